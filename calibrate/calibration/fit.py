"""Fit the simulator's step-cost model to observations, hold some out, write a profile.

Model: an observation's time is ``api_server_s`` (TTFT only) plus the sum of
``StepCost.step_time`` over its steps (:mod:`kvroute.calibrate.calibration.steps`). Given which steps sit on
the weight-load floor, that is linear in the six coefficients, so the fit is non-negative least
squares on relative residuals (every observation weighs by ``1 / measured``, so short and long
times count alike). The floor is handled by trying every token threshold below which steps are
on it and keeping the best consistent solution; ``loss="soft_l1"`` (or ``"huber"``) then refines
with ``scipy.optimize.least_squares`` under bounds >= 0 on the exact (max) model.

``api_server_s`` comes from the server's ``/metrics`` (``overhead="metrics"``: median of client
TTFT minus the engine's queue + prefill time) and the TTFT targets become the engine's share; or
it is fitted as a free non-negative coefficient (``overhead="fit"``; the default when the server
exported no histograms).

Hold-out: a seeded share of the configurations of every kind (all repetitions of a prompt length,
a batch x context point, ...) is left out of the fit; quality (R^2, median and p90 absolute
percentage error) is reported on TTFT and ITL for the held-out and the fitted configurations,
comparing each configuration's median over its repetitions with the prediction, and for every
single measurement. The profile's coefficients are the ones fitted without the held-out share.

Uncertainty (``bootstrap=N``): the fit is repeated on N resamples of the fitted share's
configurations (:func:`bootstrap_coefficients`) and the refitted coefficient vectors go into the
profile's ``step_cost_uncertainty``.

Walls (:mod:`kvroute.calibrate.calibration.walls`): a coefficient held on its bound is named in the
summary and the profile's ``fit_notes`` with what a refit without that bound asks for, and so is
every configuration whose repeated experiments differ by more than 2x.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvroute.calibrate.calibration.observations import Observation, TTFT_KINDS
from kvroute.calibrate.calibration.steps import COEFFICIENTS, Step, design_row, predict
from kvroute.sim.timing.coverage import measured_range
from kvroute.calibrate.calibration.walls import SCATTER_LIMIT, fit_notes_document
from kvroute.sim.timing.cost_model import StepCost


@dataclass(frozen=True, slots=True)
class Quality:
    """Fit quality on one set of observations.

    Attributes:
        n: observations.
        r2: coefficient of determination of predicted vs measured (NaN for n < 2).
        median_ape, p90_ape: median and 90th percentile of ``|pred - meas| / meas`` (fractions).
        median_abs_log, p90_abs_log: median and 90th percentile of ``|log(pred / meas)|`` over
            the observations with both positive (NaN without any): the spread a prediction
            interval needs (``kvroute.sim.timing.heldout``), which the percentage error tells
            only with the error's sign.
    """

    n: int
    r2: float
    median_ape: float
    p90_ape: float
    median_abs_log: float = math.nan
    p90_abs_log: float = math.nan


def quality(measured: np.ndarray, predicted: np.ndarray) -> Quality:
    """R^2 and absolute percentage errors of ``predicted`` against ``measured`` (same shape)."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    if len(m) == 0:
        return Quality(0, math.nan, math.nan, math.nan)
    ape = np.abs(p - m) / m
    ss = float(np.sum((m - m.mean()) ** 2))
    r2 = 1.0 - float(np.sum((p - m) ** 2)) / ss if len(m) > 1 and ss > 0 else math.nan
    both = (p > 0) & (m > 0)
    ale = np.abs(np.log(p[both] / m[both]))
    logs = (float(np.median(ale)), float(np.percentile(ale, 90))) if len(ale) else (math.nan, math.nan)
    return Quality(len(m), r2, float(np.median(ape)), float(np.percentile(ape, 90)), *logs)


