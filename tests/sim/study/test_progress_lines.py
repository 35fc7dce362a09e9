"""Plain progress lines where nobody watches a bar (``kvroute calibrate measure ... > log 2>&1``,
nohup, CI): sim/study/progress.LineProgress on a fake clock, exact lines."""

import asyncio
import io

import pytest

from kvroute.sim.study import progress
from kvroute.sim.study.progress import LineProgress, keep_refreshed


class Clock:
    """A fake monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bar(total, clock, **kw):
    out = io.StringIO()
    return LineProgress(total, "calibration sweep", "experiment", out, clock=clock, **kw), out


def test_a_long_phase_writes_a_line_every_tenth_and_every_interval_then_a_last_one():
    clock = Clock()
    bar, out = _bar(100, clock)
    for _ in range(5):  # its first 30 s: nothing, however much is done
        clock.now += 5.0
        bar.update()
    assert out.getvalue() == ""
    clock.now += 10.0  # 35 s, 6 done
    bar.update()
    for _ in range(4):  # 10 done in 39 s: a tenth more
        clock.now += 1.0
        bar.update()
    clock.now += 20.0  # 59 s: neither a tenth more nor 30 s since the last line
    bar.update()
    clock.now += 10.0  # 69 s: 30 s since the last line
    bar.update()
    for _ in range(88):  # 100 done at 157 s: no line for the end itself ...
        clock.now += 1.0
        bar.update()
    bar.close()  # ... but close's
    assert out.getvalue().splitlines() == [
        "calibration sweep: 6 of 100 experiments done, about 9 min left",  # 35 s / 6 x 94
        "calibration sweep: 10 of 100 experiments done, about 6 min left",
        "calibration sweep: 12 of 100 experiments done, about 8 min left",  # 69 s: 30 s after 39 s
        "calibration sweep: 20 of 100 experiments done, about 5 min left",  # 77 s / 20 x 80
        "calibration sweep: 30 of 100 experiments done, about 3 min left",
        "calibration sweep: 40 of 100 experiments done, about 2 min left",
        "calibration sweep: 50 of 100 experiments done, about 2 min left",
        "calibration sweep: 60 of 100 experiments done, about 78 s left",  # 117 s / 60 x 40
        "calibration sweep: 70 of 100 experiments done, about 54 s left",
        "calibration sweep: 80 of 100 experiments done, about 34 s left",
        "calibration sweep: 90 of 100 experiments done, about 16 s left",
        "calibration sweep: 100 of 100 experiments done in 3 min",  # 157 s
    ]


def test_the_callers_time_left_is_the_lines_and_a_short_phase_says_nothing():
    clock = Clock()
    bar, out = _bar(4, clock, time_left=lambda elapsed: 600.0 - elapsed)  # 569 s at 31 s
    clock.now += 31.0
    bar.update()
    bar.close()
    assert out.getvalue().splitlines() == ["calibration sweep: 1 of 4 experiments done, about 9 min left",
                                           "calibration sweep: 1 of 4 experiments done in 31 s"]
    bar, out = _bar(4, clock)
    for _ in range(4):
        clock.now += 7.0
        bar.update()
    bar.close()
    assert out.getvalue() == ""


def test_refreshes_while_nothing_finishes_write_a_line_each_interval_after_the_last():
    """One long item: the caller's refresh every 5 s (keep_refreshed) writes a line at the first
    refresh 30 s or more after the last line, an update's line included."""
    clock = Clock()
    bar, out = _bar(4, clock, time_left=lambda elapsed: 600.0 - elapsed)
    for _ in range(7):  # 5 .. 35 s
        clock.now += 5.0
        bar.refresh()
    clock.now += 2.0  # 37 s: the first item ends, a tenth more
    bar.update()
    for _ in range(14):  # 42 .. 107 s
        clock.now += 5.0
        bar.refresh()
    bar.close()
    assert out.getvalue().splitlines() == [
        "calibration sweep: 0 of 4 experiments done, about 10 min left",  # 30 s: 570 s (9.5 min)
        "calibration sweep: 1 of 4 experiments done, about 9 min left",  # 37 s: the update's
        "calibration sweep: 1 of 4 experiments done, about 9 min left",  # 67 s: 533 s
        "calibration sweep: 1 of 4 experiments done, about 8 min left",  # 97 s: 503 s
        "calibration sweep: 1 of 4 experiments done in 2 min",  # 107 s
    ]


def test_keep_refreshed_refreshes_every_interval_until_cancelled():
    slept, refreshed = [], []

    class Bar:
        def refresh(self):
            refreshed.append(len(slept))

    async def main():
        forever = asyncio.get_running_loop().create_future()

        async def sleep(seconds):  # returns at once twice, then never
            slept.append(seconds)
            if len(slept) == 3:
                await forever

        task = asyncio.create_task(keep_refreshed(Bar(), 5.0, sleep=sleep))
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task

    task = asyncio.run(main())
    assert task.cancelled() and slept == [5.0, 5.0, 5.0] and refreshed == [1, 2]
    with pytest.raises(ValueError, match="every_s"):
        asyncio.run(keep_refreshed(Bar(), 0.0))


def test_a_pipe_gets_line_progress_not_a_bar():
    bar = progress.progress_bar(3, "sweep", "run", stream=io.StringIO())
    assert isinstance(bar, LineProgress) and bar.interval == 30.0
