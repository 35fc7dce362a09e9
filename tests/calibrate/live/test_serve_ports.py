"""A port already in use fails ``kvroute serve`` before it says or starts anything
(calibrate/live/server.check_ports); before, it printed "starting ..." and then failed."""

from __future__ import annotations

import contextlib
import socket

import pytest

from kvroute.calibrate.live import cores, server
from kvroute.calibrate.live.server import ServerError, ServerSpec, check_ports


@contextlib.contextmanager
def listening(host: str = "127.0.0.1"):
    """A port taken by a listening socket, as a running server holds it."""
    with socket.socket() as s:
        s.bind((host, 0))
        s.listen()
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_taken_port_is_named_in_one_line():
    with listening() as a, listening() as b:
        free = _free_port()
        check_ports([ServerSpec("m", port=free)])  # nothing taken: nothing said
        with pytest.raises(ServerError) as err:
            check_ports([ServerSpec("m", port=a), ServerSpec("m", port=free), ServerSpec("m", port=b)])
    assert str(err.value) == (f"ports {a}, {b} on 127.0.0.1 are already in use (another server there? --port-base "
                              "picks other ports)")


def test_a_kv_event_port_counts_where_it_is_tcp():
    with listening("0.0.0.0") as taken:
        api = _free_port()
        check_ports([ServerSpec("m", port=api, kv_events_port=taken)])  # loopback: a Unix socket, not the port
        with pytest.raises(ServerError) as err:
            check_ports([ServerSpec("m", port=api, kv_events_port=taken, host="0.0.0.0")])
    assert str(err.value) == (f"port {taken} on 0.0.0.0 is already in use (another server there? "
                              "--kv-events-port-base picks other ports)")


def _not_started(self, timeout_s):
    raise ServerError("not started in this test")


def test_serve_on_a_taken_port_fails_first_and_starts_nothing(monkeypatch, tmp_path):
    import importlib.util
    import signal

    from click.testing import CliRunner

    from kvroute.cli.main import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])
    monkeypatch.setattr(cores, "pinned_servers", lambda: [])
    started = []
    monkeypatch.setattr(server.VllmServer, "start", lambda self: started.append(self.spec.port))
    monkeypatch.setattr(server.VllmServer, "wait_ready", _not_started)
    with listening() as port:
        result = CliRunner().invoke(cli, ["serve", "--model", str(tmp_path), "-n", "1", "--port-base", str(port),
                                          "--log-dir", str(tmp_path)])
    assert result.exit_code == 1 and started == []
    assert result.output == (f"Error: port {port} on 127.0.0.1 is already in use (another server there? "
                             "--port-base picks other ports)\n")


def test_a_kv_event_socket_a_running_server_publishes_on_is_taken_and_a_leftover_file_is_not(monkeypatch, tmp_path):
    """On loopback the KV events go through ``<dir>/kv-events-<port>.sock``: a second serve with the
    same --kv-events-port-base had removed a running server's socket as if a killed one had left it."""
    monkeypatch.setattr(server, "kv_events_dir", lambda: tmp_path)
    api = _free_port()
    spec = ServerSpec("m", port=api, kv_events_port=5557)
    sock = tmp_path / "kv-events-5557.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as publisher:
        publisher.bind(str(sock))
        publisher.listen()
        with pytest.raises(ServerError) as err:
            check_ports([spec])
        assert str(err.value) == (f"KV-event socket {sock} is already in use (another server there? "
                                  "--kv-events-port-base picks other ports)")
        with pytest.raises(ServerError, match="KV-event socket .* is already in use"):
            server.VllmServer(spec).start()
        assert sock.exists()  # the running server's socket is left alone
    assert sock.exists()  # closed: a file left behind, refusing connections
    check_ports([spec])
