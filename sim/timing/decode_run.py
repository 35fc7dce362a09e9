"""Step times of a run of identical decode steps that a worker advances as one event.

Step 0 is the pure-decode step just scheduled (its time ``first_s`` from ``StepCost.step_time``);
steps ``1 .. num_steps`` follow it, step ``j`` reading ``num_reqs * j`` more context tokens
(``StepCost.decode_run_times``). Durations, end times (their running sum from ``start``, one
float addition per step, left to right) and inter-token gaps (differences of consecutive end
times) are the same float operations, in the same order, as stepping one at a time, so they are
equal bit for bit. Busy time is the durations summed left to right, which the worker adds to its
own at once: within rounding (1e-15 relative) of stepping's one addition per step.

This is the pure-Python implementation, the reference for the compiled one
(``sim/timing/_decode_run.pyx``, same API and values; ``kvroute.sim.engine.compiled`` chooses).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from functools import reduce
from itertools import accumulate
from operator import add, sub

from kvroute.sim.timing.cost_model import StepCost


class DecodeRunTimes:
    """Durations and end times of steps ``0 .. num_steps`` of a decode run, s.

    Args:
        cost: the worker's step-cost coefficients.
        first_s: duration of step 0, s.
        num_reqs: requests in every step (one token each).
        context_tokens: context tokens step 0 reads.
        num_steps: steps after step 0.
        start: when step 0 starts, s.
    """

    __slots__ = ("_durations", "_ends")

    def __init__(self, cost: StepCost, first_s: float, num_reqs: int, context_tokens: int, num_steps: int,
                 start: float) -> None:
        durations = [first_s]
        durations += cost.decode_run_times(num_reqs, context_tokens, num_steps)
        ends = list(accumulate(durations, initial=start))
        del ends[0]
        self._durations, self._ends = durations, ends

    def duration(self, step: int) -> float:
        """Duration of step ``step``, s."""
        return self._durations[step]

    def end(self, step: int) -> float:
        """When step ``step`` ends, s."""
        return self._ends[step]

    def first_ending_at_or_after(self, now: float) -> int:
        """The first step that ends at or after ``now`` (``num_steps + 1`` if none does)."""
        return bisect_left(self._ends, now)

    def busy_s(self, num_steps: int) -> float:
        """Summed duration of steps ``0 .. num_steps - 1``, s (left to right from 0.0, as the
        compiled version; ``sum`` compensates its rounding from Python 3.12)."""
        return reduce(add, self._durations[:num_steps], 0.0)

    def ends(self, num_steps: int) -> list[float]:
        """End times of steps ``0 .. num_steps - 1``, s."""
        return self._ends[:num_steps]

    def gaps(self, num_steps: int) -> array:
        """Gaps between the ends of steps ``0 .. num_steps - 1`` (``num_steps - 1`` doubles), s."""
        ends = self._ends[:num_steps]
        return array("d", map(sub, ends[1:], ends))
