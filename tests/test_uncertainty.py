"""Model uncertainty: bootstrap refits in the measured profiles, drawn profiles, stated ranges."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvroute.calibrate.fit import UNCERTAIN_FIELDS, fit, uncertainty_document
from kvroute.calibrate.observations import build_observations, engine_config, load_sweep
from kvroute.sim.profile import CoefficientUncertainty, load_profile, profile_from_dict
from kvroute.sim.uncertainty import PRIOR_FIELDS, coefficient, draw_profiles, profile_uncertainty

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["cpu-tiny-qwen2", "cpu-tiny-qwen2-x2"])
def test_refit_reproduces_the_shipped_coefficients_and_first_bootstrap_samples(name):
    shipped = json.loads((ROOT / "sim" / "profiles" / f"{name}.json").read_text())
    fit_doc = shipped["provenance"]["fit"]
    meta, servers, req, exp = load_sweep(ROOT / "bench" / f"calibrate-{name}")
    obs, _ = build_observations(req, exp, engine_config(servers[0]), "auto")
    res = fit(obs, fit_doc["holdout_share"], fit_doc["holdout_seed"], "auto", fit_doc["method"].split("/")[-1],
              True, 4, bootstrap=2)
    assert {k: getattr(res.cost, k) for k in shipped["step_cost"]} == shipped["step_cost"]
    assert res.api_server_s == shipped["overheads"]["api_server_s"]
    doc = uncertainty_document(res)
    unc = shipped["step_cost_uncertainty"]
    assert unc["fields"] == list(UNCERTAIN_FIELDS) and unc["num_samples"] == 100
    # resample i does not depend on how many follow it
    assert doc["samples"] == unc["samples"][:2]


def test_draws_of_a_measured_profile_are_its_bootstrap_samples_seeded():
    profile = load_profile("cpu-tiny-qwen2")
    a = draw_profiles(profile, 5, np.random.default_rng(3))
    b = draw_profiles(profile, 5, np.random.default_rng(3))
    assert [p.step_cost for p in a] == [p.step_cost for p in b]
    rows = {tuple(r) for r in profile.uncertainty.samples}
    fields = profile.uncertainty.fields
    for p in a:
        assert tuple(coefficient(p, f) for f in fields) in rows
    assert len({p.step_cost for p in a}) == 5  # without replacement while n <= samples


def test_draws_of_a_derived_prior_stay_in_the_stated_range():
    profile = load_profile("a6000-qwen2.5-7b")
    assert profile.uncertainty is None
    unc = profile_uncertainty(profile, 0.1)
    assert unc.fields == PRIOR_FIELDS and unc.relative_range == 0.1
    draws = draw_profiles(profile, 50, np.random.default_rng(0), prior_range=0.1)
    for f in PRIOR_FIELDS:
        ratios = np.array([coefficient(p, f) / coefficient(profile, f) for p in draws])
        assert ratios.min() >= 0.9 and ratios.max() <= 1.1 and ratios.std() > 0.03, f
    assert all(p.engine == profile.engine for p in draws)
    assert {coefficient(p, "overheads.gateway_s") for p in draws} == {profile.overheads.gateway_s}


def test_uncertainty_section_errors_name_the_file_and_field():
    doc = json.loads((ROOT / "sim" / "profiles" / "cpu-tiny-qwen2.json").read_text())
    bad = dict(doc, step_cost_uncertainty={"fields": ["step_cost.nope"], "samples": [[1.0]]})
    with pytest.raises(ValueError, match="x.json: step_cost_uncertainty: unknown uncertain coefficient 'step_cost.nope'"):
        profile_from_dict(bad, "x.json")
    short = dict(doc, step_cost_uncertainty={"fields": ["step_cost.per_token_s"], "samples": [[1.0, 2.0]]})
    with pytest.raises(ValueError, match="sample 0 has 2 values for 1 fields"):
        profile_from_dict(short, "x.json")
    with pytest.raises(ValueError, match="give samples or a relative_range"):
        CoefficientUncertainty(("step_cost.per_token_s",))
    rel = profile_from_dict(dict(doc, step_cost_uncertainty={"fields": ["step_cost.per_token_s"],
                                                             "relative_range": 0.3}))
    assert rel.uncertainty.interval("step_cost.per_token_s", 2.0) == pytest.approx((1.4, 2.6))
    assert rel.uncertainty.interval("step_cost.decode_attn_s", 2.0) is None
    with pytest.raises(ValueError, match="must be >= 1"):
        draw_profiles(replace(rel, uncertainty=None), 0, np.random.default_rng(0))
