"""The one figure style of kvroute's figures: a colour per policy, scenario titles, intervals clipped
to possible values, axis scales and the output formats.

Every figure a run writes (``compare``'s TTFT and time-series figures, ``sweep``'s load curve,
``validate``'s predicted-against-measured figures) takes its policy colours from
:func:`policy_colors` over the run's policies, so a policy has the same colour in each of them; a
prediction and a measurement of one policy share the colour and differ by line style and marker
(:data:`VARIANT_STYLES`). See docs/guide/figures-and-reports.md.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
"""Policy colours in the order a run lists its policies (matplotlib's ``tab10``, which stays
distinguishable in grey print and for the common colour-vision deficiencies better than most)."""

VARIANT_STYLES = {
    None: {"ls": "-", "marker": "o"},
    "predicted": {"ls": "-", "marker": "o"},
    "measured": {"ls": "--", "marker": "s"},
}
"""Line style and marker of a series by what it is: a plain run, a prediction, a measurement."""

FIGURE_FORMATS = ("png", "pdf", "svg")
"""Formats ``--figure-format`` accepts: PNG for screens and the HTML report, PDF and SVG (vector)
for papers."""

TITLE_WIDTH = 110
"""Characters per title line before it wraps (fits a figure 11 inches wide at 10 pt)."""

TITLE_GAP_IN = 0.08
"""Inches between a figure's top edge and its title (:func:`figure_title`)."""


def split_variant(label: str) -> tuple[str, str | None]:
    """``"kv_aware measured"`` -> ``("kv_aware", "measured")``; a plain policy -> ``(policy, None)``."""
    for variant in ("predicted", "measured"):
        if label.endswith(f" {variant}"):
            return label[: -len(variant) - 1], variant
    return label, None


def short_names(policies: Iterable[str]) -> dict[str, str]:
    """Display names of policy specs for tables and legends: a config file's path cut to its file
    name (``epp:/runs/a/precise.yaml`` -> ``epp:precise.yaml``) and a Markdown report's block to
    its name (``epp:/x/report.md#precise-scheduling`` -> ``epp:precise-scheduling``); a spec
    without a path as it is. Specs whose short names would read the same keep their whole text.
    Variants (``"<spec> measured"``) are shortened as their spec.

    Returns:
        ``{spec: name}`` for every distinct spec given.
    """
    specs = list(dict.fromkeys(str(p) for p in policies))
    short = {}
    for spec in specs:
        base, variant = split_variant(spec)
        name = _SPEC_PATH.sub(lambda m: m.group("block") or m.group("file"), base)
        short[spec] = name + (f" {variant}" if variant else "")
    seen: dict[str, int] = {}
    for name in short.values():
        seen[name] = seen.get(name, 0) + 1
    return {spec: name if seen[name] == 1 else spec for spec, name in short.items()}


_SPEC_PATH = re.compile(r"(?<=[:=])[^,:=]*/(?P<file>[^,/#]+?(?:\.md|\.markdown)?)(?:#(?P<block>[^,]+))?(?=,|$)")
"""A path in a policy spec's value (after ``:`` or ``=``, up to the next ``,``): its file name, and
a Markdown report's ``#block``."""


def policy_colors(policies: Iterable[str]) -> dict[str, str]:
    """One colour per policy, by order of first appearance (variants such as ``"x measured"``
    count as their policy ``x``); the palette repeats after ten policies.

    Returns:
        ``{policy: "#rrggbb"}`` for every distinct policy.
    """
    out: dict[str, str] = {}
    for label in policies:
        policy, _ = split_variant(str(label))
        if policy not in out:
            out[policy] = PALETTE[len(out) % len(PALETTE)]
    return out


def dodged(x, k: int, n: int, spread: float = 0.06) -> np.ndarray:
    """``x`` moved apart for the ``k``-th of ``n`` series that share a log x axis, so that series
    with equal values stay visible side by side: ``x * 2 ** (spread * (k - (n - 1) / 2))`` (a
    factor of 1.06 between neighbours at the default). Only the drawing moves; the values and
    the axis ticks stay where they are."""
    return np.asarray(x, float) * 2.0 ** (spread * (k - (n - 1) / 2))


