"""Derived priors: profiles computed from spec sheets, the model's config and stated efficiencies.

A prior is what the simulator uses before a worker has been measured (``calibrate`` replaces it
with fitted numbers). Everything here is arithmetic on public numbers:

- the GPU's memory as the driver reports it (``nvidia-smi``), its peak dense bf16 and fp8 tensor
  FLOP/s, its memory bandwidth and its NVLink/PCIe bandwidth from NVIDIA's data sheets (a row of
  the table ``data/gpus.csv``, :class:`~kvroute.sim.timing.specs.GpuSpec`);
- the model's shapes from its ``config.json`` on Hugging Face (``data/models/*.json`` or any local
  file, :class:`~kvroute.sim.timing.specs.ModelSpec`);
- efficiency factors, stated as assumptions from public knowledge of what vLLM achieves and
  **not** tuned against the lab's runs (:class:`Efficiency`, :class:`ParallelEfficiency`);
- vLLM 0.11's memory rule and batch defaults, and its tensor-parallel sharding: weights, KV heads
  (replicated below ``tp``) and FLOPs split across ranks, two all-reduces per layer, the KV pool
  bounded by the smallest rank.

:func:`derive_profile` takes any GPU of the table, any model (shipped name or ``config.json``),
``tp``, ``dtype`` (bf16/fp8) and ``kv_cache_dtype`` (auto/fp8); ``kvroute profiles derive`` is
its command (docs/guide/derive-a-profile.md). With ``tp=1`` and bf16 the document is exactly the
one the shipped Qwen2.5-7B priors were written from.

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
from typing import NamedTuple

from kvroute.traces.outputs import write_text_atomic
from kvroute.sim.engine.scheduler_output import prefill_pairs
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.profile import MemoryModel, profile_from_dict
from kvroute.sim.timing.specs import VOCAB_PADDING, GpuSpec, ModelSpec, gpu_spec, model_spec
from kvroute.sim.timing.vllm_versions import STUDY, VllmDefaults, defaults as vllm_defaults, family, parse_version

MiB = 2**20
GiB = 2**30

#: Date stamped into every derived profile's provenance (fixed so the files do not drift).
PROVENANCE_DATE = "2026-11-29"

#: Memory outside PyTorch's allocator that grows during vLLM's profiling run (cuBLAS/cuDNN
#: workspaces, NCCL and allocator fragmentation); a stated constant, in bytes. vLLM logs show
#: 0.03-0.3 GiB for one GPU without tensor parallelism and 1-2 GiB with NCCL; 0.5 GiB sits at the
#: lower end of the 0.5-1 GiB range this project assumes.
NON_TORCH_BYTES = 512 * MiB

#: Memory vLLM sets aside for CUDA graphs before sizing the KV cache, from 0.21 (``v1/worker/
#: gpu_worker.py: determine_available_memory`` subtracts ``cudagraph_memory_estimate_applied``),
#: per rank, in bytes; a stated constant. vLLM measures it at start-up and logs it ("Estimated CUDA
#: graph memory: X GiB total"): public logs show 0.17-0.36 GiB for a few to 16 captured sizes, and
#: vLLM's earlier start-up note said graphs "can take additional 1~3 GiB memory per GPU"; 1 GiB,
#: for the default capture sizes, is stated, not measured. ``profiles derive
#: --cudagraph-memory-gib`` takes the figure a server logged.
CUDAGRAPH_BYTES = GiB


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------


# GPU rows and model shapes are data (sim/timing/data/); these names are kept for the shipped priors.
RTX_A6000 = gpu_spec("RTX-A6000")
A100_SXM_40GB = gpu_spec("A100-40GB-SXM")
A100_SXM_80GB = gpu_spec("A100-80GB-SXM")
H100_SXM_80GB = gpu_spec("H100-SXM")

QWEN25_7B = model_spec("qwen2.5-7b")


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
        _check_factors(self, ("linear_flops", "attention_flops", "weight_bandwidth", "kv_bandwidth"))


def _check_factors(factors, shares: tuple[str, ...]) -> None:
    """Every field of the dataclass ``factors`` finite and >= 0, and each of ``shares`` in (0, 1].

    Raises:
        ValueError: naming the class and the field.
    """
    kind = type(factors).__name__
    for name in shares:
        value = getattr(factors, name)
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{kind}.{name} must be in (0, 1], got {value!r}")
    for name, value in asdict(factors).items():
        if not (value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"{kind}.{name} must be finite and >= 0, got {value!r}")


# --------------------------------------------------------------------------------------------
# vLLM rules
# --------------------------------------------------------------------------------------------


def get_batch_defaults(gpu: GpuSpec, vllm_version: str = STUDY) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` of ``vllm_version`` picks on
    this GPU.

    Mirrors ``vllm/engine/arg_utils.py`` (``get_batch_defaults``, OpenAI API server context): in
    vLLM 0.11, devices with at least 70 GiB whose name does not contain ``"a100"`` (H100/H200
    class) get 8192 / 1024; all others (A6000, A100 40 GB and, by the A100 exception, A100 80 GB)
    get 2048 / 256 (the values the seed study's ``vllm serve`` runs used). From 0.32, devices of
    at least 160 GiB (B200) get 16384 / 1024 (:meth:`~kvroute.sim.timing.vllm_versions.VllmDefaults.batch_defaults`).
    """
    return vllm_defaults(vllm_version).batch_defaults(gpu.memory_bytes, gpu.name)


