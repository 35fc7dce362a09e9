"""inference-perf workload configs as traces: ``data: shared_prefix`` under a ``constant`` or
``poisson`` stage ladder, as inference-perf 0.7.0 sends it.

What is mirrored (``docs/reference/load-generators.md`` gives the reading in full):

- Prompts (``inference_perf/datagen/synthetic/shared_prefix_datagen.py``): ``num_groups`` shared
  system prompts of ``system_prompt_len`` tokens, each followed by ``num_prompts_per_group``
  questions of ``question_len`` tokens: ``num_groups * num_prompts_per_group`` distinct prompts,
  put in one seeded random order. Request ``k`` of a stage sends prompt ``k`` of that order
  (modulo its size); every stage starts again at prompt 0 (``run_stage`` calls ``get_data()``
  anew). ``max_tokens`` is ``output_len`` and ``ignore_eos`` is ``server.ignore_eos`` (default
  true), so a reply is exactly ``output_len`` tokens.
- Arrivals (``inference_perf/loadgen/load_timer.py``, ``load_generator.py: run_stage``): a stage
  sends ``int(rate * duration)`` requests. ``constant`` draws exponential gaps and scales them
  so that they sum to ``duration`` (the last request is sent at the stage's end); ``poisson``
  draws a Poisson count for each second and spreads that many requests over the second the same
  way, until the stage's count is reached.
- Stage boundaries: a stage ends when every request of it has finished (or failed); the next
  starts ``load.interval`` (default 1 s) plus a 1 s lead later. The simulated client keeps that
  barrier (``kvroute.sim.cluster.cluster``); the timestamps here lay the stages end to end as if
  each finished on time, and ``Trace.metadata["stages"]`` says where each begins.
- The client gives up on a request after ``load.request_timeout`` seconds, or aiohttp's default
  total timeout (300 s) when it is unset (``client/modelserver/openai_client.py``).

The package itself is not imported: inference-perf requires Python >= 3.12, pins transformers
and imports PyAV with its config classes, and kvroute runs on 3.11. The YAML is read with PyYAML
and the fields used here are checked by the rules of inference-perf's pydantic classes
(``config/datagen/config.py: SharedPrefix``, ``config/loadgen/config.py: StandardLoadStage,
LoadConfig``), field aliases included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.inputs import InputError, Num, describe, MAX_TOKENS
from kvroute.traces.yaml_doc import parse_yaml, read_text

DATA_TYPES = ("shared_prefix",)
"""``data.type`` values read (inference-perf has more: mock, shareGPT, random, ...)."""

LOAD_TYPES = ("constant", "poisson")
"""``load.type`` values read (inference-perf also has concurrent, trace_replay, trace_session_replay)."""

AIOHTTP_DEFAULT_TIMEOUT_S = 300.0
"""aiohttp's ``DEFAULT_TIMEOUT.total``, what inference-perf's session uses without ``load.request_timeout``."""

STAGE_LEAD_S = 1.0
"""``run_stage`` schedules a stage's first request times from ``perf_counter() + 1``."""

TRACE_BLOCK_SIZE = 16
"""Tokens per ``hash_ids`` block of the traces built here (vLLM's default block on GPUs; engines
of 16, 32, 64, ... tokens per block read them unchanged)."""

_COUNT = Num(integer=True, minimum=1)
_LENGTH = Num(integer=True, minimum=0, maximum=MAX_TOKENS, unit="tokens")
_OUTPUT = Num(integer=True, minimum=1, maximum=MAX_TOKENS, unit="tokens")
_RATE = Num(minimum=0.0, above=True, maximum=1e6)
_DURATION = Num(integer=True, minimum=0, above=True, maximum=10**7, unit="s")
_TIMEOUT = Num(minimum=0.0, above=True, maximum=1e9, unit="s")
_INTERVAL = Num(minimum=0.0, maximum=1e9, unit="s")


