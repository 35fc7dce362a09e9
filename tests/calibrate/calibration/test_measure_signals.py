"""SIGTERM stops ``kvroute calibrate measure`` the way Ctrl-C does (issue 35, item 5): the rows
measured so far are kept, ``meta.json`` says ``interrupted`` (not ``running``), the Parquet copy is
written, and the exit code is 130.

The command runs in a real process (signals cannot be tested in-process) against the fake vLLM
server of ``test_calibrate``. The signal is sent once rows are on disk, so the test does not
depend on the machine's speed; the wait is only a guard against a hang.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from tests.calibrate.calibration.test_calibrate import fake_server  # noqa: F401 - the fixture

HANG_GUARD_S = 120


def _rows(path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except OSError:
        return 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_measure_and_keeps_rows_and_meta(fake_server, tmp_path, signum):  # noqa: F811
    server = fake_server()
    out = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-c", "from kvroute.cli.main import main; main()", "calibrate", "measure",
           "--url", server.url, "--out", str(out), "--preset", "quick", "--no-bursts", "--no-progress"]
    with open(err, "w") as err_file:
        # SIGINT restored for the child: a shell without job control starts it ignored
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while _rows(out / "requests.csv") < 3:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the sweep measured no row"
            time.sleep(0.05)
        proc.send_signal(signum)
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.read_text()
    assert code == 130, text
    assert "interrupted:" in text and "Traceback" not in text, text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "interrupted" and "finished" in meta
    kept = _rows(out / "requests.csv")
    assert kept >= 3
    assert len(pd.read_parquet(out / "requests.parquet")) == kept
