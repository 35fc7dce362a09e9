"""The fit's error on experiments it did not see, as a log-space spread for prediction intervals.

``kvroute calibrate fit`` holds out a share of the sweep's configurations, fits the rest and
records how far the fitted model predicts the held-out ones (``provenance.fit.heldout`` and, per
single measurement, ``heldout_single_measurements``: for TTFT and ITL the median and 90th
percentile of the absolute percentage error). That error is what the model's form gets wrong on
configurations like the measured ones, which bootstrap refits of the same form (the interval's
``model`` term) cannot show. Rule, for a measure paced by TTFT or by ITL:

- the log error ``e = log(predicted / measured)`` is taken normal with spread ``s``, so that
  ``|e|`` has median ``0.674 s`` and 90th percentile ``1.645 s``;
- ``s`` is the larger of ``median_abs_log_error / 0.674`` and ``p90_abs_log_error / 1.645`` (the
  held-out errors' tails are heavier than a normal's, and the larger keeps them);
- a fit that recorded only percentage errors (profiles before those fields) gives ``|e|``'s
  quantiles through the sign it does not record, taken even: an error ``a < 1`` is
  ``log(1 + a)`` above and ``-log(1 - a)`` below, so ``s`` solves ``(F(log(1 + a) / s) +
  F(-log(1 - a) / s)) / 2 = q`` with ``F(x) = erf(x / sqrt(2))`` (the CDF of ``|Z|``) at the
  median and the 90th percentile; an error of 100 % or more is an over-prediction,
  ``log(1 + a) / z``;
- TTFT measures take TTFT's, ITL and TPOT take ITL's, other times (E2E, time to complete) the
  root mean square of the two; shares, counts and changes between policies take none (a model
  error common to both policies cancels in their change).

A profile without a fit's held-out errors (a derived prior) gives 0.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from scipy.optimize import brentq

from kvroute.sim.timing.drift import drift_exponent, paced_by

Z_MEDIAN, Z_90 = 0.6744897501960817, 1.6448536269514722
"""Standard normal quantiles: of |Z|, the median and the 90th percentile."""


def heldout_spreads(raw: dict) -> dict[str, float]:
    """``{"ttft": s, "itl": s}`` (log space) from a profile document's held-out errors (module
    doc): the single measurements' when the fit recorded them, else the configurations'; {}
    without any."""
    fit = ((raw or {}).get("provenance") or {}).get("fit") or {}
    block = fit.get("heldout_single_measurements") or fit.get("heldout") or {}
    out = {}
    for kind in ("ttft", "itl"):
        errors = block.get(kind) or {}
        logs = [(_usable(errors.get(f"{q}_abs_log_error")), z) for q, z in (("median", Z_MEDIAN), ("p90", Z_90))]
        if any(value is not None for value, _ in logs):
            candidates = [value / z for value, z in logs if value is not None]
        else:
            candidates = [spread_from_ape(ape, q) for ape, q in ((_usable(errors.get("median_ape")), 0.5),
                                                                 (_usable(errors.get("p90_ape")), 0.9))
                          if ape is not None]
        if candidates:
            out[kind] = max(candidates)
    return out


def _usable(value) -> float | None:
    """A recorded error as a float when it is a finite number >= 0, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def spread_from_ape(ape: float, q: float) -> float:
    """The log-space spread ``s`` whose ``|e|`` puts the absolute percentage error ``ape`` at
    quantile ``q`` (0.5 or 0.9) when ``e`` is as often above as below 0 (module doc); 0 for an
    error of 0.

    Raises:
        ValueError: ``q`` not in (0, 1).
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {q!r}")
    if ape <= 0.0:
        return 0.0
    above = math.log1p(ape)
    if ape >= 1.0:  # only an over-prediction errs by 100 % or more
        return above / NormalDist().inv_cdf((1.0 + q) / 2.0)
    below = -math.log1p(-ape)

    def excess(s: float) -> float:
        return (math.erf(above / s / math.sqrt(2.0)) + math.erf(below / s / math.sqrt(2.0))) / 2.0 - q

    return brentq(excess, above / 50.0, below * 50.0, xtol=1e-12, rtol=1e-12)


def heldout_log_sd(raw: dict, metric: str) -> float:
    """The held-out model error's log-space spread for ``metric`` (rule in the module doc); 0 for
    shares and counts and for a profile without held-out errors."""
    spreads = heldout_spreads(raw)
    if not spreads or drift_exponent(metric) == 0:
        return 0.0
    kind = paced_by(metric)
    if kind in spreads:
        return spreads[kind]
    return math.sqrt(sum(s * s for s in spreads.values()) / len(spreads))
