"""The validation report as data: ``report.json``'s dict (:func:`report_dict`), which
``validate_render`` turns into ``report.md`` and ``report.html``.

Every compared quantity is a ``{"predicted": p, "measured": m, "error_pct": e}`` mapping with
``e = 100 (p - m) / m`` (null when undefined), so a reader can find the pairs generically
(``notebooks/05_validation.ipynb`` does).

Each measured value (one live run) is also checked against a prediction interval of one simulated
run at ``ValidationSpec.interval_level`` (90 % by default; ``run_interval``, ``inside`` and its
``interval_terms``), combining the seeds', the drawn profiles' and the live rounds' spread and the
host's speed drift (``kvroute.sim.study.intervals.combined_interval``;
``docs/reference/intervals.md``); ``coverage`` counts the values inside. Where the drift moves the
interval's centre, a time also gives ``drift_factor``, ``predicted_with_drift`` and
``error_pct_with_drift`` (the error against that centre). The failed-request count is compared
but not checked (``UNCHECKED_METRICS``). A live round cut short (interrupted, or a worker died
during it; :func:`cut_short`) is not the whole trace on every worker the prediction is of, so it
is left out of the checked means (:func:`round_values`, :func:`round_changes`; below); when no
round (or, for a change, no pair of rounds) ran whole, the value is the mean of every round and
keeps its interval but is not checked: ``inside`` is null and ``not_checked`` says why. A run
with no request served measures nothing (its values are null). Before that rule it was
the 95 % normal-theory interval of the simulated runs' values
(``kvroute.sim.study.experiment.prediction_interval``): the seeds' spread alone, or seeds and model
when ``validate --uncertainty N`` drew N profiles from the profile's coefficient uncertainty.
Changes between policies are checked the same way, pairing the simulated runs seed by seed; a
change is in percent, a share's (the hit rate) in percentage points (``unit``; :func:`change_of`).

With ``validate --live-rounds N`` (N >= 2) every measured value is the mean over the K live rounds
that ran whole (``kvroute.calibrate.validation.rounds``), checked against the prediction interval
of the mean of K runs (the live rounds' spread from two whole rounds on, the host prior with one),
and each metric also gives ``live_rounds`` (K, the rounds in the mean), ``measured_rounds`` (every
round's value, those cut short too), ``left_out`` (per round cut short, ``{"live_round", "why"}``),
``measured_min``, ``measured_max``, ``measured_interval`` (95 % Student-t interval of the mean
from 3 rounds on, else null) and ``predicted_inside_live_range`` (min <= predicted <= max; null
with one round in the mean, which has no range); min,
max and that interval are of the rounds in the mean, so a round cut short moves none of them. A
change is that of the round means over the pairs of rounds (round ``i`` of the policy, round ``i``
of the base) whole on both sides; ``measured_rounds`` holds every pair's change, ``left_out`` the
pairs with a side cut short, and ``measured_interval`` the 95 % Student-t interval of the counted
pairs' mean. Per-policy counts (failures, errors, dead workers) add up every round, and the
``failed`` metric (never checked) is the mean over every round; ``workers``
(hit and query tokens, requests, preemptions), ``live_wall_time_s`` and ``client_cpu_share`` are
means over the rounds in the metrics' means (the whole trace, as predicted); ``rounds`` lists each
round's cache reset, dead workers, wall time and ``cut_short`` (why, or null). With one live round (the default) every measured value is
that round's, none of these per-round fields is written, and a note says that one round of a
short burst can be off by tens of percent.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.calibrate.calibration.step_end import merge
from kvroute.calibrate.validation.engine_times import convoy_rows, engine_rows, stamp_note
from kvroute.calibrate.validation.rounds import error_pct, finite, mean_interval, spread
from kvroute.calibrate.validation.validate import (SILENT_BEFORE_THE_RUN, PolicyRun, Validation, send_lags,
                                                   servers_of_another_model)
from kvroute.sim.timing.heldout import heldout_log_sd, heldout_spreads
from kvroute.sim.study.experiment import prediction_interval
from kvroute.sim.study.intervals import combined_interval, coverage, prior_sd_for, within
from kvroute.sim.timing.drift import drift_exponent, metric_drift
from kvroute.sim.cluster.metrics import SHARE_METRICS, SUMMARY_METRICS, change_bounds, change_of

#: Metrics of the per-policy table, in order.
REPORT_METRICS = (
    "time_to_complete_s", "ttft_mean_s", "ttft_p90_s", "later_ttft_mean_s", "later_ttft_p90_s",
    "itl_mean_s", "tpot_mean_s", "e2e_mean_s", "hit_rate", "failed",
)
#: Metrics compared but given no prediction interval, so not counted in the coverage: a live
#: request fails for the server's or the network's reasons (a dead server, a timeout), which the
#: simulation does not model; its "0 failed = 0 predicted" is no evidence for the prediction.
UNCHECKED_METRICS = ("failed",)
#: Metrics of the change-between-policies table.
CHANGE_METRICS = ("time_to_complete_s", "ttft_mean_s", "ttft_p90_s", "later_ttft_mean_s", "itl_mean_s", "hit_rate")
MAX_LISTED_FAILURES = 200
#: The report's note with two live rounds per policy and a host prior set (it applies to one).
TWO_ROUNDS_NOTE = (
    "two live rounds per policy: each interval's run-to-run term is the two rounds' own spread, one degree of "
    "freedom per metric, so the intervals are wide and their width is itself uncertain; --run-to-run-prior "
    "applies to one live round only; 3 or more rounds give a steadier spread")
#: The report's note when each policy ran live once.
ONE_ROUND_NOTE = (
    "one live round per policy: a short burst's live timings vary a lot from round to round on a shared "
    "machine (on 2 CPU vLLM servers the same 8-chat x 4-turn burst of round_robin completed in 1.44 s in one "
    "round and 2.11 s in the next, and one worker's TPOT was 2-3x the other's, the slow worker changing "
    "between rounds), so a single round can be off by tens of percent and a change between policies "
    "measured from single rounds is mostly noise; pass --live-rounds 3 or more for bursts shorter than a "
    "minute")


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def _pair(predicted: float, measured: float) -> dict:
    return {"predicted": _num(predicted), "measured": _num(measured), "error_pct": _num(error_pct(predicted, measured))}


def _inside(values, measured, future: int = 1) -> dict:
    """``run_interval`` (95 % prediction interval of one run from ``values``, or of the mean of
    ``future`` runs) and whether ``measured`` falls inside it (None when either is undefined)."""
    lo, hi = prediction_interval(values, future=max(future, 1)) if len(values) else (math.nan, math.nan)
    m = _num(measured)
    inside = within(m, lo, hi)
    return {"run_interval": [_num(lo), _num(hi)], "inside": inside}


def metric_interval(pred: PolicyRun, metric: str, live_values, *, level: float, drifts: dict | None = None,
                    profile_raw: dict | None = None, run_log_sd: float = 0.0):
    """The ``level`` prediction interval of the mean of the live rounds ``live_values`` of
    ``metric`` under ``pred``'s policy (``kvroute.sim.study.intervals.combined_interval``): the
    simulated runs' spread (``pred.run_values``, grouped by ``pred.run_draws``), the live rounds'
    spread, for time measures the host's drift ``drifts`` from the speed probes (``{}``: none)
    and the fit's held-out error from the profile document ``profile_raw``
    (``kvroute.sim.timing.heldout``), and with one live round the host prior ``run_log_sd`` (log
    sd of one live run; ``prior_sd_for``). Clipped to the metric's possible values.

    Raises:
        ValueError: as ``combined_interval`` (``level`` outside (0, 1)).
    """
    from kvroute.sim.cluster.metrics import METRIC_BOUNDS

    sim = pred.run_values.get(metric, [])
    draws = getattr(pred, "run_draws", None) or None
    if draws is not None and len(draws) != len(sim):
        draws = None
    power = drift_exponent(metric)
    return combined_interval(sim, draws, finite(live_values), metric_drift(metric, drifts or {}), power, level,
                             log_scale=power != 0, bounds=METRIC_BOUNDS.get(metric, (-math.inf, math.inf)),
                             heldout_log_sd=heldout_log_sd(profile_raw or {}, metric),
                             prior_sd=prior_sd_for(metric, run_log_sd))


def simulated_changes(base: PolicyRun, other: PolicyRun, metric: str) -> tuple[list[float], list[int] | None]:
    """The simulated change of ``metric`` from ``base``'s policy to ``other``'s, run by run
    (:func:`change_of`; the runs paired seed by seed, dropping pairs with a missing value), and
    the drawn profile of each (``other.run_draws``; None when the runs carry none)."""
    change = change_of(metric)
    b, o = base.run_values.get(metric, []), other.run_values.get(metric, [])
    keep = [i for i, (x, y) in enumerate(zip(b, o)) if x is not None and y is not None]
    changes = [change(o[i], b[i]) for i in keep]
    draws = getattr(other, "run_draws", None)
    return changes, ([draws[i] for i in keep] if draws and len(draws) == len(o) else None)


def change_interval(base: PolicyRun, other: PolicyRun, metric: str, live_changes, *, level: float,
                    run_log_sd: float = 0.0):
    """The ``level`` prediction interval of the mean of the live rounds' changes
    ``live_changes`` of ``metric`` from ``base``'s policy to ``other``'s (percent, a share's in
    pp): the paired simulated changes' spread (:func:`simulated_changes`) and the live rounds'
    spread, in linear space without drift, with one live round the host prior ``run_log_sd`` at
    the simulated mean change (``change_prior_sd``), clipped to :func:`change_bounds`.

    Raises:
        ValueError: as ``combined_interval``.
    """
    sim, draws = simulated_changes(base, other, metric)
    predicted = float(np.mean(finite(sim))) if finite(sim) else math.nan
    return combined_interval(sim, draws, finite(live_changes), level=level, log_scale=False,
                             bounds=change_bounds(metric), prior_sd=prior_sd_for(metric, run_log_sd, predicted))


def _combined_inside(v: Validation, pred: PolicyRun, metric: str, live_values: list, measured,
                     base: PolicyRun | None = None) -> dict:
    """``run_interval``: the ``spec.interval_level`` interval of the live rounds' mean
    (:func:`metric_interval`; with ``base``, of the change from ``base``'s policy,
    :func:`change_interval`, ``live_values`` then the live rounds' changes); ``inside``:
    whether ``measured`` falls in it; ``interval_terms``: its variance terms; for a time whose
    interval the drift moved, the drifted centre and the error against it."""
    level = getattr(v.spec, "interval_level", 0.90)
    prior = getattr(v.spec, "run_to_run_prior", 0.0)
    try:
        if base is not None:
            ci = change_interval(base, pred, metric, live_values, level=level, run_log_sd=prior)
        else:
            ci = metric_interval(pred, metric, live_values, level=level, drifts=getattr(v, "drift", None),
                                 profile_raw=v.sim_spec.profile.raw, run_log_sd=prior)
    except ValueError:
        return {"run_interval": [None, None], "inside": None}
    terms = {k: (_num(x) if isinstance(x, float) else x) for k, x in ci.parts.items()}
    out = {"run_interval": [_num(ci.low), _num(ci.high)], "inside": ci.contains(_num(measured)),
           "interval_terms": terms}
    power = 0 if base is not None else drift_exponent(metric)
    factor = ci.parts.get("drift_factor", 1.0)
    if power and factor != 1.0 and _num(pred.predicted.get(metric)) is not None:
        # the interval is centred on the prediction at the host's drifted speed: say so beside it
        drifted = pred.predicted[metric] * factor ** power
        out["drift_factor"] = _num(factor ** power)
        out["predicted_with_drift"] = _num(drifted)
        out["error_pct_with_drift"] = _num(error_pct(drifted, _num(measured)))
    return out


def inside_count(doc: dict) -> tuple[int, int]:
    """(measured values inside their interval, values checked) over every metric and change."""
    flags = [m["inside"] for p in doc["policies"].values() for m in p["metrics"].values()]
    flags += [c["inside"] for ch in doc["changes"].values() for c in ch.values()]
    checked = [f for f in flags if f is not None]
    return sum(checked), len(checked)


def worker_rows(run: PolicyRun) -> list[dict]:
    """Per worker: predicted and measured hit and query tokens, requests, liveness.

    Measured hit tokens are ``/metrics`` deltas; where a scrape is missing (a dead server) the
    sum of the usage's cached tokens stands in, and ``hit_source`` says which was used.
    """
    pred_hits = run.predicted_counter("prefix_cache_hits")
    pred_queries = run.predicted_counter("prefix_cache_queries")
    workers = run.live.workers if run.live is not None else pd.DataFrame()
    rows = []
    for w, ph in enumerate(pred_hits):
        live = workers.iloc[w].to_dict() if w < len(workers) else {}
        hits, source = _num(live.get("prefix_cache_hits")), "metrics"
        if hits is None and live:
            hits, source = float(live["usage_cached_tokens"]), "usage"
        rows.append({
            "worker": w,
            "url": live.get("url"),
            "alive": bool(live.get("alive", True)),
            "requests": int(live.get("requests", 0)),
            "hit_tokens": _pair(ph, math.nan if hits is None else hits),
            "query_tokens": _pair(pred_queries[w], live.get("prefix_cache_queries", math.nan)),
            "usage_cached_tokens": int(live.get("usage_cached_tokens", 0)),
            "preemptions": _num(live.get("num_preemptions")),
            "hit_source": source,
        })
    return rows


def failures(run: PolicyRun, multi: bool = False) -> list[dict]:
    """The live run's failed requests: request, session, turn, worker, error (and, with
    ``multi``, the live round)."""
    if run.live is None:
        return []
    df = run.live.records
    bad = df[df["status"] != "ok"]
    extra = {"live_round": run.live_round} if multi else {}
    return [
        {"policy": run.policy, **extra, "request_id": int(r.request_id),
         "session_id": None if pd.isna(r.session_id) else r.session_id,
         "turn": None if pd.isna(r.turn) else int(r.turn), "worker": int(r.worker), "error": r.error}
        for r in bad.itertuples()
    ]


def _multi(v: Validation) -> bool:
    """Whether the report gives several live rounds per policy (``--live-rounds`` >= 2)."""
    return v.spec.live_rounds > 1


def cut_short(runs: list[PolicyRun]) -> str | None:
    """Why the live runs ``runs`` are not the whole trace on every worker the prediction is of
    (interrupted, or a worker died during one), or None: their values are then not checked."""
    why = ["interrupted"] if any(r.interrupted for r in runs) else []
    dead = sorted({w for r in runs for w in r.dead})
    if dead:
        why.append(f"worker{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died")
    return ", ".join(why) or None


@dataclass(frozen=True, slots=True)
class CheckedRounds:
    """The live rounds a measured value is the mean of and is checked over (:func:`round_values`,
    :func:`round_changes`): the rounds that ran whole, the ones cut short (:func:`cut_short`) left
    out; every round when none ran whole, and then the value is not checked.

    Attributes:
        values: per round counted, the metric's value (s, a share, a count; a change between
            policies: per pair of rounds, percent or for a share pp); non-finite when not measured.
        measured: the checked value: the mean of the finite ``values`` (a change: the change of
            the counted pairs' round means); NaN without one.
        left_out: per round left out, ``{"live_round": r, "why": reason}`` (``r`` from 0, as
            ``rounds`` in report.json; a change's reason names the policy cut short).
        not_checked: why nothing is checked (no round, or no pair of rounds, ran whole; the
            reasons of every round), else None.
        runs: the rounds counted, parallel to ``values`` (a change's: ``(base round, round)``
            pairs).
    """

    values: list[float]
    measured: float
    left_out: list[dict]
    not_checked: str | None
    runs: list


def whole_rounds(runs: list[PolicyRun]) -> tuple[list[PolicyRun], list[dict]]:
    """Of one policy's live rounds ``runs``, those that ran whole, and per round cut short
    ``{"live_round": r, "why": reason}`` (:func:`cut_short`)."""
    cut = [(r, cut_short([r])) for r in runs]
    return [r for r, why in cut if why is None], [{"live_round": r.live_round, "why": why} for r, why in cut if why]


def whole_pairs(base: list[PolicyRun], runs: list[PolicyRun]) -> tuple[list[tuple[PolicyRun, PolicyRun]], list[dict]]:
    """The pairs (round ``i`` of ``base``'s policy, round ``i`` of ``runs``') in which both
    rounds ran whole, and per pair left out ``{"live_round": r, "why": "<policy>: <reason>"}``
    (every side cut short, ``; ``-separated). A round without a partner (its policy's round
    ``i`` never ran, after an interruption) is in no pair."""
    whole, left = [], []
    for b, r in zip(base, runs):
        why = [f"{x.policy}: {reason}" for x in (b, r) if (reason := cut_short([x]))]
        if why:
            left.append({"live_round": r.live_round, "why": "; ".join(why)})
        else:
            whole.append((b, r))
    return whole, left


def round_values(runs: list[PolicyRun], metric: str) -> CheckedRounds:
    """``metric`` over one policy's live rounds ``runs``, as checked: the whole rounds' values
    and their mean, the rounds cut short left out; with no round whole, every round's, not
    checked (``not_checked``: :func:`cut_short` of them all)."""
    whole, left = whole_rounds(runs)
    counted = whole or list(runs)
    values = [r.measured.get(metric, math.nan) for r in counted]
    return CheckedRounds(values, spread(values)["mean"], left, None if whole else cut_short(runs), counted)


def round_changes(base: list[PolicyRun], runs: list[PolicyRun], metric: str) -> CheckedRounds:
    """The change of ``metric`` from ``base``'s policy to ``runs``' (:func:`change_of`) over
    their live rounds paired round ``i`` with round ``i``, as checked: per pair whole on both
    sides (:func:`whole_pairs`) the round's change, and the change of those pairs' round means;
    with no pair whole, every pair's, not checked."""
    whole, left = whole_pairs(base, runs)
    pairs = whole or list(zip(base, runs))
    change = change_of(metric)
    values = [change(r.measured.get(metric, math.nan), b.measured.get(metric, math.nan)) for b, r in pairs]
    means = (spread([side.measured.get(metric, math.nan) for side in sides])["mean"] for sides in zip(*pairs))
    b_mean, r_mean = means if pairs else (math.nan, math.nan)
    return CheckedRounds(values, change(r_mean, b_mean), left, None if whole else cut_short([*base, *runs]), pairs)


def _not_checked(checked: dict, reason: str | None) -> dict:
    """``checked`` with ``inside`` None and ``not_checked`` = ``reason`` when no round counted ran whole."""
    if reason is None or checked["inside"] is None:
        return checked
    return {**checked, "inside": None, "not_checked": reason}


def _metric_entry(v: Validation, runs: list[PolicyRun], metric: str, multi: bool) -> dict:
    """One metric of one policy: predicted against the mean measured over ``runs`` (its live
    rounds; those cut short left out: :func:`round_values`)."""
    pred = runs[0]
    rounds = round_values(runs, metric)
    if metric in UNCHECKED_METRICS:  # a count, never checked: every round's, those cut short too
        values = [r.measured.get(metric, math.nan) for r in runs]
        rounds = CheckedRounds(values, spread(values)["mean"], [], None, list(runs))
    live = spread(rounds.values, metric)
    checked = (_combined_inside(v, pred, metric, rounds.values, rounds.measured) if metric not in UNCHECKED_METRICS
               else {"run_interval": [None, None], "inside": None})
    checked = _not_checked(checked, rounds.not_checked)
    entry = {"label": SUMMARY_METRICS[metric], **_pair(pred.predicted.get(metric, math.nan), rounds.measured),
             "predicted_interval": [_num(x) for x in pred.predicted_interval.get(metric, (None, None))], **checked}
    if multi:
        p, lo, hi = (_num(x) for x in (pred.predicted.get(metric), live["min"], live["max"]))
        entry.update(live_rounds=live["n"], measured_rounds=[_num(r.measured.get(metric, math.nan)) for r in runs],
                     left_out=rounds.left_out, measured_min=lo, measured_max=hi,
                     measured_interval=live["interval"] and [_num(x) for x in live["interval"]],
                     predicted_inside_live_range=None if live["n"] < 2 else within(p, lo, hi))
    return entry


def _mean_workers(per_round: list[list[dict]]) -> list[dict]:
    """Per worker, the mean over live rounds of :func:`worker_rows`' measured values."""
    out = []
    for rows in zip(*per_round):
        first = rows[0]

        def mean(get):
            return spread([get(r) for r in rows])["mean"]

        out.append({**first, "alive": all(r["alive"] for r in rows), "requests": mean(lambda r: r["requests"]),
                    "hit_tokens": _pair(first["hit_tokens"]["predicted"], mean(lambda r: r["hit_tokens"]["measured"])),
                    "query_tokens": _pair(first["query_tokens"]["predicted"],
                                          mean(lambda r: r["query_tokens"]["measured"])),
                    "usage_cached_tokens": mean(lambda r: r["usage_cached_tokens"]),
                    "preemptions": _num(mean(lambda r: r["preemptions"])),
                    "hit_source": ", ".join(sorted({r["hit_source"] for r in rows}))})
    return out


def _policy_entry(v: Validation, runs: list[PolicyRun], multi: bool) -> dict:
    """The report of one policy over its live rounds ``runs``: failures, errors and dead workers
    of every round; the workers' means, the wall time and the client's CPU share (of the whole
    trace, like the prediction) of the rounds that ran whole (:func:`whole_rounds`; every round
    when none did)."""
    fails = [f for r in runs for f in failures(r)]
    whole = (whole_rounds(runs)[0] if multi else None) or runs
    dead: dict[str, str] = {}  # each worker's first death, in the order they died
    for r in runs:
        for w, why in r.dead.items():
            dead.setdefault(str(w), f"live round {r.live_round + 1}: {why}" if multi else why)
    entry = {
        "metrics": {m: _metric_entry(v, runs, m, multi) for m in REPORT_METRICS},
        "workers": {str(row["worker"]): row for row in
                    (_mean_workers([worker_rows(r) for r in whole]) if multi else worker_rows(runs[0]))},
        "cache_reset": [list(r.cache_reset) for r in runs] if multi else list(runs[0].cache_reset),
        "warm_cache": any(r.warm for r in runs),
        "dead_workers": dead,
        "failed_requests": len(fails),
        "errors": dict(Counter(f["error"] for f in fails).most_common(20)),
        "interrupted": any(r.interrupted for r in runs),
        "live_wall_time_s": _num(spread([r.elapsed_s for r in whole])["mean"]),
        "client_cpu_share": _num(spread([client_cpu_share(r) for r in whole])["mean"]),
        "usage_reported_cached_tokens": all(r.usage_reported for r in runs),
        "client_send_lag_s": _lag_summary(np.concatenate([send_lags(r, v.trace, v.spec.max_in_flight is not None)
                                                          for r in runs])),
        "engine_times": engine_rows(runs),
    }
    convoys = convoy_rows(runs)
    if convoys:  # live engine first-token times: only with the servers' KV-cache events
        entry["convoys"] = convoys
        correction = merge(getattr(r, "stamp_correction", None) for r in runs)
        entry["convoys_kv_event_stamp"], stamp_bias = stamp_note(v.servers, correction)
        if correction is not None:  # early stamps moved to the prefill step's end (correct_live_stamps)
            entry["convoys_stamp_correction"] = correction.to_dict()
        if stamp_bias is not None:
            entry["convoys_note"] = stamp_bias
    if multi:
        entry["live_rounds"] = len(runs)
        entry["rounds"] = [{"live_round": r.live_round, "cache_reset": list(r.cache_reset), "warm_cache": r.warm,
                            "dead_workers": {str(w): why for w, why in r.dead.items()},
                            "failed_requests": len(failures(r)), "interrupted": r.interrupted,
                            "cut_short": cut_short([r]),
                            "live_wall_time_s": _num(r.elapsed_s),
                            "client_cpu_share": _num(client_cpu_share(r))} for r in runs]
    return entry


def scenario_dict(v: Validation) -> dict:
    """What ``report.json`` says of a validation before its values: trace, profile, workers,
    replay, seeds, servers, failures, interruption and notes, with empty ``policies`` and
    ``changes``."""
    spec = v.spec
    multi = _multi(v)
    doc: dict = {
        "trace": v.trace.source,
        "num_requests": len(v.trace.records),
        "profile": v.sim_spec.profile.name,
        "num_workers": len(spec.urls),
        "max_in_flight": spec.max_in_flight,
        "closed_loop": (v.spec.closed_loop if v.spec.closed_loop is not None
                        else any(r.parent is not None for r in v.trace.records)),
        "sim_rounds": spec.sim_rounds,
        **({"live_rounds": spec.live_rounds} if multi else {}),
        "sim_client_lag_s": v.client_lag_s,
        "sim_client_lag_measured": spec.client_lag_s is None,
        "seed": spec.seed,
        "warm_cache": any(r.warm for r in v.runs),
        "interrupted": v.interrupted,
        "failed_requests": sum(len(failures(r)) for r in v.runs),
        "servers": [
            {"url": s.url, "model": s.model, "vllm_version": s.vllm_version,
             # NOTE: only when known, so reports of servers that do not say keep their old shape
             **({"async_scheduling": s.async_scheduling} if getattr(s, "async_scheduling", None) is not None else {}),
             "hardware": s.hardware,
             "block_size": s.block_size, "num_gpu_blocks": s.num_gpu_blocks,
             "max_num_batched_tokens": s.max_num_batched_tokens, "max_num_seqs": s.max_num_seqs,
             "max_model_len": s.max_model_len, "dev_mode": s.dev_mode}
            for s in v.servers
        ],
        "notes": ([ONE_ROUND_NOTE] if v.runs and not multi else [])
                 + ([TWO_ROUNDS_NOTE] if spec.live_rounds == 2 and getattr(spec, "run_to_run_prior", 0.0) else [])
                 + list(v.notes) + run_notes(v),
        "policies": {},
        "changes": {},
    }
    return doc


def report_dict(v: Validation) -> dict:
    """The machine-readable report: :func:`scenario_dict`, then per policy its measured and
    predicted values (``policies``) and the changes from the first policy (``changes``)."""
    spec = v.spec
    doc = scenario_dict(v)
    groups = v.policy_rounds()
    multi = _multi(v)
    for policy, runs in groups.items():
        doc["policies"][policy] = _policy_entry(v, runs, multi)
    base, *others = groups.values() if groups else [None]
    for runs in others:
        doc["changes"][runs[0].policy] = {
            m: {"label": SUMMARY_METRICS[m], "vs": base[0].policy, **change_pair(base, runs, m, multi, v)}
            for m in CHANGE_METRICS
        }
    doc["failures"] = [f for r in v.runs for f in failures(r, multi)][:MAX_LISTED_FAILURES]
    # what the "95 % interval of the prediction" column spans (the checked interval: interval_terms)
    doc["predicted_interval_source"] = v.runs[0].interval_source if v.runs else "seeds"
    doc["uncertainty_draws"] = spec.uncertainty
    k, n = inside_count(doc)
    doc["inside_interval"] = {"inside": k, "checked": n}
    doc["interval_level"] = getattr(spec, "interval_level", 0.90)
    doc["heldout_log_sd"] = heldout_spreads(v.sim_spec.profile.raw)  # the fit's, per kind (TTFT, ITL)
    note = rough_fit_note(doc["profile"], doc["heldout_log_sd"])
    if note:
        doc["notes"].append(note)
    if not _multi(v):
        doc["run_to_run_prior"] = getattr(spec, "run_to_run_prior", 0.0)
    doc["coverage"] = {**coverage([m["inside"] for p in doc["policies"].values() for m in p["metrics"].values()]
                                  + [c["inside"] for ch in doc["changes"].values() for c in ch.values()]),
                       "level": doc["interval_level"]}
    if getattr(v, "drift", None):
        doc["drift"] = {k: d.to_dict() for k, d in v.drift.items()}
        doc["probe_reference"] = "calibration" if getattr(spec, "probe_reference", None) else "predicted"
    if getattr(v, "speed_scale", None) is not None:
        doc["speed_scale"] = v.speed_scale.to_dict()
    # a profile of another model than every server's: the times differ by the model, not the host's speed
    if not getattr(spec, "speed_probes", 0) and len(servers_of_another_model(v.sim_spec.profile, v.servers)) < len(v.servers):
        note = speed_hint(doc)
        if note:
            doc["notes"].append(note)
    if v.probes:
        doc["probes"] = v.probes  # the probe samples, s, so that the speed scale and drift can be refitted
    return doc


def measured_only_dict(v: Validation) -> dict:
    """The machine-readable report of a validation interrupted before its prediction was made
    (``v.predicted`` False): :func:`scenario_dict` with ``"predicted": false`` and, per live
    run in run order, its policy, live round, measured ``REPORT_METRICS`` (s, share or count;
    null where nothing was served), failed requests and whether it was interrupted."""
    doc = scenario_dict(v)
    doc["predicted"] = False
    doc["notes"] = [n for n in doc["notes"] if n not in (ONE_ROUND_NOTE, TWO_ROUNDS_NOTE)]  # of intervals: none here
    doc["runs"] = [{"policy": r.policy, "live_round": r.live_round,
                    "measured": {m: _num(r.measured.get(m, math.nan)) for m in REPORT_METRICS},
                    "failed_requests": len(failures(r)), "interrupted": r.interrupted}
                   for r in v.runs if r.live is not None]
    doc["failures"] = [f for r in v.runs for f in failures(r, _multi(v))][:MAX_LISTED_FAILURES]
    if v.probes:
        doc["probes"] = v.probes
    return doc


ROUGH_FIT_LOG_SD = 0.5
"""A profile whose fit misses its held-out experiments by more than this log sd (TTFT or ITL;
about x1.65 either way at one sd) gets :func:`rough_fit_note`."""


def rough_fit_note(profile: str, heldout: dict[str, float]) -> str | None:
    """A note for a profile whose fit misses the experiments it held out by more than
    :data:`ROUGH_FIT_LOG_SD` (``heldout``: ``kvroute.sim.timing.heldout.heldout_spreads``): its
    predictions are rough and its intervals wide, so a value inside one says little. None
    otherwise."""
    rough = {kind: sd for kind, sd in heldout.items() if sd > ROUGH_FIT_LOG_SD}
    if not rough:
        return None
    return (f"profile {profile!r} misses the experiments its fit held out by a log sd of "
            + ", ".join(f"{sd:.2f} for {kind.upper()} (one sd is x{math.exp(sd):.1f})" for kind, sd in rough.items())
            + ": its predictions are rough and the intervals carry that width, so a value inside one says little; a "
            "full calibration sweep (kvroute calibrate measure without --preset quick, then fit) fits closer")


SPEED_HINT_RATIO = 1.5
"""How far the measured times may sit from the predicted ones, all alike (geometric mean ratio),
before a report without speed probes suggests them (:func:`speed_hint`)."""

_HINT_METRICS = ("time_to_complete_s", "ttft_mean_s", "itl_mean_s", "e2e_mean_s")


def speed_hint(doc: dict) -> str | None:
    """A note for a report without speed probes whose measured times are off the predicted ones
    as a host at another speed puts them, which the probes measure and the profile can be
    rescaled to; None when they are not:

    - all off the same way, by at least :data:`SPEED_HINT_RATIO` on average (the geometric mean
      of measured / predicted over every policy's time to complete, TTFT, ITL and E2E);
    - or TTFT and ITL each off by at least that much (geometric mean over the policies), in
      opposite directions: prefill and decode at other speeds than the profile's, which the
      probes tell apart (their rescaling takes the attention terms apart from the step and token
      terms).
    """
    by_key: dict[str, list[float]] = {}
    for p in doc["policies"].values():
        for key, m in p["metrics"].items():
            if key in _HINT_METRICS and (m.get("measured") or 0) > 0 and (m.get("predicted") or 0) > 0:
                by_key.setdefault(key, []).append(math.log(m["measured"] / m["predicted"]))
    logs = [x for values in by_key.values() for x in values]
    if len(logs) < 2:
        return None
    ratio = math.exp(sum(logs) / len(logs))
    alike = all(x * logs[0] > 0 for x in logs)  # every time off the same way
    if not alike:
        mean = {key: math.exp(sum(v) / len(v)) for key, v in by_key.items()}
        ttft, itl = mean.get("ttft_mean_s"), mean.get("itl_mean_s")
        far = math.log(SPEED_HINT_RATIO)
        if ttft is None or itl is None or min(abs(math.log(ttft)), abs(math.log(itl))) < far or (ttft > 1) == (itl > 1):
            return None
        return (f"the measured TTFT is x{ttft:.2f} the predicted and the measured ITL x{itl:.2f}: prefill and decode "
                "run at other speeds than the profile describes (another day's speed, other work on the machine, or "
                "a profile that misprices this workload). --speed-probes 3 measures both and rescales the profile's "
                "attention terms apart from its step and token terms (docs/guide/validate-live.md)")
    if 1 / SPEED_HINT_RATIO < ratio < SPEED_HINT_RATIO:
        return None
    return (f"the measured times are x{ratio:.2f} the predicted ones on average, all off the same way: the host "
            "runs at another speed than the profile describes (another day's speed, other work on the machine, or a "
            "profile that misprices this workload). "
            "--speed-probes 3 measures that speed and rescales the profile to it (docs/guide/validate-live.md)")


def _lag_summary(lags: np.ndarray) -> dict | None:
    if not len(lags):
        return None
    return {"n": int(len(lags)), "median": _num(np.median(lags)), "p90": _num(np.percentile(lags, 90)),
            "max": _num(lags.max())}


def change_pair(base: list[PolicyRun], runs: list[PolicyRun], metric: str, multi: bool = False,
                v: Validation | None = None) -> dict:
    """Predicted and measured change of ``metric`` from policy ``base`` to policy ``runs`` (each
    its live rounds; the measured change is that of the round means over the pairs of rounds
    whole on both sides, :func:`round_changes`, percent) and their difference (percentage
    points). With ``multi``, also each round's change against the base's round of the same index
    (every pair, ``left_out`` naming those cut short) and the 95 % Student-t interval of the
    counted pairs' mean (from two pairs on)."""
    b0, r0 = base[0], runs[0]
    change = change_of(metric)
    p = change(r0.predicted.get(metric, math.nan), b0.predicted.get(metric, math.nan))
    rounds = round_changes(base, runs, metric)
    m = rounds.measured
    checked = (_inside(simulated_changes(b0, r0, metric)[0], m, len(finite(rounds.values))) if v is None else
               _combined_inside(v, r0, metric, rounds.values, m, base=b0))
    checked = _not_checked(checked, rounds.not_checked)
    out = {"predicted": _num(p), "measured": _num(m), "unit": "pp" if metric in SHARE_METRICS else "%",
           "difference_pp": _num(p - m), **checked}
    if multi:
        every = [change(r.measured.get(metric, math.nan), b.measured.get(metric, math.nan)) for b, r in zip(base, runs)]
        lo, hi = (_num(x) for x in mean_interval(rounds.values, bounds=change_bounds(metric)))
        out.update(live_rounds=len(finite(rounds.values)), measured_rounds=[_num(x) for x in every],
                   left_out=rounds.left_out, measured_interval=None if lo is None else [lo, hi],
                   predicted_inside_measured_interval=within(p, lo, hi))
    return out


def _run_name(run: PolicyRun, multi: bool) -> str:
    return f"{run.policy} (live round {run.live_round + 1})" if multi else run.policy


def run_notes(v: Validation) -> list[str]:
    """Warm caches, dead workers, failures and interruptions, in words."""
    notes = []
    multi = _multi(v)
    for run in v.runs:
        name = _run_name(run, multi)
        if run.warm:
            bad = [v.servers[i].url for i, ok in enumerate(run.cache_reset) if ok is False]
            notes.append(f"{name}: the prefix cache of {', '.join(bad) or 'some server'} could not be "
                         "reset, so the run started WARM (the simulation starts cold)")
        for w, why in run.dead.items():
            if why.endswith(SILENT_BEFORE_THE_RUN):  # lost in an earlier run
                notes.append(f"{name}: worker {w} ({v.servers[w].url}) did not answer before the run, so the "
                             "policy sent it nothing and the replay ran on the others")
            else:
                notes.append(f"{name}: worker {w} ({v.servers[w].url}) died or timed out mid-replay and "
                             f"the policy stopped sending to it; the replay finished on the others ({why})")
        n_fail = len(failures(run))
        if n_fail and n_fail >= len(run.live.records):
            notes.append(f"{name}: none of the {len(run.live.records)} requests was served (all failed or were not "
                         "sent), so it has no measured metrics: its values and the changes involving it are not "
                         "compared")
        elif n_fail:
            notes.append(f"{name}: {n_fail} of {len(v.trace.records)} requests failed or were not sent; "
                         "measured metrics cover the rest")
        if not run.usage_reported:
            notes.append(f"{name}: a server never reported cached tokens in its usage (started without "
                         "--enable-prompt-tokens-details); per-request cached tokens read 0")
        if run.interrupted:
            notes.append(f"{name}: interrupted (Ctrl-C); the report holds what was measured until then")
    return notes


def client_cpu_share(run: PolicyRun) -> float:
    """The client's CPU seconds per wall second of ``run`` (NaN for a run recorded without
    ``client_cpu_s``, by a kvroute that did not measure it)."""
    cpu, wall = getattr(run, "client_cpu_s", math.nan), run.elapsed_s
    return cpu / wall if wall > 0 else math.nan
