"""Sweeps: grids, rows equal to ``compare``'s, the same numbers on every executor, and the CLI."""

import dataclasses
import hashlib
import json
import math

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from kvroute.cli.sweep_command import sweep_command
from kvroute.sim.study.experiment import compare
from kvroute.sim.cluster.metrics import SUMMARY_METRICS, summarize_rounds
from kvroute.sim.timing.profile import load_profile
from kvroute.sim.study.sweep import (
    COUNTER_COLUMNS, EXAMPLE_COLUMNS, SCENARIO_FIELDS, Scenario, cost_per_million_tokens, grid, intervals, run_scenario,
    sweep,
)
from tests.support.paths import GOLDEN
from tests.support.shared_traces import shared_trace

SMALL = Scenario(chats=8, turns=3)
POLICIES = ["round_robin", "least_loaded", "kv_aware"]


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster


def test_grid_is_the_cartesian_product_first_axis_slowest():
    scenarios = grid(SMALL, workers=[2, 4], policy=["round_robin", "kv_aware"], chats=16)
    assert [(s.workers, s.policy, s.chats) for s in scenarios] == [
        (2, "round_robin", 16), (2, "kv_aware", 16), (4, "round_robin", 16), (4, "kv_aware", 16)]
    assert grid(SMALL) == [SMALL]
    # a tuple is one value (a range), not an axis
    assert [s.history for s in grid(Scenario(workload="agent"), history=(8000, 16000))] == [(8000, 16000)]


def test_bad_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid fields: workload, chats"):
        grid(SMALL, worker=[2])
    with pytest.raises(ValueError, match="valid policies: round_robin"):
        Scenario(policy="sticky")
    with pytest.raises(ValueError, match="valid workloads: seed-chat, agent"):
        Scenario(workload="chat")
    with pytest.raises(ValueError, match="agent workload only"):
        Scenario(history=8000)
    with pytest.raises(ValueError, match="share GPUs"):
        Scenario(workers=2, gpus=1, kv_blocks=1000)
    with pytest.raises(ValueError, match="valid executors: local, sequential, dask"):
        sweep([SMALL], executor="ray")


def test_rows_equal_compare_for_the_same_seeds():
    frame = sweep(grid(SMALL, policy=POLICIES), rounds=2, executor="sequential", progress=False)
    trace = lambda seed: Scenario(workload="seed-chat", turns=3, chats=8, seed=seed).trace()  # noqa: E731
    expected = compare(trace, Scenario(profile="a6000-qwen2.5-7b", workers=4).spec(), POLICIES, rounds=2)
    assert list(frame["policy"]) == list(expected.summaries["policy"])
    assert list(frame["run_seed"]) == list(expected.summaries["seed"])
    for metric in SUMMARY_METRICS:
        assert frame[metric].tolist() == pytest.approx(expected.summaries[metric].tolist(), rel=0, abs=0,
                                                       nan_ok=True), metric


def test_agent_rows_equal_compare_with_the_cli_trace():
    scenario = Scenario(workload="agent", chats=4, turns=3, seed=5, policy="kv_aware")
    frame = sweep(scenario, rounds=2, executor="sequential", progress=False)
    # Each round draws its own agent trace from its run seed, in the CLI as in sweeps.
    trace = lambda seed: Scenario(workload="agent", turns=3, chats=4, seed=seed).trace()  # noqa: E731
    expected = compare(trace, Scenario(profile="a6000-qwen2.5-7b", workers=4).spec(), ["kv_aware"],
                       rounds=2, seed=5)
    for metric in ("time_to_complete_s", "later_ttft_mean_s", "hit_rate", "goodput_share"):
        assert frame[metric].tolist() == expected.summaries[metric].tolist()


def test_kv_blocks_rows_equal_compare_with_the_same_override():
    scenario = Scenario(workload="agent", chats=4, turns=3, history=None, workers=2, kv_blocks=2500, seed=2)
    frame = sweep(grid(scenario, policy=["round_robin", "kv_aware"]), rounds=2, executor="sequential", progress=False)
    trace = lambda seed: Scenario(workload="agent", turns=3, chats=4, seed=seed).trace()  # noqa: E731
    spec = Scenario(profile="a6000-qwen2.5-7b", workers=2, kv_blocks=2500).spec()
    expected = compare(trace, spec, ["round_robin", "kv_aware"], rounds=2, seed=2)
    assert frame["num_evictions"].sum() > 0 and frame["evicted_prefix_tokens"].sum() > 0
    for metric in ("time_to_complete_s", "later_ttft_p90_s", "hit_rate"):
        assert frame[metric].tolist() == expected.summaries[metric].tolist()


