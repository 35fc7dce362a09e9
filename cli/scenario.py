"""Options shared by ``simulate``, ``compare`` and ``sweep``: which trace, which cluster."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from kvroute.cli.values import Opt, apply_options, check_values
from kvroute.sim.cluster.cluster import REPLAY_MODES, ClusterSpec
from kvroute.sim.timing.profile import load_profile, with_overrides
from kvroute.cli.lengths import length_options
from kvroute.sim.routing import CACHE_VIEWS, make_policy, parse_spec, split_specs
from kvroute.traces.format import Trace, truncate  # noqa: F401 - truncate: also kvroute.cli.scenario's

from kvroute.traces.generators import BUILTIN_WORKLOADS as WORKLOADS


def scenario_option_list() -> list[Opt]:
    """The trace and cluster options (``Opt``: a sweep takes each but the trace file's and the
    SLO's as a comma list)."""
    return [
        Opt("--workload", type=click.Choice(WORKLOADS), default="seed-chat", show_default=True,
            help="Built-in workload (ignored with --trace)."),
        Opt("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), axis=False,
            help="Trace file: kvroute/Mooncake JSONL, Azure or BurstGPT CSV, ShareGPT or vllm bench serve JSON."),
        Opt("--trace-block-size", type=int, default=None, axis=False,
            help="Tokens per hash_ids block when the trace file does not declare it [512]."),
        Opt("--max-requests", type=int, default=None, help="Use only the first N records of the trace."),
        Opt("--turns", type=int, default=6, show_default=True,
            help="Turns per chat (seed-chat); most turns per session (agent: a session stops "
                 "once its next prompt would pass 32,000 tokens)."),
        Opt("--chats", type=int, default=64, show_default=True, help="Chats (seed-chat) or sessions (agent)."),
        *length_options(),
        Opt("--workers", type=int, default=4, show_default=True, help="vLLM workers behind the router."),
        Opt("--gpus", type=int, default=None, help="GPUs; fewer than workers means sharing [one each]."),
        Opt("--profile", "profile_name", default="a6000-qwen2.5-7b", show_default=True,
            help="Shipped profile name or profile JSON file."),
        Opt("--max-model-len", type=int, default=None,
            help="Override the profile's max_model_len (tokens); longer prompts are rejected as vLLM does."),
        Opt("--kv-blocks", type=int, default=None,
            help="Override the profile's num_gpu_blocks per worker (KV capacity)."),
        Opt("--arrival-spread", type=float, default=0.005, show_default=True,
            help="Uniform start jitter of root requests, s."),
        Opt("--replay", type=click.Choice(list(REPLAY_MODES)), default="auto", show_default=True,
            help="closed: later turns wait for their parent; open: trace timestamps."),
        Opt("--seed", type=int, default=0, show_default=True, sweep_names=("--seeds",),
            help="Seed of round 0 (round r uses seed + r)."),
        Opt("--slo-ttft", type=float, default=2.0, show_default=True, axis=False, help="Goodput bound on TTFT, s."),
        Opt("--slo-tpot", type=float, default=0.1, show_default=True, axis=False, help="Goodput bound on TPOT, s."),
    ]


def scenario_options(func=None, *, axes: bool = False):
    """Decorate a command with the trace and cluster options (``axes``: as a sweep's comma lists)."""
    if func is None:
        return functools.partial(scenario_options, axes=axes)
    return apply_options(check_values(func), scenario_option_list(), axes)


def load_trace(trace_path: Path | None, workload: str, turns: int, chats: int, think_time: float | str,
               trace_block_size: int | None, max_requests: int | None, seed: int,
               reply_tokens: str | None = None, max_tokens: int | None = None, user_tokens: str | None = None,
               start: str | float = 0.0, request_rate: float | None = None, arrival: str = "poisson",
               speedup: float | None = None) -> Trace:
    """The trace a command runs: a file, or a built-in workload drawn for run seed ``seed``.

    ``think_time``, ``reply_tokens``, ``user_tokens`` and ``start`` are distributions
    (:mod:`kvroute.traces.lengths`); random ones are drawn from ``workload_rng(seed)``. A
    generated workload's sessions start at ``request_rate`` per second (``arrival`` process); a
    file's timestamps are rescaled by ``speedup`` or to a mean ``request_rate``.

    Raises:
        click.UsageError: ``--speedup`` without a trace file, or both ``--speedup`` and
            ``--request-rate`` for one.
    """
    from kvroute.traces import generators
    from kvroute.traces.arrivals import rescale_conflict, rescaled

    conflict = rescale_conflict(trace_path is not None, speedup, request_rate)
    if conflict:
        raise click.UsageError(conflict)
    if trace_path is not None:
        trace = read_any_trace(trace_path, trace_block_size)
        if speedup is not None or request_rate is not None:
            trace = rescaled(trace, speedup, request_rate)
    else:
        trace = generators.builtin_workload(workload, chats, turns, think_time, seed, reply_tokens,
                                            max_tokens=max_tokens, user=user_tokens, start_s=start,
                                            request_rate=request_rate, arrival=arrival)
    if max_requests is not None:
        trace = truncate(trace, max_requests)
    return trace


def read_any_trace(path: Path, block_size: int | None, fmt: str = "auto", count_tokens=None,
                   tokens_note: str | None = None) -> Trace:
    """Read a trace in any format :mod:`kvroute.traces.detect` knows (``auto``: by suffix/content).

    Raises:
        click.BadParameter: the file is missing or malformed (the message names line and field).
    """
    from kvroute.traces.detect import read_any

    if not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint="'--trace'")
    try:
        return read_any(path, block_size, fmt, count_tokens, tokens_note)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="'--trace'") from None


