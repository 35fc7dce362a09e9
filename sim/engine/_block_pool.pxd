# cython: language_level=3
"""C-level declaration of the compiled block pool (``_block_pool.pyx``), so that the compiled
KV-cache manager (``_kv_cache_manager.pyx``) moves block ids between the pool and its block
tables as C ints, never as Python objects."""

from cpython.array cimport array
from libc.stdint cimport int32_t, int64_t, uint8_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from kvroute.sim.engine._prefix_map cimport PrefixMap


cdef inline const int64_t* int64_items(object seq) noexcept:
    """The items of an ``array("q")`` (a request's hashes from the compiled ``block_hashes``)
    as C int64s; NULL for any other sequence (a list of ints)."""
    if type(seq) is array and (<array>seq).ob_descr.typecode == b"q":
        return <const int64_t*>(<array>seq).data.as_longlongs
    return NULL


cdef struct Block:
    int64_t block_hash  # meaningful only when has_hash
    int32_t ref_cnt
    int32_t prev  # free-queue links (0: the fake head / tail); stale while the block is in use
    int32_t next
    uint8_t has_hash


cdef class BlockPool:
    cdef readonly int32_t num_gpu_blocks
    cdef readonly bint enable_caching
    cdef public long long num_evictions
    cdef public object kv_event_listener
    cdef Block* _blocks  # per block id < _capacity
    cdef size_t _blocks_mapped  # bytes of _blocks' own mapping (map_huge), 0: PyMem memory
    cdef int32_t _capacity
    cdef int32_t _fresh  # ids >= _fresh were never handed out
    cdef int32_t _num_free
    cdef PrefixMap _cached_map  # hash -> the first block registered under it
    cdef unordered_map[int64_t, vector[int32_t]] _dups

    # the C API of the compiled KV-cache manager (block ids as C ints; callers pass valid ids)
    cdef int pop_blocks(self, Py_ssize_t num_blocks, vector[int32_t]& out) except -1
    cdef int register_blocks(self, const int32_t* ids, object hashes, Py_ssize_t start,
                             Py_ssize_t end) except -1
    cdef int release_reversed(self, const int32_t* ids, Py_ssize_t n) except -1
    cdef int take_hits(self, const int32_t* ids, Py_ssize_t n) except -1
    cdef int _ids(self, object block_ids, vector[int32_t]& out) except -1
    cdef bint any_cached(self, const int64_t* keys, Py_ssize_t n) noexcept

    # internals
    cdef void _map_blocks(self) noexcept
    cdef int _grow(self, int32_t capacity) except -1
    cdef int _link_fresh(self, int32_t prev, int32_t nxt) except -1
    cdef int _check_id(self, long long bid) except -1
    cdef int32_t _popleft(self) except -1
    cdef Py_ssize_t _pop_fresh_run(self, Py_ssize_t num_blocks, vector[int32_t]& out) except -1
    cdef void _remove(self, int32_t b) noexcept
    cdef void _append(self, int32_t b) noexcept
    cdef void _prepend_n(self, vector[int32_t]& ids) noexcept
    cdef void _release(self, int32_t b, vector[int32_t]& evict_first) noexcept
    cdef int _register(self, int32_t b, int64_t h) except -1
    cdef void _evict(self, int32_t b) noexcept
    cdef int32_t _lookup(self, object h) noexcept