def activation_peak_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> int:
    """Peak activation bytes of vLLM's profiling run on one rank (a stated simple rule).

    vLLM profiles one forward pass over ``max_num_batched_tokens`` tokens and a sampler pass
    over ``max_num_seqs`` positions (``vllm/v1/worker/gpu_model_runner.py: profile_run``). The
    rule keeps, per token, the bf16 residual stream and one layer's hidden output
    (2 x hidden, whole on every rank) plus the MLP's gate/up output and activated product
    (3 x intermediate / tp, split across ranks), and per sampled position the logits in bf16
    and their fp32 copy (6 bytes x vocab; the logits are gathered whole on every rank).
    """
    per_token = (2 * model.hidden_size + 3 * model.intermediate_size // tp) * model.dtype_bytes
    per_seq = model.vocab_size * (model.dtype_bytes + 4)
    return max_num_batched_tokens * per_token + max_num_seqs * per_seq


@dataclass(frozen=True, slots=True)
class ParallelEfficiency:
    """Stated factors of tensor parallelism and fp8 (assumptions, not fits; the same for every GPU).

    Attributes:
        allreduce_bandwidth: share of the link's one-direction bandwidth a ring all-reduce's bus
            bandwidth reaches. 0.7: nccl-tests ``all_reduce_perf`` reports bus bandwidths of
            roughly 70-85 % of the one-direction NVLink figure for large messages, less for the
            0.1-10 MB messages of one layer; 0.7 is stated, not measured here.
        allreduce_latency_nvlink_s: fixed time of one all-reduce over NVLink, s. 8 us: vLLM's
            custom all-reduce for small messages (one or two shots over NVLink/NVSwitch) is
            reported at a few microseconds to about ten; stated.
        allreduce_latency_pcie_s: fixed time of one all-reduce over PCIe (NCCL, no custom
            all-reduce), s. 25 us; stated.
        nccl_bytes: extra memory outside PyTorch per rank with tensor parallelism (NCCL
            communicators and buffers, vLLM's custom all-reduce buffers), bytes. 1 GiB: the
            :data:`NON_TORCH_BYTES` note's vLLM logs show 1-2 GiB non-torch memory with NCCL against
            0.03-0.3 GiB without; 0.5 GiB + 1 GiB = 1.5 GiB sits in that range.
        fp8_linear_flops: share of the fp8 peak that fp8 GEMMs reach (when the GPU has fp8 tensor
            cores). 0.6: the bf16 factor (:class:`Efficiency`), stated; fp8 GEMMs reach a similar
            share of their (doubled) peak at large shapes and less at small ones.
    """

    allreduce_bandwidth: float = 0.7
    allreduce_latency_nvlink_s: float = 8e-6
    allreduce_latency_pcie_s: float = 25e-6
    nccl_bytes: int = GiB
    fp8_linear_flops: float = 0.6

    def __post_init__(self) -> None:
        _check_factors(self, ("allreduce_bandwidth", "fp8_linear_flops"))


DTYPES = {"bf16": 2, "fp8": 1}
"""Weight dtypes ``--dtype`` takes and their bytes per weight (fp8: the linear layers' weights;
embedding, LM head, norms and biases stay bf16, as vLLM's fp8 quantization keeps them)."""

KV_CACHE_DTYPES = {"auto": 2, "fp8": 1}
"""``--kv-cache-dtype`` values and bytes per KV element (auto: the activations' bf16, also with
fp8 weights, as in vLLM)."""


def allreduce_buffer_bytes_per_token(model: ModelSpec) -> int:
    """Bytes one token puts into the all-reduces of one forward pass: 2 per layer of its bf16
    activations, ``2 x layers x hidden x 2`` (the volume the all-reduces reduce, before the ring's
    ``2 (tp - 1) / tp`` factor)."""
    return 2 * model.num_layers * model.hidden_size * 2


def allreduce_bytes_per_token(model: ModelSpec, tp: int) -> int:
    """Bytes one rank sends per token per forward pass in its all-reduces: 2 all-reduces per layer
    (after attention's o_proj and the MLP's down_proj, ``RowParallelLinear``) of the token's bf16
    activations (hidden x 2 bytes), each a ring all-reduce sending ``2 (tp - 1) / tp`` of the
    buffer; 0 without tensor parallelism. The value is exact when ``2 (tp - 1) x hidden x 2``
    divides by ``tp`` (it does for even hidden sizes and tp a power of two)."""
    if tp == 1:
        return 0
    return 2 * model.num_layers * 2 * (tp - 1) * model.hidden_size * 2 // tp


def derive_profile(
    gpu: GpuSpec | str,
    model: ModelSpec | str | Path = QWEN25_7B,
    eff: Efficiency = Efficiency(),
    vllm_version: str = STUDY,
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int | None = None,
    max_model_len: int | None = None,
    tp: int = 1,
    dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    par: ParallelEfficiency = ParallelEfficiency(),
    cudagraph_bytes: int | None = None,
) -> dict:
    """A profile document (the layout of ``kvroute.sim.timing.profile``) derived from specs.

    Args:
        gpu: the GPU, a :class:`GpuSpec` or a name of ``data/gpus.csv`` (``"H100-SXM"``).
        model: the model's shapes, a :class:`ModelSpec`, a shipped model's name
            (``"llama-3.1-70b"``) or the path of a Hugging Face ``config.json``.
        eff: stated efficiency factors and overheads.
        vllm_version: the vLLM release the prior stands for (default: the seed study's,
            ``vllm_versions.STUDY``, 0.11.0, as the shipped GPU priors are; ``kvroute profiles
            derive`` defaults to ``vllm_versions.CURRENT``); its defaults fill every setting
            left None and the engine's ``async_scheduling`` (``kvroute.sim.timing.vllm_versions``:
            0.11 block 16, utilisation 0.9, sync; 0.20-0.33 block 16, 0.92, async on CUDA; 0.34
            block 64, 1.0, async).
        gpu_memory_utilization: vLLM's share of each device for this instance; None: the
            release's default.
        max_num_batched_tokens, max_num_seqs: scheduler limits; ``None`` takes
            :func:`get_batch_defaults` for this GPU and release.
        block_size: tokens per KV block; None: the release's default (16; 64 from 0.34). A
            block size or a ``gpu_memory_utilization`` other than the release's is in the name
            (``-block64``, ``-mem0.85``).
        max_model_len: longest sequence in tokens; ``None``: the model's
            ``max_position_embeddings`` (Qwen2.5-7B-Instruct's 32768).
        tp: tensor-parallel size: one worker spans ``tp`` GPUs.
        dtype: weights, ``"bf16"`` or ``"fp8"``.
        kv_cache_dtype: ``"auto"`` (bf16) or ``"fp8"``.
        par: stated factors of tensor parallelism and fp8.
        cudagraph_bytes: memory vLLM sets aside for CUDA graphs on each rank before sizing the
            KV cache, bytes (the "Estimated CUDA graph memory" a server logs); None: the
            release's, :data:`CUDAGRAPH_BYTES` from 0.21 (stated), 0 before. A value other than
            the release's is in the name (``-cg0.5``, GiB).

    Returns:
        A dict with sections name, hardware, model, engine, memory, step_cost, overheads,
        provenance and sources (and ``parallel`` when tp > 1 or a dtype is fp8). Times are
        seconds; memory is bytes, per rank.

    Raises:
        InputError: unknown GPU or model name, or a bad config file.
        ValueError: ``tp``, ``dtype`` or ``kv_cache_dtype`` not allowed for this model, no KV
            cache fits, or the cache cannot hold one ``max_model_len`` request (vLLM refuses to
            start in that case).
    """
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    model = model if isinstance(model, ModelSpec) else model_spec(model)
    settings = _settings(gpu, model, vllm_version, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                         block_size, max_model_len, tp, dtype, kv_cache_dtype, cudagraph_bytes)
    mem = _rank_memory(gpu, model, settings, par)
    cost = _step_costs(gpu, model, settings, mem, eff, par)
    return _document(gpu, model, settings, mem, cost, eff, par)


# --------------------------------------------------------------------------------------------
# The parts of derive_profile
# --------------------------------------------------------------------------------------------


class _Settings(NamedTuple):
    """The engine settings a profile is derived for, the release's defaults filled in.

    Attributes:
        release: the defaults of ``vllm_version``.
        vllm_version: the release as given (not normalised).
        block_size: tokens per KV block.
        gpu_memory_utilization: vLLM's share of each device.
        max_model_len: longest sequence, tokens.
        default_tokens, default_seqs: ``vllm serve``'s ``max_num_batched_tokens`` (tokens) and
            ``max_num_seqs`` on this GPU for this release.
        max_num_batched_tokens, max_num_seqs: the scheduler limits in force (tokens, sequences).
        tp: tensor-parallel size.
        dtype: weights, ``"bf16"`` or ``"fp8"``.
        kv_cache_dtype: ``"auto"`` or ``"fp8"``.
        cudagraph_bytes: CUDA-graph memory set aside per rank before the KV cache, bytes.
        cudagraph_given: whether ``cudagraph_bytes`` was given (else the release's default).
    """

    release: VllmDefaults
    vllm_version: str
    block_size: int
    gpu_memory_utilization: float
    max_model_len: int
    default_tokens: int
    default_seqs: int
    max_num_batched_tokens: int
    max_num_seqs: int
    tp: int
    dtype: str
    kv_cache_dtype: str
    cudagraph_bytes: int = 0
    cudagraph_given: bool = False

    @property
    def plain(self) -> bool:
        """tp 1 with bf16 weights and KV cache (the shipped priors' case): the step costs use the
        model's whole, unpadded counts, and the document has no ``parallel`` section."""
        return self.tp == 1 and self.dtype == "bf16" and self.kv_cache_dtype == "auto"


def _settings(
    gpu: GpuSpec,
    model: ModelSpec,
    vllm_version: str,
    gpu_memory_utilization: float | None,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    block_size: int | None,
    max_model_len: int | None,
    tp: int,
    dtype: str,
    kv_cache_dtype: str,
    cudagraph_bytes: int | None = None,
) -> _Settings:
    """:func:`derive_profile`'s arguments checked, every None replaced by the release's default
    (block size in tokens, memory share, CUDA-graph memory: :data:`CUDAGRAPH_BYTES` from 0.21, else
    0), the model's ``max_position_embeddings`` (tokens) or :func:`get_batch_defaults` for this GPU.

    Raises:
        ValueError: a version that does not parse, an unknown ``dtype`` or ``kv_cache_dtype``, a
            ``tp`` that is not an integer or does not split the model (:meth:`ModelSpec.check_tp`),
            a negative ``cudagraph_bytes``, a size or limit below 1, or a memory share outside
            (0, 1].
    """
    if parse_version(vllm_version) is None:
        raise ValueError(f"vLLM version must look like 0.11 or 0.34.0, got {vllm_version!r}")
    release = vllm_defaults(vllm_version)
    block_size = release.block_size if block_size is None else block_size
    gpu_memory_utilization = release.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    if type(tp) is not int:
        raise ValueError(f"tensor parallel size must be an integer, got {tp!r}")
    model.check_tp(tp)
    max_model_len = model.max_position_embeddings if max_model_len is None else max_model_len
    default_tokens, default_seqs = get_batch_defaults(gpu, vllm_version)
    if cudagraph_bytes is not None and not (type(cudagraph_bytes) is int and cudagraph_bytes >= 0):
        raise ValueError(f"CUDA-graph memory must be a whole number of bytes >= 0, got {cudagraph_bytes!r}")
    for name, value in (("block_size", block_size), ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len)):
        if value is not None and not (type(value) is int and value >= 1):
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not (isinstance(gpu_memory_utilization, (int, float)) and 0.0 < gpu_memory_utilization <= 1.0):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    return _Settings(
        release=release,
        vllm_version=vllm_version,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        default_tokens=default_tokens,
        default_seqs=default_seqs,
        max_num_batched_tokens=default_tokens if max_num_batched_tokens is None else max_num_batched_tokens,
        max_num_seqs=default_seqs if max_num_seqs is None else max_num_seqs,
        tp=tp,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        cudagraph_bytes=(CUDAGRAPH_BYTES if release.cudagraph_memory_profiled else 0) if cudagraph_bytes is None
        else cudagraph_bytes,
        cudagraph_given=cudagraph_bytes is not None,
    )


