"""The API-server queue and host model (sim/timing/frontend.py) against closed forms, alone and in a run."""

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.frontend import FifoLane, FrontendModel, Frontends, HostModel
from kvroute.sim.timing.profile import profile_from_dict
from kvroute.traces.format import Trace, TraceRecord


def profile(api=0.0, frontend=None, host=None):
    """Steps cost 10 ms + 1 ms per batched token; API overhead ``api`` s, no jitter."""
    doc = {
        "name": "test",
        "engine": {"block_size": 16, "num_gpu_blocks": 1000, "max_num_batched_tokens": 2048,
                   "max_num_seqs": 256, "max_model_len": 32768},
        "step_cost": {"step_overhead_s": 0.01, "weight_load_s": 0.0, "per_token_s": 0.001,
                      "per_request_s": 0.0, "prefill_attn_s": 0.0, "decode_attn_s": 0.0},
        "overheads": {"api_server_s": api, "gateway_s": 0.0, "jitter_cv": 0.0},
    }
    if frontend is not None:
        doc["frontend"] = frontend
    if host is not None:
        doc["host"] = host
    return profile_from_dict(doc)


def rec(rid, length, out):
    return TraceRecord(rid, 0.0, length, out, tuple(range(rid * 1000, rid * 1000 + -(-length // 16))))


def run(prof, records, workers=1, policy="round_robin"):
    spec = ClusterSpec(prof, num_workers=workers, policy=policy, arrival_spread_s=0.0, record_steps=True)
    return simulate(Trace(records, block_size=16), spec, seed=0)


def test_md1_mean_wait_matches_pollaczek_khinchine():
    # M/D/1: Poisson arrivals at rate lam, service D, load rho = lam * D: Wq = rho * D / (2 (1 - rho)).
    rng = np.random.default_rng(1)
    D, rho = 0.01, 0.6
    arrivals = np.cumsum(rng.exponential(D / rho, size=200_000))
    lane = FifoLane()
    waits = np.array([lane.submit(t, D)[0] - t for t in arrivals])
    expected = rho * D / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(expected, rel=0.03)
    assert lane.busy_time == pytest.approx(D * len(arrivals))


def test_burst_of_n_equal_requests_is_served_in_n_service_times():
    lane = FifoLane()
    ends = [lane.submit(0.0, 0.25)[1] for _ in range(16)]
    assert ends == [0.25 * (i + 1) for i in range(16)]
    assert lane.busy(3.99) and not lane.busy(4.0)


def test_requests_join_the_lane_free_soonest():
    fronts = Frontends(FrontendModel(api_server_count=2, per_request_s=1.0), num_workers=1)
    waits = [fronts.admit(0, i, 0.0, 100) for i in range(5)]
    assert waits == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert fronts.num_busy(2.5) == 1 and fronts.num_busy(3.0) == 0


def test_burst_reaches_the_engine_one_admission_after_another():
    # pre-engine time 0.1 s, all of it admission work in the one API process: request i is
    # scheduled at (i + 1) x 0.1 s, its 16-token prefill step takes 26 ms; its token is streamed
    # after the admissions queued before it (FIFO), so the first seven reach the client at 0.8 s.
    n, s = 8, 0.1
    res = run(profile(api=s, frontend={"per_request_s": s}), [rec(i, 16, 1) for i in range(n)])
    starts, durations = res.step_logs[0][:, 0], res.step_logs[0][:, 1]
    assert list(starts) == pytest.approx([(i + 1) * s for i in range(n)])
    assert list(durations) == pytest.approx([0.026] * n)
    assert sorted(res.records["ttft"]) == pytest.approx([n * s] * (n - 1) + [n * s + 0.026])


def test_streaming_work_paces_tokens_when_slower_than_steps():
    # decode steps take 11 ms; streaming a token takes 50 ms of the API process
    res = run(profile(frontend={"per_output_token_s": 0.05}), [rec(0, 100, 3)])
    row = res.records.iloc[0]
    assert row["ttft"] == pytest.approx(0.11 + 0.05)
    assert row["tpot"] == pytest.approx(0.05)
    assert row["e2e"] == pytest.approx(0.11 + 3 * 0.05)


def test_streaming_delays_a_later_admission():
    # request 0's admission holds the lane 0-0.1 s, its first token (emitted at 0.11 s) 0.11-0.31 s;
    # request 1, sent at 0.2 s, waits for that token's streaming.
    fronts = Frontends(FrontendModel(per_request_s=0.1, per_output_token_s=0.2), num_workers=1)
    assert fronts.admit(0, 0, 0.0, 10) == 0.0
    assert fronts.deliver(0, 0, 0.11) == pytest.approx(0.31)
    assert fronts.admit(0, 1, 0.2, 10) == pytest.approx(0.11)


def test_a_step_pays_its_output_batch_once_then_each_token():
    # AsyncLLM.output_handler takes one output batch per engine step: 0.5 ms for the batch,
    # then 0.1 ms per request's token, in order; the next step's batch pays again
    fronts = Frontends(FrontendModel(per_output_token_s=1e-4, per_step_s=5e-4), num_workers=1)
    for rid in range(3):
        fronts.admit(0, rid, 0.0, 10)
    assert [fronts.deliver(0, rid, 1.0) for rid in range(3)] == pytest.approx([1.0006, 1.0007, 1.0008])
    assert [fronts.deliver(0, rid, 1.01) for rid in range(3)] == pytest.approx([1.0106, 1.0107, 1.0108])


def test_step_cost_paces_a_lone_stream_like_a_token_cost():
    # one request: each decode step (11 ms) emits one token; 60 ms per step on the API lane
    res = run(profile(frontend={"per_step_s": 0.05, "per_output_token_s": 0.01}), [rec(0, 100, 3)])
    row = res.records.iloc[0]
    assert row["ttft"] == pytest.approx(0.11 + 0.06)
    assert row["tpot"] == pytest.approx(0.06)


def test_zero_cost_frontend_predicts_like_no_frontend():
    records = [rec(i, 200 + 30 * i, 5 + i) for i in range(6)]
    plain = run(profile(api=0.02), records, workers=2)
    queued = run(profile(api=0.02, frontend={"api_server_count": 1}), records, workers=2)
    for col in ("ttft", "e2e", "tpot"):
        assert list(queued.records[col]) == pytest.approx(list(plain.records[col]))


def test_host_contention_stretches_steps_when_cores_are_oversubscribed():
    # two engines busy on one core, fair sharing: every step twice as long
    records = [rec(0, 100, 1), rec(1, 100, 1)]
    alone = run(profile(), records, workers=2)
    shared = run(profile(host={"cores": 1, "contention": 1.0}), records, workers=2)
    assert list(alone.records["ttft"]) == pytest.approx([0.11, 0.11])
    assert list(shared.records["ttft"]) == pytest.approx([0.22, 0.22])
    # the coefficients were calibrated with both busy: no stretch beyond them
    base = run(profile(host={"cores": 1, "contention": 1.0, "baseline_busy": 2}), records, workers=2)
    assert list(base.records["ttft"]) == pytest.approx([0.11, 0.11])


def test_an_idle_engine_keeps_its_core_busy_for_its_spin_time():
    # one core, fair sharing: requests 0 and 1 share it (steps of 0.11 s take 0.22 s, both end at
    # 0.22 s); request 2 reaches worker 0 at 0.5 s. Without spin it runs alone; with a 1 s spin
    # worker 1's idle engine still holds half the core, so its step takes twice as long.
    records = [rec(0, 100, 1), rec(1, 100, 1), TraceRecord(2, 500.0, 100, 1, tuple(range(5000, 5007)))]
    host = {"cores": 1, "contention": 1.0}
    plain = run(profile(host=host), records, workers=2).records.set_index("request_id")
    spun = run(profile(host={**host, "engine_spin_s": 1.0}), records, workers=2).records.set_index("request_id")
    assert plain.at[2, "ttft"] == pytest.approx(0.11)
    assert spun.at[2, "ttft"] == pytest.approx(0.22)
    # a spin shorter than the gap changes nothing
    short = run(profile(host={**host, "engine_spin_s": 0.05}), records, workers=2).records.set_index("request_id")
    assert short.at[2, "ttft"] == pytest.approx(0.11)


def test_the_client_counts_as_busy_only_while_responses_stream():
    from kvroute.sim.cluster.cluster import Cluster

    prof = profile(frontend={"per_output_token_s": 0.01}, host={"cores": 2, "contention": 1.0, "client_busy": 1.0})
    spec = ClusterSpec(prof, num_workers=2, policy="round_robin", arrival_spread_s=0.0)
    cluster = Cluster(Trace([rec(0, 100, 1)], block_size=16), spec, 0)
    assert cluster.host.num_busy() == 0  # nothing queued: engines idle, no lane busy, client waiting
    cluster.frontends.lanes[1][0].free_at = 0.5  # worker 1's API process streams until 0.5 s
    assert cluster.host.num_busy() == 2  # that lane and the client reading from it
    prof0 = profile(frontend={"per_output_token_s": 0.01}, host={"cores": 2, "contention": 1.0})
    quiet = Cluster(Trace([rec(0, 100, 1)], block_size=16), ClusterSpec(prof0, num_workers=2), 0)
    quiet.frontends.lanes[1][0].free_at = 0.5
    assert quiet.host.num_busy() == 1


def test_with_api_processes_on_their_engines_cores_a_lane_stretches_its_own_engine_alone():
    # two cores, fair sharing, 1 ms of lane time per prompt token. At 0 s worker 0 gets a
    # 1,000-token prompt (lane 0 busy 0 - 1 s, one 1.01 s step) and worker 1 a 100-token one
    # (lane 1 busy 0 - 0.1 s, one 0.11 s step); both engines start at once (no overheads).
    records = [rec(0, 1000, 1), rec(1, 100, 1)]
    fe = {"per_prompt_token_s": 0.001}
    host = {"cores": 2, "contention": 1.0, "baseline_busy": 2}
    shared = run(profile(frontend=fe, host=host), records, workers=2).records.set_index("request_id")
    own = run(profile(frontend=fe, host={**host, "api_on_engine_core": True}), records, workers=2)
    own = own.records.set_index("request_id")
    # the whole host: both lanes' busy time over a step, shared by both engines (1 / cores each)
    assert shared.at[1, "ttft"] == pytest.approx(0.11 + (0.11 + 0.1) / 2)
    assert shared.at[0, "ttft"] == pytest.approx(1.01 + (1.0 + 0.1) / 2)
    # per core: each engine is stretched by its own lane's busy time alone, in full
    assert own.at[1, "ttft"] == pytest.approx(0.11 + 0.1)
    assert own.at[0, "ttft"] == pytest.approx(1.01 + 1.0)


def test_per_core_load_counts_the_engine_its_lanes_and_a_share_of_the_client():
    from kvroute.sim.cluster.cluster import Cluster

    prof = profile(frontend={"per_output_token_s": 0.01},
                   host={"cores": 2, "contention": 1.0, "client_busy": 1.0, "api_on_engine_core": True})
    cluster = Cluster(Trace([rec(0, 100, 1)], block_size=16), ClusterSpec(prof, num_workers=2), 0)
    busy0, busy1 = cluster.host.busy_for(0), cluster.host.busy_for(1)
    assert (busy0(0.0), busy1(0.0)) == (0.0, 0.0)
    cluster.frontends.lanes[1][0].free_at = 0.5  # worker 1's API process streams until 0.5 s
    # times cores: worker 1's core holds its lane (1) and half the client; worker 0's half the client
    assert (busy0(0.0), busy1(0.0)) == (1.0, 3.0)
    assert busy1(1.0) == 2 * 0.5 + 0.5  # over the next second the lane is busy half of it


@pytest.mark.parametrize("client_core,pinned", [(-1, -1), (0, 0), (1, 1), (5, 5)])
def test_a_client_pinned_to_a_workers_core_takes_a_fair_share_of_that_core_alone(client_core, pinned):
    from kvroute.sim.cluster.cluster import Cluster

    prof = profile(frontend={"per_output_token_s": 0.01},
                   host={"cores": 2, "contention": 1.0, "client_busy": 1.0, "api_on_engine_core": True,
                         "client_core": client_core})
    cluster = Cluster(Trace([rec(0, 100, 1)], block_size=16), ClusterSpec(prof, num_workers=2), 0)
    cluster.frontends.lanes[1][0].free_at = 0.5  # worker 1's API process streams until 0.5 s
    # times cores: worker 1's core holds its lane (1); a floating client adds its share (1) to
    # every core's count, a pinned one to none (it is the multiplicative term of its own core)
    floating = client_core < 0
    assert (cluster.host.busy_for(0)(0.0), cluster.host.busy_for(1)(0.0)) == ((1.0, 3.0) if floating else (0.0, 2.0))
    assert cluster.host.client_worker() == pinned
    assert [w.step_cost.client is not None for w in cluster.workers] == [w == pinned for w in range(2)]
    assert cluster.host.client_share(1.0) == 0.5  # the busiest lane fills half of the next second


def test_a_pinned_clients_share_stretches_the_step_as_fair_sharing_whatever_the_contention():
    from kvroute.sim.timing.cost_model import StepCost
    from kvroute.sim.timing.frontend import ContendedStepCost

    cost = StepCost(0.01, 0.0, 0.001, 0.0, 0.0, 0.0)
    host = HostModel(cores=2, contention=0.0, client_busy=1.0, api_on_engine_core=True, client_core=0)
    step = ContendedStepCost(cost, host, lambda d: 5.0, client=lambda d: 0.5)
    assert step.step_time(100, 1, 0.0, 0) == pytest.approx(0.11 * 1.5)
    assert ContendedStepCost(cost, host, lambda d: 5.0).step_time(100, 1, 0.0, 0) == pytest.approx(0.11)


def test_the_pinned_client_slows_its_own_workers_steps_only():
    # two requests, one per worker, streaming 20 tokens each: with the client on worker 1's
    # core, worker 1's decode steps stretch and worker 0's do not (spread, both stretch alike)
    records = [rec(0, 100, 20), rec(1, 100, 20)]
    host = {"cores": 2, "contention": 1.0, "client_busy": 1.0, "api_on_engine_core": True}
    fe = {"per_output_token_s": 0.02}
    spread = run(profile(frontend=fe, host=host), records, workers=2).records.set_index("worker")
    pinned = run(profile(frontend=fe, host={**host, "client_core": 1}), records, workers=2).records.set_index("worker")
    assert spread.at[0, "e2e"] == pytest.approx(spread.at[1, "e2e"])
    assert pinned.at[1, "e2e"] > spread.at[1, "e2e"] > pinned.at[0, "e2e"]


@pytest.mark.parametrize("frontend,host,timer,fast", [
    (None, None, "StepCost", True),
    ({"per_output_token_s": 0.01}, None, "StreamedStepCost", False),
    (None, {"cores": 2, "contention": 1.0}, "ContendedStepCost", False),
    ({"per_output_token_s": 0.01}, {"cores": 2, "contention": 1.0}, "ContendedStepCost", False),
])
def test_each_worker_gets_one_step_timer_and_fast_forwards_only_when_its_step_time_depends_on_the_batch_alone(
        frontend, host, timer, fast):
    from kvroute.sim.cluster.cluster import Cluster
    from kvroute.sim.timing.host import StreamedStepCost

    prof = profile(frontend=frontend, host=host)
    cluster = Cluster(Trace([rec(0, 100, 1)], block_size=16), ClusterSpec(prof, num_workers=2), 0)
    assert [type(w.step_cost).__name__ for w in cluster.workers] == [timer] * 2
    assert [w.fast_forward for w in cluster.workers] == [fast] * 2  # the worker asks its timer
    assert [w.step_cost.fast_forward for w in cluster.workers] == [fast] * 2
    off = Cluster(Trace([rec(0, 100, 1)], block_size=16), ClusterSpec(prof, num_workers=2, fast_forward=False), 0)
    assert [w.fast_forward for w in off.workers] == [False] * 2
    # behind API lanes alone, a step takes its calibrated time
    streamed = StreamedStepCost(prof.step_cost)
    assert streamed.step_time(100, 3, 50.0, 7) == prof.step_cost.step_time(100, 3, 50.0, 7)


def test_each_worker_steps_at_its_own_drawn_speed():
    from kvroute.sim.timing.host import engine_speeds

    # one request per worker, no contention: each TTFT is its one step (0.11 s) times its factor
    records = [rec(0, 100, 1), rec(1, 100, 1), rec(2, 100, 1)]
    host = {"cores": 8, "contention": 0.0}
    even = run(profile(host=host), records, workers=3).records.set_index("worker")
    spread = run(profile(host={**host, "engine_speed_sigma": 0.3}), records, workers=3).records.set_index("worker")
    speeds = engine_speeds(HostModel(cores=8, engine_speed_sigma=0.3), 3, 0)
    assert list(even["ttft"]) == pytest.approx([0.11] * 3)
    assert list(spread["ttft"]) == pytest.approx([0.11 * f for f in speeds])
    assert len(set(speeds)) == 3 and all(0.3 < f < 3.0 for f in speeds)
    assert list(spread["arrival"]) == list(even["arrival"])  # the run's own draws do not move
    assert engine_speeds(HostModel(cores=8, engine_speed_sigma=0.3), 3, 0) == speeds  # seeded
    assert engine_speeds(HostModel(cores=8, engine_speed_sigma=0.3), 3, 1) != speeds
    assert engine_speeds(HostModel(cores=8), 3, 0) == [1.0, 1.0, 1.0]
    many = engine_speeds(HostModel(cores=8, engine_speed_sigma=0.3), 20000, 0)
    assert np.mean(many) == pytest.approx(1.0, abs=0.01)  # mean-one factors
    assert np.std(np.log(many)) == pytest.approx(0.3, abs=0.01)


def test_engine_speed_drawn_anew_every_period():
    from dataclasses import replace as dc_replace

    from kvroute.sim.timing.host import engine_speed_processes, engine_speeds

    # one worker, a 100-token request at 0 s and another at 1.5 s: each TTFT is its one step
    # (0.11 s) times the factor of the period its step starts in (period 1 s: draws 0 and 1)
    records = [rec(0, 100, 1), dc_replace(rec(1, 100, 1), timestamp_ms=1500.0)]
    host = {"cores": 8, "contention": 0.0, "engine_speed_sigma": 0.3}
    per_run = run(profile(host=host), records).records
    periodic = run(profile(host={**host, "engine_speed_period_s": 1.0}), records).records
    model = HostModel(cores=8, engine_speed_sigma=0.3, engine_speed_period_s=1.0)
    speed = engine_speed_processes(model, 1, 0)[0]
    f0, f1 = speed.at(0.0), speed.at(1.5)
    assert f0 == engine_speeds(model, 1, 0)[0] != f1  # the first period keeps the per-run draw
    assert speed.at(0.999) == f0 and speed.at(1.0) == f1 == speed.at(1.999) and speed.factors == [f0, f1]
    assert list(periodic["ttft"]) == pytest.approx([0.11 * f0, 0.11 * f1], abs=1e-12)
    assert list(per_run["ttft"]) == pytest.approx([0.11 * f0, 0.11 * f0], abs=1e-12)
    # later periods' draws depend on the seed and the period only, not on what asked before
    again = engine_speed_processes(model, 1, 0)[0]
    assert again.at(5.5) == speed.at(5.5) and again.factors[1] == f1
    many = engine_speed_processes(model, 1, 0)[0]
    draws = [many.at(k + 0.5) for k in range(20000)]
    assert np.mean(draws) == pytest.approx(1.0, abs=0.01) and np.std(np.log(draws)) == pytest.approx(0.3, abs=0.01)


def test_engine_speed_spread_from_bursts_on_every_server():
    import pandas as pd

    from kvroute.calibrate.calibration.speed import fit_speed

    # two bursts of 4 requests per server; server A's TPOT is e^0.2 times the bursts' geometric
    # mean, B's e^-0.2 (so deviations of +-0.2, scaled by sqrt(2) for two servers)
    rows = []
    for exp_id, base in ((1, 0.01), (2, 0.02)):
        for url, f in (("http://a", np.exp(0.2)), ("http://b", np.exp(-0.2))):
            for _ in range(4):
                last = 0.05 + 10 * base * f  # the usage chunk ends the stream 1 ms after the last token
                rows.append(dict(exp_id=exp_id, rep=0, kind="burst_all", role="burst", url=url, batch=4, n_tokens=11,
                                 ttft_s=0.05, t_done_s=last + 0.001, token_times=f"0.05 {last}", error=None))
    rows.append(dict(exp_id=3, rep=0, kind="burst_all", role="burst", url="http://a", batch=2, n_tokens=11,
                     ttft_s=0.05, t_done_s=9.0, token_times="0.05 9.0", error=None))  # fewer than 4 per server
    # the same deviations over bursts of different spans: the speed does not average out, one
    # factor per run (period 0) fits best
    fit = fit_speed(pd.DataFrame(rows))
    assert fit.bursts == 2 and fit.period_s == 0.0 and fit.method == "bursts"
    assert fit.sigma == pytest.approx(0.2 * np.sqrt(2))
    assert fit_speed(pd.DataFrame(rows[:4])) is None  # one server only


def test_engine_speed_period_from_how_the_spread_shrinks_with_the_burst_span():
    import pandas as pd

    from kvroute.calibrate.calibration.speed import SPEED_PERIODS, fit_speed, window_variance

    assert window_variance(0.5, 1.0) == pytest.approx(1 - 0.5 / 3) and window_variance(4.0, 1.0) == pytest.approx(
        1 / 4 - 1 / 48)
    # bursts whose servers' log TPOT deviate by exactly the model's standard deviation for
    # sigma 0.3 and a 1 s period (a grid point, 2 per decade near it), over spans of 0.3-8 s
    period = min(SPEED_PERIODS, key=lambda p: abs(p - 1.0))
    rows = []
    for exp_id, span in enumerate((0.3, 0.6, 1.0, 2.0, 4.0, 8.0) * 2):
        dev = 0.3 * np.sqrt(window_variance(span, period)) / np.sqrt(2)  # +-dev about the mean, k = 2
        for url, sign in (("http://a", 1), ("http://b", -1)):
            tpot = 0.01 * np.exp(sign * dev)
            for _ in range(4):
                n = int(span / tpot) + 1
                rows.append(dict(exp_id=exp_id, rep=0, kind="burst_all", role="burst", url=url, batch=4, n_tokens=n,
                                 t_send_s=0.0, ttft_s=0.05, t_done_s=0.05 + (n - 1) * tpot,
                                 token_times=f"0.05 {0.05 + (n - 1) * tpot}", error=None))
    fit = fit_speed(pd.DataFrame(rows))
    sigma, got, used = fit.sigma, fit.period_s, fit.bursts
    assert used == 12 and got == pytest.approx(period, rel=0.3) and sigma == pytest.approx(0.3, rel=0.1)
    # the likelihood-ratio interval holds the best period, within the grid, and narrows with data
    lo, hi = fit.interval_s
    assert lo <= got <= hi < 8.0  # 24 deviations leave a wide interval (0.25-3.2 s) but not any period
    few = [r for r in rows if r["exp_id"] in (0, 5)]
    lo2, hi2 = fit_speed(pd.DataFrame(few)).interval_s
    assert lo2 <= lo and hi2 > hi
    assert fit_speed(pd.DataFrame(rows[:4])) is None  # one server only


def test_host_stretch_closed_form():
    host = HostModel(cores=2, contention=0.5, baseline_busy=3, other_busy=1)
    assert host.stretch(2) == 1.0
    assert host.stretch(4) == pytest.approx(1 + 0.5 * 2 / 2)


def test_decode_baseline_counts_the_streaming_share_of_the_calibration():
    """``baseline_stream_busy`` processes count in a step's baseline for the share of it that
    streaming fills; a step without decodes keeps ``baseline_busy``."""
    host = HostModel(cores=2, contention=1.0, baseline_busy=2, baseline_stream_busy=3)
    assert host.baseline(0.004, 0.0) == 2.0
    assert host.baseline(0.004, 0.001) == pytest.approx(2 + 3 * 0.25)
    assert host.baseline(0.004, 0.010) == 5.0  # streaming longer than the step: the whole of it
    assert host.stretch(3.5, host.baseline(0.004, 0.001)) == pytest.approx(1 + 1.0 * (3.5 - 2.75) / 2)
    assert host.stretch(2.5, host.baseline(0.004, 0.001)) == 1.0
    assert HostModel(cores=2, baseline_busy=2).baseline(0.004, 0.001) == 2.0  # not stated: engines only


def test_contended_step_takes_its_streaming_baseline_from_its_decoding_requests():
    """A decode-only step of B requests streams ``per_step_s + B per_output_token_s`` in its
    calibration; a step with a prefill beside B - 1 decodes streams for B - 1; a prefill alone
    for none. Busy processes held at 3.5 on 2 cores, baseline 2 engines + 3 streaming."""
    from kvroute.sim.timing.frontend import ContendedStepCost

    cost = profile().step_cost  # 10 ms + 1 ms per batched token
    fe = FrontendModel(per_step_s=0.002, per_output_token_s=0.0005)
    host = HostModel(cores=2, contention=1.0, baseline_busy=2, baseline_stream_busy=3)
    step = ContendedStepCost(cost, host, lambda d: 3.5, frontend=fe)
    d = 0.01 + 0.004  # 4 decodes
    share = (0.002 + 4 * 0.0005) / d
    assert step.step_time(4, 4, 0.0, 400) == pytest.approx(d * (1 + max(0.0, 3.5 - 2 - 3 * share) / 2))
    d = 0.01 + 0.104  # a 100-token prefill chunk and 4 decodes
    share = (0.002 + 4 * 0.0005) / d
    assert step.step_time(104, 5, 5050.0, 400) == pytest.approx(d * (1 + (3.5 - 2 - 3 * share) / 2))
    assert step.step_time(100, 1, 5050.0, 0) == pytest.approx(0.11 * (1 + 1.5 / 2))
    # two 50-token prefill chunks beside 3 decodes: the engine says 3 decode, not num_reqs - 1 = 4
    d = 0.01 + 0.103
    share = (0.002 + 3 * 0.0005) / d
    assert step.step_time(103, 5, 2550.0, 300, 3) == pytest.approx(d * (1 + (3.5 - 2 - 3 * share) / 2))
    old = ContendedStepCost(cost, HostModel(cores=2, contention=1.0, baseline_busy=2), lambda d: 3.5, frontend=fe)
    assert old.step_time(4, 4, 0.0, 400) == pytest.approx(0.014 * (1 + 1.5 / 2))  # profiles without the term


@pytest.mark.parametrize("section,body,message", [
    ("frontend", {"per_request": 0.1}, "unknown field(s) ['per_request'] in section 'frontend'"),
    ("frontend", {"api_server_count": 0}, "frontend.api_server_count must be >= 1"),
    ("frontend", {"per_output_token_s": -1}, "frontend.per_output_token_s must be finite and >= 0"),
    ("host", {"contention": 1.0}, "section 'host' lacks 'cores'"),
    ("host", {"cores": "two"}, "host.cores must be a number, got 'two'"),
    ("host", {"cores": "2"}, "host.cores must be a number, got '2'"),
    ("host", {"cores": float("inf")}, "host.cores must be a whole number, got inf"),
    ("host", {"cores": 2, "engine_speed_period_s": 1e-12}, "host.engine_speed_period_s must be 0 (one draw per run) or >= 0.001 s"),
    ("frontend", {"per_step_s": "0.001"}, "frontend.per_step_s must be a number, got '0.001'"),
    ("host", {"cores": 2, "engine_speed_sigma": -0.1}, "host.engine_speed_sigma must be finite and >= 0"),
    ("host", {"cores": 2, "engine_speed_sigma": 50}, "host.engine_speed_sigma must be <= 2.0"),
    ("host", {"cores": 2, "engine_speed_sigma": "abc"}, "host.engine_speed_sigma must be a number, got 'abc'"),
    ("host", {"cores": 2, "engine_speed_period_s": -1}, "host.engine_speed_period_s must be finite and >= 0"),
    ("host", {"cores": 2, "api_on_engine_core": 1}, "host.api_on_engine_core must be true or false, got 1"),
    ("host", {"cores": 2, "api_contention": -1}, "host.api_contention must be finite and >= 0, got -1.0"),
    ("host", {"cores": 2, "api_contention": True}, "host.api_contention must be a number, got True"),
    ("host", {"cores": 2, "client_core": -2}, "host.client_core must be a worker index or -1 (floating), got -2"),
    ("host", {"cores": 2, "client_core": "one"}, "host.client_core must be a number, got 'one'"),
    ("host", {"cores": 2, "client_core": 1.5}, "host.client_core must be a whole number, got 1.5"),
    ("host", {"cores": 2.5}, "host.cores must be a whole number, got 2.5"),
    ("frontend", {"per_step_s": False}, "frontend.per_step_s must be a number, got False"),
])
def test_bad_sections_name_the_field(section, body, message):
    with pytest.raises(ValueError, match=r"<dict>: .*" + __import__("re").escape(message)):
        profile(**{section: body})


def test_lane_work_beside_a_busy_engine_on_its_core_takes_one_plus_api_contention_times_as_long():
    # one worker, 1 ms of lane time per prompt token, no overheads, steps never stretched
    # (contention 0), every prompt 100 tokens: lane time 0.1 s, a 0.11 s step each. Sent at 0,
    # 0.05 and 0.06 s: request 0's admission (0 - 0.1 s) meets an idle engine; requests 1 and 2
    # are admitted while the engine has requests, so with api_contention 1 each takes 0.2 s:
    # lane 0.1 - 0.3 and 0.3 - 0.5 s (plain: 0.1 - 0.2 and 0.2 - 0.3 s). The engine gets them at
    # 0, 0.1 and 0.3 s (plain 0.2 s) and emits at 0.11, 0.22 and 0.41 s (plain 0.33 s); a token
    # reaches the client when the lane has done the admissions queued before it.
    records = [TraceRecord(i, t, 100, 1, tuple(range(100 * i, 100 * i + 7))) for i, t in enumerate((0.0, 50.0, 60.0))]
    fe = {"per_prompt_token_s": 0.001}
    host = {"cores": 2, "api_on_engine_core": True}
    spec = lambda prof: ClusterSpec(prof, num_workers=1, arrival_spread_s=0.0, closed_loop=False)  # noqa: E731
    trace = Trace(records, block_size=16)
    stretched = simulate(trace, spec(profile(frontend=fe, host={**host, "api_contention": 1.0})), seed=0)
    plain = simulate(trace, spec(profile(frontend=fe, host=host)), seed=0)
    assert stretched.records.sort_values("request_id")["ttft"].tolist() == pytest.approx([0.5, 0.45, 0.44])
    assert plain.records.sort_values("request_id")["ttft"].tolist() == pytest.approx([0.3, 0.25, 0.27])


def test_api_contention_needs_the_api_process_on_the_engines_core():
    from kvroute.sim.cluster.cluster import Cluster

    fe = {"per_prompt_token_s": 0.001}
    trace = Trace([rec(0, 100, 1)], block_size=16)
    whole_host = Cluster(trace, ClusterSpec(profile(frontend=fe, host={"cores": 2, "api_contention": 1.0})), 0)
    assert whole_host.frontends.slowdown is None
    own = Cluster(trace, ClusterSpec(profile(frontend=fe, host={"cores": 2, "api_contention": 1.0,
                                                                 "api_on_engine_core": True})), 0)
    assert own.frontends.slowdown(0, 0.0) == 1.0  # the engine has no requests


def test_lane_work_left_counts_a_stretched_item_at_its_own_cpu_time():
    lane = FifoLane()
    assert lane.submit(0.0, 1.0, factor=2.0) == (0.0, 2.0)  # 1 s of work beside a computing engine
    assert lane.submit(1.0, 0.5) == (2.0, 2.5)
    assert lane.busy_time == 2.5
    assert [lane.work_left(t) for t in (0.0, 1.0, 2.2, 3.0)] == pytest.approx([1.5, 1.0, 0.3, 0.0])


def test_the_engine_is_stretched_by_its_lanes_cpu_time_not_by_its_stretched_time():
    # one worker, its API process on its core, fair sharing both ways (contention 1,
    # api_contention 1), 1 ms of lane time per prompt token, steps 10 ms + 1 ms per token.
    # Request 0 (10 tokens, 2 outputs) at 0 s: lane 0 - 0.01 s (engine idle: not stretched);
    # its step (0.02 s) shares the core with that 0.01 s of lane work: x 1.5, emits at 0.03 s.
    # Request 1 (5 tokens, 1 output) at 0.025 s, while the engine computes: 0.005 s of work
    # stretched to 0.025 - 0.035 s. The next step (one decode + 5 prefill tokens, 0.016 s) starts
    # at 0.03 s with 0.005 s of that item left: 0.0025 s of CPU, a share of 0.15625 of the step:
    # x 1.15625, 0.0185 s, emits at 0.0485 s (counting the stretched time would give 0.051 s).
    records = [TraceRecord(0, 0.0, 10, 2, (0,)), TraceRecord(1, 25.0, 5, 1, (1,))]
    prof = profile(frontend={"per_prompt_token_s": 0.001},
                   host={"cores": 2, "contention": 1.0, "api_on_engine_core": True, "api_contention": 1.0})
    spec = ClusterSpec(prof, num_workers=1, arrival_spread_s=0.0, closed_loop=False)
    recs = simulate(Trace(records, block_size=16), spec, seed=0).records.set_index("request_id")
    assert recs.at[0, "first_token"] == pytest.approx(0.035)  # the token waits for request 1's admission
    assert recs.at[0, "finish"] == pytest.approx(0.0485)
    assert recs.at[1, "ttft"] == pytest.approx(0.0485 - 0.025)


def _bench_validate():
    """``bench/bench_validate.py`` as a module (it is a script, not part of the package)."""
    import importlib.util

    from tests.support.paths import ROOT

    path = ROOT / "bench" / "bench_validate.py"
    spec = importlib.util.spec_from_file_location("bench_validate", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_validate_names_the_server_sharing_the_clients_core():
    bench = _bench_validate()
    # server i runs on core i: one pinned core that holds a server names it; else the client floats
    assert [bench.client_core(c, 2) for c in ("1", "0", "0-1", "1,0", "3", None, "")] == [1, 0, -1, -1, -1, -1, -1]


def test_bench_validate_reads_the_hosts_cpu_shares(tmp_path):
    bench = _bench_validate()
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    before = bench.host_cpu_times(stat)
    assert before == {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 10, "irq": 0, "softirq": 0,
                      "steal": 40}
    stat.write_text("cpu  400 0 150 1200 10 0 0 90 0 0\n")
    # 850 ticks between the readings: 300 + 100 busy, 400 idle, 50 stolen
    assert bench.host_cpu_shares(before, bench.host_cpu_times(stat)) == {"busy": 100 * 400 / 850,
                                                                          "steal": 100 * 50 / 850}
    assert bench.host_cpu_shares(before, before) is None and bench.host_cpu_shares(None, before) is None
    assert bench.host_cpu_times(tmp_path / "absent") is None
    for bad in ("", "cpu  1 2 3\n", "cpu  1 2 x 4 5 6 7 8\n", "intr 1 2 3 4 5 6 7 8\n"):
        stat.write_text(bad)
        assert bench.host_cpu_times(stat) is None, bad


def test_bench_validate_counts_coverage_per_profile_and_shape():
    bench = _bench_validate()
    row = dict(profile="p", level=0.9, live_rounds=3)
    rows = [dict(row, shape="long-chats", inside=True), dict(row, shape="long-chats", inside=False),
            dict(row, shape="open-loop", inside=True, live_rounds=6), dict(row, shape="open-loop", inside=None, live_rounds=6),
            dict(profile="q", shape="open-loop", level=0.9, live_rounds=6, inside=True)]
    assert bench.coverage_lines(rows) == [
        "coverage p: 2 of 3 measured values inside the 90 % interval (67 %; target >= 85 %): "
        "long-chats 1/2 (3 live rounds), open-loop 1/1 (6 live rounds)",
        "coverage q: 1 of 1 measured values inside the 90 % interval (100 %; target >= 85 %): open-loop 1/1 (6 live rounds)"]


def test_bench_validate_keeps_single_round_coverage_apart_from_the_means():
    bench = _bench_validate()
    mean = dict(profile="p", level=0.9, live_rounds=3, shape="long-chats", inside=True)
    single = dict(mean, live_rounds=1, one_round=True)
    rows = [mean, dict(single, round=0, inside=False), dict(single, round=1), dict(single, round=2)]
    assert bench.coverage_lines(rows) == [
        "coverage p: 1 of 1 measured values inside the 90 % interval (100 %; target >= 85 %): "
        "long-chats 1/1 (3 live rounds)",
        "coverage p: 2 of 3 single live rounds inside their one-round 90 % interval (67 %; target >= 85 %): "
        "long-chats 2/3 (single rounds)"]


def test_a_request_leaves_the_lane_map_when_its_reply_is_done():
    """``Frontends`` keeps which lane streams a request while it is in flight only: a finished
    request is forgotten, so a long trace does not grow the map."""
    from kvroute.sim.cluster.cluster import Cluster

    frontends = Frontends(FrontendModel(per_output_token_s=0.01), num_workers=1)
    frontends.admit(0, 7, 0.0, 100)
    assert frontends.deliver(0, 7, 0.1) == pytest.approx(0.11)
    frontends.release(7)
    frontends.release(7)  # twice: nothing left to forget
    assert frontends._lane_of == {}
    prof = profile(frontend={"per_output_token_s": 0.01})
    cluster = Cluster(Trace([rec(i, 100, 4) for i in range(6)], block_size=16), ClusterSpec(prof, num_workers=2), 0)
    cluster.run()
    assert cluster.frontends._lane_of == {} and all(r.output_tokens == 4 for r in cluster.records)


@pytest.mark.parametrize("memory,message", [
    ({}, "field 'memory.gpu_memory_bytes': required field missing"),
    (False, "field 'memory': missing or invalid section (expected an object, got a boolean)"),
])
def test_an_empty_or_false_memory_section_is_refused_not_skipped(memory, message):
    import json
    from pathlib import Path

    import kvroute.sim.timing.profile as profiles

    doc = json.loads((Path(profiles.__file__).parent / "profiles" / "a6000-qwen2.5-7b.json").read_text())
    with pytest.raises(ValueError, match="x.json: " + __import__("re").escape(message)):
        profiles.profile_from_dict({**doc, "memory": memory}, "x.json")
