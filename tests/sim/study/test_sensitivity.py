"""Sensitivity (Morris screening): factors and their ranges, ranking, determinism, CLI."""

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.timing.profile import CoefficientUncertainty, load_profile
from kvroute.sim.study.sensitivity import (FACTOR_GROUPS, Factor, Ranges, base_profile, default_factors, output_names,
                                     run_sensitivity)
from kvroute.sim.study.sweep import Scenario
from kvroute.sim.timing.uncertainty import with_coefficients

TOY = Scenario(chats=8, turns=2, workers=2)


def _set(name):
    return lambda scenario, profile, value: (scenario, with_coefficients(profile, {name: value}))


def test_default_factors_of_a_derived_prior_are_its_values_plus_minus_the_stated_range():
    profile = load_profile("a6000-qwen2.5-7b")
    factors = {f.name: f for f in default_factors(Scenario(), profile, Ranges(prior_range=0.25))}
    assert list(FACTOR_GROUPS) == ["step_cost", "overheads", "kv_capacity", "start_spread", "workload"]
    f = factors["step_cost.per_token_s"]
    assert (f.low, f.high) == (0.75 * profile.step_cost.per_token_s, 1.25 * profile.step_cost.per_token_s)
    assert f.source == "±25 % (stated)"
    assert (factors["overheads.api_server_s"].low, factors["overheads.api_server_s"].high) == (0.1 * (1 - 0.25), 0.1 * 1.25)
    assert (factors["overheads.jitter_cv"].low, factors["overheads.jitter_cv"].high) == (0.0, 0.6)
    assert (factors["kv_capacity"].low, factors["kv_capacity"].high) == (0.9, 1.1)
    assert (factors["arrival_spread_s"].low, factors["arrival_spread_s"].high) == (0.0, 0.02)
    # a zero coefficient has no relative range and is left out
    assert "overheads.api_server_per_token_s" not in factors
    # the seed workload's fitted reply stop point, lognormal:90:1, and its 195-token user turns
    assert (factors["reply.median_tokens"].low, factors["reply.median_tokens"].high) == (0.7 * 90, 1.3 * 90)
    assert (factors["reply.cv"].low, factors["reply.cv"].high) == (0.25, 1.5)
    assert (factors["user_tokens.sd"].low, factors["user_tokens.sd"].high) == (0.0, 20.0)


def test_workload_factors_set_the_scenarios_lengths():
    profile = load_profile("a6000-qwen2.5-7b")
    factors = {f.name: f for f in default_factors(TOY, profile, groups=["workload"])}
    scenario, _ = factors["reply.median_tokens"].apply(TOY, profile, 70.0)
    scenario, _ = factors["reply.cv"].apply(scenario, profile, 0.5)
    scenario, _ = factors["user_tokens.sd"].apply(scenario, profile, 12.0)
    assert (scenario.reply, scenario.user) == ("lognormal:70:0.5", "normal:195:12")
    fixed = default_factors(replace(TOY, reply=128), profile, groups=["workload"])
    assert [f.name for f in fixed] == ["user_tokens.sd"]  # a fixed reply has no stop-point spread to vary


def test_measured_coefficients_take_their_bootstrap_range():
    profile = load_profile("a6000-qwen2.5-7b")
    samples = tuple((v, 0.1) for v in (1.0, 2.0, 3.0, 4.0, 5.0))
    profile = replace(profile, uncertainty=CoefficientUncertainty(
        ("step_cost.step_overhead_s", "overheads.jitter_cv"), samples, method="bootstrap"))
    factors = {f.name: f for f in default_factors(Scenario(), profile, Ranges(coverage=0.5))}
    f = factors["step_cost.step_overhead_s"]
    assert (f.low, f.high, f.source) == (2.0, 4.0, "bootstrap 50 %")
    # every sample has the same jitter CV: an empty range falls back to the stated one
    assert (factors["overheads.jitter_cv"].low, factors["overheads.jitter_cv"].high) == (0.0, 0.6)


