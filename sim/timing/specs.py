"""GPU spec sheets and model shapes, read from data files shipped with the package.

- ``sim/timing/data/gpus.csv``: one row per GPU, the numbers of NVIDIA's data sheets (memory as
  the driver reports it, dense bf16 and fp8 tensor FLOP/s, DRAM bandwidth, NVLink and PCIe
  bandwidth) and, in the ``*_source`` columns, which data sheet each number comes from.
- ``sim/timing/data/models/<short name>.json``: the fields of a model's Hugging Face
  ``config.json`` that the derivation needs, copied from the published file (``_name_or_path`` is
  the Hugging Face id, ``_source`` where the values come from).

:func:`gpu_spec` looks a GPU up by its table name, short name or CUDA name; :func:`model_spec`
takes a shipped model's name (short name or Hugging Face id) or the path of any local
``config.json``. Bad names and files are one-line :class:`~kvroute.traces.inputs.InputError`\\ s.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvroute.traces.inputs import JSON_DECODER, DuplicateKeyError, InputError, check_regular_file

MiB = 2**20

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Directory of the spec tables (package data of ``kvroute.sim.timing``)."""

VOCAB_PADDING = 64
"""vLLM pads the vocabulary of the embedding and LM head to a multiple of 64 before splitting it
across ranks (``vllm/model_executor/layers/vocab_parallel_embedding.py``: DEFAULT_VOCAB_PADDING_SIZE)."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model, from public spec sheets (a row of ``data/gpus.csv``).

    Attributes:
        name: device name as CUDA reports it (``torch.cuda.get_device_name``); vLLM's batch
            defaults look at it (``"a100"`` is excluded from the large defaults).
        short_name: stem used in profile names, e.g. ``"a6000"``.
        memory_bytes: total device memory in bytes, as the driver reports it (``nvidia-smi``
            total in MiB x 2**20).
        peak_bf16_flops: peak dense (no sparsity) bf16 tensor-core FLOP/s with fp32 accumulate.
        memory_bandwidth_bytes_per_s: peak DRAM bandwidth, bytes/s.
        memory_source, flops_source, bandwidth_source: where each number comes from.
        peak_fp8_flops: peak dense fp8 tensor FLOP/s, or None where the GPU has no fp8 tensor
            cores (Ampere).
        nvlink_bidir_bytes_per_s: NVLink bandwidth per GPU as the data sheet states it (both
            directions together), or None without NVLink.
        nvlink_max_gpus: most GPUs one NVLink domain joins (8 with NVSwitch, 2 with a bridge).
        pcie_bidir_bytes_per_s: host link bandwidth per GPU (both directions together).
        table_name: the row's name in ``gpus.csv`` (what ``--gpu`` takes), e.g. ``"H100-SXM"``.
        fp8_source, interconnect_source, source: where those numbers come from; ``source`` names
            the data sheet(s) of the row.
    """

    name: str
    short_name: str
    memory_bytes: int
    peak_bf16_flops: float
    memory_bandwidth_bytes_per_s: float
    memory_source: str
    flops_source: str
    bandwidth_source: str
    peak_fp8_flops: float | None = None
    nvlink_bidir_bytes_per_s: float | None = None
    nvlink_max_gpus: int = 0
    pcie_bidir_bytes_per_s: float = 64e9
    table_name: str = ""
    fp8_source: str = ""
    interconnect_source: str = ""
    source: str = ""

    def interconnect(self, tp: int) -> tuple[str, float]:
        """``(kind, bytes/s in one direction)`` of the link a ``tp``-way all-reduce runs over:
        NVLink when the GPU has it and ``tp`` GPUs fit in one NVLink domain, else PCIe. A ring
        all-reduce sends in one direction per link, so the data sheet's bidirectional figure is
        halved."""
        if self.nvlink_bidir_bytes_per_s and tp <= self.nvlink_max_gpus:
            return "nvlink", self.nvlink_bidir_bytes_per_s / 2
        return "pcie", self.pcie_bidir_bytes_per_s / 2


def _float_or_none(text: str) -> float | None:
    return float(text) if text.strip() else None


