"""Derived priors: profiles computed from spec sheets, the model's config and stated efficiencies.

A prior is what the simulator uses before a worker has been measured (``calibrate`` replaces it
with fitted numbers). Everything here is arithmetic on public numbers:

- the GPU's memory as the driver reports it (``nvidia-smi``), its peak dense bf16 tensor FLOP/s
  and its memory bandwidth from NVIDIA's data sheets (:class:`GpuSpec`);
- the model's shapes from its ``config.json`` on Hugging Face (:class:`ModelSpec`);
- efficiency factors, stated as assumptions from public knowledge of what vLLM achieves and
  **not** tuned against the lab's runs (:class:`Efficiency`);
- vLLM 0.11's memory rule and batch defaults.

``python -m kvroute.sim.timing.priors`` prints each shipped prior's sanity report (decode speed and
prefill time beside the lab's observations); ``--write`` rewrites the shipped JSON files in
``sim/timing/profiles/`` from :func:`derive_profile`, and the tests check that they have not drifted.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from kvroute.traces.outputs import write_text_atomic
from kvroute.sim.timing.cost_model import prefill_pairs
from kvroute.sim.timing.profile import MemoryModel, profile_from_dict

MiB = 2**20
GiB = 2**30

#: Date stamped into every derived profile's provenance (fixed so the files do not drift).
PROVENANCE_DATE = "2026-11-29"

#: Memory outside PyTorch's allocator that grows during vLLM's profiling run (cuBLAS/cuDNN
#: workspaces, NCCL and allocator fragmentation); a stated constant, in bytes. vLLM logs show
#: 0.03-0.3 GiB for one GPU without tensor parallelism and 1-2 GiB with NCCL; 0.5 GiB sits at the
#: lower end of the 0.5-1 GiB range this project assumes.
NON_TORCH_BYTES = 512 * MiB


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model, from public spec sheets.

    Attributes:
        name: device name as CUDA reports it (``torch.cuda.get_device_name``); vLLM's batch
            defaults look at it (``"a100"`` is excluded from the large defaults).
        short_name: stem used in profile names, e.g. ``"a6000"``.
        memory_bytes: total device memory in bytes, as the driver reports it (``nvidia-smi``
            total in MiB x 2**20).
        peak_bf16_flops: peak dense (no sparsity) bf16 tensor-core FLOP/s with fp32 accumulate.
        memory_bandwidth_bytes_per_s: peak DRAM bandwidth, bytes/s.
        memory_source, flops_source, bandwidth_source: where each number comes from.
    """

    name: str
    short_name: str
    memory_bytes: int
    peak_bf16_flops: float
    memory_bandwidth_bytes_per_s: float
    memory_source: str
    flops_source: str
    bandwidth_source: str


RTX_A6000 = GpuSpec(
    name="NVIDIA RTX A6000",
    short_name="a6000",
    memory_bytes=49_140 * MiB,
    peak_bf16_flops=154.8e12,
    memory_bandwidth_bytes_per_s=768e9,
    memory_source="nvidia-smi total for NVIDIA RTX A6000: 49140 MiB",
    flops_source=(
        "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX A6000: peak BF16 tensor TFLOPS "
        "with FP32 accumulate 154.8 dense (309.7 with sparsity, as on the RTX A6000 data sheet)"
    ),
    bandwidth_source="NVIDIA RTX A6000 data sheet: 48 GB GDDR6, 768 GB/s",
)

A100_SXM_40GB = GpuSpec(
    name="NVIDIA A100-SXM4-40GB",
    short_name="a100-40gb",
    memory_bytes=40_536 * MiB,
    peak_bf16_flops=312e12,
    memory_bandwidth_bytes_per_s=1_555e9,
    memory_source="nvidia-smi total for NVIDIA A100-SXM4-40GB: 40536 MiB",
    flops_source="NVIDIA A100 Tensor Core GPU data sheet: BF16 tensor core 312 TFLOPS dense (624 sparse)",
    bandwidth_source="NVIDIA A100 data sheet, A100 40GB SXM: HBM2 1,555 GB/s",
)

