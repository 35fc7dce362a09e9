"""Experiments: several policies on the same trace and cluster, over several seeded rounds.

Round ``r`` of every policy uses seed ``seed + r``, so policies are compared under the same
jitter draws and the same workload draws (common random numbers). ``compare_uncertain`` repeats
the comparison under profiles drawn from the coefficients' uncertainty, for intervals that
include the model's share.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.cluster.metrics import (COUNT_METRICS, METRIC_BOUNDS, SHARE_METRICS, SUMMARY_METRICS, RunResult,
                                         ServiceClass,
                                         change_bounds, change_of, one_round_intervals, summarize,
                                         summarize_rounds)
from kvroute.sim.timing.uncertainty import PRIOR_RANGE
from kvroute.traces.format import Trace

if TYPE_CHECKING:
    import pandas as pd


class Comparison:
    """Results of ``compare``.

    Held as plain rows; the DataFrames ``summaries`` and ``intervals`` are built on first use,
    so a comparison printed as JSON or a table never imports pandas when it has one round
    (its cost: docs/log/speed-passes.md).

    Args:
        policies: policy names in the order given (the first is the baseline).
        runs: ``runs[policy][round]`` run results.
        summaries: one row per (policy, round): a list of dicts (``policy``, ``round``, ``seed``
            and every summary metric) or the same as a DataFrame.
        intervals: per policy, per metric ``mean``, ``low``, ``high``, ``rounds``: dicts
            (``intervals[policy][metric]``) or ``summarize_rounds`` DataFrames.
        round_ids: ``round_ids[policy][k]``: the round of ``runs[policy][k]`` (the ``round``
            column of ``records``, ``series``, ``tokens``); default ``k`` (an interrupted
            comparison's finished rounds may have gaps).

    Attributes:
        policies, runs: as given.
        rows: the summaries as a list of dicts.
        interval_rows: ``interval_rows[policy][metric]``: dict of ``mean``, ``low``, ``high``, ``rounds``.
        summaries: ``rows`` as a DataFrame.
        intervals: ``intervals[policy]``: DataFrame of mean/low/high/rounds per metric.
    """

    __slots__ = ("policies", "runs", "rows", "interval_rows", "round_ids", "_summaries", "_intervals")

    def __init__(self, policies: list[str], runs: dict[str, list[RunResult]], summaries: list[dict] | pd.DataFrame,
                 intervals: dict[str, dict[str, dict[str, float]]] | dict[str, pd.DataFrame],
                 round_ids: dict[str, list[int]] | None = None) -> None:
        self.policies = policies
        self.runs = runs
        self.round_ids = round_ids
        self._summaries = self._intervals = None
        if isinstance(summaries, list):
            self.rows = summaries
        else:
            self._summaries, self.rows = summaries, summaries.to_dict("records")
        frames = {p: iv for p, iv in intervals.items() if not isinstance(iv, dict)}
        if frames:
            self._intervals = dict(intervals) if len(frames) == len(intervals) else None
            intervals = {p: iv.to_dict("index") if p in frames else iv for p, iv in intervals.items()}
        self.interval_rows = intervals

    def num_rounds(self, policy: str) -> int:
        """Rounds run of ``policy`` (the rows of its summaries)."""
        return sum(1 for row in self.rows if row["policy"] == policy)

    @property
    def summaries(self) -> pd.DataFrame:
        """One row per (policy, round) with every summary metric."""
        if self._summaries is None:
            import pandas as pd

            self._summaries = pd.DataFrame(self.rows)
        return self._summaries

    @property
    def intervals(self) -> dict[str, pd.DataFrame]:
        """``intervals[policy]``: DataFrame indexed by metric with ``mean``, ``low``, ``high``, ``rounds``."""
        if self._intervals is None:
            import pandas as pd

            self._intervals = {p: pd.DataFrame.from_dict(iv, orient="index", columns=["mean", "low", "high", "rounds"])
                               for p, iv in self.interval_rows.items()}
        return self._intervals

    def records(self) -> pd.DataFrame:
        """Every record of every run, with ``policy`` and ``round`` columns."""
        import pandas as pd

        frames = []
        for policy, runs in self.runs.items():
            for k, run in enumerate(runs):
                frames.append(run.records.assign(policy=policy, round=self._round(policy, k)))
        return pd.concat(frames, ignore_index=True)

    def _round(self, policy: str, k: int) -> int:
        return k if self.round_ids is None else self.round_ids[policy][k]

    def series(self) -> pd.DataFrame | None:
        """Every run's per-worker time series (``kvroute.sim.cluster.timeseries.SERIES_COLUMNS``) with
        ``policy`` and ``round`` columns first, or None when the runs did not record them
        (``ClusterSpec.record_series``)."""
        return self._stacked("series")

    def tokens(self) -> pd.DataFrame | None:
        """Every run's per-token arrival times (``kvroute.sim.cluster.metrics.TOKEN_COLUMNS``) with
        ``policy`` and ``round`` columns first, or None when the runs did not record them."""
        return self._stacked("tokens")

    def _stacked(self, field: str) -> pd.DataFrame | None:
        import pandas as pd

        frames = []
        for policy, runs in self.runs.items():
            for k, run in enumerate(runs):
                frame = getattr(run, field)
                if frame is None:
                    return None
                frames.append(frame.assign(policy=policy, round=self._round(policy, k))[["policy", "round",
                                                                                        *frame.columns]])
        return pd.concat(frames, ignore_index=True) if frames else None

    def change(self, policy: str, metric: str) -> float:
        """Relative change of ``metric``'s mean for ``policy`` against the baseline, percent."""
        base = self.interval_rows[self.policies[0]][metric]["mean"]
        value = self.interval_rows[policy][metric]["mean"]
        return 100.0 * (value - base) / base if base else math.nan

    def change_points(self, policy: str, metric: str) -> float:
        """Change of a share's mean (hit rate, goodput share) against the baseline, percentage points."""
        base = self.interval_rows[self.policies[0]][metric]["mean"]
        return 100.0 * (self.interval_rows[policy][metric]["mean"] - base)

    def to_dict(self) -> dict:
        """A JSON-ready dict: per policy, per metric, mean/low/high, each round's value and the
        change against the baseline (percent; for shares also ``change_vs_baseline_pp``)."""
        out: dict = {"policies": {}}
        for policy in self.policies:
            rounds = [row for row in self.rows if row["policy"] == policy]
            out["policies"][policy] = {
                metric: {
                    "mean": _num(row["mean"]),
                    "low": _num(row["low"]),
                    "high": _num(row["high"]),
                    "rounds": [_num(r[metric]) for r in rounds],
                    **(
                        {"change_vs_baseline_pct": _num(self.change(policy, metric))}
                        if policy != self.policies[0]
                        else {}
                    ),
                    **(
                        {"change_vs_baseline_pp": _num(self.change_points(policy, metric))}
                        if policy != self.policies[0] and metric in SHARE_METRICS
                        else {}
                    ),
                }
                for metric, row in self.interval_rows[policy].items()
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
    run_progress=None,
    executor: str = "sequential",
    address: str | None = None,
    max_workers: int | None = None,
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
        run_progress: optional callable ``run_progress(policy, round, now_s, sent, total)``
            called inside each run (``Cluster.run``): simulated time, requests dealt with (sent, or
            recorded as not sent), trace size;
            with ``executor="sequential"`` only (runs elsewhere report when they end).
        executor, address, max_workers: where the policy x round runs execute
            (``kvroute.sim.study.executors.run_tasks``: ``sequential``, ``local`` process pool or
            ``dask``); every executor gives the same results.

    Raises:
        ValueError: no policy, fewer than one round, or any error ``simulate`` raises.
        CompareInterrupted (a KeyboardInterrupt): Ctrl-C or SIGTERM (as ``KeyboardInterrupt``);
            carries the finished runs (all of them when it came after the last one finished,
            while they were summarised: ``missing`` is then empty).
    """
    if not policies:
        raise ValueError("compare needs at least one policy")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    traces = [trace(seed + r) for r in range(rounds)] if callable(trace) else [trace] * rounds
    grid = [(policy, r) for policy in policies for r in range(rounds)]
    results: list[RunResult | None] = [None] * len(grid)

    def done(i: int, result: RunResult) -> None:
        results[i] = result
        if progress is not None:
            progress(*grid[i])

    try:
        if executor == "sequential":
            for i, (policy, r) in enumerate(grid):
                inside = None if run_progress is None else functools.partial(run_progress, policy, r)
                done(i, simulate(traces[r], replace(spec, policy=policy), seed=seed + r, progress=inside))
        else:
            from kvroute.sim.study.executors import interrupts_as_keyboard, run_tasks

            tasks = [(traces[r], replace(spec, policy=policy), seed + r) for policy, r in grid]
            with interrupts_as_keyboard():
                run_tasks(_simulate_task, tasks, done, executor, address, max_workers)
        return _comparison(list(policies), grid, results, seed, slo)
    except KeyboardInterrupt:  # during the runs, or after them (then no run is missing)
        missing = [f"{policy} round {r}" for (policy, r), result in zip(grid, results) if result is None]
        finished = [p for p in policies if any(res is not None for (q, _), res in zip(grid, results) if q == p)]
        partial = _comparison(finished, grid, results, seed, slo) if finished else None
        raise CompareInterrupted(partial, missing, len(grid)) from None


class CompareInterrupted(KeyboardInterrupt):
    """``compare`` was stopped (Ctrl-C, SIGTERM) before it returned: before every run finished, or
    after the last one, while they were summarised (``missing`` empty, ``comparison`` whole).

    Attributes:
        comparison: the finished runs as a :class:`Comparison` (the policies with at least one
            finished round; each policy's intervals over its finished rounds), or None when no
            run finished.
        missing: the runs not finished, ``"<policy> round <r>"``.
        total: the runs asked for.
    """

    def __init__(self, comparison: Comparison | None, missing: list[str], total: int) -> None:
        super().__init__(f"compare interrupted: {total - len(missing)} of {total} runs finished")
        self.comparison, self.missing, self.total = comparison, missing, total


def _comparison(policies: list[str], grid: list[tuple[str, int]], results: list[RunResult | None], seed: int,
                slo: ServiceClass) -> Comparison:
    """The :class:`Comparison` of the finished ``results`` (None: not finished) of ``grid``."""
    runs: dict[str, list[RunResult]] = {policy: [] for policy in policies}
    round_ids: dict[str, list[int]] = {policy: [] for policy in policies}
    rows = []
    for (policy, r), result in zip(grid, results):
        if result is None or policy not in runs:
            continue
        runs[policy].append(result)
        round_ids[policy].append(r)
        rows.append({"policy": policy, "round": r, "seed": seed + r, **summarize(result, slo)})
    intervals = {}
    for p in policies:
        per_round = [{m: row[m] for m in SUMMARY_METRICS} for row in rows if row["policy"] == p]
        if len(per_round) == 1:
            intervals[p] = one_round_intervals(per_round[0])
        else:
            intervals[p] = summarize_rounds(per_round).to_dict("index")
    gaps = any(ids != list(range(len(ids))) for ids in round_ids.values())
    return Comparison(list(policies), runs, rows, intervals, round_ids if gaps else None)


def _simulate_task(task: tuple[Trace, ClusterSpec, int]) -> RunResult:
    """One run of ``compare`` on an executor: ``simulate(trace, spec, seed)``."""
    trace, spec, seed = task
    return simulate(trace, spec, seed=seed)


def format_table(comparison: Comparison, metrics: list[str] | None = None) -> str:
    """A paper-style table: one row per metric, one column per policy (named by
    ``figure_style.short_names``; mean ± 95% half-width
    over rounds, or ``mean [low, high]`` where the interval was clipped to possible values), and
    after each non-baseline policy its change against the first: percent, or for a share
    (hit rate, goodput share) percentage points (``+3.8 pp``), never a percent of a percent. A
    metric no policy has a value of (later-turn TTFT on single-turn requests) is left out."""
    from kvroute.sim.study.figure_style import short_names

    metrics = metrics or list(SUMMARY_METRICS)
    names = short_names(comparison.policies)  # a config file's path cut to its name
    header = ["metric"]
    for i, p in enumerate(comparison.policies):
        header.append(names[p])
        if i:
            header.append(f"Δ vs {names[comparison.policies[0]]}")
    rows = [header]
    for m in metrics:
        if not _has_value(comparison, m):
            continue
        row = [SUMMARY_METRICS[m]]
        for i, p in enumerate(comparison.policies):
            iv = comparison.interval_rows[p][m]
            row.append(_fmt_interval(iv["mean"], iv["low"], iv["high"], int(iv["rounds"]), whole_counts(m, [iv["mean"]]),
                                     of=comparison.num_rounds(p)))
            if i:
                row.append(_fmt_change(comparison, p, m))
        rows.append(row)
    return tabulate_rows(rows)


def _has_value(comparison: Comparison, metric: str) -> bool:
    """Whether any policy of ``comparison`` has a mean of ``metric`` (later-turn TTFT has none on
    single-turn requests): a table leaves a metric without one out."""
    return not all(math.isnan(comparison.interval_rows[p][metric]["mean"]) for p in comparison.policies)


def _fmt_change(comparison: Comparison, policy: str, metric: str) -> str:
    if metric in SHARE_METRICS:
        points = comparison.change_points(policy, metric)
        return "" if math.isnan(points) else f"{points:+.1f} pp"
    change = comparison.change(policy, metric)
    return "" if math.isnan(change) else f"{change:+.1f}%"


def tabulate_rows(rows: list[list[str]], left: int = 1) -> str:
    """Rows (the first is the header) as a plain-text table: ``tabulate``'s ``simple`` format,
    the first ``left`` columns (the row labels: the metric) left-aligned, the others
    right-aligned, cells kept as written."""
    from tabulate import SEPARATING_LINE, DataRow, Line, TableFormat, tabulate

    # NOTE: the header goes in as a row above a separating line, since tabulate pads headers by
    # two extra spaces (MIN_PADDING), which would widen columns narrower than their cells; the
    # format is "simple" without its top and bottom rules.
    rule, row = Line("", "-", "  ", ""), DataRow("", "  ", "")
    fmt = TableFormat(lineabove=None, linebelowheader=rule, linebetweenrows=None, linebelow=None,
                      headerrow=row, datarow=row, padding=0, with_header_hide=None)
    return tabulate([rows[0], SEPARATING_LINE, *rows[1:]], tablefmt=fmt, disable_numparse=True,
                    colalign=("left",) * left + ("right",) * (len(rows[0]) - left))


def format_interval(mean: float | None, low: float | None, high: float | None, rounds: int,
                    whole: bool = False) -> str:
    """A table cell as :func:`format_table` writes it (``-`` for a missing mean; None reads as NaN;
    ``whole``: without decimals, :func:`whole_counts`)."""
    nan = math.nan
    return _fmt_interval(nan if mean is None else mean, nan if low is None else low, nan if high is None else high,
                         rounds, whole)


def whole_counts(metric: str, means, counts=COUNT_METRICS) -> bool:
    """Whether a table cell shows ``metric`` without decimals (``320 ± 0``, not ``320.0 ± 0.0``):
    it is one of ``counts`` (``COUNT_METRICS``; a sweep's, ``sweep.COUNT_COLUMNS``) and every one
    of ``means`` (the cell's mean; for a model-uncertainty range, its ends too; None and NaN aside,
    at least one) is a whole number. Decided cell by cell, so a count's exact ``0 ± 0`` is not
    written ``0.000 ± 0.000`` beside another cell's mean between whole numbers (``1.500 [0.000,
    7.853]``), and a cell reads the same in ``compare`` and in a sweep."""
    values = [float(v) for v in means if v is not None and not math.isnan(float(v))]
    return metric in counts and bool(values) and all(v.is_integer() for v in values)


def _fmt_interval(mean: float, low: float, high: float, rounds: int, whole: bool = False,
                  of: int | None = None) -> str:
    """``mean ± half`` for a symmetric interval; ``mean [low, high]`` for one clipped to the
    metric's possible values (``summarize_rounds``); 3 decimals below 10, 1 from 10, none when
    ``whole`` or from 10,000, where thousands are separated (``5,644,517 ± 1,949,599``). When
    only ``rounds`` of ``of`` rounds have a value, the cell says so (``0.292 ± 0.021 (2 of 4
    rounds)``)."""
    if math.isnan(mean):
        return "-"
    form = ",.0f" if whole or abs(mean) >= 10_000 else ".3f" if abs(mean) < 10 else ".1f"
    some = f" ({rounds} of {of} rounds)" if of is not None and rounds < of else ""
    if rounds <= 1:
        return f"{mean:{form}}{some}"
    if math.isclose(mean - low, high - mean, rel_tol=1e-9, abs_tol=1e-12):
        return f"{mean:{form}} ± {high - mean:{form}}{some}"
    return f"{mean:{form}} [{low:{form}}, {high:{form}}]{some}"


@dataclass(slots=True)
class UncertainComparison:
    """Results of ``compare_uncertain``: the central profile's comparison plus the same comparison
    under profiles drawn from the coefficients' uncertainty.

    Attributes:
        base: ``compare`` on the central profile (seed-only intervals).
        draws: profiles drawn.
        rounds: rounds per policy and draw.
        summaries: one row per (draw, policy, round): ``draw``, ``policy``, ``round``, ``seed`` and
            every summary metric.
        method: how the profiles were drawn (the profile's uncertainty ``method``).
    """

    base: Comparison
    draws: int
    rounds: int
    summaries: pd.DataFrame
    method: str

    @property
    def policies(self) -> list[str]:
        """Policy names; the first is the baseline."""
        return self.base.policies

    def _runs(self, policy: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """``policy``'s values of ``metric``, the central profile's runs first, then the drawn
        profiles'; and the draw of each (-1: the central profile)."""
        central = self.base.summaries
        central = central[central["policy"] == policy]
        drawn = self.summaries[self.summaries["policy"] == policy]
        return (np.concatenate([central[metric].to_numpy(float), drawn[metric].to_numpy(float)]),
                np.concatenate([np.full(len(central), -1), drawn["draw"].to_numpy(int)]))

    def _changes(self, policy: str, metric: str) -> tuple[list[float], list[int]]:
        """The change of ``metric`` (``change_of``: percent, a share's in pp) from the baseline to
        ``policy``, run by run: the two policies' runs of one round of one profile paired (the
        same seed), the central profile's first; and the draw of each (-1: central)."""
        change = change_of(metric)
        first = self.policies[0]
        values, draws = [], []
        for frame in (self.base.summaries.assign(draw=-1), self.summaries):
            base = frame[frame["policy"] == first].set_index(["draw", "round"])[metric]
            other = frame[frame["policy"] == policy].set_index(["draw", "round"])[metric]
            for (draw, round_), value in other.items():
                if (draw, round_) in base.index:
                    values.append(change(float(value), float(base[draw, round_])))
                    draws.append(int(draw))
        return values, draws

    def _interval(self, policy: str, metric: str, coverage: float, future_runs: int) -> tuple[float, float]:
        from kvroute.sim.study.intervals import combined_interval
        from kvroute.sim.timing.drift import drift_exponent

        values, draws = self._runs(policy, metric)
        # a time or a rate combines in log space where every run has one (a goodput rate of 0 does not)
        log_scale = drift_exponent(metric) != 0 and bool(np.all(values[np.isfinite(values)] > 0))
        ci = combined_interval(values, draws, level=coverage, log_scale=log_scale,
                               bounds=METRIC_BOUNDS.get(metric, (-math.inf, math.inf)), future_runs=future_runs)
        return ci.low, ci.high

    def mean_interval(self, policy: str, metric: str, coverage: float = 0.95) -> tuple[float, float]:
        """``coverage`` prediction interval of the mean over ``rounds`` runs
        (``kvroute.sim.study.intervals.combined_interval``): centred on the central profile's mean
        (the seeds-only table's value), wide by the seeds' spread and the spread between the
        drawn profiles' means (the model's share); a time or a rate in log space; clipped to the
        metric's possible values (``METRIC_BOUNDS``: a time is never negative, a share lies in
        [0, 1]). ``(nan, nan)`` with no spread to work from."""
        return self._interval(policy, metric, coverage, self.rounds)

    def run_interval(self, policy: str, metric: str, coverage: float = 0.95) -> tuple[float, float]:
        """As :meth:`mean_interval`, of a single run's value."""
        return self._interval(policy, metric, coverage, 1)

    def change_interval(self, policy: str, metric: str, coverage: float = 0.95) -> tuple[float, float]:
        """``coverage`` prediction interval of the change of ``policy``'s mean over ``rounds`` runs
        against the baseline's (percent; a share's, ``SHARE_METRICS``, in percentage points),
        centred on the central profile's change of the means (the seeds-only table's), wide by
        the spread of the paired per-run changes within and between profiles (:meth:`_changes`),
        in linear space, clipped to ``change_bounds`` (no fall below -100 %)."""
        from kvroute.sim.study.intervals import combined_interval

        values, draws = self._changes(policy, metric)
        point = (self.base.change_points(policy, metric) if metric in SHARE_METRICS
                 else self.base.change(policy, metric))
        ci = combined_interval(values, draws, level=coverage, log_scale=False, bounds=change_bounds(metric),
                               future_runs=self.rounds, center=point if math.isfinite(point) else None)
        return ci.low, ci.high

    def to_dict(self, coverage: float = 0.95) -> dict:
        """``base.to_dict()`` with, per metric, ``model_interval`` (mean over rounds, model
        uncertainty included), ``run_interval`` (one run) and, for later policies,
        ``change_model_interval_pct`` (``change_model_interval_pp`` for shares); plus ``uncertainty``: draws,
        rounds, method."""
        doc = self.base.to_dict()
        for policy, metrics in doc["policies"].items():
            for metric, entry in metrics.items():
                lo, hi = self.mean_interval(policy, metric, coverage)
                entry["model_interval"] = {"low": _num(lo), "high": _num(hi)}
                lo, hi = self.run_interval(policy, metric, coverage)
                entry["run_interval"] = {"low": _num(lo), "high": _num(hi)}
                if policy != self.policies[0]:
                    lo, hi = self.change_interval(policy, metric, coverage)
                    key = "change_model_interval_pp" if metric in SHARE_METRICS else "change_model_interval_pct"
                    entry[key] = {"low": _num(lo), "high": _num(hi)}
        doc["uncertainty"] = {"draws": self.draws, "rounds_per_draw": self.rounds, "coverage": coverage,
                              "method": self.method}
        return doc


def prediction_interval(values, coverage: float = 0.95, future: int = 1) -> tuple[float, float]:
    """Normal-theory prediction interval of one more value like ``values``, or of the mean of
    ``future`` more: ``mean ± t(n - 1) * sd * sqrt(1 / future + 1 / n)`` (NaNs dropped;
    ``(nan, nan)`` for fewer than two values).

    Unlike percentiles it stays honest with few draws (five draws' percentiles would be nearly
    their min and max, and cover far less than 95 %).
    """
    from scipy.stats import t

    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return math.nan, math.nan
    half = (float(t.ppf(0.5 + coverage / 2, len(x) - 1)) * float(x.std(ddof=1))
            * math.sqrt(1 / future + 1 / len(x)))
    return float(x.mean()) - half, float(x.mean()) + half


def compare_uncertain(
    trace: Trace | Callable[[int], Trace],
    spec: ClusterSpec,
    policies: list[str],
    draws: int,
    rounds: int = 3,
    seed: int = 0,
    prior_range: float = PRIOR_RANGE,
    slo: ServiceClass = ServiceClass(),
    progress=None,
) -> UncertainComparison:
    """``compare`` on the central profile, then on ``draws`` profiles drawn from its coefficients'
    uncertainty (``kvroute.sim.timing.uncertainty.draw_profiles``: bootstrap refits of a measured
    profile, or ``±prior_range`` for a derived prior).

    Draw ``d`` runs every policy on seeds ``seed + (d + 1) * rounds ..`` (its own seeds, so the
    spread of the draws' means holds both the model's and the seeds' share; policies share them,
    so changes keep common random numbers). The profiles are drawn with
    ``numpy.random.default_rng([seed, 2])`` (the workload lengths use ``[seed, 1]``, its arrivals ``[seed, 3]``). Runs: ``(draws + 1) * rounds`` per policy.

    Raises:
        ValueError: ``draws < 1``, or as ``compare``.
        CompareInterrupted: stopped before every run finished; carries the central profile's
            finished runs (the drawn profiles' runs are all listed as missing).
    """
    from kvroute.sim.timing.uncertainty import draw_profiles, profile_uncertainty

    if draws < 1:
        raise ValueError(f"uncertainty draws must be >= 1, got {draws}")
    total = len(policies) * rounds * (draws + 1)
    drawn_runs = [f"{p} round {r} of uncertainty draw {k}" for k in range(draws) for p in policies
                  for r in range(rounds)]
    try:
        base = compare(trace, spec, policies, rounds, seed, slo, progress)
    except CompareInterrupted as stop:
        raise CompareInterrupted(stop.comparison, stop.missing + drawn_runs, total) from None
    profiles = draw_profiles(spec.profile, draws, np.random.default_rng([seed, 2]), prior_range)
    rows = []
    for d, profile in enumerate(profiles):
        first = seed + (d + 1) * rounds
        # Only the central profile's runs keep time series (``base``); the drawn ones give summaries.
        drawn = replace(spec, profile=profile, record_series=False)
        try:
            comparison = compare(trace, drawn, policies, rounds, first, slo, progress)
        except CompareInterrupted:  # the central profile's comparison is kept; the draws are not
            raise CompareInterrupted(base, drawn_runs, total) from None
        rows.append(comparison.summaries.assign(draw=d))
    import pandas as pd

    summaries = pd.concat(rows, ignore_index=True)
    method = profile_uncertainty(spec.profile, prior_range).method
    return UncertainComparison(base, draws, rounds, summaries, method)


def format_uncertain_table(result: UncertainComparison, metrics: list[str] | None = None,
                           coverage: float = 0.95) -> str:
    """``format_table``'s layout with, after each policy, its 95 % interval including model
    uncertainty (``UncertainComparison.mean_interval``), and after each change, the change's
    (``UncertainComparison.change_interval``)."""
    from kvroute.sim.study.figure_style import short_names

    metrics = metrics or list(SUMMARY_METRICS)
    base = result.base
    names = short_names(result.policies)  # a config file's path cut to its name
    header = ["metric"]
    for i, p in enumerate(result.policies):
        header += [f"{names[p]} (seeds)", "with model unc."]
        if i:
            header += [f"Δ vs {names[result.policies[0]]}", "Δ with model unc."]
    rows = [header]
    for m in metrics:
        if not _has_value(base, m):
            continue
        row = [SUMMARY_METRICS[m]]
        for i, p in enumerate(result.policies):
            iv = base.interval_rows[p][m]
            row.append(_fmt_interval(iv["mean"], iv["low"], iv["high"], int(iv["rounds"]), whole_counts(m, [iv["mean"]]),
                                     of=base.num_rounds(p)))
            lo, hi = result.mean_interval(p, m, coverage)
            row.append(format_range(lo, hi, whole=whole_counts(m, [iv["mean"], lo, hi])))
            if i:
                row.append(_fmt_change(base, p, m))
                row.append(format_change_range(*result.change_interval(p, m, coverage), points=m in SHARE_METRICS))
        rows.append(row)
    return tabulate_rows(rows)


def format_range(lo: float | None, hi: float | None, whole: bool = False) -> str:
    """``[lo, hi]`` with 3 decimals below 10 and 1 from there, none when ``whole`` (a count whose
    mean and ends are whole numbers, ``whole_counts``), ``-`` when undefined (None or NaN)."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "-"
    digits = 0 if whole else 3 if max(abs(lo), abs(hi)) < 10 else 1
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def format_change_range(lo: float | None, hi: float | None, points: bool = False) -> str:
    """A change's interval, ``[-5.2, +1.0]%`` (``points``: ``[...] pp``, a share's), empty when
    undefined (None or NaN)."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return ""
    return f"[{lo:+.1f}, {hi:+.1f}]{' pp' if points else '%'}"
