"""``kvroute sensitivity``: Morris screening of a scenario's uncertain inputs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from kvroute.cli.scenario import (parse_policies, policies_option, scenario_from_options, scenario_options,
                                 scenario_trace, with_errors)
from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.sim_commands import figure_format_option
from kvroute.cli.values import OPEN_FRACTION, PROCESSES, Choice, Number, check_runs
from kvroute.traces.inputs import MAX_RUNS, RUNS, SECONDS, SEED, InputError, Num
from kvroute.traces.outputs import atomic_output, check_output, write_text_atomic


JITTER_CV = Num(minimum=0.0, maximum=10.0)
"""Bounds of ``--jitter-cv-range``: a profile's ``overheads.jitter_cv`` rule."""


def _pair(text: str, hint: str, rule: Num) -> tuple[float, float]:
    """``LOW:HIGH`` with each end checked by ``rule`` and LOW < HIGH (errors name ``hint``)."""
    try:
        lo, hi = (float(x) for x in text.split(":"))
        for value in (lo, hi):
            rule.check(value)
    except ValueError as exc:
        reason = exc.reason if isinstance(exc, InputError) else f"must be LOW:HIGH, got {text!r}"
        raise click.BadParameter(reason, param_hint=f"'{hint}'") from None
    if not lo < hi:
        raise click.BadParameter(f"LOW must be below HIGH, got {text!r}", param_hint=f"'{hint}'")
    return lo, hi