@dataclass
class FitResult:
    """A fitted cost model and how well it predicts.

    Attributes:
        cost: fitted step-cost coefficients.
        api_server_s: API-server time added to every TTFT, s.
        overhead_source: ``"metrics"`` or ``"fit"``.
        jitter_cv: coefficient of variation of the measured per-request overhead (0 if unknown).
        observations: every observation used.
        held_out: parallel to ``observations``: True for the held-out share.
        predicted_s: parallel predictions, s (API time included for TTFT).
        quality: ``{split: {"ttft"|"itl"|<kind>: Quality}}``; splits ``"heldout"`` and ``"fit"``
            compare each configuration's median over its repetitions with the prediction,
            ``"heldout_raw"`` and ``"fit_raw"`` every single measurement.
        method: e.g. ``"nnls"`` or ``"least_squares/soft_l1"``.
        holdout: share of experiments held out; ``seed``: split seed.
        folds: configurations' folds of the cross validation (``quality["crossval"]``; below 2:
            none).
        bootstrap_samples: ``(N, len(UNCERTAIN_FIELDS))`` coefficient vectors refitted on
            bootstrap resamples (:func:`bootstrap_coefficients`), or None.
    """

    cost: StepCost
    api_server_s: float
    overhead_source: str
    jitter_cv: float
    observations: list[Observation]
    held_out: np.ndarray
    predicted_s: np.ndarray
    quality: dict[str, dict[str, Quality]]
    method: str
    holdout: float
    seed: int
    api_server_per_token_s: float = 0.0
    parts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    bootstrap_samples: np.ndarray | None = None
    walls: list = field(default_factory=list)
    scatter: list = field(default_factory=list)
    folds: int = 4

    def summary(self) -> str:
        """A few lines: coefficients and held-out errors."""
        lines = [f"{k} = {getattr(self.cost, k):.4g}" for k in COEFFICIENTS]
        lines.append(f"api_server_s = {self.api_server_s:.4g} + {self.api_server_per_token_s:.3g} x prompt tokens"
                     f" ({self.overhead_source})")
        names = {"heldout": "held-out configurations (median of repetitions)",
                 "heldout_raw": "held-out single measurements",
                 "crossval": "cross-validated configurations (every configuration held out once)",
                 "crossval_raw": "cross-validated single measurements",
                 "fit": "fitted configurations", "fit_raw": "fitted single measurements"}
        for split in ("heldout", "heldout_raw", "crossval", "crossval_raw", "fit", "fit_raw"):
            if split not in self.quality:
                continue
            lines.append(names[split] + ":")
            for key in ("ttft", "itl", "cold", "cached", "decode", "mixed"):
                q = self.quality[split].get(key)
                if q and q.n:
                    lines.append(
                        f"  {key:6s} n={q.n:4d}  R^2={q.r2:6.3f}  median APE={100 * q.median_ape:5.1f}%"
                        f"  p90 APE={100 * q.p90_ape:5.1f}%"
                    )
        if self.bootstrap_samples is not None:
            lines.append(f"bootstrap ({len(self.bootstrap_samples)} refits), 95% range:")
            for name, column in zip(UNCERTAIN_FIELDS, self.bootstrap_samples.T):
                lo, hi = np.percentile(column, [2.5, 97.5])
                lines.append(f"  {name} {lo:.4g} .. {hi:.4g}")
        from kvroute.calibrate.calibration.walls import summary_lines

        lines += summary_lines(self.walls, self.scatter)  # terms at a bound; repeats that scatter (walls.py)
        return "\n".join(lines)


def split_holdout(obs: list[Observation], share: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out observations: ``share`` of the configurations of each kind (at
    least one when a kind has two or more), chosen with ``numpy.random.default_rng(seed)``; all
    repetitions of a configuration (:attr:`Observation.config`) stay on the same side.

    Raises:
        ValueError: ``share`` outside ``[0, 1)``.
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"holdout share must be in [0, 1), got {share}")
    rng = np.random.default_rng(seed)
    held: set[tuple] = set()
    for kind in sorted({o.kind for o in obs}):
        configs = sorted({o.config for o in obs if o.kind == kind}, key=repr)
        k = int(round(share * len(configs)))
        if share > 0 and k == 0 and len(configs) >= 2:
            k = 1
        for i in rng.permutation(len(configs))[:k]:
            held.add(configs[i])
    return np.array([o.config in held for o in obs], dtype=bool)


def _nnls_rel(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    A = X * w[:, None]
    b = y * w
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale, b, maxiter=50 * A.shape[1])
    return x / scale


def _as_cost(x: np.ndarray) -> StepCost:
    return StepCost(**{k: float(max(v, 0.0)) for k, v in zip(COEFFICIENTS, x[: len(COEFFICIENTS)])})


def _floor_design(steps_list: list[tuple[Step, ...]], threshold: float, extra: np.ndarray) -> np.ndarray:
    """Design matrix when every step with fewer than ``threshold`` tokens sits on the floor,
    followed by the ``extra`` columns."""
    fake = StepCost(0.0, 1.0, 1.0 / threshold, 0.0, 0.0, 0.0) if threshold > 0 else None
    X = np.array([design_row(list(s), fake) for s in steps_list])
    return np.hstack([X, extra])


@dataclass(frozen=True, slots=True)
class CostFit:
    """Output of :func:`fit_cost`.

    Attributes:
        cost: step-cost coefficients.
        api_server_s: per-request time before the first token beyond the engine steps, s.
        api_server_per_token_s: its growth per prompt token, s/token (JSON, validation and block
            hashing of the prompt; the simulator applies it only if it knows the field).
        overhead_source: ``"metrics"`` or ``"fit"``.
        jitter_cv: coefficient of variation of the measured API-server time around its fitted
            line in prompt length, from the bulk of the spread (:func:`lognormal_cv`; 0 if unknown).
        method: ``"nnls"`` or ``"least_squares/<loss>"``.
        parts: the pieces of ``api_server_s`` and ``api_server_per_token_s``, for provenance.
    """

    cost: StepCost
    api_server_s: float
    api_server_per_token_s: float
    overhead_source: str
    jitter_cv: float
    method: str
    parts: dict


