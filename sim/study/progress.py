"""Progress where it is seen: a bar on a terminal or in a notebook, plain lines in a log (long phases).

:func:`progress_bar` picks by where the output goes:

- a terminal (standard error is a TTY): a ``tqdm`` bar on standard error, naming the phase, the
  count done of the total and the time left;
- a Jupyter notebook (an IPython kernel): ONE display that updates in place (an HTML
  ``<progress>`` element and the same words), so an executed notebook holds one line per phase,
  not a chunk of bar characters per update (``tqdm``'s text bar writes a ``\\r`` chunk per
  refresh; its widget needs ``ipywidgets``);
- anything else (a pipe, a file, ``nohup``, a test runner): no bar; a phase that runs longer than
  :data:`LINE_INTERVAL_S` seconds writes plain lines from then on (``sweep: 12 of 48 runs done,
  about 2 min left``), one each time another tenth of it is done and one at the first update or
  refresh :data:`LINE_INTERVAL_S` seconds or more after the last line, and a last one when it ends
  (``sweep: 48 of 48 runs done in 12 min``), so a log of a long calibration says where it is; a
  short phase writes nothing. A caller whose single items run long keeps the lines coming with
  :func:`keep_refreshed` (``kvroute calibrate measure``: a line every 30 to 35 s while one
  experiment runs).

Every kind has tqdm's small interface the callers use: ``update``, ``refresh``, ``close``, ``n``,
``total``, ``desc``, ``reset``, ``set_description`` and ``set_postfix_str``.

The time left is the count's: the time so far per item done, times the items left (tqdm's bar:
its smoothed rate). Where the items take very different times, the caller gives its own
(``time_left``; ``kvroute calibrate measure``: :class:`kvroute.calibrate.calibration.sweep_time.TimeLeft`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import TextIO

TimeLeftFn = Callable[[float], "float | None"]
"""Seconds left after the given seconds since the bar was made, or None when it cannot say."""

LINE_INTERVAL_S = 30.0
"""When nobody watches a bar (pipes, files): seconds a phase runs before its first plain progress
line, and the least gap after which an update or a refresh writes one."""

REFRESH_S = 5.0
"""Seconds between two refreshes of :func:`keep_refreshed`: plain lines come at most this late
after :data:`LINE_INTERVAL_S`, and a bar's elapsed and left times move this often."""

Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.monotonic``; a test's fake)."""


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ``ZMQInteractiveShell``)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - an IPython without a running shell
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def watched(stream: TextIO | None = None) -> str | None:
    """Where a bar would be seen: ``"terminal"`` (``stream``, default standard error, is a TTY),
    ``"notebook"`` (a Jupyter kernel), or None (a pipe or a file)."""
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return "terminal"
    except (AttributeError, ValueError):  # a closed or a fake stream
        pass
    return "notebook" if in_notebook() else None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Progress:
    """The shared state of the bars that are not tqdm's: a count, a total, a phase name."""

    def __init__(self, total: int | None, desc: str, unit: str, time_left: TimeLeftFn | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.time_left, self.clock = time_left, clock
        self.n = 0
        self.postfix = ""
        self.started = clock()

    def left_text(self) -> str:
        """``"12 of 48 runs done, about 2 min left"``: the time left from ``time_left``, else by
        count (none before the first is done)."""
        done = f"{self.n} of {self.total} {self.unit}s done" if self.total else f"{self.n} {self.unit}s done"
        if self.total and self.n < self.total:
            elapsed = self.clock() - self.started
            left = self.time_left(elapsed) if self.time_left is not None else None
            if left is None and self.n > 0:
                left = elapsed / self.n * (self.total - self.n)
            if left is not None:
                done += f", about {_duration(left)} left"
        return done + (f" ({self.postfix})" if self.postfix else "")

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self) -> None:
        pass

    def reset(self, total: int | None = None) -> None:
        self.n, self.total, self.started = 0, total, self.clock()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


class NoBar(_Progress):
    """No output at all (``progress=False``, ``--quiet``)."""


