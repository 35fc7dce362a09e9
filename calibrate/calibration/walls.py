"""A fit that says when it hits a wall: fitted terms at their bounds, and repeated experiments
that scatter too much to fit through.

A bounded fit that puts a term on its bound has not found the data's answer: the data asked for
more (or less) than the bound allows, and the other terms took up the rest. This module names
such terms and finds what the data asked for by refitting without that bound:

- step costs (:func:`cost_walls`): a coefficient of the non-negative least-squares fit
  (``kvroute.calibrate.calibration.fit``) that is 0 or contributes less than ``tol`` of the
  predicted time, refitted by linear least squares with that coefficient free of its bound
  (the others kept >= 0), at the fit's weight-load floor and weights;
- burst terms (:func:`asked_beyond`): the host contention at its upper bound
  (``kvroute.calibrate.calibration.bursts.CONTENTION_BOUND``), refitted on the same burst loss
  up to ``ASK_LIMIT`` times the bound.

Repeated experiments of one configuration (:func:`repeat_scatter`, :func:`burst_scatter`) that
differ by more than ``SCATTER_LIMIT`` (2x) are named too; the fit's bootstrap then resamples those
configurations' experiments as well (``fit.bootstrap_coefficients``), so their scatter widens the
coefficients' uncertainty instead of being averaged away.

The profile carries the findings as ``fit_notes`` (``{"at_bound": [...], "scatter": [...]}``,
:func:`fit_notes_document`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SCATTER_LIMIT = 2.0
"""Repeated experiments whose largest and smallest measured times differ by more than this
factor are reported and resampled in the bootstrap."""

BOUND_TOL = 1e-3
"""A term within this relative distance of its bound (or, for a step-cost coefficient at 0,
contributing less than this share of the predicted time) is at its bound."""

ASK_LIMIT = 16.0
"""How far beyond an upper bound :func:`asked_beyond` looks, in multiples of the bound."""


@dataclass(frozen=True, slots=True)
class Wall:
    """A fitted term at one of its bounds.

    Attributes:
        term: the profile field, e.g. ``"host.contention"`` or ``"step_cost.weight_load_s"``.
        bound: the bound it sits on; side: ``"upper"`` or ``"lower"``.
        value: the fitted value.
        asked_for: the value a refit without that bound gives (None: not refitted).
        loss_at_bound, loss_asked: the fit's objective at the bound and at ``asked_for``.
        note: what it means, in words.
    """

    term: str
    bound: float
    side: str
    value: float
    asked_for: float | None = None
    loss_at_bound: float | None = None
    loss_asked: float | None = None
    note: str = ""

    def describe(self) -> str:
        """One line for the fit summary."""
        asked = ("not refitted" if self.asked_for is None else
                 f"the data ask for {self.asked_for:.4g}" + (
                     f" (objective {self.loss_at_bound:.4g} at the bound, {self.loss_asked:.4g} there)"
                     if self.loss_at_bound is not None and self.loss_asked is not None else ""))
        return (f"AT BOUND: {self.term} = {self.value:.4g} on its {self.side} bound {self.bound:g}; {asked}"
                + (f": {self.note}" if self.note else ""))

    def to_dict(self) -> dict:
        """JSON-ready (six significant digits)."""
        return {"term": self.term, "bound": _r(self.bound), "side": self.side, "value": _r(self.value),
                "asked_for": _r(self.asked_for), "loss_at_bound": _r(self.loss_at_bound),
                "loss_asked": _r(self.loss_asked), "note": self.note}


@dataclass(frozen=True, slots=True)
class Scatter:
    """Repeated experiments of one configuration that disagree.

    Attributes:
        what: ``"ttft"``/``"itl"`` observations, or ``"burst <metric>"``.
        config: the configuration (as :attr:`Observation.config` or the burst's shape).
        ratio: largest / smallest measured value over its experiments.
        experiments: how many repeated experiments.
    """

    what: str
    config: tuple
    ratio: float
    experiments: int

    def describe(self) -> str:
        """One line for the fit summary."""
        consequence = ("each is compared as measured, and their spread widens the burst fit's residual variance, "
                       "which sets the contention range the profile draws from" if self.what.startswith("burst")
                       else "their scatter widens the bootstrap, not fitted through")
        return (f"SCATTER: {self.what} {self.config}: {self.experiments} repeated experiments differ by "
                f"{self.ratio:.3g}x (> {SCATTER_LIMIT:g}x): {consequence}")

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"what": self.what, "config": [_plain(v) for v in self.config], "ratio": _r(self.ratio),
                "experiments": self.experiments}


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _r(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.6g}")


def at_upper(value: float, bound: float, tol: float = BOUND_TOL) -> bool:
    """Whether ``value`` is within ``tol`` (relative) of the upper ``bound``."""
    return value >= bound * (1.0 - tol)


def asked_beyond(loss, bound: float, limit: float = ASK_LIMIT, xatol: float = 0.01) -> tuple[float, float, float]:
    """What the data ask for a term fitted at its upper ``bound``: the minimum of ``loss`` over
    ``[bound, limit * bound]`` (``scipy.optimize.minimize_scalar``, bounded).

    Returns:
        ``(asked_for, loss_at_bound, loss_asked)``; ``asked_for`` at ``limit * bound`` means the
        data ask for at least that.
    """
    from scipy.optimize import minimize_scalar

    at_bound = float(loss(bound))
    res = minimize_scalar(loss, bounds=(bound, limit * bound), method="bounded",
                          options={"xatol": xatol * bound, "maxiter": 30})
    x, f = float(res.x), float(res.fun)
    if f >= at_bound:
        return bound, at_bound, at_bound
    return x, at_bound, f


def cost_walls(obs, mask, cost, overhead_source: str, per_token_overhead: bool = True,
               tol: float = BOUND_TOL) -> list[Wall]:
    """Step-cost coefficients at their lower bound 0, and what the data ask for.

    Args:
        obs, mask: the observations and the share the fit used (as ``fit.fit_cost``).
        cost: the fitted :class:`~kvroute.sim.timing.cost_model.StepCost`.
        overhead_source: the fit's ``"metrics"`` or ``"fit"`` (which TTFT target it fitted).
        per_token_overhead: whether the per-prompt-token admission term was fitted.
        tol: a coefficient whose share of the predicted time is below ``tol`` is at its bound.

    Returns:
        One :class:`Wall` per coefficient at 0 whose refit without that bound asks for a negative
        value and lowers the objective by more than ``tol`` (relative): a coefficient that is 0
        because the data need none of it is not a wall.
    """
    from scipy.optimize import lsq_linear

    from kvroute.calibrate.calibration.observations import TTFT_KINDS
    from kvroute.calibrate.calibration.steps import COEFFICIENTS, design_row
    from kvroute.sim.timing.cost_model import StepCost

    sel = [o for o, m in zip(obs, np.ones(len(obs), bool) if mask is None else mask) if m]
    if not sel:
        return []
    meas = np.array([o.measured_s for o in sel])
    is_ttft = np.array([o.kind in TTFT_KINDS for o in sel], float)
    plen = np.array([o.desc.get("prompt_len", 0) for o in sel], float)
    extra = np.column_stack([is_ttft, is_ttft * plen if per_token_overhead else np.zeros(len(sel))])
    y = np.array([o.engine_s if (overhead_source == "metrics" and o.kind in TTFT_KINDS) else o.measured_s
                  for o in sel])
    x = np.array([getattr(cost, k) for k in COEFFICIENTS])
    thr = cost.weight_load_s / cost.per_token_s if cost.weight_load_s > 0 and cost.per_token_s > 0 else 0.0
    # the design at the fit's weight-load floor, as fit._floor_design builds it: steps under thr
    # tokens sit on the floor
    floor = StepCost(0.0, 1.0, 1.0 / thr, 0.0, 0.0, 0.0) if thr > 0 else None
    X = np.array([design_row(list(o.steps), floor) for o in sel])
    w = 1.0 / meas
    total = float(np.sum(X @ x))
    walls = []
    for k, name in enumerate(COEFFICIENTS):
        share = float(np.sum(X[:, k]) * x[k]) / total if total > 0 else 0.0
        if x[k] > 0 and share >= tol:
            continue
        A = np.hstack([X, extra]) * w[:, None]
        scale = np.abs(A).max(axis=0)
        scale[scale == 0] = 1.0
        lower = np.zeros(A.shape[1])
        lower[k] = -np.inf
        res = lsq_linear(A / scale, y * w, bounds=(lower, np.inf))
        asked = float(res.x[k] / scale[k])
        bounded = lsq_linear(A / scale, y * w, bounds=(0, np.inf))
        if asked >= 0 or not res.cost < bounded.cost * (1.0 - tol):
            continue  # the data need none of it: no better fit below 0
        walls.append(Wall(f"step_cost.{name}", 0.0, "lower", float(x[k]), asked, 2 * float(bounded.cost),
                          2 * float(res.cost),
                          "the data ask for a negative time: another term overstates it, or the model lacks a "
                          "term that shortens these steps"))
    return walls


def repeat_scatter(obs, limit: float = SCATTER_LIMIT) -> list[Scatter]:
    """Configurations whose repeated experiments differ by more than ``limit`` (largest over
    smallest measured time; an experiment with several observations counts by its median)."""
    per: dict[tuple, dict[int, list[float]]] = {}
    for o in obs:
        per.setdefault(o.config, {}).setdefault(o.exp_id, []).append(o.measured_s)
    out = []
    for config, exps in per.items():
        values = [float(np.median(v)) for v in exps.values() if len(v)]
        values = [v for v in values if v > 0 and math.isfinite(v)]
        if len(values) >= 2 and max(values) / min(values) > limit:
            what = "ttft" if config[0] in ("cold", "cached") else "itl"
            out.append(Scatter(what, config, max(values) / min(values), len(values)))
    return sorted(out, key=lambda s: -s.ratio)


def scattered_configs(obs, limit: float = SCATTER_LIMIT) -> set[tuple]:
    """The configurations :func:`repeat_scatter` names."""
    return {s.config for s in repeat_scatter(obs, limit)}


def burst_scatter(bursts, limit: float = SCATTER_LIMIT) -> list[Scatter]:
    """Repeated bursts of one shape (kind, servers, batch, prompt, output and prefix length) whose
    measured figures differ by more than ``limit``, per figure."""
    per: dict[tuple, list] = {}
    for b in bursts:
        per.setdefault((b.kind, b.num_servers, b.batch, b.prompt_len, b.max_tokens, b.prefix_len), []).append(b)
    out = []
    for shape, group in per.items():
        if len(group) < 2:
            continue
        for metric in group[0].measured:
            values = [float(b.measured.get(metric, math.nan)) for b in group]
            values = [v for v in values if v > 0 and math.isfinite(v)]
            if len(values) >= 2 and max(values) / min(values) > limit:
                out.append(Scatter(f"burst {metric}", shape, max(values) / min(values), len(values)))
    return sorted(out, key=lambda s: -s.ratio)


def fit_notes_document(walls, scatter, max_scatter: int = 20) -> dict:
    """The profile's ``fit_notes`` section: ``{"at_bound": [...], "scatter": [...]}`` (the
    ``max_scatter`` largest scatters, and their total count)."""
    scatter = list(scatter)
    return {"at_bound": [w.to_dict() for w in walls],
            "scatter": [s.to_dict() for s in scatter[:max_scatter]],
            "num_scattered": len(scatter), "scatter_limit": SCATTER_LIMIT}


def summary_lines(walls, scatter, max_scatter: int = 5) -> list[str]:
    """Lines for a fit summary: every wall, the ``max_scatter`` largest scatters and their count."""
    scatter = list(scatter)
    lines = [w.describe() for w in walls] + [s.describe() for s in scatter[:max_scatter]]
    if len(scatter) > max_scatter:
        lines.append(f"SCATTER: {len(scatter) - max_scatter} more configurations differ by more than "
                     f"{SCATTER_LIMIT:g}x (profile fit_notes)")
    return lines
