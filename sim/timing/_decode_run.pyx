# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""Step times of a decode run, compiled: the same API and the same values, bit for bit, as the
pure-Python ``kvroute.sim.timing.decode_run.DecodeRunTimes`` (the reference and fallback;
``kvroute.sim.engine.compiled`` chooses).

Durations and end times are C doubles in two vectors, computed with the pure version's float
operations in the same order: duration ``j >= 1`` is ``base + attn * (context + num_reqs * j)``
with ``(base, attn) = StepCost.decode_step_terms(num_reqs)``, end ``j`` is end ``j - 1`` plus
duration ``j``, busy time a left-to-right sum, a gap the difference of two ends. The module is
built with ``-ffp-contract=off`` (setup.py), so the compiler never fuses a multiply and an add
into one rounding. The Python version makes a float object per step three times over; here
only the gaps returned cross into Python, as one ``array("d")``.
"""

from cpython.array cimport array, clone
from libcpp.vector cimport vector

from array import array as py_array

cdef array DOUBLES = py_array("d")


cdef class DecodeRunTimes:
    """Durations and end times of steps ``0 .. num_steps`` of a decode run, s.

    Args:
        cost: the worker's step-cost coefficients (``StepCost``).
        first_s: duration of step 0, s.
        num_reqs: requests in every step (one token each).
        context_tokens: context tokens step 0 reads.
        num_steps: steps after step 0.
        start: when step 0 starts, s.

    Raises:
        IndexError: from the accessors, for a step outside ``0 .. num_steps``.
    """

    cdef vector[double] _durations
    cdef vector[double] _ends

    def __init__(self, cost, double first_s, long long num_reqs, long long context_tokens,
                 Py_ssize_t num_steps, double start) -> None:
        base_obj, attn_obj = cost.decode_step_terms(num_reqs)
        cdef double base = base_obj, attn = attn_obj
        cdef double end = start
        cdef double d
        cdef Py_ssize_t j
        cdef long long c = context_tokens
        n = max(num_steps, 0)
        self._durations.reserve(n + 1)
        self._ends.reserve(n + 1)
        end = end + first_s
        self._durations.push_back(first_s)
        self._ends.push_back(end)
        for j in range(n):
            c += num_reqs
            d = base + attn * <double>c
            end = end + d
            self._durations.push_back(d)
            self._ends.push_back(end)

    cdef inline Py_ssize_t _step(self, Py_ssize_t step) except -1:
        if step < 0 or step >= <Py_ssize_t>self._ends.size():
            raise IndexError(f"step {step} is not in the run (0 .. {self._ends.size() - 1})")
        return step

    def duration(self, Py_ssize_t step) -> float:
        """Duration of step ``step``, s."""
        return self._durations[self._step(step)]

    def end(self, Py_ssize_t step) -> float:
        """When step ``step`` ends, s."""
        return self._ends[self._step(step)]

    def first_ending_at_or_after(self, double now) -> int:
        """The first step that ends at or after ``now`` (``num_steps + 1`` if none does)."""
        cdef Py_ssize_t lo = 0, hi = self._ends.size(), mid
        while lo < hi:  # bisect_left
            mid = (lo + hi) // 2
            if self._ends[mid] < now:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def busy_s(self, Py_ssize_t num_steps) -> float:
        """Summed duration of steps ``0 .. num_steps - 1``, s (left to right from 0.0)."""
        cdef double total = 0.0
        cdef Py_ssize_t j
        for j in range(min(max(num_steps, 0), <Py_ssize_t>self._durations.size())):
            total += self._durations[j]
        return total

    def ends(self, Py_ssize_t num_steps) -> array:
        """End times of steps ``0 .. num_steps - 1``, s, as an ``array("d")``."""
        cdef Py_ssize_t n = min(max(num_steps, 0), <Py_ssize_t>self._ends.size())
        cdef array out = clone(DOUBLES, n, False)
        cdef Py_ssize_t j
        for j in range(n):
            out.data.as_doubles[j] = self._ends[j]
        return out

    def gaps(self, Py_ssize_t num_steps) -> array:
        """Gaps between the ends of steps ``0 .. num_steps - 1`` (``num_steps - 1`` doubles), s."""
        cdef Py_ssize_t n = min(max(num_steps, 0), <Py_ssize_t>self._ends.size())
        cdef array out = clone(DOUBLES, max(n - 1, 0), False)
        cdef Py_ssize_t j
        for j in range(n - 1):
            out.data.as_doubles[j] = self._ends[j + 1] - self._ends[j]
        return out
