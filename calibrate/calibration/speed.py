"""The engines' speed process (``HostModel.engine_speed_sigma``, ``engine_speed_period_s``)
from the concurrency sweep's bursts sent to every server at once.

Identical requests reach identical servers at once, so what differs between the servers' token
streams is how fast each engine stepped: on a shared host, the cores its processes got. The
simulator models that as one step-time factor per worker, piecewise constant, a mean-one
lognormal draw every ``period`` (``kvroute.sim.timing.frontend.EngineSpeed``).

Two ways to measure it, the first used whenever the sweep kept every token's arrival time:

- **Windows within each burst** (:func:`speed_windows`). Each server's decode is cut into up to
  ``WINDOW_MAX`` windows of equal token counts (the mean over the server's requests of the k-th
  token's arrival), the same token indices on every server, so a window holds the same engine
  steps everywhere. The log ratio of two servers' window lengths is the difference of their
  speeds averaged over the window, plus the client's error in seeing each window's first and
  last token (the API process sends tokens late, in chunks, when it falls behind). Under the
  model the windows of one burst are jointly normal, with the covariance of window means of a
  piecewise-constant process (:func:`window_covariance`; random phase) plus that boundary error
  (:func:`lag_covariance`); the period, ``sigma`` and the boundary error's standard deviation
  maximise the likelihood. Whether a burst's first and second half deviate alike tells the
  period directly, where one figure per burst only tells it through how the spread shrinks
  with the span.
- **One figure per burst** (:func:`_burst_deviations`, the fallback for sweeps without token
  times): each server's log mean TPOT against the burst's mean, variance
  ``sigma**2 * window_variance(span, period)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.calibrate.calibration.bursts import _e2e_and_tpot
from kvroute.calibrate.calibration.observations import token_times

SPREAD_MIN_BATCH = 4
"""Bursts of fewer requests per server are left out of the engine-speed spread (their TPOT is
mostly the API process's, not the engine's)."""

WINDOW_MIN_TOKENS, WINDOW_MAX, WINDOW_MIN_S = 4, 8, 0.010
"""A burst's decode is cut into at most ``WINDOW_MAX`` windows of at least ``WINDOW_MIN_TOKENS``
tokens; a window shorter than ``WINDOW_MIN_S`` on some server (tokens that arrived in one chunk)
is merged with its neighbour."""

SPEED_PERIODS = tuple(float(x) for x in np.geomspace(0.25, 2000.0, 40)) + (math.inf,)
"""Periods the one-figure-per-burst fallback tries, s: log-spaced from 0.25 s (the sweep's
shortest bursts decode for about 0.2 s, so shorter periods are not told apart from one another,
only ``sigma**2 * period``: on one sweep here the likelihood ran off to 20 ms with sigma 0.9) to
2000 s, then infinity: one factor per run."""

WINDOW_PERIODS = tuple(float(x) for x in np.geomspace(0.02, 2000.0, 51)) + (math.inf,)
"""Periods the window likelihood tries, s: 5 per decade from 20 ms (windows of 10-100 ms tell
such periods apart) to 2000 s, then infinity."""

PERIOD_INTERVAL_DROP = 1.92
"""Log-likelihood drop bounding :attr:`SpeedFit.interval_s` (half the 95 % chi-square
quantile of one degree of freedom: a likelihood-ratio interval)."""


@dataclass(frozen=True, slots=True)
class SpeedFit:
    """The engine-speed process fitted to a sweep (:func:`fit_speed`).

    Attributes:
        sigma: log-spread of one worker's factor (``HostModel.engine_speed_sigma``).
        period_s: seconds one factor lasts, s; 0 for one factor per run.
        interval_s: ``(low, high)`` periods within ``PERIOD_INTERVAL_DROP`` of the best
            log-likelihood, s (``inf``: up to one factor per run).
        bursts: bursts used; method: ``"windows"`` or ``"bursts"`` (one figure per burst).
        lag_s: standard deviation of the client's error in a window boundary, s (windows only;
            NaN otherwise).
        curve: ``(period_s, negative log-likelihood)`` at every period tried.
    """

    sigma: float
    period_s: float
    interval_s: tuple[float, float]
    bursts: int
    method: str
    lag_s: float = math.nan
    curve: tuple[tuple[float, float], ...] = ()


def window_variance(span_s: float, period_s: float) -> float:
    """Variance of a window's mean of a piecewise-constant process of independent unit-variance
    draws every ``period_s`` (random phase: triangular autocorrelation), over ``span_s``:
    ``1 - u / 3`` for ``u = span / period <= 1``, else ``1 / u - 1 / (3 u**2)``; 1 for a zero span
    or an infinite period."""
    if period_s == math.inf or span_s <= 0.0:
        return 1.0
    u = span_s / period_s
    return 1.0 - u / 3.0 if u <= 1.0 else 1.0 / u - 1.0 / (3.0 * u * u)


def _tent_double_integral(x: np.ndarray, period_s: float) -> np.ndarray:
    """``G(x) = integral_0^|x| (|x| - u) r(u) du`` for the triangular autocorrelation
    ``r(u) = max(0, 1 - u / period)``: ``G'' = r``, so the double integral of ``r(t - s)`` over
    ``t`` in ``[a, b]`` and ``s`` in ``[c, d]`` is ``G(b - c) - G(b - d) - G(a - c) + G(a - d)``."""
    x = np.abs(x)
    if period_s == math.inf:
        return 0.5 * x * x
    return np.where(x <= period_s, 0.5 * x * x - x ** 3 / (6.0 * period_s), 0.5 * x * period_s - period_s ** 2 / 6.0)


def window_covariance(windows: np.ndarray, period_s: float) -> np.ndarray:
    """Covariance of the means of a unit-variance piecewise-constant process (a draw every
    ``period_s``, random phase) over each of ``windows``.

    Args:
        windows: shape ``(n, 2)``, each row a window's start and end, s (end > start).
        period_s: seconds one draw lasts (``inf``: one draw for all).

    Returns:
        Shape ``(n, n)``; the diagonal is :func:`window_variance` of each window's span.
    """
    a, b = windows[:, 0], windows[:, 1]
    g = lambda x: _tent_double_integral(x, period_s)  # noqa: E731
    num = (g(b[:, None] - a[None, :]) - g(b[:, None] - b[None, :]) - g(a[:, None] - a[None, :])
           + g(a[:, None] - b[None, :]))
    span = b - a
    return num / np.outer(span, span)


def lag_covariance(windows: np.ndarray) -> np.ndarray:
    """Covariance of the log lengths of consecutive ``windows`` (shape ``(n, 2)``, s) from
    independent unit-variance errors in each boundary time (windows ``i`` and ``i + 1`` share
    one): ``2 / d_i**2`` on the diagonal, ``-1 / (d_i d_{i+1})`` beside it, ``d`` the spans."""
    d = windows[:, 1] - windows[:, 0]
    cov = np.diag(2.0 / (d * d))
    off = -1.0 / (d[:-1] * d[1:])
    idx = np.arange(len(d) - 1)
    cov[idx, idx + 1] = off
    cov[idx + 1, idx] = off
    return cov


def _burst_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The sweep's requests of bursts sent to every server, ``SPREAD_MIN_BATCH`` per server or
    more, with more than one token and no error."""
    req = requests[(requests["kind"] == "burst_all") & (requests["role"] == "burst") & (requests["n_tokens"] > 1)
                   & (requests["batch"] >= SPREAD_MIN_BATCH)]
    return req[req["error"].isna()] if "error" in req else req


