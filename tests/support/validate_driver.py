"""Run ``kvroute validate`` in a subprocess and press Ctrl-C once the live replay is under way
(shared by the fake-server and the real-server tests)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

_CODE = ("import sys; from kvroute.cli.validate_command import validate; "
         "validate(sys.argv[1:], prog_name='kvroute validate')")


def interrupt_validate(trace: Path, urls: list[str], profile: str, out: Path, settle_s: float,
                       timeout_s: float, ready=None, extra: tuple[str, ...] = (),
                       signum: int = signal.SIGINT) -> tuple[int, str, dict]:
    """Validate round_robin then kv_aware one request at a time, send SIGINT (or ``signum``) ``settle_s`` seconds
    after the first "replaying" line (or after ``timeout_s`` without one) or, given ``ready``, as
    soon as ``ready()`` is true after that line (an event, robust on a loaded machine); returns
    the exit code, stderr and the report written to ``out``. ``extra``: more arguments; ``signum``:
    the signal sent (SIGTERM, as a service manager or ``timeout`` sends, must stop it the same way)."""
    args = [sys.executable, "-c", _CODE, "--trace", str(trace)]
    for url in urls:
        args += ["--url", url]
    args += ["--policies", "round_robin,kv_aware", "--profile", profile, "--out", str(out),
             "--max-in-flight", "1", "--rounds", "1", *extra]
    # NOTE: a shell without job control starts background commands with SIGINT ignored, and a
    # Python started with SIGINT ignored keeps ignoring it: Ctrl-C is restored for the child.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and "replaying" not in proc.stderr.readline():
        pass
    if ready is None:
        time.sleep(settle_s)
    else:
        while time.monotonic() < deadline and not ready():
            time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=timeout_s)
    doc = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc.returncode, err, doc
