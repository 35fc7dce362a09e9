"""The speed probe as a profile predicts it (kvroute.calibrate.validation.probe.predicted_probe),
the reference a drift is measured against when no probe was taken right after calibrating."""

import math

import pytest

from kvroute.calibrate.validation.probe import (PROBE_OUTPUT_TOKENS, PROBE_PROMPT_TOKENS, drifts,
                                                predicted_probe, speed_scale)
from kvroute.sim.timing.speed_scale import SpeedScale, scaled_profile
from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.timing.profile import load_profile


@pytest.fixture(scope="module")
def prior():
    """A spec-sheet prior: no jitter, no front-end terms, so every run of the probe is the same."""
    return ClusterSpec(profile=load_profile("a6000-qwen2.5-7b"), num_workers=2, policy="kv_aware",
                       max_in_flight=1, client_lag_s=(0.5,))


def test_the_predicted_probe_has_one_value_per_simulated_request(prior):
    pp = predicted_probe(prior, reps=3, burst=4, rounds=2)
    assert {k: len(v) for k, v in pp.items()} == {"ttft_s": 12, "itl_s": 12, "long_ttft_s": 4, "long_itl_s": 4,
                                                   "burst_ttft_s": 16, "burst_itl_s": 16}


def test_one_at_a_time_requests_are_alike_and_the_burst_queues(prior):
    """Requests one at a time on an idle cluster are alike (within the prior's API overhead, drawn
    per request with a 10 % coefficient of variation); the burst's four 2,048-token
    prompts per worker fill the step's token budget one at a time, so their TTFTs per worker are
    the single request's, then later by about one prefill each."""
    pp = predicted_probe(prior, reps=3, burst=4, rounds=1)
    single = pp["ttft_s"][0]
    assert pp["ttft_s"] == pytest.approx([single] * 6, rel=0.1)
    assert min(pp["burst_ttft_s"]) == pytest.approx(single, rel=0.1)  # first of the burst: alone but for its arrival
    per_worker = sorted(pp["burst_ttft_s"])[::2]
    assert all(b > a for a, b in zip(per_worker, per_worker[1:]))
    assert max(pp["burst_ttft_s"]) > 3 * single
    assert max(pp["burst_itl_s"]) > pp["itl_s"][0]  # decodes share steps with the others' prefills
    assert min(pp["long_ttft_s"]) > 3 * single  # 8,192 tokens: four chunks, attention over more context


def test_the_probe_the_profile_predicts_gives_no_drift_against_itself(prior):
    pp = predicted_probe(prior, rounds=1)
    d = drifts(pp, pp, pp)
    assert set(d) == {"ttft", "itl", "long_ttft", "long_itl", "burst_ttft", "burst_itl"}
    assert all(x.factor == pytest.approx(1.0, rel=1e-12) for x in d.values())
    slower = {k: [2 * t for t in v] for k, v in pp.items()}
    assert drifts(slower, slower, pp)["burst_ttft"].factor == pytest.approx(2.0, rel=1e-12)
    assert (PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS) == (2048, 32)
    assert math.isfinite(d["itl"].log_sd)


def test_probes_saved_without_the_burst_part_give_the_single_request_drifts_alone(prior):
    pp = predicted_probe(prior, rounds=1)
    old = {"ttft_s": pp["ttft_s"], "itl_s": pp["itl_s"]}
    assert set(drifts(old, old, pp)) == {"ttft", "itl"}


@pytest.mark.parametrize("name", ["a6000-qwen2.5-7b", "cpu-tiny-qwen2-x2-bursts"])
def test_the_speed_scale_recovers_known_factors_from_a_probe_simulated_with_them(name):
    """A synthetic fit with a known answer: the probe simulated under the profile with step x1.3,
    token x2.0 and attention x1.7 (jitter off, as the fit's own simulations: it compares
    jitter-free means), read back by speed_scale against the unscaled profile."""
    import dataclasses

    profile = load_profile(name)
    if profile.host is not None:
        profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, engine_speed_sigma=0.0))
    cluster = ClusterSpec(profile=profile, num_workers=2)
    truth = SpeedScale(step=1.3, token=2.0, attention=1.7)
    profile = dataclasses.replace(profile, overheads=dataclasses.replace(profile.overheads, jitter_cv=0.0))
    cluster = ClusterSpec(profile=profile, num_workers=2)
    measured = predicted_probe(dataclasses.replace(cluster, profile=scaled_profile(profile, truth)), rounds=1)
    got = speed_scale(cluster, measured)
    assert got.factors() == pytest.approx(truth.factors(), rel=0.02)
    assert got.residual < 0.01 and got.clipped == ()
    assert set(got.log_sd) == {"step", "token", "attention"}  # one probe sample per quantity: the 10 % default scatter
    one = speed_scale(cluster, {"ttft_s": measured["ttft_s"], "itl_s": measured["itl_s"]})
    assert one.token == one.attention  # no long part: one factor for the prefill's two groups


def test_a_scaled_profile_multiplies_each_group_and_its_bootstrap_samples():
    profile = load_profile("cpu-tiny-qwen2-x2")
    scaled = scaled_profile(profile, SpeedScale(step=2.0, token=3.0, attention=0.5))
    c, k = profile.step_cost, scaled.step_cost
    assert (k.step_overhead_s, k.weight_load_s, k.per_request_s) == (2 * c.step_overhead_s, 2 * c.weight_load_s,
                                                                     2 * c.per_request_s)
    assert (k.per_token_s, k.prefill_attn_s, k.decode_attn_s) == (3 * c.per_token_s, 0.5 * c.prefill_attn_s,
                                                                  0.5 * c.decode_attn_s)
    assert scaled.name == "cpu-tiny-qwen2-x2 x probe" and scaled.raw["speed_scale"]["token"] == 3.0
    fields = profile.uncertainty.fields
    i = fields.index("step_cost.per_token_s")
    assert scaled.uncertainty.samples[0][i] == 3 * profile.uncertainty.samples[0][i]
    with pytest.raises(ValueError, match="attention"):
        SpeedScale(attention=0.0)


