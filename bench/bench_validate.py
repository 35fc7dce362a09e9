"""Accuracy of the simulator's predictions against live vLLM CPU servers, per workload shape.

    python bench/bench_validate.py                        # all shapes, default live rounds: about 12 min
    python bench/bench_validate.py --shapes short-replies --live-rounds 1     # about 1.5 min
    python bench/bench_validate.py --url http://127.0.0.1:8300 --url http://127.0.0.1:8301

Starts two tiny-model vLLM CPU servers (one core each for the engine, and by default each
server's API process on its engine's core, ``--api-cores own``; ports from ``--port-base``)
unless ``--url`` is given. For each workload shape it replays the trace live under round_robin
and kv_aware (prefix cache reset before each), ``--live-rounds`` times (by default
``LIVE_ROUNDS`` of the shape; interleaved: ``kvroute
validate --live-rounds``; the report of all rounds goes to ``--out/<shape>/``), then simulates it
(``--rounds`` seeds) with each ``--profile`` and scores every profile against the same live
rounds. The simulation delays each later turn by a send lag drawn from the live client's measured
ones and sends each root request at its measured send offset
(``kvroute.calibrate.validation.validate.with_measured_client``).

Shapes:
- ``long-chats``: 12 chats x 6 turns, 3,904-token system prompt and user turns, 16-token replies
  (prompts to 27k tokens; prefill-heavy), closed loop, all chats at once;
- ``short-replies``: 8 chats x 4 turns, a 2,048-token shared system prompt, 256-token user turns
  (plus 3 generation-prompt tokens), 32-token replies, closed loop, all chats at once;
- ``open-loop``: Poisson arrivals at rising rates (1, 2, 4, 8 requests/s, 5 s each; 61
  requests), each request one of 16 shared 6,144-token documents plus 256 new tokens, 32-token
  replies (a cold prefill takes about 0.2 s, so round_robin's misses queue at the higher rates).

Targets on this 2-core machine, per shape and policy: time to complete within 15 %, TTFT
(turns >= 2 for chats, all requests open loop) within 25 %, TPOT within 25 %; the change
kv_aware vs round_robin of time to complete and of that TTFT within 8 percentage points. Each
figure is printed with the number of live rounds behind it and the load average (1 min) at the
start and end of the shape's live rounds: live timings on a shared machine move with its load.
Before each shape a speed probe (three cold 2,048-token requests and one 8,192-token request one
at a time on each server, then four per server on every server at once:
``kvroute.calibrate.validation.probe``) times the servers, and again after its live rounds; its
change against the first probe, taken right after ``--calibrate``, says how far the host's speed
moved under the run. Without ``--calibrate`` each profile is scored rescaled to the probes' speed
(``kvroute.sim.timing.speed_scale``, rows ``<name> x probe``; ``--no-speed-scale``: as it is).
The probes around each shape's rounds give the drift factor that scales and widens its
prediction intervals (``kvroute.sim.timing.drift``), and the script ends with the coverage:
how many measured values fall inside their ``--interval-level`` (90 %) interval, which also holds
the seeds', the live rounds' and ``--uncertainty`` drawn profiles' spread
(``kvroute.sim.study.intervals``; docs/reference/intervals.md). Around each shape's
live rounds the host's CPU accounting (``/proc/stat``) gives its busy and hypervisor-stolen shares
(a note per shape; ``host_cpu`` in ``summary.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import gzip
import pickle
import sys
import time
from pathlib import Path

TARGETS = {"time_to_complete_s": 15.0, "ttft": 25.0, "tpot_mean_s": 25.0}
CHANGE_TARGET_PP = 8.0
SHAPES = ("long-chats", "short-replies", "open-loop")
LIVE_ROUNDS = {"long-chats": 3, "short-replies": 20, "open-loop": 6}
"""Default live rounds per shape: enough rounds that the 90 % interval of a measured change
between policies is narrower than the 8 pp target. A short-reply round takes about 1 s and its
rounds differ so much that from a few rounds that interval is wider than the target itself,
hence 20; the long chats' changes are narrow from 3 rounds; the open loop's TPOT moves from round
to round, hence 6 (a round takes about 20 s). (The measurements behind these defaults:
docs/log/from-code-comments.md.)"""
DEFAULT_PROFILES = ("cpu-tiny-qwen2-x2-bursts", "cpu-tiny-qwen2-x2")


def live_rounds_arg(text: str) -> dict[str, int]:
    """``--live-rounds``: ``N`` (every shape) or ``SHAPE=N,SHAPE=N`` -> ``{shape: rounds}``.

    Raises:
        argparse.ArgumentTypeError: a count that is not a positive integer, or an unknown shape.
    """
    def count(value: str) -> int:
        if not value.strip().isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"a positive integer, got {value!r}")
        return int(value)

    if "=" not in text:
        return dict.fromkeys(SHAPES, count(text))
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        shape, _, value = part.partition("=")
        if shape.strip() not in SHAPES:
            raise argparse.ArgumentTypeError(f"unknown shape {shape.strip()!r}; choose from {', '.join(SHAPES)}")
        out[shape.strip()] = count(value)
    return out


def open_loop_trace(rates=(1.0, 2.0, 4.0, 8.0), phase_s: float = 5.0, docs: int = 16, doc_tokens: int = 6144,
                    new_tokens: int = 256, reply: int = 32, block_size: int = 32, seed: int = 0):
    """Poisson arrivals at each rate in ``rates`` (requests/s) for ``phase_s`` seconds each; every
    request is one of ``docs`` shared documents of ``doc_tokens`` tokens plus ``new_tokens`` of
    its own (whole blocks), ``reply`` output tokens. Seeded: the same seed gives the same trace."""
    import numpy as np

    from kvroute.traces.format import Trace, TraceRecord

    rng = np.random.default_rng(seed)
    nd, nn = doc_tokens // block_size, new_tokens // block_size
    records, t0, rid = [], 0.0, 0
    for rate in rates:
        t = t0 + rng.exponential(1.0 / rate)
        while t < t0 + phase_s:
            d = int(rng.integers(docs))
            hashes = tuple(range(d * nd, (d + 1) * nd)) + tuple(range(10**6 + rid * nn, 10**6 + (rid + 1) * nn))
            records.append(TraceRecord(rid, 1000.0 * t, nd * block_size + nn * block_size, reply, hashes))
            rid += 1
            t += rng.exponential(1.0 / rate)
        t0 += phase_s
    return Trace(records, block_size=block_size, source="open-loop rising rates")


def client_cpu_note(shape: str, validation) -> str:
    """The client's measured CPU share (CPU seconds per wall second of its live rounds), per policy."""
    from kvroute.calibrate.validation.rounds import spread
    from kvroute.calibrate.validation.validate_report import client_cpu_share

    parts = []
    for policy, runs in validation.policy_rounds().items():
        mean = spread([client_cpu_share(r) for r in runs])["mean"]  # as the report's client_cpu_share
        parts.append(f"{policy} not measured" if math.isnan(mean) else f"{policy} {100 * mean:.0f} %")
    return f"{shape}: the client's CPU share in the live rounds (mean over rounds): {', '.join(parts)}"


CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The host's CPU states, in the order of ``/proc/stat``'s first line (proc(5))."""


def host_cpu_times(path: Path = Path("/proc/stat")) -> dict[str, int] | None:
    """The host's cumulative CPU time per state (:data:`CPU_STATES`), clock ticks over every core;
    None where ``path`` cannot be read (not Linux) or its first line is not ``cpu`` and eight
    counts (a live run's rounds are not lost to the note)."""
    try:
        fields = path.read_text().split("\n", 1)[0].split()
        counts = [int(x) for x in fields[1:1 + len(CPU_STATES)]]
    except (OSError, ValueError):
        return None
    return dict(zip(CPU_STATES, counts)) if fields[:1] == ["cpu"] and len(counts) == len(CPU_STATES) else None


def host_cpu_shares(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, float] | None:
    """Percent of the host's CPU time between two :func:`host_cpu_times` readings: ``busy`` (every
    state but idle, iowait and steal) and ``steal`` (time the hypervisor ran something else on a
    virtual core that had work: a cause of a host running slower than its calibration that the
    model cannot see). None without both readings or without ticks between them."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in CPU_STATES}
    total = sum(delta.values())
    if total <= 0:
        return None
    busy = total - delta["idle"] - delta["iowait"] - delta["steal"]
    return {"busy": 100.0 * busy / total, "steal": 100.0 * delta["steal"] / total}


def make_trace(shape: str):
    """The trace of a workload shape (see the module doc)."""
    from kvroute.traces.generators import seed_chat

    if shape == "long-chats":
        return seed_chat(num_chats=12, num_turns=6, system_words=3000, user_words=3000, reply_tokens=16, block_size=32)
    if shape == "short-replies":
        return seed_chat(num_chats=8, num_turns=4, system_words=2044, user_words=252, reply_tokens=32,
                         tokens_per_word=1.0, block_size=32)
    if shape == "open-loop":
        return open_loop_trace()
    raise SystemExit(f"--shapes: unknown shape {shape!r}; choose from {', '.join(SHAPES)}")


KV_EVENTS_PORT_OFFSET = 100
"""With ``--kv-events``, server ``i`` publishes its KV-cache events on ``--port-base + 100 + i``."""


@contextlib.contextmanager
def _servers(urls: list[str], log_dir: Path, port_base: int, api_cores: str = "spare", kv_events: bool = False):
    """Yields ``(urls, kv_event_endpoints)``: the given servers (no endpoints), or two started here."""
    if urls:
        yield urls, []
        return
    from kvroute.calibrate.live.plan import plan_servers
    from kvroute.calibrate.live.server import serve_many
    from kvroute.calibrate.calibration.tiny_model import TINY_MODEL_NAME, build_tiny_model

    model = str(build_tiny_model())
    specs = plan_servers(model, 2, port_base=port_base, served_model_name=TINY_MODEL_NAME, block_size=32,
                         kv_cache_gib=1, log_dir=log_dir, device="cpu", api_cores=api_cores,
                         kv_events_port_base=port_base + KV_EVENTS_PORT_OFFSET if kv_events else None)
    print(f"starting {len(specs)} vLLM CPU servers (logs in {log_dir}) ...", file=sys.stderr)
    with serve_many(specs, timeout_s=900) as servers:
        yield [s.url for s in servers], [s.kv_events_endpoint for s in servers if s.kv_events_endpoint]


def score(shape: str, profile_name: str, runs, validation, rounds: int, load: tuple[float, float],
          level: float = 0.90, profile_raw: dict | None = None, one_round: bool = False,
          run_to_run_prior: float = 0.0) -> tuple[list, int]:
    """Predicted (``runs``, one per policy) against measured (the live rounds of ``validation``)
    for one shape and profile; returns (rows, targets missed). Each row also says whether the
    measured value falls inside its ``level`` prediction interval (``inside``, ``interval``:
    ``kvroute.sim.study.intervals.combined_interval`` over the simulated runs, drawn profiles,
    live rounds, the probes' drift, ``validation.drift``, and the fit's held-out error from the
    profile document ``profile_raw``, ``kvroute.sim.timing.heldout``), for :func:`coverage_lines`.
    As ``kvroute validate`` does (``validate_report.round_values``, ``round_changes``), a live
    round cut short (interrupted, or a worker died) is left out of the measured mean and of the
    pairs a change is taken over (``left_out``), and with none whole the row is not checked
    (``inside`` None, ``not_checked`` why); with a single whole round (or pair) its interval
    takes the host prior ``run_to_run_prior``, as ``validate`` does with one live round.

    ``one_round``: also score every live round on its own, as ``kvroute validate`` does with its
    default single live round: each round's value against the interval made from that round
    alone (rows with ``one_round`` True and the round's index in ``round``; not counted in the
    targets missed, and kept apart from the rounds' means in the coverage), with the host prior
    ``run_to_run_prior`` standing for the spread one round cannot show, as ``validate`` does
    (``ValidationSpec.run_to_run_prior``); a round cut short is not checked."""
    from kvroute.calibrate.validation.rounds import diff_interval, error_pct, finite
    from kvroute.sim.cluster.metrics import change_pct
    from kvroute.calibrate.validation.validate_report import (change_interval, cut_short, metric_interval,
                                                              round_changes, round_values)
    from kvroute.sim.cluster.metrics import summarize

    live = validation.policy_rounds()
    chats = any(math.isfinite(r.measured.get("later_ttft_mean_s", math.nan)) for r in validation.runs)
    ttft_key = "later_ttft_mean_s" if chats else "ttft_mean_s"
    drifts = getattr(validation, "drift", None) or {}

    def rounds_of(i: int) -> list:
        return live.get(runs[i].policy, [])

    def checked(rows: dict, ci, measured: float, why: str | None) -> dict:
        """The row's interval and ``inside`` (None, and ``not_checked``, when ``why`` is given)."""
        return dict(rows, interval=[ci.low, ci.high], inside=None if why else ci.contains(measured), level=level,
                    **({"not_checked": why} if why else {}))

    def single_rounds(values: list[float], whys: list[str | None], numbers: list[int], interval_of,
                      **row) -> list[dict]:
        """With ``one_round``, each live round's value scored against ``interval_of([value])``
        (not checked when ``whys`` says the round, or a side of its pair, was cut short)."""
        if not one_round:
            return []
        return [checked(dict(row, measured=x, live_rounds=1, round=j, one_round=True, sim_rounds=rounds),
                        interval_of([x]), x, why)
                for x, why, j in zip(values, whys, numbers)]

    rows, missed = [], 0
    for i, run in enumerate(runs):
        for metric in ("time_to_complete_s", ttft_key, "tpot_mean_s", "hit_rate"):
            if not rounds_of(i):
                continue
            counted = round_values(rounds_of(i), metric)
            ms = finite(counted.values)
            p, m = run.predicted[metric], counted.measured
            e = error_pct(p, m)
            target = TARGETS.get("ttft" if "ttft" in metric else metric)
            ok = None if target is None else abs(e) <= target
            missed += ok is False
            ci = metric_interval(run, metric, counted.values, level=level, drifts=drifts, profile_raw=profile_raw,
                                 run_log_sd=run_to_run_prior)
            rows.append(checked(dict(shape=shape, profile=profile_name, policy=run.policy, metric=metric, predicted=p,
                                     measured=m, measured_min=min(ms, default=math.nan),
                                     measured_max=max(ms, default=math.nan), live_rounds=len(ms),
                                     left_out=counted.left_out, sim_rounds=rounds, error_pct=e, target_pct=target,
                                     ok=ok, load_start=load[0], load_end=load[1]), ci, m, counted.not_checked))
            every = rounds_of(i)
            rows += single_rounds([r.measured[metric] for r in every], [cut_short([r]) for r in every],
                                  [r.live_round for r in every],
                                  lambda x: metric_interval(run, metric, x, level=level, drifts=drifts,
                                                            profile_raw=profile_raw, run_log_sd=run_to_run_prior),
                                  shape=shape, profile=profile_name, policy=run.policy, metric=metric, predicted=p)
    if len(runs) == 2 and all(rounds_of(i) for i in (0, 1)):
        base, kv = runs
        simulated = [[summarize(r) for r in run.sim_runs] for run in runs]
        for metric in ("time_to_complete_s", ttft_key):
            counted = round_changes(rounds_of(0), rounds_of(1), metric)
            p, m = change_pct(kv.predicted[metric], base.predicted[metric]), counted.measured
            ok = abs(p - m) <= CHANGE_TARGET_PP
            missed += not ok
            lo, hi = diff_interval([[x[metric] for x in sims] for sims in simulated],
                                   [[side.measured[metric] for side in sides] for sides in zip(*counted.runs)])
            ci = change_interval(base, kv, metric, counted.values, level=level, run_log_sd=run_to_run_prior)
            rows.append(checked(dict(shape=shape, profile=profile_name, policy=f"{kv.policy} vs {base.policy}",
                                     metric=f"change {metric}", predicted=p, measured=m,
                                     live_rounds=len(finite(counted.values)), left_out=counted.left_out,
                                     sim_rounds=rounds, error_pp=p - m, interval_pp=[lo, hi],
                                     target_pp=CHANGE_TARGET_PP, ok=ok, load_start=load[0], load_end=load[1]),
                                ci, m, counted.not_checked))
            every = list(zip(rounds_of(0), rounds_of(1)))
            rows += single_rounds([change_pct(k.measured[metric], b.measured[metric]) for b, k in every],
                                  [cut_short([b, k]) for b, k in every], [k.live_round for _, k in every],
                                  lambda x: change_interval(base, kv, metric, x, level=level,
                                                            run_log_sd=run_to_run_prior),
                                  shape=shape, profile=profile_name, policy=f"{kv.policy} vs {base.policy}",
                                  metric=f"change {metric}", predicted=p)
    return rows, missed


def coverage_lines(rows: list[dict]) -> list[str]:
    """Coverage of the rows' prediction intervals (``inside``), per profile over every shape,
    policy and measure, and per profile and shape, each with the number of figures checked and
    the live rounds behind them (``kvroute.sim.study.intervals.coverage``)."""
    from kvroute.sim.study.intervals import coverage

    lines = []
    for one in (False, True):
        for profile in dict.fromkeys(r["profile"] for r in rows):
            mine = [r for r in rows if r["profile"] == profile and "inside" in r and bool(r.get("one_round")) == one]
            if not mine:
                continue
            level = mine[0]["level"]
            c = coverage(r["inside"] for r in mine)
            share = "-" if c["share"] is None else f"{100 * c['share']:.0f} %"
            parts = []
            for shape in dict.fromkeys(r["shape"] for r in mine):
                cs = coverage(r["inside"] for r in mine if r["shape"] == shape)
                rounds = sorted({r["live_rounds"] for r in mine if r["shape"] == shape})
                parts.append(f"{shape} {cs['inside']}/{cs['checked']} "
                             + ("(single rounds)" if one else f"({'/'.join(map(str, rounds))} live rounds)"))
            what = ("single live rounds inside their one-round" if one else "measured values inside the")
            lines.append(f"coverage {profile}: {c['inside']} of {c['checked']} {what} "
                         f"{100 * level:g} % interval ({share}; target >= 85 %): " + ", ".join(parts))
    return lines


def print_rows(rows: list[dict]) -> None:
    """One line per figure (the rounds' means; single-round rows are counted in the coverage only),
    then a line per figure whose live rounds cut short were left out or that was not checked."""
    rows = [r for r in rows if not r.get("one_round")]
    cut = [r for r in rows if r.get("left_out") or r.get("not_checked")]
    print(f"{'shape':<14} {'profile':<26} {'policy':<24} {'metric':<28} {'predicted':>10} {'measured':>10} "
          f"{'error':>9} {'target':>7} {'live':>4} {'load':>10}  ok")
    for r in rows:
        load = f"{r['load_start']:.1f}-{r['load_end']:.1f}"
        if "error_pp" in r:
            lo, hi = r["interval_pp"]
            print(f"{r['shape']:<14} {r['profile']:<26} {r['policy']:<24} {r['metric']:<28} {r['predicted']:>+9.1f}% "
                  f"{r['measured']:>+9.1f}% {r['error_pp']:>+7.1f}pp {'±8pp':>7} {r['live_rounds']:>4} {load:>10}  "
                  f"{'yes' if r['ok'] else 'NO'}  (90% interval of the diff [{lo:+.1f}, {hi:+.1f}] pp"
                  f"{'; wider than the target: more live rounds' if (hi - lo) / 2 > CHANGE_TARGET_PP else ''})")
        else:
            tgt = "-" if r["target_pct"] is None else f"±{r['target_pct']:g}%"
            ok = "" if r["ok"] is None else "yes" if r["ok"] else "NO"
            print(f"{r['shape']:<14} {r['profile']:<26} {r['policy']:<24} {r['metric']:<28} {r['predicted']:>10.4f} "
                  f"{r['measured']:>10.4f} {r['error_pct']:>+8.1f}% {tgt:>7} {r['live_rounds']:>4} {load:>10}  {ok}")
    for r in cut:
        left = ", ".join(f"{x['live_round'] + 1} ({x['why']})" for x in r.get("left_out") or [])
        print(f"{r['shape']} {r['profile']} {r['policy']} {r['metric']}: "
              + (f"not checked (every live round cut short: {r['not_checked']})" if r.get("not_checked")
                 else f"live rounds cut short, left out of the mean and its interval: {left}"))


def _rounds_with_prediction(runs, validation):
    """Per predicted policy run in ``runs`` that has live rounds in ``validation``: ``(run, rounds)``,
    each round given that prediction (what the engine-time tables compare)."""
    live = validation.policy_rounds()
    for pred in runs:
        rounds = live.get(pred.policy, [])
        if rounds:
            for r in rounds:
                r.take_prediction(pred)
            yield pred, rounds


def time_split(shape: str, profile_name: str, runs, validation) -> list[str]:
    """Per policy, where a request's time goes (``kvroute.calibrate.validation.engine_times``):
    TTFT, engine queue, engine prefill, front end and engine decode time, predicted (``runs``)
    / measured (mean of ``validation``'s live rounds), ms. Informational: no targets."""
    from kvroute.calibrate.validation.engine_times import engine_rows

    lines = []
    for pred, rounds in _rounds_with_prediction(runs, validation):
        cells = []
        for key, row in engine_rows(rounds).items():
            if row["predicted"] is None and row["measured"] is None:
                continue
            p, m = (f"{1000 * v:.1f}" if v is not None else "-" for v in (row["predicted"], row["measured"]))
            cells.append(f"{key} {p}/{m}")
        lines.append(f"{shape} {profile_name} {pred.policy}: " + ", ".join(cells))
    return lines


def convoy_split(shape: str, profile_name: str, runs, validation) -> list[str]:
    """Per policy, one line of later turns' TTFT by position in their convoy, split at the
    engine's first token (``kvroute.calibrate.validation.engine_times.convoy_rows``), ms
    predicted/measured; [] without live engine first-token times (``--kv-events``)."""
    from kvroute.calibrate.validation.engine_times import convoy_rows

    lines = []
    for pred, rounds in _rounds_with_prediction(runs, validation):
        rows = convoy_rows(rounds)
        if rows:
            lines.append(f"{shape} {profile_name} {pred.policy}: " + "; ".join(
                f"{r['position']}: engine {1000 * r['predicted_engine']:.1f}/{1000 * r['measured_engine']:.1f}, "
                f"out {1000 * r['predicted_out']:.1f}/{1000 * r['measured_out']:.1f} (n={r['count']})" for r in rows))
    return lines


def period_variants(profile) -> list:
    """``profile`` with its engine-speed period set to each end of the interval its sweep allows
    (``provenance.fit.bursts.engine_speed_period_interval_s``; an open end is one speed per run),
    for the ends that differ from its own period; none without such an interval. The closed-loop
    TTFT change between policies hangs on that period, which a sweep pins down poorly."""
    from dataclasses import replace

    host, interval = profile.host, profile.speed_period_interval()
    if host is None or host.engine_speed_sigma <= 0 or interval is None:
        return []
    out = []
    for end in interval:
        period = 0.0 if end == float("inf") else end  # HostModel: period 0 is one speed per run
        if abs(period - host.engine_speed_period_s) > 1e-9:
            label = "run" if period == 0.0 else f"{period:.2g}s"
            out.append(replace(profile, name=f"{profile.name}@{label}", host=replace(host, engine_speed_period_s=period)))
    return out


def client_core(client_cores: str | None, num_servers: int) -> int:
    """The server whose engine core the client is pinned to (server ``i`` on core ``i``), or -1
    when the client floats, spans several cores or sits on a core with no server."""
    from kvroute.calibrate.live.cores import core_set

    cores = sorted(core_set(client_cores) or ()) if client_cores else None
    return cores[0] if cores and len(cores) == 1 and cores[0] < num_servers else -1


def calibrate_here(urls: list[str], out: Path, longest: int | None = None, sweeps: int = 1,
                   api_cores: str = "spare", client_cores: str | None = None,
                   kv_events: list[str] | None = None) -> Path:
    """Calibrate ``urls`` in place: ``kvroute calibrate measure`` (full preset, with the
    concurrency sweep, extended to ``longest`` tokens when given) into ``out``, ``sweeps`` times
    one after another (into ``out/sweep-1``, ``out/sweep-2``, ... when more than one), then one
    ``kvroute calibrate fit`` of them all pooled (30 bootstrap refits: the fit uncertainty the
    prediction intervals draw from); returns the profile's path,
    ``out/profile.json``. The processor behind a shared machine can change from one start of it
    to the next, so a profile measured on another start carries another speed
    (docs/guide/calibrate-on-cpu.md). ``api_cores``: where the
    servers run their API processes (``own``: the fit counts the host's load per core);
    ``client_cores``: the sweep's client's cores (``measure --client-cores``); ``kv_events``:
    the servers' KV-event endpoints (``measure --kv-events``: the fit then places the unloaded
    front end before and after the engine's step). With ``own`` and a client pinned to one core
    that a server's engine runs on (server ``i`` on core ``i``, as ``kvroute serve`` places
    them), the fit is told which server shares the client's core (``fit --client-core``).

    Raises:
        SystemExit: a calibration command failed (its exit code and the folder named).
    """
    import subprocess

    kvroute = [sys.executable, "-c", "from kvroute.cli.main import main; main()"]
    dirs = [out] if sweeps == 1 else [out / f"sweep-{k}" for k in range(1, sweeps + 1)]
    steps = [kvroute + ["calibrate", "measure", "--out", str(d), "--no-progress"]
             + (["--longest", str(longest)] if longest else [])
             + (["--client-cores", client_cores] if client_cores else [])
             + [a for u in urls for a in ("--url", u)]
             + [a for e in (kv_events or []) for a in ("--kv-events", e)] for d in dirs]
    shared = client_core(client_cores, len(urls)) if api_cores == "own" else -1
    steps.append(kvroute + ["calibrate", "fit", *map(str, dirs), "--out", str(out / "profile.json"), "--bootstrap", "30",
                            "--name", "calibrated-here", "--api-cores", api_cores]
                 + (["--client-core", str(shared)] if shared >= 0 else []))
    for cmd in steps:
        print("+", " ".join(cmd[3:]), file=sys.stderr)
        rc = subprocess.run(cmd).returncode
        if rc:
            sys.exit(f"error: calibration step failed with exit code {rc}; see {out}")
    return out / "profile.json"


from kvroute.calibrate.validation.probe import PROBE_OUTPUT_TOKENS, PROBE_PROMPT_TOKENS, PROBE_REPS  # noqa: E402


def speed_probe(urls: list[str], seed: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The servers' speed now (``kvroute.calibrate.validation.probe.probe_samples``: on each server
    in turn, from a reset prefix cache, ``PROBE_REPS`` cold ``PROBE_PROMPT_TOKENS``-token requests
    one at a time). Taken before each shape's live rounds and after them, and compared with the
    probe taken right after calibrating, it tells a model error from the host changing speed
    under the run (these machines share their processors): the drift widens the intervals.

    Returns:
        ``({"ttft_s", "itl_s"}, samples)``: medians over every server and repetition of the
        client's TTFT and of each request's mean inter-token gap, s (NaN when no request
        succeeded), and the samples themselves.
    """
    import asyncio

    from kvroute.calibrate.validation.probe import median, probe_samples

    samples = asyncio.run(probe_samples(urls, seed, warn=lambda msg: print(f"warning: {msg}", file=sys.stderr)))
    return median(samples), samples


def probe_scaled(shape: str, cluster, saved_probes: dict, notes: list[str]):
    """``cluster`` with its profile rescaled to the host's speed the probes around the shape's
    live rounds measured (``probe.speed_scale``, ``kvroute.sim.timing.speed_scale``); appends a
    note with the factors."""
    from dataclasses import replace

    from kvroute.calibrate.validation.probe import speed_scale
    from kvroute.sim.timing.speed_scale import scaled_profile

    scale = speed_scale(cluster, saved_probes.get("before"), saved_probes.get("after"))
    notes.append(f"{shape}: {cluster.profile.name} rescaled to the probes' speed: {scale.describe()}")
    return replace(cluster, profile=scaled_profile(cluster.profile, scale))


def probe_drift_of(shape: str, profile_name: str, saved_probes: dict, cluster, notes: list[str]) -> dict:
    """The host's drift over a shape's live rounds for one profile (``probe.drifts``): the probes
    before and after the rounds against the probe taken right after ``--calibrate`` when there is
    one, else against the probe as ``cluster``'s profile predicts it (``probe.drifts_against``);
    appends a note saying which and what came out."""
    from kvroute.calibrate.validation.probe import drifts_against

    found, _, _ = drifts_against(saved_probes.get("before"), saved_probes.get("after"), cluster,
                                 saved_probes.get("reference"))
    against = "the probe after calibrating" if saved_probes.get("reference") else f"{profile_name}'s prediction of the probe"
    if found:
        notes.append(f"{shape}: host speed drift over the live rounds (probes before and after, against {against}): "
                     + ", ".join(f"{q} x{d.factor:.3f} (log sd {d.log_sd:.3f})" for q, d in found.items()))
    return found


def probe_note(label: str, probe: dict[str, float], first: dict[str, float] | None) -> str:
    """One line: the probe's TTFT and ITL (ms) and, against ``first``, their change (%)."""
    parts = []
    for key, name in (("ttft_s", "TTFT"), ("itl_s", "ITL")):
        text = f"{name} {1000 * probe[key]:.1f} ms"
        if first is not None and first[key] > 0:
            text += f" ({100 * (probe[key] / first[key] - 1):+.1f} %)"
        parts.append(text)
    against = " against the first probe" if first is not None else ""
    return (f"speed probe {label} ({PROBE_PROMPT_TOKENS}-token cold prompt, {PROBE_OUTPUT_TOKENS} outputs, "
            f"{PROBE_REPS} per server, medians){against}: " + ", ".join(parts))


def _live_rounds(shape: str, trace, urls: list[str], profile, args, kv_event_endpoints=()):
    """``--live-rounds`` interleaved live replays of ``trace`` under round_robin and kv_aware (one
    validation); its report goes to ``args.out/<shape>/`` and the validation (with the load
    average at the start and end) to ``args.out/<shape>/live.pickle`` for ``--rescore``."""
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report

    spec = ValidationSpec(tuple(urls), ("round_robin", "kv_aware"), sim_rounds=1, client_lag_s=0.0,
                          live_rounds=args.live_rounds.get(shape, LIVE_ROUNDS[shape]), record_tokens=True,
                          kv_event_endpoints=tuple(kv_event_endpoints))
    load_start = os.getloadavg()[0]

    def progress(msg: str) -> None:
        print(msg + (f" (load {os.getloadavg()[0]:.2f})" if msg.startswith("replaying") else ""), file=sys.stderr)

    validation = run_validation(trace, profile, spec, progress=progress)
    write_report(validation, args.out / shape)
    load = (load_start, os.getloadavg()[0])
    try:
        (args.out / shape / "live.pickle").write_bytes(pickle.dumps((validation, load)))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        print(f"warning: live rounds not saved for --rescore: {exc}", file=sys.stderr)
    return validation, load


def _saved_rounds(saved):
    """A ``live.pickle``'s validation; one saved before ``validate --live-rounds`` (a list of
    one-round validations) is merged into one, its runs numbered by round."""
    import dataclasses

    from kvroute.calibrate.validation.validate import Validation, ValidationSpec

    def current(spec) -> ValidationSpec:  # a spec pickled before a field was added gets its default
        return ValidationSpec(**{f.name: getattr(spec, f.name, f.default) for f in dataclasses.fields(ValidationSpec)})

    def field_of(obj, f):  # a field pickled before it was added: its default
        if hasattr(obj, f.name):
            return getattr(obj, f.name)
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()

    if not isinstance(saved, list):  # a Validation pickled before a field was added gets its default too
        return Validation(**{f.name: field_of(saved, f) for f in dataclasses.fields(Validation) if f.name != "spec"},
                          spec=current(saved.spec))
    first = saved[0]
    spec = current(first.spec)
    merged = Validation(first.trace, dataclasses.replace(spec, live_rounds=len(saved)), first.servers, first.sim_spec,
                        notes=[n for v in saved for n in v.notes], interrupted=any(v.interrupted for v in saved),
                        client_lag_s=first.client_lag_s, root_offsets_s=first.root_offsets_s)
    for r, v in enumerate(saved):
        for run in v.runs:
            run.live_round = r
            merged.runs.append(run)
    return merged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``parser.error`` on a bad value); ``api_cores`` and
    ``run_to_run_prior`` are filled in with their defaults when not given."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", action="append", default=[], help="Use running servers instead of starting two.")
    parser.add_argument("--port-base", type=int, default=8300, help="First port of the servers started here.")
    parser.add_argument("--api-cores", choices=("spare", "own"), default=None,
                        help="Where each server's API process runs (kvroute serve --api-cores), which --calibrate's fit "
                             "follows. own: each on its engine's core (the default for the servers this script starts); "
                             "spare: they float when every core has an engine, and the servers' decode speed flips "
                             "with where the kernel puts them (the default with --url, as kvroute serve starts them; "
                             "also for servers started with --api-cores any).")
    parser.add_argument("--client-cores", default=None, metavar="CORES",
                        help="Run this client (the sweep's and the live rounds') on these CPU cores, e.g. '1' "
                             "(default: wherever the kernel puts it).")
    parser.add_argument("--profile", action="append", default=[],
                        help=f"Profile to score (repeatable; default: {', '.join(DEFAULT_PROFILES)}).")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"Comma-separated shapes (default: all: {','.join(SHAPES)}).")
    parser.add_argument("--rounds", type=int, default=20, help="Simulation rounds (seeds) averaged per profile (default: 20).")
    parser.add_argument("--no-speed-scale", dest="speed_scale", action="store_false",
                        help="Score each profile as it is, not rescaled to the host's speed the probes around the live "
                             "rounds measure (kvroute.sim.timing.speed_scale; without --calibrate the default rescales "
                             "every profile and scores it as '<name> x probe').")
    parser.add_argument("--uncertainty", type=int, default=4, metavar="N",
                        help="Profiles drawn from each profile's fit uncertainty, x --rounds each, for the prediction "
                             "intervals (default: 4; 0: seeds only).")
    parser.add_argument("--interval-level", type=float, default=0.90, metavar="P",
                        help="Level of the prediction intervals whose coverage is reported (default: 0.90).")
    parser.add_argument("--live-rounds", type=live_rounds_arg, default={}, metavar="N|SHAPE=N,...",
                        help="Live replays per policy: N for every shape, or per shape (e.g. short-replies=60); "
                             "default per shape: " + ", ".join(f"{k} {v}" for k, v in LIVE_ROUNDS.items()) + ".")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_validate"),
                        help="Folder of the reports, live rounds and calibration (default: runs/bench_validate).")
    parser.add_argument("--calibrate", action="store_true",
                        help="First calibrate the servers themselves (kvroute calibrate measure, full sweep with "
                             "bursts, then fit; 12-17 minutes on this 2-core machine) and score that profile before the others.")
    parser.add_argument("--longest", type=int, default=None, metavar="N",
                        help="With --calibrate: extend the sweep to sequences of N tokens (calibrate measure "
                             "--longest; the long-chats shape reaches 27,442).")
    parser.add_argument("--sweeps", type=int, default=1, metavar="K",
                        help="With --calibrate: take K sweeps one after another and fit them pooled (calibrate fit "
                             "RUN_DIR...; about 17 minutes each).")
    parser.add_argument("--no-period-range", dest="period_range", action="store_false",
                        help="Do not also score the first profile at the ends of the engine-speed period interval "
                             "its sweep allows (scored by default when the profile has one; not counted as targets).")
    parser.add_argument("--kv-events", action="store_true",
                        help="Start the servers with KV-cache events (ports --port-base + 100 + i) and time each "
                             "live request's engine first token from them; the script then also prints a later "
                             "turn's TTFT by position in its convoy, split at that time. With --calibrate the sweep "
                             "reads them too, and the fit places the unloaded front end before and after the "
                             "engine's step (overheads.post_engine_s).")
    parser.add_argument("--one-round", action="store_true",
                        help="Also score every live round on its own against its one-round interval, as kvroute "
                             "validate's default single live round is checked (a coverage line of its own).")
    parser.add_argument("--run-to-run-prior", type=float, default=None, metavar="LOG_SD",
                        help="The host prior for one round's spread (kvroute validate --run-to-run-prior; default: "
                             "its default), used by --one-round and by a figure left with one whole live round when "
                             "the others were cut short.")
    parser.add_argument("--rescore", type=Path, default=None, metavar="DIR",
                        help="Score the profiles against the live rounds saved in DIR by an earlier run "
                             "(DIR/<shape>/live.pickle or live.pickle.gz), without servers.")
    args = parser.parse_args(argv)
    if args.api_cores is None:
        args.api_cores = "spare" if args.url else "own"
    if args.sweeps < 1:
        parser.error(f"--sweeps: at least 1, got {args.sweeps}")
    if not 0.0 < args.interval_level < 1.0:
        parser.error(f"--interval-level: between 0 and 1, got {args.interval_level}")
    if args.run_to_run_prior is None:
        from kvroute.sim.study.intervals import HOST_RUN_TO_RUN_LOG_SD

        args.run_to_run_prior = HOST_RUN_TO_RUN_LOG_SD
    if not 0 <= args.run_to_run_prior < math.inf:
        parser.error(f"--run-to-run-prior: a finite number >= 0, got {args.run_to_run_prior}")
    if args.uncertainty < 0:
        parser.error(f"--uncertainty: at least 0, got {args.uncertainty}")
    if args.kv_events and (args.url or args.rescore):
        parser.error("--kv-events configures the servers this script starts; it cannot be used with --url or "
                     "--rescore (live rounds saved with engine first-token times are split when rescored)")
    if args.client_cores:
        import click

        from kvroute.cli.values import Cores

        try:  # as calibrate measure reads it: cores this process may run on
            args.client_cores_set = Cores().convert(args.client_cores, None, None)
        except click.BadParameter as exc:
            parser.error(f"--client-cores: {exc.message}")
    else:
        args.client_cores_set = None
    return args


