"""Per-request records, run results, and the summaries the lab reports.

Definitions (times in seconds, from the client's side):
- TTFT: first token received - request sent. ITL: gap between consecutive tokens of one
  request (every gap of the run's served requests pooled: a request that failed, e.g. whose
  client timed out mid-reply, adds none, as the live client counts ITL). TPOT: (last token -
  first token) / (output tokens - 1) per request. E2E: last token - request sent.
- Time to complete: last token of the run - first request sent (the burst's makespan).
- Hit rate: cached prompt tokens / prompt tokens over first admissions, vLLM's
  ``prefix_cache_hits_total / prefix_cache_queries_total``.
- Queue time: first scheduled - received by the engine, vLLM's ``request_queue_time_seconds``
  (engine-side times, so the gateway's and API server's overheads are not in it). Prefill time:
  first token out of the engine - first scheduled; decode time: last token out of the engine -
  first token out of it (vLLM's ``request_prefill_time_seconds`` and
  ``request_decode_time_seconds``, ``vllm/v1/metrics/stats.py``).
- Goodput: share (and rate, per second of time to complete) of requests whose TTFT and TPOT
  both meet the service class's bounds; a failed request never meets them.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from kvroute.traces.format import TraceRecord

if TYPE_CHECKING:
    import pandas as pd

# NOTE: pandas and scipy are imported where used, not here: this module is imported by every
# command (``kvroute --help`` included) and scipy.stats alone takes ~0.5 s and 57 MB to import.

RECORD_COLUMNS = [
    "request_id", "session_id", "turn", "worker", "arrival", "first_token", "finish",
    "ttft", "e2e", "tpot", "prompt_tokens", "cached_tokens", "output_tokens", "preemptions",
    "status", "error", "client_wait", "queued", "scheduled", "queue_time", "prefill_time", "decode_time",
    "engine_first_token",
]


class RequestRecord:
    """What a client observed of one request (mutable while the run goes on).

    Attributes:
        trace: the trace record sent.
        worker: the worker it was routed to (-1 if never sent).
        arrival: send time, s.
        first_token, last_token, finish: token arrival times, s (None until they happen).
        cached_tokens: prefix-cache hit tokens at first admission.
        output_tokens: tokens received.
        preemptions: times the engine preempted it.
        error: why it failed, or None.
        client_wait: time it was ready to send but waited in the client (a ``max_in_flight``
            or concurrency limit) before it was sent, s.
        queued: when the engine received it, s (vLLM's ``queued_ts``); None if it never did
            or nobody measured it (a live replay).
        scheduled: when an engine step first scheduled it, s (vLLM's ``scheduled_ts``; a
            re-admission after a preemption does not move it); None as ``queued``.
        engine_first_token, engine_last_token: when the engine's step produced the first and
            the last output token, s (before any API-server time of streaming them); None as
            ``queued``.
        token_times: when each output token reached the client, s, in order, when the run
            records them (``ClusterSpec.record_series``), else None.
    """

    __slots__ = (
        "trace", "worker", "arrival", "first_token", "last_token", "finish",
        "cached_tokens", "output_tokens", "preemptions", "error", "client_wait",
        "queued", "scheduled", "engine_first_token", "engine_last_token", "token_times",
    )

    def __init__(self, trace: TraceRecord, worker: int, arrival: float) -> None:
        self.trace = trace
        self.worker = worker
        self.arrival = arrival
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish: float | None = None
        self.cached_tokens = 0
        self.output_tokens = 0
        self.preemptions = 0
        self.error: str | None = None
        self.client_wait = 0.0
        self.queued: float | None = None
        self.scheduled: float | None = None
        self.engine_first_token: float | None = None
        self.engine_last_token: float | None = None
        self.token_times: array | None = None

    def as_row(self) -> tuple:
        """One row in ``RECORD_COLUMNS`` order."""
        t = self.trace
        ok = self.error is None and self.finish is not None
        ttft = self.first_token - self.arrival if ok else math.nan
        e2e = self.finish - self.arrival if ok else math.nan
        tpot = (
            (self.finish - self.first_token) / (self.output_tokens - 1)
            if ok and self.output_tokens > 1
            else math.nan
        )
        return (
            t.request_id, t.session_id, t.turn, self.worker, self.arrival,
            self.first_token if ok else math.nan, self.finish if ok else math.nan,
            ttft, e2e, tpot, t.input_length, self.cached_tokens, self.output_tokens,
            self.preemptions, "ok" if ok else "failed", self.error, self.client_wait,
            _or_nan(self.queued), _or_nan(self.scheduled),
            _since(self.scheduled, self.queued), _since(self.engine_first_token, self.scheduled),
            _since(self.engine_last_token, self.engine_first_token), _or_nan(self.engine_first_token),
        )


def record_rows(records: list[RequestRecord]) -> list[tuple]:
    """Records as tuples in ``RECORD_COLUMNS`` order, sorted by request id (stable)."""
    rows = [r.as_row() for r in records]
    rows.sort(key=itemgetter(0))
    return rows


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _since(later: float | None, earlier: float | None) -> float:
    """``later - earlier``, NaN when either is unknown."""
    return math.nan if later is None or earlier is None else later - earlier


def records_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """Records as a DataFrame with ``RECORD_COLUMNS``, sorted by request id."""
    import pandas as pd

    return pd.DataFrame(record_rows(records), columns=RECORD_COLUMNS)


TOKEN_COLUMNS = ["request_id", "token", "time"]
"""Columns of :func:`tokens_frame`: request id, output token number (1 = first), arrival at the client (s)."""


def tokens_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """Every recorded output token's arrival at the client, one row per token (``TOKEN_COLUMNS``),
    sorted by request id then token number. Records without ``token_times`` add no rows.

    Per request, ``time`` at token 1 is its ``first_token`` and the differences of consecutive
    times are its inter-token latencies (the run's ``itl`` pools them over the requests served;
    a failed request's tokens are here too).
    """
    import pandas as pd

    timed = sorted((r for r in records if r.token_times is not None), key=lambda r: r.trace.request_id)
    counts = np.array([len(r.token_times) for r in timed], dtype=np.int64)
    ids = np.repeat(np.array([r.trace.request_id for r in timed], dtype=np.int64), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    number = np.arange(int(counts.sum()), dtype=np.int64) - starts + 1
    times = np.concatenate([np.frombuffer(r.token_times, dtype=float) for r in timed]) if timed else np.zeros(0)
    return pd.DataFrame({"request_id": ids, "token": number, "time": times}, columns=TOKEN_COLUMNS)


class RunResult:
    """One run's outcome.

    ``records`` and ``workers`` may be given as DataFrames or, by ``from_rows``, as plain
    rows; the DataFrames are then built on first use, so a run summarised by ``summarize``
    (the ``simulate`` command) never imports pandas (its cost: docs/log/speed-passes.md).

    Attributes:
        records: per-request DataFrame (``RECORD_COLUMNS``), sorted by request id.
        itl: every inter-token gap of the run's served requests (status ``ok``), s; a failed
            request's gaps (a client timeout mid-reply) are left out.
        workers: per-worker counters (steps, busy time, prefix-cache tokens, preemptions,
            evictions, KV blocks).
        policy: routing policy name.
        seed: the run's seed.
        step_logs: per-worker step logs when requested, else None.
        series: per-worker step samples (``kvroute.sim.cluster.timeseries.SERIES_COLUMNS``) when the
            run recorded them (``ClusterSpec.record_series``), else None.
        tokens: per-token arrival times (:func:`tokens_frame`) when recorded, else None.
    """

    __slots__ = ("itl", "policy", "seed", "step_logs", "series", "tokens", "_records", "_rows", "_workers",
                 "_worker_rows")

    def __init__(self, records: pd.DataFrame, itl: np.ndarray, workers: pd.DataFrame, policy: str, seed: int,
                 step_logs: list[np.ndarray] | None = None, series: pd.DataFrame | None = None,
                 tokens: pd.DataFrame | None = None) -> None:
        self._records, self._rows = records, None
        self._workers, self._worker_rows = workers, None
        self.itl = itl
        self.policy = policy
        self.seed = seed
        self.step_logs = step_logs
        self.series = series
        self.tokens = tokens

    @property
    def records(self) -> pd.DataFrame:
        """Per-request DataFrame (``RECORD_COLUMNS``), sorted by request id."""
        if self._records is None:
            import pandas as pd

            self._records = pd.DataFrame(self._rows, columns=RECORD_COLUMNS)
        return self._records

    @records.setter
    def records(self, frame: pd.DataFrame) -> None:
        self._records, self._rows = frame, None

    @property
    def workers(self) -> pd.DataFrame:
        """Per-worker counters, one row per worker."""
        if self._workers is None:
            import pandas as pd

            self._workers = pd.DataFrame(self._worker_rows)
        return self._workers

    @workers.setter
    def workers(self, frame: pd.DataFrame) -> None:
        self._workers, self._worker_rows = frame, None

    def record_rows(self) -> list[tuple]:
        """The records as tuples in ``RECORD_COLUMNS`` order, sorted by request id (the rows of
        ``records``; NaN where the DataFrame has NaN or a missing value)."""
        if self._rows is not None:
            return self._rows
        return list(self._records.itertuples(index=False, name=None))

    def worker_rows(self) -> list[dict]:
        """The per-worker counters as one dict per worker (the rows of ``workers``)."""
        if self._worker_rows is not None:
            return self._worker_rows
        return self._workers.to_dict("records")

    def __repr__(self) -> str:
        return f"RunResult(policy={self.policy!r}, seed={self.seed}, requests={len(self.record_rows())})"

    @classmethod
    def from_rows(cls, policy: str, seed: int, records: list[RequestRecord], worker_rows: list[dict],
                  itl_gaps: array | list[float], step_logs: list[np.ndarray] | None = None,
                  series: pd.DataFrame | None = None) -> "RunResult":
        """A finished run's result from its plain parts (DataFrames are built on first use).

        Args:
            policy: the routing policy's name.
            seed: the run's seed.
            records: one :class:`RequestRecord` per request.
            worker_rows: one dict per worker, with the columns of ``workers``.
            itl_gaps: every inter-token gap of the run's served requests, s.
            step_logs: per worker, an ``(n, 4)`` array of its steps, or None when not recorded.
            series: the per-step time series, or None when not recorded (the per-token frame
                is then left out too).
        """
        tokens = tokens_frame(records) if series is not None else None
        result = cls(None, np.asarray(itl_gaps, dtype=float), None, policy, seed, step_logs, series, tokens)
        result._rows = record_rows(records)
        result._worker_rows = worker_rows
        return result


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """A goodput bound: TTFT and TPOT limits, s."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


_ID, _STATUS, _ERROR = (RECORD_COLUMNS.index(c) for c in ("request_id", "status", "error"))
"""Where :func:`failures` reads a record row (``RECORD_COLUMNS`` order)."""

NOT_SENT = "not sent:"
"""How the error of a request never sent begins (its parent failed; ``kvroute.sim.cluster.cluster``)."""
TIMED_OUT = "timed out"
"""How the error of a request its client abandoned begins (``kvroute.sim.cluster.cluster``); any
other error is the engine's rejection."""


@dataclass(frozen=True, slots=True)
class Failures:
    """The failed requests of one run or of several, by kind, with one example.

    Attributes:
        requests: requests of the runs, served and failed.
        failed: requests that failed.
        rejected: failed requests the engine rejected (any error but ``NOT_SENT`` and ``TIMED_OUT``).
        not_sent: later turns never sent, their parent having failed.
        timed_out: requests their client abandoned.
        example: ``(request id, error)`` of the first request the engine rejected (its error
            says what to change), else of the first that failed; None when none failed. The
            error is "" when none was recorded.
    """

    requests: int = 0
    failed: int = 0
    rejected: int = 0
    not_sent: int = 0
    timed_out: int = 0
    example: tuple[int, str] | None = None

    def __add__(self, other: Failures) -> Failures:
        """Both runs' counts summed; the example is the first rejection of the two (self's first),
        else the first failure."""
        example = (self.example if self.rejected or not other.rejected else other.example) or other.example
        return Failures(self.requests + other.requests, self.failed + other.failed, self.rejected + other.rejected,
                        self.not_sent + other.not_sent, self.timed_out + other.timed_out, example)


def failures(rows: list[tuple]) -> Failures:
    """The failed requests of one run, from its records as tuples in ``RECORD_COLUMNS`` order
    (``RunResult.record_rows``), in request-id order."""
    counts = {NOT_SENT: 0, TIMED_OUT: 0, None: 0}  # None: rejected by the engine
    first = rejection = None
    for row in rows:
        if row[_STATUS] == "ok":
            continue
        error = row[_ERROR] if isinstance(row[_ERROR], str) else ""  # None, or NaN read back from a frame
        kind = NOT_SENT if error.startswith(NOT_SENT) else TIMED_OUT if error.startswith(TIMED_OUT) else None
        counts[kind] += 1
        first = first or (int(row[_ID]), error)
        if kind is None and rejection is None:
            rejection = (int(row[_ID]), error)
    failed = sum(counts.values())
    return Failures(len(rows), failed, counts[None], counts[NOT_SENT], counts[TIMED_OUT], rejection or first)


def route_digest(request_ids, workers) -> str:
    """A digest of the worker each request of a run went to (32 hex digits): two runs of the same
    trace have the same digest when they routed every request alike.

    Args:
        request_ids, workers: a request id and its worker (-1: never sent) per request of the
            run, in any order (sequences of ints of one length).
    """
    import hashlib

    pairs = np.column_stack([np.asarray(request_ids, dtype=np.int64), np.asarray(workers, dtype=np.int64)])
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    return hashlib.blake2b(pairs.tobytes(), digest_size=16).hexdigest()


def alike_policies(routes: dict) -> list[tuple[str, str]]:
    """``(policy, first)`` for each policy whose route equals that of an earlier one, ``first``
    the earliest such.

    Args:
        routes: policy -> its runs' routes, comparable (e.g. a ``(round, route_digest)`` tuple),
            in the table's order.
    """
    alike, seen = [], {}  # seen: route -> the first policy that took it
    for policy, route in routes.items():
        if route in seen:
            alike.append((policy, seen[route]))
        else:
            seen[route] = policy
    return alike


def alike_by_point(runs) -> dict[object, list[tuple[str, str]]]:
    """:func:`alike_policies` at each point of a grid: ``{point: [(policy, first), ...]}`` for the
    points where some policy's runs all routed as an earlier policy's did.

    Args:
        runs: ``(point, policy, route)`` per run, ``point`` the run's settings but its policy
            (hashable), ``route`` what identifies its routing (e.g. ``(run_seed, route_digest)``),
            in the grid's policy order; a policy's routes are compared as a sorted tuple.
    """
    by_point: dict[object, dict[str, list]] = {}
    for point, policy, route in runs:
        by_point.setdefault(point, {}).setdefault(policy, []).append(route)
    alike = {point: alike_policies({p: tuple(sorted(r)) for p, r in by_policy.items()})
             for point, by_policy in by_point.items()}
    return {point: pairs for point, pairs in alike.items() if pairs}


def routed_alike(records) -> dict[str, str]:
    """``{policy: first}`` for each policy of simulated records that sent every request to the worker
    an earlier policy (``first``, in the records' order) chose, in every round: in a simulation
    such runs are the same run under two names.

    Args:
        records: per-request rows with ``policy``, ``round``, ``request_id`` and ``worker``
            (``Comparison.records()``); without those columns, or with fewer than two
            policies, the answer is ``{}``.
    """
    if not {"policy", "round", "request_id", "worker"} <= set(records.columns) or records["policy"].nunique() < 2:
        return {}
    runs = ((None, policy, (round_, route_digest(run["request_id"], run["worker"])))
            for (policy, round_), run in records.groupby(["policy", "round"], sort=False))
    return dict(alike_by_point(runs).get(None, []))


SUMMARY_METRICS: dict[str, str] = {
    "time_to_complete_s": "time to complete (s)",
    "ttft_mean_s": "TTFT mean (s)",
    "ttft_p50_s": "TTFT p50 (s)",
    "ttft_p90_s": "TTFT p90 (s)",
    "ttft_p99_s": "TTFT p99 (s)",
    "later_ttft_mean_s": "TTFT mean, turns >= 2 (s)",
    "later_ttft_p50_s": "TTFT p50, turns >= 2 (s)",
    "later_ttft_p90_s": "TTFT p90, turns >= 2 (s)",
    "later_ttft_p99_s": "TTFT p99, turns >= 2 (s)",
    "itl_mean_s": "ITL mean (s)",
    "itl_p90_s": "ITL p90 (s)",
    "tpot_mean_s": "TPOT mean (s)",
    "e2e_mean_s": "E2E mean (s)",
    "e2e_p90_s": "E2E p90 (s)",
    "hit_rate": "hit rate (cached/prompt tokens)",
    "output_throughput_tps": "output throughput (tok/s)",
    "goodput_share": "goodput (share of requests in SLO)",
    "goodput_rps": "goodput (requests/s in SLO)",
    "preemptions": "preemptions",
    "failed": "failed requests",
}
"""Summary keys and their human labels, in report order."""


def _q(values: np.ndarray, q: float) -> float:
    """``float(np.quantile(values, q))`` (numpy's default, linear method); NaN for no values.

    NOTE: numpy's own steps (the same partition of a copy, the same interpolation, NaN when a
    value is NaN) without its ``np.unique`` of the partition points, which imports ``numpy.ma``
    (its cost: docs/log/speed-passes.md); tests/sim/cluster/test_summary_rows.py compares the two."""
    n = len(values)
    if not n:
        return math.nan
    virtual = (n - 1) * q
    below, above = (-1, -1) if virtual >= n - 1 else (math.floor(virtual), math.floor(virtual) + 1)
    arr = np.array(values, dtype=float)
    arr.partition(sorted({0, -1, below, above}))
    if math.isnan(arr[-1]):
        return math.nan
    a, b = float(arr[below]), float(arr[above])
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


def summarize(result: RunResult, slo: ServiceClass = ServiceClass()) -> dict[str, float]:
    """The run's summary metrics, keyed as ``SUMMARY_METRICS``.

    Later-turn TTFT uses requests with ``turn >= 2``; it is NaN for traces without turns.
    Computed from ``result.record_rows()`` with numpy, in request-id order (the order of the
    ``records`` DataFrame, so means and quantiles are the ones pandas gave, to the bit).
    """
    rows = result.record_rows()
    ok = [r for r in rows if r[14] == "ok"]  # status
    ttft = np.array([r[7] for r in ok], dtype=float)
    later = np.array([r[7] for r in ok if r[2] is not None and r[2] == r[2] and r[2] >= 2], dtype=float)  # turn
    start = float(min(r[4] for r in rows)) if rows else 0.0  # arrival
    makespan = float(max(r[6] for r in ok)) - start if ok else math.nan  # finish
    tpot = np.array([r[9] for r in ok], dtype=float)
    met = int(((ttft <= slo.ttft_s) & (np.where(np.isnan(tpot), 0.0, tpot) <= slo.tpot_s)).sum())
    prompt = float(sum(r[10] for r in ok))
    e2e = np.array([r[8] for r in ok], dtype=float)
    return {
        "time_to_complete_s": makespan,
        "ttft_mean_s": _mean(ttft),
        "ttft_p50_s": _q(ttft, 0.5),
        "ttft_p90_s": _q(ttft, 0.9),
        "ttft_p99_s": _q(ttft, 0.99),
        "later_ttft_mean_s": _mean(later),
        "later_ttft_p50_s": _q(later, 0.5),
        "later_ttft_p90_s": _q(later, 0.9),
        "later_ttft_p99_s": _q(later, 0.99),
        "itl_mean_s": _mean(result.itl),
        "itl_p90_s": _q(result.itl, 0.9),
        "tpot_mean_s": _mean(tpot[~np.isnan(tpot)]),
        "e2e_mean_s": _mean(e2e),
        "e2e_p90_s": _q(e2e, 0.9),
        "hit_rate": float(sum(r[11] for r in ok)) / prompt if prompt else math.nan,  # cached tokens
        "output_throughput_tps": float(sum(r[12] for r in ok)) / makespan if makespan else math.nan,
        "goodput_share": float(met) / len(rows) if rows else math.nan,
        "goodput_rps": float(met) / makespan if makespan else math.nan,
        "preemptions": float(sum(r[13] for r in ok)),
        "failed": float(len(rows) - len(ok)),
    }


METRIC_BOUNDS: dict[str, tuple[float, float]] = {
    **{metric: (0.0, math.inf) for metric in SUMMARY_METRICS},
    "hit_rate": (0.0, 1.0),
    "goodput_share": (0.0, 1.0),
}
"""Possible values of each summary metric: shares lie in [0, 1]; times, rates and counts are >= 0."""

CHANGE_BOUNDS: tuple[float, float] = (-100.0, math.inf)
"""Possible values of a relative change between two policies of a metric >= 0, percent: it cannot
fall by more than 100 %."""

SHARE_METRICS = ("hit_rate", "goodput_share")
"""Metrics that are shares in [0, 1]: their changes are shown in percentage points."""

COUNT_METRICS = ("preemptions", "failed")
"""Metrics that count (preemptions, failed requests): a table shows their whole means without
decimals (``kvroute.sim.study.experiment.whole_counts``)."""


def change_pct(value: float, base: float) -> float:
    """Relative change of ``value`` against ``base``, percent: ``100 (value - base) / base``; NaN
    when either is None or NaN or ``base`` is 0."""
    if value is None or base is None or not base or math.isnan(base) or math.isnan(value):
        return math.nan
    return 100.0 * (value - base) / base


def change_of(metric: str):
    """How a change of ``metric`` between two policies is measured, ``f(value, base)``: in
    percentage points for a share (``SHARE_METRICS``: ``100 (value - base)``), else in percent
    (:func:`change_pct`), as ``kvroute compare`` and ``kvroute validate`` give it."""
    if metric in SHARE_METRICS:
        return lambda value, base: 100.0 * (value - base)
    return change_pct


def change_bounds(metric: str) -> tuple[float, float]:
    """The possible values of :func:`change_of` ``metric``: a share's change in [-100, 100] pp,
    else ``CHANGE_BOUNDS`` (no fall beyond -100 %)."""
    return (-100.0, 100.0) if metric in SHARE_METRICS else CHANGE_BOUNDS


def summarize_rounds(summaries: list[dict[str, float]], confidence: float = 0.95,
                     bounds: dict[str, tuple[float, float]] = METRIC_BOUNDS) -> pd.DataFrame:
    """Mean and two-sided Student-t interval over rounds, one row per metric, clipped to the
    metric's possible values.

    With few rounds the t interval can reach impossible values (a hit rate of -0.5..1.2 from two
    rounds); ``low`` and ``high`` are clipped to ``bounds[metric]`` (metrics not in ``bounds``
    are left as they are). The mean is never changed.

    A round where a metric has no value (NaN: later-turn TTFT when every later turn failed,
    TPOT when every reply was one token) is left out of that metric's mean, spread and degrees
    of freedom alike; ``rounds`` counts the rounds that have a value, per metric.

    Returns:
        DataFrame indexed by metric with columns ``mean``, ``low``, ``high``, ``rounds``; with
        one round (or one round with a value) the interval is the value itself.

    Raises:
        ValueError: no summary.
    """
    import pandas as pd

    if not summaries:
        raise ValueError("summarize_rounds: no round to summarize")
    if len(summaries) == 1:
        plain = one_round_intervals(summaries[0], bounds)
        return pd.DataFrame.from_dict(plain, orient="index", columns=["mean", "low", "high", "rounds"])
    from scipy import stats as sps

    frame = pd.DataFrame(summaries).astype(float)
    n = frame.count()  # per metric: the rounds with a value
    mean = frame.mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        t = pd.Series(sps.t.ppf(0.5 + confidence / 2, (n - 1).clip(lower=1)), index=n.index)
        half = (frame.std(ddof=1) / np.sqrt(n) * t).where(n >= 2, mean * 0.0)
    lower = pd.Series([bounds.get(m, (-math.inf, math.inf))[0] for m in mean.index], index=mean.index)
    upper = pd.Series([bounds.get(m, (-math.inf, math.inf))[1] for m in mean.index], index=mean.index)
    low = (mean - half).where(lambda v: v.isna() | (v >= lower), lower)
    high = (mean + half).where(lambda v: v.isna() | (v <= upper), upper)
    return pd.DataFrame({"mean": mean, "low": low, "high": high, "rounds": n})


def clip_interval(low: float, high: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """``(low, high)`` with ``low`` raised to ``bounds[0]`` and ``high`` lowered to ``bounds[1]``
    where they pass them (a metric's possible values, ``METRIC_BOUNDS``); NaNs are kept."""
    lower, upper = bounds
    if not (math.isnan(low) or low >= lower):
        low = lower
    if not (math.isnan(high) or high <= upper):
        high = upper
    return low, high


def one_round_intervals(summary: dict[str, float],
                        bounds: dict[str, tuple[float, float]] = METRIC_BOUNDS) -> dict[str, dict[str, float]]:
    """``summarize_rounds([summary])`` without pandas: per metric ``mean``, ``low``, ``high``
    (all the value itself, NaN where the value is NaN or infinite, as ``value * 0.0`` makes the
    half-width NaN there; ``low``/``high`` clipped to ``bounds``) and ``rounds`` (1)."""
    out = {}
    for metric, value in summary.items():
        value = float(value)
        half = value * 0.0
        low, high = clip_interval(value - half, value + half, bounds.get(metric, (-math.inf, math.inf)))
        out[metric] = {"mean": value, "low": low, "high": high, "rounds": 1}
    return out
