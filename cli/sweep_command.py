"""``kvroute sweep``: a grid of scenarios on a local process pool or a Dask cluster."""

from __future__ import annotations

import math
import numbers
import sys
from pathlib import Path

import click
import numpy as np
from click.core import ParameterSource
import pandas as pd

from kvroute.cli.config import config_option
from kvroute.cli.profile_notes import frontend_note, unmeasured_note
from kvroute.cli.sim_commands import figure_format_option
from kvroute.cli.signals import INTERRUPTED_EXIT, exit_if_held, stops_on_sigterm
from kvroute.cli.sweep_notes import sweep_notes
from kvroute.sim.study.figure_style import FIGURE_FORMATS
from kvroute.cli.scenario import (SCENARIO_FIELDS, click_error, executor_options, parse_policies, policies_option,
                                 resolve_executor, scenario_options, scenario_trace, with_errors)
from kvroute.cli.values import Number, check_runs
from kvroute.traces.inputs import RUNS
from kvroute.traces.outputs import atomic_output, check_output
from kvroute.sim.cluster.metrics import SUMMARY_METRICS, ServiceClass
from kvroute.sim.timing.profile import load_profile
from kvroute.sim.study.executors import interrupts_deferred
from kvroute.sim.study.experiment import format_interval, tabulate_rows, whole_counts
from kvroute.sim.study.sweep import (COUNT_COLUMNS, COUNTER_COLUMNS, Scenario, ScenarioError, SweepInterrupted, grid,
                                    intervals, lead_ttft, sweep)

DEFAULT_SHOW = "time_to_complete_s,later_ttft_mean_s,later_ttft_p90_s,hit_rate"
"""``--show``'s default; on rows without later turns its later-turn TTFTs become all-turn ones
(:func:`default_shown`)."""


def default_shown(frame: pd.DataFrame) -> list[str]:
    """The metrics ``sweep`` prints without ``--show``: time to complete, TTFT mean and p90 and hit
    rate, the TTFTs chosen by ``sweep.lead_ttft`` (turns >= 2 when the rows have later turns, all
    turns otherwise), the rule the load figure follows."""
    return ["time_to_complete_s", lead_ttft(frame, "mean"), lead_ttft(frame, "p90"), "hit_rate"]


def _choices(text: str, valid: tuple[str, ...] | list[str], hint: str) -> list[str]:
    names = [item.strip() for item in text.split(",") if item.strip()]
    for name in names:
        if name not in valid:
            raise click.BadParameter(f"unknown name {name!r}; valid names: {', '.join(valid)}", param_hint=f"'{hint}'")
    if not names:
        raise click.BadParameter("give at least one value", param_hint=f"'{hint}'")
    return names


def _check_profiles(names: list[str]) -> None:
    for name in names:
        try:
            load_profile(name)
        except (FileNotFoundError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="'--profile'") from exc


def pivot_table(frame: pd.DataFrame, metric: str) -> str:
    """``metric``'s mean ± 95% half-width over rounds (``mean [low, high]`` where clipped to possible
    values; a count's whole mean without decimals, cell by cell: ``experiment.format_interval``, as
    compare's table): a row per scenario, a column per policy."""
    iv = intervals(frame, [metric])
    by = [c for c in iv.columns if c not in ("rounds", metric, f"{metric}_low", f"{metric}_high")]
    iv["cell"] = [format_interval(row[metric], row[f"{metric}_low"], row[f"{metric}_high"], int(row["rounds"]),
                                  whole_counts(metric, [row[metric]], COUNT_COLUMNS))
                  for _, row in iv.iterrows()]
    index = [c for c in by if c != "policy"]
    label = SUMMARY_METRICS.get(metric) or COUNTER_COLUMNS.get(metric, metric)
    if not index:  # one scenario: no row to label, its cells under a rule as compare's table
        header = list(iv["policy"]) if "policy" in by else [metric]
        return f"{label}\n{tabulate_rows([header, list(iv['cell'])], left=0)}"
    if "policy" in by:
        table = iv.pivot(index=index, columns="policy", values="cell")[list(dict.fromkeys(iv["policy"]))]
        table.columns.name = None
    else:
        table = iv.set_index(index)[["cell"]].rename(columns={"cell": metric})
    return f"{label}\n{table.to_string()}"


