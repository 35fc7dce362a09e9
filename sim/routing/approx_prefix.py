"""llm-d's approximate prefix index: what a gateway believes each server caches, from what it routed.

Mirrored from ``llm-d-inference-scheduler``
``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/indexer.go`` and
``plugin.go`` (the ``approx-prefix-cache-producer``; before it, the ``prefix-cache-scorer`` of
``gateway-api-inference-extension`` ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``,
v1.3.0, held the same index):

- each server has an LRU of block hashes (``hashicorp/golang-lru``) of ``capacity`` entries;
  routing a request to a server adds its prompt's block hashes in prompt order (an entry already
  held moves to the front; a new one beyond capacity evicts the least recent, and the eviction
  removes the server from that hash's server set);
- after the LRU adds, the server is set in every added hash's server set, so a hash the same
  request evicted again (a prompt longer than the capacity) stays listed, as in llm-d;
- a lookup walks the prompt's hashes from the first and stops at the first one no server holds;
  each server counts the hashes it holds on the way (``matchLongestPrefix``). Lookups do not
  refresh the LRU.

The index never sees the servers' own evictions: that is the estimate. Plain class, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class ApproxPrefixIndex:
    """Per-server LRUs of routed block hashes and the reverse map from hash to servers.

    Args:
        capacities: per server, the LRU's capacity in entries (llm-d's ``lruCapacityPerServer``,
            or the server's ``num_gpu_blocks`` when auto-tuned).

    Raises:
        ValueError: no server, or a capacity < 1.
    """

    def __init__(self, capacities: Sequence[int]) -> None:
        if not capacities:
            raise ValueError("an approximate prefix index needs at least one server")
        if min(capacities) < 1:
            raise ValueError(f"LRU capacities must be >= 1 entry, got {min(capacities)}")
        self.capacities = list(capacities)
        self._lru: list[OrderedDict] = [OrderedDict() for _ in capacities]  # last = most recent
        self._servers: dict[object, int] = {}  # hash -> bitmask of servers listed for it

    def servers(self, block_hash: object) -> list[int]:
        """The servers listed for ``block_hash``, in index order."""
        mask = self._servers.get(block_hash, 0)
        return [w for w in range(len(self._lru)) if mask >> w & 1]

    def held(self, server: int) -> list:
        """The hashes in ``server``'s LRU, least recent first."""
        return list(self._lru[server])

    def match(self, hashes: Sequence) -> list[int]:
        """Per server, how many of ``hashes`` it holds, counted from the first hash up to the
        first hash no server holds (llm-d's greedy ``matchLongestPrefix``)."""
        counts = [0] * len(self._lru)
        get = self._servers.get
        for h in hashes:
            mask = get(h, 0)
            if not mask:
                break
            w = 0
            while mask:
                if mask & 1:
                    counts[w] += 1
                mask >>= 1
                w += 1
        return counts

    def add(self, server: int, hashes: Sequence) -> None:
        """Record that a request with ``hashes`` was routed to ``server`` (llm-d's
        ``PreRequest`` then ``indexer.Add``)."""
        lru, cap, servers = self._lru[server], self.capacities[server], self._servers
        bit = 1 << server
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            if len(lru) > cap:
                old, _ = lru.popitem(last=False)
                mask = servers.get(old, 0) & ~bit
                if mask:
                    servers[old] = mask
                else:
                    servers.pop(old, None)
        for h in hashes:
            servers[h] = servers.get(h, 0) | bit
