"""Ctrl-C and SIGTERM stop a local ``kvroute sweep``: no pool process left, finished rows kept.

The sweep runs in a real process (signals cannot be tested in-process), its standard error on a
pseudo-terminal as when a person presses Ctrl-C (a bar shows on a terminal only). The signal is
sent once the progress bar shows a finished run, so the test does not depend on the machine's
speed; the generous wait is only a guard against a hang, not a speed claim.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

HANG_GUARD_S = 120


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read(master: int, buffer: bytearray, timeout: float = 0.1) -> bool:
    """Append what the terminal ``master`` has to ``buffer``; False once the other side closed."""
    ready, _, _ = select.select([master], [], [], timeout)
    if not ready:
        return True
    try:
        chunk = os.read(master, 65536)
    except OSError:  # EIO: every process holding the terminal exited
        return False
    buffer += chunk
    return bool(chunk)


def signal_after_first_run(cmd: list[str], signum: int, group: bool = False) -> tuple[int, str, list[int]]:
    """Run ``cmd`` (a local-pool command) with standard error on a pseudo-terminal; once its bar
    shows a finished run, send ``signum`` to it (``group``: to its whole process group, as a
    terminal's Ctrl-C does). Returns its exit code, what it wrote to standard error and the pool
    processes it had when signalled."""
    master, terminal = pty.openpty()
    err = bytearray()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=terminal, start_new_session=True)
        os.close(terminal)
        deadline = time.monotonic() + HANG_GUARD_S
        while not re.search(rb"\| *[1-9]\d*/\d+ ", err):
            assert proc.poll() is None, err.decode(errors="replace")
            assert time.monotonic() < deadline, "the command finished no run"
            _read(master, err)
        children = _children(proc.pid)
        assert children, "the local executor runs a process pool"
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        while proc.poll() is None and time.monotonic() < deadline + HANG_GUARD_S:
            _read(master, err)  # keep reading: a full terminal would block the command's last lines
        while _read(master, err, 0.5):
            pass
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, err.decode(errors="replace"), children


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_local_sweep_and_keeps_finished_rows(tmp_path, signum):
    out = tmp_path / "rows.csv"
    cmd = [sys.executable, "-c", "from kvroute.cli.main import main; main()", "sweep",
           "--workload", "agent", "--chats", "16", "--turns", "10", "--workers", "2,4,8", "--policies", "kv_aware",
           "--rounds", "20", "--max-workers", "2", "--out", str(out)]
    code, text, children = signal_after_first_run(cmd, signum)
    assert code == 130, text
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
    assert f"interrupted ({name}):" in text
    assert "Traceback" not in text and "Error" not in text, text
    time.sleep(0.2)  # reaping by init after the parent exited
    assert [c for c in children if _alive(c)] == []
    rows = pd.read_csv(out)
    assert 1 <= len(rows) < 60
    assert rows["partial"].all()
    assert out.with_name("rows.scenario.yaml").exists()  # how to run the rest
    assert list(out.parent.glob(".*tmp*")) == []  # no temporary file left behind


def test_sweep_api_raises_with_finished_rows(monkeypatch):
    """In-process: a KeyboardInterrupt mid-sweep becomes SweepInterrupted with the rows done."""
    from kvroute.sim.study import sweep as sweep_module

    calls = {"n": 0}
    real = sweep_module._run_task

    def task(t):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(t)

    monkeypatch.setattr(sweep_module, "_run_task", task)
    scenarios = sweep_module.grid(chats=2, turns=1, workers=[1, 2])
    with pytest.raises(sweep_module.SweepInterrupted) as info:
        sweep_module.sweep(scenarios, rounds=2, executor="sequential", progress=False)
    assert len(info.value.frame) == 2 and info.value.total == 4
    assert info.value.frame["partial"].all()
    assert info.value.signal_name == "SIGINT"


def test_sweep_stopped_after_its_runs_writes_every_row(tmp_path, monkeypatch):
    """In-process: SIGTERM while ``sweep --out`` writes its rows is held until the rows, scenario
    and report are written; then exit 130 with a line saying the results are whole (before, the
    write was cut and the runs lost)."""
    from click.testing import CliRunner

    from kvroute.cli import sweep_command
    from kvroute.cli.main import cli

    real = sweep_command._write_rows

    def write_rows(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs at the next bytecode
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_command, "_write_rows", write_rows)
    out = tmp_path / "rows.csv"
    done = CliRunner().invoke(cli, ["sweep", "--chats", "2", "--turns", "2", "--workers", "1,2", "--rounds", "2",
                                    "--executor", "sequential", "--out", str(out)])
    assert done.exit_code == 130, done.output
    assert f"interrupted (SIGTERM) after every run finished: the results above and in {out} are whole" in done.output
    rows = pd.read_csv(out)
    assert len(rows) == 2 * 2 * 3 and not rows.get("partial", pd.Series([False])).any()  # 2 sizes x 2 rounds x 3 policies
    assert out.with_name("rows.report.html").exists() and out.with_name("rows.scenario.yaml").exists()
