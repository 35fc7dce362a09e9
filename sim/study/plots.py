"""Figures: TTFT distributions and TTFT by turn per policy, load curves and one run's time series
(matplotlib, no pyplot state), in the style of ``kvroute.sim.study.figure_style``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.sim.study.figure_style import (figure_title, interval_errors, log_axis_if_spread, plain_log_axis,
                                              policy_colors, series_style, short_names, split_variant,
                                              spans_decades, spread_along)


def ttft_figure(records: pd.DataFrame, title: str = "", colors: dict[str, str] | None = None) -> Figure:
    """Two panels: TTFT CDF per policy, and mean and p90 TTFT by turn per policy (by prompt-length
    decile for traces without turns).

    Args:
        records: per-request records with ``policy``, ``turn``, ``ttft`` (s) and ``status``
            columns (``Comparison.records()``); all rounds are pooled. A policy named
            ``"<policy> predicted"`` or ``"<policy> measured"`` takes ``<policy>``'s colour and the
            variant's line style (``figure_style.VARIANT_STYLES``).
        title: figure title (``figure_style.scenario_title``: it names the scenario).
        colors: ``{policy: colour}`` shared by every figure of the run (default:
            ``figure_style.policy_colors`` over the records' policies).

    Returns:
        A bare matplotlib Figure (no pyplot state). The CDF's time axis, and the by-turn panel's
        TTFT axis, are logarithmic when their TTFTs span a decade or more. A simulated policy that
        routed every request as an earlier one did (``metrics.routed_alike``, when the records
        carry ``round``, ``request_id`` and ``worker``) is named so in the legend: its lines lie
        on the earlier policy's.
    """
    ok = records[records["status"] == "ok"]
    # NOTE: a bare Figure (no pyplot) draws with whatever backend is active and leaves a
    # notebook's inline backend alone.
    fig = Figure(figsize=(11, 4.6))
    ax_cdf, ax_turn = fig.subplots(1, 2)
    has_turns = ok["turn"].notna().any()
    colors = colors or policy_colors(ok["policy"].drop_duplicates())
    names = legend_names(records)
    # Later policies are drawn thinner, so a policy whose results equal an earlier one's
    # (least_loaded and kv_aware often do in closed-loop bursts) stays visible.
    order = list(colors)
    turn_values: list[float] = []
    for policy, group in ok.groupby("policy", sort=False):
        base, _variant = split_variant(str(policy))
        lw = max(1.0, 3.2 - 0.8 * (order.index(base) if base in order else len(order)))
        style = series_style(str(policy), colors)
        ttft = np.sort(group["ttft"].to_numpy(float))
        ax_cdf.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), lw=lw, color=style["color"], ls=style["ls"],
                    label=names[str(policy)])
        if has_turns:
            by = group.groupby("turn")["ttft"]
        else:  # no turns: TTFT against prompt length, in ten equal-count bins
            bins = pd.qcut(group["prompt_tokens"], 10, duplicates="drop")
            by = group.groupby(bins, observed=True)["ttft"]
        mean, p90 = by.mean(), by.quantile(0.9)
        x = mean.index if has_turns else [interval.mid for interval in mean.index]
        turn_values += [*mean.values, *p90.values]
        ax_turn.plot(x, mean.values, lw=lw, ms=3 + 2 * lw, label=f"{names[str(policy)]} mean", **style)
        ax_turn.plot(x, p90.values, lw=max(0.8, lw - 1.2), ms=2 + lw, mfc="none", alpha=0.8, label=f"{names[str(policy)]} p90",
                     **style)
    if len(ok):
        plain_log_axis(ax_cdf, [ok["ttft"].min(), ok["ttft"].max()], "x")
    ax_cdf.set_xlabel("TTFT (s)")
    ax_cdf.set_ylabel("share of requests (cumulative, 0-1)")
    ax_cdf.set_ylim(0, 1.02)
    ax_cdf.set_title("TTFT distribution", fontsize=10)
    ax_cdf.grid(alpha=0.3)
    if ax_cdf.get_legend_handles_labels()[0]:
        ax_cdf.legend(fontsize=8)
    if has_turns:
        integer_ticks(ax_turn)
    ax_turn.set_xlabel("turn (1 = a session's first request)" if has_turns
                       else "prompt length (tokens, decile midpoints)")
    ax_turn.set_ylabel("TTFT (s): mean (filled), p90 (hollow)")
    if not plain_log_axis(ax_turn, turn_values):  # first turns of long prompts: 30 s against 0.3 s
        ax_turn.set_ylim(bottom=0)
    ax_turn.set_title("TTFT by turn" if has_turns else "TTFT by prompt length", fontsize=10)
    ax_turn.grid(alpha=0.3)
    if ax_turn.get_legend_handles_labels()[0]:
        ax_turn.legend(fontsize=7, ncol=2 if ok["policy"].nunique() > 3 else 1)
    if title:
        figure_title(fig, title)
    fig.tight_layout()
    return fig


def legend_names(records: pd.DataFrame) -> dict[str, str]:
    """``{policy: legend name}``: :func:`figure_style.short_names`, and for a simulated policy that
    routed alike with an earlier one (``metrics.routed_alike``; measured and predicted variants are
    not simulations of one another and are left out) ``"<name> (routed as <first>)"``."""
    from kvroute.sim.cluster.metrics import routed_alike

    names = short_names(records["policy"])
    simulated = records[[split_variant(str(p))[1] is None for p in records["policy"]]]
    for policy, first in routed_alike(simulated).items():
        names[str(policy)] += f" (routed as {names[str(first)]})"
    return names


def integer_ticks(ax, axis: str = "x") -> None:
    """Ticks only at whole numbers on ``ax``'s ``axis`` (turns, workers: no "turn 2.5")."""
    from matplotlib.ticker import MaxNLocator

    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def token_label(tokens: float) -> str:
    """A token count as a short label: ``512``, ``31.2k``, ``1.5M`` (3 significant digits)."""
    size = abs(tokens)
    if size < 1e3:
        return f"{tokens:.3g}"
    if size < 1e6:
        return f"{tokens / 1e3:.3g}k"
    return f"{tokens / 1e6:.3g}M"


def token_axis(ax, axis: str = "x", unit: float = 1.0) -> None:
    """Label ``ax``'s ``axis`` in tokens with :func:`token_label` (``32.8k``, not ``2^-5``
    million); ``unit`` is the tokens one data unit stands for (1e6 for data in millions)."""
    from matplotlib.ticker import FuncFormatter

    target = getattr(ax, f"{axis}axis")
    target.set_major_formatter(FuncFormatter(lambda value, _pos: token_label(value * unit)))
    target.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))


