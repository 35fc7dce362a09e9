"""The calibration sweep's raw tables: their columns and a writer that keeps every row.

``requests.csv`` holds one row per request (:data:`REQUEST_COLUMNS`), ``experiments.csv`` one
row per experiment (:data:`EXPERIMENT_COLUMNS`); both are appended and flushed as each row
arrives, so an interrupted sweep keeps what it measured, and copied to Parquet when the sweep ends.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvroute.calibrate.live.client import CalibrationError

REQUEST_COLUMNS = [
    "url", "exp_id", "kind", "role", "rep", "batch", "prompt_len", "prefix_len", "max_tokens",
    "t_send_s", "ttft_s", "t_done_s", "n_tokens", "prompt_tokens", "cached_tokens",
    "expected_cached", "engine_queue_s", "engine_prefill_s", "engine_ttft_s", "overhead_s",
    "error", "warning", "token_times", "engine_first_token_s", "engine_next_batch_s",
]
EXPERIMENT_COLUMNS = [
    "url", "exp_id", "kind", "rep", "batch", "context_len", "prefix_len", "new_len", "prefill_len",
    "max_tokens", "itl_engine_s", "itl_engine_count", "t_start_s", "t_end_s", "error",
    "engine_queue_s", "engine_prefill_s", "engine_count", "api_cpu_s", "scrape_cpu_s",
]
TEXT_COLUMNS = ("url", "kind", "role", "error", "warning", "token_times")
"""Columns of the two tables that hold text (``token_times``: each token's arrival, s after the
send, separated by spaces); the others hold numbers."""


SWEEP_FILES = ("requests.csv", "experiments.csv", "meta.json")
"""The files a sweep writes first; any of them in a directory means it holds a sweep."""


def check_no_sweep(out_dir: str | os.PathLike[str]) -> None:
    """Fail before a sweep into ``out_dir`` if it already holds one: the new rows would follow
    the old ones in the same tables (experiment ids from 0 again) and ``meta.json`` would
    describe the new sweep only.

    Raises:
        CalibrationError: one line naming ``out_dir``, what it holds (requests measured, the
            earlier sweep's status) and what to do.
    """
    out = Path(out_dir)
    found = [name for name in SWEEP_FILES if (out / name).exists()]
    if not found:
        return
    try:
        with open(out / "requests.csv", newline="") as fh:
            rows = max(sum(1 for _ in csv.reader(fh)) - 1, 0)
    except OSError:
        rows = 0
    try:
        status = json.loads((out / "meta.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    held = f"{rows} measured requests" + (f", status '{status}' in meta.json" if status else "")
    raise CalibrationError(f"{out} already holds a sweep ({', '.join(found)}: {held}); a second sweep there would "
                           "mix its rows with those: measure into a new directory, or remove this one first")


class RowWriter:
    """Append rows to a CSV file, flushing after each so an interrupted sweep keeps them.

    Args:
        path: CSV file; its header is written when the file is new.
        columns: column names; missing keys are written empty.

    Raises:
        CalibrationError: the file exists with other columns (a sweep of another kvroute
            version): appending would put values under the wrong names.
    """

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = path
        new = not path.exists() or path.stat().st_size == 0
        if not new:
            with open(path, newline="") as fh:
                header = next(csv.reader(fh), [])
            if header != list(columns):
                raise CalibrationError(
                    f"{path}:1: its columns differ from this version's ({len(header)} against {len(columns)}: "
                    f"{', '.join(sorted(set(columns).symmetric_difference(header))) or 'another order'}); "
                    "measure into a new directory")
        self._fh = open(path, "a", newline="")
        self._w = csv.DictWriter(self._fh, fieldnames=list(columns), extrasaction="ignore")
        if new:
            self._w.writeheader()
            self._fh.flush()
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        """Write one row and flush it to disk."""
        self._w.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
                          for k, v in row.items()})
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.rows += 1

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def to_parquet(csv_path: Path) -> None:
    """A Parquet copy of ``csv_path`` beside it (same stem); nothing when the CSV is missing or empty, or
    when pandas/pyarrow cannot write it (the CSV is the record)."""
    try:
        import pandas as pd

        if csv_path.exists() and csv_path.stat().st_size > 0:
            pd.read_csv(csv_path).to_parquet(csv_path.with_suffix(".parquet"), index=False)
    except Exception:  # noqa: BLE001 - the CSV is the record; Parquet is a convenience
        pass
