"""Engine step time from a step's composition and a profile's coefficients.

The model is a roofline in a form that a least-squares fit can recover from measurements::

    step_time = step_overhead_s
              + max(weight_load_s, per_token_s * num_batched_tokens)
              + per_request_s * num_reqs
              + prefill_attn_s * prefill_token_pairs
              + decode_attn_s * decode_context_tokens

- ``weight_load_s`` is the floor set by streaming every weight once per step (small batches
  are memory-bound); ``per_token_s`` is the linear layers' compute per batched token.
- ``prefill_token_pairs`` sums, over requests scheduled for more than one token, the causal
  attention pairs of the chunk: ``new * (computed + (new + 1) / 2)``
  (``kvroute.sim.engine.scheduler_output.prefill_pairs``); it grows with context.
- ``decode_context_tokens`` sums, over requests scheduled for one token, the context read
  (``computed + 1``): decode attention is bound by reading the KV cache.
- ``per_request_s`` covers per-sequence work (the LM head on the sampled position, sampling).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class StepCost:
    """Coefficients of the step-time model; every field in seconds (per unit named).

    Attributes:
        step_overhead_s: fixed cost of one engine step (scheduling, launch, output processing).
        weight_load_s: time to read all weights once; the floor of the linear layers' time.
        per_token_s: linear-layer compute per batched token.
        per_request_s: per scheduled request (LM head on its sampled position, sampling).
        prefill_attn_s: per causal attention pair (query token x context token) in prefill.
        decode_attn_s: per context token read by a one-token (decode) request.

    Raises:
        ValueError: if a coefficient is negative or not finite.
    """

    # NOTE: a class attribute, not a field (no annotation): the fields are the coefficients.
    fast_forward = True
    """A :class:`~kvroute.sim.timing.step_timer.StepTimer`: a step's time depends on nothing but
    its batch, so runs of decode steps may be advanced as one event (:meth:`decode_run_times`)."""

    step_overhead_s: float
    weight_load_s: float
    per_token_s: float
    per_request_s: float
    prefill_attn_s: float
    decode_attn_s: float

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (value >= 0.0 and value != float("inf")):
                raise ValueError(f"StepCost.{name} must be finite and >= 0, got {value!r}")

    def step_time(
        self,
        num_batched_tokens: int,
        num_reqs: int,
        prefill_token_pairs: float,
        decode_context_tokens: int,
        num_decodes: int | None = None,
    ) -> float:
        """Seconds one engine step takes.

        Args:
            num_batched_tokens: tokens scheduled in the step (prefill chunks plus decodes).
            num_reqs: requests scheduled in the step.
            prefill_token_pairs: causal attention pairs of the step's prefill chunks.
            decode_context_tokens: context tokens read by the step's decodes.
            num_decodes: the step's one-token requests (``StepTimer``'s argument); the GPU step
                cost does not depend on it beyond the tokens and requests above.
        """
        linear = self.per_token_s * num_batched_tokens
        if linear < self.weight_load_s:
            linear = self.weight_load_s
        return (
            self.step_overhead_s
            + linear
            + self.per_request_s * num_reqs
            + self.prefill_attn_s * prefill_token_pairs
            + self.decode_attn_s * decode_context_tokens
        )


    def decode_step_terms(self, num_reqs: int) -> tuple[float, float]:
        """``(base, attn)`` with ``step_time(num_reqs, num_reqs, 0.0, c) == base + attn * c``
        exactly for every int ``c`` (the same float operations in the same order), s."""
        linear = self.per_token_s * num_reqs
        if linear < self.weight_load_s:
            linear = self.weight_load_s
        return self.step_overhead_s + linear + self.per_request_s * num_reqs + self.prefill_attn_s * 0.0, self.decode_attn_s

    def decode_run_times(self, num_reqs: int, context_tokens: int, num_steps: int) -> list[float]:
        """Seconds of steps ``1 .. num_steps`` after a pure-decode step of ``num_reqs`` requests
        that read ``context_tokens`` context tokens: step ``j`` reads ``num_reqs * j`` more.

        Element ``j - 1`` equals ``step_time(num_reqs, num_reqs, 0.0, context_tokens +
        num_reqs * j)`` exactly (the same float operations in the same order), computed in one
        list comprehension instead of ``num_steps`` calls.
        """
        base, attn = self.decode_step_terms(num_reqs)
        # the contexts context_tokens + num_reqs * j, j = 1 .. num_steps, as one range of ints
        stop = context_tokens + num_reqs * num_steps + 1
        return [base + attn * c for c in range(context_tokens + num_reqs, stop, num_reqs)]


