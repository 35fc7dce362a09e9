"""``report.md`` and ``report.html`` of a validation, from ``report.json``'s dict
(:func:`kvroute.calibrate.validation.validate_report.report_dict`), and the files
:func:`write_report` writes.

Both pages are rendered from the same tables (:func:`policy_tables`, :func:`changes_table`,
:func:`scenario_lines`): Markdown by :func:`markdown_table`, HTML by
``kvroute.sim.study.report``. The closing paragraph (:func:`coverage_text`) says how many measured
values fall inside their prediction interval, what the intervals combine and how wide they are.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from kvroute.calibrate.validation.validate import Validation
from kvroute.calibrate.validation.validate_report import (REPORT_METRICS, UNCHECKED_METRICS, _multi, _num,
                                                          measured_only_dict, report_dict)
from kvroute.sim.cluster.metrics import SUMMARY_METRICS
from kvroute.sim.timing.drift import drift_exponent
from kvroute.sim.study.report import Cell, Report, Table
from kvroute.traces.outputs import atomic_output, write_text_atomic


def _with_drift(metric: dict) -> str:
    """`` (x1.08 drift: 1.333)`` for a metric whose interval is centred on the prediction times the
    host's speed drift, else ''."""
    if metric.get("predicted_with_drift") is None:
        return ""
    return f" (x{metric['drift_factor']:.2f} drift: {_fmt(metric['predicted_with_drift'])})"


def _error_text(metric: dict) -> str:
    """The error column: against the prediction, and where the interval is centred on the
    prediction times the host's drift, also against that (``-20.0% (drift: -3.2%)``)."""
    drifted = metric.get("error_pct_with_drift")
    return _pct(metric["error_pct"]) + ("" if drifted is None else f" (drift: {_pct(drifted)})")


def _async_text(server: dict) -> str:
    """`` (async scheduling on)`` or ``off`` for a server entry that says, else ''."""
    flag = server.get("async_scheduling")
    return "" if flag is None else f" (async scheduling {'on' if flag else 'off'})"


def _share(x) -> str:
    x = _num(x)
    return "-" if x is None else f"{100 * x:.0f} %"


