"""Where a request's time goes, engine-side: vLLM's request histograms against the simulator's.

vLLM 0.32 times every finished request in its engine core (``vllm/v1/metrics/stats.py:
IterationStats.update_from_finished_request``): queue time = first scheduled - received by the
engine core (``vllm:request_queue_time_seconds``), prefill time = first token out of the engine -
first scheduled (``vllm:request_prefill_time_seconds``), decode time = last token out - first
token out (``vllm:request_decode_time_seconds``). A live run's per-request means are the deltas
of the histograms' sums over the run divided by the deltas of their counts, over all servers; the
simulator's records carry the same three times (``kvroute.sim.cluster.metrics``), defined alike.

What the client's TTFT holds beyond queue and prefill time is the ``front end`` row, TTFT - queue
- prefill on both sides: the client's send, HTTP, the API server's admission and the streaming of
the first token back. Live, vLLM's own TTFT (``vllm:time_to_first_token_seconds``: from the API
process receiving the request to it processing the first token) splits that further into the API
server's share and the client's (HTTP and SSE on both ends); the simulator has one front end, so
those two rows are measured only. Splitting a TTFT error this way says whether the engine's steps or the
processes around them are mispredicted. All figures are means over every request of a run (all
turns), in seconds.

The convoy table splits later turns at the engine's first token, which the live side takes from
the servers' KV-cache events. Where a release stamps those one step early (vLLM 0.11.0; async
scheduling under load: ``vllm_versions.kv_event_stamp``), ``live_stamps.correct_live_stamps``
first moves each record's time to the end of its prefill step (``kvroute.calibrate.calibration.
step_end``), and the report counts what was moved and what was left as stamped.
"""

from __future__ import annotations

import math

from kvroute.calibrate.validation.rounds import error_pct, spread
from kvroute.calibrate.validation.validate import PolicyRun

#: Engine-side times and the vLLM histogram each is read from.
HISTOGRAMS = {
    "queue_time": "vllm:request_queue_time_seconds",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
}
SERVER_TTFT = "vllm:time_to_first_token_seconds"

#: Below this on both sides a row gives no relative error, s: an engine queue time of 15 us
#: measured against 0 predicted is agreement, not "-100 %".
TIME_RESOLUTION_S = 1e-3

#: Rows of the decomposition, in order, with their labels.
ROWS = {
    "ttft": "TTFT, all requests (client)",
    "queue_time": "engine queue time",
    "prefill_time": "engine prefill time",
    "front_end": "front end: TTFT - queue - prefill",
    "api_front_end": "  of which the API server's: vLLM's TTFT - queue - prefill",
    "client": "  of which the client's and HTTP: TTFT - vLLM's TTFT",
    "decode_time": "engine decode time",
}


def measured_times(run: PolicyRun) -> dict[str, float]:
    """Per-request means of one live run (NaN where the servers did not report a histogram).

    Sums and counts are added over every server whose ``/metrics`` was scraped before and after
    the run; a server without a scrape (dead) is left out.
    """
    out = {key: _histogram_mean(run, name) for key, name in HISTOGRAMS.items()}
    out["ttft"] = run.measured.get("ttft_mean_s", math.nan)
    out["front_end"] = out["ttft"] - out["queue_time"] - out["prefill_time"]
    server_ttft = _histogram_mean(run, SERVER_TTFT)
    out["api_front_end"] = server_ttft - out["queue_time"] - out["prefill_time"]
    out["client"] = out["ttft"] - server_ttft
    return out


def _histogram_mean(run: PolicyRun, name: str) -> float:
    """Mean observation of histogram ``name`` over the run, all scraped servers pooled."""
    total = count = 0.0
    for before, after in zip(run.before, run.after):
        if before is None or after is None:
            continue
        s, n = after.delta(before, f"{name}_sum"), after.delta(before, f"{name}_count")
        if math.isfinite(s) and math.isfinite(n):
            total, count = total + s, count + n
    return total / count if count > 0 else math.nan


def predicted_times(run: PolicyRun) -> dict[str, float]:
    """Per-request means over the simulated runs behind ``run``'s prediction (every request
    that finished, all runs pooled)."""
    sums = dict.fromkeys(HISTOGRAMS, 0.0)
    count = 0
    for sim in run.sim_runs:
        df = sim.records
        ok = df[df["status"] == "ok"]
        count += len(ok)
        for key in HISTOGRAMS:  # records made elsewhere (another tool's) may lack the column
            sums[key] += float(ok[key].sum()) if key in ok else math.nan
    out = {key: (total / count if count else math.nan) for key, total in sums.items()}
    out["ttft"] = run.predicted.get("ttft_mean_s", math.nan)
    out["front_end"] = out["ttft"] - out["queue_time"] - out["prefill_time"]
    out["api_front_end"] = out["client"] = math.nan  # one front end in the model: measured only
    return out


