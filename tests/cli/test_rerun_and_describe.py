"""A saved scenario re-runs as printed; output-only flags need --out, and a saved scenario names
those its run was given; the scenario line counts TP GPUs."""

import shlex

import pandas as pd
import yaml
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
    assert not {"time_series", "time-series"} & set(yaml.safe_load(saved))  # not a value (the header names it)
    again = _run("compare", "--config", str(out / "scenario.yaml"))
    assert again.exit_code == 0, again.output


def test_a_saved_scenario_names_the_output_flags_of_its_run_and_that_command_writes_the_same_files(tmp_path):
    """Output options stay out of the scenario's values (the test above), so the header names them
    and the ``kvroute`` block records them: the printed command writes the same files again."""
    a, b = tmp_path / "a", tmp_path / "b"
    small = ("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin")
    first = _run(*small, "--out", str(a), "--time-series", "--figure-format", "png,svg")
    assert first.exit_code == 0, first.output
    saved = (a / "scenario.yaml").read_text()
    scenario = a / "scenario.yaml"
    lines = saved.splitlines()
    assert lines[1] == ("# Output options are not scenario values and --config does not set them: this run also had "
                        "--figure-format png,svg --time-series;")
    assert lines[2] == (f"# to write the same files again: cli compare --config {scenario} --out DIR "
                        "--figure-format png,svg --time-series")
    doc = yaml.safe_load(saved)
    assert doc["kvroute"]["outputs"] == {"figure-format": ["png", "svg"], "time-series": True,
                                         "records-format": "parquet"}
    assert not {"time-series", "figure-format", "records-format"} & set(doc)
    args = shlex.split(lines[2].split(": ", 1)[1])[2:]  # after "cli compare"
    again = _run("compare", *[str(b) if arg == "DIR" else arg for arg in args])
    assert again.exit_code == 0, again.output
    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    assert {"timeseries.parquet", "tokens.parquet", "timeseries-round_robin.png", "timeseries-round_robin.svg",
            "ttft.svg"} <= set(names)
    for name in ("records.parquet", "timeseries.parquet", "tokens.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(a / name), pd.read_parquet(b / name))


def test_a_run_without_output_flags_has_no_rerun_line_for_them(tmp_path):
    out = tmp_path / "run"
    assert _run("simulate", "--chats", "2", "--turns", "1", "--out", str(out)).exit_code == 0
    saved = (out / "scenario.yaml").read_text()
    assert [line for line in saved.splitlines() if line.startswith("#")] == [
        f"# cli simulate --config {out / 'scenario.yaml'} re-runs this scenario; command-line flags override these "
        "values.",
        "# The 'kvroute' block records what produced the outputs; --config ignores it.",
    ]
    assert yaml.safe_load(saved)["kvroute"]["outputs"] == {"figure-format": ["png"], "time-series": False,
                                                           "records-format": "parquet"}


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


def test_the_scenario_line_names_cpu_devices_for_a_profile_measured_on_vllms_cpu_backend():
    """A CPU profile's header read "2 workers on 2 GPUs"."""
    from kvroute.sim.timing.profile import load_profile

    scenario = Scenario(chats=2, turns=1, workers=2)
    assert " | 2 workers on 2 CPU devices | " in describe(scenario.trace(), scenario.spec(load_profile("cpu-tiny-qwen2-x2")))
    one = Scenario(chats=2, turns=1, workers=1)
    assert " | 1 worker on 1 CPU device | " in describe(one.trace(), one.spec(load_profile("cpu-tiny-qwen2")))


def test_a_sweep_rerun_from_its_scenario_leaves_the_first_runs_load_curve_alone(tmp_path):
    """``--plot-load``'s path is an output, not a scenario value: kept, ``--config`` would draw the
    re-run over the first run's figure. The header prints it as FILE.svg; a file that still has
    the key is refused with the reason."""
    first_out, load = tmp_path / "a.csv", tmp_path / "load.svg"
    small = ("sweep", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin",
             "--request-rate", "1,2", "--executor", "sequential")
    first = _run(*small, "--out", str(first_out), "--plot-load", str(load))
    assert first.exit_code == 0, first.output
    scenario = tmp_path / "a.scenario.yaml"
    saved = scenario.read_text()
    doc = yaml.safe_load(saved)
    assert "plot-load" not in doc and doc["kvroute"]["outputs"]["plot-load"] == str(load.resolve())
    assert saved.splitlines()[2] == (f"# to write the same files again: cli sweep --config {scenario} --out FILE "
                                     "--plot-load FILE.svg")
    before = load.read_bytes()
    load.write_bytes(b"the first run's figure")
    again = _run("sweep", "--config", str(scenario), "--out", str(tmp_path / "b.csv"))
    assert again.exit_code == 0, again.output
    assert load.read_bytes() == b"the first run's figure" and before.startswith(b"<?xml")
    old = tmp_path / "old.yaml"
    old.write_text(saved.split("# The 'kvroute' block", 1)[0] + f"plot-load: {load}\n")
    refused = CliRunner().invoke(cli, ["sweep", "--config", str(old)])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines()[-1] == (
        f"Error: Invalid value for '--config': {old}:4: 'plot-load' says where sweep writes or what it shows, not "
        "what it runs: give --plot-load on the command line")
