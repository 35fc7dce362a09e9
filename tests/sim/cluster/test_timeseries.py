"""Per-worker time series, queue times and per-token times (issue 11, deliverable 2)."""

import math

import numpy as np
import pandas as pd
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.cluster.timeseries import SERIES_COLUMNS, cumulative_at, gauge_at, gauge_mean
from kvroute.traces.format import Trace, TraceRecord
from tests.sim.cluster.test_cluster import simple_profile


def two_requests() -> Trace:
    """Request 0: 100 prompt tokens (blocks 0..6) at 0 s; request 1: 64 tokens whose first three
    blocks are request 0's, at 0.05 s; three output tokens each."""
    return Trace([TraceRecord(0, 0.0, 100, 3, tuple(range(7))), TraceRecord(1, 50.0, 64, 3, (0, 1, 2, 1003))],
                 block_size=16)


def run(trace, record_series=True, **spec):
    spec = {"num_workers": 1, "arrival_spread_s": 0.0, **spec}
    profile = spec.pop("profile", simple_profile())
    return simulate(trace, ClusterSpec(profile, record_series=record_series, **spec), seed=0)


def test_two_requests_on_one_worker_step_by_step():
    # Steps cost 10 ms + 1 ms per batched token; the API server adds 0.1 s before the engine.
    # Step 1 (0.1 .. 0.21): request 0's prefill, 100 tokens; request 1 arrives at 0.15 and waits.
    # Step 2 (0.21 .. 0.237): request 0's decode + request 1's prefill of 64 - 48 cached = 16 tokens.
    # Step 3 (0.237 .. 0.249): two decodes; request 0 gets its third token and finishes.
    # Step 4 (0.249 .. 0.26): request 1's last decode.
    res = run(two_requests())
    s = res.series
    assert list(s.columns) == SERIES_COLUMNS
    assert list(s["start"]) == pytest.approx([0.1, 0.21, 0.237, 0.249], abs=1e-12)
    assert list(s["end"]) == pytest.approx([0.21, 0.237, 0.249, 0.26], abs=1e-12)
    assert list(s["num_steps"]) == [1, 1, 1, 1]
    assert list(s["vllm:num_requests_running"]) == [1, 2, 1, 0]
    assert list(s["vllm:num_requests_waiting"]) == [1, 0, 0, 0]
    assert list(s["num_batched_tokens"]) == [100, 17, 2, 1]
    assert list(s["num_scheduled_reqs"]) == [1, 2, 2, 1]
    # Request 0 holds ceil(101 / 16) = 7 blocks; request 1 shares 3 of them and adds 1, then a
    # fifth for its 65th token; request 0's blocks are freed when it finishes.
    assert list(s["kv_blocks_used"]) == [7, 8, 5, 0]
    assert list(s["kv_blocks_cached"]) == [6, 7, 7, 7]  # full blocks: 6 of request 0, then request 1's 4th
    assert list(s["vllm:kv_cache_usage_perc"]) == [7 / 999, 8 / 999, 5 / 999, 0.0]
    assert list(s["vllm:prefix_cache_queries"]) == [100, 64, 0, 0]
    assert list(s["vllm:prefix_cache_hits"]) == [0, 48, 0, 0]
    assert list(s["vllm:num_preemptions"]) == [0, 0, 0, 0]
    assert s["vllm:prefix_cache_queries"].sum() == res.records["prompt_tokens"].sum()
    assert s["vllm:prefix_cache_hits"].sum() == res.records["cached_tokens"].sum()

    rec = res.records
    # vLLM's engine core adds a request that came in during a step when that step is over
    # (its QUEUED event), so request 1, handed over at 0.15, is queued and scheduled at 0.21.
    assert list(rec["queued"]) == pytest.approx([0.1, 0.21])
    assert list(rec["scheduled"]) == pytest.approx([0.1, 0.21])
    assert list(rec["queue_time"]) == pytest.approx([0.0, 0.0])
    # vLLM's prefill time (first token out - first scheduled) and decode time (last - first token
    # out), engine-side: with no API-server model they end where the client's times do.
    assert list(rec["prefill_time"]) == pytest.approx([0.11, 0.027], abs=1e-12)
    assert list(rec["decode_time"]) == pytest.approx([0.039, 0.023], abs=1e-12)
    tok = res.tokens
    assert list(tok["request_id"]) == [0, 0, 0, 1, 1, 1]
    assert list(tok["token"]) == [1, 2, 3, 1, 2, 3]
    assert list(tok["time"]) == pytest.approx([0.21, 0.237, 0.249, 0.237, 0.249, 0.26], abs=1e-12)
    assert list(tok.groupby("request_id")["time"].first()) == list(rec["first_token"])
    assert list(tok.groupby("request_id")["time"].last()) == list(rec["finish"])


