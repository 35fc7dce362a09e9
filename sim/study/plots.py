"""Figures: TTFT distributions per policy and TTFT by turn (matplotlib, no pyplot state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def plot_ttft(records: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Write a PNG with two panels: TTFT CDF per policy, and mean and p90 TTFT by turn per
    policy (by prompt-length decile for traces without turns).

    Args:
        records: per-request records with ``policy``, ``turn``, ``ttft`` (s) and ``status``
            columns (``Comparison.records()``); all rounds are pooled.
        path: output PNG path.
        title: figure title.

    Returns:
        The path written.
    """
    ok = records[records["status"] == "ok"]
    # NOTE: a bare Figure (no pyplot) draws with whatever backend is active and leaves a
    # notebook's inline backend alone.
    fig = Figure(figsize=(11, 4.2))
    ax_cdf, ax_turn = fig.subplots(1, 2)
    has_turns = ok["turn"].notna().any()
    # Later policies are drawn thinner with their own marker, so a policy whose results equal
    # an earlier one's (least_loaded and kv_aware often do in closed-loop bursts) stays visible.
    for i, (policy, group) in enumerate(ok.groupby("policy", sort=False)):
        lw, marker = max(1.0, 3.2 - 0.8 * i), "osD^v<>"[i % 7]
        ttft = np.sort(group["ttft"].to_numpy(float))
        ax_cdf.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), lw=lw, label=policy)
        if has_turns:
            by = group.groupby("turn")["ttft"]
        else:  # no turns: TTFT against prompt length, in ten equal-count bins
            bins = pd.qcut(group["prompt_tokens"], 10, duplicates="drop")
            by = group.groupby(bins, observed=True)["ttft"]
        mean, p90 = by.mean(), by.quantile(0.9)
        x = mean.index if has_turns else [interval.mid for interval in mean.index]
        line = ax_turn.plot(x, mean.values, lw=lw, marker=marker, ms=3 + 2 * lw, label=f"{policy} mean")[0]
        ax_turn.plot(x, p90.values, ls="--", lw=lw, color=line.get_color(), label=f"{policy} p90")
    ax_cdf.set_xlabel("TTFT (s)")
    ax_cdf.set_ylabel("share of requests")
    ax_cdf.set_title("TTFT distribution")
    ax_cdf.grid(alpha=0.3)
    if ax_cdf.get_legend_handles_labels()[0]:
        ax_cdf.legend()
    if has_turns:
        integer_ticks(ax_turn)
    ax_turn.set_xlabel("turn" if has_turns else "prompt length (tokens, decile midpoints)")
    ax_turn.set_ylabel("TTFT (s)")
    ax_turn.set_title("TTFT by turn" if has_turns else "TTFT by prompt length")
    ax_turn.grid(alpha=0.3)
    if ax_turn.get_legend_handles_labels()[0]:
        ax_turn.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


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


LOAD_PANELS = (
    ("goodput_share", "goodput (share of requests in SLO)"),
    ("ttft_p50_s", "TTFT p50 (s)"),
    ("ttft_p90_s", "TTFT p90 (s)"),
    ("output_throughput_tps", "output throughput (tok/s)"),
)
"""The panels of :func:`plot_load_curve`: the curves ``vllm bench serve`` users draw by hand."""


def plot_load_curve(frame: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Write a PNG of goodput, TTFT p50/p90 and output throughput against offered load, per policy.

    Args:
        frame: sweep rows (``kvroute.sim.study.sweep.sweep``) with ``request_rate`` (sessions/s),
            ``policy`` and the ``LOAD_PANELS`` metrics; rounds are averaged, and the error bars
            are the min and max over rounds.
        path: output PNG path.
        title: figure title.

    Returns:
        The path written.

    Raises:
        ValueError: no row has a ``request_rate``.
    """
    rows = frame[frame["request_rate"].notna()] if "request_rate" in frame else frame.iloc[0:0]
    if rows.empty:
        raise ValueError("the load curve needs rows with a request_rate (kvroute sweep --request-rate 1,2,4,...)")
    fig = Figure(figsize=(12, 3.6))
    axes = fig.subplots(1, len(LOAD_PANELS))
    for i, (policy, group) in enumerate(rows.groupby("policy", sort=False)):
        by_rate = group.groupby("request_rate")
        for ax, (metric, label) in zip(axes, LOAD_PANELS):
            stats = by_rate[metric].agg(["mean", "min", "max"])
            ax.errorbar(stats.index, stats["mean"], yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                        marker="osD^v<>"[i % 7], ls=("-", "--", ":", "-.")[i % 4], capsize=2, label=policy)
            ax.set_xlabel("sessions started per second")
            ax.set_title(label, fontsize=9)
            ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


SERIES_PANELS = (
    ("vllm:num_requests_running", "running requests", "gauge"),
    ("vllm:num_requests_waiting", "waiting requests", "gauge"),
    ("kv_blocks_used", "KV blocks used", "gauge"),
    ("num_batched_tokens", "batched tokens per second", "rate"),
    ("vllm:prefix_cache_hits", "prefix-cache hit rate (cumulative)", "hit_rate"),
    ("vllm:num_preemptions", "preemptions (cumulative)", "count"),
)
"""The panels of :func:`plot_series`: the column each draws, its title, and how."""


def plot_series(series: pd.DataFrame, path: str | Path, title: str = "", bins: int = 200) -> Path:
    """Write :func:`series_figure` of one run's time series to a PNG at ``path``; return the path.

    Raises:
        ValueError: as :func:`series_figure`.
    """
    fig = series_figure(series, title, bins)
    fig.savefig(path, dpi=110)
    return Path(path)


def series_figure(series: pd.DataFrame, title: str = "", bins: int = 200) -> Figure:
    """One run's per-worker time series as a figure: one panel per metric, stacked per worker.

    The run's span (first step's start to last step's end) is cut into ``bins`` equal intervals.
    Running and waiting requests and KV blocks used are stacked areas of each worker's time-weighted
    mean over each interval (the top is the cluster's; ``kvroute.sim.cluster.timeseries.gauge_mean``);
    batched tokens per second are stacked the same way from the tokens each interval ran;
    preemptions are stacked cumulative counts; the prefix-cache hit rate is one line per worker
    (cumulative hits / queries: a ratio does not stack) with the cluster's in black.

    Args:
        series: ONE run's rows (``RunResult.series``, or ``Comparison.series()`` filtered to one
            ``policy`` and ``round``).
        title: figure title.
        bins: intervals on the time axis.

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
    edges = np.linspace(float(series["start"].min()), float(series["end"].max()), bins + 1)
    fig = Figure(figsize=(12, 8.5))
    axes = fig.subplots(3, 2, sharex=True).ravel()
    labels = [f"worker {w}" for w in workers]
    for ax, (column, label, how) in zip(axes, SERIES_PANELS):
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
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-2:]:
        ax.set_xlabel("simulated time (s)")
    legend = len(workers) <= 16
    if legend:
        handles, names = axes[4].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=min(len(names), 9), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04 if legend else 0, 1, 1))
    return fig
