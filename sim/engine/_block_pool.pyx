# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""vLLM v1's KV block pool with prefix caching, compiled: the same public API and the same
results as the pure-Python ``kvroute.sim.engine.block_pool.BlockPool`` (the reference and fallback;
``kvroute.sim.engine.compiled`` chooses between them), with C-level state.

Mirrors ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and
``vllm/v1/core/kv_cache_utils.py: FreeKVCacheBlockQueue``:

- one C struct per block id (``Block``): vLLM's ``KVCacheBlock.ref_cnt`` and ``block_hash``
  (a hash and a has-hash flag) and the ``prev`` / ``next`` links of the free queue;
- the free queue is vLLM's doubly linked list over those links, with O(1) pop from the head
  (``popleft``), append at the tail (``append``), push at the head (``prepend_n``) and removal
  from the middle (``remove``); block 0, the null block, never in the queue, is its fake head
  and tail;
- the prefix cache maps a hash to the first block registered under it (what a lookup returns),
  in an open-addressing table (``_prefix_map.pxd``); identical blocks computed twice are kept,
  as vLLM keeps them, the later ones in registration order in a C++
  ``unordered_map<int64, vector<int32>>`` (rare: only blocks computed twice).

Never-used blocks: the queue starts as every block in id order. Blocks ``_fresh .. N - 1`` have
never been handed out; only block ``_fresh`` is linked into the queue, standing for the whole
run of them (popping it links ``_fresh + 1`` in its place), so the block array grows with the
blocks a run uses, not with the KV capacity (``PyMem_*`` memory, seen by ``tracemalloc``).

Batch operations (``pop_blocks``, ``register_blocks``, ``release_reversed``, ``take_hits``: the
C API the compiled KV-cache manager calls through ``_block_pool.pxd``, block ids as C ints; the
Python methods are built on them) first prefetch the index slots and blocks they will touch,
then change the state in the order of the one-block-at-a-time loop, so their results are that
loop's; a head made of never-used blocks is handed out as one run of ids.

