# cython: language_level=3
# distutils: language = c++
"""A request inside one simulated vLLM engine, compiled: the same attributes, errors and repr as
the pure-Python ``kvroute.sim.engine.request.Request`` (the reference and fallback;
``kvroute.sim.engine.compiled`` chooses between them), with its token counters stored as C integers
(``Py_ssize_t``) so that the compiled scheduler reads them without Python objects.

Token counts must be ints (TypeError otherwise, where the pure-Python class would accept any
number); every caller passes ints.
"""

from kvroute.sim.engine.request import RequestStatus


cdef class Request:
    """One generation request as the scheduler sees it (see ``kvroute.sim.engine.request.Request`` for
    the attributes: token counts in tokens, times in seconds).

    Raises:
        ValueError: on an empty prompt or ``max_tokens < 1``.
    """

    def __init__(self, request_id, num_prompt_tokens, max_tokens, block_hashes, client=None):
        if num_prompt_tokens < 1:
            raise ValueError(f"request {request_id}: prompt must have at least one token")
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: max_tokens must be >= 1, got {max_tokens}")
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.block_hashes = block_hashes
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens = None
        self.num_preemptions = 0
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.queued_ts = None
        self.scheduled_ts = None
        self.status = RequestStatus.WAITING
        self.client = client

    @property
    def num_tokens(self):
        """Prompt plus sampled tokens (vLLM's ``Request.num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self):
        return (
            f"Request({self.request_id}, prompt={self.num_prompt_tokens}, "
            f"computed={self.num_computed_tokens}, out={self.num_output_tokens}/{self.max_tokens}, "
            f"{self.status.name})"
        )