class Run:
    """What one run of the script gathers across its shapes: scored rows, the targets missed,
    notes, the time splits and convoy lines, and the host's CPU shares per shape."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.missed = 0
        self.notes: list[str] = []
        self.splits: list[str] = []
        self.convoys: list[str] = []
        self.host_cpu: dict[str, dict | None] = {}


class ProbeChain:
    """The speed probes between the shapes' live rounds: the probe after one shape's rounds is
    the next one's before.

    Attributes:
        by_shape: the medians of the probe before each shape's rounds (``{"ttft_s", "itl_s"}``, s).
        last: the samples of the probe taken last (None before the first).
        first: the samples of the first probe.
    """

    def __init__(self) -> None:
        self.by_shape: dict[str, dict[str, float]] = {}
        self.last: dict[str, list[float]] | None = None
        self.first: dict[str, list[float]] | None = None

    def before(self, urls: list[str], shape: str, k: int) -> dict[str, list[float]]:
        """The samples before ``shape``'s rounds (the ``k``-th shape): a new probe for the first,
        else the one taken after the rounds before."""
        from kvroute.calibrate.validation.probe import median

        if self.last is None:
            self.by_shape[shape], self.last = speed_probe(urls, seed=k)
            self.first = self.first or self.last
        else:
            self.by_shape[shape] = median(self.last)
        return self.last

    def after(self, urls: list[str], k: int) -> dict[str, list[float]]:
        """Probe after the ``k``-th shape's rounds; the samples."""
        self.last = speed_probe(urls, seed=100 + k)[1]
        return self.last


