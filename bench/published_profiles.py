"""Derived profiles against published measurements: prefill time per token and decode step time.

For each (model, GPU, TP, dtype) that a public source measured, this script derives the kvroute
prior (``kvroute.sim.timing.priors.derive_profile``) and prints, per measure, the published time,
the derived time and the error ``(derived - published) / published``. The measures:

- ``prefill N``: one N-token prompt alone in one engine step, seconds per token;
- ``decode b``: one engine step in which b requests each decode one token after 1,023 tokens of
  context (1,024 KV positions read per request; Vidur's rows use a 1,024-token KV cache).

The published numbers live in ``bench/published/data/published_steps.csv``, one row per measure,
each with its source (repository, commit, paths or URL) and the scope that says which parts were
summed. ``--extract`` rebuilds that file from the upstream repositories when they have been
fetched (``/work/.mirror/microsoft+vidur`` and ``/work/.mirror/ai-dynamo+aiconfigurator``); it
needs git, pandas and pyarrow. Without ``--extract`` only the CSV is read.

Scopes (what the published number sums, and the same parts of the derivation):

- ``layer-compute-no-attn`` (Vidur ``mlp.csv``): per decoder layer, the q/k/v projection,
  rotary embedding, o projection, the two RMSNorms, gate/up projection, activation, down
  projection and residual add (Vidur's ``ExecutionTime`` terms without attention and all-reduce),
  times the layers. Derived: ``max(layer weight bytes / (bandwidth x weight_bandwidth),
  linear FLOPs per token x n)`` -- kvroute's linear term restricted to the decoder layers
  (``weight_load_s`` without the LM head's bytes) and without the all-reduce share of
  ``per_token_s``.
- ``layer-compute`` (Vidur ``mlp.csv`` + ``attention.csv``): the above plus Vidur's attention
  kernel (``attn_prefill`` or ``attn_decode``). Derived: the above plus kvroute's attention term
  (``prefill_attn_s x pairs`` or ``decode_attn_s x KV positions read``).
- ``step-gpu`` (AIConfigurator's vLLM tables): per layer the four GEMMs (qkv, o, gate/up, down)
  from ``gemm_perf``, the attention kernel from ``context_attention_perf`` or
  ``generation_attention_perf`` and, with TP, two of vLLM's custom all-reduces from
  ``custom_allreduce_perf`` (CUDA-graph timing up to 512 tokens, eager above, as vLLM captures
  graphs up to 512); once per step the embedding's all-reduce (TP) and the LM-head GEMM (bf16,
  m = the sampled positions: 1 for a prefill, b for a decode). Not in the tables, so in neither
  side: RMSNorm, rotary, activation, residual adds, embedding gather, sampler, CPU. Derived:
  kvroute's step time less its CPU terms (``Efficiency.step_overhead_s`` and, per request,
  ``per_request_overhead_s`` and the sampler's bytes).
- ``step-e2e`` (a served model's time per output token at concurrency 1): the whole decode step
  as a client sees it. Derived: kvroute's whole decode step.

GEMM shapes missing from AIConfigurator's grid are interpolated linearly in n and k between the
neighbouring grid points (extrapolated from the top two for an LM head wider than 65,536), as
AIConfigurator itself interpolates; the row's ``note`` says so.

Usage::

    python bench/published_profiles.py             # the table from the CSV
    python bench/published_profiles.py --extract   # rebuild the CSV from the fetched repos, then the table
    python bench/published_profiles.py --markdown  # the table as Markdown (for docs/log)
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvroute.sim.engine.scheduler_output import prefill_pairs
from kvroute.sim.timing.priors import derive_profile
from kvroute.sim.timing.profile import profile_from_dict
from kvroute.sim.timing.specs import gpu_spec, model_spec

DATA = Path(__file__).resolve().parent / "published" / "data" / "published_steps.csv"
CONTEXT = 1023  # tokens of context before each decoded token (1,024 KV positions read)
PREFILL_TOKENS = (512, 2048)
DECODE_BATCHES = (1, 16, 64)
MAX_MODEL_LEN = 4096  # only the KV pool depends on it; the step costs do not
VLLM = "0.11.0"  # the release the priors' step costs were stated for (2 ms of CPU per step, no overlap)

COLUMNS = ("source", "repo", "commit", "paths", "model", "gpu", "tp", "dtype", "measure", "tokens", "batch",
           "context", "scope", "published_s", "note")
SCOPES = ("layer-compute-no-attn", "layer-compute", "step-gpu", "step-e2e")


# --------------------------------------------------------------------------------------------
# The published rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """One published measure: ``measure`` is ``prefill`` (``tokens`` in one step, ``published_s``
    per token) or ``decode`` (``batch`` requests at ``context`` tokens each, ``published_s`` per
    step); ``scope`` is one of :data:`SCOPES`."""

    source: str
    repo: str
    commit: str
    paths: str
    model: str
    gpu: str
    tp: int
    dtype: str
    measure: str
    tokens: int
    batch: int
    context: int
    scope: str
    published_s: float
    note: str


def read_published(path: Path = DATA) -> list[Published]:
    """The rows of the published-measures CSV.

    Raises:
        ValueError: a missing column, an unknown scope or measure, a row without a source
            (repository or URL), or a time that is not a positive number; the message names the
            file, the line and the field.
    """
    rows = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, raw in enumerate(reader, start=2):
            def bad(field: str, why: str) -> ValueError:
                return ValueError(f"{path}:{line}: field {field!r}: {why}")

            if not raw["source"] or not raw["repo"]:
                raise bad("repo", "every row needs its source and repository (or URL)")
            if raw["scope"] not in SCOPES:
                raise bad("scope", f"expected one of {', '.join(SCOPES)}, got {raw['scope']!r}")
            if raw["measure"] not in ("prefill", "decode"):
                raise bad("measure", f"expected prefill or decode, got {raw['measure']!r}")
            try:
                value = float(raw["published_s"])
            except ValueError:
                raise bad("published_s", f"not a number: {raw['published_s']!r}") from None
            if not (value > 0 and math.isfinite(value)):
                raise bad("published_s", f"expected a positive time, got {value!r}")
            rows.append(Published(raw["source"], raw["repo"], raw["commit"], raw["paths"], raw["model"], raw["gpu"],
                                  int(raw["tp"]), raw["dtype"], raw["measure"], int(raw["tokens"]),
                                  int(raw["batch"]), int(raw["context"]), raw["scope"], value, raw["note"]))
    return rows


# --------------------------------------------------------------------------------------------
# The derivation's parts
# --------------------------------------------------------------------------------------------


def derived_seconds(row: Published) -> float:
    """kvroute's time for the same measure and scope as ``row`` (per token for a prefill, per
    step for a decode), from ``derive_profile`` with its default efficiency factors for vLLM
    :data:`VLLM`; the bare step time (no asynchronous-scheduling overlap)."""
    model = model_spec(row.model)
    gpu = gpu_spec(row.gpu)
    doc = derive_profile(gpu, model, tp=row.tp, dtype=row.dtype, max_model_len=MAX_MODEL_LEN, vllm_version=VLLM)
    cost = profile_from_dict(doc).step_cost
    eff = doc["provenance"]["efficiency"]
    par = doc.get("parallel") or {}
    bw = gpu.memory_bandwidth_bytes_per_s * eff["weight_bandwidth"]
    if row.measure == "prefill":
        n, reqs, pairs, reads = row.tokens, 1, prefill_pairs(0, row.tokens), 0
    else:
        n, reqs, pairs, reads = row.batch, row.batch, 0.0, row.batch * (row.context + 1)
    if row.scope in ("step-gpu", "step-e2e"):
        step = cost.step_time(n, reqs, pairs, reads)
        if row.scope == "step-gpu":
            sampling_s = model.vocab_size * eff["sampler_bytes_per_logit"] / bw
            step -= eff["step_overhead_s"] + reqs * (eff["per_request_overhead_s"] + sampling_s)
        return step / n if row.measure == "prefill" else step
    # decoder layers only: no embedding or LM head bytes, no all-reduce
    head_bytes = (model.embedding_params_per_rank(row.tp) + model.lm_head_params_per_rank(row.tp)) * model.dtype_bytes
    layer_load_s = (doc["memory"]["weight_bytes"] - head_bytes) / bw
    compute_per_token_s = cost.per_token_s - par.get("allreduce_per_token_s", 0.0)
    total = max(layer_load_s, compute_per_token_s * n)
    if row.scope == "layer-compute":
        total += cost.prefill_attn_s * pairs + cost.decode_attn_s * reads
    return total / n if row.measure == "prefill" else total


# --------------------------------------------------------------------------------------------
# Extraction from the fetched repositories (--extract)
# --------------------------------------------------------------------------------------------

MIRROR = Path("/work/.mirror")
VIDUR = ("microsoft/vidur", MIRROR / "microsoft+vidur" / "repo", "7d47513363ec447a741ac5e47241580b47724fbf")
# the one attention.csv whose blob is in the snapshot (later per-model attention.csv files are absent)
VIDUR_ATTN_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
AIC = ("ai-dynamo/aiconfigurator", MIRROR / "ai-dynamo+aiconfigurator" / "repo",
       "095f58a51c4ca8e61b66ec108d86f223f8d559ce")
AIC_DATA = "aic-core/src/aiconfigurator_core/systems/data"


def git_show(repo_dir: Path, commit: str, path: str) -> bytes:
    """The bytes of ``path`` at ``commit`` in a fetched repository.

    Raises:
        ValueError: the repository is not fetched, or the file is not in it at that commit (the
            snapshots lack files of 4 MiB and more), naming both.
    """
    if not repo_dir.is_dir():
        raise ValueError(f"{repo_dir}: not fetched (fetch github:{repo_dir.parent.name.replace('+', '/')} first)")
    done = subprocess.run(["git", "-C", str(repo_dir), "show", f"{commit}:{path}"], capture_output=True)
    if done.returncode:
        raise ValueError(f"{repo_dir}: no {path} at {commit[:12]} ({done.stderr.decode(errors='replace').strip()})")
    return done.stdout


def vidur_rows() -> list[Published]:
    """Vidur's per-operator medians summed over the decoder layers (see the module docstring)."""
    import pandas as pd

    repo, repo_dir, commit = VIDUR
    # (kvroute model, Vidur compute dir, Vidur model, kvroute GPU, tp, Vidur's model note)
    configs = [
        ("llama-2-7b", "a100", "meta-llama/Llama-2-7b-hf", "A100-80GB-SXM", 1, ""),
        ("llama-2-7b", "h100", "meta-llama/Llama-2-7b-hf", "H100-SXM", 1, ""),
        ("llama-3.1-8b", "a100", "meta-llama/Meta-Llama-3-8B", "A100-80GB-SXM", 1,
         "Vidur profiled Meta-Llama-3-8B: the same layer shapes as Llama-3.1-8B"),
        ("llama-3.1-70b", "a100", "meta-llama/Meta-Llama-3-70B", "A100-80GB-SXM", 2,
         "Vidur profiled Meta-Llama-3-70B: the same layer shapes as Llama-3.1-70B"),
        ("llama-3.1-70b", "a100", "meta-llama/Meta-Llama-3-70B", "A100-80GB-SXM", 4,
         "Vidur profiled Meta-Llama-3-70B: the same layer shapes as Llama-3.1-70B"),
        ("llama-3.1-70b", "h100", "meta-llama/Llama-2-70b-hf", "H100-SXM", 4,
         "Vidur profiled Llama-2-70b-hf: the same layer shapes as Llama-3.1-70B (vocabulary aside)"),
    ]
    ops = ["attn_pre_proj", "attn_rope", "attn_post_proj", "input_layernorm", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]
    attn_path = "data/profiling/a100/attention.csv"
    attn = pd.read_csv(io.BytesIO(git_show(repo_dir, VIDUR_ATTN_COMMIT, attn_path)))
    out = []
    for kv_model, sku, vidur_model, gpu, tp, note in configs:
        path = f"data/profiling/compute/{sku}/{vidur_model}/mlp.csv"
        mlp = pd.read_csv(io.BytesIO(git_show(repo_dir, commit, path)))
        mlp = mlp[mlp.num_tensor_parallel_workers == tp]
        layers = model_spec(kv_model).num_layers
        # Vidur's attention.csv at e2d00e9 holds one shape: hidden 8192, 64 query and 8 KV heads, TP2
        with_attn = kv_model == "llama-3.1-70b" and sku == "a100" and tp == 2
        a = attn[(attn.n_embd == 8192) & (attn.n_q_head == 64) & (attn.n_kv_head == 8)
                 & (attn.num_tensor_parallel_workers == 2)]

        def layer_ms(n: int) -> float:
            row = mlp[mlp.num_tokens == n]
            if row.empty:
                raise ValueError(f"{repo} {path}: no row for num_tokens {n}, tp {tp}")
            # a few token counts were profiled twice (medians within 0.1 %): their mean
            return float(sum(row[f"time_stats.{op}.median"].mean() for op in ops))

        for n in PREFILL_TOKENS:
            ms = layer_ms(n)
            scope, paths = "layer-compute-no-attn", path
            if with_attn:
                p = a[a.is_prefill & (a.batch_size == 1) & (a.prefill_chunk_size == n) & (a.kv_cache_size == 0)]
                ms += float(p["time_stats.attn_prefill.median"].iloc[0])
                scope, paths = "layer-compute", f"{path}; {attn_path}@{VIDUR_ATTN_COMMIT[:7]}"
            out.append(Published("Vidur", repo, commit, paths, kv_model, gpu, tp, "bf16", "prefill", n, 0, 0, scope,
                                 ms * layers / 1e3 / n, note))
        for b in DECODE_BATCHES:
            ms = layer_ms(b)
            scope, paths, context = "layer-compute-no-attn", path, 0
            if with_attn:
                d = a[~a.is_prefill & (a.batch_size == b) & (a.kv_cache_size == CONTEXT + 1)]
                ms += float(d["time_stats.attn_decode.median"].median())
                scope, paths, context = "layer-compute", f"{path}; {attn_path}@{VIDUR_ATTN_COMMIT[:7]}", CONTEXT
            out.append(Published("Vidur", repo, commit, paths, kv_model, gpu, tp, "bf16", "decode", 0, b, context,
                                 scope, ms * layers / 1e3, note))
    return out


