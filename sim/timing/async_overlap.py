"""How much of an engine step's time is CPU work that async scheduling overlaps with the GPU.

With vLLM's async scheduling (``EngineConfig.async_scheduling``) the engine core schedules step
N+1 and processes step N-1's output while step N runs on the GPU
(``vllm/v1/engine/core.py: step_with_batch_queue``). The worker model
(``kvroute.sim.cluster.worker``) splits each step's time ``d`` (from the step timer) into a CPU
part ``c`` and a GPU part ``d - c``:

- the CPU part of a step starts when it is scheduled (right after the output of the step two
  before it is processed) and takes ``c``;
- its GPU part starts when both its CPU part and the GPU part of the step before it are done:
  ``start = max(end of previous step, scheduled at + c)``, ``end = start + d - c``.

The engine thread does one thing at a time: the next step is scheduled only when the CPU part
of the one before is done, and a step's output is processed when its GPU part and the CPU part
of the step scheduled after it are done. A worker whose pipeline is empty therefore takes ``d``
for its first step, as synchronously; in a busy run a step takes ``max(d - c, c)`` instead of
``d``. With ``c = 0`` async scheduling changes what each step contains and when tokens and
freed blocks become visible, not step times. The step timer is asked for ``d`` when the step
is scheduled (a contended timer reads the host's load then, one step before the GPU part).

``c`` is ``cpu_fraction * step_overhead_s`` (``kvroute.sim.timing.cost_model.StepCost``):
``step_overhead_s`` is the fixed per-step cost, described in the priors
(``kvroute.sim.timing.priors``: scheduling, input preparation, graph launch, sampler sync,
output hand-off; "vLLM 0.11 does not overlap these by default"). The default ``cpu_fraction``
1.0 is **stated, not fitted**: the whole fixed cost is taken as host work that async scheduling
hides, which is what vLLM's async-scheduling design aims at (the sampler's device sync and the
output copy move off the critical path, ``vllm/v1/worker/gpu_model_runner.py``: the async
output copy). Calibration cannot see it: profiles are measured on vLLM's CPU backend, where
async scheduling is off, and a sweep on a GPU server with async on folds the hidden part into a
smaller ``step_overhead_s``. A profile carries its own as ``engine.async_cpu_fraction``
(``Profile.async_cpu_fraction``): ``calibrate fit`` writes 0 for servers that scheduled
asynchronously (nothing left to hide); a derived tensor-parallel prior writes the CPU part of
its ``step_overhead_s``, whose all-reduce latency is GPU time (``kvroute.sim.timing.priors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvroute.sim.timing.cost_model import StepCost

__all__ = ["AsyncOverlap", "STATED_CPU_FRACTION"]

STATED_CPU_FRACTION = 1.0
"""The share of ``step_overhead_s`` taken as overlappable CPU work (stated, see the module)."""


@dataclass(frozen=True, slots=True)
class AsyncOverlap:
    """The CPU part of a step under async scheduling.

    Attributes:
        cpu_fraction: share of ``StepCost.step_overhead_s`` that is CPU work overlapped with
            the previous step's GPU work, in [0, 1]; stated (``STATED_CPU_FRACTION``).

    Raises:
        ValueError: if ``cpu_fraction`` is outside [0, 1].
    """

    cpu_fraction: float = STATED_CPU_FRACTION

    def __post_init__(self) -> None:
        if not 0.0 <= self.cpu_fraction <= 1.0:
            raise ValueError(f"AsyncOverlap.cpu_fraction must be in [0, 1], got {self.cpu_fraction!r}")

    def cpu_s(self, cost: StepCost) -> float:
        """Seconds of CPU work per step that async scheduling overlaps (``c`` above)."""
        return self.cpu_fraction * cost.step_overhead_s
