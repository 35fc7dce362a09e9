# cython: language_level=3
"""C-level declaration of the compiled KV-cache manager (``_kv_cache_manager.pyx``), so that the
compiled scheduler (``_scheduler.pyx``) extends a running request's table without a Python call."""

from libc.stdint cimport int32_t, int64_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

from kvroute.sim.engine._block_pool cimport BlockPool
from kvroute.sim.engine._request cimport Request


cdef struct Table:
    vector[int32_t] blocks
    Py_ssize_t num_cached  # the first num_cached blocks are registered (or hits)


cdef class KVCacheManager:
    cdef readonly BlockPool pool
    cdef readonly Py_ssize_t block_size
    cdef readonly Py_ssize_t max_model_len
    cdef public object stats
    cdef unordered_map[int64_t, Table] _tables

    # the C API of the compiled scheduler
    cdef bint extend_running(self, Request request, Py_ssize_t num_new) except -1

    # internals
    cdef Table* _table(self, object request) except? NULL
    cdef Table* _table_of(self, int64_t rid) noexcept
    cdef int _cache(self, Table* table, object request, Py_ssize_t num_full) except -1
    cdef bint _extend_running(self, Table* table, object request, Py_ssize_t num_computed, Py_ssize_t num_tokens,
                              Py_ssize_t num_new) except -1
    cdef Table* _existing(self, object request) except NULL