class AicTables:
    """AIConfigurator's vLLM tables of one GPU and vLLM version
    (``systems/data/<gpu>/{gemm,attention,comm}/vllm/<version>/``)."""

    def __init__(self, system: str, version: str = "0.14.0"):
        import pandas as pd

        _, repo_dir, commit = AIC
        self.version = version
        self.paths = {
            "gemm": f"{AIC_DATA}/{system}/gemm/vllm/{version}/gemm_perf.parquet",
            "context": f"{AIC_DATA}/{system}/attention/vllm/{version}/context_attention_perf.parquet",
            "generation": f"{AIC_DATA}/{system}/attention/vllm/{version}/generation_attention_perf.parquet",
            "allreduce": f"{AIC_DATA}/{system}/comm/vllm/{version}/custom_allreduce_perf.parquet",
        }
        self.t = {k: pd.read_parquet(io.BytesIO(git_show(repo_dir, commit, p))) for k, p in self.paths.items()}
        self.interpolated = False
        self.outliers = 0
        self._gemm: dict[str, dict[tuple[int, int, int], float]] = {}

    def gemm_ms(self, dtype: str, m: int, n: int, k: int) -> float:
        """Latency of an (m x k) @ (k x n) GEMM, ms: the table's row, or linear in n and k between
        neighbouring grid points (``interpolated`` is set then). A grid point more than 1.5 x slower
        than the same shape at the next larger m is a measurement glitch (the table has a few, e.g. m=2048,
        n=12288, k=8192 at 192 TFLOP/s between 863 at m=1024 and m=4096); it is replaced by the
        linear interpolation in m between its neighbours (``outliers`` counts them)."""
        if dtype not in self._gemm:
            g = self.t["gemm"]
            g = g[g.gemm_dtype == dtype]
            if g.empty:
                raise ValueError(f"no {dtype} GEMM rows")
            self._gemm[dtype] = {(int(m_), int(n_), int(k_)): float(lat)
                                 for m_, n_, k_, lat in zip(g.m, g.n, g.k, g.latency)}
        table = self._gemm[dtype]
        ms = sorted({mm for mm, _, _ in table})
        if m not in ms:
            raise ValueError(f"no {dtype} GEMM rows with m={m}")

        def point(nn: int, kk: int) -> float:
            value = table[(m, nn, kk)]
            i = ms.index(m)
            if 0 < i < len(ms) - 1:
                lo, hi = ms[i - 1], ms[i + 1]
                if (lo, nn, kk) in table and (hi, nn, kk) in table and value > 1.5 * table[(hi, nn, kk)]:
                    self.outliers += 1
                    return table[(lo, nn, kk)] + (table[(hi, nn, kk)] - table[(lo, nn, kk)]) * (m - lo) / (hi - lo)
            return value

        grid = {(nn, kk) for mm, nn, kk in table if mm == m}
        if (n, k) in grid:
            return point(n, k)
        self.interpolated = True

        def bracket(values: list[int], x: int) -> tuple[int, int]:
            values = sorted(set(values))
            below = [v for v in values if v <= x]
            above = [v for v in values if v >= x]
            if below and above:
                return below[-1], above[0]
            return (values[-2], values[-1]) if not above else (values[0], values[1])

        def at_k(kk: int) -> float:
            n0, n1 = bracket([nn for nn, k2 in grid if k2 == kk], n)
            if n0 == n1:
                return point(n0, kk)
            return point(n0, kk) + (point(n1, kk) - point(n0, kk)) * (n - n0) / (n1 - n0)

        k0, k1 = bracket([kk for _, kk in grid], k)
        if k0 == k1:
            return at_k(k0)
        return at_k(k0) + (at_k(k1) - at_k(k0)) * (k - k0) / (k1 - k0)

    @staticmethod
    def _plain(t):
        """Rows of head size 128 without a sliding window (the dense models here)."""
        t = t[t.head_dim == 128]
        return t[t.window_size == 0] if "window_size" in t.columns else t

    def context_attention_ms(self, isl: int, heads: int, kv_heads: int) -> float:
        """One prompt of ``isl`` tokens, vLLM's attention backend, bf16 KV, ms."""
        c = self._plain(self.t["context"])
        row = c[(c.batch_size == 1) & (c.isl == isl) & (c.num_heads == heads) & (c.num_key_value_heads == kv_heads)
                & (c.kv_cache_dtype == "bfloat16")]
        if row.empty:
            raise ValueError(f"no context-attention row for isl {isl}, heads {heads}/{kv_heads}")
        return float(row.latency.median())  # B200's 0.19.0 table measured some shapes twice

    def generation_attention_ms(self, batch: int, context: int, heads: int, kv_heads: int) -> float:
        """``batch`` one-token queries after ``context`` tokens each (the table's ``step``), bf16 KV, ms."""
        g = self._plain(self.t["generation"])
        row = g[(g.batch_size == batch) & (g.step == context) & (g.num_heads == heads)
                & (g.num_key_value_heads == kv_heads) & (g.kv_cache_dtype == "bfloat16")]
        if row.empty:
            raise ValueError(f"no generation-attention row for batch {batch}, step {context}")
        return float(row.latency.median())

    def allreduce_ms(self, tp: int, elements: int, graph: bool) -> float:
        """vLLM's custom all-reduce of ``elements`` bf16 values over ``tp`` GPUs, ms (linear in the
        message size between grid points)."""
        a = self.t["allreduce"]
        a = a[(a.num_gpus == tp) & (a.backend == ("vllm_graph" if graph else "vllm_eager"))].sort_values("message_size")
        sizes, lat = a.message_size.tolist(), a.latency.tolist()
        for (s0, l0), (s1, l1) in zip(zip(sizes, lat), zip(sizes[1:], lat[1:])):
            if s0 <= elements <= s1:
                return l0 + (l1 - l0) * (elements - s0) / (s1 - s0)
        raise ValueError(f"all-reduce of {elements} elements outside the table")