Hashes are signed 64-bit ints (``content.block_hashes`` makes every key fit). A request's hashes
may be a list of ints or an ``array("q")`` (the compiled ``_content.block_hashes``), whose items
are read as C int64s where the pool reads a run of them (``register_blocks``,
``longest_cache_hit``), without a Python object per key. Registering one
outside that range raises OverflowError, a non-int one TypeError, where the Python pool would
store it; lookups of such values find nothing, as in the Python pool. Block ids must be ids the
pool handed out (IndexError otherwise, with nothing changed: the C state is never read or
written out of range; the Python pool's lists would wrap a negative id).
"""

from cython.operator cimport dereference as deref
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memset
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from kvroute.sim.engine._prefix_map cimport (EMPTY, HUGE_PAGE, MIN_CAPACITY, map_clear, map_create, map_erase, map_free,
                                      map_huge, track_huge, unmap_huge,
                                      map_get, map_prefetch, map_replace, map_setdefault, prefetch)


cdef class BlockPool:
    """The blocks of one worker, their reference counts, hashes and the free queue.

    Args:
        num_gpu_blocks: total blocks including the null block 0, as vLLM reports it.
        enable_caching: keep hashes of freed blocks so they can be hit later.

    Attributes:
        num_gpu_blocks: as given.
        enable_caching: as given.
        num_evictions: cached blocks whose hash was dropped because the block was reused.
        kv_event_listener: None, or called as ``listener(stored, hashes)`` when hashes enter
            (True) or leave (False) the prefix cache, after the change: vLLM's BlockStored /
            BlockRemoved KV events.

    Raises:
        ValueError: if ``num_gpu_blocks < 2``.
        OverflowError: if ``num_gpu_blocks`` does not fit a 32-bit block id.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is reserved), got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = bool(enable_caching)
        self.num_evictions = 0
        self.kv_event_listener = None
        self._map_blocks()
        self._grow(min(<int32_t>MIN_CAPACITY, self.num_gpu_blocks))
        map_create(&self._cached_map, self.num_gpu_blocks - 1)  # block 0 is never cached
        self._blocks[0].ref_cnt = 1  # the null block is never freed
        self._fresh = 1  # the queue: fake head/tail 0 <-> block 1, standing for 1 .. N - 1
        self._link_fresh(0, 0)
        self._num_free = self.num_gpu_blocks - 1

    def __dealloc__(self):
        if self._blocks_mapped:
            unmap_huge(self._blocks, self._blocks_mapped)
        else:
            PyMem_Free(self._blocks)
        map_free(&self._cached_map)

    # -- C-level state -----------------------------------------------------------------------

    cdef void _map_blocks(self) noexcept:
        """Reserve the block array for every block id at once when that is 1 MB or more: a
        mapping of its own in whole 2 MB pages, advised to use transparent huge pages
        (``map_huge``), which the kernel zeroes and commits as ids are first handed out, in id
        order. ``_grow`` then only moves ``_capacity``: no ``PyMem_Realloc`` copy and no page
        fault per 4 KB page (on the first 1,000 Mooncake requests with 66,534-block pools the
        doublings were about a quarter of the process's page faults). ``tracemalloc`` is told
        the bytes of the ids handed out (``_capacity`` of them), not the reservation. Leaves
        ``_blocks`` NULL where that is unavailable."""
        cdef size_t size = <size_t>self.num_gpu_blocks * sizeof(Block)
        if size < HUGE_PAGE // 2:
            return
        cdef Block* p = <Block*>map_huge(size)
        if p != NULL:
            self._blocks = p
            self._blocks_mapped = size

    cdef int _grow(self, int32_t capacity) except -1:
        """Make the block array hold ``capacity`` ids, new entries zeroed."""
        cdef int32_t old = self._capacity
        if capacity <= old:
            return 0
        if self._blocks_mapped:  # reserved whole and zeroed (_map_blocks)
            self._capacity = capacity
            track_huge(self._blocks, <size_t>capacity * sizeof(Block))
            return 0
        cdef Block* p = <Block*>PyMem_Realloc(self._blocks, capacity * sizeof(Block))
        if p == NULL:
            raise MemoryError()
        memset(p + old, 0, (capacity - old) * sizeof(Block))
        self._blocks = p
        self._capacity = capacity
        return 0

    cdef int _link_fresh(self, int32_t prev, int32_t nxt) except -1:
        """Link block ``_fresh`` (the never-used run's stand-in) between ``prev`` and ``nxt``."""
        cdef int32_t b = self._fresh
        if b >= self._capacity:
            self._grow(min(2 * self._capacity, self.num_gpu_blocks))
        cdef Block* blocks = self._blocks
        blocks[b].prev = prev
        blocks[b].next = nxt
        blocks[prev].next = b
        blocks[nxt].prev = b
        return 0

    cdef int _check_id(self, long long bid) except -1:
        if bid < 0 or bid >= self._fresh:
            raise IndexError(f"block id {bid} was never handed out by this pool")
        return 0

    cdef int32_t _popleft(self) except -1:
        """``FreeKVCacheBlockQueue.popleft`` (the caller checks the queue is not empty)."""
        cdef Block* blocks = self._blocks
        cdef int32_t b = blocks[0].next
        cdef int32_t nxt = blocks[b].next
        self._num_free -= 1
        if b == self._fresh:  # the first never-used block: the next one takes its place
            self._fresh = b + 1
            if self._fresh < self.num_gpu_blocks:
                self._link_fresh(0, nxt)
                return b
        blocks[0].next = nxt
        blocks[nxt].prev = 0
        return b

    cdef Py_ssize_t _pop_fresh_run(self, Py_ssize_t num_blocks, vector[int32_t]& out) except -1:
        """``popleft`` repeated while the head is the never-used run: up to ``num_blocks`` of its
        blocks at once, in id order (the caller checks the head is block ``_fresh``)."""
        cdef int32_t first = self._fresh
        cdef int32_t nxt = self._blocks[first].next
        cdef int32_t stop = <int32_t>min(<Py_ssize_t>first + num_blocks, <Py_ssize_t>self.num_gpu_blocks)
        cdef int32_t capacity = self._capacity
        cdef int32_t b
        while capacity <= stop and capacity < self.num_gpu_blocks:
            capacity = min(2 * capacity, self.num_gpu_blocks)
        self._grow(capacity)
        for b in range(first, stop):
            self._blocks[b].ref_cnt = 1  # never used: no hash, no links to undo
            out.push_back(b)
        self._fresh = stop
        self._num_free -= stop - first
        if stop < self.num_gpu_blocks:
            self._link_fresh(0, nxt)
        else:
            self._blocks[0].next = nxt
            self._blocks[nxt].prev = 0
        return stop - first

    cdef void _remove(self, int32_t b) noexcept:
        """``FreeKVCacheBlockQueue.remove``: take a used block out of the middle."""
        cdef Block* blocks = self._blocks
        cdef int32_t p = blocks[b].prev
        cdef int32_t n = blocks[b].next
        blocks[p].next = n
        blocks[n].prev = p
        self._num_free -= 1

    cdef void _append(self, int32_t b) noexcept:
        """``FreeKVCacheBlockQueue.append``: put a block at the tail."""
        cdef Block* blocks = self._blocks
        cdef int32_t last = blocks[0].prev
        blocks[last].next = b
        blocks[b].prev = last
        blocks[b].next = 0
        blocks[0].prev = b
        self._num_free += 1

    cdef void _prepend_n(self, vector[int32_t]& ids) noexcept:
        """``FreeKVCacheBlockQueue.prepend_n``: put ``ids`` at the head, the first one first."""
        if ids.size() == 0:
            return
        cdef Block* blocks = self._blocks
        cdef int32_t first = blocks[0].next
        cdef int32_t prev = 0
        cdef int32_t b
        for b in ids:
            blocks[b].prev = prev
            blocks[prev].next = b
            prev = b
        blocks[prev].next = first
        blocks[first].prev = prev
        self._num_free += <int32_t>ids.size()

    cdef void _release(self, int32_t b, vector[int32_t]& evict_first) noexcept:
        """Drop one reference; at 0 a hashed block goes to the tail, another one is kept for the
        head (``BlockPool.free_blocks``)."""
        cdef Block* blk = &self._blocks[b]
        blk.ref_cnt -= 1
        if blk.ref_cnt == 0:
            if blk.has_hash:
                self._append(b)
            else:
                evict_first.push_back(b)

    cdef int _register(self, int32_t b, int64_t h) except -1:
        """``BlockHashToBlockMap.insert``: a second block under a cached hash is kept as a
        duplicate; a lookup keeps returning the first."""
        cdef int32_t first = map_setdefault(&self._cached_map, h, b)
        if first != b:
            self._dups[h].push_back(b)
        self._blocks[b].block_hash = h
        self._blocks[b].has_hash = 1
        return 0

    cdef void _evict(self, int32_t b) noexcept:
        """``BlockPool._maybe_evict_cached_block`` for a block that carries a hash: the next
        duplicate, if any, takes its place in the index."""
        cdef int64_t h = self._blocks[b].block_hash
        cdef unordered_map[int64_t, vector[int32_t]].iterator it
        cdef vector[int32_t]* others
        cdef size_t i
        self._blocks[b].has_hash = 0
        if self._dups.empty():
            map_erase(&self._cached_map, h)
            return
        it = self._dups.find(h)
        if it == self._dups.end():
            map_erase(&self._cached_map, h)
            return
        others = &deref(it).second
        if map_get(&self._cached_map, h) == b:
            map_replace(&self._cached_map, h, deref(others)[0])
            others.erase(others.begin())
        else:
            for i in range(others.size()):
                if deref(others)[i] == b:
                    others.erase(others.begin() + i)
                    break
        if others.empty():
            self._dups.erase(it)

    cdef int32_t _lookup(self, object h) noexcept:
        """The block cached under ``h``, or EMPTY (also for a value that is not an int64)."""
        cdef int overflow = 0
        cdef long long key
        if not PyLong_Check(h):
            return EMPTY
        key = PyLong_AsLongLongAndOverflow(h, &overflow)
        if overflow:
            return EMPTY
        return map_get(&self._cached_map, key)

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached (evictable) ones included."""
        return self._num_free

    @property
    def ref_cnt(self) -> list[int]:
        """Reference count per block id handed out so far, a copy (an id at or above its length
        was never used: 0 references). For tests and reports."""
        cdef int32_t i
        return [self._blocks[i].ref_cnt for i in range(self._fresh)]

    @property
    def block_hash(self) -> list[int | None]:
        """Hash per block id (None: not cached). For tests and reports."""
        out: list = [None] * self.num_gpu_blocks
        cdef int32_t i
        for i in range(self._fresh):
            if self._blocks[i].has_hash:
                out[i] = self._blocks[i].block_hash
        return out

    @property
    def _shared(self) -> set[int]:
        """Blocks with 2 or more references (the Python pool keeps this set; here it is read
        off the reference counts). For tests."""
        cdef int32_t i
        return {i for i in range(1, self._fresh) if self._blocks[i].ref_cnt >= 2}

    @property
    def _cached(self) -> dict[int, int]:
        """The prefix index, hash -> the first block registered under it (the Python pool's
        attribute; here a copy read off the C table). For tests."""
        cdef Py_ssize_t i
        out = {}
        for i in range(<Py_ssize_t>self._cached_map.mask + 1):
            if self._cached_map.slots[i].value != EMPTY:
                out[self._cached_map.slots[i].key] = self._cached_map.slots[i].value
        return out

    def free_queue(self) -> list[int]:
        """Block ids in free-queue order, head (next to be reused) first. For tests and reports."""
        out = []
        cdef int32_t b = self._blocks[0].next
        while b != 0:
            if b == self._fresh:
                out.extend(range(b, self.num_gpu_blocks))
            else:
                out.append(b)
            b = self._blocks[b].next
        return out

    def usage(self) -> float:
        """KV usage as vLLM reports it: 1 - free / usable blocks (evictable counts as free)."""
        return 1.0 - self._num_free / <double>(self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash) -> int | None:
        """The block holding ``block_hash``, or None (the first registered when several do)."""
        cdef int32_t b = self._lookup(block_hash)
        return None if b == EMPTY else b

    def num_cached_blocks(self) -> int:
        """Distinct hashes currently in the prefix cache."""
        return self._cached_map.size

    def num_evictable(self, block_ids) -> int:
        """How many of ``block_ids`` (hit blocks) have no reference: they sit in the free queue,
        so taking them uses free capacity (``get_num_blocks_to_allocate``'s evictable blocks).

        Raises:
            IndexError: for an id the pool never handed out.
        """
        cdef long long bid
        cdef Py_ssize_t n = 0
        for bid in block_ids:
            self._check_id(bid)
            if self._blocks[bid].ref_cnt == 0:
                n += 1
        return n

    def none_cached(self, block_hashes) -> bool:
        """True when no hash of ``block_hashes`` is in the prefix cache."""
        if self._cached_map.size == 0:
            return True
        for h in block_hashes:
            if self._lookup(h) != EMPTY:
                return False
        return True

    def longest_cache_hit(self, block_hashes, max_num_blocks) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes``, at most ``max_num_blocks``.

        The walk stops at the first hash not cached (``find_longest_cache_hit`` for full
        attention), so a lost block 1 hides blocks 2 and 3 even if they are still cached.
        """
        cdef Py_ssize_t n = min(max_num_blocks, len(block_hashes))
        cdef Py_ssize_t i
        cdef int32_t b
        hit = []
        if n <= 0 or self._cached_map.size == 0:
            return hit
        cdef const int64_t* keys = int64_items(block_hashes)
        if keys != NULL:
            for i in range(n):
                b = map_get(&self._cached_map, keys[i])
                if b == EMPTY:
                    break
                hit.append(b)
            return hit
        cdef list hashes = block_hashes if type(block_hashes) is list else list(block_hashes)
        for i in range(n):
            b = self._lookup(hashes[i])
            if b == EMPTY:
                break
            hit.append(b)
        return hit

    # -- the C API (block ids as C ints, for the compiled KV-cache manager) --------------------

    cdef int pop_blocks(self, Py_ssize_t num_blocks, vector[int32_t]& out) except -1:
        """``get_new_blocks``, appending the ids to ``out``.

        Two passes: pop every block (prefetching the index slot of each cached one), then evict
        and take them in the same order; the result is that of one pass, and the index's memory
        latencies overlap instead of adding up.
        """
        if num_blocks > self._num_free:
            raise ValueError(f"cannot get {num_blocks} free blocks, only {self._num_free} free")
        cdef Py_ssize_t k, first = out.size()
        cdef int32_t b
        cdef Block* blk
        cdef long long evicted = 0
        cdef bint events = self.kv_event_listener is not None
        removed = [] if events else None
        k = 0
        while k < num_blocks:
            if self._blocks[0].next == self._fresh:  # never-used blocks: a run of ids at once
                k += self._pop_fresh_run(num_blocks - k, out)
                continue
            b = self._popleft()
            out.push_back(b)
            blk = &self._blocks[b]
            if blk.has_hash:
                map_prefetch(&self._cached_map, blk.block_hash)
            k += 1
        for k in range(first, first + num_blocks):
            b = out[k]
            blk = &self._blocks[b]
            if blk.has_hash:
                if events:
                    removed.append(blk.block_hash)
                self._evict(b)
                evicted += 1
            blk.ref_cnt = 1
        if evicted:
            self.num_evictions += evicted
            if events:
                self.kv_event_listener(False, removed)  # one BlockRemoved per evicted block, in order
        return 0

    cdef int register_blocks(self, const int32_t* ids, object hashes, Py_ssize_t start,
                             Py_ssize_t end) except -1:
        """``cache_full_blocks`` for table ids ``ids[start:end]``, ``hashes[start:end]`` (a list
        or an ``array("q")``, at least ``end`` long); each hash is checked before anything
        changes, and every index slot and block is prefetched before the first is written."""
        if not self.enable_caching or end <= start:
            return 0
        cdef Py_ssize_t i
        cdef vector[int64_t] copied
        cdef const int64_t* values = int64_items(hashes)
        cdef list keys
        if values != NULL:
            values += start
        else:
            keys = hashes
            copied.reserve(end - start)
            for i in range(start, end):
                copied.push_back(keys[i])
            values = copied.data()
        for i in range(start, end):
            map_prefetch(&self._cached_map, values[i - start])
            prefetch(&self._blocks[ids[i]])
        for i in range(start, end):
            self._register(ids[i], values[i - start])
        if self.kv_event_listener is not None:
            self.kv_event_listener(True, hashes[start:end])
        return 0

    cdef int release_reversed(self, const int32_t* ids, Py_ssize_t n) except -1:
        """``free_table`` for the table ``ids[:n]``: one reference less on each, last first
        (every block prefetched first)."""
        cdef vector[int32_t] evict_first
        cdef Py_ssize_t i
        for i in range(n):
            prefetch(&self._blocks[ids[i]])
        for i in range(n - 1, -1, -1):
            self._release(ids[i], evict_first)
        self._prepend_n(evict_first)
        return 0

    cdef int take_hits(self, const int32_t* ids, Py_ssize_t n) except -1:
        """``touch`` for ``ids[:n]``."""
        cdef Py_ssize_t i
        cdef int32_t b
        for i in range(n):
            b = ids[i]
            if self._blocks[b].ref_cnt == 0:
                self._remove(b)
            self._blocks[b].ref_cnt += 1
        return 0

    cdef bint any_cached(self, const int64_t* keys, Py_ssize_t n) noexcept:
        """Whether any of ``keys[:n]`` is in the prefix cache (``not none_cached``)."""
        cdef Py_ssize_t i
        if self._cached_map.size == 0:
            return False
        for i in range(n):
            map_prefetch(&self._cached_map, keys[i])
        for i in range(n):
            if map_get(&self._cached_map, keys[i]) != EMPTY:
                return True
        return False

    cdef int _ids(self, object block_ids, vector[int32_t]& out) except -1:
        """Append ``block_ids`` (any iterable of ints) to ``out``, each checked first."""
        cdef long long bid
        for bid in block_ids:
            self._check_id(bid)
            out.push_back(<int32_t>bid)
        return 0

    # -- actions -----------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks) -> list[int]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cache entries.

        Returns:
            the block ids in queue order, each now with one reference.

        Raises:
            ValueError: if fewer blocks are free (callers check first, as vLLM's do).
        """
        if num_blocks > self._num_free:
            raise ValueError(f"cannot get {num_blocks} free blocks, only {self._num_free} free")
        cdef Py_ssize_t n = num_blocks
        cdef vector[int32_t] out
        if n > 0:
            self.pop_blocks(n, out)
        return [b for b in out]

    def touch(self, block_ids) -> None:
        """Take a reference on hit blocks; one with no reference leaves the free queue.

        Raises:
            IndexError: for an id the pool never handed out (nothing is changed).
        """
        cdef vector[int32_t] ids
        self._ids(block_ids, ids)
        self.take_hits(ids.data(), ids.size())

    def free_blocks(self, ordered_block_ids, hashes) -> None:
        """Drop one reference on each block, in eviction-priority order (first evicted first);
        ``hashes`` gives each block's hash, None for a block not cached.

        Blocks reaching 0 references go to the tail if they carry a hash, to the head if not
        (``BlockPool.free_blocks``: FIFO reuse for cached blocks, LIFO for the others). Pairs
        are taken as ``zip`` takes them; this pool reads each block's hash from its own state
        (the one it was registered under), which is ``hashes``' for every consistent caller.

        Raises:
            IndexError: for an id the pool never handed out (nothing is changed).
        """
        cdef vector[int32_t] ids
        self._ids([bid for bid, _ in zip(ordered_block_ids, hashes)], ids)
        cdef vector[int32_t] evict_first
        cdef int32_t b
        for b in ids:
            self._release(b, evict_first)
        self._prepend_n(evict_first)

    def free_table(self, blocks, block_hashes, num_hashed) -> None:
        """``free_blocks(reversed(blocks), ...)`` for a request's block table whose first
        ``num_hashed`` blocks, and only those, carry a hash, block ``i`` the hash
        ``block_hashes[i]`` (hits and registered full blocks form a prefix of every table).

        This pool reads each block's hash from its own state, so ``block_hashes`` and
        ``num_hashed``, which the Python pool needs, are not read.

        Raises:
            IndexError: for an id the pool never handed out (nothing is changed).
        """
        cdef vector[int32_t] ids
        self._ids(blocks, ids)
        self.release_reversed(ids.data(), ids.size())

    def cache_full_blocks(self, block_ids, block_hashes, start, end) -> None:
        """Register blocks ``start .. end - 1`` of a request under their hashes.

        Called when the blocks are scheduled full, before their compute finishes
        (``BlockPool.cache_full_blocks``). Identical blocks are not merged. The pairs are
        ``zip(block_ids[start:end], block_hashes[start:end])``.

        Raises:
            IndexError: for an id the pool never handed out; OverflowError or TypeError for a
                hash that is not a signed 64-bit int (nothing is changed in either case).
        """
        if not self.enable_caching or end <= start:
            return
        cdef vector[int32_t] ids
        hashes = list(block_hashes[start:end])
        self._ids(block_ids[start:end][:len(hashes)], ids)
        cdef Py_ssize_t n = ids.size()
        cdef Py_ssize_t i
        cdef int64_t h
        for i in range(n):
            h = hashes[i]
        for i in range(n):
            self._register(ids[i], <int64_t>hashes[i])
        if self.kv_event_listener is not None:
            self.kv_event_listener(True, block_hashes[start:end])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is in use (vLLM's ``reset_prefix_cache``).

        Returns:
            False, changing nothing, when some request still holds blocks.
        """
        if self._num_free != self.num_gpu_blocks - 1:
            return False
        map_clear(&self._cached_map)
        self._dups.clear()
        cdef int32_t b, prev, nxt
        for b in range(self._fresh):
            self._blocks[b].has_hash = 0
        # as in vLLM's pool: every block now counts as handed out (0 references, in the queue
        # in the same order), so the never-used run is linked in block by block
        if self._fresh < self.num_gpu_blocks:
            self._grow(self.num_gpu_blocks)
            prev = self._blocks[self._fresh].prev
            nxt = self._blocks[self._fresh].next
            for b in range(self._fresh, self.num_gpu_blocks):
                self._blocks[b].prev = prev
                self._blocks[prev].next = b
                prev = b
            self._blocks[prev].next = nxt
            self._blocks[nxt].prev = prev
            self._fresh = self.num_gpu_blocks
        return True