def test_nothing_is_recorded_unless_asked():
    res = run(two_requests(), record_series=False)
    assert res.series is None and res.tokens is None
    # Queue times are in every record: they cost one stamp per admission.
    assert list(res.records["queue_time"]) == pytest.approx([0.0, 0.0])


def test_queue_time_counts_the_steps_a_request_waits_in_the_waiting_queue():
    # max_num_seqs 1: request 1 (handed over at 0.15, during step 1) is queued when step 1 ends
    # at 0.21 and scheduled only when request 0 is done: steps 2 and 3 are its decodes
    # (0.21 .. 0.221 .. 0.232), so request 1 waits from 0.21 to 0.232.
    from dataclasses import replace

    base = simple_profile()
    profile = replace(base, engine=replace(base.engine, max_num_seqs=1))
    rec = run(two_requests(), record_series=False, profile=profile).records
    assert list(rec["queued"]) == pytest.approx([0.1, 0.21], abs=1e-12)
    assert list(rec["scheduled"]) == pytest.approx([0.1, 0.232], abs=1e-12)
    assert list(rec["queue_time"]) == pytest.approx([0.0, 0.022], abs=1e-12)


def test_a_fast_forwarded_decode_run_is_one_row_with_its_step_count():
    # Request 0 decodes 200 tokens alone; request 1 arrives in the middle and cuts the run.
    trace = Trace([TraceRecord(0, 0.0, 40, 200, (0, 1, 2)), TraceRecord(1, 600.0, 40, 50, (9, 10, 11))],
                  block_size=16)
    fast, slow = run(trace), run(trace, fast_forward=False)
    assert slow.series["num_steps"].eq(1).all()
    assert (fast.series["num_steps"] > 1).any()
    steps = int(fast.workers["num_steps"].iloc[0])
    assert fast.series["num_steps"].sum() == steps == len(slow.series) == int(slow.workers["num_steps"].iloc[0])
    # Each fast row equals the step-by-step row of its last step; counters add up over the run.
    last = fast.series["num_steps"].cumsum().to_numpy() - 1
    aligned = slow.series.iloc[last].reset_index(drop=True)
    gauges = ["vllm:num_requests_running", "vllm:num_requests_waiting", "num_batched_tokens", "num_scheduled_reqs",
              "kv_blocks_used", "kv_blocks_cached"]
    pd.testing.assert_frame_equal(fast.series[gauges], aligned[gauges])
    assert list(fast.series["end"]) == pytest.approx(list(aligned["end"]), rel=1e-12)
    group = np.repeat(np.arange(len(fast.series)), fast.series["num_steps"])
    for counter in ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"]:
        assert list(slow.series[counter].groupby(group).sum()) == list(fast.series[counter])
    # Inside a run every step decodes the same batch.
    runs = fast.series[fast.series["num_steps"] > 1]
    assert (runs["num_batched_tokens"] == runs["num_scheduled_reqs"]).all()
    pd.testing.assert_frame_equal(fast.tokens, slow.tokens, rtol=1e-12)