A100_SXM_80GB = GpuSpec(
    name="NVIDIA A100-SXM4-80GB",
    short_name="a100-80gb",
    memory_bytes=81_920 * MiB,
    peak_bf16_flops=312e12,
    memory_bandwidth_bytes_per_s=2_039e9,
    memory_source="nvidia-smi total for NVIDIA A100-SXM4-80GB: 81920 MiB",
    flops_source="NVIDIA A100 Tensor Core GPU data sheet: BF16 tensor core 312 TFLOPS dense (624 sparse)",
    bandwidth_source="NVIDIA A100 data sheet, A100 80GB SXM: HBM2e 2,039 GB/s",
)

H100_SXM_80GB = GpuSpec(
    name="NVIDIA H100 80GB HBM3",
    short_name="h100-80gb",
    memory_bytes=81_559 * MiB,
    peak_bf16_flops=989.4e12,
    memory_bandwidth_bytes_per_s=3.35e12,
    memory_source="nvidia-smi total for NVIDIA H100 80GB HBM3 (SXM5): 81559 MiB",
    flops_source=(
        "NVIDIA H100 Tensor Core GPU architecture whitepaper, H100 SXM5: BF16 tensor 989.4 "
        "TFLOPS dense (the H100 data sheet's 1,979 TFLOPS is with sparsity)"
    ),
    bandwidth_source="NVIDIA H100 data sheet, H100 SXM: HBM3 3.35 TB/s",
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shapes, from its ``config.json``.

    Attributes:
        name: Hugging Face model id.
        short_name: stem used in profile names, e.g. ``"qwen2.5-7b"``.
        num_layers: ``num_hidden_layers``.
        hidden_size: ``hidden_size``.
        num_attention_heads: ``num_attention_heads`` (query heads).
        num_kv_heads: ``num_key_value_heads`` (grouped-query attention).
        head_dim: ``hidden_size / num_attention_heads``.
        intermediate_size: ``intermediate_size`` of the gated (SwiGLU) MLP.
        vocab_size: ``vocab_size`` (rows of the embedding and of the LM head).
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        total_params: all parameters, embeddings and LM head included.
        dtype_bytes: bytes per weight and per KV element (bf16: 2).
        source: where the shapes and the count come from.
    """

    name: str
    short_name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    total_params: int
    dtype_bytes: int
    source: str

    @property
    def embedding_params(self) -> int:
        """Parameters of the input embedding table (vocab x hidden)."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the LM head (vocab x hidden; 0 extra if tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def non_embedding_params(self) -> int:
        """Parameters of the decoder layers and final norm (no embedding, no LM head)."""
        return self.total_params - self.embedding_params - self.lm_head_params

    def qwen2_param_count(self) -> int:
        """Parameters implied by the shapes for a Qwen2 layer (q/k/v with bias, o without,
        SwiGLU MLP without bias, two RMSNorms per layer, a final RMSNorm)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = (h * h + h) + 2 * (h * kv + kv) + h * h
        mlp = 3 * h * self.intermediate_size
        layer = attn + mlp + 2 * h
        return self.num_layers * layer + h + self.embedding_params + self.lm_head_params

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes: K and V x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


QWEN25_7B = ModelSpec(
    name="Qwen/Qwen2.5-7B-Instruct",
    short_name="qwen2.5-7b",
    num_layers=28,
    hidden_size=3584,
    num_attention_heads=28,
    num_kv_heads=4,
    head_dim=128,
    intermediate_size=18944,
    vocab_size=152064,
    tie_word_embeddings=False,
    total_params=7_615_616_512,
    dtype_bytes=2,
    source=(
        "config.json of Qwen/Qwen2.5-7B-Instruct on Hugging Face (same shapes as Qwen/Qwen2.5-7B): "
        "num_hidden_layers 28, hidden_size 3584, num_attention_heads 28, num_key_value_heads 4, "
        "intermediate_size 18944, vocab_size 152064, tie_word_embeddings false, torch_dtype "
        "bfloat16; total_params = model.safetensors.index.json total_size 15,231,233,024 bytes / 2 "
        "(the model card's 7.61B; 6.53B non-embedding)"
    ),
)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Stated efficiency factors and overheads (assumptions, not fits).

    Chosen from public knowledge of vLLM on NVIDIA GPUs, the same for every GPU here, and not
    tuned against the lab's observations.

    Attributes:
        linear_flops: share of peak bf16 FLOP/s the linear layers (cuBLAS/CUTLASS GEMMs) reach
            at prefill-sized batches. 0.6: large bf16 GEMMs reach 70-80 % of peak, the 7B model's
            3584-wide shapes and the A6000's 300 W power cap less.
        attention_flops: share of peak FLOP/s for prefill attention (FlashAttention-2 on Ampere,
            FA3 on Hopper). 0.5: FlashAttention-2 reports 50-73 % of peak forward on A100, lower
            for short varlen chunks.
        weight_bandwidth: share of peak bandwidth when streaming weights (memory-bound GEMMs at
            decode batch sizes). 0.8: typical of bandwidth-bound kernels on GDDR6 and HBM.
        kv_bandwidth: share of peak bandwidth when decode attention reads paged KV (16-token
            blocks, ~1k-token contexts). 0.6: paged decode kernels reach less than streaming GEMMs.
        step_overhead_s: fixed seconds per engine step with CUDA graphs (scheduling, input
            preparation, graph replay launch, sampler sync, output hand-off; vLLM 0.11 does not
            overlap these by default). 0.002 s.
        per_request_overhead_s: CPU seconds per scheduled request per step (scheduler
            bookkeeping, input tensors, output processing). 10 us.
        sampler_bytes_per_logit: bytes the sampler moves per vocabulary entry of one request
            (fp32 logits written and read by penalties, temperature, top-k/top-p sort, softmax and
            the draw: about 8 passes x 4 bytes). 32.
        api_server_s: API-server time before the engine sees a request; 0.1 s (seed study).
        gateway_s: gateway time per request after the lab's Redis fix; 0.001 s (seed study).
        jitter_cv: coefficient of variation of per-request overheads; 0.1 (stated).
    """

    linear_flops: float = 0.6
    attention_flops: float = 0.5
    weight_bandwidth: float = 0.8
    kv_bandwidth: float = 0.6
    step_overhead_s: float = 0.002
    per_request_overhead_s: float = 10e-6
    sampler_bytes_per_logit: float = 32.0
    api_server_s: float = 0.1
    gateway_s: float = 0.001
    jitter_cv: float = 0.1

    def __post_init__(self) -> None:
        for name in ("linear_flops", "attention_flops", "weight_bandwidth", "kv_bandwidth"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"Efficiency.{name} must be in (0, 1], got {value!r}")
        for name, value in asdict(self).items():
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"Efficiency.{name} must be finite and >= 0, got {value!r}")