class _RankMemory(NamedTuple):
    """One rank's weights and KV cache, and the KV pool vLLM would allocate.

    Attributes:
        weight_bytes: weights on one rank, bytes.
        embedding_params: input-embedding parameters on one rank (a count, not bytes).
        non_embedding_params: decoder-layer parameters and the final norm on one rank (a count).
        kv_bytes_per_token: KV-cache bytes one token takes on one rank.
        ranks: the memory model of every rank, in rank order.
        memory: the rank with the fewest KV blocks (it bounds the pool).
        num_gpu_blocks: KV blocks of the pool (each of ``block_size`` tokens).
    """

    weight_bytes: int
    embedding_params: int
    non_embedding_params: int
    kv_bytes_per_token: int
    ranks: list[MemoryModel]
    memory: MemoryModel
    num_gpu_blocks: int


def _rank_memory(gpu: GpuSpec, model: ModelSpec, s: _Settings, par: ParallelEfficiency) -> _RankMemory:
    """Per-rank bytes (weights, activation peak, non-torch memory, KV per block) and vLLM's
    KV-capacity rule applied to every rank; memory in bytes, capacity in blocks.

    Raises:
        ValueError: no KV cache fits (:meth:`MemoryModel.num_gpu_blocks`), or the usable blocks
            (all but vLLM's null block) cannot hold one ``max_model_len`` request.
    """
    tp, block_size = s.tp, s.block_size
    wbytes, kvbytes, bf16 = DTYPES[s.dtype], KV_CACHE_DTYPES[s.kv_cache_dtype], model.dtype_bytes

    # Per-rank parameters and bytes (every rank holds the same shard sizes: heads, MLP and the
    # padded vocabulary divide evenly, and KV heads are replicated below tp).
    linear_params = model.linear_params_per_rank(tp)
    other_params = model.other_layer_params_per_rank(tp)
    embedding_params = model.embedding_params_per_rank(tp)
    lm_head_params = model.lm_head_params_per_rank(tp)
    non_embedding_params = model.non_embedding_params_per_rank(tp)
    weight_bytes = linear_params * wbytes + (other_params + embedding_params + lm_head_params) * bf16
    kv_bytes_per_token = model.kv_bytes_per_token_per_rank(tp, kvbytes)
    kv_bytes_per_block = kv_bytes_per_token * block_size
    non_torch = NON_TORCH_BYTES + (par.nccl_bytes if tp > 1 else 0)

    # vLLM's KV-capacity rule on every rank (each rank's free memory / its own bytes per block,
    # which hold only its KV heads); the smallest rank bounds the pool
    # (vllm/v1/core/kv_cache_utils.py: get_kv_cache_configs, "Change the num_blocks of each
    # rank to the smallest among all ranks"). Under this model every rank holds the same shard
    # sizes, so the counts are equal; the list keeps the rule visible.
    ranks = [
        MemoryModel(
            gpu_memory_bytes=gpu.memory_bytes,
            weight_bytes=weight_bytes,
            activation_peak_bytes=activation_peak_bytes(model, s.max_num_batched_tokens, s.max_num_seqs, tp),
            non_torch_bytes=non_torch,
            kv_bytes_per_block=kv_bytes_per_block,
            cudagraph_bytes=s.cudagraph_bytes,
        )
        for _ in range(tp)
    ]
    memory = min(ranks, key=lambda m: m.num_gpu_blocks(s.gpu_memory_utilization))
    num_gpu_blocks = memory.num_gpu_blocks(s.gpu_memory_utilization)
    if (num_gpu_blocks - 1) * block_size < s.max_model_len:
        raise ValueError(
            f"{gpu.name}: {num_gpu_blocks - 1} usable blocks of {block_size} tokens cannot hold "
            f"one request of max_model_len {s.max_model_len}"
        )
    return _RankMemory(
        weight_bytes=weight_bytes,
        embedding_params=embedding_params,
        non_embedding_params=non_embedding_params,
        kv_bytes_per_token=kv_bytes_per_token,
        ranks=ranks,
        memory=memory,
        num_gpu_blocks=num_gpu_blocks,
    )


