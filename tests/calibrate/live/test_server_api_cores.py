"""A running server's API process pinned to a core (``kvroute serve --api-cores spare`` moves it
there once the server is up) is found too, engines go to cores of neither an engine nor an API
process first, and an engine that must share an API process's only core is warned of, naming the
server (calibrate/live/cores.py: pinned_servers, api_cores_in_use; calibrate/live/plan.py: plan_servers,
core_notes)."""

import contextlib
import importlib.util
import signal
import socket

import pytest
from click.testing import CliRunner

from kvroute.calibrate.live import cores, plan, server
from kvroute.calibrate.live.plan import plan_servers
from tests.calibrate.live.test_server_plan import _fake_proc

FIRST = "the vLLM server on port 8800 (PID 101, of kvroute serve PID 100)"


@pytest.fixture
def first_serve(tmp_path):
    """``kvroute serve -n 1 --port-base 8800`` on a 2-core machine, up: its engine on core 0, its
    API process moved to the spare core 1."""
    proc = tmp_path / "proc"
    proc.mkdir()
    py = "/usr/bin/python"
    _fake_proc(proc, 100, [py, "-c", "from kvroute.cli.main import main; main()", "serve", "--model", "tiny-qwen2",
                           "-n", "1", "--port-base", "8800"])
    _fake_proc(proc, 101, [py, "-m", "kvroute.calibrate.live.vllm_serve", "serve", "/m", "--port", "8800"], ppid=100,
               allowed="1", bind="0")
    _fake_proc(proc, 102, ["VLLM::EngineCore"], ppid=101, allowed="0", environ=False)
    _fake_proc(proc, 103, ["VLLM::Worker"], ppid=102, allowed="0", environ=False)
    return proc


def test_the_api_processs_core_is_found_apart_from_the_engines(first_serve):
    found = cores.pinned_servers(first_serve, own_cores=[0, 1])
    assert found == [cores.PinnedServer(101, (0,), FIRST, (1,))]
    assert cores.engine_cores_in_use(found) == {0: FIRST}
    assert cores.api_cores_in_use(found) == {(1,): FIRST}


def test_api_server_processes_of_a_multi_api_server_count_once_under_their_server(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    _fake_proc(proc, 200, ["/usr/bin/vllm", "serve", "/m", "--port", "9000", "--api-server-count", "2"],
               allowed="0-3", bind="0")
    _fake_proc(proc, 201, ["VLLM::APIServer_0"], ppid=200, allowed="2", environ=False)
    _fake_proc(proc, 202, ["VLLM::APIServer_1"], ppid=200, allowed="3", environ=False)
    _fake_proc(proc, 203, ["VLLM::EngineCore"], ppid=200, allowed="0", environ=False)
    found = cores.pinned_servers(proc, own_cores=[0, 1, 2, 3])
    assert found == [cores.PinnedServer(200, (0,), "the vLLM server on port 9000 (PID 200)", (2, 3))]


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1, 2, 3])


def test_engines_go_to_cores_of_neither_first_and_a_trapped_api_process_is_warned_of(four_cores):
    taken, api = {0: "A"}, {(1,): "A"}
    one = plan_servers("m", 1, 8810, taken=taken, api_taken=api)
    assert [(s.cpu_core, s.frontend_cores) for s in one] == [(2, (1, 3))]  # API processes may share a core
    assert plan.core_notes(one, taken, api) == [
        "note: CPU core 0 runs the engine of A; so this serve's engine runs on core 2"]
    three = plan_servers("m", 3, 8810, taken=taken, api_taken=api)
    assert [s.cpu_core for s in three] == [2, 3, 1]
    assert plan.core_notes(three, taken, api) == [
        "note: CPU core 0 runs the engine of A; so this serve's engines run on cores 2, 3, 1",
        "warning: CPU core 1 runs the API process of A; the engine of the server on port 8812 will share it and "
        "run slower while that server serves (start it with --api-cores own, or start fewer servers)",
        "warning: the API processes of the servers on ports 8810, 8811, 8812 may run on CPU core 0, which runs the "
        "engine of A, and slow that engine at random (with --api-cores own each stays on its own engine's core)"]


