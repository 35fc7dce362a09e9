"""The pandas-free summary path (``summarize`` on record rows, one round's intervals, a
``Comparison`` built from dicts) gives, bit for bit, what the pandas computations it replaced
gave: those are kept below as the references."""

import math

import numpy as np
import pandas as pd
import pytest

from kvroute.sim.cluster.cluster import Cluster, ClusterSpec, simulate
from kvroute.sim.study.experiment import compare
from kvroute.sim.cluster.metrics import (METRIC_BOUNDS, RECORD_COLUMNS, SUMMARY_METRICS, RunResult, ServiceClass,
                                 _q, one_round_intervals, summarize)
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.format import Trace, TraceRecord


def pandas_summarize(df: pd.DataFrame, itl: np.ndarray, slo: ServiceClass) -> dict[str, float]:
    """``summarize`` as it was computed on the records DataFrame before rows replaced it."""

    def q(values, p):
        return float(np.quantile(values, p)) if len(values) else math.nan

    def mean(values):
        return float(values.mean()) if len(values) else math.nan

    ok = df[df["status"] == "ok"]
    ttft = ok["ttft"].to_numpy(float)
    later = ok[ok["turn"].fillna(0).astype(float) >= 2]["ttft"].to_numpy(float)
    start = float(df["arrival"].min()) if len(df) else 0.0
    makespan = float(ok["finish"].max()) - start if len(ok) else math.nan
    met = (ok["ttft"] <= slo.ttft_s) & (ok["tpot"].fillna(0.0) <= slo.tpot_s)
    prompt = float(ok["prompt_tokens"].sum())
    return {
        "time_to_complete_s": makespan,
        "ttft_mean_s": mean(ttft), "ttft_p50_s": q(ttft, 0.5), "ttft_p90_s": q(ttft, 0.9), "ttft_p99_s": q(ttft, 0.99),
        "later_ttft_mean_s": mean(later), "later_ttft_p50_s": q(later, 0.5), "later_ttft_p90_s": q(later, 0.9),
        "later_ttft_p99_s": q(later, 0.99),
        "itl_mean_s": mean(itl), "itl_p90_s": q(itl, 0.9),
        "tpot_mean_s": mean(ok["tpot"].dropna().to_numpy(float)),
        "e2e_mean_s": mean(ok["e2e"].to_numpy(float)), "e2e_p90_s": q(ok["e2e"].to_numpy(float), 0.9),
        "hit_rate": float(ok["cached_tokens"].sum()) / prompt if prompt else math.nan,
        "output_throughput_tps": float(ok["output_tokens"].sum()) / makespan if makespan else math.nan,
        "goodput_share": float(met.sum()) / len(df) if len(df) else math.nan,
        "goodput_rps": float(met.sum()) / makespan if makespan else math.nan,
        "preemptions": float(ok["preemptions"].sum()),
        "failed": float((df["status"] != "ok").sum()),
    }


