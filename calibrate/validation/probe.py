"""Speed probes: the same small requests timed on every server, before and after live rounds, to
measure how far the host's speed moved (``kvroute.sim.timing.drift``), and the same probe as a
profile predicts it, the reference when no probe was taken right after calibrating.

A probe has three parts, each from a reset prefix cache and with cold prompts of random token ids
asking for ``PROBE_OUTPUT_TOKENS`` tokens:

- one at a time: on each server in turn, ``reps`` requests of ``PROBE_PROMPT_TOKENS`` one after
  another (quantities ``ttft_s``, ``itl_s``): the host's speed for one engine alone;
- long: then ``long`` requests of ``PROBE_LONG_TOKENS`` one after another (``long_ttft_s``,
  ``long_itl_s``), where attention takes most of the prefill: with the short ones they tell the
  attention's speed from the rest (``kvroute.sim.timing.speed_scale``);
- a burst: ``burst`` requests sent at once to every server at once (``burst_ttft_s``,
  ``burst_itl_s``): the host's speed with every engine, API process and the client busy, which
  a host shared with other machines can lose while one request at a time still runs at speed
  (docs/log/2026-12-05-validation-run.md).

Each request gives its client TTFT and its mean inter-token gap (TPOT), s.
"""

from __future__ import annotations

import math

from kvroute.sim.timing.drift import NO_DRIFT, Drift, probe_drift

PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS, PROBE_REPS, PROBE_BURST = 2048, 32, 3, 4
"""The probe's prompt length and outputs (tokens), its requests per server one at a time, and its
requests per server in the burst."""

PROBE_LONG_TOKENS, PROBE_LONG_REPS = 8192, 1
"""The long part's prompt length (tokens) and its requests per server."""

PROBE_QUANTITIES = ("ttft_s", "itl_s", "long_ttft_s", "long_itl_s", "burst_ttft_s", "burst_itl_s")
"""What a probe times per request: the client's TTFT and the mean inter-token gap, s, one at a
time, long and in the burst."""

SCALE_QUANTITIES = ("ttft_s", "itl_s", "long_ttft_s", "long_itl_s")
"""The probe quantities a speed scale is fitted to (:func:`speed_scale`): requests alone, whose
times the step costs decide; not the burst's, which also hold the host model's contention that
a speed factor must not absorb."""

PREDICTED_ROUNDS = 8
"""Seeded simulations of the probe behind :func:`predicted_probe` (the profile's jitter)."""


async def probe_samples(urls: list[str], seed: int, reps: int = PROBE_REPS, model: str | None = None,
                        warn=lambda msg: None, burst: int = PROBE_BURST,
                        long: int = PROBE_LONG_REPS, timeout_s: float = 600.0) -> dict[str, list[float]]:
    """Time the probe on every server (module doc).

    Args:
        urls: server base URLs.
        seed: seeds the prompts' token ids (``calibrate measure``'s cold prompts).
        reps: requests per server one at a time.
        model: served model name; None: each server's only model.
        warn: called with a one-line message for a request that failed or returned < 2 tokens.
        burst: requests per server in the burst; 0: no burst.
        long: long requests per server (none on a server whose context is too short, :func:`fits_long`); 0: none.
        timeout_s: limit on each request, s.

    Returns:
        ``{quantity: [...]}`` for every one of :data:`PROBE_QUANTITIES`: one value per successful
        request, s.

    Raises:
        CalibrationError: a server is unreachable, a connection broke or a request took longer
            than ``timeout_s`` (a request the server rejects is only warned of).
    """
    import asyncio
    import contextlib

    import numpy as np

    from kvroute.calibrate.calibration.prompt_factory import PromptFactory
    from kvroute.calibrate.live.client import VllmClient

    prompts = PromptFactory(np.random.default_rng(seed))
    out: dict[str, list[float]] = {q: [] for q in PROBE_QUANTITIES}

    def keep(res, url: str, prefix: str) -> None:
        times = res.token_times
        if res.error or len(times) < 2:
            warn(f"speed probe on {url}: {res.error or 'fewer than two tokens'}")
            return
        out[prefix + "ttft_s"].append(float(times[0]))
        out[prefix + "itl_s"].append(float((times[-1] - times[0]) / (len(times) - 1)))

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(VllmClient(url, model, timeout_s)) for url in urls]
        for client in clients:
            info = await client.probe()
            await client.reset_prefix_cache()
            for _ in range(reps):
                keep(await client.complete(prompts.unique(PROBE_PROMPT_TOKENS), PROBE_OUTPUT_TOKENS), client.url, "")
            for _ in range(long if fits_long(info.max_model_len) else 0):
                keep(await client.complete(prompts.unique(PROBE_LONG_TOKENS), PROBE_OUTPUT_TOKENS), client.url, "long_")
        if burst > 0:
            for client in clients:
                await client.reset_prefix_cache()
            sends = [(client, prompts.unique(PROBE_PROMPT_TOKENS)) for client in clients for _ in range(burst)]
            results = await asyncio.gather(*(c.complete(prompt, PROBE_OUTPUT_TOKENS) for c, prompt in sends))
            for (client, _), res in zip(sends, results):
                keep(res, client.url, "burst_")
    return out