def _even(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value % 2:
        raise click.BadParameter(f"must be even, got {value}", ctx=ctx, param=param)
    return value


@click.command("sensitivity")
@scenario_options
@policies_option
@click.option("--trajectories", type=Number(Num(integer=True, minimum=2, maximum=MAX_RUNS)), default=12,
              show_default=True,
              help="Morris trajectories; the design has trajectories x (factors + 1) points.")
@click.option("--levels", type=Number(Num(integer=True, minimum=2, maximum=1000)), default=4, show_default=True,
              callback=_even, help="Morris grid levels (even).")
@click.option("--rounds", type=Number(RUNS), default=2, show_default=True,
              help="Seeds per point (the same seeds at every point: common random numbers).")
@click.option("--noise-rounds", type=Number(RUNS), default=5, show_default=True,
              help="Seeds of the unperturbed scenario (its value and seed-to-seed sd in the table).")
@click.option("--design-seed", type=Number(SEED), default=0, show_default=True,
              help="Seeds the Morris design and the bootstrap of mu* intervals.")
@click.option("--prior-range", type=Number(OPEN_FRACTION), default=0.2, show_default=True,
              help="Relative half-width of a coefficient or overhead mean without fitted uncertainty (derived priors).")
@click.option("--coverage", type=Number(OPEN_FRACTION), default=0.95, show_default=True,
              help="Central share of a measured coefficient's bootstrap samples taken as its range.")
@click.option("--jitter-cv-range", default="0:0.6", show_default=True,
              help="LOW:HIGH of the overhead jitter CV when the profile has no fitted one.")
@click.option("--kv-range", type=Number(OPEN_FRACTION), default=0.1, show_default=True, help="Relative half-width of the KV capacity.")
@click.option("--spread-range", default=None,
              help="LOW:HIGH of the start spread of root requests, s [default: 0:0.02 for a burst (--arrival-spread "
                   "up to 0.02 s), else the scenario's spread +- --prior-range of it].")
@click.option("--groups", default=None,
              help="Comma-separated factor groups to vary (default: all; see kvroute.sim.study.sensitivity.FACTOR_GROUPS).")
@click.option("--executor", type=Choice(["local", "sequential"]), default="local", show_default=True,
              help="local: a process pool; sequential: this process.")
@click.option("--max-workers", type=Number(PROCESSES), default=None, help="Processes of the local pool [CPU count].")
@click.option("--json", "json_out", is_flag=True, help="Print JSON instead of the tables.")
@click.option("--quiet", is_flag=True, help="No progress bar (it shows on a terminal only).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write sensitivity.json, indices.csv, samples.csv, tornado.png and report.html "
                   "(one self-contained page: scenario, tables, tornado, notes) here.")
@figure_format_option
@with_errors
@stops_on_sigterm
def sensitivity(policies_text, trajectories, levels, rounds, noise_rounds, design_seed, prior_range, coverage,
                jitter_cv_range, kv_range, spread_range, groups, executor, max_workers, json_out, quiet, out,
                slo_ttft, slo_tpot, figure_formats=("png",), **options):
    """Rank the scenario's uncertain inputs by how much each moves the headline metrics.

    Morris's elementary effects (SALib) over the step-cost coefficients (their bootstrap range
    for measured profiles, ±--prior-range for derived priors), the overhead means and jitter CV,
    the KV capacity and the start spread. The table gives mu*: the mean absolute change of a
    metric when the factor crosses its range (signed + / - for a monotone effect, ~ otherwise).
    """
    from kvroute.sim.cluster.metrics import ServiceClass
    from kvroute.sim.study.sensitivity import (FACTOR_GROUPS, NOISE_MARK, NOISE_RULE, Ranges, base_profile,
                                               check_groups, default_factors, run_sensitivity)

    policies = parse_policies(policies_text)
    scenario = scenario_from_options(options, policy=policies[0])
    if spread_range is None:  # around the scenario's own spread, not a burst's, when it has one
        spread = scenario.arrival_spread_s
        spread_range = "0:0.02" if spread <= 0.02 else f"{spread * (1 - prior_range):g}:{spread * (1 + prior_range):g}"
    try:
        ranges = Ranges(prior_range, coverage, _pair(jitter_cv_range, "--jitter-cv-range", JITTER_CV), kv_range,
                        _pair(spread_range, "--spread-range", SECONDS))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    # a trace file is read once, the same records at every point (a generated workload is drawn
    # anew whenever a factor changes the scenario)
    trace = scenario_trace(scenario) if scenario.trace_file is not None else None
    try:
        profile = base_profile(scenario)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--profile'") from exc
    names = [g.strip() for g in groups.split(",") if g.strip()] if groups is not None else None
    try:
        if names == []:
            raise ValueError(f"names no factor group ({groups!r}); valid groups: {', '.join(FACTOR_GROUPS)}")
        check_groups(names or [])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--groups'") from None
    # by default the workload group gives no factor where the lengths are given (workload_factors)
    given = ("a --trace file's" if trace is not None else
             "a --workload-config's" if scenario.workload_config is not None else None)
    if given and names is not None and "workload" in names:
        raise click.BadParameter(f"the workload group varies the generated workload's lengths; {given} "
                                 "are given (leave it out)", param_hint="'--groups'")
    factors = default_factors(scenario, profile, ranges, names)
    if names is not None and len(factors) < 2:
        raise click.BadParameter(f"{', '.join(names)}: {len(factors)} factor(s) to vary here; Morris screening needs at "
                                 "least two (add a group)", param_hint="'--groups'")
    runs = (trajectories * (len(factors) + 1) * rounds + noise_rounds) * len(policies)
    check_runs(runs, f"(--trajectories {trajectories} x {len(factors) + 1} points x --rounds {rounds} + --noise-rounds "
                     f"{noise_rounds}) x {len(policies)} policies")
    if out is not None:  # before the work: the samples (~200 bytes a run), the tables, a figure and a page
        check_output(out, 200 * runs + (4 << 20), is_dir=True)
    start = time.perf_counter()
    result = run_sensitivity(scenario, policies, factors, ranges, trajectories, levels, rounds, design_seed,
                             noise_rounds, profile, trace, None, executor, max_workers,
                             progress=not (json_out or quiet), slo=ServiceClass(slo_ttft, slo_tpot))
    wall = time.perf_counter() - start
    result.settings["wall_s"] = round(wall, 2)
    chats, turns = scenario.sizes
    source = trace.source if trace is not None else f"{scenario.workload}: {chats} chats x {turns} turns"
    header = f"{source} | {scenario.workers} workers | profile {profile.name}"
    note = (f"mu*: mean |change| of the metric when the factor crosses its range (Morris, SALib); "
            f"+/- the sign of a monotone effect, ~ mixed signs; {NOISE_MARK} {NOISE_RULE}. Seed sd: {noise_rounds} "
            "seeds of the unperturbed scenario"
            + (" (one seed: no sd, so no effect is marked)." if noise_rounds == 1 else "."))
    if json_out:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(f"{header} | {len(factors)} factors, "
                   f"{trajectories} trajectories x ({len(factors)} factors + 1) = {result.settings['points']} points "
                   f"on {levels} levels, "
                   f"{rounds} round(s) each, and the base point on {noise_rounds} seeds, "
                   f"for each of {len(policies)} policies ({runs} runs): {', '.join(policies)}\n")
        click.echo(result.format_table())
        click.echo(f"\n{note}\nwall time of the runs {wall:.1f} s (start-up, tables and figures aside)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "sensitivity.json", json.dumps(result.to_dict(), indent=2))
        for name, table in (("indices.csv", result.marked_indices()), ("samples.csv", result.samples)):
            with atomic_output(out / name) as tmp:
                table.to_csv(tmp, index=False)
        figure_names = _write_figure_and_report(result, out, header, note, figure_formats, scenario, profile)
        if not json_out:
            click.echo(f"wrote {out / 'sensitivity.json'}, indices.csv, samples.csv, {', '.join(figure_names)}, "
                       "report.html")


def _write_figure_and_report(result, out: Path, header: str, note: str, figure_formats, scenario,
                             profile) -> list[str]:
    """``tornado.<format>`` for each of ``figure_formats`` and ``report.html`` (scenario, the mu*
    tables, the tornado, the note, the files this run wrote, and as provenance the resolved
    options, the settings and the profile and trace hashes) under ``out``; returns the figure
    files' names."""
    from kvroute.cli.provenance import canonical_sha256, kvroute_version, resolved_options, trace_file_record
    from kvroute.sim.study.figure_style import save_figure
    from kvroute.sim.study.report import Report, write_report

    fig = result.figure(scenario=header)
    names = [path.name for path in save_figure(fig, out / "tornado", figure_formats, dpi=90)]
    settings = result.settings
    ctx = click.get_current_context()
    trace = {"trace": trace_file_record(scenario.trace_file)} if scenario.trace_file is not None else {}
    provenance = {"command": ctx.command_path, "version": kvroute_version(), "options": resolved_options(ctx),
                  "profile": {"name": profile.name, "sha256": canonical_sha256(profile.raw)}, **trace,
                  "settings": settings}
    files = ["sensitivity.json", "indices.csv", "samples.csv", *names]  # not a file an earlier run left
    report = Report(
        title=f"kvroute sensitivity: {', '.join(result.policies)}",
        scenario=[*header.split(" | "), f"policies {', '.join(result.policies)} (changes against {result.policies[0]})",
                  f"{len(result.factors)} factors, {settings['trajectories']} trajectories x ({len(result.factors)} "
                  f"factors + 1) = {settings['points']} points on {settings['levels']} levels, "
                  f"{settings['rounds']} round(s) each, "
                  f"{settings['noise_rounds']} seeds of the base point, design seed {settings['seed']}"],
        tables=result.report_tables(),
        figures=[("Tornado: mu* per factor and output, largest on top; dashed: the seed noise (sd); hatched: an "
                  "effect within it (? in the tables)", fig)],
        notes=[note],
        provenance=json.dumps(provenance, indent=2, default=str),
        files=files,
    )
    write_report(report, out / "report.html")
    return names
