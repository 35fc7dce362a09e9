"""The concurrency sweep's plan, the burst replay in the simulator and the front-end fit."""

from dataclasses import replace

import numpy as np
import pytest

from kvroute.calibrate.calibration.bursts import (Burst, burst_table, fit_frontend, profile_sections, schedule_delay,
                                                  simulate_burst)
from kvroute.calibrate.calibration.sweep_plan import SweepPlan
from kvroute.sim.timing.frontend import FrontendModel, HostModel
from kvroute.sim.timing.profile import profile_from_dict


def base_profile():
    """Steps 2 ms + 20 us per token + 0.2 us per decode context token; API 5 ms unloaded."""
    return profile_from_dict({
        "name": "t",
        "engine": {"block_size": 32, "num_gpu_blocks": 20000, "max_num_batched_tokens": 2048,
                   "max_num_seqs": 128, "max_model_len": 32768},
        "step_cost": {"step_overhead_s": 0.002, "weight_load_s": 0.0, "per_token_s": 2e-5,
                      "per_request_s": 1e-5, "prefill_attn_s": 0.0, "decode_attn_s": 2e-7},
        "overheads": {"api_server_s": 0.005, "api_server_per_token_s": 1e-6, "gateway_s": 0.0, "jitter_cv": 0.0},
    })


def test_plan_lists_bursts_on_one_server_in_turn_and_on_all():
    plan = SweepPlan(burst_sizes=(1, 8), burst_shapes=((256, 32), (2048, 16)), burst_reps=1, burst_cached_sizes=())
    exps = plan.bursts(num_servers=2, first_id=100, capacity_tokens=8 * 2064 + 100)
    assert [(e["kind"], e["batch"], e["prompt_len"], e.get("server")) for e in exps] == [
        ("burst", 1, 256, 0), ("burst_all", 1, 256, None), ("burst", 8, 256, 1), ("burst_all", 8, 256, None),
        ("burst", 1, 2048, 0), ("burst_all", 1, 2048, None)]  # 8 x 2064 tokens exceed 90 % of capacity
    assert [e["exp_id"] for e in exps] == list(range(100, 106))
    assert SweepPlan.preset("full").burst_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert SweepPlan().burst_sizes == () and SweepPlan.preset("full").without_bursts().burst_sizes == ()
    assert SweepPlan.preset("full").clipped(1024).burst_shapes == ((256, 32),)


def test_plan_lists_bursts_on_a_cached_prefix_after_the_cold_ones():
    plan = SweepPlan(burst_sizes=(1,), burst_shapes=((256, 32),), burst_reps=1, burst_cached_sizes=(2, 8),
                     burst_cached_shapes=((2048, 256, 32),))
    exps = plan.bursts(num_servers=2, first_id=0, capacity_tokens=21_000)
    assert [(e["kind"], e["batch"], e["prompt_len"], e["prefix_len"], e.get("server")) for e in exps] == [
        ("burst", 1, 256, 0, 0), ("burst_all", 1, 256, 0, None),
        ("burst", 2, 2304, 2048, 1), ("burst_all", 2, 2304, 2048, None),
        ("burst", 8, 2304, 2048, 0), ("burst_all", 8, 2304, 2048, None)]
    assert replace(plan, burst_sizes=()).bursts(2, 0) == []  # no concurrency sweep, no cached bursts either
    alone = replace(plan, cold_lengths=(), cached_prefixes=(), decode_contexts=(), mixed_batches=())
    assert alone.longest_sequence() == (2304, 2336)
    assert SweepPlan.preset("full").clipped(2200).burst_cached_shapes == ()


