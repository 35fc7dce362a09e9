"""Session affinity: a consistent hash of the session id picks the worker."""

from __future__ import annotations

import hashlib

import numpy as np

from kvroute.sim.routing.base import Policy, pick_min, register


@register("session_affinity")
class SessionAffinity(Policy):
    """A consistent hash of the session id picks the worker; no cache or load signal.

    Every request of a session goes to the live worker with the highest hash of
    ``(session id, worker)`` (rendezvous hashing, a consistent hash: when a worker dies only
    its sessions move). Requests without a session go to the least loaded worker. This is the
    sticky-session routing of gateways that hash a header (e.g. Envoy's ring-hash/Maglev load
    balancers on ``x-session-id``), with no cache or load signal.

    Args:
        rng: the router's generator (ties of the fallback).
    """

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self._ranks: dict[object, list[int]] = {}

    def ranking(self, session: object, num_workers: int) -> list[int]:
        """Workers in the session's preference order (cached per session)."""
        ranks = self._ranks.get(session)
        if ranks is None or len(ranks) != num_workers:
            def h(w: int) -> int:
                digest = hashlib.blake2b(f"{session!r}/{w}".encode(), digest_size=8).digest()
                return int.from_bytes(digest, "big")
            ranks = self._ranks[session] = sorted(range(num_workers), key=h, reverse=True)
        return ranks

    @classmethod
    def workload_note(cls, records) -> str:
        """Says so when requests carry no session id: those are routed as least_loaded routes
        them (the fallback), so on a workload without sessions this policy is least_loaded."""
        records = list(records)
        missing = sum(1 for rec in records if rec.session_id is None)
        if not missing:
            return ""
        if missing == len(records):
            return (f"Note: no request of this workload carries a session id, so {cls.name} routed every request "
                    "as least_loaded does (its fallback for a request without a session); sticky sessions need a "
                    "trace whose records give session_id.")
        return (f"Note: {missing} of {len(records)} requests carry no session id; {cls.name} routed those as "
                "least_loaded does (its fallback for a request without a session).")

    def choose(self, request, view) -> int:
        if request.session_id is None:
            return pick_min(view.alive_workers(), view.in_flight.__getitem__, self.rng)
        for w in self.ranking(request.session_id, view.num_workers):
            if view.alive[w]:
                return w
        raise RuntimeError("no live worker to route to")