def saved_shape(folder: Path, shape: str):
    """A shape's live rounds saved by an earlier run in ``folder``: ``(validation, load,
    probes)`` from ``<shape>/live.pickle`` (or ``.gz``) and ``probes.json`` (``{}`` without one).
    Exits with an error naming the file when there are no rounds."""
    saved = folder / shape / "live.pickle"
    packed = saved.with_name("live.pickle.gz")  # as bench_coverage.py --keep archives it
    if not saved.exists() and not packed.exists():
        sys.exit(f"error: {saved}: no saved live rounds for shape {shape!r}")
    data = saved.read_bytes() if saved.exists() else gzip.decompress(packed.read_bytes())
    validation, load = pickle.loads(data)
    probe_file = folder / shape / "probes.json"
    return _saved_rounds(validation), load, json.loads(probe_file.read_text()) if probe_file.exists() else {}


def live_shape(shape: str, k: int, first_shape: str, trace, urls: list[str], profile, args, kv_endpoints,
               chain: ProbeChain, run: Run):
    """``shape``'s live rounds (the ``k``-th shape) between two speed probes, saved under
    ``args.out/<shape>/``; notes the probe before and the host's CPU shares in ``run``.

    Returns:
        ``(validation, load, probes)`` as :func:`saved_shape` reads them back.
    """
    before = chain.before(urls, shape, k)
    run.notes.append(probe_note(f"before {shape}", chain.by_shape[shape], chain.by_shape[first_shape] if k else None))
    print(run.notes[-1], file=sys.stderr)
    cpu_before = host_cpu_times()
    validation, load = _live_rounds(shape, trace, urls, profile, args, kv_endpoints)
    probes = {"before": before, "after": chain.after(urls, k), "reference": chain.first if args.calibrate else None}
    (args.out / shape / "probes.json").write_text(json.dumps(probes, indent=2))
    run.host_cpu[shape] = host_cpu_shares(cpu_before, host_cpu_times())
    if run.host_cpu[shape] is not None:
        run.notes.append(f"{shape}: the host's CPU in the live rounds: busy {run.host_cpu[shape]['busy']:.0f} %, "
                         f"stolen by the hypervisor {run.host_cpu[shape]['steal']:.2f} %")
    return validation, load, probes


