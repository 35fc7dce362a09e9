"""The combined prediction interval (kvroute.sim.study.intervals) against closed forms, and its
coverage on normal draws with known variances (seeded: the same numbers every run)."""

import math
import statistics

import numpy as np
import pytest
from scipy.stats import t

from kvroute.sim.study.experiment import prediction_interval
from kvroute.sim.study.intervals import combined_interval, coverage
from kvroute.sim.timing.drift import Drift


def test_seeds_alone_in_linear_space_is_the_normal_theory_prediction_interval():
    values = [2.0, 2.3, 1.9, 2.2, 2.05]
    for future, level in ((1, 0.9), (3, 0.9), (1, 0.95)):
        ci = combined_interval(values, live_values=[2.1] * future, level=level, log_scale=False)
        assert (ci.low, ci.high) == pytest.approx(prediction_interval(values, level, future), rel=1e-12)
        assert ci.parts["run_source"] == "seeds"


def test_log_space_with_a_known_drift_shifts_the_centre_by_the_factor_and_adds_its_variance():
    values = [1.0, 1.1, 1.2, 0.9]
    drift = Drift(1.3, 0.1)
    ci = combined_interval(values, live_values=[1.4], drift=drift, level=0.9, log_scale=True)
    s2 = statistics.variance([math.log(v) for v in values])
    seeds = s2 * (1 + 1 / 4)
    total = seeds + 0.01
    df = total ** 2 / (seeds ** 2 / 3)  # Welch-Satterthwaite, the drift's variance known
    half = t.ppf(0.95, df) * math.sqrt(total)
    centre = math.log(statistics.fmean(values)) + math.log(1.3)
    assert (ci.low, ci.high) == pytest.approx((math.exp(centre - half), math.exp(centre + half)), rel=1e-12)
    # a rate scales with 1 / factor
    rate = combined_interval(values, live_values=[1.4], drift=drift, drift_power=-1, level=0.9)
    assert math.sqrt(rate.low * rate.high) == pytest.approx(math.exp(math.log(statistics.fmean(values)) - math.log(1.3)))
    assert ci.contains(1.4) is True and ci.contains(10.0) is False and ci.contains(None) is None


def test_bounds_clip_and_too_few_runs_give_no_interval():
    ci = combined_interval([0.1, 0.5, 0.9], live_values=[0.5], level=0.9, log_scale=False, bounds=(0.0, 1.0))
    assert ci.low == 0.0 and ci.high == 1.0
    assert math.isnan(combined_interval([1.0], live_values=[1.0]).low)
    with pytest.raises(ValueError, match="level"):
        combined_interval([1.0, 2.0], level=1.0)


def test_coverage_of_the_seeds_interval_for_normal_draws_is_the_nominal_level():
    """n = 8 simulated runs and one live value from the same normal: the 90 % interval covers the
    live value in 90 % of 4,000 seeded trials (binomial sd 0.5 pp)."""
    rng = np.random.default_rng(0)
    hits = []
    for _ in range(4000):
        sim = rng.normal(5.0, 0.4, 8)
        live = rng.normal(5.0, 0.4, 1)
        hits.append(combined_interval(sim, live_values=live, level=0.9, log_scale=False).contains(live[0]))
    assert coverage(hits)["share"] == pytest.approx(0.90, abs=0.015)


def test_the_model_term_restores_coverage_when_the_fit_is_uncertain():
    """Each trial: the real system's mean is 5 + b, b ~ N(0, 0.5^2) (what the fit does not know);
    20 drawn profiles, each off by its own b_d ~ N(0, 0.5^2), run 4 seeds of sd 0.2; the central
    profile's 4 seeds sit at 5. Seeds alone cover far less than 90 %; with the draws about 90 %."""
    rng = np.random.default_rng(1)
    with_model, seeds_only = [], []
    for _ in range(1500):
        central = rng.normal(5.0, 0.2, 4)
        drawn = np.concatenate([rng.normal(5.0 + rng.normal(0, 0.5), 0.2, 4) for _ in range(20)])
        values = np.concatenate([central, drawn])
        draws = [-1] * 4 + [d for d in range(20) for _ in range(4)]
        live = rng.normal(5.0 + rng.normal(0, 0.5), 0.2)
        with_model.append(combined_interval(values, draws, [live], level=0.9, log_scale=False).contains(live))
        seeds_only.append(combined_interval(central, None, [live], level=0.9, log_scale=False).contains(live))
    assert coverage(with_model)["share"] == pytest.approx(0.90, abs=0.03)
    assert coverage(seeds_only)["share"] < 0.65  # about 57 %: N(0, 0.54^2) against a +-0.43 interval


