"""``cli/signals.py``: SIGTERM takes Ctrl-C's path while a command runs, and only then."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kvroute.cli.signals import sigterm_as_sigint


def test_sigterm_raises_keyboard_interrupt_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_sigint():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):  # the handler runs between bytecodes, at once
                pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_in_asyncio_run_cancels_the_task_so_its_cleanup_runs():
    cleaned = []

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the clean-up may await, as run_sweep's does
            cleaned.append(True)

    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_sigint():
            asyncio.run(work())
    assert cleaned == [True]