def test_preemptions_blocks_and_counters_agree_with_the_records():
    # 11 usable blocks; two requests that grow to 8 blocks each cannot both finish without preemption.
    trace = Trace([TraceRecord(0, 0.0, 64, 60, (0, 1, 2, 3)), TraceRecord(1, 1.0, 64, 60, (5, 6, 7, 8))],
                  block_size=16)
    res = run(trace, profile=simple_profile(num_gpu_blocks=12))
    s, rec = res.series, res.records
    assert rec["preemptions"].sum() > 0
    assert s["vllm:num_preemptions"].sum() == rec["preemptions"].sum() == res.workers["num_preemptions"].sum()
    assert s["kv_blocks_used"].max() <= 11 and s["kv_blocks_used"].min() >= 0
    assert s["vllm:kv_cache_usage_perc"].max() <= 1.0
    # Re-admissions after a preemption are not prefix-cache queries (vLLM counts them apart).
    assert s["vllm:prefix_cache_queries"].sum() == rec["prompt_tokens"].sum() == 128
    assert s["vllm:prefix_cache_hits"].sum() == rec["cached_tokens"].sum()
    # A preempted request keeps its first scheduling time.
    assert (rec["scheduled"] <= rec["first_token"]).all()
    assert (rec["queue_time"] >= 0).all()


def test_token_times_give_the_run_s_itl_gaps():
    res = run(Trace([TraceRecord(i, 10.0 * i, 40 + 16 * i, 30 + 7 * i, tuple(range(10 * i, 10 * i + 5)))
                     for i in range(5)], block_size=16), num_workers=2, policy="round_robin")
    gaps = np.concatenate([np.diff(g.to_numpy()) for _, g in res.tokens.groupby("request_id")["time"]])
    assert np.sort(gaps) == pytest.approx(np.sort(res.itl), abs=1e-12)
    assert list(res.tokens.groupby("request_id").size()) == list(res.records["output_tokens"])
    assert sorted(res.series["worker"].unique()) == [0, 1]


def frame(rows):
    cols = ["worker", "start", "end", "num_steps", "g", "c"]
    return pd.DataFrame(rows, columns=cols)


def test_gauges_and_totals_on_a_grid():
    # Worker 0: g = 2 after the step ending at 1 s, 4 after the step ending at 3 s.
    # Worker 1: g = 1 after the step ending at 2 s. Each row counts c per step.
    s = frame([(0, 0.0, 1.0, 1, 2, 10), (0, 1.0, 3.0, 2, 4, 5), (1, 1.5, 2.0, 1, 1, 7)])
    assert gauge_at(s, "g", [0.5, 1.0, 2.5, 3.0, 9.0]).tolist() == [[0, 2, 2, 4, 4], [0, 0, 1, 1, 1]]
    # Time-weighted means over [0, 2] and [2, 4]: worker 0 is 0 then 2 (1 s each), then 2 (1 s)
    # and 4 (1 s); worker 1 is 0 for 2 s, then 1.
    assert gauge_mean(s, "g", [0.0, 2.0, 4.0]).tolist() == [[1.0, 3.0], [0.0, 1.0]]
    assert cumulative_at(s, "c", [0.5, 1.0, 3.0]).tolist() == [[0, 10, 15], [0, 0, 7]]
    # per_step: the second row's 2 x 5 spread over 1..3 s; worker 1's 7 over 1.5..2 s.
    assert cumulative_at(s, "c", [0.5, 2.0, 3.0], per_step=True).tolist() == [[5, 15, 20], [0, 7, 7]]
    with pytest.raises(ValueError, match="strictly increasing"):
        gauge_mean(s, "g", [1.0, 1.0])


def test_plot_series_draws_one_run(tmp_path):
    from kvroute.sim.study.plots import plot_series

    res = run(two_requests())
    path = plot_series(res.series, tmp_path / "ts.png", title="two requests")
    assert path.stat().st_size > 0
    two = pd.concat([res.series.assign(policy="a"), res.series.assign(policy="b")])
    with pytest.raises(ValueError, match="one policy"):
        plot_series(two, tmp_path / "x.png")
    with pytest.raises(ValueError, match="--time-series"):
        plot_series(res.series.iloc[0:0], tmp_path / "x.png")


