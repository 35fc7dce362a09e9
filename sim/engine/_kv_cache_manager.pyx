# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
# distutils: language = c++
"""Per-request KV block tables over the compiled BlockPool, compiled: the same public API and
the same results as the pure-Python ``kvroute.sim.engine.kv_cache_manager.KVCacheManager`` (the
reference and fallback; ``kvroute.sim.engine.compiled`` chooses between them).

Mirrors ``vllm/v1/core/kv_cache_manager.py`` and ``single_type_kv_cache_manager.py`` for one
full-attention group. A table is a C++ vector of block ids per request id, with its count of
registered blocks (vLLM's ``req_to_blocks`` and ``num_cached_block``): block ids move between
the pool and the tables as C ints (``_block_pool.pxd``), so the millions of blocks a Mooncake
run allocates, registers and frees never become Python objects. Integer division follows
Python's rules (``cdivision=False``), as the Python manager's does.

Requests are read through their attributes (``request_id``, ``num_computed_tokens``,
``num_prompt_tokens``, ``num_output_tokens``, ``num_tokens``, ``block_hashes``: a list of ints
or an ``array("q")``, whose int64s the pool reads directly), as the Python manager reads them;
request ids must be ints (64-bit: TypeError or OverflowError otherwise), as every caller's are.
NOTE: the pool's KV-event listener is called from inside these methods;
it must not call back into this manager.
"""

from cpython.array cimport array
from cython.operator cimport dereference as deref
from libc.stdint cimport int32_t, int64_t
from libcpp.algorithm cimport adjacent_find, sort
from libcpp.vector cimport vector

from kvroute.sim.engine._block_pool cimport BlockPool, int64_items
from kvroute.sim.engine._request cimport Request
from kvroute.sim.engine.kv_cache_manager import PrefixCacheStats