def _burst_groups(req: pd.DataFrame):
    return req.groupby(["exp_id", "rep"] if "rep" in req else ["exp_id"])


def _token_curve(grp: pd.DataFrame) -> np.ndarray | None:
    """The mean over a server's requests in a burst of the k-th token's arrival, s after the
    burst's clock's zero; None when a request kept no token times."""
    sent = grp["t_send_s"].to_numpy(float) if "t_send_s" in grp else np.zeros(len(grp))
    times = []
    for text, t0 in zip(grp["token_times"], sent):
        seen = token_times(text)
        if not len(seen):
            return None
        times.append(seen + t0)
    n = min(len(t) for t in times)
    return np.mean([t[:n] for t in times], axis=0)


def _window_edges(curves: list[np.ndarray]) -> np.ndarray | None:
    """Token indices cutting every server's decode into the same windows (see the module doc);
    None when even the whole decode is shorter than ``WINDOW_MIN_S`` on some server."""
    n = min(len(c) for c in curves)
    count = max(1, min(WINDOW_MAX, (n - 1) // WINDOW_MIN_TOKENS))
    edges = [int(round(x)) for x in np.linspace(0, n - 1, count + 1)]

    def short(i: int) -> bool:  # window i (edges[i - 1] to edges[i]) on some server
        return any(c[edges[i]] - c[edges[i - 1]] < WINDOW_MIN_S for c in curves)

    i = 1
    while i < len(edges) and len(edges) > 2:
        if short(i):
            del edges[i if i < len(edges) - 1 else i - 1]  # merge window i into the next (the last: the previous)
            i = 1
        else:
            i += 1
    return None if short(1) and len(edges) == 2 else np.array(edges)


def speed_windows(requests: pd.DataFrame) -> list[list[np.ndarray]]:
    """Per burst sent to every server (``SPREAD_MIN_BATCH`` requests per server or more, token
    times kept), each server's decode windows: a list over servers of arrays of shape ``(W, 2)``,
    each row a window's start and end, s on the burst's clock (the same token indices on every
    server). Bursts on fewer than two servers, without token times or whose decode is shorter
    than ``WINDOW_MIN_S`` are left out."""
    if "kind" not in requests.columns or "token_times" not in requests.columns:
        return []
    out = []
    for _, grp in _burst_groups(_burst_requests(requests)):
        curves = [_token_curve(g) for _, g in grp.groupby("url")]
        if len(curves) < 2 or any(c is None or len(c) < 2 for c in curves):
            continue
        edges = _window_edges(curves)
        if edges is not None:
            out.append([np.stack([c[edges[:-1]], c[edges[1:]]], axis=1) for c in curves])
    return out


def _window_terms(bursts: list[list[np.ndarray]], period_s: float):
    """Per burst: the log ratios of every server's window lengths to the last server's (shape
    ``(m,)``, ``m = (servers - 1) x windows``) and the two covariance parts of that vector, the
    speed's (unit ``sigma``) and the boundary error's (unit lag), each ``(m, m)``; grouped by
    ``m`` as stacked arrays for batched Cholesky factorisations."""
    groups: dict[int, list] = {}
    for wins in bursts:
        logs = [np.log(w[:, 1] - w[:, 0]) for w in wins]
        ks = [window_covariance(w, period_s) for w in wins]
        ns = [lag_covariance(w) for w in wins]
        k, size = len(wins), len(logs[0])
        x = np.concatenate([logs[s] - logs[-1] for s in range(k - 1)])
        speed = np.tile(ks[-1], (k - 1, k - 1))
        lag = np.tile(ns[-1], (k - 1, k - 1))
        for s in range(k - 1):
            block = slice(s * size, (s + 1) * size)
            speed[block, block] += ks[s]
            lag[block, block] += ns[s]
        groups.setdefault(len(x), []).append((x, speed, lag))
    return [tuple(np.stack(parts) for parts in zip(*g)) for g in groups.values()]


def _window_nll(terms, log_var: float, log_lag2: float) -> float:
    """Negative log-likelihood (less constants) of every burst's window vector, normal with
    covariance ``e**log_var * speed + e**log_lag2 * lag``."""
    var, lag2 = math.exp(log_var), math.exp(log_lag2)
    total = 0.0
    for x, speed, lag in terms:
        chol = np.linalg.cholesky(var * speed + lag2 * lag)
        z = np.linalg.solve(chol, x[..., None])[..., 0]
        total += float(np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2))) + 0.5 * np.sum(z * z))
    return total


