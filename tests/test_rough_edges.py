"""Rough edges: intervals within possible values, percentage points for shares, failed grid points."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvroute.sim.cluster.metrics import summarize_rounds


def test_intervals_of_bounded_metrics_are_clipped_to_possible_values():
    iv = summarize_rounds([{"hit_rate": 0.1, "goodput_share": 1.0, "preemptions": 0.0, "other": -1.0},
                           {"hit_rate": 0.9, "goodput_share": 0.5, "preemptions": 4.0, "other": 1.0}])
    t = 12.706204736174707  # Student t, 1 degree of freedom, 97.5 %
    assert iv.loc["hit_rate"].tolist() == [0.5, 0.0, 1.0, 2]             # unclipped: 0.5 -/+ 5.08
    assert iv.loc["goodput_share"].tolist() == [0.75, 0.0, 1.0, 2]
    assert iv.loc["preemptions", "low"] == 0.0
    assert iv.loc["preemptions", "high"] == pytest.approx(2.0 + 2.0 * t)
    assert iv.loc["other", "low"] == pytest.approx(-t)                  # unknown metric: not clipped


def test_unclipped_intervals_stay_symmetric_and_nan_stays_nan():
    iv = summarize_rounds([{"hit_rate": 0.50, "ttft_mean_s": math.nan}, {"hit_rate": 0.52, "ttft_mean_s": math.nan}])
    low, high = iv.loc["hit_rate", "low"], iv.loc["hit_rate", "high"]
    assert 0 < low < 0.5 and high < 1 and (0.51 - low) == pytest.approx(high - 0.51)
    assert math.isnan(iv.loc["ttft_mean_s", "low"]) and math.isnan(iv.loc["ttft_mean_s", "high"])


def _comparison(base_hit, other_hit):
    from kvroute.sim.study.experiment import Comparison

    def iv(hit, ttft):
        return summarize_rounds([{"hit_rate": hit, "ttft_mean_s": ttft}])
    summaries = pd.DataFrame([{"policy": "a", "hit_rate": base_hit, "ttft_mean_s": 2.0},
                              {"policy": "b", "hit_rate": other_hit, "ttft_mean_s": 1.0}])
    return Comparison(["a", "b"], {}, summaries, {"a": iv(base_hit, 2.0), "b": iv(other_hit, 1.0)})


def test_table_shows_share_changes_in_points_and_others_in_percent():
    from kvroute.sim.study.experiment import format_table

    lines = format_table(_comparison(0.40, 0.55), ["hit_rate", "ttft_mean_s"]).splitlines()
    assert lines[2].split()[-2:] == ["+15.0", "pp"]      # 0.40 -> 0.55: 15 points, not +37.5 %
    assert lines[3].split()[-1] == "-50.0%"


def test_a_metric_no_policy_has_is_left_out_of_the_tables():
    """Single-turn requests printed four later-turn TTFT rows of '-' under every policy."""
    from kvroute.sim.study.experiment import Comparison, format_table
    from kvroute.sim.study.report_tables import compare_table

    def iv(hit):
        return summarize_rounds([{"hit_rate": hit, "later_ttft_mean_s": math.nan}])
    summaries = pd.DataFrame([{"policy": p, "hit_rate": 0.4, "later_ttft_mean_s": math.nan} for p in "ab"])
    comparison = Comparison(["a", "b"], {}, summaries, {"a": iv(0.4), "b": iv(0.5)})
    lines = format_table(comparison, ["hit_rate", "later_ttft_mean_s"]).splitlines()
    assert [line.split("  ")[0] for line in lines[2:]] == ["hit rate (cached/prompt tokens)"]
    doc = {"policies": {p: {"hit_rate": {"mean": h, "low": h, "high": h, "rounds": [h]},
                            "later_ttft_mean_s": {"mean": None, "low": None, "high": None, "rounds": [None]}}
                        for p, h in (("a", 0.4), ("b", 0.5))}}
    assert [row[0] for row in compare_table(doc).rows] == ["hit rate (cached/prompt tokens)"]


def test_table_shows_a_clipped_interval_as_its_ends():
    from kvroute.sim.study.experiment import _fmt_interval

    assert _fmt_interval(0.5, 0.25, 0.75, 3) == "0.500 ± 0.250"
    assert _fmt_interval(0.9, 0.6, 1.0, 3) == "0.900 [0.600, 1.000]"
    assert _fmt_interval(0.9, 0.6, 1.0, 1) == "0.900"
    # a token count over rounds read 5644517.3 ± 1949599.1
    assert _fmt_interval(5644517.3, 3694918.2, 7594116.4, 3) == "5,644,517 ± 1,949,599"
    assert _fmt_interval(9999.94, 8999.94, 10999.94, 3) == "9999.9 ± 1000.0"


def test_tables_show_whole_counts_without_decimals():
    from kvroute.sim.study.experiment import Comparison, format_table, whole_counts

    rounds = {"a": [{"failed": 320.0, "preemptions": 0.0, "ttft_mean_s": 2.0}] * 2,
              "b": [{"failed": 320.0, "preemptions": 1.0, "ttft_mean_s": 1.0},
                    {"failed": 320.0, "preemptions": 2.0, "ttft_mean_s": 1.0}]}
    summaries = pd.DataFrame([{"policy": p, **r} for p, rows in rounds.items() for r in rows])
    comparison = Comparison(["a", "b"], {}, summaries, {p: summarize_rounds(rows) for p, rows in rounds.items()})
    lines = format_table(comparison, ["failed", "preemptions", "ttft_mean_s"]).splitlines()
    assert lines[2].split() == ["failed", "requests", "320", "±", "0", "320", "±", "0", "+0.0%"]  # was 320.0 ± 0.0
    # cell by cell: an exact 0 beside a mean between whole numbers (1.5 preemptions) that keeps its digits
    assert lines[3].split() == ["preemptions", "0", "±", "0", "1.500", "[0.000,", "7.853]"]
    assert lines[4].split() == ["TTFT", "mean", "(s)", "2.000", "±", "0.000", "1.000", "±", "0.000", "-50.0%"]
    assert whole_counts("failed", [320.0, math.nan, None]) and not whole_counts("failed", [math.nan])
    assert not whole_counts("failed", [2.0, 4.484])  # a range's end between whole numbers
    assert not whole_counts("ttft_mean_s", [2.0, 1.0])  # a time that happens to be whole is not a count


def test_uncertain_tables_show_whole_counts_and_their_ranges_without_decimals():
    """``compare --uncertainty`` printed ``0.000 ± 0.000  [0.000, 0.000]`` where the plain table
    printed ``0 ± 0``."""
    from kvroute.sim.study.experiment import format_range
    from kvroute.sim.study.report_tables import compare_table

    assert format_range(0.0, 0.0, whole=True) == "[0, 0]"
    assert format_range(0.0, 0.0) == "[0.000, 0.000]"

    def entry(mean, low, high):
        return {"mean": mean, "low": mean, "high": mean, "rounds": [mean, mean],
                "model_interval": {"low": low, "high": high}}
    doc = {"policies": {p: {"failed": entry(0.0, 0.0, 0.0), "preemptions": entry(2.0, 1.0, hi),
                            "ttft_mean_s": entry(1.0, 1.0, 1.0)} for p, hi in (("a", 3.0), ("b", 3.5))}}
    rows = {row[0]: [c.text for c in row[1:]] for row in compare_table(doc).rows}
    assert rows["failed requests"] == ["0 ± 0", "[0, 0]", "0 ± 0", "[0, 0]", "", ""]
    # a range with an end between whole numbers keeps its digits; the cells beside it do not
    assert rows["preemptions"][:4] == ["2 ± 0", "[1, 3]", "2 ± 0", "[1.000, 3.500]"]
    assert rows["TTFT mean (s)"][:2] == ["1.000 ± 0.000", "[1.000, 1.000]"]  # a time is not a count


def test_infeasible_grid_points_are_failed_rows_and_the_sweep_goes_on():
    from kvroute.sim.study.sweep import Scenario, grid, intervals, sweep

    base = Scenario(chats=2, turns=2, workers=2, policy="round_robin")
    frame = sweep(grid(base, kv_blocks=[2, 100_000]), rounds=2, executor="sequential", progress=False)
    assert list(frame["status"]) == ["failed", "failed", "ok", "ok"]
    assert list(frame["run_seed"]) == [0, 1, 0, 1]
    assert frame["error"].iloc[0].startswith("seed_chat: request 0 needs 68 KV blocks")
    assert frame["error"].iloc[2:].isna().all() and frame["ttft_mean_s"].iloc[:2].isna().all()
    iv = intervals(frame, ["hit_rate"])
    assert list(iv["kv_blocks"]) == [2, 100_000] and list(iv["rounds"]) == [0, 2]
    assert math.isnan(iv["hit_rate"].iloc[0]) and 0.0 <= iv["hit_rate_low"].iloc[1] <= iv["hit_rate_high"].iloc[1] <= 1.0


def test_a_cluster_that_cannot_be_built_is_a_failed_row_too(tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    out = tmp_path / "g.csv"
    result = CliRunner().invoke(cli, ["sweep", "--chats", "2", "--turns", "2", "--workers", "1,4", "--gpus", "2",
                                      "--policies", "round_robin", "--rounds", "1", "--executor", "sequential",
                                      "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 of 2 runs failed (infeasible" in result.output
    rows = pd.read_csv(out)
    assert list(rows["status"]) == ["failed", "ok"]
    assert rows["error"].iloc[0] == "num_gpus must be between 1 and num_workers, got 2"


def test_turn_axis_has_integer_ticks_and_token_axis_reads_in_k_and_m():
    from matplotlib.figure import Figure

    from kvroute.sim.study.plots import integer_ticks, token_axis, token_label

    assert [token_label(v) for v in (512, 31_250, 32_768, 1_500_000, 2_000_000)] == [
        "512", "31.2k", "32.8k", "1.5M", "2M"]
    fig = Figure()
    ax_turn, ax_kv = fig.subplots(1, 2)
    ax_turn.plot([1, 2, 3], [0.1, 0.2, 0.3])
    integer_ticks(ax_turn)
    ticks = [t for t in ax_turn.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    ax_kv.plot([2 ** -5, 2 ** -2, 1.0], [1, 2, 3])
    ax_kv.set_xscale("log", base=2)
    token_axis(ax_kv, unit=1e6)
    labels = [ax_kv.xaxis.get_major_formatter()(t, 0) for t in (2 ** -5, 2 ** -2, 1.0)]
    assert labels == ["31.2k", "250k", "1M"]


def test_compare_json_gives_share_changes_in_points():
    doc = _comparison(0.40, 0.55).to_dict()["policies"]["b"]
    assert doc["hit_rate"]["change_vs_baseline_pp"] == pytest.approx(15.0)
    assert doc["hit_rate"]["change_vs_baseline_pct"] == pytest.approx(37.5)
    assert "change_vs_baseline_pp" not in doc["ttft_mean_s"]
