# cython: language_level=3
"""C-level declaration of the compiled Request (``_request.pyx``), so that the compiled scheduler
(``_scheduler.pyx``) reads and writes its token counters as C integers."""


cdef class Request:
    cdef public object request_id
    cdef public Py_ssize_t num_prompt_tokens
    cdef public Py_ssize_t max_tokens
    cdef public object block_hashes
    cdef public Py_ssize_t num_computed_tokens
    cdef public Py_ssize_t num_output_tokens
    cdef public object num_cached_tokens
    cdef public Py_ssize_t num_preemptions
    cdef public Py_ssize_t num_output_placeholders
    cdef public Py_ssize_t num_in_flight_tokens
    cdef public Py_ssize_t num_stale_output_tokens
    cdef public object queued_ts
    cdef public object scheduled_ts
    cdef public object status
    cdef public object client
