"""What one engine step schedules and what it produces (vLLM's ``SchedulerOutput`` and the
sampled/finished part of ``EngineCoreOutputs``), shared by the pure-Python scheduler
(``kvroute.sim.engine.scheduler``) and the compiled one (``kvroute.sim.engine._scheduler``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvroute.sim.engine.request import Request


def prefill_pairs(num_computed: int, num_new: int) -> float:
    """Causal attention pairs (query token x context token) of a chunk of ``num_new`` tokens
    after ``num_computed`` tokens: ``num_new * (num_computed + (num_new + 1) / 2)``. The one
    definition of :attr:`SchedulerOutput.prefill_token_pairs`'s terms; the compiled scheduler
    (``_scheduler.pyx``) repeats its float operations in C, in the same order, and the parity
    tests compare the two cores' outputs."""
    return num_new * (num_computed + (num_new + 1) / 2)


@dataclass(slots=True)
class SchedulerOutput:
    """What one step runs, in vLLM's order (running requests first, then admitted ones).

    Attributes:
        requests: scheduled requests.
        num_scheduled_tokens: tokens scheduled per request, parallel to ``requests``.
        num_batched_tokens: sum of ``num_scheduled_tokens``.
        prefill_token_pairs: causal attention pairs of chunks longer than one token, summed
            (:func:`prefill_pairs`).
        decode_context_tokens: context tokens read by one-token requests.
        num_decodes: one-token requests (decodes; a prompt's last single token counts too).
        preempted: requests preempted in this step, in preemption order.
        admitted: requests moved from waiting to running in this step.
        samples: with async scheduling, parallel to ``requests``: whether the request samples
            a token in this step (its chunk reaches the end of its known tokens plus
            placeholders, vLLM's ``not request.is_prefill_chunk``); None when stepping
            synchronously.
    """

    requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    num_batched_tokens: int = 0
    prefill_token_pairs: float = 0.0
    decode_context_tokens: int = 0
    num_decodes: int = 0
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    samples: list[bool] | None = None

    @property
    def num_reqs(self) -> int:
        """Requests scheduled in the step."""
        return len(self.requests)

    def is_empty(self) -> bool:
        """True when the step schedules nothing."""
        return not self.requests


@dataclass(slots=True)
class StepResult:
    """Tokens a step produced.

    Attributes:
        emitted: requests that sampled one token in this step (their first when
            ``num_output_tokens == 1``).
        finished: requests that reached ``max_tokens`` (or ``max_model_len``); their blocks
            are already freed.
    """

    emitted: list[Request]
    finished: list[Request]
