"""Plain progress lines where nobody watches a bar (``kvroute calibrate measure ... > log 2>&1``,
nohup, CI): sim/study/progress.LineProgress on a fake clock, exact lines."""

import io

from kvroute.sim.study import progress
from kvroute.sim.study.progress import LineProgress


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


def test_a_pipe_gets_line_progress_not_a_bar():
    bar = progress.progress_bar(3, "sweep", "run", stream=io.StringIO())
    assert isinstance(bar, LineProgress) and bar.interval == 30.0