def test_burst_on_a_cached_prefix_is_replayed_after_one_warm_request_per_server():
    from kvroute.calibrate.calibration.bursts import WARM_LEAD_S, burst_trace
    from kvroute.sim.cluster.cluster import ClusterSpec, simulate

    b = Burst(0, "burst_all", 2, 2, 512 + 100, 8, (0.0, 0.0001, 0.0002, 0.0003), {}, prefix_len=512 + 16)
    trace = burst_trace(b, 32)
    # warm requests: server j's 16 whole prefix blocks plus its partial 17th
    assert [(r.request_id, r.timestamp_ms, r.input_length, r.output_length) for r in trace.records[:2]] == [
        (0, 0.0, 528, 1), (1, 0.0, 528, 1)]
    assert trace.records[0].hash_ids == tuple(range(20_000_000, 20_000_016)) + (30_000_000,)
    assert trace.records[3].hash_ids[:16] == trace.records[1].hash_ids[:16]  # 2nd send -> worker 1's prefix
    assert trace.records[3].hash_ids[16:] == tuple(range(10_000_036, 10_000_040))  # its own 4 blocks
    assert trace.records[2].timestamp_ms == 1000.0 * WARM_LEAD_S
    spec = ClusterSpec(base_profile(), num_workers=2, policy="round_robin", arrival_spread_s=0.0, closed_loop=False)
    rec = simulate(trace, spec, 0).records.sort_values("request_id")
    assert rec["worker"].tolist() == [0, 1, 0, 1, 0, 1]
    assert rec["cached_tokens"].tolist() == [0, 0, 512, 512, 512, 512]
    assert simulate_burst(b, base_profile())["ttft_mean_s"] > 0


def _bursts(truth, sizes=(1, 4, 16), shapes=((256, 16), (1024, 8))):
    out = []
    for k, (L, T) in enumerate(shapes):
        for N in sizes:
            for servers in (1, 2):
                send = tuple(np.linspace(0.0, 0.0005 * (N * servers - 1), N * servers))
                b = Burst(len(out), "burst" if servers == 1 else "burst_all", servers, N, L, T, send, {})
                out.append(replace(b, measured=simulate_burst(b, truth)))
    return out


def test_burst_of_one_is_predicted_as_the_one_at_a_time_profile():
    prof = base_profile()
    b = Burst(0, "burst", 1, 1, 256, 4, (0.0,), {})
    m = simulate_burst(b, prof)
    prefill = 0.002 + 2e-5 * 256 + 1e-5
    decode = 0.002 + 2e-5 + 1e-5 + 2e-7 * 257
    assert m["ttft_mean_s"] == pytest.approx(0.005 + 256e-6 + prefill)
    assert m["ttft_last_s"] == m["ttft_mean_s"]
    assert m["tpot_mean_s"] == pytest.approx(decode + 2e-7 * 1, rel=1e-2)


def test_fit_recovers_burst_figures_of_known_terms():
    # streaming (1 ms per token) is slower than a 16-request decode step: the API paces tokens
    prof = base_profile()
    truth = replace(prof, frontend=FrontendModel(1, 0.004, 1e-6, 1e-3),
                    host=HostModel(cores=2, contention=0.6, baseline_busy=2))
    bursts = _bursts(truth, sizes=(2, 16))
    ff = fit_frontend(bursts, prof, cores=2, baseline_busy=2, max_evals=60)
    before = np.median(np.abs(ff.before["error_pct"]))
    after = np.median(np.abs(ff.after["error_pct"]))
    assert before > 10 and after < 2, (before, after)
    # admission and streaming trade off a little in these figures; so does contention, which only
    # acts for the share of a step that queued API work fills
    assert ff.frontend.per_request_s == pytest.approx(0.004, rel=0.35)
    assert ff.frontend.per_output_token_s == pytest.approx(1e-3, rel=0.1)
    assert ff.host.contention == pytest.approx(0.6, abs=0.35)
    # the range the bursts allow is taken at the final terms, so it holds the fitted contention
    low, high = ff.contention_interval
    assert low <= ff.host.contention <= high
    doc = profile_sections(ff)
    assert doc["host"]["cores"] == 2 and doc["frontend"]["per_prompt_token_s"] == 1e-6
    reloaded = profile_from_dict({**prof.raw, "frontend": doc["frontend"], "host": doc["host"]})
    assert reloaded.frontend.per_output_token_s == pytest.approx(ff.frontend.per_output_token_s, rel=1e-5)
    assert reloaded.host.contention == pytest.approx(ff.host.contention, rel=1e-5)