def score_shape(shape: str, trace, validation, load, saved_probes: dict, profiles: list, checks: list, args,
                run: Run) -> None:
    """Simulate ``shape`` with each profile (and each of ``checks``, not counted as targets),
    rescaled to the probes' speed unless ``--no-speed-scale`` or calibrated here, and score it
    against the live rounds; rows, targets missed, notes and splits go to ``run``."""
    from dataclasses import replace

    from kvroute.calibrate.validation.validate import cluster_spec, predict, with_measured_client
    from kvroute.sim.timing.coverage import run_note

    spec = validation.spec
    sim_trace, lags, lag, offsets = with_measured_client(
        trace, validation.runs, slot_limited=validation.spec.max_in_flight is not None)
    run.notes.append(f"{shape}: {len(trace.records)} requests; measured client lag {1000 * lag:.1f} ms (median of "
                     f"{len(lags)} later turns, each simulated turn draws one), root send offsets "
                     f"up to {1000 * max(offsets.values(), default=0):.1f} ms")
    run.notes.append(client_cpu_note(shape, validation))
    for profile in profiles + checks:
        cluster, _ = cluster_spec(profile, validation.servers, spec)
        if args.speed_scale and saved_probes.get("before") and not saved_probes.get("reference"):
            cluster = probe_scaled(shape, cluster, saved_probes, run.notes)
            profile = cluster.profile
        validation.drift = probe_drift_of(shape, profile.name, saved_probes, cluster, run.notes)
        cluster = replace(cluster, client_lag_s=lags)
        runs = predict(sim_trace, cluster, list(spec.policies), args.rounds, spec.seed, args.uncertainty)
        beyond = run_note(cluster.profile, [r.records for sim in runs for r in sim.sim_runs])
        if beyond:
            run.notes.append(f"{shape}: {beyond.removeprefix('Note: ')}")
        rows, m = score(shape, profile.name, runs, validation, args.rounds, load, args.interval_level,
                        profile.raw, args.one_round, args.run_to_run_prior)
        run.rows += rows
        run.missed += m if profile not in checks else 0
        run.splits += time_split(shape, profile.name, runs, validation)
        run.convoys += convoy_split(shape, profile.name, runs, validation)


