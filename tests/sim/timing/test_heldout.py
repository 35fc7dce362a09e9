"""The held-out model error as a log-space spread (``sim/timing/heldout.py``): from the fit's
absolute log errors when it recorded them, else from its percentage errors with the sign taken
even, checked against the closed forms."""

import math

import pytest

from kvroute.sim.timing.heldout import Z_90, Z_MEDIAN, heldout_log_sd, heldout_spreads, spread_from_ape


def _raw(**ttft) -> dict:
    return {"provenance": {"fit": {"heldout_single_measurements": {"ttft": ttft}}}}


def test_recorded_log_errors_give_the_spread_directly():
    spreads = heldout_spreads(_raw(median_ape=0.9, p90_ape=0.9, median_abs_log_error=0.1, p90_abs_log_error=0.4))
    assert spreads == {"ttft": 0.4 / Z_90}  # the larger of 0.1 / 0.674 and 0.4 / 1.645; the APEs unused
    assert heldout_spreads(_raw(median_abs_log_error=0.3, p90_abs_log_error=0.4)) == {"ttft": 0.3 / Z_MEDIAN}


@pytest.mark.parametrize("ape", [0.01, 0.2, 0.543, 0.95])
@pytest.mark.parametrize("q", [0.5, 0.9])
def test_a_percentage_error_puts_the_even_signed_log_error_at_its_quantile(ape, q):
    s = spread_from_ape(ape, q)
    above, below = math.log1p(ape), -math.log1p(-ape)
    # half the errors above 0 (|e| <= log(1 + a) is APE <= a), half below (|e| <= -log(1 - a))
    share = (math.erf(above / s / math.sqrt(2)) + math.erf(below / s / math.sqrt(2))) / 2
    assert share == pytest.approx(q, abs=1e-10)
    z = Z_MEDIAN if q == 0.5 else Z_90
    assert above / z < s < below / z  # between "all over-predictions" and "all under-predictions"


def test_percentage_errors_of_100_percent_or_more_and_of_0():
    assert spread_from_ape(1.5, 0.9) == pytest.approx(math.log(2.5) / Z_90, rel=1e-12)
    assert spread_from_ape(0.0, 0.5) == 0.0
    with pytest.raises(ValueError, match="quantile must be in"):
        spread_from_ape(0.1, 1.0)


def test_a_fit_with_percentage_errors_only_takes_the_larger_quantiles_spread():
    raw = _raw(median_ape=0.1, p90_ape=0.543)
    assert heldout_spreads(raw) == {"ttft": max(spread_from_ape(0.1, 0.5), spread_from_ape(0.543, 0.9))}
    assert heldout_log_sd(raw, "ttft_mean_s") == heldout_spreads(raw)["ttft"]
    assert heldout_log_sd(raw, "hit_rate") == 0.0 and heldout_spreads({}) == {}
    assert heldout_spreads(_raw(median_ape=True, p90_ape=float("nan"))) == {}  # not numbers: none