def test_fit_keeps_the_stated_per_core_placement_in_the_profile():
    prof = base_profile()
    truth = replace(prof, frontend=FrontendModel(1, 0.004, 1e-6, 1e-3),
                    host=HostModel(cores=2, contention=0.6, baseline_busy=2, api_on_engine_core=True))
    ff = fit_frontend(_bursts(truth, sizes=(2,)), prof, cores=2, baseline_busy=2, max_evals=10,
                      api_on_engine_core=True, api_contention=1.0)
    assert ff.host.api_on_engine_core is True and ff.host.api_contention == 1.0
    doc = profile_sections(ff)
    assert doc["host"]["api_on_engine_core"] is True and doc["host"]["api_contention"] == 1.0
    reloaded = profile_from_dict({**prof.raw, "frontend": doc["frontend"], "host": doc["host"]}).host
    assert reloaded.api_on_engine_core and reloaded.api_contention == 1.0
    shared = fit_frontend(_bursts(prof, sizes=(2,)), prof, cores=2, baseline_busy=2, max_evals=10)
    # profiles without them stay as they were
    assert not {"api_on_engine_core", "api_contention"} & set(profile_sections(shared)["host"])


def test_burst_table_reports_each_metric():
    prof = base_profile()
    bursts = _bursts(prof, sizes=(2,), shapes=((256, 4),))
    table = burst_table(bursts, prof)
    assert set(table["metric"]) == {"ttft_mean_s", "ttft_last_s", "tpot_mean_s", "complete_s", "engine_ttft_s",
                                    "engine_itl_s", "engine_first_s"}
    assert np.allclose(table["error_pct"], 0.0)


def test_engine_figures_of_a_burst_are_vllm_s_histogram_means():
    # Two 256-token requests at once on one server, 4 tokens each. Both reach the engine at
    # 5.256 ms (API 5 ms + 1 us per prompt token) and are prefilled in one step of 2 ms + 512 x
    # 20 us + 2 x 10 us = 12.26 ms: engine TTFT (queue 0 + prefill) 12.26 ms. Three decode steps
    # follow, each 2 ms + 2 x 20 us + 2 x 10 us + 0.2 us per context token (514, 516, 518):
    # engine ITL their mean, 2.1632 ms.
    b = Burst(0, "burst", 1, 2, 256, 4, (0.0, 0.0), {})
    m = simulate_burst(b, base_profile())
    assert m["engine_ttft_s"] == pytest.approx(0.01226, abs=1e-12)
    assert m["engine_itl_s"] == pytest.approx(0.0021632, abs=1e-12)


def test_engine_first_token_of_a_burst_is_its_mean_time_from_send_to_the_end_of_the_prefill_step():
    # as above: both reach the engine at 5.256 ms and their prefill step ends 12.26 ms later
    m = simulate_burst(Burst(0, "burst", 1, 2, 256, 4, (0.0, 0.0), {}), base_profile())
    assert m["engine_first_s"] == pytest.approx(0.005256 + 0.01226, abs=1e-12)


def test_a_burst_measures_engine_first_token_only_when_every_request_was_timed():
    import math

    import pandas as pd

    from kvroute.calibrate.calibration.bursts import load_bursts

    def rows(exp_id, engine):
        return [dict(url="u", exp_id=exp_id, kind="burst", role="burst", batch=2, prompt_len=64, prefix_len=0,
                     max_tokens=1, t_send_s=0.001 * i, ttft_s=0.02, t_done_s=0.021, n_tokens=1, token_times="0.02",
                     error=None, engine_first_token_s=e) for i, e in enumerate(engine)]
    req = pd.DataFrame(rows(1, [0.010, 0.014]) + rows(2, [0.010, math.nan]))
    (timed, untimed), _ = load_bursts(req, pd.DataFrame())
    assert timed.measured["engine_first_s"] == pytest.approx(0.012)
    assert math.isnan(untimed.measured["engine_first_s"])
    old, _ = load_bursts(req.drop(columns=["engine_first_token_s"]), pd.DataFrame())  # a sweep without events
    assert all(math.isnan(b.measured["engine_first_s"]) for b in old)


