"""Speed of the trace reader on Mooncake's conversation trace, as a ratio to plain JSON parsing.

    python bench/bench_reader.py

The reference (``json.loads`` of every line of the same file, no validation) is timed in the
same run, alternating with the reader (A B A B ...), so machine load cancels out of the ratio
(a plain wall-clock limit fails on a loaded machine). The assertion: reading with
full validation costs at most ``MAX_RATIO`` times parsing the JSON alone.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from kvroute.traces.reader import read_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MAX_RATIO = 2.5
PAIRS = 5


def _parse_only(path: Path) -> None:
    with open(path, encoding="utf-8") as handle:
        [json.loads(line) for line in handle if line.strip()]


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    if not TRACE.exists():
        print(f"skipped: {TRACE} not found")
        return 0
    ratios = []
    for _ in range(PAIRS):
        t0 = time.perf_counter()
        _parse_only(TRACE)
        t1 = time.perf_counter()
        read_trace(TRACE)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    ratio = statistics.median(ratios)
    print(f"read_trace / json.loads on {TRACE.name}: median ratio {ratio:.2f} over {PAIRS} pairs "
          f"(target <= {MAX_RATIO}); loadavg {os.getloadavg()[0]:.2f}")
    assert ratio <= MAX_RATIO, f"reader is {ratio:.2f}x plain JSON parsing (target <= {MAX_RATIO})"
    return 0


if __name__ == "__main__":
    sys.exit(main())
