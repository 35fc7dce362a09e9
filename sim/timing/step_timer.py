"""The one interface a worker times its engine steps through: :class:`StepTimer`.

Implementations: :class:`~kvroute.sim.timing.cost_model.StepCost` (the calibrated GPU step cost
alone, the only one that allows fast-forward), :class:`~kvroute.sim.timing.frontend.ContendedStepCost`
(stretched by the host's load of the moment) and :class:`~kvroute.sim.timing.host.StreamedStepCost`
(a step cost whose tokens stream through API lanes). :meth:`kvroute.sim.timing.host.Host.step_timers`
chooses one per worker from the profile.
"""

from __future__ import annotations

from typing import Protocol


class StepTimer(Protocol):
    """Seconds one engine step takes, and whether the worker may fast-forward runs of decode steps.

    Fast-forward only where the step time depends on nothing but the batch. A worker advances a
    run of identical decode steps as one event and times steps 1 .. n of the run in closed form
    from step 0 (``kvroute.sim.timing.compiled.DecodeRunTimes``, ``docs/design/fast-path.md``).
    That is exact only when a step's time is a function of the step's composition alone (the
    arguments of :meth:`step_time`), not of the clock, the other workers or the host's load when
    the step starts, and when nothing else needs each step's end as an event of its own at its
    time (API lanes that stream every step's tokens in time order). A timer that cannot promise
    both sets :attr:`fast_forward` False, and its worker steps one at a time.

    Attributes:
        fast_forward: True when runs of decode steps may be advanced as one event. Such a timer
            also gives the run's closed form, as :class:`~kvroute.sim.timing.cost_model.StepCost`
            does: ``decode_step_terms(num_reqs)`` and ``decode_run_times(num_reqs,
            context_tokens, num_steps)``, equal bit for bit to calling :meth:`step_time` step
            by step.
    """

    @property
    def fast_forward(self) -> bool: ...

    def step_time(self, num_batched_tokens: int, num_reqs: int, prefill_token_pairs: float,
                  decode_context_tokens: int, num_decodes: int | None = None) -> float:
        """Seconds the step takes when it starts now.

        Args:
            num_batched_tokens: tokens scheduled in the step (prefill chunks plus decodes).
            num_reqs: requests scheduled in the step.
            prefill_token_pairs: causal attention pairs of the step's prefill chunks.
            decode_context_tokens: context tokens read by the step's decodes.
            num_decodes: the step's one-token requests (``SchedulerOutput.num_decodes``); None
                for a step of the calibration sweep's shapes (all decodes, or beside one
                prefill chunk: ``num_reqs`` or ``num_reqs - 1``).
        """
        ...