def test_kv_capacity_factor_scales_the_blocks_and_the_shared_gpu_rule():
    profile = base_profile(Scenario())
    kv = next(f for f in default_factors(Scenario(), profile) if f.name == "kv_capacity")
    _, scaled = kv.apply(Scenario(), profile, 0.9)
    assert scaled.engine.num_gpu_blocks == round(0.9 * profile.engine.num_gpu_blocks)
    shared, shared_scaled = profile.shared(2), scaled.shared(2)
    assert shared_scaled.engine.num_gpu_blocks == pytest.approx(0.9 * shared.engine.num_gpu_blocks, rel=1e-3)
    assert profile.engine.num_gpu_blocks != scaled.engine.num_gpu_blocks  # the input is not mutated


def test_a_dominant_input_is_ranked_first():
    factors = [
        Factor("dominant_api_server_s", 0.0, 2.0, _set("overheads.api_server_s"), "s"),
        Factor("minor_gateway_s", 0.001, 0.0012, _set("overheads.gateway_s"), "s"),
        *[f for f in default_factors(TOY) if f.name in ("kv_capacity", "step_cost.per_request_s")],
    ]
    result = run_sensitivity(TOY, ["round_robin", "kv_aware"], factors=factors, trajectories=4, rounds=1,
                             noise_rounds=2, executor="sequential")
    for out in ("round_robin:time_to_complete_s", "kv_aware:later_ttft_mean_s", "round_robin:later_ttft_p90_s"):
        assert result.ranking(out)[0] == "dominant_api_server_s", out
    row = result.indices[(result.indices["output"] == "kv_aware:later_ttft_mean_s")
                         & (result.indices["factor"] == "dominant_api_server_s")].iloc[0]
    # later-turn TTFT carries the API-server time once: crossing 0..2 s adds about 2 s
    assert row["mu"] == pytest.approx(2.0, rel=0.15) and row["mu"] == row["mu_star"]
    assert result.indices.groupby("output")["rank"].apply(sorted).map(list).tolist() == [[1, 2, 3, 4]] * 12
    assert result.outputs == output_names(["round_robin", "kv_aware"])
    assert len(result.samples) == 4 * (len(factors) + 1)
    # a share's change is in percentage points, as compare gives it (it was a relative change, %)
    base = result.base
    assert base["kv_aware vs round_robin:hit_rate"] == pytest.approx(
        100 * (base["kv_aware:hit_rate"] - base["round_robin:hit_rate"]), rel=1e-9)


def test_same_seed_same_indices_on_every_executor():
    factors = [f for f in default_factors(TOY) if f.name in ("overheads.api_server_s", "overheads.jitter_cv",
                                                             "arrival_spread_s")]
    a = run_sensitivity(TOY, factors=factors, trajectories=2, noise_rounds=2, executor="sequential")
    b = run_sensitivity(TOY, factors=factors, trajectories=2, noise_rounds=2, executor="local", max_workers=2)
    assert a.indices.equals(b.indices) and a.samples.equals(b.samples)
    assert a.base == b.base


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="levels must be even"):
        run_sensitivity(TOY, levels=3)
    with pytest.raises(ValueError, match="at least two factors"):
        run_sensitivity(TOY, factors=default_factors(TOY)[:1])
    with pytest.raises(ValueError, match="unknown factor group"):
        default_factors(TOY, groups=["nope"])
    with pytest.raises(ValueError, match="finite low < high"):
        Factor("x", 1.0, 1.0, _set("overheads.gateway_s"))
    with pytest.raises(ValueError, match="kv_range"):
        Ranges(kv_range=1.5)


