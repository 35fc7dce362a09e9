"""Read the Azure LLM inference traces (Splitwise, ISCA 2024) as a :class:`Trace`.

The CSV has columns ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``), ``ContextTokens`` and
``GeneratedTokens``. It carries no prefix information, so every record gets fresh hash ids that
no other record shares: replaying it, a prefix cache can only hit within one request, which makes
it a control on which cache-aware routing should gain almost nothing.
"""

from __future__ import annotations

import csv
import os
from datetime import datetime, timedelta

from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import MOONCAKE_BLOCK_SIZE, TraceError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure_csv(path: str | os.PathLike[str], block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Read an Azure LLM inference trace CSV.

    Args:
        path: the CSV file (header line, then one request per line).
        block_size: tokens per hash id block (default 512, Mooncake's).

    Returns:
        A :class:`Trace`, one record per data row in file order: ``request_id`` = 0-based row
        index, ``timestamp_ms`` = ms since the first row's ``TIMESTAMP`` (so the first is 0.0;
        resolution 1 us, the 7th fractional digit is dropped), ``input_length`` =
        ``ContextTokens``, ``output_length`` = ``GeneratedTokens`` (tokens), ``hash_ids`` =
        ``ceil(input_length / block_size)`` ids unique to the record (0, 1, 2, ... counted
        across the file, so no two records share a block). ``metadata`` is
        ``{"origin": "azure_csv"}``.

    Raises:
        TraceError (a ValueError) naming path, line (1 = header) and field: a missing column, a
            short row, an unparsable timestamp or one earlier than the first row's, a count that
            is not a non-negative int.
        OSError: the file cannot be opened.
    """
    if type(block_size) is not int or block_size <= 0:
        raise TraceError(f"must be a positive int, got {block_size!r}", path, None, "block_size")
    source = str(path)
    records: list[TraceRecord] = []
    next_id = 0
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError("empty file: expected a header line", source, 1, "TIMESTAMP")
        header = [h.strip() for h in header]
        for column in AZURE_COLUMNS:
            if column not in header:
                raise TraceError(f"column missing from header {header}", source, 1, column)
        i_ts, i_in, i_out = (header.index(c) for c in AZURE_COLUMNS)
        width = max(i_ts, i_in, i_out) + 1
        t0: datetime | None = None
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < width:
                missing = next(c for c, i in zip(AZURE_COLUMNS, (i_ts, i_in, i_out)) if i >= len(row))
                raise TraceError(f"row has {len(row)} values, header has {len(header)}", source, lineno, missing)
            text = row[i_ts].strip()
            try:
                stamp = datetime.fromisoformat(text)
            except ValueError:
                raise TraceError(f"not a datetime: {text!r}", source, lineno, "TIMESTAMP") from None
            if t0 is None:
                t0 = stamp
            micros = (stamp - t0) // _MICROSECOND
            if micros < 0:
                raise TraceError(f"{text} is earlier than the first row's timestamp {t0}",
                                 source, lineno, "TIMESTAMP")
            n_in = _count(row[i_in], source, lineno, "ContextTokens")
            n_out = _count(row[i_out], source, lineno, "GeneratedTokens")
            n_blocks = -(-n_in // block_size)
            records.append(TraceRecord(
                request_id=len(records),
                timestamp_ms=micros / 1000.0,
                input_length=n_in,
                output_length=n_out,
                hash_ids=tuple(range(next_id, next_id + n_blocks)),
            ))
            next_id += n_blocks
    return Trace(records=records, block_size=block_size, source=source, metadata={"origin": "azure_csv"})


_MICROSECOND = timedelta(microseconds=1)


def _count(text: str, source: str, lineno: int, field: str) -> int:
    """Parse a non-negative token count or raise a TraceError naming the field."""
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceError(f"expected a non-negative int (tokens), got {text!r}", source, lineno, field) from None
    if value < 1:  # a request sends at least one token and asks for at least one
        raise TraceError(f"length must be >= 1, got {value}", source, lineno, field)
    return value