def spread_along(x, k: int, n: int, ticks, log: bool, share: float = 0.2) -> np.ndarray:
    """``x`` moved apart for the ``k``-th of ``n`` series drawn at the same ``ticks`` (the x values
    the series share), so that series with equal values stay visible side by side.

    The ``n`` series together span ``share`` of the narrowest gap between neighbouring ticks,
    centred on each tick: on a log axis (``log``) the gap is measured in powers of two and the
    series are :func:`dodged` by that factor, on a linear axis they are shifted by that length.
    With one tick the gap is the tick's own size (1 for a tick at 0). Only the drawing moves; the
    values and the axis ticks stay where they are.

    Returns:
        ``x`` as floats, moved; ``x`` itself when ``n`` is 1.
    """
    x = np.asarray(x, float)
    if n < 2:
        return x
    marks = np.unique(np.asarray([t for t in np.asarray(ticks, float).ravel() if np.isfinite(t)]))
    if log:
        marks = np.log2(marks[marks > 0])
    gaps = np.diff(marks)
    gap = gaps.min() if len(gaps) else (abs(marks[0]) if len(marks) and marks[0] != 0 else 1.0)
    step = share * gap / (n - 1)
    return dodged(x, k, n, spread=step) if log else x + step * (k - (n - 1) / 2)


def series_style(label: str, colors: dict[str, str]) -> dict:
    """Matplotlib keyword arguments (``color``, ``ls``, ``marker``) for a series named ``label``
    (a policy, or ``"<policy> predicted"`` / ``"<policy> measured"``) under ``colors``."""
    policy, variant = split_variant(label)
    color = colors.get(policy) or policy_colors([policy])[policy]
    return {"color": color, **VARIANT_STYLES[variant]}


def scenario_title(scenario: str, policies: Sequence[str] = (), what: str = "", width: int = TITLE_WIDTH) -> str:
    """A figure title naming the run: ``what`` first, then the scenario (trace, workers,
    profile: ``kvroute.cli.scenario.describe``'s header) and the policies, each wrapped at
    ``width`` characters (default :data:`TITLE_WIDTH`, for a figure 11 inches wide) so no line
    runs off the figure. The policies are named as the legends name them (:func:`short_names`)."""
    parts = textwrap.wrap(what, width, break_on_hyphens=False) if what else []
    text = scenario + (f" | policies {', '.join(short_names(policies).values())}" if policies else "")
    parts += textwrap.wrap(text, width, break_on_hyphens=False) or [""]
    return "\n".join(parts)


def figure_title(fig, text: str, fontsize: float = 10):
    """Set ``text`` as ``fig``'s title, :data:`TITLE_GAP_IN` inches below its top edge, whatever
    the figure's height; then ``fig.tight_layout()`` keeps the first row of panel titles clear of
    it. (Matplotlib's own place, 2 % of the height down, is 0.35 inches on a 17-inch tornado:
    lower than the room tight_layout makes for the title, so its last line ran over the panel
    titles.)

    Returns:
        The title's ``Text``.
    """
    return fig.suptitle(text, fontsize=fontsize, y=1.0 - TITLE_GAP_IN / fig.get_figheight(), va="top")


def interval_errors(mean, low, high, lower: float = 0.0, upper: float = math.inf) -> np.ndarray:
    """Error-bar lengths ``[[mean - low], [high - mean]]`` for ``errorbar(yerr=...)``, with the
    interval first clipped to the possible values ``[lower, upper]`` (a count or a time cannot be
    negative, a share not above 1) and missing bounds drawn as no bar.

    Returns:
        A ``2 x N`` array of non-negative floats.
    """
    mean, low, high = (np.atleast_1d(np.asarray(x, float)) for x in (mean, low, high))
    low = np.clip(np.where(np.isnan(low), mean, low), lower, upper)
    high = np.clip(np.where(np.isnan(high), mean, high), lower, upper)
    below = np.nan_to_num(mean - low, nan=0.0)
    above = np.nan_to_num(high - mean, nan=0.0)
    return np.vstack([np.maximum(below, 0.0), np.maximum(above, 0.0)])


