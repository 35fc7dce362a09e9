"""Start, watch and stop vLLM OpenAI-compatible servers as subprocesses.

One :class:`VllmServer` is one ``vllm serve`` process (run with this Python through
:mod:`kvroute.calibrate.live.vllm_serve`, which also starts vLLM's CPU build, whose ``vllm``
command cannot find its own version) with its own log file: ``vllm serve`` is the
entry point that honours ``--api-server-count`` (``entrypoints/cli/serve.py``; ``python -m
vllm.entrypoints.openai.api_server`` runs one API process whatever it is told, and is deprecated
from 0.34). :func:`serve_many` starts one per GPU (``CUDA_VISIBLE_DEVICES``), or several per GPU
splitting its memory (``plan_servers(workers_per_gpu=N)``), or, on a machine without GPUs, one per
CPU core (``VLLM_CPU_OMP_THREADS_BIND``; the vLLM CPU build; cores that running servers' engines
are pinned to, :func:`pinned_servers`, come last), waits until every ``GET /health``
answers 200 and stops them all on exit: SIGINT, then SIGTERM, then SIGKILL.

``VLLM_SERVER_DEV_MODE=1`` is set so that ``POST /reset_prefix_cache`` and ``GET /server_info``
(the engine's full configuration) work; ``--enable-prompt-tokens-details`` makes the streamed
usage report cached prompt tokens. ``HF_HUB_OFFLINE=1`` is set only when the model is a local
directory (a fresh machine must download a Hugging Face id's weights).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


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
            as ``CUDA_VISIBLE_DEVICES`` may name it; None: no change.
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
    cuda_device: int | str | None = None
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
            env["CUDA_VISIBLE_DEVICES"] = str(self.cuda_device)
        return env


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
        """Stop the server: SIGINT to its process group, then SIGTERM, then SIGKILL; once it has
        exited, remove its ``ipc://`` KV-event socket file (vLLM leaves it behind).

        Returns:
            The exit code, or None if it was never started.
        """
        proc = self.process
        if proc is None:
            return None
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        code = proc.poll()
        events = self.spec.kv_events_endpoint
        if code is not None and events is not None and events.startswith("ipc://"):
            with contextlib.suppress(OSError):
                Path(events.removeprefix("ipc://")).unlink(missing_ok=True)
        return code


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


def set_affinity(pid: int, cores) -> None:
    """Pin every thread of process ``pid`` to ``cores`` (Linux; silently skipped elsewhere)."""
    cores = set(cores)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def pinned(cores) -> Iterator[None]:
    """Run the calling process on ``cores`` inside the block (e.g. keep a measuring client off
    the engine's core); None or empty: no change. Restores the previous affinity."""
    if not cores or not hasattr(os, "sched_getaffinity"):
        yield
        return
    old = os.sched_getaffinity(0)
    set_affinity(os.getpid(), cores)
    try:
        yield
    finally:
        set_affinity(os.getpid(), old)


def detect_gpus() -> list[int | str]:
    """Visible NVIDIA GPUs: the entries of ``CUDA_VISIBLE_DEVICES`` if set (indices as ints, UUIDs
    such as ``GPU-8f3a...`` and MIG ids such as ``MIG-...`` as they are written, blanks around
    them dropped; as CUDA does, none from a negative index on), else the indices ``nvidia-smi -L``
    lists. Each is what a server's ``CUDA_VISIBLE_DEVICES`` is set to, to pin it to that GPU.

    Returns an empty list on a machine without GPUs (or with ``CUDA_VISIBLE_DEVICES`` empty).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices: list[int | str] = []
        for entry in (x.strip() for x in visible.split(",")):
            if not entry:
                continue
            if entry.startswith("-") and entry[1:].isdigit():
                break  # CUDA hides a negative index and every device after it
            devices.append(int(entry) if entry.isdigit() else entry)
        return devices
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [i for i, line in enumerate(l for l in out.stdout.splitlines() if l.startswith("GPU "))]


def gpu_models() -> list[str]:
    """The model name of each NVIDIA GPU ``nvidia-smi`` lists (e.g. ``"NVIDIA A100-SXM4-80GB"``), in
    its order (``CUDA_VISIBLE_DEVICES`` does not hide any); an empty list without ``nvidia-smi`` or
    when it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def cpu_cores() -> list[int]:
    """CPU cores this process may run on (``sched_getaffinity``), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class PinnedServer:
    """A running vLLM server whose engine or API processes are pinned to CPU cores
    (:func:`pinned_servers`).

    Attributes:
        pid: its top vLLM process: the API server's, or an engine's without one.
        cores: the cores its engine is pinned to.
        what: who it is, for a message, e.g. ``"the vLLM server on port 8500 (PID 24659, of
            kvroute serve PID 24617)"``.
        api_cores: the cores its API processes are pinned to (``kvroute serve`` moves them to
            ``--api-cores``' cores once the server is up); empty when they may run on every core.
    """

    pid: int
    cores: tuple[int, ...]
    what: str
    api_cores: tuple[int, ...] = ()


VLLM_MARKS = ("VLLM::", "vllm.entrypoints", "kvroute.calibrate.live.vllm_serve")
"""A process whose command line holds one of these is a vLLM server's: its API process started as a
module (``python -m vllm.entrypoints.openai.api_server``, kvroute's launcher) or a process vLLM
retitled (``VLLM::EngineCore``, ``VLLM::Worker``: ``setproctitle``, which also hides their
environment); besides, ``vllm serve``."""


def _core_set(text: str) -> set[int] | None:
    """``"0"``, ``"0-3,6"`` or vLLM's per-rank ``"0-1|2-3"`` to core ids; None for anything else
    (``auto``, ``all``, ``nobind``, empty)."""
    cores: set[int] = set()
    try:
        for part in text.replace("|", ",").split(","):
            a, _, b = part.strip().partition("-")
            cores.update(range(int(a), int(b or a) + 1))
    except ValueError:
        return None
    return cores or None


def _is_api(argv: Sequence[str]) -> bool:
    """Whether a vLLM process (:func:`_is_vllm`) is an API process: one vLLM did not retitle (the
    server's top process, which serves the API unless ``--api-server-count`` N > 1 spawns N), or
    one titled ``VLLM::APIServer_<i>``; the engine's are ``VLLM::EngineCore``, ``VLLM::Worker``."""
    joined = " ".join(argv)
    return "VLLM::APIServer" in joined or not joined.startswith("VLLM::")


def api_processes(pid: int, proc: str | Path = "/proc") -> list[int]:
    """The API processes of the vLLM server whose top process is ``pid``: ``pid`` itself and, with
    ``--api-server-count`` N > 1, the ``VLLM::APIServer_<i>`` processes below it (read from
    ``proc``, Linux; just ``[pid]`` where it cannot be read)."""
    procs = _processes(proc)
    if procs is None:
        return [pid]

    def below(p: int) -> bool:
        seen = set()
        while p in procs and p not in seen:
            seen.add(p)
            p = procs[p][1]
            if p == pid:
                return True
        return False

    return [pid] + sorted(p for p, (argv, *_) in procs.items()
                          if p != pid and "VLLM::APIServer" in " ".join(argv) and below(p))


def _is_vllm(argv: Sequence[str]) -> bool:
    joined = " ".join(argv)
    return (any(mark in joined for mark in VLLM_MARKS)
            or any(Path(a).name == "vllm" and argv[i + 1:i + 2] == ["serve"] for i, a in enumerate(argv[:3])))


def _processes(proc: str | Path) -> dict[int, tuple[list[str], int, set[int] | None, str | None]] | None:
    """Every process under ``proc`` (Linux's ``/proc``) by PID, as :func:`_read_process` reads it
    (one gone meanwhile left out); None where ``proc`` cannot be read."""
    try:
        entries = [e for e in Path(proc).iterdir() if e.name.isdigit()]
    except OSError:
        return None
    return {int(e.name): info for e in entries if (info := _read_process(e)) is not None}


def _read_process(entry: Path) -> tuple[list[str], int, set[int] | None, str | None] | None:
    """A process's command line, parent, allowed cores and ``VLLM_CPU_OMP_THREADS_BIND`` (None when
    unset or unreadable), or None once it is gone."""
    try:
        argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        status = (entry / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    bind = None
    try:
        for var in (entry / "environ").read_bytes().split(b"\0"):
            if var.startswith(b"VLLM_CPU_OMP_THREADS_BIND="):
                bind = var.split(b"=", 1)[1].decode(errors="replace")
    except OSError:  # another user's process
        pass
    try:
        ppid = int(fields.get("PPid", "0"))
    except ValueError:
        ppid = 0
    return argv, ppid, _core_set(fields.get("Cpus_allowed_list", "")), bind


def pinned_servers(proc: str | Path = "/proc", own_cores: Sequence[int] | None = None) -> list[PinnedServer]:
    """The vLLM servers running on this machine whose engines or API processes are pinned to CPU
    cores (another ``kvroute serve``'s, the live tests', or one started by hand), read from
    ``proc`` (Linux).

    A server's engine cores are its processes' ``VLLM_CPU_OMP_THREADS_BIND`` (the cores vLLM's CPU
    backend binds the engine to; ``kvroute serve`` sets it in each server's environment), else,
    where that cannot be read, its engine processes' allowed cores (``sched_setaffinity``: the
    cores :func:`_child_setup` pins the server to) when they are fewer than ``own_cores`` (default:
    this process's, :func:`cpu_cores`). Its API cores are its API processes' (:func:`_is_api`)
    allowed cores when fewer than ``own_cores`` (``kvroute serve`` moves the API process to its
    ``--api-cores`` once the server is up). A server's processes (API server, engine core, worker)
    are counted once, under the top one.

    Returns:
        One :class:`PinnedServer` per server, by PID; an empty list where ``proc`` cannot be read.
    """
    own = set(cpu_cores() if own_cores is None else own_cores)
    procs = _processes(proc)
    if procs is None:
        return []
    vllm = {pid for pid, (argv, *_) in procs.items() if _is_vllm(argv)}

    def top(pid: int) -> int:
        seen = {pid}
        while (parent := procs[pid][1]) in vllm and parent not in seen:
            pid = parent
            seen.add(pid)
        return pid

    cores: dict[int, set[int]] = {}
    api: dict[int, set[int]] = {}
    for pid in vllm:
        argv, _, allowed, bind = procs[pid]
        narrowed = allowed if allowed is not None and allowed < own else None
        engine = _core_set(bind) if bind else None
        if _is_api(argv):
            if narrowed:
                api.setdefault(top(pid), set()).update(narrowed)
        elif engine is None:
            engine = narrowed
        if engine:
            cores.setdefault(top(pid), set()).update(engine)
    servers = []
    for pid in sorted(cores.keys() | api.keys()):
        argv, ppid = procs[pid][0], procs[pid][1]
        port = next((a.split("=", 1)[1] for a in argv if a.startswith("--port=")), None)
        if port is None and "--port" in argv[:-1]:
            port = argv[argv.index("--port") + 1]
        what = f"the vLLM server on port {port}" if port else f"the vLLM process {' '.join(argv)[:60]!r}"
        parent = " ".join(procs[ppid][0]) if ppid in procs else ""
        by = f", of kvroute serve PID {ppid}" if "kvroute" in parent and " serve" in parent else ""
        servers.append(PinnedServer(pid, tuple(sorted(cores.get(pid, ()))), f"{what} (PID {pid}{by})",
                                    tuple(sorted(api.get(pid, ())))))
    return servers


def engine_cores_in_use(servers: Sequence[PinnedServer]) -> dict[int, str]:
    """Each core the engines of ``servers`` (:func:`pinned_servers`) are pinned to, and whose they
    are (``" and "`` between several), by core."""
    users: dict[int, list[str]] = {}
    for server in servers:
        for core in server.cores:
            users.setdefault(core, []).append(server.what)
    return {core: " and ".join(users[core]) for core in sorted(users)}


def api_cores_in_use(servers: Sequence[PinnedServer]) -> dict[tuple[int, ...], str]:
    """The core sets the API processes of ``servers`` (:func:`pinned_servers`) are pinned to, and
    whose they are (``" and "`` between several), by core set."""
    users: dict[tuple[int, ...], list[str]] = {}
    for server in servers:
        if server.api_cores:
            users.setdefault(server.api_cores, []).append(server.what)
    return {cores: " and ".join(users[cores]) for cores in sorted(users)}


API_CORES = ("spare", "own", "any")
"""Where a CPU server's API process runs (``plan_servers(api_cores=...)``): ``spare``, the cores
no engine uses, or every core when each core has an engine (the API processes then float, and
which engine's core each lands on changes at random); ``own``, each server's API process on its
own engine's core (no core is free of an engine's work, but every engine always shares its core
with its own API process alone); ``any``, every core. An API process on its engine's core
slows that engine's decode steps; with two servers and no spare core, floating API processes and
the client land on one engine's core or the other, and the servers' decode speed flips between
the two for minutes at a time (the measurements behind this: docs/log/from-code-comments.md)."""


def plan_servers(
    model: str,
    num_servers: int | None = None,
    port_base: int = 8100,
    served_model_name: str | None = None,
    block_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    kv_cache_gib: float = 1.0,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
    log_dir: str | Path = ".",
    device: str = "auto",
    api_cores: str = "spare",
    kv_events_port_base: int | None = None,
    workers_per_gpu: int = 1,
    vllm_version: str | None = None,
    taken: Mapping[int, str] | None = None,
    api_taken: Mapping[tuple[int, ...], str] | None = None,
) -> list[ServerSpec]:
    """Specs of one server per GPU (``workers_per_gpu`` per GPU), or one per CPU core without GPUs.

    On the CPU, server ``i``'s engine runs on the ``i``-th core no other server's engine or API
    process is pinned to (``taken``, ``api_taken``), once those run out on the cores of other
    servers' API processes, then on those of their engines, in order (core ``i`` when none is
    taken); where its API server runs is ``api_cores`` (``API_CORES``).

    Args:
        model: model directory or id.
        num_servers: how many (default: every GPU, or every core).
        port_base: first port; server ``i`` listens on ``port_base + i``.
        block_size: KV block size; default: vLLM's own on GPUs (16 through 0.33, 64 from 0.34),
            32 on the CPU backend.
        gpu_memory_utilization: the share of each GPU all its servers take together; each of
            ``workers_per_gpu`` servers gets ``gpu_memory_utilization / workers_per_gpu``
            (``--gpu-memory-utilization``). None: vLLM's default for one server, and with several
            per GPU its default share split (0.9 through 0.19, 0.92 from 0.20, 1.0 from 0.34,
            whose unset default takes the whole GPU so that a second server finds no memory).
        device: ``"auto"``, ``"gpu"`` or ``"cpu"``.
        kv_events_port_base: server ``i`` publishes its KV-cache events on port
            ``kv_events_port_base + i``; None: no events.
        workers_per_gpu: servers on each GPU (GPUs only); ``num_servers`` counts servers, so
            ``num_servers / workers_per_gpu`` GPUs are used, filled in order.
        vllm_version: the vLLM that will serve (for its default memory share); None: the
            installed one (``importlib.metadata``), or the newest release read.
        taken: CPU cores that running servers' engines are pinned to, with whose they are
            (:func:`engine_cores_in_use` of :func:`pinned_servers`; ``kvroute serve`` reads them):
            engines go to the other cores first, ``spare`` API processes to none of them, and
            ``num_servers`` None counts the other cores (every core when all are taken).
            :func:`core_notes` says what was avoided and what is shared. None: none taken.
        api_taken: the core sets running servers' API processes are pinned to, with whose they
            are (:func:`api_cores_in_use`): engines go to their cores after the cores of neither
            (an engine slows down on an API process's core). None: none.

    Raises:
        ValueError: more servers than devices, ``device="gpu"`` without GPUs, an unknown
            ``api_cores``, ports outside 1..65535, ``workers_per_gpu`` below 1 or above 1
            without GPUs, or a memory share below 0.01 per server.
    """
    if type(workers_per_gpu) is not int or workers_per_gpu < 1:
        raise ValueError(f"workers per GPU must be an integer >= 1, got {workers_per_gpu!r}")
    if api_cores not in API_CORES:
        raise ValueError(f"api_cores must be one of {sorted(API_CORES)}, got {api_cores!r}")
    gpus = detect_gpus() if device in ("auto", "gpu") else []
    if device == "gpu" and not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError("no GPU found (nvidia-smi -L lists none and CUDA_VISIBLE_DEVICES is unset)" if visible is None
                         else f"no GPU found (CUDA_VISIBLE_DEVICES={visible!r} names none)")
    if workers_per_gpu > 1 and not gpus:
        raise ValueError(f"{workers_per_gpu} workers per GPU, but no GPU is used (the CPU backend runs one server "
                         "per core)")
    taken = {} if gpus or taken is None else taken
    if gpus:
        devices = [g for g in gpus for _ in range(workers_per_gpu)]
    else:
        fronts = {c for cores in (api_taken or {}) for c in cores}
        devices = sorted(cpu_cores(), key=lambda c: (c in taken, c in fronts))  # stable: in order within each
    free = sum(1 for c in devices if c not in taken)
    n = (free or len(devices)) if num_servers is None else num_servers
    if not 1 <= n <= len(devices):
        kind = f"GPUs x {workers_per_gpu} workers" if workers_per_gpu > 1 else "GPUs" if gpus else "CPU cores"
        raise ValueError(f"asked for {n} servers but this machine has {len(gpus) or len(devices)} {kind}: "
                         f"{gpus or sorted(devices)}")
    share = gpu_memory_utilization
    if gpus and workers_per_gpu > 1:
        share = (gpu_memory_utilization if gpu_memory_utilization is not None
                 else _default_memory_share(vllm_version)) / workers_per_gpu
        if share < 0.01:
            raise ValueError(f"{workers_per_gpu} workers per GPU leave each {share:.4f} of the GPU's memory")
        share = float(f"{share:.6g}")
    for option, base in (("port base", port_base), ("KV-events port base", kv_events_port_base)):
        if base is not None and not (1 <= base and base + n - 1 <= 65535):
            raise ValueError(f"{option} {base}: {n} server(s) need ports {base}..{base + n - 1}, "
                             f"which must lie in 1..65535")
    specs = []
    spare = tuple(sorted(c for c in devices if c not in devices[:n] and c not in taken)) if not gpus else ()
    for i in range(n):
        common = dict(
            model=model,
            port=port_base + i,
            served_model_name=served_model_name,
            max_model_len=max_model_len,
            extra_args=tuple(extra_args),
            kv_events_port=None if kv_events_port_base is None else kv_events_port_base + i,
            log_path=Path(log_dir) / f"vllm-{port_base + i}.log",
        )
        if gpus:
            specs.append(ServerSpec(**common, block_size=block_size, cuda_device=devices[i],
                                    gpu_memory_utilization=share, kv_cache_gib=None))
        else:
            frontend = {"spare": spare or None, "own": (devices[i],), "any": None}[api_cores]
            specs.append(ServerSpec(**common, block_size=32 if block_size is None else block_size,
                                    cpu_core=devices[i], frontend_cores=frontend, kv_cache_gib=kv_cache_gib))
    return specs


def core_notes(specs: Sequence[ServerSpec], taken: Mapping[int, str],
               api_taken: Mapping[tuple[int, ...], str] | None = None) -> list[str]:
    """What ``kvroute serve`` says of the cores other servers' engines and API processes are
    pinned to (``taken``, ``api_taken``, as given to :func:`plan_servers`): a warning for each of
    ``specs``' engines put on an engine's core (the two engines then fight for the core: each step
    waits for the other's busy-polling, and both servers' step times are slowed at random), else a
    note that they were left alone; and a warning for each API process whose every core will then
    run an engine, one of them ``specs``' (the engine there runs slower while that server serves).

    Returns:
        Lines, ``"warning: ..."`` or ``"note: ..."``; none when no spec runs on a CPU core or no
        core is taken.
    """
    ours = [s.cpu_core for s in specs if s.cpu_core is not None]
    if not ours or not (taken or api_taken):
        return []
    port = {s.cpu_core: s.port for s in reversed(specs)}  # a core's first server
    shared = [c for c in ours if c in taken]
    lines = [f"warning: CPU core {c} already runs the engine of {taken[c]}; the server on port {port[c]} will share "
             f"it, and both will run slower, at random (stop the other server, or start fewer here)" for c in shared]
    if taken and not shared:
        by_who: dict[str, list[int]] = {}
        for c, who in taken.items():
            by_who.setdefault(who, []).append(c)
        others = "; ".join(f"CPU core {cs[0]} runs the engine of {who}" if len(cs) == 1 else
                           f"CPU cores {', '.join(map(str, cs))} run the engine of {who}" for who, cs in by_who.items())
        mine = ", ".join(str(c) for c in ours)
        lines.append(f"note: {others}; so this serve's engine{'s run on cores' if len(ours) > 1 else ' runs on core'} "
                     f"{mine}")
    engines = set(taken) | set(ours)
    for cores, who in (api_taken or {}).items():
        mine = [c for c in cores if c in ours and c not in taken]
        if mine and set(cores) <= engines:  # nowhere left for it but an engine's core
            where = f"CPU core {cores[0]} runs" if len(cores) == 1 else f"CPU cores {', '.join(map(str, cores))} run"
            servers = ("the server on port " if len(mine) == 1 else "the servers on ports ") + ", ".join(
                str(port[c]) for c in mine)
            lines.append(f"warning: {where} the API process of {who}; the engine of {servers} will share "
                         f"{'it' if len(cores) == 1 else 'them'} and run slower while that server serves (start it "
                         f"with --api-cores own, or start fewer servers)")
    return lines


def installed_vllm_version() -> str | None:
    """The version of the ``vllm`` distribution installed in this Python, or None."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _default_memory_share(vllm_version: str | None) -> float:
    """vLLM's default ``gpu_memory_utilization`` for ``vllm_version`` (None: the installed one)."""
    from kvroute.sim.timing.vllm_versions import defaults

    return defaults(vllm_version or installed_vllm_version()).gpu_memory_utilization


@contextlib.contextmanager
def serve_many(specs: Sequence[ServerSpec], timeout_s: float = 600.0) -> Iterator[list[VllmServer]]:
    """Start every server, wait until all are healthy, yield them, stop them all on exit.

    Raises:
        ServerError: a port is taken (:func:`check_ports`; nothing started), or a server failed to
            start (the others are stopped first).
    """
    check_ports(specs)
    servers = [VllmServer(s) for s in specs]
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready(timeout_s)
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def serve_one(spec: ServerSpec, timeout_s: float = 600.0) -> Iterator[VllmServer]:
    """:func:`serve_many` for a single server."""
    with serve_many([spec], timeout_s) as servers:
        yield servers[0]
