"""The worker loop with async scheduling: step N+1 scheduled before step N's output, each
step's CPU part (``AsyncOverlap``: all of ``step_overhead_s`` by default) overlapping the GPU
part of the step before it. Exact times from ``simple_profile``: 10 ms overhead + 1 ms per
batched token."""

from dataclasses import replace

import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.async_overlap import STATED_CPU_FRACTION, AsyncOverlap
from kvroute.traces.format import Trace
from kvroute.traces.generators import seed_chat
from kvroute.sim.timing.profile import profile_from_dict
from tests.sim.cluster.test_cluster import one, simple_profile


def async_profile(**kw):
    p = simple_profile(**kw)
    return replace(p, engine=replace(p.engine, async_scheduling=True))


def test_a_lone_request_overlaps_each_steps_cpu_part_with_the_previous_gpu_part():
    trace = Trace([one(0, 100, 3)], block_size=16)
    result = simulate(trace, ClusterSpec(async_profile(), num_workers=1, arrival_spread_s=0.0), seed=0)
    row = result.records.iloc[0]
    # Prefill at 0.1: CPU 10 ms, then GPU 100 ms -> first token at 0.21, as synchronously.
    # Decode 1 was scheduled at 0.11 (before the first token was known): it runs 0.21-0.211, but
    # its output waits for decode 2's CPU part (scheduled at 0.21) -> 0.22. Decode 2 runs
    # 0.22-0.221 and nothing is scheduled after it (the request is at max_tokens).
    assert row["ttft"] == pytest.approx(0.21)
    assert row["e2e"] == pytest.approx(0.221)
    assert list(result.itl) == pytest.approx([0.01, 0.001])


def gpu_bound_profile(async_scheduling):
    """Steps cost 2 ms overhead + max(20 ms, 1 ms per batched token): a decode is GPU-bound."""
    p = profile_from_dict({
        "name": "test",
        "engine": {"block_size": 16, "num_gpu_blocks": 1000, "max_num_batched_tokens": 2048,
                   "max_num_seqs": 256, "max_model_len": 32768, "gpu_memory_utilization": 0.9},
        "step_cost": {"step_overhead_s": 0.002, "weight_load_s": 0.02, "per_token_s": 0.001,
                      "per_request_s": 0.0, "prefill_attn_s": 0.0, "decode_attn_s": 0.0},
        "overheads": {"api_server_s": 0.1, "gateway_s": 0.0, "jitter_cv": 0.0},
    })
    return replace(p, engine=replace(p.engine, async_scheduling=async_scheduling))


def test_a_request_arriving_under_load_waits_one_step_more():
    # r1 reaches the engine at 0.3 s while r0 decodes (ts in ms).
    trace = Trace([one(0, 100, 20), one(1, 32, 2, ts=200.0)], block_size=16)
    sync, asyn = (simulate(trace, ClusterSpec(gpu_bound_profile(on), num_workers=1, arrival_spread_s=0.0), seed=0)
                  for on in (False, True))
    # sync: r0's decodes end at 0.202 + 0.022 k; r1 joins the step scheduled at 0.312
    # (33 tokens: 35 ms) -> first token at 0.347
    assert sync.records.iloc[1]["ttft"] == pytest.approx(0.347 - 0.2)
    # async: iterations every 20 ms from 0.202 (the GPU part); r1 is scheduled at 0.302, but the
    # step scheduled at 0.282 runs first (0.302-0.322), then r1's prefill (33 ms) -> 0.355
    assert asyn.records.iloc[1]["ttft"] == pytest.approx(0.355 - 0.2)
    # r0's decodes: 22 ms apart synchronously, 20 ms (the GPU part) with async
    assert sync.itl[1] == pytest.approx(0.022) and asyn.itl[1] == pytest.approx(0.02)


def test_fast_forward_is_off_and_results_are_the_same_without_it():
    trace = seed_chat(num_chats=6, num_turns=3, think_time_ms=300.0)
    spec = ClusterSpec(async_profile(num_gpu_blocks=300), num_workers=2, policy="round_robin")
    a = simulate(trace, spec, seed=3)
    b = simulate(trace, replace(spec, fast_forward=False), seed=3)
    assert a.records.equals(b.records)
    assert (a.records["status"] == "ok").all()


def test_two_workers_on_one_gpu_take_turns_for_their_gpu_parts():
    trace = Trace([one(0, 100, 1), one(1, 100, 1)], block_size=16)
    profile = async_profile(memory={"gpu_memory_bytes": 10_000, "weight_bytes": 1000, "activation_peak_bytes": 0,
                                    "non_torch_bytes": 0, "kv_bytes_per_block": 4})
    shared = simulate(trace, ClusterSpec(profile, num_workers=2, num_gpus=1, policy="round_robin",
                                         arrival_spread_s=0.0))
    # both CPU parts run at once (0.1-0.11); the GPU parts (100 ms each) one after the other
    assert sorted(shared.records["ttft"]) == pytest.approx([0.21, 0.31])


def test_the_stated_overlap_is_the_whole_step_overhead():
    cost = simple_profile().step_cost
    assert STATED_CPU_FRACTION == 1.0
    assert AsyncOverlap().cpu_s(cost) == 0.01
    assert AsyncOverlap(0.25).cpu_s(cost) == 0.0025
    with pytest.raises(ValueError, match="cpu_fraction"):
        AsyncOverlap(1.5)


def test_a_profiles_async_cpu_fraction_sets_the_overlapped_part():
    """engine.async_cpu_fraction 0.4: a step's CPU part is 4 ms of the 10 ms overhead. The prefill
    (CPU 0.100-0.104, GPU to 0.210) gives the first token at 0.21; decode 1 (CPU 0.104-0.108)
    runs 0.210-0.217 on the GPU and decode 2 (CPU 0.210-0.214) 0.217-0.224: ITL 7 ms, 7 ms. With
    0 nothing is hidden and the steps take what synchronous ones do (11 ms)."""
    p = async_profile()
    assert p.async_cpu_fraction == STATED_CPU_FRACTION
    trace = Trace([one(0, 100, 3)], block_size=16)

    def run(profile):
        return simulate(trace, ClusterSpec(profile, num_workers=1, arrival_spread_s=0.0), seed=0)

    assert list(run(p).itl) == pytest.approx([0.01, 0.001])
    part = run(replace(p, async_cpu_fraction=0.4))
    assert list(part.itl) == pytest.approx([0.007, 0.007])
    assert part.records.iloc[0]["ttft"] == pytest.approx(0.21) and part.records.iloc[0]["e2e"] == pytest.approx(0.224)
    assert list(run(replace(p, async_cpu_fraction=0.0)).itl) == pytest.approx(list(run(simple_profile()).itl))
    assert list(run(simple_profile()).itl) == pytest.approx([0.011, 0.011])


def test_a_profile_reads_its_async_cpu_fraction_and_refuses_one_outside_0_1():
    from kvroute.traces.inputs import InputError

    doc = {"name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 100, "async_cpu_fraction": 0.25},
           "step_cost": {"step_overhead_s": 0.002, "weight_load_s": 0.02, "per_token_s": 0.001,
                         "per_request_s": 0.0, "prefill_attn_s": 0.0, "decode_attn_s": 0.0}}
    assert profile_from_dict(doc).async_cpu_fraction == 0.25
    doc["engine"]["async_cpu_fraction"] = 1.5
    with pytest.raises(InputError, match="engine.async_cpu_fraction"):
        profile_from_dict(doc)
