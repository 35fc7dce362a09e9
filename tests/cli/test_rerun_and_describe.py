"""A saved scenario re-runs as printed; output-only flags need --out; the scenario line counts TP GPUs."""

from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.cli.scenario import describe
from kvroute.sim.study.scenario import Scenario
from kvroute.sim.timing.priors import derive_profile
from kvroute.sim.timing.profile import profile_from_dict


def _run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_the_rerun_command_of_a_time_series_run_works_as_written(tmp_path):
    out = tmp_path / "run"
    first = _run("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--out", str(out), "--time-series")
    assert first.exit_code == 0, first.output
    saved = (out / "scenario.yaml").read_text()
    assert f"compare --config {out / 'scenario.yaml'} re-runs this scenario" in saved
    assert "time" + "_series" not in saved.split("kvroute:")[0] and "time-series" not in saved.split("kvroute:")[0]
    again = _run("compare", "--config", str(out / "scenario.yaml"))
    assert again.exit_code == 0, again.output


def test_figure_format_without_out_is_an_error_naming_out():
    for args in (("compare", "--figure-format", "svg"), ("sweep", "--workers", "2,4", "--figure-format", "svg")):
        result = CliRunner().invoke(cli, list(args))
        assert result.exit_code == 2
        assert "--figure-format" in result.output and "--out" in result.output


def test_the_scenario_line_counts_the_gpus_of_tensor_parallel_workers():
    profile = profile_from_dict(derive_profile("H100-SXM", "llama-3.1-70b", tp=4))
    scenario = Scenario(chats=2, turns=1, workers=4)
    line = describe(scenario.trace(), scenario.spec(profile))
    assert "4 workers on 4 TP4 groups (16 GPUs)" in line
    assert "4 workers on 4 GPUs" in describe(scenario.trace(), scenario.spec())
