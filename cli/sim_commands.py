"""``kvroute simulate`` and ``kvroute compare``."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvroute.cli.config import config_option
from kvroute.cli.profile_notes import frontend_note, unmeasured_note
from kvroute.cli.run_notes import (clamped_output_note, failed_count_note, failure_note, flat_goodput_note,
                                   kv_turnover_note, model_note, named_as_tables, policy_notes, same_routing_note,
                                   speed_note)
from kvroute.cli.signals import INTERRUPTED_EXIT, exit_if_held, stops_on_sigterm
from kvroute.cli.stage_output import stage_doc, stage_results, stage_text, write_stages
from kvroute.cli.values import DRAWS, PRIOR_RANGE, Choice, Number, check_runs, check_values
from kvroute.traces.inputs import RUNS
from kvroute.sim.cluster.collector import paused_collector
from kvroute.sim.study.executors import interrupts_deferred
from kvroute.traces.outputs import atomic_output, check_output, write_text_atomic
from kvroute.cli.scenario import (describe, executor_options, parse_policies, policies_option, resolve_executor,
                                 scenario_from_options, scenario_options, scenario_spec, scenario_trace, with_errors)
from kvroute.sim.routing import DEFAULT_POLICIES
from kvroute.sim.cluster.metrics import COUNT_METRICS, ServiceClass

if TYPE_CHECKING:
    from kvroute.sim.study.experiment import CompareInterrupted, Comparison, UncertainComparison


class _RunProgress:
    """A second bar for the run under way (on a terminal only): requests sent of the trace, and
    its simulated time."""

    def __init__(self, total: int, disable: bool) -> None:
        from kvroute.sim.study.progress import progress_bar, watched

        self.disable = disable or watched() != "terminal"
        self.bar = progress_bar(total, "run", "request", enabled=not self.disable, leave=False, position=1)

    def __call__(self, policy: str, round_: int, now_s: float, sent: int, total: int) -> None:
        if self.bar.total != total or self.bar.desc != f"{policy} r{round_}":
            self.bar.reset(total=total)
            self.bar.set_description(f"{policy} r{round_}", refresh=False)
        self.bar.set_postfix_str(f"t={now_s:,.1f} s simulated", refresh=False)
        self.bar.update(sent - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def _run(policies, rounds, json_out, out, records_format, scenario, slo_ttft, slo_tpot, uncertainty=0, prior_range=0.2,
         quiet=False, time_series=False, executor=("sequential", None, None), figure_formats=("png",),
         command="compare"):
    """The body of ``kvroute compare`` and ``kvroute simulate`` (``command``): check the options,
    run the comparison, print it (table or JSON) with its notes and write ``--out``.

    Exits with :data:`INTERRUPTED_EXIT` when interrupted, after reporting and writing the runs that
    finished."""
    if time_series and out is None:
        raise click.UsageError("--time-series writes its files under --out: give --out DIR")
    if figure_formats != ("png",) and out is None:
        raise click.UsageError("--figure-format sets the figures written under --out: give --out DIR")

    seed, trace_path = scenario.seed, scenario.trace_file

    @functools.cache  # drawn once per round: the runs, the notes and the provenance read it
    def trace_for(run_seed: int):
        return scenario_trace(scenario, run_seed - seed)

    trace = trace_for(seed)
    # A generated workload draws its lengths per round; a trace file is the same in every round.
    rounds_trace = trace if trace_path is not None else trace_for
    spec = scenario_spec(scenario, record_series=time_series)
    _warn_changed_inputs(trace_path, spec)
    if out is not None:  # before the work: ~300 bytes per record row, plus a plot
        check_output(out, 300 * len(trace.records) * len(policies) * rounds + (1 << 20), is_dir=True)
    header = describe(trace, spec)
    if not json_out:
        click.echo(f"{header} | {rounds} round(s) per policy"
                   + (f", plus {uncertainty} drawn profile(s) x {rounds} round(s)" if uncertainty else ""))

    slo = ServiceClass(slo_ttft, slo_tpot)
    result = _run_comparison(rounds_trace, spec, policies, rounds, seed, slo, uncertainty, prior_range,
                             len(trace.records), quiet or json_out, executor)
    # every result is in: a stop now is held until they are reported and written (a second one stops at once)
    with interrupts_deferred() as held:
        interval_note = _interval_note(result, policies, rounds, seed, slo)
        notes = _gather_notes(result, scenario, trace, rounds_trace, spec, policies, slo,
                              table=not json_out or out is not None, command=command)  # (--json alone keeps pandas unimported)
        staged = stage_results(result.comparison, trace, spec)  # None unless the trace has load stages
        _print_results(result, header, rounds, seed, slo, staged, notes, interval_note, json_out)
        if out is not None:
            _write_output_set(out, result, header, staged, notes, interval_note, scenario, spec, trace_for, rounds,
                              slo, json_out, records_format, time_series, figure_formats)
    if result.interrupted is not None or result.stopped:  # its line was printed when the runs stopped
        sys.exit(INTERRUPTED_EXIT)
    exit_if_held(held, out)


@dataclass(frozen=True)
class _RunResult:
    """What :func:`_run_comparison` ran: the comparison, its drawn profiles' and, when it was
    stopped, the interruption."""

    comparison: Comparison
    """The ``Comparison`` of the finished runs (the central profile's under ``--uncertainty``)."""
    uncertain: UncertainComparison | None
    """The ``UncertainComparison`` under ``--uncertainty``; None without it, or when interrupted."""
    interrupted: CompareInterrupted | None
    """The ``CompareInterrupted`` when Ctrl-C or SIGTERM stopped the runs, else None."""
    draws: int
    """The drawn profiles reported: ``--uncertainty``, or 0 when interrupted (the draws are dropped)."""
    stopped: bool = False
    """Ctrl-C or SIGTERM came after every run finished, while they were summarised: the results
    are whole (``interrupted`` is None) and the command exits as interrupted once they are written."""


def _run_comparison(rounds_trace, spec, policies, rounds, seed, slo, uncertainty, prior_range, num_records,
                    no_bars, executor) -> _RunResult:
    """Run every policy's rounds (and ``uncertainty`` drawn profiles' rounds) with progress bars
    unless ``no_bars``.

    Ctrl-C or SIGTERM ends the runs: the finished ones are kept, the draws dropped, and a line on
    stderr says how many finished; when none did, the command exits here with
    :data:`INTERRUPTED_EXIT`."""
    from kvroute.sim.study.experiment import CompareInterrupted
    from kvroute.sim.study.experiment import compare as run_compare
    from kvroute.sim.study.progress import progress_bar

    # a bar on a terminal or in a notebook; in a pipe or a file only a plain line a minute, if it runs that long
    bar = progress_bar(len(policies) * rounds * (1 + uncertainty), "simulating", "run", enabled=not no_bars)
    inside = _RunProgress(num_records, disable=no_bars)
    uncertain = interrupted = None  # Ctrl-C or SIGTERM: the finished runs are reported and written, marked incomplete
    late = None  # Ctrl-C or SIGTERM after the last run (the runs are whole)
    try:
        if uncertainty:
            from kvroute.sim.study.experiment import compare_uncertain

            uncertain = compare_uncertain(rounds_trace, spec, policies, uncertainty, rounds, seed, prior_range,
                                          slo, progress=lambda p, r: bar.update())
            comparison = uncertain.base
        else:
            where, address, max_workers = executor
            if where == "local" and len(policies) * rounds == 1:
                where = "sequential"  # one run: a pool would only add its start-up
            comparison = run_compare(rounds_trace, spec, policies, rounds=rounds, seed=seed,
                                     slo=slo, progress=lambda p, r: bar.update(),
                                     run_progress=inside if not inside.disable else None, executor=where,
                                     address=address, max_workers=max_workers)
    except CompareInterrupted as stop:
        comparison, uncertainty = stop.comparison, 0
        if stop.missing:
            interrupted = stop
        else:  # after the last run: the set is whole
            late = stop
    inside.close()
    bar.close()
    if late is not None:
        click.echo(f"\ninterrupted after all {late.total} runs finished: their results are whole", err=True)
    if interrupted is not None:
        click.echo(f"\ninterrupted: {interrupted.total - len(interrupted.missing)} of {interrupted.total} runs "
                   "finished" + ("" if comparison is not None else "; nothing written"), err=True)
        if comparison is None:
            sys.exit(INTERRUPTED_EXIT)
    return _RunResult(comparison, uncertain, interrupted, uncertainty, stopped=late is not None)


def _interval_note(result: _RunResult, policies, rounds: int, seed: int, slo: ServiceClass) -> str:
    """The note printed under the table (and in ``report.html``): what ± means (rounds, seeds,
    finished rounds of an interrupted run, the drawn profiles' share), the units of changes and the
    goodput bound."""
    comparison = result.comparison
    changes = "; changes of shares in percentage points (pp)" if len(policies) > 1 else ""  # change columns only then
    spread = ("one round per policy, seed {seed}: no interval (--rounds 2 or more gives one)".format(seed=seed)
              if rounds == 1 else
              f"{rounds} round(s) per policy, seeds {seed}..{seed + rounds - 1}; ± is the 95% interval over rounds "
              "([low, high] where clipped to possible values)" + (
                  ": with two rounds Student's t has one degree of freedom, 12.7 standard errors wide each way "
                  "(4.3 with three)" if rounds == 2 else ""))
    if result.interrupted is not None and rounds > 1:
        done = ", ".join(f"{p} {len(comparison.runs.get(p, []))}" for p in policies)
        spread = (f"interrupted: rounds finished of {rounds} per policy: {done}; ± is the 95% interval over the "
                  "finished rounds ([low, high] where clipped to possible values)")
    if not result.draws:  # (an interrupted run drops the draws)
        return f"{spread}{changes}; goodput at TTFT <= {slo.ttft_s} s and TPOT <= {slo.tpot_s} s."
    return (f"(seeds): mean ± 95% interval over {rounds} round(s), seeds {seed}..{seed + rounds - 1}, "
            f"central profile. With model unc.: 95% prediction interval of the mean of {rounds} run(s), "
            f"centred on the (seeds) mean, from its seeds' spread and that of {result.draws} profiles drawn "
            f"from {result.uncertain.method}, each on its own seeds (times and rates in log space; "
            "docs/reference/intervals.md)" + (
                f"; the seeds' spread is pooled over the runs of all {result.draws + 1} profiles, so with {rounds} "
                f"rounds it can come out narrower than (seeds), whose t has {rounds - 1} degree{'s' if rounds > 2 else ''} of freedom"
                if rounds < 4 else "") + f"{changes}; goodput at TTFT <= {slo.ttft_s} s and TPOT <= {slo.tpot_s} s.")


def _gather_notes(result: _RunResult, scenario, trace, rounds_trace, spec, policies, slo: ServiceClass,
                  table: bool, command: str = "compare") -> list[str]:
    """The notes printed under the table, in ``--json``'s ``notes`` and in ``report.html``, of
    ``command`` (``compare`` or ``simulate``: the advice names the options it has).

    With ``table`` (the table is printed or ``--out`` writes the records) they read the per-request
    records; without it (``--json`` alone) only the notes that need no per-request table are given,
    failures counted from the runs' summaries, so pandas stays unimported (the records are a
    DataFrame). When nothing was served, the failure note is the only one."""
    comparison = result.comparison
    fitted_seed = (scenario.trace_file is None and scenario.workload == "seed-chat" and scenario.reply is None
                   and scenario.workload_config is None)
    if table:
        from kvroute.sim.timing.coverage import peak_in_flight, run_note

        records = comparison.records()
        peaks = ({policy: peak_in_flight(rows) for policy, rows in records.groupby("policy", sort=False)}
                 if "policy" in records.columns else {None: peak_in_flight(records)})
        peak = max(peaks.values())
        at_peak = [p for p, n in peaks.items() if n == peak]  # the policies that piled the most on one worker
        busiest = ", ".join(at_peak) if len(at_peak) < len(peaks) else None
        served = bool((records["status"] == "ok").any())
        failures = failure_note(comparison)
    else:  # the notes that need no per-request table; failures counted from the runs' summaries
        served, failures = True, failed_count_note(comparison)
    # nothing served: the failure note is the whole story (a note on timing would be about no run)
    if not served:
        return [failures]
    return named_as_tables([line for line in (
        failures, unmeasured_note(spec.profile, fitted_seed, result.draws, command),
        frontend_note(spec.profile, peak, busiest) if table else "", run_note(spec.profile, records, peak) if table else "",
        kv_turnover_note(comparison, spec.profile.engine.block_size, rounds_trace, spec.record_series),
        clamped_output_note(comparison, spec.profile.engine.max_model_len, rounds_trace) if table else "",
        speed_note(spec.profile, spec.num_workers),
        model_note(trace, spec.profile), flat_goodput_note(comparison, slo.ttft_s, slo.tpot_s),
        same_routing_note(records) if table else "",
        *policy_notes(trace, policies)) if line], comparison.policies)


def _print_results(result: _RunResult, header: str, rounds: int, seed: int, slo: ServiceClass, staged,
                   notes: list[str], interval_note: str, json_out: bool) -> None:
    """Print the comparison: with ``json_out`` one JSON document (scenario, rounds, seed, SLO, the
    missing runs of an interrupted run, the results, the per-stage table, the notes); else the
    table, the per-stage table, ``interval_note`` and the notes."""
    comparison, uncertain = result.comparison, result.uncertain
    if json_out:
        doc = {"scenario": header, "rounds": rounds, "seed": seed,
               "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
               **({"incomplete": {"missing_runs": result.interrupted.missing}} if result.interrupted is not None
                  else {}),
               **(uncertain.to_dict() if result.draws else comparison.to_dict())}
        if staged is not None:  # a trace with load stages: the per-stage table too
            doc.update(stage_doc(staged))
        doc["notes"] = notes
        click.echo(json.dumps(doc, indent=2))
        return
    if result.draws:
        from kvroute.sim.study.experiment import format_uncertain_table

        click.echo(format_uncertain_table(uncertain))
    else:
        from kvroute.sim.study.experiment import format_table

        click.echo(format_table(comparison))
    if staged is not None:
        click.echo(stage_text(staged))
    click.echo(f"\n{interval_note}")
    for line in notes:
        click.echo(line)


def _write_output_set(out: Path, result: _RunResult, header: str, staged, notes: list[str], interval_note: str,
                      scenario, spec, trace_for, rounds: int, slo: ServiceClass, json_out: bool, records_format: str,
                      time_series: bool, figure_formats) -> None:
    """Write the output set under ``--out``: records, summary, ``compare.json``, figures, time
    series, per-stage files, ``vllm bench serve``-style results, ``scenario.yaml``, under
    ``--uncertainty`` ``uncertainty.csv`` (and its ``compare.json``), and ``report.html`` last.

    :data:`INCOMPLETE_MARKER` is written first and removed after the last file; an interrupted run's
    names the runs not finished."""
    comparison, uncertain, interrupted = result.comparison, result.uncertain, result.interrupted
    # INCOMPLETE marks the set until its last file is written; an interrupted run's names the runs not finished
    marker = out / INCOMPLETE_MARKER
    write_text_atomic(marker, _incomplete_text(None))
    doc, figures = _write_outputs(comparison, out, header, json_out, records_format,
                                  incomplete=None if interrupted is None else {"missing_runs": interrupted.missing},
                                  figure_formats=figure_formats)
    if time_series:
        figures += _write_series(comparison, out, header, json_out, figure_formats)
    _write_bench_results(comparison, out, spec, slo, scenario.request_rate, scenario.arrival)
    tables = []
    if staged is not None:
        table, figure = _write_stage_files(staged, out, header, comparison.policies, json_out, figure_formats)
        tables.append(table)
        figures.append(figure)
    _write_provenance(out, scenario.trace_file, trace_for, spec, scenario.seed, rounds)
    if result.draws:
        uncertain.summaries.to_csv(out / "uncertainty.csv", index=False)
        doc = {"scenario": header, **uncertain.to_dict()}
        (out / "compare.json").write_text(json.dumps(doc, indent=2))
    _write_report(out, doc, header, comparison.policies, figures, notes, rounds, scenario.seed, interval_note, tables)
    if not json_out:
        from kvroute.sim.study.bench_result import result_filenames

        more = ["scenario.yaml", *result_filenames(comparison.policies).values(), "report.html"]
        if result.draws:
            more.append("uncertainty.csv")
        click.echo(f"wrote {', '.join(str(out / name) for name in more)}")
    if interrupted is None:
        marker.unlink()
    else:
        write_text_atomic(marker, _incomplete_text(interrupted.missing))
        click.echo(f"the set in {out} is incomplete: {marker.name} names the {len(interrupted.missing)} runs "
                   "not finished", err=True)


def _write_stage_files(staged, out: Path, header: str, policies, quiet: bool, figure_formats) -> tuple:
    """The per-stage files of a trace with load stages under ``out`` (``write_stages``); returns the
    per-stage table and ``(caption, Figure)`` for the report."""
    from kvroute.sim.study.figure_style import policy_colors, scenario_title
    from kvroute.sim.study.report_tables import frame_table

    names, stage_fig = write_stages(
        staged, out, scenario_title(header, policies, "Per stage: TTFT, output throughput and ITL"),
        figure_formats, policy_colors(policies))
    if not quiet:
        click.echo(f"wrote {', '.join(str(out / name) for name in names)}")
    return (frame_table(staged[1], "Per stage (inference-perf's counting), means over rounds", "stages"),
            ("Per stage: TTFT, output throughput and ITL, one line per policy", stage_fig))


INCOMPLETE_MARKER = "INCOMPLETE"
"""A file in ``--out`` while the set there is not whole: written before the first output file, removed
after the last; it stays when the command was stopped while writing, or names the runs not finished
when it was stopped before them (the files then hold the finished runs only)."""


def _incomplete_text(missing: list[str] | None) -> str:
    if missing is None:
        return ("This output set is incomplete: the command was stopped while writing it, so files may be missing "
                "or left from an earlier run in this directory.\n")
    return (f"This output set is incomplete: the command was interrupted (Ctrl-C or SIGTERM) before {len(missing)} "
            "run(s) finished; the files hold the finished runs only (compare.json: incomplete.missing_runs).\n"
            "Runs not finished:\n" + "".join(f"  {name}\n" for name in missing))


def _write_outputs(comparison, out: Path, header: str, quiet: bool, records_format: str,
                   incomplete: dict | None = None, figure_formats=("png",)) -> tuple[dict, list]:
    """Records, ``summary.csv``, ``compare.json`` and the TTFT figure (``ttft.<format>``) under ``out``.

    Returns:
        ``compare.json``'s dict and ``[(caption, Figure)]`` for the report.
    """
    from kvroute.sim.study.figure_style import policy_colors, save_figure, scenario_title
    from kvroute.sim.study.plots import ttft_figure

    out.mkdir(parents=True, exist_ok=True)
    records = comparison.records()
    records_file = out / f"records.{records_format}"
    with atomic_output(records_file) as tmp:
        if records_format == "csv":
            records.to_csv(tmp, index=False)
        else:
            records.to_parquet(tmp, index=False)
    with atomic_output(out / "summary.csv") as tmp:  # counts written whole: 16, not 16.0
        summaries = comparison.summaries
        counts = [c for c in COUNT_METRICS if c in summaries and summaries[c].notna().all()]
        summaries.astype(dict.fromkeys(counts, "int64")).to_csv(tmp, index=False)
    doc = {"scenario": header, **comparison.to_dict(), **({"incomplete": incomplete} if incomplete else {})}
    write_text_atomic(out / "compare.json", json.dumps(doc, indent=2))
    fig = ttft_figure(records, scenario_title(header, comparison.policies, "TTFT per policy, all rounds"),
                      policy_colors(comparison.policies))
    written = save_figure(fig, out / "ttft", figure_formats)
    if not quiet:
        names = [str(out / name) for name in (records_file.name, "summary.csv", "compare.json")]
        click.echo(f"wrote {', '.join(names + [str(path) for path in written])}")
    return doc, [("TTFT per policy (all rounds pooled): distribution, and mean and p90 by turn", fig)]


def _write_series(comparison, out: Path, header: str, quiet: bool, figure_formats=("png",)) -> list:
    """``timeseries.parquet`` and ``tokens.parquet`` (every policy and round) and one
    ``timeseries-<policy>.<format>`` per policy (its round 0) under ``out``; returns
    ``[(caption, Figure)]`` for the report."""
    from kvroute.cli.plot_command import SERIES_RUN_ATTR, series_png_name
    from kvroute.sim.study.figure_style import save_figure, scenario_title
    from kvroute.sim.study.plots import series_figure

    series, tokens = comparison.series(), comparison.tokens()
    series.attrs[SERIES_RUN_ATTR] = header  # plot-series titles a redrawn plot with it
    with atomic_output(out / "timeseries.parquet") as tmp:
        series.to_parquet(tmp, index=False)
    with atomic_output(out / "tokens.parquet") as tmp:
        tokens.to_parquet(tmp, index=False)
    names = ["timeseries.parquet", "tokens.parquet"]
    figures = []
    for policy in comparison.policies:
        run = series[(series["policy"] == policy) & (series["round"] == 0)]
        if run.empty:  # every request failed before reaching an engine: no step to draw
            continue
        fig = series_figure(run, title=scenario_title(header, (), f"{policy}, round 0: every worker over time"))
        stem = series_png_name(policy).removesuffix(".png")
        names += [path.name for path in save_figure(fig, out / stem, figure_formats, dpi=110)]
        figures.append((f"{policy}, round 0: queues, KV blocks, batched tokens and hit rate per worker", fig))
    if not quiet:
        click.echo(f"wrote {', '.join(str(out / name) for name in names)}")
    return figures


def _write_report(out: Path, doc: dict, header: str, policies, figures: list, notes: list[str], rounds: int,
                  seed: int, spread_note: str, tables: list = ()) -> None:
    """``report.html`` under ``out``: the scenario, the table of ``doc`` (``compare.json``) and
    ``tables`` (the per-stage table), the figures, the notes and ``scenario.yaml``
    (``kvroute.sim.study.report``)."""
    from kvroute.sim.study.report import Report, write_report
    from kvroute.sim.study.report_tables import compare_table

    scenario_file = out / "scenario.yaml"
    files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name not in ("report.html", INCOMPLETE_MARKER))
    report = Report(
        title=f"kvroute {click.get_current_context().command.name}: {', '.join(policies)}",
        scenario=[*header.split(" | "), f"policies {', '.join(policies)}",
                  f"{rounds} round(s) per policy, seeds {seed}..{seed + rounds - 1}"],
        tables=[compare_table(doc, spread_note), *tables],
        figures=figures,
        notes=notes + ([f"incomplete: {len(doc['incomplete']['missing_runs'])} run(s) not finished"]
                       if doc.get("incomplete") else []),
        provenance=scenario_file.read_text() if scenario_file.exists() else "",
        files=files,
    )
    write_report(report, out / "report.html")