def load_axis(frame: pd.DataFrame) -> str:
    """The column of sweep rows :func:`load_figure` draws against: ``"chats"`` when the rows sweep
    the number of sessions (more than one ``chats`` value), else ``"request_rate"`` (sessions
    started per s).

    Raises:
        ValueError: the rows sweep both (the curve would mix them: hold one fixed), or neither a
            ``chats`` sweep nor any ``request_rate``.
    """
    rates = frame["request_rate"].dropna().nunique() if "request_rate" in frame else 0
    chats = frame["chats"].dropna().nunique() if "chats" in frame else 0
    if rates > 1 and chats > 1:
        raise ValueError("the rows sweep both request_rate and chats: hold one fixed (one --request-rate, or one "
                         "--chats) to draw the load curve against the other")
    if chats > 1:
        return "chats"
    if rates:
        return "request_rate"
    raise ValueError("the load curve needs rows with a request_rate (kvroute sweep --request-rate 1,2,4,...) or a "
                     "chats sweep (--chats 32,64,128)")


def load_label(rows: pd.DataFrame, axis: str) -> str:
    """The x label of :func:`load_figure` against ``axis`` (:func:`load_axis`) with its unit:
    sessions started per s; or sessions, all started at once (no ``request_rate``) or at the
    rows' one rate."""
    if axis == "request_rate":
        return "offered load (sessions started per s)"
    rates = rows["request_rate"].dropna().unique() if "request_rate" in rows else []
    return (f"sessions (started at {float(rates[0]):g} per s)" if len(rates) == 1
            else "sessions (all started at once)")


