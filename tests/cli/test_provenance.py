"""Scenario files: every --out holds the resolved scenario and provenance; --config re-runs it."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.cli.provenance import canonical_sha256
from kvroute.sim.timing.profile import load_profile

SMALL = ["--chats", "4", "--turns", "2", "--workers", "2", "--policies", "round_robin,kv_aware"]


def _invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def test_saved_scenario_reruns_to_identical_records(tmp_path):
    _invoke("compare", *SMALL, "--rounds", "2", "--think-time", "uniform:0:1", "--seed", "5", "--out", tmp_path / "a")
    doc = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())
    assert doc["rounds"] == 2 and doc["seed"] == 5 and doc["think-time"] == "uniform:0:1"
    assert doc["workers"] == 2 and doc["slo-ttft"] == 2.0 and "out" not in doc   # defaults resolved too
    meta = doc["kvroute"]
    assert meta["seeds"] == [5, 6] and meta["command"].endswith("compare")
    assert meta["profile"]["sha256"] == canonical_sha256(load_profile("a6000-qwen2.5-7b").raw)
    assert set(meta["trace"]["generated_records_sha256"]) == {5, 6}
    _invoke("compare", "--config", tmp_path / "a" / "scenario.yaml", "--out", tmp_path / "b")
    a = pd.read_parquet(tmp_path / "a" / "records.parquet")
    b = pd.read_parquet(tmp_path / "b" / "records.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 2 * 2 * 8
    again = yaml.safe_load((tmp_path / "b" / "scenario.yaml").read_text())
    assert {k: v for k, v in again.items() if k != "kvroute"} == {k: v for k, v in doc.items() if k != "kvroute"}
    assert again["kvroute"]["trace"] == meta["trace"]


def test_trace_file_hash_and_flags_override_the_config(tmp_path):
    trace = tmp_path / "t.jsonl"
    _invoke("trace", "generate", "seed-chat", "--chats", "3", "--turns", "2", "--out", trace)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"trace": str(trace), "workers": 2, "rounds": 2, "policy": "round_robin"}))
    _invoke("simulate", "--config", config, "--rounds", "1", "--out", tmp_path / "o")
    doc = yaml.safe_load((tmp_path / "o" / "scenario.yaml").read_text())
    assert doc["rounds"] == 1                       # the flag wins
    assert doc["workers"] == 2 and doc["trace"] == str(trace.resolve())
    assert doc["kvroute"]["trace"]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()


def test_config_errors_name_the_file_and_option(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("workerz: 2\n")
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
    assert result.exit_code == 2 and "unknown option 'workerz' for compare (did you mean 'workers'?)" in \
        " ".join(result.output.split())
    valid = result.output.split("valid: ")[1].replace("\n", " ").split(", ")
    assert "reply-tokens" in valid and "reply" not in valid and "user" not in valid  # long names only
    bad.write_text("chats: 4\nworkers: 0\n")   # checked like the flag, and named with its file and line
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: option 'workers': must be >= 1, got 0" in result.output
    bad.write_text("chats: 4\nworkload: agnet\n")
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: option 'workload': 'agnet' is not one of" in result.output
    bad.with_suffix(".json").write_text('{"workers": "eight"}')
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad.with_suffix(".json"))])
    assert result.exit_code == 2 and f"{bad.with_suffix('.json')}: option 'workers': 'eight' is not a valid integer" \
        in result.output
    bad.write_text("workers: [1\n")
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
    assert result.exit_code == 2 and "not valid YAML" in result.output and str(bad) in result.output
    bad.write_text("chats: 4\npolicies: [round_robin, kv_awre]\n")  # checked at the file's line, not later
    result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: option 'policies': unknown policy 'kv_awre' (did you mean " \
        "'kv_aware'?)" in result.output
    for value, shown in (("5", "5"), ("[round_robin, null]", "None"), ("{a: 1}", "{'a': 1}")):
        bad.write_text(f"chats: 4\npolicies: {value}\n")
        result = CliRunner().invoke(cli, ["compare", "--config", str(bad)])
        assert result.exit_code == 2 and f"{bad}:2: option 'policies': expected policy names (a comma list, or a " \
            f"list of names), got {shown}" in result.output, result.output


def test_a_yaml_list_of_policies_runs_as_the_comma_list(tmp_path):
    """``policies: [a, b]`` used to reach the command as the text "['a', 'b']"."""
    listed, text = tmp_path / "list.yaml", tmp_path / "text.yaml"
    listed.write_text("chats: 4\nturns: 2\nworkers: 2\nrounds: 1\npolicies:\n  - round_robin\n"
                      "  - dynamo:overlap_weight=2,temperature=0.5\n")
    text.write_text("chats: 4\nturns: 2\nworkers: 2\nrounds: 1\npolicies: round_robin,dynamo:overlap_weight=2,"
                    "temperature=0.5\n")
    a = _invoke("compare", "--config", listed, "--out", tmp_path / "a")
    b = _invoke("compare", "--config", text, "--out", tmp_path / "b")
    assert a.output.replace(str(tmp_path / "a"), "OUT") == b.output.replace(str(tmp_path / "b"), "OUT")
    assert "dynamo:overlap_weight=2,temperature=0.5" in a.output
    saved = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())
    assert saved["policies"] == "round_robin,dynamo:overlap_weight=2,temperature=0.5"


def test_sweep_writes_its_scenario_beside_the_rows(tmp_path):
    out = tmp_path / "grid.csv"
    _invoke("sweep", "--chats", "2", "--turns", "2", "--workers", "1,2", "--policies", "round_robin", "--rounds", "1",
            "--executor", "sequential", "--no-progress", "--out", out)
    doc = yaml.safe_load((tmp_path / "grid.scenario.yaml").read_text())
    assert doc["workers"] == "1,2" and doc["kvroute"]["seeds"] == [0]
    assert set(doc["kvroute"]["profile_sha256"]) == {"a6000-qwen2.5-7b"}
    result = _invoke("sweep", "--config", tmp_path / "grid.scenario.yaml", "--out", tmp_path / "again.csv")
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(tmp_path / "again.csv"))
    # the footer says what a clipped interval looks like, as compare's does
    assert "± is the 95% interval over rounds ([low, high] where clipped to possible values)" in result.output


def test_rerun_warns_when_the_trace_file_changed(tmp_path):
    trace = tmp_path / "t.jsonl"
    _invoke("trace", "generate", "seed-chat", "--chats", "3", "--turns", "2", "--out", trace)
    _invoke("simulate", "--trace", trace, "--workers", "1", "--out", tmp_path / "a")
    same = _invoke("simulate", "--config", tmp_path / "a" / "scenario.yaml", "--out", tmp_path / "b")
    assert "warning" not in same.output
    _invoke("trace", "generate", "seed-chat", "--chats", "2", "--turns", "2", "--out", trace)
    changed = _invoke("simulate", "--config", tmp_path / "a" / "scenario.yaml", "--out", tmp_path / "c")
    assert "warning: the trace file (sha256" in changed.output and "numbers may differ" in changed.output


def test_a_compare_scenario_runs_under_sweep_as_one_grid_point(tmp_path):
    """compare saved a (low, high) range as a YAML list, which sweep reads as two grid values, and
    sweep refused compare's own options: now the range is "low-high" and those are left out, with a
    warning naming the file and line for one that is not at its default."""
    _invoke("compare", "--workload", "agent", "--history", "16000-32000", "--chats", "2", "--turns", "2",
            "--workers", "2", "--rounds", "1", "--policies", "round_robin", "--prior-range", "0.3",
            "--out", tmp_path / "c")
    doc = yaml.safe_load((tmp_path / "c" / "scenario.yaml").read_text())
    assert doc["history"] == "16000-32000" and "records-format" not in doc  # an output option, not saved
    again = _invoke("compare", "--config", tmp_path / "c" / "scenario.yaml", "--out", tmp_path / "d")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "c" / "records.parquet"),
                                  pd.read_parquet(tmp_path / "d" / "records.parquet"))
    assert "warning" not in again.output
    swept = _invoke("sweep", "--config", tmp_path / "c" / "scenario.yaml", "--executor", "sequential",
                    "--out", tmp_path / "s.csv")
    lines = (tmp_path / "c" / "scenario.yaml").read_text().splitlines()
    at = {key: 1 + next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
          for key in ("uncertainty", "prior-range")}
    warned = [line for line in swept.output.splitlines() if line.startswith("warning:")]
    assert warned == [f"warning: {tmp_path / 'c' / 'scenario.yaml'}:{at['prior-range']}: 'prior-range' is an option of "
                      "compare, not of sweep; sweep runs the scenario without it"]  # uncertainty: at its default 0
    rows = pd.read_csv(tmp_path / "s.csv")
    assert rows["history"].tolist() == ["16000-32000"]
    assert rows["time_to_complete_s"].iloc[0] == pytest.approx(
        json.loads((tmp_path / "c" / "compare.json").read_text())["policies"]["round_robin"]["time_to_complete_s"]["mean"])


def test_display_options_are_not_saved_but_an_earlier_files_copy_still_runs(tmp_path):
    """sweep saved --show and --no-progress, compare --records-format, as scenario values: they
    are no longer saved, and a file that has them still runs (a warning when one is not the
    default: --config no longer sets it)."""
    out = tmp_path / "grid.csv"
    _invoke("sweep", "--chats", "2", "--turns", "2", "--workers", "1,2", "--policies", "round_robin", "--rounds", "1",
            "--executor", "sequential", "--no-progress", "--show", "hit_rate", "--out", out)
    doc = yaml.safe_load((tmp_path / "grid.scenario.yaml").read_text())
    assert not {"show", "no-progress", "quiet"} & set(doc)
    old = tmp_path / "old.yaml"
    old.write_text("chats: 2\nturns: 2\nworkers: 1,2\npolicies: round_robin\nrounds: 1\nexecutor: sequential\n"
                   "show: time_to_complete_s,later_ttft_mean_s,later_ttft_p90_s,hit_rate\nno-progress: true\n")
    result = _invoke("sweep", "--config", old, "--out", tmp_path / "again.csv")
    assert f"warning: {old}:8: 'no-progress' is no longer a scenario value and --config leaves it out: give " \
           "--no-progress on the command line" in result.output
    assert "'show'" not in result.output  # the default: nothing to say
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(tmp_path / "again.csv"))
    compare = tmp_path / "compare.yaml"
    compare.write_text("chats: 2\nturns: 2\nrounds: 1\npolicies: round_robin\nrecords-format: csv\n")
    result = _invoke("compare", "--config", compare)
    assert f"warning: {compare}:5: 'records-format' is no longer a scenario value" in result.output


def test_a_sweep_prints_and_reports_the_notes_compare_gives_about_its_profile(tmp_path):
    """A sweep showed no caveat at all where compare, on the same settings, said the profile is a
    derived prior without front-end terms."""
    result = _invoke("sweep", "--chats", "2", "--turns", "2", "--workers", "1,2", "--policies", "round_robin",
                     "--rounds", "1", "--executor", "sequential", "--out", tmp_path / "g.csv")
    derived = ("Note: a6000-qwen2.5-7b is a derived prior, not a measurement: absolute times rest on its stated step "
               "costs and API-server time (100 ms). `kvroute compare --uncertainty 10` on one point adds their share "
               "to its intervals; `kvroute sensitivity` ranks them.")
    assert derived in result.output
    assert "Note: a6000-qwen2.5-7b has no front-end terms: vLLM's API process and the host's CPU are taken as " \
           "unlimited" in result.output
    assert "a6000-qwen2.5-7b is a derived prior, not a measurement" in (tmp_path / "g.report.html").read_text()


def test_a_list_of_two_cores_is_recorded_as_the_cores_not_a_range():
    """``--client-cores 0,2`` means cores 0 and 2; "0-2" would read back as 0, 1 and 2."""
    import os

    import click

    from kvroute.cli.provenance import resolved_options
    from kvroute.cli.values import Cores, Number
    from kvroute.traces.inputs import SECONDS

    @click.command()
    @click.option("--client-cores", type=Cores(), default=None)
    @click.option("--arrival-spread", type=Number(SECONDS), default=None)
    @click.option("--history", type=(int, int), default=(2, 5))
    def command(client_cores, arrival_spread, history):
        click.echo(json.dumps(resolved_options(click.get_current_context())))

    result = CliRunner().invoke(command, ["--client-cores", "0,1" if len(os.sched_getaffinity(0)) < 3 else "0,2"])
    recorded = json.loads(result.output)
    assert recorded["client-cores"] in ([0, 1], [0, 2]) and recorded["history"] == "2-5"