def load_gpu_table(path: Path | None = None) -> dict[str, GpuSpec]:
    """Every row of ``gpus.csv`` by its table name (in file order)."""
    path = DATA_DIR / "gpus.csv" if path is None else Path(path)
    table: dict[str, GpuSpec] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                table[row["name"]] = GpuSpec(
                    name=row["cuda_name"],
                    short_name=row["short_name"],
                    memory_bytes=int(row["memory_mib"]) * MiB,
                    peak_bf16_flops=float(row["bf16_dense_flops"]),
                    memory_bandwidth_bytes_per_s=float(row["memory_bandwidth_bytes_per_s"]),
                    memory_source=row["memory_source"],
                    flops_source=row["flops_source"],
                    bandwidth_source=row["bandwidth_source"],
                    peak_fp8_flops=_float_or_none(row["fp8_dense_flops"]),
                    nvlink_bidir_bytes_per_s=_float_or_none(row["nvlink_bidir_bytes_per_s"]),
                    nvlink_max_gpus=int(row["nvlink_max_gpus"] or 0),
                    pcie_bidir_bytes_per_s=float(row["pcie_bidir_bytes_per_s"]),
                    table_name=row["name"],
                    fp8_source=row["fp8_source"],
                    interconnect_source=row["interconnect_source"],
                    source=row["source"],
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(f"bad GPU row: {exc}", str(path), line) from None
    return table


def gpu_key(name: str) -> str:
    """A GPU name as :func:`gpu_spec` compares names: lower case, letters and digits only
    (``"NVIDIA A100-SXM4-80GB"`` -> ``"nvidiaa100sxm480gb"``)."""
    return "".join(c for c in name.lower() if c.isalnum())


def gpu_spec(name: str) -> GpuSpec:
    """The GPU called ``name``: its table name (``H100-SXM``), short name (``h100-80gb``) or CUDA
    name (``NVIDIA H100 80GB HBM3``), case and ``-``/``_``/space insensitive.

    Raises:
        InputError: no such GPU (the message lists the known ones).
    """
    table = load_gpu_table()
    wanted = gpu_key(name)
    for spec in table.values():
        if wanted in (gpu_key(spec.table_name), gpu_key(spec.short_name), gpu_key(spec.name)):
            return spec
    raise InputError(f"unknown GPU {name!r}; known: {', '.join(table)}")


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


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
        head_dim: ``head_dim`` where the config sets it, else ``hidden_size / num_attention_heads``.
        intermediate_size: ``intermediate_size`` of the gated (SwiGLU) MLP.
        vocab_size: ``vocab_size`` (rows of the embedding and of the LM head).
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        total_params: all parameters, embeddings and LM head included.
        dtype_bytes: bytes per weight and per KV element of the checkpoint (bf16: 2).
        source: where the shapes and the count come from.
        max_position_embeddings: ``max_position_embeddings`` (the default ``max_model_len``).
        qkv_bias: q/k/v projections carry a bias (Qwen2).
        o_bias: the output projection carries a bias (``attention_bias`` true in Llama configs).
        qk_norm: an RMSNorm over each head's q and k (Qwen3: ``q_norm``/``k_norm``, head_dim each).
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
    max_position_embeddings: int = 32768
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False

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

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes: K and V x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    # ---- tensor parallelism (vLLM's sharding) ----------------------------------------------

    def check_tp(self, tp: int) -> None:
        """Raise ValueError unless vLLM can split this model ``tp`` ways: query heads and the MLP
        divide by ``tp``; KV heads divide by ``tp`` or, fewer than ``tp``, divide ``tp`` (then
        vLLM replicates each KV head on ``tp / kv_heads`` ranks)."""
        if tp < 1:
            raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
        problems = []
        if self.num_attention_heads % tp:
            problems.append(f"num_attention_heads {self.num_attention_heads}")
        if self.intermediate_size % tp:
            problems.append(f"intermediate_size {self.intermediate_size}")
        kv = self.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            problems.append(f"num_key_value_heads {kv}")
        if problems:
            raise ValueError(f"{self.name} cannot be split {tp} ways: {', '.join(problems)} not divisible by {tp}")

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each rank holds: ``kv_heads / tp``, or 1 (replicated) when ``kv_heads < tp``
        (``vllm/model_executor/layers/linear.py: QKVParallelLinear``)."""
        return max(1, self.num_kv_heads // tp)

    def vocab_per_rank(self, tp: int) -> int:
        """Rows of the embedding (and LM head) on one rank: the vocabulary padded to a multiple of
        :data:`VOCAB_PADDING`, split evenly (``VocabParallelEmbedding``)."""
        padded = math.ceil(self.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
        return padded // tp

    def linear_params_per_rank(self, tp: int) -> int:
        """Weight-matrix parameters of the decoder layers on one rank (what fp8 quantizes):
        q and o split by heads, k and v by KV heads (replicated below ``tp`` heads), the MLP by
        ``intermediate_size``."""
        h, d, L = self.hidden_size, self.head_dim, self.num_layers
        q = h * self.num_attention_heads * d // tp
        kv = 2 * h * self.kv_heads_per_rank(tp) * d
        o = self.num_attention_heads * d // tp * h
        mlp = 3 * h * self.intermediate_size // tp
        return L * (q + kv + o + mlp)

    def other_layer_params_per_rank(self, tp: int) -> int:
        """Biases and norms of the decoder layers on one rank, and the final norm (kept in bf16):
        q/k/v biases split like their weights, o bias and norms replicated."""
        h, d, L = self.hidden_size, self.head_dim, self.num_layers
        per_layer = 2 * h  # input and post-attention RMSNorm
        if self.qkv_bias:
            per_layer += self.num_attention_heads * d // tp + 2 * self.kv_heads_per_rank(tp) * d
        if self.o_bias:
            per_layer += h
        if self.qk_norm:
            per_layer += 2 * d
        return L * per_layer + h

    def non_embedding_params_per_rank(self, tp: int) -> int:
        """Decoder-layer parameters (weights, biases, norms) and the final norm on one rank."""
        return self.linear_params_per_rank(tp) + self.other_layer_params_per_rank(tp)

    def embedding_params_per_rank(self, tp: int) -> int:
        """Embedding rows on one rank x hidden."""
        return self.vocab_per_rank(tp) * self.hidden_size

    def lm_head_params_per_rank(self, tp: int) -> int:
        """LM head rows on one rank x hidden (0 extra when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.embedding_params_per_rank(tp)

    def kv_bytes_per_token_per_rank(self, tp: int, kv_bytes: int) -> int:
        """KV-cache bytes one token takes on one rank: 2 (K, V) x layers x KV heads per rank x
        head_dim x bytes per element."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * kv_bytes


def params_from_shapes(cfg: dict, head_dim: int, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> int:
    """All parameters a dense decoder implies: per layer q/k/v/o, the SwiGLU MLP, two RMSNorms (and
    the biases and q/k norms the flags ask for); a final norm; the embedding and an untied LM head."""
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * cfg["intermediate_size"] + 2 * h
    layer += (q + 2 * kv if qkv_bias else 0) + (h if o_bias else 0) + (2 * head_dim if qk_norm else 0)
    emb = cfg["vocab_size"] * h
    return L * layer + h + emb + (0 if cfg["tie_word_embeddings"] else emb)


MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
"""``config.json`` fields that mark a mixture-of-experts model (Mixtral, Qwen-MoE, DeepSeek)."""

REQUIRED_INT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "vocab_size", "max_position_embeddings")
"""``config.json`` fields every model needs (positive integers)."""


def model_from_config(cfg: object, where: str, short_name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a parsed Hugging Face ``config.json``.

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (no GQA), ``head_dim`` to
    ``hidden_size / num_attention_heads``, ``tie_word_embeddings`` to false. Qwen2
    (``model_type`` qwen2) has q/k/v biases; Qwen3 q/k norms; ``attention_bias`` true adds
    biases to q/k/v and o (Llama).

    Raises:
        InputError: a field is missing or not a positive integer (or bool), naming ``where``
            and the field; ``num_key_value_heads`` that does not divide ``num_attention_heads``
            (no vLLM attention takes it); or a model the roofline does not model, naming the
            field: mixture-of-experts (``num_local_experts``, ``num_experts``,
            ``n_routed_experts``) or sliding-window attention in use (``sliding_window`` set,
            unless ``use_sliding_window`` is false, as in Qwen2's configs).
    """
    if not isinstance(cfg, dict):
        raise InputError("a config.json is a JSON object", where)
    for key in MOE_FIELDS:
        if cfg.get(key) not in (None, 0, 1):
            raise InputError(f"{cfg[key]!r} experts: a mixture-of-experts model, which the derived prior does "
                             "not model (dense decoders only)", where, None, key)
    if cfg.get("sliding_window") is not None and cfg.get("use_sliding_window", True) is not False:
        raise InputError(f"sliding-window attention ({cfg['sliding_window']!r} tokens), which the derived prior "
                         "does not model (full attention only)", where, None, "sliding_window")
    fields: dict = {}
    for key in (*REQUIRED_INT_FIELDS, "num_key_value_heads", "head_dim"):
        value = cfg.get(key)
        if value is None and key in ("num_key_value_heads", "head_dim"):
            continue
        if type(value) is not int or value < 1:
            raise InputError(f"expected a positive integer, got {value!r}", where, None, key)
        fields[key] = value
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    if fields["num_attention_heads"] % fields["num_key_value_heads"]:
        raise InputError(f"{fields['num_key_value_heads']} KV heads do not divide the {fields['num_attention_heads']} "
                         "attention heads (grouped-query attention needs whole groups)", where, None,
                         "num_key_value_heads")
    tie = cfg.get("tie_word_embeddings", False)
    if type(tie) is not bool:
        raise InputError(f"expected true or false, got {tie!r}", where, None, "tie_word_embeddings")
    fields["tie_word_embeddings"] = tie
    if "head_dim" not in fields:
        if fields["hidden_size"] % fields["num_attention_heads"]:
            raise InputError("hidden_size is not a multiple of num_attention_heads; give head_dim",
                             where, None, "head_dim")
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    model_type = str(cfg.get("model_type", ""))
    attention_bias = cfg.get("attention_bias", False)
    if type(attention_bias) is not bool:
        raise InputError(f"expected true or false, got {attention_bias!r}", where, None, "attention_bias")
    qkv_bias = model_type == "qwen2" or attention_bias
    o_bias = attention_bias
    qk_norm = model_type == "qwen3"
    name = cfg.get("_name_or_path") or short_name or Path(where).parent.name or "model"
    if short_name is None:
        short_name = str(name).rstrip("/").split("/")[-1].lower() or "model"
    total = params_from_shapes(fields, fields["head_dim"], qkv_bias, o_bias, qk_norm)
    source = cfg.get("_source") or f"config.json at {where}"
    return ModelSpec(
        name=str(name),
        short_name=short_name,
        num_layers=fields["num_hidden_layers"],
        hidden_size=fields["hidden_size"],
        num_attention_heads=fields["num_attention_heads"],
        num_kv_heads=fields["num_key_value_heads"],
        head_dim=fields["head_dim"],
        intermediate_size=fields["intermediate_size"],
        vocab_size=fields["vocab_size"],
        tie_word_embeddings=tie,
        total_params=total,
        dtype_bytes=2,
        source=str(source),
        max_position_embeddings=fields["max_position_embeddings"],
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=qk_norm,
    )


def read_config(path: str | Path, short_name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a local Hugging Face ``config.json`` (or a directory holding one).

    Raises:
        InputError: the file cannot be read, is not JSON, or a field is missing or invalid
            (one line naming the file and the field).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    check_regular_file(path)  # /dev/zero or a FIFO would never end
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the model config: {exc.strerror or exc}", str(path)) from None
    try:
        cfg = JSON_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", str(path), exc.lineno) from None
    except DuplicateKeyError as exc:
        raise InputError(exc.reason, str(path), None, exc.field) from None
    except ValueError as exc:  # an int of over 4300 digits; nested too deep
        raise InputError(f"not valid JSON: {' '.join(str(exc).split(';')[0].split())}", str(path)) from None
    return model_from_config(cfg, str(path), short_name)


def model_names() -> list[str]:
    """The shipped model shapes, by short name."""
    return sorted(p.stem for p in (DATA_DIR / "models").glob("*.json"))


def model_spec(name_or_path: str | Path) -> ModelSpec:
    """A shipped model by short name (``llama-3.1-70b``) or Hugging Face id
    (``meta-llama/Llama-3.1-70B-Instruct``, case-insensitive, ``-Instruct`` optional), or any
    local ``config.json`` (a path ending in ``.json``, or a directory holding one).

    Raises:
        InputError: unknown name (lists the shipped ones), or a bad config file.
    """
    text = str(name_or_path)
    path = Path(text)
    if text.endswith(".json") or path.is_dir() or path.exists():
        return read_config(path)
    def key(name: str) -> str:  # "Mistral-7B-Instruct-v0.3" and "mistral-7b-v0.3" are one model
        return name.lower().replace("-instruct", "")

    wanted = key(text)
    for stem in model_names():
        file = DATA_DIR / "models" / f"{stem}.json"
        hf_id = key(json.loads(file.read_text(encoding="utf-8")).get("_name_or_path", ""))
        if wanted in (stem, hf_id, hf_id.split("/")[-1]):
            return read_config(file, short_name=stem)
    raise InputError(f"unknown model {text!r}; shipped: {', '.join(model_names())} "
                     "(or give the path of a config.json)")
