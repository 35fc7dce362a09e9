"""vLLM v1's KV block pool with prefix caching (``vllm/v1/core/block_pool.py``).

Blocks are ids ``0 .. num_gpu_blocks - 1``; block 0 is the reserved null block and is never
handed out. Free blocks sit in a queue that starts in id order. New blocks are popped from the
head; popping a block that still carries a hash drops that cache entry (the eviction). Freed
blocks whose reference count reaches 0 go to the tail when they carry a hash (evicted last, so
the queue is an LRU) and to the head when they do not (reused first). A cached block stays a
possible hit until it is popped. Plain class: no SimPy, no clock.

Representation (same queue order as vLLM's ``FreeKVCacheBlockQueue``, cheaper to change by runs
of blocks): every block without a hash is only ever pushed to the head and every block with a
hash only ever appended to the tail, and a block's hash changes only while it is in use, so the
queue is always [blocks without a hash] + [blocks with a hash]. The first part is a list used as
a stack (its end is the head of the queue) above the blocks never handed out, which stay a bare
range of ids (``_fresh .. num_gpu_blocks - 1``, in id order): per-block state exists only for
blocks a run has used, so memory follows the run, not the KV capacity. The second is an append-only list read from a moving
start index: a hit block taken out of the middle (``touch``) leaves a stale entry behind, counted
per block and skipped when the head reaches it (a block's stale entries always precede its live
one, which is its latest). Whole runs of blocks then move with list slices, reads by C-level
``map`` calls and stores by tight loops (an ``OrderedDict`` cost about 0.7 us per block moved
through it); the Mooncake trace moves about 4 million blocks per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import compress, repeat
from operator import not_


# NOTE: stores go through plain loops (``lst[i] = v``, ``del d[k]``), not ``map(lst.__setitem__,
# ...)``: ``__setitem__``, ``__delitem__`` and ``int.__add__`` are slot wrappers that build an
# argument tuple per call, 2-4x slower on CPython 3.11 than the interpreter's specialised
# instructions; ``list.__getitem__``, ``dict.get``/``setdefault`` and ``operator`` functions
# are fast calls, so reads stay ``map`` calls.


class BlockPool:
    """The blocks of one worker, their reference counts, hashes and the free queue.

    Args:
        num_gpu_blocks: total blocks including the null block 0, as vLLM reports it.
        enable_caching: keep hashes of freed blocks so they can be hit later.

    Attributes:
        ref_cnt: reference count per block id handed out so far (a block id at or above
            ``len(ref_cnt)`` was never used: 0 references).
        block_hash: hash per block id handed out so far, None for a block not (or no longer)
            cached.
        num_evictions: cached blocks whose hash was dropped because the block was reused.

    Raises:
        ValueError: if ``num_gpu_blocks < 2``.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is reserved), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [1]  # the null block is never freed
        self.block_hash: list[int | None] = [None]
        # Free blocks without a hash that were used before; the END of the list is the head of
        # the free queue. Below them, the never-used blocks _fresh .. num_gpu_blocks - 1.
        self._head: list[int] = []
        self._fresh = 1
        # Free blocks with a hash, in queue order from _lru[_lru_start] (next to be evicted),
        # with stale entries: _stale[bid] of them per block, _num_stale in all, _lru_len live.
        self._lru: list[int] = []
        self._lru_start = 0
        self._lru_len = 0
        self._stale = [0]
        self._num_stale = 0
        # hash -> the first block registered under it (the one a lookup returns); identical
        # blocks computed twice are kept, vLLM does not merge them: the later ones in _dups.
        self._cached: dict[int, int] = {}
        self._dups: dict[int, list[int]] = {}
        self.num_evictions = 0
        # Called as listener(stored, hashes) when hashes enter (True) or leave (False) the
        # prefix cache: vLLM's BlockStored / BlockRemoved KV events. None: no events.
        self.kv_event_listener = None

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached (evictable) ones included."""
        return len(self._head) + self.num_gpu_blocks - self._fresh + self._lru_len

    def free_queue(self) -> list[int]:
        """Block ids in free-queue order, head (next to be reused) first. For tests and reports."""
        return self._head[::-1] + list(range(self._fresh, self.num_gpu_blocks)) + self._lru_order()

    def usage(self) -> float:
        """KV usage as vLLM reports it: 1 - free / usable blocks (evictable counts as free)."""
        return 1.0 - self.num_free_blocks / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: int) -> int | None:
        """The block holding ``block_hash``, or None (the first registered when several do)."""
        return self._cached.get(block_hash)

    def num_cached_blocks(self) -> int:
        """Distinct hashes currently in the prefix cache."""
        return len(self._cached)

    def none_cached(self, block_hashes: list[int]) -> bool:
        """True when no hash of ``block_hashes`` is in the prefix cache."""
        return self._cached.keys().isdisjoint(block_hashes)

    def longest_cache_hit(self, block_hashes: list[int], max_num_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes``, at most ``max_num_blocks``.

        The walk stops at the first hash not cached (``find_longest_cache_hit`` for full
        attention), so a lost block 1 hides blocks 2 and 3 even if they are still cached.
        """
        get = self._cached.get
        n = min(max_num_blocks, len(block_hashes))
        hit: list[int] = []
        i, step = 0, 8
        while i < n:  # chunks of growing size: a short hit costs few lookups, a long one few calls
            part = list(map(get, block_hashes[i:min(i + step, n)]))
            if None in part:
                hit += part[:part.index(None)]
                break
            hit += part
            i += step
            step *= 2
        return hit

    # -- actions -----------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cache entries.

        Returns:
            the block ids in queue order, each now with one reference.

        Raises:
            ValueError: if fewer blocks are free (callers check first, as vLLM's do).
        """
        head = self._head
        ref_cnt = self.ref_cnt
        k = len(head)
        if num_blocks <= k:
            out = head[k - num_blocks:]
            del head[k - num_blocks:]
            out.reverse()
            for bid in out:
                ref_cnt[bid] = 1
            return out
        m = num_blocks - k
        fresh = self._fresh
        num_fresh = self.num_gpu_blocks - fresh
        if m > num_fresh + self._lru_len:
            raise ValueError(f"cannot get {num_blocks} free blocks, only {self.num_free_blocks} free")
        out = head[::-1]
        head.clear()
        for bid in out:
            ref_cnt[bid] = 1
        if num_fresh:
            t = min(m, num_fresh)
            out += range(fresh, fresh + t)
            self._fresh = fresh + t
            ref_cnt += repeat(1, t)  # never-used blocks enter with their one reference
            self.block_hash += repeat(None, t)
            self._stale += repeat(0, t)
            m -= t
        if m:
            taken = self._pop_lru(m)
            self._evict(taken)
            for bid in taken:
                ref_cnt[bid] = 1
            out += taken
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on hit blocks; one with no reference leaves the free queue."""
        ids = list(block_ids)
        ref_cnt, stale = self.ref_cnt, self._stale
        if len(set(ids)) != len(ids):  # a block twice (only on a hash collision): one by one
            for bid in ids:
                if ref_cnt[bid] == 0:
                    stale[bid] += 1
                    self._num_stale += 1
                    self._lru_len -= 1
                ref_cnt[bid] += 1
            return
        refs = list(map(ref_cnt.__getitem__, ids))
        if 0 in refs:  # a hit block carries a hash, so a free one sits in the LRU part
            leaving = list(compress(ids, map(not_, refs)))
            for bid in leaving:
                stale[bid] += 1
            self._num_stale += len(leaving)
            self._lru_len -= len(leaving)
        for bid, r in zip(ids, refs):
            ref_cnt[bid] = r + 1

    def free_blocks(self, ordered_block_ids: Iterable[int]) -> None:
        """Drop one reference on each block, in eviction-priority order (first evicted first).

        Blocks reaching 0 references go to the tail if they carry a hash, to the head if not
        (``BlockPool.free_blocks``: FIFO reuse for cached blocks, LIFO for the others).
        """
        ids = list(ordered_block_ids)
        ref_cnt = self.ref_cnt
        refs = list(map(ref_cnt.__getitem__, ids))
        if refs.count(1) == len(ids):  # the usual case: no block is shared
            for bid in ids:
                ref_cnt[bid] = 0
            released = ids
        else:  # shared blocks, possibly one listed twice: one by one
            released = []
            for bid in ids:
                ref_cnt[bid] -= 1
                if ref_cnt[bid] == 0:
                    released.append(bid)
        hashed = list(map(self.block_hash.__getitem__, released))
        num_unhashed = hashed.count(None)
        if None not in hashed[num_unhashed:]:  # unhashed blocks first (a table's tail), then hashed
            if num_unhashed:
                self._head.extend(reversed(released[:num_unhashed]))
            if num_unhashed < len(released):
                self._lru.extend(released[num_unhashed:])
                self._lru_len += len(released) - num_unhashed
            return
        evict_first = [bid for bid, h in zip(released, hashed) if h is None]
        self._lru.extend(bid for bid, h in zip(released, hashed) if h is not None)
        self._lru_len += len(released) - len(evict_first)
        self._head.extend(reversed(evict_first))

    def free_table(self, blocks: list[int], num_hashed: int) -> None:
        """``free_blocks(reversed(blocks))`` for a request's block table whose first
        ``num_hashed`` blocks, and only those, carry a hash (hits and registered full blocks
        form a prefix of every table): the same queue order, without looking hashes up.
        """
        ref_cnt = self.ref_cnt
        refs = list(map(ref_cnt.__getitem__, blocks))
        if refs.count(1) == len(blocks):  # no block shared: all released
            for bid in blocks:
                ref_cnt[bid] = 0
            if num_hashed < len(blocks):
                self._head.extend(blocks[num_hashed:])  # unhashed: to the head, the last block first
            if num_hashed:
                self._lru.extend(reversed(blocks[:num_hashed]))  # hashed: to the tail, last first
                self._lru_len += num_hashed
            return
        if len(set(blocks)) != len(blocks):  # a block listed twice (a hash collision): one by one
            self.free_blocks(reversed(blocks))
            return
        # Shared hit blocks (kv_aware routes turns of a conversation together): the blocks whose
        # count reaches 0 are released, in the same order as above.
        left = [r - 1 for r in refs]
        for bid, r in zip(blocks, left):
            ref_cnt[bid] = r
        released = list(compress(blocks, map(not_, left)))
        num_released_hashed = len(released) - sum(map(not_, left[num_hashed:]))
        if num_released_hashed < len(released):
            self._head.extend(released[num_released_hashed:])
        if num_released_hashed:
            hashed = released[:num_released_hashed]
            hashed.reverse()
            self._lru.extend(hashed)
            self._lru_len += num_released_hashed

    def cache_full_blocks(self, block_ids: list[int], block_hashes: list[int], start: int, end: int) -> None:
        """Register blocks ``start .. end - 1`` of a request under their hashes.

        Called when the blocks are scheduled full, before their compute finishes
        (``BlockPool.cache_full_blocks``). Identical blocks are not merged.
        """
        if not self.enable_caching or end <= start:
            return
        bids = block_ids[start:end]
        hashes = block_hashes[start:end]
        block_hash = self.block_hash
        for bid, h in zip(bids, hashes):
            block_hash[bid] = h
        # setdefault inserts a new hash and returns the block given; for a hash already cached
        # (or repeated within this call) it keeps the first block and returns that one instead.
        firsts = list(map(self._cached.setdefault, hashes, bids))
        if firsts != bids:
            dups = self._dups
            for bid, h, first in zip(bids, hashes, firsts):
                if first != bid:
                    dups.setdefault(h, []).append(bid)
        if self.kv_event_listener is not None:
            self.kv_event_listener(True, hashes)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is in use (vLLM's ``reset_prefix_cache``).

        Returns:
            False, changing nothing, when some request still holds blocks.
        """
        if self.num_free_blocks != self.num_gpu_blocks - 1:
            return False
        order = self.free_queue()
        self._cached.clear()
        self._dups.clear()
        self.block_hash = [None] * self.num_gpu_blocks
        self.ref_cnt += repeat(0, self.num_gpu_blocks - self._fresh)
        self._fresh = self.num_gpu_blocks
        self._lru.clear()
        self._lru_start = self._lru_len = self._num_stale = 0
        self._stale = [0] * self.num_gpu_blocks
        self._head = order[::-1]
        return True

    def _pop_lru(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` live entries from the head of the LRU part (caller checks there
        are enough), skipping stale ones."""
        lst, start = self._lru, self._lru_start
        if not self._num_stale:
            taken = lst[start:start + num_blocks]
            start += num_blocks
        else:
            stale = self._stale
            taken = []
            while len(taken) < num_blocks:
                need = num_blocks - len(taken)
                chunk = lst[start:start + need]  # at most ``need`` live entries
                start += need
                marks = list(map(stale.__getitem__, chunk))
                if not any(marks):
                    taken += chunk
                    continue
                if len(set(chunk)) == len(chunk):  # each block once: every entry decided alone
                    skipped = list(compress(chunk, marks))
                    for bid in skipped:
                        stale[bid] -= 1
                    self._num_stale -= len(skipped)
                    taken += compress(chunk, map(not_, marks))
                    continue
                for bid in chunk:  # in order: a block's stale entries precede its live one
                    left = stale[bid]
                    if left:
                        stale[bid] = left - 1
                        self._num_stale -= 1
                    else:
                        taken.append(bid)
        self._lru_len -= num_blocks
        if start > 4096 and 2 * start > len(lst):
            del lst[:start]
            start = 0
        self._lru_start = start
        return taken

    def _lru_order(self) -> list[int]:
        """Live entries of the LRU part in queue order (for ``free_queue``)."""
        stale = {bid: n for bid, n in enumerate(self._stale) if n}
        order = []
        for bid in self._lru[self._lru_start:]:
            if stale.get(bid):
                stale[bid] -= 1
            else:
                order.append(bid)
        return order

    def _evict(self, bids: list[int]) -> None:
        """Drop the cache entries of blocks popped from the LRU part (all carry a hash)."""
        block_hash = self.block_hash
        hashes = list(map(block_hash.__getitem__, bids))
        for bid in bids:
            block_hash[bid] = None
        self.num_evictions += len(bids)
        dups = self._dups
        if not dups or dups.keys().isdisjoint(hashes):
            cached = self._cached
            for h in hashes:
                del cached[h]
        else:
            cached = self._cached
            for bid, h in zip(bids, hashes):
                others = dups.get(h)
                if others is None:
                    del cached[h]
                else:
                    if cached[h] == bid:
                        cached[h] = others.pop(0)
                    else:
                        others.remove(bid)
                    if not others:
                        del dups[h]
        if self.kv_event_listener is not None:
            self.kv_event_listener(False, hashes)  # one BlockRemoved per evicted block, in order