@dataclass(frozen=True, slots=True)
class Stage:
    """One load stage: ``rate`` requests per second for ``duration_s`` seconds."""

    rate: float
    duration_s: int

    @property
    def num_requests(self) -> int:
        """Requests the stage sends: ``int(rate * duration)`` (``run_stage``)."""
        return int(self.rate * self.duration_s)


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """``data.shared_prefix``: groups, prompts per group and lengths, tokens."""

    num_groups: int
    num_prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int

    @property
    def num_prompts(self) -> int:
        """Distinct prompts: ``num_groups * num_prompts_per_group``."""
        return self.num_groups * self.num_prompts_per_group


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """The parts of an inference-perf config that decide the workload and its client.

    Attributes:
        source: the file read.
        data: the shared-prefix prompts.
        load_type: ``constant`` or ``poisson``.
        stages: the stage ladder, in order.
        interval_s: ``load.interval``, seconds between a stage's end and the next stage.
        request_timeout_s: ``load.request_timeout``, s, or None (aiohttp's 300 s then applies).
        num_workers: ``load.num_workers`` when given (inference-perf's default is the CPU count).
        worker_max_concurrency: ``load.worker_max_concurrency`` (default 100 per worker).
        ignore_eos: ``server.ignore_eos`` (default true).
    """

    source: str
    data: SharedPrefix
    load_type: str
    stages: tuple[Stage, ...]
    interval_s: float = 1.0
    request_timeout_s: float | None = None
    num_workers: int | None = None
    worker_max_concurrency: int = 100
    ignore_eos: bool = True

    @property
    def client_timeout_s(self) -> float:
        """The client's per-request total timeout, s: ``request_timeout`` or aiohttp's 300 s."""
        return AIOHTTP_DEFAULT_TIMEOUT_S if self.request_timeout_s is None else self.request_timeout_s

    @property
    def client_slots(self) -> int | None:
        """The client's request slots, ``num_workers * worker_max_concurrency``, when the config
        sets ``load.num_workers`` (else None: inference-perf's default is the benchmarking host's
        CPU count, which a config does not record)."""
        return None if self.num_workers is None else self.num_workers * self.worker_max_concurrency

    @property
    def stage_gap_s(self) -> float:
        """Seconds from a stage's last finished request to the next stage's schedule start."""
        return self.interval_s + STAGE_LEAD_S


def read_workload_config(path: str | Path) -> WorkloadConfig:
    """Read an inference-perf YAML config, or the first YAML block with a ``load:`` key in a
    Markdown report (``.md``), as its publishers print it.

    Raises:
        InputError: one line naming the file, the line where known and the field: unreadable
            file, not YAML, a key given twice, an unknown ``data.type`` or ``load.type``, a
            missing or out-of-range field.
    """
    where = str(path)
    text, offset = read_text(path), 0
    if where.lower().endswith((".md", ".markdown")):
        text, offset = _yaml_block(text, where)
    doc = parse_yaml(text, where, offset)
    return parse_workload_config(doc, where)