def aic_rows() -> list[Published]:
    """AIConfigurator's vLLM per-op latencies summed into step times (see the module docstring)."""
    repo, _, commit = AIC
    configs = [  # (kvroute model, AIC system, vLLM version of its tables, kvroute GPU, tp, dtype)
        ("llama-3.1-8b", "h100_sxm", "0.14.0", "H100-SXM", 1, "bf16"),
        ("llama-3.1-8b", "h100_sxm", "0.14.0", "H100-SXM", 1, "fp8"),
        ("llama-3.1-8b", "a100_sxm", "0.14.0", "A100-80GB-SXM", 1, "bf16"),
        ("llama-3.1-8b", "h200_sxm", "0.14.0", "H200", 1, "bf16"),
        ("llama-3.1-70b", "h100_sxm", "0.14.0", "H100-SXM", 4, "bf16"),
        ("llama-3.1-70b", "h100_sxm", "0.14.0", "H100-SXM", 4, "fp8"),
        ("qwen3-32b", "h100_sxm", "0.14.0", "H100-SXM", 2, "fp8"),
        # the same H100 configurations with the newest vLLM AIConfigurator tabulates (its fp8 GEMMs
        # are 1.6-1.7 x faster than 0.14.0's)
        ("llama-3.1-8b", "h100_sxm", "0.24.0", "H100-SXM", 1, "bf16"),
        ("llama-3.1-8b", "h100_sxm", "0.24.0", "H100-SXM", 1, "fp8"),
        ("llama-3.1-70b", "h100_sxm", "0.24.0", "H100-SXM", 4, "bf16"),
        ("llama-3.1-70b", "h100_sxm", "0.24.0", "H100-SXM", 4, "fp8"),
        ("qwen3-32b", "h100_sxm", "0.24.0", "H100-SXM", 2, "fp8"),
        ("llama-3.1-8b", "b200_sxm", "0.24.0", "B200", 1, "bf16"),
        ("llama-3.1-70b", "b200_sxm", "0.24.0", "B200", 4, "bf16"),
        ("llama-3.1-70b", "b200_sxm", "0.24.0", "B200", 4, "fp8"),
    ]
    out = []
    for kv_model, system, version, gpu, tp, dtype in configs:
        tables = AicTables(system, version)
        m = model_spec(kv_model)
        h, d, L = m.hidden_size, m.head_dim, m.num_layers
        heads, kv_heads = m.num_attention_heads // tp, m.kv_heads_per_rank(tp)
        gdt = "bfloat16" if dtype == "bf16" else "fp8"
        qkv_n, o_k = (heads + 2 * kv_heads) * d, heads * d
        inter = m.intermediate_size // tp
        vocab = m.vocab_per_rank(tp)

        def layer_gemms_ms(tokens: int) -> float:
            return (tables.gemm_ms(gdt, tokens, qkv_n, h) + tables.gemm_ms(gdt, tokens, h, o_k)
                    + tables.gemm_ms(gdt, tokens, 2 * inter, h) + tables.gemm_ms(gdt, tokens, h, inter))

        def allreduce_ms(tokens: int) -> float:
            return 0.0 if tp == 1 else tables.allreduce_ms(tp, tokens * h, graph=tokens <= 512)

        def add(measure: str, n: int, b: int, ctx: int, total_ms: float, per: int) -> None:
            parts = ["gemm", "context" if measure == "prefill" else "generation"] + (["allreduce"] if tp > 1 else [])
            note = f"vLLM {tables.version} kernels on {tables.t['gemm'].device.iloc[0]}"
            if tables.interpolated:
                note += "; GEMM shapes off the grid interpolated linearly in n and k"
            if tables.outliers:
                note += f"; {tables.outliers} GEMM grid point(s) over 1.5 x slower than at the next larger m replaced by interpolation in m"
            out.append(Published(f"AIConfigurator vLLM {tables.version}", repo, commit, "; ".join(tables.paths[p] for p in parts), kv_model,
                                 gpu, tp, dtype, measure, n, b, ctx, "step-gpu", total_ms / 1e3 / per, note))

        for n in PREFILL_TOKENS:
            tables.interpolated, tables.outliers = False, 0
            ms = L * (layer_gemms_ms(n) + tables.context_attention_ms(n, heads, kv_heads) + 2 * allreduce_ms(n))
            ms += allreduce_ms(n) + tables.gemm_ms("bfloat16", 1, vocab, h)  # embedding all-reduce, LM head
            add("prefill", n, 0, 0, ms, n)
        for b in DECODE_BATCHES:
            tables.interpolated, tables.outliers = False, 0
            ms = L * (layer_gemms_ms(b) + tables.generation_attention_ms(b, CONTEXT, heads, kv_heads)
                      + 2 * allreduce_ms(b))
            ms += allreduce_ms(b) + tables.gemm_ms("bfloat16", b, vocab, h)
            add("decode", 0, b, CONTEXT, ms, 1)
    return out


