"""Validation mode against two real vLLM CPU servers running the tiny random-weight Qwen2 model.

Run: python -m pytest -m live tests/calibrate/validation/test_validate_live.py   (about 70 s, 50 of them start-up)

Each server's engine runs on its own core (``VLLM_CPU_OMP_THREADS_BIND``), block size 32. The
trace is a small chat burst with a long shared system prompt and an odd number of chats (with
an even number, round robin happens to keep every chat on one worker). The last test kills one
server, so it stays last.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from tests.support.live_servers import two_server_specs

pytestmark = pytest.mark.live

PROFILE = "cpu-tiny-qwen2"


def chat_trace(turns: int = 4):
    from kvroute.traces.generators import seed_chat

    # 7 chats x 4 turns; a 1,954-token system prompt shared by all; 32-token replies
    return seed_chat(num_chats=7, num_turns=turns, system_words=1500, user_words=60, reply_tokens=32, block_size=32)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from kvroute.calibrate.live.server import serve_many

    specs = two_server_specs(tmp_path_factory)
    with serve_many(specs, timeout_s=600) as srvs:
        yield srvs


def _validate(servers, policies, max_in_flight, rounds=1):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.sim.timing.profile import load_profile

    spec = ValidationSpec(tuple(s.url for s in servers), tuple(policies), max_in_flight=max_in_flight,
                          sim_rounds=rounds)
    return run_validation(chat_trace(), load_profile(PROFILE), spec)


def _hits(run):
    live = [float(x) for x in run.live.workers["prefix_cache_hits"]]
    sim = [float(x) for x in run.predicted_counter("prefix_cache_hits")]
    return live, sim


@pytest.fixture(scope="module")
def sequential(servers):
    return _validate(servers, ["round_robin", "kv_aware"], max_in_flight=1)


@pytest.fixture(scope="module")
def concurrent(servers):
    return _validate(servers, ["round_robin", "kv_aware"], max_in_flight=None, rounds=3)


@pytest.mark.parametrize("policy", ["round_robin", "kv_aware"])
def test_one_at_a_time_hit_tokens_per_worker_equal_the_simulation(sequential, policy):
    run = next(r for r in sequential.runs if r.policy == policy)
    assert run.cache_reset == [True, True] and not run.warm
    assert (run.live.records["status"] == "ok").all()
    assert (run.live.records["output_tokens"] == 32).all()  # ignore_eos forced every reply's length
    live, sim = _hits(run)
    print(f"{policy} one at a time: hit tokens per worker measured {live}, predicted {sim}")
    assert live == sim, (live, sim)
    # the usage's cached tokens agree with the server's counters, and the routing with the simulator's
    assert [float(x) for x in run.live.workers["usage_cached_tokens"]] == live
    lw = run.live.records.set_index("request_id")["worker"]
    sw = run.sim_runs[0].records.set_index("request_id")["worker"]
    assert (lw == sw).all()
    queries = [float(x) for x in run.live.workers["prefix_cache_queries"]]
    assert queries == [float(x) for x in run.predicted_counter("prefix_cache_queries")]


@pytest.mark.parametrize("policy", ["round_robin", "kv_aware"])
def test_concurrent_hit_tokens_within_two_percent(concurrent, policy):
    run = next(r for r in concurrent.runs if r.policy == policy)
    assert (run.live.records["status"] == "ok").all()
    live, sim = _hits(run)
    print(f"{policy} concurrent: hit tokens per worker measured {live}, predicted {sim}")
    # Hit tokens in all are predictable under concurrency for both policies.
    assert abs(sum(live) - sum(sim)) <= 0.02 * sum(sim), (live, sim)
    if policy == "kv_aware":
        # NOTE: kv_aware sends a turn whose routed match is under half its prompt to the least
        # loaded worker, ties broken at random (issue 10). Under concurrency which turns meet a tie,
        # and so which chat lands where, depends on arrival timing; the split over workers is
        # checked exactly one request at a time (test above), not here.
        return
    for w, (l, s) in enumerate(zip(live, sim)):
        assert abs(l - s) <= 0.02 * s, f"worker {w}: measured {l} hit tokens, predicted {s}"


def test_kv_aware_measures_a_higher_hit_rate_than_round_robin(sequential, concurrent):
    for v in (sequential, concurrent):
        rr, kv = (next(r for r in v.runs if r.policy == p) for p in ("round_robin", "kv_aware"))
        print(f"max_in_flight {v.spec.max_in_flight}: hit rate round_robin {rr.measured['hit_rate']:.3f} "
              f"(predicted {rr.predicted['hit_rate']:.3f}), kv_aware {kv.measured['hit_rate']:.3f} "
              f"(predicted {kv.predicted['hit_rate']:.3f})")
        assert kv.predicted["hit_rate"] > rr.predicted["hit_rate"]
        if v.spec.max_in_flight == 1:
            # one at a time the routing is deterministic: measured 0.855 vs 0.891, as predicted
            assert kv.measured["hit_rate"] > rr.measured["hit_rate"] + 0.02
        else:
            # NOTE: all at once, round robin's hit rate depends on the order the turns arrive in
            # (which chat's turn lands on which worker); a CI run measured a 0.017 lead where the
            # simulation predicted 0.025, so only the sign of the lead is asserted here.
            assert kv.measured["hit_rate"] > rr.measured["hit_rate"]


def test_report_files(concurrent, tmp_path):
    from kvroute.calibrate.validation.validate_render import write_report

    doc = json.loads(write_report(concurrent, tmp_path).read_text())
    assert doc["warm_cache"] is False and doc["failed_requests"] == 0 and not doc["interrupted"]
    m = doc["policies"]["kv_aware"]["metrics"]
    for key in ("time_to_complete_s", "ttft_mean_s", "ttft_p90_s", "later_ttft_mean_s", "itl_mean_s", "hit_rate"):
        assert m[key]["predicted"] > 0 and m[key]["measured"] > 0, key
    assert doc["changes"]["kv_aware"]["hit_rate"]["measured"] > 0
    for name in ("report.md", "records_live.parquet", "records_sim.parquet", "ttft_round_robin.png",
                 "ttft_kv_aware.png"):
        assert (tmp_path / name).exists(), name


def test_the_speed_probe_on_live_servers_and_the_profile_rescaled_to_it(servers):
    """One short and one long request per server one at a time, then two per server at once;
    the profile's step costs fitted to what they measured (kvroute.sim.timing.speed_scale)."""
    import asyncio

    from kvroute.calibrate.validation.probe import speed_scale, probe_samples
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile
    from kvroute.sim.timing.speed_scale import FACTOR_BOUNDS

    samples = asyncio.run(probe_samples([s.url for s in servers], seed=3, reps=1, burst=2, long=1))
    assert {q: len(v) for q, v in samples.items()} == {"ttft_s": 2, "itl_s": 2, "long_ttft_s": 2, "long_itl_s": 2,
                                                       "burst_ttft_s": 4, "burst_itl_s": 4}
    # 8,192 tokens take longer than 2,048 (means: one sample each per server, and a loaded 2-core
    # host has stalled a single request by several times)
    assert np.mean(samples["long_ttft_s"]) > np.mean(samples["ttft_s"])
    scale = speed_scale(ClusterSpec(profile=load_profile(PROFILE), num_workers=2), samples)
    # the fit keeps its factors inside FACTOR_BOUNDS: none of them left on a bound
    assert scale.clipped == () and all(FACTOR_BOUNDS[0] < f < FACTOR_BOUNDS[1] for f in scale.factors().values())
    assert 0 <= scale.residual < 1.0 and "ttft 2" in scale.source


