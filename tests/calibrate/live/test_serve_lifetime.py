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
    fake = SimpleNamespace(url=f"http://127.0.0.1:{port}", process=FakeProcess(), log_path=log, stopped=0)
    fake.stop = lambda grace_s: setattr(fake, "stopped", fake.stopped + 1)
    return fake


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
    assert (a.stopped, b.stopped) == (1, 0)  # what a left running is stopped once; b serves on


def test_stop_ends_what_a_killed_server_left_running(tmp_path):
    """A server's top process killed (kill -9) leaves its children in its process group; stop()
    ends them too (as it must a vLLM server's engine processes)."""
    from kvroute.calibrate.live.server import ServerSpec, VllmServer, group_alive

    srv = VllmServer(ServerSpec("m", 8999, log_path=str(tmp_path / "log")))
    pid_file = tmp_path / "child.pid"
    srv.process = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"p = subprocess.Popen(['sleep', '300']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"],
        start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(srv.process.pid, signal.SIGKILL)
    srv.process.wait(timeout=10)
    assert group_alive(srv.process.pid)  # the child lives on in the group
    assert srv.stop(grace_s=5.0) == -signal.SIGKILL
    assert not group_alive(srv.process.pid)
    try:  # a zombie until whoever adopted it reaps it, or gone
        assert open(f"/proc/{child}/stat").read().rsplit(") ", 1)[1][0] == "Z"
    except FileNotFoundError:
        pass


def test_group_alive_reads_state_and_group_from_proc(tmp_path):
    from kvroute.calibrate.live.server import group_alive

    for pid, name, state, group in ((10, "python", "S", 10), (11, "VLLM::Engine Core) x", "R", 10),
                                    (12, "sleep", "Z", 20), (13, "other", "S", 30)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) {state} 1 {group} {group} 0 -1 4194560\n")
    (tmp_path / "self").mkdir()
    assert group_alive(10, tmp_path) and group_alive(30, tmp_path)
    assert not group_alive(20, tmp_path)  # a zombie only
    assert not group_alive(99, tmp_path)


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