class _StepCosts(NamedTuple):
    """The step-cost coefficients of one rank (ranks run in lockstep) and the all-reduce terms
    in them.

    Attributes:
        step: the ``step_cost`` section (its coefficients in seconds; ``step_overhead_s``
            includes ``allreduce_step_s``, ``per_token_s`` includes ``allreduce_per_token_s``).
        fp8_compute: the linear layers run on fp8 tensor cores (fp8 weights and a GPU that has them).
        link_kind, link_bw: the link a ``tp``-way all-reduce runs over (``"nvlink"`` or
            ``"pcie"``) and its one-direction bandwidth, bytes/s (also computed for tp 1).
        ar_bytes: bytes one rank sends per token in its all-reduces (0 for tp 1).
        ar_latency: fixed seconds of one all-reduce over ``link_kind``.
        allreduce_per_token_s: all-reduce seconds per token (0.0 for tp 1).
        allreduce_step_s: all-reduce latency per step, seconds (0.0 for tp 1).
    """

    step: StepCost
    fp8_compute: bool
    link_kind: str
    link_bw: float
    ar_bytes: int
    ar_latency: float
    allreduce_per_token_s: float
    allreduce_step_s: float


def _step_costs(
    gpu: GpuSpec, model: ModelSpec, s: _Settings, mem: _RankMemory, eff: Efficiency, par: ParallelEfficiency
) -> _StepCosts:
    """Step-cost coefficients in seconds from the roofline of one rank: FLOPs over stated shares of
    peak FLOP/s, bytes over stated shares of memory or link bandwidth (:class:`_StepCosts`)."""
    tp, plain = s.tp, s.plain
    bf16 = model.dtype_bytes
    # Step-cost coefficients (seconds), per rank (ranks run in lockstep).
    bw, peak = gpu.memory_bandwidth_bytes_per_s, gpu.peak_bf16_flops
    fp8_compute = s.dtype == "fp8" and gpu.peak_fp8_flops is not None
    linear_peak = gpu.peak_fp8_flops * par.fp8_linear_flops if fp8_compute else peak * eff.linear_flops
    # every weight is read each step but the input embedding, whose rows are only gathered; a
    # tied LM head reads that same matrix whole, so then nothing is left out
    streamed_weight_bytes = mem.weight_bytes - (0 if model.tie_word_embeddings else mem.embedding_params * bf16)
    weight_load_s = streamed_weight_bytes / (bw * eff.weight_bandwidth)
    link_kind, link_bw = gpu.interconnect(tp)
    ar_bytes = allreduce_bytes_per_token(model, tp)
    allreduce_per_token_s = ar_bytes / (link_bw * par.allreduce_bandwidth) if tp > 1 else 0.0
    ar_latency = par.allreduce_latency_nvlink_s if link_kind == "nvlink" else par.allreduce_latency_pcie_s
    allreduce_step_s = 2 * model.num_layers * ar_latency if tp > 1 else 0.0
    if plain:
        per_token_s = 2 * model.non_embedding_params / (peak * eff.linear_flops)
    else:
        per_token_s = 2 * mem.non_embedding_params / linear_peak + allreduce_per_token_s
    lm_head_s = 2 * model.hidden_size * model.vocab_per_rank(tp) / (peak * eff.linear_flops)
    if plain:
        lm_head_s = 2 * model.hidden_size * model.vocab_size / (peak * eff.linear_flops)
    sampling_s = model.vocab_size * eff.sampler_bytes_per_logit / (bw * eff.weight_bandwidth)
    per_request_s = lm_head_s + sampling_s + eff.per_request_overhead_s
    attn_flops_per_pair = 4 * model.num_layers * (model.num_attention_heads // tp) * model.head_dim
    prefill_attn_s = attn_flops_per_pair / (peak * eff.attention_flops)
    decode_attn_s = mem.kv_bytes_per_token / (bw * eff.kv_bandwidth)
    step_overhead_s = eff.step_overhead_s + allreduce_step_s
    step = StepCost(step_overhead_s=step_overhead_s, weight_load_s=weight_load_s, per_token_s=per_token_s,
                    per_request_s=per_request_s, prefill_attn_s=prefill_attn_s, decode_attn_s=decode_attn_s)
    return _StepCosts(
        step=step,
        fp8_compute=fp8_compute,
        link_kind=link_kind,
        link_bw=link_bw,
        ar_bytes=ar_bytes,
        ar_latency=ar_latency,
        allreduce_per_token_s=allreduce_per_token_s,
        allreduce_step_s=allreduce_step_s,
    )


def _profile_name(gpu: GpuSpec, model: ModelSpec, s: _Settings) -> str:
    """The profile's name: ``<gpu>-<model>``, then ``-tp<N>``, ``-fp8``, ``-kvfp8``, ``-vllm<x.y>``,
    ``-block<N>``, ``-mem<u>``, ``-cg<GiB>``, ``-len<N>``, ``-tokens<N>`` and ``-seqs<N>`` for each
    setting that is not the plain or the release's default (``max_model_len``'s: the model's
    ``max_position_embeddings``; the batch limits': ``vllm serve``'s on this GPU)."""
    tp, dtype, kv_cache_dtype, release = s.tp, s.dtype, s.kv_cache_dtype, s.release
    suffix = (f"-tp{tp}" if tp > 1 else "") + ("-fp8" if dtype == "fp8" else "") + (
        "-kvfp8" if kv_cache_dtype == "fp8" else "")
    # NOTE: a release other than the study's is in the name, so no note meant for the shipped prior matches it
    return f"{gpu.short_name}-{model.short_name}{suffix}" + (
        "" if family(s.vllm_version) == family(STUDY) else f"-vllm{family(s.vllm_version)}") + (
        "" if s.block_size == release.block_size else f"-block{s.block_size}") + (
        "" if s.gpu_memory_utilization == release.gpu_memory_utilization else f"-mem{s.gpu_memory_utilization:g}") + (
        "" if not s.cudagraph_given or s.cudagraph_bytes == (CUDAGRAPH_BYTES if release.cudagraph_memory_profiled
                                                             else 0) else f"-cg{s.cudagraph_bytes / GiB:g}") + (
        "" if s.max_model_len == model.max_position_embeddings else f"-len{s.max_model_len}") + (
        "" if s.max_num_batched_tokens == s.default_tokens else f"-tokens{s.max_num_batched_tokens}") + (
        "" if s.max_num_seqs == s.default_seqs else f"-seqs{s.max_num_seqs}")


def _weight_dtype_text(dtype: str) -> str:
    """How the weights are stored, in words (``"bf16"``, or which weights are fp8)."""
    return "bf16" if dtype == "bf16" else "fp8 linear weights, bf16 embedding/LM head/norms/biases"


def _provenance_notes(gpu: GpuSpec, model: ModelSpec, s: _Settings, cost: _StepCosts, eff: Efficiency,
                      par: ParallelEfficiency) -> str:
    """``provenance.notes``: what the prior stands for and the stated efficiencies it assumes."""
    tp, plain = s.tp, s.plain
    eff_text = (
        f"linear {eff.linear_flops:g} of peak FLOP/s, prefill attention {eff.attention_flops:g}, "
        f"weights {eff.weight_bandwidth:g} of bandwidth, KV reads {eff.kv_bandwidth:g}"
    )
    if not plain:
        eff_text += (f", fp8 GEMMs {par.fp8_linear_flops:g} of fp8 peak, all-reduce "
                     f"{par.allreduce_bandwidth:g} of link bandwidth + {cost.ar_latency * 1e6:g} us each")
    return (
        f"Roofline prior for {model.name} "
        f"({'bf16' if plain else _weight_dtype_text(s.dtype) + ', KV ' + s.kv_cache_dtype}"
        f"{'' if tp == 1 else f', tensor parallel {tp}'}) on {gpu.name} under vLLM {s.vllm_version}, "
        f"from spec sheets and config.json with stated efficiencies ({eff_text}); not fitted "
        "to any measurement. Replace with a calibrated profile once the worker is measured."
    )


def _sources(gpu: GpuSpec, model: ModelSpec, s: _Settings, cost: _StepCosts, eff: Efficiency,
             par: ParallelEfficiency) -> dict[str, str]:
    """The document's ``sources`` section: for each field (dotted path), where its value comes from
    or the rule that computes it, in words."""
    tp, plain, vllm_version, release = s.tp, s.plain, s.vllm_version, s.release
    block_size, gpu_memory_utilization, max_model_len = s.block_size, s.gpu_memory_utilization, s.max_model_len
    kv_cache_dtype, kvbytes = s.kv_cache_dtype, KV_CACHE_DTYPES[s.kv_cache_dtype]
    link_kind, link_bw, ar_bytes, ar_latency = cost.link_kind, cost.link_bw, cost.ar_bytes, cost.ar_latency
    model_id = model.name.rstrip("/").split("/")[-1]
    dtype_text = _weight_dtype_text(s.dtype)
    sources = {
        "hardware.gpu": "device name as CUDA reports it",
        "hardware.gpu_memory_bytes": gpu.memory_source,
        "hardware.peak_bf16_dense_flops": gpu.flops_source,
        "hardware.memory_bandwidth_bytes_per_s": gpu.bandwidth_source,
        "model": model.source,
        "model.non_embedding_params": "total_params - embedding (vocab x hidden) - untied LM head (vocab x hidden)",
        "engine.vllm_version": ("the seed study's engine (vLLM 0.11.0, default settings)" if vllm_version == STUDY
                                else f"given: --vllm-version {vllm_version} (its default settings)"),
        "engine.block_size": (f"vLLM {vllm_version} default {block_size} (vllm/config/cache.py: 16 through 0.33, "
                              "DEFAULT_BLOCK_SIZE 64 from 0.34)" if block_size == release.block_size
                              else f"given: {block_size}"),
        "engine.gpu_memory_utilization": (
            f"vLLM {vllm_version} default {gpu_memory_utilization:g} (vllm/config/cache.py: 0.9 through 0.19, 0.92 "
            "from 0.20; from 0.34 unset resolves to 1.0 on CUDA with the extensible KV cache, "
            "CacheConfig.resolved_gpu_memory_utilization)" if gpu_memory_utilization == release.gpu_memory_utilization
            else f"given: {gpu_memory_utilization:g}"),
        "engine.async_scheduling": (
            f"vLLM {vllm_version} default on CUDA: {'on' if release.async_scheduling_cuda else 'off'} "
            "(vllm/config/vllm.py: SchedulerConfig.async_scheduling None resolves to True from 0.14)"),
        **({"engine.async_cpu_fraction": (
            f"step_overhead_s's CPU part, {eff.step_overhead_s * 1e3:g} ms of {cost.step.step_overhead_s * 1e3:.3g} ms: "
            "async scheduling overlaps the host's work with the GPU, not the tensor-parallel all-reduce latency "
            "(kvroute.sim.timing.async_overlap)")} if cost.allreduce_step_s else {}),
        "engine.max_num_batched_tokens": (
            f"vllm serve default on {gpu.name}: {s.default_tokens} (vllm/engine/arg_utils.py: "
            "get_batch_defaults; >= 70 GiB and not A100: 8192, else 2048"
            + ("; >= 160 GiB: 16384 from 0.32" if release.large_gpu_tier else "") + ")"
            if s.max_num_batched_tokens == s.default_tokens else f"given: {s.max_num_batched_tokens}"
        ),
        "engine.max_num_seqs": (
            f"vllm serve default on {gpu.name}: {s.default_seqs} (vllm/engine/arg_utils.py: "
            "get_batch_defaults; >= 70 GiB and not A100: 1024, else 256"
            + ("; >= 160 GiB: 1024 from 0.32" if release.large_gpu_tier else "") + ")"
            if s.max_num_seqs == s.default_seqs else f"given: {s.max_num_seqs}"
        ),
        "engine.max_model_len": (
            f"max_position_embeddings {model.max_position_embeddings} in {model_id}'s config.json"
            if max_model_len == model.max_position_embeddings else f"given: {max_model_len}"
        ),
        "engine.num_gpu_blocks": (
            "floor((gpu_memory_bytes x gpu_memory_utilization - weight_bytes - activation_peak_bytes "
            "- non_torch_bytes" + (" - cudagraph_bytes" if s.cudagraph_bytes else "")
            + ") / kv_bytes_per_block) (vllm/v1/worker/gpu_worker.py: "
            "determine_available_memory; kvroute.sim.timing.profile.MemoryModel)"
            + ("" if tp == 1 else "; per rank, the smallest rank's count bounds the pool "
               "(vllm/v1/core/kv_cache_utils.py: get_kv_cache_configs)")
        ),
        "memory.gpu_memory_bytes": gpu.memory_source,
        "memory.weight_bytes": "total_params x 2 bytes (bf16)" + (
            "" if model.vocab_size % VOCAB_PADDING == 0 else
            f", the embedding and LM head at the vocabulary padded to a multiple of {VOCAB_PADDING}") if plain else (
            f"one rank's share ({dtype_text}): q/o/MLP weights / tp, k/v by KV heads per rank, "
            "embedding and LM head by padded vocab / tp, norms and o bias whole"
        ),
        "memory.activation_peak_bytes": (
            "stated rule (kvroute.sim.timing.priors.activation_peak_bytes): max_num_batched_tokens x "
            "(2 x hidden + 3 x intermediate) x 2 bytes + max_num_seqs x vocab x 6 bytes (bf16 + fp32 "
            "logits), for vLLM's profile_run (vllm/v1/worker/gpu_model_runner.py)"
            + ("" if tp == 1 else "; intermediate / tp on each rank")
        ),
        "memory.non_torch_bytes": f"stated constant {NON_TORCH_BYTES / GiB:g} GiB (CUDA/cuBLAS workspaces, allocator slack)" + (
            "" if tp == 1 else f" + {par.nccl_bytes / GiB:g} GiB per rank for NCCL and custom all-reduce buffers (stated)"),
        **({"memory.cudagraph_bytes": (
            f"given: {s.cudagraph_bytes / GiB:g} GiB" if s.cudagraph_given else
            f"stated {CUDAGRAPH_BYTES / GiB:g} GiB: vLLM {vllm_version} sets aside its CUDA graphs' estimated memory "
            "before the KV cache (v1/worker/gpu_worker.py: determine_available_memory, "
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default since 0.21); the server logs its figure "
            "(\"Estimated CUDA graph memory\"): give it with --cudagraph-memory-gib")} if s.cudagraph_bytes else {}),
        "memory.kv_bytes_per_block": "2 (K,V) x layers x kv_heads x head_dim x 2 bytes x block_size" if plain else (
            f"2 (K,V) x layers x KV heads per rank ({model.kv_heads_per_rank(tp)}: max(1, kv_heads / tp), "
            f"vLLM replicates KV heads below tp) x head_dim x {kvbytes} bytes ({kv_cache_dtype}) x block_size"
        ),
        "step_cost.step_overhead_s": f"stated: {eff.step_overhead_s} s per step, vLLM with CUDA graphs" + (
            "" if tp == 1 else f" + 2 all-reduces x {model.num_layers} layers x {ar_latency * 1e6:g} us latency "
                               f"over {link_kind} (stated)"),
        "step_cost.weight_load_s": (
            ("streamed weight bytes (all weights: the tied LM head reads the embedding matrix whole) / "
             if model.tie_word_embeddings else
             "streamed weight bytes (all weights but the input embedding, which is only gathered) / ")
            + f"(bandwidth x {eff.weight_bandwidth:g})" + ("" if plain else ", one rank's share")
        ),
        "step_cost.per_token_s": f"2 x non_embedding_params FLOPs / (peak bf16 x {eff.linear_flops:g})" if plain else (
            f"2 x one rank's non_embedding_params FLOPs / ("
            + (f"peak fp8 x {par.fp8_linear_flops:g}" if cost.fp8_compute else f"peak bf16 x {eff.linear_flops:g}")
            + ")" + ("" if tp == 1 else
                     f" + all-reduce bytes per token {ar_bytes} (2 x layers x 2 (tp-1)/tp x hidden x 2 bytes) / "
                     f"({link_kind} {link_bw / 1e9:g} GB/s one direction x {par.allreduce_bandwidth:g})")
        ),
        "step_cost.per_request_s": (
            f"LM head 2 x hidden x vocab{'' if tp == 1 else ' / tp'} FLOPs / (peak x {eff.linear_flops:g}) + "
            f"sampling vocab x {eff.sampler_bytes_per_logit:g} bytes / (bandwidth x {eff.weight_bandwidth:g}) + "
            f"{eff.per_request_overhead_s:g} s CPU per request"
        ),
        "step_cost.prefill_attn_s": (
            f"4 x layers x heads{'' if tp == 1 else ' / tp'} x head_dim FLOPs per causal pair / "
            f"(peak x {eff.attention_flops:g})"
        ),
        "step_cost.decode_attn_s": (
            f"KV bytes per context token{'' if plain else ' on one rank'} / (bandwidth x {eff.kv_bandwidth:g})"
        ),
        "overheads.api_server_s": "seed study: the API server adds about 100 ms per request",
        "overheads.gateway_s": "seed study: the gateway adds about 1 ms after the Redis fix",
        "overheads.jitter_cv": "stated: lognormal jitter with CV 0.1 (seed study asks for stated, seeded jitter)",
    }
    if not plain:
        sources["hardware.peak_fp8_dense_flops"] = gpu.fp8_source
        sources["parallel.interconnect_bytes_per_s"] = gpu.interconnect_source
        sources["parallel"] = (
            "tensor parallelism as vLLM shards a dense decoder (ColumnParallelLinear q/k/v, gate/up; "
            "RowParallelLinear o, down, each followed by an all-reduce; VocabParallelEmbedding and "
            "ParallelLMHead); stated factors in provenance.parallel_efficiency"
        )
    return sources


