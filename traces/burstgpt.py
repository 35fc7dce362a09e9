"""Read the BurstGPT trace (Wang et al., 2024; Azure OpenAI GPT service logs) as a :class:`Trace`.

The CSV (``BurstGPT_1.csv`` and later releases) has columns ``Timestamp`` (seconds since the
trace start), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens`` and
``Log Type``; release 1.2 adds ``Session ID`` (rows of one conversation share it) and
``Elapsed time``. Rows whose request or response is 0 tokens are failed requests in the log; they
are skipped and counted. Like Azure's, the trace carries no prefix information: every record gets
fresh hash ids, so a prefix cache only hits within a request. A ``Session ID`` is kept as the
record's ``session_id`` (session-affinity routing and ``--request-rate``'s session starts read
it); no record is made to extend another (no ``parent``), since the log does not say which tokens
a later request repeats.
"""

from __future__ import annotations

import csv
import math
import os

from kvroute.traces.inputs import MAX_TOKENS, SECONDS, InputError, ascii_int
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import MOONCAKE_BLOCK_SIZE, TraceError, check_not_gzip, check_trace_block_size

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
"""The columns every release has and the reader needs; ``Session ID`` is read when present, the
others (``Model``, ``Total tokens``, ``Log Type``, ``Elapsed time``) are ignored."""

SESSION_COLUMN = "Session ID"
"""BurstGPT 1.2's conversation id column (optional)."""


def is_burstgpt_header(header: list[str]) -> bool:
    """Whether a CSV header row names BurstGPT's columns."""
    names = {h.strip() for h in header}
    return all(c in names for c in BURSTGPT_COLUMNS)


def read_burstgpt(path: str | os.PathLike[str], block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Read a BurstGPT CSV.

    Args:
        path: the CSV file (header line, then one request per line).
        block_size: tokens per hash id block (default 512).

    Returns:
        A :class:`Trace`, one record per kept row in file order: ``request_id`` counts kept rows
        from 0, ``timestamp_ms`` = 1000 x (``Timestamp`` - the first kept row's), ``input_length`` =
        ``Request tokens``, ``output_length`` = ``Response tokens``, ``hash_ids`` a ``range`` of
        fresh ids, ``session_id`` the ``Session ID`` text where the column is present and the
        cell not empty (else None). ``metadata``: ``{"origin": "burstgpt", "skipped_failed_rows": n}``.

    Raises:
        TraceError (a ValueError) naming path, line (1 = header) and column: a missing column, a
            short row, a timestamp that is not a finite number between 0 and 1e9 s
            (:data:`~kvroute.traces.inputs.SECONDS`) or is earlier than the first row's, a token
            count that is not an int between 0 and ``MAX_TOKENS``, a file that is not UTF-8 text
            (gzip-compressed: said so), no kept row; a bad ``block_size``.
        OSError: the file cannot be opened.
    """
    source = str(path)
    check_trace_block_size(block_size, path)
    check_not_gzip(path)
    records: list[TraceRecord] = []
    next_id = skipped = 0
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:  # a leading BOM is dropped
            reader = csv.reader(handle)
            header = [h.strip() for h in next(reader, [])]
            for column in BURSTGPT_COLUMNS:
                if column not in header:
                    raise TraceError(f"column missing from header {header}", source, 1, column)
            index = [header.index(c) for c in BURSTGPT_COLUMNS]
            session = header.index(SESSION_COLUMN) if SESSION_COLUMN in header else None
            t0: float | None = None  # the first row's Timestamp: no later row may be earlier
            start = 0.0  # the first kept row's: the trace's time 0
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) <= max(index):
                    missing = next(c for c, i in zip(BURSTGPT_COLUMNS, index) if i >= len(row))
                    raise TraceError(f"row has {len(row)} values, header has {len(header)}", source, line, missing)
                stamp = _seconds(row[index[0]], source, line)
                t0 = stamp if t0 is None else t0
                if stamp < t0:
                    raise TraceError(f"{stamp} s is earlier than the first row's {t0} s", source, line, "Timestamp")
                n_in = _count(row[index[1]], source, line, "Request tokens")
                n_out = _count(row[index[2]], source, line, "Response tokens")
                if n_in == 0 or n_out == 0:
                    skipped += 1
                    continue
                n_blocks = -(-n_in // block_size)
                sid = (row[session].strip() or None) if session is not None and session < len(row) else None
                if not records:  # a failed row sends nothing: time 0 is the first kept row's
                    start = stamp
                records.append(TraceRecord(len(records), (stamp - start) * 1000.0, n_in, n_out,
                                           range(next_id, next_id + n_blocks), session_id=sid))
                next_id += n_blocks
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason}); BurstGPT is a CSV file", source) from None
    if not records:
        raise TraceError("the trace has no row with both token counts above 0", source)
    return Trace(records, block_size, source, {"origin": "burstgpt", "skipped_failed_rows": skipped})


def _seconds(text: str, source: str, line: int) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise TraceError(f"expected seconds, got {text!r}", source, line, "Timestamp") from None
    if not math.isfinite(value):
        raise TraceError(f"must be finite, got {text!r}", source, line, "Timestamp")
    try:
        return SECONDS.check(value)
    except InputError as exc:
        raise TraceError(exc.reason, source, line, "Timestamp") from None


def _count(text: str, source: str, line: int, field: str) -> int:
    value = ascii_int(text.strip().removesuffix(".0"))
    if value is None:
        raise TraceError(f"expected an int (tokens), got {text!r}", source, line, field)
    if not 0 <= value <= MAX_TOKENS:
        raise TraceError(f"must be between 0 and {MAX_TOKENS:,} tokens, got {value}", source, line, field)
    return value
