"""This machine's CPU cores and GPUs, and the CPU cores running vLLM servers are pinned to.

The host: the cores this process may use (:func:`cpu_cores`), the visible NVIDIA GPUs
(:func:`detect_gpus`, ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``) and their model names
(:func:`gpu_models`), and pinning a process to cores (:func:`set_affinity`, :func:`pinned`).

The running servers: :func:`pinned_servers` reads ``/proc`` (Linux) for vLLM servers whose engine
(vLLM's CPU backend binds it to ``VLLM_CPU_OMP_THREADS_BIND``) or API processes are pinned to
cores, another ``kvroute serve``'s or one started by hand, so that a new serve's plan
(:mod:`kvroute.calibrate.live.plan`) can keep off their cores; :func:`api_processes` finds the
API processes of one server, which ``kvroute serve`` moves off its engine's core once it is up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def core_set(text: str) -> set[int] | None:
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
    return argv, ppid, core_set(fields.get("Cpus_allowed_list", "")), bind


def pinned_servers(proc: str | Path = "/proc", own_cores: Sequence[int] | None = None) -> list[PinnedServer]:
    """The vLLM servers running on this machine whose engines or API processes are pinned to CPU
    cores (another ``kvroute serve``'s, the live tests', or one started by hand), read from
    ``proc`` (Linux).

    A server's engine cores are its processes' ``VLLM_CPU_OMP_THREADS_BIND`` (the cores vLLM's CPU
    backend binds the engine to; ``kvroute serve`` sets it in each server's environment), else,
    where that cannot be read, its engine processes' allowed cores (``sched_setaffinity``: the
    cores ``kvroute serve`` pins the server to, ``server._child_setup``) when they are fewer than
    ``own_cores`` (default: this process's, :func:`cpu_cores`). Its API cores are its API
    processes' (:func:`_is_api`) allowed cores when fewer than ``own_cores`` (``kvroute serve``
    moves the API process to its ``--api-cores`` once the server is up). A server's processes (API
    server, engine core, worker) are counted once, under the top one.

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
        engine = core_set(bind) if bind else None
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