def _parallel_section(gpu: GpuSpec, model: ModelSpec, s: _Settings, mem: _RankMemory, cost: _StepCosts,
                      par: ParallelEfficiency) -> dict:
    """The document's ``parallel`` section (tensor parallelism and fp8): bytes per rank or per
    token, seconds per token or per step, and each rank's KV blocks; the link is None for tp 1."""
    tp = s.tp
    return {
        "tensor_parallel_size": tp,
        "interconnect": cost.link_kind if tp > 1 else None,
        "interconnect_bytes_per_s": cost.link_bw if tp > 1 else None,
        "kv_heads_per_rank": model.kv_heads_per_rank(tp),
        "weight_bytes_per_rank": mem.weight_bytes,
        "kv_bytes_per_token_per_rank": mem.kv_bytes_per_token,
        "allreduce_buffer_bytes_per_token": allreduce_buffer_bytes_per_token(model) if tp > 1 else 0,
        "allreduce_bytes_per_token": cost.ar_bytes,
        "allreduce_per_token_s": cost.allreduce_per_token_s,
        "allreduce_latency_per_step_s": cost.allreduce_step_s,
        "nccl_bytes_per_rank": par.nccl_bytes if tp > 1 else 0,
        "linear_compute": "fp8" if cost.fp8_compute else "bf16",
        "blocks_per_rank": [m.num_gpu_blocks(s.gpu_memory_utilization) for m in mem.ranks],
    }


