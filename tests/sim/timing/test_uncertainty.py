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


@pytest.mark.parametrize("notes,field,message", [
    (["x"], "fit_notes", "expected an object, got a list"),
    ({"at_bound": {}}, "fit_notes.at_bound", "expected a list, got an object"),
    ({"at_bound": ["x"]}, "fit_notes.at_bound[0]", "expected an object, got a string ('x')"),
])
def test_a_malformed_fit_notes_section_is_refused_where_it_is_read(notes, field, message):
    """The term ranges read ``fit_notes.at_bound`` when drawing profiles; a malformed section was
    accepted and crashed there with an AttributeError."""
    doc = json.loads((ROOT / "sim" / "timing" / "profiles" / "cpu-tiny-qwen2-x2-bursts.json").read_text())
    with pytest.raises(ValueError) as err:
        profile_from_dict(dict(doc, fit_notes=notes), "x.json")
    assert str(err.value) == f"x.json: field {field!r}: {message}"


@pytest.mark.parametrize("value,message", [
    ("abc", "expected a finite number >= 0 or null, got a string ('abc')"),
    (float("nan"), "expected a finite number >= 0 or null, got a float (nan)"),
    (True, "expected a finite number >= 0 or null, got a boolean"),
])
def test_a_bad_held_out_error_is_refused_where_the_profile_is_read(value, message):
    """The intervals read the fit's held-out errors; a bad one was skipped silently, which
    narrowed them."""
    doc = json.loads((ROOT / "sim" / "timing" / "profiles" / "cpu-tiny-qwen2-x2.json").read_text())
    doc["provenance"]["fit"]["heldout_single_measurements"]["itl"]["p90_abs_log_error"] = value
    with pytest.raises(ValueError) as err:
        profile_from_dict(doc, "x.json")
    field = "provenance.fit.heldout_single_measurements.itl.p90_abs_log_error"
    assert str(err.value) == f"x.json: field {field!r}: {message}"
    doc["provenance"]["fit"]["heldout_single_measurements"]["itl"]["p90_abs_log_error"] = None  # the fit's NaN
    assert profile_from_dict(doc, "x.json").name == "cpu-tiny-qwen2-x2"


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
    failed_row = next(line for line in text.splitlines() if line.startswith("failed requests"))
    assert failed_row.split()[2:] == ["0", "±", "0", "[0,", "0]", "0", "±", "0", "[0,", "0]"]  # not 0.000
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
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    # two draws far apart: the normal interval of a share runs past both its bounds
    res = _uncertain({"p": {"goodput_share": [0.5, 0.5]}}, {"p": {"goodput_share": [[0.05, 0.06], [0.95, 0.96]]}})
    lo, hi = res.mean_interval("p", "goodput_share")
    assert (lo, hi) == (0.0, 1.0)
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


def _uncertain(central: dict, drawn: dict, rounds: int = 2):
    """An ``UncertainComparison`` from values: ``central[policy][metric]`` one per round of the
    central profile, ``drawn[policy][metric][d]`` one per round of drawn profile ``d``."""
    import pandas as pd

    from kvroute.sim.study.experiment import Comparison, UncertainComparison

    policies = list(central)
    rows = [{"policy": p, "round": r, "seed": r, **{m: v[r] for m, v in central[p].items()}}
            for p in policies for r in range(rounds)]
    means = {p: {m: {"mean": float(np.mean(v)), "low": np.nan, "high": np.nan, "rounds": rounds}
                 for m, v in central[p].items()} for p in policies}
    draws = len(next(iter(drawn[policies[0]].values())))
    drawn_rows = [{"draw": d, "policy": p, "round": r, "seed": rounds * (d + 1) + r,
                   **{m: v[d][r] for m, v in drawn[p].items()}}
                  for d in range(draws) for p in policies for r in range(rounds)]
    return UncertainComparison(Comparison(policies, {}, rows, means), draws, rounds, pd.DataFrame(drawn_rows), "test")


def test_a_shares_model_interval_is_the_combined_closed_form():
    from scipy.stats import t

    # three profiles, each two rounds 0.45 and 0.55: seeds' variance 0.005 on 3 df, no model
    # spread; the mean of 2 rounds: 0.005 (1/2 + 1/2) on 3 df
    res = _uncertain({"p": {"hit_rate": [0.45, 0.55]}}, {"p": {"hit_rate": [[0.45, 0.55], [0.45, 0.55]]}})
    half = float(t.ppf(0.975, 3)) * 0.005 ** 0.5
    assert res.mean_interval("p", "hit_rate") == pytest.approx((0.5 - half, 0.5 + half), rel=1e-12)
    # one run: 0.005 (1 + 1/2)
    half = float(t.ppf(0.975, 3)) * (0.005 * 1.5) ** 0.5
    assert res.run_interval("p", "hit_rate") == pytest.approx((0.5 - half, 0.5 + half), rel=1e-12)


