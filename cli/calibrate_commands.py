"""Command line: ``kvroute calibrate {measure,fit,tiny-model}`` (``fit`` is
:mod:`kvroute.cli.fit_command`; ``kvroute serve`` is :mod:`kvroute.cli.serve_command`).

``kvroute`` loads this module only when one of its commands runs
(``kvroute.cli.main.LAZY_COMMANDS``); heavy imports stay inside the commands. Also runnable as
``python -m kvroute.cli.calibrate_commands {serve,calibrate} ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvroute.cli.fit_command import fit_cmd
from kvroute.cli.help_text import HelpfulGroup
from kvroute.cli.serve_command import SERVE_VALUES, serve
from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.values import Choice, Cores, Number, check_urls, check_values, token_id_range
from kvroute.traces.inputs import MAX_TOKENS, SEED, TOKENS, Num
from kvroute.traces.outputs import check_output, new_dirs_removed_on_failure


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
@click.option("--preset", type=Choice(["full", "quick"]), default="full", show_default=True, help="Sweep size.")
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
                   "(16k tokens for 'full'); must fit the servers' max_model_len and --max-len.")
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

    from kvroute.calibrate.live.client import CalibrationError
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.live.cores import pinned

    plan = _sweep_plan(preset, longest, max_len, bursts, burst_slots)
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
            check_endpoints(kv_events, len(urls) or (num_servers or 1 if dry_run else 0))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--kv-events'") from exc
    given = _load_estimate_profile(estimate_profile) if estimate_profile else None
    if dry_run:
        _print_dry_run(plan, given, urls, num_servers, seed, bool(kv_events), longest)
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

    from kvroute.calibrate.calibration.sweep_files import check_no_sweep

    try:  # its rows stay as they are
        check_no_sweep(out)
    except CalibrationError as exc:
        raise click.ClickException(f"--out {exc}") from None
    # a failure before anything is written (no server, a wrong --model) leaves no --out it made
    with new_dirs_removed_on_failure(out):
        try:  # before any work; a full sweep writes a few MB of rows
            check_output(out, 16 << 20, is_dir=True)
        except ValueError as exc:
            raise click.ClickException(str(exc))
        try:
            with pinned(client_cores):
                summary = asyncio.run(run_sweep(
                    list(urls), out, plan, model, seed, (lo, hi), progress, hardware, timeout, kv_events,
                    on_start=started))
        except CalibrationError as exc:
            kept = _rows(out / "requests.csv")
            raise click.ClickException(f"{exc}" + (f"\n{kept} measured requests are kept in {out / 'requests.csv'}" if kept else ""))
        except KeyboardInterrupt:
            kept = _rows(out / "requests.csv")
            click.echo(f"\ninterrupted: {kept} measured requests are kept in {out / 'requests.csv'}" if kept
                       else "\ninterrupted before any request was measured", err=True)
            sys.exit(130)
    _print_measured(summary, out)


def _sweep_plan(preset: str, longest: int | None, max_len: int | None, bursts: bool, burst_slots: int):
    """The preset's ``SweepPlan`` extended to ``longest`` tokens, clipped to ``max_len``, with or
    without its bursts, spread over ``burst_slots``.

    Raises:
        click.BadParameter: ``longest`` above ``max_len`` (which would drop what it adds).
    """
    from dataclasses import replace

    from kvroute.calibrate.calibration.sweep_plan import SweepPlan

    if longest is not None and max_len is not None and longest > max_len:  # --max-len would drop what --longest adds
        raise click.BadParameter(f"{longest} tokens is more than --max-len {max_len}, which drops every sequence "
                                 f"longer than that; give --longest at most {max_len}, or raise --max-len",
                                 param_hint="'--longest'")
    plan = SweepPlan.preset(preset)
    if longest is not None:
        plan = plan.extended(longest)
    if max_len is not None:
        plan = plan.clipped(max_len)
    if not bursts:
        plan = plan.without_bursts()
    return replace(plan, burst_slots=burst_slots)


def _print_dry_run(plan, given, urls, num_servers: int | None, seed: int, kv_events: bool,
                   longest: int | None) -> None:
    """``--dry-run``: the plan, the estimate of its time on ``--servers`` (or the ``--url``)
    servers and, without servers, the commands to run next (README: Calibrate on your GPUs)."""
    n = num_servers or len(urls) or 1
    profile, note = _estimate_profile(given, None, n, urls)
    click.echo(_plan_text(plan, n, seed, profile))
    click.echo(_estimate(plan, profile, n, seed, None, kv_events).line() + note)
    if not urls:
        click.echo(f"next: start the servers ({_serve_command(given, n, longest)}), then this "
                   f"command with {'one --url per server' if n > 1 else '--url URL'} and --out DIR instead of "
                   f"--dry-run{'' if num_servers is None else f' and --servers {num_servers}'}, then kvroute "
                   "calibrate fit DIR --out PROFILE.json")


def _print_measured(summary, out: Path) -> None:
    """What a finished sweep measured (stdout), then its warnings and notes (stderr)."""
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


def _serve_command(given, num_servers: int, longest: int | None) -> str:
    """The ``kvroute serve`` command that starts the servers a ``measure --dry-run`` planned for:
    ``num_servers`` of them (``-n``); from ``given`` (the ``--estimate-profile`` the user chose,
    or None) its model and tensor-parallel size (``--tp``, a derived prior's
    ``parallel.tensor_parallel_size``); with ``longest``, a ``--max-model-len`` that takes it."""
    import shlex

    raw = (given.raw or {}) if given is not None else {}
    model = (raw.get("model") or {}).get("name") if isinstance(raw.get("model"), dict) else None
    parallel = raw.get("parallel") if isinstance(raw.get("parallel"), dict) else {}
    tp = parallel.get("tensor_parallel_size", 1)
    args = ["kvroute", "serve", "--model", shlex.quote(model) if isinstance(model, str) and model else "MODEL"]
    if type(tp) is int and tp > 1:
        args += ["--tp", str(tp)]
    args += ["-n", str(num_servers)]
    if longest is not None:
        args += ["--max-model-len", str(longest)]
    return " ".join(args)


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
    from kvroute.calibrate.live.cores import detect_gpus
    from kvroute.sim.timing.profile import load_profile

    if infos:
        on_cpu = infos[0].device == "cpu"
    else:
        on_cpu = _all_on_this_machine(urls) and not detect_gpus()
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
    if profile.on_cpu:
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

    if infos:
        if infos[0].device != "cuda" or infos[0].hardware == "unknown":
            return []
        return [re.sub(r"^(\d+ of )?\d+ x ", "", part.strip()) for part in infos[0].hardware.split(", ")]
    from kvroute.calibrate.live.cores import gpu_models

    return gpu_models() if _all_on_this_machine(urls) else []


def _all_on_this_machine(urls) -> bool:
    """Whether every server of ``urls`` (or none given) runs on this machine (a loopback host)."""
    from urllib.parse import urlsplit

    from kvroute.calibrate.live.server import machine_key

    return all(machine_key(urlsplit(u).hostname or "") == "loopback" for u in urls)


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


def _async_text(flag: bool | None) -> str:
    return "" if flag is None else f" (async scheduling {'on' if flag else 'off'})"


def _rows(path: Path) -> int:
    try:
        with open(path) as fh:
            return max(0, sum(1 for _ in fh) - 1)
    except OSError:
        return 0


@calibrate.command("tiny-model")
@click.argument("out_dir", required=False, type=click.Path(file_okay=False))
def tiny_model(out_dir):
    """Build the tiny random-weight Qwen2 model and tokenizer (no download) and print its path."""
    from kvroute.calibrate.calibration.tiny_model import build_tiny_model

    click.echo(build_tiny_model(out_dir))


calibrate.add_command(fit_cmd, "fit")

COMMANDS = [serve, calibrate]


@click.group(cls=HelpfulGroup, context_settings={"help_option_names": ["-h", "--help"]})
def _main() -> None:
    """kvroute calibration commands (standalone entry point)."""


for _c in COMMANDS:
    _main.add_command(_c)


if __name__ == "__main__":
    _main()
