"""``kvroute profiles`` lists every shipped profile on one line."""

from __future__ import annotations

import pytest
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


def test_profiles_list_is_profiles():
    runner = CliRunner()
    assert runner.invoke(cli, ["profiles", "list"]).output == runner.invoke(cli, ["profiles"]).output


def test_derive_writes_a_profile_compare_accepts(tmp_path):
    from kvroute.sim.timing.profile import load_profile

    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                      "--tp", "4", "--vllm-version", "0.11", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "KV blocks per worker         29,503 of 16 tokens" in result.output
    assert "vLLM                         0.11: block size 16, gpu_memory_utilization 0.9, async scheduling off" in result.output
    for batch in (1, 16, 64):
        assert f"decode step, batch {batch}" in result.output
    assert "prefill per token" in result.output
    profile = load_profile(out)
    assert profile.name == "h100-80gb-llama-3.1-70b-tp4" and profile.engine.num_gpu_blocks == 29_503
    assert (profile.vllm_version, profile.async_scheduling) == ("0.11", False)


def test_derive_takes_the_newest_releases_defaults_unless_told(tmp_path):
    """vLLM 0.34: block 64, memory 1.0 (the extensible KV cache), async on; issue 33, item 2."""
    from kvroute.sim.timing.profile import load_profile

    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                      "--tp", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "KV blocks per worker         8,802 of 64 tokens (563,328 tokens)" in result.output
    assert "vLLM                         0.34.0: block size 64, gpu_memory_utilization 1, async scheduling on" in result.output
    profile = load_profile(out)
    assert (profile.vllm_version, profile.async_scheduling, profile.gpu_memory_utilization) == ("0.34.0", True, 1.0)
    assert profile.engine.block_size == 64 and profile.engine.async_scheduling is True
    assert profile.name == "h100-80gb-llama-3.1-70b-tp4-vllm0.34"  # not the name of a 0.11 prior


def test_derive_takes_a_block_size_memory_share_and_length_and_names_them(tmp_path):
    """The llm-d 37-capacity setting: vLLM 0.11 with 64-token blocks (the precise scorer's
    blockSize) gives bench/published/REPORT.md's 7,375 blocks; a share of 0.85 of 1.0's memory."""
    from kvroute.sim.timing.profile import load_profile

    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                      "--tp", "4", "--vllm-version", "0.11", "--block-size", "64", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "KV blocks per worker         7,375 of 64 tokens (472,000 tokens)" in result.output
    profile = load_profile(out)
    assert profile.engine.block_size == 64 and profile.name == "h100-80gb-llama-3.1-70b-tp4-block64"
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                      "--tp", "4", "--gpu-memory-utilization", "0.85", "--out", str(out)])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.gpu_memory_utilization == 0.85 and profile.name == "h100-80gb-llama-3.1-70b-tp4-vllm0.34-mem0.85"
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                      "--tp", "4", "--max-model-len", "16384", "--out", str(out)])
    assert result.exit_code == 0, result.output  # two lengths wrote one file name
    assert load_profile(out).name == "h100-80gb-llama-3.1-70b-tp4-vllm0.34-len16384"
    bad = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-70B",
                                   "--block-size", "0", "--out", str(out)])
    assert bad.exit_code == 2 and "--block-size" in bad.output


@pytest.mark.parametrize("version, message", [
    ("0.9", "0.9 is outside the releases read, 0.11.0 to 0.34.0"),
    ("latest", "a release such as 0.11 or 0.34.0, got 'latest'"),
])
def test_derive_refuses_a_release_not_read(version, message):
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "qwen3-32b",
                                      "--vllm-version", version])
    assert result.exit_code == 2 and message in result.output and "--vllm-version" in result.output


