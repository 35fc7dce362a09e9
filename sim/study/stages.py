"""Per-stage results of a trace with load stages, counted as inference-perf counts them.

inference-perf's per-stage report (``inference_perf/reportgen/base.py: summarize_requests``,
one call per stage's bucket of requests) puts a request in the stage that sent it, whenever it
finished, and over that bucket reports:

- ``achieved_rate``: requests / send duration (last send - first send of the stage), the
  ``Requests/s`` column of llm-d's published tables (it tracks the stage's rate even when the
  replies take minutes);
- output throughput: output tokens of the successful requests / the stage's benchmark time
  (the last end of any of its requests - its first send);
- TTFT: first token - send, over successful requests (mean, p90 by ``numpy.percentile``);
- ITL: every gap between consecutive streamed tokens of the successful requests, pooled; its
  mean is ``sum(last - first token) / sum(output tokens - 1)``;
- failures: requests with an error, timeouts included.

A failed request's end is its timeout for one the client abandoned (send + timeout) and its
send for one the server refused at once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from kvroute.sim.cluster.metrics import TIMED_OUT

if TYPE_CHECKING:
    import pandas as pd

    from kvroute.traces.format import Trace

STAGE_COLUMNS = ["policy", "round", "stage", "rate", "duration_s", "requests", "failed", "timed_out",
                 "achieved_rate", "output_throughput", "ttft_mean", "ttft_p90", "itl_mean", "benchmark_time"]
"""Columns of :func:`stage_rows`: rates in requests/s, throughput in output tokens/s, times in s."""


def has_stages(trace: Trace) -> bool:
    """Whether ``trace`` carries load stages (``Trace.metadata["stages"]`` and a stage per record)."""
    return bool(trace.metadata.get("stages")) and all(rec.stage is not None for rec in trace.records)


def stage_rows(records: pd.DataFrame, trace: Trace, timeout_s: float | None = None) -> pd.DataFrame:
    """One row per (policy, round, stage) of a comparison's records (``Comparison.records()``:
    ``RECORD_COLUMNS`` plus ``policy`` and ``round``), in ``STAGE_COLUMNS``.

    Args:
        records: the runs' records; a request's stage is that of its ``request_id`` in ``trace``
            (the same in every round of a stage ladder).
        trace: the trace with stages (:func:`has_stages`).
        timeout_s: the client's request timeout, s (the end of a request it abandoned).

    Raises:
        ValueError: ``trace`` has no stages.
    """
    import pandas as pd

    if not has_stages(trace):
        raise ValueError(f"{trace.source}: the trace has no load stages")
    stages = trace.metadata["stages"]
    stage_of = {rec.request_id: rec.stage for rec in trace.records}
    frame = records.assign(stage=records["request_id"].map(stage_of))
    rows = []
    for (policy, round_), run in frame.groupby(["policy", "round"], sort=False):
        for index, part in run.groupby("stage", sort=True):
            stage = stages[int(index)]
            rows.append({"policy": policy, "round": round_, "stage": int(index), "rate": stage["rate"],
                         "duration_s": stage["duration_s"], **_stage_metrics(part, timeout_s)})
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


def _stage_metrics(part: pd.DataFrame, timeout_s: float | None) -> dict[str, float]:
    ok = part[part["status"] == "ok"]
    errors = part["error"].fillna("")
    timed_out = errors.str.startswith(TIMED_OUT)
    sends = part["arrival"].to_numpy(float)
    ends = np.where(part["status"] == "ok", part["finish"].to_numpy(float),
                    np.where(timed_out, sends + (timeout_s or 0.0), sends))
    span = float(ends.max() - sends.min()) if len(part) else 0.0
    send_span = float(sends.max() - sends.min()) if len(part) else 0.0
    ttft = ok["ttft"].dropna().to_numpy(float)
    streamed = ok[ok["output_tokens"] > 1]
    gaps = float(streamed["output_tokens"].sum() - len(streamed))
    return {
        "requests": len(part), "failed": int((part["status"] != "ok").sum()), "timed_out": int(timed_out.sum()),
        "achieved_rate": len(part) / send_span if send_span > 0 else 0.0,
        "output_throughput": float(ok["output_tokens"].sum()) / span if span > 0 else 0.0,
        "ttft_mean": float(ttft.mean()) if len(ttft) else math.nan,
        "ttft_p90": float(np.percentile(ttft, 90)) if len(ttft) else math.nan,
        "itl_mean": float((streamed["finish"] - streamed["first_token"]).sum()) / gaps if gaps > 0 else math.nan,
        "benchmark_time": span,
    }


def stage_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The mean over rounds of :func:`stage_rows`, one row per (stage, policy), stages in order and
    policies in their first-seen order, with ``rounds``."""
    keys = ["stage", "policy"]
    order = {p: i for i, p in enumerate(dict.fromkeys(rows["policy"]))}
    table = rows.drop(columns="round").groupby(keys, sort=False).mean(numeric_only=True).reset_index()
    table["rounds"] = rows.groupby(keys, sort=False).size().to_numpy()
    table = table.sort_values(["stage", "policy"], key=lambda c: c.map(order) if c.name == "policy" else c)
    for name in ("requests", "failed", "timed_out"):
        table[name] = table[name].round(1)
    return table.reset_index(drop=True)