def test_the_speed_factors_standard_errors_follow_the_probes_scatter_through_the_fit():
    """Closed forms of the propagated standard error: one quantity per factor (identity Jacobian)
    gives each quantity's own relative error; a quantity twice as sensitive halves it; two
    factors that move the probe times alike (equal columns) are not determined."""
    from kvroute.calibrate.validation.probe import _log_sd

    assert _log_sd([[1.0, 0.0], [0.0, 1.0]], [0.1, 0.2]) == pytest.approx([0.1, 0.2])
    assert _log_sd([[2.0, 0.0], [0.0, 1.0]], [0.1, 0.2]) == pytest.approx([0.05, 0.2])
    # a quantity from one request (no scatter) takes the largest known relative error
    assert _log_sd([[1.0, 0.0], [0.0, 1.0]], [0.1, float("nan")]) == pytest.approx([0.1, 0.1])
    assert _log_sd([[1.0, 1.0], [1.0, 1.0]], [0.1, 0.1]) == [float("inf")] * 2
    # a misfit the scatter does not allow: three quantities, one factor (dof 2), each 3 errors off
    # (chi^2 = 27): the error grows by sqrt(27 / 2); a fit within its errors keeps it
    flat = [[1.0], [1.0], [1.0]]
    base = _log_sd(flat, [0.1] * 3)[0]
    assert base == pytest.approx(0.1 / math.sqrt(3))
    assert _log_sd(flat, [0.1] * 3, [0.3, -0.3, 0.3])[0] == pytest.approx(base * math.sqrt(27 / 2))
    assert _log_sd(flat, [0.1] * 3, [0.01, -0.01, 0.0])[0] == pytest.approx(base)


def test_a_speed_scale_names_the_factors_its_probes_leave_poorly_determined():
    scale = SpeedScale(step=0.8, token=2.4, attention=2.1, log_sd={"step": 0.35, "token": 0.25, "attention": 0.03})
    assert scale.poorly_determined() == ("step", "token")
    text = scale.describe()
    assert "step x0.800 (log sd 0.35)" in text
    assert "poorly determined by the probes (log sd above 0.2, from their scatter and the fit's misfit): step, token" in text
    assert scale.to_dict()["log_sd"] == {"step": 0.35, "token": 0.25, "attention": 0.03}
    assert SpeedScale().poorly_determined() == () and "poorly" not in SpeedScale().describe()


def test_a_per_token_factor_the_probes_leave_undetermined_is_tied_to_the_per_step_one(monkeypatch):
    """When the three-factor fit leaves ``token`` poorly determined, the fit is redone with one
    factor for the per-step and per-token costs together (``tied``), and attention its own."""
    import dataclasses

    from kvroute.calibrate.validation import probe

    profile = load_profile("cpu-tiny-qwen2-x2-bursts")
    profile = dataclasses.replace(profile, overheads=dataclasses.replace(profile.overheads, jitter_cv=0.0),
                                  host=dataclasses.replace(profile.host, engine_speed_sigma=0.0))
    cluster = ClusterSpec(profile=profile, num_workers=2)
    measured = predicted_probe(dataclasses.replace(cluster, profile=scaled_profile(
        profile, SpeedScale(step=1.5, token=1.5, attention=2.0))), rounds=1)
    real = probe._log_sd
    # the three-factor fit's errors as the 2026-12-05 07:19 run's long chats gave them
    monkeypatch.setattr(probe, "_log_sd", lambda jac, se, fun=None: [0.13, 0.64, 0.07] if len(jac[0]) == 3
                        else real(jac, se, fun))
    got = speed_scale(cluster, measured)
    assert got.tied == (("step", "token"),) and got.step == got.token
    assert (got.step, got.attention) == pytest.approx((1.5, 2.0), rel=0.02)
    assert got.describe().startswith("step and token x1.500 (one factor: the probes cannot tell them apart; log sd ")
    assert got.to_dict()["tied"] == [["step", "token"]]


def test_drifts_against_the_calibration_probe_else_the_profiles_prediction():
    """One rule for the drift's reference (validate and bench_validate): the probe right after
    calibrating when there is one, else the probe simulated with the profile; no drift without
    both probes."""
    from kvroute.calibrate.validation.probe import drifts, drifts_against, predicted_probe
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile

    cluster = ClusterSpec(load_profile("cpu-tiny-qwen2"), num_workers=2)
    before = {"ttft_s": [0.050, 0.052, 0.051], "itl_s": [0.002, 0.0021, 0.002]}
    after = {"ttft_s": [0.060, 0.061, 0.059], "itl_s": [0.0022, 0.0023, 0.0022]}
    calibrated = {"ttft_s": [0.040, 0.041, 0.040], "itl_s": [0.0019, 0.0019, 0.002]}
    found, reference, label = drifts_against(before, after, cluster, calibrated)
    assert reference is calibrated and label == "after calibrating"
    assert found == drifts(before, after, calibrated, "after calibrating") and set(found) == {"ttft", "itl"}
    found, reference, label = drifts_against(before, after, cluster, None, reps=2, seed=3)
    assert label == "as cpu-tiny-qwen2 predicts them"
    assert reference == predicted_probe(cluster, 2, seed=3)
    assert found == drifts(before, after, reference, label)
    assert drifts_against(before, None, cluster) == ({}, None, "as cpu-tiny-qwen2 predicts them")