@pytest.mark.parametrize("args, flag", [
    (["--gpu", "V100", "--model", "qwen3-32b"], "--gpu"),
    (["--gpu", "H100-SXM", "--model", "nope"], "--model"),
    (["--gpu", "H100-SXM", "--model", "qwen3-32b", "--tp", "3"], "--tp"),
    (["--gpu", "H100-SXM", "--model", "qwen3-32b", "--tp", "0"], "--tp"),
    (["--gpu", "H100-SXM", "--model", "qwen3-32b", "--dtype", "int4"], "--dtype"),
    (["--gpu", "H100-SXM", "--model", "qwen3-32b", "--kv-cache-dtype", "fp16"], "--kv-cache-dtype"),
])
def test_derive_bad_values_name_the_flag(args, flag, tmp_path):
    result = CliRunner().invoke(cli, ["profiles", "derive", *args, "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{flag}'" in errors[0], result.output


def test_derive_bad_config_file_names_file_and_field(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"hidden_size": 4096}')
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", str(cfg)])
    assert result.exit_code == 2
    assert f"Invalid value for '--model': {cfg}: field 'intermediate_size'" in result.output


def test_derive_too_small_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "llama-3.1-70b",
                                      "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and result.output.startswith("Error: no KV cache fits"), result.output


def test_derive_names_a_block_larger_than_the_kv_memory(tmp_path):
    result = CliRunner().invoke(cli, ["profiles", "derive", "--gpu", "H100-SXM", "--model", "Llama-3.1-8B",
                                      "--block-size", "1000000", "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 1 and not (tmp_path / "x.json").exists()
    assert result.output == (
        "Error: no KV cache fits: one KV block takes 131,072,000,000 bytes (122.1 GiB), and the memory left for the "
        "KV cache, 61.7 GiB (79.6 GiB at utilisation 1.0 minus weights 15.0 GiB, activations 1.5 GiB, non-torch "
        "memory 0.5 GiB and CUDA graphs 1.0 GiB), holds 0 of them; at least 2 are needed (vLLM keeps one as its null block) (a smaller --block-size, or fewer bytes "
        "per block: more GPUs with --tp, fp8 with --kv-cache-dtype)\n")


def test_memory_model_tells_a_too_large_block_from_too_little_memory():
    from dataclasses import replace

    from kvroute.sim.timing.profile import KVBlockTooLarge, MemoryModel

    model = MemoryModel(gpu_memory_bytes=10 * 2**30, weight_bytes=6 * 2**30, activation_peak_bytes=2**30,
                        non_torch_bytes=0, kv_bytes_per_block=2 * 2**30)
    with pytest.raises(KVBlockTooLarge, match=r"one KV block takes 2,147,483,648 bytes \(2\.0 GiB\), and the "
                                              r"memory left for the KV cache, 3\.0 GiB \(10\.0 GiB .*holds 1 of them"):
        model.num_gpu_blocks(1.0)
    assert replace(model, kv_bytes_per_block=2**30).num_gpu_blocks(1.0) == 3
    with pytest.raises(ValueError, match=r"^no KV cache fits: 5\.0 GiB at utilisation 0\.5 minus weights 6\.0 GiB") as info:
        model.num_gpu_blocks(0.5)
    assert not isinstance(info.value, KVBlockTooLarge)


def test_derive_help_lists_every_release_read_from_the_version_rules():
    from kvroute.cli.profiles_command import derive_command
    from kvroute.sim.timing.vllm_versions import release_groups

    assert [(first, last) for first, last, _ in release_groups()] == [
        ("0.11", "0.13"), ("0.14", "0.19"), ("0.20", "0.20"), ("0.21", "0.33"), ("0.34", "0.34")]
    helps = {p.name: p.help for p in derive_command.params}
    assert helps["vllm_version"] == (
        "The vLLM release whose defaults the prior takes: 0.11-0.13 (block 16, memory 0.9, sync scheduling), "
        "0.14-0.19 (16, 0.9, async), 0.20 (16, 0.92, async), 0.21-0.33 (16, 0.92, async, CUDA graphs' memory set "
        "aside), 0.34 (64, 1.0, async, CUDA graphs' memory set aside); the seed study ran 0.11 "
        "[default: the newest release read, 0.34.0].")
    assert "[default: the release's, 16; 64 from 0.34]" in helps["block_size"]
    assert "[default: the release's, 0.9; 0.92 from 0.20; 1.0 from 0.34]" in helps["gpu_memory_utilization"]
