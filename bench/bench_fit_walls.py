"""Why host contention runs to its bound: refit the saved two-server bursts sweep under variants.

    python bench/bench_fit_walls.py                         # every variant: about 10 min on 2 cores
    python bench/bench_fit_walls.py --variants default,no-stream-baseline

Refits the front-end and host terms (``kvroute.calibrate.calibration.bursts.fit_frontend``, as
``kvroute calibrate fit --base-profile cpu-tiny-qwen2-x2`` does) to the bursts saved in
``calibrate/data/calibrate-cpu-tiny-qwen2-x2-bursts`` (2026-12-01, two servers on two cores, API
processes and client floating), with the contention bound lifted to ``--bound`` (64) so the fit
says what the data ask for, under these variants:

- ``default``: as ``calibrate fit`` fits today (streaming baseline, client counted);
- ``no-stream-baseline``: decode steps' baseline without the streaming processes;
- ``no-client``: the measuring client not counted as a busy process;
- ``no-admission``: the simulated engine TTFT without the engine admission the one-at-a-time
  fit put before the engine (as before 2026-12-05);
- ``speed-1.25``: every step cost 1.25x (the host 25 % slower than when the step costs were
  measured, two days earlier);
- ``admission-in-step``: the engine admission the one-at-a-time fit measured
  (``provenance.fit.overhead_parts``) paid inside the step that first schedules each request
  (``overheads.engine_admission_s``), not before the engine (docs/log/2026-12-05-policy-change-sign.md).

Per variant it prints the fitted contention, its approximate 95 % profile-likelihood range
(explored up to the old bound of 4 only, so an upper end equal to the value is open), the fit's
objective (sum of squared log ratios over every burst figure), the objective along contention
0..16 with the lane terms held, and, for the default, measured over predicted burst figures
per shape at contention 0 (docs/log/2026-12-05-fit-walls.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

VARIANTS = ("default", "no-stream-baseline", "no-client", "no-admission", "speed-1.25", "admission-in-step")
SWEEP = Path(__file__).resolve().parent.parent / "calibrate" / "data" / "calibrate-cpu-tiny-qwen2-x2-bursts"


def refit(variant: str, bound: float) -> dict:
    """One variant's refit: ``{"contention", "interval", "objective", "terms", "curve", "seconds"}``."""
    import numpy as np

    import kvroute.calibrate.calibration.bursts as B
    from kvroute.calibrate.calibration.observations import load_sweeps
    from kvroute.sim.timing.profile import load_profile

    meta, servers, req, exp = load_sweeps([SWEEP])
    bursts, _ = B.load_bursts(req, exp)
    prof = load_profile("cpu-tiny-qwen2-x2")
    kw = dict(client_busy=1.0, engine_spin_s=1.0, refine_evals=40, baseline_stream_busy=3.0)
    if variant == "no-stream-baseline":
        kw["baseline_stream_busy"] = 0.0
    elif variant == "no-client":
        kw.update(client_busy=0.0, baseline_stream_busy=2.0)
    elif variant == "no-admission":
        prof = replace(prof, raw={k: v for k, v in prof.raw.items() if k != "provenance"})
    elif variant == "admission-in-step":
        parts = prof.raw["provenance"]["fit"]["overhead_parts"]
        prof = replace(prof, overheads=replace(prof.overheads, engine_admission_s=parts["engine_admission_s"],
                                               engine_admission_per_token_s=parts["engine_admission_per_token_s"]))
    elif variant.startswith("speed-"):
        factor = float(variant.split("-", 1)[1])
        prof = replace(prof, step_cost=replace(prof.step_cost, **{k: getattr(prof.step_cost, k) * factor
                                                                  for k in prof.step_cost.__dataclass_fields__}))
    saved = B.CONTENTION_BOUND
    B.CONTENTION_BOUND = bound
    try:
        t = time.perf_counter()
        ff = B.fit_frontend(bursts, prof, 2, 2.0, 1, **kw)
        seconds = time.perf_counter() - t
        f = ff.frontend
        x = np.array([f.per_request_s, f.per_output_token_s, f.per_step_s, ff.host.contention])
        host = replace(ff.host, contention=0.0)
        cold = [b for b in bursts if not b.prefix_len]
        curve = {}
        for c in (0.0, 1.0, 2.0, 4.0, 8.0, 16.0):
            tab = B.burst_table(cold, B.with_terms(prof, np.array([*x[:3], c]), 1, host), seeds=(0,))
            curve[c] = float((np.log(tab.predicted_s / tab.measured_s) ** 2).sum())
        ratios = None
        if variant == "default":
            tab = B.burst_table(cold, B.with_terms(prof, np.array([*x[:3], 0.0]), 1, host), seeds=(0,))
            tab["ratio"] = tab.measured_s / tab.predicted_s
            ratios = tab.pivot_table(index=["kind", "prompt_len", "batch"], columns="metric", values="ratio",
                                     aggfunc="median")
    finally:
        B.CONTENTION_BOUND = saved
    return {"contention": ff.host.contention, "interval": ff.contention_interval, "objective": ff.objective,
            "terms": x[:3], "curve": curve, "seconds": seconds, "ratios": ratios}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated (default: all: {','.join(VARIANTS)}).")
    parser.add_argument("--bound", type=float, default=64.0, help="Contention bound of the refits (default 64).")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS and not v.startswith("speed-"):
            parser.error(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)} or speed-<factor>")
    print(f"{'variant':<20} {'contention':>10} {'range':>13} {'objective':>9}  objective at contention "
          "0/1/2/4/8/16 (lanes held)   lane terms (request, token, step)   s")
    for v in variants:
        r = refit(v, args.bound)
        lo, hi = r["interval"]
        rng = "-" if math.isnan(lo) else f"{lo:.2f}-{hi:.2f}"
        curve = "/".join(f"{r['curve'][c]:.1f}" for c in sorted(r["curve"]))
        terms = ", ".join(f"{1e6 * t:.0f} us" for t in r["terms"])
        print(f"{v:<20} {r['contention']:>10.3g} {rng:>13} {r['objective']:>9.2f}  {curve:<40} {terms:<34} "
              f"{r['seconds']:.0f}", flush=True)
        if r["ratios"] is not None:
            print("  measured / predicted at contention 0 (median of the two repetitions):")
            print("  " + r["ratios"].round(2).to_string().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
