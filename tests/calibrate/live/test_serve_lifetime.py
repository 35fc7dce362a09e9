"""How long ``kvroute serve``'s servers live: a server that exits leaves the others serving
(cli/serve_command.py ``_watch``), and ``kill -9`` of serve sends each server's process
SIGTERM (calibrate/live/server.py ``_child_setup``, ``PR_SET_PDEATHSIG``). No vLLM: fake server
objects, and plain child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from kvroute.cli.serve_command import _watch


class FakeProcess:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


def _fake(port: int, log: Path, text: str = "") -> SimpleNamespace:
    log.write_text(text)
    return SimpleNamespace(url=f"http://127.0.0.1:{port}", process=FakeProcess(), log_path=log)


def test_a_dead_server_leaves_the_others_serving(tmp_path, capsys):
    a = _fake(8600, tmp_path / "a.log", "INFO ready\n[shutdown] MPClient: engine core exited unexpectedly; "
                                          "starting cleanup\n")
    b = _fake(8601, tmp_path / "b.log", "INFO ready\nsome last line\n")
    ticks = []

    def sleep(_):
        ticks.append(1)
        if len(ticks) == 2:
            a.process.returncode = 0  # the API process exits 0 after its engine was killed
        if len(ticks) == 5:
            raise KeyboardInterrupt  # Ctrl-C: the caller stops every server

    with pytest.raises(KeyboardInterrupt):
        _watch([a, b], sleep)
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (f"server http://127.0.0.1:8600 exited (code 0) after its engine died; "
                                   f"1 of 2 still serving; log {a.log_path}:")
    assert err.splitlines()[1] == "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    assert "INFO ready" not in err and "8601" not in err
    assert len(ticks) == 5  # kept watching b after a had gone


def test_serve_fails_once_every_server_has_exited(tmp_path, capsys):
    a, b = _fake(8600, tmp_path / "a.log"), _fake(8601, tmp_path / "b.log", "Traceback ...\n")
    ticks = []

    def sleep(_):
        ticks.append(1)
        if len(ticks) == 1:
            b.process.returncode = 1
        if len(ticks) == 3:
            a.process.returncode = -9

    with pytest.raises(click.ClickException, match=r"every server has exited \(2\)"):
        _watch([a, b], sleep)
    err = capsys.readouterr().err
    assert "Traceback ..." in err  # the last lines of a log that names no engine death
    lines = [line for line in err.splitlines() if line.startswith("server ")]
    assert lines == [f"server http://127.0.0.1:8601 exited with code 1; 1 of 2 still serving; log {b.log_path}:",
                     f"server http://127.0.0.1:8600 exited with code -9; log {a.log_path}:"]


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


def test_a_server_not_healthy_in_time_says_to_download_a_hub_models_weights_first(tmp_path):
    """A Hugging Face model's first start downloads its weights within serve's wait for /health
    (about 15 GB for a 7B model): the timeout's message says to download them first; a local
    model directory has nothing to download."""
    from kvroute.calibrate.live.server import ServerError, ServerSpec, VllmServer

    log = tmp_path / "vllm-8600.log"
    log.write_text("INFO Starting to load model Qwen/Qwen2.5-7B-Instruct...\n")
    hub = VllmServer(ServerSpec(model="Qwen/Qwen2.5-7B-Instruct", port=8600, log_path=log))
    hub.process = FakeProcess()
    with pytest.raises(ServerError) as failed:
        hub.wait_ready(timeout_s=0.0)
    assert str(failed.value) == (
        "vLLM server on port 8600 not healthy after 0 s; unless its weights are in the Hugging Face cache, a server "
        "of Qwen/Qwen2.5-7B-Instruct downloads them within this wait (about 15 GB for a 7B model in bf16): download "
        "them first, `hf download Qwen/Qwen2.5-7B-Instruct` (`huggingface-cli download Qwen/Qwen2.5-7B-Instruct` "
        "before huggingface_hub 0.34), then start again, or wait longer (kvroute serve --timeout); "
        f"log {log}:\nINFO Starting to load model Qwen/Qwen2.5-7B-Instruct...")
    local = VllmServer(ServerSpec(model=str(tmp_path), port=8600, log_path=log))
    local.process = FakeProcess()
    with pytest.raises(ServerError, match=r"^vLLM server on port 8600 not healthy after 0 s; log "):
        local.wait_ready(timeout_s=0.0)
