"""The gateway's view of the workers: what a real router can know when it decides.

A gateway knows what it did itself: its requests in flight per worker, the prompt tokens it sent
that are not yet prefilled, the sessions it routed, and an index of the prompt blocks it routed
to each worker (SGLang's approximate radix tree, llm-d's approximate prefix index, Dynamo's
``--no-kv-events`` mode), which cannot see evictions. Beyond that it sees only what the workers
report, as late as it arrives (``signals``): a ``/metrics`` scrape and KV-cache events. An
``exact`` cache view reads the workers' caches directly, for reference.
"""

from __future__ import annotations

import numpy as np

from typing import Callable

from kvroute.sim.routing.base import RouteRequest, pick_min
from kvroute.sim.routing.in_flight import InFlightPrompts
from kvroute.sim.routing.signals import KVEventIndex, MetricsScrape

CACHE_VIEWS = ("routed", "events", "exact")
"""Where ``matched_blocks`` looks: the gateway's routed-prefix index (the default), the
worker's KV-cache events as received (possibly late), or the workers' prefix caches exactly."""

SCRAPED_SIGNALS = ("running", "waiting", "queue", "kv_usage")
"""The load signals read from the workers' scraped ``/metrics``: a policy that uses one sets
``Policy.uses_metrics``."""

ROUTED_INDEX_MAX_TOKENS = 256
"""The coarsest default granularity of the routed-prefix index, tokens (:func:`routed_index_tokens`)."""