class LineProgress(_Progress):
    """Plain lines on ``stream`` for a phase that runs long (the module's docstring): none in its
    first ``interval`` seconds; after that one each time another tenth of ``total`` is done and one
    whenever it is updated or refreshed ``interval`` seconds or more after the last line (so a
    caller that refreshes it every few seconds gets a line every ``interval`` seconds or a little
    more while nothing finishes); none for the last item itself; on ``close``, when it wrote any,
    a last line with the count done and the time taken."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: TextIO,
                 interval: float = LINE_INTERVAL_S, time_left: TimeLeftFn | None = None,
                 clock: Clock = time.monotonic) -> None:
        super().__init__(total, desc, unit, time_left, clock)
        self.stream, self.interval = stream, interval
        self.last = self.started
        self.tenths = 0  # tenths of the total done at the last line
        self.lines = 0

    def refresh(self) -> None:
        now = self.clock()
        if now - self.started < self.interval or (self.total and self.n >= self.total):
            return  # a short phase says nothing; the end is close's line
        tenths = 10 * self.n // self.total if self.total else 0
        if tenths > self.tenths or now - self.last >= self.interval:
            self.last, self.tenths = now, tenths
            self._line(self.left_text())

    def reset(self, total: int | None = None) -> None:
        super().reset(total)
        self.last, self.tenths = self.started, 0

    def close(self) -> None:
        if self.lines:
            done = f"{self.n} of {self.total}" if self.total else f"{self.n}"
            self._line(f"{done} {self.unit}s done in {_duration(self.clock() - self.started)}")

    def _line(self, text: str) -> None:
        self.lines += 1
        print(f"{self.desc}: {text}", file=self.stream, flush=True)


class NotebookBar(_Progress):
    """One notebook display updated in place (``IPython.display`` with a ``display_id``), at most
    every ``min_interval`` seconds; closing it leaves one line: the phase, its count, its time."""

    def __init__(self, total: int | None, desc: str, unit: str, min_interval: float = 0.2,
                 time_left: TimeLeftFn | None = None) -> None:
        super().__init__(total, desc, unit, time_left)
        from IPython.display import display

        self.min_interval, self.last = min_interval, 0.0
        self.handle = display(self._view(), display_id=True)

    def _view(self, final: bool = False):
        text = (f"{self.desc}: {self.n} {self.unit}s in {_duration(self.clock() - self.started)}" if final
                else f"{self.desc}: {self.left_text()}")
        return _Html(text, None if final else (self.n, self.total))

    def refresh(self) -> None:
        now = self.clock()
        if now - self.last >= self.min_interval:
            self.last = now
            self.handle.update(self._view())

    def close(self) -> None:
        self.handle.update(self._view(final=True))


class _Html:
    """A notebook view: an HTML ``<progress>`` bar and its words; plain text elsewhere."""

    def __init__(self, text: str, fraction: tuple[int, int | None] | None) -> None:
        self.text, self.fraction = text, fraction

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html

        bar = ""
        if self.fraction is not None and self.fraction[1]:
            bar = f'<progress value="{self.fraction[0]}" max="{self.fraction[1]}"></progress> '
        return f"<div>{bar}{html.escape(self.text)}</div>"


def _columns(stream: TextIO) -> int:
    """The width of the terminal behind ``stream`` (0 when it reports none)."""
    import os

    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _timed_tqdm(time_left: TimeLeftFn, **options):
    """A tqdm bar whose time left is ``time_left``'s (``about 3 min left``) instead of its rate's."""
    from tqdm import tqdm

    class TimedBar(tqdm):
        @property
        def format_dict(self):
            d = super().format_dict
            left = self.time_left(d["elapsed"]) if self.total is None or self.n < self.total else None
            d["left"] = "" if left is None else f", about {_duration(left)} left"
            return d

    TimedBar.time_left = staticmethod(time_left)
    return TimedBar(bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{left}{postfix}]", **options)


async def keep_refreshed(bar, every_s: float = REFRESH_S, sleep=asyncio.sleep) -> None:
    """Refresh ``bar`` every ``every_s`` seconds until cancelled, so its time shown moves while a
    single item runs long (a plain line at least every :data:`LINE_INTERVAL_S` seconds or a
    little more; a terminal bar's elapsed and left times).

    Args:
        bar: what :func:`progress_bar` returned.
        every_s: seconds between two refreshes, > 0.
        sleep: awaits the given seconds (``asyncio.sleep``; a test's fake).

    Raises:
        ValueError: ``every_s`` <= 0.
    """
    if not every_s > 0.0:
        raise ValueError(f"every_s must be > 0, got {every_s!r}")
    while True:
        await sleep(every_s)
        bar.refresh()


def progress_bar(total: int | None, desc: str, unit: str, enabled: bool = True, stream: TextIO | None = None,
                 time_left: TimeLeftFn | None = None, **tqdm_options):
    """A progress bar for a phase of ``total`` ``unit``s named ``desc``, of the kind that fits
    where the output goes (:func:`watched`; the module's docstring lists them).

    Args:
        total: items in the phase (None: unknown).
        desc: what the phase does, shown first (``"sweep"``, ``"calibration sweep"``).
        unit: the item's name, singular (``"run"``, ``"exp"``).
        enabled: False gives :class:`NoBar` (quiet).
        stream: where a terminal bar or plain lines go (default: standard error).
        time_left: gives the seconds left after the seconds since the bar was made (None from
            it: the count's); None: the count's (the module's docstring).
        tqdm_options: more ``tqdm`` options for the terminal bar (``leave``, ``position``).

    Returns:
        An object with ``update``, ``refresh``, ``close``, ``n``, ``total``, ``desc``, ``reset``,
        ``set_description`` and ``set_postfix_str``; ``refresh`` shows the elapsed time and the
        time left anew (:func:`keep_refreshed`).
    """
    if not enabled:
        return NoBar(total, desc, unit)
    stream = sys.stderr if stream is None else stream
    where = watched(stream)
    if where == "terminal":
        from tqdm import tqdm

        # NOTE: a terminal that reports no size (a bare pseudo-terminal) gets 100 x 24: tqdm would
        # hide every bar below its 0 rows
        sized = _columns(stream) > 0
        size = {} if sized else {"ncols": 100, "nrows": 24}
        options = dict(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=sized, **size, **tqdm_options)
        return tqdm(**options) if time_left is None else _timed_tqdm(time_left, **options)
    if where == "notebook":
        return NotebookBar(total, desc, unit, time_left=time_left)
    return LineProgress(total, desc, unit, stream, time_left=time_left)
