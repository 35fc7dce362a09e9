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

from kvroute.traces.inputs import BLOCK_SIZE, MAX_TOKENS, InputError, ascii_int
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import MOONCAKE_BLOCK_SIZE, TraceError, check_not_gzip

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

        ``hash_ids`` is a ``range`` (no ids are expanded, whatever the length).

    Raises:
        TraceError (a ValueError) naming path, line (1 = header) and field: a missing column, a
            short row, an unparsable timestamp, one earlier than the first row's or one with a
            time zone when the first row has none (or the reverse), a count that is not an int
            between 1 and ``MAX_TOKENS``, a file that is not UTF-8 text (gzip-compressed: said so),
            a file with no data row; a ``block_size`` that is not an int between 1 and
            ``MAX_BLOCK_SIZE``.
        OSError: the file cannot be opened.
    """
    check_not_gzip(path)
    try:
        BLOCK_SIZE.check(block_size, "block_size", str(path))
    except InputError as exc:
        raise TraceError(exc.reason, path, None, "block_size") from None
    source = str(path)
    try:
        return _read(path, source, block_size)
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason}); an Azure trace is a CSV file", source) from None


def _read(path: str | os.PathLike[str], source: str, block_size: int) -> Trace:
    records: list[TraceRecord] = []
    next_id = 0
    with open(path, encoding="utf-8-sig", newline="") as handle:  # utf-8-sig: a leading BOM (Excel's) is dropped
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
            if (stamp.tzinfo is None) != (t0.tzinfo is None):
                raise TraceError(
                    f"{text} {'has no' if stamp.tzinfo is None else 'has a'} time zone but the first "
                    f"row's timestamp {t0} {'has one' if t0.tzinfo is not None else 'has none'}; "
                    f"timestamps must all have a time zone or none", source, lineno, "TIMESTAMP")
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
                hash_ids=range(next_id, next_id + n_blocks),
            ))
            next_id += n_blocks
    if not records:
        raise TraceError("the trace has no data rows", source, None)
    return Trace(records=records, block_size=block_size, source=source, metadata={"origin": "azure_csv"})


_MICROSECOND = timedelta(microseconds=1)


def _count(text: str, source: str, lineno: int, field: str) -> int:
    """Parse a token count of 1 to ``MAX_TOKENS`` or raise a TraceError naming the field."""
    value = ascii_int(text)
    if value is None:
        raise TraceError(f"expected an int >= 1 (tokens), got {text!r}", source, lineno, field)
    if value < 1:  # a request sends at least one token and asks for at least one
        raise TraceError(f"length must be >= 1, got {value}", source, lineno, field)
    if value > MAX_TOKENS:
        raise TraceError(f"length must be <= {MAX_TOKENS:,} tokens, got {value}", source, lineno, field)
    return value