def routed_index_tokens(trace_block_size: int, engine_block_size: int) -> int:
    """The routed-prefix index's default granularity for a trace, tokens: the trace's own content
    granularity (its ``hash_ids`` block: two prompts can part only there) up to
    :data:`ROUTED_INDEX_MAX_TOKENS`, rounded down to whole engine blocks, at least one.

    The real routers match finer than any fixed coarse step: Dynamo's approximate index hashes
    each KV block, SGLang's tree characters. A coarser index leaves a prompt's last partial step
    out, so a later turn whose history ends inside it matches only the prefix every worker shares:
    on the seed burst (16-token blocks, a 784-token shared system prompt, 986-token first turns) a
    256-token step scattered the chats of the worker SGLang's rule piles them on (time to complete
    24.5 s against 36.3 s at 16 tokens). On the Mooncake trace (512-token blocks) 16 and 256 tokens
    route alike to three digits of TTFT and hit rate, and 256 costs 1.6-2.8x less time.
    """
    tokens = min(trace_block_size, ROUTED_INDEX_MAX_TOKENS)
    return max(1, tokens // engine_block_size) * engine_block_size


LOAD_SIGNALS = ("in_flight", "tokens", "running", "waiting", "queue", "kv_usage")
"""Load signals ``RouterView.load`` gives: requests in flight at this gateway, prompt tokens
this gateway sent and not yet prefilled, and the scraped ``/metrics``: running, waiting,
running + waiting requests and KV usage (0..1)."""


def checked_load(policy: str, load: str) -> str:
    """``load`` when it is one of :data:`LOAD_SIGNALS`, for ``policy``'s ``load`` parameter.

    Raises:
        ValueError: another value, naming the policy, the parameter and the valid signals (a
            misspelt ``least_loaded:load=queu`` failed only at its first request).
    """
    if load not in LOAD_SIGNALS:
        raise ValueError(f"{policy}: load must be one of {', '.join(LOAD_SIGNALS)}; got {load!r}")
    return load


class RouterView:
    """The gateway's knowledge: in-flight counts, liveness, and what it routed where.

    Args:
        num_workers: workers behind the router.
        block_size: engine tokens per block of ``RouteRequest.block_hashes``.
        router_block_tokens: granularity of the routed-prefix index, tokens (a multiple of
            ``block_size``; at most one block indexes every block); coarser is cheaper and
            matches prefixes to that precision.
        track_prefixes: keep the routed-prefix index (only cache-aware policies need it; without
            it the ``routed`` view's ``matched_blocks`` raises, so a policy that forgot
            ``Policy.uses_prefixes`` fails rather than reading an empty cache).
        cache_view: where ``matched_blocks`` looks (``CACHE_VIEWS``).
        metrics: the workers' scraped ``/metrics``; needed for the scraped load signals (given
            for a policy that sets ``Policy.uses_metrics``, the signals the live replay polls).
        events: the KV-event index; needed for ``cache_view="events"``.
        exact: per-worker longest cached prefix of a hash list, read from the workers
            themselves; needed for ``cache_view="exact"``.
        track_active_blocks: keep each worker's prompt blocks in flight (``active_blocks``,
            :meth:`new_blocks`), for a policy that sets ``Policy.uses_active_blocks``.
        routed_ttl_s: seconds a routed prefix stays in the routed-prefix index after the last
            request that routed it to a worker (Dynamo's ``--no-kv-events`` mode expires its
            entries: ``KvRouterConfig.router_ttl_secs``, 120 s); None keeps them for good (the
            other routers' approximate trees evict only past a size none of these runs reach).
        clock: the current time, s (needed with ``routed_ttl_s``).

    Attributes:
        outstanding_tokens: per worker, prompt tokens this gateway routed there that are not
            yet prefilled (prompt minus the match seen at routing, until the first token):
            Dynamo's ``ActiveSequences`` prefill tokens.
        active_blocks: per worker, the distinct prompt blocks of this gateway's requests in
            flight there, a block shared by several counted once (Dynamo's
            ``ActiveSequences::active_blocks``, its ``unique_blocks``); kept only with
            ``track_active_blocks`` (zeros otherwise).
        num_gpu_blocks: per worker, its KV-cache blocks as its ``vllm:cache_config_info``
            reports them, or None where unknown (the cluster sets it; llm-d's auto-tuned
            approximate prefix index sizes its LRUs by it).

    Raises:
        ValueError: fewer than one worker, an unknown cache view, or a view without its source.
    """

    def __init__(
        self,
        num_workers: int,
        block_size: int,
        router_block_tokens: int = 256,
        track_prefixes: bool = True,
        cache_view: str = "routed",
        metrics: MetricsScrape | None = None,
        events: KVEventIndex | None = None,
        exact: Callable[[list[int]], list[int]] | None = None,
        track_active_blocks: bool = False,
        routed_ttl_s: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError("a router needs at least one worker")
        if cache_view not in CACHE_VIEWS:
            raise ValueError(f"unknown cache view {cache_view!r}; valid: {', '.join(CACHE_VIEWS)}")
        if (cache_view == "events" and events is None) or (cache_view == "exact" and exact is None):
            raise ValueError(f"cache view {cache_view!r} needs its source")
        if routed_ttl_s is not None and (clock is None or not routed_ttl_s > 0):
            raise ValueError(f"routed_ttl_s needs a clock and a time > 0 s, got {routed_ttl_s!r}")
        self.cache_view = cache_view
        self.metrics = metrics
        self.events = events
        self.exact = exact
        self.outstanding_tokens = [0] * num_workers
        self.active_blocks = [0] * num_workers
        self.num_gpu_blocks: list[int] | None = None
        self._active: dict[int, list] = {}  # request id -> [worker, unprefilled tokens, block hashes or None]
        # per worker, the prompt blocks of its requests in flight (Dynamo's unique_blocks)
        self._in_flight_blocks: list[InFlightPrompts] | None = (
            [InFlightPrompts() for _ in range(num_workers)] if track_active_blocks else None)
        self._last_match: tuple[int, list[int]] | None = None
        self.num_workers = num_workers
        self.block_size = block_size
        self.in_flight = [0] * num_workers
        self.alive = [True] * num_workers
        self.stride = max(1, router_block_tokens // block_size)
        self.track_prefixes = track_prefixes and cache_view == "routed"
        self._index: dict[int, int] = {}  # sampled block hash -> bitmask of workers
        self.routed_ttl_s = routed_ttl_s if self.track_prefixes else None
        self._clock = clock
        self._expiry: dict[int, list[float]] = {}  # with a TTL: sampled block hash -> expiry per worker
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

    def load(self, signal: str = "in_flight") -> list:
        """Per worker, the load ``signal`` (one of ``LOAD_SIGNALS``) as this gateway sees it.

        Raises:
            ValueError: an unknown signal, or a scraped one without a metrics source.
        """
        if signal == "in_flight":
            return self.in_flight
        if signal == "tokens":
            return self.outstanding_tokens
        if signal not in LOAD_SIGNALS:
            raise ValueError(f"unknown load signal {signal!r}; valid: {', '.join(LOAD_SIGNALS)}")
        if self.metrics is None:
            raise ValueError(f"load signal {signal!r} needs the workers' /metrics, which the router reads for a "
                             "policy that sets uses_metrics = True (Policy)")
        scraped = self.metrics.current()
        if signal == "running":
            return [m[0] for m in scraped]
        if signal == "waiting":
            return [m[1] for m in scraped]
        if signal == "queue":
            return [m[0] + m[1] for m in scraped]
        return [m[2] for m in scraped]

    def matched_blocks(self, block_hashes: list[int], request_id: int | None = None) -> list[int]:
        """Per worker, the engine blocks of the longest prefix of ``block_hashes`` it holds,
        according to the view's cache source (``cache_view``).

        The routed-prefix index counts at its granularity: a prefix matches up to the last
        sampled block that every earlier sampled block also matched. Giving ``request_id``
        lets ``on_routed`` reuse the match for the outstanding-token count.
        """
        if self.cache_view == "routed":
            matched = self._routed_match(block_hashes)
        elif self.cache_view == "events":
            matched = self.events.matched_blocks(block_hashes)
        else:
            matched = self.exact(block_hashes)
        if request_id is not None:
            self._last_match = (request_id, matched)
        return matched

    def _routed_match(self, block_hashes: list[int]) -> list[int]:
        if not self.track_prefixes:
            raise RuntimeError("matched_blocks: the router keeps no prefix index for this policy; a policy that "
                               "reads the cache view sets uses_prefixes = True (Policy)")
        matched = [0] * self.num_workers
        get, stride = self._index.get, self.stride
        live = (1 << self.num_workers) - 1
        length = 0  # engine blocks matched by every worker still in ``live``
        ttl = self.routed_ttl_s is not None
        now = self._clock() if ttl else 0.0
        # the sampled blocks are those at positions stride - 1, 2 * stride - 1, ...
        for h in block_hashes[stride - 1::stride]:
            mask = get(h, 0) & live
            if ttl and mask:  # entries past their time are gone (Dynamo prunes them)
                expiry = self._expiry[h]
                for w in range(self.num_workers):
                    if mask >> w & 1 and expiry[w] <= now:
                        mask &= ~(1 << w)
            if mask != live:
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
            length += stride
        for w in range(self.num_workers):
            if live >> w & 1:
                matched[w] = length
        return matched

    def on_routed(self, worker: int, request: RouteRequest) -> None:
        """Record that ``request`` was sent to ``worker``."""
        self.in_flight[worker] += 1
        last = self._last_match
        hit = last[1][worker] if last is not None and last[0] == request.request_id else 0
        tokens = max(request.num_prompt_tokens - hit * self.block_size, 0)
        self.outstanding_tokens[worker] += tokens
        hashes = None
        if self._in_flight_blocks is not None:
            hashes = request.block_hashes
            held = self._in_flight_blocks[worker]
            held.add(hashes)
            self.active_blocks[worker] = held.num_blocks
        self._active[request.request_id] = [worker, tokens, hashes]
        if request.session_id is not None:
            self.sessions[request.session_id] = worker
        if self.track_prefixes:
            bit = 1 << worker
            index = self._index
            get = index.get
            sampled = request.block_hashes[self.stride - 1::self.stride]
            for h in sampled:
                index[h] = get(h, 0) | bit
            if self.routed_ttl_s is not None:
                until, expiry = self._clock() + self.routed_ttl_s, self._expiry
                for h in sampled:
                    times = expiry.get(h)
                    if times is None:
                        times = expiry[h] = [-1.0] * self.num_workers
                    times[worker] = until

    def on_first_token(self, request_id: int) -> None:
        """Record that a request's prefill is done (its first token arrived)."""
        entry = self._active.get(request_id)
        if entry is not None:
            self.outstanding_tokens[entry[0]] -= entry[1]
            entry[1] = 0

    def on_finished(self, worker: int, request_id: int | None = None) -> None:
        """Record that a request on ``worker`` finished (or failed)."""
        self.in_flight[worker] -= 1
        entry = self._active.pop(request_id, None) if request_id is not None else None
        if entry is not None:
            self.outstanding_tokens[entry[0]] -= entry[1]
            if entry[2] is not None:
                held = self._in_flight_blocks[entry[0]]
                held.remove(entry[2])
                self.active_blocks[entry[0]] = held.num_blocks

    def new_blocks(self, worker: int, block_hashes: list[int]) -> int:
        """Blocks of ``block_hashes`` past their longest prefix that a request in flight on
        ``worker`` holds: what a new request adds to the worker's active blocks (Dynamo's
        ``ActiveSequences::new_blocks``; chained hashes make its per-block test a prefix:
        :class:`~kvroute.sim.routing.in_flight.InFlightPrompts`).

        Raises:
            RuntimeError: the view does not track active blocks (``track_active_blocks``).
        """
        if self._in_flight_blocks is None:
            raise RuntimeError("this view does not track the blocks in flight (track_active_blocks)")
        return self._in_flight_blocks[worker].new_blocks(block_hashes)

    def mark_dead(self, worker: int) -> None:
        """Stop routing to ``worker`` (it failed or timed out)."""
        self.alive[worker] = False