# --------------------------------------------------------------------------------------------
# vLLM rules
# --------------------------------------------------------------------------------------------


def get_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` picks on this GPU.

    Mirrors ``vllm/engine/arg_utils.py`` (``get_batch_defaults``, OpenAI API server context) as
    in vLLM 0.11: devices with at least 70 GiB whose name does not contain ``"a100"`` (H100/H200
    class) get 8192 / 1024; all others (A6000, A100 40 GB and, by the A100 exception, A100 80 GB)
    get 2048 / 256. These are the values the seed study's ``vllm serve`` runs used.
    """
    if gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


def activation_peak_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak activation bytes of vLLM's profiling run (a stated simple rule).

    vLLM profiles one forward pass over ``max_num_batched_tokens`` tokens and a sampler pass
    over ``max_num_seqs`` positions (``vllm/v1/worker/gpu_model_runner.py: profile_run``). The
    rule keeps, per token, the bf16 residual stream and one layer's hidden output
    (2 x hidden) plus the MLP's gate/up output and activated product (3 x intermediate), and
    per sampled position the logits in bf16 and their fp32 copy (6 bytes x vocab).
    """
    per_token = (2 * model.hidden_size + 3 * model.intermediate_size) * model.dtype_bytes
    per_seq = model.vocab_size * (model.dtype_bytes + 4)
    return max_num_batched_tokens * per_token + max_num_seqs * per_seq


# --------------------------------------------------------------------------------------------
# The derivation
# --------------------------------------------------------------------------------------------


def derive_profile(
    gpu: GpuSpec,
    model: ModelSpec = QWEN25_7B,
    eff: Efficiency = Efficiency(),
    vllm_version: str = "0.11.0",
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int = 16,
    max_model_len: int = 32768,
) -> dict:
    """A profile document (the layout of ``kvroute.sim.timing.profile``) derived from specs.

    Args:
        gpu: the GPU (memory in bytes, peak FLOP/s, bandwidth in bytes/s).
        model: the model's shapes (bf16 weights and KV cache).
        eff: stated efficiency factors and overheads.
        vllm_version: engine version the prior stands for (0.11.0: utilisation 0.9).
        gpu_memory_utilization: vLLM's share of the device for this instance.
        max_num_batched_tokens, max_num_seqs: scheduler limits; ``None`` takes
            :func:`get_batch_defaults` for this GPU.
        block_size: tokens per KV block (vLLM default 16).
        max_model_len: longest sequence in tokens (Qwen2.5-7B-Instruct's 32768).

    Returns:
        A dict with sections name, hardware, model, engine, memory, step_cost, overheads,
        provenance and sources. Times are seconds; memory is bytes.

    Raises:
        ValueError: if no KV cache fits, or the cache cannot hold one ``max_model_len`` request
            (vLLM refuses to start in that case).
    """
    default_tokens, default_seqs = get_batch_defaults(gpu)
    tokens = default_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    seqs = default_seqs if max_num_seqs is None else max_num_seqs

    # Memory (bytes) and vLLM's KV-capacity rule.
    kv_bytes_per_block = model.kv_bytes_per_token * block_size
    weight_bytes = model.total_params * model.dtype_bytes
    memory = MemoryModel(
        gpu_memory_bytes=gpu.memory_bytes,
        weight_bytes=weight_bytes,
        activation_peak_bytes=activation_peak_bytes(model, tokens, seqs),
        non_torch_bytes=NON_TORCH_BYTES,
        kv_bytes_per_block=kv_bytes_per_block,
    )
    num_gpu_blocks = memory.num_gpu_blocks(gpu_memory_utilization)
    if (num_gpu_blocks - 1) * block_size < max_model_len:
        raise ValueError(
            f"{gpu.name}: {num_gpu_blocks - 1} usable blocks of {block_size} tokens cannot hold "
            f"one request of max_model_len {max_model_len}"
        )

    # Step-cost coefficients (seconds).
    bw, peak = gpu.memory_bandwidth_bytes_per_s, gpu.peak_bf16_flops
    streamed_weight_bytes = weight_bytes - model.embedding_params * model.dtype_bytes
    weight_load_s = streamed_weight_bytes / (bw * eff.weight_bandwidth)
    per_token_s = 2 * model.non_embedding_params / (peak * eff.linear_flops)
    lm_head_s = 2 * model.hidden_size * model.vocab_size / (peak * eff.linear_flops)
    sampling_s = model.vocab_size * eff.sampler_bytes_per_logit / (bw * eff.weight_bandwidth)
    per_request_s = lm_head_s + sampling_s + eff.per_request_overhead_s
    attn_flops_per_pair = 4 * model.num_layers * model.num_attention_heads * model.head_dim
    prefill_attn_s = attn_flops_per_pair / (peak * eff.attention_flops)
    decode_attn_s = model.kv_bytes_per_token / (bw * eff.kv_bandwidth)

    name = f"{gpu.short_name}-{model.short_name}"
    eff_text = (
        f"linear {eff.linear_flops:g} of peak FLOP/s, prefill attention {eff.attention_flops:g}, "
        f"weights {eff.weight_bandwidth:g} of bandwidth, KV reads {eff.kv_bandwidth:g}"
    )
    sources = {
        "hardware.gpu": "device name as CUDA reports it",
        "hardware.gpu_memory_bytes": gpu.memory_source,
        "hardware.peak_bf16_dense_flops": gpu.flops_source,
        "hardware.memory_bandwidth_bytes_per_s": gpu.bandwidth_source,
        "model": model.source,
        "model.non_embedding_params": "total_params - embedding (vocab x hidden) - untied LM head (vocab x hidden)",
        "engine.vllm_version": "the seed study's engine (vLLM 0.11.0, default settings)",
        "engine.block_size": "vLLM default 16 (vllm/config/cache.py)",
        "engine.gpu_memory_utilization": "vLLM 0.11 default 0.9 (vllm/config/cache.py; 0.92 from 0.33)",
        "engine.max_num_batched_tokens": (
            f"vllm serve default on {gpu.name}: {default_tokens} (vllm/engine/arg_utils.py: "
            "get_batch_defaults; >= 70 GiB and not A100: 8192, else 2048)"
        ),
        "engine.max_num_seqs": (
            f"vllm serve default on {gpu.name}: {default_seqs} (vllm/engine/arg_utils.py: "
            "get_batch_defaults; >= 70 GiB and not A100: 1024, else 256)"
        ),
        "engine.max_model_len": "max_position_embeddings 32768 in Qwen2.5-7B-Instruct's config.json",
        "engine.num_gpu_blocks": (
            "floor((gpu_memory_bytes x gpu_memory_utilization - weight_bytes - activation_peak_bytes "
            "- non_torch_bytes) / kv_bytes_per_block) (vllm/v1/worker/gpu_worker.py: "
            "determine_available_memory; kvroute.sim.timing.profile.MemoryModel)"
        ),
        "memory.gpu_memory_bytes": gpu.memory_source,
        "memory.weight_bytes": "total_params x 2 bytes (bf16)",
        "memory.activation_peak_bytes": (
            "stated rule (kvroute.sim.timing.priors.activation_peak_bytes): max_num_batched_tokens x "
            "(2 x hidden + 3 x intermediate) x 2 bytes + max_num_seqs x vocab x 6 bytes (bf16 + fp32 "
            "logits), for vLLM's profile_run (vllm/v1/worker/gpu_model_runner.py)"
        ),
        "memory.non_torch_bytes": "stated constant 0.5 GiB (CUDA/cuBLAS workspaces, allocator slack)",
        "memory.kv_bytes_per_block": "2 (K,V) x layers x kv_heads x head_dim x 2 bytes x block_size",
        "step_cost.step_overhead_s": f"stated: {eff.step_overhead_s} s per step, vLLM with CUDA graphs",
        "step_cost.weight_load_s": (
            "streamed weight bytes (all weights but the input embedding, which is only gathered) / "
            f"(bandwidth x {eff.weight_bandwidth:g})"
        ),
        "step_cost.per_token_s": f"2 x non_embedding_params FLOPs / (peak bf16 x {eff.linear_flops:g})",
        "step_cost.per_request_s": (
            f"LM head 2 x hidden x vocab FLOPs / (peak x {eff.linear_flops:g}) + sampling vocab x "
            f"{eff.sampler_bytes_per_logit:g} bytes / (bandwidth x {eff.weight_bandwidth:g}) + "
            f"{eff.per_request_overhead_s:g} s CPU per request"
        ),
        "step_cost.prefill_attn_s": (
            f"4 x layers x heads x head_dim FLOPs per causal pair / (peak x {eff.attention_flops:g})"
        ),
        "step_cost.decode_attn_s": (
            f"KV bytes per context token / (bandwidth x {eff.kv_bandwidth:g})"
        ),
        "overheads.api_server_s": "seed study: the API server adds about 100 ms per request",
        "overheads.gateway_s": "seed study: the gateway adds about 1 ms after the Redis fix",
        "overheads.jitter_cv": "stated: lognormal jitter with CV 0.1 (seed study asks for stated, seeded jitter)",
    }
    return {
        "name": name,
        "hardware": {
            "gpu": gpu.name,
            "gpu_memory_bytes": gpu.memory_bytes,
            "peak_bf16_dense_flops": gpu.peak_bf16_flops,
            "memory_bandwidth_bytes_per_s": gpu.memory_bandwidth_bytes_per_s,
        },
        "model": {
            "name": model.name,
            "dtype": "bfloat16",
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "num_kv_heads": model.num_kv_heads,
            "head_dim": model.head_dim,
            "intermediate_size": model.intermediate_size,
            "vocab_size": model.vocab_size,
            "tie_word_embeddings": model.tie_word_embeddings,
            "total_params": model.total_params,
            "non_embedding_params": model.non_embedding_params,
        },
        "engine": {
            "vllm_version": vllm_version,
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "max_num_batched_tokens": tokens,
            "max_num_seqs": seqs,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
        },
        "memory": asdict(memory),
        "step_cost": {
            "step_overhead_s": eff.step_overhead_s,
            "weight_load_s": weight_load_s,
            "per_token_s": per_token_s,
            "per_request_s": per_request_s,
            "prefill_attn_s": prefill_attn_s,
            "decode_attn_s": decode_attn_s,
        },
        "overheads": {
            "api_server_s": eff.api_server_s,
            "gateway_s": eff.gateway_s,
            "jitter_cv": eff.jitter_cv,
        },
        "provenance": {
            "kind": "derived",
            "source": "kvroute.sim.timing.priors",
            "date": PROVENANCE_DATE,
            "notes": (
                f"Roofline prior for {model.name} (bf16) on {gpu.name} under vLLM {vllm_version}, "
                f"from spec sheets and config.json with stated efficiencies ({eff_text}); not fitted "
                "to any measurement. Replace with a calibrated profile once the worker is measured."
            ),
            "efficiency": asdict(eff),
        },
        "sources": sources,
    }


#: The shipped derived profiles: file stem -> GPU (model Qwen2.5-7B, default efficiencies).
SHIPPED_GPUS: dict[str, GpuSpec] = {
    f"{g.short_name}-{QWEN25_7B.short_name}": g
    for g in (RTX_A6000, A100_SXM_40GB, A100_SXM_80GB, H100_SXM_80GB)
}


def shipped_documents() -> dict[str, dict]:
    """Every shipped derived profile as :func:`derive_profile` produces it now, by file stem."""
    return {name: derive_profile(gpu) for name, gpu in SHIPPED_GPUS.items()}


def profiles_dir() -> Path:
    """Directory of the shipped profiles (``sim/timing/profiles``)."""
    return Path(__file__).resolve().parent / "profiles"


def write_profiles(directory: Path | None = None) -> list[Path]:
    """Write every shipped derived profile as ``<name>.json`` (indent 2); returns the paths."""
    directory = profiles_dir() if directory is None else Path(directory)
    paths = []
    for name, doc in shipped_documents().items():
        path = directory / f"{name}.json"
        write_text_atomic(path, json.dumps(doc, indent=2) + "\n")
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------
# Sanity check against the lab's observations (reported, never tuned)
# --------------------------------------------------------------------------------------------


def prefill_time_s(profile_doc: dict, prompt_tokens: int, computed_tokens: int = 0) -> float:
    """Seconds to prefill ``prompt_tokens`` new tokens alone, in chunks of the step budget.

    Each chunk is one engine step with one request; the last step also yields the first token.
    """
    profile = profile_from_dict(profile_doc, profile_doc.get("name", "<dict>"))
    budget = profile.engine.max_num_batched_tokens
    total, done = 0.0, computed_tokens
    remaining = prompt_tokens
    while remaining > 0:
        chunk = min(budget, remaining)
        total += profile.step_cost.step_time(chunk, 1, prefill_pairs(done, chunk), 0)
        done += chunk
        remaining -= chunk
    return total


def decode_step_s(profile_doc: dict, num_decodes: int, context_tokens: int) -> float:
    """Seconds of one step in which ``num_decodes`` requests each decode one token after
    ``context_tokens`` tokens of context."""
    profile = profile_from_dict(profile_doc, profile_doc.get("name", "<dict>"))
    return profile.step_cost.step_time(num_decodes, num_decodes, 0.0, num_decodes * (context_tokens + 1))


def sanity_report(profile_doc: dict) -> str:
    """Plain-text table of the prior's predictions beside the lab's A6000 observations.

    (a) decode speed per user with 16 chats decoding at a 1,000-token context
    (1 / step_time, tokens/s), and the 128-token reply at that speed; (b) the prefill of a
    1,000-token history alone (chunks of ``max_num_batched_tokens``), and the step that mixes
    it with 15 decodes; (c) the API server overhead. Lab figures are from the seed study and
    were measured on RTX A6000s, so they compare directly only with the A6000 prior.
    """
    profile = profile_from_dict(profile_doc, profile_doc.get("name", "<dict>"))
    cost = profile.step_cost
    step16 = decode_step_s(profile_doc, 16, 1000)
    tps = 1.0 / step16
    prefill = prefill_time_s(profile_doc, 1000)
    mixed = cost.step_time(1000 + 15, 16, prefill_pairs(0, 1000), 15 * 1001)
    rows = [
        ("(a) decode, 16 chats at 1,000-token context", f"{tps:.1f} tokens/s per user "
         f"(step {step16 * 1e3:.1f} ms)", "about 30 tokens/s per user"),
        ("    128-token reply at that speed", f"{128 * step16:.2f} s", "about 4 s"),
        ("(b) prefill of a 1,000-token history, alone", f"{prefill * 1e3:.0f} ms", "100-200 ms"),
        ("    same prefill sharing a step with 15 decodes", f"{mixed * 1e3:.0f} ms", "(not measured)"),
        ("(c) API server overhead per request", f"{profile.overheads.api_server_s * 1e3:.0f} ms (stated)",
         "about 100 ms"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    same_gpu = "a6000" in profile.name.lower()
    lines = [
        f"{profile.name}: derived prior vs the lab's A6000 observations (not tuned to them)"
        + ("" if same_gpu else "; a different GPU, so the lab column is for scale only"),
        f"{'quantity':<{w0}}  {'prior':<{w1}}  lab (4 x RTX A6000, vLLM 0.11)",
    ]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    weight_ms = cost.weight_load_s * 1e3
    lines.append(
        f"decode step = {cost.step_overhead_s * 1e3:.1f} ms overhead + {weight_ms:.1f} ms weights + "
        f"{16 * cost.per_request_s * 1e3:.2f} ms per-request + "
        f"{16 * 1001 * cost.decode_attn_s * 1e3:.2f} ms KV reads"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: print every shipped prior's sanity report; ``--write`` also rewrites the
    shipped JSON files in ``sim/timing/profiles/``."""
    parser = argparse.ArgumentParser(prog="python -m kvroute.sim.timing.priors", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write sim/timing/profiles/<name>.json for every prior")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_profiles():
            print(f"wrote {path}")
    for name, doc in shipped_documents().items():
        eng = doc["engine"]
        print(
            f"\n{name}: num_gpu_blocks {eng['num_gpu_blocks']}, "
            f"batch {eng['max_num_batched_tokens']}/{eng['max_num_seqs']}"
        )
        print(sanity_report(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
