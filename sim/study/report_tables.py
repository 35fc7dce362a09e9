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
    for shares). A metric no policy has a value of is left out."""
    from kvroute.sim.cluster.metrics import SUMMARY_METRICS
    from kvroute.sim.study.experiment import format_change_range, format_interval, whole_counts

    policies = list(doc["policies"])
    metrics = list(dict.fromkeys(m for p in policies for m in doc["policies"][p]))
    uncertain = any("model_interval" in doc["policies"][p][m] for p in policies for m in doc["policies"][p])
    header = ["metric"]
    for i, policy in enumerate(policies):
        header += [f"{policy} (seeds)" if uncertain else policy] + (["with model unc."] if uncertain else [])
        if i:
            header += [f"Δ vs {policies[0]}"] + (["Δ with model unc."] if uncertain else [])
    rows = []
    for metric in metrics:
        if all(doc["policies"][p].get(metric, {}).get("mean") is None for p in policies):
            continue  # no policy has a value (later-turn TTFT on single-turn requests), as the printed table
        row: list[Cell | str] = [SUMMARY_METRICS.get(metric, metric)]
        for i, policy in enumerate(policies):
            entry = doc["policies"][policy].get(metric, {})
            n = len(entry.get("rounds") or [])
            whole = whole_counts(metric, [entry.get("mean")])
            row.append(Cell(format_interval(entry.get("mean"), entry.get("low"), entry.get("high"), n, whole),
                            {"mean": entry.get("mean"), "low": entry.get("low"), "high": entry.get("high"),
                             "rounds": n}))
            if uncertain:
                model = entry.get("model_interval") or {}
                row.append(_range_cell(model, whole_counts(metric, [entry.get("mean"), model.get("low"),
                                                                    model.get("high")])))
            if i:
                pp = "change_vs_baseline_pp" in entry
                value = entry.get("change_vs_baseline_pp" if pp else "change_vs_baseline_pct")
                row.append(Cell("" if value is None else ("{:+.1f} pp" if pp else "{:+.1f}%").format(value),
                                {"value": value}))
                if uncertain:
                    iv = entry.get("change_model_interval_pp" if pp else "change_model_interval_pct") or {}
                    row.append(Cell(format_change_range(iv.get("low"), iv.get("high"), points=pp),
                                    {"low": iv.get("low"), "high": iv.get("high")}))
        rows.append(row)
    title = ("Summary per policy: mean and 95 % interval over rounds (seeds) and the 95 % prediction interval with "
             "the model's uncertainty, change against the first policy" if uncertain else
             "Summary per policy: mean and 95 % interval over rounds, change against the first policy")
    return Table(title, header, rows, table_id="compare-table", note=note)


def _range_cell(interval: dict | None, whole: bool = False) -> Cell:
    """A ``[low, high]`` cell (``data-low``, ``data-high``) from ``{"low", "high"}`` (None: ``-``),
    without decimals when ``whole`` (``format_range``)."""
    from kvroute.sim.study.experiment import format_range

    iv = interval or {}
    return Cell(format_range(iv.get("low"), iv.get("high"), whole),
                {"low": iv.get("low"), "high": iv.get("high")})


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
    to possible values; a count's whole mean without decimals, cell by cell) with ``data-mean``, ``data-low``,
    ``data-high`` and ``data-rounds``."""
    from kvroute.sim.study.experiment import format_interval, whole_counts
    from kvroute.sim.study.sweep import COUNT_COLUMNS, intervals

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
                                                  int(row["rounds"]), whole_counts(metric, [row[metric]], COUNT_COLUMNS)),
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
