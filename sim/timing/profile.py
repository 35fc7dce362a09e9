"""Profiles: one JSON file per (hardware, model, engine version), written by ``calibrate`` or
derived from spec sheets (``sim/timing/priors.py``), read here.

Layout of a profile file::

    {
      "name": "a6000-qwen2.5-7b",
      "hardware": {"gpu": "NVIDIA RTX A6000", "gpu_memory_bytes": ..., ...},
      "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "num_layers": 28, ...},
      "engine": {"vllm_version": "0.11.0", "block_size": 16, "num_gpu_blocks": ...,
                 "max_num_batched_tokens": 2048, "max_num_seqs": 256, "max_model_len": 32768,
                 "gpu_memory_utilization": 0.9, "async_scheduling": false},
      "memory": {"gpu_memory_bytes": ..., "weight_bytes": ..., "activation_peak_bytes": ...,
                 "non_torch_bytes": ..., "kv_bytes_per_block": ...},
      "step_cost": {"step_overhead_s": ..., "weight_load_s": ..., "per_token_s": ...,
                    "per_request_s": ..., "prefill_attn_s": ..., "decode_attn_s": ...},
      "overheads": {"api_server_s": 0.1, "gateway_s": 0.001, "jitter_cv": 0.1,
                    "api_server_per_token_s": 0.0},
      "frontend": {"api_server_count": 1, "per_request_s": ..., "per_prompt_token_s": ...,
                   "per_output_token_s": ..., "per_step_s": ...},   (optional, sim/timing/frontend.py)
      "host": {"cores": 2, "contention": ..., "baseline_busy": ..., "other_busy": ..., "client_busy": ...,
               "engine_spin_s": ..., "api_on_engine_core": false, "api_contention": 0.0, ...},
                                                                             (optional, HostModel)
      "provenance": {"kind": "derived" | "measured", "source": "...", "date": "...", ...},
      "sources": {"<field>": "<where the number comes from>"},
      "step_cost_uncertainty": {"method": "bootstrap", "fields": ["step_cost.per_token_s", ...],
                                "samples": [[...], ...], ...}          (optional)
    }

``step_cost_uncertainty`` (optional) holds the fitted coefficients' uncertainty: either
``samples``, coefficient vectors refitted on bootstrap resamples (one value per name in
``fields``, each ``"step_cost.<coefficient>"`` or ``"overheads.<field>"``), or a
``relative_range`` r meaning each coefficient lies in ``[(1 - r) c, (1 + r) c]``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.timing.async_overlap import STATED_CPU_FRACTION
from kvroute.sim.timing.cost_model import StepCost
from kvroute.traces.inputs import (BLOCK_SIZE, BYTES, COST_SECONDS, COUNT, FRACTION, JSON_DECODER, KV_BLOCKS,
                                POSITIVE_INT, TOKENS, DuplicateKeyError, InputError, Num, check_fields,
                                check_regular_file, describe)
from kvroute.sim.timing.frontend import FrontendModel, HostModel, frontend_from_dict, host_from_dict


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
        post_engine_s: time from the end of an engine step to its token reaching the client,
            measured one request at a time (the engine core hands the step's outputs to the API
            process, which detokenises them and writes the SSE chunk, and the client reads it);
            0: none, every overhead before the engine. A measured profile takes it
            from the KV-cache events' step times (``kvroute calibrate measure --kv-events``) and
            takes it out of ``api_server_s``, so one request alone is predicted the same with or
            without it.
        post_engine_per_token_s: its growth per prompt token, s/token (taken out of
            ``api_server_per_token_s`` the same way; on the 2-core CPU reference about 0.4 us,
            1.6 ms at 32 tokens to 8 ms at 16k). With a ``frontend`` section the simulator
            charges ``post_engine_s + post_engine_per_token_s * prompt tokens``, less the lane
            work a lone token already pays (:meth:`post_engine_delay_s`), to the API lane as
            work on the request's first output: it queues behind the lane's other work and
            stretches beside a busy engine like all lane work. Live under bursts that part grew
            from 3.3 ms alone to 7-10 ms (2-core reference, ``api_contention`` 1), as lane work
            does. Without a ``frontend`` section it is a pure delay of every token (inter-token
            latencies unchanged).
        engine_admission_s: the part of ``api_server_s`` that vLLM spends inside the engine step
            that first schedules the request, serial with that step's forward, rather than before
            the engine (0: none, all of ``api_server_s`` before the engine). On a server whose engine
            core runs its model in a worker process (vLLM's CPU build always does:
            ``vllm/platforms/cpu.py`` turns the ``uni`` executor into ``mp``), every newly scheduled
            request goes to the worker inside that step's ``SchedulerOutput`` with its whole
            prompt (``NewRequestData.from_request``, ``vllm/v1/core/sched/output.py``), and the
            worker copies the prompt into its input batch before the forward
            (``InputBatch.add_request``, ``vllm/v1/worker/gpu_input_batch.py``); vLLM's request
            histograms count that time in the request's prefill time (first scheduled to first
            token), not in its queue time. A measured profile's one-at-a-time fit gives it as
            ``provenance.fit.overhead_parts.engine_admission_s`` (queue + prefill time beyond the
            step costs). The simulator adds it, unstretched, to the step that first schedules the
            request, so several new requests in one step lengthen it by the sum of theirs and a
            request alone is predicted as without it.
        engine_admission_per_token_s: its growth per prompt token (the whole prompt, cached tokens
            included: the prompt is sent and copied whole), s/token; part of
            ``api_server_per_token_s`` in the same way.

    Apart from ``post_engine_s`` and the engine admission, all of it passes before the engine sees
    the request, and none of it delays running requests. That holds for the engine core's own
    preprocessing (building the ``Request`` and its block hashes): vLLM v1 does it in the engine
    core's input thread "in parallel with Model forward" (``vllm/v1/engine/core.py:
    preprocess_add_request``, called from ``process_input_sockets``), before the request's queue
    time starts. Measured profiles fold all of the engine's share into ``api_server_s`` and leave
    the engine admission fields 0 unless set; which of the two placements predicts better was
    measured both ways (docs/log/from-code-comments.md, an earlier model without API lanes;
    docs/log/2026-12-05-policy-change-sign.md, closed-loop chats under two routers).
    """

    api_server_s: float = 0.1
    gateway_s: float = 0.001
    jitter_cv: float = 0.1
    api_server_per_token_s: float = 0.0
    post_engine_s: float = 0.0
    post_engine_per_token_s: float = 0.0
    engine_admission_s: float = 0.0
    engine_admission_per_token_s: float = 0.0

    def mean_s(self, num_prompt_tokens: int) -> float:
        """Mean overhead of a request with ``num_prompt_tokens`` prompt tokens up to its first
        step's forward, s: everything but ``post_engine_s``, the engine admission included."""
        return self.api_server_s + self.gateway_s + self.api_server_per_token_s * num_prompt_tokens

    @property
    def has_engine_admission(self) -> bool:
        """Whether part of the overhead is paid inside the step that first schedules a request."""
        return self.engine_admission_s > 0.0 or self.engine_admission_per_token_s > 0.0

    def engine_admission(self, num_prompt_tokens: int) -> float:
        """Seconds the step that first schedules a request of ``num_prompt_tokens`` prompt tokens
        spends on it beyond the step cost: ``engine_admission_s + engine_admission_per_token_s *
        num_prompt_tokens``."""
        return self.engine_admission_s + self.engine_admission_per_token_s * num_prompt_tokens

    def pre_engine_mean_s(self, num_prompt_tokens: int) -> float:
        """Mean overhead before the engine sees the request, s: :meth:`mean_s` less
        :meth:`engine_admission`, never below 0 (a profile file must keep the admission within
        the API-server time, ``profile_from_dict`` checks it; a profile drawn from a fit's
        uncertainty may not)."""
        rest = self.mean_s(num_prompt_tokens) - self.engine_admission(num_prompt_tokens)
        return rest if rest > 0.0 else 0.0

    @property
    def has_post_engine(self) -> bool:
        """Whether any of the front end is placed after the engine's step."""
        return self.post_engine_s > 0.0 or self.post_engine_per_token_s > 0.0

    def post_engine_delay_s(self, frontend: FrontendModel | None, num_prompt_tokens: int) -> float:
        """Pure delay of every token of a request of ``num_prompt_tokens`` prompt tokens after
        its engine step, s: ``post_engine_s + post_engine_per_token_s * num_prompt_tokens`` less
        the lane work that ``frontend`` already charges a lone token (``per_step_s +
        per_output_token_s``), never below 0."""
        lane = frontend.per_step_s + frontend.per_output_token_s if frontend is not None else 0.0
        return max(0.0, self.post_engine_s + self.post_engine_per_token_s * num_prompt_tokens - lane)


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """vLLM's KV-capacity rule inputs, so shared GPUs can be re-derived.

    ``num_gpu_blocks = (gpu_memory_bytes * gpu_memory_utilization - weight_bytes
    - activation_peak_bytes - non_torch_bytes - cudagraph_bytes) // kv_bytes_per_block``
    (``vllm/v1/worker/gpu_worker.py: determine_available_memory``; the utilisation is the
    share of the whole device this one instance may take; ``cudagraph_bytes``, 0 unless given,
    is the CUDA-graph memory vLLM sets aside from 0.21, ``cudagraph_memory_estimate_applied``).
    """

    gpu_memory_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    kv_bytes_per_block: int
    cudagraph_bytes: int = 0

    def num_gpu_blocks(self, gpu_memory_utilization: float) -> int:
        """Blocks vLLM would allocate at this utilisation.

        Raises:
            KVBlockTooLarge: memory is left for the KV cache but fewer than 2 blocks fit in it
                (naming one block's bytes and the memory left).
            ValueError: no memory is left after weights and activations, or more blocks fit
                than a worker may hold.
        """
        free = (
            self.gpu_memory_bytes * gpu_memory_utilization
            - self.weight_bytes
            - self.activation_peak_bytes
            - self.non_torch_bytes
            - self.cudagraph_bytes
        )
        blocks = int(free // self.kv_bytes_per_block)
        if blocks > KV_BLOCKS.maximum:
            raise ValueError(f"{blocks:,} KV blocks fit, more than the {KV_BLOCKS.maximum:,} a worker may hold "
                             "(a 32-bit block id); check the memory section's byte counts")
        taken = [("weights", self.weight_bytes), ("activations", self.activation_peak_bytes),
                 ("non-torch memory", self.non_torch_bytes)] + (
            [("CUDA graphs", self.cudagraph_bytes)] if self.cudagraph_bytes else [])
        parts = [f"{what} {size / 2**30:.1f} GiB" for what, size in taken]
        budget = (f"{self.gpu_memory_bytes * gpu_memory_utilization / 2**30:.1f} GiB at utilisation "
                  f"{gpu_memory_utilization} minus {', '.join(parts[:-1])} and {parts[-1]}")
        if blocks < 2 and free > 0:  # memory is left, but a block is too large for two of them to fit
            raise KVBlockTooLarge(
                f"no KV cache fits: one KV block takes {self.kv_bytes_per_block:,} bytes "
                f"({_size(self.kv_bytes_per_block)}), and the memory left for the KV cache, {_size(free)} "
                f"({budget}), holds {blocks} of them; at least 2 are needed (vLLM keeps one as its null block)")
        if blocks < 2:
            raise ValueError(f"no KV cache fits: {budget}")
        return blocks


class KVBlockTooLarge(ValueError):
    """The memory left for the KV cache is positive but holds fewer than two KV blocks
    (:meth:`MemoryModel.num_gpu_blocks`): a smaller block size is one remedy."""


def _size(num_bytes: float) -> str:
    """Bytes as GiB (``"62.6 GiB"``), or MiB below 1 GiB (``"2.0 MiB"``)."""
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


@dataclass(frozen=True, slots=True)
class CoefficientUncertainty:
    """Uncertainty of a profile's fitted coefficients (the ``step_cost_uncertainty`` section).

    Attributes:
        fields: coefficient names, ``"step_cost.<StepCost field>"`` or ``"overheads.<Overheads field>"``.
        samples: coefficient vectors, one value per field each (bootstrap refits); may be empty
            when ``relative_range`` is given.
        relative_range: r: every field of ``fields`` lies in ``[(1 - r) c, (1 + r) c]`` around the
            profile's value ``c`` (stated ranges of derived priors); None with ``samples``.
        method: how the uncertainty was obtained (free text kept for reports).

    Raises:
        ValueError: unknown field, a sample of the wrong length, a negative or non-finite value,
            or neither samples nor a relative range.
    """

    fields: tuple[str, ...]
    samples: tuple[tuple[float, ...], ...] = ()
    relative_range: float | None = None
    method: str = ""

    def __post_init__(self) -> None:
        for name in self.fields:
            section, _, key = name.partition(".")
            known = {"step_cost": StepCost.__dataclass_fields__, "overheads": Overheads.__dataclass_fields__}
            if key not in known.get(section, ()):
                raise ValueError(f"unknown uncertain coefficient {name!r} (step_cost.<name> or overheads.<name>)")
        for i, row in enumerate(self.samples):
            if len(row) != len(self.fields):
                raise ValueError(f"sample {i} has {len(row)} values for {len(self.fields)} fields")
            if not all(v >= 0.0 and v != float("inf") for v in row):
                raise ValueError(f"sample {i} has a negative or non-finite value")
        if not self.samples and self.relative_range is None:
            raise ValueError("give samples or a relative_range")
        if self.relative_range is not None and not 0.0 <= self.relative_range < 1.0:
            raise ValueError(f"relative_range must be in [0, 1), got {self.relative_range}")

    def interval(self, name: str, value: float, coverage: float = 0.95) -> tuple[float, float] | None:
        """Central ``coverage`` range of coefficient ``name`` (whose profile value is ``value``):
        percentiles of the samples, else ``value`` times ``1 -/+ relative_range``; None when
        ``name`` is not one of ``fields``."""
        if name not in self.fields:
            return None
        if self.samples:
            import numpy as np

            column = np.array([row[self.fields.index(name)] for row in self.samples])
            lo, hi = np.percentile(column, [50 * (1 - coverage), 50 * (1 + coverage)])
            return float(lo), float(hi)
        r = float(self.relative_range)
        return value * (1 - r), value * (1 + r)

    def to_dict(self) -> dict:
        """The JSON section (layout of the module docstring)."""
        doc: dict = {"method": self.method, "fields": list(self.fields)}
        if self.samples:
            doc["num_samples"] = len(self.samples)
            doc["samples"] = [list(row) for row in self.samples]
        if self.relative_range is not None:
            doc["relative_range"] = self.relative_range
        return doc


def uncertainty_from_dict(doc: dict, where: str = "<dict>") -> CoefficientUncertainty:
    """Parse a ``step_cost_uncertainty`` section; errors name ``where`` and the field."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: step_cost_uncertainty must be an object")
    try:
        rel = doc.get("relative_range")
        return CoefficientUncertainty(
            fields=tuple(str(f) for f in doc.get("fields", ())),
            samples=tuple(tuple(float(v) for v in row) for row in doc.get("samples", ())),
            relative_range=None if rel is None else float(rel),
            method=str(doc.get("method", "")),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: step_cost_uncertainty: {exc}") from exc


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
        frontend: the API processes as a queue (``kvroute.sim.timing.frontend``); None: overheads only,
            as if the API server had unlimited capacity.
        host: the host's cores and their contention; None: steps never stretched.
        raw: the whole JSON document (hardware, model, provenance, sources), kept for reports.
        uncertainty: the fitted coefficients' uncertainty (``step_cost_uncertainty``), or None.
        async_cpu_fraction: the share of ``step_cost.step_overhead_s`` that async scheduling
            overlaps with the GPU (``engine.async_cpu_fraction``; ``kvroute.sim.timing.async_overlap``):
            stated 1.0 by default; a derived tensor-parallel prior's is its CPU part (the
            all-reduce is GPU time), a profile fitted to servers that scheduled asynchronously 0
            (their measured steps have the overlap in them already).
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
    uncertainty: CoefficientUncertainty | None = field(default=None, compare=False, repr=False)
    async_cpu_fraction: float = STATED_CPU_FRACTION

    @property
    def vllm_version(self) -> str | None:
        """The vLLM release the profile stands for (``engine.vllm_version``), or None."""
        engine = self.raw.get("engine") if isinstance(self.raw, dict) else None
        version = engine.get("vllm_version") if isinstance(engine, dict) else None
        return version if isinstance(version, str) else None

    @property
    def on_cpu(self) -> bool:
        """Whether the profile was measured on vLLM's CPU backend (``hardware.device`` ``"cpu"``)."""
        hardware = self.raw.get("hardware") if isinstance(self.raw, dict) else None
        return isinstance(hardware, dict) and hardware.get("device") == "cpu"

    @property
    def async_scheduling(self) -> bool | None:
        """Whether the profiled engine scheduled asynchronously (``engine.async_scheduling``),
        or None when the profile does not say (profiles written before issue 33)."""
        engine = self.raw.get("engine") if isinstance(self.raw, dict) else None
        flag = engine.get("async_scheduling") if isinstance(engine, dict) else None
        return flag if isinstance(flag, bool) else None

    def version_note(self, version: str | None, async_scheduling: bool | None = None) -> str | None:
        """A one-line note when this profile is used to predict servers of another vLLM release
        (another ``major.minor``) or another async-scheduling setting; None when they match or
        either side is unknown (``kvroute.sim.timing.vllm_versions``)."""
        from kvroute.sim.timing.vllm_versions import family, parse_version

        mine = self.vllm_version
        parts = []
        if parse_version(mine) and parse_version(version) and family(mine) != family(version):
            parts.append(f"measured or derived for vLLM {mine}, used for vLLM {version}")
        if self.async_scheduling is not None and async_scheduling is not None and self.async_scheduling != async_scheduling:
            parts.append(f"async scheduling {'on' if self.async_scheduling else 'off'} in the profile, "
                         f"{'on' if async_scheduling else 'off'} on the servers")
        if not parts:
            return None
        return (f"profile {self.name}: " + "; ".join(parts) + " (defaults, step overlap and the live path differ "
                "across releases: docs/reference/vllm-versions.md)")

    def speed_period_interval(self) -> tuple[float, float] | None:
        """The engine-speed periods the profile's sweep allows, ``(low, high)`` in s (``high``
        ``inf``: up to one speed per run), from ``provenance.fit.bursts.engine_speed_period_interval_s``
        as ``kvroute calibrate fit`` writes it; None when the profile carries no such interval (or
        one that is not ``0 < low <= high``)."""
        fit = (self.raw.get("provenance") or {}).get("fit") if isinstance(self.raw, dict) else None
        bursts = fit.get("bursts") if isinstance(fit, dict) else None
        interval = bursts.get("engine_speed_period_interval_s") if isinstance(bursts, dict) else None
        if not (isinstance(interval, list) and len(interval) == 2 and isinstance(interval[0], (int, float))):
            return None
        low = float(interval[0])
        high = float(interval[1]) if isinstance(interval[1], (int, float)) else float("inf")
        return (low, high) if 0.0 < low <= high else None  # NaN, negative or reversed: not an interval

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


def model_key(name: str) -> str:
    """A model's name as kvroute compares names from different sources (a profile, a server, a
    workload config): its last path component, lower case (``meta-llama/Llama-3.1-70B-Instruct``
    and ``/cache/llama-3.1-70b-instruct/`` alike give ``llama-3.1-70b-instruct``)."""
    return str(name).rstrip("/").rsplit("/", 1)[-1].lower()


def profile_model_key(profile: Profile) -> str:
    """:func:`model_key` of the model ``profile`` describes (its name, else its path or id);
    '' when the profile names none."""
    model = profile.raw.get("model") or {}
    return model_key(model.get("name") or model.get("path_or_id") or "")


def with_overrides(profile: Profile, max_model_len: int | None = None, kv_blocks: int | None = None) -> Profile:
    """``profile`` with its engine's ``max_model_len`` (tokens) and ``num_gpu_blocks`` (per
    worker) replaced where given; None keeps the profile's value.

    An overridden block count drops the memory model, so that nothing re-derives the blocks
    (workers sharing a GPU then cannot be split by vLLM's memory rule).

    Raises:
        ValueError: an engine vLLM would refuse to start (:meth:`EngineConfig.vllm_refusal`: a
            ``max_model_len`` below the profile's ``long_prefill_token_threshold``).
    """
    overrides = {k: v for k, v in (("max_model_len", max_model_len), ("num_gpu_blocks", kv_blocks)) if v is not None}
    if not overrides:
        return profile
    engine = replace(profile.engine, **overrides)
    if refusal := engine.vllm_refusal():
        raise ValueError(f"{profile.name}: engine.{refusal[0]} {refusal[1]}")
    profile = replace(profile, engine=engine)
    return replace(profile, memory=None) if kv_blocks is not None else profile


def with_scheduling(profile: Profile, async_scheduling: bool | None) -> Profile:
    """``profile`` with its engine's ``async_scheduling`` set (vLLM's
    ``SchedulerConfig.async_scheduling``); None keeps the profile's setting."""
    if async_scheduling is None or profile.engine.async_scheduling == async_scheduling:
        return profile
    return replace(profile, engine=replace(profile.engine, async_scheduling=async_scheduling))


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped in ``kvroute.sim.timing.profiles``."""
    root = resources.files("kvroute.sim.timing.profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name or a profile JSON file by path (a folder named like a
    shipped profile, e.g. a run's output, is passed over for the shipped one).

    Raises:
        FileNotFoundError: the name is neither a file nor a shipped profile (lists the valid names).
        InputError (a ValueError): the file cannot be read, is not JSON, or a field is missing
            or invalid; the one-line message names the file (and line or field).
    """
    path = Path(name_or_path)
    shipped = resources.files("kvroute.sim.timing.profiles") / f"{name_or_path}.json"
    # a folder that happens to bear a shipped profile's name (a run's --out) does not hide it
    if path.suffix == ".json" or (path.exists() and not (path.is_dir() and shipped.is_file())):
        if not path.exists():
            raise FileNotFoundError(f"profile file {path} does not exist")
        if path.is_dir():
            raise InputError("is a directory; give a profile JSON file or a shipped profile name", str(path))
        check_regular_file(path)
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the profile: {exc}", str(path)) from None
    else:
        entry = shipped
        if not entry.is_file():
            raise FileNotFoundError(
                f"unknown profile {str(name_or_path)!r}; shipped profiles: "
                f"{', '.join(shipped_profiles())} (or give a path to a profile JSON file)"
            )
        text, where = entry.read_text(), f"shipped profile {name_or_path}"
    try:
        doc = JSON_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", where, exc.lineno) from None
    except DuplicateKeyError as exc:  # json would keep the last value silently
        raise InputError(exc.reason, where, None, exc.field) from None
    except ValueError as exc:  # an int of over 4300 digits
        raise InputError(f"not valid JSON: {' '.join(str(exc).split(';')[0].split())}", where) from None
    return profile_from_dict(doc, where)


ENGINE_SCHEMA = {
    "block_size": BLOCK_SIZE,
    "num_gpu_blocks": KV_BLOCKS,
    "max_num_batched_tokens": POSITIVE_INT,
    "max_num_seqs": POSITIVE_INT,
    "max_model_len": TOKENS,
    "long_prefill_token_threshold": COUNT,
    "gpu_memory_utilization": FRACTION,
    "async_cpu_fraction": Num(minimum=0.0, maximum=1.0),
}
"""Rules of a profile's ``engine`` section (block_size and num_gpu_blocks are required)."""

STEP_COST_SCHEMA = {name: COST_SECONDS for name in StepCost.__dataclass_fields__}
"""Rules of the ``step_cost`` section: every coefficient required, finite, between 0 and 3600 s."""

OVERHEADS_SCHEMA = {
    "api_server_s": COST_SECONDS,
    "gateway_s": COST_SECONDS,
    "jitter_cv": Num(minimum=0.0, maximum=10.0),
    "api_server_per_token_s": COST_SECONDS,
    "post_engine_s": COST_SECONDS,
    "post_engine_per_token_s": COST_SECONDS,
    "engine_admission_s": COST_SECONDS,
    "engine_admission_per_token_s": COST_SECONDS,
}
"""Rules of the optional ``overheads`` section."""

MEMORY_SCHEMA = ({name: BYTES for name in MemoryModel.__dataclass_fields__}
                 | {"kv_bytes_per_block": Num(integer=True, minimum=1, maximum=BYTES.maximum, unit="bytes")})
"""Rules of the optional ``memory`` section (every field but ``cudagraph_bytes``, 0 when left out,
required when it is present)."""


def _check_fit_notes(notes: object, where: str) -> None:
    """A profile's ``fit_notes`` (``kvroute.calibrate.calibration.walls.fit_notes_document``), when
    present: an object whose ``at_bound`` and ``scatter`` are lists of objects, as the
    uncertainty's term ranges (``kvroute.sim.timing.uncertainty.term_ranges``) read them.

    Raises:
        InputError: naming ``where`` and the field.
    """
    if notes is None:
        return
    if type(notes) is not dict:
        raise InputError(f"expected an object, got {describe(notes)}", where, None, "fit_notes")
    for key in ("at_bound", "scatter"):
        entries = notes.get(key, [])
        if type(entries) is not list:
            raise InputError(f"expected a list, got {describe(entries)}", where, None, f"fit_notes.{key}")
        for i, entry in enumerate(entries):
            if type(entry) is not dict:
                raise InputError(f"expected an object, got {describe(entry)}", where, None, f"fit_notes.{key}[{i}]")


HELDOUT_ERRORS = ("median_ape", "p90_ape", "median_abs_log_error", "p90_abs_log_error")
"""The fit's held-out error fields per kind that prediction intervals read
(``kvroute.sim.timing.heldout``)."""


def _check_heldout_errors(doc: dict, where: str) -> None:
    """A profile's held-out fit errors (``provenance.fit.heldout`` and
    ``heldout_single_measurements``, per kind: :data:`HELDOUT_ERRORS`), when present: each a
    finite number >= 0, or null (the fit writes null for an error it could not compute).

    Raises:
        InputError: naming ``where`` and the field.
    """
    provenance = doc.get("provenance")
    fit = provenance.get("fit") if isinstance(provenance, dict) else None
    if not isinstance(fit, dict):
        return
    for block in ("heldout", "heldout_single_measurements"):
        kinds = fit.get(block)
        if kinds is None:
            continue
        if type(kinds) is not dict:
            raise InputError(f"expected an object, got {describe(kinds)}", where, None, f"provenance.fit.{block}")
        for kind, errors in kinds.items():
            field = f"provenance.fit.{block}.{kind}"
            if type(errors) is not dict:
                raise InputError(f"expected an object, got {describe(errors)}", where, None, field)
            for key in HELDOUT_ERRORS:
                value = errors.get(key)
                if value is not None and not (type(value) in (int, float) and math.isfinite(value) and value >= 0):
                    raise InputError(f"expected a finite number >= 0 or null, got {describe(value)}", where, None,
                                     f"{field}.{key}")


def profile_from_dict(doc: object, where: str = "<dict>") -> Profile:
    """Build a Profile from a parsed profile document, checking every value once.

    Raises:
        InputError (a ValueError): ``doc`` or a section is not an object, a required field is
            missing, or a value has the wrong type, is not finite or is out of range (see the
            ``*_SCHEMA`` tables); the one-line message names ``where`` and the field.
    """
    if type(doc) is not dict:
        raise InputError(f"a profile is a JSON object, got {describe(doc)}", where)

    def section(key: str, schema: dict[str, Num], required: tuple[str, ...], also: tuple[str, ...] = ()) -> dict:
        value = doc.get(key)
        if type(value) is not dict:
            raise InputError(f"missing or invalid section (expected an object, got {describe(value)})",
                             where, None, key)
        # NOTE: a misspelt coefficient would otherwise be ignored and the run use the real one
        unknown = sorted(k for k in value if k not in schema and k not in also and not k.startswith("_"))
        if unknown:
            raise InputError(f"unknown field (known: {', '.join(sorted([*schema, *also]))})", where, None,
                             f"{key}.{unknown[0]}")
        return check_fields(value, schema, where, required=required, prefix=f"{key}.")

    engine_doc = section("engine", ENGINE_SCHEMA, ("block_size", "num_gpu_blocks"),
                         also=("enable_prefix_caching", "vllm_version", "async_scheduling"))
    cost_doc = section("step_cost", STEP_COST_SCHEMA, tuple(STEP_COST_SCHEMA))
    over_doc = section("overheads", OVERHEADS_SCHEMA, ()) if doc.get("overheads") is not None else {}
    memory = None
    if doc.get("memory") is not None:  # an empty or false section is checked, not skipped
        required = tuple(k for k in MEMORY_SCHEMA if k != "cudagraph_bytes")
        memory = MemoryModel(**section("memory", MEMORY_SCHEMA, required))
    enable = doc["engine"].get("enable_prefix_caching", True)
    if type(enable) is not bool:
        raise InputError(f"expected true or false, got {describe(enable)}", where, None,
                         "engine.enable_prefix_caching")
    engine_async = doc["engine"].get("async_scheduling", False)
    if type(engine_async) is not bool:
        raise InputError(f"expected true or false, got {describe(engine_async)}", where, None,
                         "engine.async_scheduling")
    version = doc["engine"].get("vllm_version")
    if version is not None and type(version) is not str:
        raise InputError(f"expected a string, got {describe(version)}", where, None, "engine.vllm_version")
    try:
        engine = EngineConfig(
            block_size=engine_doc["block_size"],
            num_gpu_blocks=engine_doc["num_gpu_blocks"],
            max_num_batched_tokens=engine_doc.get("max_num_batched_tokens", 2048),
            max_num_seqs=engine_doc.get("max_num_seqs", 256),
            max_model_len=engine_doc.get("max_model_len", 32768),
            long_prefill_token_threshold=engine_doc.get("long_prefill_token_threshold", 0),
            enable_prefix_caching=enable,
            async_scheduling=engine_async,
        )
    except ValueError as exc:
        raise InputError(str(exc), where, None, "engine") from None
    if refusal := engine.vllm_refusal():
        raise InputError(refusal[1], where, None, f"engine.{refusal[0]}")
    _check_fit_notes(doc.get("fit_notes"), where)
    _check_heldout_errors(doc, where)
    name = doc.get("name", where)
    if type(name) is not str:
        raise InputError(f"expected a string, got {describe(name)}", where, None, "name")
    overheads = Overheads(**over_doc)
    for part, whole in (("engine_admission_s", "api_server_s"), ("engine_admission_per_token_s", "api_server_per_token_s")):
        if getattr(overheads, part) > getattr(overheads, whole):
            raise InputError(f"{getattr(overheads, part)!r} is part of overheads.{whole} "
                             f"({getattr(overheads, whole)!r}) and cannot exceed it", where, None, f"overheads.{part}")
    return Profile(
        name=name,
        engine=engine,
        step_cost=StepCost(**cost_doc),
        overheads=overheads,
        gpu_memory_utilization=engine_doc.get("gpu_memory_utilization", 0.9),
        memory=memory,
        frontend=frontend_from_dict(doc.get("frontend"), where),
        host=host_from_dict(doc.get("host"), where),
        raw=doc,
        uncertainty=(uncertainty_from_dict(doc["step_cost_uncertainty"], where)
                     if doc.get("step_cost_uncertainty") is not None else None),
        async_cpu_fraction=engine_doc.get("async_cpu_fraction", STATED_CPU_FRACTION),
    )
