"""``kvroute plot-series``: redraw the plot of a saved time series (``compare --time-series``)."""

from __future__ import annotations

from pathlib import Path

import click

from kvroute.cli.signals import stops_on_sigterm
from kvroute.cli.values import InputFile, Number
from kvroute.traces.inputs import MAX_RUNS, Num


SERIES_RUN_ATTR = "kvroute_run"
"""Key of the run's description (trace and request count) in ``timeseries.parquet``'s pandas
metadata (``DataFrame.attrs``), written by ``compare --time-series``."""


def series_png_name(policy: str, round_: int = 0) -> str:
    """The file name of a policy's series plot: ``timeseries-<policy>.png`` for round 0 (as
    ``compare --time-series`` writes it), ``timeseries-<policy>-round<r>.png`` otherwise; characters
    other than letters, digits and ``-_.`` in the policy spec become ``_``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in policy)
    return f"timeseries-{safe}.png" if round_ == 0 else f"timeseries-{safe}-round{round_}.png"


@click.command("plot-series")
@click.argument("series_file", type=InputFile())
@click.option("--policy", default=None, help="Policy whose run to draw [the file's first].")
@click.option("--round", "round_", type=Number(Num(integer=True, minimum=0, maximum=MAX_RUNS)), default=0, show_default=True, help="Round to draw.")
@click.option("--bins", type=Number(Num(integer=True, minimum=1, maximum=100_000)), default=200, show_default=True,
              help="Intervals on the time axis.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Figure to write, .png, .pdf or .svg [timeseries-<policy>.png beside SERIES_FILE, as compare "
                   "writes it for round 0].")
@stops_on_sigterm
def plot_series_command(series_file: Path, policy: str | None, round_: int, bins: int, out: Path | None) -> None:
    """Redraw one run's time-series plot from a timeseries.parquet (compare --time-series).

    Errors (one line each): SERIES_FILE is not a readable parquet file, lacks the time-series
    columns, or has no such policy or round (the valid ones are listed); --out does not end in .png,
    .pdf or .svg.
    """
    import pandas as pd

    from kvroute.traces.outputs import atomic_output
    from kvroute.sim.study.plots import plot_series
    from kvroute.sim.cluster.timeseries import SERIES_COLUMNS

    from kvroute.sim.study.figure_style import FIGURE_FORMATS, scenario_title

    if out is not None and out.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise click.BadParameter(f"{out} must end in {', '.join('.' + f for f in FIGURE_FORMATS)}",
                                 param_hint="'--out'")
    try:
        series = pd.read_parquet(series_file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not parquet
        raise click.BadParameter(f"cannot read {series_file} as parquet: {' '.join(str(exc).split())[:200]}",
                                 param_hint="'SERIES_FILE'") from None
    missing = [c for c in SERIES_COLUMNS if c not in series.columns]
    if missing:
        raise click.BadParameter(f"{series_file} is not a time series (no column {missing[0]!r}); "
                                 "compare --time-series --out DIR writes DIR/timeseries.parquet",
                                 param_hint="'SERIES_FILE'")
    policies = list(dict.fromkeys(series["policy"])) if "policy" in series else []
    if policy is None and policies:
        policy = policies[0]
    if policy is not None:
        if policy not in policies:
            raise click.BadParameter(f"no policy {policy!r} in {series_file}; valid: {', '.join(policies) or 'none'}",
                                     param_hint="'--policy'")
        series = series[series["policy"] == policy]
    if "round" in series:
        rounds = sorted(set(series["round"]))
        if round_ not in rounds:
            raise click.BadParameter(f"no round {round_} in {series_file}; valid: {', '.join(map(str, rounds))}",
                                     param_hint="'--round'")
        series = series[series["round"] == round_]
    if series.empty:
        raise click.ClickException(f"{series_file} has no time series rows to draw")
    out = out or series_file.with_name(series_png_name(policy or "run", round_))
    run = series.attrs.get(SERIES_RUN_ATTR) or str(series_file)  # the header compare wrote, else the file
    with atomic_output(out) as tmp:
        plot_series(series, tmp, bins=bins,
                    title=scenario_title(run, (), f"{policy or 'run'}, round {round_}: every worker over time"))
    click.echo(f"wrote {out}")