def fit_cost(
    obs: list[Observation],
    mask: np.ndarray | None = None,
    overhead: str = "auto",
    loss: str = "linear",
    per_token_overhead: bool = True,
) -> CostFit:
    """Fit the coefficients on ``obs[mask]``.

    Every TTFT observation also gets ``a + b * prompt_len`` (the per-request time outside the
    engine's steps: the API server, plus the engine's admission of a new request), ``a, b >= 0``.

    Args:
        obs: observations.
        mask: which to fit on (default all).
        overhead: ``"metrics"``: TTFT targets are the engine's share (queue + prefill time from
            ``/metrics``), so ``a, b`` fit only the engine's admission cost and the API server's
            time is added from a robust line through the measured ``client TTFT - engine``
            times; ``"fit"``: TTFT targets are the client's TTFT and ``a, b`` fit everything;
            ``"auto"``: ``"metrics"`` when every TTFT observation has an engine share.
        loss: ``"linear"`` (NNLS only) or a ``scipy.optimize.least_squares`` robust loss
            (``"soft_l1"``, ``"huber"``, ``"cauchy"``) refining the NNLS solution.
        per_token_overhead: fit ``b``; False fixes it at 0.

    Raises:
        ValueError: no TTFT or no ITL observation to fit on, or an unknown option.
    """
    sel = [o for o, m in zip(obs, np.ones(len(obs), bool) if mask is None else mask) if m]
    ttft = [o for o in sel if o.kind in TTFT_KINDS]
    itl = [o for o in sel if o.kind not in TTFT_KINDS]
    if not ttft or not itl:
        raise ValueError(
            f"need both TTFT and ITL observations to fit (have {len(ttft)} TTFT, {len(itl)} ITL)"
        )
    if overhead not in ("auto", "metrics", "fit"):
        raise ValueError(f"overhead must be 'auto', 'metrics' or 'fit', got {overhead!r}")
    if loss not in ("linear", "soft_l1", "huber", "cauchy", "arctan"):
        raise ValueError(f"unknown loss {loss!r}")
    have_engine = all(o.engine_s > 0 for o in ttft)
    if overhead == "metrics" and not have_engine:
        raise ValueError("overhead='metrics' needs the server's /metrics histograms, which this sweep lacks")
    mode = "metrics" if (overhead == "metrics" or (overhead == "auto" and have_engine)) else "fit"
    over = np.array([o.overhead_s for o in ttft if o.overhead_s == o.overhead_s])
    over_L = np.array([o.desc.get("prompt_len", 0) for o in ttft if o.overhead_s == o.overhead_s], float)
    a_o, b_o = robust_line(over_L, over, per_token_overhead)
    line = a_o + b_o * over_L  # the fitted API-server time at each measured prompt, s
    # (a proportional line, intercept clipped to 0, is positive wherever prompts were measured)
    jitter = lognormal_cv(over / line) if len(over) > 1 and bool(np.all(line > 0)) else 0.0

    meas = np.array([o.measured_s for o in sel])
    is_ttft = np.array([o.kind in TTFT_KINDS for o in sel], float)
    plen = np.array([o.desc.get("prompt_len", 0) for o in sel], float)
    extra = np.column_stack([is_ttft, is_ttft * plen if per_token_overhead else np.zeros(len(sel))])
    w = 1.0 / meas
    y = np.array([o.engine_s if (mode == "metrics" and o.kind in TTFT_KINDS) else o.measured_s for o in sel])
    steps_list = [o.steps for o in sel]
    all_tokens = sorted({s.tokens for st in steps_list for s in st})
    n = len(COEFFICIENTS)

    def predicted(x: np.ndarray) -> np.ndarray:
        cost = _as_cost(x)
        return np.array([predict(list(st), cost) for st in steps_list]) + extra @ x[n:]

    best_x, best_f = None, math.inf
    for thr in [0.0] + [t + 0.5 for t in all_tokens]:
        x = _nnls_rel(_floor_design(steps_list, thr, extra), y, w)
        if thr > 0 and (x[2] <= 0 or x[1] <= 0):
            continue  # no floor in this solution: the same as thr = 0
        f = float(np.sum(((predicted(x) - y) * w) ** 2))
        if f < best_f:
            best_x, best_f = x, f
    method = "nnls"
    if loss != "linear":
        from scipy.optimize import least_squares

        scale = np.where(best_x > 0, best_x, 1e-12)
        upper = np.full(len(best_x), np.inf)
        if not per_token_overhead:
            upper[n + 1] = 1e-30
        res = least_squares(lambda x: (predicted(x) - y) * w, np.clip(best_x, 0, upper), bounds=(0, upper),
                            loss=loss, f_scale=0.05, x_scale=scale, max_nfev=2000)
        best_x = res.x
        method = f"least_squares/{loss}"
    a, b = float(best_x[n]), float(best_x[n + 1])
    parts: dict = {}
    if mode == "metrics":
        parts = {"api_server_from_metrics_s": a_o, "api_server_from_metrics_per_token_s": b_o,
                 "engine_admission_s": a, "engine_admission_per_token_s": b,
                 "api_server_median_s": float(np.median(over)) if len(over) else None}
        a, b = a + a_o, b + b_o
    else:
        parts = {"fitted_intercept_s": a, "fitted_per_token_s": b,
                 "api_server_median_s": float(np.median(over)) if len(over) else None}
    return CostFit(_as_cost(best_x), a, b, mode, jitter, method, parts)


