"""The concurrency sweep's bursts: load them, replay them in the simulator, fit the front-end
queue and host-contention terms (``kvroute.sim.timing.frontend``) to them, and report their errors.

A burst (``kvroute.calibrate.calibration.measure``: kinds ``burst`` and ``burst_all``) is N cold prompts of
one shape sent at once to one server, or N to every server, or N prompts on a prefix the server
has cached (``prefix_len``). Its simulated twin is a trace of the
same requests sent at the times the live client really sent them (the client's own send lag
under load is part of the measurement, not a parameter), with round-robin routing over the
servers loaded. Compared per burst: mean TTFT, TTFT of the last request, mean TPOT and the time
to complete the burst, as the client saw them, and two engine-side figures from vLLM's request
histograms (the sweep scrapes them around each burst): the mean engine TTFT (queue time +
prefill time, ``vllm:request_queue_time_seconds`` and ``request_prefill_time_seconds``) and the
mean engine inter-token latency (``vllm:inter_token_latency_seconds``). The engine figures pin
down what the engines did; the client's beyond them is the front end's (API lanes, streaming),
so lane times and host contention, which both stretch the client's TTFT and TPOT, are told apart.
The CPU seconds each server's API process spent over the burst (``process_cpu_seconds_total``,
which prometheus_client's process collector adds to vLLM's ``/metrics`` with one API process)
are compared with the lane work the terms give (:func:`api_busy_s`): without them a large
per-step lane time could stand in for engine slowdown, since busy API lanes count as busy
processes on the host (a fit without them can give a per-step lane time several times the API
process's CPU time: docs/log/from-code-comments.md).

Fit: the step costs and the unloaded API-server time come from the one-at-a-time sweep and stay
fixed. The loss is the sum of squared log ratios of predicted to measured figures. Stage 1:
``per_request_s``, ``per_output_token_s`` and ``per_step_s`` (API lane time) from the bursts on one server, by a
bounded Nelder-Mead search (``scipy.optimize.minimize``) started at the best point of a coarse
grid (simulation is deterministic per seed, so the loss is piecewise smooth and a derivative-
free search suits it); one engine and its API process alone rarely oversubscribe the cores, so
contention hardly enters. Stage 2: the host's ``contention`` from the bursts on all servers at
once (``minimize_scalar``, bounded). Fitting both at once confounds them: both stretch TPOT.
The per-prompt-token lane time is the profile's measured ``api_server_per_token_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.frontend import FrontendModel, HostModel
from kvroute.sim.timing.profile import Profile
from kvroute.traces.format import Trace, TraceRecord

BURST_KINDS = ("burst", "burst_all")
CONTENTION_BOUND = 4.0
"""Upper bound of the fitted ``HostModel.contention`` (4: a busy process beyond the cores stretches
steps four times as much as fair sharing would)."""
METRICS = ("ttft_mean_s", "ttft_last_s", "tpot_mean_s", "complete_s", "engine_ttft_s", "engine_itl_s", "api_cpu_s",
           "engine_first_s")
"""Compared per burst; the ``engine_*`` ones only where the servers exported their histograms,
``api_cpu_s`` (CPU seconds of a server's API process over the burst, mean over the loaded
servers) where they exported ``process_cpu_seconds_total`` and the profile has front-end terms,
``engine_first_s`` (mean time from a request's send to the end of its prefill step) where the
sweep read the servers' KV-cache events (``measure --kv-events``): it tells the front end's time
before the engine from its time after it, which the client's TTFT holds together."""


@dataclass(frozen=True, slots=True)
class Burst:
    """One measured burst.

    Attributes:
        exp_id: experiment id; kind: ``burst`` (one server) or ``burst_all`` (every server).
        num_servers: servers loaded; batch: N requests per loaded server.
        prompt_len, max_tokens: the shape, tokens.
        send_s: every request's send time, s after the burst's first send (ascending).
        measured: ``METRICS`` -> seconds.
        engine_queue_s, engine_prefill_s: the servers' mean queue and prefill time of the
            burst's requests from ``/metrics`` (NaN when not exported); their sum is
            ``measured["engine_ttft_s"]``, and the servers' mean inter-token latency
            ``measured["engine_itl_s"]``.
        prefix_len: tokens of the prefix every prompt of a server shares, cached there by one
            request before the burst (0: cold prompts).
    """

    exp_id: int
    kind: str
    num_servers: int
    batch: int
    prompt_len: int
    max_tokens: int
    send_s: tuple[float, ...]
    measured: dict
    engine_queue_s: float = math.nan
    engine_prefill_s: float = math.nan
    prefix_len: int = 0


def _metrics(send, ttft, e2e, tpot) -> dict:
    last = int(np.argmax(send))
    return {"ttft_mean_s": float(np.mean(ttft)), "ttft_last_s": float(ttft[last]),
            "tpot_mean_s": float(np.nanmean(tpot)) if np.isfinite(tpot).any() else math.nan,
            "complete_s": float(np.max(np.asarray(send) + np.asarray(e2e)) - np.min(send))}


def _e2e_and_tpot(grp: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per request of a sweep's rows: the time its last token arrived after the send (``t_done_s``
    when no token times were kept) and its TPOT from the last token's arrival (NaN for a single
    token or without token times), s. The last token, not ``t_done_s``, because the stream's end
    also waits for the usage chunk."""
    ttft = grp["ttft_s"].to_numpy(float)
    n_tok = grp["n_tokens"].to_numpy(float)
    last = np.array([float(t.split()[-1]) if isinstance(t, str) and t.strip() else math.nan
                     for t in grp["token_times"]])
    tpot = np.where(n_tok > 1, (last - ttft) / np.maximum(n_tok - 1, 1), math.nan)
    return np.where(np.isfinite(last), last, grp["t_done_s"].to_numpy(float)), tpot


def load_bursts(requests: pd.DataFrame, experiments: pd.DataFrame) -> tuple[list[Burst], list[str]]:
    """The sweep's bursts and notes on the ones left out (a failed request; impossible counts are
    measurement errors, counted in the first note: ``observations.mark_measurement_errors``).

    Args:
        requests, experiments: the sweep's tables (``kvroute.calibrate.calibration.observations.load_sweep``).
    """
    from kvroute.calibrate.calibration.observations import mark_measurement_errors

    out, notes = [], []
    if "kind" not in requests.columns:
        return out, notes
    req = requests[requests["kind"].isin(BURST_KINDS) & (requests["role"] == "burst")]
    req, summary = mark_measurement_errors(req)
    if summary is not None:
        notes.append(summary)
    for exp_id, grp in req.groupby("exp_id"):
        errors = grp["error"].dropna() if "error" in grp else []
        if len(errors) or not (grp["ttft_s"] > 0).all():
            notes.append(f"burst {exp_id}: a request failed; left out")
            continue
        t0 = float(grp["t_send_s"].min())
        send = grp["t_send_s"].to_numpy(float) - t0
        ttft = grp["ttft_s"].to_numpy(float)
        e2e, tpot = _e2e_and_tpot(grp)
        order = np.argsort(send, kind="stable")
        kind = str(grp["kind"].iloc[0])
        servers = int(grp["url"].nunique())
        erow = experiments[experiments["exp_id"] == exp_id] if len(experiments) else experiments
        q, p, itl, cpu = (_engine_mean(erow, col) for col in ("engine_queue_s", "engine_prefill_s", "itl_engine_s",
                                                               "api_cpu_s"))
        prefix = int(grp["prefix_len"].iloc[0]) if "prefix_len" in grp else 0
        first = grp["engine_first_token_s"].to_numpy(float) if "engine_first_token_s" in grp else np.array([math.nan])
        measured = {**_metrics(send, ttft, e2e, tpot), "engine_ttft_s": q + p, "engine_itl_s": itl, "api_cpu_s": cpu,
                    "engine_first_s": float(np.mean(first)) if np.isfinite(first).all() else math.nan}
        out.append(Burst(int(exp_id), kind, servers, int(grp["batch"].iloc[0]), int(grp["prompt_len"].iloc[0]),
                         int(grp["max_tokens"].iloc[0]), tuple(float(x) for x in send[order]),
                         measured, q, p, prefix))
    return out, notes


def _engine_mean(erow: pd.DataFrame, column: str) -> float:
    """An engine figure of a burst: the mean over its servers' rows (each server's own mean over
    the burst's requests; NaN when the sweep has no such column)."""
    if column not in erow or not len(erow):
        return math.nan
    return float(erow[column].mean())


