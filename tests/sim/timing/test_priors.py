"""Derived priors (sim/timing/priors.py): exact arithmetic, shipped files in step with the code."""

from __future__ import annotations

import json
import math

import pytest

from kvroute.sim.timing import priors
from kvroute.sim.engine.scheduler_output import prefill_pairs
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.profile import load_profile, shipped_profiles

NAMES = ["a6000-qwen2.5-7b", "a100-40gb-qwen2.5-7b", "a100-80gb-qwen2.5-7b", "h100-80gb-qwen2.5-7b"]


def test_kv_bytes_per_block_qwen25_7b():
    assert priors.QWEN25_7B.kv_bytes_per_token * 16 == 2 * 28 * 4 * 128 * 2 * 16 == 917_504
    for name in NAMES:
        assert priors.shipped_documents()[name]["memory"]["kv_bytes_per_block"] == 917_504


def test_param_count_matches_config_shapes():
    m = priors.QWEN25_7B
    # a Qwen2 layer: q/k/v with bias, o without, SwiGLU MLP, two RMSNorms; a final norm; untied LM head
    h, kv = m.hidden_size, m.num_kv_heads * m.head_dim
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * m.intermediate_size + 2 * h
    assert m.num_layers * layer + h + 2 * m.vocab_size * h == m.total_params == 7_615_616_512
    assert m.non_embedding_params == 6_525_621_760
    assert m.hidden_size == m.num_attention_heads * m.head_dim


@pytest.mark.parametrize("name", NAMES)
def test_num_gpu_blocks_follows_memory_rule_by_hand(name):
    doc = priors.shipped_documents()[name]
    mem, eng = doc["memory"], doc["engine"]
    assert mem["weight_bytes"] == 2 * 7_615_616_512
    free = (
        mem["gpu_memory_bytes"] * eng["gpu_memory_utilization"]
        - mem["weight_bytes"]
        - mem["activation_peak_bytes"]
        - mem["non_torch_bytes"]
    )
    assert eng["num_gpu_blocks"] == int(free // mem["kv_bytes_per_block"])
    assert eng["gpu_memory_utilization"] == 0.9
    assert eng["block_size"] == 16


def test_gpu_memory_is_driver_mib():
    assert priors.RTX_A6000.memory_bytes == 49_140 * 2**20
    assert priors.A100_SXM_40GB.memory_bytes == 40_536 * 2**20
    assert priors.A100_SXM_80GB.memory_bytes == 81_920 * 2**20
    assert priors.H100_SXM_80GB.memory_bytes == 81_559 * 2**20


def test_batch_defaults_follow_vllm():
    assert priors.get_batch_defaults(priors.RTX_A6000) == (2048, 256)
    assert priors.get_batch_defaults(priors.A100_SXM_40GB) == (2048, 256)
    # >= 70 GiB, but vLLM excludes A100s from the large defaults
    assert priors.get_batch_defaults(priors.A100_SXM_80GB) == (2048, 256)
    assert priors.get_batch_defaults(priors.H100_SXM_80GB) == (8192, 1024)
    doc = priors.derive_profile(priors.RTX_A6000, max_num_batched_tokens=4096, max_num_seqs=64)
    assert (doc["engine"]["max_num_batched_tokens"], doc["engine"]["max_num_seqs"]) == (4096, 64)


def test_step_cost_formulas_a6000():
    doc = priors.shipped_documents()["a6000-qwen2.5-7b"]
    c, eff = doc["step_cost"], priors.Efficiency()
    assert c["per_token_s"] == pytest.approx(2 * 6_525_621_760 / (154.8e12 * eff.linear_flops))
    assert c["prefill_attn_s"] == pytest.approx(4 * 28 * 28 * 128 / (154.8e12 * eff.attention_flops))
    assert c["decode_attn_s"] == pytest.approx(57_344 / (768e9 * eff.kv_bandwidth))
    streamed = 2 * (7_615_616_512 - 152_064 * 3584)
    assert c["weight_load_s"] == pytest.approx(streamed / (768e9 * eff.weight_bandwidth))
    assert c["step_overhead_s"] == eff.step_overhead_s


@pytest.mark.parametrize("name", NAMES)
def test_shipped_json_equals_derivation(name):
    path = priors.profiles_dir() / f"{name}.json"
    assert json.loads(path.read_text()) == priors.shipped_documents()[name], (
        f"{path} drifted from derive_profile; run `python -m kvroute.sim.timing.priors --write`"
    )


@pytest.mark.parametrize("name", NAMES)
def test_shipped_profile_loads_and_is_sane(name):
    assert name in shipped_profiles()
    profile = load_profile(name)
    assert profile.name == name
    doc = profile.raw
    assert doc["provenance"]["kind"] == "derived"
    assert doc["provenance"]["source"] == "kvroute.sim.timing.priors"
    assert doc["provenance"]["date"] == "2026-11-29"
    for key in StepCost.__dataclass_fields__:
        value = doc["step_cost"][key]
        assert math.isfinite(value) and value >= 0, key
        assert f"step_cost.{key}" in doc["sources"]
    assert (profile.overheads.api_server_s, profile.overheads.gateway_s, profile.overheads.jitter_cv) == (
        0.1,
        0.001,
        0.1,
    )
    assert profile.engine.num_usable_blocks * 16 >= profile.engine.max_model_len


@pytest.mark.parametrize("name", NAMES)
def test_two_workers_sharing_a_gpu_get_less_than_half_the_blocks(name):
    profile = load_profile(name)
    shared = profile.shared(2)
    assert shared.gpu_memory_utilization == pytest.approx(0.45)
    # weights, activations and non-torch memory are paid by each worker
    assert shared.engine.num_gpu_blocks < profile.engine.num_gpu_blocks / 2
    assert shared.step_cost == profile.step_cost


def test_sanity_report_mentions_lab_figures():
    doc = priors.shipped_documents()["a6000-qwen2.5-7b"]
    text = priors.sanity_report(doc)
    assert "30 tokens/s" in text and "100-200 ms" in text and "100 ms" in text
    tps = 1.0 / priors.decode_step_s(doc, 16, 1000)
    prefill = priors.prefill_time_s(doc, 1000)
    assert 0 < tps and 0 < prefill
    # chunking: 5,000 tokens at a 2,048 budget are three steps (2048, 2048, 904)
    cost = load_profile("a6000-qwen2.5-7b").step_cost
    by_hand = (
        cost.step_time(2048, 1, prefill_pairs(0, 2048), 0)
        + cost.step_time(2048, 1, prefill_pairs(2048, 2048), 0)
        + cost.step_time(904, 1, prefill_pairs(4096, 904), 0)
    )
    assert priors.prefill_time_s(doc, 5000) == pytest.approx(by_hand)


def test_efficiency_rejects_impossible_factors():
    with pytest.raises(ValueError):
        priors.Efficiency(linear_flops=1.5)
    with pytest.raises(ValueError):
        priors.Efficiency(step_overhead_s=-1.0)


def test_no_kv_cache_raises():
    tiny = priors.GpuSpec("tiny", "tiny", 16 * 2**30, 1e12, 1e11, "", "", "")
    with pytest.raises(ValueError):
        priors.derive_profile(tiny)


def test_main_prints_reports(capsys):
    assert priors.main([]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
