"""Sweeps: grids of scenarios run on a process pool or a Dask cluster, as one tidy DataFrame.

A :class:`~kvroute.sim.study.scenario.Scenario` names a workload, a cluster and a policy; ``run_scenario(scenario, round)``
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

import itertools
import math
from dataclasses import replace
from typing import Any, Iterable

import numpy as np
import pandas as pd

from kvroute.sim.cluster.cluster import simulate
from kvroute.sim.cluster.eviction import cacheable_blocks, evicted_history_tokens, parent_links
from kvroute.sim.study.executors import EXECUTORS, Stop, interrupts_as_keyboard, run_tasks
from kvroute.sim.study.progress import progress_bar
from kvroute.sim.cluster.metrics import (COUNT_METRICS, METRIC_BOUNDS, SUMMARY_METRICS, Failures, ServiceClass,
                                         failures, route_digest, summarize, summarize_rounds)
from kvroute.sim.routing.policy_errors import PolicyError
from kvroute.sim.study.scenario import (  # noqa: F401 - Scenario's names, also this module's
    GENERATOR_FIELDS, SCENARIO_FIELDS, WORKLOADS, Scenario, ScenarioError,
)

COUNTER_COLUMNS: dict[str, str] = {
    "num_requests": "requests in the trace",
    "prompt_tokens": "prompt tokens of completed requests",
    "prefill_tokens": "prompt tokens prefilled (not from the prefix cache), first admissions",
    "output_tokens": "output tokens received",
    "num_gpu_blocks": "KV blocks per worker (smallest worker)",
    "num_evictions": "cached blocks evicted, all workers",
    "evicted_prefix_tokens": "prompt tokens a later turn computed again that its worker had cached for the chat "
                             "and evicted (a lower bound: kvroute.sim.cluster.eviction)",
    "num_preemptions": "engine preemptions, all workers",
    "prefix_cache_queries": "prompt tokens the engines looked up in the prefix cache, all workers (vLLM's "
                            "prefix_cache_queries counter: first admissions, finished or not)",
    "prefix_cache_hits": "of those, tokens found cached (vLLM's prefix_cache_hits counter)",
    "busy_time_s": "GPU busy time, all workers (s)",
    "cacheable_blocks": "KV blocks the workers can cache in, all workers (vLLM's null block out)",
    "rejected": "requests the engine rejected",
    "not_sent": "later turns not sent, their parent having failed",
    "timed_out": "requests their client abandoned (timed out)",
    "num_sessions": "sessions in the trace (a request without a session is one)",
    "peak_sessions": "most sessions in flight at once (first request sent, last not yet ended)",
}
"""Numeric columns a row has besides the scenario fields and ``SUMMARY_METRICS``."""

EXAMPLE_COLUMNS: dict[str, str] = {
    "failed_request": "the id of the first request the engine rejected, else of the first that failed (NaN: none)",
    "failed_reason": "that request's error",
    "route_digest": "a digest of the worker each request went to: equal in two runs that routed alike",
}
"""The other columns of a row, for the notes under a sweep's tables (``kvroute.cli.sweep_notes``)."""

COUNT_COLUMNS = (*COUNT_METRICS, *(c for c in COUNTER_COLUMNS if c != "busy_time_s"))
"""A row's metrics that count (requests, tokens, blocks, evictions, preemptions): its tables show
their whole means without decimals (``kvroute.sim.study.experiment.whole_counts``)."""

COLUMN_BOUNDS: dict[str, tuple[float, float]] = {**METRIC_BOUNDS, **dict.fromkeys(COUNTER_COLUMNS, (0.0, math.inf))}
"""Possible values of a row's metrics: ``METRIC_BOUNDS`` and the counters' (counts and a busy time,
never below 0); :func:`intervals` clips to them."""


