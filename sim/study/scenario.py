"""The one scenario type: a workload, a cluster and a routing policy (everything but the round).

:class:`Scenario` is what ``kvroute simulate``, ``compare``, ``sweep`` and ``sensitivity`` run, and
their scenario options are generated from its fields (``kvroute.cli.scenario.scenario_options``
reads each field's ``metadata``), so a field's default, its flag's default and its checks are
one. ``Scenario.trace(round)`` is the one trace loader (a file, or a built-in workload drawn for
the round's seed) and ``Scenario.spec()`` the one builder of the cluster layer's
:class:`~kvroute.sim.cluster.cluster.ClusterSpec`.

Field metadata (:func:`option`), read by the command line and by the checks here:

- ``help``: the option's help text; ``group``: where the option stands (:data:`OPTION_GROUPS`);
- ``flag``: the long flag (default: ``--`` and the name with dashes); ``aliases``: earlier
  parameter names a ``--config`` scenario file may still use;
- ``type``: the value's type at the command line (``int``, ``float``, ``str``, ``"path"``);
  ``choices``: the valid values;
- ``check``: a :class:`~kvroute.traces.inputs.Num` rule for a number, with its upper bound: every
  ``int`` or ``float`` field declares one (``tests/cli/test_bounds.py`` checks it);
- ``kind``: how a value is read and checked: ``"dist"`` (a number or a
  :mod:`kvroute.traces.lengths` distribution), ``"length"`` (also a ``(low, high)`` range of
  tokens), ``"history"`` (``H`` or ``(low, high)`` tokens), ``"arrival"`` (an arrival process),
  ``"positive"`` (a finite number > 0);
- ``axis``: False when a sweep takes one value, not a comma list; ``sweep_flags``: more flags
  of the sweep's option;
- ``option``: False for a field without a generated option (``policy``: each command has its
  own policy option).
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kvroute.sim.cluster.cluster import REPLAY_MODES, ClusterSpec
from kvroute.sim.routing import CACHE_VIEWS, DEFAULT_POLICIES, check_spec
from kvroute.sim.timing.profile import Profile, load_profile, with_overrides, with_scheduling
from kvroute.traces import generators
from kvroute.traces.arrivals import parse_arrival, rescale_conflict, rescaled
from kvroute.traces.format import Trace, truncate
from kvroute.traces.generators import BUILTIN_WORKLOADS, WORKLOAD_SIZES
from kvroute.traces.inputs import (BLOCK_SIZE, KV_BLOCKS, MAX_RECORDS, MAX_TOKENS, POSITIVE_INT, RECORDS, SECONDS,
                                   SEED, TOKENS, WORKERS, InputError, Num)
from kvroute.traces.lengths import parse_dist

WORKLOADS = BUILTIN_WORKLOADS

GATEWAYS = Num(integer=True, minimum=1, maximum=1024)
"""Gateway replicas: each keeps state per worker (about 80 bytes), so 1,024 replicas of 10,000
workers hold about 0.8 GB."""

MIN_SCRAPE_INTERVAL_S = 1e-3
"""Shortest scrape period but 0 (live): each scrape is an event, and a period far below the
steps' (1e-300 s) would never let the clock move on."""

RATE = Num(minimum=0.0, above=True, maximum=1e9)
"""A rate or a speed-up factor: finite, > 0, at most 1e9 (a trace's span divided by it stays a time)."""

REQUEST_TIMEOUT = Num(minimum=0.0, above=True, maximum=SECONDS.maximum, unit="s")
"""A client's request timeout: finite seconds > 0."""

SCHEDULING: dict[str, bool | None] = {"profile": None, "sync": False, "async": True}
"""``Scenario.scheduling`` -> the engine's ``async_scheduling`` (None: the profile's)."""

OPTION_GROUPS = ("workload", "trace", "cluster", "gateway")
"""The groups of scenario options, in the order a command's help lists them."""


