"""Wall time of the routing policies on the Mooncake conversation trace, 8 workers, as ratios to
kv_aware's measured in the same call (each run in a fresh subprocess).

    python bench/bench_routers.py                       # kv_aware and the five new policies, 1 run each
    python bench/bench_routers.py --policies llmd,sglang --runs 3
    python bench/bench_routers.py --one dynamo          # one run, for farm-bench:
    farm-bench --vs 'python bench/bench_routers.py --one kv_aware' -- python bench/bench_routers.py --one llmd

CPU seconds are printed beside wall seconds: on a shared machine they are the steadier figure
(measured ratios: docs/log/from-code-comments.md).
Target (routing issue): the slowest of the new policies (sglang, dynamo, llmd, session_affinity,
power_of_two) within 1.5x of kv_aware's wall time. Extra router settings can be given as
``--spec key=value`` (ClusterSpec fields, e.g. ``cache_view=events``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
NEW = ["sglang", "dynamo", "llmd", "session_affinity", "power_of_two"]

CHILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.reader import read_trace
policy, path, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
trace = read_trace(path)
spec = ClusterSpec(load_profile("a100-80gb-qwen2.5-7b"), 8, policy=policy, **extra)
t1 = time.perf_counter()
result = simulate(trace, spec, seed=0)
t2 = time.perf_counter()
r = result.records
print(json.dumps({"wall_s": t2 - t0, "cpu_s": time.process_time() - c0, "simulate_s": t2 - t1, "requests": len(r),
                  "hit_rate": float(r["cached_tokens"].sum() / r["prompt_tokens"].sum())}))
"""


def run(policy: str, extra: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, policy, str(MOONCAKE), json.dumps(extra)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default=",".join(NEW), help="Policies to time against kv_aware.")
    parser.add_argument("--runs", type=int, default=1, help="Runs per policy (median wall time).")
    parser.add_argument("--one", default=None, help="Run this policy once and print its figures.")
    parser.add_argument("--spec", action="append", default=[], help="ClusterSpec field=value for every run.")
    args = parser.parse_args()
    if not MOONCAKE.exists():
        print(f"skipped: {MOONCAKE} not found (the shared traces folder is absent)")
        return
    extra = {k: _value(v) for k, _, v in (s.partition("=") for s in args.spec)}
    if args.one:
        print(json.dumps(run(args.one, extra)))
        return
    policies = ["kv_aware"] + [p for p in args.policies.split(",") if p and p != "kv_aware"]
    walls: dict[str, list[float]] = {p: [] for p in policies}
    cpus: dict[str, list[float]] = {p: [] for p in policies}
    hits: dict[str, float] = {}
    for _ in range(args.runs):  # interleaved, so a drifting machine hits every policy alike
        for p in policies:
            fig = run(p, extra)
            walls[p].append(fig["wall_s"])
            cpus[p].append(fig["cpu_s"])
            hits[p] = fig["hit_rate"]
    ref, cref = statistics.median(walls["kv_aware"]), statistics.median(cpus["kv_aware"])
    print(f"{'policy':<18} {'wall s':>8} {'x kv_aware':>11} {'cpu s':>8} {'x kv_aware':>11} {'hit rate':>9}")
    for p in policies:
        w, c = statistics.median(walls[p]), statistics.median(cpus[p])
        print(f"{p:<18} {w:>8.2f} {w / ref:>11.2f} {c:>8.2f} {c / cref:>11.2f} {hits[p]:>9.3f}")
    slowest = max(policies[1:], key=lambda p: statistics.median(walls[p]), default=None)
    if slowest:
        print(f"slowest new policy: {slowest}, {statistics.median(walls[slowest]) / ref:.2f}x kv_aware "
              f"(target <= 1.5x); {args.runs} run(s) each")


if __name__ == "__main__":
    main()
