"""``report.html``: one self-contained page per run (``compare``, ``sweep``, ``validate``, ``sensitivity``
with ``--out``).

The page holds the scenario, the run's tables, its figures, its notes and its provenance, and
needs nothing else to open: the figures are inlined (PNG as base64 ``data:`` URIs, or SVG as
markup), the style sheet is inline, there is no script and no network address. A table cell that
shows a number carries the run's JSON value in ``data-*`` attributes (``data-mean``,
``data-low``, ``data-high``, ``data-value``, written with ``repr``), so a check can compare the
page with ``compare.json`` exactly (``tests/sim/study/test_report.py``).
"""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 78em;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.scenario { color: #444; } .scenario li { margin: 0.15em 0; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
figure { margin: 1em 0; } figure img, figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.notes li { margin: 0.3em 0; } .table-note { color: #555; font-size: 0.88em; margin-top: 0; }
"""


@dataclass
class Cell:
    """One table cell: the ``text`` shown and the exact values behind it (``data-<key>``)."""

    text: str
    values: dict[str, float | None] = field(default_factory=dict)
    numeric: bool = True


@dataclass
class Table:
    """A table of the report: ``header`` names the columns, each row is a list of cells (a plain
    string is a text cell)."""

    caption: str
    header: Sequence[str]
    rows: list[list[Cell | str]]
    table_id: str = ""
    note: str = ""


@dataclass
class Report:
    """Everything one ``report.html`` shows.

    Attributes:
        title: the page's heading.
        scenario: lines naming the run (trace, workers, profile, policies, rounds, seeds).
        tables: the run's tables, in order.
        figures: ``(caption, matplotlib Figure or the path of a PNG file)`` pairs, inlined as PNG
            (or SVG).
        notes: the notes printed under the run's table.
        provenance: text shown verbatim (the run's ``scenario.yaml``).
        files: the other files the run wrote, listed by name.
    """

    title: str
    scenario: list[str]
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    provenance: str = ""
    files: list[str] = field(default_factory=list)


def exact(value) -> str:
    """A number as the JSON writer writes it: an integer's digits (``3``, a count of rounds), the
    ``repr`` of a float (``3.0``); ``null`` for None or NaN."""
    if value is None:
        return "null"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    value = float(value)
    return "null" if math.isnan(value) else repr(value)


def figure_png(fig, dpi: int = 110) -> str:
    """``fig`` as a ``data:image/png;base64,...`` URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": "kvroute"})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure_svg(fig) -> str:
    """``fig`` as inline SVG markup (the XML prologue and DOCTYPE dropped)."""
    from kvroute.sim.study.figure_style import reproducible

    buffer = io.StringIO()
    with reproducible():
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "kvroute"})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _cell(cell: Cell | str) -> str:
    if isinstance(cell, str):
        return f"<td>{html.escape(cell)}</td>"
    attrs = "".join(f' data-{key}="{exact(value)}"' for key, value in cell.values.items())
    css = ' class="num"' if cell.numeric else ""
    return f"<td{css}{attrs}>{html.escape(cell.text)}</td>"


def table_html(table: Table) -> str:
    """One ``<table>`` with its caption, header row and cells."""
    ident = f' id="{html.escape(table.table_id)}"' if table.table_id else ""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in table.header)
    body = "\n".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in table.rows)
    note = f'\n<p class="table-note">{html.escape(table.note)}</p>' if table.note else ""
    return (f"<table{ident}>\n<caption>{html.escape(table.caption)}</caption>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table>{note}")


def render(report: Report, figure_format: str = "png") -> str:
    """The page as one HTML string (UTF-8; no script, no external reference).

    Args:
        report: what to show.
        figure_format: ``"png"`` (base64 ``<img>``) or ``"svg"`` (inline markup).

    Raises:
        ValueError: another ``figure_format``.
    """
    if figure_format not in ("png", "svg"):
        raise ValueError(f"report figures are png or svg, got {figure_format!r}")
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{esc(report.title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
             f"<h1>{esc(report.title)}</h1>", '<ul class="scenario" id="scenario">']
    parts += [f"<li>{esc(line)}</li>" for line in report.scenario]
    parts.append("</ul>")
    for table in report.tables:
        parts.append(table_html(table))
    if report.figures:
        parts.append('<h2>Figures</h2>')
    for caption, fig in report.figures:
        if isinstance(fig, (str, Path)):  # a PNG file another writer drew
            data = base64.b64encode(Path(fig).read_bytes()).decode("ascii")
            body = f'<img src="data:image/png;base64,{data}" alt="{esc(caption)}">'
        elif figure_format == "svg":
            body = figure_svg(fig)
        else:
            body = f'<img src="{figure_png(fig)}" alt="{esc(caption)}">'
        parts.append(f"<figure>{body}<figcaption>{esc(caption)}</figcaption></figure>")
    if report.notes:
        parts.append('<h2>Notes</h2><ul class="notes" id="notes">')
        parts += [f"<li>{esc(note)}</li>" for note in report.notes]
        parts.append("</ul>")
    if report.provenance or report.files:
        parts.append("<h2>Provenance</h2>")
    if report.files:
        parts.append("<p>Files of this run beside this page: " + ", ".join(
            f"<code>{esc(name)}</code>" for name in report.files) + "</p>")
    if report.provenance:
        parts.append(f'<pre id="provenance">{esc(report.provenance)}</pre>')
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_report(report: Report, path: str | Path, figure_format: str = "png") -> Path:
    """Write :func:`render` of ``report`` to ``path`` atomically; return the path."""
    from kvroute.traces.outputs import write_text_atomic

    path = Path(path)
    write_text_atomic(path, render(report, figure_format))
    return path

