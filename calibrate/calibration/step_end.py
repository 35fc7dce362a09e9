"""KV-event stamps turned into the end of each request's prefill step.

The live path times a request's prefill step by the ``ts`` of the KV-event batch that stored its
prompt's last full block (``KVEventBatch(ts=time.time(), ...)``, ``vllm/v1/core/sched/
scheduler.py``). The blocks are stored as ``schedule()`` allocates the step's slots; when the
batch goes out depends on the release and on async scheduling
(:func:`kvroute.sim.timing.vllm_versions.kv_event_stamp`, ``docs/reference/vllm-versions.md``
row 5):

- ``"step_end"`` (0.11.1 and later, sync): published in ``update_from_output`` of that step, after
  its model run (``EngineCore.step``, ``vllm/v1/engine/core.py``): the stamp is the step's end.
- ``"step_start"`` (0.11.0): published at the end of ``schedule()``, before ``EngineCore.step``
  runs the model: the stamp is the step's start, one whole step early.
- ``"step_end_alone"`` (async scheduling): ``EngineCore.step_with_batch_queue`` (a queue of two
  batches: ``max_concurrent_batches``, ``vllm/v1/executor/``) schedules step N
  and, its queue full, waits for step N-1 and runs ``update_from_output(N-1)``, which takes the
  events step N stored: a request whose step N was scheduled while step N-1 ran gets N-1's end,
  one step early. A request alone (the engine idle when it came) gets its own step's end, since
  step N is then dispatched before any update and the batch goes out in ``update_from_output(N)``.

Where the stamp is early (every request for ``step_start``; for ``step_end_alone`` a request sent
while another of its server was in flight, :func:`others_in_flight`), :func:`prefill_step_ends`
adds an estimate ``d`` of that step's duration, from the first of these that is available and
places the step's end no later than the request's first token at the client (a step cannot end
after its token arrived):

1. ``"next_batch"``: the stamp of the same server's next batch, less this one. If step N+1 stored a
   block, its batch is stamped in ``update_from_output(N)`` (async): the gap ends at the stamp a
   sync server would have given, error 0; or at the end of ``schedule(N+1)``, which follows
   ``update_from_output(N)`` at once (0.11.0): late by that ``schedule()``'s CPU time. If steps
   N+1.. stored nothing, the next batch is later: over by the steps between, at most up to the
   client's first token (so by at most the time from the step's end to the client's token).
2. ``"fitted_step"`` (calibration only, requests alone): the fitted time of that prefill step
   alone (``cost.step_time`` of its last chunk): off by the fit's residual at that prompt.
3. ``"first_gap"``: the request's own first inter-token gap at the client (second token's arrival
   less the first's, when > 0): the period of step N+1, not N: short by what step N did beyond
   N+1 (its own prefill chunk), and off by the jitter of the two tokens' streaming.

A stamp that needs a correction none of them gives is kept as stamped (``"uncorrected"``), and
the report or profile says how many and which way they lean.

"Sent while another was in flight" stands in for "scheduled while the engine ran a step", which
the client cannot see. It is wrong both ways near the edges: a burst's requests that the engine
took into its first step after idling are stamped right but counted early (each estimate then
puts their step's end a step late, usually after their first token, so they are kept and counted
uncorrected); a request sent just after another's last step ended but before that one's last
token reached the client is counted early too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ESTIMATORS = ("next_batch", "fitted_step", "first_gap")
"""Estimators of the early stamp's step duration, in the order they are tried."""

EARLY = {"step_start": "every request", "step_end_alone": "requests with another in flight on their server"}
"""Stamp kinds that are early, and for which requests."""