def _document(gpu: GpuSpec, model: ModelSpec, s: _Settings, mem: _RankMemory, cost: _StepCosts, eff: Efficiency,
              par: ParallelEfficiency) -> dict:
    """The profile document :func:`derive_profile` returns, its sections in their order; fp8
    peak, KV cache dtype, ``parallel`` and ``provenance.parallel_efficiency`` only when not plain."""
    plain = s.plain
    name = _profile_name(gpu, model, s)
    notes = _provenance_notes(gpu, model, s, cost, eff, par)
    sources = _sources(gpu, model, s, cost, eff, par)
    doc = {
        "name": name,
        "hardware": {
            "gpu": gpu.name,
            "gpu_memory_bytes": gpu.memory_bytes,
            "peak_bf16_dense_flops": gpu.peak_bf16_flops,
            "memory_bandwidth_bytes_per_s": gpu.memory_bandwidth_bytes_per_s,
        },
        "model": {
            "name": model.name,
            "dtype": "bfloat16" if s.dtype == "bf16" else "fp8",
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
            "vllm_version": s.vllm_version,
            "block_size": s.block_size,
            "num_gpu_blocks": mem.num_gpu_blocks,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "max_num_seqs": s.max_num_seqs,
            "max_model_len": s.max_model_len,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "async_scheduling": s.release.async_scheduling("cuda"),
            # async hides the step's CPU part; the all-reduce latency is GPU time (kvroute.sim.timing.async_overlap)
            **({"async_cpu_fraction": eff.step_overhead_s / cost.step.step_overhead_s} if cost.allreduce_step_s else {}),
        },
        # cudagraph_bytes only where it is set aside (0.21 on), so earlier releases' documents stay as they were
        "memory": {k: v for k, v in asdict(mem.memory).items() if k != "cudagraph_bytes" or v},
        "step_cost": asdict(cost.step),
        "overheads": {
            "api_server_s": eff.api_server_s,
            "gateway_s": eff.gateway_s,
            "jitter_cv": eff.jitter_cv,
        },
        "provenance": {
            "kind": "derived",
            "source": "kvroute.sim.timing.priors",
            "date": PROVENANCE_DATE,
            "notes": notes,
            "efficiency": asdict(eff),
        },
        "sources": sources,
    }
    if not plain:
        doc["hardware"]["peak_fp8_dense_flops"] = gpu.peak_fp8_flops
        doc["model"]["kv_cache_dtype"] = s.kv_cache_dtype
        doc["parallel"] = _parallel_section(gpu, model, s, mem, cost, par)
        doc["provenance"]["parallel_efficiency"] = asdict(par)
    return doc


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