def test_an_api_process_with_a_core_left_to_it_is_no_warning(four_cores):
    taken, api = {0: "A"}, {(1, 2, 3): "A"}  # A started with -n 1 on 4 cores: its API process on 1-3
    one = plan_servers("m", 1, 8810, taken=taken, api_taken=api)
    assert [(s.cpu_core, s.frontend_cores) for s in one] == [(1, (2, 3))]
    assert plan.core_notes(one, taken, api) == [
        "note: CPU core 0 runs the engine of A; so this serve's engine runs on core 1"]
    every = plan_servers("m", 3, 8810, taken=taken, api_taken=api)
    assert plan.core_notes(every, taken, api)[1] == (
        "warning: CPU cores 1, 2, 3 run the API process of A; the engine of the servers on ports 8810, 8811, 8812 "
        "will share them and run slower while that server serves (start it with --api-cores own, or start fewer "
        "servers)")


def test_a_second_serves_floating_api_process_is_warned_of_on_the_first_ones_engine_core(first_serve, monkeypatch):
    """``serve -n 1`` then ``serve -n 1 --port-base 8810`` on 2 cores: the second's engine takes
    core 1 and no core is spare for its API process, which floats over core 0, the first server's
    engine's; with --api-cores own it stays on core 1 and only the shared API core is warned of."""
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])
    found = cores.pinned_servers(first_serve, own_cores=[0, 1])
    taken, api = cores.engine_cores_in_use(found), cores.api_cores_in_use(found)
    spare = plan_servers("m", 1, 8810, taken=taken, api_taken=api)
    assert [(s.cpu_core, s.frontend_cores) for s in spare] == [(1, None)]
    shared_api_core = (f"warning: CPU core 1 runs the API process of {FIRST}; the engine of the server on port 8810 "
                       "will share it and run slower while that server serves (start it with --api-cores own, or "
                       "start fewer servers)")
    assert plan.core_notes(spare, taken, api) == [
        f"note: CPU core 0 runs the engine of {FIRST}; so this serve's engine runs on core 1",
        shared_api_core,
        f"warning: the API process of the server on port 8810 may run on CPU core 0, which runs the engine of "
        f"{FIRST}, and slow that engine at random (with --api-cores own it stays on its own engine's core)"]
    own = plan_servers("m", 1, 8810, api_cores="own", taken=taken, api_taken=api)
    assert [(s.cpu_core, s.frontend_cores) for s in own] == [(1, (1,))]
    assert plan.core_notes(own, taken, api) == [
        f"note: CPU core 0 runs the engine of {FIRST}; so this serve's engine runs on core 1", shared_api_core]


def test_a_second_serve_warns_that_its_engine_shares_the_first_ones_api_core(first_serve, monkeypatch, tmp_path):
    """The trial's case: ``serve -n 1`` then ``serve -n 1 --port-base 8810`` on 2 cores (no server
    is started here)."""
    from kvroute.cli.main import cli

    real_find, real_pinned = importlib.util.find_spec, cores.pinned_servers
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find(name, *a))
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])
    monkeypatch.setattr(cores, "pinned_servers", lambda: real_pinned(first_serve, own_cores=[0, 1]))

    @contextlib.contextmanager
    def not_started(specs, timeout_s):
        raise server.ServerError("not started in this test")
        yield

    monkeypatch.setattr(server, "serve_many", not_started)
    with socket.socket() as s:  # a free port for the plan's port check
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(cli, ["serve", "--model", str(tmp_path), "-n", "1", "--port-base", str(port),
                                      "--log-dir", str(tmp_path)])
    assert result.output.splitlines()[:4] == [
        f"note: CPU core 0 runs the engine of {FIRST}; so this serve's engine runs on core 1",
        f"warning: CPU core 1 runs the API process of {FIRST}; the engine of the server on port {port} will share it "
        "and run slower while that server serves (start it with --api-cores own, or start fewer servers)",
        f"warning: the API process of the server on port {port} may run on CPU core 0, which runs the engine of "
        f"{FIRST}, and slow that engine at random (with --api-cores own it stays on its own engine's core)",
        f"starting http://127.0.0.1:{port} on CPU core 1 (log {tmp_path / f'vllm-{port}.log'})"]