def needs_correction(stamp: str, loaded: np.ndarray) -> np.ndarray:
    """Per request, whether its stamp of kind ``stamp`` (a key of ``vllm_versions.KV_EVENT_STAMPS``)
    is one step early: all for ``"step_start"``, the ``loaded`` ones for ``"step_end_alone"``,
    none for ``"step_end"``."""
    loaded = np.asarray(loaded, dtype=bool)
    if stamp == "step_start":
        return np.ones(len(loaded), dtype=bool)
    if stamp == "step_end_alone":
        return loaded.copy()
    return np.zeros(len(loaded), dtype=bool)


def prefill_step_ends(stamp: str, stamps, first_token, next_batch=None, first_gap=None, loaded=None,
                      fitted_step=None) -> tuple[np.ndarray, np.ndarray]:
    """The end of each request's prefill step from its KV-event stamp (see the module text).

    Args:
        stamp: what the server's stamps mark (a key of ``vllm_versions.KV_EVENT_STAMPS``).
        stamps: shape (n,), the stamp of the batch that stored each prompt's last full block, s
            (NaN: not timed); every array in one clock (the run's, or since the request's send).
        first_token: shape (n,), when the request's first token reached the client, s.
        next_batch: shape (n,), the stamp of the same server's next batch after ``stamps``, s
            (NaN: none seen); None: not known.
        first_gap: shape (n,), the request's own first inter-token gap at the client, s (NaN or
            <= 0: none); None: not known.
        loaded: shape (n,), bool: another request of the server was in flight when this one was
            sent (:func:`others_in_flight`); None: none was.
        fitted_step: shape (n,), the fitted time of the request's prefill step alone, s (NaN
            where the request was not alone); None: not known.

    Returns:
        ``(ends, how)``: shape (n,) each; ``ends`` the step ends, s (NaN where ``stamps`` is);
        ``how`` per request ``"untimed"``, ``"as_stamped"``, one of :data:`ESTIMATORS` or
        ``"uncorrected"`` (early, no estimate: kept as stamped).
    """
    ts = np.asarray(stamps, dtype=float)
    n = len(ts)
    first = np.asarray(first_token, dtype=float)

    def col(values):
        return np.full(n, math.nan) if values is None else np.asarray(values, dtype=float)

    estimates = {"next_batch": col(next_batch) - ts, "fitted_step": col(fitted_step), "first_gap": col(first_gap)}
    early = needs_correction(stamp, np.zeros(n, dtype=bool) if loaded is None else loaded)
    ends = ts.copy()
    how = np.where(np.isfinite(ts), "as_stamped", "untimed").astype(object)
    todo = early & np.isfinite(ts)
    how[todo] = "uncorrected"
    for name in ESTIMATORS:
        d = estimates[name]
        with np.errstate(invalid="ignore"):
            ok = todo & np.isfinite(d) & (d > 0) & (ts + d <= first)
        ends[ok] = ts[ok] + d[ok]
        how[ok] = name
        todo &= ~ok
    return ends, how


def others_in_flight(server, send, done) -> np.ndarray:
    """Per request, whether another request of the same server was in flight when it was sent:
    sent strictly earlier and not finished before (client-side send and finish times, s; a
    request with either NaN counts for no one, and is itself not loaded).

    Args:
        server: shape (n,), a server key per request (worker index or URL).
        send, done: shape (n,), each request's send and finish times, s.

    A request that the engine finished but whose last token had not yet reached the client counts
    as in flight (the client's finish is later than the engine's).
    """
    server = np.asarray(server)
    send, done = np.asarray(send, dtype=float), np.asarray(done, dtype=float)
    out = np.zeros(len(send), dtype=bool)
    for key in np.unique(server):
        mine = np.flatnonzero(server == key)
        live = mine[np.isfinite(send[mine]) & np.isfinite(done[mine])]
        starts, ends = np.sort(send[live]), np.sort(done[live])
        t = send[mine]
        count = np.searchsorted(starts, t, "left") - np.searchsorted(ends, t, "left")  # done >= send: a subset
        out[mine] = np.isfinite(t) & np.isfinite(done[mine]) & (count >= 1)
    return out


