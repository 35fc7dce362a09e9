"""Wall times of the commands whose durations the README states, on this machine, now.

    python bench/bench_readme.py                 # help, the main job, one Mooncake simulation
    python bench/bench_readme.py --tests         # also the README's test command (about 1.5 min)
    python bench/bench_readme.py --runs 5

Each command runs ``--runs`` times in its own process (``time.perf_counter`` around it); the
script prints min / median / max wall time per command and the 1-minute load average before
and after, since a shared machine's load moves every figure. The Mooncake case reads the trace
from ``../shared/traces`` beside the clone and is skipped with a message when it is absent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
KVROUTE = [sys.executable, "-c", "from kvroute.cli.main import main; main()"]


def cases(with_tests: bool) -> list[tuple[str, list[str] | None, str]]:
    """``(label, command or None when unavailable, reason)`` per README figure."""
    out = [
        ("kvroute --help", KVROUTE + ["--help"], ""),
        ("kvroute compare (the main job)", KVROUTE + ["compare"], ""),
    ]
    if MOONCAKE.exists():
        out.append(("kvroute simulate, Mooncake trace, 8 workers, kv_aware",
                    KVROUTE + ["simulate", "--trace", str(MOONCAKE), "--workers", "8", "--profile",
                               "a100-80gb-qwen2.5-7b", "--policy", "kv_aware"], ""))
    else:
        out.append(("kvroute simulate, Mooncake trace", None, f"{MOONCAKE} not found"))
    if with_tests:
        out.append(("python -m pytest (the README's test command, installed)", [sys.executable, "-m", "pytest", "-q"],
                    ""))
    return out


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="Runs per command (default 3).")
    parser.add_argument("--tests", action="store_true", help="Also time the test command.")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores")
    print(f"{'command':<58} {'min':>8} {'median':>8} {'max':>8}  runs")
    for label, cmd, reason in cases(args.tests):
        if cmd is None:
            print(f"{label:<58} skipped: {reason}")
            continue
        walls = []
        for _ in range(args.runs):
            t = time.perf_counter()
            rc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            walls.append(time.perf_counter() - t)
            if rc:
                print(f"{label:<58} failed with exit code {rc}")
                break
        else:
            print(f"{label:<58} {min(walls):>7.2f}s {statistics.median(walls):>7.2f}s {max(walls):>7.2f}s  {len(walls)}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
