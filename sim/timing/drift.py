"""The host's speed drift around live rounds, from speed probes: a multiplicative factor on
time measures and its uncertainty.

A speed probe times the same small, fixed request a few times (``bench/bench_validate.py`` and
``kvroute validate --speed-probes``: cold 2,048-token prompts one at a time on each server). Its
times, taken right after calibrating (the reference), before the first live round and after the
last one, say how far the host's speed moved, which no profile predicts. Rule (closed form, in
log space, ``docs/reference/intervals.md``):

- the rounds ran at some speed between the probes before and after them: the log factor over the
  rounds is taken uniform between the two probes' mean log times, ``m_b`` and ``m_a``: mean
  ``(m_b + m_a) / 2``, variance ``(m_a - m_b)**2 / 12``;
- each probe's mean log time carries its sampling variance ``s**2 / n`` (``s``: the standard
  deviation of log times pooled over the probes with two or more samples);
- against a reference probe ``m_r``: ``log factor = (m_b + m_a) / 2 - m_r``, the reference's own
  sampling variance added; without one the factor is 1 and the drift since calibration is taken
  to be as large as the change within the rounds: uniform on ``[-|m_a - m_b|, |m_a - m_b|]``,
  variance ``(m_a - m_b)**2 / 3``.

The reference is the probe taken right after calibrating when there is one, else the profile's own
prediction of the probe (``kvroute.calibrate.validation.probe.predicted_probe``), so that a host
uniformly slower than on the calibration day shows as drift.

A probe has three parts: short requests one at a time (quantities ``ttft``, ``itl``), long ones
one at a time (``long_ttft``, ``long_itl``) and a burst of short requests at once on every server
(``burst_ttft``, ``burst_itl``), which also sees how the host handles several busy engines, API
processes and the client together. A metric takes the drifts of its probe quantities (TTFT
measures: the three TTFT ones; ITL and TPOT: the three ITL ones; E2E, time to complete and rates:
all), combined as: log factor the mean of theirs,
variance the largest of theirs plus ``(max - min)**2 / 12`` of their log factors (the speed that
applies lies somewhere between what the probes say).

Time measures (TTFT, ITL, TPOT, E2E, time to complete) are multiplied by the factor; a rate
(throughput, goodput per second) is divided by it; shares and counts are left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RATE_METRICS = ("output_throughput_tps", "goodput_rps")
"""Summary metrics that scale with ``1 / factor`` (a slower host gives fewer tokens per second)."""

ITL_PREFIXES = ("itl_", "tpot_")
"""Metrics paced by decode steps: they take the ITL probes' drift when there is one."""

TTFT_PREFIXES = ("ttft_", "later_ttft_")
"""Metrics paced by prefills and admission: they take the TTFT probes' drift when there is one."""

PROBE_KEYS = {"itl": ("itl", "long_itl", "burst_itl"), "ttft": ("ttft", "long_ttft", "burst_ttft")}
"""Which probe quantities' drifts a metric paced by ITL or by TTFT (:func:`paced_by`) takes."""


def paced_by(metric: str) -> str | None:
    """``"itl"`` for a metric paced by decode steps (ITL, TPOT), ``"ttft"`` for one paced by
    prefills and admission (TTFT), None for the rest."""
    if metric.startswith(ITL_PREFIXES):
        return "itl"
    if metric.startswith(TTFT_PREFIXES):
        return "ttft"
    return None


@dataclass(frozen=True, slots=True)
class Drift:
    """The host's speed over the live rounds against the profile's calibration.

    Attributes:
        factor: multiplicative factor on time measures (> 0; 1: no drift).
        log_sd: standard deviation of ``log(factor)`` (>= 0).
        source: how it was obtained, for reports.

    Raises:
        ValueError: a non-positive or non-finite factor, or a negative or non-finite sd.
    """

    factor: float = 1.0
    log_sd: float = 0.0
    source: str = "none"

    def __post_init__(self) -> None:
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ValueError(f"drift factor must be finite and > 0, got {self.factor!r}")
        if not (self.log_sd >= 0 and math.isfinite(self.log_sd)):
            raise ValueError(f"drift log_sd must be finite and >= 0, got {self.log_sd!r}")

    @property
    def log_factor(self) -> float:
        """``log(factor)``."""
        return math.log(self.factor)

    def to_dict(self) -> dict:
        """``{"factor", "log_sd", "source"}``."""
        return {"factor": self.factor, "log_sd": self.log_sd, "source": self.source}


