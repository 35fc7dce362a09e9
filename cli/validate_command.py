"""``kvroute validate``: live replay + prediction + comparison report.

Register with ``cli.add_command(validate)``. Heavy imports stay inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvroute.cli.scenario import DEFAULT_POLICIES, scenario_from_options, scenario_options
from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.sim_commands import figure_format_option
from kvroute.cli.values import (DRAWS, OPEN_FRACTION, POSITIVE_SECONDS, PRIOR_RANGE, RELATIVE, Choice, Cores, Number,
                                check_runs, check_urls, check_values, token_id_range)
from kvroute.sim.study.intervals import HOST_RUN_TO_RUN_LOG_SD
from kvroute.traces.inputs import POSITIVE_INT, RUNS, SECONDS, SEED, TOKENS
from kvroute.traces.outputs import check_output, new_dirs_removed_on_failure


def _policies(single: tuple[str, ...], joined: str | None) -> list[str]:
    from kvroute.cli.scenario import parse_policies

    names = [p for text in (*single, joined or "") for p in text.split(",") if p.strip()]
    return parse_policies(",".join(names) or DEFAULT_POLICIES)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@scenario_options(groups=("workload", "trace"), exclude=("workload_config",), slo=False)
@click.option("--url", "urls", multiple=True, required=True, help="vLLM server base URL; repeat, one per worker.")
@click.option("--policy", "policy", multiple=True, help="Routing policy; repeat to compare several.")
@click.option("--policies", "policies_text", default=None,
              help=f"Comma-separated policies (same as repeated --policy) [{DEFAULT_POLICIES}].")
@click.option("--profile", "profile_name", default="cpu-tiny-qwen2", show_default=True,
              help="Profile (shipped name or JSON file) for step costs and overheads; engine settings come from the servers.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for report.json, report.md, report.html (one self-contained page), "
                   "records_*.parquet and the ttft_* figures (--figure-format).")
@click.option("--max-in-flight", type=Number(POSITIVE_INT), default=None, help="Most requests outstanding at the client (1: one at a time).")
@click.option("--replay", type=Choice(["auto", "closed", "open"]), default="auto", show_default=True,
              help="closed: later turns wait for their parent; open: trace timestamps.")
@click.option("--arrival-spread", "arrival_spread_s", type=Number(SECONDS), default=0.0, show_default=True,
              help="The simulation's start jitter of root requests, s.")
@click.option("--rounds", type=Number(RUNS), default=10, show_default=True,
              help="Seeded simulation rounds averaged (the report gives the mean's 95 % interval).")
@click.option("--live-rounds", type=Number(RUNS), default=1, show_default=True,
              help="Live replays of every policy, interleaved (rr, kv, rr, kv, ...); the report gives their mean, "
                   "min-max and, from 3 rounds, the mean's 95 % interval. One round of a burst shorter than a minute can be off "
                   "by tens of percent on a shared machine: use 3 or more there. The simulation is the same for any number "
                   "of live rounds (with --client-lag measured it draws from every round's measured lags).")
@click.option("--timeout", type=Number(POSITIVE_SECONDS), default=600.0, show_default=True,
              help="Limit on one live request or speed-probe request, s; a worker that passes it is treated as dead. "
                   "Identifying the servers, cache resets and /metrics scrapes wait at most this too "
                   "(and at most 30 s, 30 s and 10 s).")
@click.option("--router-block-tokens", type=Number(TOKENS), default=None,
              help="Router prefix-index granularity, tokens (default: the trace's block, at most 256).")
@click.option("--model", default=None, help="Served model name (default: each server's only model).")
@click.option("--token-range", default=None, help="LO:HI prompt token ids (default: from the model's tokenizer).")
@click.option("--client-cores", type=Cores(), default=None, help="Run this client on these CPU cores (e.g. '1'), off the engines'.")
@click.option("--seed", type=Number(SEED), default=0, show_default=True, help="Seeds simulation rounds and prompt tokens.")
@click.option("--client-lag", default="measured", show_default=True,
              help="Seconds the simulation adds before every later turn, for the live client's own send delay; "
                   "'measured': run the live replays first, then give each simulated later turn a lag drawn from "
                   "their measured send lags (and each root its measured send offset).")
@click.option("--uncertainty", type=Number(DRAWS), default=0, show_default=True,
              help="Also simulate N profiles drawn from the profile's coefficient uncertainty (x --rounds each), so "
                   "each measured value is checked against an interval that includes the model's share.")
@click.option("--prior-range", type=Number(PRIOR_RANGE), default=0.2, show_default=True,
              help="Relative half-width of a derived prior's step costs and API-server time for --uncertainty.")
@click.option("--interval-level", type=Number(OPEN_FRACTION), default=0.90, show_default=True,
              help="Level of the prediction interval each measured value is checked against (it combines the seeds', "
                   "the drawn profiles' and the live rounds' spread and the probes' drift; docs/reference/intervals.md).")
@click.option("--speed-probes", type=Number(DRAWS), default=0, show_default=True,
              help="Time N cold 2,048-token requests per server, one 8,192-token request and a burst of 4 before the "
                   "first and after the last live round: the profile is rescaled to the host's speed they measure "
                   "(see --speed-scale) and their drift shifts and widens the intervals of time measures "
                   "(0: no probes).")
@click.option("--speed-scale/--no-speed-scale", "speed_scale", default=True, show_default=True,
              help="With --speed-probes, predict with the profile's step costs rescaled to the probes' speed "
                   "(kvroute.sim.timing.speed_scale: one factor per step, per-token and attention cost); "
                   "--no-speed-scale predicts with the profile as it is.")
@click.option("--run-to-run-prior", "run_to_run_prior", type=Number(RELATIVE), default=HOST_RUN_TO_RUN_LOG_SD,
              show_default=True,
              help="With one live round, how far one live run of a time measure is taken to move from the next (log "
                   "standard deviation; measured on a shared 2-core CPU host, docs/reference/intervals.md): one round "
                   "cannot show its own spread. From --live-rounds 2 on, their spread is used. 0: none.")
@click.option("--kv-events", "kv_events", multiple=True, metavar="ENDPOINT",
              help="Each server's KV-cache event endpoint (ipc://PATH or tcp://HOST:PORT, as kvroute serve "
                   "--kv-events-port-base prints it), "
                   "one per --url in the same order: every live record then carries when the engine's step produced "
                   "its first token, and the report splits later turns' TTFT at it.")
@click.option("--tokens/--no-tokens", "record_tokens", default=False, show_default=True,
              help="Also keep every output token's arrival time, live and simulated (tokens_live.parquet, "
                   "tokens_sim.parquet).")
@figure_format_option
@check_values
@stops_on_sigterm
def validate(urls, policy, policies_text, profile_name, out_dir, max_in_flight, replay, arrival_spread_s, rounds,
             live_rounds, timeout, router_block_tokens, model, token_range, client_cores, seed, client_lag,
             uncertainty, prior_range, kv_events, record_tokens, figure_formats=("png",), interval_level=0.90,
             speed_probes=0, speed_scale=True, run_to_run_prior=HOST_RUN_TO_RUN_LOG_SD, **options):
    """Replay a trace live against vLLM servers with the simulator's routing policies, simulate the
    same trace, and report predicted against measured (time to complete, TTFT, ITL, hit rate,
    per-worker hit tokens). Ctrl-C or SIGTERM writes what was measured so far (exit code 130).

    \b
    Example:
      kvroute validate --trace chat.jsonl --url http://127.0.0.1:8100 --url http://127.0.0.1:8101 \\
          --policies round_robin,kv_aware --profile cpu-tiny-qwen2-x2 --live-rounds 3 --out runs/validate
    """
    from kvroute.calibrate.live.client import CalibrationError
    from kvroute.calibrate.live.kv_events import check_endpoints
    from kvroute.calibrate.live.cores import pinned
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_measured_only, write_report
    from kvroute.cli.scenario import scenario_trace
    from kvroute.sim.cluster.cluster import REPLAY_MODES
    from kvroute.sim.timing.profile import load_profile

    check_urls(urls)
    scenario = scenario_from_options(options, seed=seed)  # the workload: checked before any connection
    check_runs(rounds * (uncertainty + 1), f"--rounds {rounds} x (--uncertainty {uncertainty} + 1) per policy")
    if kv_events:
        try:
            check_endpoints(kv_events, len(urls))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--kv-events'") from exc
    if not speed_scale and not speed_probes:
        raise click.BadParameter("applies with --speed-probes N (N >= 1): without probes the profile is used as it "
                                 "is", param_hint="'--no-speed-scale'")
    # NOTE: the live client, imported before anything is written: when it is missing, main()
    # names the extras that bring it (cli.main.OPTIONAL_MODULES)
    import aiohttp  # noqa: F401
    names = _policies(policy, policies_text)
    # a failure before anything is written (no server, a bad option checked below) leaves no --out it made
    with new_dirs_removed_on_failure(out_dir):
        try:  # before any work: ~1 KB per record per policy and round, simulated or live
            check_output(out_dir, 1024 * len(names) * (rounds + live_rounds) * (scenario.max_requests or 10**4),
                         is_dir=True)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        trace = scenario_trace(scenario)
        try:
            profile = load_profile(profile_name)
        except (FileNotFoundError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="'--profile'") from exc
        closed = REPLAY_MODES[replay]
        spec = ValidationSpec(tuple(urls), tuple(names), max_in_flight, closed, arrival_spread_s, router_block_tokens,
                              timeout, rounds, seed, model, token_id_range(token_range), _client_lag(client_lag),
                              uncertainty,
                              prior_range, live_rounds=live_rounds, record_tokens=record_tokens,
                              kv_event_endpoints=tuple(kv_events), interval_level=interval_level,
                              speed_probes=speed_probes, speed_scale=speed_scale, run_to_run_prior=run_to_run_prior)
        try:
            with pinned(client_cores):
                result = run_validation(trace, profile, spec, progress=lambda m: click.echo(m, err=True))
        except (CalibrationError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo("interrupted before any live measurement; nothing written", err=True)
            sys.exit(130)
        if not result.predicted:  # Ctrl-C after the live rounds, before their prediction
            path = write_measured_only(result, out_dir, provenance=_provenance(scenario, trace, profile))
        else:
            path = write_report(result, out_dir, figure_formats, provenance=_provenance(scenario, trace, profile))
    _print_outcome(result, out_dir, path, figure_formats, live_rounds)


def _client_lag(text: str) -> float | None:
    """``--client-lag``: seconds, or None for ``measured``.

    Raises:
        click.BadParameter: neither ``measured`` nor a number of seconds in [0, 1e9].
    """
    if text == "measured":
        return None
    try:
        lag = float(text)
    except ValueError:
        raise click.BadParameter(f"expected seconds or 'measured', got {text!r}", param_hint="'--client-lag'") from None
    if not 0.0 <= lag <= 1e9:
        raise click.BadParameter(f"must be a finite number >= 0 (seconds) or 'measured', got {text!r}",
                                 param_hint="'--client-lag'")
    return lag


def _print_outcome(result, out_dir: str, path, figure_formats, live_rounds: int) -> None:
    """The report as written, the files written (in ``out_dir`` as given), a warning per lost
    worker; exits 130 when the run was interrupted and 1 when no live request was measured."""
    click.echo((Path(out_dir) / "report.md").read_text(encoding="utf-8"), nl=False)  # as written, not rebuilt
    figures = figure_formats[0] if len(figure_formats) == 1 else "{" + ",".join(figure_formats) + "}"
    tokens = (", tokens_live.parquet" + (", tokens_sim.parquet" if result.predicted else "")
              if result.spec.record_tokens else "")
    click.echo(f"wrote {path}, report.md, records_live.parquet{tokens} in {out_dir} (no prediction)"
               if not result.predicted
               else f"wrote {path}, report.md, report.html, records_live.parquet, records_sim.parquet{tokens}, "
                    f"ttft_*.{figures} in {out_dir}", err=True)
    for run in result.runs:
        for w, why in run.dead.items():
            click.echo(f"warning: {run.policy}" + (f" (live round {run.live_round + 1})" if live_rounds > 1 else "")
                       + f": worker {w} was lost ({why}); report.md counts the requests that failed, "
                       "records_live.parquet (status, error) lists them", err=True)
    if result.interrupted:
        sys.exit(130)
    measured = sum(int((run.live.records["status"] == "ok").sum()) for run in result.runs if run.live is not None)
    if measured == 0:
        click.echo("Error: no live request was measured (each one failed or was not sent: report.md says why)",
                   err=True)
        sys.exit(1)


def _provenance(scenario, trace, profile) -> dict:
    """What produced a validation: the command and its resolved options, kvroute's version, the
    profile's name and content hash and the trace's (its file's hash, or the generated records')."""
    from kvroute.cli.provenance import (canonical_sha256, kvroute_version, records_sha256, resolved_options,
                                        trace_file_record)

    ctx = click.get_current_context()
    trace_file = getattr(scenario, "trace_file", None)
    return {"command": ctx.command_path, "version": kvroute_version(), "options": resolved_options(ctx),
            "profile": {"name": profile.name, "sha256": canonical_sha256(profile.raw)},
            "trace": trace_file_record(trace_file) if trace_file else {"generated_records_sha256": records_sha256(trace)}}
