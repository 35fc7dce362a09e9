"""The fit's error on experiments it did not see, as a log-space spread for prediction intervals.

``kvroute calibrate fit`` holds out a share of the sweep's configurations, fits the rest and
records how far the fitted model predicts the held-out ones (``provenance.fit.heldout`` and, per
single measurement, ``heldout_single_measurements``: for TTFT and ITL the median and 90th
percentile of the absolute percentage error). That error is what the model's form gets wrong on
configurations like the measured ones, which bootstrap refits of the same form (the interval's
``model`` term) cannot show. Rule, for a measure paced by TTFT or by ITL:

- the log error ``e = log(predicted / measured)`` is taken normal with spread ``s``, so that
  ``|e|`` has median ``0.674 s`` and 90th percentile ``1.645 s``;
- ``s`` is the larger of ``log(1 + median_ape) / 0.674`` and ``log(1 + p90_ape) / 1.645`` (the
  held-out errors' tails are heavier than a normal's, and the larger keeps them);
- TTFT measures take TTFT's, ITL and TPOT take ITL's, other times (E2E, time to complete) the
  root mean square of the two; shares, counts and changes between policies take none (a model
  error common to both policies cancels in their change).

A profile without a fit's held-out errors (a derived prior) gives 0.
"""

from __future__ import annotations

import math

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
        candidates = [math.log1p(errors[key]) / z for key, z in (("median_ape", Z_MEDIAN), ("p90_ape", Z_90))
                      if isinstance(errors.get(key), (int, float)) and math.isfinite(errors[key]) and errors[key] >= 0]
        if candidates:
            out[kind] = max(candidates)
    return out


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