def fits_long(max_model_len: int | None) -> bool:
    """Whether a server or profile of this context length takes the long part (prompt and
    outputs); an unknown length is taken to."""
    return max_model_len is None or max_model_len >= PROBE_LONG_TOKENS + PROBE_OUTPUT_TOKENS


def _probe_trace(num_workers: int, block: int, reps: int, long: int, burst: int):
    """The probe as a trace: per worker ``reps`` short then ``long`` long requests 5 s apart
    (longer than any probe request takes; round-robin deals them over the workers in turn), then
    ``burst`` short ones per worker at once. Returns the trace and each record's part prefix
    (``""``, ``"long_"``, ``"burst_"``)."""
    from kvroute.traces.format import Trace, TraceRecord

    records, parts = [], []
    gap_ms = 5000.0
    next_block = 0  # every prompt gets blocks of its own: all cold

    def add(tokens: int, at_ms: float, part: str) -> None:
        nonlocal next_block
        blocks = -(-tokens // block)
        records.append(TraceRecord(request_id=len(records), timestamp_ms=at_ms, input_length=tokens,
                                   output_length=PROBE_OUTPUT_TOKENS,
                                   hash_ids=range(next_block, next_block + blocks)))
        next_block += blocks
        parts.append(part)

    for _ in range(reps * num_workers):
        add(PROBE_PROMPT_TOKENS, len(records) * gap_ms, "")
    for _ in range(long * num_workers):
        add(PROBE_LONG_TOKENS, len(records) * gap_ms, "long_")
    burst_at = len(records) * gap_ms
    for _ in range(burst * num_workers):
        add(PROBE_PROMPT_TOKENS, burst_at, "burst_")
    return Trace(records, block, source="speed probe"), parts


def _simulated_probe(cluster, trace, parts, seed: int, rounds: int) -> dict[str, list[float]]:
    import dataclasses

    from kvroute.sim.cluster.cluster import simulate

    spec = dataclasses.replace(cluster, policy="round_robin", closed_loop=False, max_in_flight=None,
                               client_lag_s=(), request_timeout_s=None, record_steps=False, record_series=False)
    out: dict[str, list[float]] = {q: [] for q in PROBE_QUANTITIES}
    for k in range(rounds):
        df = simulate(trace, spec, seed=seed + k).records.sort_values("request_id")
        for part, ttft, tpot in zip(parts, df["ttft"], df["tpot"]):
            out[part + "ttft_s"].append(float(ttft))
            out[part + "itl_s"].append(float(tpot))
    return out


def predicted_probe(cluster, reps: int = PROBE_REPS, burst: int = PROBE_BURST, seed: int = 0,
                    rounds: int = PREDICTED_ROUNDS, long: int = PROBE_LONG_REPS) -> dict[str, list[float]]:
    """The probe (module doc) as ``cluster``'s profile predicts it: the reference a drift is
    measured against when no probe was taken right after calibrating.

    Simulates ``rounds`` seeded runs of the probe on ``cluster`` (its workers, GPUs, front end and
    host model; its policy, client limits and lags are replaced by round-robin, no limit and
    none): per worker ``reps`` short then ``long`` long requests one at a time, then ``burst``
    short ones per worker at once (round-robin deals them evenly).

    Args:
        cluster: a ``kvroute.sim.cluster.cluster.ClusterSpec`` (one worker per live server).
        reps, burst, long: as :func:`probe_samples`.
        seed: seed of the first run; run ``k`` uses ``seed + k``.
        rounds: simulated runs.

    Returns:
        The samples :func:`probe_samples` returns, one value per simulated request, s.
    """
    engine = cluster.profile.engine
    trace, parts = _probe_trace(cluster.num_workers, engine.block_size, reps,
                                long if fits_long(engine.max_model_len) else 0, burst)
    return _simulated_probe(cluster, trace, parts, seed, rounds)


def speed_scale(cluster, *samples: dict[str, list[float]] | None):
    """The step-cost factors (``kvroute.sim.timing.speed_scale.SpeedScale``) under which
    ``cluster``'s profile predicts the measured probes: the mean of each quantity of
    :data:`SCALE_QUANTITIES` over all ``samples`` (e.g. the probes before and after the live
    rounds) against the mean of the same quantity in the probe simulated with the factors.

    The fit is scipy's bounded least squares on the log factors (within
    ``speed_scale.FACTOR_BOUNDS``) of the relative errors, with the probe simulated once per
    evaluation without the profile's jitter (``HostModel.engine_speed_sigma``, a mean-one factor on
    step times, and ``Overheads.jitter_cv``, mean-one on per-request overheads: so the jitter-free
    times are the jittered runs' means). Each factor's standard error is :func:`_log_sd`'s.

    Four quantities (probes with their long part) fit the three factors. When that leaves the
    per-token factor on a bound or poorly determined
    (``speed_scale.POORLY_DETERMINED_LOG_SD``: its time is a small part of every probe quantity,
    and it trades against the per-step one), the fit is redone with one factor for ``step`` and
    ``token`` together and one for ``attention`` (the two-factor form that reproduces cold
    prefills of 2,048-16,384 tokens within 4 %: docs/log/2026-12-05-speed-scale.md), and
    ``SpeedScale.tied`` says so. Two quantities (probes saved before the long part existed) fit
    one factor for ``token`` and ``attention`` and one for ``step``.

    Raises:
        ValueError: no probe time in ``samples``.
    """
    import dataclasses
    import statistics

    import numpy as np
    from scipy.optimize import least_squares

    from kvroute.sim.timing.speed_scale import (FACTOR_BOUNDS, POORLY_DETERMINED_LOG_SD, SPEED_GROUPS, SpeedScale,
                                                scaled_profile)

    measured, rel_se = {}, {}
    for q in SCALE_QUANTITIES:
        values = [v for s in samples if s for v in s.get(q, []) if math.isfinite(v) and v > 0]
        if values:
            measured[q] = statistics.fmean(values)
            rel_se[q] = statistics.stdev(values) / measured[q] / math.sqrt(len(values)) if len(values) > 1 else math.nan
    if not measured:
        raise ValueError("no probe time to fit a speed scale to")
    profile = dataclasses.replace(cluster.profile, overheads=dataclasses.replace(cluster.profile.overheads, jitter_cv=0.0))
    if profile.host is not None:
        profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, engine_speed_sigma=0.0))
    if not fits_long(profile.engine.max_model_len):
        measured = {q: m for q, m in measured.items() if not q.startswith("long_")}
    long = 1 if any(q.startswith("long_") for q in measured) else 0
    trace, parts = _probe_trace(cluster.num_workers, profile.engine.block_size, PROBE_REPS, PROBE_LONG_REPS * long, 0)
    counts = ", ".join(f"{q.removesuffix('_s')} {sum(len(s.get(q, [])) for s in samples if s)}" for q in measured)
    lo, hi = np.log(FACTOR_BOUNDS)

    def fit(factors: dict[str, tuple[str, ...]]) -> SpeedScale:
        """Fit one log factor per key of ``factors``, each scaling the SPEED_GROUPS it names."""
        names = list(factors)

        def scale_of(x) -> SpeedScale:
            return SpeedScale(**{g: float(np.exp(v)) for name, v in zip(names, x) for g in factors[name]})

        def residuals(x) -> np.ndarray:
            spec = dataclasses.replace(cluster, profile=scaled_profile(profile, scale_of(x)))
            got = _simulated_probe(spec, trace, parts, 0, 1)
            return np.array([statistics.fmean(got[q]) / m - 1 for q, m in measured.items()])

        result = least_squares(residuals, np.zeros(len(names)), bounds=(lo, hi), diff_step=0.02)
        sd = _log_sd(result.jac, [rel_se[q] for q in measured], result.fun)
        clipped = tuple(g for name, v in zip(names, result.x) if not lo + 1e-3 < v < hi - 1e-3 for g in factors[name])
        tied = tuple(factors[name] for name in names if len(factors[name]) > 1)
        return dataclasses.replace(scale_of(result.x), source=f"speed probes ({counts} requests) against "
                                   f"{cluster.profile.name}", residual=float(np.sqrt(np.mean(result.fun ** 2))),
                                   clipped=clipped, log_sd={g: s for name, s in zip(names, sd) for g in factors[name]},
                                   tied=tied)

    if not long:  # token and attention cannot be told apart without the long part
        return fit({"step": ("step",), "compute": ("token", "attention")})
    scale = fit({group: (group,) for group in SPEED_GROUPS})
    if "token" in scale.clipped or scale.log_sd["token"] > POORLY_DETERMINED_LOG_SD:
        scale = fit({"rest": ("step", "token"), "attention": ("attention",)})
    return scale


