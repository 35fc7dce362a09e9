"""Start, watch and stop vLLM OpenAI-compatible servers as subprocesses.

One :class:`VllmServer` is one ``vllm serve`` process (run with this Python through
:mod:`kvroute.calibrate.live.vllm_serve`, which also starts vLLM's CPU build, whose ``vllm``
command cannot find its own version) with its own log file: ``vllm serve`` is the
entry point that honours ``--api-server-count`` (``entrypoints/cli/serve.py``; ``python -m
vllm.entrypoints.openai.api_server`` runs one API process whatever it is told, and is deprecated
by 0.32, where it warns). :func:`serve_many` starts the servers of a plan
(:func:`kvroute.calibrate.live.plan.plan_servers`: one per GPU, ``CUDA_VISIBLE_DEVICES``, or several
per GPU splitting its memory, or, on a machine without GPUs, one per CPU core,
``VLLM_CPU_OMP_THREADS_BIND``, the vLLM CPU build), waits until every ``GET /health`` answers 200,
moves a CPU server's API processes off its engine's core (:mod:`kvroute.calibrate.live.cores`) and
stops them all on exit: SIGINT, then SIGTERM, then SIGKILL. A server's process dies with
``kvroute serve`` (``PR_SET_PDEATHSIG``).

``VLLM_SERVER_DEV_MODE=1`` is set so that ``POST /reset_prefix_cache`` and ``GET /server_info``
(the engine's full configuration) work; ``--enable-prompt-tokens-details`` makes the streamed
usage report cached prompt tokens. ``HF_HUB_OFFLINE=1`` is set only when the model is a local
directory (a fresh machine must download a Hugging Face id's weights).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvroute.calibrate.live.cores import api_processes, cpu_cores, set_affinity


class ServerError(RuntimeError):
    """A vLLM server did not start or died; the message names the log file and its last lines."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to start one vLLM server.

    Attributes:
        model: model directory or Hugging Face id.
        port: TCP port on 127.0.0.1 (``host`` to change).
        served_model_name: name clients use in requests; default: ``model``.
        block_size: KV block size, tokens (a multiple of 32 on the CPU backend).
        gpu_memory_utilization: vLLM's flag (GPU only; None leaves vLLM's default).
        cpu_core: run the engine (engine-core process and model worker, whose OpenMP threads
            ``VLLM_CPU_OMP_THREADS_BIND`` pins) on this core (CPU backend); None: no pinning.
        frontend_cores: once the server is up, move the API-server process to these cores; None:
            every core this process may use. Keeping the API server (and the measuring client)
            off the engine's core is what makes step times reproducible on a small machine: the
            engine core busy-waits for its worker, and sharing a core with the API server made
            decode steps up to three times slower, at random.
        cuda_device: expose only this GPU (``CUDA_VISIBLE_DEVICES``): an index, or a UUID or MIG id
            as ``CUDA_VISIBLE_DEVICES`` may name it, or a tuple of them for a tensor-parallel
            server; None: no change.
        tensor_parallel_size: GPUs one server spans (vLLM's ``--tensor-parallel-size``); 1: the
            flag is not passed.
        kv_cache_gib: KV cache size on the CPU backend (``VLLM_CPU_KVCACHE_SPACE``), GiB.
        max_model_len: ``--max-model-len``; None: the model's own limit.
        extra_args: more vLLM command-line arguments, passed as they are.
        kv_events_port: publish KV-cache events on this TCP port (vLLM's ``--kv-events-config``,
            ZeroMQ publisher, reachable no further than the API: :attr:`kv_events_endpoint`
            subscribes): the ``events`` cache view and the live records' engine first-token times
            read them. None: no events.
        host: interface to bind.
        log_path: file receiving the server's stdout and stderr; default ``vllm-<port>.log`` in
            the current directory.
    """

    model: str
    port: int = 8100
    served_model_name: str | None = None
    block_size: int | None = 32
    gpu_memory_utilization: float | None = None
    cpu_core: int | None = None
    frontend_cores: tuple[int, ...] | None = None
    cuda_device: int | str | tuple[int | str, ...] | None = None
    tensor_parallel_size: int = 1
    kv_cache_gib: float | None = 1.0
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    kv_events_port: int | None = None
    host: str = "127.0.0.1"
    log_path: Path | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8100``."""
        return f"http://{self.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        """ZeroMQ endpoint to subscribe to the server's KV-cache events; None without
        ``kv_events_port``.

        On a loopback ``host`` (the default 127.0.0.1) it is a Unix socket,
        ``ipc://<tmp>/kvroute-<uid>/kv-events-<port>.sock`` in a folder only this user may
        enter: vLLM's ZeroMQ publisher binds only wildcard and ``ipc://`` endpoints
        (``vllm/distributed/kv_events.py: ZmqEventPublisher._is_bind_endpoint``; a
        ``tcp://127.0.0.1:PORT`` it would connect to, not listen on), and a wildcard would publish
        the prompts' token ids (``BlockStored.token_ids``) on every interface while the API
        listens on loopback. On any other ``host`` the API is already exposed, and the events
        are published on ``tcp://*:<port>`` and subscribed to at ``tcp://<host>:<port>``.
        """
        if self.kv_events_port is None:
            return None
        if _loopback(self.host):
            return f"ipc://{kv_events_dir() / f'kv-events-{self.kv_events_port}.sock'}"
        return f"tcp://{self.host}:{self.kv_events_port}"

    @property
    def kv_events_publish(self) -> str | None:
        """The endpoint vLLM's publisher binds (``--kv-events-config``'s ``endpoint``): the
        ``ipc://`` socket of :attr:`kv_events_endpoint` on a loopback ``host``, else
        ``tcp://*:<port>``; None without ``kv_events_port``."""
        if self.kv_events_port is None:
            return None
        if _loopback(self.host):
            return self.kv_events_endpoint
        return f"tcp://*:{self.kv_events_port}"

    def command(self) -> list[str]:
        """The server's command line (``vllm serve MODEL ...``)."""
        cmd = [
            sys.executable, "-m", "kvroute.calibrate.live.vllm_serve", "serve", self.model,
            "--served-model-name", self.served_model_name or self.model,
            "--host", self.host,
            "--port", str(self.port),
            "--enable-prompt-tokens-details",
        ]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.kv_events_port is not None:
            cmd += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                      "endpoint": self.kv_events_publish})]
        return cmd + list(self.extra_args)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: ``base`` (default ``os.environ``) plus vLLM's settings."""
        env = dict(os.environ if base is None else base)
        if Path(self.model).expanduser().exists():  # a local model: no reason to reach the Hub
            env.setdefault("HF_HUB_OFFLINE", "1")
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if self.cpu_core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.cpu_core)
        if self.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
        if self.cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices_text
            # the indices are nvidia-smi's (PCI bus order); CUDA's own default is fastest first
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return env

    @property
    def devices_text(self) -> str:
        """The GPUs as ``CUDA_VISIBLE_DEVICES`` names them (``"0"``, ``"0,1,2,3"``); "" for none."""
        devices = self.cuda_device if isinstance(self.cuda_device, tuple) else (self.cuda_device,)
        return ",".join(str(d) for d in devices if d is not None)


