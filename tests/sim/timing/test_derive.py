"""Profiles for any GPU and model with tensor parallelism (sim/timing/specs.py, priors.derive_profile):
per-rank bytes worked out by hand, the spec tables, and config.json errors."""

from __future__ import annotations

import json

import pytest

from kvroute.sim.timing import priors
from kvroute.sim.timing.profile import profile_from_dict
from kvroute.sim.timing.specs import gpu_spec, load_gpu_table, model_names, model_spec, read_config
from kvroute.traces.inputs import InputError

GiB = 2**30


def test_llama_31_70b_tp4_by_hand():
    # hidden 8192, 80 layers, 64 query heads, 8 KV heads of 128, intermediate 28672, vocab 128256
    m = model_spec("Llama-3.1-70B")
    assert m.total_params == 70_553_706_496
    q = 8192 * (64 * 128) // 4            # 16,777,216
    kv = 2 * 8192 * (8 // 4) * 128        # 4,194,304: 2 KV heads per rank
    o = (64 * 128) // 4 * 8192            # 16,777,216
    mlp = 3 * 8192 * (28672 // 4)         # 176,160,768
    assert q + kv + o + mlp == 213_909_504
    linear = 80 * 213_909_504             # 17,112,760,320
    norms = 80 * 2 * 8192 + 8192          # 1,318,912 (replicated)
    vocab = 128256 // 4 * 8192            # 262,668,288 each for embedding and LM head
    weight_bytes = 2 * (linear + norms + 2 * vocab)
    assert weight_bytes == 35_278_831_616

    doc = priors.derive_profile("H100-SXM", "llama-3.1-70b", tp=4)
    par = doc["parallel"]
    assert doc["memory"]["weight_bytes"] == par["weight_bytes_per_rank"] == 35_278_831_616
    assert par["kv_heads_per_rank"] == 2
    assert par["kv_bytes_per_token_per_rank"] == 2 * 80 * 2 * 128 * 2 == 81_920
    assert doc["memory"]["kv_bytes_per_block"] == 81_920 * 16
    # 2 all-reduces per layer of 8192 bf16 activations; a ring sends 2 (tp - 1) / tp of it
    assert par["allreduce_buffer_bytes_per_token"] == 2 * 80 * 8192 * 2 == 2_621_440
    assert par["allreduce_bytes_per_token"] == 2_621_440 * 2 * 3 // 4 == 3_932_160
    assert par["interconnect"] == "nvlink" and par["interconnect_bytes_per_s"] == 450e9
    assert doc["memory"]["non_torch_bytes"] == 512 * 2**20 + GiB
    assert doc["name"] == "h100-80gb-llama-3.1-70b-tp4"
    eff, pe = priors.Efficiency(), priors.ParallelEfficiency()
    c = doc["step_cost"]
    assert c["step_overhead_s"] == pytest.approx(0.002 + 2 * 80 * 8e-6)
    # async scheduling hides the 2 ms of host work, not the 1.28 ms of all-reduce latency
    assert doc["engine"]["async_cpu_fraction"] == pytest.approx(0.002 / (0.002 + 2 * 80 * 8e-6))
    assert profile_from_dict(doc).async_cpu_fraction == pytest.approx(0.002 / 0.00328)
    assert "async_cpu_fraction" not in priors.derive_profile("H100-SXM", "llama-3.1-8b")["engine"]  # tp 1: stated 1
    assert c["per_token_s"] == pytest.approx(
        2 * (linear + norms) / (989.4e12 * eff.linear_flops) + 3_932_160 / (450e9 * pe.allreduce_bandwidth))
    assert c["prefill_attn_s"] == pytest.approx(4 * 80 * 16 * 128 / (989.4e12 * eff.attention_flops))
    assert c["decode_attn_s"] == pytest.approx(81_920 / (3.35e12 * eff.kv_bandwidth))
    # the pool: each rank's free memory over its own bytes per block; all ranks are alike here
    free = 81_559 * 2**20 * 0.9 - 35_278_831_616 - doc["memory"]["activation_peak_bytes"] - (512 * 2**20 + GiB)
    assert doc["engine"]["num_gpu_blocks"] == int(free // (81_920 * 16)) == min(par["blocks_per_rank"])
    assert len(par["blocks_per_rank"]) == 4
    profile_from_dict(doc)  # a valid profile


def test_qwen3_32b_tp2_by_hand():
    # hidden 5120, 64 layers, 64 query heads and 8 KV heads of head_dim 128, intermediate 25600,
    # vocab 151936, q/k RMSNorms of 128 per layer
    m = model_spec("Qwen/Qwen3-32B")
    assert m.total_params == 32_762_123_264 and m.qk_norm
    q = 5120 * (64 * 128) // 2            # 20,971,520
    kv = 2 * 5120 * (8 // 2) * 128        # 5,242,880
    o = (64 * 128) // 2 * 5120            # 20,971,520
    mlp = 3 * 5120 * (25600 // 2)         # 196,608,000
    linear = 64 * (q + kv + o + mlp)
    assert linear == 15_602_810_880
    other = 64 * (2 * 5120 + 2 * 128) + 5120
    assert other == 676_864
    vocab = 151936 // 2 * 5120            # 388,956,160
    doc = priors.derive_profile("H100-SXM", "qwen3-32b", tp=2)
    par = doc["parallel"]
    assert par["weight_bytes_per_rank"] == 2 * (linear + other + 2 * vocab) == 32_762_800_128
    assert par["kv_bytes_per_token_per_rank"] == 2 * 64 * 4 * 128 * 2 == 131_072
    assert par["allreduce_buffer_bytes_per_token"] == 2 * 64 * 5120 * 2 == 1_310_720
    assert par["allreduce_bytes_per_token"] == 1_310_720 * 2 * 1 // 2 == 1_310_720

    fp8 = priors.derive_profile("H100-SXM", "qwen3-32b", tp=2, dtype="fp8", kv_cache_dtype="fp8")
    # fp8 linear weights; embedding, LM head, norms stay bf16
    assert fp8["memory"]["weight_bytes"] == linear + 2 * (other + 2 * vocab) == 17_159_989_248
    assert fp8["parallel"]["kv_bytes_per_token_per_rank"] == 65_536
    assert fp8["parallel"]["linear_compute"] == "fp8"
    assert fp8["name"] == "h100-80gb-qwen3-32b-tp2-fp8-kvfp8"
    assert fp8["engine"]["num_gpu_blocks"] > 2 * doc["engine"]["num_gpu_blocks"]
    # no fp8 tensor cores on an A100: fp8 weights, bf16 compute
    a100 = priors.derive_profile("A100-80GB-SXM", "qwen3-32b", tp=2, dtype="fp8")
    assert a100["parallel"]["linear_compute"] == "bf16"


def test_kv_heads_replicated_below_tp():
    m = model_spec("llama-3.1-70b")  # 8 KV heads
    m.check_tp(16)
    assert m.kv_heads_per_rank(16) == 1
    assert m.kv_bytes_per_token_per_rank(16, 2) == 2 * 80 * 1 * 128 * 2
    with pytest.raises(ValueError, match="cannot be split 3 ways"):
        m.check_tp(3)


def test_tp1_bf16_is_the_shipped_derivation():
    assert priors.derive_profile(priors.H100_SXM_80GB) == priors.derive_profile("H100-SXM", "Qwen2.5-7B")
    assert "parallel" not in priors.derive_profile("H100-SXM", "qwen2.5-7b")


def test_gpu_table_rows():
    table = load_gpu_table()
    for name in ("RTX-A6000", "A40", "L40S", "A100-40GB-SXM", "A100-80GB-SXM", "H100-SXM", "H100-PCIe", "H200", "B200"):
        g = table[name]
        assert g.memory_bytes > 0 and g.peak_bf16_flops > 0 and g.memory_bandwidth_bytes_per_s > 0
        assert g.source and g.memory_source and g.flops_source and g.bandwidth_source and g.interconnect_source
    assert table["A100-80GB-SXM"].peak_fp8_flops is None and table["H100-SXM"].peak_fp8_flops == 1978.9e12
    assert table["L40S"].interconnect(2) == ("pcie", 32e9)
    assert table["H100-PCIe"].interconnect(2) == ("nvlink", 300e9)
    assert table["H100-PCIe"].interconnect(4) == ("pcie", 64e9)
    assert gpu_spec("h100-80gb") == gpu_spec("NVIDIA H100 80GB HBM3") == table["H100-SXM"]
    with pytest.raises(InputError, match="unknown GPU 'V100'"):
        gpu_spec("V100")


@pytest.mark.parametrize("name", model_names())
def test_shipped_models_derive_on_h100_tp4(name):
    doc = priors.derive_profile("H100-SXM", name, tp=4)
    profile_from_dict(doc)


def test_a_tied_lm_head_streams_the_embedding_matrix_every_step(tmp_path):
    """With ``tie_word_embeddings`` the LM head reads the embedding's matrix at every step: the
    weights streamed per step are all of them (untied: all but the input embedding)."""
    cfg = json.loads((priors.Path(priors.__file__).parent / "data" / "models" / "qwen3-8b.json").read_text())
    for tied in (False, True):
        cfg["tie_word_embeddings"] = tied
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        doc = priors.derive_profile("A100-80GB-SXM", str(tmp_path / "config.json"))
        streamed = doc["memory"]["weight_bytes"] - (0 if tied else cfg["vocab_size"] * cfg["hidden_size"] * 2)
        bandwidth = gpu_spec("A100-80GB-SXM").memory_bandwidth_bytes_per_s * priors.Efficiency().weight_bandwidth
        assert doc["step_cost"]["weight_load_s"] == pytest.approx(streamed / bandwidth, rel=1e-12)


@pytest.mark.parametrize("change, field, reason", [
    ({"num_local_experts": 8}, "num_local_experts", "8 experts: a mixture-of-experts model"),
    ({"n_routed_experts": 64}, "n_routed_experts", "64 experts: a mixture-of-experts model"),
    ({"sliding_window": 4096}, "sliding_window", "sliding-window attention (4096 tokens)"),
    ({"num_key_value_heads": 5}, "num_key_value_heads", "5 KV heads do not divide the 32 attention heads"),
])
def test_a_config_the_prior_cannot_model_is_refused_naming_the_field(tmp_path, change, field, reason):
    """A Mixtral config read as a dense model gave 7.2 B parameters for 46.7 B; a sliding window or
    KV heads in broken groups were taken silently."""
    cfg = json.loads((priors.Path(priors.__file__).parent / "data" / "models" / "qwen3-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **change}))
    with pytest.raises(InputError) as err:
        model_spec(str(path))
    assert str(err.value).startswith(f"{path}: field '{field}': {reason}")
    path.write_text(json.dumps({**cfg, "sliding_window": 131072, "use_sliding_window": False}))  # Qwen2's configs
    assert model_spec(str(path)).total_params == model_spec("qwen3-8b").total_params


def test_read_config_errors_name_file_and_field(tmp_path):
    cfg = json.loads((priors.Path(priors.__file__).parent / "data" / "models" / "qwen3-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert read_config(tmp_path).total_params == model_spec("qwen3-8b").total_params
    assert model_spec(str(path)).name == "Qwen/Qwen3-8B"
    del cfg["num_hidden_layers"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError) as err:
        model_spec(str(path))
    assert str(err.value) == f"{path}: field 'num_hidden_layers': expected a positive integer, got None"
    path.write_text("{")
    with pytest.raises(InputError, match=f"^{path}:1: not valid JSON"):
        read_config(path)
    with pytest.raises(InputError, match="cannot read the model config"):
        read_config(tmp_path / "missing.json")
    with pytest.raises(InputError, match="unknown model 'gpt-5'"):
        model_spec("gpt-5")


@pytest.mark.parametrize("version, block, memory, async_on, blocks", [
    ("0.11.0", 16, 0.9, False, 32_817),   # the shipped prior, the seed study's release
    ("0.20.0", 16, 0.92, True, 33_941),
    ("0.21.0", 16, 0.92, True, 32_770),   # 1 GiB per GPU set aside for CUDA graphs: 1,171 blocks of 57,344 x 16 B
    ("0.34.0", 64, 1.0, True, 9_315),     # 596,160 tokens: +14 % over 0.11's 525,072
])
def test_derived_priors_take_their_releases_defaults(version, block, memory, async_on, blocks):
    """Issue 33, item 2: block size, memory share and async scheduling as that vLLM picks them."""
    doc = priors.derive_profile("RTX-A6000", vllm_version=version)
    engine = doc["engine"]
    assert (engine["vllm_version"], engine["block_size"], engine["gpu_memory_utilization"],
            engine["async_scheduling"], engine["num_gpu_blocks"]) == (version, block, memory, async_on, blocks)
    assert "engine.async_scheduling" in doc["sources"]


def test_cuda_graph_memory_is_set_aside_before_the_kv_cache_from_0_21_as_given():
    """vLLM 0.21 on subtracts its CUDA graphs' estimated memory from the KV budget
    (``determine_available_memory``); the prior states 1 GiB, and takes a server's logged figure."""
    kv_block = 57_344 * 16  # Qwen2.5-7B, bytes
    stated = priors.derive_profile("RTX-A6000", vllm_version="0.21.0")
    logged = priors.derive_profile("RTX-A6000", vllm_version="0.21.0", cudagraph_bytes=0)
    assert stated["memory"]["cudagraph_bytes"] == 2**30 and "cudagraph_bytes" not in logged["memory"]
    assert logged["name"] == "a6000-qwen2.5-7b-vllm0.21-cg0" and stated["name"] == "a6000-qwen2.5-7b-vllm0.21"
    # floor((free - 1 GiB) / block) against floor(free / block): 1,170.3 blocks' worth, 1,171 fewer here
    assert logged["engine"]["num_gpu_blocks"] - stated["engine"]["num_gpu_blocks"] == 1_171 == -(-2**30 // kv_block)
    assert "cudagraph_bytes" not in priors.derive_profile("RTX-A6000", vllm_version="0.20.0")["memory"]
    profile = profile_from_dict(json.loads(json.dumps(stated)))
    assert profile.memory.num_gpu_blocks(0.92) == profile.engine.num_gpu_blocks == 32_770  # re-derived alike
    with pytest.raises(ValueError, match=r"^CUDA-graph memory must be a whole number of bytes >= 0, got -1$"):
        priors.derive_profile("RTX-A6000", vllm_version="0.21.0", cudagraph_bytes=-1)


def test_batch_limits_other_than_vllm_serves_are_named_and_stated_as_given():
    doc = priors.derive_profile("A100-80GB-SXM", max_num_batched_tokens=8192, max_num_seqs=512)
    assert doc["name"] == "a100-80gb-qwen2.5-7b-tokens8192-seqs512"  # not the shipped prior's name
    assert (doc["sources"]["engine.max_num_batched_tokens"], doc["sources"]["engine.max_num_seqs"]) == (
        "given: 8192", "given: 512")
    assert priors.derive_profile("A100-80GB-SXM", max_num_batched_tokens=2048)["name"] == "a100-80gb-qwen2.5-7b"


@pytest.mark.parametrize("setting, message", [
    ({"block_size": 0}, "block_size must be a whole number >= 1, got 0"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens must be a whole number >= 1, got -5"),
    ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    ({"par": "allreduce"}, r"ParallelEfficiency.allreduce_bandwidth must be in \(0, 1\], got 0"),
])
def test_derive_profile_from_python_checks_its_settings(setting, message):
    """The CLI's checks hold for a caller from Python too (a block size of 0 divided by zero)."""
    if setting == {"par": "allreduce"}:
        with pytest.raises(ValueError, match=f"^{message}$"):
            priors.ParallelEfficiency(allreduce_bandwidth=0)
        return
    with pytest.raises(ValueError, match=f"^{message}$"):
        priors.derive_profile("A100-80GB-SXM", **setting)


def test_b200_batch_defaults_follow_the_release():
    assert priors.get_batch_defaults(priors.gpu_spec("B200"), "0.11.0") == (8192, 1024)
    assert priors.get_batch_defaults(priors.gpu_spec("B200"), "0.34.0") == (16384, 1024)
    assert priors.derive_profile("B200", vllm_version="0.34.0")["engine"]["max_num_batched_tokens"] == 16384


def test_shipped_priors_stay_the_study_release():
    assert priors.derive_profile(priors.RTX_A6000) == priors.derive_profile(priors.RTX_A6000, vllm_version="0.11.0")
    with pytest.raises(ValueError, match="vLLM version must look like 0.11 or 0.34.0, got 'new'"):
        priors.derive_profile(priors.RTX_A6000, vllm_version="new")