def parse_workload_config(doc: object, where: str = "<config>") -> WorkloadConfig:
    """A parsed config (a dict) as a :class:`WorkloadConfig`; ``where`` names it in errors.

    Raises:
        InputError: naming the field (``data.type``, ``load.stages[2].rate``, ...) and why.
    """
    if type(doc) is not dict:
        raise InputError(f"expected a mapping, got {describe(doc)}", where)
    data = _section(doc, "data", where, required=True)
    data_type = data.get("type", "mock")
    if data_type not in DATA_TYPES:
        raise InputError(f"unsupported {data_type!r}; kvroute reads {', '.join(DATA_TYPES)}", where,
                         field="data.type")
    sp = _section(data, "shared_prefix", where, "data.", required=True)
    shared = SharedPrefix(
        num_groups=_field(sp, ("num_groups", "num_unique_system_prompts"), 10, _COUNT, where, "data.shared_prefix."),
        num_prompts_per_group=_field(sp, ("num_prompts_per_group", "num_users_per_system_prompt"), 10, _COUNT, where,
                                     "data.shared_prefix."),
        system_prompt_len=_field(sp, ("system_prompt_len",), 100, _LENGTH, where, "data.shared_prefix."),
        question_len=_field(sp, ("question_len",), 50, _LENGTH, where, "data.shared_prefix."),
        output_len=_field(sp, ("output_len",), 50, _OUTPUT, where, "data.shared_prefix."),
    )
    for name in ("question_distribution", "output_distribution", "multimodal"):
        if sp.get(name) is not None:
            raise InputError("not supported by kvroute (fixed lengths only)", where, field=f"data.shared_prefix.{name}")
    if sp.get("enable_multi_turn_chat"):
        raise InputError("multi-turn shared-prefix chats are not supported by kvroute", where,
                         field="data.shared_prefix.enable_multi_turn_chat")
    if shared.system_prompt_len + shared.question_len < 1:
        raise InputError("a prompt needs at least one token (system_prompt_len + question_len)", where,
                         field="data.shared_prefix")
    load = _section(doc, "load", where, required=True)
    load_type = load.get("type", "constant")
    if load_type not in LOAD_TYPES:
        raise InputError(f"unsupported {load_type!r}; kvroute reads {', '.join(LOAD_TYPES)}", where, field="load.type")
    if load.get("sweep") is not None:
        raise InputError("sweeps (stages found from a saturation probe) are not supported; list the stages", where,
                         field="load.sweep")
    raw_stages = load.get("stages")
    if type(raw_stages) is not list or not raw_stages:
        raise InputError(f"expected a list of stages ({{rate, duration}}), got {describe(raw_stages)}", where,
                         field="load.stages")
    stages = []
    for i, raw in enumerate(raw_stages):
        prefix = f"load.stages[{i}]."
        if type(raw) is not dict:
            raise InputError(f"expected a mapping, got {describe(raw)}", where, field=prefix.rstrip("."))
        for name in ("num_requests", "concurrency_level"):
            if raw.get(name) is not None:
                raise InputError(f"should not be set for {load_type} load (inference-perf's rule)", where,
                                 field=prefix + name)
        stages.append(Stage(_field(raw, ("rate",), None, _RATE, where, prefix),
                            _field(raw, ("duration",), None, _DURATION, where, prefix)))
    server = doc.get("server") if type(doc.get("server")) is dict else {}
    ignore_eos = server.get("ignore_eos", True)
    if type(ignore_eos) is not bool:
        raise InputError(f"expected true or false, got {describe(ignore_eos)}", where, field="server.ignore_eos")
    timeout = load.get("request_timeout")
    workers = load.get("num_workers")
    return WorkloadConfig(
        source=where, data=shared, load_type=load_type, stages=tuple(stages),
        interval_s=float(_field(load, ("interval",), 1.0, _INTERVAL, where, "load.")),
        request_timeout_s=None if timeout is None else float(_TIMEOUT.check(timeout, "load.request_timeout", where)),
        num_workers=None if workers is None else _COUNT.check(workers, "load.num_workers", where),
        worker_max_concurrency=_field(load, ("worker_max_concurrency",), 100, _COUNT, where, "load."),
        ignore_eos=ignore_eos,
    )


def workload_trace(config: WorkloadConfig, seed: int, block_size: int = TRACE_BLOCK_SIZE) -> Trace:
    """The config's requests as a trace for seed ``seed`` (prompt order and arrival times).

    Returns:
        A trace of ``sum(stage.num_requests)`` records, each with its ``stage``; ``timestamp_ms``
        lays the stages end to end, ``stage_gap_s`` apart. ``metadata``: ``stages`` (one dict
        per stage: ``stage``, ``rate``, ``duration_s``, ``requests``, ``start_ms``),
        ``stage_gap_s``, ``request_timeout_s`` (the client's), ``load_type``, ``num_prompts``.
    """
    rng = np.random.default_rng(seed)
    prompts = _prompt_blocks(config.data, block_size)
    order = rng.permutation(len(prompts))
    sp = config.data
    input_length = sp.system_prompt_len + sp.question_len
    records, meta_stages = [], []
    start_s = 0.0
    for index, stage in enumerate(config.stages):
        n = stage.num_requests
        offsets = _constant_times(rng, n, stage.rate, stage.duration_s) if config.load_type == "constant" \
            else _poisson_times(rng, n, stage.rate)
        for k in range(n):
            prompt = int(order[k % len(order)])
            records.append(TraceRecord(len(records), (start_s + float(offsets[k])) * 1000.0, input_length,
                                       sp.output_len, prompts[prompt], session_id=None, stage=index))
        meta_stages.append({"stage": index, "rate": stage.rate, "duration_s": stage.duration_s, "requests": n,
                            "start_ms": start_s * 1000.0})
        last = float(offsets[-1]) if n else 0.0
        start_s += max(float(stage.duration_s), last) + config.stage_gap_s
    metadata = {"stages": meta_stages, "stage_gap_s": config.stage_gap_s,
                "request_timeout_s": config.client_timeout_s, "load_type": config.load_type,
                "num_prompts": sp.num_prompts}
    return Trace(records, block_size, f"inference-perf:{Path(config.source).name}", metadata)


