"""The host's speed drift from speed probes (kvroute.sim.timing.drift): exact arithmetic."""

import math

import pytest

from kvroute.sim.timing.drift import NO_DRIFT, Drift, combine, drift_exponent, metric_drift, probe_drift


def test_drift_against_a_reference_is_the_mean_of_the_probes_over_the_reference():
    e = math.exp
    d = probe_drift([e(0.1), e(0.1)], [e(0.3), e(0.3)], [1.0, 1.0])
    assert d.factor == pytest.approx(e(0.2), rel=1e-12)
    assert d.log_sd == pytest.approx(0.2 / math.sqrt(12), rel=1e-12)  # uniform between the probes


def test_without_a_reference_the_factor_is_one_and_the_change_counts_both_ways():
    e = math.exp
    d = probe_drift([e(0.1)], [e(0.3)])
    assert d.factor == 1.0 and d.log_sd == pytest.approx(0.2 / math.sqrt(3), rel=1e-12)


def test_the_probes_sampling_variance_is_pooled_over_probes_of_two_or_more():
    e = math.exp
    # before: logs 0 and 0.2 (mean 0.1, squares 0.02); after: 0.3, 0.3; reference: 0, 0
    d = probe_drift([1.0, e(0.2)], [e(0.3), e(0.3)], [1.0, 1.0])
    s2 = 0.02 / 3
    var = 0.2 ** 2 / 12 + s2 * (1 / 2 + 1 / 2) / 4 + s2 / 2
    assert d.factor == pytest.approx(e(0.2), rel=1e-12) and d.log_sd == pytest.approx(math.sqrt(var), rel=1e-12)


def test_no_usable_probe_gives_no_drift_and_bad_values_are_refused():
    d = probe_drift([], [0.5])
    assert (d.factor, d.log_sd) == (1.0, 0.0) and "no usable probe" in d.source
    assert probe_drift([-1.0, float("nan")], [1.0]).factor == 1.0
    with pytest.raises(ValueError, match="factor"):
        Drift(0.0, 0.1)
    with pytest.raises(ValueError, match="log_sd"):
        Drift(1.0, -0.1)


def test_metrics_take_the_drift_of_their_probe_and_shares_none():
    ttft, itl = Drift(1.2, 0.05), Drift(1.1, 0.02)
    drifts = {"ttft": ttft, "itl": itl}
    assert metric_drift("later_ttft_mean_s", drifts) is ttft and metric_drift("tpot_mean_s", drifts) is itl
    both = metric_drift("time_to_complete_s", drifts)
    assert both.factor == pytest.approx(math.sqrt(1.2 * 1.1))
    assert both.log_sd == pytest.approx(math.sqrt(0.05 ** 2 + math.log(1.2 / 1.1) ** 2 / 12), rel=1e-12)
    assert metric_drift("hit_rate", drifts) is NO_DRIFT and metric_drift("ttft_mean_s", {}) is NO_DRIFT
    assert [drift_exponent(m) for m in ("e2e_mean_s", "output_throughput_tps", "failed", "hit_rate",
                                        "max_output_tokens_per_s")] == [1, -1, 0, 0, -1]


def test_a_metric_combines_the_single_and_burst_probes_of_its_kind():
    e = math.exp
    ttft, burst = Drift(e(0.2), 0.03), Drift(e(0.6), 0.04)
    drifts = {"ttft": ttft, "burst_ttft": burst, "itl": Drift(e(0.1), 0.01)}
    d = metric_drift("later_ttft_mean_s", drifts)
    assert d.factor == pytest.approx(e(0.4), rel=1e-12)  # mean of the log factors
    assert d.log_sd == pytest.approx(math.sqrt(0.04 ** 2 + 0.4 ** 2 / 12), rel=1e-12)  # largest sd, plus the range
    assert metric_drift("tpot_mean_s", drifts) is drifts["itl"]  # no burst ITL probe: the single one alone
    every = metric_drift("e2e_mean_s", drifts)
    assert every.factor == pytest.approx(e(0.3), rel=1e-12)
    assert every.log_sd == pytest.approx(math.sqrt(0.04 ** 2 + 0.5 ** 2 / 12), rel=1e-12)
    with pytest.raises(ValueError, match="at least one"):
        combine([])
