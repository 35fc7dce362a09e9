"""The load generator's own limits in the simulated client: a cap on requests in flight
(``--max-concurrency``), a request timeout (``--request-timeout``) and inference-perf's stage
barrier (``--workload-config``)."""

from __future__ import annotations

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.study.scenario import Scenario
from kvroute.traces.format import Trace
from kvroute.traces.inference_perf import parse_workload_config, workload_trace
from tests.sim.cluster.test_cluster import one, simple_profile
from tests.support.paths import INFERENCE_PERF_CONFIGS


def peak_in_flight(records) -> int:
    """Most requests between their send and their end at once (an end frees its slot before a
    send at the same instant takes it, as the client's semaphore does)."""
    events = sorted([(t, 1) for t in records["arrival"]] + [(t, -1) for t in records["end"]])
    return int(np.max(np.cumsum([step for _, step in events])))


def _ends(result, timeout=None):
    frame = result.records
    timed_out = frame["error"].fillna("").str.startswith("timed out")
    return frame.assign(end=np.where(timed_out, frame["arrival"] + (timeout or 0.0), frame["finish"]))


def burst(n=40, out=30):
    return Trace([one(i, 200 + 10 * i, out, ts=i * 5.0) for i in range(n)], block_size=16)


@pytest.mark.parametrize("cap", [1, 3, 7])
def test_max_concurrency_is_never_exceeded_and_is_reached(cap):
    spec = ClusterSpec(simple_profile(), num_workers=2, arrival_spread_s=0.0, closed_loop=False, max_in_flight=cap)
    result = simulate(burst(), spec, seed=0)
    records = _ends(result)
    assert (records["status"] == "ok").all()
    assert peak_in_flight(records) == cap
    assert (records["client_wait"] > 0).sum() > 0  # requests did wait in the client


def test_a_timed_out_request_is_recorded_failed_at_its_timeout():
    # one worker, steps of about 16 ms: a 10-token reply ends in 0.3 s, 400-token ones need 6 s
    trace = Trace([one(i, 16, 10 if i == 0 else 400, ts=0.0) for i in range(6)], block_size=16)
    spec = ClusterSpec(simple_profile(api=0.0), num_workers=1, arrival_spread_s=0.0, request_timeout_s=1.5)
    frame = simulate(trace, spec, seed=0).records
    late = frame[frame["status"] != "ok"]
    assert late["request_id"].tolist() == [1, 2, 3, 4, 5]
    assert late["error"].str.startswith("timed out: no full reply 1.5 s after it was sent").all()
    assert late["ttft"].isna().all()
    ok = frame[frame["status"] == "ok"]
    assert (ok["e2e"] <= 1.5).all()


def test_timeouts_free_the_client_slots():
    """With one slot and a 1 s timeout, each request that cannot finish in 1 s is abandoned and the
    next one is sent exactly then."""
    trace = Trace([one(i, 2000, 500, ts=0.0) for i in range(4)], block_size=16)
    spec = ClusterSpec(simple_profile(api=0.0), num_workers=1, arrival_spread_s=0.0, request_timeout_s=1.0,
                       max_in_flight=1)
    frame = simulate(trace, spec, seed=0).records
    assert (frame["status"] == "failed").all()  # 500 decode steps of 11 ms each: none ends within 1 s
    assert frame["arrival"].tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0], abs=1e-9)


def test_without_the_options_nothing_changes():
    """The options off are the run as before (the golden tests hold the exact records)."""
    trace = burst(12)
    base = ClusterSpec(simple_profile(), num_workers=2, arrival_spread_s=0.0, closed_loop=False)
    long_timeout = ClusterSpec(simple_profile(), num_workers=2, arrival_spread_s=0.0, closed_loop=False,
                               request_timeout_s=1e6)
    a, b = simulate(trace, base, seed=0).records, simulate(trace, long_timeout, seed=0).records
    assert a.drop(columns="error").equals(b.drop(columns="error"))


def _staged(doc_stages, **load):
    doc = {"data": {"type": "shared_prefix",
                    "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 2, "system_prompt_len": 64,
                                      "question_len": 32, "output_len": 20}},
           "load": {"type": "constant", "stages": doc_stages, **load}}
    return workload_trace(parse_workload_config(doc), seed=0)


def test_a_stage_starts_once_the_one_before_has_finished():
    """inference-perf's run_stage waits for every request it sent; the next stage's times start
    load.interval (here 3 s) + 1 s later."""
    trace = _staged([{"rate": 20, "duration": 2}, {"rate": 5, "duration": 2}], interval=3)
    spec = ClusterSpec(simple_profile(), num_workers=1, arrival_spread_s=0.0)
    frame = simulate(trace, spec, seed=0).records
    stage = frame["request_id"].map({r.request_id: r.stage for r in trace.records})
    first, second = frame[stage == 0], frame[stage == 1]
    offset = trace.records[40].timestamp_ms - trace.metadata["stages"][1]["start_ms"]
    assert second["arrival"].min() == pytest.approx(first["finish"].max() + 4.0 + offset / 1000.0, abs=1e-9)
    # stage 0 ran late (40 requests of 96 tokens in 2 s on one slow worker), so the barrier moved stage 1
    assert first["finish"].max() > 2.0 + 0.1


