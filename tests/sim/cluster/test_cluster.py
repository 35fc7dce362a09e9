"""End-to-end runs of the simulated cluster: timing, replay modes, GPU sharing, bad input."""

from dataclasses import replace

import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import Overheads, profile_from_dict
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.generators import seed_chat
from tests.support.shared_traces import shared_trace


def simple_profile(num_gpu_blocks=1000, api=0.1, cv=0.0, max_model_len=32768, memory=None):
    """Steps cost 10 ms + 1 ms per batched token; nothing else."""
    doc = {
        "name": "test",
        "engine": {"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "max_num_batched_tokens": 2048,
                   "max_num_seqs": 256, "max_model_len": max_model_len, "gpu_memory_utilization": 0.9},
        "step_cost": {"step_overhead_s": 0.01, "weight_load_s": 0.0, "per_token_s": 0.001,
                      "per_request_s": 0.0, "prefill_attn_s": 0.0, "decode_attn_s": 0.0},
        "overheads": {"api_server_s": api, "gateway_s": 0.0, "jitter_cv": cv},
    }
    if memory:
        doc["memory"] = memory
    return profile_from_dict(doc)


def one(rid, length, out, ts=0.0, **kw):
    return TraceRecord(rid, ts, length, out, tuple(range(rid * 1000, rid * 1000 + -(-length // 16))), **kw)


def test_ttft_itl_and_e2e_follow_the_step_times_exactly():
    trace = Trace([one(0, 100, 3)], block_size=16)
    result = simulate(trace, ClusterSpec(simple_profile(), num_workers=1, arrival_spread_s=0.0), seed=0)
    row = result.records.iloc[0]
    prefill = 0.01 + 0.001 * 100
    decode = 0.01 + 0.001
    assert row["arrival"] == 0.0
    assert row["ttft"] == pytest.approx(0.1 + prefill)
    assert row["e2e"] == pytest.approx(0.1 + prefill + 2 * decode)
    assert row["tpot"] == pytest.approx(decode)
    assert result.itl == pytest.approx([decode, decode])
    assert (row["prompt_tokens"], row["cached_tokens"], row["output_tokens"]) == (100, 0, 3)


def test_two_workers_sharing_a_gpu_alternate_their_steps():
    trace = Trace([one(0, 100, 1), one(1, 100, 1)], block_size=16)
    profile = simple_profile(memory={"gpu_memory_bytes": 10_000, "weight_bytes": 1000, "activation_peak_bytes": 0,
                                     "non_torch_bytes": 0, "kv_bytes_per_block": 4})
    own = simulate(trace, ClusterSpec(profile, num_workers=2, policy="round_robin", arrival_spread_s=0.0))
    shared = simulate(trace, ClusterSpec(profile, num_workers=2, num_gpus=1, policy="round_robin",
                                         arrival_spread_s=0.0))
    step = 0.01 + 0.1
    assert list(own.records["ttft"]) == pytest.approx([0.1 + step, 0.1 + step])
    assert list(shared.records["ttft"]) == pytest.approx([0.1 + step, 0.1 + 2 * step])
    # Each of two workers gets half the memory share: (10000*0.45 - 1000) // 4 blocks.
    assert list(shared.workers["num_gpu_blocks"]) == [875, 875]
    assert list(own.workers["num_gpu_blocks"]) == [1000, 1000]


def test_closed_loop_sends_a_turn_when_its_parent_finished_plus_think_time():
    trace = seed_chat(num_chats=2, num_turns=3, think_time_ms=500.0)
    result = simulate(trace, ClusterSpec(simple_profile(), num_workers=2, policy="kv_aware"), seed=3)
    df = result.records.set_index("request_id")
    for rec in trace.records:
        if rec.parent is not None:
            assert df.loc[rec.request_id, "arrival"] == pytest.approx(df.loc[rec.parent, "finish"] + 0.5)
            assert df.loc[rec.request_id, "worker"] == df.loc[rec.parent, "worker"]


def test_a_client_started_during_an_event_runs_before_the_normal_events_already_due_then():
    # where a client process's first step ran (SimPy's urgent Initialize): a later turn started
    # when its parent finishes is routed before another worker's step ending at the same time
    from kvroute.sim.cluster.cluster import Cluster

    cluster = Cluster(Trace([one(0, 100, 1)], block_size=16), ClusterSpec(simple_profile()), 0)
    env, order = cluster.env, []

    def parent_finishes(_event) -> None:
        env.timeout(0).callbacks.append(lambda _e: order.append(("due", env.now)))
        cluster._start_at_once(lambda label: order.append((label, env.now)), "started")
        order.append(("parent", env.now))

    env.timeout(1.0).callbacks.append(parent_finishes)
    env.run(until=2.0)
    assert order == [("parent", 1.0), ("started", 1.0), ("due", 1.0)]


def test_a_later_turn_on_the_same_worker_hits_its_history_and_reply():
    trace = seed_chat(num_chats=1, num_turns=2)
    result = simulate(trace, ClusterSpec(simple_profile(), num_workers=1), seed=0)
    turn2 = result.records.iloc[1]
    # 986-token turn 1 + 128-token reply: 1113 tokens computed, 69 full blocks.
    assert turn2["cached_tokens"] == 69 * 16
    assert result.workers["prefix_cache_hits"].sum() == result.records["cached_tokens"].sum()
    assert result.workers["prefix_cache_queries"].sum() == result.records["prompt_tokens"].sum()


def test_open_loop_uses_timestamps():
    trace = Trace([one(0, 50, 2, ts=0.0), one(1, 50, 2, ts=2500.0)], block_size=16)
    result = simulate(trace, ClusterSpec(simple_profile(), num_workers=1, arrival_spread_s=0.0))
    assert list(result.records["arrival"]) == [0.0, 2.5]


def test_same_seed_same_result_and_jitter_is_seeded():
    trace = seed_chat(num_chats=8, num_turns=3)
    spec = ClusterSpec(simple_profile(cv=0.2), num_workers=2, policy="round_robin")
    a, b, c = simulate(trace, spec, seed=1), simulate(trace, spec, seed=1), simulate(trace, spec, seed=2)
    assert a.records.equals(b.records)
    assert not a.records["arrival"].equals(c.records["arrival"])
    turn1 = a.records[a.records["turn"] == 1]["arrival"]
    assert turn1.min() >= 0.0 and turn1.max() <= 0.005 and turn1.nunique() == 8


def test_a_prompt_over_max_model_len_is_recorded_as_failed_and_its_later_turns_are_not_sent():
    trace = seed_chat(num_chats=2, num_turns=3)
    records = list(trace.records)
    records[0] = replace(records[0], input_length=5000, hash_ids=tuple(range(7000, 7000 + 313)))
    bad = Trace(records, trace.block_size, "test")
    result = simulate(bad, ClusterSpec(simple_profile(max_model_len=4096), num_workers=1))
    df = result.records.set_index("request_id")
    assert df.loc[0, "status"] == "failed"
    assert "maximum context length is 4096 tokens" in df.loc[0, "error"]
    assert "parent request 0 failed" in df.loc[2, "error"]
    assert (df.loc[[1, 3, 5], "status"] == "ok").all()


def test_a_cache_too_small_for_one_request_fails_before_the_run():
    trace = Trace([one(0, 1000, 100)], block_size=16, source="tiny.jsonl")
    with pytest.raises(ValueError, match=r"tiny.jsonl: request 0 needs 69 KV blocks .* only 9 usable blocks"):
        simulate(trace, ClusterSpec(simple_profile(num_gpu_blocks=10), num_workers=1))
    # the output counted is the one vLLM leaves room for: it read "4000 prompt + 500 output tokens"
    # for the 4096 - 4000 = 96 that made the 256 blocks
    long = Trace([one(0, 4000, 500)], block_size=16, source="long.jsonl")
    with pytest.raises(ValueError, match=r"^long.jsonl: request 0 needs 256 KV blocks \(4000 prompt \+ 96 output "
                                         r"tokens \(of 500 asked, cut at max_model_len 4096\) at 16 tokens per block\)"):
        simulate(long, ClusterSpec(simple_profile(num_gpu_blocks=10, max_model_len=4096), num_workers=1))


def test_block_size_mismatch_names_the_sizes_that_work():
    trace = Trace([TraceRecord(0, 0, 24, 2, (1,))], block_size=24, source="odd.jsonl")
    with pytest.raises(ValueError, match=r"odd.jsonl: .*24.*1, 2, 3, 4, 6, 8, 12, 24"):
        simulate(trace, ClusterSpec(simple_profile(), num_workers=1))


def test_mooncake_first20_runs_on_real_input():
    path = shared_trace("mooncake", "mooncake_trace_first20.jsonl")
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.reader import read_trace

    trace = read_trace(path)
    result = simulate(trace, ClusterSpec(load_profile("a100-80gb-qwen2.5-7b"), num_workers=2, policy="kv_aware"))
    df = result.records
    too_long = df["prompt_tokens"] >= 32768  # the prior's max_model_len
    assert len(df) == 20 and too_long.sum() >= 1
    assert (df.loc[too_long, "status"] == "failed").all()
    assert (df.loc[~too_long, "status"] == "ok").all() and (df.loc[~too_long, "ttft"] > 0).all()
    # Records 4 and 5 share 12 blocks of 512 tokens (ids 46..57): kv_aware co-locates them, so
    # the second hits exactly those 6,144 tokens on the worker that holds them.
    assert df.loc[5, "worker"] == df.loc[4, "worker"]
    assert df.loc[5, "cached_tokens"] == 12 * 512


@pytest.mark.parametrize("policy", ["round_robin", "kv_aware"])
def test_fast_forwarded_decode_runs_equal_step_by_step_simulation(policy):
    """Advancing runs of identical decode steps as one event changes nothing but rounding."""
    from kvroute.sim.timing.profile import load_profile

    trace = seed_chat(num_chats=12, num_turns=4, think_time_ms=300.0)
    profile = load_profile("a6000-qwen2.5-7b")
    small = replace(profile, engine=replace(profile.engine, num_gpu_blocks=300))  # evictions, preemptions
    spec = ClusterSpec(small, num_workers=2, policy=policy)
    fast = simulate(trace, spec, seed=5)
    slow = simulate(trace, replace(spec, fast_forward=False), seed=5)
    for column in ["worker", "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "status"]:
        assert list(fast.records[column]) == list(slow.records[column]), column
    for column in ["arrival", "first_token", "finish", "ttft", "e2e"]:
        assert list(fast.records[column]) == pytest.approx(list(slow.records[column]), rel=1e-9, abs=1e-9)
    assert sorted(fast.itl) == pytest.approx(sorted(slow.itl), rel=1e-9, abs=1e-12)
    for column in ["num_steps", "prefix_cache_hits", "prefix_cache_queries", "num_evictions", "num_preemptions"]:
        assert list(fast.workers[column]) == list(slow.workers[column]), column
    assert fast.workers["num_evictions"].sum() > 0 and fast.workers["num_preemptions"].sum() > 0


def test_max_in_flight_one_sends_requests_one_at_a_time_in_ready_order():
    trace = seed_chat(num_chats=3, num_turns=2)
    spec = ClusterSpec(simple_profile(), num_workers=2, policy="round_robin", arrival_spread_s=0.0, max_in_flight=1)
    df = simulate(trace, spec).records.sort_values("arrival")
    # Chats 0, 1, 2 send turn 1 in trace order; each turn 2 becomes ready after its turn 1 and
    # queues behind the turn 1s already waiting.
    assert list(df["request_id"]) == [0, 1, 2, 3, 4, 5]
    assert (df["arrival"].to_numpy()[1:] >= df["finish"].to_numpy()[:-1]).all()