def _successes(url: str) -> float:
    """``vllm:request_success_total`` of the server at ``url``, summed over its labels."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_ctrl_c_writes_what_was_measured(servers, tmp_path):
    from tests.support.validate_driver import interrupt_validate

    from kvroute.traces.writer import write_trace

    trace = tmp_path / "chat.jsonl"
    write_trace(chat_trace(turns=10), trace)  # one at a time: 2-20 s per policy, with the host's speed
    out = tmp_path / "out"
    # NOTE: interrupted on an event, not after a fixed time: once 2 more requests have finished
    # on the first server than before the run (round_robin, early in its 70), whatever the speed
    first = servers[0].url
    before = _successes(first)
    code, stderr, doc = interrupt_validate(trace, [s.url for s in servers[:2]], PROFILE, out, settle_s=3.0,
                                           timeout_s=120, ready=lambda: _successes(first) >= before + 2)
    assert code == 130, stderr
    assert doc["interrupted"] is True and list(doc["policies"]) == ["round_robin"]
    rr = doc["policies"]["round_robin"]
    assert rr["interrupted"] and 0 < rr["failed_requests"] < doc["num_requests"]
    assert rr["metrics"]["ttft_mean_s"]["measured"] > 0
    assert (out / "records_live.parquet").exists()


def test_killing_a_server_mid_run_is_survived(servers, tmp_path):
    """Runs last: server 1 is killed (SIGKILL) while the replay is under way."""
    import asyncio

    from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec
    from kvroute.calibrate.validation.validate import (PolicyRun, Validation, ValidationSpec, cluster_spec,
                                                       finish_run, measure, predict, probe_servers)
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    urls = [s.url for s in servers]
    trace = chat_trace()
    infos = asyncio.run(probe_servers(urls))
    # NOTE: kv_aware keeps each chat on one worker, so the chats on the surviving worker carry on
    # after the kill whatever the timing (round_robin alternates a chat between workers, and how
    # many chats survive then depends on when the kill lands).
    spec = ValidationSpec(tuple(urls), ("kv_aware",), sim_rounds=1)
    cluster, _ = cluster_spec(load_profile(PROFILE), infos, spec)
    run: PolicyRun = predict(trace, cluster, ["kv_aware"], 1, 0)[0]
    replay = LiveReplay(trace, [Endpoint(i.url, i.model) for i in infos], 32, ReplaySpec("kv_aware", timeout_s=60))
    killed_at = []

    async def main():
        task = asyncio.create_task(measure(run, replay, urls))
        while replay.num_finished < 10 and not task.done():
            await asyncio.sleep(0.01)
        os.killpg(servers[1].process.pid, signal.SIGKILL)
        killed_at.append(replay.now())
        await task

    asyncio.run(main())
    finish_run(run, replay)
    df = run.live.records
    assert list(run.dead) == [1]
    assert len(df) == len(trace.records)  # every request is accounted for
    failed = df[df["status"] != "ok"]
    after = df[df["arrival"] > killed_at[0]]
    print(f"killed at {killed_at[0]:.2f} s: {len(failed)} failed ({(failed['worker'] == 1).sum()} in flight on the "
          f"dead worker, {(failed['worker'] == -1).sum()} later turns not sent), {(df['status'] == 'ok').sum()} ok, "
          f"{(after['status'] == 'ok').sum()} of them sent after the kill, all to worker 0; run {run.elapsed_s:.1f} s")
    assert len(failed) >= 1 and failed["error"].notna().all()
    assert failed["error"].str.contains(f"{servers[1].spec.port}|parent request", regex=True).all()
    assert (after.loc[after["status"] == "ok", "worker"] == 0).all()
    assert (after["status"] == "ok").sum() >= 1  # the replay went on, on the other server
    hurt = set(failed["session_id"])
    ok = df[df["status"] == "ok"]
    assert all(len(g) == 4 for s, g in ok.groupby("session_id") if s not in hurt)
    v = Validation(trace, spec, infos, cluster, runs=[run])
    doc = json.loads(write_report(v, tmp_path).read_text())
    assert doc["policies"]["kv_aware"]["dead_workers"].keys() == {"1"}
    assert doc["policies"]["kv_aware"]["workers"]["1"]["alive"] is False
    assert any("died or timed out" in n for n in doc["notes"])

