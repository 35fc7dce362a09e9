"""A vLLM server started by ``kvroute serve`` dies with it: ``kill -9`` of serve sends each
server's process SIGTERM (calibrate/live/server.py ``_child_setup``, ``PR_SET_PDEATHSIG``).
No vLLM: plain child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_process_gets_sigterm_when_serve_is_killed(tmp_path):
    """A parent that starts a child as VllmServer.start does, then dies by SIGKILL: the child
    receives SIGTERM (and here, with no handler, ends) instead of living on under init."""
    code = (
        "import subprocess, sys, time\n"
        "from kvroute.calibrate.live.server import _child_setup\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True,\n"
        "                     preexec_fn=_child_setup(None))\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