@click.command("sweep")
@config_option
@scenario_options(axes=True)
@policies_option
@click.option("--rounds", type=Number(RUNS), default=3, show_default=True, help="Seeded rounds per scenario.")
@executor_options
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every row to FILE.parquet or FILE.csv (the suffix is required), its scenario to FILE.scenario.yaml and a "
                   "self-contained page (scenario, tables, figures, notes, provenance) to FILE.report.html.")
@click.option("--time-series", is_flag=True,
              help="Not recorded by sweeps (an error): run `kvroute compare --time-series --out DIR` on a grid point.")
@click.option("--plot-load", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --request-rate, or a --chats list (sessions): write a figure of goodput, TTFT p50/p90 "
                   "(turns >= 2 when the workload has later turns, as the tables) and throughput against that load "
                   "per policy, means with the tables' 95% intervals (FILE.png, .pdf or .svg; --figure-format adds the other formats beside it).")
@figure_format_option
@click.option("--show", default=DEFAULT_SHOW, show_default=True,
              help="Metrics to print, comma list, of: "
                   f"{', '.join([*SUMMARY_METRICS, *COUNTER_COLUMNS])}. The default's TTFTs are of turns >= 2 "
                   "when the workload has later turns, of all turns when it has none (as --plot-load's).")
@click.option("--no-progress", "--quiet", "no_progress", is_flag=True, help="Hide the progress bar.")
@with_errors
@stops_on_sigterm
def sweep_command(policies_text, rounds, executor, address, max_workers, out, time_series, plot_load, show,
                  no_progress, slo_ttft, slo_tpot, figure_formats=("png",), **options):
    """Run a grid of scenarios (every combination of the comma lists) and print pivot tables.

    Takes every scenario option of `kvroute compare` (same names and defaults); each but --trace,
    --trace-block-size, --workload-config and the SLO bounds takes a comma list, one axis of the grid.

    Example: kvroute sweep --workload agent --workers 2,4,8 --policies round_robin,kv_aware
    --history 8000,16000 --reply-tokens 64,128 --chats 32 --rounds 3 --out sweep.parquet
    """
    if time_series:
        raise click.UsageError("sweep does not record time series; run kvroute compare --time-series --out DIR "
                               "with the grid point's options")
    # only a run that draws asks (plots imports matplotlib: half a second)
    load_error = _load_axis_error(options) if plot_load is not None or out is not None else ""
    if plot_load is not None and load_error:
        raise click.UsageError(load_error)
    if plot_load is not None and plot_load.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise click.BadParameter(f"{plot_load} must end in {', '.join('.' + f for f in FIGURE_FORMATS)}",
                                 param_hint="'--plot-load'")
    valid_metrics = [*SUMMARY_METRICS, *COUNTER_COLUMNS]
    shown = _choices(show, valid_metrics, "--show")
    if out is not None and out.suffix.lower() not in (".parquet", ".csv"):
        raise click.BadParameter(f"{out} must end in .parquet or .csv", param_hint="'--out'")
    if figure_formats != ("png",) and out is None and plot_load is None:
        raise click.UsageError("--figure-format sets the figures written with --out or --plot-load: give one")
    executor = resolve_executor(executor, address)
    _check_profiles(options["profile"])
    trace_path = options["trace_file"]
    if trace_path is not None:  # read once here: a bad file is one error, not a failed row per point
        scenario_trace(Scenario(trace_file=str(trace_path), trace_block_size=options["trace_block_size"]))
        options["trace_file"] = str(trace_path.resolve())
    fields = {name: value for name, value in options.items() if value is not None and name in SCENARIO_FIELDS}
    policies = parse_policies(policies_text)
    points = math.prod(len(v) for v in fields.values() if isinstance(v, list)) * len(policies)
    check_runs(points * rounds, f"the grid's {points:,} points (with --policies) x --rounds {rounds}")
    try:
        scenarios = grid(**fields, policy=policies)
    except ScenarioError as exc:
        raise click_error(exc) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if out is not None:  # before the work: about 1 KB per row
        check_output(out, 1024 * len(scenarios) * rounds)
    click.echo(f"{len(scenarios)} scenario(s) x {rounds} round(s) on executor {executor}", err=True)
    try:
        frame = sweep(scenarios, rounds=rounds, executor=executor, address=address, max_workers=max_workers,
                      progress=not no_progress, slo=ServiceClass(slo_ttft, slo_tpot))
    except SweepInterrupted as stop:
        click.echo(f"\ninterrupted ({stop.signal_name}): {len(stop.frame)} of {stop.total} runs finished",
                   err=True)
        if out is not None and len(stop.frame):
            with interrupts_deferred():  # the finished rows are written whole (a second stop ends at once)
                _write_rows(stop.frame, out)
                _write_provenance(out, scenarios, rounds, trace_path)  # how to run the rest
            click.echo(f"wrote {len(stop.frame)} finished rows to {out} (column partial = true) and its scenario "
                       f"to {out.with_name(out.stem + '.scenario.yaml')}", err=True)
        sys.exit(INTERRUPTED_EXIT)
    # every run is in: a stop now is held until the tables and files are out (a second one stops at once)
    with interrupts_deferred() as held:
        failed = frame[frame["status"] == "failed"] if "status" in frame else frame.iloc[:0]
        if len(failed) == len(frame):
            if out is not None:
                _write_rows(frame, out)
            raise click.ClickException(f"every run failed (infeasible): {failed['error'].iloc[0]}")
        if len(failed):
            click.echo(f"{len(failed)} of {len(frame)} runs failed (infeasible; shown as -, reason in column error): "
                       f"{failed['error'].iloc[0]}", err=True)
        if click.get_current_context().get_parameter_source("show") in (ParameterSource.DEFAULT,
                                                                         ParameterSource.DEFAULT_MAP):
            shown = default_shown(frame)
        empty = [m for m in shown if m in frame and frame[m].isna().all()]
        for metric in shown:
            if metric not in empty:
                click.echo(pivot_table(frame, metric) + "\n")
        if empty:
            click.echo(f"not shown, no run has a value: {', '.join(empty)}"
                       + (" (the trace has no later turns)" if any(m.startswith("later_") for m in empty) else ""))
        spread_note = (f"{rounds} round(s) per scenario; ± is the 95% interval over rounds ([low, high] where clipped to "
                       "possible values); "
                       f"goodput at TTFT <= {slo_ttft} s and TPOT <= {slo_tpot} s.")
        click.echo(spread_note)
        notes = sweep_notes(frame) + _profile_notes(scenarios)
        for note in notes:
            click.echo(note)
        figures = []
        if not load_error and (plot_load is not None or out is not None):
            figures.append(_load_figure(frame, scenarios, rounds, plot_load, figure_formats))
        if out is not None:
            _write_rows(frame, out)
            _write_provenance(out, scenarios, rounds, trace_path)
            notes = ([f"{len(failed)} of {len(frame)} runs failed (infeasible; shown as -): {failed['error'].iloc[0]}"]
                     if len(failed) else []) + notes
            _write_report(out, frame, scenarios, rounds, [m for m in shown if m not in empty], spread_note, figures, notes)
            click.echo(f"wrote {len(frame)} rows to {out}, its scenario to {out.with_name(out.stem + '.scenario.yaml')} "
                       f"and its report to {out.with_name(out.stem + '.report.html')}", err=True)
    exit_if_held(held, out)


