"""Write a :class:`Trace` as kvroute JSON Lines (the format read by :func:`read_trace`)."""

from __future__ import annotations

import json
import os

from kvroute.traces.outputs import write_text_atomic
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import FORMAT_VERSION, TraceError


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` to ``path``: a metadata line, then one record per line.

    The metadata line is ``{"kvroute_trace": 1, "block_size": N, ...}`` followed by the keys of
    ``trace.metadata`` (which must be JSON-serialisable and must not use those two names).
    Each record line has ``timestamp`` (ms), ``input_length``, ``output_length`` (tokens) and,
    only when not None/default, ``hash_ids``, ``request_id`` (omitted when equal to the record's
    0-based position), ``session_id``, ``turn``, ``parent`` and ``think_time`` (ms; omitted when 0).
    Whole-number ms are written as ints, so Mooncake records come out as they went in.
    ``read_trace(path)`` returns records, block size and metadata equal to ``trace``'s.

    Raises:
        TraceError (a ValueError): ``trace.metadata`` uses a reserved key, or a value cannot be
            written as JSON (e.g. NaN); the error names the record's line and the field.
        OSError: the file cannot be written.
    """
    reserved = {"kvroute_trace", "block_size"} & set(trace.metadata)
    if reserved:
        raise TraceError(f"metadata may not use reserved key(s) {sorted(reserved)}",
                         path, 1, sorted(reserved)[0])
    dumps = json.dumps
    try:
        header = dumps({"kvroute_trace": FORMAT_VERSION, "block_size": trace.block_size,
                        **trace.metadata}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"metadata cannot be written as JSON: {exc}", path, 1, "metadata") from None
    out = [header]
    for index, rec in enumerate(trace.records):
        obj = _record_to_json(rec, index)
        try:
            out.append(dumps(obj, allow_nan=False))
        except (TypeError, ValueError) as exc:
            field = next((k for k, v in obj.items() if not _is_plain_json(v)), None)
            raise TraceError(f"cannot be written as JSON: {exc}", path, index + 2, field) from None
    out.append("")
    write_text_atomic(path, "\n".join(out))  # a failed write never leaves a cut trace


def _record_to_json(rec: TraceRecord, index: int) -> dict:
    """The JSON object of one record, optional fields only when set."""
    obj: dict = {
        "timestamp": _number(rec.timestamp_ms),
        "input_length": rec.input_length,
        "output_length": rec.output_length,
    }
    if rec.hash_ids is not None:
        obj["hash_ids"] = list(rec.hash_ids)
    if rec.request_id != index:
        obj["request_id"] = rec.request_id
    if rec.session_id is not None:
        obj["session_id"] = rec.session_id
    if rec.turn is not None:
        obj["turn"] = rec.turn
    if rec.parent is not None:
        obj["parent"] = rec.parent
    if rec.think_time_ms:
        obj["think_time"] = _number(rec.think_time_ms)
    return obj


def _number(value: float) -> int | float:
    """Whole-number floats as ints (``0.0`` -> ``0``), others unchanged."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _is_plain_json(value: object) -> bool:
    """True if ``value`` serialises with ``allow_nan=False`` (used to name a failing field)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