def option(group: str, help: str, **meta: Any) -> dict[str, Any]:
    """A field's metadata: its option's ``group`` and ``help``, and the keys of the module's
    docstring (``flag``, ``type``, ``check``, ``kind``, ...)."""
    return {"group": group, "help": help, **meta}


class ScenarioError(ValueError):
    """A scenario field holds a value it cannot take.

    Attributes:
        field: the field at fault (None when the message names the fields itself).
        reason: the message without the field's name (for a command line naming its flag).
    """

    def __init__(self, message: str, field: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason or message


def _sizes_text(index: int) -> str:
    return ", ".join(f"{name} {size[index]}" for name, size in WORKLOAD_SIZES.items())


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated scenario (everything but the round).

    Each field's ``metadata`` holds its command-line option (module docstring).

    Attributes:
        workload: ``"seed-chat"`` (the lab's burst) or ``"agent"`` (long-history sessions).
        chats: chats (seed-chat) or sessions (agent); None: the workload's default
            (``kvroute.traces.generators.WORKLOAD_SIZES``: seed-chat 64, agent 16).
        turns: turns per chat (None: seed-chat 6, agent 10); an agent session stops earlier
            when its history would exceed the history range's top.
        reply: where replies stop, tokens: an int (exact), a ``(low, high)`` uniform range or a
            distribution in ``kvroute.traces.lengths`` syntax (e.g. ``"lognormal:150:1"``); None
            keeps the generator's default (seed-chat: the fitted default capped at 128; agent
            50-300).
        history: agent only: prompt tokens, a ``(low, high)`` range (turn 1 drawn uniformly in
            it, later turns grow until they would pass ``high``) or an int ``H`` meaning
            ``(H // 2, H)``; None keeps the generator's default (8000, 32000).
        think_time_s: seconds between a reply's last token and the next turn (a number or a
            distribution).
        max_tokens: the requests' reply limit; None keeps the default (seed-chat 128, agent none).
        user: seed-chat: tokens of each user message; agent: new tokens per later turn (a number
            or a distribution); None keeps the default.
        start_s: seed-chat: each chat's first send, s (a number or a distribution).
        request_rate: sessions started per second (None: all at once); later turns follow
            closed-loop. With a ``trace_file``: its timestamps rescaled to this mean rate, of
            sessions in a closed-loop replay (``traces.arrivals.rescaled``), of requests in an open one.
        arrival: the sessions' arrival process (``poisson``, ``gamma:CV``, ``constant``).
        profile: shipped profile name or profile JSON path.
        workers: vLLM workers behind the router.
        gpus: GPUs (fewer than workers means sharing); None means one per worker.
        policy: routing policy spec (``name`` or ``name:key=value,...``); default the baseline
            of ``kvroute.sim.routing.DEFAULT_POLICIES``, round_robin.
        kv_blocks: override of each worker's ``num_gpu_blocks``; None keeps the profile's.
            Not allowed with shared GPUs (there vLLM's memory rule sets the blocks).
        arrival_spread_s: uniform start jitter of the requests sent at their timestamps (roots
            in closed loop, every request in open loop), s.
        seed: round r runs with seed ``seed + r``, and random workload lengths and session
            arrivals are drawn for that seed (``kvroute.traces.generators.workload_rng`` and
            ``arrival_rng``).
        scrape_interval_s: seconds between the gateway's ``/metrics`` scrapes (0: live).
        cache_view: ``routed``, ``events`` or ``exact`` (see ``ClusterSpec``).
        kv_event_delay_s: seconds before a KV-cache event reaches the gateway.
        gateways: gateway replicas (front balancer ``gateway_lb``).
        gateway_state: ``local`` or ``shared`` session/prefix state.
        store_latency_s: seconds each request waits on the shared store.
        trace_file: a trace file to replay instead of the generated workload (any format
            ``kvroute.traces.detect`` reads; the same records in every round), as
            ``kvroute compare --trace``; the workload, chats, turns and length fields are then
            unused.
        trace_block_size: tokens per ``hash_ids`` block when the file does not declare it.
        max_requests: keep only the first N records (and none whose parent was cut).
        speedup: divide the trace file's timestamps by this factor; or give ``request_rate``
            to rescale them to that mean rate (requests per second), not both.
        max_model_len: override of the profile's ``max_model_len``, tokens (longer prompts
            are rejected as vLLM does); None keeps the profile's.
        replay: ``auto``, ``closed`` (later turns wait for their parent) or ``open`` (trace
            timestamps); see ``kvroute.sim.cluster.cluster.REPLAY_MODES``.
        gateway_lb: the front balancer over gateway replicas, ``round_robin`` or ``random``.
        workload_config: an inference-perf YAML config (``data: shared_prefix``, ``load:
            constant|poisson`` with ``stages``; or a Markdown report holding one) to simulate
            instead of the generated workload (``kvroute.traces.inference_perf``): its prompts,
            stage rates and durations, drawn for the round's seed; the client keeps its stage
            barrier and its request timeout.
        max_concurrency: the client keeps at most this many requests in flight, the others
            waiting in it in send order (``vllm bench serve --max-concurrency``, aiperf's
            ``--concurrency``); None: no limit, or with a ``workload_config`` that sets
            ``load.num_workers``, its ``num_workers * worker_max_concurrency`` slots.
        request_timeout_s: the client abandons a request this many seconds after sending it,
            recording it as failed (timed out); None: none, or with a ``workload_config`` its
            ``load.request_timeout`` (aiohttp's 300 s when unset).
        scheduling: the engine's scheduling (:data:`SCHEDULING`): ``profile`` keeps the
            profile's ``engine.async_scheduling`` (a derived prior follows its vLLM release: on
            CUDA, async from vLLM 0.14), ``sync`` or ``async`` sets vLLM's
            ``SchedulerConfig.async_scheduling`` off or on (``kvroute.sim.engine.async_scheduler``).
    """

    workload: str = field(default="seed-chat", metadata=option(
        "workload", "Built-in workload (not with --trace).", choices=WORKLOADS))
    chats: int | None = field(default=None, metadata=option(
        "workload", f"Chats (seed-chat) or sessions (agent) [{_sizes_text(0)}].", type=int, check=RECORDS))
    turns: int | None = field(default=None, metadata=option(
        "workload", "Turns per chat (seed-chat); most turns per session (agent: a session stops once its next "
                    f"prompt would pass the top of --history) [{_sizes_text(1)}].", type=int, check=RECORDS))
    reply: int | tuple[int, int] | str | None = field(default=None, metadata=option(
        "workload", "Where replies stop, tokens: N, uniform:LO:HI, lognormal:MEDIAN:CV, empirical:FILE, ... "
                    "(capped at --max-tokens) [seed-chat: the fitted default, see docs/reference/seed-study-fit.md; "
                    "agent: uniform:50:300].", flag="--reply-tokens", kind="length", sweep_flags=("--reply",)))
    history: int | tuple[int, int] | None = field(default=None, metadata=option(
        "workload", "Agent prompt tokens: H (meaning H/2-H) or a LOW-HIGH range; turn 1 is drawn in it, later "
                    "turns grow until they would pass its top; the shared system prompt is 2000 tokens or LOW if shorter "
                    "[8000-32000].", kind="history"))
    think_time_s: float | str = field(default=0.0, metadata=option(
        "workload", "Seconds between a reply's last token and the next turn: a number or a distribution.",
        flag="--think-time", kind="dist"))
    max_tokens: int | None = field(default=None, metadata=option(
        "workload", "Reply limit of every request (vLLM's max_tokens) [seed-chat 128, agent none].", type=int,
        check=TOKENS))
    user: int | str | None = field(default=None, metadata=option(
        "workload", "Tokens of each user message (seed-chat) or new tokens per later turn (agent), as a "
                    "distribution [seed-chat 195, agent uniform:200:1000].", flag="--user-tokens", kind="dist"))
    start_s: float | str = field(default=0.0, metadata=option(
        "workload", "Seed-chat: each chat's first send, seconds (a distribution; on top of --arrival-spread).",
        flag="--start", kind="dist"))
    request_rate: float | None = field(default=None, metadata=option(
        "workload", "Load: sessions started per second for a generated workload (later turns follow "
                    "closed-loop); for a --trace file, its timestamps rescaled to this mean rate (of "
                    "sessions in a closed-loop replay, of requests in an open one) [generated: all at once].",
        type=float, kind="positive", check=RATE))
    arrival: str = field(default="poisson", metadata=option(
        "workload", "Arrival process of --request-rate: poisson, gamma:CV (CV > 1 burstier), constant.",
        kind="arrival"))
    profile: str = field(default="a6000-qwen2.5-7b", metadata=option(
        "cluster", "Shipped profile name or profile JSON file.", aliases=("profile_name",)))
    workers: int = field(default=4, metadata=option(
        "cluster", "vLLM workers behind the router.", type=int, check=WORKERS))
    gpus: int | None = field(default=None, metadata=option(
        "cluster", "GPUs; fewer than workers means sharing [one each].", type=int, check=WORKERS))
    policy: str = field(default=DEFAULT_POLICIES[0], metadata=option(
        "cluster", "Routing policy, optionally with parameters (sglang:cache_threshold=0.5).", option=False))
    kv_blocks: int | None = field(default=None, metadata=option(
        "cluster", "Override the profile's num_gpu_blocks per worker (KV capacity).", type=int,
        check=KV_BLOCKS))
    arrival_spread_s: float = field(default=0.005, metadata=option(
        "cluster", "Uniform start jitter of the requests sent at their timestamps (roots in closed loop, "
                   "every request in open loop), s.", flag="--arrival-spread", type=float, check=SECONDS))
    seed: int = field(default=0, metadata=option(
        "cluster", "Seed of round 0 (round r uses seed + r).", type=int, check=SEED, sweep_flags=("--seeds",)))
    scrape_interval_s: float = field(default=0.0, metadata=option(
        "gateway", "Seconds between the gateway's scrapes of each worker's /metrics (0: live).",
        flag="--scrape-interval", type=float, check=SECONDS))
    cache_view: str = field(default="routed", metadata=option(
        "gateway", "Cache state cache-aware policies read: the routed-prefix index, the workers' KV-cache events, "
                   "or the exact caches (a policy that names its own, llmd-precise, reads that).", choices=CACHE_VIEWS))
    kv_event_delay_s: float = field(default=0.0, metadata=option(
        "gateway", "Seconds before a worker's KV-cache event reaches the gateway (--cache-view events).",
        flag="--kv-event-delay", type=float, check=SECONDS))
    gateways: int = field(default=1, metadata=option("gateway", "Gateway replicas.", type=int, check=GATEWAYS))
    gateway_state: str = field(default="local", metadata=option(
        "gateway", "Session/prefix state per replica, or in one shared store.", choices=("local", "shared")))
    store_latency_s: float = field(default=0.0, metadata=option(
        "gateway", "Seconds each request waits on the shared store (lab's Redis: 0.05 before its fix, 0.001 after).",
        flag="--store-latency", type=float, check=SECONDS))
    trace_file: str | None = field(default=None, metadata=option(
        "trace", "Trace file: kvroute/Mooncake JSONL, Azure or BurstGPT CSV, ShareGPT or vllm bench serve JSON.",
        flag="--trace", type="path", axis=False, aliases=("trace_path",)))
    trace_block_size: int | None = field(default=None, metadata=option(
        "trace", "Tokens per hash_ids block when the trace file does not declare it [512; ShareGPT 16].", type=int,
        check=BLOCK_SIZE, axis=False))
    max_requests: int | None = field(default=None, metadata=option(
        "trace", "Use only the first N records of the trace.", type=int, check=RECORDS))
    speedup: float | None = field(default=None, metadata=option(
        "trace", "Divide a --trace file's timestamps by this factor (2 = twice the load).", type=float,
        kind="positive", check=RATE))
    max_model_len: int | None = field(default=None, metadata=option(
        "cluster", "Override the profile's max_model_len (tokens); longer prompts are rejected as vLLM does.",
        type=int, check=TOKENS))
    replay: str = field(default="auto", metadata=option(
        "cluster", "closed: later turns wait for their parent; open: trace timestamps.", choices=tuple(REPLAY_MODES)))
    gateway_lb: str = field(default="round_robin", metadata=option(
        "gateway", "Front load balancer over the gateway replicas.", choices=("round_robin", "random")))
    workload_config: str | None = field(default=None, metadata=option(
        "trace", "inference-perf YAML config to simulate (data: shared_prefix; load: constant or poisson stages), or "
                 "a Markdown report holding one.", type="path", axis=False))
    max_concurrency: int | None = field(default=None, metadata=option(
        "cluster", "Most requests the client keeps in flight; the others wait in it (vllm bench serve "
                    "--max-concurrency, aiperf --concurrency) [no limit; a --workload-config with load.num_workers: "
                   "num_workers x worker_max_concurrency].", type=int, check=POSITIVE_INT))
    request_timeout_s: float | None = field(default=None, metadata=option(
        "cluster", "Seconds after which the client abandons a request, recorded as failed (timed out) "
                    "[none; with --workload-config its load.request_timeout, else aiohttp's 300].",
        flag="--request-timeout", type=float, check=REQUEST_TIMEOUT))
    scheduling: str = field(default="profile", metadata=option(
        "cluster", "The engine's scheduling: the profile's setting, or vLLM's sync or async scheduling "
                   "(SchedulerConfig.async_scheduling; on CUDA the default from vLLM 0.14).",
        choices=("profile", "sync", "async")))

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):  # e.g. from JSON: tuples, so that scenarios stay hashable
                object.__setattr__(self, f.name, tuple(value))
            elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                object.__setattr__(self, f.name, int(value))  # numpy integers
            elif isinstance(value, numbers.Real) and not isinstance(value, (numbers.Integral, float)):
                object.__setattr__(self, f.name, float(value))
            elif type(value) is not float and isinstance(value, float):
                object.__setattr__(self, f.name, float(value))  # numpy floats
        check_scenario(self)

    @property
    def sizes(self) -> tuple[int, int]:
        """``(chats, turns)``, each left unset taken from the workload's default (``WORKLOAD_SIZES``)."""
        chats, turns = WORKLOAD_SIZES[self.workload]
        return (chats if self.chats is None else self.chats, turns if self.turns is None else self.turns)

    @property
    def history_range(self) -> tuple[int, int] | None:
        """The agent workload's prompt-token range, or None for the generator's default."""
        if self.history is None or isinstance(self.history, tuple):
            return self.history
        return (self.history // 2, self.history)

    def trace(self, round: int = 0) -> Trace:
        """The scenario's trace for round ``round`` (every command's one trace loader): the trace
        file (rescaled by ``speedup`` or to ``request_rate``), or the workload generated for seed
        ``seed + round``; then its first ``max_requests`` records. Files (while unchanged) and
        generated workloads are cached per process.

        Raises:
            ValueError: the file cannot be read or parsed (naming it), or cannot be rescaled.
        """
        if self.workload_config is not None:
            from kvroute.traces.inference_perf import workload_trace

            config = _workload_config(str(self.workload_config), _file_stamp(self.workload_config))
            trace = workload_trace(config, self.seed + round)
        elif self.trace_file is not None:
            trace = _file_trace(str(self.trace_file), self.trace_block_size, _file_stamp(self.trace_file))
            if self.speedup is not None or self.request_rate is not None:
                closed = REPLAY_MODES[self.replay]  # None: closed loop when some record extends another
                sessions = any(r.parent is not None for r in trace.records) if closed is None else closed
                trace = rescaled(trace, self.speedup, self.request_rate, sessions)
        else:
            chats, turns = self.sizes
            trace = _trace(self.workload, chats, turns, self.reply, self.history_range, self.think_time_s,
                           self.seed + round, self.max_tokens, self.user, self.start_s, self.request_rate,
                           self.arrival)
        return trace if self.max_requests is None else truncate(trace, self.max_requests)

    def base_profile(self) -> Profile:
        """The scenario's profile with its ``max_model_len`` and ``kv_blocks`` overrides.

        Raises:
            FileNotFoundError: an unknown profile (the message lists the shipped ones).
            ValueError: a profile file that cannot be read or is invalid.
        """
        profile = with_overrides(_profile(self.profile, _file_stamp(self.profile)), self.max_model_len,
                                 self.kv_blocks)
        return with_scheduling(profile, SCHEDULING[self.scheduling])

    def spec(self, profile: Profile | None = None, **changes: Any) -> ClusterSpec:
        """The scenario's cluster: the one place a scenario becomes a ``ClusterSpec``.

        Args:
            profile: the workers' profile, taken as it is (default: :meth:`base_profile`).
            changes: ``ClusterSpec`` fields to set besides (``policy``, ``record_series``, ...).

        Raises:
            ValueError: the cluster cannot be built (from ``ClusterSpec``), or as :meth:`base_profile`.
        """
        values = dict(num_workers=self.workers, num_gpus=self.gpus, policy=self.policy,
                      closed_loop=REPLAY_MODES[self.replay], arrival_spread_s=self.arrival_spread_s,
                      scrape_interval_s=self.scrape_interval_s, cache_view=self.cache_view,
                      kv_event_delay_s=self.kv_event_delay_s, gateways=self.gateways, gateway_lb=self.gateway_lb,
                      gateway_state=self.gateway_state, store_latency_s=self.store_latency_s)
        config = None if self.workload_config is None else \
            _workload_config(str(self.workload_config), _file_stamp(self.workload_config))
        if self.max_concurrency is not None:
            values["max_in_flight"] = self.max_concurrency
        elif config is not None and config.client_slots is not None:
            values["max_in_flight"] = config.client_slots
        timeout = self.request_timeout_s
        if timeout is None and config is not None:
            timeout = config.client_timeout_s
        if timeout is not None:
            values["request_timeout_s"] = timeout
        values.update(changes)
        return ClusterSpec(self.base_profile() if profile is None else profile, **values)

    def label(self) -> dict[str, Any]:
        """The scenario's fields as row columns (ranges as ``"low-high"`` strings, unset sizes as
        the workload's). With a ``trace_file`` the generator's fields it leaves unused
        (``GENERATOR_FIELDS``) are None and ``workload`` is ``"trace"``, so a row never names a
        workload that did not run."""
        row = asdict(self)
        row["chats"], row["turns"] = self.sizes
        for name in ("reply", "history"):
            if isinstance(row[name], (tuple, list)):
                row[name] = f"{row[name][0]}-{row[name][1]}"
        if self.trace_file is not None:
            row.update(dict.fromkeys(GENERATOR_FIELDS), workload="trace")
        elif self.workload_config is not None:
            row.update(dict.fromkeys(GENERATOR_FIELDS), workload="inference-perf")
        return row


SCENARIO_FIELDS = tuple(f.name for f in fields(Scenario))

GENERATOR_FIELDS = ("chats", "turns", "reply", "history", "think_time_s", "max_tokens", "user")
"""Fields only the generated workloads read; unused when a scenario replays a trace file."""

TRACE_UNUSED_FIELDS = tuple(name for name in SCENARIO_FIELDS
                            if name in ("workload", *GENERATOR_FIELDS, "start_s", "arrival"))
"""Fields a trace file or a workload config leaves unused (``GENERATOR_FIELDS``, the workload's
name, its start and its arrival process), in option order: set to anything but their default with
a ``trace_file`` or a ``workload_config``, they are an error (``request_rate`` rescales a trace
file's timestamps, ``max_requests`` cuts it)."""


def _flag(name: str) -> str:
    """The long flag of field ``name`` (its ``flag`` metadata, or ``--`` and the name with dashes)."""
    meta = Scenario.__dataclass_fields__[name].metadata
    return meta.get("flag", "--" + name.replace("_", "-"))


def _is_default(name: str, value: Any) -> bool:
    """Whether field ``name`` holds its default (a distribution field's fixed value as its text,
    ``"0.0"``, counts as the number it fixes)."""
    f = Scenario.__dataclass_fields__[name]
    if value == f.default:
        return True
    if f.metadata.get("kind") == "dist" and isinstance(value, str) and not isinstance(f.default, str):
        try:
            dist = parse_dist(value, name)
        except ValueError:
            return False
        return dist.kind == "fixed" and dist.params[0] == f.default
    return False


NO_EMPTY_REPLY = "must allow a reply of at least 1 token (vLLM samples at least one: max_tokens >= 1)"
"""Why a reply whose every draw rounds below 1 token is refused (the generator raised each to 1)."""


def check_scenario(scenario: Scenario) -> None:
    """The checks of a scenario's fields (each by its metadata) and of their combinations.

    Raises:
        ScenarioError: naming the field and the rule its value broke.
    """
    for f in fields(scenario):
        value, name, meta = getattr(scenario, f.name), f.name, f.metadata
        if value is None:
            continue
        rule, kind = meta.get("check"), meta.get("kind")
        if rule is not None:
            try:
                rule.check(value)
            except InputError as exc:
                raise ScenarioError(f"{name} {exc.reason}", name, exc.reason) from None
        if kind in ("dist", "length") and not isinstance(value, tuple):
            try:
                dist = parse_dist(value, name)
            except ValueError as exc:
                raise ScenarioError(str(exc), name, str(exc).removeprefix(f"{name}: ")) from None
            if name == "reply" and dist.largest_tokens < 1:
                raise ScenarioError(f"reply {NO_EMPTY_REPLY}, got {value!r}", name, f"{NO_EMPTY_REPLY}, got {value!r}")
        elif kind in ("length", "history") and isinstance(value, tuple):
            least = 1 if kind == "history" else 0  # a prompt has at least one token
            if not (len(value) == 2 and all(type(v) is int for v in value) and least <= value[0] <= value[1]):
                reason = f"a (low, high) token range needs ints {least} <= low <= high, got {value!r}"
                raise ScenarioError(f"{name}: {reason}", name, reason)
            if name == "reply" and value[1] < 1:
                raise ScenarioError(f"reply {NO_EMPTY_REPLY}, got {value!r}", name, f"{NO_EMPTY_REPLY}, got {value!r}")
        elif kind == "history" and not (type(value) is int and 2 <= value <= MAX_TOKENS):
            reason = f"expected tokens H >= 2 (meaning H/2-H) or a (low, high) range, got {value!r}"
            raise ScenarioError(f"{name}: {reason}", name, reason)
        elif kind == "arrival":
            try:
                parse_arrival(value)
            except ValueError as exc:
                raise ScenarioError(str(exc), name) from None
        elif kind == "positive" and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                         and math.isfinite(value) and value > 0):
            reason = f"must be a finite number > 0, got {value}"
            raise ScenarioError(f"{name} {reason}", name, reason)
    if scenario.workload not in WORKLOADS:
        raise ScenarioError(f"unknown workload {scenario.workload!r}; valid workloads: {', '.join(WORKLOADS)}",
                            "workload")
    try:
        check_spec(scenario.policy)
    except ValueError as exc:
        raise ScenarioError(str(exc), "policy") from None
    if scenario.scheduling not in SCHEDULING:
        raise ScenarioError(f"unknown scheduling {scenario.scheduling!r}; valid: {', '.join(SCHEDULING)}",
                            "scheduling")
    if scenario.replay not in REPLAY_MODES:
        raise ScenarioError(f"unknown replay {scenario.replay!r}; valid: {', '.join(REPLAY_MODES)}", "replay")
    if scenario.trace_file is not None or scenario.workload_config is not None:
        given = [name for name in TRACE_UNUSED_FIELDS if not _is_default(name, getattr(scenario, name))]
        if given:
            flags = ", ".join(_flag(name) for name in given)
            verb, they = ("does", "it shapes") if len(given) == 1 else ("do", "they shape")
            source = ("--trace", "a trace file's records are replayed as they are") if scenario.trace_file is not None \
                else ("--workload-config", "the config's data and load sections set the workload")
            raise ScenarioError(f"{flags} {verb} not apply with {source[0]}: {they} the generated workload, and "
                                f"{source[1]}")
    if scenario.history is not None and scenario.workload != "agent":
        reason = "applies to the agent workload only (--workload agent only); seed-chat histories grow with turns"
        raise ScenarioError(f"history {reason}", "history", reason)
    if scenario.workload == "agent" and not _is_default("start_s", scenario.start_s):
        reason = ("applies to the seed-chat workload only; agent sessions start together (give --request-rate "
                  "or --arrival-spread to spread them)")
        raise ScenarioError(f"start_s {reason}", "start_s", reason)
    if 0 < scenario.scrape_interval_s < MIN_SCRAPE_INTERVAL_S:
        reason = f"must be 0 (live) or >= {MIN_SCRAPE_INTERVAL_S:g} s, got {scenario.scrape_interval_s!r}"
        raise ScenarioError(f"scrape_interval_s {reason}", "scrape_interval_s", reason)
    chats, turns = scenario.sizes
    if chats * turns > MAX_RECORDS:
        raise ScenarioError(f"--chats {chats:,} x --turns {turns:,} is {chats * turns:,} requests, more than the "
                            f"{MAX_RECORDS:,} one trace may hold")
    conflict = rescale_conflict(scenario.trace_file is not None, scenario.speedup, scenario.request_rate)
    if conflict:
        raise ScenarioError(conflict)
    if scenario.workload_config is not None:
        for name, given in (("trace_file", scenario.trace_file is not None),
                            ("request_rate", scenario.request_rate is not None),
                            ("speedup", scenario.speedup is not None), ("history", scenario.history is not None)):
            if given:
                reason = "cannot be combined with --workload-config (its stages set the load)"
                raise ScenarioError(f"{name} {reason}", name, reason)
    if scenario.kv_blocks is not None and scenario.gpus is not None and scenario.gpus < scenario.workers:
        reason = ("cannot be overridden when workers share GPUs (vLLM's memory rule sets each shared worker's "
                  "blocks)")
        raise ScenarioError(f"kv_blocks {reason}", "kv_blocks", reason)


def _file_stamp(path: str | Path) -> tuple[int, int, int] | None:
    """What tells a changed file from the one read before (None: not a file, e.g. a shipped name)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=8)
def _profile(name: str, stamp: tuple[int, int, int] | None) -> Profile:
    return load_profile(name)


@functools.lru_cache(maxsize=4)
def _file_trace(path: str, block_size: int | None, stamp: tuple[int, int, int] | None) -> Trace:
    from kvroute.traces.detect import read_any

    try:
        return read_any(path, block_size)
    except OSError as exc:
        raise ValueError(f"cannot read trace file {path}: {exc.strerror or exc}") from None


@functools.lru_cache(maxsize=4)
def _workload_config(path: str, stamp: tuple[int, int, int] | None):
    from kvroute.traces.inference_perf import read_workload_config

    return read_workload_config(path)


@functools.lru_cache(maxsize=16)
def _trace(workload: str, chats: int, turns: int, reply, history, think_time_s, seed: int, max_tokens, user,
           start_s, request_rate, arrival) -> Trace:
    return generators.builtin_workload(workload, chats, turns, think_time_s, seed, reply, history,
                                       max_tokens=max_tokens, user=user, start_s=start_s,
                                       request_rate=request_rate, arrival=arrival)
