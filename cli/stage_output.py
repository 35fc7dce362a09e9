"""The per-stage table of ``kvroute simulate`` and ``compare`` for a trace with load stages (an
inference-perf stage ladder, ``--workload-config``): printed under the main table, added to
``--json``, and written with ``--out`` as ``stages.csv``, ``stages.json`` and ``stages.png`` (and
``stages.pdf`` / ``stages.svg`` with ``--figure-format``), and shown in ``report.html``."""

from __future__ import annotations

import json
from pathlib import Path

from kvroute.traces.outputs import atomic_output, write_text_atomic


def stage_results(comparison, trace, spec):
    """``(rows, table)``: per (policy, round, stage) and per (stage, policy) over rounds
    (``kvroute.sim.study.stages``); None when ``trace`` has no stages."""
    from kvroute.sim.study.stages import has_stages, stage_rows, stage_table

    if not has_stages(trace):
        return None
    rows = stage_rows(comparison.records(), trace, spec.request_timeout_s)
    return rows, stage_table(rows)


def stage_text(results) -> str:
    """The table as text, with a line saying how it is counted."""
    rows, table = results
    return ("\nper stage (inference-perf's counting: a request belongs to the stage that sent it; req/s = requests / "
            "send span; out tok/s = successful output tokens / (last end - first send); TTFT from send; ITL pooled "
            f"token gaps; means over {int(table['rounds'].max())} round(s)):\n" + _text(table))


def _text(table) -> str:
    from kvroute.sim.study.stages import format_stage_table

    return format_stage_table(table)


def stage_doc(results) -> dict:
    """``{"stages": [...], "stage_rounds": [...]}`` for ``--json`` and ``stages.json``."""
    rows, table = results
    return {"stages": json.loads(table.to_json(orient="records")),
            "stage_rounds": json.loads(rows.to_json(orient="records"))}


def write_stages(results, out: Path, title: str = "", formats=("png",), colors: dict | None = None):
    """``stages.csv`` (one row per stage and policy), ``stages.json`` and the per-stage figure
    (``stages.<format>`` for each of ``formats``: ``--figure-format``) under ``out``.

    Args:
        title: the figure's title (``figure_style.scenario_title``: it names the scenario).
        colors: ``{policy: colour}`` of the run's other figures (``figure_style.policy_colors``).

    Returns:
        ``(names, figure)``: the file names written and the matplotlib Figure (for report.html).
    """
    from kvroute.sim.study.figure_style import save_figure
    from kvroute.sim.study.stages import stages_figure

    rows, table = results
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / "stages.csv") as tmp:
        table.to_csv(tmp, index=False)
    write_text_atomic(out / "stages.json", json.dumps(stage_doc(results), indent=2))
    fig = stages_figure(table, title, colors)
    names = [path.name for path in save_figure(fig, out / "stages", formats, dpi=110)]
    return ["stages.csv", "stages.json", *names], fig