def run_scenario(scenario: Scenario, round: int = 0, slo: ServiceClass = ServiceClass()) -> dict[str, Any]:
    """Simulate ``scenario`` once with seed ``scenario.seed + round``; return its row.

    Returns:
        The scenario's fields, ``round``, ``run_seed``, the SLO bounds, every
        ``SUMMARY_METRICS`` key, the ``COUNTER_COLUMNS`` and the ``EXAMPLE_COLUMNS``.

    Raises:
        ValueError: from building the trace or spec, or from ``simulate``.
    """
    trace = scenario.trace(round)
    spec = scenario.spec()
    result = simulate(trace, spec, seed=scenario.seed + round)
    ok = result.records[result.records["status"] == "ok"]
    workers = result.workers
    rows = result.record_rows()
    failed = failures(rows)
    counters = {
        "num_requests": len(result.records),
        "prompt_tokens": int(ok["prompt_tokens"].sum()),
        "prefill_tokens": int((ok["prompt_tokens"] - ok["cached_tokens"]).sum()),
        "output_tokens": int(ok["output_tokens"].sum()),
        "num_gpu_blocks": int(workers["num_gpu_blocks"].min()),
        "num_evictions": int(workers["num_evictions"].sum()),
        "evicted_prefix_tokens": evicted_history_tokens(rows, parent_links(trace),
                                                        spec.profile.engine.block_size)[0],
        "num_preemptions": int(workers["num_preemptions"].sum()),
        "prefix_cache_queries": int(workers["prefix_cache_queries"].sum()),
        "prefix_cache_hits": int(workers["prefix_cache_hits"].sum()),
        "busy_time_s": float(workers["busy_time"].sum()),
        "cacheable_blocks": cacheable_blocks(result.worker_rows()),
        "rejected": failed.rejected,
        "not_sent": failed.not_sent,
        "timed_out": failed.timed_out,
        **dict(zip(("num_sessions", "peak_sessions"), sessions_in_flight(result.records))),
    }
    examples = {
        "failed_request": failed.example[0] if failed.example else math.nan,
        "failed_reason": failed.example[1] if failed.example else None,
        "route_digest": route_digest(result.records["request_id"], result.records["worker"]),
    }
    return {
        **scenario.label(), "round": round, "run_seed": scenario.seed + round,
        "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s,
        **summarize(result, slo), **counters, **examples,
    }


def sessions_in_flight(records: pd.DataFrame) -> tuple[int, int]:
    """How many sessions a run had, and the most of them in flight at once.

    A session is in flight from the send time (``arrival``, s) of its first request to the end
    of its last one: the latest ``finish`` (s) of its requests, or the latest send time where
    none finished (a request that failed before its reply). A session that ends at the time
    another starts does not overlap it. A request without a ``session_id`` is a session of its
    own. Cost: a group-by and a sort over the run's requests (O(n log n); about 2 ms for 1,000
    requests).

    Args:
        records: a run's records (``RunResult.records``: ``request_id``, ``session_id``,
            ``arrival``, ``finish``).

    Returns:
        ``(sessions, peak)``: the number of sessions and the most in flight at one time
        (``peak == sessions``: every session had started before any ended).
    """
    if records.empty:
        return 0, 0
    session = records["session_id"].fillna(-1 - records["request_id"]).to_numpy()
    ends = records["finish"].fillna(records["arrival"])
    spans = pd.DataFrame({"session": session, "start": records["arrival"], "end": ends}).groupby("session").agg(
        start=("start", "min"), end=("end", "max"))
    times = np.concatenate([spans["start"].to_numpy(float), spans["end"].to_numpy(float)])
    steps = np.concatenate([np.ones(len(spans), int), -np.ones(len(spans), int)])
    order = np.lexsort((steps, times))  # at one time, ends before starts
    return len(spans), int(np.cumsum(steps[order]).max())


def row_failures(row) -> Failures:
    """The failed requests of a run from its row (``run_scenario``'s; a mapping or a pandas
    Series): what ``kvroute.sim.cluster.metrics.failures`` gave of its records."""
    reason = row["failed_reason"] if isinstance(row["failed_reason"], str) else ""
    example = None if pd.isna(row["failed_request"]) else (int(row["failed_request"]), reason)
    return Failures(int(row["num_requests"]), int(row["failed"]), int(row["rejected"]), int(row["not_sent"]),
                    int(row["timed_out"]), example)