def _admission(parts: dict, api_server_s: float, api_server_per_token_s: float) -> dict:
    """The overheads' engine admission (``Overheads.engine_admission_s`` and
    ``engine_admission_per_token_s``: the part of the API-server time vLLM spends inside the step
    that first schedules a request, paid there by the simulator) from a fit with
    ``overhead="metrics"``, which measures it as the queue and prefill time the engine's own
    histograms hold beyond the step cost; to six significant digits, then capped by
    :func:`cap_admission` at the API-server terms it is part of (``api_server_s``,
    ``api_server_per_token_s``); {} from a fit that did not split the overhead, or when both end
    at 0."""
    a, b = parts.get("engine_admission_s"), parts.get("engine_admission_per_token_s")
    if a is None or b is None:
        return {}
    keys = ("engine_admission_s", "engine_admission_per_token_s")
    overheads = {"api_server_s": api_server_s, "api_server_per_token_s": api_server_per_token_s,
                 keys[0]: _r(max(a, 0.0)), keys[1]: _r(max(b, 0.0))}
    cap_admission(overheads)
    return {k: overheads[k] for k in keys if k in overheads}


def cap_admission(overheads: dict) -> None:
    """Cap a profile document's engine admission at the API-server terms it is part of, in place,
    once every step that moves time out of them has run (the front-end split moves the part after
    the engine to ``post_engine_s``: ``engine_split.apply_post_engine``); both fields are dropped
    when both end at 0. The profile loader refuses an admission above its API-server term."""
    for part, whole in (("engine_admission_s", "api_server_s"),
                        ("engine_admission_per_token_s", "api_server_per_token_s")):
        if part in overheads:
            overheads[part] = min(overheads[part], max(float(overheads.get(whole, 0.0)), 0.0))
    if not overheads.get("engine_admission_s") and not overheads.get("engine_admission_per_token_s"):
        overheads.pop("engine_admission_s", None)
        overheads.pop("engine_admission_per_token_s", None)


