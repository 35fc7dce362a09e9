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
through it); the Mooncake trace moves about 5 million blocks per run.

No hash is stored per block: a block's hash is known where it matters. A request's table
carries hash ``block_hashes[i]`` on its block ``i`` for every registered block (hits are looked
up under those hashes, new blocks are registered under them), so ``free_table`` is given the
hashes with the table and the LRU part keeps them in a parallel list; a popped block's hash,
the one to evict, is then read off that list by the same slice that pops the block. Blocks
with more than one reference are kept in a set (``_shared``, usually small): a freed table
releases every block but those in it without reading reference counts.

Runs of consecutive block ids (extents) were measured and rejected as a representation: on the
Mooncake trace (round_robin) the blocks one call hands out, registers, evicts or frees form
runs of 5.5 consecutive ids on average (5.7 million blocks in 0.95 million runs handed out),
because decode steps interleave the blocks of the running requests and the LRU order keeps
that interleaving; a Python step per run would cost more than the C-level per-block steps it
replaces. Consecutive hash keys (``content.block_hashes``) do not help either: the blocks
registered under them are no more consecutive.
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
        self._shared: set[int] = set()  # blocks with 2 or more references
        # Free blocks without a hash that were used before; the END of the list is the head of
        # the free queue. Below them, the never-used blocks _fresh .. num_gpu_blocks - 1.
        self._head: list[int] = []
        self._fresh = 1
        # Free blocks with a hash, in queue order from _lru[_lru_start] (next to be evicted),
        # with stale entries: _stale[bid] of them per block, _num_stale in all, _lru_len live.
        # _lru_hash[i] is the hash of block _lru[i].
        self._lru: list[int] = []
        self._lru_hash: list[int] = []
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

    @property
    def block_hash(self) -> list[int | None]:
        """Hash per block id (None: not cached), built from the prefix cache. For tests and reports."""
        out: list[int | None] = [None] * self.num_gpu_blocks
        for h, bid in self._cached.items():
            out[bid] = h
        for h, bids in self._dups.items():
            for bid in bids:
                out[bid] = h
        return out

    def usage(self) -> float:
        """KV usage as vLLM reports it: 1 - free / usable blocks (evictable counts as free)."""
        return 1.0 - self.num_free_blocks / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: int) -> int | None:
        """The block holding ``block_hash``, or None (the first registered when several do)."""
        return self._cached.get(block_hash)

    def num_cached_blocks(self) -> int:
        """Distinct hashes currently in the prefix cache."""
        return len(self._cached)

    def num_evictable(self, block_ids: list[int]) -> int:
        """How many of ``block_ids`` (hit blocks) have no reference: they sit in the free queue,
        so taking them uses free capacity (``get_num_blocks_to_allocate``'s evictable blocks)."""
        return list(map(self.ref_cnt.__getitem__, block_ids)).count(0)

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
            self._stale += repeat(0, t)
            m -= t
        if m:
            taken, hashes = self._pop_lru(m)
            self._evict(taken, hashes)
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
                elif ref_cnt[bid] == 1:
                    self._shared.add(bid)
                ref_cnt[bid] += 1
            return
        refs = list(map(ref_cnt.__getitem__, ids))
        if 1 in refs:  # held by another request: now shared
            self._shared.update(compress(ids, [r == 1 for r in refs]))
        if 0 in refs:  # a hit block carries a hash, so a free one sits in the LRU part
            leaving = list(compress(ids, map(not_, refs)))
            for bid in leaving:
                stale[bid] += 1
            self._num_stale += len(leaving)
            self._lru_len -= len(leaving)
        for bid, r in zip(ids, refs):
            ref_cnt[bid] = r + 1

    def free_blocks(self, ordered_block_ids: Iterable[int], hashes: Iterable[int | None]) -> None:
        """Drop one reference on each block, in eviction-priority order (first evicted first);
        ``hashes`` gives each block's hash, None for a block not cached.

        Blocks reaching 0 references go to the tail if they carry a hash, to the head if not
        (``BlockPool.free_blocks``: FIFO reuse for cached blocks, LIFO for the others).
        """
        ref_cnt = self.ref_cnt
        evict_first: list[int] = []
        for bid, h in zip(ordered_block_ids, hashes):  # one by one: a block may be listed twice
            r = ref_cnt[bid] - 1
            ref_cnt[bid] = r
            if r == 1:
                self._shared.discard(bid)
            elif r == 0:
                if h is None:
                    evict_first.append(bid)
                else:
                    self._lru.append(bid)
                    self._lru_hash.append(h)
                    self._lru_len += 1
        self._head.extend(reversed(evict_first))  # the first released becomes the head

    def free_table(self, blocks: list[int], block_hashes: list[int], num_hashed: int) -> None:
        """``free_blocks(reversed(blocks), ...)`` for a request's block table whose first
        ``num_hashed`` blocks, and only those, carry a hash, block ``i`` the hash
        ``block_hashes[i]`` (hits and registered full blocks form a prefix of every table):
        the same queue order, by slices.
        """
        ref_cnt = self.ref_cnt
        shared = self._shared.intersection(blocks) if self._shared else None
        k = 0
        if shared:
            # Shared hit blocks (another running request holds them; under round_robin too, as
            # conversations share prefixes) lose one reference and stay. They are usually the
            # table's first blocks; if they are exactly those (so each is listed once, and so is
            # every other block, which has one reference), the rest is released by slices.
            k = len(shared)
            if k > num_hashed or shared != set(blocks[:k]):
                self._free_shared_table(blocks, block_hashes, num_hashed, shared)
                return
            for bid in blocks[:k]:
                r = ref_cnt[bid] - 1
                ref_cnt[bid] = r
                if r == 1:
                    self._shared.discard(bid)
        # every block from k on has one reference: all are released
        for bid in blocks[k:]:
            ref_cnt[bid] = 0
        if num_hashed < len(blocks):
            self._head.extend(blocks[num_hashed:])  # unhashed: to the head, the last block first
        if num_hashed > k:
            self._lru.extend(reversed(blocks[k:num_hashed]))  # hashed: to the tail, last first
            self._lru_hash.extend(reversed(block_hashes[k:num_hashed]))
            self._lru_len += num_hashed - k

    def _free_shared_table(self, blocks: list[int], block_hashes: list[int], num_hashed: int, shared: set[int]) -> None:
        # ``free_table`` when the table's ``shared`` blocks are not exactly its first ones.
        if len(set(blocks)) != len(blocks):  # a block listed twice (a hash collision): one by one
            hashes = [*block_hashes[:num_hashed], *[None] * (len(blocks) - num_hashed)]
            self.free_blocks(reversed(blocks), reversed(hashes))
            return
        ref_cnt = self.ref_cnt
        kept = list(shared)
        left = [ref_cnt[bid] - 1 for bid in kept]
        for bid in blocks:
            ref_cnt[bid] = 0
        for bid, r in zip(kept, left):
            ref_cnt[bid] = r
            if r == 1:
                self._shared.discard(bid)
        released = list(map(not_, map(shared.__contains__, blocks)))
        if num_hashed < len(blocks):
            self._head.extend(compress(blocks[num_hashed:], released[num_hashed:]))
        if num_hashed:
            hashed = list(compress(blocks[:num_hashed], released))
            hashed.reverse()
            self._lru.extend(hashed)
            hashes = list(compress(block_hashes[:num_hashed], released))
            hashes.reverse()
            self._lru_hash.extend(hashes)
            self._lru_len += len(hashed)

    def cache_full_blocks(self, block_ids: list[int], block_hashes: list[int], start: int, end: int) -> None:
        """Register blocks ``start .. end - 1`` of a request under their hashes.

        Called when the blocks are scheduled full, before their compute finishes
        (``BlockPool.cache_full_blocks``). Identical blocks are not merged.
        """
        if not self.enable_caching or end <= start:
            return
        bids = block_ids[start:end]
        hashes = block_hashes[start:end]
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
        self.ref_cnt += repeat(0, self.num_gpu_blocks - self._fresh)
        self._fresh = self.num_gpu_blocks
        self._lru.clear()
        self._lru_hash.clear()
        self._lru_start = self._lru_len = self._num_stale = 0
        self._stale = [0] * self.num_gpu_blocks
        self._head = order[::-1]
        return True

    def _pop_lru(self, num_blocks: int) -> tuple[list[int], list[int]]:
        """Take ``num_blocks`` live entries from the head of the LRU part (caller checks there
        are enough), skipping stale ones. Returns their block ids and hashes."""
        lst, lst_hash, start = self._lru, self._lru_hash, self._lru_start
        if not self._num_stale:
            taken = lst[start:start + num_blocks]
            hashes = lst_hash[start:start + num_blocks]
            start += num_blocks
        else:
            stale = self._stale
            taken, hashes = [], []
            while len(taken) < num_blocks:
                need = num_blocks - len(taken)
                chunk = lst[start:start + need]  # at most ``need`` live entries
                chunk_hash = lst_hash[start:start + need]
                start += need
                marks = list(map(stale.__getitem__, chunk))
                if not any(marks):
                    taken += chunk
                    hashes += chunk_hash
                    continue
                skipped = list(compress(chunk, marks))
                # A block with no stale entry has at most one (live) entry, so only a stale block
                # can appear twice; if none does, every entry is decided alone.
                if len(set(skipped)) == len(skipped):
                    for bid in skipped:
                        stale[bid] -= 1
                    self._num_stale -= len(skipped)
                    live = list(map(not_, marks))
                    taken += compress(chunk, live)
                    hashes += compress(chunk_hash, live)
                    continue
                for bid, h in zip(chunk, chunk_hash):  # in order: a block's stale entries precede its live one
                    left = stale[bid]
                    if left:
                        stale[bid] = left - 1
                        self._num_stale -= 1
                    else:
                        taken.append(bid)
                        hashes.append(h)
        self._lru_len -= num_blocks
        if start > 4096 and 2 * start > len(lst):
            del lst[:start]
            del lst_hash[:start]
            start = 0
        self._lru_start = start
        return taken, hashes

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

    def _evict(self, bids: list[int], hashes: list[int]) -> None:
        """Drop the cache entries of blocks popped from the LRU part (``hashes``: theirs)."""
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
