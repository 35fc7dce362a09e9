"""Command line: ``kvroute serve``, vLLM servers for calibration and live validation.

``kvroute`` loads this module only when ``serve`` runs (``kvroute.cli.main.LAZY_COMMANDS``); the
servers' specs, ports and lifetime are :mod:`kvroute.calibrate.live.server`, the cores they run
on :mod:`kvroute.calibrate.live.cores` and :mod:`kvroute.calibrate.live.plan`.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import click

from kvroute.cli.values import Choice, Number, check_values
from kvroute.traces.inputs import BLOCK_SIZE, FRACTION, SECONDS, TOKENS, Num
from kvroute.traces.outputs import check_output


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


HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
"""One label of a host name (RFC 1123)."""


def _host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--host``: an IPv4 address or a host name (the servers' URLs are ``http://HOST:PORT``,
    which an IPv6 literal would break)."""
    import ipaddress

    labels = value.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(value)
            return value
        except ValueError:
            pass
    elif ":" not in value and len(value) <= 253 and all(HOST_LABEL.match(label) for label in labels):
        return value
    raise click.BadParameter(f"not an IPv4 address or host name: {value!r}", ctx=ctx, param=param)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.option("--model", required=True,
              help="Model directory or Hugging Face id; 'tiny-qwen2' builds the tiny random-weight test model.")
@click.option("--served-model-name", default=None, help="Name clients use (default: the model; 'tiny-qwen2' for the tiny model).")
@click.option("-n", "--num-servers", type=Number(SERVE_VALUES["num_servers"]), default=None,
              help="Servers to start (default: one per GPU, or one per CPU core that no running vLLM server's engine "
                   "is pinned to).")
@click.option("--port-base", type=Number(PORT), default=8100, show_default=True, help="Server i listens on port-base + i.")
@click.option("--host", default="127.0.0.1", show_default=True, callback=_host,
              help="Address the servers listen on, and that their URLs name: the default is this machine only; give "
                   "this machine's address on the network for a client (calibrate measure, validate) on another "
                   "machine. KV-cache events then go over TCP to that address too.")
@click.option("--block-size", type=Number(BLOCK_SIZE), default=None,
              help="KV block size (default: vLLM's on GPUs, 16 through 0.33 and 64 from 0.34; 32 on the CPU backend).")
@click.option("--gpu-memory-utilization", type=Number(FRACTION), default=None,
              help="vLLM's share of each GPU, for all its workers together (GPU only; default: vLLM's).")
@click.option("--workers-per-gpu", type=Number(Num(integer=True, minimum=1, maximum=64)), default=1, show_default=True,
              help="vLLM servers on each GPU, each with 1/N of the GPU's memory share (GPU only).")
@click.option("--tp", "tensor_parallel_size", type=Number(Num(integer=True, minimum=1, maximum=1024)), default=1,
              show_default=True,
              help="GPUs per server (vLLM's --tensor-parallel-size): server i gets GPUs i*N to i*N+N-1; -n counts "
                   "servers (default: GPUs / N). GPU only.")
