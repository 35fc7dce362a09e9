"""Where planned vLLM CPU servers put their engines and API processes (calibrate/live/server.py)."""

import dataclasses
import re

import pytest

from kvroute.calibrate.live import server
from kvroute.calibrate.live.server import plan_servers


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(server, "detect_gpus", lambda: [])
    monkeypatch.setattr(server, "cpu_cores", lambda: [0, 1])


@pytest.mark.parametrize("api_cores,expected", [
    ("spare", [None, None]),  # no core without an engine: the API processes float
    ("own", [(0,), (1,)]),
    ("any", [None, None]),
])
def test_api_processes_on_two_engines_cores(two_cores, api_cores, expected):
    specs = plan_servers("m", 2, api_cores=api_cores)
    assert [s.cpu_core for s in specs] == [0, 1]
    assert [s.frontend_cores for s in specs] == expected


def test_a_spare_core_takes_the_api_process_unless_asked_otherwise(two_cores):
    assert plan_servers("m", 1)[0].frontend_cores == (1,)
    assert plan_servers("m", 1, api_cores="own")[0].frontend_cores == (0,)


def test_unknown_placement_is_refused(two_cores):
    with pytest.raises(ValueError, match=r"api_cores must be one of \['any', 'own', 'spare'\], got 'mine'"):
        plan_servers("m", 2, api_cores="mine")


def test_kv_events_get_a_port_per_server(two_cores):
    import json

    from kvroute.calibrate.live.server import kv_events_dir

    specs = plan_servers("m", 2, port_base=8300, kv_events_port_base=8400)
    sockets = [f"ipc://{kv_events_dir()}/kv-events-8400.sock", f"ipc://{kv_events_dir()}/kv-events-8401.sock"]
    assert [s.kv_events_endpoint for s in specs] == sockets
    cmd = specs[1].command()
    config = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    # an API on loopback publishes its events on a Unix socket (vLLM binds only wildcard and
    # ipc endpoints), never on every interface: BlockStored events carry the prompts' token ids
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": sockets[1]}
    exposed = dataclasses.replace(specs[1], host="0.0.0.0")
    cmd = exposed.command()
    assert json.loads(cmd[cmd.index("--kv-events-config") + 1])["endpoint"] == "tcp://*:8401"
    assert exposed.kv_events_endpoint == "tcp://0.0.0.0:8401"
    plain = plan_servers("m", 2)
    assert [s.kv_events_endpoint for s in plain] == [None, None]
    assert "--kv-events-config" not in plain[0].command()


@pytest.mark.parametrize("kw, message", [
    ({"port_base": -3}, "port base -3: 2 server(s) need ports -3..-2, which must lie in 1..65535"),
    ({"port_base": 65535}, "port base 65535: 2 server(s) need ports 65535..65536, which must lie in 1..65535"),
    ({"kv_events_port_base": -5}, "KV-events port base -5: 2 server(s) need ports -5..-4, which must lie in 1..65535"),
    ({"kv_events_port_base": 70000}, "KV-events port base 70000: 2 server(s) need ports 70000..70001"),
])
def test_ports_outside_the_tcp_range_are_refused(two_cores, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_servers("m", 2, **kw)