def engine_rows(runs: list[PolicyRun]) -> dict[str, dict]:
    """The decomposition of one policy over its live rounds ``runs``: per row of ``ROWS``, the
    predicted value (shared by the rounds), the mean measured over the rounds and the error (%).

    Returns:
        ``{row: {"label", "predicted", "measured", "error_pct"}}``, values in seconds (None for
        NaN, so the mapping is valid JSON; ``error_pct`` None also where both sides are under
        :data:`TIME_RESOLUTION_S`).
    """
    predicted = predicted_times(runs[0])
    per_round = [measured_times(r) for r in runs]
    out = {}
    for key, label in ROWS.items():
        p = predicted[key]
        m = spread([r[key] for r in per_round])["mean"]
        tiny = abs(p) < TIME_RESOLUTION_S and abs(m) < TIME_RESOLUTION_S  # NaN compares False: not tiny
        out[key] = {"label": label, "predicted": _num(p), "measured": _num(m),
                    "error_pct": None if tiny else _num(error_pct(p, m))}
    return out


def _num(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def stamp_note(servers, correction=None) -> tuple[str, str | None]:
    """What the live engine first-token times mark for these servers (a key of
    ``kvroute.sim.timing.vllm_versions.KV_EVENT_STAMPS``, from server 0's release and async flag)
    and, where some are not the end of the prefill step, how that biases the measured convoy
    columns (the simulated ones are the step's end). With ``correction`` (the runs'
    :class:`~kvroute.calibrate.calibration.step_end.StampCorrection`, ``live_stamps.correct_live_stamps``)
    the stamps were moved to the step's end: a note only for those left as stamped."""
    from kvroute.sim.timing.vllm_versions import kv_event_stamp

    s = servers[0] if servers else None
    stamp = kv_event_stamp(getattr(s, "vllm_version", None), getattr(s, "async_scheduling", None))
    if correction is not None:
        if not correction.uncorrected:
            return stamp, None
        return stamp, (f"{correction.uncorrected} of the {correction.timed} live engine first-token times are "
                       "about one step early (their servers' KV-event stamps mark the step before, and neither the "
                       "server's next batch nor the request's own first inter-token gap dated that step): for "
                       "them the measured 'engine' convoy column is short by about one step and 'out' long")
    if stamp == "step_start":
        return stamp, (f"vLLM {s.vllm_version} stamps its KV-cache events when it schedules a step, before the step "
                       "runs: the measured 'engine' convoy column ends at the start of each request's prefill step "
                       "(short by that step) and 'out' is long by it")
    if stamp == "step_end_alone":
        return stamp, ("the servers schedule asynchronously: a KV-event batch is published after step N with what "
                       "step N+1 stored, so under load the measured 'engine' convoy column is about one step short "
                       "and 'out' one step long")
    return stamp, None


#: Positions of a convoy the report shows (the first ones; later ones are rare).
CONVOY_POSITIONS = 8


def convoy_rows(runs: list[PolicyRun], positions: int = CONVOY_POSITIONS) -> list[dict]:
    """A later turn's TTFT by its position in its convoy, split at the engine's first token.

    A convoy is the requests of one turn that one worker got in one round (a simulated round,
    or a live round), ranked by send time. Per position, means over the requests of turns >= 2:
    ``engine`` = engine first token - send (client send, the API server's admission, engine
    queue and the prefill step) and ``out`` = client first token - engine first token (the
    engine core handing the token over, the API server streaming it and the client reading it),
    predicted (the simulated runs behind ``runs``) and measured (the live records of ``runs``,
    which carry ``engine_first_token`` only when the replay read the servers' KV-cache events).

    Returns:
        one dict per position present on both sides, in order: ``position``, ``count`` (live
        requests), ``predicted_engine``, ``measured_engine``, ``predicted_out``,
        ``measured_out``, ``predicted_ttft``, ``measured_ttft`` (s); [] when the live records
        have no engine first-token times.
    """
    import pandas as pd

    live = [r.live.records.assign(_round=r.live_round) for r in runs if r.live is not None]
    if not live:
        return []
    measured = pd.concat(live, ignore_index=True)
    if "engine_first_token" not in measured or measured["engine_first_token"].isna().all():
        return []
    simulated = pd.concat([r.records.assign(_round=k) for k, r in enumerate(runs[0].sim_runs)], ignore_index=True)
    (p, _), (m, counts) = _by_position(simulated), _by_position(measured)
    rows = []
    for pos in sorted(set(p.index) & set(m.index))[:positions]:
        row = {"position": int(pos), "count": int(counts[pos])}
        for side, table in (("predicted", p), ("measured", m)):
            for key in ("engine", "out", "ttft"):
                row[f"{side}_{key}"] = _num(table.at[pos, key])
        rows.append(row)
    return rows


def _by_position(records):
    """Means of ``engine``, ``out`` and ``ttft`` per convoy position (see :func:`convoy_rows`),
    and the number of requests per position, over finished requests of turns >= 2 that have an
    engine first-token time."""
    d = records[(records["status"] == "ok") & (records["turn"] >= 2) & records["engine_first_token"].notna()]
    d = d.sort_values("arrival", kind="stable").copy()
    d["position"] = d.groupby(["_round", "worker", "turn"])["arrival"].rank(method="first").astype(int)
    d["engine"] = d["engine_first_token"] - d["arrival"]
    d["out"] = d["first_token"] - d["engine_first_token"]
    return d.groupby("position")[["engine", "out", "ttft"]].mean(), d["position"].value_counts()