NO_DRIFT = Drift()
"""No probes: factor 1, no uncertainty."""


def _logs(values) -> np.ndarray:
    x = np.asarray([v for v in (values or []) if v is not None], float)
    x = x[np.isfinite(x) & (x > 0)]
    return np.log(x)


def probe_drift(before, after, reference=None, reference_label: str = "after calibrating") -> Drift:
    """The drift of one probe quantity (e.g. the probe's TTFT) over live rounds bracketed by two
    probes (rule in the module doc).

    Args:
        before, after: the probe's times right before the first and after the last live round, s
            (one per repetition and server; non-positive and non-finite values dropped).
        reference: the same probe's times right after the profile's calibration (or as the
            profile predicts them), s; None or empty: no reference.
        reference_label: what the reference is, for ``source``.

    Returns:
        The drift; :data:`NO_DRIFT` (with its source saying why) when ``before`` or ``after``
        has no usable time.
    """
    lb, la, lr = _logs(before), _logs(after), _logs(reference)
    if not len(lb) or not len(la):
        return Drift(source="no usable probe before and after the live rounds")
    groups = [g for g in (lb, la, lr) if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    s2 = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / dof if dof else 0.0
    mb, ma = float(lb.mean()), float(la.mean())
    within = (ma - mb) ** 2
    sampling = s2 * (1 / len(lb) + 1 / len(la)) / 4
    if len(lr):
        log_factor = (mb + ma) / 2 - float(lr.mean())
        var = within / 12 + sampling + s2 / len(lr)
        source = (f"probes: {len(lb)} before, {len(la)} after the live rounds against {len(lr)} {reference_label}")
    else:
        log_factor = 0.0
        var = within / 3 + sampling
        source = f"probes: {len(lb)} before, {len(la)} after the live rounds; no calibration reference"
    return Drift(math.exp(log_factor), math.sqrt(var), source)


def drift_exponent(metric: str) -> int:
    """How ``metric`` scales with the host's speed factor f: 1 (a time, times f), -1 (a rate,
    divided by f: :data:`RATE_METRICS` and any ``*_per_s``) or 0 (a share or a count)."""
    if metric in RATE_METRICS or metric.endswith("_per_s"):
        return -1
    return 1 if metric.endswith("_s") else 0


def combine(drifts: list[Drift]) -> Drift:
    """One drift from several probe quantities' (rule in the module doc): log factor their mean,
    variance the largest of theirs plus ``(max - min)**2 / 12`` of their log factors.

    Raises:
        ValueError: ``drifts`` is empty.
    """
    if not drifts:
        raise ValueError("combine needs at least one drift")
    if len(drifts) == 1:
        return drifts[0]
    logs = [d.log_factor for d in drifts]
    var = max(d.log_sd for d in drifts) ** 2 + (max(logs) - min(logs)) ** 2 / 12
    return Drift(math.exp(sum(logs) / len(logs)), math.sqrt(var), "combined: " + "; ".join(d.source for d in drifts))


def metric_drift(metric: str, drifts: dict[str, Drift]) -> Drift:
    """The drift that applies to ``metric`` from per-probe-quantity drifts (keys ``"ttft"``,
    ``"itl"``, ``"long_ttft"``, ``"long_itl"``, ``"burst_ttft"``, ``"burst_itl"``): TTFT metrics
    take the TTFT quantities', ITL
    and TPOT the ITL quantities', the rest (E2E, time to complete, rates) all of them, combined
    by :func:`combine`. Shares and counts get :data:`NO_DRIFT`."""
    if not drifts or drift_exponent(metric) == 0:
        return NO_DRIFT
    keys = [k for k in PROBE_KEYS.get(paced_by(metric), ()) if k in drifts]
    return combine([drifts[k] for k in keys or sorted(drifts)])