def print_run(run: Run) -> None:
    """The scored rows, the coverage lines, the time splits, the convoy lines and the notes."""
    print()
    print_rows(run.rows)
    print()
    for line in coverage_lines(run.rows):
        print(line)
    if run.splits:
        print("\nwhere a request's time goes, predicted/measured ms (engine times from vLLM's request histograms; "
              "front_end = TTFT - queue - prefill; api_front_end and client split it, measured only):")
        for line in run.splits:
            print(f"  {line}")
    if run.convoys:
        print("\nlater turns by position in their convoy, predicted/measured ms (engine = engine first token - send, "
              "out = client first token - engine first token; measured from the servers' KV-cache events):")
        for line in run.convoys:
            print(f"  {line}")
    for note in run.notes:
        print(f"note: {note}")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    args = parse_args()
    from kvroute.calibrate.live.cores import pinned
    from kvroute.sim.timing.profile import load_profile

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    traces = {s: make_trace(s) for s in shapes}
    names = list(args.profile or DEFAULT_PROFILES)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run, chain = Run(), ProbeChain()
    servers = contextlib.nullcontext(([], [])) if args.rescore else _servers(args.url, args.out, args.port_base,
                                                                              args.api_cores, args.kv_events)
    with servers as (urls, kv_endpoints), pinned(args.client_cores_set):
        t1 = time.perf_counter()
        if args.calibrate and not args.rescore:
            names.insert(0, str(calibrate_here(urls, args.out / "calibration", args.longest, args.sweeps,
                                                 args.api_cores, args.client_cores, kv_endpoints)))
            run.notes.append(f"calibrated on these servers in {time.perf_counter() - t1:.0f} s: {names[0]}")
            t1 = time.perf_counter()
        profiles = [load_profile(p) for p in names]
        checks = period_variants(profiles[0]) if args.period_range else []
        if checks:
            run.notes.append(f"{profiles[0].name}'s engine-speed period {profiles[0].host.engine_speed_period_s:.3g} s; "
                             f"also scored at the ends of the interval its sweep allows: "
                             f"{', '.join(p.name for p in checks)} (not counted in the targets missed)")
        for k, shape in enumerate(shapes):
            if args.rescore:
                validation, load, probes = saved_shape(args.rescore, shape)
            else:
                validation, load, probes = live_shape(shape, k, shapes[0], traces[shape], urls, profiles[0], args,
                                                      kv_endpoints, chain, run)
            score_shape(shape, traces[shape], validation, load, probes, profiles, checks, args, run)
    t2 = time.perf_counter()
    print_run(run)
    print(f"\nwall time: {t2 - t0:.0f} s ({t1 - t0:.0f} s server start-up); reports in {args.out}/<shape>/")
    (args.out / "summary.json").write_text(json.dumps({"rows": run.rows, "notes": run.notes, "missed": run.missed,
                                                        "wall_s": t2 - t0, "speed_probes": chain.by_shape,
                                                        "host_cpu": run.host_cpu, "api_cores": args.api_cores},
                                                       indent=2, default=str))
    print(f"targets missed: {run.missed} (counted over every profile)")


if __name__ == "__main__":
    main()