def test_the_published_config_through_the_scenario():
    """``Scenario(workload_config=...)``: its trace, and the client's timeout from the config
    (aiohttp's 300 s: load.request_timeout is unset) and the cap given."""
    scenario = Scenario(workload_config=str(INFERENCE_PERF_CONFIGS / "llm-d-37-capacity.yaml"), max_concurrency=64,
                        max_requests=300)
    trace = scenario.trace()
    assert len(trace.records) == 300 and {r.stage for r in trace.records} == {0, 1}
    spec = scenario.spec()
    assert (spec.request_timeout_s, spec.max_in_flight) == (300.0, 64)
    assert Scenario(workload_config=scenario.workload_config, request_timeout_s=20.0).spec().request_timeout_s == 20.0
    assert Scenario().spec().request_timeout_s is None and Scenario().spec().max_in_flight is None


def test_a_config_with_num_workers_gives_its_client_slots(tmp_path):
    """inference-perf's client: num_workers processes of worker_max_concurrency slots each."""
    path = tmp_path / "c.yaml"
    path.write_text((INFERENCE_PERF_CONFIGS / "llm-d-37-capacity.yaml").read_text()
                    .replace("load:\n", "load:\n  num_workers: 3\n  worker_max_concurrency: 20\n"))
    assert Scenario(workload_config=str(path)).spec().max_in_flight == 60
    assert Scenario(workload_config=str(path), max_concurrency=5).spec().max_in_flight == 5


def test_the_engine_caches_each_groups_system_prompt():
    """Prompts of 64 shared + 32 own tokens (blocks of 16): a prompt hits 0 tokens (its group not
    seen), 64 (the group's system prompt) or 80 (the same prompt again: all of it but the last
    token, in full blocks, as vLLM caps a hit)."""
    trace = _staged([{"rate": 4, "duration": 5}])
    frame = simulate(trace, ClusterSpec(simple_profile(), num_workers=1, arrival_spread_s=0.0), seed=0).records
    assert set(frame["cached_tokens"]) == {0, 64, 80}
    first_of_group = {}
    for rec in trace.records:
        first_of_group.setdefault(rec.hash_ids[:4], rec.request_id)
    assert (frame.set_index("request_id").loc[list(first_of_group.values()), "cached_tokens"] == 0).all()


@pytest.mark.parametrize("cap", [1, 3])
def test_the_client_holds_its_slot_until_the_replys_last_token_reaches_it(cap):
    """With API lanes (or a post-engine delay) a reply reaches the client after its engine's
    last step: the slot is freed then, as a live client's semaphore is, so the cap holds on the
    client's own clock (arrival to finish). One at a time, each request is sent after the
    previous one's finish."""
    from kvroute.sim.timing.profile import load_profile

    profile = load_profile("cpu-tiny-qwen2-x2-bursts")
    assert profile.frontend is not None
    spec = ClusterSpec(profile, num_workers=2, arrival_spread_s=0.0, closed_loop=False, max_in_flight=cap)
    result = simulate(burst(n=12), spec, seed=0)
    records = result.records
    assert (records["status"] == "ok").all()
    assert peak_in_flight(records.assign(end=records["finish"])) == cap
    if cap == 1:
        ordered = records.sort_values("arrival")
        assert (ordered["arrival"].to_numpy()[1:] >= ordered["finish"].to_numpy()[:-1] - 1e-12).all()


def test_a_stage_waits_for_the_replys_last_token_to_reach_the_client():
    """With API lanes a reply reaches the client after its engine's last step; inference-perf's
    run_stage waits for the client's replies, so the next stage starts the stage gap after the
    last reply reached the client, not after the engine's last step."""
    from kvroute.sim.timing.profile import load_profile

    profile = load_profile("cpu-tiny-qwen2-x2-bursts")
    assert profile.frontend is not None
    trace = _staged([{"rate": 20, "duration": 1}, {"rate": 5, "duration": 1}], interval=3)
    frame = simulate(trace, ClusterSpec(profile, num_workers=2, arrival_spread_s=0.0), seed=0).records
    stage = frame["request_id"].map({r.request_id: r.stage for r in trace.records})
    first, second = frame[stage == 0], frame[stage == 1]
    offset = trace.records[len(first)].timestamp_ms - trace.metadata["stages"][1]["start_ms"]
    assert second["arrival"].min() == pytest.approx(first["finish"].max() + 4.0 + offset / 1000.0, abs=1e-9)
    engine_last = first["engine_first_token"] + first["decode_time"]
    assert first["finish"].max() > engine_last.max()  # the API's delay is there to wait for
