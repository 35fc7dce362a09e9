"""The seed burst with vLLM's async scheduling on and off (issue 33, item 1).

Runs ``kvroute compare``'s default scenario (the seed burst, its default profile, workers and
policies, 3 rounds) twice: as the profile says (async off) and with
``EngineConfig.async_scheduling`` on, and prints the mean over rounds of TTFT, later-turn TTFT,
TPOT, ITL and time to complete per policy. Then times one ``simulate`` run (first policy, one
round, the run only, no start-up) ``--repeat`` times each way and prints the ratio of the
medians.

    python bench/bench_async_scheduling.py [--turns 6] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

from kvroute.sim.cluster.cluster import simulate
from kvroute.sim.routing import DEFAULT_POLICIES
from kvroute.sim.study.experiment import compare
from kvroute.sim.study.scenario import Scenario

METRICS = ("ttft_mean_s", "later_ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "itl_mean_s", "time_to_complete_s")


def with_async(spec, on: bool):
    """``spec`` with its profile's engine stepping asynchronously (``on``) or not."""
    profile = spec.profile
    return replace(spec, profile=replace(profile, engine=replace(profile.engine, async_scheduling=on)))


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=None, help="turns per chat (default: the workload's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scenario = Scenario() if args.turns is None else Scenario(turns=args.turns)
    spec = scenario.spec()

    def trace_for(seed: int):
        return scenario.trace(seed - scenario.seed)

    print(f"seed burst: {len(trace_for(scenario.seed).records)} requests, profile {spec.profile.name}, "
          f"{spec.num_workers} workers, {args.rounds} rounds")
    summaries = {}
    for on in (False, True):
        comp = compare(trace_for, with_async(spec, on), list(DEFAULT_POLICIES), rounds=args.rounds, seed=scenario.seed)
        summaries[on] = {policy: {m: statistics.fmean(row[m] for row in comp.rows if row["policy"] == policy)
                                  for m in METRICS} for policy in DEFAULT_POLICIES}
    print("policy | metric | async off | async on | change")
    for policy in DEFAULT_POLICIES:
        for metric in METRICS:
            off, on = summaries[False][policy][metric], summaries[True][policy][metric]
            print(f"{policy} | {metric} | {off:.4f} | {on:.4f} | {100 * (on / off - 1):+.1f}%")

    trace = trace_for(scenario.seed)
    times = {}
    for on in (False, True):
        s = with_async(spec, on)
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            simulate(trace, s, seed=scenario.seed)
            runs.append(time.perf_counter() - t0)
        times[on] = runs
        print(f"simulate, async {'on ' if on else 'off'}: " + ", ".join(f"{t:.3f}" for t in runs) + " s")
    print(f"async / sync run time (medians): {statistics.median(times[True]) / statistics.median(times[False]):.2f}")


if __name__ == "__main__":
    main()