def test_model_intervals_are_centred_on_the_central_profiles_value_not_the_draws():
    # the drawn profiles all run slower than the central one: the interval widens to reach them
    # but stays around the value the table shows (before: centred on the draws' mean, 2.6 s,
    # it missed the central 1.1 s)
    res = _uncertain({"p": {"ttft_mean_s": [1.0, 1.2], "goodput_rps": [4.0, 4.4]}},
                     {"p": {"ttft_mean_s": [[2.0, 2.2], [3.0, 3.2]], "goodput_rps": [[2.0, 2.2], [1.0, 1.2]]}})
    for metric, point in (("ttft_mean_s", 1.1), ("goodput_rps", 4.2)):
        lo, hi = res.mean_interval("p", metric)
        assert lo < point < hi and (lo * hi) ** 0.5 == pytest.approx(point, rel=1e-12)  # log-symmetric about it


def test_change_intervals_stop_at_minus_100_percent_and_hold_the_change_shown():
    # preemptions fall to none under q in the central profile (-100 %) and nearly none in the draws:
    # the normal interval of the per-run changes runs below -100 %, which no change can
    res = _uncertain({"p": {"preemptions": [4.0, 6.0]}, "q": {"preemptions": [0.0, 0.0]}},
                     {"p": {"preemptions": [[2.0, 10.0], [5.0, 5.0]]}, "q": {"preemptions": [[0.0, 1.0], [1.0, 0.0]]}})
    lo, hi = res.change_interval("q", "preemptions")
    assert lo == -100.0 and -100.0 < hi < 0.0
    assert res.base.change("q", "preemptions") == -100.0
    # a change of the means that differs from the mean of the per-run changes is the centre
    res = _uncertain({"p": {"ttft_mean_s": [1.9, 2.1]}, "q": {"ttft_mean_s": [1.5, 1.5]}},
                     {"p": {"ttft_mean_s": [[1.9, 2.1]]}, "q": {"ttft_mean_s": [[1.5, 1.5]]}})
    point = res.base.change("q", "ttft_mean_s")  # 1.5 / 2 - 1: -25 %, where the runs' changes average -24.8 %
    lo, hi = res.change_interval("q", "ttft_mean_s")
    assert point == pytest.approx(-25.0, rel=1e-12) and (lo + hi) / 2 == pytest.approx(point, rel=1e-12)
    assert -100.0 < lo < point < hi < 0.0


def test_uncertainty_keeps_the_stage_table_and_puts_the_model_intervals_in_the_report(tmp_path):
    import re

    from click.testing import CliRunner

    from kvroute.cli.main import cli
    from tests.support.workloads import SMALL_LADDER

    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    out = tmp_path / "run"
    args = ["compare", "--workload-config", str(config), "--policies", "round_robin,kv_aware", "--rounds", "2",
            "--uncertainty", "2", "--executor", "sequential", "--quiet", "--out", str(out)]
    text = CliRunner().invoke(cli, args, catch_exceptions=False).output
    assert "\nper stage (inference-perf's counting" in text
    assert "With model unc.: 95% prediction interval of the mean of 2 run(s), centred on the (seeds) mean" in text
    # why a model-uncertainty interval can be narrower than the seeds-only one with few rounds
    assert ("the seeds' spread is pooled over the runs of all 3 profiles, so with 2 rounds it can come out "
            "narrower than (seeds), whose t has 1 degree of freedom;" in " ".join(text.split()))
    page = (out / "report.html").read_text()
    table = page[page.index('id="compare-table"'):]
    table = table[:table.index("</table>")]
    header = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert header == ["metric", "round_robin (seeds)", "with model unc.", "kv_aware (seeds)", "with model unc.",
                      "Δ vs round_robin", "Δ with model unc."]
    doc = json.loads((out / "compare.json").read_text())
    ttc = doc["policies"]["kv_aware"]["time_to_complete_s"]
    low, high = ttc["model_interval"]["low"], ttc["model_interval"]["high"]
    assert f'data-low="{low!r}" data-high="{high!r}"' in table
    assert "With model unc.: 95% prediction interval" in page