def format_stage_table(table: pd.DataFrame) -> str:
    """:func:`stage_table` as text: one line per stage and policy (named by
    ``figure_style.short_names``), the policy column as wide as its longest name."""
    from kvroute.sim.study.figure_style import short_names

    names = short_names(table["policy"])
    width = max([18, *map(len, names.values())])
    head = (f"{'stage':>5}  {'policy':<{width}} {'rate':>6} {'req/s':>7} {'out tok/s':>10} {'TTFT mean':>10} "
            f"{'TTFT p90':>9} {'ITL mean':>9} {'requests':>9} {'failed':>7} {'timed out':>9}")
    lines = [head, "-" * len(head)]
    for row in table.itertuples(index=False):
        lines.append(f"{row.stage:>5}  {names[str(row.policy)]:<{width}} {row.rate:>6g} {row.achieved_rate:>7.3f} "
                     f"{row.output_throughput:>10.1f} {_s(row.ttft_mean):>10} {_s(row.ttft_p90):>9} "
                     f"{_s(row.itl_mean, 4):>9} {row.requests:>9g} {row.failed:>7g} {row.timed_out:>9g}")
    return "\n".join(lines)


def _s(value: float, digits: int = 3) -> str:
    return "-" if value != value else f"{value:.{digits}f}"


STAGE_PANELS = (
    (("ttft_mean", "ttft_p90"), "TTFT per stage", "TTFT (s): mean (solid), p90 (dashed, hollow)"),
    (("output_throughput",), "output throughput per stage", "output tokens per second (tok/s)"),
    (("itl_mean",), "mean ITL per stage", "ITL mean (s)"),
)
"""The panels of :func:`stages_figure`: the :func:`stage_table` columns each draws, its title and
its y label with the unit. A panel none of whose values is a number (every request of every
stage failed, or one output token each: no ITL) is left out."""


def stages_figure(table: pd.DataFrame, title: str = "", colors: dict[str, str] | None = None):
    """:func:`stage_table` drawn stage by stage, in the order they ran (ticks: stage and rate):
    mean and p90 TTFT, output throughput and mean ITL, one line per policy in the style of
    ``kvroute.sim.study.figure_style``.

    Args:
        table: :func:`stage_table`'s rows (``stage``, ``rate`` in requests/s, ``policy`` and the
            panels' columns: TTFT and ITL in s, throughput in tok/s).
        title: figure title (``figure_style.scenario_title``: it names the scenario).
        colors: ``{policy: colour}`` shared by every figure of the run (default:
            ``figure_style.policy_colors`` over the table's policies).

    Returns:
        A bare matplotlib ``Figure`` (no pyplot state, so a notebook's backend is left alone). A
        panel's y axis is logarithmic when its values span a decade or more (a ladder's TTFT past
        saturation runs from 0.1 s to minutes), linear from 0 otherwise. One legend below the
        panels names the policies (and the TTFT panel's dashed p90), so none lies over a line.

    Raises:
        ValueError: ``table`` has no rows.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from kvroute.sim.study.figure_style import figure_title, plain_log_axis, policy_colors, series_style, short_names

    if table.empty:
        raise ValueError("no stage rows to plot")
    colors = colors or policy_colors(table["policy"].drop_duplicates())
    names = short_names(table["policy"])
    panels = [p for p in STAGE_PANELS if table[list(p[0])].notna().to_numpy().any()]
    fig = Figure(figsize=(5 * len(panels), 4.4))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    stages = table.drop_duplicates("stage").sort_values("stage")
    ticks = stages["stage"].to_numpy(int)
    tick_labels = [f"{s}\n{r:g}/s" for s, r in zip(stages["stage"], stages["rate"])]
    handles = []
    for k, (policy, part) in enumerate(table.groupby("policy", sort=False)):
        part = part.sort_values("stage")
        x = part["stage"].to_numpy(int)
        style = series_style(str(policy), colors)
        # later policies thinner, so one whose stages equal an earlier one's stays visible (as plots.ttft_figure)
        lw = max(1.0, 3.2 - 0.8 * k)
        handles.append(Line2D([], [], lw=lw, ms=2 + 2 * lw, label=names[str(policy)], **style))
        for ax, (columns, _name, _unit) in zip(axes, panels):
            if columns == ("ttft_mean", "ttft_p90"):
                ax.plot(x, part["ttft_mean"], lw=lw, ms=2 + 2 * lw, label=f"{names[str(policy)]} mean", **style)
                ax.plot(x, part["ttft_p90"], color=style["color"], ls="--", marker=style["marker"], mfc="none",
                        lw=max(0.8, lw - 1.2), ms=2 + 2 * lw, label=f"{names[str(policy)]} p90")
            else:
                ax.plot(x, part[columns[0]], lw=lw, ms=2 + 2 * lw, label=names[str(policy)], **style)
    for ax, (columns, name, unit) in zip(axes, panels):
        ax.set_xticks(ticks, tick_labels, fontsize=7)
        ax.set_xlabel("stage (in the order run) and its rate (requests/s)")
        ax.set_ylabel(unit)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        if not plain_log_axis(ax, table[list(columns)].to_numpy(float), "y"):
            ax.set_ylim(bottom=0)
    if panels[0][0] == ("ttft_mean", "ttft_p90"):
        handles.append(Line2D([], [], color="0.3", ls="--", marker="o", mfc="none", lw=1.0,
                              label="TTFT p90 (dashed, hollow)"))
    legend = fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8)
    if title:
        figure_title(fig, title)
    fig.tight_layout(rect=(0, legend.get_window_extent().height / fig.bbox.height + 0.01, 1, 1))  # above the legend
    return fig


def plot_stages(table: pd.DataFrame, path, title: str = "", colors: dict[str, str] | None = None):
    """Write :func:`stages_figure` to ``path`` (its suffix picks the format: .png, .pdf, .svg);
    return the figure.

    Raises:
        ValueError: as :func:`stages_figure`.
    """
    fig = stages_figure(table, title, colors)
    fig.savefig(path, dpi=110)
    return fig