def _fmt(x, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals, and at least two significant ones below 1 (an ITL of
    0.0021 s, not 0.002); at most one from 100 (``523.3``; none when ``digits`` is 0); thousands
    with separators; '-' for None or NaN."""
    x = _num(x)
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if 0 < abs(x) < 1 and digits:
        digits = max(digits, 1 - math.floor(math.log10(abs(x))))
    if abs(round(x, digits)) >= 100:
        digits = min(digits, 1)
    return f"{x:.{digits}f}"


def _count(x) -> str:
    """A count, or a mean of counts: no decimals when whole (``0``, ``12``), else one (``0.5``);
    '-' for None or NaN."""
    x = _num(x)
    return "-" if x is None else _fmt(x, 0 if x == round(x) else 1)


def _range(pair, fmt: Callable = _fmt) -> str:
    lo, hi = (_num(x) for x in pair)
    return "-" if lo is None or hi is None else f"{fmt(lo)} - {fmt(hi)}"


def _pct(x, unit: str = "%") -> str:
    """``+12.3%``, or ``+12.3 pp`` with ``unit`` "pp"; '-' for None or NaN."""
    x = _num(x)
    return "-" if x is None else f"{x:+.1f}" + (" pp" if unit == "pp" else "%")


def _lag_text(lag: dict | None, simulated_s: float, measured: bool = False) -> str:
    """The client's send lag of later turns, live, and what the simulation does with it: draws
    each turn's lag from the measured ones (``--client-lag measured``), adds one fixed lag, or
    none."""
    if not lag:
        return ""
    if measured:
        sim = "the simulation draws each later turn's lag from these measured ones (--client-lag measured)"
    elif simulated_s:
        sim = f"the simulation adds {1000 * simulated_s:.1f} ms to each (--client-lag)"
    else:
        sim = "which the simulation does not add (--client-lag 0)"
    return (f"; the client sent later turns {1000 * lag['median']:.1f} ms (median, p90 "
            f"{1000 * lag['p90']:.1f} ms) after their parent's last token, {sim}")


def policy_line(doc: dict, p: dict) -> str:
    """One policy's live run in a sentence: wall time, the client's CPU share, failed requests,
    a warm cache, and the client's send lag against what the simulation does with it."""
    whole = sum(not r.get("cut_short") for r in p.get("rounds", [])) or p.get("live_rounds")
    rounds = (f" (mean of {whole} rounds{' that ran whole' if whole < p['live_rounds'] else ''})"
              if doc.get("live_rounds") else "")
    return (f"live wall time {_fmt(p['live_wall_time_s'], 1)} s{rounds}, client CPU "
            f"{_share(p.get('client_cpu_share'))} of it, failed requests {p['failed_requests']}"
            + (", warm cache" if p["warm_cache"] else "")
            + _lag_text(p["client_send_lag_s"], doc["sim_client_lag_s"], doc.get("sim_client_lag_measured", False))
            + _cut_rounds_text(p))


def _rounds_text(left_out: list[dict]) -> str:
    """``live round 2 (interrupted), live round 3 (worker 1 died)``: the rounds of ``left_out``
    (report.json's ``{"live_round", "why"}``, rounds from 0), numbered from 1."""
    return ", ".join(f"live round {x['live_round'] + 1} ({x['why']})" for x in left_out)


def _cut_rounds_text(p: dict) -> str:
    """With several live rounds, the policy's rounds cut short and what was done with them: left
    out of the checked means (and of their min - max and interval), or, when every round was,
    the means are of them all and not checked; '' when every round ran whole."""
    rounds = p.get("rounds") or []
    cut = [{"live_round": r["live_round"], "why": r["cut_short"]} for r in rounds if r.get("cut_short")]
    if not cut:
        return ""
    if len(cut) == len(rounds):
        return f"; every live round was cut short ({_rounds_text(cut)}): the means are of them all, not checked"
    return (f"; left out of the measured means, their min - max and intervals, as cut short: {_rounds_text(cut)}; "
            f"each value is checked against the interval of the mean of the {len(rounds) - len(cut)} whole round(s)")


def report_markdown(v: Validation, doc: dict | None = None) -> str:
    """The human report: scenario, per policy its tables (:func:`policy_tables`), the change table
    (:func:`changes_table`), the coverage paragraph, notes. ``report.html`` shows the same tables."""
    doc = doc or report_dict(v)
    lines = [f"# Validation: {doc['trace']} ({doc['num_requests']} requests)", ""]
    lines += [f"- {line}" for line in scenario_lines(doc)]
    for policy, p in doc["policies"].items():
        lines += ["", f"## {policy}", "", policy_line(doc, p).replace("warm cache", "**warm cache**")]
        first, *more = policy_tables(doc, policy, p)  # the first's note is the line above it
        lines += [""] + markdown_table(first)
        for table in more:
            lines += ["", f"{table.caption}:", ""] + markdown_table(table) + (["", table.note] if table.note else [])
    changes = changes_table(doc)
    if changes is not None:
        lines += ["", f"## {changes.caption}", ""] + markdown_table(changes)
        lines += ["", changes.note] if changes.note else []
    lines += ["", coverage_text(doc)]
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    prov = doc.get("provenance")
    if prov:
        lines += ["", f"Made by kvroute {prov['version']} (`{prov['command']}`), profile `{prov['profile']['name']}` "
                  f"(sha256 {prov['profile']['sha256'][:12]}); every option and the trace's hash are in report.json "
                  "(provenance)."]
    return "\n".join(lines) + "\n"


def scenario_lines(doc: dict) -> list[str]:
    """The report's scenario, one item per line: replay and prediction, live rounds, each
    worker, the cache, an interruption."""
    n_live = doc.get("live_rounds")
    loop = "closed loop" if doc["closed_loop"] else "open loop (trace timestamps)"
    lines = [f"replay: {loop}, max in flight {doc['max_in_flight'] or 'unlimited'}; "
             f"prediction: profile `{doc['profile']}`, mean of {doc['sim_rounds']} seeded round(s)"]
    if n_live:
        lines.append(f"live: {n_live} rounds per policy, interleaved (every policy once per round); measured values "
                     f"are the rounds' means, checked against the prediction interval of the mean of {n_live} live "
                     "rounds" + ("; rounds cut short (named under each policy) are left out, and the interval is "
                                 "of the mean of the rounds left" if _any_cut(doc) else ""))
    lines += [f"worker {s['url']}: {s['model']}, vLLM {s['vllm_version']}{_async_text(s)}, {s['hardware']}, "
              f"block size {s['block_size']}, {s['num_gpu_blocks']} KV blocks" for s in doc["servers"]]
    lines.append(f"cache: {'WARM for some run (see notes)' if doc['warm_cache'] else 'reset before every run (cold)'}")
    if doc["interrupted"]:
        lines.append("**interrupted**: partial measurement")
    return lines


def _any_cut(doc: dict) -> bool:
    """Whether some policy has a live round cut short (report.json's ``rounds[].cut_short``)."""
    return any(r.get("cut_short") for p in doc["policies"].values() for r in p.get("rounds") or [])


def _interval_header(doc: dict) -> str:
    level = f"{100 * doc['interval_level']:g} %"
    n_live = doc.get("live_rounds")
    if n_live and _any_cut(doc):
        return f"{level} interval of the mean of the live rounds that ran whole"
    return f"{level} interval of " + (f"the mean of {n_live} live rounds" if n_live else "one live run")


def _yes_cell(flag, not_checked: str | None = None) -> Cell:
    """A yes/no cell (``-`` when undefined, ``not checked: <why>`` for a run cut short);
    :func:`markdown_table` bolds a "no"."""
    if not_checked is not None:
        return Cell(f"not checked: {not_checked}", numeric=False)
    return Cell("-" if flag is None else ("yes" if flag else "no"), numeric=False)


def _live_min_max(m: dict, fmt: Callable = _fmt) -> str:
    """The min - max of the live rounds in the mean (``live_rounds`` of them), or one value when
    they are equal: "0.812 in all 3 rounds" (it read "0.812 - 0.812"), "0.812 (one round)"."""
    low, high, n = _num(m.get("measured_min")), _num(m.get("measured_max")), m.get("live_rounds")
    if low is None or low != high:
        return _range([low, high], fmt)
    return f"{fmt(low)} (one round)" if n == 1 else f"{fmt(low)} in all {n} rounds"


def _live_range_cell(m: dict) -> Cell:
    """Whether the prediction lies in the live rounds' min-max; a "no" says on which side, with
    both numbers to four significant digits where three decimals would show them equal (a
    predicted 0.02652 s against a minimum of 0.02736 s both read 0.027)."""
    flag = m["predicted_inside_live_range"]
    cell = _yes_cell(flag)
    predicted, low, high = (_num(m.get(k)) for k in ("predicted", "measured_min", "measured_max"))
    if flag is not False or None in (predicted, low, high):
        return cell
    below = predicted < low
    edge = low if below else high
    text = f"no: {'below' if below else 'above'}"
    if _fmt(predicted) == _fmt(edge):
        text += f" ({predicted:.4g} {'<' if below else '>'} {edge:.4g})"
    return Cell(text, numeric=False)


def policy_tables(doc: dict, policy: str, p: dict) -> list[Table]:
    """One policy's tables: predicted against measured (each metric, then each worker's hit
    tokens; with several live rounds also the rounds' min-max, the 95 % interval of their mean
    and whether the prediction lies in their range), where the time goes, and, with the servers'
    KV-cache events, the later turns by convoy position (its stamp correction as the note)."""
    n_live = doc.get("live_rounds")
    header = ["metric", "predicted", "95 % interval of the prediction", _interval_header(doc),
              "measured (mean)" if n_live else "measured"]
    header += ["live min - max", "95 % interval of the live mean", "prediction in live range"] if n_live else []
    header += ["inside", "error %"]
    rows = []
    for key, m in p["metrics"].items():
        fmt = _count if key == "failed" else _fmt  # failed requests: a count
        live = [Cell(_live_min_max(m, fmt), {"low": m["measured_min"], "high": m["measured_max"]}),
                Cell(_range(m["measured_interval"] or [None, None], fmt)),
                _live_range_cell(m)] if n_live else []
        rows.append([m["label"], Cell(fmt(m["predicted"]) + _with_drift(m), {"predicted": m["predicted"]}),
                     Cell(_range(m["predicted_interval"], fmt)),
                     Cell(_range(m["run_interval"], fmt), {"low": m["run_interval"][0], "high": m["run_interval"][1]}),
                     Cell(fmt(m["measured"]), {"measured": m["measured"]}), *live, _yes_cell(m["inside"], m.get("not_checked")),
                     Cell(_error_text(m), {"error_pct": m["error_pct"]})])
    for w, row in p["workers"].items():
        h = row["hit_tokens"]
        rows.append([f"hit tokens, worker {w}" + ("" if row["alive"] else " (died)"),
                     Cell(_count(h["predicted"]), {"predicted": h["predicted"]}), Cell("-"), Cell("-"),
                     Cell(_count(h["measured"]), {"measured": h["measured"]}), *[Cell("-")] * (3 if n_live else 0),
                     Cell("-", numeric=False), Cell(_pct(h["error_pct"]), {"error_pct": h["error_pct"]})])
    tables = [Table(f"{policy}: predicted against measured", header, rows, table_id=f"policy-{policy}",
                    note=policy_line(doc, p))]
    times = [[row["label"], Cell(_fmt(row["predicted"], 4), {"predicted": row["predicted"]}),
              Cell(_fmt(row["measured"], 4), {"measured": row["measured"]}),
              Cell(_pct(row["error_pct"]), {"error_pct": row["error_pct"]})] for row in p["engine_times"].values()]
    tables.append(Table("Where the time goes, per request (s; measured engine times from vLLM's request histograms"
                        + (", mean of the rounds" if n_live else "") + ")", ["", "predicted", "measured", "error %"],
                        times, table_id=f"times-{policy}"))
    if p.get("convoys"):
        rows = [[Cell(str(c["position"])), Cell(str(c["count"])),
                 *(Cell(f"{_fmt(c['predicted_' + k], 4)} / {_fmt(c['measured_' + k], 4)}",
                        {"predicted": c["predicted_" + k], "measured": c["measured_" + k]})
                   for k in ("engine", "out", "ttft"))] for c in p["convoys"]]
        tables.append(Table("Later turns by position in their convoy (the requests of one turn that one worker got in "
                            "one round, in send order), split at the engine's first token (measured from the servers' "
                            "KV-cache events); s, predicted / measured",
                            ["position", "live requests", "send to engine first token", "engine to client first token",
                             "TTFT"], rows, table_id=f"convoys-{policy}", note=_convoy_note(p)))
    return tables


def _convoy_note(p: dict) -> str:
    """The convoy table's stamp correction and stamp note, in words ('' without either)."""
    out = []
    fix = p.get("convoys_stamp_correction")
    if fix and (fix["num_corrected"] or fix["uncorrected"]):
        by = ", ".join(f"{k} by {e.replace('_', ' ')}" for e, k in fix["corrected"].items()) or "none"
        out.append(f"Engine first tokens: of the {fix['timed']} KV-event stamps ({fix['stamp']}), "
                   f"{fix['as_stamped']} marked the end of the prefill step, {fix['num_corrected']} were early "
                   f"and moved to it ({by}) and {fix['uncorrected']} were left as stamped (no estimate).")
    if p.get("convoys_note"):
        out.append(f"Note: {p['convoys_note']}.")
    return "\n\n".join(out)


def changes_table(doc: dict) -> Table | None:
    """The change of each metric from the first policy to each other one: predicted, its
    interval, measured (with several live rounds, the change of the round means and the 95 %
    interval over paired rounds), inside, and the difference in percentage points; None with
    one policy."""
    if not doc["changes"]:
        return None
    n_live = doc.get("live_rounds")
    header = ["metric", "policy", "predicted", _interval_header(doc),
              "measured (change of the round means)" if n_live else "measured"]
    header += ["95 % interval over paired rounds"] if n_live else []
    header += ["inside", "difference (pp)"]
    rows = []
    for policy, ch in doc["changes"].items():
        for c in ch.values():
            diff = _num(c["difference_pp"])
            unit = c.get("unit", "%")
            paired = [Cell(_pct_range(c["measured_interval"], unit))] if n_live else []
            rows.append([c["label"], policy, Cell(_pct(c["predicted"], unit), {"predicted": c["predicted"]}),
                         Cell(_pct_range(c["run_interval"], unit), {"low": c["run_interval"][0],
                                                                    "high": c["run_interval"][1]}),
                         Cell(_pct(c["measured"], unit), {"measured": c["measured"]}), *paired, _yes_cell(c["inside"], c.get("not_checked")),
                         Cell("-" if diff is None else f"{diff:+.1f}", {"value": diff})])
    return Table(f"Change vs {next(iter(doc['policies']))}", header, rows, table_id="changes",
                 note=_cut_pairs_text(doc))


def _cut_pairs_text(doc: dict) -> str:
    """The pairs of live rounds the changes leave out, as a side was cut short, per policy
    ('' when none was)."""
    out = []
    base = next(iter(doc["policies"]))
    for policy, ch in doc["changes"].items():
        first = next(iter(ch.values()))
        left = first.get("left_out") or []
        if left:
            whole = len(first["measured_rounds"]) - len(left)
            out.append(f"{policy} left out {_rounds_text(left)}, "
                       + (f"{whole} pair(s) counted" if whole else
                          "no pair whole, so its changes are over every pair and not checked"))
    return (f"Each change pairs live round i of a policy with live round i of {base} and counts the pairs whole on "
            "both sides: " + "; ".join(out) + ".") if out else ""


def markdown_table(table: Table) -> list[str]:
    """``table`` as Markdown lines: header, alignment (text left, numbers right, yes/no centred,
    as the first row's cells are) and rows; a "no" in a yes/no cell is bold."""
    def text(cell) -> str:
        if isinstance(cell, str):
            return cell
        return (f"**{cell.text}**" if not cell.numeric and (cell.text == "no" or cell.text.startswith("no:"))
                else cell.text)

    def align(cell) -> str:
        return "---" if isinstance(cell, str) else ("---:" if cell.numeric else ":---:")

    first = table.rows[0] if table.rows else [""] * len(table.header)
    lines = ["| " + " | ".join(table.header) + " |", "|" + "|".join(align(c) for c in first) + "|"]
    return lines + ["| " + " | ".join(text(c) for c in row) + " |" for row in table.rows]


def coverage_text(doc: dict) -> str:
    """The report's closing paragraph: how many measured values fall inside their prediction
    interval, and what each interval is of and made of (``docs/reference/intervals.md``)."""
    k, n = doc["inside_interval"]["inside"], doc["inside_interval"]["checked"]
    level = f"{100 * doc['interval_level']:g} %"
    n_live = doc.get("live_rounds")
    parts = [f"the spread of {doc['sim_rounds']} seeded simulation round(s)"
             + (f" on the central profile and on each of {doc['uncertainty_draws']} profiles drawn from the fit's "
                "uncertainty" if doc["uncertainty_draws"] else "")]
    if doc.get("run_to_run_prior"):
        parts.append(f"where larger, the host's run-to-run prior for one live round (log sd {doc['run_to_run_prior']:g} "
                     "for times; for changes, both policies moving by it; --run-to-run-prior)")
    else:
        parts.append("where larger, the live rounds' own spread")
    if doc.get("drift"):
        reference = ("the probe after calibrating" if doc.get("probe_reference") == "calibration"
                     else f"{doc['profile']}'s prediction of the probe")
        drifts = ", ".join(f"{q} x{d['factor']:.3f}, log sd {d['log_sd']:.3f}" for q, d in doc["drift"].items())
        parts.append(f"for times, the host's speed drift from the probes against {reference} ({drifts}), which "
                     "also moves the interval's centre to the prediction times the drift, given beside the prediction "
                     "as (xF drift: value)")
    heldout = doc.get("heldout_log_sd") or {}
    if heldout and any(_term(m["interval_terms"], "heldout_var") for m in _time_metrics(doc)):
        rms = math.sqrt(sum(x * x for x in heldout.values()) / len(heldout))
        parts.append("for times, the fit's error on the experiments it held out (log sd "
                     + ", ".join(f"{sd:.2f} {kind.upper()}" for kind, sd in heldout.items())
                     + (f"; their rms, {rms:.2f}, for the other times" if len(heldout) > 1 else "") + ")")
    of = ("one live run" if not n_live else f"the mean of {n_live} live rounds" if not _any_cut(doc)
          else f"the mean of the live rounds it counts (of the {n_live} run, those cut short are left out)")
    text = (f"{k} of {n} measured values fall inside their {level} prediction interval. Each interval is of {of} "
            "and combines " + "; ".join(parts) + " (docs/reference/intervals.md).")
    return " ".join([text, *_unchecked_text(doc), *_width_text(doc), *_live_range_text(doc)])


def _unchecked_text(doc: dict) -> list[str]:
    """How many values have no interval (none of its terms gave a spread, e.g. a hit rate with
    one simulated round), the failed-request counts aside, which are never checked."""
    missing = [m for p in doc["policies"].values() for key, m in p["metrics"].items()
               if m.get("inside") is None and key not in UNCHECKED_METRICS]
    missing += [c for ch in doc["changes"].values() for c in ch.values() if c.get("inside") is None]
    cut = [m for m in missing if m.get("not_checked")]
    unmeasured = [m for m in missing if not m.get("not_checked") and "measured" in m and m["measured"] is None]
    missing = [m for m in missing if not m.get("not_checked") and not ("measured" in m and m["measured"] is None)]
    out = []
    if cut:
        why = sorted({m["not_checked"] for m in cut})
        run = ("every live round (for a change, every pair of rounds) behind them was cut short"
               if doc.get("live_rounds") else "their live run was cut short")
        out.append(f"{len(cut)} value(s) were not checked, as {run} ({'; '.join(why)}) while "
                   "the prediction is of the whole trace on every worker; they are not counted.")
    fewer = [m for p in doc["policies"].values() for m in p["metrics"].values() if m.get("left_out")]
    fewer += [c for ch in doc["changes"].values() for c in ch.values() if c.get("left_out")]
    fewer = [m for m in fewer if m.get("inside") is not None]
    if fewer:
        out.append(f"{len(fewer)} value(s) are checked over the live rounds that ran whole only, the rounds cut short "
                   "(named under each table) left out, each against the interval of the mean of the rounds left.")
    if unmeasured:
        out.append(f"{len(unmeasured)} value(s) were not measured (no request of that run was served, see the "
                   "notes); they are not counted.")
    if missing:
        out.append(f"{len(missing)} more value(s) have no interval, as no term gives them a spread (with --rounds 1, "
                   "a share the seeds do not move); they are not counted.")
    return out


#: What each variance term of ``interval_terms`` is, in words (``combined_interval``'s parts).
TERM_NAMES = {
    "run_to_run": "the live rounds' spread",
    "run_to_run_prior": "the host's run-to-run prior",
    "prediction_seeds": "the seeds' spread",
    "run_to_run_and_prediction_seeds": "the seeds' spread",
    "model": "the drawn profiles' spread",
    "drift_var": "the host's speed drift",
    "heldout_var": "the fit's held-out error",
}
#: Median high / low of the time intervals above which the report calls them wide.
WIDE_TIME_RATIO = 3.0


def _time_metrics(doc: dict) -> list[dict]:
    """Every policy's checked time and rate metrics (``drift_exponent`` not 0: log-space
    intervals), with both ends of the interval > 0."""
    return [m for p in doc["policies"].values() for key, m in p["metrics"].items()
            if drift_exponent(key) and m.get("inside") is not None and None not in m["run_interval"]
            and m["run_interval"][0] > 0]


def _width_text(doc: dict) -> list[str]:
    """How wide the intervals are (median high / low of the times, median width of the changes, pp)
    and, past :data:`WIDE_TIME_RATIO`, which term makes most of the times' width."""
    import statistics

    times = _time_metrics(doc)
    changes = [c for ch in doc["changes"].values() for c in ch.values()  # in percent: a share's is in pp
               if c.get("inside") is not None and None not in c["run_interval"] and c.get("unit", "%") == "%"]
    if not times:
        return []
    ratio = statistics.median(m["run_interval"][1] / m["run_interval"][0] for m in times)
    text = f"Median width: x{ratio:.2f} (high / low) for times"
    if changes:
        text += f", {statistics.median(c['run_interval'][1] - c['run_interval'][0] for c in changes):.0f} pp for changes"
    text += "."
    if ratio > WIDE_TIME_RATIO:
        largest = Counter(max(TERM_NAMES, key=lambda t: _term(m["interval_terms"], t)) for m in times).most_common(1)
        text += (f" These intervals are wide, mostly from {TERM_NAMES[largest[0][0]]}: a value inside one says little "
                 "(the prediction's own distance from the measurement is the error column)")
        text += "." if largest[0][0] != "heldout_var" else (
            "; that is the profile's error on its own sweep's held-out experiments: one from a quick sweep "
            "narrows with a full one (kvroute calibrate measure, then fit), one from a full sweep does not.")
    return [text]


def _term(terms: dict, name: str) -> float:
    value = terms.get(name)
    return value if isinstance(value, float) and math.isfinite(value) else 0.0


def _live_range_text(doc: dict) -> list[str]:
    """With several live rounds: how many predictions lie within the live rounds' min-max."""
    flags = [m.get("predicted_inside_live_range") for p in doc["policies"].values() for m in p["metrics"].values()
             if m.get("inside") is not None]
    flags = [f for f in flags if f is not None]
    if not doc.get("live_rounds") or not flags:
        return []
    return [f"The prediction itself lies within the live rounds' min - max for {sum(flags)} of {len(flags)} values."]


def _pct_range(pair, unit: str = "%") -> str:
    lo, hi = (_num(x) for x in pair or (None, None))
    return "-" if lo is None or hi is None else f"{_pct(lo, unit)} - {_pct(hi, unit)}"


def write_report(v: Validation, out_dir: str | Path, figure_formats=("png",), provenance: dict | None = None) -> Path:
    """Replace what an earlier validation wrote into ``out_dir`` (:data:`OUTPUT_FILES` and
    ``ttft_*`` figures; other files stay) with ``report.json``, ``report.md``, ``records_live.parquet`` (with a ``live_round``
    column for several live rounds), ``records_sim.parquet``, ``ttft_<policy>.<format>`` (every
    live round's requests; plus ``ttft_all.<format>`` for several policies; prediction and
    measurement in the policy's colour, solid and dashed) and ``report.html`` (one self-contained
    page: :func:`report_page`) into ``out_dir``; with ``record_tokens``, also every output token's
    arrival time, ``tokens_live.parquet`` and ``tokens_sim.parquet``
    (``kvroute.sim.cluster.metrics.TOKEN_COLUMNS`` plus policy and round).
    ``provenance`` (the command's resolved options, kvroute's version, the profile's and trace's
    hashes: ``kvroute.cli.validate_command``) is kept in ``report.json`` and shown on the page.

    Returns:
        The path of ``report.json``.
    """
    from kvroute.sim.study.figure_style import policy_colors, save_figure, scenario_title
    from kvroute.sim.study.plots import ttft_figure
    from kvroute.sim.study.report import write_report as write_page

    doc = report_dict(v)
    out = _start_report(out_dir, doc, provenance)
    write_text_atomic(out / "report.md", report_markdown(v, doc))
    _write_live(v, out)
    groups = v.policy_rounds()
    sim = [run.records.assign(policy=p, round=k) for p, rs in groups.items() for k, run in enumerate(rs[0].sim_runs)]
    if sim:
        _parquet(pd.concat(sim, ignore_index=True), out / "records_sim.parquet")
    sim_tokens = [run.tokens.assign(policy=p, round=k) for p, rs in groups.items() for k, run in enumerate(rs[0].sim_runs)
                  if run.tokens is not None]
    if sim_tokens:
        _parquet(pd.concat(sim_tokens, ignore_index=True), out / "tokens_sim.parquet")
    both, figures = [], []
    colors = policy_colors(groups)
    scenario = scenario_line(doc)
    for policy, runs in groups.items():
        frames = [run.records.assign(policy=f"{policy} predicted") for run in runs[0].sim_runs]
        frames += [r.live.records.assign(policy=f"{policy} measured") for r in runs
                   if r.live is not None and (r.live.records["status"] == "ok").any()]
        frame = pd.concat(frames, ignore_index=True)
        both.append(frame)
        title = scenario_title(scenario, [policy], f"{policy}: predicted (solid) vs measured (dashed)")
        fig = ttft_figure(frame, title, colors)
        save_figure(fig, out / f"ttft_{policy}", figure_formats)
        figures.append((f"TTFT of {policy}, predicted (solid) and measured (dashed)", fig))
    if len(both) > 1:
        fig = ttft_figure(pd.concat(both, ignore_index=True),
                          scenario_title(scenario, list(groups), "predicted (solid) vs measured (dashed)"), colors)
        save_figure(fig, out / "ttft_all", figure_formats)
        figures.insert(0, ("TTFT of every policy, predicted (solid) and measured (dashed)", fig))
    write_page(report_page(doc, figures), out / "report.html")
    return out / "report.json"


OUTPUT_FILES = ("report.json", "report.md", "report.html", "records_live.parquet", "records_sim.parquet",
                "tokens_live.parquet", "tokens_sim.parquet")
"""What a validation writes into its directory, besides its figures ``ttft_*.{png,pdf,svg}``."""


def _start_report(out_dir: str | Path, doc: dict, provenance: dict | None) -> Path:
    """Make ``out_dir``, clear what an earlier validation wrote there (:func:`_clear_earlier`)
    and write ``doc`` as ``report.json``, with ``provenance`` (what produced it: the command's
    options, kvroute's version, the inputs' hashes) when given; returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _clear_earlier(out)
    if provenance:
        doc["provenance"] = provenance
    write_text_atomic(out / "report.json", json.dumps(doc, indent=2, default=str) + "\n")
    return out


def _clear_earlier(out: Path) -> None:
    """Remove what an earlier validation wrote into ``out`` (:data:`OUTPUT_FILES` and its
    figures), so that no figure or table of another run stays beside this one's report; other
    files stay."""
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    for ext in ("png", "pdf", "svg"):
        for figure in out.glob(f"ttft_*.{ext}"):
            figure.unlink(missing_ok=True)


def _write_live(v: Validation, out: Path) -> None:
    """``records_live.parquet`` (with ``policy``, ``url`` and, for several live rounds,
    ``live_round``) and, where token times were kept, ``tokens_live.parquet``."""
    multi = _multi(v)
    live = [r.live.records.assign(policy=r.policy, url=r.live.records["worker"].map(
        lambda w: v.servers[w].url if 0 <= w < len(v.servers) else None),
        **({"live_round": r.live_round} if multi else {})) for r in v.runs if r.live is not None]
    if live:
        _parquet(pd.concat(live, ignore_index=True), out / "records_live.parquet")
    tokens = [r.live.tokens.assign(policy=r.policy, **({"live_round": r.live_round} if multi else {}))
              for r in v.runs if r.live is not None and r.live.tokens is not None]
    if tokens:
        _parquet(pd.concat(tokens, ignore_index=True), out / "tokens_live.parquet")


def write_measured_only(v: Validation, out_dir: str | Path, provenance: dict | None = None) -> Path:
    """Replace what an earlier validation wrote into ``out_dir`` (as :func:`write_report`) with
    what a validation interrupted before its prediction measured (``v.predicted`` False): ``report.json`` (:func:`~kvroute.calibrate.validation.validate_report.measured_only_dict`),
    ``report.md`` (one table of every live run's measured values, then the notes),
    ``records_live.parquet`` and, with token times, ``tokens_live.parquet``.

    Returns:
        The path of ``report.json``.
    """
    doc = measured_only_dict(v)
    out = _start_report(out_dir, doc, provenance)
    lines = [f"# Validation, measured only: {doc['trace']} ({doc['num_requests']} requests)", "",
             "Interrupted before the prediction was made: what the live runs measured is kept here and in "
             "records_live.parquet; nothing is compared.", ""]
    if doc.get("live_rounds"):
        lines.append(f"- live: {doc['live_rounds']} rounds per policy, interleaved (every policy once per round)")
    lines += [f"- {line}" for line in scenario_lines(doc) if not line.startswith(("replay:", "live:"))]
    header = ["metric", *(run["policy"] + (f", live round {run['live_round'] + 1}" if _multi(v) else "")
                          for run in doc["runs"])]
    rows = [[SUMMARY_METRICS[m], *(Cell(_count(run["measured"][m]) if m == "failed" else _fmt(run["measured"][m]))
                                   for run in doc["runs"])]
            for m in REPORT_METRICS]
    lines += ["", "## Measured", ""] + markdown_table(Table("measured", header, rows))
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    write_text_atomic(out / "report.md", "\n".join(lines) + "\n")
    _write_live(v, out)
    return out / "report.json"


def scenario_line(doc: dict) -> str:
    """The validation's scenario in one line: trace, requests, workers, profile, replay."""
    loop = "closed loop" if doc["closed_loop"] else "open loop"
    return (f"trace {doc['trace']}: {doc['num_requests']} requests | {doc['num_workers']} live worker(s) | "
            f"profile {doc['profile']} | {loop} replay")


def report_page(doc: dict, figures: list) -> "Report":
    """``report.html``'s content from ``report.json``'s dict: report.md's scenario and tables
    (:func:`scenario_lines`, :func:`policy_tables` with :func:`policy_line` under each policy's
    first table, :func:`changes_table`; cells carry ``data-predicted``, ``data-measured``,
    ``data-error_pct``), the figures, the coverage paragraph and the notes."""
    tables = []
    for policy, p in doc["policies"].items():
        first, *more = policy_tables(doc, policy, p)
        tables += [first] + [dataclasses.replace(t, caption=f"{policy}: {t.caption}") for t in more]
    changes = changes_table(doc)
    if changes is not None:
        tables.append(changes)
    scalars = {k: v for k, v in doc.items() if not isinstance(v, (dict, list))}
    if doc.get("provenance"):
        scalars["provenance"] = doc["provenance"]
    return Report(title=f"kvroute validate: {', '.join(doc['policies'])}",
                  scenario=[f"trace {doc['trace']}: {doc['num_requests']} requests",
                            f"policies {', '.join(doc['policies'])}",
                            *(line.replace("`", "").replace("**", "") for line in scenario_lines(doc))],
                  tables=tables, figures=figures, notes=[coverage_text(doc), *doc["notes"]],
                  provenance=json.dumps(scalars, indent=2, default=str),
                  files=["report.json", "report.md", "records_live.parquet", "records_sim.parquet"])


def _parquet(frame: pd.DataFrame, path: Path) -> None:
    frame = frame.copy()
    for col in ("session_id", "error", "url"):
        if col not in frame:
            continue
        values = frame[col].dropna()
        if len({type(x) for x in values}) > 1:  # mixed ints and strings: store as text
            frame[col] = frame[col].map(lambda x: None if pd.isna(x) else str(x))
    with atomic_output(path) as tmp:
        frame.to_parquet(tmp, index=False)