def _loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def machine_key(host: str) -> str:
    """The machine a URL's ``host`` names, as a key: ``"loopback"`` for every name of this
    machine (``localhost``, loopback addresses, ``0.0.0.0``, which a client connects to here),
    else the name lower-cased. Two URLs with the same key and port name the same server."""
    host = host.lower()
    return "loopback" if host == "0.0.0.0" or _loopback(host) else host


def kv_events_dir() -> Path:
    """The folder of the servers' KV-cache event sockets: ``<tmp>/kvroute-<uid>``
    (``tempfile.gettempdir()``), created by :meth:`VllmServer.start` with mode 0700."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"kvroute-{os.getuid()}"


def _health(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _socket_in_use(path: Path) -> bool:
    """Whether a process listens on the Unix socket ``path`` (a running server's KV-event
    publisher); a file left by a killed server refuses the connection, and no file is free."""
    import socket

    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _ipc_path(endpoint: str | None) -> Path | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return Path(endpoint.removeprefix("ipc://")) if endpoint and endpoint.startswith("ipc://") else None


def check_ports(specs: Sequence[ServerSpec]) -> None:
    """Fail before anything starts if a port ``specs`` would listen on is taken: each server's API
    port on its ``host``, and its KV-event port where that is TCP, or, on loopback, where the
    events go through a Unix socket (:attr:`ServerSpec.kv_events_endpoint`), that socket when a
    running server publishes on it (a file a killed server left is not in use).

    Raises:
        ServerError: one line naming every taken port and its interface, e.g. ``port 8700 on
            127.0.0.1 is already in use (another server there? --port-base picks other ports)``,
            and every KV-event socket in use.
    """
    busy: dict[str, list[int]] = {}
    sockets: list[str] = []
    options: dict[str, None] = {}  # the options that choose the taken ports, in order
    for spec in specs:
        wanted = [(spec.port, "--port-base")]
        if spec.kv_events_port is not None and not _loopback(spec.host):
            wanted.append((spec.kv_events_port, "--kv-events-port-base"))
        for port, option in wanted:
            if not _port_free(spec.host, port):
                busy.setdefault(spec.host, []).append(port)
                options[option] = None
        sock = _ipc_path(spec.kv_events_publish)
        if sock is not None and _socket_in_use(sock):
            sockets.append(str(sock))
            options["--kv-events-port-base"] = None
    if busy or sockets:
        where = [f"{'port' if len(ports) == 1 else 'ports'} {', '.join(map(str, ports))} on {host}"
                 for host, ports in busy.items()]
        if sockets:
            where.append(f"KV-event socket{'s' if len(sockets) > 1 else ''} {', '.join(sockets)}")
        verb = "are" if sum(map(len, busy.values())) + len(sockets) > 1 else "is"
        raise ServerError(f"{'; '.join(where)} {verb} already in use (another server there? {' and '.join(options)} "
                          f"{'pick' if len(options) > 1 else 'picks'} other ports)")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def download_hint(model: str) -> str | None:
    """What to do when a server of ``model`` is slow to start because it downloads the weights:
    None for a local directory, else the advice to download them first (``hf download``, the
    Hugging Face CLI from huggingface_hub 0.34; ``huggingface-cli download`` before it) into the
    cache vLLM reads, or to wait longer."""
    if Path(model).expanduser().exists():
        return None
    return (f"unless its weights are in the Hugging Face cache, a server of {model} downloads them within this wait "
            f"(about 15 GB for a 7B model in bf16): download them first, `hf download {model}` "
            f"(`huggingface-cli download {model}` before huggingface_hub 0.34), then start again, or wait longer "
            f"(kvroute serve --timeout)")


@dataclass
class VllmServer:
    """One vLLM server process.

    Args:
        spec: how to start it.

    Attributes:
        process: the ``Popen`` once started, else None.
        log_path: where its output goes.
    """

    spec: ServerSpec
    process: subprocess.Popen | None = field(default=None, init=False)
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = Path(self.spec.log_path or f"vllm-{self.spec.port}.log")

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where its KV-cache events can be subscribed to (``ServerSpec.kv_events_endpoint``)."""
        return self.spec.kv_events_endpoint

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return self.spec.url

    def start(self) -> None:
        """Launch the process (returns at once; see :meth:`wait_ready`).

        Raises:
            ServerError: if the port, or the KV-event socket (a running server's), is already taken.
        """
        if not _port_free(self.spec.host, self.spec.port):
            raise ServerError(f"port {self.spec.port} on {self.spec.host} is already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sock = _ipc_path(self.spec.kv_events_endpoint)
        if sock is not None:
            if _socket_in_use(sock):
                raise ServerError(f"KV-event socket {sock} is already in use (another server publishes there; "
                                  "--kv-events-port-base picks another)")
            sock.parent.mkdir(mode=0o700, exist_ok=True)
            sock.parent.chmod(0o700)
            sock.unlink(missing_ok=True)  # left by a server that was killed
        log = open(self.log_path, "ab")
        preexec = _child_setup(self.spec.cpu_core)
        try:
            self.process = subprocess.Popen(
                self.spec.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.spec.environment(),
                start_new_session=True,  # our own process group: stop() signals the whole tree
                preexec_fn=preexec,
            )
        finally:
            log.close()

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            ServerError: the process exited, or ``timeout_s`` passed; with the log's last lines
                and, for a model that is not a local directory, the advice to download its
                weights first (:func:`download_hint`).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"vLLM server on port {self.spec.port} exited with code {self.process.returncode}; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if _health(self.url):
                if self.spec.cpu_core is not None and self.process is not None:
                    # the engine-core and worker processes were forked pinned to the engine's
                    # core; only the API processes move
                    for pid in api_processes(self.process.pid):
                        set_affinity(pid, self.spec.frontend_cores or cpu_cores())
                return
            time.sleep(0.5)
        hint = download_hint(self.spec.model)
        raise ServerError(
            f"vLLM server on port {self.spec.port} not healthy after {timeout_s:.0f} s"
            f"{f'; {hint}' if hint else ''}; log {self.log_path}:\n{_tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 20.0) -> int | None:
        """Stop the server and every process it started: SIGINT to its process group, then
        SIGTERM, then SIGKILL, each until the group is empty or its wait (``grace_s``, 10 s, 10 s)
        runs out. A server whose top process already exited (killed, or its API process died)
        may have left its engine processes running in the group; they are stopped the same way.
        Once it has exited, remove its ``ipc://`` KV-event socket file (vLLM leaves it behind).

        Returns:
            The top process's exit code, or None if it was never started.
        """
        proc = self.process
        if proc is None:
            return None
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None and not group_alive(proc.pid):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + wait
            while (proc.poll() is None or group_alive(proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
        code = proc.poll()
        events = self.spec.kv_events_endpoint
        if code is not None and events is not None and events.startswith("ipc://"):
            with contextlib.suppress(OSError):
                Path(events.removeprefix("ipc://")).unlink(missing_ok=True)
        return code


def group_alive(pgid: int, proc: str | Path = "/proc") -> bool:
    """Whether process group ``pgid`` still has a running member (not a zombie), read from
    ``proc`` (Linux's ``/proc``: each ``PID/stat``'s state and process group); where ``proc``
    cannot be read, whether the group can be signalled at all (zombies then count)."""
    try:
        entries = [e for e in Path(proc).iterdir() if e.name.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, group = stat[stat.rindex(")") + 2:].split()[:3]  # the name may hold spaces and ')'
        if int(group) == pgid and state not in ("Z", "X"):
            return True
    return False


ENGINE_DEATH_MARKERS = (
    "engine core exited unexpectedly",  # vllm/v1/engine/core_client.py, start_engine_core_monitor
    "died unexpectedly",                # vllm/v1/utils.py, multiproc_executor.py
    "EngineDeadError",
    "EngineCore encountered an issue",  # vllm/v1/engine/exceptions.py
)
"""Lines vLLM (0.11-0.34) logs when a server's engine-core or worker process dies under its API
process: after one of them, an API process's own exit code (often 0) says nothing of the cause."""


def exit_text(server: "VllmServer") -> tuple[str, str]:
    """How ``server``'s exited process ended, for a message: ``("exited with code N", the log's
    last lines)``, or, when its log's last lines say its engine died, ``("exited (code N) after
    its engine died", that line of the log)``: the API process may well exit 0 then."""
    code = server.process.returncode if server.process is not None else None
    tail = _tail(server.log_path, 200).splitlines()
    for line in tail:
        if any(marker in line for marker in ENGINE_DEATH_MARKERS):
            return f"exited (code {code}) after its engine died", line.strip()
    return f"exited with code {code}", "\n".join(tail[-10:])


def _child_setup(core: int | None):
    """The ``preexec_fn`` of a server's process: pin it to ``core`` (None: no pinning) and, on
    Linux, have the kernel send it SIGTERM when this process dies (``PR_SET_PDEATHSIG``), so that a
    ``kill -9`` of ``kvroute serve`` leaves no server running: vLLM's API process stops its engine
    on SIGTERM. The signal follows the thread that started the server: start servers from a thread that
    outlives them (``kvroute serve`` and the live tests start them from the main thread)."""
    parent = os.getpid()
    libc = None
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util

        try:  # loaded before the fork: the child may only make simple calls
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            libc = None

    def setup() -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return setup if core is not None or libc is not None else None


PR_SET_PDEATHSIG = 1
"""``<linux/prctl.h>``: the signal a process receives when its parent thread exits."""


@contextlib.contextmanager
def serve_many(specs: Sequence[ServerSpec], timeout_s: float = 600.0) -> Iterator[list[VllmServer]]:
    """Start every server, wait until all are healthy, yield them, stop them all on exit.

    Servers on different GPUs start together; one that shares a GPU with a server still
    starting waits until that server is healthy. vLLM sizes its KV cache from the device's free
    memory while it loads and profiles (``gpu_worker.determine_available_memory``: memory taken
    meanwhile by anything else, such as a second server loading its weights, counts as its own),
    so two starting at once on one GPU would each get too little KV cache, and not the same.

    Raises:
        ServerError: a port is taken (:func:`check_ports`; nothing started), or a server failed to
            start (the others are stopped first).
    """
    check_ports(specs)
    servers = [VllmServer(s) for s in specs]
    try:
        starting: list[VllmServer] = []
        for s in servers:
            shared = [o for o in starting if _devices(o.spec) & _devices(s.spec)]
            for other in shared:
                other.wait_ready(timeout_s)
                starting.remove(other)
            s.start()
            starting.append(s)
        for s in servers:
            s.wait_ready(timeout_s)
        yield servers
    finally:
        for s in servers:
            s.stop()


def _devices(spec: ServerSpec) -> set[str]:
    """The GPUs ``spec``'s server sees (its ``cuda_device``, as ``CUDA_VISIBLE_DEVICES`` names
    them); empty when not set (a CPU server, or a GPU server left to vLLM's own choice)."""
    device = spec.cuda_device
    if device is None:
        return set()
    return {str(d) for d in (device if isinstance(device, tuple) else (device,))}


@contextlib.contextmanager
def serve_one(spec: ServerSpec, timeout_s: float = 600.0) -> Iterator[VllmServer]:
    """:func:`serve_many` for a single server."""
    with serve_many([spec], timeout_s) as servers:
        yield servers[0]