def next_stamps(batch_stamps, stamps) -> np.ndarray:
    """Per request, the first of its server's batch stamps later than its own stamp.

    Args:
        batch_stamps: shape (m,), every batch stamp of the server, s (any order).
        stamps: shape (n,), the requests' stamps, s (NaN: NaN).

    Returns:
        shape (n,), s; NaN where no later batch was seen.
    """
    b = np.sort(np.asarray(batch_stamps, dtype=float))
    ts = np.asarray(stamps, dtype=float)
    out = np.full(len(ts), math.nan)
    ok = np.isfinite(ts)
    i = np.searchsorted(b, ts[ok], "right")
    found = i < len(b)
    out[np.flatnonzero(ok)[found]] = b[i[found]]
    return out


@dataclass(frozen=True, slots=True)
class StampCorrection:
    """What :func:`prefill_step_ends` did to a set of requests.

    Attributes:
        stamp: what the servers' stamps mark (a key of ``vllm_versions.KV_EVENT_STAMPS``, or
            several joined by ``+`` for servers that differ).
        timed: requests with a stamp.
        as_stamped: stamps that mark the step's end already.
        corrected: per estimator (:data:`ESTIMATORS`), stamps moved to the step's end by it.
        uncorrected: early stamps kept as stamped (no estimate).
    """

    stamp: str
    timed: int
    as_stamped: int
    corrected: dict = field(default_factory=dict)
    uncorrected: int = 0

    @classmethod
    def of(cls, stamp: str, how) -> "StampCorrection":
        """The counts of ``how`` (:func:`prefill_step_ends`' second result)."""
        how = list(how)
        return cls(stamp, sum(h != "untimed" for h in how), how.count("as_stamped"),
                   {e: how.count(e) for e in ESTIMATORS if how.count(e)}, how.count("uncorrected"))

    @property
    def num_corrected(self) -> int:
        """Stamps moved, all estimators."""
        return sum(self.corrected.values())

    def to_dict(self) -> dict:
        """JSON-ready: the fields, ``num_corrected`` and ``rule`` (which stamps were moved, how)."""
        rule = ("none: the stamps mark the end of the prefill step" if self.stamp not in EARLY and "+" not in self.stamp
                else f"stamps early for {EARLY.get(self.stamp, 'some requests')} moved to the end of the prefill "
                     f"step by the step's duration, estimated by {', '.join(ESTIMATORS)} in that order "
                     "(kvroute.calibrate.calibration.step_end)")
        return {"stamp": self.stamp, "rule": rule, "timed": self.timed, "as_stamped": self.as_stamped,
                "num_corrected": self.num_corrected, "corrected": dict(self.corrected),
                "uncorrected": self.uncorrected}

    def text(self) -> str:
        """One sentence for a report: what was corrected, by what, and what was left."""
        if self.num_corrected == 0 and self.uncorrected == 0:
            return f"KV-event stamps ({self.stamp}): {self.timed} mark the end of the prefill step; none corrected"
        by = ", ".join(f"{n} by {e.replace('_', ' ')}" for e, n in self.corrected.items()) or "none"
        left = (f"; {self.uncorrected} early by about one step were left as stamped (no estimate of that step)"
                if self.uncorrected else "")
        return (f"KV-event stamps ({self.stamp}): of {self.timed} timed requests {self.as_stamped} mark the end of "
                f"the prefill step and {self.num_corrected} were moved to it ({by}){left}")


def merge(corrections) -> StampCorrection | None:
    """One :class:`StampCorrection` of several (the counts added; None for none)."""
    items = [c for c in corrections if c is not None]
    if not items:
        return None
    kinds = sorted({c.stamp for c in items})
    corrected = {e: sum(c.corrected.get(e, 0) for c in items) for e in ESTIMATORS}
    return StampCorrection("+".join(kinds), sum(c.timed for c in items), sum(c.as_stamped for c in items),
                           {e: n for e, n in corrected.items() if n}, sum(c.uncorrected for c in items))
