"""``kvroute simulate|compare --workload-config``: the per-stage table printed, in ``--json`` and
written with ``--out`` (``stages.csv``: one row per stage and policy)."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from kvroute.cli.main import cli
from tests.support.workloads import SMALL_LADDER


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_compare_prints_and_writes_one_row_per_stage_and_policy(tmp_path):
    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    out = tmp_path / "run"
    result = _run("compare", "--workload-config", config, "--policies", "round_robin,kv_aware", "--rounds", 2,
                  "--executor", "sequential", "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    assert "trace inference-perf:ip.yaml: 28 requests" in result.output  # 4 x 3 + 8 x 2
    assert "per stage (inference-perf's counting" in result.output
    table = pd.read_csv(out / "stages.csv")
    assert table[["stage", "policy"]].values.tolist() == [[0, "round_robin"], [0, "kv_aware"], [1, "round_robin"],
                                                         [1, "kv_aware"]]
    assert table["requests"].tolist() == [12, 12, 16, 16] and table["rate"].tolist() == [4, 4, 8, 8]
    assert (table["rounds"] == 2).all() and (table["failed"] == 0).all()
    doc = json.loads((out / "stages.json").read_text())
    assert len(doc["stages"]) == 4 and len(doc["stage_rounds"]) == 8
    assert (out / "stages.png").stat().st_size > 0


def test_simulate_json_has_the_stages_and_a_timeout_fails_requests(tmp_path):
    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    result = _run("simulate", "--workload-config", config, "--json", "--request-timeout", "0.05",
                  "--max-concurrency", 2)
    assert result.exit_code == 0, result.output
    stages = json.loads(result.output)["stages"]
    assert [s["requests"] for s in stages] == [12, 16]
    # every request times out: the profile's API server alone takes 100 ms
    assert all(s["timed_out"] == s["failed"] == s["requests"] for s in stages)


def test_a_trace_without_stages_has_no_stage_table():
    result = _run("simulate", "--chats", 2, "--turns", 1, "--quiet")
    assert result.exit_code == 0 and "per stage" not in result.output


def test_a_misspelt_key_is_an_error_naming_file_line_and_the_key_meant(tmp_path):
    """The reported typo: ``system_promt_len`` left system_prompt_len at its default (100 tokens)
    and the run went on; inference-perf 0.7.0 refuses such a file, and so does kvroute."""
    from tests.support.paths import INFERENCE_PERF_CONFIGS

    config = tmp_path / "ip2.yaml"
    config.write_text((INFERENCE_PERF_CONFIGS / "llm-d-37-capacity.yaml").read_text()
                      .replace("system_prompt_len", "system_promt_len"))
    result = _run("compare", "--workload-config", config, "--rounds", 1, "--quiet")
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {config}:44: field 'data.shared_prefix.system_promt_len': unknown key (inference-perf 0.7.0 "
        "refuses it too); did you mean 'system_prompt_len'?")


def test_a_note_says_when_the_configs_run_served_another_model(tmp_path):
    """``server.model_name`` names the model the config's run served; the times are the profile's
    model's, so a note says so when the two differ (by name, without organisation or case)."""
    config = tmp_path / "ip.yaml"
    args = ("simulate", "--workload-config", config, "--quiet")
    config.write_text(SMALL_LADDER + "server:\n  model_name: meta-llama/Llama-3.1-70B-Instruct\n")
    other = _run(*args)
    assert other.exit_code == 0, other.output
    assert ("Note: the workload config's run served meta-llama/Llama-3.1-70B-Instruct; the times here are those of "
            "the profile's model, Qwen/Qwen2.5-7B-Instruct (a6000-qwen2.5-7b). To simulate "
            "meta-llama/Llama-3.1-70B-Instruct: `kvroute profiles derive --model meta-llama/Llama-3.1-70B-Instruct "
            "--gpu GPU --tp N`, then --profile FILE.") in other.output
    config.write_text(SMALL_LADDER + "server:\n  model_name: qwen2.5-7b-instruct\n")
    assert "workload config's run served" not in _run(*args).output
    config.write_text(SMALL_LADDER)
    assert "workload config's run served" not in _run(*args).output


def test_a_sweep_of_a_workload_config_writes_parquet_with_its_path_as_text(tmp_path):
    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    out = tmp_path / "grid.parquet"
    result = _run("sweep", "--workload-config", config, "--policies", "round_robin", "--workers", "2,3",
                  "--rounds", 1, "--executor", "sequential", "--no-progress", "--out", out)
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out)
    assert table["workers"].tolist() == [2, 3]
    assert table["workload_config"].tolist() == [str(config)] * 2
    assert table["num_requests"].tolist() == [28, 28] and table["failed"].tolist() == [0, 0]