#: Served measurements at concurrency 1 (time per output token), from published pages.
SERVED = [
    Published("InferenceBench: concurrency-sweep recipe (vLLM 0.21.0, fp16, llm.inference.chatbot-short)",
              "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/", "", "table 'Sweep results', conc 1",
              "llama-3.1-8b", "H100-SXM", 1, "bf16", "decode", 0, 1, CONTEXT, "step-e2e", 6.48e-3,
              "TPOT p50 at concurrency 1 on H100-80GB-HBM3; prompt lengths of the workload not stated, so the "
              "context is taken as 1,023 (at batch 1 the KV reads are under 1 % of the step)"),
    Published("Musgrave: vLLM throughput-latency sweep on NVIDIA A100 (John Musgrave, vLLM 0.23.0)",
              "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on", "", "summary: 'about 75 tokens/sec' at C=1",
              "llama-3.1-8b", "A100-40GB-SXM", 1, "bf16", "decode", 0, 1, CONTEXT, "step-e2e", 1 / 75,
              "1 / 75 tokens/s at concurrency 1 (1,024-token prompts, 128 output tokens, so 1,024-1,152 tokens "
              "of context); the page rounds the figure ('about 75')"),
]


def extract(path: Path = DATA) -> list[Published]:
    """Rebuild the published-measures CSV from the fetched repositories; returns its rows."""
    rows = vidur_rows() + aic_rows() + SERVED
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([r.source, r.repo, r.commit, r.paths, r.model, r.gpu, r.tp, r.dtype, r.measure, r.tokens,
                             r.batch, r.context, r.scope, f"{r.published_s:.6g}", r.note])
    return rows


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def short_source(row: Published) -> str:
    """The source's short name: its text before the first colon (``Vidur``, ``AIConfigurator``, ...)."""
    return row.source.split(":")[0]


