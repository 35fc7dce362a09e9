"""vLLM v1's KV block pool with prefix caching, written as vLLM writes it: the source of truth
that the compiled twin (``_block_pool.pyx``) is tested against.

Mirrors ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and
``vllm/v1/core/kv_cache_utils.py: FreeKVCacheBlockQueue`` of vLLM 0.32 (the release
tests/sim/engine/test_vllm_parity.py drives) for one full-attention KV-cache group; each method
names the vLLM function it follows.

Blocks are ids ``0 .. num_gpu_blocks - 1``; block 0 is the reserved null block and is never
handed out. Free blocks sit in a queue that starts in id order. New blocks are popped from the
head; popping a block that still carries a hash drops that cache entry (the eviction). Freed
blocks whose reference count reaches 0 go to the tail when they carry a hash (evicted last, so
the queue is an LRU) and to the head when they do not (reused first). A cached block stays a
possible hit until it is popped. Plain class: no SimPy, no clock.

Where this differs from vLLM, and why (none of it changes a block id, an eviction or a hit):

- A block is its id, not a ``KVCacheBlock`` object: its fields are lists indexed by id
  (``ref_cnt``; ``_block_hash``, ``KVCacheBlock.block_hash``).
- The free queue is an ``OrderedDict`` of block ids (a doubly linked list in C, with vLLM's O(1)
  ``popleft``, ``remove``, ``append`` and push to the head), not links stored in the blocks.
- vLLM builds every block when the pool starts. Here the blocks never handed out, ids ``fresh ..
  num_gpu_blocks - 1``, are one entry of the free queue standing for all of them in id order,
  and a block's fields are made when it is first handed out, so memory follows the blocks a run
  uses, not the KV capacity (the compiled twin does the same).
- One group and one hash per block: the prefix cache is keyed by the block hash alone, not by
  ``(hash, group id)``.
- KV-cache events go to ``kv_event_listener`` as they happen (vLLM queues ``BlockStored`` /
  ``BlockRemoved`` events for the scheduler to publish).
- Block tables never hold the null block (no sliding window), so ``touch`` and ``free_blocks``
  need not skip it.
- Besides vLLM's methods the pool answers the questions the KV-cache manager asks of it (the
  longest cache hit, the evictable hit blocks, whether any hash is cached) and frees a whole
  block table (``free_table``), each one written with the primitives above.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator


class FreeKVCacheBlockQueue:
    """The free blocks in eviction order, head first (``vllm/v1/core/kv_cache_utils.py:
    FreeKVCacheBlockQueue``).

    The blocks never handed out, ``fresh .. num_gpu_blocks - 1``, are the one entry ``fresh``:
    popping it hands out block ``fresh`` (or a run of them) and puts the next one in its place.
    Block 0, the null block, is never in the queue (vLLM pops it when the pool starts:
    ``BlockPool.null_block``).

    Args:
        num_gpu_blocks: total blocks including the null block 0.

    Attributes:
        num_free_blocks: blocks in the queue.
        fresh: the lowest block id never handed out (``num_gpu_blocks``: none left).
    """

    def __init__(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.num_free_blocks = num_gpu_blocks - 1
        self.fresh = 1
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys([1])

    def popleft(self) -> int:
        """Pop the block at the head (``FreeKVCacheBlockQueue.popleft``)."""
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head, in queue order (``FreeKVCacheBlockQueue.popleft_n``).

        Never-used blocks at the head are handed out as one run of ids (as the compiled twin
        does). The caller checks that ``n`` blocks are free.

        Raises:
            TypeError: if ``n`` is not an int.
        """
        n = operator.index(n)
        ret: list[int] = []
        while len(ret) < n:
            block_id, _ = self._queue.popitem(last=False)
            if block_id != self.fresh:
                ret.append(block_id)
                continue
            run = min(n - len(ret), self.num_gpu_blocks - self.fresh)
            ret += range(self.fresh, self.fresh + run)
            self.fresh += run
            if self.fresh < self.num_gpu_blocks:  # the next never-used block stands for the rest
                self._queue[self.fresh] = None
                self._queue.move_to_end(self.fresh, last=False)
        self.num_free_blocks -= len(ret)
        return ret

    def remove(self, block_id: int) -> None:
        """Take a block out of the middle of the queue (``FreeKVCacheBlockQueue.remove``): a hit
        block, which carries a hash, so never a never-used block."""
        del self._queue[block_id]
        self.num_free_blocks -= 1

    def append_n(self, block_ids: list[int]) -> None:
        """Put blocks at the tail, the first of them first (``FreeKVCacheBlockQueue.append_n``)."""
        for block_id in block_ids:
            self._queue[block_id] = None
        self.num_free_blocks += len(block_ids)

    def prepend_n(self, block_ids: list[int]) -> None:
        """Put blocks at the head, the first of them becoming the head
        (``FreeKVCacheBlockQueue.prepend_n``)."""
        for block_id in reversed(block_ids):
            self._queue[block_id] = None
            self._queue.move_to_end(block_id, last=False)
        self.num_free_blocks += len(block_ids)

    def get_all_free_blocks(self) -> list[int]:
        """Block ids in queue order, head first (``FreeKVCacheBlockQueue.get_all_free_blocks``)."""
        out: list[int] = []
        for block_id in self._queue:
            if block_id == self.fresh:
                out.extend(range(self.fresh, self.num_gpu_blocks))
            else:
                out.append(block_id)
        return out


