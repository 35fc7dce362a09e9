"""Model uncertainty: bootstrap refits in the measured profiles, drawn profiles, stated ranges."""

import json
from dataclasses import replace

import numpy as np
import pytest

from kvroute.calibrate.calibration.fit import UNCERTAIN_FIELDS, fit, uncertainty_document
from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweep
from kvroute.sim.timing.profile import CoefficientUncertainty, load_profile, profile_from_dict
from kvroute.sim.timing.uncertainty import PRIOR_FIELDS, coefficient, draw_profiles, profile_uncertainty
from tests.support.paths import ROOT


@pytest.mark.parametrize("name", ["cpu-tiny-qwen2", "cpu-tiny-qwen2-x2"])
def test_refit_reproduces_the_shipped_coefficients_and_first_bootstrap_samples(name):
    shipped = json.loads((ROOT / "sim" / "timing" / "profiles" / f"{name}.json").read_text())
    fit_doc = shipped["provenance"]["fit"]
    meta, servers, req, exp = load_sweep(ROOT / "calibrate" / "data" / f"calibrate-{name}")
    obs, _ = build_observations(req, exp, engine_config(servers[0]), "auto")
    res = fit(obs, fit_doc["holdout_share"], fit_doc["holdout_seed"], "auto", fit_doc["method"].split("/")[-1],
              True, 4, bootstrap=2, scatter_limit=None)  # the shipped samples predate the 2x-scatter resampling
    # The least-squares solve goes through BLAS, whose last bits differ between numpy builds; a
    # coefficient the data leaves at zero (this tiny model's weight floor, ~1e-10 s) can move by
    # a few 1e-9 s. Ten nanoseconds per step is far below anything the fit resolves (steps take ms).
    close = dict(rel=1e-9, abs=1e-8)
    assert {k: getattr(res.cost, k) for k in shipped["step_cost"]} == pytest.approx(shipped["step_cost"], **close)
    assert res.api_server_s == pytest.approx(shipped["overheads"]["api_server_s"], **close)
    doc = uncertainty_document(res)
    unc = shipped["step_cost_uncertainty"]
    assert unc["fields"] == list(UNCERTAIN_FIELDS) and unc["num_samples"] == 100
    # resample i does not depend on how many follow it
    assert len(doc["samples"]) == 2
    for got, want in zip(doc["samples"], unc["samples"][:2]):
        assert got == pytest.approx(want, **close)


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
    doc = json.loads((ROOT / "sim" / "timing" / "profiles" / "cpu-tiny-qwen2.json").read_text())
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


def test_prediction_interval_is_the_normal_theory_one():
    from scipy.stats import t

    from kvroute.sim.study.experiment import prediction_interval

    lo, hi = prediction_interval([1.0, 2.0, 3.0, float("nan")])
    half = t.ppf(0.975, 2) * 1.0 * (4 / 3) ** 0.5
    assert (lo, hi) == pytest.approx((2 - half, 2 + half))
    assert all(np.isnan(prediction_interval([1.0])))


def test_compare_uncertainty_keeps_the_seed_only_results_and_adds_model_intervals():
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    args = ["compare", "--chats", "6", "--turns", "2", "--workers", "2", "--rounds", "2", "--seed", "3",
            "--policies", "round_robin,kv_aware", "--profile", "cpu-tiny-qwen2", "--json"]
    plain = json.loads(CliRunner().invoke(cli, args, catch_exceptions=False).output)
    result = CliRunner().invoke(cli, args + ["--uncertainty", "3"], catch_exceptions=False)
    doc = json.loads(result.output)
    assert doc["uncertainty"]["draws"] == 3 and doc["uncertainty"]["method"].startswith("bootstrap: 100 refits")
    for policy in ("round_robin", "kv_aware"):
        for metric, entry in doc["policies"][policy].items():
            assert entry["rounds"] == plain["policies"][policy][metric]["rounds"], (policy, metric)
            assert set(entry["model_interval"]) == {"low", "high"}
    ttc = doc["policies"]["kv_aware"]["time_to_complete_s"]
    assert ttc["model_interval"]["low"] < ttc["mean"] < ttc["model_interval"]["high"]
    assert "change_model_interval_pct" in ttc
    # a share's change is in percentage points, never a percent of a percent
    hit = doc["policies"]["kv_aware"]["hit_rate"]
    assert "change_model_interval_pp" in hit and "change_model_interval_pct" not in hit
    text = CliRunner().invoke(cli, args[:-1] + ["--uncertainty", "3"], catch_exceptions=False).output
    hit_row = next(line for line in text.splitlines() if line.lstrip().startswith("hit"))
    assert " pp" in hit_row, hit_row
    bad = CliRunner().invoke(cli, args + ["--uncertainty", "-1"])
    assert bad.exit_code != 0 and "--uncertainty" in bad.output