def _prompt_blocks(sp: SharedPrefix, block_size: int) -> list[tuple[int, ...]]:
    """``hash_ids`` of every distinct prompt, group by group: the full blocks of a group's system
    prompt are the group's own ids; the block holding the boundary and every later one are the
    prompt's own."""
    shared_blocks = sp.system_prompt_len // block_size
    total_blocks = -(-(sp.system_prompt_len + sp.question_len) // block_size)
    next_id = sp.num_groups * shared_blocks
    prompts = []
    for g in range(sp.num_groups):
        prefix = tuple(range(g * shared_blocks, (g + 1) * shared_blocks))
        for _ in range(sp.num_prompts_per_group):
            own = total_blocks - shared_blocks
            prompts.append(prefix + tuple(range(next_id, next_id + own)))
            next_id += own
    return prompts


def _constant_times(rng: np.random.Generator, n: int, rate: float, duration: float) -> np.ndarray:
    """``ConstantLoadTimer``: ``n`` exponential gaps (mean ``1/rate``) scaled to sum to
    ``duration``; the send times after the start, s."""
    if n == 0:
        return np.zeros(0)
    gaps = rng.exponential(1.0 / rate, n)
    return np.cumsum(gaps * (duration / gaps.sum()))


def _poisson_times(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """``PoissonLoadTimer``: each second a Poisson(``rate``) count of requests, spread over the
    second as ``ConstantLoadTimer(count, 1)``; the first ``n`` send times after the start, s."""
    times: list[float] = []
    second = 0.0
    while len(times) < n:
        count = int(rng.poisson(rate))
        if count:
            times.extend(second + _constant_times(rng, count, count, 1.0))
        second += 1.0
    return np.asarray(times[:n])


def _section(doc: dict, name: str, where: str, prefix: str = "", required: bool = False) -> dict:
    value = doc.get(name)
    if value is None and not required:
        return {}
    if type(value) is not dict:
        reason = "required section missing" if value is None else f"expected a mapping, got {describe(value)}"
        raise InputError(reason, where, field=prefix + name)
    return value


def _field(doc: dict, names: tuple[str, ...], default, rule: Num, where: str, prefix: str):
    """The first of ``names`` present in ``doc`` (inference-perf's aliases), checked by ``rule``;
    ``default`` when none is (None: required)."""
    given = [name for name in names if doc.get(name) is not None]
    if len(given) > 1:
        raise InputError(f"given twice, as {' and '.join(given)}", where, field=prefix + given[1])
    if not given:
        if default is None:
            raise InputError("required field missing", where, field=prefix + names[0])
        return default
    value = doc[given[0]]
    if type(value) is dict and "mean" in value:
        raise InputError("length distributions are not supported by kvroute; give a fixed int", where,
                         field=prefix + given[0])
    return rule.check(value, prefix + given[0], where)


_YAML_BLOCK = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.M | re.S)


def _yaml_block(text: str, where: str) -> tuple[str, int]:
    """The first fenced YAML block of a Markdown file with a top-level ``load:`` key, and the
    number of lines before it (for error lines)."""
    for match in _YAML_BLOCK.finditer(text):
        if re.search(r"^load:", match.group(1), re.M):
            return match.group(1), text.count("\n", 0, match.start(1))
    raise InputError("no ```yaml block with a top-level 'load:' key", where)
