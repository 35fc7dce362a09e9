"""``kvroute serve --kv-events-port-base`` opens no listener beyond 127.0.0.1: the API on loopback,
the KV-cache events (whose ``BlockStored`` carry the prompts' token ids) on a Unix socket.

The server is a stub standing in for ``vllm serve`` (``python -m vllm.entrypoints.cli.main serve``):
a ``vllm`` package on ``PYTHONPATH`` whose command answers ``/health`` on ``--host``/``--port`` and binds or
connects a ZeroMQ PUB socket for ``--kv-events-config`` exactly as vLLM's ``ZmqEventPublisher``
decides (bind wildcard and ``ipc://`` endpoints, connect to the rest). Listeners are read from
``/proc/net/tcp`` and ``/proc/net/tcp6``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live_servers import free_port

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (the live extra brings it with vLLM)")

STUB = '''
import argparse, json, threading, zmq
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host"); parser.add_argument("--port", type=int)
parser.add_argument("--kv-events-config")
args, _ = parser.parse_known_args()
if args.kv_events_config:
    endpoint = json.loads(args.kv_events_config)["endpoint"]
    pub = zmq.Context().socket(zmq.PUB)
    # vllm/distributed/kv_events.py: ZmqEventPublisher._is_bind_endpoint
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        pub.bind(endpoint)
    else:
        pub.connect(endpoint)

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass

ThreadingHTTPServer((args.host, args.port), Health).serve_forever()
'''


def _listeners() -> set[tuple[str, int]]:
    """(address in hex as /proc shows it, port) of every TCP socket in LISTEN state."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                address, port = local.split(":")
                out.add((address, int(port, 16)))
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}
"""127.0.0.1 and ::1 as /proc/net/tcp{,6} write them."""


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="no /proc/net/tcp (not Linux)")
def test_serve_listens_on_loopback_only(tmp_path):
    stub = tmp_path / "stub" / "vllm" / "entrypoints" / "cli"
    stub.mkdir(parents=True)
    for folder in (stub.parents[1], stub.parent, stub):
        (folder / "__init__.py").write_text("")
    (stub / "main.py").write_text(STUB)
    api, events = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'stub'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", "from kvroute.cli.main import main; main()", "serve",
                             "--model", "stub-model", "-n", "1", "--port-base", str(api),
                             "--kv-events-port-base", str(events), "--log-dir", str(tmp_path), "--timeout", "60"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()  # the URL, once the server answers /health
        assert line.strip() == f"http://127.0.0.1:{api}", proc.stderr.read() if proc.poll() is not None else line
        mine = {(a, p) for a, p in _listeners() if p in (api, events)}
        assert mine == {("0100007F", api)}
        assert not (set(_listeners()) & {(a, events) for a in ("00000000", "00000000000000000000000000000000")})
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
