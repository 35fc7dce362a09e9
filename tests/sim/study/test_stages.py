"""Per-stage results counted as inference-perf's ``summarize_requests`` counts a stage's bucket."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvroute.sim.study.stages import STAGE_COLUMNS, format_stage_table, stage_rows, stage_table
from kvroute.traces.format import Trace, TraceRecord


def _trace() -> Trace:
    records = [TraceRecord(i, 0.0, 10, 5, (i,), stage=0 if i < 3 else 1) for i in range(5)]
    stages = [{"stage": 0, "rate": 2.0, "duration_s": 1, "requests": 3, "start_ms": 0.0},
              {"stage": 1, "rate": 4.0, "duration_s": 1, "requests": 2, "start_ms": 3000.0}]
    return Trace(records, 16, "t", {"stages": stages})


def _records(policy: str, round_: int) -> pd.DataFrame:
    # stage 0: sends at 0, 0.5 and 1 s; request 2 timed out (timeout 10 s); stage 1: sends at 20 and 20.25 s
    rows = [
        dict(request_id=0, arrival=0.0, first_token=0.5, finish=1.5, ttft=0.5, output_tokens=5, status="ok",
             error=None),
        dict(request_id=1, arrival=0.5, first_token=1.5, finish=3.5, ttft=1.0, output_tokens=5, status="ok",
             error=None),
        dict(request_id=2, arrival=1.0, first_token=math.nan, finish=math.nan, ttft=math.nan, output_tokens=0,
             status="failed", error="timed out: no full reply 10 s after it was sent"),
        dict(request_id=3, arrival=20.0, first_token=20.2, finish=21.0, ttft=0.2, output_tokens=5, status="ok",
             error=None),
        dict(request_id=4, arrival=20.25, first_token=20.5, finish=20.75, ttft=0.25, output_tokens=2, status="ok",
             error=None),
    ]
    return pd.DataFrame(rows).assign(policy=policy, round=round_)


def test_a_stage_counts_what_it_sent():
    rows = stage_rows(pd.concat([_records("a", 0)]), _trace(), timeout_s=10.0)
    assert list(rows.columns) == STAGE_COLUMNS
    s0, s1 = rows.iloc[0], rows.iloc[1]
    assert (s0["requests"], s0["failed"], s0["timed_out"]) == (3, 1, 1)
    assert s0["achieved_rate"] == 3 / 1.0  # 3 requests sent over 1 s
    assert s0["benchmark_time"] == 11.0  # the timed-out request ends at 1 + 10 s
    assert s0["output_throughput"] == 10 / 11.0  # successful output tokens only
    assert s0["ttft_mean"] == 0.75 and s0["ttft_p90"] == pytest.approx(0.95)
    assert s0["itl_mean"] == (1.0 + 2.0) / (4 + 4)  # pooled gaps: sum(last - first) / sum(tokens - 1)
    assert (s1["requests"], s1["failed"], s1["rate"]) == (2, 0, 4.0)
    assert s1["achieved_rate"] == 2 / 0.25 and s1["benchmark_time"] == 1.0
    assert s1["output_throughput"] == 7.0
    assert s1["itl_mean"] == pytest.approx((0.8 + 0.25) / (4 + 1), abs=1e-12)  # 21.0 - 20.2 is not 0.8 in binary


def test_the_table_is_the_mean_over_rounds_per_stage_and_policy():
    records = pd.concat([_records("b", 0), _records("a", 0), _records("b", 1)])
    later = records["policy"].eq("b") & records["round"].eq(1)
    records.loc[later & records["request_id"].eq(0), ["first_token", "ttft"]] = [1.5, 1.5]
    table = stage_table(stage_rows(records, _trace(), timeout_s=10.0))
    assert table[["stage", "policy"]].values.tolist() == [[0, "b"], [0, "a"], [1, "b"], [1, "a"]]
    b0 = table.iloc[0]
    assert b0["rounds"] == 2 and b0["ttft_mean"] == pytest.approx((0.75 + 1.25) / 2)
    text = format_stage_table(table)
    assert len(text.splitlines()) == 2 + 4 and "timed out" in text.splitlines()[0]


def test_a_trace_without_stages_is_refused():
    with pytest.raises(ValueError, match="no load stages"):
        stage_rows(_records("a", 0), Trace([TraceRecord(0, 0.0, 10, 5, (0,))], 16, "plain"))