def table_rows(rows: list[Published]) -> list[list[str]]:
    """One line per published measure: model, GPU, TP, dtype, source, scope, measure, published,
    derived, error."""
    out = []
    for r in rows:
        derived = derived_seconds(r)
        err = (derived - r.published_s) / r.published_s * 100
        unit, scale = ("us/token", 1e6) if r.measure == "prefill" else ("ms/step", 1e3)
        what = f"prefill {r.tokens}" if r.measure == "prefill" else f"decode b={r.batch}" + (
            f" c={r.context + 1}" if r.scope in ("layer-compute", "step-gpu", "step-e2e") else "")
        source = short_source(r)
        out.append([r.model, r.gpu, str(r.tp), r.dtype, source, r.scope, what, unit,
                    f"{r.published_s * scale:.2f}", f"{derived * scale:.2f}", f"{err:+.0f}%"])
    return out


HEADER = ["model", "GPU", "TP", "dtype", "source", "scope", "measure", "unit", "published", "derived", "error"]


def main(argv: list[str] | None = None) -> int:
    """Print the table (``--extract`` first rebuilds the CSV from the fetched repositories)."""
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extract", action="store_true", help="rebuild the CSV from the fetched repositories")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--csv", type=Path, default=DATA, help="published-measures CSV (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        rows = extract(args.csv) if args.extract else read_published(args.csv)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    lines = table_rows(rows)
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(x[i]) for x in [HEADER, *lines]) for i in range(len(HEADER))]
        for line in [HEADER, *lines]:
            print("  ".join(x.ljust(w) if i < 8 else x.rjust(w) for i, (x, w) in enumerate(zip(line, widths))))
    errors = [abs(float(line[-1].rstrip("%"))) for line in lines]
    print(f"\n{len(lines)} measures; |error| median {sorted(errors)[len(errors) // 2]:.0f}%, "
          f"{sum(e <= 30 for e in errors)} within 30%", file=sys.stderr if args.markdown else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