def test_each_draw_runs_on_its_own_seeds_shared_by_the_policies():
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.study.experiment import compare_uncertain
    from kvroute.traces.generators import seed_chat

    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2)
    res = compare_uncertain(seed_chat(num_chats=4, num_turns=2), spec, ["round_robin", "kv_aware"], draws=2,
                            rounds=2, seed=5)
    seeds = res.summaries.groupby(["draw", "policy"])["seed"].apply(list).to_dict()
    assert seeds == {(0, "round_robin"): [7, 8], (0, "kv_aware"): [7, 8],
                     (1, "round_robin"): [9, 10], (1, "kv_aware"): [9, 10]}
    assert list(res.base.summaries["seed"]) == [5, 6, 5, 6]
    with pytest.raises(ValueError, match="draws must be >= 1"):
        compare_uncertain(seed_chat(num_chats=4, num_turns=2), spec, ["round_robin"], draws=0)


def test_model_intervals_stay_within_possible_values_and_notes_stay_under_the_table():
    import pandas as pd
    from click.testing import CliRunner

    from kvroute.cli.main import cli
    from kvroute.sim.study.experiment import UncertainComparison

    # two draws far apart: the normal interval of a share and of a time runs past their bounds
    rows = pd.DataFrame({"draw": [0, 1], "policy": ["p", "p"], "round": [0, 0], "seed": [0, 1],
                         "goodput_share": [0.05, 0.95], "ttft_mean_s": [0.1, 9.0]})
    res = UncertainComparison(base=None, draws=2, rounds=1, summaries=rows, method="test")
    lo, hi = res.mean_interval("p", "goodput_share")
    assert (lo, hi) == (0.0, 1.0)
    lo, hi = res.run_interval("p", "ttft_mean_s")
    assert lo == 0.0 and hi > 9.0
    out = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "2", "--rounds", "2", "--uncertainty", "2",
                                   "--policies", "round_robin"], catch_exceptions=False).output
    assert "Note: a6000-qwen2.5-7b is a derived prior" in out
    assert "The `with model unc.` intervals include their share" in out and "`--uncertainty 10`" not in out


def test_draws_take_host_contention_in_the_range_the_burst_fit_allows_up_to_what_the_data_asked_for():
    import copy

    from kvroute.sim.timing.uncertainty import term_ranges

    profile = load_profile("cpu-tiny-qwen2-x2-bursts")
    # its burst fit left contention inside its bounds, so draws take the fit's likelihood interval
    assert term_ranges(profile) == {"host.contention": (0.89541, 1.16525)}
    raw = copy.deepcopy(profile.raw)
    raw["provenance"]["fit"]["bursts"].pop("contention_interval")
    assert term_ranges(profile_from_dict(raw)) == {}  # no interval: contention stays
    raw["provenance"]["fit"]["bursts"]["contention_interval"] = [3.86, 4.0]
    raw["fit_notes"] = {"at_bound": [{"term": "host.contention", "bound": 4.0, "asked_for": 9.61}]}
    walled = profile_from_dict(raw)
    assert term_ranges(walled) == {"host.contention": (3.86, 9.61)}
    draws = draw_profiles(walled, 40, np.random.default_rng(0))
    c = np.array([p.host.contention for p in draws])
    assert c.min() >= 3.86 and c.max() <= 9.61 and c.max() > 7.0  # reaches past the bound of 4
    # the step costs are still the bootstrap samples
    rows = {tuple(r) for r in walled.uncertainty.samples}
    assert all(tuple(coefficient(p, f) for f in walled.uncertainty.fields) in rows for p in draws)
