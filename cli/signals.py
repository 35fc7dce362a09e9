"""SIGTERM stops a command the way Ctrl-C (SIGINT) does.

A service manager, ``timeout`` or ``kill`` sends SIGTERM, whose default action ends the process
at once: no partial report, ``meta.json`` left ``running``. While :func:`sigterm_as_sigint` is
active, SIGTERM runs whatever handles SIGINT at that moment instead: Python's own handler raises
``KeyboardInterrupt``; inside ``asyncio.run`` the runner's handler cancels the main task (so the
coroutine's cleanup runs) and ``asyncio.run`` then raises ``KeyboardInterrupt``. Where SIGINT is
ignored (a background job of a shell without job control), SIGTERM still raises
``KeyboardInterrupt``. The previous SIGTERM handler is restored after. Each command then takes
its Ctrl-C path: what finished is kept and the command exits with 130.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Iterator

import click

INTERRUPTED_EXIT = 130
"""Exit code of an interrupted command (128 + SIGINT), as the shell gives for Ctrl-C."""


def _as_sigint(signum, frame) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIG_IGN or SIG_DFL: still stop
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Within the block, SIGTERM is handled as SIGINT (see the module docstring). A no-op
    outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stops_on_sigterm(func):
    """Decorate a click command's function: SIGTERM is handled as SIGINT while it runs, and an
    interrupt the command does not handle itself ends it with "interrupted" and exit code 130
    (not click's "Aborted!" and 1)."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with sigterm_as_sigint():
            try:
                return func(*args, **kwargs)
            except KeyboardInterrupt:
                click.echo("\ninterrupted", err=True)
                sys.exit(INTERRUPTED_EXIT)
    return wrapper
