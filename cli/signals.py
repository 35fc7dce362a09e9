"""SIGTERM stops a command the way Ctrl-C (SIGINT) does.

A service manager, ``timeout`` or ``kill`` sends SIGTERM, whose default action ends the process
at once: no partial report, ``meta.json`` left ``running``. While :func:`sigterm_as_sigint` is
active, SIGTERM runs whatever handles SIGINT at that moment instead: Python's own handler raises
``KeyboardInterrupt``; inside ``asyncio.run`` the runner's handler cancels the main task (so the
coroutine's cleanup runs) and ``asyncio.run`` then raises ``KeyboardInterrupt``. Where SIGINT is
ignored (a background job of a shell without job control), SIGTERM still raises
``KeyboardInterrupt``. The previous SIGTERM handler is restored after. Each command then takes
its Ctrl-C path: what finished is kept and the command exits with 130.

The mechanism is the simulator's (``kvroute.sim.study.executors.interrupts_as_keyboard``, which
also stops a sweep's pool), so SIGTERM has one handler in the whole program.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import click

from kvroute.sim.study.executors import interrupts_as_keyboard

INTERRUPTED_EXIT = 130
"""Exit code of an interrupted command (128 + SIGINT), as the shell gives for Ctrl-C."""


def sigterm_as_sigint() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGTERM is handled as SIGINT (see the module docstring); SIGINT itself
    is left to Python or ``asyncio.run``. A no-op outside the main thread."""
    return interrupts_as_keyboard(sigint=False)


def exit_if_held(held: list[str], out=None) -> None:
    """After an ``interrupts_deferred`` block that finished its work (``held``: the stop it held, if
    any): say the results are whole, printed and under ``out`` when given, and exit with
    :data:`INTERRUPTED_EXIT`; nothing when no stop came."""
    if held:
        click.echo(f"\ninterrupted ({held[0]}) after every run finished: the results above"
                   + (f" and in {out} are whole" if out is not None else " are whole"), err=True)
        sys.exit(INTERRUPTED_EXIT)


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
