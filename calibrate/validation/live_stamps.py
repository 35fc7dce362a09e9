"""Live records' KV-event engine first-token times moved to the end of each request's prefill
step, where the servers' release stamps them early (issue 33, row 5 of
``docs/reference/vllm-versions.md``; the rule and its estimates: ``kvroute.calibrate.calibration.
step_end``). ``validate.finish_run`` applies it to every live run with the servers' event feed;
``engine_times.stamp_note`` reports it."""

from __future__ import annotations

import math

import numpy as np

from kvroute.calibrate.calibration.step_end import StampCorrection, next_stamps, others_in_flight, prefill_step_ends


def correct_live_stamps(run, batch_times, stamps):
    """Move each live record's ``engine_first_token`` (as stamped by the KV-event batch that stored
    its last full prompt block) to the end of its prefill step where its server's stamp is early,
    in place (``run.live.records``), per :func:`kvroute.calibrate.calibration.step_end.
    prefill_step_ends` (the module text states each estimate's error).

    Per record: early for every record of a server whose ``stamps`` entry is ``"step_start"``
    (vLLM 0.11.0), and for a ``"step_end_alone"`` server (async scheduling) when another request
    was in flight on its worker when it was sent (last token not yet at the client); the step's
    duration estimated by the worker's next batch after the stamp (``batch_times``), else the
    record's own first inter-token gap (from ``run.live.tokens``, kept only with ``validate
    --tokens``). No fitted step time is used here: a record with neither is left as
    stamped and counted.

    Args:
        run: a ``validate.PolicyRun`` whose live records carry ``engine_first_token`` (s since the
            run's start).
        batch_times: per worker, every batch stamp seen, s since the run's start
            (``LiveReplay.kv_batch_times``).
        stamps: per worker, what its stamps mark (``vllm_versions.kv_event_stamp`` of its release and
            async flag; missing: ``"step_end"``).

    Returns:
        A :class:`~kvroute.calibrate.calibration.step_end.StampCorrection`, or None when no
        record has an engine first-token time.
    """
    records = run.live.records if run.live is not None else None
    if records is None or "engine_first_token" not in records or records["engine_first_token"].isna().all():
        return None
    df = records.copy()
    eft = df["engine_first_token"].to_numpy(float)
    worker = df["worker"].to_numpy(int)
    loaded = others_in_flight(worker, df["arrival"], df["finish"])
    gap = np.full(len(df), math.nan)
    tokens = run.live.tokens
    if tokens is not None and len(tokens):
        first, second = (tokens[tokens["token"] == k].set_index("request_id")["time"] for k in (1, 2))
        gap = (df["request_id"].map(second) - df["request_id"].map(first)).to_numpy(float)
    ends, how = eft.copy(), np.where(np.isfinite(eft), "as_stamped", "untimed").astype(object)
    kinds = set()
    for w in np.unique(worker[np.isfinite(eft)]):
        mine = worker == w
        kind = stamps[w] if 0 <= w < len(stamps) else "step_end"
        kinds.add(kind)
        nxt = next_stamps(batch_times[w] if 0 <= w < len(batch_times) else [], eft[mine])
        ends[mine], how[mine] = prefill_step_ends(kind, eft[mine], df["first_token"].to_numpy(float)[mine], nxt,
                                                  gap[mine], loaded[mine])
    df["engine_first_token"] = ends
    run.live.records = df
    return StampCorrection.of("+".join(sorted(kinds)), how)
