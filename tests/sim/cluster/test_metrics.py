"""Metric definitions, on hand-made records with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvroute.sim.cluster.metrics import RECORD_COLUMNS, RunResult, ServiceClass, summarize, summarize_rounds


def frame(rows):
    return pd.DataFrame(rows, columns=RECORD_COLUMNS)


def row(rid, turn, arrival, first, finish, prompt, cached, out, status="ok"):
    ok = status == "ok"
    return (rid, 0, turn, 0, arrival, first if ok else math.nan, finish if ok else math.nan,
            first - arrival if ok else math.nan, finish - arrival if ok else math.nan,
            (finish - first) / (out - 1) if ok and out > 1 else math.nan,
            prompt, cached, out, 0, status, None if ok else "boom", 0.0, math.nan, math.nan, math.nan, math.nan,
            math.nan, math.nan)


def result(rows, itl=()):
    return RunResult(frame(rows), np.asarray(itl, dtype=float), pd.DataFrame(), "p", 0)


def test_summary_definitions():
    rows = [
        row(0, 1, 0.0, 0.5, 2.5, 100, 0, 5),    # ttft 0.5, tpot 0.5
        row(1, 2, 3.0, 3.2, 4.0, 200, 150, 5),  # ttft 0.2, tpot 0.2
        row(2, 2, 1.0, 4.0, 6.0, 300, 60, 3),   # ttft 3.0, tpot 1.0
        row(3, 1, 0.5, 0, 0, 50, 0, 1, status="failed"),
    ]
    s = summarize(result(rows, itl=[0.1, 0.2, 0.3, 0.4]), ServiceClass(ttft_s=1.0, tpot_s=0.6))
    assert s["time_to_complete_s"] == 6.0            # last token 6.0 - first send 0.0
    assert s["ttft_mean_s"] == pytest.approx((0.5 + 0.2 + 3.0) / 3)
    assert s["later_ttft_mean_s"] == pytest.approx((0.2 + 3.0) / 2)
    assert s["later_ttft_p50_s"] == pytest.approx(1.6)
    assert s["hit_rate"] == pytest.approx(210 / 600)  # failed requests' prompts are not counted
    assert s["itl_mean_s"] == pytest.approx(0.25) and s["itl_p90_s"] == pytest.approx(0.37)
    assert s["tpot_mean_s"] == pytest.approx((0.5 + 0.2 + 1.0) / 3)
    assert s["e2e_mean_s"] == pytest.approx((2.5 + 1.0 + 5.0) / 3)
    assert s["goodput_share"] == pytest.approx(2 / 4)  # rows 0 and 1 meet both bounds
    assert s["goodput_rps"] == pytest.approx(2 / 6.0)
    assert s["output_throughput_tps"] == pytest.approx(13 / 6.0)
    assert s["failed"] == 1.0


def test_turnless_traces_have_no_later_turn_ttft():
    s = summarize(result([row(0, None, 0.0, 0.5, 1.0, 10, 0, 2)]))
    assert math.isnan(s["later_ttft_mean_s"])


def test_round_intervals_are_student_t():
    rounds = [{"x": 1.0}, {"x": 2.0}, {"x": 4.0}]
    out = summarize_rounds(rounds).loc["x"]
    half = np.std([1, 2, 4], ddof=1) / math.sqrt(3) * stats.t.ppf(0.975, 2)
    assert out["mean"] == pytest.approx(7 / 3)
    assert out["high"] - out["mean"] == pytest.approx(half)
    assert out["rounds"] == 3
    single = summarize_rounds([{"x": 5.0}]).loc["x"]
    assert (single["low"], single["mean"], single["high"]) == (5.0, 5.0, 5.0)


def test_rounds_without_a_value_count_for_nothing():
    """A metric with no value in some rounds (NaN) has its interval over the rounds that have
    one: n, sqrt(n) and the t degrees of freedom alike (the missing rounds used to count in n)."""
    nan = math.nan
    out = summarize_rounds([{"x": 1.0, "y": 3.0, "z": nan}, {"x": 2.0, "y": nan, "z": nan},
                            {"x": nan, "y": nan, "z": nan}])
    half = np.std([1, 2], ddof=1) / math.sqrt(2) * stats.t.ppf(0.975, 1)  # 6.353
    assert out.loc["x", "mean"] == 1.5 and out.loc["x", "rounds"] == 2
    assert (out.loc["x", "low"], out.loc["x", "high"]) == pytest.approx((1.5 - half, 1.5 + half))
    assert (out.loc["y", "low"], out.loc["y", "mean"], out.loc["y", "high"], out.loc["y", "rounds"]) == (3.0, 3.0, 3.0, 1)
    assert out.loc[["z"], ["mean", "low", "high"]].isna().all(axis=None) and out.loc["z", "rounds"] == 0


def test_failures_count_each_kind_and_prefer_a_rejection_as_the_example():
    from kvroute.sim.cluster.metrics import Failures, failures

    def failed(rid, error):
        record = list(row(rid, 1, 0.0, 0.0, 0.0, 10, 0, 0, status="failed"))
        record[RECORD_COLUMNS.index("error")] = error
        return tuple(record)

    rows = [failed(0, "timed out: no full reply 60 s after it was sent"), row(1, 1, 0.0, 0.5, 1.0, 10, 0, 2),
            failed(2, "This model's maximum context length is 8 tokens."),
            failed(3, "not sent: its parent request 2 failed"), failed(4, None)]
    one = failures(rows)
    assert one == Failures(5, 4, 2, 1, 1, (2, "This model's maximum context length is 8 tokens."))
    assert failures(rows[:2]) == Failures(2, 1, 0, 0, 1, (0, "timed out: no full reply 60 s after it was sent"))
    assert failures(rows[1:2]) == Failures(1, 0, 0, 0, 0, None)
    # summed over runs, the example is the first rejection of either
    assert failures(rows[:2]) + one == Failures(7, 5, 2, 1, 2, one.example)
    assert (Failures() + failures(rows[:2])).example == (0, "timed out: no full reply 60 s after it was sent")
    read_back = list(frame(rows).itertuples(index=False, name=None))  # a missing error reads back as NaN or None
    assert failures(read_back) == one


def test_route_digest_is_equal_for_runs_that_routed_alike_in_any_order():
    from kvroute.sim.cluster.metrics import route_digest

    assert route_digest([0, 1, 2], [1, 0, -1]) == route_digest([2, 0, 1], [-1, 1, 0])
    assert route_digest([0, 1, 2], [1, 0, -1]) != route_digest([0, 1, 2], [1, 1, -1])
    assert len(route_digest([], [])) == 32