def _write_bench_results(comparison, out: Path, spec, slo: ServiceClass, request_rate, arrival: str) -> None:
    """One ``vllm bench serve``-style result JSON per policy (its round 0) beside the outputs."""
    from kvroute.sim.study.bench_result import result_filenames, vllm_bench_result
    from kvroute.traces.arrivals import parse_arrival

    process, cv = parse_arrival(arrival)
    burstiness = "inf" if process == "constant" else 1.0 / cv ** 2  # vLLM's burstiness: gamma shape 1/CV^2
    model = (spec.profile.raw.get("model") or {}).get("name", spec.profile.name)
    for policy, name in result_filenames(comparison.policies).items():
        doc = vllm_bench_result(comparison.runs[policy][0], slo, model, policy, request_rate, burstiness)
        write_text_atomic(out / name, json.dumps(doc))


def _warn_changed_inputs(trace_path, spec) -> None:
    """Before the runs of a ``--config`` scenario that recorded its inputs: a warning for each that
    differs now (the trace file, the profile, a policy's file or config; ``changed_inputs``)."""
    from kvroute.cli.config import PROVENANCE_META, changed_inputs
    from kvroute.cli.provenance import canonical_sha256, file_sha256

    ctx = click.get_current_context()
    if not isinstance(ctx.meta.get(PROVENANCE_META), dict):
        return
    trace_sha256 = file_sha256(trace_path) if trace_path is not None else None
    for change in changed_inputs(ctx, trace_sha256, canonical_sha256(spec.profile.raw)):
        click.echo(f"warning: {change} differs from the --config run's, so its numbers may differ", err=True)