def derive_summary(doc: dict, context_tokens: int = 1000, prompt_tokens: int = 1000) -> str:
    """Plain-text summary of a derived profile: per-rank memory, KV blocks per worker, the decode
    step at batch 1/16/64 (each request at ``context_tokens`` of context) and prefill time per
    token (one ``prompt_tokens`` prompt alone, in chunks of the step budget)."""
    eng, mem, model = doc["engine"], doc["memory"], doc["model"]
    par = doc.get("parallel") or {}
    tp = par.get("tensor_parallel_size", 1)
    gib = 2**30
    link = f", TP{tp} over {par['interconnect']}" if tp > 1 else ""
    blocks = eng["num_gpu_blocks"]
    rows = [
        ("weights per rank", f"{mem['weight_bytes'] / gib:.2f} GiB ({model['dtype']})"),
        ("KV bytes per token per rank", f"{mem['kv_bytes_per_block'] // eng['block_size']:,} B "
         f"(KV cache {model.get('kv_cache_dtype', 'auto')}, {par.get('kv_heads_per_rank', model['num_kv_heads'])} "
         "KV heads per rank)"),
        ("all-reduce bytes per token", f"{par.get('allreduce_buffer_bytes_per_token', 0):,} B reduced, "
         f"{par.get('allreduce_bytes_per_token', 0):,} B sent per rank (ring)"),
        ("KV blocks per worker", f"{blocks:,} of {eng['block_size']} tokens ({blocks * eng['block_size']:,} tokens)"),
        ("batch limits", f"max_num_batched_tokens {eng['max_num_batched_tokens']}, max_num_seqs "
         f"{eng['max_num_seqs']}, max_model_len {eng['max_model_len']:,}"),
        ("vLLM", f"{eng.get('vllm_version', '?')}: block size {eng['block_size']}, gpu_memory_utilization "
         f"{eng['gpu_memory_utilization']:g}, async scheduling "
         f"{ {True: 'on', False: 'off'}.get(eng.get('async_scheduling'), 'not stated')}"
         + (f", {mem['cudagraph_bytes'] / gib:g} GiB per rank set aside for CUDA graphs"
            if mem.get("cudagraph_bytes") else "")),
    ]
    for batch in (1, 16, 64):
        step = decode_step_s(doc, batch, context_tokens)
        rows.append((f"decode step, batch {batch}", f"{step * 1e3:.2f} ms ({1 / step:.1f} tokens/s per request, "
                     f"{context_tokens:,}-token contexts)"))
    prefill = prefill_time_s(doc, prompt_tokens)
    rows.append(("prefill per token", f"{prefill / prompt_tokens * 1e6:.1f} us ({prompt_tokens:,}-token prompt "
                 f"alone: {prefill * 1e3:.1f} ms)"))
    width = max(len(r[0]) for r in rows)
    head = f"{doc['name']}: {model['name']} on {tp} x {doc['hardware']['gpu']}{link} (derived prior, not measured)"
    return "\n".join([head, *(f"  {a:<{width}}  {b}" for a, b in rows)])


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