def _config_medians(obs: list[Observation], meas: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median measured and predicted time per configuration (repetitions pooled)."""
    by: dict[tuple, list[int]] = {}
    for i, o in enumerate(obs):
        by.setdefault(o.config, []).append(i)
    idx = list(by.values())
    return (np.array([np.median(meas[i]) for i in idx]), np.array([np.median(pred[i]) for i in idx]))


def lognormal_cv(ratios: np.ndarray) -> float:
    """Coefficient of variation of the lognormal whose bulk matches ``ratios`` (measured / fitted).

    The log-spread comes from the interquartile range of ``log(ratios)`` (``sigma = IQR / 1.349``),
    not from their standard deviation: on a shared machine a few requests stall behind another
    process for tens of milliseconds, and a standard deviation inflated by them gives a
    lognormal whose median is far below its mean. The simulator then admits most requests too
    early, which decides the race between a chat's next turn and other requests' last decode
    steps (the measurements behind this: docs/log/from-code-comments.md).
    Non-positive ratios are dropped; fewer than two left gives 0.

    Returns:
        ``sqrt(exp(sigma**2) - 1)``, dimensionless.
    """
    r = np.asarray(ratios, float)
    logs = np.log(r[r > 0])
    if len(logs) < 2:
        return 0.0
    q1, q3 = np.percentile(logs, [25, 75])
    sigma = (q3 - q1) / 1.349
    return float(math.sqrt(math.expm1(sigma * sigma)))


def robust_line(x: np.ndarray, y: np.ndarray, slope: bool) -> tuple[float, float]:
    """Intercept and non-negative slope of a robust (Siegel repeated-medians) line; the median
    alone when ``slope`` is False or the data cannot give a slope."""
    if len(y) == 0:
        return 0.0, 0.0
    if not slope or len(set(x.tolist())) < 2:
        return float(np.median(y)), 0.0
    from scipy.stats import siegelslopes

    m, c = siegelslopes(y, x)
    if m < 0:
        return float(np.median(y)), 0.0
    return max(float(c), 0.0), float(m)


def _predict_all(obs: list[Observation], cf: CostFit) -> np.ndarray:
    return np.array([
        predict(list(o.steps), cf.cost)
        + ((cf.api_server_s + cf.api_server_per_token_s * o.desc.get("prompt_len", 0)) if o.kind in TTFT_KINDS else 0.0)
        for o in obs
    ])


_GROUPS = ((("ttft", TTFT_KINDS), ("itl", ("decode", "mixed")))
           + tuple((k, (k,)) for k in ("cold", "cached", "decode", "mixed")))


def _qualities(obs: list[Observation], meas: np.ndarray, pred: np.ndarray, m: np.ndarray) -> tuple[dict, dict]:
    """(per-configuration, per-measurement) quality of ``obs[m]`` for every group."""
    per_config, raw = {}, {}
    for key, kinds in _GROUPS:
        sel = m & np.array([o.kind in kinds for o in obs])
        raw[key] = quality(meas[sel], pred[sel])
        cm, cp = _config_medians([o for o, s in zip(obs, sel) if s], meas[sel], pred[sel])
        per_config[key] = quality(cm, cp)
    return per_config, raw


def fold_assignment(obs: list[Observation], folds: int, seed: int) -> np.ndarray:
    """Fold index (0..folds-1) of every observation: the configurations of each kind dealt to the
    folds in a seeded random order; repetitions of a configuration share a fold."""
    rng = np.random.default_rng(seed + 1_000_003)
    fold_of: dict[tuple, int] = {}
    for kind in sorted({o.kind for o in obs}):
        configs = sorted({o.config for o in obs if o.kind == kind}, key=repr)
        for j, i in enumerate(rng.permutation(len(configs))):
            fold_of[configs[i]] = j % folds
    return np.array([fold_of[o.config] for o in obs])


UNCERTAIN_FIELDS = tuple(f"step_cost.{k}" for k in COEFFICIENTS) + (
    "overheads.api_server_s", "overheads.api_server_per_token_s", "overheads.jitter_cv")
"""The coefficients :func:`bootstrap_coefficients` refits, in column order."""


def bootstrap_coefficients(
    obs: list[Observation],
    mask: np.ndarray,
    num_samples: int,
    seed: int,
    overhead: str = "auto",
    loss: str = "linear",
    per_token_overhead: bool = True,
    scatter_limit: float | None = SCATTER_LIMIT,
) -> np.ndarray:
    """Coefficients refitted on ``num_samples`` bootstrap resamples of ``obs[mask]``.

    Each resample draws, for every kind of experiment (cold, cached, decode, mixed), as many
    configurations as that kind has, with replacement (``numpy.random.default_rng(seed +
    2_000_003)``: apart from the hold-out split's draws), and
    keeps every repetition of a drawn configuration; :func:`fit_cost` is rerun on it with the same
    options, API-server line and jitter CV included. A configuration whose repeated experiments
    scatter by more than ``scatter_limit`` (2x; ``walls.repeat_scatter``) has its experiments drawn
    again too, whole experiments with replacement, so that scatter widens the refits' spread (None:
    every repetition kept, as the shipped profiles' samples were drawn).

    Why configurations, not the fit's covariance: the errors that matter are the model's misfit
    from one configuration to the next (repetitions of a configuration are nearly identical, so
    an i.i.d. covariance would count them as independent evidence); several coefficients sit on
    their bound at 0, where a linearised covariance gives symmetric, partly negative ranges; and
    the weight-load floor is a discrete choice no Jacobian sees. Resampling whole configurations
    within each kind keeps all of that, and every refit is non-negative by construction.

    Returns:
        ``(num_samples, len(UNCERTAIN_FIELDS))`` array.

    Raises:
        ValueError: ``num_samples < 1`` or as :func:`fit_cost`.
    """
    if num_samples < 1:
        raise ValueError(f"bootstrap needs at least one resample, got {num_samples}")
    from kvroute.calibrate.calibration.walls import scattered_configs

    rng = np.random.default_rng(seed + 2_000_003)
    kept = [o for o, m in zip(obs, mask) if m]
    scattered = scattered_configs(kept, scatter_limit) if scatter_limit else set()
    by_config: dict[tuple, list[Observation]] = {}
    for o in kept:
        by_config.setdefault(o.config, []).append(o)
    kinds = {kind: sorted({o.config for o in kept if o.kind == kind}, key=repr)
             for kind in sorted({o.kind for o in kept})}
    rows = []
    for _ in range(num_samples):
        sample: list[Observation] = []
        for configs in kinds.values():
            for i in rng.integers(0, len(configs), size=len(configs)):
                sample.extend(_drawn_repeats(by_config[configs[i]], configs[i] in scattered, rng))
        cf = fit_cost(sample, None, overhead, loss, per_token_overhead)
        rows.append([getattr(cf.cost, k) for k in COEFFICIENTS] + [cf.api_server_s, cf.api_server_per_token_s,
                                                                     cf.jitter_cv])
    return np.array(rows, float)


def _drawn_repeats(repeats: list[Observation], scattered: bool, rng: np.random.Generator) -> list[Observation]:
    """A drawn configuration's observations in a bootstrap resample: all of them, or, for a
    configuration whose repeated experiments scatter by more than ``walls.SCATTER_LIMIT``, its
    experiments drawn again with replacement (whole experiments, every observation of a drawn
    one kept), so that scatter widens the refits instead of being averaged away."""
    if not scattered:
        return repeats
    by_exp: dict[int, list[Observation]] = {}
    for o in repeats:
        by_exp.setdefault(o.exp_id, []).append(o)
    ids = sorted(by_exp)
    return [o for i in rng.integers(0, len(ids), size=len(ids)) for o in by_exp[ids[i]]]


def fit(
    obs: list[Observation],
    holdout: float = 0.25,
    seed: int = 0,
    overhead: str = "auto",
    loss: str = "linear",
    per_token_overhead: bool = True,
    folds: int = 4,
    bootstrap: int = 0,
    scatter_limit: float | None = SCATTER_LIMIT,
) -> FitResult:
    """Split, fit on the kept share, predict everything, and measure the quality.

    Besides the single hold-out split (whose fit gives the coefficients), ``folds``-fold cross
    validation over configurations (every configuration predicted once by a fit that did not see
    it) gives a steadier estimate of the held-out error: quality keys ``"crossval"`` and
    ``"crossval_raw"``; ``folds < 2`` skips it. ``bootstrap > 0`` refits that many resamples of
    the fitted share (:func:`bootstrap_coefficients`, seeded by ``seed``; configurations whose
    repeats scatter by more than ``scatter_limit`` have their experiments resampled too); the
    coefficients themselves do not change. The result names every coefficient held on its bound
    with what the data asked for (``walls``) and the configurations whose repeated experiments
    differ by more than 2x (``scatter``; :mod:`kvroute.calibrate.calibration.walls`).

    Raises:
        ValueError: see :func:`fit_cost` and :func:`split_holdout`.
    """
    held = split_holdout(obs, holdout, seed)
    cf = fit_cost(obs, ~held, overhead, loss, per_token_overhead)
    pred = _predict_all(obs, cf)
    meas = np.array([o.measured_s for o in obs])
    q: dict[str, dict[str, Quality]] = {}
    for split, m in (("heldout", held), ("fit", ~held)):
        q[split], q[split + "_raw"] = _qualities(obs, meas, pred, m)
    if folds >= 2:
        fold = fold_assignment(obs, folds, seed)
        cv_pred = np.full(len(obs), np.nan)
        for k in range(folds):
            test = fold == k
            if test.any() and (~test).any():
                cv_pred[test] = _predict_all([o for o, t in zip(obs, test) if t],
                                             fit_cost(obs, ~test, overhead, loss, per_token_overhead))
        ok = ~np.isnan(cv_pred)
        q["crossval"], q["crossval_raw"] = _qualities(obs, meas, np.where(ok, cv_pred, 0.0), ok)
    samples = (bootstrap_coefficients(obs, ~held, bootstrap, seed, overhead, loss, per_token_overhead, scatter_limit)
               if bootstrap > 0 else None)
    from kvroute.calibrate.calibration.walls import cost_walls, repeat_scatter

    return FitResult(cf.cost, cf.api_server_s, cf.overhead_source, cf.jitter_cv, obs, held, pred, q, cf.method,
                     holdout, seed, api_server_per_token_s=cf.api_server_per_token_s, parts=cf.parts,
                     bootstrap_samples=samples,
                     walls=cost_walls(obs, ~held, cf.cost, cf.overhead_source, per_token_overhead),
                     scatter=repeat_scatter([o for o, h in zip(obs, held) if not h]), folds=folds)


def uncertainty_document(result: FitResult) -> dict | None:
    """The profile's ``step_cost_uncertainty`` section of a fit with bootstrap samples (values to
    six significant digits), or None without them."""
    if result.bootstrap_samples is None:
        return None
    return {
        "method": (f"bootstrap: {len(result.bootstrap_samples)} refits ({result.method}) on resamples of the "
                   "fitted configurations, drawn with replacement within each kind, all repetitions of a "
                   "drawn configuration kept"),
        "seed": result.seed,
        "fields": list(UNCERTAIN_FIELDS),
        "num_samples": len(result.bootstrap_samples),
        "samples": [[_r(v) for v in row] for row in result.bootstrap_samples],
    }


# --------------------------------------------------------------------------------------------
# Profile and report
# --------------------------------------------------------------------------------------------


def profile_document(result: FitResult, info, meta: dict, name: str, model_doc: dict | None = None) -> dict:
    """The profile JSON document (layout of ``kvroute.sim.timing.profile``) of a fit.

    Args:
        result: the fit.
        info: the measured server's :class:`~kvroute.calibrate.live.client.ServerInfo`.
        meta: the sweep's ``meta.json`` (dates, URLs, seed, plan).
        name: profile name.
        model_doc: extra model facts (e.g. shapes read from its ``config.json``).
    """
    def q(x: Quality) -> dict:
        return {"n": x.n, "r2": _r(x.r2), "median_ape": _r(x.median_ape), "p90_ape": _r(x.p90_ape),
                "median_abs_log_error": _r(x.median_abs_log), "p90_abs_log_error": _r(x.p90_abs_log)}

    urls = meta.get("urls", [info.url])
    date = (meta.get("started") or _dt.date.today().isoformat())[:10]
    engine = {
        "vllm_version": info.vllm_version,
        "block_size": info.block_size,
        "num_gpu_blocks": info.num_gpu_blocks,
        "max_num_batched_tokens": info.max_num_batched_tokens,
        "max_num_seqs": info.max_num_seqs,
        "max_model_len": info.max_model_len,
        "long_prefill_token_threshold": info.long_prefill_token_threshold,
        "enable_prefix_caching": info.enable_prefix_caching,
    }
    # a sweep from before servers reported it: vLLM's CPU backend never schedules asynchronously
    cpu_sync = info.async_scheduling is None and info.device == "cpu"
    if info.async_scheduling is not None or cpu_sync:
        engine["async_scheduling"] = bool(info.async_scheduling)
    if info.async_scheduling:  # the measured steps have the overlap in them: nothing left to hide
        engine["async_cpu_fraction"] = 0.0
    if info.gpu_memory_utilization is not None:
        engine["gpu_memory_utilization"] = info.gpu_memory_utilization
    return {
        "name": name,
        "hardware": {"description": info.hardware, "device": info.device},
        "model": {"name": info.model, "path_or_id": info.model_root, **(model_doc or {})},
        "engine": engine,
        "step_cost": {k: getattr(result.cost, k) for k in COEFFICIENTS},
        "overheads": {"api_server_s": result.api_server_s, "api_server_per_token_s": result.api_server_per_token_s,
                      "gateway_s": 0.0, "jitter_cv": _r(result.jitter_cv),
                      **_admission(result.parts, result.api_server_s, result.api_server_per_token_s)},
        "provenance": {
            "kind": "measured",
            "source": "kvroute calibrate measure + fit",
            "date": date,
            "measured_started": meta.get("started"),
            "measured_finished": meta.get("finished"),
            "sweep_status": meta.get("status"),
            **({"sweeps_pooled": meta["sweeps"]} if meta.get("sweeps") else {}),
            "server_urls": urls,
            "model": info.model,
            "vllm_version": info.vllm_version,
            "async_scheduling": info.async_scheduling,
            "hardware": info.hardware,
            "seed": meta.get("seed"),
            "fit": {
                "method": result.method,
                "overhead_source": result.overhead_source,
                "holdout_share": result.holdout,
                "holdout_seed": result.seed,
                "overhead_parts": {k: _r(v) for k, v in result.parts.items()},
                "num_observations": len(result.observations),
                "measured_range": measured_range([(o.kind, o.desc) for o in result.observations]).to_dict(),
                "heldout": {k: q(v) for k, v in result.quality["heldout"].items()},
                "heldout_single_measurements": {k: q(v) for k, v in result.quality["heldout_raw"].items()},
                "fitted": {k: q(v) for k, v in result.quality["fit"].items()},
                "fitted_single_measurements": {k: q(v) for k, v in result.quality["fit_raw"].items()},
                **({"crossval": {k: q(v) for k, v in result.quality["crossval"].items()},
                    "crossval_single_measurements": {k: q(v) for k, v in result.quality["crossval_raw"].items()}}
                   if "crossval" in result.quality else {}),
                "note": ("heldout/fitted: each configuration's median over its repetitions against the "
                         "prediction of the profile's coefficients (fitted without the held-out share); "
                         + (f"crossval: {result.folds}-fold cross validation over configurations; "
                            if "crossval" in result.quality else "")
                         + "*_single_measurements: every measurement"),
            },
        },
        "sources": {
            **{f"engine.{k}": v for k, v in info.sources.items() if k in engine},
            "engine.vllm_version": f"{info.url}/version",
            **({"engine.async_scheduling": "vLLM's CPU backend never schedules asynchronously (vllm/platforms/cpu.py "
                "sets scheduler_config.async_scheduling = False); the sweep predates the servers' report of it"}
               if cpu_sync else {}),
            "step_cost": "fitted to the sweep's TTFT and ITL (kvroute.calibrate.calibration.fit)",
            "overheads.api_server_s": (
                "intercept of a robust line through client TTFT minus the engine's queue + prefill time "
                "(vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds) against prompt length, plus "
                "the fitted engine time of admitting a new request (beyond its step costs)"
                if result.overhead_source == "metrics"
                else "fitted TTFT intercept beyond the step costs (API server plus the engine's admission of a request)"
            ),
            "overheads.api_server_per_token_s": (
                "growth of the API-server time per prompt token (JSON, validation, block hashing), fitted "
                "like api_server_s; a simulator without this field ignores it"
            ),
            "overheads.gateway_s": "0: the sweep talked to the servers directly",
            "overheads.jitter_cv": "lognormal CV of the measured API-server time around its line in prompt length, from the interquartile range of its log (robust to stalls)",
            "hardware": info.sources.get("hardware", "server report"),
        },
        **({"step_cost_uncertainty": uncertainty_document(result)} if result.bootstrap_samples is not None else {}),
        "fit_notes": fit_notes_document(result.walls, result.scatter),
    }


def _r(x: float) -> float | None:
    """Six significant digits; None for a missing value."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(f"{float(x):.6g}")


FIT_KIND_COLORS = {"cold": "#1f77b4", "cached": "#2ca02c", "decode": "#ff7f0e", "mixed": "#d62728"}
"""Colours of the fit figure's observation kinds (matplotlib's ``tab10``; no policy is drawn)."""

FIT_KIND_MARKERS = {"cold": "o", "cached": "^", "decode": "s", "mixed": "D"}
"""Marker of each observation kind in the fit figure, so kinds differ in shape as well as colour
(in grey print too): filled where fitted or measured, hollow where held out or predicted."""


def fit_figure(result: FitResult, title: str = ""):
    """The fit's figure: measured against predicted TTFT and ITL (log axes, fitted vs held-out),
    and TTFT against the tokens computed and ITL against the decode batch with the model's curves.

    Args:
        result: :func:`fit`'s result.
        title: what the profile is (name, model, hardware, vLLM version); the figure's title
            names it (``kvroute.sim.study.figure_style.scenario_title``).

    Returns:
        A bare matplotlib ``Figure`` (no pyplot state: a notebook's backend is left alone). Times
        are in ms on log axes (they span decades: a 16-token prefill to a 4k one), the batch
        axis is base 2.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    from kvroute.sim.study.figure_style import figure_title, scenario_title

    obs, pred, held = result.observations, result.predicted_s, result.held_out
    meas = np.array([o.measured_s for o in obs])
    fig = Figure(figsize=(12, 10.4))
    axes = fig.subplots(2, 2)
    colors = FIT_KIND_COLORS
    for ax, kinds, label in ((axes[0, 0], ("cold", "cached"), "TTFT"), (axes[0, 1], ("decode", "mixed"), "ITL / step")):
        lo, hi = math.inf, 0.0
        for kind in kinds:
            for h in (False, True):
                sel = np.array([o.kind == kind for o in obs]) & (held == h)
                if sel.any():  # fitted: filled; held out: hollow, the kind's colour on its edge
                    ax.scatter(meas[sel] * 1e3, pred[sel] * 1e3, marker=FIT_KIND_MARKERS[kind], s=22,
                               facecolors="none" if h else colors[kind], edgecolors=colors[kind],
                               linewidths=1.2 if h else 0.5, label=f"{kind} ({'held out' if h else 'fitted'})",
                               alpha=0.8)
                    lo, hi = min(lo, meas[sel].min(), pred[sel].min()), max(hi, meas[sel].max(), pred[sel].max())
        if hi > 0:
            xs = np.array([lo * 0.8, hi * 1.25]) * 1e3
            ax.plot(xs, xs, "k-", lw=0.8)
            ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.15, label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        key = "ttft" if label == "TTFT" else "itl"
        qh = result.quality["heldout"][key]
        ax.set_title(f"{label}: held-out median APE {100 * qh.median_ape:.1f}%, p90 {100 * qh.p90_ape:.1f}% (n={qh.n})")
        ax.set_xlabel(f"measured {label} (ms)")
        ax.set_ylabel(f"predicted {label} (ms)")
        ax.legend(fontsize=8)
    # TTFT vs prompt length
    ax = axes[1, 0]
    for kind in ("cold", "cached"):
        sel = [i for i, o in enumerate(obs) if o.kind == kind]
        if sel:
            x = [obs[i].desc.get("prompt_len", 0) - (obs[i].desc.get("prefix_len", 0) if kind == "cached" else 0) for i in sel]
            ax.scatter(x, meas[sel] * 1e3, c=colors[kind], marker=FIT_KIND_MARKERS[kind], s=16,
                       label=f"{kind} measured")
            ax.scatter(x, pred[sel] * 1e3, facecolors="none", edgecolors="k", marker=FIT_KIND_MARKERS[kind], s=30,
                       label=f"{kind} predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens computed (prompt minus cached prefix, tokens)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Prefill")
    ax.legend(fontsize=8)
    # ITL vs batch
    ax = axes[1, 1]
    dec = [i for i, o in enumerate(obs) if o.kind == "decode"]
    ctxs = sorted({obs[i].desc.get("context_len") for i in dec})
    cmap = colormaps["viridis"]
    for j, L in enumerate(ctxs):
        sel = [i for i in dec if obs[i].desc.get("context_len") == L]
        b = [obs[i].desc["batch"] for i in sel]
        c = cmap(0.85 * j / max(1, len(ctxs) - 1))  # viridis' top (pale yellow) is hard to see on white
        ax.scatter(b, meas[sel] * 1e3, color=c, s=18)
        order = np.argsort(b)
        ax.plot(np.array(b)[order], pred[sel][order] * 1e3, color=c, lw=1,
                label=f"{L:,}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size B (requests)")
    ax.set_ylabel("ITL (ms); dots: measured, lines: model")
    ax.set_title("Decode")
    # outside the axes: inside, it can cover a context's line (one whose batch-1 ITL is high)
    ax.legend(fontsize=8, title="context (tokens)", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)
    from matplotlib.ticker import FuncFormatter, LogFormatter

    for ax in axes.ravel():  # plain tick labels (0.5, 20, 1000; batch 1, 2, ... 64), not powers
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            # an axis spanning less than a decade labels its minor ticks too: plain (2, 3, 4), not 2x10^0
            axis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    figure_title(fig, scenario_title(title, (), "Step-cost fit: measured against predicted, prefill and decode")
                 if title else "Step-cost fit: measured against predicted, prefill and decode", fontsize=12)
    fig.tight_layout()
    return fig


def plot_report(result: FitResult, path: str | Path, title: str = "", formats=()) -> list[Path]:
    """Write :func:`fit_figure` to ``path`` (its suffix picks the format: .png, .pdf, .svg) and
    beside it in each other format of ``formats`` (``--figure-format``).

    Returns:
        The paths written, ``path`` first.

    Raises:
        ValueError: ``path``'s suffix or a format is not one of ``figure_style.FIGURE_FORMATS``.
    """
    from kvroute.sim.study.figure_style import save_figure

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower().lstrip(".")
    return save_figure(fit_figure(result, title), out.with_suffix(""), [suffix, *(f for f in formats if f != suffix)],
                       dpi=90)
