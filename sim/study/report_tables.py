"""The tables of the runs' ``report.html`` pages (``kvroute.sim.study.report``), built from the
run's own JSON or rows so that the page's numbers are the run's: ``compare`` (from
``compare.json``) and ``sweep`` (from its rows, through ``sweep.intervals``)."""

from __future__ import annotations

from kvroute.sim.study.report import Cell, Table


def compare_table(doc: dict, note: str = "") -> Table:
    """The table ``kvroute compare`` prints, from its JSON (``compare.json``: ``Comparison.to_dict``):
    a row per metric, a column per policy (``mean ± half`` or ``mean [low, high]``, cells carrying
    ``data-mean``, ``data-low``, ``data-high`` and ``data-rounds``), and after each policy but the
    first its change against the first (``data-value``: ``change_vs_baseline_pct``, or ``_pp``
    for shares)."""
    from kvroute.sim.cluster.metrics import SUMMARY_METRICS
    from kvroute.sim.study.experiment import format_interval

    policies = list(doc["policies"])
    header = ["metric"]
    for i, policy in enumerate(policies):
        header += [policy] + ([f"Δ vs {policies[0]}"] if i else [])
    metrics = list(dict.fromkeys(m for p in policies for m in doc["policies"][p]))
    rows = []
    for metric in metrics:
        row: list[Cell | str] = [SUMMARY_METRICS.get(metric, metric)]
        for i, policy in enumerate(policies):
            entry = doc["policies"][policy].get(metric, {})
            n = len(entry.get("rounds") or [])
            row.append(Cell(format_interval(entry.get("mean"), entry.get("low"), entry.get("high"), n),
                            {"mean": entry.get("mean"), "low": entry.get("low"), "high": entry.get("high"),
                             "rounds": n}))
            if i:
                if "change_vs_baseline_pp" in entry:
                    value, text = entry["change_vs_baseline_pp"], "{:+.1f} pp"
                else:
                    value, text = entry.get("change_vs_baseline_pct"), "{:+.1f}%"
                row.append(Cell("" if value is None else text.format(value), {"value": value}))
        rows.append(row)
    return Table("Summary per policy: mean and 95 % interval over rounds, change against the first policy", header,
                 rows, table_id="compare-table", note=note)


ALWAYS_SHOWN = ("workload", "chats", "turns", "profile", "workers", "policy")
"""Scenario fields every sweep report names, varying or not."""


def grid_lines(rows) -> list[str]:
    """Lines naming a sweep's grid from its rows (``Scenario.label()`` columns): the fields in
    :data:`ALWAYS_SHOWN`, then every other field that varies or is not at its default, each
    ``"field: v1, v2, ..."`` in the order swept."""
    from kvroute.sim.study.scenario import SCENARIO_FIELDS, Scenario

    default = Scenario().label()
    lines = []
    for name in SCENARIO_FIELDS:
        if name not in rows or name == "seed":
            continue
        values = list(dict.fromkeys(str(v) for v in rows[name] if v is not None and v == v))
        if not values:
            continue
        if name in ALWAYS_SHOWN or len(values) > 1 or values != [str(default.get(name))]:
            lines.append(f"{name}: {', '.join(values)}")
    return lines


def sweep_table(frame, metric: str, label: str) -> Table:
    """One metric of a sweep as a table: a row per scenario (the fields that vary, but the policy),
    a column per policy, each cell ``mean [low, high]`` over rounds (``sweep.intervals``, clipped
    to possible values) with ``data-mean``, ``data-low``, ``data-high`` and ``data-rounds``."""
    from kvroute.sim.study.experiment import format_interval
    from kvroute.sim.study.sweep import intervals

    iv = intervals(frame, [metric])
    by = [c for c in iv.columns if c not in ("rounds", metric, f"{metric}_low", f"{metric}_high")]
    index = [c for c in by if c != "policy"]
    policies = list(dict.fromkeys(iv["policy"])) if "policy" in by else [metric]
    keys = list(dict.fromkeys(tuple(row[c] for c in index) for _, row in iv.iterrows()))
    cells = {}
    for _, row in iv.iterrows():
        key = tuple(row[c] for c in index)
        column = row["policy"] if "policy" in by else metric
        cells[key, column] = Cell(format_interval(row[metric], row[f"{metric}_low"], row[f"{metric}_high"],
                                                  int(row["rounds"])),
                                  {"mean": row[metric], "low": row[f"{metric}_low"], "high": row[f"{metric}_high"],
                                   "rounds": int(row["rounds"])})
    rows = [[*(str(k) for k in key), *(cells.get((key, p), "-") for p in policies)] for key in keys]
    return Table(label, [*index, *policies], rows, table_id=f"sweep-{metric}")


def frame_table(frame, caption: str, table_id: str = "") -> Table:
    """Any DataFrame as a table: its columns as the header, numbers shown with 4 significant
    digits and carried exactly in ``data-value``, everything else as text."""
    import numbers

    rows = []
    for record in frame.to_dict("records"):
        row: list[Cell | str] = []
        for value in record.values():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                row.append(Cell(f"{value:.4g}", {"value": value}))
            else:
                row.append("" if value is None else str(value))
        rows.append(row)
    return Table(caption, [str(c) for c in frame.columns], rows, table_id=table_id)
