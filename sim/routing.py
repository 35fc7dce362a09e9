"""Routing policies behind one interface, shared by the simulator and the live replay.

A policy answers ``choose(request, view) -> worker index``. The ``RouterView`` holds only what a
real gateway can know: its own in-flight count per worker, which workers it believes alive, and
an index of the prompt blocks it has routed to each worker (it cannot see evictions).

Tie-breaking, for every policy: among equals, the lower in-flight count wins, then the lower
worker index. Policies never pick a worker the view marks dead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the router sees of a request.

    Attributes:
        request_id: the request's id.
        session_id: conversation id, or None.
        block_hashes: the prompt's full-block hashes at the engine block size.
        num_prompt_tokens: prompt length, tokens.
    """

    request_id: int
    session_id: object
    block_hashes: list[int]
    num_prompt_tokens: int


class RouterView:
    """The gateway's knowledge: in-flight counts, liveness, and what it routed where.

    Args:
        num_workers: workers behind the router.
        block_size: engine tokens per block of ``RouteRequest.block_hashes``.
        router_block_tokens: granularity of the routed-prefix index, tokens (a multiple of
            ``block_size``); coarser is cheaper and matches prefixes to that precision.
        track_prefixes: keep the routed-prefix index (only cache-aware policies need it).
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
        self.in_flight = [0] * num_workers
        self.alive = [True] * num_workers
        self.stride = max(1, router_block_tokens // block_size)
        self.track_prefixes = track_prefixes
        self._index: dict[int, int] = {}  # sampled block hash -> bitmask of workers
        self.sessions: dict[object, int] = {}  # session id -> worker of its latest request

    def alive_workers(self) -> list[int]:
        """Indices of workers the router still sends to."""
        return [i for i in range(self.num_workers) if self.alive[i]]

    def least_loaded(self, candidates: list[int] | None = None) -> int:
        """The candidate with the fewest requests in flight; ties go to the lower index.

        Raises:
            RuntimeError: if no worker is alive.
        """
        pool = self.alive_workers() if candidates is None else candidates
        if not pool:
            raise RuntimeError("no live worker to route to")
        in_flight = self.in_flight
        return min(pool, key=lambda w: (in_flight[w], w))

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


class Policy:
    """A routing policy. Subclasses set ``name`` and implement ``choose``.

    Attributes:
        name: the CLI name.
        uses_prefixes: whether the policy reads the routed-prefix index.
    """

    name = ""
    uses_prefixes = False

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        """The worker index for ``request``; raises RuntimeError if no worker is alive."""
        raise NotImplementedError


class RoundRobin(Policy):
    """The next live worker in turn, starting at worker 0."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        for k in range(view.num_workers):
            w = (self._next + k) % view.num_workers
            if view.alive[w]:
                self._next = w + 1
                return w
        raise RuntimeError("no live worker to route to")


class LeastLoaded(Policy):
    """The live worker with the fewest requests in flight at the router."""

    name = "least_loaded"

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        return view.least_loaded()


class RandomPolicy(Policy):
    """A live worker drawn uniformly with the run's seeded generator."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        return alive[int(self._rng.integers(len(alive)))]


class KVAware(Policy):
    """The live worker whose routed history holds the longest prefix of this prompt.

    For a chat this is the worker that served the previous turn. Three guards keep a prefix
    that every request shares (a common system prompt) from pulling all traffic to the first
    worker that saw it:

    - the first request of a session the router has not seen goes to the least loaded worker;
    - the best match must cover at least ``min_match_share`` of the prompt (SGLang's
      ``cache_threshold``, default 0.5 there too), otherwise the least loaded worker wins;
    - ties between equally long matches go to the least loaded of them.
    """

    name = "kv_aware"
    uses_prefixes = True

    def __init__(self, min_match_share: float = 0.5) -> None:
        self.min_match_share = min_match_share

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        if request.session_id is not None and request.session_id not in view.sessions:
            return view.least_loaded(alive)
        matched = view.matched_blocks(request.block_hashes)
        best = max(matched[w] for w in alive)
        num_blocks = len(request.block_hashes)
        if best == 0 or best < self.min_match_share * num_blocks:
            return view.least_loaded(alive)
        return view.least_loaded([w for w in alive if matched[w] == best])


class PrefixBalanced(Policy):
    """KV-aware unless the cache-preferred worker is overloaded, then least loaded.

    Overloaded means its in-flight count exceeds the least loaded worker's by more than
    ``abs_threshold`` requests **and** by more than a factor ``rel_threshold``: the rule of
    SGLang's cache-aware router (``balance_abs_threshold``, ``balance_rel_threshold``), applied
    to the chosen worker rather than to the cluster's extremes.
    """

    name = "prefix_balanced"
    uses_prefixes = True

    def __init__(self, abs_threshold: int = 4, rel_threshold: float = 1.5) -> None:
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self._kv = KVAware()

    def choose(self, request: RouteRequest, view: RouterView) -> int:
        preferred = self._kv.choose(request, view)
        lightest = view.least_loaded()
        load, low = view.in_flight[preferred], view.in_flight[lightest]
        if load - low > self.abs_threshold and load > self.rel_threshold * low:
            return lightest
        return preferred


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoaded, KVAware, PrefixBalanced, RandomPolicy)
}


def make_policy(name: str, rng: np.random.Generator) -> Policy:
    """A fresh policy by CLI name.

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}")
    if cls is RandomPolicy:
        return RandomPolicy(rng)
    return cls()
