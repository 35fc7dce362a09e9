"""Open-loop replay of one long session whose turns the arrival spread reorders: time against
turns, which must grow linearly.

    python bench/bench_open_loop_session.py            # 1,000, 2,000 and 5,000 turns
    python bench/bench_open_loop_session.py --turns 500,5000

One session of N turns, turn i sent at i ms with the default arrival spread (5 ms, so a turn
is often sent before its parent), 2 workers of the ``a100-80gb-qwen2.5-7b`` profile, open loop.
Each turn adds 2 tokens to its parent's sequence and asks for 1. Prints the wall time of
``simulate`` per size with the spread and without it (turns then in order), their ratio (about 1:
reordering costs nothing; the workload builder once rebuilt a turn's whole ancestor chain for
every reordered turn, which made the spread's runs quadratic in turns: seconds at 1,000 turns,
minutes at 5,000), and the time per turn relative to the smallest size. The time per turn grows
with the session even in order, since each turn's prompt holds the whole session so far and the
engine looks up every block of it; that growth is the engine's, not the builder's.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.format import Trace, TraceRecord


def session(turns: int) -> Trace:
    """One session of ``turns`` turns, turn i at i ms; block size 16."""
    recs = [TraceRecord(0, 0.0, 16, 1, (7,), session_id=0)]
    for i in range(1, turns):
        recs.append(TraceRecord(i, float(i), recs[-1].input_length + 2, 1, parent=i - 1, session_id=0))
    return Trace(recs, 16)


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="1000,2000,5000", help="comma-separated session lengths")
    args = parser.parse_args()
    profile = load_profile("a100-80gb-qwen2.5-7b")
    spread = ClusterSpec(profile, num_workers=2, closed_loop=False)  # default arrival spread, 5 ms
    in_order = ClusterSpec(profile, num_workers=2, closed_loop=False, arrival_spread_s=0.0)
    rows = []
    for n in (int(x) for x in args.turns.split(",")):
        trace = session(n)
        walls = []
        for spec in (spread, in_order):
            t0 = time.perf_counter()
            simulate(trace, spec, seed=0)
            walls.append(time.perf_counter() - t0)
        rows.append((n, *walls))
    base = rows[0][1] / rows[0][0]
    print(f"{'turns':>6} {'spread 5 ms s':>14} {'in order s':>11} {'ratio':>6} {'per turn vs first':>18}")
    for n, wall, ordered in rows:
        print(f"{n:>6} {wall:>14.2f} {ordered:>11.2f} {wall / ordered:>6.2f} {wall / n / base:>18.2f}")


if __name__ == "__main__":
    main()
