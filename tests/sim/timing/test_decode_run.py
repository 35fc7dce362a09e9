"""Decode-run step times (``sim/timing/decode_run.py`` and the compiled ``sim/timing/_decode_run.pyx``): the
same values, bit for bit, as stepping one step at a time with ``StepCost.step_time`` (both from the
``core`` fixture, tests/conftest.py)."""

from __future__ import annotations

import random
import struct

import pytest

from kvroute.sim.timing.cost_model import StepCost


def _bits(values) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


@pytest.mark.parametrize("seed", range(20))
def test_times_equal_stepping_one_at_a_time(core, seed):
    rng = random.Random(seed)
    cost = StepCost(*(rng.uniform(0, 1e-2) * rng.choice([1e-6, 1e-3, 1.0]) for _ in range(6)))
    batch, context, steps = rng.randint(1, 256), rng.randint(1, 10**6), rng.randint(0, 3000)
    start = rng.uniform(0, 1e4)
    first = cost.step_time(batch, batch, 0.0, context)
    times = core.DecodeRunTimes(cost, first, batch, context, steps, start)
    durations = [first] + [cost.step_time(batch, batch, 0.0, context + batch * j) for j in range(1, steps + 1)]
    ends, t = [], start
    for d in durations:
        t += d
        ends.append(t)
    assert _bits(times.duration(j) for j in range(steps + 1)) == _bits(durations)
    assert _bits(times.end(j) for j in range(steps + 1)) == _bits(ends)
    for n in (0, 1, steps // 2, steps + 1, steps + 5):
        total = 0.0  # left to right, as the compiled loop (Python 3.12's sum compensates)
        for d in durations[:n]:
            total += d
        assert _bits([times.busy_s(n)]) == _bits([total])
        assert _bits(times.ends(n)) == _bits(ends[:n])
        assert _bits(times.gaps(n)) == _bits([b - a for a, b in zip(ends[:n], ends[1:n])])
    for now in (start, ends[0], ends[-1], ends[-1] + 1, ends[steps // 2], (ends[0] + ends[-1]) / 2):
        assert times.first_ending_at_or_after(now) == sum(1 for e in ends if e < now)
    with pytest.raises(IndexError):
        times.end(steps + 1)
