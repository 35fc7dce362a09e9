"""Profiles: one JSON file per (hardware, model, engine version), written by ``calibrate`` or
derived from spec sheets (``sim/priors.py``), read here.

Layout of a profile file::

    {
      "name": "a6000-qwen2.5-7b",
      "hardware": {"gpu": "NVIDIA RTX A6000", "gpu_memory_bytes": ..., ...},
      "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "num_layers": 28, ...},
      "engine": {"vllm_version": "0.11.0", "block_size": 16, "num_gpu_blocks": ...,
                 "max_num_batched_tokens": 2048, "max_num_seqs": 256, "max_model_len": 32768,
                 "gpu_memory_utilization": 0.9},
      "memory": {"gpu_memory_bytes": ..., "weight_bytes": ..., "activation_peak_bytes": ...,
                 "non_torch_bytes": ..., "kv_bytes_per_block": ...},
      "step_cost": {"step_overhead_s": ..., "weight_load_s": ..., "per_token_s": ...,
                    "per_request_s": ..., "prefill_attn_s": ..., "decode_attn_s": ...},
      "overheads": {"api_server_s": 0.1, "gateway_s": 0.001, "jitter_cv": 0.1,
                    "api_server_per_token_s": 0.0},
      "frontend": {"api_server_count": 1, "per_request_s": ..., "per_prompt_token_s": ...,
                   "per_output_token_s": ...},                      (optional, sim/frontend.py)
      "host": {"cores": 2, "contention": ..., "baseline_busy": ..., "other_busy": ...},  (optional)
      "provenance": {"kind": "derived" | "measured", "source": "...", "date": "...", ...},
      "sources": {"<field>": "<where the number comes from>"}
    }
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from kvroute.sim.config import EngineConfig
from kvroute.sim.cost_model import StepCost
from kvroute.sim.frontend import FrontendModel, HostModel, frontend_from_dict, host_from_dict


@dataclass(frozen=True, slots=True)
class Overheads:
    """Per-request time outside the engine, in seconds.

    Attributes:
        api_server_s: mean time the OpenAI API server spends before the engine sees a request
            (tokenisation, validation, queueing into the engine).
        api_server_per_token_s: API-server time per prompt token (request parsing and
            validation grow with the prompt; measured by calibration, 0 in derived priors).
        gateway_s: mean time the router/gateway adds to every request.
        jitter_cv: coefficient of variation of the total, applied as a seeded lognormal factor.

    All of it passes before the engine sees the request, and none of it delays running requests.
    That holds for the engine core's share too (measured profiles fold the engine's admission of
    a request, its block hashing included, into ``api_server_s``): vLLM v1 builds the
    ``Request`` in the engine core's input thread "in parallel with Model forward"
    (``vllm/v1/engine/core.py: preprocess_add_request``, called from ``process_input_sockets``).
    Charging it inside the next step instead was tried against the CPU validation bench: one
    server's mean TTFT fell 12 % below the measured value and ITL rose 21 % above it.
    """

    api_server_s: float = 0.1
    gateway_s: float = 0.001
    jitter_cv: float = 0.1
    api_server_per_token_s: float = 0.0

    def mean_s(self, num_prompt_tokens: int) -> float:
        """Mean overhead of a request with ``num_prompt_tokens`` prompt tokens, seconds."""
        return self.api_server_s + self.gateway_s + self.api_server_per_token_s * num_prompt_tokens


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """vLLM's KV-capacity rule inputs, so shared GPUs can be re-derived.

    ``num_gpu_blocks = (gpu_memory_bytes * gpu_memory_utilization - weight_bytes
    - activation_peak_bytes - non_torch_bytes) // kv_bytes_per_block``
    (``vllm/v1/worker/gpu_worker.py: determine_available_memory``; the utilisation is the
    share of the whole device this one instance may take).
    """

    gpu_memory_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    kv_bytes_per_block: int

    def num_gpu_blocks(self, gpu_memory_utilization: float) -> int:
        """Blocks vLLM would allocate at this utilisation; raises ValueError if none fit."""
        free = (
            self.gpu_memory_bytes * gpu_memory_utilization
            - self.weight_bytes
            - self.activation_peak_bytes
            - self.non_torch_bytes
        )
        blocks = int(free // self.kv_bytes_per_block)
        if blocks < 2:
            raise ValueError(
                f"no KV cache fits: {self.gpu_memory_bytes * gpu_memory_utilization / 2**30:.1f} GiB "
                f"at utilisation {gpu_memory_utilization} minus weights "
                f"{self.weight_bytes / 2**30:.1f} GiB and activations "
                f"{(self.activation_peak_bytes + self.non_torch_bytes) / 2**30:.1f} GiB"
            )
        return blocks


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything the simulator needs to know about one kind of worker.

    Attributes:
        name: short name (the file stem for shipped profiles).
        engine: engine settings the run used.
        step_cost: step-time coefficients.
        overheads: per-request API server and gateway time.
        gpu_memory_utilization: share of the device one worker takes (vLLM's flag).
        memory: inputs of vLLM's KV-capacity rule, or None when only ``num_gpu_blocks`` is known.
        frontend: the API processes as a queue (``kvroute.sim.frontend``); None: overheads only,
            as if the API server had unlimited capacity.
        host: the host's cores and their contention; None: steps never stretched.
        raw: the whole JSON document (hardware, model, provenance, sources), kept for reports.
    """

    name: str
    engine: EngineConfig
    step_cost: StepCost
    overheads: Overheads = Overheads()
    gpu_memory_utilization: float = 0.9
    memory: MemoryModel | None = None
    frontend: FrontendModel | None = None
    host: HostModel | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def shared(self, workers_per_gpu: int) -> "Profile":
        """The profile of one of ``workers_per_gpu`` workers splitting one GPU's memory.

        Each worker's ``gpu_memory_utilization`` becomes the share divided by the number of
        workers (how the lab ran two vLLM instances on one A100), and ``num_gpu_blocks`` follows
        vLLM's memory rule. Step costs are unchanged: the GPU itself is shared in time.

        Raises:
            ValueError: if the profile has no memory model or the share leaves no KV cache.
        """
        if workers_per_gpu == 1:
            return self
        if self.memory is None:
            raise ValueError(
                f"profile {self.name!r} has no 'memory' section, so the KV capacity of "
                f"{workers_per_gpu} workers sharing a GPU cannot be derived"
            )
        util = self.gpu_memory_utilization / workers_per_gpu
        blocks = self.memory.num_gpu_blocks(util)
        return replace(
            self, engine=replace(self.engine, num_gpu_blocks=blocks), gpu_memory_utilization=util
        )


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped in ``kvroute.sim.profiles``."""
    root = resources.files("kvroute.sim.profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name or a profile JSON file by path.

    Raises:
        FileNotFoundError: the name is neither a file nor a shipped profile (lists the valid names).
        ValueError: a field is missing or invalid; the message names the file and the field.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"profile file {path} does not exist")
        text, where = path.read_text(), str(path)
    else:
        root = resources.files("kvroute.sim.profiles")
        entry = root / f"{name_or_path}.json"
        if not entry.is_file():
            raise FileNotFoundError(
                f"unknown profile {str(name_or_path)!r}; shipped profiles: "
                f"{', '.join(shipped_profiles())} (or give a path to a profile JSON file)"
            )
        text, where = entry.read_text(), f"shipped profile {name_or_path}"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from exc
    return profile_from_dict(doc, where)


def profile_from_dict(doc: dict, where: str = "<dict>") -> Profile:
    """Build a Profile from a parsed profile document; errors name ``where`` and the field."""

    def section(key: str) -> dict:
        value = doc.get(key)
        if not isinstance(value, dict):
            raise ValueError(f"{where}: missing or invalid section {key!r}")
        return value

    engine_doc, cost_doc = section("engine"), section("step_cost")
    try:
        engine = EngineConfig(
            block_size=int(engine_doc["block_size"]),
            num_gpu_blocks=int(engine_doc["num_gpu_blocks"]),
            max_num_batched_tokens=int(engine_doc.get("max_num_batched_tokens", 2048)),
            max_num_seqs=int(engine_doc.get("max_num_seqs", 256)),
            max_model_len=int(engine_doc.get("max_model_len", 32768)),
            long_prefill_token_threshold=int(engine_doc.get("long_prefill_token_threshold", 0)),
        )
        step_cost = StepCost(**{k: float(cost_doc[k]) for k in StepCost.__dataclass_fields__})
    except KeyError as exc:
        raise ValueError(f"{where}: missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    over_doc = doc.get("overheads", {})
    overheads = Overheads(**{k: float(v) for k, v in over_doc.items() if k in Overheads.__dataclass_fields__})
    mem_doc = doc.get("memory")
    memory = None
    if mem_doc:
        try:
            memory = MemoryModel(**{k: int(mem_doc[k]) for k in MemoryModel.__dataclass_fields__})
        except KeyError as exc:
            raise ValueError(f"{where}: memory section lacks {exc.args[0]!r}") from exc
    return Profile(
        name=str(doc.get("name", where)),
        engine=engine,
        step_cost=step_cost,
        overheads=overheads,
        gpu_memory_utilization=float(engine_doc.get("gpu_memory_utilization", 0.9)),
        memory=memory,
        frontend=frontend_from_dict(doc.get("frontend"), where),
        host=host_from_dict(doc.get("host"), where),
        raw=doc,
    )