def _log_sd(jacobian, rel_se: list[float], residuals=None) -> list[float]:
    """Standard errors of the fitted log factors: ``sqrt(diag((J^T W J)^-1))`` with ``J`` the
    relative residuals' Jacobian in the log factors (rows: probe quantities) and ``W`` the inverse
    squared relative standard errors of the measured means (a quantity with one request takes the
    largest of the others', or 10 % without any), times the Birge ratio ``sqrt(chi^2 / dof)``
    when the fit's ``residuals`` miss by more than those errors allow (a misfit the scatter alone
    does not show; ``dof`` = quantities - factors, at least 1); inf where ``J^T W J`` is singular."""
    import numpy as np

    se = np.asarray(rel_se, float)
    known = se[np.isfinite(se) & (se > 0)]
    se = np.where(np.isfinite(se) & (se > 0), se, known.max() if len(known) else 0.10)
    j = np.asarray(jacobian, float) / se[:, None]
    info = j.T @ j
    inflate = 1.0
    if residuals is not None:
        chi2 = float(np.sum((np.asarray(residuals, float) / se) ** 2))
        inflate = max(1.0, chi2 / max(1, len(se) - j.shape[1]))
    try:
        if np.linalg.cond(info) > 1e12:
            raise np.linalg.LinAlgError
        return [float(math.sqrt(max(v, 0.0) * inflate)) for v in np.diag(np.linalg.inv(info))]
    except np.linalg.LinAlgError:
        return [math.inf] * info.shape[0]


