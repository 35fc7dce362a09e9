"""Prediction intervals that hold what the model does not know, and their coverage.

A measured value (the mean of N live rounds) is checked against an interval that combines
(rule in ``docs/reference/intervals.md``; closed form, normal theory, no Monte Carlo):

- the run-to-run spread: the larger of the simulated seeds' spread within a profile and the live
  rounds' own spread (a simulator's seeds can vary less than a shared host does), divided by N;
  with fewer than two live rounds, the larger of the seeds' spread and a prior for the host
  (``prior_sd``: what one live run is expected to move by, since one round cannot show it);
- the prediction's own noise: the seeds' variance over the central profile's R runs;
- the fit's uncertainty: the variance between the means of the profiles drawn from it
  (``kvroute.sim.timing.uncertainty.draw_profiles``: bootstrap refits over the sweep's
  experiments, the ranges the fitted host terms allow), less the seeds' share of it;
- the host's speed drift around the live rounds (``kvroute.sim.timing.drift``): a
  multiplicative factor that moves the centre and whose log variance adds to the rest.

Times are combined in log space (drift is a factor; a time cannot go negative) and the interval
is taken back to seconds; shares, counts and changes between policies in linear space, without
drift (a factor on both policies cancels in their change). The quantile is Student's t with
Welch-Satterthwaite degrees of freedom over the estimated variance terms (the drift's counted
as known). With the central profile's runs alone, no live rounds' spread and no drift, the
interval in linear space is ``kvroute.sim.study.experiment.prediction_interval`` exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvroute.sim.timing.drift import NO_DRIFT, Drift, drift_exponent

DEFAULT_LEVEL = 0.90
"""The interval level ``validate`` checks measured values against (the issue's target: at least
85 % of measured values inside the 90 % interval)."""


HOST_RUN_TO_RUN_LOG_SD = 0.08
"""The default prior for how far one live run of a time measure moves from the next (log standard
deviation), used when a validation has fewer than two live rounds to show it: the root mean square
of the per-round spread of 72 time measures (3 workload shapes, 2 policies, 3 measures, 4 runs of
``bench/bench_validate.py``) on the shared 2-core CPU host (docs/log/2026-12-05-one-round-intervals.md;
median 0.05, 90th percentile 0.13). A quieter host, such as a dedicated GPU server, moves less."""


@dataclass(frozen=True, slots=True)
class CombinedInterval:
    """A prediction interval and the pieces it was made of.

    Attributes:
        low, high: the interval, in the metric's units (NaN when it cannot be formed).
        level: its nominal coverage (0.9: 90 %).
        log_scale: whether it was combined in log space.
        parts: variance terms (in the combining scale), their degrees of freedom, the run-to-run
            source (``"seeds"`` or ``"live rounds"``), the drift and the t quantile.
    """

    low: float
    high: float
    level: float
    log_scale: bool
    parts: dict = field(default_factory=dict)

    def contains(self, value) -> bool | None:
        """Whether ``value`` lies in ``[low, high]`` (:func:`within`: widened by 1e-12 of the
        value's size; an interval of identical runs, e.g. a deterministic hit rate, is its mean
        computed two ways, which can differ in the last bit); None when either is undefined."""
        return within(value, self.low, self.high)


def within(value, low, high) -> bool | None:
    """Whether ``value`` lies in ``[low, high]``, widened by 1e-12 of the value's size (a value
    computed two ways, e.g. a deterministic hit rate predicted and measured, can differ in the
    last bit: 0.7907181671317375 against 0.7907181671317374); None when any of the three is
    undefined (None, NaN, not a number) or ``value`` is infinite."""
    try:
        v, lo, hi = float(value), float(low), float(high)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v) or math.isnan(lo) or math.isnan(hi):
        return None
    slack = 1e-12 * max(1.0, abs(v))
    return bool(lo - slack <= v <= hi + slack)


def _nan(level: float, log_scale: bool, why: str) -> CombinedInterval:
    return CombinedInterval(math.nan, math.nan, level, log_scale, {"why": why})


def combined_interval(sim_values, sim_draws=None, live_values=(), drift: Drift = NO_DRIFT, drift_power: int = 1,
                      level: float = DEFAULT_LEVEL, log_scale: bool = True,
                      bounds: tuple[float, float] = (-math.inf, math.inf), heldout_log_sd: float = 0.0,
                      prior_sd: float = 0.0, future_runs: int | None = None,
                      center: float | None = None) -> CombinedInterval:
    """The ``level`` prediction interval of the mean of the live rounds (module doc).

    Args:
        sim_values: one value per simulated run.
        sim_draws: parallel to ``sim_values``: -1 for a run of the central profile, ``d >= 0``
            for a run of drawn profile ``d``; None: every run is the central profile's.
        live_values: the live rounds' values (non-finite dropped); their number N (at least 1)
            is how many runs the checked mean averages, and from two on their spread counts.
        drift: the host's speed drift; used on the log scale only.
        drift_power: how the metric scales with the drift factor (1 times, -1 rates, 0 none).
        level: nominal coverage in (0, 1).
        log_scale: combine in log space (positive values; non-positive ones are dropped).
        bounds: the metric's possible values; the interval is clipped to them.
        heldout_log_sd: the fit's error on held-out experiments for this metric, log space
            (``kvroute.sim.timing.heldout``); used on the log scale only, a known variance.
        prior_sd: with fewer than two live rounds, the run-to-run standard deviation of one live
            run on this host, in the combining scale (log for times, the metric's units for
            changes: :func:`change_prior_sd`); where it exceeds the seeds' spread it stands for
            the run-to-run term as a known variance (``parts["run_to_run_prior"]``). 0: none.
        future_runs: how many runs the predicted mean averages when no live rounds say it (a
            simulated comparison's ``--rounds``); None: the live rounds' number, at least 1.
        center: the interval's centre in the metric's units in place of the central runs' mean
            (``kvroute compare``'s change of the means, where ``sim_values`` are per-run changes);
            moved by the drift like the mean. None: the central runs' mean.

    Returns:
        The interval; NaN ends when the runs give no spread to work from (fewer than two
        central runs and no other estimated term).

    Raises:
        ValueError: ``level`` outside (0, 1), ``sim_draws`` of another length than ``sim_values``,
            ``future_runs`` below 1, or a ``center`` the scale cannot take (not finite; not
            positive on the log scale).
    """
    x, d, live = _usable_values(sim_values, sim_draws, live_values, level=level, log_scale=log_scale,
                                future_runs=future_runs, center=center)
    fwd, inv = (np.log, np.exp) if log_scale else ((lambda v: v), (lambda v: v))
    central = x[d < 0] if (d < 0).any() else x
    if not len(central):
        return _nan(level, log_scale, "no simulated run")
    y = fwd(x)
    center = float(fwd(np.mean(central) if center is None else center))
    sim_var, sim_df = _seeds_variance(y, d)
    n_live = max(len(live), 1) if future_runs is None or len(live) else future_runs
    r0 = len(central)
    terms, known_var, run_source = _run_to_run_terms(sim_var, sim_df, fwd, live, n_live, r0, prior_sd)
    draw_ids, model_term = _model_term(y, d, sim_var)
    if model_term is not None:
        terms.append(model_term)
    if not terms and not known_var:
        return _nan(level, log_scale, "fewer than two runs: no spread")
    drift_var, heldout_var, shift = _log_space_known_terms(drift, drift_power, heldout_log_sd, log_scale)
    total, df, q = _combine(terms, drift_var, heldout_var, known_var, level)
    low, high = _ends(center, shift, q, total, inv, bounds)
    parts = {name: v for name, v, _ in terms}
    if known_var:
        parts["run_to_run_prior"] = known_var
    parts.update(run_source=run_source, drift_factor=drift.factor if log_scale else 1.0,
                 drift_var=drift_var, heldout_var=heldout_var, df=df, quantile=q, central_runs=r0, live_rounds=len(live),
                 draws=len(draw_ids))
    return CombinedInterval(low, high, level, log_scale, parts)


def _usable_values(sim_values, sim_draws, live_values, *, level: float, log_scale: bool,
                   future_runs: int | None, center: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arguments checked (the errors :func:`combined_interval` raises, in this order), and
    the values it combines, in the metric's units: the simulated runs and their draw ids (-1:
    the central profile) with non-finite runs dropped, and the live rounds with None and
    non-finite ones dropped; on the log scale non-positive values are dropped too (no log)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must be in (0, 1), got {level!r}")
    x = np.asarray(list(sim_values), float)
    d = np.full(len(x), -1) if sim_draws is None else np.asarray(list(sim_draws), int)
    if len(d) != len(x):
        raise ValueError(f"sim_draws has {len(d)} entries for {len(x)} simulated values")
    if future_runs is not None and future_runs < 1:
        raise ValueError(f"future_runs must be >= 1, got {future_runs!r}")
    if center is not None and not (math.isfinite(center) and (center > 0 or not log_scale)):
        raise ValueError(f"center must be finite{' and positive on the log scale' if log_scale else ''}, got {center!r}")
    ok = np.isfinite(x) & ((x > 0) if log_scale else True)
    x, d = x[ok], d[ok]
    live = np.asarray([v for v in live_values if v is not None], float)
    live = live[np.isfinite(live) & ((live > 0) if log_scale else True)]
    return x, d, live


def _seeds_variance(y: np.ndarray, d: np.ndarray) -> tuple[float, int]:
    """The seeds' variance within one profile, in the combining scale (log space for times,
    squared units otherwise): the runs' ``y`` squared deviations from their own profile's mean
    (grouped by draw id ``d``), pooled over the profiles and divided by their degrees of freedom
    ``sum(runs - 1)``; returns ``(variance, degrees of freedom)``, NaN variance with none."""
    groups = [y[d == g] for g in np.unique(d)]
    sim_df = sum(len(g) - 1 for g in groups)
    sim_var = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / sim_df if sim_df else math.nan
    return sim_var, sim_df


def _run_to_run_terms(sim_var: float, sim_df: int, fwd, live: np.ndarray, n_live: int, r0: int,
                      prior_sd: float) -> tuple[list[tuple[str, float, float]], float, str]:
    """The run-to-run and prediction-seeds variance terms, in the combining scale (``fwd`` takes
    the live rounds there): the live rounds' variance over ``n_live`` (df ``N - 1``) where it
    exceeds the seeds' ``sim_var``; else, with fewer than two live rounds, the host prior
    ``prior_sd ** 2 / n_live`` as a known variance where it exceeds it; else the seeds'
    ``sim_var * (1 / n_live + 1 / r0)`` (df ``sim_df``). The first two add the seeds' own
    ``sim_var / r0`` for the prediction's mean of ``r0`` central runs. Returns the estimated
    terms ``(name, variance, degrees of freedom)``, the known variance (0 unless the prior
    stands) and the run-to-run term's source."""
    terms: list[tuple[str, float, float]] = []  # (name, variance, degrees of freedom)
    known_var = 0.0  # the host prior's, when it stands for the run-to-run term
    live_var = float(np.var(fwd(live), ddof=1)) if len(live) >= 2 else math.nan
    run_source = "seeds"
    if math.isfinite(live_var) and not (live_var <= sim_var):
        run_source = "live rounds"
        terms.append(("run_to_run", live_var / n_live, len(live) - 1))
        if math.isfinite(sim_var):
            terms.append(("prediction_seeds", sim_var / r0, sim_df))
    elif len(live) < 2 and prior_sd > 0 and not (prior_sd ** 2 <= sim_var):
        run_source = "host prior"
        known_var += prior_sd ** 2 / n_live
        if math.isfinite(sim_var):
            terms.append(("prediction_seeds", sim_var / r0, sim_df))
    elif math.isfinite(sim_var):
        terms.append(("run_to_run_and_prediction_seeds", sim_var * (1 / n_live + 1 / r0), sim_df))
    return terms, known_var, run_source


def _model_term(y: np.ndarray, d: np.ndarray, sim_var: float) -> tuple[list, tuple[str, float, float] | None]:
    """The model term, in the combining scale: the variance between the drawn profiles' means of
    ``y`` (draw ids ``d >= 0``) less the seeds' share of it (``sim_var`` times the mean of ``1 /
    runs per draw``), floored at 0, with ``draws - 1`` degrees of freedom. Returns the draw ids
    and ``("model", variance, df)``, or None with fewer than two drawn profiles."""
    draw_ids = [g for g in np.unique(d) if g >= 0]
    if len(draw_ids) < 2:
        return draw_ids, None
    means = np.array([y[d == g].mean() for g in draw_ids])
    sizes = np.array([(d == g).sum() for g in draw_ids])
    seeds_share = (sim_var if math.isfinite(sim_var) else 0.0) * float(np.mean(1.0 / sizes))
    model_var = max(0.0, float(np.var(means, ddof=1)) - seeds_share)
    return draw_ids, ("model", model_var, len(draw_ids) - 1)


def _log_space_known_terms(drift: Drift, drift_power: int, heldout_log_sd: float,
                           log_scale: bool) -> tuple[float, float, float]:
    """The terms counted as known, on the log scale only (all 0 in linear space): the drift's
    variance ``(drift_power * log_sd) ** 2`` and the held-out error's ``heldout_log_sd ** 2``
    (log space squared), and the centre's shift ``drift_power * log(factor)`` (log space).
    Returns ``(drift_var, heldout_var, shift)``."""
    drift_var = (drift_power * drift.log_sd) ** 2 if log_scale else 0.0
    heldout_var = heldout_log_sd ** 2 if log_scale else 0.0
    shift = drift_power * drift.log_factor if log_scale else 0.0
    return drift_var, heldout_var, shift


def _combine(terms: list[tuple[str, float, float]], drift_var: float, heldout_var: float, known_var: float,
             level: float) -> tuple[float, float, float]:
    """The combination, in the combining scale: the total variance ``V`` (the estimated
    ``terms`` plus the known drift, held-out and prior variances), its Welch-Satterthwaite
    degrees of freedom ``V ** 2 / sum(v ** 2 / df)`` over the estimated terms with ``v, df > 0``
    (inf with none) and Student's t quantile at ``(1 + level) / 2`` (the normal's at inf df).
    Returns ``(V, df, q)``."""
    from scipy.stats import t

    total = sum(v for _, v, _ in terms) + drift_var + heldout_var + known_var
    denom = sum(v * v / df for _, v, df in terms if v > 0 and df > 0)
    df = total * total / denom if denom > 0 else math.inf
    q = float(t.ppf(0.5 + level / 2, df)) if math.isfinite(df) else float(_z(level))
    return total, df, q


def _ends(center: float, shift: float, q: float, total: float, inv,
          bounds: tuple[float, float]) -> tuple[float, float]:
    """The interval's ends in the metric's units: ``inv(center + shift -/+ q * sqrt(total))``
    (``inv``: exp from log space, identity in linear space), clipped to ``bounds``."""
    half = q * math.sqrt(total)
    low, high = float(inv(center + shift - half)), float(inv(center + shift + half))
    return max(low, bounds[0]), min(high, bounds[1])


def prior_sd_for(metric: str, run_log_sd: float, change_pct: float | None = None) -> float:
    """The host's run-to-run prior for ``metric`` in the scale :func:`combined_interval` combines
    it in (its ``prior_sd``): ``run_log_sd`` for a time or a rate (log space); for the change
    between two policies of one (``change_pct`` given, the predicted change in percent),
    :func:`change_prior_sd`; 0 for shares and counts, which take no host prior."""
    if not drift_exponent(metric):
        return 0.0
    return run_log_sd if change_pct is None else change_prior_sd(run_log_sd, change_pct)


def change_prior_sd(run_log_sd: float, predicted_change_pct: float) -> float:
    """The run-to-run standard deviation (percentage points) of one live round's change between
    two policies, ``100 (k / b - 1)``, when each policy's value moves by a log standard deviation
    ``run_log_sd`` independently: ``100 (1 + c / 100) sqrt(2) run_log_sd`` at the predicted change
    ``c`` (first order); 0 for a non-finite change."""
    if not math.isfinite(predicted_change_pct):
        return 0.0
    return 100.0 * max(0.0, 1.0 + predicted_change_pct / 100.0) * math.sqrt(2.0) * run_log_sd


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def coverage(flags) -> dict:
    """How many checked values fell inside their intervals: ``{"inside", "checked", "share"}``
    (``share`` None when nothing was checked; None flags are not checked)."""
    checked = [bool(f) for f in flags if f is not None]
    k = sum(checked)
    return {"inside": k, "checked": len(checked), "share": k / len(checked) if checked else None}