def _write_provenance(out: Path, trace_path, trace_for, spec, seed: int, rounds: int) -> None:
    """``scenario.yaml`` beside the outputs: resolved options, seeds, version, profile and trace hashes."""
    from kvroute.cli.provenance import canonical_sha256, records_sha256, trace_file_record, write_scenario

    seeds = list(range(seed, seed + rounds))
    if trace_path is not None:
        trace_hash = trace_file_record(trace_path)
    else:  # generated: each round's own draw, by seed
        trace_hash = {"generated_records_sha256": {s: records_sha256(trace_for(s)) for s in seeds}}
    ctx = click.get_current_context()
    profile_hash = canonical_sha256(spec.profile.raw)
    write_scenario(out, ctx, {
        "seeds": seeds, "rounds": rounds,
        "profile": {"name": spec.profile.name, "sha256": profile_hash},
        "trace": trace_hash,
    })


def _figure_formats(ctx, param, value):
    from kvroute.sim.study.figure_style import parse_figure_formats

    try:
        return parse_figure_formats(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


figure_format_option = click.option(
    "--figure-format", "figure_formats", default="png", show_default=True, callback=_figure_formats,
    help="Figure files to write with --out, comma list of png, pdf, svg (vector for papers); report.html "
         "inlines PNG.")
"""``--figure-format png,pdf,svg``: checked at parse time (one line naming the flag and the valid formats)."""


def output_options(func):
    """Decorate a command with --json, --out and --records-format."""
    for option in reversed([
        click.option("--json", "json_out", is_flag=True, help="Print JSON instead of the table."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Write records.parquet, summary.csv, compare.json, ttft.png, scenario.yaml (the run's "
                          "scenario, for --config), a vllm bench serve-style vllm-bench-<policy>.json per policy "
                          "(round 0) and report.html (one self-contained page: scenario, table, figures, notes, "
                          "provenance) here."),
        click.option("--records-format", type=Choice(["parquet", "csv"]), default="parquet",
                     show_default=True, help="Format of the per-request records written with --out."),
        click.option("--quiet", is_flag=True, help="No progress bars (they show on a terminal only)."),
        figure_format_option,
        click.option("--time-series", is_flag=True,
                     help="Also sample every worker on each engine step (vllm:num_requests_running, ...) and keep "
                          "each token's time; writes timeseries.parquet, tokens.parquet and timeseries-<policy>.png "
                          "(round 0) under --out. An output option, not a scenario value: --config does not set it; "
                          "the saved scenario.yaml's header names it for a re-run."),
    ]):
        func = option(func)
    return func


@click.command()
@config_option
@scenario_options
@policies_option
@click.option("--rounds", type=Number(RUNS), default=3, show_default=True, help="Seeded rounds per policy.")
@click.option("--uncertainty", type=Number(DRAWS), default=0, show_default=True,
              help="Also run N profiles drawn from the profile's coefficient uncertainty (bootstrap refits of a "
                   "measured profile, --prior-range for a derived prior), N x rounds runs per policy, and report "
                   "intervals that include it next to the seed-only ones.")
@click.option("--prior-range", type=Number(PRIOR_RANGE), default=0.2, show_default=True,
              help="Relative half-width of a derived prior's step costs and API-server time for --uncertainty.")
@executor_options
@output_options
@check_values
@with_errors
@stops_on_sigterm
def compare(policies_text, rounds, uncertainty, prior_range, executor, address, max_workers, json_out, out,
            records_format, quiet, time_series, slo_ttft, slo_tpot, figure_formats=("png",), **options):
    """Compare routing policies on the same trace and cluster (default: the seed study's burst)."""
    executor = resolve_executor(executor, address, "--uncertainty" if uncertainty else None)
    policies = parse_policies(policies_text)
    check_runs(len(policies) * rounds * (uncertainty + 1),
               f"{len(policies)} policies x --rounds {rounds} x (--uncertainty {uncertainty} + 1)")
    with paused_collector():
        _run(policies, rounds, json_out, out, records_format, scenario_from_options(options),
             slo_ttft, slo_tpot, uncertainty=uncertainty, prior_range=prior_range, quiet=quiet, time_series=time_series,
             executor=(executor, address, max_workers), figure_formats=figure_formats)


@click.command()
@config_option
@scenario_options
@click.option("--policy", default=DEFAULT_POLICIES[0], show_default=True,
              help="Routing policy, optionally with parameters (sglang:cache_threshold=0.5).")
@click.option("--rounds", type=Number(RUNS), default=1, show_default=True, help="Seeded rounds.")
@output_options
@check_values
@with_errors
@stops_on_sigterm
def simulate(policy, rounds, json_out, out, records_format, quiet, time_series, slo_ttft, slo_tpot,
             figure_formats=("png",), **options):
    """Simulate one routing policy and print its summary."""
    with paused_collector():
        _run(parse_policies(policy, "--policy"), rounds, json_out, out, records_format, scenario_from_options(options),
             slo_ttft, slo_tpot, quiet=quiet, time_series=time_series, figure_formats=figure_formats,
             command="simulate")


@click.command("policies")
def policies_command():
    """List the routing policies, one line each: name, parameters with defaults, summary."""
    from kvroute.sim.routing import POLICIES, load_user_policies, policy_params

    try:
        load_user_policies()
    except ValueError as exc:  # a user's file: missing, failing to import, or a name taken
        raise click.ClickException(str(exc)) from None
    for name, cls in POLICIES.items():
        params = ",".join(f"{k}={v}" for k, v in policy_params(cls).items())
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()) or "(no docstring)"
        click.echo(f"{name:<17} {summary}" + (f" [{params}]" if params else ""))
