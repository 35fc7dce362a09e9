"""Ctrl-C and SIGTERM stop a local ``kvroute sensitivity`` with work left: exit code 130, no pool
process left, no traceback. Its pool is ``executors.run_tasks``', as sweep's and compare's.

Driven as ``test_sweep_signals``' sweep: the signal is sent once the bar shows a finished run.
"""

from __future__ import annotations

import re
import signal
import sys
import time

import pytest

from tests.sim.study.test_sweep_signals import _alive, signal_after_first_run


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_local_sensitivity_and_its_pool(signum):
    # 20 trajectories x (factors + 1) points x 2 rounds: hundreds of runs, minutes of work left
    cmd = [sys.executable, "-c", "from kvroute.cli.main import main; main()", "sensitivity",
           "--workload", "agent", "--chats", "16", "--turns", "10", "--workers", "4", "--policies", "kv_aware",
           "--trajectories", "20", "--max-workers", "2"]
    # SIGINT as Ctrl-C at a terminal sends it: to the whole process group, the pool included
    code, text, children = signal_after_first_run(cmd, signum, group=signum == signal.SIGINT)
    assert code == 130, text
    assert "interrupted" in text and "Traceback" not in text, text
    bars = [(int(done), int(total)) for done, total in re.findall(r"\| *(\d+)/(\d+) ", text)]
    assert bars[0][1] > 100 and max(done for done, _ in bars) < bars[0][1]  # stopped, not run to the end
    time.sleep(0.2)  # reaping by init after the parent exited
    assert [c for c in children if _alive(c)] == []