def parse_policies(text: str, param_hint: str = "--policies") -> list[str]:
    """Split ``a,b:key=value,key=value,c`` into policy specs and check every one (each policy is
    built once, so a value it rejects fails here, before any run).

    Raises:
        click.BadParameter: naming the unknown policy (listing the valid ones), the unknown
            parameter (listing the policy's), the malformed value or the value out of range.
    """
    import numpy as np

    try:
        specs = split_specs(text)
        for spec in specs:
            parse_spec(spec)
            make_policy(spec, np.random.default_rng(0))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{param_hint}'") from None
    if not specs:
        raise click.BadParameter("give at least one policy", param_hint=f"'{param_hint}'")
    twice = sorted({name for name in specs if specs.count(name) > 1})
    if twice:
        raise click.BadParameter(f"policy {', '.join(twice)} listed twice; name each policy once",
                                 param_hint=f"'{param_hint}'")
    return specs


DEFAULT_POLICIES = "round_robin,least_loaded,kv_aware"


def policies_option(func):
    """Decorate a command with ``--policies`` (``parse_policies`` reads its text)."""
    return click.option(
        "--policies", "policies_text", default=DEFAULT_POLICIES, show_default=True,
        help="Comma-separated policies, each optionally with parameters (dynamo:overlap_weight=2,temperature=0.5); "
             "the first is the baseline of the change columns. `kvroute policies` lists them.")(func)


def router_option_list() -> list[Opt]:
    """What the gateway sees and how many gateways there are (a sweep takes each as a comma list)."""
    return [
        Opt("--scrape-interval", "scrape_interval_s", type=float, default=0.0, show_default=True,
            help="Seconds between the gateway's scrapes of each worker's /metrics (0: live)."),
        Opt("--cache-view", type=click.Choice(CACHE_VIEWS), default="routed", show_default=True,
            help="Cache state cache-aware policies read: the routed-prefix index, the workers' "
                 "KV-cache events, or the exact caches."),
        Opt("--kv-event-delay", "kv_event_delay_s", type=float, default=0.0, show_default=True,
            help="Seconds before a worker's KV-cache event reaches the gateway (--cache-view events)."),
        Opt("--gateways", type=int, default=1, show_default=True, help="Gateway replicas."),
        Opt("--gateway-lb", type=click.Choice(["round_robin", "random"]), default="round_robin",
            show_default=True, help="Front load balancer over the gateway replicas."),
        Opt("--gateway-state", type=click.Choice(["local", "shared"]), default="local", show_default=True,
            help="Session/prefix state per replica, or in one shared store."),
        Opt("--store-latency", "store_latency_s", type=float, default=0.0, show_default=True,
            help="Seconds each request waits on the shared store (lab's Redis: 0.05 before its fix, 0.001 after)."),
    ]


ROUTER_FIELDS = ("scrape_interval_s", "cache_view", "kv_event_delay_s", "gateways", "gateway_lb", "gateway_state",
                 "store_latency_s")
"""The parameters of ``router_option_list``, named as the ``ClusterSpec`` fields they set."""


def router_options(func=None, *, axes: bool = False):
    """Decorate a command with the gateway options (``axes``: as a sweep's comma lists)."""
    if func is None:
        return functools.partial(router_options, axes=axes)
    return apply_options(func, router_option_list(), axes)


def executor_options(func):
    """Decorate a command with where its runs execute (``kvroute.sim.study.executors``): ``--executor``,
    ``--address``, ``--max-workers``; the same options and defaults for ``compare`` and ``sweep``."""
    from kvroute.sim.study.executors import EXECUTORS

    options = [
        click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                     help="local: process pool; sequential: this process; dask: a Dask cluster."),
        click.option("--address", default=None,
                     help="Dask scheduler address, e.g. tcp://host:8786 (implies --executor dask) "
                          "[dask without it: a temporary local cluster]."),
        click.option("--max-workers", type=int, default=None, help="Local processes [CPU count]."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_spec(profile_name: str, workers: int, gpus: int | None, arrival_spread: float, replay: str,
               max_model_len: int | None = None, kv_blocks: int | None = None) -> ClusterSpec:
    """The ClusterSpec for the options; unknown profiles list the shipped names."""
    if kv_blocks is not None and gpus is not None and gpus < workers:
        raise click.UsageError("--kv-blocks sets each worker's blocks and cannot be combined with workers "
                               "sharing GPUs, whose blocks follow vLLM's memory rule")
    try:
        profile = with_overrides(load_profile(profile_name), max_model_len, kv_blocks)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--profile'") from exc
    closed = REPLAY_MODES[replay]
    if gpus is not None and not 1 <= gpus <= workers:
        raise click.BadParameter(f"must be between 1 and --workers ({workers}), got {gpus}", param_hint="'--gpus'")
    try:
        return ClusterSpec(profile, num_workers=workers, num_gpus=gpus, arrival_spread_s=arrival_spread,
                           closed_loop=closed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def describe(trace: Trace, spec: ClusterSpec) -> str:
    """One line naming the scenario (KV blocks per worker after any GPU sharing)."""
    gpus = spec.num_gpus or spec.num_workers
    blocks = sorted({spec.profile.shared(spec.workers_on_gpu(spec.gpu_of(w))).engine.num_gpu_blocks
                     for w in range(spec.num_workers)})
    on = f"{gpus} GPU" if gpus == 1 else f"{gpus} GPUs"
    return (f"trace {trace.source}: {len(trace.records)} requests | {spec.num_workers} workers on {on} | "
            f"profile {spec.profile.name} ({'/'.join(map(str, blocks))} KV blocks of "
            f"{spec.profile.engine.block_size} tokens per worker)")


def with_errors(func):
    """Turn the simulator's ValueErrors into clean CLI errors."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    return wrapper