def test_compare_stacks_series_and_tokens_by_policy_and_round():
    from kvroute.sim.study.experiment import compare

    spec = ClusterSpec(simple_profile(), num_workers=2, arrival_spread_s=0.0, record_series=True)
    comp = compare(two_requests(), spec, ["round_robin", "kv_aware"], rounds=2)
    series, tokens = comp.series(), comp.tokens()
    assert list(series.columns[:2]) == ["policy", "round"] and list(series.columns[2:]) == SERIES_COLUMNS
    assert set(map(tuple, series[["policy", "round"]].drop_duplicates().values)) == {
        ("round_robin", 0), ("round_robin", 1), ("kv_aware", 0), ("kv_aware", 1)}
    assert len(tokens) == 4 * 6
    off = compare(two_requests(), ClusterSpec(simple_profile(), num_workers=2), ["round_robin"], rounds=1)
    assert off.series() is None and off.tokens() is None
    assert not math.isnan(off.records()["queue_time"].iloc[0])


def test_cli_writes_the_series_beside_the_records(tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", "--turns", "2", "--chats", "6", "--rounds", "2", "--policies",
                                      "round_robin,kv_aware", "--out", str(out), "--time-series"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    series = pd.read_parquet(out / "timeseries.parquet")
    tokens = pd.read_parquet(out / "tokens.parquet")
    records = pd.read_parquet(out / "records.parquet")
    assert list(series.columns) == ["policy", "round", *SERIES_COLUMNS]
    assert (out / "timeseries-round_robin.png").exists() and (out / "timeseries-kv_aware.png").exists()
    sums = series.groupby(["policy", "round"])[["vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]].sum()
    rec = records.groupby(["policy", "round"])[["prompt_tokens", "cached_tokens"]].sum()
    assert sums.to_numpy().tolist() == rec.to_numpy().tolist()
    assert len(tokens) == records["output_tokens"].sum()


def test_time_series_needs_out():
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    result = CliRunner().invoke(cli, ["simulate", "--turns", "1", "--chats", "2", "--time-series"])
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert errors == ["Error: --time-series writes its files under --out: give --out DIR"]


def test_vllm_bench_result_carries_per_request_itls_when_tokens_were_kept():
    from kvroute.sim.study.bench_result import vllm_bench_result
    from kvroute.sim.cluster.metrics import ServiceClass

    doc = vllm_bench_result(run(two_requests()), ServiceClass(), "m", "p", None, 1.0)
    assert doc["itls"] == [pytest.approx([0.027, 0.012], abs=1e-12), pytest.approx([0.012, 0.011], abs=1e-12)]
    assert vllm_bench_result(run(two_requests(), record_series=False), ServiceClass(), "m", "p", None,
                             1.0)["itls"] == [[], []]


def test_workers_sharing_a_gpu_sample_their_alternating_steps():
    profile = simple_profile(memory={"gpu_memory_bytes": 10_000, "weight_bytes": 1000, "activation_peak_bytes": 0,
                                     "non_torch_bytes": 0, "kv_bytes_per_block": 4})
    trace = Trace([TraceRecord(i, 0.0, 100, 20, tuple(range(10 * i, 10 * i + 7))) for i in range(4)], block_size=16)
    res = run(trace, profile=profile, num_workers=2, num_gpus=1, policy="round_robin")
    s = res.series.sort_values("start")
    assert (s["num_steps"] == 1).all()  # no fast-forward on a shared GPU
    assert (s["start"].to_numpy()[1:] >= s["end"].to_numpy()[:-1] - 1e-12).all()  # one step at a time
    assert list(s.groupby("worker")["num_steps"].sum()) == list(res.workers["num_steps"])
    assert (s["kv_blocks_used"] <= 874).all()  # 875 blocks per worker, block 0 reserved


def test_token_times_are_the_client_s_behind_an_api_server_model():
    from kvroute.sim.timing.profile import load_profile

    profile = load_profile("cpu-tiny-qwen2-x2-bursts")
    trace = Trace([TraceRecord(i, 0.0, 64, 8, tuple(range(10 * i, 10 * i + 4))) for i in range(6)], block_size=16)
    res = run(trace, profile=profile, num_workers=2, policy="round_robin")
    first = res.tokens.groupby("request_id")["time"].first().to_numpy()
    last = res.tokens.groupby("request_id")["time"].last().to_numpy()
    assert list(first) == list(res.records["first_token"]) and list(last) == list(res.records["finish"])
    assert (res.records["queued"] >= res.records["arrival"]).all()


def test_plot_series_command_redraws_a_saved_series(tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", "--turns", "2", "--chats", "4", "--rounds", "2", "--policies",
                                      "round_robin,kv_aware", "--out", str(out), "--time-series", "--quiet"])
    assert result.exit_code == 0, result.output
    (out / "timeseries-round_robin.png").unlink()
    result = CliRunner().invoke(cli, ["plot-series", str(out / "timeseries.parquet")])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {out / 'timeseries-round_robin.png'}\n"   # the file's first policy, round 0
    png = tmp_path / "kv1.png"
    result = CliRunner().invoke(cli, ["plot-series", str(out / "timeseries.parquet"), "--policy", "kv_aware",
                                      "--round", "1", "--bins", "50", "--out", str(png)])
    assert result.exit_code == 0, result.output
    for path in (out / "timeseries-round_robin.png", png):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_series_titles_a_redrawn_plot_with_the_run_not_the_file(tmp_path, monkeypatch):
    import pandas as pd
    from click.testing import CliRunner

    import kvroute.sim.study.plots
    from kvroute.cli.main import cli

    out = tmp_path / "run"
    CliRunner().invoke(cli, ["compare", "--turns", "1", "--chats", "4", "--rounds", "1", "--policies", "round_robin",
                             "--out", str(out), "--time-series", "--quiet"], catch_exceptions=False)
    header = "trace seed_chat: 4 requests | 4 workers on 4 GPUs | profile a6000-qwen2.5-7b (32817 KV blocks of 16 tokens per worker)"
    assert pd.read_parquet(out / "timeseries.parquet").attrs == {"kvroute_run": header}
    titles = []
    monkeypatch.setattr(kvroute.sim.study.plots, "plot_series", lambda series, path, title, bins: titles.append(title))
    CliRunner().invoke(cli, ["plot-series", str(out / "timeseries.parquet")], catch_exceptions=False)
    assert titles == ["round_robin, round 0: every worker over time\ntrace seed_chat: 4 requests | 4 workers on 4 GPUs | "
                      "profile a6000-qwen2.5-7b (32817 KV blocks of 16 tokens per\nworker)"]


@pytest.mark.parametrize("args, message", [
    (["--policy", "sticky"], "no policy 'sticky' in"),
    (["--round", "3"], "no round 3 in"),
    (["--out", "x.jpg"], "x.jpg must end in .png, .pdf, .svg"),
])
def test_plot_series_command_errors_are_one_line(tmp_path, args, message):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    out = tmp_path / "run"
    CliRunner().invoke(cli, ["compare", "--turns", "1", "--chats", "2", "--rounds", "1", "--policies", "kv_aware",
                             "--out", str(out), "--time-series", "--quiet"])
    result = CliRunner().invoke(cli, ["plot-series", str(out / "timeseries.parquet"), *args])
    assert result.exit_code == 2 and message in result.output and result.exception.__class__ is SystemExit
    result = CliRunner().invoke(cli, ["plot-series", str(out / "records.parquet")])
    assert result.exit_code == 2 and "is not a time series (no column 'start')" in result.output