def test_row_has_scenario_fields_metrics_and_counters():
    row = run_scenario(Scenario(chats=4, turns=2, workers=2, policy="kv_aware", reply=128), round=1)
    assert set(SCENARIO_FIELDS) | set(SUMMARY_METRICS) | set(COUNTER_COLUMNS) | set(EXAMPLE_COLUMNS) <= set(row)
    assert row["round"] == 1 and row["run_seed"] == 1
    assert row["num_requests"] == 8
    assert row["output_tokens"] == 8 * 128
    assert row["prefill_tokens"] == pytest.approx(row["prompt_tokens"] * (1 - row["hit_rate"]))
    assert row["num_gpu_blocks"] == load_profile("a6000-qwen2.5-7b").engine.num_gpu_blocks
    assert row["num_evictions"] == 0 and row["num_preemptions"] == row["preemptions"] == 0
    # nothing failed: the engines' prefix-cache counters are the finished requests' tokens
    assert row["prefix_cache_queries"] == row["prompt_tokens"]
    assert row["prefix_cache_hits"] == row["prompt_tokens"] - row["prefill_tokens"]
    assert row["evicted_prefix_tokens"] == 0
    assert row["cacheable_blocks"] == 2 * (row["num_gpu_blocks"] - 1)  # vLLM's null block holds no cache
    assert row["rejected"] == row["not_sent"] == row["timed_out"] == row["failed"] == 0
    assert math.isnan(row["failed_request"]) and row["failed_reason"] is None and len(row["route_digest"]) == 32


def test_engine_counters_also_count_requests_admitted_and_then_lost():
    """Requests timed out after admission: vLLM's counters (prefix_cache_*, num_preemptions)
    count them, the table's hit rate and preemptions (over finished requests) do not."""
    row = run_scenario(Scenario(chats=32, turns=2, workers=1, kv_blocks=300, request_timeout_s=3.0), round=0)
    assert row["timed_out"] > 0
    assert row["prefix_cache_queries"] > row["prompt_tokens"]
    assert row["prefix_cache_hits"] / row["prefix_cache_queries"] != row["hit_rate"]
    assert row["num_preemptions"] > row["preemptions"]


def test_kv_blocks_override_makes_evictions_appear():
    base = Scenario(workload="agent", chats=8, turns=4, history=(8000, 12000), policy="kv_aware", workers=2)
    frame = sweep(grid(base, kv_blocks=[1000, 100_000]), executor="sequential", progress=False)
    assert frame["num_gpu_blocks"].tolist() == [1000, 100_000]
    small, large = frame.iloc[0], frame.iloc[1]
    assert small["num_evictions"] > 0 and large["num_evictions"] == 0
    assert small["hit_rate"] < large["hit_rate"]


def test_shared_gpu_follows_the_memory_rule():
    row = run_scenario(Scenario(chats=4, turns=2, workers=2, gpus=1, profile="a100-80gb-qwen2.5-7b"))
    assert row["num_gpu_blocks"] == load_profile("a100-80gb-qwen2.5-7b").shared(2).engine.num_gpu_blocks


EXECUTOR_GRID = grid(SMALL, workers=[2, 4], policy=["round_robin", "kv_aware"])


@pytest.fixture(scope="module")
def sequential_rows():
    return sweep(EXECUTOR_GRID, rounds=2, executor="sequential", progress=False)


def test_local_pool_gives_the_sequential_numbers(sequential_rows):
    local = sweep(EXECUTOR_GRID, rounds=2, executor="local", max_workers=2, progress=False)
    assert len(sequential_rows) == 8
    pd.testing.assert_frame_equal(local, sequential_rows)


def test_dask_cluster_gives_the_sequential_numbers(dask_cluster, sequential_rows):
    dask = sweep(EXECUTOR_GRID, rounds=2, executor="dask", address=dask_cluster.scheduler_address, progress=False)
    pd.testing.assert_frame_equal(dask, sequential_rows)