def _load_axis_error(options: dict) -> str:
    """Why ``--plot-load`` has no load to draw against (``plots.load_axis``'s reason: no
    ``--request-rate`` and no ``--chats`` list, or both lists), or "" when it has one."""
    from kvroute.sim.study.plots import load_axis

    axes = {name: options.get(name) or [] for name in ("request_rate", "chats")}
    try:
        load_axis(pd.DataFrame({name: pd.Series(values, dtype=float) for name, values in axes.items()}))
    except ValueError as exc:
        return f"--plot-load: {exc}"
    return ""


def _profile_notes(scenarios: list[Scenario]) -> list[str]:
    """The notes ``compare`` prints about a profile (a derived prior; no front-end terms), once per
    profile of the grid."""
    notes = []
    for name in dict.fromkeys(s.profile for s in scenarios):
        profile = load_profile(name)
        notes += [n for n in (unmeasured_note(profile, command="sweep"), frontend_note(profile, None)) if n]
    return notes


def _load_figure(frame: pd.DataFrame, scenarios: list[Scenario], rounds: int, plot_load: Path | None,
                 figure_formats) -> tuple[str, object]:
    """The load curve (``plots.load_figure``), written to ``plot_load`` (and beside it in the other
    ``figure_formats``) when given; returns ``(caption, Figure)`` for the report."""
    from kvroute.sim.study.figure_style import policy_colors, save_figure, scenario_title
    from kvroute.sim.study.plots import load_axis, load_figure, slo_text
    from kvroute.sim.study.report_tables import grid_lines

    policies = list(dict.fromkeys(s.policy for s in scenarios))
    axis = load_axis(frame)
    lines = [line for line in grid_lines(frame) if not line.startswith(("policy:", f"{axis}:"))]
    spread = "mean and 95% interval over rounds, as the tables" if rounds > 1 else "one round each"
    title = scenario_title(" | ".join(lines), policies,
                           f"Load curves: {len(scenarios)} scenario(s) x {rounds} round(s), {spread}")
    fig = load_figure(frame, title, policy_colors(policies))
    if plot_load is not None:
        plot_load.parent.mkdir(parents=True, exist_ok=True)
        suffix = plot_load.suffix.lower().lstrip(".")
        paths = save_figure(fig, plot_load.with_suffix(""), [suffix, *(f for f in figure_formats if f != suffix)],
                            dpi=110)
        click.echo(f"wrote {', '.join(map(str, paths))}", err=True)
    ttft = ("turns >= 2" if lead_ttft(frame, "p50").startswith("later_") else "all turns")
    caption = (f"Goodput ({slo_text(frame)}), TTFT p50 and p90 ({ttft}, as the tables) and output throughput "
               f"against {'offered load' if axis == 'request_rate' else 'the number of sessions'}"
               + (" (error bars: 95% interval over rounds, as the tables)" if rounds > 1 else ""))
    return caption, fig


