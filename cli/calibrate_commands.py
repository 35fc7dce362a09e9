"""Command line: ``kvroute serve`` and ``kvroute calibrate {measure,fit,tiny-model}``.

``kvroute`` loads this module only when one of its commands runs
(``kvroute.cli.main.LAZY_COMMANDS``); heavy imports stay inside the commands. Also runnable as
``python -m kvroute.cli.calibrate_commands {serve,calibrate} ...``.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from kvroute.cli.help_text import HelpfulGroup
from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.values import Cores, Number, check_urls, check_values, token_id_range
from kvroute.traces.inputs import BLOCK_SIZE, FRACTION, MAX_RUNS, MAX_TOKENS, SECONDS, SEED, TOKENS, Num
from kvroute.traces.outputs import atomic_output, check_output, new_dirs_removed_on_failure, write_text_atomic


PORT = Num(integer=True, minimum=1, maximum=65535)

SERVE_VALUES = {
    "num_servers": Num(integer=True, minimum=1, maximum=1024),
    "port_base": PORT,
    "kv_events_port_base": PORT,
    "block_size": BLOCK_SIZE,
    "gpu_memory_utilization": FRACTION,
    "kv_cache_gib": Num(integer=True, minimum=1, maximum=65536, unit="GiB"),  # vLLM reads an int; 0 = its 4 GiB
    "max_model_len": TOKENS,
    "timeout": Num(minimum=0.0, above=True, maximum=SECONDS.maximum, unit="s"),
}
"""Rules of ``kvroute serve``'s numeric options (checked before vLLM is looked for)."""

FIT_VALUES = {
    "api_server_count": Num(integer=True, minimum=1, maximum=1024),
    "client_busy": Num(minimum=0.0, maximum=1024.0),  # processes
    "api_contention": Num(minimum=0.0, maximum=100.0),
    "client_core": Num(integer=True, minimum=-1, maximum=65535),
}
"""Rules of ``kvroute calibrate fit``'s host-model options."""


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _cores(text: str | None) -> tuple[int, ...] | None:
    """``"1"``, ``"1,3"`` or ``"2-5"`` to core ids."""
    if not text:
        return None
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out += range(int(a), int(b) + 1)
        elif part.strip():
            out.append(int(part))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------------


@click.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.option("--model", required=True,
              help="Model directory or Hugging Face id; 'tiny-qwen2' builds the tiny random-weight test model.")
@click.option("--served-model-name", default=None, help="Name clients use (default: the model; 'tiny-qwen2' for the tiny model).")
@click.option("-n", "--num-servers", type=Number(SERVE_VALUES["num_servers"]), default=None,
              help="Servers to start (default: one per GPU, or one per CPU core that no running vLLM server's engine "
                   "is pinned to).")
@click.option("--port-base", type=Number(PORT), default=8100, show_default=True, help="Server i listens on port-base + i.")
@click.option("--block-size", type=Number(BLOCK_SIZE), default=None,
              help="KV block size (default: vLLM's on GPUs, 16 through 0.33 and 64 from 0.34; 32 on the CPU backend).")
@click.option("--gpu-memory-utilization", type=Number(FRACTION), default=None,
              help="vLLM's share of each GPU, for all its workers together (GPU only; default: vLLM's).")
@click.option("--workers-per-gpu", type=Number(Num(integer=True, minimum=1, maximum=64)), default=1, show_default=True,
              help="vLLM servers on each GPU, each with 1/N of the GPU's memory share (GPU only).")
@click.option("--kv-cache-gib", type=Number(SERVE_VALUES["kv_cache_gib"]), default=1, show_default=True, help="KV cache per server on the CPU backend, whole GiB.")
@click.option("--max-model-len", type=Number(TOKENS), default=None, help="vLLM --max-model-len.")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True)
@click.option("--api-cores", type=click.Choice(["spare", "own", "any"]), default="spare", show_default=True,
              help="CPU backend: where each server's API process runs. spare: the cores no engine uses (every core "
                   "when none is spare); own: its own engine's core, so each engine shares its core with its own "
                   "API process alone and decode speed does not flip with where the kernel puts the API processes; "
                   "any: every core. Fit a sweep of such servers with 'kvroute calibrate fit --api-cores own' after "
                   "own, '--api-cores spare' otherwise.")
@click.option("--kv-events-port-base", type=Number(PORT), default=None,
              help="Server i publishes its KV-cache events as number this + i (vLLM --kv-events-config, ZeroMQ): "
                   "on a Unix socket, ipc://<tmp>/kvroute-<uid>/kv-events-<this + i>.sock, when the API listens on "
                   "loopback (as it does by default), else on TCP port this + i of every interface. serve prints each "
                   "endpoint; 'kvroute validate' and 'calibrate measure' take it as '--kv-events ENDPOINT' once per "
                   "server, in --url order, and time each request's engine first token.")