WARM_LEAD_S = 2.0
"""Seconds between the warm requests of a cached-prefix burst's twin and its first send (the
warm requests are done and idle engines parked by then)."""


def num_warm(burst: Burst) -> int:
    """Warm requests ahead of the burst in :func:`burst_trace`: one per server for a
    cached-prefix burst, else none."""
    return burst.num_servers if burst.prefix_len else 0


def burst_trace(burst: Burst, block_size: int) -> Trace:
    """The burst as a trace, routed round-robin over its servers: unique cold prompts sent at
    the measured times (ms). A cached-prefix burst first sends one request per server (ids
    ``0 .. num_warm - 1``, one output token) with that server's prefix, and the burst
    ``WARM_LEAD_S`` later; round-robin gives warm request ``j`` to worker ``j`` and the burst's
    ``i``-th send to worker ``i % num_servers``, so its prompt starts with that worker's prefix
    (its whole blocks, as vLLM caches them) and goes on with blocks of its own."""
    nb = -(-burst.prompt_len // block_size)
    k = num_warm(burst)
    shared = burst.prefix_len // block_size
    prefixes = [tuple(range(20_000_000 + j * nb, 20_000_000 + j * nb + shared)) for j in range(k)]
    partial = burst.prefix_len % block_size > 0  # a warm prompt's last, partial block: its own
    records = [TraceRecord(j, 0.0, burst.prefix_len, 1, prefixes[j] + ((30_000_000 + j,) if partial else ()))
               for j in range(k)]
    lead = 1000.0 * WARM_LEAD_S if k else 0.0
    for i, t in enumerate(burst.send_s):
        own = tuple(range(10_000_000 + i * nb, 10_000_000 + (i + 1) * nb))
        hashes = prefixes[i % k] + own[shared:] if k else own
        records.append(TraceRecord(k + i, lead + 1000.0 * t, burst.prompt_len, burst.max_tokens, hashes))
    return Trace(records, block_size=block_size, source=f"burst {burst.exp_id}")


def simulate_burst(burst: Burst, profile: Profile, seeds: tuple[int, ...] = (0,)) -> dict:
    """``METRICS`` of the burst predicted with ``profile``, mean over ``seeds``."""
    bs = profile.engine.block_size
    trace = burst_trace(burst, bs)
    spec = ClusterSpec(profile, num_workers=burst.num_servers, policy="round_robin", arrival_spread_s=0.0,
                       closed_loop=False)
    acc = {m: [] for m in METRICS}
    for seed in seeds:
        run = simulate(trace, spec, seed)
        rec = run.records.sort_values("request_id").iloc[num_warm(burst):]
        m = _metrics(np.array(burst.send_s), rec["ttft"].to_numpy(float), rec["e2e"].to_numpy(float),
                     rec["tpot"].to_numpy(float))
        # as vLLM's histograms average them: per request (queue + prefill), per token gap (decode);
        # plus the engine's admission time that the one-at-a-time fit put before the engine
        m["engine_ttft_s"] = float((rec["queue_time"] + rec["prefill_time"]).mean()) + engine_admission_s(profile,
                                                                                                        burst.prompt_len)
        gaps = float((rec["output_tokens"] - 1).clip(lower=0).sum())
        m["engine_itl_s"] = float(rec["decode_time"].sum()) / gaps if gaps > 0 else math.nan
        m["api_cpu_s"] = api_busy_s(profile, rec, run.workers["num_steps"].sum(), burst.num_servers)
        m["engine_first_s"] = float((rec["engine_first_token"] - rec["arrival"]).mean())
        for k in METRICS:
            acc[k].append(m[k])
    return {k: float(np.mean(v)) for k, v in acc.items()}


def engine_admission_s(profile: Profile, prompt_len: int) -> float:
    """The engine's own admission time of a request of ``prompt_len`` tokens that the profile's
    one-at-a-time fit measured inside vLLM's queue + prefill time but placed in the API-server
    time before the engine (``provenance.fit.overhead_parts``: ``engine_admission_s`` +
    ``engine_admission_per_token_s`` x prompt tokens, written by a fit with ``overhead="metrics"``;
    0 without them), s. The simulated engine TTFT of a burst adds it, so that it is compared with
    vLLM's histograms like for like: without it a lone 256-token request's predicted engine TTFT
    was half the measured one, and only host contention could stretch it
    (docs/log/2026-12-05-fit-walls.md). 0 for a profile that already charges it inside the step
    that first schedules the request (``Overheads.has_engine_admission``): its simulated prefill
    time holds it, as vLLM's does."""
    if profile.overheads.has_engine_admission:
        return 0.0
    fit = (profile.raw.get("provenance") or {}).get("fit") if isinstance(profile.raw, dict) else None
    parts = fit.get("overhead_parts") if isinstance(fit, dict) else None
    if not isinstance(parts, dict):
        return 0.0
    a, b = parts.get("engine_admission_s"), parts.get("engine_admission_per_token_s")
    a = float(a) if isinstance(a, (int, float)) and math.isfinite(a) else 0.0
    b = float(b) if isinstance(b, (int, float)) and math.isfinite(b) else 0.0
    return max(a, 0.0) + max(b, 0.0) * prompt_len


def api_busy_s(profile: Profile, records: pd.DataFrame, num_steps: int, num_servers: int) -> float:
    """Predicted work of one server's API process(es) over a burst, s, the mean over
    ``num_servers``: every request's admission (``per_request_s`` + ``per_prompt_token_s`` x
    prompt tokens), every streamed token's ``per_output_token_s`` and ``per_step_s`` once per
    engine step (``num_steps``, all servers: each step of a burst emits tokens, its prompts
    fitting the token budget whole). NaN for a profile without front-end terms (no lanes).

    Args:
        records: the burst's requests (``prompt_tokens`` and ``output_tokens`` columns).
    """
    fe = profile.frontend
    if fe is None or num_servers <= 0:
        return math.nan
    work = (fe.per_request_s * len(records) + fe.per_prompt_token_s * float(records["prompt_tokens"].sum())
            + fe.per_output_token_s * float(records["output_tokens"].sum()) + fe.per_step_s * float(num_steps))
    return work / num_servers


def schedule_delay(burst: Burst, profile: Profile, seed: int = 0) -> dict:
    """The simulated arrival-to-schedule delay of the burst's last-sent request.

    Returns:
        ``{"last_delay_s": its first scheduling minus its send time,
        "last_ttft_s": its TTFT, "mean_prefill_s": mean over the burst of (engine's first
        token - first scheduling), "comparable_s": last_ttft_s - mean_prefill_s}``, seconds.
        ``comparable_s`` is computed as :func:`measured_delay` computes the live figure (the
        server exports no per-request scheduling time, only the mean prefill time).
    """
    from kvroute.sim.cluster.cluster import Cluster

    spec = ClusterSpec(profile, num_workers=burst.num_servers, policy="round_robin", arrival_spread_s=0.0,
                       closed_loop=False)
    cluster = Cluster(burst_trace(burst, profile.engine.block_size), spec, seed)
    scheduled: dict[int, float] = {}
    first: dict[int, float] = {}
    for w in cluster.workers:
        # instrument this run's scheduler and token callback (instance attributes; the worker
        # looks both up when it runs)
        def schedule(orig=w.scheduler.schedule):
            out = orig()
            for r in out.admitted:
                scheduled.setdefault(r.request_id, cluster.env.now)
            return out

        def on_token(request, now, orig=w.on_token):
            first.setdefault(request.request_id, now)
            orig(request, now)

        w.scheduler.schedule, w.on_token = schedule, on_token
    rec = cluster.run().records.set_index("request_id")
    k = num_warm(burst)
    last = k + len(burst.send_s) - 1
    mean_prefill = float(np.mean([first[i] - scheduled[i] for i in scheduled if i >= k]))
    ttft = float(rec.at[last, "ttft"])
    sent = burst.send_s[-1] + (WARM_LEAD_S if k else 0.0)
    return {"last_delay_s": scheduled[last] - sent, "last_ttft_s": ttft,
            "mean_prefill_s": mean_prefill, "comparable_s": ttft - mean_prefill}


def measured_delay(burst: Burst) -> float:
    """The live arrival-to-schedule delay of the burst's last-sent request, s: its client TTFT
    minus the servers' mean prefill time of the burst (``vllm:request_prefill_time_seconds``,
    scheduling to first token). NaN when the server exported no prefill times."""
    return burst.measured["ttft_last_s"] - burst.engine_prefill_s


def burst_table(bursts: list[Burst], profile: Profile, seeds: tuple[int, ...] = (0, 1)) -> pd.DataFrame:
    """Per burst and metric: measured, predicted and the error in % (long format)."""
    rows = []
    for b in bursts:
        pred = simulate_burst(b, profile, seeds)
        for m in METRICS:
            meas = b.measured[m]
            if not (meas > 0) or not math.isfinite(pred[m]):
                continue
            rows.append(dict(exp_id=b.exp_id, kind=b.kind, batch=b.batch, prompt_len=b.prompt_len,
                             prefix_len=b.prefix_len, max_tokens=b.max_tokens, metric=m, measured_s=meas, predicted_s=pred[m],
                             error_pct=100.0 * (pred[m] / meas - 1.0)))
    return pd.DataFrame(rows)


WORSE_MARGIN = 1.05
"""How much worse (ratio of :meth:`FrontendFit.latency_misfit`) the terms may fit the cold bursts'
latencies than the profile without them before the fit summary says so."""

SCOPES = {"burst": "one server", "burst_all": "all servers", "burst_cached": "one server, cached prefix",
          "burst_all_cached": "all servers, cached prefix"}
"""Report scopes of :func:`error_summary`: the burst kind, ``_cached`` for a cached prefix."""


def error_summary(table: pd.DataFrame) -> dict:
    """``{scope: {metric: median |error| %}}`` of a :func:`burst_table`; the scope is the burst's
    kind, with ``_cached`` appended for bursts on a cached prefix (``SCOPES``)."""
    out: dict = {}
    if table.empty:
        return out
    cached = table["prefix_len"] > 0 if "prefix_len" in table else pd.Series(False, index=table.index)
    scope = table["kind"] + np.where(cached, "_cached", "")
    for (kind, metric), g in table.groupby([scope, table["metric"]]):
        out.setdefault(kind, {})[metric] = float(np.median(np.abs(g["error_pct"])))
    return out


@dataclass(frozen=True, slots=True)
class FrontendFit:
    """Fitted front-end and host terms and the burst errors with and without them.

    Attributes:
        frontend, host: the fitted sections.
        before, after: :func:`burst_table` of the profile without / with them, over every burst:
            the terms are fitted to the cold bursts, and the bursts on a cached prefix check
            what they cannot fit, the step costs of several such prefills in one step.
        objective: final sum of squared log ratios; evaluations: simulations of all bursts run.
        contention_interval: the range of contention the bursts cannot tell apart from the
            fitted one (:func:`contention_interval`; NaN when not fitted).
    """

    frontend: FrontendModel
    host: HostModel
    before: pd.DataFrame
    after: pd.DataFrame
    objective: float
    evaluations: int
    contention_interval: tuple[float, float] = (math.nan, math.nan)
    walls: tuple = ()
    scatter: tuple = ()

    def summary(self) -> str:
        """Lines: the terms, then median |error| per scope and metric before -> after."""
        f, h = self.frontend, self.host
        lines = [
            f"front end: {f.api_server_count} API process(es); admission {_time(f.per_request_s)} + "
            f"{_time(f.per_prompt_token_s)}/prompt token; {_time(f.per_step_s)} per engine step + "
            f"{_time(f.per_output_token_s)} per streamed token",
            f"host: {h.cores} cores, contention {h.contention:.3g}"
            + (f" (the bursts allow {_span(*self.contention_interval)}: an approximate 95 % profile-likelihood "
               "range)" if math.isfinite(self.contention_interval[0]) else "")
            + (f" (at its bound {CONTENTION_BOUND:g}: the bursts ask for more than the host model gives"
               + ("" if h.api_on_engine_core else
                  "; were the API processes on their engines' cores, fit --api-cores own?") + ")"
               if h.contention >= 0.99 * CONTENTION_BOUND else "")
            + f" (baseline {h.baseline_busy:g} busy"
            + (f" + {h.baseline_stream_busy:g} streaming in decode steps" if h.baseline_stream_busy else "")
            + ", idle engines "
            f"busy for {h.engine_spin_s:g} s), engine speed spread between servers {h.engine_speed_sigma:.3g} (log), "
            + (f"drawn anew every {h.engine_speed_period_s:.3g} s" if h.engine_speed_period_s > 0 else "once per run"),
            "burst errors, median |predicted/measured - 1| (one-at-a-time profile -> with these terms):",
        ]
        b, a = error_summary(self.before), error_summary(self.after)
        for kind, scope in SCOPES.items():
            if kind not in a:
                continue
            parts = [f"{m[:-2]} {_pct(b.get(kind, {}).get(m, math.nan))} -> {_pct(a[kind][m])}"
                     for m in METRICS if m in a[kind]]
            lines.append(f"  {scope:<12} " + ", ".join(parts)
                         + (" (not fitted: checks the step costs of several prefills on a cached prefix in one step)"
                            if kind.endswith("_cached") else ""))
        from kvroute.calibrate.calibration.walls import summary_lines

        worse = self.worse_note()
        lines += [worse] if worse else []
        lines += summary_lines(self.walls, self.scatter)  # terms at a bound; repeats that scatter (walls.py)
        return "\n".join(lines)

    def latency_misfit(self) -> tuple[float, float, int]:
        """The cold bursts' latency misfit without and with the terms: sums of squared log ratios
        of predicted to measured over the figures both profiles predict (``api_cpu_s`` is not
        among them: the profile without terms predicts none), and how many figures. The terms
        are fitted to these figures, ``api_cpu_s`` and the bursts' engine times together, with
        the stated host terms (:func:`fit_frontend`)."""
        keys = ["exp_id", "metric"]
        cold = [t[t["prefix_len"] == 0][keys + ["error_pct"]] if len(t) else pd.DataFrame(columns=keys + ["error_pct"])
                for t in (self.before, self.after)]
        both = cold[0].merge(cold[1], on=keys, suffixes=("_before", "_after"))
        misfit = [float((np.log1p(both[f"error_pct_{w}"] / 100.0) ** 2).sum()) for w in ("before", "after")]
        return misfit[0], misfit[1], len(both)

    def worse_note(self) -> str | None:
        """A ``WORSE:`` line when the terms fit the cold bursts' latencies more than
        ``WORSE_MARGIN`` times worse than the profile without them (:meth:`latency_misfit`);
        None otherwise."""
        before, after, n = self.latency_misfit()
        if not n or not after > WORSE_MARGIN * before:
            return None
        bursts = int(self.after.loc[self.after["prefix_len"] == 0, "exp_id"].nunique())
        return (f"WORSE: the cold bursts' latencies fit worse with these terms than with none (sum of squared log "
                f"ratios over the {n} figures both predict: {before:.3g} -> {after:.3g}): the fit weighs them with "
                f"the API process's CPU seconds and carries the stated host terms; {bursts} cold bursts may be too few "
                "to fit them (a sweep with more bursts, measure --preset full, fits them from more)")


def _span(low: float, high: float) -> str:
    """``low-high`` to 3 significant figures, or to 4 decimals where those would print one number
    twice (3.99568-4 is not 4-4)."""
    text = f"{low:.3g}-{high:.3g}"
    return f"{low:.4f}-{high:.4f}" if f"{low:.3g}" == f"{high:.3g}" and low != high else text


def _time(seconds: float) -> str:
    """A duration to 3 significant figures in us below 1 ms, in ms below 1 s, else in s
    (1740e-6 prints as 1.74 ms, not 1.74e+03 us)."""
    rounded = abs(float(f"{seconds:.3g}"))
    for scale, unit in ((1e6, "us"), (1e3, "ms")):
        if rounded * scale < 1e3:
            return f"{seconds * scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def _pct(value: float) -> str:
    return f"{value:.1f}%" if math.isfinite(value) else "-"


def with_terms(profile: Profile, x: np.ndarray, count: int, host: HostModel) -> Profile:
    """``profile`` with front-end lane times ``x[0]`` (per request), ``x[1]`` (per output token),
    ``x[2]`` (per engine step) and host contention ``x[3]``."""
    fe = FrontendModel(count, float(x[0]), profile.overheads.api_server_per_token_s, float(x[1]), float(x[2]))
    return replace(profile, frontend=fe, host=replace(host, contention=float(x[3])))


def fit_frontend(bursts: list[Burst], profile: Profile, cores: int, baseline_busy: float,
                 api_server_count: int = 1, seeds: tuple[int, ...] = (0,), max_evals: int = 120,
                 client_busy: float = 0.0, refine_evals: int = 0, engine_spin_s: float = 0.0,
                 baseline_stream_busy: float = 0.0, api_on_engine_core: bool = False,
                 api_contention: float = 0.0, client_core: int = -1) -> FrontendFit:
    """Fit the front-end and host terms to ``bursts`` (see the module doc).

    Args:
        bursts: measured bursts (:func:`load_bursts`).
        profile: the one-at-a-time profile (its step costs and overheads stay).
        cores: the host's CPU cores during the sweep.
        baseline_busy: busy processes while the step costs were measured (the servers of the
            one-at-a-time sweep, which ran concurrently).
        api_server_count: API processes per server.
        seeds: simulation seeds averaged per evaluation.
        max_evals: Nelder-Mead function evaluations of stage 1.
        client_busy: processes of the measuring client on the same host (1; 0 when it ran
            elsewhere), busy while an API lane has a backlog (``HostModel.client_busy``).
        refine_evals: evaluations of a final joint Nelder-Mead refinement of all the terms on
            every burst (0: none).
        engine_spin_s: seconds an idle engine stays busy (``HostModel.engine_spin_s``; stated,
            not fitted: vLLM's shared-memory queue busy-polls for 1 s).
        baseline_stream_busy: processes that streamed while the decode steps were measured
            (``HostModel.baseline_stream_busy``: the sweep's servers' API processes and the
            client; 0: none counted).
        api_on_engine_core: each server's API process ran on its engine's core
            (``HostModel.api_on_engine_core``; ``kvroute serve --api-cores own``).
        api_contention: with ``api_on_engine_core``, the stretch of lane work beside a busy
            engine (``HostModel.api_contention``; stated, not fitted: 1 for fair sharing).
        client_core: with ``api_on_engine_core``, the server whose core the measuring client
            was pinned to (``HostModel.client_core``; stated; -1: it floated).

    Raises:
        ValueError: no bursts.
    """
    from scipy.optimize import minimize, minimize_scalar

    if not bursts:
        raise ValueError("the sweep holds no bursts (run 'kvroute calibrate measure' without --no-bursts)")
    checked = bursts
    bursts = [b for b in bursts if not b.prefix_len] or bursts  # fitted to cold bursts, see FrontendFit
    host = HostModel(cores=cores, contention=0.0, baseline_busy=baseline_busy, client_busy=client_busy,
                     engine_spin_s=engine_spin_s, baseline_stream_busy=baseline_stream_busy,
                     api_on_engine_core=api_on_engine_core, api_contention=api_contention,
                     client_core=client_core if api_on_engine_core else -1)
    scale = np.array([max(profile.overheads.api_server_s, 1e-3), 1e-4, 1e-4])
    one = [b for b in bursts if b.num_servers == 1] or bursts
    loaded = [b for b in bursts if b.num_servers > 1]
    evals = 0
    terms = 0  # residuals in the last loss evaluated

    def loss(group: list[Burst], x: np.ndarray) -> float:
        nonlocal evals, terms
        evals += 1
        prof = with_terms(profile, x, api_server_count, host)
        total, terms = 0.0, 0
        for b in group:
            pred = simulate_burst(b, prof, seeds)
            for m in METRICS:
                meas = b.measured[m]
                if meas > 0 and pred[m] > 0:
                    total += math.log(pred[m] / meas) ** 2
                    terms += 1
        return total

    # stage 1: the API lane times from bursts on one server (its engine and API process alone
    # rarely oversubscribe the cores), from the best point of a coarse grid
    lane = lambda z: loss(one, np.array([*(np.maximum(z, 0.0) * scale), 0.0]))  # noqa: E731
    grid = [np.array([a, o, st]) for a in (0.1, 0.25, 0.5, 1.0, 2.0, 4.0) for o in (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
            for st in (0.0, 1.0, 3.0, 10.0, 30.0)]
    z0 = min(grid, key=lane)
    res = minimize(lane, z0, method="Nelder-Mead", bounds=list(LANE_BOUNDS),
                   options={"maxfev": max_evals, "xatol": 1e-3, "fatol": 1e-5})
    x = np.maximum(res.x, 0.0) * scale
    # stage 2: the host's contention from bursts on all servers at once (and on one server when
    # a stated busy client already oversubscribes the cores there)
    contention, interval = 0.0, (math.nan, math.nan)
    group = loaded if client_busy == 0 else bursts
    if group:
        r2 = minimize_scalar(lambda c: loss(group, np.array([*x, c])), bounds=(0.0, CONTENTION_BOUND), method="bounded",
                             options={"xatol": 0.01, "maxiter": 30})
        contention = float(r2.x)
    x = np.array([*x, contention])
    if refine_evals > 0:
        s3 = np.array([*scale, 1.0])
        r3 = minimize(lambda z: loss(bursts, np.maximum(z, 0.0) * s3), x / s3, method="Nelder-Mead",
                      bounds=[*LANE_BOUNDS, (0, CONTENTION_BOUND)],
                      options={"maxfev": refine_evals, "xatol": 1e-3})
        x = np.maximum(r3.x, 0.0) * s3
    objective = loss(bursts, x)
    if group:  # at the final terms: the range holds the contention the profile carries
        interval = contention_interval(lambda c: loss(bursts, np.array([*x[:3], c])), float(x[3]), float(objective),
                                       terms)
    walls = burst_walls(lambda z: loss(bursts, z), x, scale, float(objective) if group else None)
    fitted = with_terms(profile, x, api_server_count, host)
    before = burst_table(checked, profile)
    after = burst_table(checked, fitted)
    from kvroute.calibrate.calibration.walls import burst_scatter

    return FrontendFit(fitted.frontend, fitted.host, before, after, float(objective), evals, interval,
                       tuple(walls), tuple(burst_scatter(bursts)))


LANE_BOUNDS = ((0.0, 40.0), (0.0, 300.0), (0.0, 300.0))
"""Bounds of the three API-lane terms in :func:`fit_frontend`'s Nelder-Mead search, in units of
its scale (the unloaded API-server time, 100 us, 100 us)."""

LANE_TERMS = ("frontend.per_request_s", "frontend.per_output_token_s", "frontend.per_step_s")


def burst_walls(loss, x: np.ndarray, scale: np.ndarray, objective: float | None) -> list:
    """The burst terms at a bound (:class:`~kvroute.calibrate.calibration.walls.Wall`): a lane
    term on an end of :data:`LANE_BOUNDS` (not refitted), and the host contention on
    :data:`CONTENTION_BOUND`, refitted up to ``walls.ASK_LIMIT`` times it with the lane terms
    fixed (``loss(z)``: the fit's objective over every burst at terms ``z``) to give what the
    bursts ask for. ``objective`` None: contention was not fitted."""
    from kvroute.calibrate.calibration.walls import BOUND_TOL, Wall, asked_beyond, at_upper

    walls = []
    for k, (name, (low, high)) in enumerate(zip(LANE_TERMS, LANE_BOUNDS)):
        value = float(x[k] / scale[k])
        if at_upper(value, high):
            walls.append(Wall(name, high * float(scale[k]), "upper", float(x[k]), note="the lane-time search's bound"))
        elif value <= BOUND_TOL * high and low == 0.0 and x[k] == 0.0:
            walls.append(Wall(name, 0.0, "lower", 0.0, note="the bursts ask for no such lane time, or less than none"))
    if objective is not None and at_upper(float(x[3]), CONTENTION_BOUND):
        asked, at_bound, at_asked = asked_beyond(lambda c: loss(np.array([*x[:3], c])), CONTENTION_BOUND)
        walls.append(Wall("host.contention", CONTENTION_BOUND, "upper", float(x[3]), asked, at_bound, at_asked,
                          "the bursts ask for more engine slowdown under load than the host model gives at its "
                          "bound; see docs/log/2026-12-05-fit-walls.md for the causes found"))
    return walls


CONTENTION_GRID = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, CONTENTION_BOUND)
"""Contention values at which :func:`contention_interval` evaluates the burst loss first."""

INTERVAL_BISECTIONS = 6
"""Bisections of the grid step where the loss crosses the bound, on each side of the fitted
contention (a 64th of that step: on one sweep the grid alone gave "0.936-0.936", its neighbours
0.8 and 1.6 both outside)."""


def contention_interval(loss, best: float, best_loss: float, num_terms: int,
                        bisections: int = INTERVAL_BISECTIONS) -> tuple[float, float]:
    """How well the bursts pin ``host.contention`` down: the range around ``best`` whose loss stays
    within the approximate 95 % profile-likelihood bound ``best_loss * (1 + 3.84 / n)`` (squared
    log errors taken as independent Gaussian residuals of one variance, estimated by
    ``best_loss / n``; chi-square with one degree of freedom). Walking out from ``best`` over
    ``CONTENTION_GRID`` (each grid point simulated only when reached), each end is the last point
    within the bound, refined by ``bisections`` halvings of the grid step where the loss first
    exceeds it. The API lane terms stay at their
    fitted values, so the range is conditional on them: it is a lower bound on the real
    uncertainty.

    Args:
        loss: ``loss(c)``: the fit's final objective over every burst (sum of squared log
            ratios) at contention ``c``, the lane terms at their final values (after the joint
            refinement: a range taken at stage 2 could leave out the contention the refinement
            moved to, 1.03 outside 0.8-0.991 on one sweep).
        best, best_loss: the fitted contention and its loss.
        num_terms: the residuals in ``best_loss`` (n).
        bisections: halvings of a grid step at each end.

    Returns:
        ``(low, high)``, contention (dimensionless); ``(best, best)`` when no residuals.
    """
    if num_terms == 0:
        return best, best
    bound = best_loss * (1.0 + 3.84 / num_terms)

    def end(points: list[float]) -> float:
        inside = best
        for c in points:
            if loss(c) > bound:
                outside = c
                for _ in range(bisections):
                    mid = 0.5 * (inside + outside)
                    inside, outside = (mid, outside) if loss(mid) <= bound else (inside, mid)
                return inside
            inside = c
        return inside

    low = end(sorted((c for c in CONTENTION_GRID if c < best), reverse=True))
    high = end(sorted(c for c in CONTENTION_GRID if c > best))
    return float(low), float(high)


def _misfit_doc(before: float, after: float, figures: int) -> dict:
    """:meth:`FrontendFit.latency_misfit` for the profile (six significant digits)."""
    return {"without_terms": float(f"{before:.6g}"), "with_terms": float(f"{after:.6g}"), "figures": figures}


def profile_sections(ff: FrontendFit) -> dict:
    """The profile's ``frontend`` and ``host`` sections, with their sources and burst errors."""
    f, h = ff.frontend, ff.host
    r = lambda v: float(f"{v:.6g}")  # noqa: E731
    return {
        "frontend": {"api_server_count": f.api_server_count, "per_request_s": r(f.per_request_s),
                     "per_prompt_token_s": r(f.per_prompt_token_s), "per_output_token_s": r(f.per_output_token_s),
                     "per_step_s": r(f.per_step_s)},
        "host": {"cores": h.cores, "contention": r(h.contention), "baseline_busy": r(h.baseline_busy),
                 "baseline_stream_busy": r(h.baseline_stream_busy),
                 "client_busy": r(h.client_busy), "engine_spin_s": r(h.engine_spin_s),
                 "engine_speed_sigma": r(h.engine_speed_sigma), "engine_speed_period_s": r(h.engine_speed_period_s),
                 **({"api_on_engine_core": True} if h.api_on_engine_core else {}),
                 **({"api_contention": r(h.api_contention)} if h.api_contention > 0 else {}),
                 **({"client_core": h.client_core} if h.client_core >= 0 else {})},
        "burst_fit": {
            "method": "Nelder-Mead on squared log ratios of simulated to measured burst figures (scipy)",
            "evaluations": ff.evaluations,
            "objective": r(ff.objective),
            **({"contention_interval": [r(v) for v in ff.contention_interval]}
               if math.isfinite(ff.contention_interval[0]) else {}),
            "num_bursts": int(ff.after["exp_id"].nunique()) if len(ff.after) else 0,
            "at_bound": [w.to_dict() for w in ff.walls],
            "median_abs_error_pct_without_terms": _rounded(error_summary(ff.before)),
            "median_abs_error_pct_with_terms": _rounded(error_summary(ff.after)),
            "cold_latency_misfit": _misfit_doc(*ff.latency_misfit()),
        },
        "sources": {
            "frontend": "fitted to the concurrency sweep's bursts (kvroute.calibrate.calibration.bursts), with the API "
                        "process's CPU seconds per burst where the servers export process_cpu_seconds_total; "
                        "per_prompt_token_s is overheads.api_server_per_token_s",
            "host.cores": "os.cpu_count() of the calibrating client (servers on the same host)",
            "host.baseline_busy": "servers measured concurrently in the one-at-a-time sweep",
            "host.baseline_stream_busy": "stated: the sweep's servers' API processes and the measuring client "
                                         "(client_busy), which streamed while its decode steps were timed",
            "host.contention": "fitted to the concurrency sweep's bursts with the front-end terms",
            "host.client_busy": "stated: the measuring client on the same host, busy while responses stream",
            **({"host.api_contention": "stated (kvroute calibrate fit --api-contention; 1: fair sharing of an "
                                       "engine's core by its API process, kvroute serve --api-cores own): lane work "
                                       "beside an engine with requests takes 1 + api_contention times as long"}
               if h.api_contention > 0 else {}),
            **({"host.client_core": "stated (kvroute calibrate fit --client-core): the server whose engine core "
                                    "the measuring client was pinned to (calibrate measure --client-cores)"}
               if h.client_core >= 0 else {}),
            "host.engine_spin_s": "stated: vLLM's shared-memory MessageQueue busy-polls for busy_loop_s = 1 s after "
                                  "its last read (vllm/distributed/device_communicators/shm_broadcast.py)",
            "host.engine_speed_sigma": "with engine_speed_period_s, by maximum likelihood over the servers' token "
                                       "streams in the bursts sent to every server at once (windows within each burst, "
                                       "or one mean TPOT per burst without token times; "
                                       "kvroute.calibrate.calibration.speed.fit_speed); applied after the other terms "
                                       "were fitted",
        },
    }


def _rounded(d: dict) -> dict:
    return {k: {m: round(v, 1) for m, v in sub.items()} for k, sub in d.items()}
