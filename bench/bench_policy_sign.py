"""Where the sticky-vs-spread TTFT change goes wrong: per-turn TTFT, the kv-aware convoy and the
engine's time split, measured against predicted, from live rounds saved by ``bench_validate.py``
(issue 37, item 3; findings in docs/log/2026-12-05-policy-change-sign.md). No servers.

    python bench/bench_policy_sign.py /tmp/bv4                       # both chat shapes, a few seconds
    python bench/bench_policy_sign.py /tmp/bv3 --compute 1.85 --shapes short-replies
    python bench/bench_policy_sign.py bench/data/live-rounds/2026-12-06-0000   # an archived run

For each closed-loop shape saved in ``RUN/<shape>/live.pickle`` it simulates the same trace with
the live client's lags (as ``bench_validate.py --rescore`` does) under variants of the profile:

- ``shipped``: the profile as it is;
- ``x probe``: rescaled to the host's speed of the saved probes, as ``bench_validate.py
  --rescore`` scores it (``kvroute.sim.timing.speed_scale``: factors on the step, token and
  attention terms), or with ``--compute F`` its compute terms (``per_token_s``,
  ``prefill_attn_s``, ``decode_attn_s``) times F (the step overhead and the front end left
  alone: on this host the probe's single-request ITL needs no factor);
- ``... contention C``: the same with ``host.contention`` set to each of ``--contention``;
- ``... no serial admission, jitter 0``: the API lane's admission work and the per-request
  overhead jitter taken out, to see whether the kv-aware convoy then stays together as live.

It prints per policy and turn the mean client TTFT measured and predicted (ratio), the later-turn
TTFT change kv_aware vs round_robin, and for kv_aware the convoy's cohesion: the share of
(round, server, turn) convoys whose requests after the first get their first token within 3 ms
of each other (one engine step), and the median gap between the first request's first token and
theirs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

_spec = importlib.util.spec_from_file_location("bench_validate", Path(__file__).with_name("bench_validate.py"))
bench_validate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_validate)

COMPUTE_TERMS = ("per_token_s", "prefill_attn_s", "decode_attn_s")
"""Step-cost terms scaled by the compute factor (the host's prefill speed)."""


def scaled(profile, factor: float):
    """``profile`` with :data:`COMPUTE_TERMS` times ``factor``."""
    cost = profile.step_cost
    return dataclasses.replace(profile, step_cost=dataclasses.replace(
        cost, **{t: getattr(cost, t) * factor for t in COMPUTE_TERMS}))


def live_records(validation) -> pd.DataFrame:
    """Every live round's records, with ``policy`` and ``round`` columns."""
    frames = [r.live.records.assign(policy=r.policy, round=r.live_round) for r in validation.runs if r.live is not None]
    return pd.concat(frames, ignore_index=True)


def sim_records(validation, shape: str, profile, rounds: int) -> pd.DataFrame:
    """``rounds`` seeded simulations per policy of the shape's trace, with the live client's lags."""
    from kvroute.calibrate.validation.validate import cluster_spec, with_measured_client
    from kvroute.sim.cluster.cluster import simulate

    trace, lags, _, _ = with_measured_client(bench_validate.make_trace(shape), validation.runs)
    cluster, _ = cluster_spec(profile, validation.servers, validation.spec)
    cluster = dataclasses.replace(cluster, client_lag_s=lags)
    frames = [simulate(trace, dataclasses.replace(cluster, policy=p), seed=s).records.assign(policy=p, round=s)
              for p in validation.spec.policies for s in range(rounds)]
    return pd.concat(frames, ignore_index=True)


def per_turn(df: pd.DataFrame) -> pd.DataFrame:
    """Mean TTFT (s) of finished requests, turns x policies."""
    ok = df[df["status"] == "ok"]
    return ok.groupby(["policy", "turn"])["ttft"].mean().unstack(0)


def later_change(df: pd.DataFrame) -> float:
    """Later-turn (turn >= 2) mean TTFT change kv_aware vs round_robin, percent."""
    ok = df[(df["status"] == "ok") & (df["turn"] >= 2)]
    m = ok.groupby("policy")["ttft"].mean()
    return 100.0 * (m["kv_aware"] / m["round_robin"] - 1.0)


def cohesion(df: pd.DataFrame) -> tuple[float, float]:
    """kv_aware's later-turn convoys (one server's requests of one turn in one round, 3 or more):
    the share whose requests after the first (by send time) get their first token within 3 ms of
    each other, and the median gap (ms) from the first request's first token to the earliest of
    theirs. NaN without such convoys."""
    d = df[(df["status"] == "ok") & (df["policy"] == "kv_aware") & (df["turn"] >= 2)]
    together, gaps = [], []
    for _, x in d.groupby(["round", "worker", "turn"]):
        ft = 1000.0 * x.sort_values("arrival")["first_token"].to_numpy()
        if len(ft) >= 3:
            together.append(ft[1:].max() - ft[1:].min() < 3.0)
            gaps.append(ft[1:].min() - ft[0])
    return (float(np.mean(together)), float(np.median(gaps))) if gaps else (math.nan, math.nan)


def probe_factor(profile, validation, probes: dict) -> float:
    """The compute factor whose scaled profile predicts the saved probes' median TTFT (bisection
    over 0.25-8 on the predicted probe; the prediction grows with the factor)."""
    from kvroute.calibrate.validation.probe import predicted_probe
    from kvroute.calibrate.validation.validate import cluster_spec

    samples = [x for side in ("before", "after") for x in (probes.get(side) or {}).get("ttft_s", [])]
    target = float(np.median(samples))

    def predicted(f: float) -> float:
        cluster, _ = cluster_spec(scaled(profile, f), validation.servers, validation.spec)
        return float(np.median(predicted_probe(cluster)["ttft_s"]))

    lo, hi = 0.25, 8.0
    for _ in range(20):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if predicted(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


def probe_scaled(profile, validation, probes: dict, compute: float | None):
    """``profile`` at the host's speed of the saved probes, and a label: with ``compute``, its
    compute terms times that; else the step-cost factors ``kvroute.calibrate.validation.probe.
    speed_scale`` fits to the probes (``kvroute.sim.timing.speed_scale``), or where that is not
    available, one compute factor matched to the probes' TTFT (:func:`probe_factor`)."""
    if compute is not None:
        return scaled(profile, compute), f"compute x{compute:.2f}"
    try:
        from kvroute.calibrate.validation.probe import speed_scale
        from kvroute.calibrate.validation.validate import cluster_spec
        from kvroute.sim.timing.speed_scale import scaled_profile
    except ImportError:
        f = probe_factor(profile, validation, probes)
        return scaled(profile, f), f"compute x{f:.2f}"
    cluster, _ = cluster_spec(profile, validation.servers, validation.spec)
    scale = speed_scale(cluster, probes.get("before"), probes.get("after"))
    return scaled_profile(profile, scale), f"x probe ({scale.describe()})"


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="A bench_validate.py --out folder with <shape>/live.pickle, or an "
                                                "archived run in bench/data/live-rounds/ (live.pickle.gz).")
    parser.add_argument("--profile", default="cpu-tiny-qwen2-x2-bursts", help="Profile to vary (default: %(default)s).")
    parser.add_argument("--shapes", default="short-replies,long-chats", help="Closed-loop shapes (default: %(default)s).")
    parser.add_argument("--compute", type=float, default=None, metavar="F",
                        help="Compute factor (default: the speed scale the saved probes give).")
    parser.add_argument("--contention", default="", metavar="C,C,...",
                        help="Also simulate with host.contention set to each of these (e.g. 0,2,4).")
    parser.add_argument("--rounds", type=int, default=10, help="Simulated rounds per policy (default: %(default)s).")
    args = parser.parse_args()

    from kvroute.sim.timing.profile import load_profile

    base = load_profile(args.profile)
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        # an archived run (bench/data/live-rounds/) keeps live.pickle.gz, a fresh --out live.pickle
        validation, _load, probes = bench_validate.saved_shape(args.run, shape)
        fast, label = probe_scaled(base, validation, probes, args.compute)
        variants = {"shipped": base, label: fast}
        for c in filter(None, (x.strip() for x in args.contention.split(","))):
            variants[f"{label}, contention {float(c):g}"] = dataclasses.replace(
                fast, host=dataclasses.replace(fast.host, contention=float(c)))
        if fast.frontend is not None:
            variants[f"{label}, no serial admission, jitter 0"] = dataclasses.replace(
                fast, overheads=dataclasses.replace(fast.overheads, jitter_cv=0.0),
                frontend=dataclasses.replace(fast.frontend, per_request_s=0.0, per_prompt_token_s=0.0))
        live = live_records(validation)
        measured = per_turn(live)
        share, gap = cohesion(live)
        print(f"\n{shape}: {live['round'].nunique()} live rounds per policy, {args.rounds} simulated; "
              f"later-turn TTFT change kv_aware vs round_robin measured {later_change(live):+.1f} %; "
              f"kv_aware convoys after the first request in one step: {100 * share:.0f} %, gap {gap:.0f} ms")
        for label, profile in variants.items():
            sim = sim_records(validation, shape, profile, args.rounds)
            ratio = per_turn(sim) / measured
            share, gap = cohesion(sim)
            cells = "; ".join(f"{p} " + " ".join(f"{ratio.at[t, p]:.2f}" for t in ratio.index) for p in ratio.columns)
            print(f"  {label}: TTFT predicted/measured by turn: {cells}; change {later_change(sim):+.1f} %; "
                  f"convoys in one step {100 * share:.0f} %, gap {gap:.0f} ms")


if __name__ == "__main__":
    main()