def _run_task(task: tuple[Scenario, int, ServiceClass]) -> dict[str, Any]:
    """One run's row with ``status`` ``"ok"``, or a failed row when the scenario is infeasible
    (any ValueError: a request larger than the KV cache, a cluster that cannot be built)."""
    try:
        return {**run_scenario(*task), "status": "ok", "error": None}
    except PolicyError:
        raise  # a bug in a policy's code, not an infeasible scenario: the sweep stops on it
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
        progress: show progress (`kvroute.sim.study.progress`: a bar on a terminal or in a notebook).
        slo: the service class goodput is measured against.

    Returns:
        A DataFrame with the scenario fields, ``round``, ``run_seed``, ``slo_ttft_s``,
        ``slo_tpot_s``, the ``SUMMARY_METRICS``, the ``COUNTER_COLUMNS``, the
        ``EXAMPLE_COLUMNS``, ``status`` (``"ok"``/``"failed"``) and ``error``. An infeasible
        grid point (its cluster cannot be built, or a run raises ValueError, e.g. a request
        larger than a worker's KV cache) is a failed row per round with the reason in ``error``
        and NaN metrics; the sweep goes on.

    Raises:
        ValueError: an unknown executor, rounds < 1, an address without Dask, an unreachable
            Dask scheduler. Any other error of a run (a bug) is raised as soon as it is seen.
        PolicyError (``kvroute.sim.routing``): a policy's code raised or chose no valid worker
            (a bug in the policy, not an infeasible grid point).
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
    bar = progress_bar(len(tasks), "sweep", "run", enabled=progress)
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
    for column in (*SUMMARY_METRICS, *COUNTER_COLUMNS, *EXAMPLE_COLUMNS):  # NaN when every run failed
        if column not in frame:
            frame[column] = math.nan
    return frame


def lead_ttft(frame: pd.DataFrame, statistic: str) -> str:
    """The TTFT column a sweep's tables and its load figure show for ``statistic`` (``mean``,
    ``p50``, ``p90``, ``p99``): ``later_ttft_<statistic>_s`` (turns >= 2, the turns a prefix cache
    can serve) when any row has a later-turn TTFT, a multi-turn workload; ``ttft_<statistic>_s``
    (all turns) when none has, a workload without later turns.

    Raises:
        ValueError: ``statistic`` names no TTFT column of ``SUMMARY_METRICS``.
    """
    later = f"later_ttft_{statistic}_s"
    if later not in SUMMARY_METRICS:
        stats = [m.removeprefix("later_ttft_").removesuffix("_s") for m in SUMMARY_METRICS
                 if m.startswith("later_ttft_")]
        raise ValueError(f"unknown TTFT statistic {statistic!r}; valid: {', '.join(stats)}")
    multi_turn = later in frame and bool(frame[later].notna().any())
    return later if multi_turn else f"ttft_{statistic}_s"


def group_columns(frame: pd.DataFrame) -> list[str]:
    """The scenario fields that vary in ``frame`` (the columns to group rounds by)."""
    return [c for c in SCENARIO_FIELDS if c in frame and c != "seed" and frame[c].nunique(dropna=False) > 1]


def intervals(frame: pd.DataFrame, metrics: list[str] | None = None, by: list[str] | None = None,
              confidence: float = 0.95, bounds: dict[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """Mean and Student-t interval over rounds of ``metrics`` for each scenario of a sweep.

    Args:
        frame: a ``sweep`` result.
        metrics: columns to summarise (default: every ``SUMMARY_METRICS`` key).
        by: columns naming a scenario (default: the scenario fields that vary, without seed).
        confidence: two-sided confidence of the interval.
        bounds: possible values of columns added to the rows, ``{column: (low, high)}`` (a cost
            from :func:`cost_per_million_tokens`: ``(0, math.inf)``), over :data:`COLUMN_BOUNDS`;
            a column in neither is not clipped.

    Returns:
        One row per scenario: the ``by`` columns, ``rounds`` (runs that did not fail), and
        ``<metric>``, ``<metric>_low``, ``<metric>_high`` per metric
        (``kvroute.sim.cluster.metrics.summarize_rounds``, clipped to possible values); NaN for a
        scenario whose every run failed.
    """
    metrics = metrics or list(SUMMARY_METRICS)
    by = group_columns(frame) if by is None else by
    bounds = {**COLUMN_BOUNDS, **(bounds or {})}
    out = []
    groups = frame.groupby(by, sort=False, dropna=False) if by else [((), frame)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        if "status" in group:  # failed runs (infeasible grid points) have no metrics
            group = group[group["status"] != "failed"]
        records = group[metrics].to_dict("records") or [dict.fromkeys(metrics, math.nan)]
        iv = summarize_rounds(records, confidence, bounds)
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