def _window_likelihood(bursts: list[list[np.ndarray]]) -> list[tuple[float, float, float, float]]:
    """``[(period_s, negative log-likelihood, sigma**2, lag**2), ...]`` over ``WINDOW_PERIODS``,
    ``sigma`` and the lag maximising the likelihood at each period (Nelder-Mead over their logs,
    each period started from the previous one's optimum)."""
    from scipy.optimize import minimize

    start = np.array([math.log(0.05), math.log(1e-6)])
    out = []
    for period in WINDOW_PERIODS:
        terms = _window_terms(bursts, period)

        def nll(theta: np.ndarray) -> float:
            theta = np.clip(theta, -30.0, 5.0)
            try:
                return _window_nll(terms, float(theta[0]), float(theta[1]))
            except np.linalg.LinAlgError:
                return math.inf

        res = minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-4, "maxiter": 400})
        theta = np.clip(res.x, -30.0, 5.0)
        start = theta
        out.append((period, float(res.fun), math.exp(theta[0]), math.exp(theta[1])))
    return out


def _burst_deviations(requests: pd.DataFrame) -> tuple[list[float], list[float], int]:
    """Per burst sent to every server at once (``SPREAD_MIN_BATCH`` requests per server or
    more): each server's log mean TPOT minus the burst's mean log, scaled by ``sqrt(k / (k - 1))``
    for ``k`` servers (deviations from a mean of ``k`` understate the spread by that factor), with
    the burst's decode span (each server's first token to its last, averaged over servers), s.

    Returns:
        ``(deviations, their bursts' spans, bursts used)``.
    """
    if "kind" not in requests.columns:
        return [], [], 0
    devs, spans, used = [], [], 0
    for _, grp in _burst_groups(_burst_requests(requests)):
        last, tpot = _e2e_and_tpot(grp)
        tpot = pd.Series(tpot, index=grp.index).groupby(grp["url"]).mean()
        tpot = tpot[tpot > 0]
        k = len(tpot)
        if k < 2:
            continue
        logs = np.log(tpot.to_numpy(float))
        sent = grp["t_send_s"].to_numpy(float) if "t_send_s" in grp else np.zeros(len(grp))
        first, end = sent + grp["ttft_s"].to_numpy(float), sent + last
        span = pd.DataFrame({"first": first, "end": end, "url": grp["url"].to_numpy()}).groupby("url")
        decode = float((span["end"].max() - span["first"].min()).mean())
        devs += list((logs - logs.mean()) * math.sqrt(k / (k - 1)))
        spans += [decode] * k
        used += 1
    return devs, spans, used