@click.option("--log-dir", type=click.Path(file_okay=False), default=".", show_default=True, help="Where vllm-<port>.log files go.")
@click.option("--vllm-args", default="", help="More vLLM arguments, as one shell-quoted string.")
@click.option("--timeout", type=Number(SERVE_VALUES["timeout"]), default=900.0, show_default=True,
              help="Seconds to wait for /health.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@check_values(rules=SERVE_VALUES)
def serve(model, served_model_name, num_servers, port_base, block_size, gpu_memory_utilization, workers_per_gpu,
          kv_cache_gib, max_model_len, device, api_cores, kv_events_port_base, log_dir, vllm_args, timeout, extra):
    """Start vLLM OpenAI-compatible servers (one per GPU, or one per CPU core) and keep them up
    until Ctrl-C. Arguments after ``--`` go to vLLM as they are. On the CPU each engine gets a core
    that no running vLLM server's engine or API process is pinned to (another serve's); when none
    is left, it shares one, with a warning naming the other server, and an API process that may
    run on another server's engine core is warned of too.

    \b
    Examples:
      kvroute serve --model Qwen/Qwen2.5-7B-Instruct            # every GPU, ports 8100...
      kvroute serve --model tiny-qwen2 -n 1 -- --max-num-seqs 64  # CPU, engine on core 0
      kvroute serve --model Qwen/Qwen2.5-7B-Instruct -n 2 --workers-per-gpu 2  # two on GPU 0
      kvroute serve --model Qwen/Qwen2.5-7B-Instruct -- --api-server-count 2   # 2 API processes each
    """
    import importlib.util
    import signal
    import time

    from kvroute.calibrate.live.cores import api_cores_in_use, engine_cores_in_use, pinned_servers
    from kvroute.calibrate.live.plan import core_notes, plan_servers
    from kvroute.calibrate.live.server import ServerError, check_ports, serve_many

    try:
        args = shlex.split(vllm_args) + list(extra)
    except ValueError as exc:  # an unclosed quote
        raise click.BadParameter(f"{exc} in {vllm_args!r}", param_hint="'--vllm-args'") from None
    try:
        check_output(log_dir, 0, "--log-dir", is_dir=True)
    except ValueError as exc:
        _fail(str(exc))
    if importlib.util.find_spec("vllm") is None:
        raise click.ClickException("vLLM is not installed in this Python, so no server can start: "
                                   "python -m pip install -e '.[gpu]' on GPU machines, '.[live]' for vLLM's CPU build")

    def _stop(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM both stop the servers cleanly, also when a script started us in the
    # background (where SIGINT arrives ignored)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    from kvroute.calibrate.calibration.tiny_model import (TINY_MODEL_NAME, build_tiny_model, default_tiny_dir,
                                                          tiny_model_built)

    tiny = model == TINY_MODEL_NAME and not Path(model).exists()
    model_path = str(default_tiny_dir()) if tiny else model
    running = pinned_servers() if device != "gpu" else []
    taken, api_taken = engine_cores_in_use(running), api_cores_in_use(running)
    try:
        specs = plan_servers(model_path, num_servers, port_base, served_model_name or model, block_size,
                             gpu_memory_utilization, kv_cache_gib, max_model_len, args, log_dir, device, api_cores,
                             kv_events_port_base, workers_per_gpu=workers_per_gpu, taken=taken, api_taken=api_taken)
        check_ports(specs)  # a taken port fails now, before any line says what starts where
    except (ValueError, ServerError) as exc:
        _fail(str(exc))
    if tiny:
        if not tiny_model_built():
            click.echo("building the tiny random-weight Qwen2 model ...", err=True)
        try:
            build_tiny_model(model_path)
        except ImportError as exc:
            _fail(f"building {TINY_MODEL_NAME} needs torch, transformers and tokenizers "
                  f"(pip install 'kvroute[live]'): {exc}")
    for line in core_notes(specs, taken, api_taken):
        click.echo(line, err=True)
    for s in specs:
        where = (f"GPU {s.cuda_device}" + (f" ({s.gpu_memory_utilization:g} of its memory)"
                                            if workers_per_gpu > 1 else "")
                 if s.cuda_device is not None else f"CPU core {s.cpu_core}")
        events = f", KV-cache events on {s.kv_events_endpoint}" if s.kv_events_endpoint else ""
        click.echo(f"starting {s.url} on {where} (log {s.log_path}{events})", err=True)
    try:
        with serve_many(specs, timeout) as servers:
            for s in servers:
                click.echo(s.url)
            sys.stdout.flush()
            click.echo("ready; Ctrl-C stops the servers", err=True)
            _watch(servers, time.sleep)
    except ServerError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


def _watch(servers, sleep, interval: float = 1.0) -> None:
    """Keep ``servers`` up until every one has exited: a server that exits while others still run
    is reported in one line (then its log's line saying its engine died, else its last lines) and
    the others keep serving (a validate run finishes on the servers it has left); once none runs,
    fail. Ctrl-C and SIGTERM raise
    ``KeyboardInterrupt`` through ``sleep``, and the caller stops them all."""
    from kvroute.calibrate.live.server import exit_text

    running = [s for s in servers if s.process is not None]
    while True:
        for s in [s for s in running if s.process.poll() is not None]:
            running.remove(s)
            left = (f"; {len(running)} of {len(servers)} still serving" if running else "")
            how, log = exit_text(s)
            click.echo(f"server {s.url} {how}{left}; log {s.log_path}:\n{log}", err=True)
        if not running:
            _fail(f"every server has exited ({len(servers)}); see the lines above")
        sleep(interval)


# --------------------------------------------------------------------------------------------
# calibrate
# --------------------------------------------------------------------------------------------


@click.group(cls=HelpfulGroup, context_settings={"help_option_names": ["-h", "--help"]})
def calibrate():
    """Measure real vLLM servers and fit a profile for the simulator."""


@calibrate.command()
@click.option("--url", "urls", multiple=True, help="Server base URL; repeat for identical servers (required but with --dry-run).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the raw rows (required but with --dry-run).")
@click.option("--model", default=None, help="Served model name (default: the server's only model).")
@click.option("--preset", type=click.Choice(["full", "quick"]), default="full", show_default=True, help="Sweep size.")
@click.option("--max-len", type=Number(TOKENS), default=None, help="Drop sweep lengths whose sequences exceed this many tokens.")
@click.option("--seed", type=Number(SEED), default=0, show_default=True, help="Seeds the prompts' token ids.")
@click.option("--token-range", default="100:1700", show_default=True, help="LO:HI range of prompt token ids.")
@click.option("--hardware", default=None, help="Hardware description for the profile (default: what the server reports).")
@click.option("--client-cores", type=Cores(), default=None,
              help="Run this client on these CPU cores (e.g. '1'), off the engine's core.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A bar on a terminal; in a log (a pipe, a file, nohup) a plain line each tenth of the sweep "
                   "and at least every 30 s, from 30 s on.")
@click.option("--timeout", type=Number(SERVE_VALUES["timeout"]), default=600.0, show_default=True,
              help="Limit on one request, s.")
@click.option("--bursts/--no-bursts", default=True, show_default=True,
              help="Run the concurrency sweep (bursts of N = 1..64 requests on one and on all servers).")
@click.option("--burst-slots", type=Number(Num(integer=True, minimum=1, maximum=1000)), default=12, show_default=True,
              help="Spread the concurrency sweep over this many slots between the one-at-a-time experiments, so "
                   "both sample the same stretch of the host's time (1: every burst after them; nothing to spread with "
                   "--no-bursts).")
@click.option("--longest", type=Number(Num(integer=True, minimum=2, maximum=MAX_TOKENS, unit="tokens")), default=None,
              help="Also time sequences up to this many tokens (prompt plus output): longer cold prompts, a "
                   "cached prefix and a decode context near it, for runs whose histories go beyond the preset "
                   "(16k tokens for 'full'); must fit the servers' max_model_len.")
@click.option("--kv-events", "kv_events", multiple=True, metavar="ENDPOINT",
              help="Each server's KV-cache event endpoint (ipc://PATH or tcp://HOST:PORT, as kvroute serve "
                   "--kv-events-port-base prints it), "
                   "one per --url in the same order: every request is then also timed at the engine step that "
                   "finished its prefill, and the fit places the unloaded front end before and after the engine "
                   "(overheads.post_engine_s).")
@click.option("--estimate-profile", default=None, metavar="NAME|PATH",
              help="Profile whose step costs and front end estimate the sweep's time, printed before it starts "
                   "(default: cpu-tiny-qwen2, -x2 for several servers, when the servers run on CPUs, or, with "
                   "--dry-run, when they are on "
                   "this machine and it has no GPU; else the a6000-qwen2.5-7b prior; "
                   "`kvroute profiles derive` makes one for your GPU and model).")
@click.option("--dry-run", is_flag=True, default=False,
              help="Print the plan and its estimated time, then exit; contacts no server and writes nothing "
                   "(--url and --out are not needed).")
@click.option("--servers", "num_servers", type=Number(SERVE_VALUES["num_servers"]), default=None,
              help="With --dry-run: the number of servers to estimate for (default: the --url count, else 1).")
@check_values
@stops_on_sigterm
def measure(urls, out_dir, model, preset, max_len, seed, token_range, hardware, client_cores, progress, timeout,
            bursts, burst_slots, longest, kv_events, estimate_profile, dry_run, num_servers=None):
    """Drive live servers through their OpenAI API: prefill (cold and cached prefixes), decode
    (batch x context grid), mixed steps; rows go to OUT/requests.csv as they arrive. Ctrl-C or SIGTERM
    stops the sweep with meta.json saying "interrupted" and the rows kept (exit code 130)."""
    import asyncio
    from dataclasses import replace

    from kvroute.calibrate.live.client import CalibrationError
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan
    from kvroute.calibrate.live.cores import pinned

    plan = SweepPlan.preset(preset)
    if longest is not None:
        plan = plan.extended(longest)
    if max_len is not None:
        plan = plan.clipped(max_len)
    if not bursts:
        plan = plan.without_bursts()
    plan = replace(plan, burst_slots=burst_slots)
    lo, hi = token_id_range(token_range)
    if num_servers is not None and not dry_run:
        raise click.BadParameter("applies with --dry-run only (a sweep runs on its --url servers)",
                                 param_hint="'--servers'")
    if not dry_run:
        for value, flag in ((urls, "--url"), (out_dir, "--out")):
            if not value:
                raise click.UsageError(f"Missing option '{flag}' (only --dry-run runs without it).")
        check_urls(urls)
    out = Path(out_dir) if out_dir else None
    if kv_events:
        from kvroute.calibrate.live.kv_events import check_endpoints

        try:
            check_endpoints(kv_events, len(urls))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--kv-events'") from exc
    given = _load_estimate_profile(estimate_profile) if estimate_profile else None
    if dry_run:
        n = num_servers or len(urls) or 1
        profile, note = _estimate_profile(given, None, n, urls)
        click.echo(_plan_text(plan, n, seed, profile))
        click.echo(_estimate(plan, profile, n, seed, None, bool(kv_events)).line() + note)
        if not urls:  # what to run next (README: Calibrate on your GPUs)
            click.echo(f"next: start the servers (kvroute serve --model MODEL{'' if n > 1 else ' -n 1'}), then this "
                       f"command with {'one --url per server' if n > 1 else '--url URL'} and --out DIR instead of "
                       "--dry-run, then kvroute calibrate fit DIR --out PROFILE.json")
        return
    # NOTE: the client, imported before --out is made: when it is missing, main() names the extras
    import aiohttp  # noqa: F401

    def started(infos):
        """Print the estimate; it paces the progress's time left (``sweep_time.TimeLeft``)."""
        from kvroute.calibrate.calibration.sweep_time import TimeLeft

        profile, note = _estimate_profile(given, infos, len(urls), urls)
        estimate = _estimate(plan, profile, len(urls), seed, infos, bool(kv_events))
        click.echo(estimate.line() + note, err=True)
        return TimeLeft(estimate)

    # a failure before anything is written (no server, a wrong --model) leaves no --out it made
    with new_dirs_removed_on_failure(out):
        try:  # before any work; a full sweep writes a few MB of rows
            check_output(out, 16 << 20, is_dir=True)
        except ValueError as exc:
            _fail(str(exc))
        try:
            with pinned(client_cores):
                summary = asyncio.run(run_sweep(
                    list(urls), out, plan, model, seed, (lo, hi), progress, hardware, timeout, kv_events,
                    on_start=started))
        except CalibrationError as exc:
            kept = _rows(out / "requests.csv")
            _fail(f"{exc}" + (f"\n{kept} measured requests are kept in {out / 'requests.csv'}" if kept else ""))
        except KeyboardInterrupt:
            kept = _rows(out / "requests.csv")
            click.echo(f"\ninterrupted: {kept} measured requests are kept in {out / 'requests.csv'}" if kept
                       else "\ninterrupted before any request was measured", err=True)
            sys.exit(130)
    s = summary.servers[0]
    click.echo(
        f"measured {summary.num_requests} requests in {summary.num_experiments} experiments in "
        f"{summary.elapsed_s:.0f} s on {len(summary.servers)} server(s): {s.model} on {s.hardware}, vLLM "
        f"{s.vllm_version}{_async_text(s.async_scheduling)}, block size {s.block_size}, {s.num_gpu_blocks} blocks -> {out}"
    )
    for warning in summary.warnings:
        click.echo(f"warning: {warning}", err=True)
    if s.hardware == "unknown":
        click.echo("note: the servers did not say their hardware (vLLM before 0.16 has no system_env in /server_info); "
                   "measure --hardware names it", err=True)
    if summary.events_problem:
        click.echo(f"warning: {summary.events_problem}; no request was timed in the engine", err=True)


def _plan_text(plan, num_servers: int, seed: int, profile) -> str:
    """The sweep's experiments by kind, for ``measure --dry-run``, with the KV capacity of
    ``profile`` standing in for the servers'."""
    from collections import Counter

    from kvroute.calibrate.calibration.sweep_time import EngineShape

    eng = profile.engine
    cap = EngineShape(eng.block_size, eng.num_gpu_blocks, eng.max_num_batched_tokens).capacity_tokens
    exps = plan.experiments(cap, seed)
    bursts = plan.bursts(num_servers, len(exps), cap)
    kinds = Counter(e["kind"] for e in (*exps, *bursts))
    prompt, total = plan.longest_sequence()
    longer = "; --longest N times longer histories, such as 32k-token agent sessions, too" if total < 32768 else ""
    return (f"plan: {', '.join(f'{n} {k}' for k, n in kinds.items())} experiments, dealt round robin to "
            f"{num_servers} server(s), bursts in {plan.burst_slots} slot(s) between them; longest sequence "
            f"{total} tokens ({prompt}-token prompt{longer}); decode points and bursts that do not fit in 90 % of the KV "
            f"cache left out ({cap:,} tokens per server as {profile.name} has it; the servers' own when measured)")


def _default_estimate_profile(infos, num_servers: int, urls=()):
    """cpu-tiny-qwen2 (-x2 for several servers) when ``infos`` say the servers run on CPUs, or,
    without ``infos`` (``--dry-run``), when every server of ``urls`` (or none given) is on this
    machine and it shows no NVIDIA GPU (``kvroute.calibrate.live.cores.detect_gpus``, which plans
    the servers `serve` starts); else the a6000-qwen2.5-7b prior."""
    from urllib.parse import urlsplit

    from kvroute.calibrate.live.cores import detect_gpus
    from kvroute.calibrate.live.server import machine_key
    from kvroute.sim.timing.profile import load_profile

    if infos:
        on_cpu = infos[0].device == "cpu"
    else:
        local = all(machine_key(urlsplit(u).hostname or "") == "loopback" for u in urls)
        on_cpu = local and not detect_gpus()
    return load_profile(("cpu-tiny-qwen2-x2" if num_servers > 1 else "cpu-tiny-qwen2") if on_cpu
                        else "a6000-qwen2.5-7b")


def _estimate_profile(given, infos, num_servers: int, urls=()):
    """``(profile, note)``: the profile the time estimate uses, ``given`` (``--estimate-profile``)
    or the default (``_default_estimate_profile``), and, for a default, the words that go after the
    estimate's line: which profile it is, what it was measured or derived on, and how to give
    another; where the GPUs are known (``infos``' hardware, or, without ``infos``, this machine's
    when the servers are on it: ``kvroute.calibrate.live.cores.gpu_models``) and the default's
    is not among them, that it is not theirs, and the shipped profile that is, if one is."""
    if given is not None:
        return given, ""
    profile = _default_estimate_profile(infos, num_servers, urls)
    hardware = (profile.raw or {}).get("hardware") or {}
    model = ((profile.raw or {}).get("model") or {}).get("name", "?")
    other = "; --estimate-profile NAME|PATH estimates with another"
    if hardware.get("device") == "cpu":
        return profile, (f". {profile.name} is the default for CPU servers, measured with {model} on "
                         f"{hardware.get('description', 'the CPU reference host')}{other}")
    gpu = hardware.get("gpu", "?")
    text = f". {profile.name} is the default: a prior for {model} on {gpu}"
    from kvroute.sim.timing.specs import gpu_key, gpu_spec

    models = _gpu_models(infos, urls)
    theirs = [m for m in dict.fromkeys(models) if gpu_key(m) != gpu_key(gpu)]
    if not theirs:
        return profile, f"{text}{other} (`kvroute profiles derive --gpu GPU --model MODEL` makes one for yours)"
    whose = "the servers'" if infos else "this machine's"
    text += f", not {whose} {' and '.join(theirs)}"
    from kvroute.sim.timing.profile import load_profile, shipped_profiles

    matches = [name for name in shipped_profiles()
               if gpu_key(((load_profile(name).raw or {}).get("hardware") or {}).get("gpu", "")) == gpu_key(theirs[0])]
    if matches:
        shipped = ((load_profile(matches[0]).raw or {}).get("model") or {}).get("name", "?")
        return profile, (f"{text}; --estimate-profile {matches[0]} estimates with the shipped prior for {shipped} "
                         f"on {theirs[0]}, NAME|PATH with another")
    try:
        derive = f"`kvroute profiles derive --gpu {gpu_spec(theirs[0]).table_name} --model MODEL` makes a prior for it"
    except ValueError:
        derive = ("`kvroute profiles derive --gpu GPU --model MODEL` makes a prior for a GPU of "
                  "`kvroute profiles gpus`, which has no " + theirs[0])
    return profile, f"{text}{other} ({derive})"


def _gpu_models(infos, urls) -> list[str]:
    """The GPU models of the servers as ``infos``' hardware names them (``"2 x NVIDIA A100-SXM4-80GB"``),
    or, without ``infos``, this machine's when every server of ``urls`` (or none given) is on it."""
    import re
    from urllib.parse import urlsplit

    if infos:
        if infos[0].device != "cuda" or infos[0].hardware == "unknown":
            return []
        return [re.sub(r"^\d+ x ", "", part.strip()) for part in infos[0].hardware.split(", ")]
    from kvroute.calibrate.live.cores import gpu_models
    from kvroute.calibrate.live.server import machine_key

    if all(machine_key(urlsplit(u).hostname or "") == "loopback" for u in urls):
        return gpu_models()
    return []


def _load_estimate_profile(name: str):
    """``--estimate-profile``'s profile; a bad name or file is a one-line error naming the flag."""
    from kvroute.sim.timing.profile import load_profile

    try:
        return load_profile(name)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--estimate-profile'") from exc


def _estimate(plan, profile, num_servers: int, seed: int, infos, kv_events: bool):
    """The sweep's ``SweepEstimate`` (``kvroute.calibrate.calibration.sweep_time``) with
    ``profile``'s step costs on ``infos``' engine settings (probed servers) or the profile's
    (``infos`` None)."""
    from kvroute.calibrate.calibration.sweep_time import EngineShape, estimate_sweep

    shape = None
    if infos:
        shape = EngineShape(infos[0].block_size, min(i.num_gpu_blocks for i in infos),
                            infos[0].max_num_batched_tokens)
    return estimate_sweep(plan, profile, num_servers, seed, shape, kv_events=kv_events)


def _prefill_step_s(cost, info):
    """``step_s(prompt_len, cached)``: the fitted time of the last step of one prefill alone (its
    last chunk of at most ``max_num_batched_tokens`` new tokens), s."""
    from kvroute.sim.timing.cost_model import prefill_pairs

    budget = info.max_num_batched_tokens

    def step_s(prompt_len: int, cached: int) -> float:
        new = max(1, prompt_len - cached)
        last = new - budget * ((new - 1) // budget)
        return cost.step_time(last, 1, prefill_pairs(prompt_len - last, last), 0)

    return step_s


def _async_text(flag: bool | None) -> str:
    return "" if flag is None else f" (async scheduling {'on' if flag else 'off'})"


def left_out_summary(notes: list[str], meta: dict) -> str:
    """What the fit left out, counted by reason (numbers in a reason count as one), and whether
    the sweep says it was interrupted, e.g. ``"left out: 12 x request failed or sent no
    token, 3 x a stream had fewer than N tokens; the sweep finished (meta.json status
    complete)"``."""
    import collections
    import re

    reasons = collections.Counter()
    for note in notes:
        head, sep, rest = note.partition("): ") if note.startswith("exp ") and "): " in note else note.partition(": ")
        text = (rest if sep and note.startswith("exp ") else note).split("; left out")[0]
        reasons[re.sub(r"\d+(\.\d+)?", "N", text).strip()] += 1
    left = (", ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
            if reasons else "none")
    status = meta.get("status")
    said = (f"the sweep was interrupted (meta.json status {status!r})" if status == "interrupted"
            else f"meta.json status {status!r}" if status else "meta.json gives no status")
    return f"left out: {left}; {said}"


def _rows(path: Path) -> int:
    try:
        with open(path) as fh:
            return max(0, sum(1 for _ in fh) - 1)
    except OSError:
        return 0


FIGURE_FORMATS = ("png", "pdf", "svg")
"""``kvroute.sim.study.figure_style.FIGURE_FORMATS`` (repeated so the calibrate commands' help
imports no numpy; ``tests/sim/study/test_figures.py`` checks they agree)."""


def _figure_formats(ctx, param, value):
    """``--figure-format``: ``figure_style.parse_figure_formats`` (one line naming the flag)."""
    from kvroute.sim.study.figure_style import parse_figure_formats

    try:
        return parse_figure_formats(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@calibrate.command("fit")
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Profile JSON to write, with <stem>.fit.png and <stem>.fit_points.csv beside it; RUN_DIR is then "
                   "left untouched (default RUN_DIR/profile.json and RUN_DIR/fit_points.csv; required with several "
                   "RUN_DIRs).")
@click.option("--name", default=None, help="Profile name (default: the output file's stem).")
@click.option("--report", default=None, type=click.Path(dir_okay=False),
              help="The fit's figure: .png, .pdf or .svg (default: beside the profile, <stem>.fit.png); "
                   "--figure-format adds the other formats beside it.")
@click.option("--figure-format", "figure_formats", default="png", show_default=True, callback=_figure_formats,
              help="Formats of the fit's figure, comma list of png, pdf, svg (vector for papers).")
@click.option("--holdout", type=Number(Num(minimum=0.0, maximum=1.0, below=True)), default=0.25, show_default=True, help="Share of experiments held out.")
@click.option("--seed", type=Number(SEED), default=0, show_default=True, help="Seed of the hold-out split.")
@click.option("--overhead", type=click.Choice(["auto", "metrics", "fit"]), default="auto", show_default=True,
              help="API-server time from the server's /metrics or fitted.")
@click.option("--loss", type=click.Choice(["linear", "soft_l1", "huber", "cauchy"]), default="soft_l1",
              show_default=True, help="linear: NNLS; else a robust least_squares refinement.")
@click.option("--itl-source", type=click.Choice(["auto", "engine", "stream"]), default="auto", show_default=True,
              help="Decode and mixed step times from the server's histograms or the client's streams.")
@click.option("--per-token-overhead/--no-per-token-overhead", default=True, show_default=True,
              help="Fit the per-prompt-token part of the API-server time.")
@click.option("--folds", type=Number(Num(integer=True, minimum=0, maximum=1000)), default=4, show_default=True, help="Cross-validation folds (0: none).")
@click.option("--bootstrap", type=Number(Num(integer=True, minimum=0, maximum=MAX_RUNS)), default=100, show_default=True,
              help="Refits on resampled configurations, kept in the profile as the coefficients' uncertainty (0: none).")
@click.option("--bursts/--no-bursts", default=True, show_default=True,
              help="Fit the front-end queue and host-contention terms to the sweep's bursts, if it has any.")
@click.option("--api-server-count", type=Number(FIT_VALUES["api_server_count"]), default=1, show_default=True,
              help="API processes per server during the sweep (vLLM --api-server-count).")
@click.option("--client-busy", type=Number(FIT_VALUES["client_busy"]), default=1.0, show_default=True,
              help="Processes of the measuring client on the servers' host, busy while responses stream "
                   "(1; 0 when it ran elsewhere).")
@click.option("--engine-spin", type=Number(SECONDS), default=1.0, show_default=True,
              help="Seconds an engine's core stays busy after its last step (vLLM's shared-memory queue "
                   "busy-polls for 1 s; 0: busy only while it has work).")
@click.option("--stream-baseline/--no-stream-baseline", default=True, show_default=True,
              help="Count the API processes and the client, which streamed while the decode steps were timed, in "
                   "those steps' contention baseline (host.baseline_stream_busy); off: engines only, as before.")
@click.option("--api-cores", type=click.Choice(["spare", "own"]), default="spare", show_default=True,
              help="Where the sweep's servers ran their API processes (kvroute serve --api-cores): own: each on its "
                   "engine's core, so the host model counts load per core (host.api_on_engine_core) and the API "
                   "process's work beside a busy engine takes twice as long (host.api_contention 1); spare: the "
                   "whole host's load stretches every engine.")
@click.option("--api-contention", type=Number(FIT_VALUES["api_contention"]), default=1.0, show_default=True,
              help="With --api-cores own: how much longer the API process's work takes while its engine, on the "
                   "same core, has requests (host.api_contention; 1: fair sharing of the core, 0: not at all). "
                   "Stated, not fitted: closed-loop TTFT under kv-aware routing depends strongly on it "
                   "(docs/design/timing-and-host-model.md).")
@click.option("--front-end-split/--no-front-end-split", default=True, show_default=True,
              help="When the sweep timed its requests in the engine (measure --kv-events), put the part of the "
                   "unloaded front end that comes after the engine's step after it (overheads.post_engine_s); off: "
                   "keep all of the front end before the engine, as for a sweep without events.")
@click.option("--base-profile", default=None,
              help="Keep this profile's step costs and overheads (shipped name or JSON file) and fit only the "
                   "burst terms to RUN_DIR (e.g. a sweep of bursts alone).")
@click.option("--client-core", "client_core", type=Number(FIT_VALUES["client_core"]), default=-1, show_default=True,
              help="With --api-cores own: the server (0, 1, ...: server i of kvroute serve runs on core i, unless "
                   "another serve's engines held cores then: serve prints each server's core) whose "
                   "core the measuring client was pinned to (calibrate measure --client-cores): the client's load "
                   "then slows that server's steps alone (host.client_core). -1: the client floated.")
@check_values(rules={**FIT_VALUES, "engine_spin": SECONDS})
@stops_on_sigterm
def fit_cmd(run_dirs, out_path, name, report, holdout, seed, overhead, loss, itl_source, per_token_overhead, folds,
            bootstrap, bursts, api_server_count, client_busy, engine_spin, stream_baseline, api_cores, api_contention,
            client_core, front_end_split, base_profile, figure_formats=("png",)):
    """Fit the step-cost model to a sweep in RUN_DIR and write a profile JSON and a PNG report.

    Several RUN_DIRs (sweeps of the same servers, taken one after another) are pooled into one
    fit: each sweep's scatter from the host's load of the moment then weighs less."""
    from kvroute.calibrate.calibration.engine_split import (alone, apply_post_engine, correct_sweep_stamps, describe,
                                                            post_engine_time)
    from kvroute.calibrate.calibration.step_end import StampCorrection
    from kvroute.calibrate.calibration.fit import cap_admission, fit, plot_report, profile_document
    from kvroute.calibrate.calibration.observations import (build_observations, engine_config, load_sweeps,
                                                            observations_frame)
    from kvroute.sim.timing.profile import load_profile, profile_from_dict
    from kvroute.sim.timing.vllm_versions import kv_event_stamp

    if report is not None and Path(report).suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise click.BadParameter(f"{report} must end in {', '.join('.' + f for f in FIGURE_FORMATS)}",
                                 param_hint="'--report'")
    if len(run_dirs) > 1 and out_path is None:
        raise click.UsageError("several RUN_DIRs: give --out (the profile is not written into one of them)")
    if client_core >= 0 and api_cores != "own":
        raise click.BadParameter("needs --api-cores own (the client shares a server's core only where each "
                                 "server's processes keep to their own core)", param_hint="'--client-core'")
    run_dir = run_dirs[0] if len(run_dirs) == 1 else " + ".join(run_dirs)
    try:
        meta, servers, req, exp = load_sweeps(run_dirs)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    if not servers:
        _fail(f"{run_dirs[0]}/meta.json names no server")
    info = servers[0]
    out = Path(out_path) if out_path else Path(run_dir) / "profile.json"
    stamp = kv_event_stamp(info.vllm_version, info.async_scheduling)
    if base_profile is not None:
        _fit_bursts_only(base_profile, run_dir, out, name or out.stem, meta, req, exp, api_server_count, client_busy,
                         engine_spin, stream_baseline, api_cores == "own", api_contention, client_core, stamp)
        return
    try:
        obs, notes = build_observations(req, exp, engine_config(info), itl_source)
    except KeyError as exc:  # a column build_observations reads but does not list as needed
        _fail(f"{req.attrs.get('source', run_dir)}: lacks the column {exc} (calibrate measure writes it)")
    for n in notes[:8]:
        click.echo(f"note: {n}", err=True)
    if len(notes) > 8:
        click.echo(f"note: ... {len(notes) - 8} more left out", err=True)
    try:
        result = fit(obs, holdout, seed, overhead, loss, per_token_overhead, folds, bootstrap)
    except ValueError as exc:
        _fail(f"{run_dir}: {exc}; {left_out_summary(notes, meta)}")
    name = name or out.stem
    doc = profile_document(result, info, meta, name, _model_doc(info.model_root))
    step_s = _prefill_step_s(result.cost, info)
    split = correction = None
    if front_end_split:  # KV-event stamps moved to each request's prefill step end first (step_end)
        rows, how = correct_sweep_stamps(req, stamp, step_s)
        split = post_engine_time(rows)
        correction = StampCorrection.of(stamp, how[alone(rows)]) if how is not None else None
    if split is not None:
        apply_post_engine(doc, split, stamp, correction)
    # after the front-end split took the part after the engine out, before the bursts' fit loads the
    # document as a profile (which refuses an admission above its API-server term)
    cap_admission(doc["overheads"])
    burst_text = (_fit_bursts(doc, meta, req, exp, api_server_count, client_busy, engine_spin, stream_baseline,
                              api_cores == "own", api_contention, client_core, stamp, step_s) if bursts else None)
    try:  # the simulator must accept what is written: checked before writing it
        profile_from_dict(json.loads(json.dumps(doc)), str(out))
    except ValueError as exc:
        _fail(f"the fit of {run_dir} gives no valid profile, so nothing is written: {exc}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
    load_profile(out)
    png = Path(report) if report else out.with_name(f"{out.stem}.fit.{figure_formats[0]}")
    figures = plot_report(result, png, f"profile {name}: {info.model} on {info.hardware}, vLLM {info.vllm_version}",
                          figure_formats)
    frame = observations_frame(obs)
    frame["predicted_s"] = result.predicted_s
    frame["held_out"] = result.held_out
    # NOTE: with --out, everything goes under it and RUN_DIR (measurements) is left untouched.
    points = Path(run_dir) / "fit_points.csv" if out_path is None else out.with_name(out.stem + ".fit_points.csv")
    with atomic_output(points) as tmp:
        frame.to_csv(tmp, index=False)
    click.echo("one request at a time:\n" + result.summary() + "\n"
               + (describe(split, doc["overheads"], correction) if front_end_split
                  else "front end: all of it before the engine (--no-front-end-split)"))
    if burst_text:
        click.echo(burst_text)
    click.echo(f"profile {out}\nreport  {', '.join(str(path) for path in figures)}\npoints  {points}")


def _fit_bursts_only(base: str, run_dir, out: Path, name: str, meta: dict, req, exp, api_server_count: int,
                     client_busy: float, engine_spin: float, stream_baseline: bool = True,
                     own_cores: bool = False, api_contention: float = 1.0, client_core: int = -1,
                     stamp: str = "step_end") -> None:
    """Write ``base`` (its step costs and overheads) with burst terms fitted to RUN_DIR as ``name``."""
    import copy

    from kvroute.sim.timing.profile import load_profile

    try:
        doc = copy.deepcopy(load_profile(base).raw)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--base-profile'") from exc
    doc["name"] = name
    doc.setdefault("provenance", {}).setdefault("fit", {})
    doc.setdefault("sources", {})
    doc["provenance"]["base_profile"] = (f"step costs and overheads of {base} ({doc['provenance'].get('date', '?')}); "
                                         f"front-end and host terms fitted to the bursts in {run_dir} "
                                         f"({meta.get('started')} - {meta.get('finished')})")
    text = _fit_bursts(doc, meta, req, exp, api_server_count, client_busy, engine_spin, stream_baseline, own_cores,
                       api_contention, client_core, stamp)
    if text is None:
        _fail(f"{run_dir} holds no bursts to fit")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    load_profile(out)
    click.echo(f"one request at a time: kept from {base}\n{text}\nprofile {out}")


def _fit_bursts(doc: dict, meta: dict, req, exp, api_server_count: int, client_busy: float = 1.0,
                engine_spin: float = 1.0, stream_baseline: bool = True, own_cores: bool = False,
                api_contention: float = 1.0, client_core: int = -1, stamp: str = "step_end",
                step_s=None) -> str | None:
    """Add the front-end and host sections fitted to the sweep's bursts to ``doc``; returns the
    report text, or None when the sweep has no bursts. ``own_cores``: the servers ran their API
    processes on their engines' cores (``HostModel.api_on_engine_core``), whose work then takes
    ``1 + api_contention`` times as long beside a busy engine (``HostModel.api_contention``), and
    ``client_core`` names the server whose core the client shared (``HostModel.client_core``).
    ``stamp``: what the servers' KV-event stamps mark, moved to each request's prefill step end
    (``engine_split.correct_sweep_stamps``, with ``step_s`` for requests alone) before the
    bursts' ``engine_first_s`` is read; the counts go into ``provenance.fit.bursts``."""
    import math
    import os
    from dataclasses import replace

    from kvroute.calibrate.calibration.bursts import BURST_KINDS, fit_frontend, load_bursts, profile_sections
    from kvroute.calibrate.calibration.engine_split import correct_sweep_stamps
    from kvroute.calibrate.calibration.speed import fit_speed
    from kvroute.calibrate.calibration.step_end import StampCorrection
    from kvroute.sim.timing.profile import profile_from_dict

    # the bursts' engine_first_s reads each request's prefill step end: early KV-event stamps moved first
    req, how = correct_sweep_stamps(req, stamp, step_s)
    found, notes = load_bursts(req, exp)
    for n in notes[:4]:
        click.echo(f"note: {n}", err=True)
    if not found:
        return None
    host = meta.get("client_host") or {}
    servers = float(len(meta.get("urls") or [1]))
    # NOTE: the decode steps were timed while every server's API process streamed and the client
    # read: they count in those steps' baseline (HostModel.baseline_stream_busy).
    ff = fit_frontend(found, profile_from_dict(doc), int(host.get("cores") or os.cpu_count() or 1), servers,
                      api_server_count, client_busy=client_busy, engine_spin_s=engine_spin, refine_evals=40,
                      baseline_stream_busy=servers + client_busy if stream_baseline else 0.0,
                      api_on_engine_core=own_cores, api_contention=api_contention if own_cores else 0.0,
                      client_core=client_core)
    speed = fit_speed(req)
    if speed is not None:
        ff = replace(ff, host=replace(ff.host, engine_speed_sigma=speed.sigma, engine_speed_period_s=speed.period_s))
    sections = profile_sections(ff)
    doc["frontend"], doc["host"] = sections["frontend"], sections["host"]
    doc["provenance"]["fit"]["bursts"] = sections["burst_fit"]
    if how is not None:
        in_bursts = (req["kind"].isin(BURST_KINDS) & (req["role"] == "burst")).to_numpy(bool)
        doc["provenance"]["fit"]["bursts"]["kv_event_stamp_correction"] = StampCorrection.of(
            stamp, how[in_bursts]).to_dict()
    _add_burst_notes(doc, ff)
    text = ff.summary()
    if speed is not None:
        lo, hi = speed.interval_s
        doc["provenance"]["fit"]["bursts"]["engine_speed_period_interval_s"] = [lo, hi if hi != math.inf else None]
        doc["provenance"]["fit"]["bursts"]["engine_speed_method"] = speed.method
        if speed.method == "windows":
            doc["provenance"]["fit"]["bursts"]["engine_speed_client_lag_s"] = round(speed.lag_s, 6)
        shown = f"{lo:.3g}-{hi:.3g} s" if hi != math.inf else f"{lo:.3g} s to one factor per run"
        text += (f"\nengine-speed period: the bursts allow {shown} (likelihood-ratio interval); closed-loop TTFT "
                 "under kv-aware routing depends on it: compare predictions across that range")
    # NOTE: a base profile's own burst terms are replaced whole, their sources with them
    doc["sources"] = {k: v for k, v in doc["sources"].items() if not k.startswith(("frontend", "host."))}
    doc["sources"].update(sections["sources"])
    if host.get("loadavg_start") is not None:
        doc["provenance"]["client_host_loadavg"] = {k: host.get(k) for k in ("loadavg_start", "loadavg_end")}
    return text


def _add_burst_notes(doc: dict, ff) -> None:
    """The burst fit's terms at a bound and its repeated bursts that scatter, added to the
    profile's ``fit_notes`` (``kvroute.calibrate.calibration.walls``; a base profile's own burst
    notes replaced)."""
    notes = doc.setdefault("fit_notes", {})
    kept = [w for w in notes.get("at_bound", []) if not str(w.get("term", "")).startswith(("host.", "frontend."))]
    notes["at_bound"] = kept + [w.to_dict() for w in ff.walls]
    notes["burst_scatter"] = [s.to_dict() for s in ff.scatter[:20]]
    notes["num_burst_scattered"] = len(ff.scatter)


def _model_doc(root: str) -> dict:
    """Shapes from a local model directory's config.json, if there is one."""
    cfg = Path(root) / "config.json"
    if not cfg.is_file():
        return {}
    try:
        c = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return {}
    keys = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
            "num_key_value_heads": "num_kv_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
            "torch_dtype": "dtype", "dtype": "dtype", "architectures": "architectures"}
    return {v: c[k] for k, v in keys.items() if k in c}


@calibrate.command("tiny-model")
@click.argument("out_dir", required=False, type=click.Path(file_okay=False))
def tiny_model(out_dir):
    """Build the tiny random-weight Qwen2 model and tokenizer (no download) and print its path."""
    from kvroute.calibrate.calibration.tiny_model import build_tiny_model

    click.echo(build_tiny_model(out_dir))


COMMANDS = [serve, calibrate]


@click.group(cls=HelpfulGroup, context_settings={"help_option_names": ["-h", "--help"]})
def _main() -> None:
    """kvroute calibration commands (standalone entry point)."""


for _c in COMMANDS:
    _main.add_command(_c)


if __name__ == "__main__":
    _main()
