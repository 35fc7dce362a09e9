"""Worker-reported signals a gateway can subscribe to, each as of when it reached the gateway.

- ``MetricsScrape``: each worker's ``/metrics`` as last scraped every ``interval_s``:
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``
  (vLLM's Prometheus names). Interval 0 reads the live values at every decision.
- ``KVEventIndex``: the prefix cache of each worker rebuilt from its KV-cache events, as vLLM
  publishes them (``vllm/distributed/kv_events.py``: ``BlockStored`` when full blocks are
  registered in the prefix cache, ``BlockRemoved`` for every hash dropped when a cached block is
  reused; ``vllm/v1/core/block_pool.py`` queues them and the scheduler publishes one
  ``KVEventBatch`` per step). A hash computed twice on one worker is stored twice and removed
  once per copy, so the index counts copies and a hash is cached while its count is positive.

Plain classes: the cluster (or the live replay) feeds them; no clock here.
"""

from __future__ import annotations

from typing import Callable, Sequence


class MetricsScrape:
    """The last scrape of every worker's load metrics.

    Args:
        read: returns, per worker, ``(num_running, num_waiting, kv_usage)`` now
            (requests, requests, fraction 0..1).
        interval_s: seconds between scrapes; 0 reads ``read()`` at every access (an
            instant view, ``ClusterSpec.scrape_interval_s``' default).

    Raises:
        ValueError: a negative interval.
    """

    def __init__(self, read: Callable[[], list[tuple[int, int, float]]], interval_s: float = 0.0) -> None:
        if interval_s < 0:
            raise ValueError(f"scrape interval must be >= 0 s, got {interval_s}")
        self.read = read
        self.interval_s = interval_s
        self._snapshot: list[tuple[int, int, float]] | None = None

    def scrape(self) -> None:
        """Take a scrape now (called every ``interval_s`` by whoever owns the clock)."""
        self._snapshot = self.read()

    def current(self) -> list[tuple[int, int, float]]:
        """Per worker ``(num_running, num_waiting, kv_usage)`` as the gateway last saw them;
        before the first scrape, the live values (a gateway scrapes once at start-up)."""
        if self.interval_s == 0 or self._snapshot is None:
            return self.read()
        return self._snapshot


class KVEventIndex:
    """Per worker, the cached block hashes as the KV-cache events received so far say.

    Args:
        num_workers: workers publishing events.
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._held: list[set[int]] = [set() for _ in range(num_workers)]
        self._extra: list[dict[int, int]] = [{} for _ in range(num_workers)]  # copies beyond the first

    def apply(self, worker: int, stored: bool, block_hashes: Sequence[int]) -> None:
        """Apply one ``BlockStored`` (``stored``) or ``BlockRemoved`` event of ``worker``; a hash
        already held, or repeated within ``block_hashes`` (a delayed feed merges one instant's
        events), adds a copy."""
        held, extra = self._held[worker], self._extra[worker]
        if stored:
            num_held = len(held)
            again = held.intersection(block_hashes)
            held.update(block_hashes)
            if again or len(held) - num_held != len(block_hashes):  # copies (vLLM does not merge them)
                seen = set()
                for h in block_hashes:
                    if h in again or h in seen:
                        extra[h] = extra.get(h, 0) + 1
                    else:
                        seen.add(h)
        elif extra:
            for h in block_hashes:
                n = extra.get(h)
                if n:
                    if n > 1:
                        extra[h] = n - 1
                    else:
                        del extra[h]
                else:
                    held.discard(h)
        else:
            held.difference_update(block_hashes)

    def copies(self, worker: int, block_hash: int) -> int:
        """How many copies of ``block_hash`` ``worker`` holds according to the events."""
        if block_hash not in self._held[worker]:
            return 0
        return 1 + self._extra[worker].get(block_hash, 0)

    def cached(self, worker: int) -> set[int]:
        """The hashes ``worker`` holds according to the events."""
        return set(self._held[worker])

    def matched_blocks(self, block_hashes: list[int]) -> list[int]:
        """Per worker, the blocks of the longest prefix of ``block_hashes`` it holds."""
        held = self._held
        matched = [0] * self.num_workers
        live = [w for w in range(self.num_workers) if held[w]]
        for pos, h in enumerate(block_hashes):
            still = [w for w in live if h in held[w]]
            if len(still) != len(live):
                for w in live:
                    if h not in held[w]:
                        matched[w] = pos
                live = still
                if not live:
                    return matched
        for w in live:
            matched[w] = len(block_hashes)
        return matched
