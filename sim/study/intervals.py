"""Prediction intervals that hold what the model does not know, and their coverage.

A measured value (the mean of N live rounds) is checked against an interval that combines
(rule in ``docs/reference/intervals.md``; closed form, normal theory, no Monte Carlo):

- the run-to-run spread: the larger of the simulated seeds' spread within a profile and the live
  rounds' own spread (a simulator's seeds can vary less than a shared host does), divided by N;
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

from kvroute.sim.timing.drift import NO_DRIFT, Drift

DEFAULT_LEVEL = 0.90
"""The interval level ``validate`` checks measured values against (the issue's target: at least
85 % of measured values inside the 90 % interval)."""


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
        """Whether ``value`` lies in ``[low, high]``, widened by 1e-12 of the value's size (an
        interval of identical runs, e.g. a deterministic hit rate, is its mean computed two ways,
        which can differ in the last bit); None when either is undefined."""
        try:
            v = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(v) or math.isnan(self.low) or math.isnan(self.high):
            return None
        slack = 1e-12 * max(1.0, abs(v))
        return bool(self.low - slack <= v <= self.high + slack)


def _nan(level: float, log_scale: bool, why: str) -> CombinedInterval:
    return CombinedInterval(math.nan, math.nan, level, log_scale, {"why": why})


def combined_interval(sim_values, sim_draws=None, live_values=(), drift: Drift = NO_DRIFT, drift_power: int = 1,
                      level: float = DEFAULT_LEVEL, log_scale: bool = True,
                      bounds: tuple[float, float] = (-math.inf, math.inf), heldout_log_sd: float = 0.0
                      ) -> CombinedInterval:
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

    Returns:
        The interval; NaN ends when the runs give no spread to work from (fewer than two
        central runs and no other estimated term).

    Raises:
        ValueError: ``level`` outside (0, 1), or ``sim_draws`` of another length than ``sim_values``.
    """
    from scipy.stats import t

    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must be in (0, 1), got {level!r}")
    x = np.asarray(list(sim_values), float)
    d = np.full(len(x), -1) if sim_draws is None else np.asarray(list(sim_draws), int)
    if len(d) != len(x):
        raise ValueError(f"sim_draws has {len(d)} entries for {len(x)} simulated values")
    ok = np.isfinite(x) & ((x > 0) if log_scale else True)
    x, d = x[ok], d[ok]
    live = np.asarray([v for v in live_values if v is not None], float)
    live = live[np.isfinite(live) & ((live > 0) if log_scale else True)]
    fwd, inv = (np.log, np.exp) if log_scale else ((lambda v: v), (lambda v: v))
    central = x[d < 0] if (d < 0).any() else x
    if not len(central):
        return _nan(level, log_scale, "no simulated run")
    y = fwd(x)
    center = float(fwd(np.mean(central)))
    groups = [y[d == g] for g in np.unique(d)]
    sim_df = sum(len(g) - 1 for g in groups)
    sim_var = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / sim_df if sim_df else math.nan
    n_live = max(len(live), 1)
    r0 = len(central)
    terms: list[tuple[str, float, float]] = []  # (name, variance, degrees of freedom)
    live_var = float(np.var(fwd(live), ddof=1)) if len(live) >= 2 else math.nan
    run_source = "seeds"
    if math.isfinite(live_var) and not (live_var <= sim_var):
        run_source = "live rounds"
        terms.append(("run_to_run", live_var / n_live, len(live) - 1))
        if math.isfinite(sim_var):
            terms.append(("prediction_seeds", sim_var / r0, sim_df))
    elif math.isfinite(sim_var):
        terms.append(("run_to_run_and_prediction_seeds", sim_var * (1 / n_live + 1 / r0), sim_df))
    draw_ids = [g for g in np.unique(d) if g >= 0]
    model_var = 0.0
    if len(draw_ids) >= 2:
        means = np.array([y[d == g].mean() for g in draw_ids])
        sizes = np.array([(d == g).sum() for g in draw_ids])
        seeds_share = (sim_var if math.isfinite(sim_var) else 0.0) * float(np.mean(1.0 / sizes))
        model_var = max(0.0, float(np.var(means, ddof=1)) - seeds_share)
        terms.append(("model", model_var, len(draw_ids) - 1))
    if not terms:
        return _nan(level, log_scale, "fewer than two runs: no spread")
    drift_var = (drift_power * drift.log_sd) ** 2 if log_scale else 0.0
    heldout_var = heldout_log_sd ** 2 if log_scale else 0.0
    shift = drift_power * drift.log_factor if log_scale else 0.0
    total = sum(v for _, v, _ in terms) + drift_var + heldout_var
    denom = sum(v * v / df for _, v, df in terms if v > 0 and df > 0)
    df = total * total / denom if denom > 0 else math.inf
    q = float(t.ppf(0.5 + level / 2, df)) if math.isfinite(df) else float(_z(level))
    half = q * math.sqrt(total)
    low, high = float(inv(center + shift - half)), float(inv(center + shift + half))
    low, high = max(low, bounds[0]), min(high, bounds[1])
    parts = {name: v for name, v, _ in terms}
    parts.update(run_source=run_source, drift_factor=drift.factor if log_scale else 1.0,
                 drift_var=drift_var, heldout_var=heldout_var, df=df, quantile=q, central_runs=r0, live_rounds=len(live),
                 draws=len(draw_ids))
    return CombinedInterval(low, high, level, log_scale, parts)


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def coverage(flags) -> dict:
    """How many checked values fell inside their intervals: ``{"inside", "checked", "share"}``
    (``share`` None when nothing was checked; None flags are not checked)."""
    checked = [bool(f) for f in flags if f is not None]
    k = sum(checked)
    return {"inside": k, "checked": len(checked), "share": k / len(checked) if checked else None}
