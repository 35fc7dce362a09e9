"""Arrival processes and trace rescaling: how fast sessions and requests come.

An arrival process is named by a short text shared by the CLI (``--arrival``), sweeps and Python:

=============  ===========================================================================
``poisson``    exponential gaps (a Poisson process), as ``vllm bench serve --burstiness 1``
``gamma:CV``   gamma gaps with coefficient of variation ``CV`` (``CV > 1`` is burstier than
               Poisson; ``vllm bench serve --burstiness B`` is ``gamma:1/sqrt(B)``)
``constant``   evenly spaced gaps of ``1 / rate``
=============  ===========================================================================

As ``vllm bench serve`` of vLLM 0.32 times its requests (``vllm/benchmarks/serve.py:
get_request``, without ramp-up): ``n`` gaps are drawn, the ``k``-th arrival is after the first
``k`` of them, and the arrivals are rescaled so that the last is at exactly ``n / rate`` s (its
note: this keeps the throughput of different seeds alike). The first arrival is after one gap,
not at 0; a run's time to complete counts from its first request.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.inputs import MILLISECONDS

PROCESSES = ("poisson", "gamma:CV", "constant")


MAX_CV = 100.0
"""Largest gamma CV: the gaps' shape ``1 / CV**2`` stays a float numpy can draw with (1e-4)."""


def parse_arrival(text: str) -> tuple[str, float]:
    """Read an arrival process: ``("poisson", 1.0)``, ``("gamma", cv)`` or ``("constant", 0.0)``.

    Raises:
        ValueError: an unknown name or a CV that is not a finite number in (0, ``MAX_CV``].
    """
    name, _, rest = str(text).strip().lower().partition(":")
    if name == "poisson" and not rest:
        return "gamma", 1.0
    if name == "constant" and not rest:
        return "constant", 0.0
    if name == "gamma":
        try:
            cv = float(rest)
        except ValueError:
            raise ValueError(f"--arrival: gamma needs a CV, as gamma:2, got {text!r}") from None
        if not math.isfinite(cv) or cv <= 0 or cv > MAX_CV:
            raise ValueError(f"--arrival: gamma CV must be a finite number > 0 and <= {MAX_CV:g}, got {text!r}")
        return "gamma", cv
    raise ValueError(f"--arrival: unknown arrival process {text!r}; valid: {', '.join(PROCESSES)}")


def arrival_times(n: int, rate: float, process: str, rng: np.random.Generator | None) -> np.ndarray:
    """``n`` arrival times, seconds, shape ``(n,)``: the cumulative sums of ``n`` gaps of mean
    ``1 / rate``, rescaled so that the last is ``n / rate`` (``vllm bench serve``'s
    ``get_request``; no rescaling when every gap drew 0).

    Args:
        n: arrivals.
        rate: mean arrivals per second (> 0).
        process: as :func:`parse_arrival` reads it.
        rng: draws the gaps (not used by ``constant``).

    Raises:
        ValueError: ``rate`` not a finite number > 0, a bad process, a random process
            without ``rng``, or a last arrival past 1e9 s.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--request-rate must be a finite number > 0, got {rate!r}")
    kind, cv = parse_arrival(process)
    if n <= 0:
        return np.zeros(0)
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        if rng is None:
            raise ValueError(f"arrival process {process!r} is random: pass rng (a seeded numpy Generator)")
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    times = np.cumsum(gaps)
    if times[-1] > 0:
        times *= (n / rate) / times[-1]
    if not times[-1] <= MILLISECONDS.maximum / 1000.0:  # inf too: the later sessions would never start
        raise ValueError(f"--request-rate {rate:g} puts the last of {n} sessions at {times[-1]:.3g} s, past the "
                         f"{MILLISECONDS.maximum / 1000:g} s any time may be")
    return times


def with_session_starts(trace: Trace, starts_s: np.ndarray) -> Trace:
    """``trace`` with session ``s``'s records stamped ``starts_s[s]`` seconds later (roots send then).

    Records without a session id are taken in trace order as sessions of their own.

    Raises:
        ValueError: fewer start times than sessions.
    """
    order: dict[object, int] = {}
    records = []
    for rec in trace.records:
        key = rec.session_id if rec.session_id is not None else ("record", rec.request_id)
        index = order.setdefault(key, len(order))
        if index >= len(starts_s):
            raise ValueError(f"{trace.source}: {len(starts_s)} start times for more sessions")
        records.append(_shifted(rec, float(starts_s[index]) * 1000.0))
    return Trace(records, trace.block_size, trace.source, dict(trace.metadata))


def rescale_conflict(from_file: bool, speedup: float | None, rate: float | None) -> str | None:
    """Why ``speedup`` and ``rate`` cannot load this trace (None when they can): ``--speedup``
    rescales a trace file only, and a file takes one of the two."""
    if not from_file and speedup is not None:
        return "--speedup rescales a --trace file; a generated workload takes --request-rate"
    if from_file and speedup is not None and rate is not None:
        return "give --speedup or --request-rate for a trace file, not both"
    return None


def rescaled(trace: Trace, speedup: float | None = None, rate: float | None = None,
             sessions: bool = False) -> Trace:
    """``trace`` with its timestamps divided by ``speedup``, or scaled to a mean rate of ``rate``
    per second.

    The mean rate of a trace is (records - 1) / (last timestamp - first timestamp), timestamps in
    seconds; with ``sessions`` (a closed-loop replay, where a later turn is sent when its parent
    finishes and its own timestamp is not used) it counts the records without a parent, the
    sessions' first turns, so that ``rate`` is sessions started per second as a generated
    workload's ``request_rate`` is. Closed-loop gaps (``think_time``) are not scaled: they belong
    to the client, not to the load.

    Raises:
        ValueError: both or neither given, a value not finite and > 0, ``rate`` asked of a
            trace whose timestamps are all equal, or a last timestamp past 1e9 s once rescaled.
    """
    if (speedup is None) == (rate is None):
        raise ValueError("give one of --speedup and --request-rate")
    if rate is not None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"--request-rate must be a finite number > 0, got {rate!r}")
        counted = [r for r in trace.records if r.parent is None] if sessions else trace.records
        stamps = [r.timestamp_ms for r in counted]
        span_s = (max(stamps) - min(stamps)) / 1000.0 if stamps else 0.0
        if span_s <= 0:
            what = "sessions start" if sessions else "requests share"
            raise ValueError(f"{trace.source}: all {what} at one timestamp; --request-rate cannot rescale it "
                             "(use a generated workload's --request-rate, or --arrival-spread)")
        speedup = rate / ((len(stamps) - 1) / span_s)
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"--speedup must be a finite number > 0, got {speedup!r}")
    last_ms = max((r.timestamp_ms for r in trace.records), default=0.0) / speedup
    if not last_ms <= MILLISECONDS.maximum:  # inf too: the later arrivals would never come
        flag = f"--speedup {speedup:g}" if rate is None else f"--request-rate {rate:g}"
        raise ValueError(f"{flag} puts the trace's last request at {last_ms / 1000:.3g} s, past the "
                         f"{MILLISECONDS.maximum / 1000:g} s any time may be")
    records = [_shifted(rec, rec.timestamp_ms / speedup - rec.timestamp_ms) for rec in trace.records]
    metadata = {**trace.metadata, "speedup": speedup}
    return Trace(records, trace.block_size, trace.source, metadata)


def _shifted(rec: TraceRecord, delta_ms: float) -> TraceRecord:
    return replace(rec, timestamp_ms=rec.timestamp_ms + delta_ms)