def spans_decades(values, decades: float = 1.0) -> bool:
    """Whether the positive ``values`` span at least ``decades`` powers of ten (max/min >= 10)."""
    arr = np.asarray([v for v in np.asarray(values, float).ravel() if np.isfinite(v)])
    return bool(len(arr)) and bool((arr > 0).all()) and arr.max() / arr.min() >= 10.0 ** decades


def log_axis_if_spread(ax, values, axis: str = "x") -> bool:
    """Put ``ax``'s ``axis`` on a log scale (base 2, ticks at the values, plain labels: ``0.5``,
    ``16``) when ``values`` span a decade or more; return whether it did."""
    if not spans_decades(values):
        return False
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    getattr(ax, f"set_{axis}scale")("log", base=2)
    target = getattr(ax, f"{axis}axis")
    ticks = sorted({float(v) for v in np.asarray(values, float).ravel() if np.isfinite(v)})
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    target.set_minor_locator(NullLocator())
    return True


def plain_log_axis(ax, values, axis: str = "y") -> bool:
    """Put ``ax``'s ``axis`` on a base-10 log scale labelled ``0.1``, ``2``, ``50`` (not ``10^-1``)
    when the positive ``values`` span a decade or more (a stage ladder's TTFT past saturation:
    0.1 to 100 s); return whether it did. Unlike :func:`log_axis_if_spread` the ticks are not the
    values themselves (measurements, not the settings swept)."""
    if not spans_decades(values):
        return False
    from matplotlib.ticker import FuncFormatter, LogLocator

    getattr(ax, f"set_{axis}scale")("log")
    target = getattr(ax, f"{axis}axis")
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    target.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))
    return True


def parse_figure_formats(text: str) -> tuple[str, ...]:
    """``"png,pdf"`` -> ``("png", "pdf")`` (case-insensitive, duplicates dropped, order kept).

    Raises:
        ValueError: an empty list or a format not in :data:`FIGURE_FORMATS` (the message names it
            and the valid ones).
    """
    names = [name.strip().lower().lstrip(".") for name in str(text).split(",") if name.strip()]
    if not names:
        raise ValueError(f"give at least one figure format ({', '.join(FIGURE_FORMATS)})")
    for name in names:
        if name not in FIGURE_FORMATS:
            raise ValueError(f"unknown figure format {name!r}; valid: {', '.join(FIGURE_FORMATS)}")
    return tuple(dict.fromkeys(names))


def save_figure(fig, stem: str | Path, formats: Sequence[str] = ("png",), dpi: int = 120) -> list[Path]:
    """Write ``fig`` to ``stem.<format>`` for each of ``formats`` (atomically:
    ``kvroute.traces.outputs.atomic_output``); return the paths written, in order.

    Raises:
        ValueError: a format not in :data:`FIGURE_FORMATS`.
    """
    from kvroute.traces.outputs import atomic_output

    stem = Path(stem)
    paths = []
    for fmt in formats:
        if fmt not in FIGURE_FORMATS:
            raise ValueError(f"unknown figure format {fmt!r}; valid: {', '.join(FIGURE_FORMATS)}")
        path = stem.with_name(f"{stem.name}.{fmt}")
        with atomic_output(path) as tmp, reproducible():
            fig.savefig(tmp, dpi=dpi, format=fmt, metadata=_metadata(fmt))
        paths.append(path)
    return paths


def reproducible():
    """A context in which matplotlib writes the same SVG for the same figure (its element ids
    are otherwise salted at random: ``svg.hashsalt``)."""
    import matplotlib

    return matplotlib.rc_context({"svg.hashsalt": "kvroute"})


def _metadata(fmt: str) -> dict:
    # No creation dates: the same run writes the same PDF and SVG bytes.
    if fmt == "pdf":
        return {"CreationDate": None, "Creator": "kvroute"}
    if fmt == "svg":
        return {"Date": None, "Creator": "kvroute"}
    return {"Software": "kvroute"}