def test_api_cpu_of_a_burst_is_the_lane_work_the_front_end_terms_give():
    from kvroute.calibrate.calibration.bursts import api_busy_s
    import pandas as pd

    # formula: admissions, streamed tokens and one per_step_s per engine step, per server
    fe = FrontendModel(1, 1e-3, 1e-6, 1e-4, 5e-4)
    prof = replace(base_profile(), frontend=fe)
    recs = pd.DataFrame({"prompt_tokens": [256, 300], "output_tokens": [4, 5]})
    assert api_busy_s(prof, recs, 7, 2) == (2e-3 + 1e-6 * 556 + 1e-4 * 9 + 5e-4 * 7) / 2
    assert np.isnan(api_busy_s(base_profile(), recs, 7, 1))  # no front-end terms: no lanes
    # two 256-token requests at once, 4 tokens each; no admission work, so both reach the engine
    # together: one prefill step and 3 decode steps, each streaming both requests' tokens
    fe = FrontendModel(1, 0.0, 0.0, 1e-4, 5e-4)
    prof = replace(base_profile(), frontend=fe)
    prof = replace(prof, overheads=replace(prof.overheads, api_server_per_token_s=0.0))
    m = simulate_burst(Burst(0, "burst", 1, 2, 256, 4, (0.0, 0.0), {}), prof)
    assert m["api_cpu_s"] == pytest.approx(8 * 1e-4 + 4 * 5e-4, abs=1e-15)


def test_schedule_delay_of_the_last_request_in_a_burst_is_its_queue_of_admissions():
    # admission (50 ms + 1 us/token) is the whole unloaded API time and far longer than a step,
    # so request i is scheduled the moment its admission ends: (i + 1) admissions after the send
    prof = base_profile()
    prof = replace(prof, overheads=replace(prof.overheads, api_server_s=0.05),
                   frontend=FrontendModel(1, 0.05, 1e-6, 0.0))
    b = Burst(0, "burst", 1, 4, 256, 1, (0.0, 0.0, 0.0, 0.0), {})
    d = schedule_delay(b, prof)
    assert d["last_delay_s"] == pytest.approx(4 * (0.05 + 256e-6))
    prefill = 0.002 + 2e-5 * 256 + 1e-5
    assert d["mean_prefill_s"] == pytest.approx(prefill)
    assert d["comparable_s"] == pytest.approx(d["last_ttft_s"] - prefill)


SERVER = dict(url="http://s0", model="m", model_root="/m", served_models=["m"], vllm_version="0.32.0",
              max_model_len=32768, block_size=32, num_gpu_blocks=20000, enable_prefix_caching=True,
              max_num_batched_tokens=2048, max_num_seqs=128)


