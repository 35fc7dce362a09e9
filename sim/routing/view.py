"""The gateway's view of the workers: what a real router can know when it decides.

A gateway knows what it did itself: its requests in flight per worker, the sessions it routed,
and an index of the prompt blocks it routed to each worker (SGLang's approximate radix tree,
llm-d's approximate prefix index, Dynamo's ``--no-kv-events`` mode). It cannot see evictions
from that index.
"""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import RouteRequest, pick_min


class RouterView:
    """The gateway's knowledge: in-flight counts, liveness, and what it routed where.

    Args:
        num_workers: workers behind the router.
        block_size: engine tokens per block of ``RouteRequest.block_hashes``.
        router_block_tokens: granularity of the routed-prefix index, tokens (a multiple of
            ``block_size``); coarser is cheaper and matches prefixes to that precision.
        track_prefixes: keep the routed-prefix index (only cache-aware policies need it).

    Raises:
        ValueError: fewer than one worker.
    """

    def __init__(
        self,
        num_workers: int,
        block_size: int,
        router_block_tokens: int = 256,
        track_prefixes: bool = True,
    ) -> None:
        if num_workers < 1:
            raise ValueError("a router needs at least one worker")
        self.num_workers = num_workers
        self.block_size = block_size
        self.in_flight = [0] * num_workers
        self.alive = [True] * num_workers
        self.stride = max(1, router_block_tokens // block_size)
        self.track_prefixes = track_prefixes
        self._index: dict[int, int] = {}  # sampled block hash -> bitmask of workers
        self.sessions: dict[object, int] = {}  # session id -> worker of its latest request

    def alive_workers(self) -> list[int]:
        """Indices of workers the router still sends to."""
        return [i for i in range(self.num_workers) if self.alive[i]]

    def least_loaded(self, candidates: list[int] | None = None, rng: np.random.Generator | None = None) -> int:
        """The candidate with the fewest requests in flight; ties at random with ``rng``
        (the lower index without one).

        Raises:
            RuntimeError: if no worker is alive.
        """
        pool = self.alive_workers() if candidates is None else candidates
        return pick_min(pool, self.in_flight.__getitem__, rng)

    def matched_blocks(self, block_hashes: list[int]) -> list[int]:
        """Per worker, the engine blocks of the longest prefix of ``block_hashes`` routed there.

        Counted at the index's granularity: a prefix matches up to the last sampled block that
        every earlier sampled block also matched.
        """
        matched = [0] * self.num_workers
        if not self.track_prefixes:
            return matched
        index, stride = self._index, self.stride
        live = (1 << self.num_workers) - 1
        length = 0  # engine blocks matched by every worker still in ``live``
        for pos in range(stride - 1, len(block_hashes), stride):
            mask = index.get(block_hashes[pos], 0) & live
            lost = live & ~mask
            w = 0
            while lost:
                if lost & 1:
                    matched[w] = length
                lost >>= 1
                w += 1
            live = mask
            if not live:
                return matched
            length = pos + 1
        for w in range(self.num_workers):
            if live >> w & 1:
                matched[w] = length
        return matched

    def on_routed(self, worker: int, request: RouteRequest) -> None:
        """Record that ``request`` was sent to ``worker``."""
        self.in_flight[worker] += 1
        if request.session_id is not None:
            self.sessions[request.session_id] = worker
        if self.track_prefixes:
            bit = 1 << worker
            index = self._index
            hashes = request.block_hashes
            for pos in range(self.stride - 1, len(hashes), self.stride):
                h = hashes[pos]
                index[h] = index.get(h, 0) | bit

    def on_finished(self, worker: int) -> None:
        """Record that a request on ``worker`` finished (or failed)."""
        self.in_flight[worker] -= 1

    def mark_dead(self, worker: int) -> None:
        """Stop routing to ``worker`` (it failed or timed out)."""
        self.alive[worker] = False