class BlockHashToBlockMap:
    """Prefix cache: block hash -> the blocks cached under it (``vllm/v1/core/block_pool.py:
    BlockHashToBlockMap``).

    vLLM does not merge identical blocks (block tables stay append-only), so one hash may name
    several blocks. As in vLLM, an entry is one block id, or a dict of block ids in
    registration order when there are several; a lookup returns the first.
    """

    def __init__(self) -> None:
        self._cache: dict[int, int | dict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._cache

    def __iter__(self) -> Iterator[int]:
        """The cached hashes."""
        return iter(self._cache)

    def get_one_block(self, block_hash: int) -> int | None:
        """A block cached under ``block_hash`` (the first registered), or None
        (``BlockHashToBlockMap.get_one_block``)."""
        blocks = self._cache.get(block_hash)
        if blocks is None or type(blocks) is int:
            return blocks
        return next(iter(blocks))

    def insert(self, block_hash: int, block_id: int) -> None:
        """Cache ``block_id`` under ``block_hash`` (``BlockHashToBlockMap.insert``)."""
        blocks = self._cache.get(block_hash)
        if blocks is None:
            self._cache[block_hash] = block_id
        elif type(blocks) is int:
            self._cache[block_hash] = {blocks: None, block_id: None}
        else:
            blocks[block_id] = None

    def pop(self, block_hash: int, block_id: int) -> bool:
        """Drop ``block_id`` from the blocks cached under ``block_hash``; False if it was not
        one of them (``BlockHashToBlockMap.pop``)."""
        blocks = self._cache.pop(block_hash, None)
        if blocks is None:
            return False
        if type(blocks) is int:
            if blocks == block_id:
                return True
            self._cache[block_hash] = blocks
            return False
        found = block_id in blocks
        if found:
            del blocks[block_id]
        if blocks:
            self._cache[block_hash] = blocks
        return found

    def clear(self) -> None:
        """Forget every cached hash (for :meth:`BlockPool.reset_prefix_cache`)."""
        self._cache.clear()


class BlockPool:
    """The blocks of one worker, their reference counts, hashes and the free queue
    (``vllm/v1/core/block_pool.py: BlockPool``).

    Args:
        num_gpu_blocks: total blocks including the null block 0, as vLLM reports it.
        enable_caching: keep hashes of freed blocks so they can be hit later.

    Attributes:
        ref_cnt: reference count per block id handed out so far (``KVCacheBlock.ref_cnt``; a
            block id at or above ``len(ref_cnt)`` was never used: 0 references). Block 0, the
            null block, keeps 1 and is never freed.
        free_block_queue: the free blocks, head (next to be reused) first.
        cached_block_hash_to_block: the prefix cache.
        num_evictions: cached blocks whose hash was dropped because the block was reused.
        kv_event_listener: None, or called as ``listener(stored, hashes)`` when hashes enter
            (True) or leave (False) the prefix cache: vLLM's BlockStored / BlockRemoved events.

    Raises:
        ValueError: if ``num_gpu_blocks < 2``.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is reserved), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [1]  # the null block
        self._block_hash: list[int | None] = [None]
        self.free_block_queue = FreeKVCacheBlockQueue(num_gpu_blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.num_evictions = 0
        self.kv_event_listener = None

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached (evictable) ones included
        (``BlockPool.get_num_free_blocks``)."""
        return self.free_block_queue.num_free_blocks

    def free_queue(self) -> list[int]:
        """Block ids in free-queue order, head (next to be reused) first. For tests and reports."""
        return self.free_block_queue.get_all_free_blocks()

    @property
    def block_hash(self) -> list[int | None]:
        """Hash per block id (None: not cached). For tests and reports."""
        return self._block_hash + [None] * (self.num_gpu_blocks - len(self._block_hash))

    @property
    def _cached(self) -> dict[int, int]:
        """The prefix cache as hash -> the block a lookup returns, a copy. For tests (the
        compiled twin has the same)."""
        get = self.cached_block_hash_to_block.get_one_block
        return {block_hash: get(block_hash) for block_hash in self.cached_block_hash_to_block}

    def usage(self) -> float:
        """KV usage as vLLM reports it: 1 - free / usable blocks, evictable counting as free
        (``BlockPool.get_usage``)."""
        return 1.0 - self.num_free_blocks / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: int) -> int | None:
        """The block holding ``block_hash``, or None; the first registered when several do
        (``BlockPool.get_cached_block``)."""
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def num_cached_blocks(self) -> int:
        """Distinct hashes currently in the prefix cache."""
        return len(self.cached_block_hash_to_block)

    def num_evictable(self, block_ids: Iterable[int]) -> int:
        """How many of ``block_ids`` (hit blocks) have no reference: they sit in the free queue,
        so taking them uses free capacity (``vllm/v1/core/single_type_kv_cache_manager.py:
        SingleTypeKVCacheManager._get_num_evictable_blocks``, for ``get_num_blocks_to_allocate``)."""
        ref_cnt = self.ref_cnt
        return sum(1 for block_id in block_ids if ref_cnt[block_id] == 0)

    def none_cached(self, block_hashes: Iterable[int]) -> bool:
        """True when no hash of ``block_hashes`` is in the prefix cache."""
        cached = self.cached_block_hash_to_block
        return not any(block_hash in cached for block_hash in block_hashes)

    def longest_cache_hit(self, block_hashes: list[int], max_num_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes``, at most ``max_num_blocks``
        (``vllm/v1/core/single_type_kv_cache_manager.py: FullAttentionManager.find_longest_cache_hit``).

        The walk stops at the first hash not cached, so a lost block 1 hides blocks 2 and 3 even
        if they are still cached.
        """
        hit: list[int] = []
        for block_hash in block_hashes[:max(max_num_blocks, 0)]:
            block_id = self.get_cached_block(block_hash)
            if block_id is None:
                break
            hit.append(block_id)
        return hit

    # -- actions -----------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cache entries
        (``BlockPool.get_new_blocks``).

        Returns:
            the block ids in queue order, each now with one reference.

        Raises:
            ValueError: if fewer blocks are free (callers check first, as vLLM's do).
        """
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} free blocks, only {self.num_free_blocks} free")
        ret = self.free_block_queue.popleft_n(num_blocks)
        new = self.free_block_queue.fresh - len(self.ref_cnt)
        if new > 0:  # blocks handed out for the first time: vLLM's KVCacheBlock(block_id)
            self.ref_cnt += [0] * new
            self._block_hash += [None] * new
        ref_cnt, block_hashes = self.ref_cnt, self._block_hash
        evicted: list[int] = []
        for block_id in ret:
            block_hash = block_hashes[block_id]
            if block_hash is not None and self._maybe_evict_cached_block(block_id):
                evicted.append(block_hash)
            ref_cnt[block_id] += 1
        if evicted and self.kv_event_listener is not None:
            self.kv_event_listener(False, evicted)  # one BlockRemoved per evicted block, in order
        return ret

    def _maybe_evict_cached_block(self, block_id: int) -> bool:
        """Drop a reused block's cache entry, if it has one (``BlockPool._maybe_evict_cached_block``).

        Returns:
            True if the block was cached.
        """
        block_hash = self._block_hash[block_id]
        if block_hash is None:
            return False
        self._block_hash[block_id] = None  # KVCacheBlock.reset_hash
        if not self.cached_block_hash_to_block.pop(block_hash, block_id):
            return False
        self.num_evictions += 1
        return True

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on hit blocks; one with no reference leaves the free queue
        (``BlockPool.touch``)."""
        ref_cnt = self.ref_cnt
        for block_id in block_ids:
            if ref_cnt[block_id] == 0:  # in the free queue: an eviction candidate
                self.free_block_queue.remove(block_id)
            ref_cnt[block_id] += 1

    def free_blocks(self, ordered_block_ids: Iterable[int],
                    hashes: Iterable[int | None] | None = None) -> None:
        """Drop one reference on each block, in eviction-priority order, first evicted first
        (``BlockPool.free_blocks``).

        Blocks reaching 0 references go to the tail if they carry a hash (FIFO reuse: the LRU)
        and to the head if they do not, or if caching is off (LIFO reuse). A block's hash is the
        pool's own; ``hashes``, when given, only pairs with the blocks as ``zip`` does (the
        compiled twin's signature).
        """
        if hashes is not None:
            ordered_block_ids = [block_id for block_id, _ in zip(ordered_block_ids, hashes)]
        ref_cnt, block_hash = self.ref_cnt, self._block_hash
        evict_first: list[int] = []
        evict_last: list[int] = []
        for block_id in ordered_block_ids:
            ref_cnt[block_id] -= 1
            if ref_cnt[block_id] == 0:
                if block_hash[block_id] is None or not self.enable_caching:
                    evict_first.append(block_id)
                else:
                    evict_last.append(block_id)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def free_table(self, blocks: list[int], block_hashes: list[int] | None = None,
                   num_hashed: int = 0) -> None:
        """Free a request's block table, last block first, so its suffix is evicted before its
        prefix (``vllm/v1/core/single_type_kv_cache_manager.py: SingleTypeKVCacheManager.free``).

        ``block_hashes`` and ``num_hashed`` (the table's hashes; its first ``num_hashed`` blocks
        carry them) are the compiled twin's signature; a block's hash is the pool's own.
        """
        self.free_blocks(reversed(blocks))

    def cache_full_blocks(self, block_ids: list[int], block_hashes: list[int], start: int, end: int) -> None:
        """Register blocks ``start .. end - 1`` of a request under their hashes
        (``BlockPool.cache_full_blocks``).

        Called when the blocks are scheduled full, before their compute finishes. Identical
        blocks are not merged. The pairs are ``zip(block_ids[start:end], block_hashes[start:end])``.
        """
        if not self.enable_caching or end <= start:
            return
        new_hashes = block_hashes[start:end]
        cached = self.cached_block_hash_to_block
        for block_id, block_hash in zip(block_ids[start:end], new_hashes):
            self._block_hash[block_id] = block_hash
            cached.insert(block_hash, block_id)
        if self.kv_event_listener is not None:
            self.kv_event_listener(True, new_hashes)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is in use (``BlockPool.reset_prefix_cache``).
        The free queue keeps its order.

        Returns:
            False, changing nothing, when some request still holds blocks.
        """
        if self.num_free_blocks != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        self._block_hash = [None] * len(self._block_hash)
        return True