def pandas_one_round(summary: dict[str, float]) -> pd.DataFrame:
    """``summarize_rounds([summary])`` as pandas computed it (the n == 1 branch)."""
    frame = pd.DataFrame([summary])
    mean = frame.mean()
    half = mean * 0.0
    lower = pd.Series([METRIC_BOUNDS.get(m, (-math.inf, math.inf))[0] for m in mean.index], index=mean.index)
    upper = pd.Series([METRIC_BOUNDS.get(m, (-math.inf, math.inf))[1] for m in mean.index], index=mean.index)
    low = (mean - half).where(lambda v: v.isna() | (v >= lower), lower)
    high = (mean + half).where(lambda v: v.isna() | (v <= upper), upper)
    return pd.DataFrame({"mean": mean, "low": low, "high": high, "rounds": 1})


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _trace() -> Trace:
    # three chats of three turns plus one prompt longer than max_model_len (a failed request)
    def ids(first: int, tokens: int) -> list[int]:
        return list(range(first, first + -(-tokens // 16)))

    records, rid = [], 0
    for chat in range(3):
        parent = None
        for turn in range(1, 4):
            prompt = 300 * turn + 40 * chat
            records.append(TraceRecord(rid, 10 * chat, prompt, 17 + 5 * turn,
                                       ids(1000 * chat, prompt) if parent is None else None,
                                       session_id=chat, turn=turn, parent=parent, think_time_ms=100))
            parent, rid = rid, rid + 1
    records.append(TraceRecord(rid, 5, 40_000, 8, ids(9000, 40_000)))
    return Trace(records, block_size=16, source="test")


@pytest.mark.parametrize("policy", ["round_robin", "kv_aware"])
def test_summary_from_rows_equals_the_pandas_summary(policy):
    profile = load_profile("a100-80gb-qwen2.5-7b")
    result = simulate(_trace(), ClusterSpec(profile, num_workers=2, policy=policy), seed=3)
    slo = ServiceClass(ttft_s=0.05, tpot_s=0.02)
    rows_summary = summarize(result, slo)
    frame_summary = summarize(RunResult(result.records, result.itl, result.workers, policy, 3), slo)
    reference = pandas_summarize(result.records, result.itl, slo)
    assert list(rows_summary) == list(SUMMARY_METRICS)
    assert reference["failed"] == 1.0
    for metric, value in reference.items():
        assert same(rows_summary[metric], value), metric
        assert same(frame_summary[metric], value), metric


def test_records_frame_equals_the_frame_built_before():
    profile = load_profile("a100-80gb-qwen2.5-7b")
    cluster = Cluster(_trace(), ClusterSpec(profile, num_workers=2, policy="kv_aware"), seed=0)
    result = cluster.run()
    before = pd.DataFrame([r.as_row() for r in cluster.records], columns=RECORD_COLUMNS)
    before = before.sort_values("request_id", kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(result.records, before, check_exact=True)
    assert list(result.workers["worker"]) == [0, 1]


def test_quantile_equals_numpys():
    """``_q`` (numpy's linear quantile without ``np.unique``) gives ``np.quantile``'s value, bit
    for bit: sizes 1 to 40 and large ones, ties, a NaN, infinities, and the quantiles used."""
    rng = np.random.default_rng(7)
    arrays = [rng.exponential(0.05, n) for n in [*range(1, 41), 999, 1000, 12_345]]
    arrays += [rng.integers(0, 4, n).astype(float) for n in (1, 2, 3, 10, 101)]
    arrays += [np.array([0.3, math.nan, 0.1]), np.array([math.inf, 1.0, -math.inf, 2.0]), np.array([5.0, 5.0])]
    for values in arrays:
        before = values.copy()
        for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
            with np.errstate(invalid="ignore"):  # inf - inf between the infinities: NaN in both
                assert repr(_q(values, q)) == repr(float(np.quantile(values, q))), (len(values), q)
        assert np.array_equal(values, before, equal_nan=True)  # the input is left as it was
    assert math.isnan(_q(np.zeros(0), 0.5))


@pytest.mark.parametrize("value", [0.25, 0.0, -0.5, 1.5, math.nan, math.inf, -math.inf, 7.0])
def test_one_round_intervals_equal_the_pandas_computation(value):
    summary = {"hit_rate": value, "time_to_complete_s": value, "other": value}
    plain = one_round_intervals(summary)
    reference = pandas_one_round(summary)
    for metric in summary:
        for column in ("mean", "low", "high"):
            assert same(plain[metric][column], float(reference.loc[metric, column])), (metric, column)
        assert plain[metric]["rounds"] == 1


def test_comparison_frames_and_json_as_before():
    profile = load_profile("a100-80gb-qwen2.5-7b")
    spec = ClusterSpec(profile, num_workers=2)
    for rounds in (1, 2):
        comparison = compare(_trace(), spec, ["round_robin", "kv_aware"], rounds=rounds, seed=1)
        summaries = comparison.summaries
        assert list(summaries.columns) == ["policy", "round", "seed", *SUMMARY_METRICS]
        doc = comparison.to_dict()
        for policy in comparison.policies:
            frame = comparison.intervals[policy]
            assert list(frame.columns) == ["mean", "low", "high", "rounds"]
            assert list(frame.index) == list(SUMMARY_METRICS)
            for metric in SUMMARY_METRICS:
                entry = doc["policies"][policy][metric]
                values = summaries[summaries["policy"] == policy][metric].tolist()
                assert [math.nan if v is None else v for v in entry["rounds"]] == pytest.approx(values, nan_ok=True, rel=0, abs=0)
                mean = frame.loc[metric, "mean"]
                assert same(math.nan if entry["mean"] is None else entry["mean"], float(mean))