def _write_report(out: Path, frame: pd.DataFrame, scenarios: list[Scenario], rounds: int, metrics: list[str],
                  spread_note: str, figures: list, notes: list[str]) -> None:
    """``<out stem>.report.html`` beside the rows: the grid, one table per shown metric (the numbers
    of the rows in ``out``), the load figure, the notes and the scenario file."""
    from kvroute.sim.study.report import Report, write_report
    from kvroute.sim.study.report_tables import grid_lines, sweep_table

    scenario_file = out.parent / f"{out.stem}.scenario.yaml"
    tables = [sweep_table(frame, m, SUMMARY_METRICS.get(m) or COUNTER_COLUMNS.get(m, m)) for m in metrics]
    if tables:
        tables[-1].note = spread_note
    report = Report(title=f"kvroute sweep: {len(scenarios)} scenario(s) x {rounds} round(s)",
                    scenario=grid_lines(frame), tables=tables, figures=figures, notes=notes,
                    provenance=scenario_file.read_text() if scenario_file.exists() else "",
                    files=[out.name, scenario_file.name])
    write_report(report, out.parent / f"{out.stem}.report.html")


def _write_provenance(out: Path, scenarios: list[Scenario], rounds: int, trace_path: Path | None) -> None:
    """``<out stem>.scenario.yaml`` beside the rows: resolved options, seeds, version, profile hashes
    and the trace file's hash (as ``compare`` records it).

    Without a trace file every grid point generates its own workload per seed, so no single trace
    hash applies; the rows' ``seed`` and options name each one, and ``kvroute trace generate``
    writes it out.
    """
    from kvroute.cli.provenance import canonical_sha256, trace_file_record, write_scenario

    profiles = {name: canonical_sha256(load_profile(name).raw) for name in dict.fromkeys(s.profile for s in scenarios)}
    seeds = sorted({s.seed + r for s in scenarios for r in range(rounds)})
    trace = (trace_file_record(trace_path) if trace_path is not None
             else "generated per grid point and seed (no trace file)")
    write_scenario(out.parent, click.get_current_context(), {
        "seeds": seeds, "rounds": rounds, "profile_sha256": profiles, "trace": trace,
    }, name=f"{out.stem}.scenario.yaml")


def _plain(value) -> bool:
    """A value a Parquet column of numbers takes as it is: None, a bool or a real number (numpy's too)."""
    return value is None or isinstance(value, (numbers.Real, np.bool_))


def _write_rows(frame: pd.DataFrame, out: Path) -> None:
    """Write sweep rows to ``out`` (.parquet or .csv) atomically."""
    table = frame.copy()
    for column in table.columns[table.dtypes == object]:
        # numbers mixed with ranges or distributions ("16000-32000", a tuple), a file's path: as text
        if not table[column].map(_plain).all():
            table[column] = table[column].map(lambda v: None if v is None else str(v))
    with atomic_output(out) as tmp:
        if out.suffix.lower() == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