def test_fit_command_with_a_base_profile_adds_only_the_burst_terms(tmp_path):
    import json

    import pandas as pd
    from click.testing import CliRunner

    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.profile import load_profile

    prof = base_profile()
    base = tmp_path / "base.json"
    base.write_text(json.dumps(prof.raw))
    truth = replace(prof, frontend=FrontendModel(1, 0.004, 1e-6, 1e-3))
    rows = []
    for k, b in enumerate(_bursts(truth, sizes=(2, 8), shapes=((256, 4),))):
        urls = [f"http://s{i % b.num_servers}" for i in range(len(b.send_s))]
        res = simulate_burst(b, truth)  # every request alike: use the burst's mean figures
        for i, (t, url) in enumerate(zip(b.send_s, urls)):
            ttft, tpot = res["ttft_mean_s"], res["tpot_mean_s"]
            times = " ".join(f"{ttft + j * tpot:.6f}" for j in range(b.max_tokens))
            rows.append(dict(url=url, exp_id=k, kind=b.kind, role="burst", batch=b.batch, prompt_len=b.prompt_len,
                             max_tokens=b.max_tokens, t_send_s=t, ttft_s=ttft, t_done_s=ttft + 3 * tpot,
                             n_tokens=b.max_tokens, token_times=times, error=None))
    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame(rows).to_csv(run / "requests.csv", index=False)
    (run / "meta.json").write_text(json.dumps({"status": "complete", "urls": ["http://s0", "http://s1"],
                                               "client_host": {"cores": 2}, "servers": [SERVER]}))
    out = tmp_path / "with-bursts.json"
    result = CliRunner().invoke(calibrate, ["fit", str(run), "--base-profile", str(base), "--out", str(out),
                                            "--client-busy", "0"])
    assert result.exit_code == 0, result.output
    assert "one request at a time: kept from" in result.output and "burst errors" in result.output
    fitted = load_profile(out)
    assert fitted.name == "with-bursts" and fitted.step_cost == prof.step_cost and fitted.overheads == prof.overheads
    assert fitted.frontend is not None and fitted.host.cores == 2 and fitted.host.baseline_busy == 2
    assert fitted.host.engine_spin_s == 1.0 and "shm_broadcast" in fitted.raw["sources"]["host.engine_spin_s"]
    assert "base_profile" in fitted.raw["provenance"]
    assert fitted.host.api_on_engine_core is False and fitted.host.api_contention == 0.0
    own = tmp_path / "own.json"
    result = CliRunner().invoke(calibrate, ["fit", str(run), "--base-profile", str(base), "--out", str(own),
                                            "--client-busy", "0", "--api-cores", "own", "--api-contention", "0.5"])
    assert result.exit_code == 0, result.output
    fitted = load_profile(own)
    assert fitted.host.api_on_engine_core is True and fitted.host.api_contention == 0.5
    assert "stated" in fitted.raw["sources"]["host.api_contention"]
    # refitted on that profile without the term, its source goes with it
    again = tmp_path / "again.json"
    result = CliRunner().invoke(calibrate, ["fit", str(run), "--base-profile", str(own), "--out", str(again),
                                            "--client-busy", "0", "--api-cores", "own", "--api-contention", "0"])
    assert result.exit_code == 0, result.output
    assert load_profile(again).host.api_contention == 0.0
    assert "host.api_contention" not in load_profile(again).raw["sources"]


def test_contention_interval_is_the_profile_likelihood_range_on_the_grid():
    """Loss 10 + 10 (c - 1)^2 with 10 residuals: the bound 10 (1 + 3.84 / 10) = 13.84 admits
    |c - 1| <= sqrt(0.384) = 0.6197: walking out from 1, the grid gives 0.8 and 0.4 below (0.2
    is out) and 1.6 above (3.2 is out), then six bisections of the steps where the loss crosses
    the bound, 0.2-0.4 and 1.6-3.2, narrow each end to 1/64 of its step."""
    from kvroute.calibrate.calibration.bursts import contention_interval

    seen = []

    def loss(c):
        seen.append(c)
        return 10.0 + 10.0 * (c - 1.0) ** 2

    low, high = contention_interval(loss, 1.0, 10.0, 10)
    # only the grid points walked are simulated, not 0, 0.05, 0.1 or 4
    assert seen == pytest.approx([0.8, 0.4, 0.2, 0.3, 0.35, 0.375, 0.3875, 0.38125, 0.378125,
                                  1.6, 3.2, 2.4, 2.0, 1.8, 1.7, 1.65, 1.625])  # midpoints in floating point
    # the last points within the bound at 1/64 of the step: 0.38125 (0.378125 is out: loss 13.867)
    # and 1.6 itself (1.625 is out: loss 13.906)
    assert (low, high) == (0.38125, 1.6)
    assert loss(low) <= 13.84 < loss(low - 0.2 / 64) and loss(high) <= 13.84 < loss(high + 1.6 / 64)
    # a loss no grid point comes near: only the fitted value; no residuals: the fitted value
    assert contention_interval(lambda c: 1e6, 0.7, 1.0, 10) == (0.7, 0.7)
    assert contention_interval(lambda c: 0.0, 0.7, 0.0, 0) == (0.7, 0.7)