LOAD_UNITS = {"goodput_share": "share of requests (0-1)", "output_throughput_tps": "output tokens per second (tok/s)"}
"""The y label of each :func:`load_figure` panel that is not a TTFT (those read ``TTFT (s)``)."""


def load_panels(frame: pd.DataFrame) -> list[str]:
    """The columns :func:`load_figure` draws, one panel each (the curves ``vllm bench serve`` users
    draw by hand): goodput share, TTFT p50 and p90 and output throughput. The TTFTs are the ones
    the sweep's tables show (``sweep.lead_ttft``): turns >= 2 when the rows have later turns, all
    turns otherwise."""
    from kvroute.sim.study.sweep import lead_ttft

    return ["goodput_share", lead_ttft(frame, "p50"), lead_ttft(frame, "p90"), "output_throughput_tps"]


def slo_text(frame: pd.DataFrame) -> str:
    """The goodput bound of sweep rows as words: ``"TTFT <= 2.0 s and TPOT <= 0.1 s"`` (from their
    ``slo_ttft_s`` and ``slo_tpot_s``).

    Raises:
        ValueError: the rows lack those columns, or hold more than one pair of bounds (their
            goodputs are not one measure).
    """
    if not {"slo_ttft_s", "slo_tpot_s"} <= set(frame.columns):
        raise ValueError("the rows have no slo_ttft_s and slo_tpot_s columns: their goodput's bounds are unknown")
    bounds = frame[["slo_ttft_s", "slo_tpot_s"]].drop_duplicates()
    if len(bounds) != 1:
        pairs = "; ".join(f"TTFT <= {t} s, TPOT <= {p} s" for t, p in bounds.itertuples(index=False))
        raise ValueError(f"the rows were measured against {len(bounds)} goodput bounds ({pairs}): draw one at a time")
    ttft, tpot = bounds.iloc[0]
    return f"TTFT <= {float(ttft)} s and TPOT <= {float(tpot)} s"


