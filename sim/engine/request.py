"""A request inside one simulated vLLM engine (vLLM's ``vllm/v1/request.py``, reduced)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any


class RequestStatus(enum.IntEnum):
    """Where a request is in the engine (vLLM's ``RequestStatus``, the states used here)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_LENGTH_CAPPED = 3
    FINISHED_ABORTED = 4


class Request:
    """One generation request as the scheduler sees it.

    Attributes:
        request_id: unique within the engine.
        num_prompt_tokens: prompt length, tokens.
        max_tokens: tokens to generate (outputs are forced to this length, as with
            ``ignore_eos``).
        block_hashes: hashes of every full block of prompt + all ``max_tokens`` outputs, signed
            64-bit ints (a list, or an ``array("q")`` from the compiled ``block_hashes``); vLLM
            hashes output blocks as they fill, and their content here is known in advance.
        num_computed_tokens: tokens whose KV is computed or scheduled (vLLM advances it at
            schedule time).
        num_output_tokens: tokens sampled so far.
        num_cached_tokens: prefix-cache hit tokens at the first admission, None before it.
        num_preemptions: times preempted (recompute).
        num_output_placeholders: with async scheduling, tokens scheduled for sampling whose
            value is not yet known (vLLM's ``Request.num_output_placeholders``); 0 otherwise.
        num_in_flight_tokens: with async scheduling, tokens scheduled in steps whose output is
            not yet processed (``num_in_flight_tokens``).
        num_stale_output_tokens: with async scheduling, in-flight tokens scheduled before the
            request's last preemption; their output is still delivered but changes no counter
            (``num_stale_output_tokens``, set in vLLM's ``Scheduler._preempt_request``; here
            ``Scheduler._preempt``).
        queued_ts: when the engine received it, s (vLLM's ``RequestStateStats.queued_ts``).
        scheduled_ts: when a step first scheduled it, s (``scheduled_ts``; None before).
        client: opaque slot for whoever submitted the request (the worker's record).

    Raises:
        ValueError: on an empty prompt or ``max_tokens < 1``.
    """

    __slots__ = (
        "request_id",
        "num_prompt_tokens",
        "max_tokens",
        "block_hashes",
        "num_computed_tokens",
        "num_output_tokens",
        "num_cached_tokens",
        "num_preemptions",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_output_tokens",
        "queued_ts",
        "scheduled_ts",
        "status",
        "client",
    )

    def __init__(
        self,
        request_id: int,
        num_prompt_tokens: int,
        max_tokens: int,
        block_hashes: Sequence[int],
        client: Any = None,
    ) -> None:
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
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.queued_ts: float | None = None
        self.scheduled_ts: float | None = None
        self.status = RequestStatus.WAITING
        self.client = client

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled tokens (vLLM's ``Request.num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id}, prompt={self.num_prompt_tokens}, "
            f"computed={self.num_computed_tokens}, out={self.num_output_tokens}/{self.max_tokens}, "
            f"{self.status.name})"
        )