cdef inline Py_ssize_t ceil_div(Py_ssize_t a, Py_ssize_t b):
    return -((-a) // b)


cdef class KVCacheManager:
    """Block tables of the requests of one worker.

    Args:
        pool: the worker's compiled BlockPool.
        block_size: tokens per block.
        max_model_len: longest sequence; slots are never allocated past it.

    Attributes:
        pool, block_size, max_model_len: as given.
        stats: prefix-cache counters (tokens).

    Raises:
        TypeError: if ``pool`` is not the compiled BlockPool.
    """

    # NOTE: the attributes and C methods are declared in _kv_cache_manager.pxd.

    def __init__(self, BlockPool pool not None, block_size: int, max_model_len: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.stats = PrefixCacheStats()

    # -- C-level steps ------------------------------------------------------------------------

    cdef Table* _table(self, object request) except? NULL:
        """The request's table, or NULL when it holds none."""
        return self._table_of(request.request_id)

    cdef Table* _table_of(self, int64_t rid) noexcept:
        """The table of request id ``rid``, or NULL when it holds none."""
        it = self._tables.find(rid)
        if it == self._tables.end():
            return NULL
        return &(deref(it).second)

    cdef int _cache(self, Table* table, object request, Py_ssize_t num_full) except -1:
        """Register the table's blocks up to ``num_full`` (``cache_full_blocks``; the count of
        registered blocks advances even with caching off, as in the Python manager)."""
        cdef Py_ssize_t start = table.num_cached
        cdef object hashes
        cdef Py_ssize_t end
        if num_full > start:
            hashes = request.block_hashes
            if type(hashes) is not list and type(hashes) is not array:
                hashes = list(hashes)
            end = min(num_full, len(hashes), <Py_ssize_t>table.blocks.size())  # zip's length
            if end > start:
                self.pool.register_blocks(table.blocks.data(), hashes, start, end)
            table.num_cached = num_full
        return 0

    # -- the Python manager's API ----------------------------------------------------------

    def get_computed_blocks(self, request):
        """Look up the longest cached prefix of a request that has no computed tokens.

        The hit is capped at ``request.num_tokens - 1`` tokens, so at least one token is always
        computed and a fully cached, block-aligned prompt recomputes its last block.

        Returns:
            ``(hit block ids, hit tokens)``; nothing is taken until ``allocate_slots``, and the
            scheduler counts the lookup in ``stats`` only once the request is admitted.
        """
        if not self.pool.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit = self.pool.longest_cache_hit(request.block_hashes, max_blocks)
        return hit, len(hit) * self.block_size

    def can_allocate(self, request, num_new_tokens, new_computed_blocks=(), full_sequence=False) -> bool:
        """Whether ``allocate_slots`` with the same arguments would succeed.

        Blocks needed = ceil(tokens needing a slot / block_size) - blocks already held - hit
        blocks, plus every hit block with no reference (it sits in the free queue, so taking it
        uses free capacity). With ``full_sequence`` (admission, vLLM's default
        ``scheduler_reserve_full_isl``) the whole current sequence must fit, not only this chunk.
        """
        cdef Table* table = self._table(request)
        cdef Py_ssize_t num_held = table.blocks.size() if table != NULL else 0
        cdef Py_ssize_t num_hits = len(new_computed_blocks)
        cdef Py_ssize_t num_evictable = self.pool.num_evictable(new_computed_blocks) if num_hits else 0
        cdef Py_ssize_t num_local = num_held + num_hits
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t num_computed = request.num_computed_tokens + num_hits * bs
        cdef Py_ssize_t free = self.pool._num_free
        cdef Py_ssize_t full, slots, need
        if full_sequence:
            full = min(<Py_ssize_t>request.num_tokens, self.max_model_len)
            need = max(ceil_div(full, bs) - num_local, 0) + num_evictable
            if need > free:
                return False
        slots = min(num_computed + <Py_ssize_t>num_new_tokens, self.max_model_len)
        need = max(ceil_div(slots, bs) - num_local, 0) + num_evictable
        return need <= free

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=(), full_sequence=False) -> bool:
        """Give ``request`` the blocks for its hit and its next ``num_new_tokens`` tokens.

        On success the hit blocks are touched and appended, new blocks are popped from the head
        of the free queue, and every block that becomes full with the scheduled tokens is
        registered in the prefix cache now (vLLM caches at schedule time).

        Returns:
            False, changing nothing, when the blocks do not fit (see ``can_allocate``).
        """
        cdef Table* table = self._table(request)
        cdef Py_ssize_t num_new = num_new_tokens
        if table != NULL and not new_computed_blocks and not full_sequence:
            return self._extend_running(table, request, request.num_computed_tokens,
                                        request.num_prompt_tokens + request.num_output_tokens, num_new)
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks, full_sequence):
            return False
        cdef int64_t rid
        if table == NULL:
            rid = request.request_id
            table = &(self._tables[rid])  # a new, empty table
            table.num_cached = 0
        cdef vector[int32_t] hits
        cdef Py_ssize_t bs = self.block_size
        if new_computed_blocks:
            self.pool._ids(new_computed_blocks, hits)
            self.pool.take_hits(hits.data(), hits.size())
            table.blocks.insert(table.blocks.end(), hits.begin(), hits.end())
            table.num_cached = table.blocks.size()
        cdef Py_ssize_t num_computed = request.num_computed_tokens + <Py_ssize_t>hits.size() * bs
        cdef Py_ssize_t slots = min(num_computed + num_new, self.max_model_len)
        cdef Py_ssize_t need = ceil_div(slots, bs) - <Py_ssize_t>table.blocks.size()
        if need > 0:
            self.pool.pop_blocks(need, table.blocks)
        cdef Py_ssize_t num_full = min(num_computed + num_new, <Py_ssize_t>request.num_tokens) // bs
        self._cache(table, request, num_full)
        return True

    cdef bint extend_running(self, Request request, Py_ssize_t num_new) except -1:
        """``allocate_slots(request, num_new)`` for the compiled scheduler's running pass, with
        the compiled Request's counters read as C integers."""
        cdef Table* table = self._table_of(request.request_id)
        if table == NULL:
            return self.allocate_slots(request, num_new)
        return self._extend_running(table, request, request.num_computed_tokens,
                                    request.num_prompt_tokens + request.num_output_tokens, num_new)

    cdef bint _extend_running(self, Table* table, object request, Py_ssize_t num_computed, Py_ssize_t num_tokens,
                              Py_ssize_t num_new) except -1:
        # Hot path of every step: a running request (no prefix lookup, no admission check)
        # takes the same decision as ``can_allocate`` with nothing hit. ``num_computed`` and
        # ``num_tokens`` are the request's ``num_computed_tokens`` and ``num_tokens``.
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t end = num_computed + num_new
        cdef Py_ssize_t slots = end if end < self.max_model_len else self.max_model_len
        cdef Py_ssize_t need = ceil_div(slots, bs) - <Py_ssize_t>table.blocks.size()
        if need > 0:
            if need > self.pool._num_free:
                return False
            self.pool.pop_blocks(need, table.blocks)
        self._cache(table, request, (end if end < num_tokens else num_tokens) // bs)
        return True

    def free(self, request) -> None:
        """Release a finished or preempted request's blocks, last block first."""
        cdef int64_t rid = request.request_id
        it = self._tables.find(rid)
        if it == self._tables.end():
            return
        cdef Table* table = &(self._tables[rid])
        if table.blocks.size():
            self.pool.release_reversed(table.blocks.data(), table.blocks.size())
        self._tables.erase(rid)

    def get_block_ids(self, request) -> list[int]:
        """The request's block table (a copy)."""
        cdef Table* table = self._table(request)
        if table == NULL:
            return []
        return [b for b in table.blocks]

    # -- steps of a decode run (``kvroute.sim.engine.fast_forward``) ----------------------------

    def allocate_new_blocks(self, request, num_blocks) -> None:
        """Append ``num_blocks`` blocks popped from the free queue to the request's table
        (``SingleTypeKVCacheManager.allocate_new_blocks``); the caller checks they are free.

        Raises:
            KeyError: if the request holds no table.
        """
        cdef Table* table = self._existing(request)
        self.pool.pop_blocks(num_blocks, table.blocks)

    def append_blocks(self, request, block_ids) -> None:
        """Append blocks the caller took from the pool (``get_new_blocks``) to the request's table.

        Raises:
            KeyError: if the request holds no table.
        """
        cdef Table* table = self._existing(request)
        self.pool._ids(block_ids, table.blocks)

    def cache_blocks(self, request, num_full_blocks) -> None:
        """Register the request's blocks up to ``num_full_blocks`` in the prefix cache
        (``SingleTypeKVCacheManager.cache_blocks``); nothing when they already are.

        Raises:
            KeyError: if the request holds no table.
        """
        self._cache(self._existing(request), request, num_full_blocks)

    def allocate_decode_run(self, requests, Py_ssize_t num_steps) -> bool:
        """The block tables after ``num_steps`` decode steps of ``requests`` (running order; each
        computes one token per step after its ``num_computed_tokens``, which the caller
        advances), with one allocation for the whole run and one registration per request,
        when that is provably the same as stepping (see the Python manager's method): the
        blocks opened are popped in (step, running position) order, and the hashes of the
        blocks filled are distinct and not cached. The caller checks the free queue covers it.

        Returns:
            False, changing nothing, when the hashes do not allow it.

        Raises:
            KeyError: if a request holds no table.
        """
        cdef Py_ssize_t num_reqs = len(requests)
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t pos = 0, c, j, start, end, stop, k
        cdef vector[Table*] tables
        cdef vector[Py_ssize_t] ends
        cdef vector[int64_t] opens  # step * num_reqs + position, one per block opened
        cdef vector[int64_t] filled  # hashes of the blocks the run fills, running order
        cdef vector[int32_t] new
        cdef const int64_t* keys
        cdef Table* table
        for req in requests:
            table = self._existing(req)
            tables.push_back(table)
            c = req.num_computed_tokens  # before run step 1; step j computes token c + j
            j = ceil_div(c - 1, bs) * bs - (c - 1)  # the first step that opens a block
            if j == 0:
                j = bs
            while j <= num_steps:
                opens.push_back(<int64_t>j * num_reqs + pos)
                j += bs
            start = table.num_cached
            j = ceil_div(c, bs) * bs - c  # the first step that fills one
            if j == 0:
                j = bs
            end = start + ((num_steps - j) // bs + 1 if j <= num_steps else 0)
            ends.push_back(end)
            hashes = req.block_hashes
            stop = min(end, <Py_ssize_t>len(hashes))  # a slice's length
            keys = int64_items(hashes)
            if keys != NULL:
                for k in range(start, stop):
                    filled.push_back(keys[k])
            else:
                for k in range(start, stop):
                    filled.push_back(hashes[k])
            pos += 1
        if self.pool.any_cached(filled.data(), filled.size()):
            return False
        sort(filled.begin(), filled.end())
        if adjacent_find(filled.begin(), filled.end()) != filled.end():
            return False
        sort(opens.begin(), opens.end())
        if opens.size():
            self.pool.pop_blocks(opens.size(), new)
        for k in range(<Py_ssize_t>opens.size()):
            tables[opens[k] % num_reqs].blocks.push_back(new[k])
        pos = 0
        for req in requests:
            self._cache(tables[pos], req, ends[pos])
            pos += 1
        return True

    def get_num_cached_blocks(self, request) -> int:
        """How many of the request's blocks are registered (or hits): a prefix of its table.

        Raises:
            KeyError: if the request holds no table.
        """
        return self._existing(request).num_cached

    cdef Table* _existing(self, object request) except NULL:
        cdef Table* table = self._table(request)
        if table == NULL:
            raise KeyError(request.request_id)
        return table

    # -- views for tests and reports ----------------------------------------------------------

    @property
    def req_to_blocks(self) -> dict[int, list[int]]:
        """Block table per request id (a copy)."""
        return {p.first: [b for b in p.second.blocks] for p in self._tables}

    @property
    def num_cached_block(self) -> dict[int, int]:
        """Registered (or hit) blocks per request id (a copy)."""
        return {p.first: p.second.num_cached for p in self._tables}
