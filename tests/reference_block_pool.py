"""The block pool as it was before the speed work (one block per Python step, an OrderedDict
free queue): the reference that tests/test_block_pool_reference.py checks the fast pool against.

vLLM v1's KV block pool with prefix caching (``vllm/v1/core/block_pool.py``).

Blocks are ids ``0 .. num_gpu_blocks - 1``; block 0 is the reserved null block and is never
handed out. Free blocks sit in a queue that starts in id order. New blocks are popped from the
head; popping a block that still carries a hash drops that cache entry (the eviction). Freed
blocks whose reference count reaches 0 go to the tail when they carry a hash (evicted last, so
the queue is an LRU) and to the head when they do not (reused first). A cached block stays a
possible hit until it is popped. Plain class: no SimPy, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class ReferenceBlockPool:
    """The blocks of one worker, their reference counts, hashes and the free queue.

    Args:
        num_gpu_blocks: total blocks including the null block 0, as vLLM reports it.
        enable_caching: keep hashes of freed blocks so they can be hit later.

    Attributes:
        ref_cnt: reference count per block id.
        block_hash: hash per block id, None for a block not (or no longer) cached.
        num_evictions: cached blocks whose hash was dropped because the block was reused.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is reserved), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        # NOTE: an OrderedDict is a C-implemented doubly linked list: O(1) pop from the head,
        # append at the tail, move to the head and removal from the middle, as vLLM's
        # FreeKVCacheBlockQueue.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        # hash -> block id, or -> list of block ids when identical blocks were computed twice
        # (vLLM keeps both; a lookup returns the first one registered).
        self._cached: dict[int, int | list[int]] = {}
        self.ref_cnt[0] = 1  # the null block is never freed
        self.num_evictions = 0

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached (evictable) ones included."""
        return len(self._free)

    def free_queue(self) -> list[int]:
        """Block ids in free-queue order, head (next to be reused) first. For tests and reports."""
        return list(self._free)

    def usage(self) -> float:
        """KV usage as vLLM reports it: 1 - free / usable blocks (evictable counts as free)."""
        return 1.0 - len(self._free) / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: int) -> int | None:
        """The block holding ``block_hash``, or None (the first registered when several do)."""
        hit = self._cached.get(block_hash)
        if hit is None or type(hit) is int:
            return hit
        return hit[0]

    def num_cached_blocks(self) -> int:
        """Distinct hashes currently in the prefix cache."""
        return len(self._cached)

    def longest_cache_hit(self, block_hashes: list[int], max_num_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes``, at most ``max_num_blocks``.

        The walk stops at the first hash not cached (``find_longest_cache_hit`` for full
        attention), so a lost block 1 hides blocks 2 and 3 even if they are still cached.
        """
        cached = self._cached
        hit: list[int] = []
        for i in range(min(max_num_blocks, len(block_hashes))):
            entry = cached.get(block_hashes[i])
            if entry is None:
                break
            hit.append(entry if type(entry) is int else entry[0])
        return hit

    # -- actions -----------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cache entries.

        Raises:
            ValueError: if fewer blocks are free (callers check first, as vLLM's do).
        """
        if num_blocks > len(self._free):
            raise ValueError(f"cannot get {num_blocks} free blocks, only {len(self._free)} free")
        popitem = self._free.popitem
        ref_cnt, block_hash = self.ref_cnt, self.block_hash
        out = [popitem(False)[0] for _ in range(num_blocks)]
        for bid in out:
            if block_hash[bid] is not None:
                self._evict(bid)
            ref_cnt[bid] = 1
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on hit blocks; one with no reference leaves the free queue."""
        ref_cnt, free = self.ref_cnt, self._free
        for bid in block_ids:
            if ref_cnt[bid] == 0:
                del free[bid]
            ref_cnt[bid] += 1

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        """Drop one reference on each block, in eviction-priority order (first evicted first).

        Blocks reaching 0 references go to the tail if they carry a hash, to the head if not
        (``BlockPool.free_blocks``: FIFO reuse for cached blocks, LIFO for the others).
        """
        ref_cnt, block_hash, free = self.ref_cnt, self.block_hash, self._free
        evict_first: list[int] = []
        for bid in ordered_block_ids:
            ref_cnt[bid] -= 1
            if ref_cnt[bid] == 0:
                if block_hash[bid] is None or not self.enable_caching:
                    evict_first.append(bid)
                else:
                    free[bid] = None
        for bid in reversed(evict_first):
            free[bid] = None
            free.move_to_end(bid, last=False)

    def cache_full_blocks(self, block_ids: list[int], block_hashes: list[int], start: int, end: int) -> None:
        """Register blocks ``start .. end - 1`` of a request under their hashes.

        Called when the blocks are scheduled full, before their compute finishes
        (``BlockPool.cache_full_blocks``). Identical blocks are not merged.
        """
        if not self.enable_caching:
            return
        cached, block_hash = self._cached, self.block_hash
        for i in range(start, end):
            bid, h = block_ids[i], block_hashes[i]
            block_hash[bid] = h
            entry = cached.get(h)
            if entry is None:
                cached[h] = bid
            elif type(entry) is int:
                cached[h] = [entry, bid]
            else:
                entry.append(bid)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is in use (vLLM's ``reset_prefix_cache``).

        Returns:
            False, changing nothing, when some request still holds blocks.
        """
        if len(self._free) != self.num_gpu_blocks - 1:
            return False
        self._cached.clear()
        self.block_hash = [None] * self.num_gpu_blocks
        return True

    def _evict(self, bid: int) -> None:
        h = self.block_hash[bid]
        self.block_hash[bid] = None
        entry = self._cached[h]
        if type(entry) is int:
            del self._cached[h]
        else:
            entry.remove(bid)
            if not entry:
                del self._cached[h]
        self.num_evictions += 1
