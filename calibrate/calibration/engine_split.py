"""Where the unloaded front end sits: before the engine, or after its step.

A request alone on a server spends its TTFT in three parts: the API process admits it (parse,
tokenise, hand it to the engine core), the engine queues and prefills it, and the step's output
goes back through the API process (detokenise, one SSE chunk) to the client. The ``/metrics``
histograms give the middle part's length but not where it lies, so ``overheads.api_server_s``
(client TTFT minus the engine's queue and prefill time) holds the first and last parts together.
Placing all of it before the engine matters under load: a request's turn at the engine then
comes too late by the part that really follows the step, and its token reaches the client too
early by the same amount.

With the servers' KV-cache events the sweep times the end of each request's prefill step
(``engine_first_token_s`` in ``requests.csv``, :func:`kvroute.calibrate.calibration.measure.
engine_first_token`); the client's TTFT less that time is the part after the engine. On the
2-core CPU reference it grows with the prompt (1.6 ms at 32 tokens, 8 ms at 16k), as the part
before the engine does (and the whole front end grows alike in sweeps without the event feed, so
the feed is not the cause), so it is fitted as a line in prompt length like ``api_server_s`` is.

What the batch's stamp marks depends on the server's release
(:func:`kvroute.sim.timing.vllm_versions.kv_event_stamp`, recorded by ``measure`` in
``meta.json``'s ``kv_events.stamp``): the end of the step from vLLM 0.11.1 (with async
scheduling, for a request alone); the *start* of the step in 0.11.0, which publishes the batch
when it schedules the step; one step early with async scheduling for a request that shared the
engine (a burst's). Read as the step's end, an early stamp would move a whole step into the part
after the engine, so :func:`correct_sweep_stamps` first moves every sweep row's stamp to the end
of its prefill step (``kvroute.calibrate.calibration.step_end``: the server's next batch, the
fitted time of that step for a request alone, or the request's first inter-token gap), and both
this split and the burst fit's ``engine_first_s`` read the corrected times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALONE_ROLES = ("cold", "warm", "cached", "context")
"""Roles of the sweep's rows of one request alone on its server (``calibrate measure``: every
one of them sent after the one before ended, with 1 output token)."""


@dataclass(frozen=True, slots=True)
class PostEngine:
    """Engine step end to the client's first token, one request at a time:
    ``intercept_s + per_token_s * prompt tokens`` (a robust line, Siegel repeated medians).

    Attributes:
        intercept_s: the line's value at 0 prompt tokens, s.
        per_token_s: its slope, s per prompt token (>= 0).
        median_s: median over the requests, s.
        q25_s, q75_s: quartiles, s.
        num_requests: requests timed in the engine.
        num_alone: successful requests alone on their server (the timed ones among them).
    """

    intercept_s: float
    per_token_s: float
    median_s: float
    q25_s: float
    q75_s: float
    num_requests: int
    num_alone: int

    def to_dict(self) -> dict:
        """JSON-ready fields (six significant digits)."""
        return {k: (v if isinstance(v, int) else float(f"{v:.6g}"))
                for k, v in ((f, getattr(self, f)) for f in self.__slots__)}


def alone(requests) -> np.ndarray:
    """Per row of a sweep's requests, whether it is a successful request alone on its server
    (role in :data:`ALONE_ROLES`, no error): the rows :func:`post_engine_time` fits."""
    return (requests["role"].isin(ALONE_ROLES) & requests["error"].isna()).to_numpy(bool)


def first_gaps(token_times) -> np.ndarray:
    """Per row of a sweep's ``token_times`` (space-separated arrival times, s after the send), the
    second token's arrival less the first's, s; NaN for fewer than two tokens."""
    out = np.full(len(token_times), np.nan)
    for i, text in enumerate(token_times):
        parts = text.split() if isinstance(text, str) else []
        if len(parts) >= 2:
            out[i] = float(parts[1]) - float(parts[0])
    return out


def correct_sweep_stamps(requests, stamp: str, step_s=None):
    """A sweep's rows with ``engine_first_token_s`` moved to the end of each request's prefill
    step where ``stamp`` says it is early (:func:`kvroute.calibrate.calibration.step_end.
    prefill_step_ends`, whose text states each estimate's error).

    Estimates, per row: the server's next batch (``engine_next_batch_s``; sweeps before it was
    written lack it); for a row alone on its server (no other row of its ``url``, and ``sweep``
    when pooled, in flight when it was sent, by ``t_send_s`` and ``t_done_s``)
    ``step_s(prompt_len, cached_tokens)``; the row's own first inter-token gap (``token_times``).

    Args:
        requests: ``requests.csv`` as a DataFrame.
        stamp: what the stamps mark (a key of ``vllm_versions.KV_EVENT_STAMPS``).
        step_s: seconds of the step that finishes such a prefill alone, or None.

    Returns:
        ``(rows, how)``: a copy of ``requests`` with the corrected column (``requests`` itself
        when it has no ``engine_first_token_s``) and, per row, how its stamp was taken
        (``prefill_step_ends``' second result; None without the column).
    """
    from kvroute.calibrate.calibration.step_end import others_in_flight, prefill_step_ends

    if "engine_first_token_s" not in requests.columns:
        return requests, None
    cols = requests.columns
    stamps = requests["engine_first_token_s"].to_numpy(float)
    n = len(stamps)
    if {"url", "t_send_s", "t_done_s"} <= set(cols):
        send = requests["t_send_s"].to_numpy(float)
        server = requests["url"].astype(str)
        if "sweep" in cols:  # pooled sweeps (observations.load_sweeps): each on its own clock
            server = server + "#" + requests["sweep"].astype(str)
        loaded = others_in_flight(server.to_numpy(), send, send + requests["t_done_s"].to_numpy(float))
    else:
        loaded = np.zeros(n, dtype=bool)
    fitted = None
    if step_s is not None:
        prompt = requests["prompt_len"].to_numpy(float)
        cached = requests["cached_tokens"].to_numpy(float) if "cached_tokens" in cols else np.zeros(n)
        fitted = np.array([step_s(int(p), int(c) if np.isfinite(c) else 0) if np.isfinite(t) and not busy
                           else np.nan for p, c, t, busy in zip(prompt, cached, stamps, loaded)])
    ends, how = prefill_step_ends(
        stamp, stamps, requests["ttft_s"].to_numpy(float),
        requests["engine_next_batch_s"].to_numpy(float) if "engine_next_batch_s" in cols else None,
        first_gaps(requests["token_times"]) if "token_times" in cols else None, loaded, fitted)
    rows = requests.copy()
    rows["engine_first_token_s"] = ends
    return rows, how


def post_engine_time(requests, stamp: str = "step_end", step_s=None) -> PostEngine | None:
    """The part of the unloaded TTFT after the engine's step, from a sweep's request rows.

    Args:
        requests: ``requests.csv`` as a DataFrame (columns ``role``, ``error``, ``prompt_len``,
            ``ttft_s`` and ``engine_first_token_s``, and ``cached_tokens``; sweeps without KV
            events lack ``engine_first_token_s``).
        stamp: what the KV-event stamps mark (a key of ``vllm_versions.KV_EVENT_STAMPS``); not
            ``"step_end"``: the stamps are corrected first (:func:`correct_sweep_stamps`; rows
            already corrected are passed with ``"step_end"``).
        step_s: ``step_s(prompt_len, cached_tokens)``: seconds of the step that finishes such a
            prefill alone, or None (:func:`correct_sweep_stamps`).

    Returns:
        A :class:`PostEngine` over the successful ``ALONE_ROLES`` rows timed in the engine, or
        None when none is (no KV events, or none arrived).
    """
    from kvroute.calibrate.calibration.fit import robust_line

    if "engine_first_token_s" not in requests.columns:
        return None
    if stamp != "step_end":
        requests, _ = correct_sweep_stamps(requests, stamp, step_s)
    alone_rows = requests[alone(requests)]
    ttft = alone_rows["ttft_s"].to_numpy(float)
    engine = alone_rows["engine_first_token_s"].to_numpy(float)
    ok = np.isfinite(ttft) & np.isfinite(engine)
    if not ok.any():
        return None
    post = ttft[ok] - engine[ok]
    a, b = robust_line(alone_rows["prompt_len"].to_numpy(float)[ok], post, True)
    q25, median, q75 = np.percentile(post, [25, 50, 75])
    return PostEngine(a, b, float(median), float(q25), float(q75), int(ok.sum()), len(alone_rows))


def apply_post_engine(doc: dict, split: PostEngine, stamp: str = "step_end", correction=None) -> None:
    """Move ``split``'s line out of a profile document's ``overheads`` line (``api_server_s``,
    ``api_server_per_token_s``) into ``post_engine_s`` and ``post_engine_per_token_s``, so the
    unloaded TTFT predicted stays the same; with its provenance and source. Each part moves
    at most what the overheads line holds (the two lines are fitted apart); the provenance
    names a part cut short. ``correction``: what was done to the stamps of the rows alone
    (:class:`~kvroute.calibrate.calibration.step_end.StampCorrection`), recorded with it."""
    over = doc["overheads"]
    moved = {}
    for have, put, value in (("api_server_s", "post_engine_s", split.intercept_s),
                             ("api_server_per_token_s", "post_engine_per_token_s", split.per_token_s)):
        part = min(value, over.get(have, 0.0))
        over[have] = float(f"{over.get(have, 0.0) - part:.6g}")
        over[put] = float(f"{part:.6g}")
        if part < value:
            moved[put] = "cut to what " + have + " held"
    fit = doc.setdefault("provenance", {}).setdefault("fit", {})
    fit["post_engine"] = {**split.to_dict(), "kv_event_stamp": stamp, **({"cut": moved} if moved else {}),
                          **({"kv_event_stamp_correction": correction.to_dict()} if correction is not None else {})}
    fixed = ""
    if stamp == "step_start":
        fixed = "; vLLM 0.11.0 stamps it when it schedules the step"
    elif stamp == "step_end_alone":
        fixed = "; with async scheduling it is one step early for a request that shares the engine"
    if fixed and correction is not None and correction.num_corrected:
        fixed += (", so the end of that step was estimated per request (" + ", ".join(
            f"{n} by {e.replace('_', ' ')}" for e, n in correction.corrected.items()) + ")")
        if correction.corrected.get("fitted_step"):
            fixed += ": the fitted time of that step was added"
    if fixed and correction is not None and correction.uncorrected:
        fixed += f"; {correction.uncorrected} left as stamped (no estimate)"
    doc.setdefault("sources", {})["overheads.post_engine_s"] = (
        f"robust line in prompt length (with overheads.post_engine_per_token_s) through {split.num_requests} "
        "requests alone on a server: the client's TTFT less the end of the engine step that finished the "
        "prefill (the KV-event batch that stored the prompt's last full block, vLLM KVEventBatch.ts"
        + fixed + "); taken out of api_server_s and api_server_per_token_s")


def describe(split: PostEngine | None, overheads: dict, correction=None) -> str:
    """Lines for the fit's report: the split and the profile's ``overheads`` after it, and what was
    done to early KV-event stamps (``correction``, a ``step_end.StampCorrection``, when any was)."""
    if split is None:
        return "front end: all of it before the engine (the sweep has no engine step times; measure --kv-events)"
    moved = correction is not None and (correction.num_corrected or correction.uncorrected)
    return ((correction.text() + "\n" if moved else "")
            + f"front end after the engine's step: {1e3 * split.intercept_s:.2f} ms + "
            f"{1e6 * split.per_token_s:.3g} us "
            f"x prompt tokens (median {1e3 * split.median_s:.2f} ms, quartiles {1e3 * split.q25_s:.2f}-"
            f"{1e3 * split.q75_s:.2f} ms; {split.num_requests} of the {split.num_alone} requests that ran alone "
            f"had an engine time)\nthe profile's front end: {1e3 * overheads['api_server_s']:.3g} ms + "
            f"{1e6 * overheads.get('api_server_per_token_s', 0.0):.3g} us x prompt tokens before the engine "
            f"(api_server_s), {1e3 * overheads['post_engine_s']:.3g} ms + "
            f"{1e6 * overheads['post_engine_per_token_s']:.3g} us after it (post_engine_s)")
