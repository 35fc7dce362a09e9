"""Statistics over repeated live rounds of one trace (``kvroute validate --live-rounds``,
``bench/bench_validate.py``).

A short live burst on a shared machine varies a lot from round to round (the same 8-chat burst
of round_robin took 1.44 s in one round and 2.11 s in the next on two CPU servers), so measured
values are averaged over rounds and given with their spread; a change between two policies is
taken from the round means, and its interval pairs round ``i`` of one policy with round ``i`` of
the other (rounds interleave policies, so machine drift hits both alike).
"""

from __future__ import annotations

import math
import statistics

#: Rounds from which a Student-t interval of the mean is given (two rounds' interval is
#: t(1) = 12.7 standard errors wide: no information).
MIN_ROUNDS_FOR_INTERVAL = 3


def error_pct(predicted: float, measured: float) -> float:
    """``100 (predicted - measured) / measured``; NaN when undefined."""
    if measured is None or predicted is None or not measured or math.isnan(measured) or math.isnan(predicted):
        return math.nan
    return 100.0 * (predicted - measured) / measured


def finite(values) -> list[float]:
    """The finite values of ``values`` (None, NaN and infinities dropped), as floats."""
    out = []
    for x in values:
        try:
            v = float(x)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def mean_interval(values, coverage: float = 0.95,
                  bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean of ``values`` (non-finite values dropped),
    clipped to ``bounds``; ``(nan, nan)`` for fewer than two values."""
    from scipy.stats import t

    x = finite(values)
    if len(x) < 2:
        return math.nan, math.nan
    from kvroute.sim.cluster.metrics import clip_interval

    half = float(t.ppf(0.5 + coverage / 2, len(x) - 1)) * statistics.stdev(x) / math.sqrt(len(x))
    mean = statistics.fmean(x)
    return clip_interval(mean - half, mean + half, bounds)


def spread(values, metric: str | None = None) -> dict:
    """Mean, min, max and count of the finite ``values`` (one per live round), and the 95 %
    Student-t interval of the mean from ``MIN_ROUNDS_FOR_INTERVAL`` rounds on (else None),
    clipped to ``metric``'s possible values (``kvroute.sim.cluster.metrics.METRIC_BOUNDS``).

    Returns:
        ``{"n", "mean", "min", "max", "interval"}``; mean, min and max are NaN without values.
    """
    from kvroute.sim.cluster.metrics import METRIC_BOUNDS

    x = finite(values)
    if not x:
        return {"n": 0, "mean": math.nan, "min": math.nan, "max": math.nan, "interval": None}
    interval = (mean_interval(x, bounds=METRIC_BOUNDS.get(metric, (-math.inf, math.inf)))
                if len(x) >= MIN_ROUNDS_FOR_INTERVAL else None)
    return {"n": len(x), "mean": statistics.fmean(x), "min": min(x), "max": max(x), "interval": interval}


def diff_interval(simulated: list[list[float]], live: list[list[float]], n: int = 2000,
                  seed: int = 0, coverage: float = 0.90) -> tuple[float, float]:
    """Bootstrap interval of (predicted - measured change), percentage points: resamples the
    simulated seeds and the live rounds of the base policy (index 0) and the other (index 1),
    each with replacement, and compares the changes of the resampled means: how much of the
    difference the rounds' own spread could explain.

    Raises:
        ValueError: an empty list of values.
    """
    import numpy as np

    if not all(len(x) for x in (*simulated, *live)):
        raise ValueError("diff_interval needs at least one simulated and one live value per policy")
    rng = np.random.default_rng(seed)
    sim = [np.asarray(x, float) for x in simulated]
    meas = [np.asarray(x, float) for x in live]
    diffs = []
    for _ in range(n):
        s0, s1 = (rng.choice(x, len(x)).mean() for x in sim)
        m0, m1 = (rng.choice(x, len(x)).mean() for x in meas)
        diffs.append(100 * (s1 / s0 - m1 / m0))
    lo, hi = np.percentile(diffs, [50 - 50 * coverage, 50 + 50 * coverage])
    return float(lo), float(hi)