def test_intervals_use_summarize_rounds():
    frame = sweep(grid(SMALL, policy=["round_robin", "kv_aware"]), rounds=3, executor="sequential", progress=False)
    iv = intervals(frame, ["time_to_complete_s", "hit_rate"])
    assert iv["policy"].tolist() == ["round_robin", "kv_aware"] and iv["rounds"].tolist() == [3, 3]
    rr = frame[frame["policy"] == "round_robin"]
    expected = summarize_rounds(rr[["time_to_complete_s", "hit_rate"]].to_dict("records"))
    assert iv.loc[0, "hit_rate_low"] == expected.loc["hit_rate", "low"]
    assert iv.loc[0, "time_to_complete_s"] == expected.loc["time_to_complete_s", "mean"]


def test_intervals_clip_counters_and_given_columns_to_their_possible_values():
    from scipy.stats import t

    # two rounds, 0 and 30: mean 15 and a half-width of 15 t(0.975, 1) = 190.6, far below zero
    frame = pd.DataFrame({"policy": ["kv_aware"] * 2, "num_evictions": [0, 30], "usd_per_mtok_output": [0.0, 30.0]})
    high = 15.0 + 15.0 * t.ppf(0.975, 1)
    iv = intervals(frame, ["num_evictions", "usd_per_mtok_output"], by=["policy"],
                   bounds={"usd_per_mtok_output": (0.0, math.inf)})  # a cost, as notebook 03 gives it
    for column in ("num_evictions", "usd_per_mtok_output"):
        assert iv.loc[0, column] == 15.0 and iv.loc[0, f"{column}_low"] == 0.0
        assert iv.loc[0, f"{column}_high"] == pytest.approx(high, rel=1e-12)
    unknown = intervals(frame, ["usd_per_mtok_output"], by=["policy"])  # a column of no known bounds
    assert unknown.loc[0, "usd_per_mtok_output_low"] == pytest.approx(15.0 - 15.0 * t.ppf(0.975, 1), rel=1e-12)


COUNTS = pd.DataFrame({"workers": [2, 2, 4, 4] * 2, "policy": ["round_robin"] * 4 + ["kv_aware"] * 4,
                       "num_evictions": [829, 829, 0, 30, 12, 12, 0, 0], "status": ["ok"] * 8})
"""Two rounds per scenario of a counter: whole means, and one (15, rounds 0 and 30) whose interval
reaches below zero."""


def test_sweep_tables_show_whole_counts_without_decimals_and_clipped_at_zero():
    from kvroute.cli.sweep_command import pivot_table
    from kvroute.sim.study.report_tables import sweep_table

    assert pivot_table(COUNTS, "num_evictions").splitlines() == [
        "cached blocks evicted, all workers",
        "         round_robin kv_aware",
        "workers                      ",
        "2            829 ± 0   12 ± 0",
        "4        15 [0, 206]    0 ± 0",
    ]
    table = sweep_table(COUNTS, "num_evictions", "evicted")
    assert [[c if isinstance(c, str) else c.text for c in row] for row in table.rows] == [
        ["2", "829 ± 0", "12 ± 0"], ["4", "15 [0, 206]", "0 ± 0"]]


def test_a_one_scenario_pivot_names_every_column_it_prints():
    from kvroute.cli.sweep_command import pivot_table

    policies = COUNTS[COUNTS["workers"] == 2]  # only the policy varies: one row, no index to label
    assert pivot_table(policies, "num_evictions").splitlines() == [
        "cached blocks evicted, all workers",
        "round_robin  kv_aware",
        "-----------  --------",
        "    829 ± 0    12 ± 0",
    ]
    one = policies[policies["policy"] == "kv_aware"]  # nothing varies
    assert pivot_table(one, "num_evictions").splitlines() == [
        "cached blocks evicted, all workers", "num_evictions", "-------------", "       12 ± 0"]


