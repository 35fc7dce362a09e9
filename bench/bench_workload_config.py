"""Wall time of one simulated run per policy of an inference-perf workload config (llm-d's
37-capacity ladder by default: 6,830 requests of 9,000 prompt and 1,000 output tokens on 4 pods).

    kvroute profiles derive --gpu H100-SXM --model Llama-3.1-70B --tp 4 --out /tmp/h100-llama70b-tp4.json
    python bench/bench_workload_config.py --profile /tmp/h100-llama70b-tp4.json
    python bench/bench_workload_config.py --profile FILE --policies random --cprofile 25

Each policy runs once (seed 0) in this process, as ``kvroute compare --workload-config FILE
--workers 4 --executor sequential`` runs it: trace built, cluster simulated, records summarised.
Prints the wall time per policy, the simulated time and the engine steps; ``--cprofile N``
prints the N functions with the most cumulative time of each run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

from kvroute.sim.cluster.cluster import simulate
from kvroute.sim.cluster.metrics import summarize
from kvroute.sim.study.scenario import Scenario

CONFIG = Path(__file__).resolve().parents[1] / "tests" / "data" / "inference-perf" / "llm-d-37-capacity.yaml"


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="profile JSON (kvroute profiles derive ... --out FILE)")
    parser.add_argument("--config", default=str(CONFIG), help="inference-perf YAML config [llm-d 37-capacity]")
    parser.add_argument("--policies", default="llmd-precise,llmd-estimated,llmd-load,random")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions by cumulative time")
    args = parser.parse_args()
    for policy in args.policies.split(","):
        scenario = Scenario(workload_config=args.config, profile=args.profile, workers=args.workers, policy=policy)
        start = time.perf_counter()
        profiler = cProfile.Profile() if args.cprofile else None
        if profiler:
            profiler.enable()
        trace = scenario.trace()
        result = simulate(trace, scenario.spec(), seed=scenario.seed)
        summarize(result)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - start
        steps = int(result.workers["num_steps"].sum())
        end = float(result.records["finish"].max())
        print(f"{policy:<16} {wall:6.1f} s wall  {len(trace.records)} requests  {end:8.0f} s simulated  "
              f"{steps:,} engine steps  ({steps / wall:,.0f} steps/s)")
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
