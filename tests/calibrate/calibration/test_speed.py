"""The engine-speed process from the bursts' token streams (kvroute.calibrate.calibration.speed)."""

import math

import numpy as np
import pandas as pd
import pytest

from kvroute.calibrate.calibration.speed import (WINDOW_PERIODS, fit_speed, lag_covariance, speed_windows,
                                                 window_covariance, window_variance)


def _numeric_covariance(w1, w2, period, n=2000):
    """Mean over both windows of the triangular autocorrelation, by the midpoint rule."""
    t = w1[0] + (np.arange(n) + 0.5) * (w1[1] - w1[0]) / n
    s = w2[0] + (np.arange(n) + 0.5) * (w2[1] - w2[0]) / n
    return float(np.mean(np.maximum(0.0, 1.0 - np.abs(t[:, None] - s[None, :]) / period)))


@pytest.mark.parametrize("period", [0.05, 0.3, 2.0])
def test_window_covariance_is_the_mean_autocorrelation_over_both_windows(period):
    wins = np.array([[0.0, 0.1], [0.1, 0.25], [0.25, 0.7], [0.9, 1.0], [0.05, 0.6]])
    cov = window_covariance(wins, period)
    for i in range(len(wins)):
        for j in range(len(wins)):
            assert cov[i, j] == pytest.approx(_numeric_covariance(wins[i], wins[j], period), abs=2e-4)
    assert np.diag(cov) == pytest.approx([window_variance(b - a, period) for a, b in wins])
    assert window_covariance(wins, math.inf) == pytest.approx(np.ones((5, 5)))  # one draw for all


def test_lag_covariance_of_consecutive_windows_sharing_boundaries():
    cov = lag_covariance(np.array([[0.0, 0.5], [0.5, 1.5], [1.5, 1.75]]))
    assert cov.tolist() == [[8.0, -2.0, 0.0], [-2.0, 2.0, -4.0], [0.0, -4.0, 32.0]]


def _sweep(sigma, period, lag, bursts=40, tokens=33, step=0.015, seed=0):
    """Rows of a sweep's bursts on two servers, 4 requests each: every server's steps stretched by
    its own piecewise-constant lognormal factor (random phase, a draw every ``period``), each
    token seen by the client ``lag`` (normal) late or early."""
    rng = np.random.default_rng(seed)
    rows = []
    for exp_id in range(bursts):
        for url in ("http://a", "http://b"):
            phase = rng.uniform(0, period)
            factors = rng.lognormal(-sigma * sigma / 2, sigma, 200)
            t, times = 0.05, [0.05]
            for _ in range(tokens - 1):
                t += step * factors[int((t + phase) // period)]
                times.append(t)
            for _ in range(4):
                seen = np.maximum.accumulate(np.array(times) + rng.normal(0, lag, tokens))
                rows.append(dict(exp_id=exp_id, rep=0, kind="burst_all", role="burst", url=url, batch=4,
                                 n_tokens=tokens, t_send_s=0.0, ttft_s=seen[0], t_done_s=seen[-1],
                                 token_times=" ".join(f"{x:.6f}" for x in seen), error=None))
    return pd.DataFrame(rows)


def test_windows_cut_every_server_at_the_same_tokens():
    rows = _sweep(0.3, 0.2, 0.0, bursts=2)
    wins = speed_windows(rows)
    assert len(wins) == 2 and all(len(w) == 2 for w in wins)
    assert [len(w[0]) for w in wins] == [8, 8]  # 32 gaps in 8 windows of 4 tokens
    for w in wins[0]:
        assert np.all(w[1:, 0] == w[:-1, 1]) and np.all(w[:, 1] > w[:, 0])  # consecutive, as the tokens
    one = rows[rows["url"] == "http://a"]
    assert speed_windows(one) == []  # one server only


def test_tokens_in_one_chunk_merge_windows():
    rows = _sweep(0.3, 0.2, 0.0, bursts=1)
    times = [float(x) for x in rows["token_times"].iloc[0].split()]
    chunked = " ".join(f"{times[12] if 4 <= k <= 12 else x:.6f}" for k, x in enumerate(times))  # tokens 4-12 in one chunk
    rows.loc[rows["url"] == "http://a", "token_times"] = chunked
    (wins,) = speed_windows(rows)
    assert len(wins[0]) < 8 and np.all(wins[0][:, 1] - wins[0][:, 0] >= 0.010)


@pytest.mark.parametrize("period", [0.1, 0.4])
def test_the_window_likelihood_finds_the_period_of_a_known_process(period):
    fit = fit_speed(_sweep(0.3, period, 0.002))
    assert fit.method == "windows" and fit.bursts == 40
    lo, hi = fit.interval_s
    # within a grid step (5 per decade) of the interval, which is narrow: 320 windows of 60 ms
    assert lo / 1.6 <= period <= hi * 1.6 and hi / lo < 3 and fit.period_s == pytest.approx(period, rel=0.3)
    assert fit.sigma == pytest.approx(0.3, rel=0.25) and fit.lag_s == pytest.approx(0.001, rel=0.5)  # 4 requests averaged
    assert len(fit.curve) == len(WINDOW_PERIODS)


def test_one_factor_per_run_is_told_from_a_short_period():
    fit = fit_speed(_sweep(0.3, 1e6, 0.002))
    assert fit.interval_s[1] == math.inf and fit.interval_s[0] > 1.0


def test_without_token_times_one_figure_per_burst():
    rows = _sweep(0.3, 0.2, 0.0)
    rows["token_times"] = [f"{t.split()[0]} {t.split()[-1]}" for t in rows["token_times"]]
    fit = fit_speed(rows)
    assert fit.method == "bursts" and math.isnan(fit.lag_s)


def test_the_one_figure_per_burst_likelihood_is_a_negative_log_likelihood():
    """It was twice one, so the 1.92 drop of the period interval cut an 83 % interval, not 95 %."""
    from scipy.stats import norm

    from kvroute.calibrate.calibration.speed import _burst_deviations, _burst_likelihood, window_variance

    rows = _sweep(0.3, 0.2, 0.0)
    rows["token_times"] = [f"{t.split()[0]} {t.split()[-1]}" for t in rows["token_times"]]
    devs, spans, _ = _burst_deviations(rows)
    curve, _ = _burst_likelihood(rows)
    exact = []
    for period, _, var, _ in curve:  # the normal NLL at each period's fitted variance, constants kept
        sd = np.sqrt([var * window_variance(d, period) for d in spans])
        exact.append(-float(np.sum(norm.logpdf(devs, scale=sd))))
    constant = 0.5 * len(devs) * (1 + math.log(2 * math.pi))
    assert [c[1] + constant for c in curve] == pytest.approx(exact, rel=1e-9)
