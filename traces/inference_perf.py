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
LoadConfig``), field aliases included. As those classes do in 0.7.0 (``StrictBaseModel``,
``extra="forbid"``, inference-perf PR #667; 0.6.x and earlier dropped unknown keys), a key they
do not know is refused in the sections read here (the top level, ``data``,
``data.shared_prefix``, ``load``, each stage, ``server``), with the closest known key as a
suggestion; keys they know that kvroute does not model (``seed``, ``base_seed``,
``request_retries``, ...) are left unread, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.inputs import InputError, Num, describe, MAX_TOKENS
from kvroute.traces.yaml_doc import MARKDOWN_SUFFIXES, YamlSource, markdown_yaml_blocks, parse_yaml, read_text

DATA_TYPES = ("shared_prefix",)
"""``data.type`` values read (inference-perf has more: mock, shareGPT, random, ...)."""

LOAD_TYPES = ("constant", "poisson")
"""``load.type`` values read (inference-perf also has concurrent, trace_replay, trace_session_replay)."""

CONFIG_KEYS = ("api", "data", "load", "metrics", "report", "storage", "server", "tokenizer", "circuit_breakers")
"""Keys of inference-perf 0.7.0's ``Config`` (the top level)."""

DATA_KEYS = ("type", "path", "corpus_file_path", "input_distribution", "output_distribution", "shared_prefix",
             "multimodal", "trace", "otel_trace_replay", "weka_trace_replay", "conversation_replay", "visionarena",
             "synthetic_agentic", "use_chat_template")
"""Keys of inference-perf 0.7.0's ``DataConfig`` (``data``)."""

SHARED_PREFIX_KEYS = ("num_groups", "num_unique_system_prompts", "num_prompts_per_group", "num_users_per_system_prompt",
                      "system_prompt_len", "question_len", "output_len", "seed", "question_distribution",
                      "output_distribution", "enable_multi_turn_chat", "multimodal")
"""Keys of inference-perf 0.7.0's ``SharedPrefix`` (``data.shared_prefix``), aliases included."""

LOAD_KEYS = ("type", "interval", "stages", "sweep", "num_workers", "worker_max_concurrency",
             "worker_max_tcp_connections", "trace", "circuit_breakers", "request_timeout", "request_retries",
             "request_retry_backoff_sec", "stage_teardown_grace_seconds", "lora_traffic_split", "base_seed")
"""Keys of inference-perf 0.7.0's ``LoadConfig`` (``load``)."""

STAGE_KEYS = ("rate", "duration", "num_requests", "concurrency_level")
"""Keys of inference-perf 0.7.0's ``StandardLoadStage`` (an item of ``load.stages``)."""

SERVER_KEYS = ("type", "model_name", "base_url", "ignore_eos", "api_key", "cert_path", "key_path")
"""Keys of inference-perf 0.7.0's ``ModelServerClientConfig`` (``server``)."""

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
        model_name: ``server.model_name``, the model the config's run served (None when not
            given; kvroute simulates the profile's model, and the commands say when they differ).
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
    model_name: str | None = None

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
        InputError: one line naming the file, the line (in the ``.md`` file for a report) and
            the field: unreadable file, not YAML, a key given twice, a key inference-perf does
            not know (with the closest known one), an unknown ``data.type`` or ``load.type``, a
            missing or out-of-range field.
    """
    where = str(path)
    text, offset = read_text(path), 0
    if where.lower().endswith(MARKDOWN_SUFFIXES):
        text, offset = _yaml_block(text, where)
    doc = parse_yaml(text, where, offset, track_lines=True)
    return parse_workload_config(doc, where, offset)


def parse_workload_config(doc: object, where: str = "<config>", line_offset: int = 0) -> WorkloadConfig:
    """A parsed config (a dict) as a :class:`WorkloadConfig`; ``where`` names it in errors.

    Args:
        doc: the parsed document; parsed with line tracking (``parse_yaml(..., track_lines=True)``:
            :class:`~kvroute.traces.yaml_doc.LineMap`) its errors also name the line.
        where: the file, in errors.
        line_offset: lines before the document in that file (a Markdown report's YAML block).

    Raises:
        InputError: naming the field (``data.type``, ``load.stages[2].rate``, ...), its line when
            known, and why; a key inference-perf 0.7.0 does not know (``system_promt_len``), with
            the closest one it knows (:func:`_known_keys`).
    """
    at = YamlSource(where, line_offset)
    if not isinstance(doc, dict):
        raise InputError(f"expected a mapping, got {describe(doc)}", where)
    _known_keys(doc, CONFIG_KEYS, at, "")
    data = _section(doc, "data", at, required=True)
    _known_keys(data, DATA_KEYS, at, "data")
    data_type = data.get("type", "mock")
    if data_type not in DATA_TYPES:
        raise at.error(f"unsupported {data_type!r}; kvroute reads {', '.join(DATA_TYPES)}", data, "type", "data.type")
    sp = _section(data, "shared_prefix", at, "data.", required=True)
    _known_keys(sp, SHARED_PREFIX_KEYS, at, "data.shared_prefix")
    p = "data.shared_prefix."
    shared = SharedPrefix(
        num_groups=_field(sp, ("num_groups", "num_unique_system_prompts"), 10, _COUNT, at, p),
        num_prompts_per_group=_field(sp, ("num_prompts_per_group", "num_users_per_system_prompt"), 10, _COUNT, at, p),
        system_prompt_len=_field(sp, ("system_prompt_len",), 100, _LENGTH, at, p),
        question_len=_field(sp, ("question_len",), 50, _LENGTH, at, p),
        output_len=_field(sp, ("output_len",), 50, _OUTPUT, at, p),
    )
    for name in ("question_distribution", "output_distribution", "multimodal"):
        if sp.get(name) is not None:
            raise at.error("not supported by kvroute (fixed lengths only)", sp, name, p + name)
    if sp.get("enable_multi_turn_chat"):
        raise at.error("multi-turn shared-prefix chats are not supported by kvroute", sp, "enable_multi_turn_chat",
                       p + "enable_multi_turn_chat")
    if shared.system_prompt_len + shared.question_len < 1:
        raise at.error("a prompt needs at least one token (system_prompt_len + question_len)", data, "shared_prefix",
                       "data.shared_prefix")
    load = _section(doc, "load", at, required=True)
    _known_keys(load, LOAD_KEYS, at, "load")
    load_type = load.get("type", "constant")
    if load_type not in LOAD_TYPES:
        raise at.error(f"unsupported {load_type!r}; kvroute reads {', '.join(LOAD_TYPES)}", load, "type", "load.type")
    if load.get("sweep") is not None:
        raise at.error("sweeps (stages found from a saturation probe) are not supported; list the stages", load,
                       "sweep", "load.sweep")
    raw_stages = load.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        got = "an empty list" if isinstance(raw_stages, list) else describe(raw_stages)
        raise at.error(f"expected a list of stages ({{rate, duration}}), got {got}", load, "stages", "load.stages")
    stages = []
    for i, raw in enumerate(raw_stages):
        prefix = f"load.stages[{i}]."
        if not isinstance(raw, dict):
            raise at.error(f"expected a mapping, got {describe(raw)}", raw_stages, i, prefix.rstrip("."))
        _known_keys(raw, STAGE_KEYS, at, prefix.rstrip("."))
        for name in ("num_requests", "concurrency_level"):
            if raw.get(name) is not None:
                raise at.error(f"should not be set for {load_type} load (inference-perf's rule)", raw, name,
                               prefix + name)
        stages.append(Stage(_field(raw, ("rate",), None, _RATE, at, prefix),
                            _field(raw, ("duration",), None, _DURATION, at, prefix)))
    if not any(stage.num_requests for stage in stages):
        raise at.error("every stage sends int(rate x duration) = 0 requests (inference-perf's run_stage): no "
                       "request to run; raise a rate or a duration", load, "stages", "load.stages")
    server = _section(doc, "server", at)
    _known_keys(server, SERVER_KEYS, at, "server")
    ignore_eos = server.get("ignore_eos", True)
    if type(ignore_eos) is not bool:
        raise at.error(f"expected true or false, got {describe(ignore_eos)}", server, "ignore_eos",
                       "server.ignore_eos")
    timeout = load.get("request_timeout")
    workers = load.get("num_workers")
    return WorkloadConfig(
        source=where, data=shared, load_type=load_type, stages=tuple(stages),
        interval_s=float(_field(load, ("interval",), 1.0, _INTERVAL, at, "load.")),
        request_timeout_s=None if timeout is None else float(
            _TIMEOUT.check(timeout, "load.request_timeout", where, at.line(load, "request_timeout"))),
        num_workers=None if workers is None else _COUNT.check(workers, "load.num_workers", where,
                                                              at.line(load, "num_workers")),
        worker_max_concurrency=_field(load, ("worker_max_concurrency",), 100, _COUNT, at, "load."),
        ignore_eos=ignore_eos,
        model_name=server.get("model_name") if isinstance(server.get("model_name"), str) else None,
    )


def workload_trace(config: WorkloadConfig, seed: int, block_size: int = TRACE_BLOCK_SIZE) -> Trace:
    """The config's requests as a trace for seed ``seed`` (prompt order and arrival times).

    Returns:
        A trace of ``sum(stage.num_requests)`` records, each with its ``stage``; ``timestamp_ms``
        lays the stages end to end, ``stage_gap_s`` apart. ``metadata``: ``stages`` (one dict
        per stage: ``stage``, ``rate``, ``duration_s``, ``requests``, ``start_ms``),
        ``stage_gap_s``, ``request_timeout_s`` (the client's), ``load_type``, ``num_prompts``, ``model_name``
        (``server.model_name`` or None).
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
                "num_prompts": sp.num_prompts, "model_name": config.model_name}
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


def _section(doc: dict, name: str, at: YamlSource, prefix: str = "", required: bool = False) -> dict:
    value = doc.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        reason = "required section missing" if value is None else f"expected a mapping, got {describe(value)}"
        # a section missing from the top level has no line; one missing inside a section, that section's
        raise at.error(reason, doc if name in doc or prefix else None, name, prefix + name)
    return value


def _known_keys(node: dict, keys: tuple[str, ...], at: YamlSource, section: str) -> None:
    """Refuse a key of ``node`` that is not one of ``keys`` (inference-perf's fields of that
    section: its config models forbid any other), naming its line and the closest known key.

    A misspelt key would otherwise leave its field at the default, silently (``system_promt_len``
    gave every prompt 100 system-prompt tokens instead of 8,000).
    """
    import difflib

    for key in node:
        if key in keys:
            continue
        close = difflib.get_close_matches(key, keys, n=1) if isinstance(key, str) else []
        hint = f"did you mean {close[0]!r}?" if close else \
            f"the keys of {section or 'the top level'} are {', '.join(keys)}"
        raise at.error(f"unknown key (inference-perf 0.7.0 refuses it too); {hint}", node, key,
                       f"{section}.{key}" if section else str(key))


def _field(doc: dict, names: tuple[str, ...], default, rule: Num, at: YamlSource, prefix: str):
    """The first of ``names`` present in ``doc`` (inference-perf's aliases), checked by ``rule``;
    ``default`` when none is (None: required)."""
    given = [name for name in names if doc.get(name) is not None]
    if len(given) > 1:
        raise at.error(f"given twice, as {' and '.join(given)}", doc, given[1], prefix + given[1])
    if not given:
        if default is None:
            raise at.error("required field missing", doc, None, prefix + names[0])
        return default
    value = doc[given[0]]
    if isinstance(value, dict) and "mean" in value:
        raise at.error("length distributions are not supported by kvroute; give a fixed int", doc, given[0],
                       prefix + given[0])
    return rule.check(value, prefix + given[0], at.where, at.line(doc, given[0]))


def _yaml_block(text: str, where: str) -> tuple[str, int]:
    """The first fenced YAML block of a Markdown file with a top-level ``load:`` key, and the
    number of lines before it (for error lines)."""
    for block, offset, _ in markdown_yaml_blocks(text):
        if re.search(r"^load:", block, re.M):
            return block, offset
    raise InputError("no ```yaml block with a top-level 'load:' key", where)