def test_a_narrow_contention_range_prints_two_numbers():
    from kvroute.calibrate.calibration.bursts import _span

    assert _span(3.99568, 4.0) == "3.9957-4.0000"
    assert _span(1.6, 1.72309) == "1.6-1.72"
    assert _span(0.7, 0.7) == "0.7-0.7"


def test_sweep_schedule_spreads_the_bursts_through_the_one_at_a_time_experiments():
    from kvroute.calibrate.calibration.sweep_plan import sweep_schedule

    shares = [[{"exp_id": i} for i in range(0, 10, 2)], [{"exp_id": i} for i in range(1, 10, 2)]]
    bursts = [{"exp_id": 100 + i} for i in range(7)]
    ids = lambda xs: [e["exp_id"] for e in xs]  # noqa: E731
    steps = [([ids(s) for s in segments], ids(chunk)) for segments, chunk in sweep_schedule(shares, bursts, 3, seed=0)]
    assert steps == [([[0], [1]], [102, 104]), ([[2, 4], [3, 5]], [103, 106]), ([[6, 8], [7, 9]], [105, 100, 101])]
    # one slot: every burst, in the plan's order, after every one-at-a-time experiment
    assert [([ids(s) for s in segments], ids(chunk)) for segments, chunk in sweep_schedule(shares, bursts, 1)] == [
        ([[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]], list(range(100, 107)))]
    with pytest.raises(ValueError, match="burst_slots must be >= 1"):
        sweep_schedule(shares, bursts, 0)


def test_fit_summary_prints_lane_times_in_a_readable_unit():
    from kvroute.calibrate.calibration.bursts import _time

    assert [_time(x) for x in (0.0, 5.2569e-07, 0.000726343, 0.0009996, 0.00174, 0.99996, 2.5)] == [
        "0 us", "0.526 us", "726 us", "1 ms", "1.74 ms", "1 s", "2.5 s"]


def test_a_bursts_engine_ttft_adds_the_engine_admission_the_one_at_a_time_fit_put_before_the_engine():
    """A metrics-mode fit measured 2 ms + 1 us per prompt token of the engine's queue + prefill
    time beyond the step costs and put it into the API-server time: the simulated engine TTFT of
    a burst adds it back (12.26 ms + 2 ms + 256 us), as vLLM's histograms count it."""
    import copy

    prof = base_profile()
    raw = copy.deepcopy(prof.raw)
    raw.setdefault("provenance", {}).setdefault("fit", {})["overhead_parts"] = {
        "engine_admission_s": 0.002, "engine_admission_per_token_s": 1e-6}
    m = simulate_burst(Burst(0, "burst", 1, 2, 256, 4, (0.0, 0.0), {}), replace(prof, raw=raw))
    assert m["engine_ttft_s"] == pytest.approx(0.01226 + 0.002 + 256e-6, abs=1e-12)


