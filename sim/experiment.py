"""Experiments: several policies on the same trace and cluster, over several seeded rounds.

Round ``r`` of every policy uses seed ``seed + r``, so policies are compared under the same
jitter draws and the same workload draws (common random numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from kvroute.sim.cluster import ClusterSpec, simulate
from kvroute.sim.metrics import SUMMARY_METRICS, RunResult, ServiceClass, summarize, summarize_rounds
from kvroute.traces.format import Trace


@dataclass(slots=True)
class Comparison:
    """Results of ``compare``.

    Attributes:
        policies: policy names in the order given (the first is the baseline).
        runs: ``runs[policy][round]`` run results.
        summaries: one row per (policy, round) with every summary metric.
        intervals: ``intervals[policy]``: DataFrame of mean/low/high per metric.
    """

    policies: list[str]
    runs: dict[str, list[RunResult]]
    summaries: pd.DataFrame
    intervals: dict[str, pd.DataFrame]

    def records(self) -> pd.DataFrame:
        """Every record of every run, with ``policy`` and ``round`` columns."""
        frames = []
        for policy, runs in self.runs.items():
            for r, run in enumerate(runs):
                frames.append(run.records.assign(policy=policy, round=r))
        return pd.concat(frames, ignore_index=True)

    def change(self, policy: str, metric: str) -> float:
        """Relative change of ``metric``'s mean for ``policy`` against the baseline, percent."""
        base = self.intervals[self.policies[0]].loc[metric, "mean"]
        value = self.intervals[policy].loc[metric, "mean"]
        return 100.0 * (value - base) / base if base else math.nan

    def to_dict(self) -> dict:
        """A JSON-ready dict: per policy, per metric, mean/low/high and each round's value."""
        out: dict = {"policies": {}}
        for policy in self.policies:
            rounds = self.summaries[self.summaries["policy"] == policy]
            out["policies"][policy] = {
                metric: {
                    "mean": _num(row["mean"]),
                    "low": _num(row["low"]),
                    "high": _num(row["high"]),
                    "rounds": [_num(v) for v in rounds[metric]],
                    **(
                        {"change_vs_baseline_pct": _num(self.change(policy, metric))}
                        if policy != self.policies[0]
                        else {}
                    ),
                }
                for metric, row in self.intervals[policy].iterrows()
            }
        return out


def _num(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def compare(
    trace: Trace | Callable[[int], Trace],
    spec: ClusterSpec,
    policies: list[str],
    rounds: int = 3,
    seed: int = 0,
    slo: ServiceClass = ServiceClass(),
    progress=None,
) -> Comparison:
    """Simulate ``trace`` on ``spec`` under each policy for ``rounds`` seeded rounds.

    Args:
        trace: the requests, or a function ``trace(seed)`` giving the trace of the round with
            that seed (a generated workload with random lengths draws one per round; every
            policy replays the same draws).
        spec: the cluster; its ``policy`` field is replaced by each of ``policies``.
        policies: policy names; the first is the baseline of the change columns.
        rounds: rounds per policy (seeds ``seed .. seed + rounds - 1``).
        seed: first seed.
        slo: the service class goodput is measured against.
        progress: optional callable ``progress(policy, round)`` called after each run.

    Raises:
        ValueError: no policy, fewer than one round, or any error ``simulate`` raises.
    """
    if not policies:
        raise ValueError("compare needs at least one policy")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    traces = [trace(seed + r) for r in range(rounds)] if callable(trace) else [trace] * rounds
    runs: dict[str, list[RunResult]] = {}
    rows = []
    for policy in policies:
        runs[policy] = []
        for r in range(rounds):
            result = simulate(traces[r], replace(spec, policy=policy), seed=seed + r)
            runs[policy].append(result)
            rows.append({"policy": policy, "round": r, "seed": seed + r, **summarize(result, slo)})
            if progress is not None:
                progress(policy, r)
    summaries = pd.DataFrame(rows)
    intervals = {
        p: summarize_rounds(summaries[summaries["policy"] == p][list(SUMMARY_METRICS)].to_dict("records"))
        for p in policies
    }
    return Comparison(list(policies), runs, summaries, intervals)


def format_table(comparison: Comparison, metrics: list[str] | None = None) -> str:
    """A paper-style table: one row per metric, one column per policy (mean ± 95% half-width
    over rounds), and after each non-baseline policy its change against the first, percent."""
    metrics = metrics or list(SUMMARY_METRICS)
    header = ["metric"]
    for i, p in enumerate(comparison.policies):
        header.append(p)
        if i:
            header.append(f"Δ vs {comparison.policies[0]}")
    rows = [header]
    for m in metrics:
        row = [SUMMARY_METRICS[m]]
        for i, p in enumerate(comparison.policies):
            iv = comparison.intervals[p].loc[m]
            row.append(_fmt_interval(iv["mean"], iv["high"] - iv["mean"], int(iv["rounds"])))
            if i:
                ch = comparison.change(p, m)
                row.append("" if math.isnan(ch) else f"{ch:+.1f}%")
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = []
    for k, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [r[c].rjust(widths[c]) for c in range(1, len(r))]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt_interval(mean: float, half: float, rounds: int) -> str:
    if math.isnan(mean):
        return "-"
    digits = 3 if abs(mean) < 10 else 1
    if rounds > 1:
        return f"{mean:.{digits}f} ± {half:.{digits}f}"
    return f"{mean:.{digits}f}"