def load_figure(frame: pd.DataFrame, title: str = "", colors: dict[str, str] | None = None) -> Figure:
    """Goodput, TTFT p50/p90 and output throughput against load (:func:`load_axis`: sessions
    started per s, or the number of sessions of a ``chats`` sweep), one line per policy and
    per combination of the other settings the rows sweep (``sweep.group_columns``: workers, KV
    blocks, ...; colour is the policy, line style and marker the setting, named in the legend), so
    no point pools runs of different settings.

    The TTFT panels show the measure the sweep's tables show (:func:`load_panels`), each panel is
    titled with its metric's ``SUMMARY_METRICS`` label (the goodput panel also with its SLO
    bounds), and the legend sits under the panels, off the data. The series sit a little apart
    along the load axis (``figure_style.spread_along``, a fifth of the narrowest gap between loads
    for all of them) so that equal values, such as every policy's goodput of 1 at a low load, stay
    visible; the ticks stay at the loads swept. A series that routed every request as an earlier
    policy's series with the same settings did, in every run at every load (equal
    ``route_digest``), is named so in the legend: "least_loaded (routed as kv_aware)".

    Args:
        frame: sweep rows (``kvroute.sim.study.sweep.sweep``) with ``request_rate`` (sessions/s)
            or several ``chats`` (sessions), ``policy``, ``slo_ttft_s``, ``slo_tpot_s`` and the :func:`load_panels` metrics; each
            point is the mean over rounds with its 95 % Student-t interval as the error bar
            (``sweep.intervals``, the tables' interval, clipped to the metric's possible values;
            none with one round).
        title: figure title (``figure_style.scenario_title``).
        colors: ``{policy: colour}`` (default: ``figure_style.policy_colors`` over the rows).

    Returns:
        A bare matplotlib Figure. The load axis (:func:`load_label`) is logarithmic (base 2, ticks
        at the loads swept) when they span a decade or more (0.5 to 16 sessions/s), linear
        otherwise.

    Raises:
        ValueError: as :func:`load_axis` and :func:`slo_text`.
    """
    from kvroute.sim.cluster.metrics import METRIC_BOUNDS, SUMMARY_METRICS
    from kvroute.sim.study.sweep import group_columns, intervals

    x = load_axis(frame)
    rows = frame[frame[x].notna()]
    slo = slo_text(rows)
    rows = rows.assign(**{x: rows[x].astype(float)})
    panels = load_panels(rows)
    # other swept settings (workers, KV blocks, ...) get lines of their own, not a pooled mean
    settings = [c for c in group_columns(rows) if c not in ("policy", x)]
    iv = intervals(rows, panels, by=["policy", *settings, x])  # failed runs left out, as the tables
    colors = colors or policy_colors(rows["policy"].drop_duplicates())
    names = short_names(rows["policy"])
    routed_as = _routed_as(rows, settings, x)
    variants = list(dict.fromkeys(tuple(map(_setting_key, t)) for t in iv[settings].itertuples(index=False, name=None)))
    fig = Figure(figsize=(13, 4.4))
    axes = fig.subplots(1, len(panels))
    loads, x_label = rows[x].unique(), load_label(rows, x)
    series = iv.groupby(["policy", *settings], sort=False, dropna=False)
    for k, (key, group) in enumerate(series):
        key = key if isinstance(key, tuple) else (key,)
        policy, values = key[0], tuple(map(_setting_key, key[1:]))
        group = group.sort_values(x)
        style = series_style(str(policy), colors)
        label = names[str(policy)]
        if (first := routed_as.get((policy, values))) is not None:
            label += f" (routed as {names[str(first)]})"
        if settings:
            k = variants.index(values)
            style |= {"ls": SETTING_LINES[k % len(SETTING_LINES)], "marker": SETTING_MARKERS[k % len(SETTING_MARKERS)]}
            label += ", " + ", ".join(f"{c}={_setting_text(v)}" for c, v in zip(settings, values))
        # each series a little apart along x: equal values (goodput 1 at low load) stay visible
        at = spread_along(group[x], k, series.ngroups, loads, log=spans_decades(loads))
        for ax, metric in zip(axes, panels):
            lower, upper = METRIC_BOUNDS[metric]
            ax.errorbar(at, group[metric],
                        yerr=interval_errors(group[metric], group[f"{metric}_low"], group[f"{metric}_high"],
                                             lower, upper),
                        capsize=2, label=label, **style)
    for ax, metric in zip(axes, panels):
        if not log_axis_if_spread(ax, loads):
            ax.set_xticks(sorted(loads))
        ax.set_xlabel(x_label)
        ax.set_ylabel(LOAD_UNITS.get(metric, "TTFT (s)"))
        label = SUMMARY_METRICS[metric]
        ax.set_title(f"{label}\nin SLO: {slo}" if metric == "goodput_share" else label, fontsize=10)
        ax.grid(alpha=0.3)
        if metric.startswith(("ttft_", "later_ttft_")) and plain_log_axis(ax, iv[metric]):
            # TTFT past saturation (0.3 s against 10 s): the axis from the points, an error bar
            # that reaches 0 runs off the bottom
            top = np.nanmax([iv[metric].max(), iv[f"{metric}_high"].max()])
            ax.set_ylim(iv[metric].min() / 2, top * 1.5)
            continue
        if metric != "goodput_share":
            ax.set_ylim(bottom=0)
    axes[0].set_ylim(-0.02, 1.02)
    handles, labels = axes[0].get_legend_handles_labels()
    # under the panels: a legend inside one sat on its curves
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), LEGEND_COLUMNS), fontsize=9, frameon=False)
    if title:
        figure_title(fig, title)
    legend_rows = -(-len(labels) // LEGEND_COLUMNS)
    fig.tight_layout(rect=(0, 0.06 * legend_rows, 1, 1))
    return fig


SETTING_LINES = ("-", "--", ":", "-.")
"""Line styles of :func:`load_figure`'s series by the other swept settings (colour is the policy's)."""

SETTING_MARKERS = ("o", "s", "^", "D", "v")
"""Markers of :func:`load_figure`'s series by the other swept settings."""

LEGEND_COLUMNS = 6
"""Most entries per row of :func:`load_figure`'s legend (more rows below the panels)."""


def _routed_as(rows: pd.DataFrame, settings: list[str], x: str) -> dict[tuple, str]:
    """``{(policy, settings' values): first}`` for each series of :func:`load_figure` that routed
    every request of every run at every load as the series of an earlier policy with the same
    settings did (equal ``route_digest`` per load and ``run_seed``); ``{}`` for rows without
    those columns."""
    from kvroute.sim.cluster.metrics import alike_by_point

    if not {"route_digest", "run_seed"} <= set(rows.columns):
        return {}
    columns = ["policy", *settings, x, "run_seed", "route_digest"]
    runs = ((tuple(map(_setting_key, values)), policy, (load, seed, str(digest)))
            for policy, *values, load, seed, digest in rows[columns].itertuples(index=False, name=None))
    return {(policy, values): first
            for values, pairs in alike_by_point(runs).items() for policy, first in pairs}


def _setting_key(value):
    """A swept setting's value with NaN as None (NaN is not equal to itself)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _setting_text(value) -> str:
    """A swept setting's value as a legend shows it: ``8`` for ``8.0``, ``default`` for none
    given (the profile's or the workload's own), text as given."""
    if value is None:
        return "default"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def plot_load_curve(frame: pd.DataFrame, path: str | Path, title: str = "",
                    colors: dict[str, str] | None = None) -> Path:
    """Write :func:`load_figure` to ``path`` (its suffix picks the format: .png, .pdf, .svg);
    return the path.

    Raises:
        ValueError: as :func:`load_figure`.
    """
    path = Path(path)
    load_figure(frame, title, colors).savefig(path, dpi=110)
    return path


SERIES_PANELS = (
    ("vllm:num_requests_running", "running requests", "requests (stacked by worker)", "gauge"),
    ("vllm:num_requests_waiting", "waiting requests", "requests (stacked by worker)", "gauge"),
    ("kv_blocks_used", "KV blocks used", "KV blocks (stacked by worker)", "gauge"),
    ("num_batched_tokens", "batched tokens per second", "tokens per s (stacked by worker)", "rate"),
    ("vllm:prefix_cache_hits", "prefix-cache hit rate (cumulative)", "hit tokens / queried tokens (0-1)",
     "hit_rate"),
    ("vllm:num_preemptions", "preemptions (cumulative)", "preempted requests (stacked by worker)", "count"),
)
"""The panels of :func:`series_figure`: the column each draws, its title, its y label with the
unit, and how it is drawn. The preemption panel is left out of a run without preemptions."""


def plot_series(series: pd.DataFrame, path: str | Path, title: str = "", bins: int = 200) -> Path:
    """Write :func:`series_figure` of one run's time series to ``path`` (its suffix picks the
    format: .png, .pdf, .svg); return the path.

    Raises:
        ValueError: as :func:`series_figure`.
    """
    fig = series_figure(series, title, bins)
    fig.savefig(path, dpi=110)
    return Path(path)


def kv_capacity_blocks(series: pd.DataFrame) -> dict[int, int]:
    """Each worker's usable KV blocks (``num_gpu_blocks - 1``, vLLM's null block left out), read
    back from the samples' ``kv_blocks_used / vllm:kv_cache_usage_perc``; a worker that never held
    a block is missing (its capacity cannot be read from its samples)."""
    used = series[series["vllm:kv_cache_usage_perc"] > 0]
    ratio = (used["kv_blocks_used"] / used["vllm:kv_cache_usage_perc"]).round()
    return {int(w): int(v) for w, v in ratio.groupby(used["worker"]).median().items()}


KV_CAPACITY_IN_VIEW = 0.25
"""Peak use, as a share of the KV capacity, from which the KV panel's axis reaches the capacity;
below it the axis follows the use (readable) and the capacity line lies above it, named in the
legend (under the panel, where no stacked area lies), with a right axis in percent of the capacity."""


def _kv_capacity_line(ax, capacity: int, peak: float, handles=()) -> float:
    """Draw the cluster's KV ``capacity`` (blocks) on the KV panel ``ax`` and a right axis in
    percent of it, with a legend of ``handles`` and the capacity line; return the top the panel's
    axis should reach."""
    share = peak / capacity
    in_view = share >= KV_CAPACITY_IN_VIEW
    label = (f"KV capacity ({capacity:,} blocks)" if in_view
             else f"KV capacity ({capacity:,} blocks: off the top, the axis reaches {100 * share:.2g} % of it)")
    line = ax.axhline(capacity, color="black", ls="--", lw=1.2, label=label)
    _kv_legend(ax, [*handles, line])
    right = ax.secondary_yaxis("right", functions=(lambda b: 100.0 * b / capacity, lambda p: p * capacity / 100.0))
    right.set_ylabel("% of KV capacity", fontsize=8)
    return max(peak, capacity) if in_view else (peak if peak > 0 else capacity * 0.01)


def _kv_legend(ax, handles) -> None:
    """The KV panel's legend, under the panel: the stacked areas fill it from below, so "best"
    still lands on them."""
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.03), frameon=False,
              ncol=len(handles))


def _fullest_worker(series: pd.DataFrame) -> str:
    """Which worker came nearest its own KV capacity and how near (``vllm:kv_cache_usage_perc``'s
    peak over its steps): the stacked panel shows the cluster, where one full worker hides."""
    peaks = series.groupby("worker")["vllm:kv_cache_usage_perc"].max()
    worker = int(peaks.idxmax())
    return f"the fullest, worker {worker}, peaked at {100 * float(peaks[worker]):.1f} % of its own blocks"


def series_figure(series: pd.DataFrame, title: str = "", bins: int = 200,
                  kv_capacity: int | None = None) -> Figure:
    """One run's per-worker time series as a figure: one panel per metric, stacked per worker.

    The run's span (first step's start to last step's end) is cut into ``bins`` equal intervals.
    Running and waiting requests and KV blocks used are stacked areas of each worker's time-weighted
    mean over each interval (the top is the cluster's; ``kvroute.sim.cluster.timeseries.gauge_mean``);
    batched tokens per second are stacked the same way from the tokens each interval ran;
    preemptions are stacked cumulative counts (the panel is left out when there were none); the
    prefix-cache hit rate is one line per worker (cumulative hits / queries: a ratio does not
    stack) with the cluster's in black. The KV panel draws, over the blocks in use, the blocks the
    prefix cache holds (``kv_blocks_cached``: in use or free and evictable, the cluster's sum, a
    black line), and the cluster's KV capacity (the sum of the workers' usable blocks) as a dashed
    line and a right axis in percent of it (the axis reaches the line from a peak of
    ``KV_CAPACITY_IN_VIEW`` on; below, the legend names it),
    with its legend under the panel; with several workers its title names the fullest worker and
    its peak use of its own blocks (one full worker hides in the cluster's stack).

    Args:
        series: ONE run's rows (``RunResult.series``, or ``Comparison.series()`` filtered to one
            ``policy`` and ``round``).
        title: figure title (``figure_style.scenario_title``: it names the scenario).
        bins: intervals on the time axis.
        kv_capacity: the cluster's usable KV blocks (default: :func:`kv_capacity_blocks` summed,
            when every worker's can be read).

    Returns:
        A bare matplotlib Figure (no pyplot state; a notebook shows it with ``display``).

    Raises:
        ValueError: ``series`` is empty, or holds several policies or rounds.
    """
    from kvroute.sim.cluster.timeseries import cumulative_at, gauge_mean, workers_of

    if series.empty:
        raise ValueError("no time series rows to plot (was the run made with --time-series?)")
    for key in ("policy", "round"):
        if key in series and series[key].nunique() > 1:
            raise ValueError(f"plot_series draws one run: filter the series to one {key} first")
    workers = workers_of(series)
    if kv_capacity is None:
        per_worker = kv_capacity_blocks(series)
        kv_capacity = sum(per_worker.values()) if len(per_worker) == len(workers) else None
    panels = [p for p in SERIES_PANELS if p[3] != "count" or series[p[0]].sum() > 0]
    edges = np.linspace(float(series["start"].min()), float(series["end"].max()), bins + 1)
    rows = (len(panels) + 1) // 2
    fig = Figure(figsize=(12, 2.9 * rows + 0.6))
    grid = fig.subplots(rows, 2, sharex=True)
    axes = list(grid.ravel())
    if len(panels) % 2:  # an odd panel count: the empty slot goes, its neighbour above shows the time axis
        fig.delaxes(axes.pop())
        axes[-2].xaxis.set_tick_params(labelbottom=True)
    labels = [f"worker {w}" for w in workers]
    for ax, (column, label, unit, how) in zip(axes, panels):
        if how in ("gauge", "count", "rate"):
            if how == "gauge":
                values = gauge_mean(series, column, edges)
            elif how == "rate":
                values = np.diff(cumulative_at(series, column, edges, per_step=True), axis=1) / np.diff(edges)
            else:
                values = cumulative_at(series, column, edges)[:, 1:]
            values = np.column_stack([values, values[:, -1]])  # step="post": the last interval's value to its end
            ax.stackplot(edges, values, labels=labels, step="post", alpha=0.85)
            top = float(values.sum(axis=0).max())
            if column == "kv_blocks_used":
                # what the prefix cache holds, in use or free and evictable: a cache can be full
                # (and turn over) while few blocks are in use
                cached = gauge_mean(series, "kv_blocks_cached", edges).sum(axis=0)
                (cached_line,) = ax.step(edges, np.append(cached, cached[-1]), where="post", color="black", lw=1.0,
                                         label="blocks in the prefix cache (in use or free)")
                top = max(top, float(cached.max()))
                if kv_capacity:
                    top = _kv_capacity_line(ax, kv_capacity, top, [cached_line])
                else:
                    _kv_legend(ax, [cached_line])
            ax.set_ylim(0, 1.05 * top if top > 0 else 1)
            if how == "rate":
                token_axis(ax, "y")
            elif how == "count":
                integer_ticks(ax, "y")
        else:  # hit rate: cumulative hits / queries per worker and for the cluster
            hits = cumulative_at(series, "vllm:prefix_cache_hits", edges)
            queries = cumulative_at(series, "vllm:prefix_cache_queries", edges)
            with np.errstate(invalid="ignore", divide="ignore"):
                for i in range(len(workers)):
                    ax.plot(edges, hits[i] / queries[i], lw=1.0, ls=("-", "--", ":", "-.")[i % 4], label=labels[i])
                ax.plot(edges, hits.sum(0) / queries.sum(0), color="black", lw=2.0, label="cluster")
            ax.set_ylim(-0.02, 1.02)
        if column == "kv_blocks_used" and len(workers) > 1:
            label = f"{label} ({_fullest_worker(series)})"
        ax.set_title(label, fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[-2:]:
        ax.set_xlabel("simulated time (s)")
    legend = len(workers) <= 16
    if legend:
        hit_panel = next(ax for ax, p in zip(axes, panels) if p[3] == "hit_rate")
        handles, names = hit_panel.get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=min(len(names), 9), fontsize=8)
    if title:
        figure_title(fig, title)
    fig.tight_layout(rect=(0, 0.04 if legend else 0, 1, 1))
    return fig
