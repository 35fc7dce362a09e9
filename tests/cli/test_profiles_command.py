"""``kvroute profiles`` lists every shipped profile on one line."""

from __future__ import annotations

from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.timing.profile import shipped_profiles



def test_profiles_one_line_each_with_source_hardware_model_blocks():
    result = CliRunner().invoke(cli, ["profiles"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == shipped_profiles()
    by_name = {line.split()[0]: line for line in lines}
    assert by_name["a6000-qwen2.5-7b"].split()[1:4] == ["derived", "NVIDIA", "RTX"]
    assert "Qwen/Qwen2.5-7B-Instruct" in by_name["a6000-qwen2.5-7b"]
    assert by_name["a6000-qwen2.5-7b"].endswith("32,817 KV blocks of 16 tokens")
    assert by_name["cpu-tiny-qwen2"].split()[1] == "measured"
    assert by_name["cpu-tiny-qwen2"].endswith("65,536 KV blocks of 32 tokens")


def test_profiles_columns_line_up_whatever_the_name_length():
    lines = CliRunner().invoke(cli, ["profiles"]).output.splitlines()
    starts = {line.index(" measured ") if " measured " in line else line.index(" derived ") for line in lines}
    assert len(starts) == 1, lines