def test_a_known_drift_factor_restores_coverage_of_a_host_that_runs_slower():
    """The live host runs 1.6x slower than calibrated (log sd of run-to-run noise 0.1): without
    the drift the 90 % interval almost never covers; with the known factor, 90 %."""
    rng = np.random.default_rng(2)
    known, none = [], []
    for _ in range(3000):
        sim = np.exp(rng.normal(0.0, 0.1, 10))
        live = 1.6 * math.exp(rng.normal(0.0, 0.1))
        known.append(combined_interval(sim, live_values=[live], drift=Drift(1.6, 0.0), level=0.9).contains(live))
        none.append(combined_interval(sim, live_values=[live], level=0.9).contains(live))
    assert coverage(known)["share"] == pytest.approx(0.90, abs=0.015)
    assert coverage(none)["share"] < 0.05


def test_live_rounds_wider_than_the_seeds_set_the_run_to_run_term():
    """Seeds of sd 0.05, live rounds of sd 0.3 (a shared host): the interval of the mean of 5
    live rounds takes the live spread and covers at least the nominal 90 %."""
    rng = np.random.default_rng(3)
    hits, sources = [], []
    for _ in range(2000):
        sim = rng.normal(3.0, 0.05, 10)
        live = rng.normal(3.0, 0.3, 5)
        ci = combined_interval(sim, live_values=live, level=0.9, log_scale=False)
        sources.append(ci.parts["run_source"])
        hits.append(ci.contains(float(np.mean(live))))
    assert sources.count("live rounds") >= 0.99 * len(sources)  # chi-square: the seeds win 0.15 % of trials
    assert 0.88 <= coverage(hits)["share"] <= 0.97


def test_coverage_counts_only_checked_values():
    assert coverage([True, False, None, True]) == {"inside": 2, "checked": 3, "share": 2 / 3}
    assert coverage([None]) == {"inside": 0, "checked": 0, "share": None}


def test_identical_runs_contain_their_own_value_despite_the_last_bit():
    """A deterministic hit rate: every run and live round the same share; the interval's ends are
    that share computed as a mean, which can land one ulp away, and the share still counts inside."""
    share = 0.8572990705303445
    ci = combined_interval([share] * 20, live_values=[share] * 20, level=0.9, log_scale=False,
                           bounds=(0.0, 1.0))
    assert ci.contains(share) is True
    assert ci.contains(share + 1e-9) is False


def test_one_live_round_takes_the_host_prior_where_the_seeds_vary_less():
    """Closed form: identical simulated runs (no seed spread) and one live round give
    ``mean * exp(-/+ z(0.95) * prior)`` with the prior a known variance; from two live rounds on
    their own spread is used and the prior is not; a seed spread larger than the prior wins."""
    from scipy.stats import norm

    z = norm.ppf(0.95)
    ci = combined_interval([2.0] * 5, live_values=[2.3], level=0.9, prior_sd=0.1)
    assert (ci.low, ci.high) == pytest.approx((2.0 * math.exp(-z * 0.1), 2.0 * math.exp(z * 0.1)), rel=1e-12)
    assert ci.parts["run_source"] == "host prior" and ci.parts["run_to_run_prior"] == pytest.approx(0.01)
    two = combined_interval([2.0] * 5, live_values=[2.3, 2.1], level=0.9, prior_sd=0.1)
    assert two.parts["run_source"] == "live rounds" and "run_to_run_prior" not in two.parts
    wide = [1.0, 2.0, 3.0, 4.0]
    seeds = combined_interval(wide, live_values=[2.3], level=0.9, prior_sd=0.1)
    assert seeds.parts["run_source"] == "seeds" and (seeds.low, seeds.high) == (
        combined_interval(wide, live_values=[2.3], level=0.9).low, combined_interval(wide, live_values=[2.3], level=0.9).high)


def test_a_changes_prior_is_both_policies_moving_independently():
    """``100 (1 + c/100) sqrt(2) s``: a change of -50 % with log sd 0.1 on each side moves by
    7.07 pp; a change of 0 by 14.1 pp; an undefined change has none."""
    from kvroute.sim.study.intervals import change_prior_sd

    assert change_prior_sd(0.1, -50.0) == pytest.approx(50 * math.sqrt(2) * 0.1)
    assert change_prior_sd(0.1, 0.0) == pytest.approx(100 * math.sqrt(2) * 0.1)
    assert change_prior_sd(0.1, math.nan) == 0.0 and change_prior_sd(0.1, -150.0) == 0.0
    # per metric: a time or rate takes the log sd, its change the change's prior, a share none
    from kvroute.sim.study.intervals import prior_sd_for

    assert prior_sd_for("ttft_mean_s", 0.1) == 0.1 and prior_sd_for("output_throughput_tps", 0.1) == 0.1
    assert prior_sd_for("time_to_complete_s", 0.1, -50.0) == change_prior_sd(0.1, -50.0)
    assert prior_sd_for("hit_rate", 0.1) == 0.0 and prior_sd_for("hit_rate", 0.1, 10.0) == 0.0
    ci = combined_interval([-50.0] * 4, live_values=[-40.0], level=0.9, log_scale=False,
                           prior_sd=change_prior_sd(0.1, -50.0))
    half = (ci.high - ci.low) / 2
    from scipy.stats import norm

    assert half == pytest.approx(norm.ppf(0.95) * 50 * math.sqrt(2) * 0.1, rel=1e-12)
