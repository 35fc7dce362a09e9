"""Per-worker time series sampled on engine steps, named after vLLM's own metrics.

vLLM makes its scheduler stats at the end of every step (``Scheduler.update_from_output`` calls
``make_stats``, ``vllm/v1/core/sched/scheduler.py``): the queue lengths and KV usage after the
step's finished requests were freed, and the prefix-cache and preemption counts of that step.
:class:`StepSeries` takes the same sample at the same point of the simulated step.

One row per engine step, except that a run of identical decode steps the worker fast-forwards
(``kvroute.sim.cluster.worker``) is ONE row whose ``num_steps`` says how many steps it covers. Such a run
admits, preempts and finishes nothing, so inside it the running count, the batched tokens per step
and the counters (zero) are the same at every step; the row's gauges are sampled after its last
step, as stepping one at a time would give for that step. Only the KV blocks used (which grow as
requests cross block boundaries) and cached are not reported for the run's inner steps. Columns
(:data:`SERIES_COLUMNS`), times in seconds of simulated time:

- ``worker``: the worker index.
- ``start``, ``end``: when the row's first step started and its last step ended (the sample time).
- ``num_steps``: engine steps in the row (1, or the length of a fast-forwarded decode run).
- ``vllm:num_requests_running``, ``vllm:num_requests_waiting``: requests in the running and
  waiting queues after the row's last step (gauges, ``vllm/v1/metrics/loggers.py``).
- ``num_batched_tokens``: tokens scheduled in each step of the row (vLLM's
  ``SchedulerOutput.total_num_scheduled_tokens``; no vLLM metric exports it per step:
  ``vllm:iteration_tokens_total`` counts a chunked prompt once, when its prefill completes).
- ``num_scheduled_reqs``: requests in each step's batch.
- ``kv_blocks_used``: blocks held by requests (usable blocks minus the free queue, evictable
  cached blocks counting as free, as vLLM's usage does); never above ``num_gpu_blocks - 1``.
- ``kv_blocks_cached``: distinct block hashes in the prefix cache (held or free and evictable).
- ``vllm:kv_cache_usage_perc``: ``kv_blocks_used / (num_gpu_blocks - 1)``, a fraction (vLLM's
  name; 1 means 100 percent).
- ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits``: prompt tokens looked up and found
  cached by the row's first admissions (a preempted request's re-admission is not counted, as in
  vLLM). Counters as increments per row: their cumulative sum is vLLM's ``..._total``, and their
  sum over a worker equals the ``prompt_tokens`` and ``cached_tokens`` of the records it served
  (a prompt rejected for ``max_model_len`` never reaches the engine), unless a client timeout
  (``request_timeout_s``) failed a request the engine had admitted: it counts in the engine's
  queries, not in a served record.
- ``vllm:num_preemptions``: requests preempted in the row (an increment, as above).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from kvroute.sim.engine.scheduler import Scheduler

SERIES_COLUMNS = [
    "worker", "start", "end", "num_steps",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "num_batched_tokens", "num_scheduled_reqs",
    "kv_blocks_used", "kv_blocks_cached", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
]
"""The columns of :meth:`StepSeries.frame`, in order."""

COUNTER_COLUMNS = ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"]
"""Columns holding per-row increments of a cumulative counter."""

_WIDTH = 12  # start, end, steps, running, waiting, tokens, reqs, used, cached, queries, hits, preemptions


class StepSeries:
    """The samples of one worker, taken after each engine step (or fast-forwarded decode run).

    Kept as one flat ``array('d')`` of fixed-width rows with the counters cumulative; increments
    are taken when the frame is built, so a sample costs a few attribute reads and one extend.

    Args:
        worker: the worker index written in every row.
        scheduler: the worker's scheduler, read at each sample.
    """

    __slots__ = ("worker", "scheduler", "_data", "_usable")

    def __init__(self, worker: int, scheduler: "Scheduler") -> None:
        self.worker = worker
        self.scheduler = scheduler
        self._data = array("d")
        self._usable = scheduler.pool.num_gpu_blocks - 1

    def sample(self, start: float, end: float, num_steps: int, batched_tokens: int, num_reqs: int) -> None:
        """Record the state after ``num_steps`` identical steps from ``start`` to ``end`` (s),
        each batching ``batched_tokens`` tokens of ``num_reqs`` requests."""
        sched = self.scheduler
        pool = sched.pool
        stats = sched.kv_cache_manager.stats
        self._data.extend((
            start, end, num_steps, len(sched.running), len(sched.waiting), batched_tokens, num_reqs,
            self._usable - pool.num_free_blocks, pool.num_cached_blocks(), stats.queries, stats.hits,
            sched.num_preemptions,
        ))

    def __len__(self) -> int:
        return len(self._data) // _WIDTH

    def frame(self) -> "pd.DataFrame":
        """The samples as a DataFrame with :data:`SERIES_COLUMNS` (counters as increments)."""
        import pandas as pd

        raw = np.array(self._data, dtype=float).reshape(-1, _WIDTH)  # a copy: sampling may go on
        ints = raw[:, 2:].astype(np.int64)
        counters = np.diff(ints[:, -3:], axis=0, prepend=np.zeros((1, 3), dtype=np.int64))
        used = ints[:, 5]
        return pd.DataFrame({
            "worker": np.full(len(raw), self.worker, dtype=np.int64),
            "start": raw[:, 0],
            "end": raw[:, 1],
            "num_steps": ints[:, 0],
            "vllm:num_requests_running": ints[:, 1],
            "vllm:num_requests_waiting": ints[:, 2],
            "num_batched_tokens": ints[:, 3],
            "num_scheduled_reqs": ints[:, 4],
            "kv_blocks_used": used,
            "kv_blocks_cached": ints[:, 6],
            "vllm:kv_cache_usage_perc": used / self._usable,
            "vllm:prefix_cache_queries": counters[:, 0],
            "vllm:prefix_cache_hits": counters[:, 1],
            "vllm:num_preemptions": counters[:, 2],
        }, columns=SERIES_COLUMNS)


def series_frame(series: list[StepSeries]) -> "pd.DataFrame":
    """All workers' samples in one DataFrame (:data:`SERIES_COLUMNS`), worker by worker, each in
    step order."""
    import pandas as pd

    frames = [s.frame() for s in series]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SERIES_COLUMNS)


def workers_of(series: "pd.DataFrame") -> list[int]:
    """The worker indices present in ``series``, ascending."""
    return sorted(int(w) for w in series["worker"].unique())


def gauge_at(series: "pd.DataFrame", column: str, times: np.ndarray) -> np.ndarray:
    """Each worker's ``column`` as it stood at each of ``times`` (s): the value of its last row
    ending at or before the time, 0 before its first step (an engine that never stepped is empty).

    Args:
        series: one run's rows (:data:`SERIES_COLUMNS`; filter ``policy`` and ``round`` first).
        column: a gauge column, or a cumulative one built by the caller.
        times: sample times, s, shape ``(T,)``.

    Returns:
        Array of shape ``(workers, T)``, workers in :func:`workers_of` order.
    """
    times = np.asarray(times, dtype=float)
    out = np.zeros((len(workers_of(series)), len(times)))
    for i, (_, rows) in enumerate(series.groupby("worker", sort=True)):
        ends = rows["end"].to_numpy(float)
        values = rows[column].to_numpy(float)
        at = np.searchsorted(ends, times, side="right") - 1
        out[i] = np.where(at >= 0, values[np.maximum(at, 0)], 0.0)
    return out


def gauge_mean(series: "pd.DataFrame", column: str, edges: np.ndarray) -> np.ndarray:
    """Each worker's ``column`` averaged over time in each interval between consecutive ``edges``
    (s): the gauge as :func:`gauge_at` holds it (from one row's end to the next, 0 before the
    first), integrated exactly and divided by the interval's length.

    Returns:
        Array of shape ``(workers, len(edges) - 1)``, workers in :func:`workers_of` order.

    Raises:
        ValueError: ``edges`` are not strictly increasing.
    """
    edges = np.asarray(edges, dtype=float)
    if len(edges) < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError("edges must be at least two strictly increasing times")
    out = np.zeros((len(workers_of(series)), len(edges) - 1))
    for i, (_, rows) in enumerate(series.groupby("worker", sort=True)):
        ends = rows["end"].to_numpy(float)
        values = rows[column].to_numpy(float)
        # The integral of the gauge from the first end: linear between ends, then on past the
        # last one at the last value; 0 before the first end (the gauge is 0 there).
        last = max(float(edges[-1]), float(ends[-1]))
        xp = np.append(ends, last)
        fp = np.append(0.0, np.cumsum(values * np.diff(xp)))
        integral = np.interp(edges, xp, fp, left=0.0)
        out[i] = np.diff(integral) / np.diff(edges)
    return out


def cumulative_at(series: "pd.DataFrame", column: str, times: np.ndarray, per_step: bool = False) -> np.ndarray:
    """Each worker's running total of ``column`` at each of ``times`` (s), shape ``(workers, T)``.

    A counter column (:data:`COUNTER_COLUMNS`) counts at its row's end. With ``per_step`` the
    column is a per-step amount (``num_batched_tokens``): a row adds it ``num_steps`` times,
    spread evenly over the row from ``start`` to ``end`` (a fast-forwarded run's steps take nearly
    equal times), so differences over a grid give a rate without lumps at run ends.
    """
    times = np.asarray(times, dtype=float)
    out = np.zeros((len(workers_of(series)), len(times)))
    for i, (_, rows) in enumerate(series.groupby("worker", sort=True)):
        amount = rows[column].to_numpy(float)
        if per_step:
            amount = amount * rows["num_steps"].to_numpy(float)
        total = np.cumsum(amount)
        if not per_step:
            ends = rows["end"].to_numpy(float)
            at = np.searchsorted(ends, times, side="right") - 1
            out[i] = np.where(at >= 0, total[np.maximum(at, 0)], 0.0)
            continue
        xp = np.column_stack([rows["start"].to_numpy(float), rows["end"].to_numpy(float)]).ravel()
        fp = np.column_stack([total - amount, total]).ravel()
        out[i] = np.interp(times, xp, fp, left=0.0, right=float(total[-1]))
    return out
