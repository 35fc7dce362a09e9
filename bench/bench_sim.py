"""Speed and memory of the simulator on the issue's two reference cases; prints its figures.

    python bench/bench_sim.py            # both cases, policy kv_aware
    python bench/bench_sim.py --policy round_robin --case seed20

Each case runs in a fresh subprocess so its peak resident memory is its own. Targets (from the
simulator-core issue, on a 2-core machine): seed 20-turn burst on 4 workers <= 3 s wall;
Mooncake conversation trace on 8 workers <= 60 s wall and <= 2 GB peak memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"

CASES = {
    "seed20": {"what": "seed burst, 64 chats x 20 turns, 4 workers, A6000 prior", "target_s": 3.0, "target_mb": None},
    "mooncake": {"what": f"Mooncake conversation trace, 8 workers, A100-80GB prior", "target_s": 60.0, "target_mb": 2048},
}

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
case, policy, path = sys.argv[1], sys.argv[2], sys.argv[3]
if case == "seed20":
    from kvroute.traces.generators import seed_chat
    trace, spec = seed_chat(num_turns=20), ClusterSpec(load_profile("a6000-qwen2.5-7b"), 4, policy=policy)
else:
    from kvroute.traces.reader import read_trace
    trace, spec = read_trace(path), ClusterSpec(load_profile("a100-80gb-qwen2.5-7b"), 8, policy=policy)
t1 = time.perf_counter()
result = simulate(trace, spec, seed=0)
t2 = time.perf_counter()
print(json.dumps({
    "load_s": t1 - t0, "simulate_s": t2 - t1, "wall_s": t2 - t0,
    "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "requests": len(result.records), "steps": int(result.workers["num_steps"].sum()),
}))
"""


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--policy", default="kv_aware")
    args = parser.parse_args()
    names = list(CASES) if args.case == "all" else [args.case]
    print(f"{'case':<10} {'policy':<12} {'wall s':>8} {'target':>8} {'peak MB':>9} {'target':>8} {'steps':>10}  what")
    for name in names:
        case = CASES[name]
        if name == "mooncake" and not MOONCAKE.exists():
            print(f"{name:<10} skipped: {MOONCAKE} not found (the shared traces folder is absent)")
            continue
        proc = subprocess.run([sys.executable, "-c", CHILD, name, args.policy, str(MOONCAKE)],
                              capture_output=True, text=True, check=True)
        fig = json.loads(proc.stdout.strip().splitlines()[-1])
        target_mb = f"{case['target_mb']:>8}" if case["target_mb"] else f"{'-':>8}"
        print(f"{name:<10} {args.policy:<12} {fig['wall_s']:>8.2f} {case['target_s']:>8.1f} "
              f"{fig['peak_mb']:>9.0f} {target_mb} {fig['steps']:>10}  {case['what']}")


if __name__ == "__main__":
    main()