@pytest.mark.parametrize("groups, message", [
    (",", "Invalid value for '--groups': names no factor group (','); valid groups: step_cost, overheads, "
          "kv_capacity, start_spread, workload"),
    ("start_spread", "Invalid value for '--groups': start_spread: 1 factor(s) to vary here; Morris screening needs "
                     "at least two (add a group)"),
])
def test_cli_groups_that_give_fewer_than_two_factors_name_the_option(groups, message):
    result = CliRunner().invoke(cli, ["sensitivity", "--chats", "2", "--turns", "1", "--trajectories", "2",
                                      "--rounds", "1", "--noise-rounds", "1", "--groups", groups])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_cli_writes_the_table_json_and_tornado(tmp_path):
    out = tmp_path / "sens"
    result = CliRunner().invoke(cli, ["sensitivity", "--chats", "6", "--turns", "2", "--workers", "2",
                                      "--trajectories", "2", "--rounds", "1", "--noise-rounds", "2",
                                      "--groups", "overheads,start_spread", "--executor", "sequential",
                                      "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "overheads.api_server_s" in result.output and "kv_aware vs round_robin (change: %, pp for a share)" in result.output
    assert "hit rate change pp" in result.output
    assert ("~ mixed signs; ? within the seeds' noise: mu* less its 95% interval (mu* - conf) is at most the seeds' "
            "sd, the tornado's dashed line (its bar hatched, its whisker reaching the line). Seed sd: 2 seeds of the "
            "unperturbed scenario.") in result.output
    doc = json.loads((out / "sensitivity.json").read_text())
    assert [f["name"] for f in doc["factors"]] == ["overheads.api_server_s", "overheads.gateway_s",
                                                   "overheads.jitter_cv", "arrival_spread_s"]
    assert (out / "tornado.png").stat().st_size > 0
    # the tables' ? per row, in the JSON and indices.csv: the one rule's verdict on each row's numbers
    from kvroute.sim.study.sensitivity import within_noise

    for row in doc["indices"]:
        want = within_noise(*(math.nan if row[k] is None else row[k] for k in ("mu_star", "mu_star_conf")),
                            math.nan if doc["noise_sd"][row["output"]] is None else doc["noise_sd"][row["output"]])
        assert row["within_noise"] is want, row
    import pandas as pd

    csv = pd.read_csv(out / "indices.csv")
    assert csv["within_noise"].tolist() == [row["within_noise"] for row in doc["indices"]]
    bad = CliRunner().invoke(cli, ["sensitivity", "--spread-range", "0.1:0"])
    assert bad.exit_code != 0 and "Invalid value for '--spread-range': LOW must be below HIGH, got '0.1:0'" in bad.output


@pytest.mark.parametrize("args, low, high", [
    ((), 0.0, 0.02),  # the default 5 ms spread: a burst
    (("--arrival-spread", "3"), 2.4, 3.6),  # the scenario's own spread +- --prior-range 0.2 of it
    (("--arrival-spread", "3", "--spread-range", "1:5"), 1.0, 5.0),
])
def test_the_start_spread_varies_around_the_scenarios_own(args, low, high):
    result = CliRunner().invoke(cli, ["sensitivity", "--chats", "4", "--turns", "2", "--workers", "2",
                                      "--trajectories", "2", "--rounds", "1", "--noise-rounds", "2",
                                      "--groups", "overheads,start_spread", "--executor", "sequential", "--json",
                                      *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    spread = next(f for f in doc["factors"] if f["name"] == "arrival_spread_s")
    assert (spread["low"], spread["high"]) == pytest.approx((low, high))


def test_a_workload_config_is_ranked_without_the_generated_workloads_factors(tmp_path):
    """``sensitivity --workload-config`` built seed-chat's reply factors and failed on them:
    "--reply-tokens does not apply with --workload-config", an option never given."""
    from kvroute.sim.study.scenario import Scenario
    from kvroute.sim.study.sensitivity import workload_factors
    from tests.support.workloads import SMALL_LADDER

    config = tmp_path / "ladder.yaml"
    config.write_text(SMALL_LADDER)
    assert workload_factors(Scenario(workload_config=str(config)), None, None) == []
    base = ["sensitivity", "--workload-config", str(config), "--workers", "2", "--trajectories", "2", "--rounds",
            "1", "--noise-rounds", "2", "--executor", "sequential", "--json"]
    result = CliRunner().invoke(cli, base + ["--policies", "round_robin,kv_aware"], catch_exceptions=False)
    assert result.exit_code == 0, result.output  # every group but the workload's
    doc = json.loads(result.output[result.output.index("{"):])
    assert doc["factors"] and not any(f["name"].startswith(("reply.", "user_tokens.")) for f in doc["factors"])
    bad = CliRunner().invoke(cli, base + ["--groups", "workload"])
    assert bad.exit_code == 2 and "a --workload-config's are given (leave it out)" in bad.output
