"""The calibration sweep's time estimate (``kvroute.calibrate.calibration.sweep_time``): each
experiment's arithmetic against hand-computed values on a toy profile whose coefficients are
binary fractions (so the sums are exact), the slot schedule, and ``measure --dry-run``."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kvroute.calibrate.calibration.measure import run_sweep
from kvroute.calibrate.calibration.sweep_plan import SweepPlan
from kvroute.calibrate.calibration.sweep_time import (PRIOR_SHARE, EngineShape, SweepEstimate, SweepTimer,
                                                      TimeLeft, estimate_sweep)
from kvroute.cli.main import cli
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.frontend import FrontendModel
from kvroute.sim.timing.profile import Overheads, Profile
from tests.calibrate.calibration.test_calibrate import TINY_PLAN, fake_server  # noqa: F401 (a fixture)

# step = 1 + 0.25 * tokens + 0.5 * requests + 0.125 * decode context tokens (no attention in prefill)
TOY = Profile(
    name="toy",
    engine=EngineConfig(block_size=4, num_gpu_blocks=1001, max_num_batched_tokens=8, max_num_seqs=64,
                        max_model_len=4096),
    step_cost=StepCost(step_overhead_s=1.0, weight_load_s=0.0, per_token_s=0.25, per_request_s=0.5,
                       prefill_attn_s=0.0, decode_attn_s=0.125),
    overheads=Overheads(api_server_s=2.0, gateway_s=0.0),
)
#: one cold prompt of 10 tokens and one decode of 2 x 8-token contexts, 3 tokens each; no bursts
PLAN = SweepPlan(cold_lengths=(10,), cold_reps=1, cached_prefixes=(), decode_batches=(2,), decode_contexts=(8,),
                 decode_tokens=3, decode_reps=1, mixed_batches=(), mixed_prefills=(), burst_slots=1)


def timer(plan=PLAN, profile=TOY, servers=1):
    return SweepTimer(plan, profile, servers, scrape_s=0.5)


def test_a_cold_prompt_is_its_front_end_its_chunked_prefill_and_two_scrapes():
    c = timer().experiment(dict(kind="cold", rep=0, prompt_len=10))
    # chunks of 8 and 2 tokens: (1 + 2 + 0.5) + (1 + 0.5 + 0.5); front end 2; scrapes 2 x 0.5
    assert (c.engine, c.front, c.fixed, c.total, c.requests) == (5.5, 2.0, 1.0, 8.5, 1)


def test_a_cached_prompt_prefills_only_its_new_tokens_after_its_warm_request():
    c = timer().experiment(dict(kind="cached", rep=0, prefix_len=8, new_len=3))
    # warm: 8 tokens in one step 3.5; cached: 3 new tokens after 8 cached, 1 + 0.75 + 0.5
    assert (c.engine, c.front, c.fixed, c.requests) == (5.75, 4.0, 2.0, 2)


def test_a_decode_experiment_prefills_its_contexts_one_at_a_time_then_decodes_the_batch():
    c = timer().experiment(dict(kind="decode", rep=0, batch=2, context_len=8))
    # contexts: 2 x (front 2 + 4-token prefill 2.5), scrapes around the first only: 10
    assert c.context == 10.0
    # batch: 2 x 4 new tokens in one step, 1 + 2 + 1 = 4; then 2 decode steps reading 2 x 9 and
    # 2 x 10 context tokens: (1 + 0.5 + 1 + 2.25) + (1 + 0.5 + 1 + 2.5) = 9.75
    assert c.engine == 2 * 2.5 + 4.0 + 9.75
    assert c.front == 3 * 2.0
    assert c.fixed == 2 * 0.5 + 2 * 0.5
    assert (c.total, c.requests) == (26.75, 4)


def test_a_burst_on_all_servers_counts_each_servers_scrapes_and_requests_once_its_time_once():
    t = timer(servers=2)
    c = t.experiment(dict(kind="burst_all", rep=0, batch=2, prompt_len=8, prefix_len=0, max_tokens=2))
    # two 8-token prefills in two steps (3.5 each), one decode step of 2 reading 2 x 9 tokens: 4.75
    assert (c.engine, c.front, c.fixed, c.requests) == (11.75, 2.0, 2.0, 4)


def test_a_burst_waits_for_its_api_lane_when_that_is_longer_than_the_engine():
    fe = replace(TOY, frontend=FrontendModel(per_request_s=10.0))
    c = timer(profile=fe).experiment(dict(kind="burst", rep=0, batch=2, prompt_len=8, prefix_len=0, max_tokens=2,
                                          server=0))
    # lane: 2 x 10 s of admission against 11.75 s of engine: 8.25 s more
    assert (c.engine, c.front) == (11.75, 2.0 + 8.25)


def test_a_burst_on_a_cached_prefix_caches_it_first_and_prefills_only_the_new_tokens():
    c = timer().experiment(dict(kind="burst", rep=0, batch=2, prompt_len=12, prefix_len=8, max_tokens=2, server=0))
    # warm 8 tokens alone: front 2 + 3.5; burst: 2 x 4 new tokens in one step 4; a decode step of 2
    # reading 2 x 13: 1 + 0.5 + 1 + 3.25 = 5.75
    assert (c.engine, c.front, c.fixed, c.requests) == (3.5 + 4.0 + 5.75, 4.0, 1.0, 3)


def test_unknown_kinds_are_named_not_guessed():
    assert timer().experiment(dict(kind="teleport", rep=0)) is None


def test_the_sweep_is_the_start_plus_each_slots_slowest_server():
    one = estimate_sweep(PLAN, TOY, 1, scrape_s=0.5)
    two = estimate_sweep(PLAN, TOY, 2, scrape_s=0.5)
    # probes: (front 2 + 9 tokens in 3.5 + 1.75 + 5 scrapes) + (front 2 + 1 new token 1.75) per server;
    # warm-up per batch size B = 1, 2: B 8-token prompts decoding 23 tokens (103.25 s, 181.5 s)
    # beside a 64-token prompt alone (30.005 s), plus the 5 ms sleep
    probes = 9.75 + 3.75
    warm = 103.25 + 181.5 + 2 * 0.005
    assert one.phases["start"] == pytest.approx(probes + warm, rel=1e-12, abs=0)
    assert two.phases["start"] == pytest.approx(2 * probes + warm, rel=1e-12, abs=0)
    # one server runs both experiments; two run them side by side, the decode server the slowest
    assert (one.phases["cold"], one.phases["decode"]) == (8.5, 26.75)
    assert (two.phases["cold"], two.phases["decode"]) == (0.0, 26.75)
    assert one.total_s == pytest.approx(one.phases["start"] + 8.5 + 26.75, rel=1e-12, abs=0)
    assert two.total_s == pytest.approx(two.phases["start"] + 26.75, rel=1e-12, abs=0)
    assert two.total_s == pytest.approx(two.engine_s + two.front_end_s + two.fixed_s, rel=1e-12, abs=0)
    assert (one.num_experiments, one.num_bursts, one.num_requests, one.context_s) == (2, 0, 5, 10.0)
    # each experiment's share of the wall time: beside the slowest server's, the others take none
    assert one.experiment_s == {0: 8.5, 1: 26.75}
    assert two.experiment_s == {1: 26.75}


def test_bursts_add_their_time_and_each_servers_first_scrape_timing():
    plan = replace(PLAN, cold_lengths=(), decode_batches=(), burst_sizes=(2,), burst_shapes=((8, 2),), burst_reps=1,
                   burst_cached_sizes=())
    est = estimate_sweep(plan, TOY, 2, scrape_s=0.5)
    # one burst on server 0 (engine 11.75 + front end 2 + one server's 2 scrapes) and one on both
    # (11.75 + 2 + 4 scrapes), then 2 servers x 11 scrapes timed before their first burst
    assert est.phases["bursts"] == 14.75 + 15.75 + 2 * 11 * 0.5
    assert est.num_bursts == 2
    # the first burst carries server 0's timed scrapes, the second (on both) server 1's
    assert est.experiment_s == {0: 14.75 + 5.5, 1: 15.75 + 5.5}


def test_the_engine_shape_of_probed_servers_replaces_the_profiles():
    # a step budget of 4 cuts the 10-token prompt into 4 + 4 + 2 tokens: 2.5 + 2.5 + 2 s
    c = SweepTimer(PLAN, TOY, shape=EngineShape(4, 1001, 4), scrape_s=0.5).experiment(
        dict(kind="cold", rep=0, prompt_len=10))
    assert c.engine == 7.0


def test_the_line_says_it_is_an_estimate_and_names_the_profile():
    text = estimate_sweep(PLAN, TOY, 2, scrape_s=0.5).line()
    assert text.startswith("estimated sweep time: about ")
    assert "An estimate from toy's step costs" in text and "on 2 server(s)" in text


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_servers"):
        estimate_sweep(PLAN, TOY, 0)
    with pytest.raises(ValueError, match="scrape_s"):
        estimate_sweep(PLAN, TOY, 1, scrape_s=-1.0)


def test_measure_dry_run_prints_plan_and_estimate_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["calibrate", "measure", "--url", "http://127.0.0.1:9", "--url",
                                      "http://127.0.0.1:10", "--out", str(out), "--dry-run",
                                      "--estimate-profile", "cpu-tiny-qwen2-x2"])
    assert result.exit_code == 0, result.output
    plan_line, estimate_line = result.output.strip().splitlines()
    assert plan_line.startswith("plan: 48 cold, 24 cached, 84 decode, 12 mixed, ")
    assert "on 2 server(s)" in estimate_line and "cpu-tiny-qwen2-x2" in estimate_line
    assert not out.exists()


def test_measure_names_a_bad_estimate_profile(tmp_path):
    result = CliRunner().invoke(cli, ["calibrate", "measure", "--url", "http://127.0.0.1:9", "--out",
                                      str(tmp_path / "run"), "--dry-run", "--estimate-profile", "a7000"])
    assert result.exit_code == 2
    assert "--estimate-profile" in result.output and "unknown profile 'a7000'" in result.output


def test_run_sweep_hands_the_probed_servers_to_on_start_before_measuring(fake_server, tmp_path):
    s = fake_server()
    seen = []

    def on_start(infos):
        seen.append(([i.block_size for i in infos], (tmp_path / "requests.csv").exists()))

    summary = asyncio.run(run_sweep([s.url], tmp_path, TINY_PLAN, progress=False, on_start=on_start))
    assert summary.status == "complete"
    assert seen == [([32], False)]  # once, with the server's settings, before any row


def test_measure_prints_the_estimate_before_the_sweep_with_the_requests_it_then_sends(fake_server, tmp_path):
    s = fake_server()
    result = CliRunner().invoke(cli, ["calibrate", "measure", "--url", s.url, "--out", str(tmp_path / "run"),
                                      "--preset", "quick", "--no-bursts", "--no-progress"])
    assert result.exit_code == 0, result.output
    estimate, measured = result.output.index("estimated sweep time"), result.output.index("measured ")
    assert estimate < measured
    planned = re.search(r"\((\d+) requests\) on 1 server", result.output).group(1)
    assert re.search(r"measured (\d+) requests", result.output).group(1) == planned


def test_measure_dry_run_needs_no_server_and_no_out_folder():
    """--dry-run plans without --url and --out: for --servers N (or one server); without
    --dry-run both are still required, and --servers is refused."""
    run = CliRunner().invoke
    result = run(cli, ["calibrate", "measure", "--dry-run", "--servers", "2", "--estimate-profile", "cpu-tiny-qwen2-x2"])
    assert result.exit_code == 0, result.output
    assert "on 2 server(s)" in result.output.strip().splitlines()[1]
    assert ("longest sequence 16448 tokens (16384-token prompt; --longest N times longer histories, such as "
            "32k-token agent sessions, too)") in result.output
    longer = run(cli, ["calibrate", "measure", "--dry-run", "--longest", "32768", "--estimate-profile",
                       "a6000-qwen2.5-7b"])
    assert "longest sequence 32768 tokens" in longer.output and "--longest N times" not in longer.output, longer.output
    assert result.output.strip().splitlines()[2] == (
        "next: start the servers (kvroute serve --model tiny-qwen2 -n 2), then this command with one --url per server "
        "and --out DIR instead of --dry-run and --servers 2, then kvroute calibrate fit DIR --out PROFILE.json")
    one = run(cli, ["calibrate", "measure", "--dry-run", "--estimate-profile", "cpu-tiny-qwen2-x2"])
    assert one.exit_code == 0 and "on 1 server(s)" in one.output
    assert "next: start the servers (kvroute serve --model tiny-qwen2 -n 1), then this command with --url URL" in one.output
    bare = run(cli, ["calibrate", "measure", "--dry-run"])  # the default estimate profile is not the user's model
    assert "next: start the servers (kvroute serve --model MODEL -n 1), then this command with --url URL" in bare.output
    missing = run(cli, ["calibrate", "measure", "--out", "x"])
    assert missing.exit_code == 2 and "Missing option '--url' (only --dry-run runs without it)." in missing.output
    missing = run(cli, ["calibrate", "measure", "--url", "http://127.0.0.1:9"])
    assert missing.exit_code == 2 and "Missing option '--out'" in missing.output
    refused = run(cli, ["calibrate", "measure", "--url", "http://127.0.0.1:9", "--out", "x", "--servers", "2"])
    assert refused.exit_code == 2 and "--servers" in refused.output and "--dry-run only" in refused.output
    # a dry run's KV-event endpoints are counted against its --servers (one without)
    events = ["--kv-events", "tcp://127.0.0.1:5557", "--kv-events", "tcp://127.0.0.1:5558"]
    assert run(cli, ["calibrate", "measure", "--dry-run", "--servers", "2", *events]).exit_code == 0
    one = run(cli, ["calibrate", "measure", "--dry-run", *events])
    assert one.exit_code == 2 and "one endpoint per server: 2 for 1 server(s)" in one.output


def test_measure_dry_run_next_line_carries_the_tensor_parallel_size_model_and_length(tmp_path):
    """The suggested serve command takes --tp and the model from the chosen --estimate-profile
    (a derived TP4 prior), -n from --servers and --max-model-len from --longest."""
    run = CliRunner().invoke
    prior = tmp_path / "tp4.json"
    derived = run(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "llama-3.1-70b", "--tp", "4",
                        "--out", str(prior)])
    assert derived.exit_code == 0, derived.output
    result = run(cli, ["calibrate", "measure", "--dry-run", "--servers", "2", "--longest", "32768",
                       "--estimate-profile", str(prior)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == (
        "next: start the servers (kvroute serve --model meta-llama/Llama-3.1-70B-Instruct --tp 4 -n 2 "
        "--max-model-len 32768), then this command with one --url per server and --out DIR instead of --dry-run "
        "and --servers 2, then kvroute calibrate fit DIR --out PROFILE.json")


def test_measure_refuses_a_longest_that_max_len_would_drop():
    run = CliRunner().invoke
    refused = run(cli, ["calibrate", "measure", "--dry-run", "--longest", "32768", "--max-len", "16384"])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines()[-1] == (
        "Error: Invalid value for '--longest': 32768 tokens is more than --max-len 16384, which drops every "
        "sequence longer than that; give --longest at most 16384, or raise --max-len")
    ok = run(cli, ["calibrate", "measure", "--dry-run", "--longest", "16384", "--max-len", "16384",
                   "--estimate-profile", "a6000-qwen2.5-7b"])
    assert ok.exit_code == 0 and "longest sequence 16384 tokens (16383-token prompt" in ok.output, ok.output


def test_measure_dry_run_estimates_local_servers_on_a_machine_without_a_gpu_with_the_cpu_profile(monkeypatch):
    """--dry-run contacts no server: servers on this machine (or none named) of a machine without
    an NVIDIA GPU are taken for CPU servers (cpu-tiny-qwen2, -x2 for several); a remote server
    or a local GPU keeps the a6000 prior."""
    from kvroute.calibrate.live import cores

    run = CliRunner().invoke
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    two = run(cli, ["calibrate", "measure", "--dry-run", "--servers", "2"])
    assert two.exit_code == 0 and "from cpu-tiny-qwen2-x2's step costs" in two.output, two.output
    local = run(cli, ["calibrate", "measure", "--dry-run", "--url", "http://localhost:8100"])
    assert "from cpu-tiny-qwen2's step costs" in local.output, local.output
    remote = run(cli, ["calibrate", "measure", "--dry-run", "--url", "http://gpu-1:8100"])
    assert "from a6000-qwen2.5-7b's step costs" in remote.output, remote.output
    monkeypatch.setattr(cores, "detect_gpus", lambda: [0])
    gpu = run(cli, ["calibrate", "measure", "--dry-run", "--servers", "2"])
    assert "from a6000-qwen2.5-7b's step costs" in gpu.output, gpu.output


def _toy_estimate(start_s=4.0, experiment_s=None):
    return SweepEstimate(total_s=64.0, phases={"start": start_s}, context_s=0.0, engine_s=0.0, front_end_s=0.0,
                         fixed_s=0.0, num_experiments=2, num_bursts=0, num_requests=2, num_servers=1, profile="toy",
                         experiment_s={0: 12.0, 1: 48.0} if experiment_s is None else experiment_s)


def test_time_left_counts_down_second_by_second_while_an_experiment_runs():
    """P = 4 + 12 + 48 = 64 estimated s, K = 0.25 x 64 = 16; what has not begun at the pace
    (E + K) / (D + K), what runs at the pace less its seconds so far."""
    left = TimeLeft(_toy_estimate(), prior_share=0.25)
    assert (left.planned_s, left.prior_s, left.pace()) == (64.0, 16.0, 1.0)
    assert left.left_s(0.0) == 64.0  # nothing measured: the estimate
    left.begin("start", 0.0)
    assert [left.left_s(t) for t in (0.0, 1.0, 2.0, 3.0)] == [64.0, 63.0, 62.0, 61.0]  # 60 + (4 - t)
    left.done("start", 14.0)  # 4 estimated s took 14: (14 + 16) / (4 + 16)
    assert left.pace() == 1.5
    left.begin(0, 14.0)
    # 1.5 x 48 not begun + 1.5 x 12 running, less the seconds since it began
    assert [left.left_s(t) for t in (14.0, 15.0, 16.0, 17.0)] == [90.0, 89.0, 88.0, 87.0]
    left.done(0, 32.0)  # as paced: (32 + 16) / (16 + 16), the same pace, so no jump
    assert (left.pace(), left.left_s(32.0)) == (1.5, 72.0)


def test_time_left_holds_at_the_rest_not_begun_when_an_experiment_overruns_and_never_goes_negative():
    left = TimeLeft(_toy_estimate(), prior_share=0.25)
    left.begin("start", 0.0)
    left.done("start", 14.0)
    left.begin(0, 14.0)
    assert [left.left_s(t) for t in (32.0, 40.0, 45.0)] == [72.0, 72.0, 72.0]  # its 18 s are gone: 1.5 x 48
    left.done(0, 46.0)  # 16 estimated s in 46: (46 + 16) / (16 + 16)
    assert (left.pace(), left.left_s(46.0)) == (1.9375, 93.0)
    left.begin(1, 46.0)
    assert left.left_s(100.0) == 39.0  # 93 - 54
    assert left.left_s(200.0) == 0.0  # the last one overran: 0, not negative
    left.done(1, 210.0)
    assert left.left_s(210.0) == 0.0


def test_time_left_takes_its_pace_from_finished_work_so_it_holds_while_nothing_runs():
    """The old rule, (P - D) (E + K) / (D + K) with E now, rose with E between two ends."""
    left = TimeLeft(_toy_estimate(), prior_share=0.25)
    assert left.left_s(8.0) == 64.0  # 8 s, nothing begun or done: still the estimate
    left.done("start", 14.0)
    assert [left.left_s(t) for t in (14.0, 50.0, 100.0)] == [90.0, 90.0, 90.0]  # 1.5 x 60
    left = TimeLeft(_toy_estimate(), prior_share=0.0)
    assert left.left_s(10.0) == 64.0  # no pace yet: 1
    left.done("start", 8.0)
    left.done(0, 40.0)
    assert (left.pace(), left.left_s(60.0)) == (2.5, 120.0)  # 40 real s for 16 estimated ones
    assert TimeLeft(_toy_estimate()).prior_s == PRIOR_SHARE * 64.0


def test_time_left_counts_keys_not_estimated_or_repeated_as_nothing():
    left = TimeLeft(_toy_estimate(), prior_share=0.25)
    left.done("start", 14.0)
    left.begin(7, 14.0)  # not estimated: neither runs nor moves the pace
    assert left.left_s(20.0) == 90.0
    left.done(7, 30.0)
    assert (left.pace(), left.left_s(30.0)) == (1.5, 90.0)
    left.begin(0, 14.0)
    left.begin(0, 20.0)  # begun once: from 14 s
    assert left.left_s(20.0) == 84.0
    left.done(0, 32.0)
    left.done(0, 60.0)  # done once: the pace stays (32 + 16) / (16 + 16)
    left.begin(0, 60.0)  # done: not running again
    assert (left.done_s, left.pace(), left.left_s(60.0)) == (16.0, 1.5, 72.0)
    assert TimeLeft(_toy_estimate(start_s=0.0, experiment_s={})).left_s(5.0) is None
    with pytest.raises(ValueError, match="prior_share"):
        TimeLeft(_toy_estimate(), prior_share=-1.0)


def test_a_log_of_one_long_experiment_gets_a_line_every_30_s_counting_down():
    """LineProgress refreshed every 5 s (run_sweep's keep_refreshed) with TimeLeft's time left: a
    48-estimated-s experiment paced at 1.5 counts down 72 s, then holds at the 1.5 x 12 s after it."""
    import io

    from kvroute.sim.study.progress import LineProgress

    now = [1000.0]
    left = TimeLeft(_toy_estimate(experiment_s={0: 48.0, 1: 12.0}), prior_share=0.25)
    out = io.StringIO()
    bar = LineProgress(2, "calibration sweep", "experiment", out, time_left=left.left_s, clock=lambda: now[0])
    left.begin("start", 0.0)
    left.done("start", 14.0)
    left.begin(0, 14.0)
    for t in range(5, 125, 5):
        now[0] = 1000.0 + t
        bar.refresh()
    assert out.getvalue().splitlines() == [
        "calibration sweep: 0 of 2 experiments done, about 74 s left",  # 30 s: 18 + 72 - 16
        "calibration sweep: 0 of 2 experiments done, about 44 s left",  # 60 s
        "calibration sweep: 0 of 2 experiments done, about 18 s left",  # 90 s: 76 s into its 72
        "calibration sweep: 0 of 2 experiments done, about 18 s left",  # 120 s
    ]


def test_run_sweep_paces_its_progress_by_the_estimate_on_start_returns(fake_server, tmp_path, monkeypatch):
    """The ``TimeLeft`` ``on_start`` returns gives the progress its time left: the warm-up, then
    each experiment and burst, begun before it runs and done when it ends, at the seconds since
    the warm-up began; the bar's refresher is cancelled when the sweep ends."""
    from kvroute.sim.study import progress

    seen, events = [], []

    class Bar:
        n = 0

        def update(self, n=1):
            self.n += n
            seen.append(self.time_left(1e9))

        def refresh(self):
            pass

        def close(self):
            pass

    def fake_bar(total, desc, unit, time_left=None):
        bar = Bar()
        bar.total, bar.time_left = total, time_left
        return bar

    class Recorded(TimeLeft):
        def begin(self, key, at_s):
            events.append(("begin", key, at_s))
            super().begin(key, at_s)

        def done(self, key, at_s):
            events.append(("done", key, at_s))
            super().done(key, at_s)

    refreshers = []
    keep_refreshed = progress.keep_refreshed

    def recorded_refresher(bar, every_s):
        refreshers.append(every_s)
        return keep_refreshed(bar, every_s)

    monkeypatch.setattr(progress, "progress_bar", fake_bar)
    monkeypatch.setattr(progress, "keep_refreshed", recorded_refresher)
    plan = replace(TINY_PLAN, burst_sizes=(1,), burst_shapes=((64, 4),), burst_reps=1, burst_cached_sizes=())

    def on_start(infos):
        return Recorded(estimate_sweep(plan, TOY, 1, shape=EngineShape(infos[0].block_size,
                                       infos[0].num_gpu_blocks, infos[0].max_num_batched_tokens)))

    async def sweep():
        summary = await run_sweep([fake_server().url], tmp_path, plan, progress=True, on_start=on_start)
        return summary, asyncio.all_tasks() - {asyncio.current_task()}

    summary, tasks_left = asyncio.run(sweep())
    assert summary.status == "complete" and summary.num_experiments == 7 and tasks_left == set()
    assert refreshers == [progress.REFRESH_S]
    # one server: each begins, then ends, before the next begins
    assert [(e[0], e[1]) for e in events[:2]] == [("begin", "start"), ("done", "start")]
    assert [e[0] for e in events] == ["begin", "done"] * 8
    assert [e[1] for e in events[0::2]] == [e[1] for e in events[1::2]]
    assert sorted(e[1] for e in events[2::2]) == list(range(7))  # 6 one at a time, a burst
    times = [e[2] for e in events]
    assert times == sorted(times) and times[0] >= 0.0
    assert seen[-1] == 0.0 and len(seen) == 7


def test_measure_dry_run_says_which_default_profile_estimates_and_how_to_give_another(monkeypatch):
    """A defaulted estimate profile is named with what it was measured or derived on and the flag
    that gives another; a local GPU other than the A6000 prior's is named, with the shipped prior
    for it where there is one, else the derive command for it."""
    from kvroute.calibrate.live import cores

    run = lambda *args: CliRunner().invoke(cli, ["calibrate", "measure", "--dry-run", *args])  # noqa: E731
    tail = lambda result: next(line for line in result.output.splitlines()  # noqa: E731
                               if "a slower or busier host" in line).split("a slower or busier host takes longer")[1]
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    assert tail(run()) == (". cpu-tiny-qwen2 is the default for CPU servers, measured with tiny-qwen2 on CPU AMD "
                           "EPYC (2 cores); --estimate-profile NAME|PATH estimates with another")
    monkeypatch.setattr(cores, "detect_gpus", lambda: [0, 1])
    monkeypatch.setattr(cores, "gpu_models", lambda: ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"])
    assert tail(run("--servers", "2")) == (
        ". a6000-qwen2.5-7b is the default: a prior for Qwen/Qwen2.5-7B-Instruct on NVIDIA RTX A6000, not this "
        "machine's NVIDIA A100-SXM4-80GB; --estimate-profile a100-80gb-qwen2.5-7b estimates with the shipped prior "
        "for Qwen/Qwen2.5-7B-Instruct on NVIDIA A100-SXM4-80GB, NAME|PATH with another")
    monkeypatch.setattr(cores, "gpu_models", lambda: ["NVIDIA L40S"])
    assert tail(run()).endswith(", not this machine's NVIDIA L40S; --estimate-profile NAME|PATH estimates with "
                                "another (`kvroute profiles derive --gpu L40S --model MODEL` makes a prior for it)")
    monkeypatch.setattr(cores, "gpu_models", lambda: ["NVIDIA RTX A6000"])
    assert tail(run()) == (". a6000-qwen2.5-7b is the default: a prior for Qwen/Qwen2.5-7B-Instruct on NVIDIA RTX "
                           "A6000; --estimate-profile NAME|PATH estimates with another (`kvroute profiles derive "
                           "--gpu GPU --model MODEL` makes one for yours)")
    # servers elsewhere: this machine's GPU says nothing of theirs; a profile given: no note
    monkeypatch.setattr(cores, "gpu_models", lambda: ["NVIDIA L40S"])
    assert "not this machine's" not in tail(run("--url", "http://gpu-1:8100"))
    assert tail(run("--estimate-profile", "h100-80gb-qwen2.5-7b")) == ""


def test_a_live_sweeps_estimate_names_the_servers_gpus_against_the_default_prior():
    from types import SimpleNamespace

    from kvroute.cli.calibrate_commands import _estimate_profile

    infos = [SimpleNamespace(device="cuda", hardware="4 x NVIDIA H100 80GB HBM3")]
    profile, note = _estimate_profile(None, infos, 4)
    assert profile.name == "a6000-qwen2.5-7b"
    assert note.endswith(", not the servers' NVIDIA H100 80GB HBM3; --estimate-profile h100-80gb-qwen2.5-7b estimates "
                         "with the shipped prior for Qwen/Qwen2.5-7B-Instruct on NVIDIA H100 80GB HBM3, NAME|PATH "
                         "with another")
    unknown = [SimpleNamespace(device="cuda", hardware="unknown")]
    assert "not the servers'" not in _estimate_profile(None, unknown, 1)[1]