def test_a_profile_that_pays_the_engine_admission_in_the_step_has_it_counted_once():
    """With ``overheads.engine_admission_s`` the simulated step that first schedules a request
    holds the admission (its prefill time, as vLLM's histograms count it), so the burst's engine
    TTFT does not add the provenance's figure again. The burst's two requests share their first
    step, so each now waits for both admissions: 12.26 ms + 2 x (2 ms + 256 us), where the
    admission before the engine gave one each (the test above)."""
    import copy

    prof = base_profile()
    raw = copy.deepcopy(prof.raw)
    raw.setdefault("provenance", {}).setdefault("fit", {})["overhead_parts"] = {
        "engine_admission_s": 0.002, "engine_admission_per_token_s": 1e-6}
    overheads = replace(prof.overheads, api_server_s=max(prof.overheads.api_server_s, 0.002),
                        api_server_per_token_s=max(prof.overheads.api_server_per_token_s, 1e-6),
                        engine_admission_s=0.002, engine_admission_per_token_s=1e-6)
    in_step = replace(prof, raw=raw, overheads=overheads)
    from kvroute.calibrate.calibration.bursts import engine_admission_s

    assert engine_admission_s(in_step, 256) == 0.0
    m = simulate_burst(Burst(0, "burst", 1, 2, 256, 4, (0.0, 0.0), {}), in_step)
    assert m["engine_ttft_s"] == pytest.approx(0.01226 + 2 * (0.002 + 256e-6), abs=1e-12)


@pytest.mark.parametrize("api_own", [False, True])
def test_contention_at_its_bound_suggests_api_cores_own_only_when_the_fit_was_not_given_it(api_own):
    import pandas as pd

    from kvroute.calibrate.calibration.bursts import CONTENTION_BOUND, FrontendFit

    host = HostModel(cores=2, contention=CONTENTION_BOUND, api_on_engine_core=api_own)
    empty = pd.DataFrame(columns=["kind", "metric", "error_pct"])
    line = FrontendFit(FrontendModel(), host, empty, empty, 0.0, 0).summary().splitlines()[1]
    hint = "; were the API processes on their engines' cores, fit --api-cores own?"
    assert f"contention 4 (at its bound 4: the bursts ask for more than the host model gives{'' if api_own else hint})" in line


def test_the_fit_says_when_its_terms_fit_the_cold_bursts_latencies_worse_than_none():
    """A quick sweep's fit took median burst TTFT errors from 28.8 % to 40.8 % without a word."""
    import math

    import pandas as pd

    from kvroute.calibrate.calibration.bursts import FrontendFit

    def table(errors: dict, api_cpu: float | None = None) -> pd.DataFrame:
        rows = [{"exp_id": e, "kind": "burst", "prefix_len": prefix, "metric": "ttft_mean_s", "error_pct": pct}
                for (e, prefix), pct in errors.items()]
        if api_cpu is not None:  # only the profile with terms predicts the API process's CPU time
            rows.append({"exp_id": 1, "kind": "burst", "prefix_len": 0, "metric": "api_cpu_s", "error_pct": api_cpu})
        return pd.DataFrame(rows)

    before = table({(1, 0): 10.0, (2, 0): -20.0, (3, 512): 0.0})
    after = table({(1, 0): 40.0, (2, 0): -20.0, (3, 512): 90.0}, api_cpu=300.0)
    fit = FrontendFit(FrontendModel(), HostModel(cores=2), before, after, 0.0, 0)
    want = (math.log(1.1) ** 2 + math.log(0.8) ** 2, math.log(1.4) ** 2 + math.log(0.8) ** 2, 2)
    assert fit.latency_misfit() == pytest.approx(want, rel=1e-12)  # cold figures both predict: not api_cpu, not exp 3
    assert fit.worse_note() == (
        "WORSE: the cold bursts' latencies fit worse with these terms than with none (sum of squared log ratios "
        "over the 2 figures both predict: 0.0589 -> 0.163): the fit weighs them with the API process's CPU seconds "
        "and carries the stated host terms; 2 cold bursts may be too few to fit them (a sweep with more bursts, "
        "measure --preset full, fits them from more)")
    assert fit.worse_note() in fit.summary().splitlines()
    assert profile_sections(fit)["burst_fit"]["cold_latency_misfit"] == {
        "without_terms": 0.0588771, "with_terms": 0.163007, "figures": 2}
    # within 5 %: no line
    near = table({(1, 0): 10.5, (2, 0): -20.0})
    assert FrontendFit(FrontendModel(), HostModel(cores=2), before, near, 0.0, 0).worse_note() is None
