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

from typing import Callable, Iterable


class MetricsScrape:
    """The last scrape of every worker's load metrics.

    Args:
        read: returns, per worker, ``(num_running, num_waiting, kv_usage)`` now
            (requests, requests, fraction 0..1).
        interval_s: seconds between scrapes; 0 reads ``read()`` at every access (today's
            instant view).

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
        self._copies: list[dict[int, int]] = [{} for _ in range(num_workers)]
        self._mask: dict[int, int] = {}  # hash -> bitmask of workers holding it

    def apply(self, worker: int, stored: bool, block_hashes: Iterable[int]) -> None:
        """Apply one ``BlockStored`` (``stored``) or ``BlockRemoved`` event of ``worker``."""
        copies, mask, bit = self._copies[worker], self._mask, 1 << worker
        if stored:
            for h in block_hashes:
                n = copies.get(h, 0)
                copies[h] = n + 1
                if n == 0:
                    mask[h] = mask.get(h, 0) | bit
        else:
            for h in block_hashes:
                n = copies.get(h, 0)
                if n > 1:
                    copies[h] = n - 1
                elif n == 1:
                    del copies[h]
                    m = mask[h] & ~bit
                    if m:
                        mask[h] = m
                    else:
                        del mask[h]

    def copies(self, worker: int, block_hash: int) -> int:
        """How many copies of ``block_hash`` ``worker`` holds according to the events."""
        return self._copies[worker].get(block_hash, 0)

    def cached(self, worker: int) -> set[int]:
        """The hashes ``worker`` holds according to the events."""
        return set(self._copies[worker])

    def matched_blocks(self, block_hashes: list[int]) -> list[int]:
        """Per worker, the blocks of the longest prefix of ``block_hashes`` it holds."""
        n = self.num_workers
        matched = [0] * n
        mask = self._mask
        live = (1 << n) - 1
        for pos, h in enumerate(block_hashes):
            now = mask.get(h, 0) & live
            lost = live & ~now
            w = 0
            while lost:
                if lost & 1:
                    matched[w] = pos
                lost >>= 1
                w += 1
            live = now
            if not live:
                return matched
        for w in range(n):
            if live >> w & 1:
                matched[w] = len(block_hashes)
        return matched