def median(samples: dict[str, list[float]]) -> dict[str, float]:
    """Per quantity, the median of a probe's samples (NaN without any)."""
    import statistics

    return {q: statistics.median(v) if v else math.nan for q, v in samples.items()}


def drifts(before: dict[str, list[float]] | None, after: dict[str, list[float]] | None,
           reference: dict[str, list[float]] | None = None,
           reference_label: str = "after calibrating") -> dict[str, Drift]:
    """Per probe quantity (``"ttft"``, ``"itl"``, ``"long_ttft"``, ``"long_itl"``, ``"burst_ttft"``,
    ``"burst_itl"``), the drift over
    the live rounds between the probes ``before`` and ``after`` them, against ``reference`` (the
    probe right after calibrating, or :func:`predicted_probe`) when given
    (``kvroute.sim.timing.drift.probe_drift``; ``reference_label`` names it in each drift's
    ``source``); {} without both probes. A quantity missing from
    either probe (probes saved before the long and burst parts existed) is left out."""
    if not before or not after:
        return {}
    out = {}
    for q in PROBE_QUANTITIES:
        if not before.get(q) or not after.get(q):
            continue
        d = probe_drift(before.get(q), after.get(q), (reference or {}).get(q), reference_label)
        if d is not NO_DRIFT and "no usable probe" not in d.source:
            out[q.removesuffix("_s")] = d
    return out


def drifts_against(before: dict[str, list[float]] | None, after: dict[str, list[float]] | None, cluster,
                   calibrated: dict[str, list[float]] | None = None, reps: int = PROBE_REPS,
                   seed: int = 0) -> tuple[dict[str, Drift], dict[str, list[float]] | None, str]:
    """:func:`drifts` against the probe taken right after calibrating (``calibrated``) when there
    is one, else against the probe as ``cluster``'s profile predicts it (:func:`predicted_probe`
    with ``reps`` and ``seed``, simulated only when both probes exist).

    Returns:
        ``(drifts, reference, label)``: the drifts; the reference samples used (None when
        neither exists); and its label, ``"after calibrating"`` or ``"as <profile> predicts
        them"``, which each drift's ``source`` carries.
    """
    if calibrated:
        return drifts(before, after, calibrated, "after calibrating"), calibrated, "after calibrating"
    label = f"as {cluster.profile.name} predicts them"
    if not before or not after:
        return {}, None, label
    reference = predicted_probe(cluster, reps, seed=seed)
    return drifts(before, after, reference, label), reference, label
