"""Sweeps: grids of scenarios run on a process pool or a Dask cluster, as one tidy DataFrame.

A :class:`Scenario` names a workload, a cluster and a policy; ``run_scenario(scenario, round)``
simulates it with seed ``scenario.seed + round`` and returns one row. The trace is built from the
scenario alone (the agent workload draws it from ``scenario.seed``), and the spec the same way
``kvroute compare`` builds it, so a sweep row equals the matching row of
``kvroute.sim.study.experiment.compare(...).summaries`` (common random numbers across policies).

Ctrl-C (SIGINT) or SIGTERM stops a sweep within about a second: the local pool's processes are
terminated (none is left behind) and :class:`SweepInterrupted` carries the rows finished so far,
marked ``partial``.

Executors (``kvroute.sim.study.executors``, shared with ``compare``; every one gives the same rows for
the same scenarios):

- ``"sequential"``: in this process, one run after another;
- ``"local"`` (default): ``concurrent.futures.ProcessPoolExecutor``;
- ``"dask"``: a Dask distributed cluster at ``address`` (``tcp://host:8786``); without an address a
  temporary ``LocalCluster`` of processes is started and closed, bound to 127.0.0.1 with its
  dashboard off. Every Dask worker must have kvroute installed (same version).
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Iterable

import pandas as pd
from tqdm import tqdm

from kvroute.sim.cluster.cluster import REPLAY_MODES, ClusterSpec, simulate
from kvroute.sim.study.executors import EXECUTORS, Stop, interrupts_as_keyboard, run_tasks
from kvroute.sim.cluster.metrics import SUMMARY_METRICS, ServiceClass, summarize, summarize_rounds
from kvroute.sim.timing.profile import Profile, load_profile, with_overrides
from kvroute.sim.routing import check_spec
from kvroute.traces import generators
from kvroute.traces.format import Trace, truncate
from kvroute.traces.arrivals import parse_arrival, rescale_conflict, rescaled
from kvroute.traces.lengths import parse_dist

WORKLOADS = ("seed-chat", "agent")

COUNTER_COLUMNS: dict[str, str] = {
    "num_requests": "requests in the trace",
    "prompt_tokens": "prompt tokens of completed requests",
    "prefill_tokens": "prompt tokens prefilled (not from the prefix cache), first admissions",
    "output_tokens": "output tokens received",
    "num_gpu_blocks": "KV blocks per worker (smallest worker)",
    "num_evictions": "cached blocks evicted, all workers",
    "num_preemptions": "engine preemptions, all workers",
    "busy_time_s": "GPU busy time, all workers (s)",
}
"""Columns a row has besides the scenario fields and ``SUMMARY_METRICS``."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated scenario (everything but the round).

    Attributes:
        workload: ``"seed-chat"`` (the lab's burst) or ``"agent"`` (long-history sessions).
        chats: chats (seed-chat) or sessions (agent).
        turns: turns per chat; an agent session stops earlier when its history would exceed
            the history range's top.
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
            closed-loop.
        arrival: the sessions' arrival process (``poisson``, ``gamma:CV``, ``constant``).
        profile: shipped profile name or profile JSON path.
        workers: vLLM workers behind the router.
        gpus: GPUs (fewer than workers means sharing); None means one per worker.
        policy: routing policy spec (``name`` or ``name:key=value,...``).
        kv_blocks: override of each worker's ``num_gpu_blocks``; None keeps the profile's.
            Not allowed with shared GPUs (there vLLM's memory rule sets the blocks).
        arrival_spread_s: uniform start jitter of root requests, s.
        seed: round r runs with seed ``seed + r``, and random workload lengths are drawn for
            that seed (``kvroute.traces.generators.workload_rng``).
        scrape_interval_s: seconds between the gateway's ``/metrics`` scrapes (0: live).
        cache_view: ``routed``, ``events`` or ``exact`` (see ``ClusterSpec``).
        kv_event_delay_s: seconds before a KV-cache event reaches the gateway.
        gateways: gateway replicas (front balancer round robin).
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
    """

    workload: str = "seed-chat"
    chats: int = 64
    turns: int = 6
    reply: int | tuple[int, int] | None = None
    history: int | tuple[int, int] | None = None
    think_time_s: float | str = 0.0
    max_tokens: int | None = None
    user: int | str | None = None
    start_s: float | str = 0.0
    request_rate: float | None = None
    arrival: str = "poisson"
    profile: str = "a6000-qwen2.5-7b"
    workers: int = 4
    gpus: int | None = None
    policy: str = "round_robin"
    kv_blocks: int | None = None
    arrival_spread_s: float = 0.005
    seed: int = 0
    scrape_interval_s: float = 0.0
    cache_view: str = "routed"
    kv_event_delay_s: float = 0.0
    gateways: int = 1
    gateway_state: str = "local"
    store_latency_s: float = 0.0
    trace_file: str | None = None
    trace_block_size: int | None = None
    max_requests: int | None = None
    speedup: float | None = None
    max_model_len: int | None = None
    replay: str = "auto"
    gateway_lb: str = "round_robin"

    def __post_init__(self) -> None:
        # Lists (e.g. from JSON) become tuples so that scenarios stay hashable.
        for name in ("reply", "history"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; valid workloads: {', '.join(WORKLOADS)}")
        check_spec(self.policy)
        if self.workload == "seed-chat" and self.history is not None:
            raise ValueError("history applies to the agent workload only (seed-chat histories grow with turns)")
        for name in ("reply", "think_time_s", "user", "start_s"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                parse_dist(value, name)  # raises ValueError naming the field
        parse_arrival(self.arrival)
        conflict = rescale_conflict(self.trace_file is not None, self.speedup, self.request_rate)
        if conflict:
            raise ValueError(conflict)
        if self.trace_file is not None and self.history is not None:
            raise ValueError("history applies to the generated agent workload, not to a trace file")
        if self.replay not in REPLAY_MODES:
            raise ValueError(f"unknown replay {self.replay!r}; valid: {', '.join(REPLAY_MODES)}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise ValueError(f"request_rate must be a finite number > 0, got {self.request_rate}")
        if self.kv_blocks is not None and self.kv_blocks < 2:
            raise ValueError(f"kv_blocks must be >= 2, got {self.kv_blocks}")
        if self.kv_blocks is not None and self.gpus is not None and self.gpus < self.workers:
            raise ValueError("kv_blocks cannot be overridden when workers share GPUs "
                             "(vLLM's memory rule sets each shared worker's blocks)")

    @property
    def history_range(self) -> tuple[int, int] | None:
        """The agent workload's prompt-token range, or None for the generator's default."""
        if self.history is None or isinstance(self.history, tuple):
            return self.history
        return (self.history // 2, self.history)

    def trace(self, round: int = 0) -> Trace:
        """The scenario's trace for round ``round``, loaded as ``kvroute compare`` loads it: the
        trace file (rescaled by ``speedup`` or to ``request_rate``), or the workload generated for
        seed ``seed + round``; then its first ``max_requests`` records. Files and generated
        workloads are cached per process.

        Raises:
            ValueError: the file cannot be read or parsed (naming it), or cannot be rescaled.
        """
        if self.trace_file is not None:
            trace = _file_trace(self.trace_file, self.trace_block_size)
            if self.speedup is not None or self.request_rate is not None:
                trace = rescaled(trace, self.speedup, self.request_rate)
        else:
            trace = _trace(self.workload, self.chats, self.turns, self.reply, self.history_range,
                           self.think_time_s, self.seed + round, self.max_tokens, self.user, self.start_s,
                           self.request_rate, self.arrival)
        return trace if self.max_requests is None else truncate(trace, self.max_requests)

    def spec(self) -> ClusterSpec:
        """The scenario's cluster, built as ``kvroute compare`` builds it."""
        profile = with_overrides(_profile(self.profile), self.max_model_len, self.kv_blocks)
        return ClusterSpec(profile, num_workers=self.workers, num_gpus=self.gpus, policy=self.policy,
                           closed_loop=REPLAY_MODES[self.replay],
                           arrival_spread_s=self.arrival_spread_s, scrape_interval_s=self.scrape_interval_s,
                           cache_view=self.cache_view, kv_event_delay_s=self.kv_event_delay_s,
                           gateways=self.gateways, gateway_lb=self.gateway_lb, gateway_state=self.gateway_state,
                           store_latency_s=self.store_latency_s)

    def label(self) -> dict[str, Any]:
        """The scenario's fields as row columns (ranges as ``"low-high"`` strings). With a
        ``trace_file`` the generator's fields it leaves unused (``GENERATOR_FIELDS``) are None and
        ``workload`` is ``"trace"``, so a row never names a workload that did not run."""
        row = asdict(self)
        for name in ("reply", "history"):
            if isinstance(row[name], (tuple, list)):
                row[name] = f"{row[name][0]}-{row[name][1]}"
        if self.trace_file is not None:
            row.update(dict.fromkeys(GENERATOR_FIELDS), workload="trace")
        return row


SCENARIO_FIELDS = tuple(f.name for f in fields(Scenario))

GENERATOR_FIELDS = ("chats", "turns", "reply", "history", "think_time_s", "max_tokens", "user")
"""Fields only the generated workloads read; unused when a scenario replays a trace file."""


@functools.lru_cache(maxsize=8)
def _profile(name: str) -> Profile:
    return load_profile(name)


@functools.lru_cache(maxsize=4)
def _file_trace(path: str, block_size: int | None) -> Trace:
    from kvroute.traces.detect import read_any

    try:
        return read_any(path, block_size)
    except OSError as exc:
        raise ValueError(f"cannot read trace file {path}: {exc.strerror or exc}") from None


@functools.lru_cache(maxsize=16)
def _trace(workload: str, chats: int, turns: int, reply, history, think_time_s, seed: int, max_tokens, user,
           start_s, request_rate, arrival) -> Trace:
    return generators.builtin_workload(workload, chats, turns, think_time_s, seed, reply, history,
                                       max_tokens=max_tokens, user=user, start_s=start_s,
                                       request_rate=request_rate, arrival=arrival)


def run_scenario(scenario: Scenario, round: int = 0, slo: ServiceClass = ServiceClass()) -> dict[str, Any]:
    """Simulate ``scenario`` once with seed ``scenario.seed + round``; return its row.

    Returns:
        The scenario's fields, ``round``, ``run_seed``, the SLO bounds, every
        ``SUMMARY_METRICS`` key and the ``COUNTER_COLUMNS``.

    Raises:
        ValueError: from building the trace or spec, or from ``simulate``.
    """
    trace = scenario.trace(round)
    spec = scenario.spec()
    result = simulate(trace, spec, seed=scenario.seed + round)
    ok = result.records[result.records["status"] == "ok"]
    workers = result.workers
    counters = {
        "num_requests": len(result.records),
        "prompt_tokens": int(ok["prompt_tokens"].sum()),
        "prefill_tokens": int((ok["prompt_tokens"] - ok["cached_tokens"]).sum()),
        "output_tokens": int(ok["output_tokens"].sum()),
        "num_gpu_blocks": int(workers["num_gpu_blocks"].min()),
        "num_evictions": int(workers["num_evictions"].sum()),
        "num_preemptions": int(workers["num_preemptions"].sum()),
        "busy_time_s": float(workers["busy_time"].sum()),
    }
    return {
        **scenario.label(), "round": round, "run_seed": scenario.seed + round,
        "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s,
        **summarize(result, slo), **counters,
    }


def _run_task(task: tuple[Scenario, int, ServiceClass]) -> dict[str, Any]:
    """One run's row with ``status`` ``"ok"``, or a failed row when the scenario is infeasible
    (any ValueError: a request larger than the KV cache, a cluster that cannot be built)."""
    try:
        return {**run_scenario(*task), "status": "ok", "error": None}
    except ValueError as exc:
        return failed_row(*task, reason=str(exc))


def failed_row(scenario: Scenario, round: int, slo: ServiceClass, reason: str) -> dict[str, Any]:
    """The row of a run that could not run: the scenario's fields, ``round``, ``run_seed``, the
    SLO bounds, ``status = "failed"`` and ``error`` (the reason, one line); metrics are absent
    (NaN in the sweep's frame)."""
    return {**scenario.label(), "round": round, "run_seed": scenario.seed + round,
            "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "status": "failed",
            "error": " ".join(reason.split())}


class SweepInterrupted(KeyboardInterrupt):
    """A sweep was stopped by Ctrl-C or SIGTERM.

    Attributes:
        frame: the rows finished before the stop, in grid order, with a ``partial`` column
            (True on every row).
        total: how many runs the sweep had.
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, frame: pd.DataFrame, total: int, signal_name: str) -> None:
        super().__init__(f"sweep interrupted by {signal_name}: {len(frame)} of {total} runs finished")
        self.frame = frame
        self.total = total
        self.signal_name = signal_name


def grid(base: Scenario | None = None, **axes: Iterable[Any] | Any) -> list[Scenario]:
    """The Cartesian product of ``axes`` over ``base`` (default ``Scenario()``).

    Each keyword is a ``Scenario`` field; a list (or other non-string iterable) is an axis, a
    scalar or tuple a fixed value. The first axis varies slowest.

    Example: ``grid(workers=[2, 4, 8], policy=["round_robin", "kv_aware"], chats=32)``.

    Raises:
        ValueError: an unknown field (listing the valid ones) or an invalid scenario.
    """
    base = base or Scenario()
    unknown = [k for k in axes if k not in SCENARIO_FIELDS]
    if unknown:
        raise ValueError(f"unknown scenario field(s) {', '.join(unknown)}; valid fields: {', '.join(SCENARIO_FIELDS)}")
    names, values = [], []
    for name, value in axes.items():
        names.append(name)
        is_axis = isinstance(value, Iterable) and not isinstance(value, (str, tuple))
        values.append(list(value) if is_axis else [value])
    return [replace(base, **dict(zip(names, combo))) for combo in itertools.product(*values)]


def sweep(
    scenarios: Scenario | Iterable[Scenario],
    rounds: int = 1,
    executor: str = "local",
    address: str | None = None,
    max_workers: int | None = None,
    progress: bool = True,
    slo: ServiceClass = ServiceClass(),
) -> pd.DataFrame:
    """Run every scenario for ``rounds`` rounds; one row per (scenario, round), in grid order.

    Args:
        scenarios: a scenario or a list (e.g. from ``grid``).
        rounds: rounds per scenario; round r uses seed ``scenario.seed + r``.
        executor: ``"local"`` (process pool), ``"sequential"`` or ``"dask"``.
        address: Dask scheduler address (``tcp://host:8786``); only with ``executor="dask"``.
        max_workers: processes of the local pool or of a temporary Dask LocalCluster
            (default: the CPU count, at most the number of runs).
        progress: show a progress bar on stderr.
        slo: the service class goodput is measured against.

    Returns:
        A DataFrame with the scenario fields, ``round``, ``run_seed``, ``slo_ttft_s``,
        ``slo_tpot_s``, the ``SUMMARY_METRICS``, the ``COUNTER_COLUMNS``, ``status``
        (``"ok"``/``"failed"``) and ``error``. An infeasible grid point (its cluster cannot be
        built, or a run raises ValueError, e.g. a request larger than a worker's KV cache) is a
        failed row per round with the reason in ``error`` and NaN metrics; the sweep goes on.

    Raises:
        ValueError: an unknown executor, rounds < 1, an address without Dask, an unreachable
            Dask scheduler. Any other error of a run (a bug) is raised as soon as it is seen.
        SweepInterrupted (a KeyboardInterrupt): Ctrl-C or SIGTERM; carries the rows finished.
    """
    if isinstance(scenarios, Scenario):
        scenarios = [scenarios]
    scenarios = list(scenarios)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if address is not None and executor != "dask":
        raise ValueError("an address is for executor='dask'")
    tasks = [(s, r, slo) for s in scenarios for r in range(rounds)]
    if not tasks:
        return pd.DataFrame(columns=[*SCENARIO_FIELDS, "round", "run_seed"])
    infeasible = {}
    for scenario in dict.fromkeys(scenarios):  # in this process: a cluster that cannot be built
        try:
            scenario.spec()
        except ValueError as exc:
            infeasible[scenario] = str(exc)
    bar = tqdm(total=len(tasks), desc="sweep", unit="run", file=sys.stderr, disable=not progress)
    rows: list[dict | None] = [None] * len(tasks)
    for i, (scenario, r, _) in enumerate(tasks):
        if scenario in infeasible:
            rows[i] = failed_row(scenario, r, slo, infeasible[scenario])
            bar.update()
    tasks_left = [(i, task) for i, task in enumerate(tasks) if rows[i] is None]

    def done(i: int, row: dict) -> None:
        rows[i] = row
        bar.update()

    try:
        with interrupts_as_keyboard():
            def done_left(j: int, row: dict) -> None:
                done(tasks_left[j][0], row)

            run_tasks(_run_task, [task for _, task in tasks_left], done_left, executor, address, max_workers)
    except KeyboardInterrupt as exc:
        finished = pd.DataFrame([row for row in rows if row is not None])
        finished["partial"] = True
        name = "SIGTERM" if isinstance(exc, Stop) else "SIGINT"
        raise SweepInterrupted(finished, len(tasks), name) from None
    finally:
        bar.close()
    frame = pd.DataFrame(rows)
    for column in (*SUMMARY_METRICS, *COUNTER_COLUMNS):  # NaN when every run failed
        if column not in frame:
            frame[column] = math.nan
    return frame


def group_columns(frame: pd.DataFrame) -> list[str]:
    """The scenario fields that vary in ``frame`` (the columns to group rounds by)."""
    return [c for c in SCENARIO_FIELDS if c in frame and c != "seed" and frame[c].nunique(dropna=False) > 1]


def intervals(frame: pd.DataFrame, metrics: list[str] | None = None, by: list[str] | None = None,
              confidence: float = 0.95) -> pd.DataFrame:
    """Mean and Student-t interval over rounds of ``metrics`` for each scenario of a sweep.

    Args:
        frame: a ``sweep`` result.
        metrics: columns to summarise (default: every ``SUMMARY_METRICS`` key).
        by: columns naming a scenario (default: the scenario fields that vary, without seed).
        confidence: two-sided confidence of the interval.

    Returns:
        One row per scenario: the ``by`` columns, ``rounds`` (runs that did not fail), and
        ``<metric>``, ``<metric>_low``, ``<metric>_high`` per metric
        (``kvroute.sim.cluster.metrics.summarize_rounds``, clipped to possible values); NaN for a
        scenario whose every run failed.
    """
    metrics = metrics or list(SUMMARY_METRICS)
    by = group_columns(frame) if by is None else by
    out = []
    groups = frame.groupby(by, sort=False, dropna=False) if by else [((), frame)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        if "status" in group:  # failed runs (infeasible grid points) have no metrics
            group = group[group["status"] != "failed"]
        records = group[metrics].to_dict("records") or [dict.fromkeys(metrics, math.nan)]
        iv = summarize_rounds(records, confidence)
        row = dict(zip(by, key))
        row["rounds"] = len(group)
        for m in metrics:
            row[m], row[f"{m}_low"], row[f"{m}_high"] = iv.loc[m, "mean"], iv.loc[m, "low"], iv.loc[m, "high"]
        out.append(row)
    return pd.DataFrame(out)


def gpus_used(frame: pd.DataFrame) -> pd.Series:
    """GPUs of each row's cluster (``gpus``, or one per worker when it is empty)."""
    return frame["gpus"].fillna(frame["workers"]).astype(int)


def cost_per_million_tokens(frame: pd.DataFrame, usd_per_gpu_hour: float, tokens: str = "output") -> pd.Series:
    """GPU cost of each run per million tokens, USD.

    ``cost = usd_per_gpu_hour * GPUs * time_to_complete_s / 3600``, divided by the run's
    tokens in millions: ``"output"`` tokens, or ``"total"`` (prompt + output) tokens.

    Raises:
        ValueError: ``tokens`` is neither ``"output"`` nor ``"total"``.
    """
    if tokens not in ("output", "total"):
        raise ValueError(f"tokens must be 'output' or 'total', got {tokens!r}")
    count = frame["output_tokens"] + (frame["prompt_tokens"] if tokens == "total" else 0)
    usd = usd_per_gpu_hour * gpus_used(frame) * frame["time_to_complete_s"] / 3600.0
    return (usd / (count / 1e6)).where(count > 0, math.nan)