def test_cost_per_million_tokens():
    frame = pd.DataFrame({"workers": [2, 2], "gpus": [None, 1], "time_to_complete_s": [3600.0, 1800.0],
                          "output_tokens": [500_000, 0], "prompt_tokens": [1_500_000, 0]})
    # 2 GPUs for an hour at $2/h = $4 for half a million output tokens
    assert cost_per_million_tokens(frame, 2.0).iloc[0] == pytest.approx(8.0)
    assert cost_per_million_tokens(frame, 2.0, tokens="total").iloc[0] == pytest.approx(2.0)
    assert math.isnan(cost_per_million_tokens(frame, 2.0).iloc[1])


def test_cli_prints_pivot_tables_and_writes_rows(tmp_path):
    out = tmp_path / "rows.csv"
    result = CliRunner().invoke(sweep_command, [
        "--chats", "4", "--turns", "2", "--workers", "2,4", "--policies", "round_robin,kv_aware",
        "--rounds", "2", "--executor", "sequential", "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "time to complete (s)" in result.output and "hit rate" in result.output
    header = next(line for line in result.output.splitlines() if "round_robin" in line)
    assert header.split() == ["round_robin", "kv_aware"]
    rows = pd.read_csv(out)
    assert len(rows) == 8 and set(rows["workers"]) == {2, 4}


def test_cli_agent_ranges_and_parquet(tmp_path):
    out = tmp_path / "rows.parquet"
    result = CliRunner().invoke(sweep_command, [
        "--workload", "agent", "--chats", "2", "--turns", "2", "--history", "8000,8000-12000", "--reply", "32",
        "--policies", "kv_aware", "--rounds", "1", "--executor", "sequential", "--no-progress",
        "--show", "num_evictions", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    assert rows["history"].tolist() == ["8000", "8000-12000"]
    assert (rows["output_tokens"] == 32 * rows["num_requests"]).all()


def test_cli_dask_address(dask_cluster):
    result = CliRunner().invoke(sweep_command, [
        "--chats", "4", "--turns", "2", "--policies", "kv_aware", "--rounds", "2", "--no-progress",
        "--address", dask_cluster.scheduler_address])
    assert result.exit_code == 0, result.output
    assert "executor dask" in result.output


@pytest.mark.parametrize("args, message", [
    (["--policies", "round_robin,sticky"], "valid policies: round_robin"),
    (["--workload", "chat"], "'chat' is not one of 'seed-chat', 'agent'"),
    (["--profile", "v100"], "shipped profiles:"),
    (["--show", "latency"], "valid names: time_to_complete_s"),
    (["--workers", "2,two"], "Invalid value for '--workers': 'two' is not a valid integer"),
    (["--history", "8000"], "--workload agent only"),
    (["--out", "rows.json"], ".parquet or .csv"),
    (["--workers", "2", "--gpus", "3"], "num_gpus must be between"),
    (["--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl does not exist"),
    (["--speedup", "2"], "--speedup rescales a --trace file"),
    (["--cache-view", "routed,exactly"], "'exactly' is not one of 'routed', 'events', 'exact'"),
    (["--time-series"], "sweep does not record time series; run kvroute compare --time-series --out DIR"),
])
def test_cli_rejects_bad_input_with_the_valid_choices(args, message):
    result = CliRunner().invoke(sweep_command, ["--chats", "2", "--turns", "1", "--rounds", "1",
                                                "--executor", "sequential", "--no-progress", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback


def test_dask_without_an_address_starts_and_closes_a_local_cluster(sequential_rows):
    pytest.importorskip("distributed")
    rows = sweep(EXECUTOR_GRID[:2], rounds=2, executor="dask", max_workers=1, progress=False)
    pd.testing.assert_frame_equal(rows, sequential_rows.iloc[:4])


SEED_BURST = GOLDEN / "seed_burst.jsonl"


def test_scenario_replays_a_trace_file_as_compare_does():
    scenario = Scenario(trace_file=str(SEED_BURST), max_requests=96, speedup=2.0, workers=2, replay="open",
                        max_model_len=1200, gateway_lb="random", gateways=2)
    frame = sweep(grid(scenario, policy=["round_robin", "kv_aware"]), rounds=2, executor="sequential",
                  progress=False)
    trace = Scenario(trace_file=str(SEED_BURST), max_requests=96, speedup=2.0).trace()
    spec = Scenario(profile="a6000-qwen2.5-7b", workers=2, replay="open", max_model_len=1200).spec()
    expected = compare(trace, dataclasses.replace(spec, gateways=2, gateway_lb="random"),
                       ["round_robin", "kv_aware"], rounds=2)
    assert frame["num_requests"].tolist() == [96] * 4
    assert frame["failed"].sum() > 0  # prompts past max_model_len=1200 are rejected in both
    # the rows name the trace, not the generator's defaults it left unused
    assert set(frame["workload"]) == {"trace"} and frame["chats"].isna().all() and frame["turns"].isna().all()
    for metric in SUMMARY_METRICS:
        assert frame[metric].tolist() == pytest.approx(expected.summaries[metric].tolist(), rel=0, abs=0,
                                                       nan_ok=True), metric


def test_trace_file_options_are_checked():
    with pytest.raises(ValueError, match="--speedup rescales a --trace file"):
        Scenario(speedup=2.0)
    with pytest.raises(ValueError, match="not both"):
        Scenario(trace_file=str(SEED_BURST), speedup=2.0, request_rate=1.0)
    with pytest.raises(ValueError, match="valid: auto, closed, open"):
        Scenario(replay="fast")
    missing = sweep(Scenario(trace_file="/nonexistent/t.jsonl"), executor="sequential", progress=False)
    assert missing["status"].tolist() == ["failed"] and "cannot read trace file" in missing["error"].iloc[0]


OUTPUT_ONLY = {"json_out", "out", "records_format", "quiet", "time_series", "figure_formats"}
"""compare's options that say what is written or shown, not what runs."""
COMPARE_ONLY = {"uncertainty", "prior_range"}
"""compare's model-uncertainty analysis, which sweeps do not run."""


def test_sweep_takes_every_scenario_option_of_compare_with_its_default():
    from kvroute.cli.sim_commands import compare as compare_command

    sweep_flags = {flag: param for param in sweep_command.params for flag in param.opts}
    scenario = [p for p in compare_command.params if p.name not in OUTPUT_ONLY | COMPARE_ONLY]
    assert len(scenario) == 42  # --config, 36 trace/workload/cluster/gateway, --policies, --rounds, 3 executor
    for param in scenario:
        for flag in param.opts:
            assert flag in sweep_flags, f"sweep has no {flag}"
            assert sweep_flags[flag].name == param.name, flag
            assert sweep_flags[flag].default == param.default, flag
    compare_flags = {flag for param in compare_command.params for flag in param.opts}
    assert sorted(set(sweep_flags) - compare_flags) == [
        "--no-progress", "--plot-load", "--reply", "--seeds", "--show"]


def _compare_json(*args) -> dict:
    from kvroute.cli.sim_commands import compare as compare_command

    result = CliRunner().invoke(compare_command, [*args, "--json", "--executor", "sequential"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _assert_rows_equal_compare(rows: pd.DataFrame, doc: dict) -> None:
    for policy, metrics in doc["policies"].items():
        mine = rows[rows["policy"] == policy]
        for metric in SUMMARY_METRICS:
            expected = [math.nan if v is None else v for v in metrics[metric]["rounds"]]
            assert mine[metric].tolist() == pytest.approx(expected, rel=0, abs=0, nan_ok=True), (policy, metric)


def test_cli_sweep_replays_a_trace_file_on_the_pool_as_compare_does(tmp_path):
    options = ["--trace", str(SEED_BURST), "--max-requests", "192", "--workers", "2", "--rounds", "2",
               "--policies", "round_robin,kv_aware", "--cache-view", "events", "--kv-event-delay", "0.01"]
    out = tmp_path / "rows.parquet"
    result = CliRunner().invoke(sweep_command, [*options, "--executor", "local", "--max-workers", "2",
                                                "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    assert rows["num_requests"].tolist() == [192] * 4
    assert rows["trace_file"].tolist() == [str(SEED_BURST.resolve())] * 4
    _assert_rows_equal_compare(rows, _compare_json(*options))
    saved = yaml.safe_load((tmp_path / "rows.scenario.yaml").read_text())
    assert saved["kvroute"]["trace"] == {"file": str(SEED_BURST.resolve()),
                                         "sha256": hashlib.sha256(SEED_BURST.read_bytes()).hexdigest()}
    assert saved["workers"] == 2 and saved["cache-view"] == "events" and saved["policies"] == "round_robin,kv_aware"
    again = CliRunner().invoke(sweep_command, ["--config", str(tmp_path / "rows.scenario.yaml"), "--executor",
                                               "sequential", "--out", str(tmp_path / "again.parquet")])
    assert again.exit_code == 0, again.output
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "again.parquet"), rows)


def test_cli_sweep_over_the_first_200_mooncake_records(tmp_path):
    mooncake = shared_trace("mooncake", "conversation_trace.jsonl")
    options = ["--trace", str(mooncake), "--max-requests", "200", "--rounds", "1", "--policies", "kv_aware"]
    result = CliRunner().invoke(sweep_command, [*options, "--workers", "2,4", "--speedup", "1,4", "--executor",
                                                "local", "--max-workers", "2", "--no-progress",
                                                "--out", str(tmp_path / "rows.parquet")])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(tmp_path / "rows.parquet")
    assert list(zip(rows["workers"], rows["speedup"])) == [(2, 1.0), (2, 4.0), (4, 1.0), (4, 4.0)]
    assert rows["num_requests"].tolist() == [200] * 4 and (rows["status"] == "ok").all()
    point = rows[(rows["workers"] == 4) & (rows["speedup"] == 4.0)]
    _assert_rows_equal_compare(point, _compare_json(*options, "--workers", "4", "--speedup", "4"))


def test_sweep_leaves_out_tables_no_run_has_a_value_and_says_why(tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    trace = tmp_path / "flat.jsonl"  # Mooncake records without sessions: no later turns
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 8,
                                         "hash_ids": [i, 1000 + i]}) + "\n" for i in range(6)))
    args = ["sweep", "--trace", str(trace), "--workers", "1,2", "--policies", "round_robin", "--rounds", "1",
            "--no-progress"]
    out = CliRunner().invoke(cli, [*args, "--show", "time_to_complete_s,later_ttft_mean_s,later_ttft_p90_s,hit_rate"],
                             catch_exceptions=False).output
    assert "time to complete" in out and "hit rate" in out
    assert "TTFT mean, turns >= 2" not in out
    assert ("not shown, no run has a value: later_ttft_mean_s, later_ttft_p90_s (the trace has no later turns)"
            in out)


def test_sweep_default_tables_show_all_turn_ttft_without_later_turns(tmp_path):
    """Without --show the TTFT tables follow sweep.lead_ttft, as the load figure: all turns here."""
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    trace = tmp_path / "flat.jsonl"  # Mooncake records without sessions: no later turns
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 8,
                                         "hash_ids": [i, 1000 + i]}) + "\n" for i in range(6)))
    out = CliRunner().invoke(cli, ["sweep", "--trace", str(trace), "--workers", "1,2", "--policies", "round_robin",
                                   "--rounds", "1", "--no-progress"], catch_exceptions=False).output
    assert out.startswith("2 scenario(s) x 1 round(s) on executor local\n")
    tables = [block.split("\n")[0] for block in out.split("\n", 1)[1].split("\n\n")]
    assert tables[:4] == ["time to complete (s)", "TTFT mean (s)", "TTFT p90 (s)", "hit rate (cached/prompt tokens)"]
    assert "not shown" not in out and "turns >= 2" not in out


def test_sessions_in_flight_counts_the_peak_of_sessions_started_and_not_ended():
    from kvroute.sim.study.sweep import sessions_in_flight

    nan = math.nan
    records = pd.DataFrame({
        "request_id": [0, 1, 2, 3, 4, 5, 6],
        "session_id": [0, 0, 1, 2, nan, nan, 1],
        "arrival": [0.0, 5.0, 1.0, 9.0, 2.0, 20.0, 6.0],
        "finish": [3.0, 9.0, 4.0, 12.0, 2.5, 21.0, nan],  # request 6 failed unfinished: it ends when sent
    })
    # sessions 0: 0-9 s, 1: 1-6 s, 2: 9-12 s (starts as 0 ends: no overlap), request 4: 2-2.5 s, 5: 20-21 s
    assert sessions_in_flight(records) == (5, 3)
    assert sessions_in_flight(records.iloc[:0]) == (0, 0)