def _burst_likelihood(requests: pd.DataFrame) -> tuple[list[tuple[float, float, float, float]], int]:
    """``[(period_s, negative log-likelihood, sigma**2, nan), ...]`` over ``SPEED_PERIODS`` from
    one figure per burst, and the bursts used; an empty list without bursts on two or more
    servers or when the deviations are all zero. Each deviation is normal with variance
    ``sigma**2 * window_variance(span, period)``; at the best ``sigma**2`` the negative
    log-likelihood is ``0.5 * sum(log(variance))`` less constants, on the scale
    ``PERIOD_INTERVAL_DROP`` reads (as :func:`_window_nll`)."""
    devs, spans, used = _burst_deviations(requests)
    if not used:
        return [], 0
    e2 = np.square(devs)
    out = []
    for period in SPEED_PERIODS:
        f = np.array([window_variance(d, period) for d in spans])
        var = float(np.mean(e2 / f))
        if var <= 0.0:
            return [], used
        out.append((period, 0.5 * float(np.sum(np.log(var * f))), var, math.nan))
    return out, used


def fit_speed(requests: pd.DataFrame) -> SpeedFit | None:
    """The engine-speed process of a sweep (see the module doc): from the windows within its
    bursts when at least one burst on every server has two or more windows, else from one figure
    per burst.

    Args:
        requests: the sweep's requests table (``kvroute.calibrate.calibration.observations.load_sweep``).

    Returns:
        The fit, or None without bursts on two or more servers (or with no spread at all).
    """
    windows = speed_windows(requests)
    if any(len(w[0]) >= 2 for w in windows):
        curve, used, method = _window_likelihood(windows), len(windows), "windows"
    else:
        (curve, used), method = _burst_likelihood(requests), "bursts"
    if not curve:
        return None
    best = min(curve, key=lambda c: c[1])
    inside = [c[0] for c in curve if c[1] - best[1] <= PERIOD_INTERVAL_DROP]
    period = 0.0 if best[0] == math.inf else best[0]
    return SpeedFit(math.sqrt(best[2]), period, (min(inside), max(inside)), used, method, math.sqrt(best[3]),
                    tuple((c[0], c[1]) for c in curve))