@click.option("--kv-cache-gib", type=Number(SERVE_VALUES["kv_cache_gib"]), default=1, show_default=True, help="KV cache per server on the CPU backend, whole GiB.")
@click.option("--max-model-len", type=Number(TOKENS), default=None, help="vLLM --max-model-len.")
@click.option("--device", type=Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True)
@click.option("--api-cores", type=Choice(["spare", "own", "any"]), default="spare", show_default=True,
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
@click.option("--dry-run", is_flag=True,
              help="Print each server's vLLM command line and the environment serve sets for it (GPUs, CPU core, "
                   "vLLM's variables), then exit: nothing starts, and vLLM need not be installed.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@check_values(rules=SERVE_VALUES)
def serve(model, served_model_name, num_servers, port_base, host, block_size, gpu_memory_utilization, workers_per_gpu,
          tensor_parallel_size, kv_cache_gib, max_model_len, device, api_cores, kv_events_port_base, log_dir, vllm_args,
          timeout, dry_run, extra):
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
      CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 kvroute serve --model meta-llama/Llama-3.1-70B-Instruct --tp 4 --dry-run
                        # what would start on 8 GPUs (named, so it previews from any machine)
    """
    import dataclasses
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
    flag = next((a for a in args if a.split("=", 1)[0] in ("--tensor-parallel-size", "-tp")), None)
    if flag is not None:  # passed as it is, each server would still get one GPU
        raise click.BadParameter(f"give the tensor-parallel size as --tp N, not {flag} to vLLM: serve then gives each "
                                 "server N GPUs", param_hint="'--tp'")
    if not dry_run:
        try:
            check_output(log_dir, 0, "--log-dir", is_dir=True)
        except ValueError as exc:
            raise click.ClickException(str(exc))
    if importlib.util.find_spec("vllm") is None and not dry_run:
        raise click.ClickException("vLLM is not installed in this Python, so no server can start: "
                                   "python -m pip install -e '.[gpu]' on GPU machines, '.[live]' for vLLM's CPU build")

    from kvroute.calibrate.calibration.tiny_model import (TINY_MODEL_NAME, build_tiny_model, default_tiny_dir,
                                                          tiny_model_built)

    tiny = model == TINY_MODEL_NAME and not Path(model).exists()
    model_path = str(default_tiny_dir()) if tiny else model
    running = pinned_servers() if device != "gpu" else []
    taken, api_taken = engine_cores_in_use(running), api_cores_in_use(running)
    try:
        specs = plan_servers(model_path, num_servers, port_base, served_model_name or model, block_size,
                             gpu_memory_utilization, kv_cache_gib, max_model_len, args, log_dir, device, api_cores,
                             kv_events_port_base, workers_per_gpu=workers_per_gpu, taken=taken, api_taken=api_taken,
                             tensor_parallel_size=tensor_parallel_size)
        specs = [dataclasses.replace(s, host=host) for s in specs]
        if dry_run:
            _print_plan(specs)
            # after the plan: what serve would warn of, and what this Python lacks to run it
            for line in core_notes(specs, taken, api_taken):
                click.echo(f"# {line}")
            if importlib.util.find_spec("vllm") is None:
                click.echo("# vLLM is not installed in this Python, so these lines cannot run here: python -m pip "
                           "install -e '.[gpu]' on GPU machines, '.[live]' for vLLM's CPU build (README)")
            return
        check_ports(specs)  # a taken port fails now, before any line says what starts where
    except (ValueError, ServerError) as exc:
        hint = ("; to preview a GPU host from a machine without its GPUs, name them: CUDA_VISIBLE_DEVICES=0,1,2,3 "
                "kvroute serve ... --dry-run" if dry_run and "GPU" in str(exc) else "")
        raise click.ClickException(f"{exc}{hint}")

    def _stop(signum, frame):
        raise KeyboardInterrupt

    # from here on, Ctrl-C and SIGTERM both stop the servers cleanly, also when a script started
    # us in the background (where SIGINT arrives ignored)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    if tiny:
        if not tiny_model_built():
            click.echo("building the tiny random-weight Qwen2 model ...", err=True)
        try:
            build_tiny_model(model_path)
        except ImportError as exc:
            raise click.ClickException(f"building {TINY_MODEL_NAME} needs torch, transformers and tokenizers "
                                       f"(pip install 'kvroute[live]'), importable: {exc}")
    for line in core_notes(specs, taken, api_taken):
        click.echo(line, err=True)
    for s in specs:
        where = (f"GPU{'s' if s.tensor_parallel_size > 1 else ''} {s.devices_text}"
                 + (f" ({s.gpu_memory_utilization:g} of its memory)"
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
        raise click.ClickException(str(exc))
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


SERVE_ENV_PREFIXES = ("CUDA_", "VLLM_", "HF_HUB_OFFLINE", "DO_NOT_TRACK")
"""The environment variables ``--dry-run`` prints: those ``ServerSpec.environment`` sets."""


def _print_plan(specs) -> None:
    """``--dry-run``: per server, a comment line (its URL, where its engine and API process run,
    its log) and its command line, one shell line (``env VAR=... python -m ...``, ready to paste);
    first, when no GPU is planned, a line saying so and how to preview a GPU host.

    A server pinned to a CPU core gets ``taskset -c CORE`` before its line, as serve starts it
    (engine and API process on that core); where serve then moves the API process to other cores
    (``--api-cores spare`` or ``any``), the comment line gives the ``taskset`` that does it once
    the server is up, which a pasted line does not do."""
    from kvroute.calibrate.live.cores import cpu_cores

    if all(s.cuda_device is None for s in specs):
        click.echo("# no GPU used: servers on vLLM's CPU backend; to preview a GPU host, name its GPUs: "
                   "CUDA_VISIBLE_DEVICES=0,1,2,3 kvroute serve ... --dry-run")
    for s in specs:
        env = s.environment({})
        shown = {k: v for k, v in env.items() if k.startswith(SERVE_ENV_PREFIXES)}
        pin = []
        if s.cuda_device is not None:
            where = f"GPUs {s.devices_text}"
        elif s.cpu_core is None:
            where = "any core"
        else:
            pin = ["taskset", "-c", str(s.cpu_core)]
            api = tuple(s.frontend_cores or cpu_cores())
            where = f"CPU core {s.cpu_core}, " + (
                "its API process too" if api == (s.cpu_core,) else
                f"its API process moved to core(s) {','.join(map(str, api))} once up "
                f"(taskset -p -c {','.join(map(str, api))} API_PID; this line does not)")
        click.echo(f"# {s.url} on {where}, log {s.log_path}")
        click.echo(shlex.join([*pin, "env", *(f"{k}={v}" for k, v in sorted(shown.items())), *s.command()]))


def _watch(servers, sleep, interval: float = 1.0) -> None:
    """Keep ``servers`` up until every one has exited: a server that exits while others still run
    is reported in one line (then its log's line saying its engine died, else its last lines),
    the processes it left are stopped (``VllmServer.stop``), and the others keep serving (a validate run finishes on the servers it has left); once none runs,
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
            s.stop(grace_s=5.0)  # the engine processes it may have left running
        if not running:
            raise click.ClickException(f"every server has exited ({len(servers)}); see the lines above")
        sleep(interval)
