"""Ctrl-C and SIGTERM stop a local ``kvroute sensitivity`` with work left: exit code 130, no pool
process left, no traceback. Its pool is ``executors.run_tasks``', as sweep's and compare's.

As in ``test_sweep_signals``: a real process with standard error on a pseudo-terminal, the signal
sent once the bar shows a finished run; the waits only guard against a hang.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.sim.study.test_sweep_signals import HANG_GUARD_S, _alive, _children, _read


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_local_sensitivity_and_its_pool(signum):
    # 20 trajectories x (factors + 1) points x 2 rounds: hundreds of runs, minutes of work left
    cmd = [sys.executable, "-c", "from kvroute.cli.main import main; main()", "sensitivity",
           "--workload", "agent", "--chats", "16", "--turns", "10", "--workers", "4", "--policies", "kv_aware",
           "--trajectories", "20", "--max-workers", "2"]
    master, terminal = pty.openpty()
    err = bytearray()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=terminal, start_new_session=True)
        os.close(terminal)
        deadline = time.monotonic() + HANG_GUARD_S
        while not re.search(rb"\| *[1-9]\d*/\d+ ", err):
            assert proc.poll() is None, err.decode(errors="replace")
            assert time.monotonic() < deadline, "sensitivity finished no run"
            _read(master, err)
        total = int(re.search(rb"\| *\d+/(\d+) ", err)[1])
        children = _children(proc.pid)
        assert children, "the local executor runs a process pool"
        if signum == signal.SIGINT:  # Ctrl-C at a terminal: to the whole process group, pool included
            os.killpg(proc.pid, signum)
        else:  # kill, timeout, a service manager: to the command alone
            proc.send_signal(signum)
        while proc.poll() is None and time.monotonic() < deadline + HANG_GUARD_S:
            _read(master, err)
        while _read(master, err, 0.5):
            pass
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = err.decode(errors="replace")
    assert code == 130, text
    assert "interrupted" in text and "Traceback" not in text, text
    finished = max(int(n) for n in re.findall(rb"\| *(\d+)/\d+ ", err))
    assert total > 100 and finished < total  # stopped, not run to the end
    time.sleep(0.2)  # reaping by init after the parent exited
    assert [c for c in children if _alive(c)] == []
