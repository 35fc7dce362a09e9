"""Progress where a person watches: a bar on a terminal or in a notebook, none in a pipe or a file.

:func:`progress_bar` picks by where the output goes:

- a terminal (standard error is a TTY): a ``tqdm`` bar on standard error, naming the phase, the
  count done of the total and the time left;
- a Jupyter notebook (an IPython kernel): ONE display that updates in place (an HTML
  ``<progress>`` element and the same words), so an executed notebook holds one line per phase,
  not a chunk of bar characters per update (``tqdm``'s text bar writes a ``\\r`` chunk per
  refresh; its widget needs ``ipywidgets``);
- anything else (a pipe, a file, a test runner): no bar; a phase that runs long writes one plain
  line every :data:`LINE_INTERVAL_S` seconds (``sweep: 12 of 48 runs done, about 2 min left``),
  so a log of a long calibration still says where it is.

Every kind has tqdm's small interface the callers use: ``update``, ``close``, ``n``, ``total``,
``desc``, ``reset``, ``set_description`` and ``set_postfix_str``.

The time left is the count's: the time so far per item done, times the items left (tqdm's bar:
its smoothed rate). Where the items take very different times, the caller gives its own
(``time_left``; ``kvroute calibrate measure``: :class:`kvroute.calibrate.calibration.sweep_time.TimeLeft`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

TimeLeftFn = Callable[[float], "float | None"]
"""Seconds left after the given seconds since the bar was made, or None when it cannot say."""

LINE_INTERVAL_S = 60.0
"""Seconds between two plain progress lines when nobody watches a bar (pipes, files)."""


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

    def __init__(self, total: int | None, desc: str, unit: str, time_left: TimeLeftFn | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.time_left = time_left
        self.n = 0
        self.postfix = ""
        self.started = time.monotonic()

    def left_text(self) -> str:
        """``"12 of 48 runs done, about 2 min left"``: the time left from ``time_left``, else by
        count (none before the first is done)."""
        done = f"{self.n} of {self.total} {self.unit}s done" if self.total else f"{self.n} {self.unit}s done"
        if self.total and self.n < self.total:
            elapsed = time.monotonic() - self.started
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
        self.n, self.total, self.started = 0, total, time.monotonic()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


class NoBar(_Progress):
    """No output at all (``progress=False``, ``--quiet``)."""


class LineProgress(_Progress):
    """A plain line on ``stream`` at most every ``interval`` seconds, none for a short phase."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: TextIO,
                 interval: float = LINE_INTERVAL_S, time_left: TimeLeftFn | None = None) -> None:
        super().__init__(total, desc, unit, time_left)
        self.stream, self.interval = stream, interval
        self.last = self.started

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval and (self.total is None or self.n < self.total):
            self.last = now
            print(f"{self.desc}: {self.left_text()}", file=self.stream, flush=True)


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
        text = (f"{self.desc}: {self.n} {self.unit}s in {_duration(time.monotonic() - self.started)}" if final
                else f"{self.desc}: {self.left_text()}")
        return _Html(text, None if final else (self.n, self.total))

    def refresh(self) -> None:
        now = time.monotonic()
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
        An object with ``update``, ``close``, ``n``, ``total``, ``desc``, ``reset``,
        ``set_description`` and ``set_postfix_str``.
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
