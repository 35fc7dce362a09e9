"""Read kvroute / Mooncake JSON Lines traces, with validation that names file, line and field.

The format is described in :mod:`kvroute.traces.format`. Mooncake's own files (no metadata line,
512-token blocks, only ``timestamp``/``input_length``/``output_length``/``hash_ids``) are a subset
of it and load unchanged.

Also here: :class:`TraceError`, the one exception of the ``traces`` package, and
:func:`check_block_sizes`, the rule that maps a trace's block size onto an engine's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable

from kvroute.traces.inputs import (BLOCK_SIZE, JSON_DECODER, MAX_BLOCK_SIZE, MAX_HASH_ID, MAX_ID, MAX_TOKENS,
                                   MILLISECONDS, DuplicateKeyError, InputError, describe)
from kvroute.traces.format import Trace, TraceRecord

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` block in Mooncake's traces; the default when nothing else says."""

FORMAT_VERSION = 1
"""Value of ``kvroute_trace`` in the metadata line this reader understands."""


class TraceError(InputError):
    """A trace (file or in-memory) is malformed, or two block sizes cannot be mapped.

    An :class:`~kvroute.traces.inputs.InputError` (so a ValueError) whose ``where`` is the file.

    Attributes:
        path: the file (or trace source) concerned, or None.
        line: 1-based line number in that file, or None.
        field: the offending field name (e.g. ``"hash_ids"``), or None.
        reason: the bare explanation, without the location prefix.
    """

    def __init__(
        self,
        reason: str,
        path: str | os.PathLike[str] | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(reason, None if path is None else str(path), line, field)
        self.path = self.where


def _malformed(exc: json.JSONDecodeError) -> str:
    """``malformed JSON: Expecting value at column 5`` (json's messages that end in "at", such
    as "Unterminated string starting at", take the column directly)."""
    where = f"column {exc.colno}" if exc.msg.endswith(" at") else f"at column {exc.colno}"
    return f"malformed JSON: {exc.msg} {where}"


def check_trace_block_size(block_size: int, path: str | os.PathLike[str]) -> None:
    """Check a trace's declared or given ``block_size`` (tokens per ``hash_ids`` block).

    Raises:
        TraceError: naming ``path`` and the field ``block_size``.
    """
    try:
        BLOCK_SIZE.check(block_size, "block_size", str(path))
    except InputError as exc:
        raise TraceError(exc.reason, path, None, "block_size") from None


def check_not_gzip(path: str | os.PathLike[str]) -> None:
    """Refuse a gzip-compressed file (its first two bytes ``1f 8b``) before it is read as text.

    Raises:
        TraceError: naming the file, line 1, and what to do.
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as handle:
        if handle.read(2) == b"\x1f\x8b":
            raise TraceError("is gzip-compressed; decompress it first (gunzip)", str(path), 1)


def load_json_document(path: str | os.PathLike[str]):
    """The JSON document in ``path`` (a whole-file format: ShareGPT, ``vllm bench serve`` results).

    Raises:
        TraceError: the file is not UTF-8 text or not JSON (naming line and column).
        OSError: the file cannot be opened.
    """
    try:
        with open(path, encoding="utf-8-sig") as handle:  # a leading BOM is dropped
            return JSON_DECODER.decode(handle.read())
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason})", str(path)) from None
    except DuplicateKeyError as exc:
        raise TraceError(exc.reason, str(path), None, exc.field) from None
    except json.JSONDecodeError as exc:
        raise TraceError(_malformed(exc), str(path), exc.lineno) from None
    except ValueError as exc:  # an int of over 4300 digits
        raise TraceError(f"unreadable JSON: {' '.join(str(exc).split(';')[0].split())}", str(path)) from None


def check_block_sizes(trace_block_size: int, engine_block_size: int) -> None:
    """Check that an engine's KV block size can replay a trace's ``hash_ids``.

    An engine block of ``engine_block_size`` tokens maps onto trace blocks of
    ``trace_block_size`` tokens when it divides the trace's size (each trace block splits into
    whole engine blocks) or is a multiple of it (each engine block covers whole trace blocks).

    Args:
        trace_block_size: tokens per ``hash_ids`` entry of the trace (> 0).
        engine_block_size: tokens per KV block of the engine (> 0).

    Raises:
        TraceError (a ValueError): the sizes are not positive ints, or neither divides the
            other; the message lists the engine sizes that would work.
    """
    for name, value in (("trace_block_size", trace_block_size), ("engine_block_size", engine_block_size)):
        if type(value) is not int or not 0 < value <= MAX_BLOCK_SIZE:
            raise TraceError(f"must be an int between 1 and {MAX_BLOCK_SIZE:,}, got {value!r}", field=name)
    if trace_block_size % engine_block_size == 0 or engine_block_size % trace_block_size == 0:
        return
    small = [d for d in range(1, math.isqrt(trace_block_size) + 1) if trace_block_size % d == 0]
    divisors = sorted({*small, *(trace_block_size // d for d in small)})
    multiples = ", ".join(str(trace_block_size * k) for k in (2, 3, 4))
    raise TraceError(
        f"engine block size {engine_block_size} is neither a divisor nor a multiple of the "
        f"trace's block size {trace_block_size}, so trace blocks cannot be mapped onto engine "
        f"blocks; engine block sizes that work: a divisor of {trace_block_size} "
        f"({', '.join(map(str, divisors))}) or a multiple of it ({multiples}, ...)",
        field="block_size",
    )


def read_trace(path: str | os.PathLike[str], block_size: int | None = None) -> Trace:
    """Read a kvroute or Mooncake JSON Lines trace.

    Args:
        path: the ``.jsonl`` file. Blank lines are skipped (line numbers still count them).
        block_size: tokens per ``hash_ids`` block, used when the file has no metadata line.
            If the file declares one and this differs, that is an error. Default: 512.

    Returns:
        A :class:`Trace` with ``records`` in file order (``timestamp_ms`` and ``think_time_ms``
        in ms as floats, lengths in tokens, ``hash_ids`` as tuples or None), ``block_size``,
        ``source=str(path)`` and ``metadata`` holding the metadata line's extra keys.

    Raises:
        TraceError (a ValueError) naming path, line and field for: malformed JSON or a line that
            is not an object; an unsupported or misplaced metadata line; a missing required field;
            a wrong type (bools are not numbers, lengths and ids must be ints); a negative or
            non-finite number; a ``timestamp`` or ``think_time`` above 1e12 ms (the
            :data:`~kvroute.traces.inputs.SECONDS` bound);
            ``len(hash_ids) != ceil(input_length / block_size)``; a negative hash id; a duplicate ``request_id``; a ``parent`` that is not an earlier record; a
            record with a parent whose ``input_length`` is below the parent's
            ``input_length + output_length``; a record with both ``parent`` and ``hash_ids``
            whose ids for the parent's full prompt blocks differ from the parent's; a record with
            neither ``hash_ids`` nor ``parent``; a length above ``MAX_TOKENS`` or a block size
            above ``MAX_BLOCK_SIZE``; a file that is not UTF-8 text (gzip, binary); a file with
            no record; a key given twice in one object. Unknown fields are ignored.
        OSError: the file cannot be opened.
    """
    source = str(path)
    check_not_gzip(path)
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")  # a leading BOM is dropped
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"not UTF-8 text (byte {data[exc.start]:#04x}); a trace is JSON Lines",
                         source, line) from None
    # JSON Lines end at "\n" only: str.splitlines would also split inside a JSON string at U+2028 and
    # count a form feed as a line, shifting every later error's line number
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return parse_trace_lines(lines, source=source, block_size=block_size)


REQUIRED_FIELDS = ("timestamp", "input_length", "output_length")
"""Fields every trace record has."""


def _missing_reason(name: str, obj: dict) -> str:
    """``required field missing``, naming a key of the line that looks like a misspelling of it."""
    import difflib

    others = [k for k in obj if isinstance(k, str) and k not in REQUIRED_FIELDS]
    close = difflib.get_close_matches(name, others, n=1, cutoff=0.75)
    return "required field missing" + (f" (the line has {close[0]!r}: misspelt?)" if close else "")


def parse_trace_lines(
    lines: Iterable[str] | list[str], source: str = "<memory>", block_size: int | None = None
) -> Trace:
    """Parse JSON Lines already in memory; same rules and errors as :func:`read_trace`.

    Each non-blank line holds a JSON object (:func:`_decoding_error` when not). The first may be
    the metadata line (:func:`_parse_metadata`), which settles the block size; every other one is
    a record, whose fields are checked on their own (:func:`_parse_record`), then against the
    records before it (:meth:`_Records.add`).

    Args:
        lines: the file's lines (with or without newlines), line 1 first.
        source: the name used in error messages and stored as ``Trace.source``.
        block_size: as in :func:`read_trace`.
    """
    lines = list(lines)
    block_size = _block_size_argument(block_size, source)
    records = _Records(source, lines)
    metadata: dict = {}
    declared: int | None = None  # the trace's block size, settled by its first non-blank line
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:  # NOTE: in this frame: a helper's frame would lower the nesting reached before the recursion limit
            obj = JSON_DECODER.decode(text)
        except ValueError as exc:
            raise _decoding_error(exc, source, lineno) from None
        if type(obj) is not dict:
            raise TraceError(f"expected a JSON object, got {type(obj).__name__}", source, lineno)
        if "kvroute_trace" in obj:
            if declared is not None:
                raise TraceError("metadata line must be the first line of the file",
                                 source, lineno, "kvroute_trace")
            declared, metadata = _parse_metadata(obj, source, lineno, block_size)
            continue
        if declared is None:
            declared = block_size if block_size is not None else MOONCAKE_BLOCK_SIZE
        records.add(_parse_record(obj, len(records.items), declared, source, lineno), declared, lineno)
    if not records.items:
        raise TraceError("the trace has no records (an empty file, or only a metadata line)", source)
    return Trace(records=records.items, block_size=declared, source=source, metadata=metadata)


def _block_size_argument(block_size: int | None, source: str) -> int | None:
    """The ``block_size`` argument of :func:`parse_trace_lines` checked: an int (a float with an
    integral value comes back as that int), or None when not given.

    Raises:
        TraceError: naming ``source`` and the field ``block_size``.
    """
    if block_size is None:
        return None
    try:
        return BLOCK_SIZE.check(block_size)
    except InputError as exc:
        raise TraceError(f"block_size argument {exc.reason}", source, None, "block_size") from None


def _decoding_error(exc: ValueError, source: str, lineno: int) -> TraceError:
    """The error for line ``lineno``, which :data:`~kvroute.traces.inputs.JSON_DECODER` refused
    with ``exc``: malformed JSON, a key given twice (json would keep the last value silently), an
    int of over 4300 digits or nesting too deep."""
    if isinstance(exc, json.JSONDecodeError):
        return TraceError(_malformed(exc), source, lineno)
    if isinstance(exc, DuplicateKeyError):
        return TraceError(exc.reason, source, lineno, exc.field)
    return TraceError(f"unreadable JSON: {' '.join(str(exc).split(';')[0].split())}", source, lineno)


def _parse_record(obj: dict, position: int, block_size: int, source: str, lineno: int) -> TraceRecord:
    """The record on line ``lineno``, each field checked on its own (not against other records).

    ``position`` is the record's 0-based index in the trace, its ``request_id`` when the line
    gives none. JSON null means absent for the optional fields. ``timestamp_ms`` and
    ``think_time_ms`` come out as floats, ``hash_ids`` as a tuple or None.

    Raises:
        TraceError: naming the field (see :func:`read_trace`).
    """
    ts, n_in, n_out = _required_fields(obj, source, lineno)
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None:
        hash_ids = _parse_hash_ids(hash_ids, n_in, block_size, source, lineno)
    if len(obj) <= 4 and hash_ids is not None:  # NOTE: the required fields and hash_ids, nothing else
        return TraceRecord(position, float(ts), n_in, n_out, hash_ids, None, None, None, 0.0)
    request_id, session_id, turn, parent, think = _optional_fields(obj, position, source, lineno)
    if parent is None and hash_ids is None:
        raise TraceError("record has neither hash_ids nor a parent; one is required",
                         source, lineno, "hash_ids")
    return TraceRecord(request_id, float(ts), n_in, n_out, hash_ids, session_id, turn, parent, float(think))


def _required_fields(obj: dict, source: str, lineno: int) -> tuple[int | float, int, int]:
    """``(timestamp, input_length, output_length)`` of a record: ms, tokens, tokens.

    Raises:
        TraceError: a field is missing (naming a near miss among the line's keys), of the wrong
            type, or out of range.
    """
    try:
        ts = obj["timestamp"]
        n_in = obj["input_length"]
        n_out = obj["output_length"]
    except KeyError as exc:
        raise TraceError(_missing_reason(exc.args[0], obj), source, lineno, exc.args[0]) from None
    if (type(ts) is not int and type(ts) is not float) or not 0 <= ts <= MILLISECONDS.maximum:  # NaN fails too
        _check_ms(ts, source, lineno, "timestamp")
    for name, value in (("input_length", n_in), ("output_length", n_out)):
        if type(value) is not int:
            raise TraceError(f"expected an int (tokens), got {describe(value)}", source, lineno, name)
        if value < 1:  # a request sends at least one token and asks for at least one
            raise TraceError(f"length must be >= 1, got {value}", source, lineno, name)
        if value > MAX_TOKENS:
            raise TraceError(f"length must be <= {MAX_TOKENS:,} tokens, got {value}", source, lineno, name)
    return ts, n_in, n_out


def _parse_hash_ids(hash_ids: object, n_in: int, block_size: int, source: str, lineno: int) -> tuple[int, ...]:
    """A record's ``hash_ids`` as a tuple: ``ceil(n_in / block_size)`` ints, each in
    ``0 .. MAX_HASH_ID``.

    Raises:
        TraceError: not a list, an entry that is not an int (bools are not), a negative entry or
            one above ``MAX_HASH_ID`` (naming its index), or the wrong number of ids.
    """
    if type(hash_ids) is not list:
        raise TraceError(f"expected a list of ints, got {describe(hash_ids)}", source, lineno, "hash_ids")
    if not {*map(type, hash_ids)} <= {int}:  # every id an int (not a bool), at C speed
        i, bad = next((i, h) for i, h in enumerate(hash_ids) if type(h) is not int)
        raise TraceError(f"entry {i} is {describe(bad)}, expected an int", source, lineno, "hash_ids")
    if hash_ids and min(hash_ids) < 0:
        i, bad = next((i, h) for i, h in enumerate(hash_ids) if h < 0)
        raise TraceError(f"entry {i} is negative ({bad}); hash ids must be >= 0", source, lineno, "hash_ids")
    if hash_ids and max(hash_ids) > MAX_HASH_ID:
        i, bad = next((i, h) for i, h in enumerate(hash_ids) if h > MAX_HASH_ID)
        raise TraceError(f"entry {i} is {bad}, above the largest hash id 2**48 - 1 (the simulator's own content "
                         "ids start there); renumber the ids densely", source, lineno, "hash_ids")
    need = -(-n_in // block_size)
    if len(hash_ids) != need:
        raise TraceError(
            f"has {len(hash_ids)} ids but input_length {n_in} at block size {block_size} "
            f"needs ceil({n_in}/{block_size}) = {need}", source, lineno, "hash_ids")
    return tuple(hash_ids)


def _optional_fields(obj: dict, position: int, source: str, lineno: int
                     ) -> tuple[int, int | str | None, int | None, int | None, int | float]:
    """``(request_id, session_id, turn, parent, think_time)`` of a record, each checked on its own.

    JSON null means absent: ``request_id`` is then ``position``, ``think_time`` 0.0 (ms), the
    others None.

    Raises:
        TraceError: a field of the wrong type or out of range (ids within int64, ``turn`` >= 1,
            ``think_time`` by the :data:`~kvroute.traces.inputs.MILLISECONDS` rule).
    """
    request_id = obj.get("request_id")
    if request_id is None:
        request_id = position
    elif type(request_id) is not int or not -MAX_ID <= request_id <= MAX_ID:
        raise TraceError(f"expected an int within +-{MAX_ID:,} (int64), got {describe(request_id)}", source,
                         lineno, "request_id")
    session_id = obj.get("session_id")
    if session_id is not None and (type(session_id) not in (int, str)
                                   or type(session_id) is int and not -MAX_ID <= session_id <= MAX_ID):
        raise TraceError(f"expected a string or an int within +-{MAX_ID:,} (int64), got "
                         f"{describe(session_id)}", source, lineno, "session_id")
    turn = obj.get("turn")
    if turn is not None and (type(turn) is not int or not 1 <= turn <= MAX_ID):
        raise TraceError(f"expected an int >= 1, got {turn!r}", source, lineno, "turn")
    think = obj.get("think_time")
    if think is None:
        think = 0.0
    elif (type(think) is not int and type(think) is not float) or not 0 <= think <= MILLISECONDS.maximum:
        _check_ms(think, source, lineno, "think_time")
    parent = obj.get("parent")
    if parent is not None and type(parent) is not int:
        raise TraceError(f"expected an int request_id, got {describe(parent)}", source, lineno, "parent")
    return request_id, session_id, turn, parent, think


class _Records:
    """The records of one trace read so far: in file order (:attr:`items`), by ``request_id``,
    and, for the parent-prefix rule, the trace ids each one's prompt is known to start with."""

    __slots__ = ("source", "lines", "items", "by_id", "known_blocks")

    def __init__(self, source: str, lines: list[str]) -> None:
        self.source = source
        self.lines = lines  # read again only to explain a missing parent
        self.items: list[TraceRecord] = []
        self.by_id: dict[int, TraceRecord] = {}
        # request_id -> (trace ids, how many of them name full blocks of this record's prompt)
        self.known_blocks: dict[int, tuple[tuple[int, ...], int]] = {}

    def add(self, rec: TraceRecord, block_size: int, lineno: int) -> None:
        """Append ``rec`` (from line ``lineno``) once it agrees with the records before it.

        Raises:
            TraceError: its parent is not an earlier record or its prompt does not extend the
                parent's (:meth:`_check_parent`); its ``request_id`` is taken.
        """
        if rec.parent is not None:
            self._check_parent(rec, lineno)
        if rec.request_id in self.by_id:
            raise TraceError(f"duplicate request_id {rec.request_id}", self.source, lineno, "request_id")
        self.by_id[rec.request_id] = rec
        self.items.append(rec)
        if rec.hash_ids is not None:
            self.known_blocks[rec.request_id] = (rec.hash_ids, rec.input_length // block_size)
        elif rec.parent is not None:
            self.known_blocks[rec.request_id] = self.known_blocks[rec.parent]

    def _check_parent(self, rec: TraceRecord, lineno: int) -> None:
        """``rec.parent`` is an earlier record, and ``rec``'s prompt extends its prompt and output.

        Raises:
            TraceError: naming ``parent`` (no such earlier record: why not), ``input_length``
                (shorter than the parent's prompt plus output) or ``hash_ids`` (ids that
                contradict the parent's full prompt blocks).
        """
        parent = self.by_id.get(rec.parent)
        if parent is None:
            reason = _missing_parent_reason(rec.parent, rec.request_id, self.lines, lineno, len(self.items))
            raise TraceError(reason, self.source, lineno, "parent")
        floor = parent.input_length + parent.output_length
        if rec.input_length < floor:
            raise TraceError(
                f"{rec.input_length} is shorter than its parent's prompt plus output "
                f"({parent.input_length} + {parent.output_length} = {floor}); a record with a "
                f"parent extends the parent's prompt and output", self.source, lineno, "input_length")
        if rec.hash_ids is not None:
            _check_parent_prefix(rec.hash_ids, rec.parent, self.known_blocks[rec.parent], self.source, lineno)


def _check_ms(value: object, source: str, lineno: int, field: str) -> None:
    """Raise the :data:`~kvroute.traces.inputs.MILLISECONDS` rule's error for a time field."""
    try:
        MILLISECONDS.check(value, field, source, lineno)
    except InputError as exc:
        raise TraceError(exc.reason, source, lineno, field) from None


def _parse_metadata(obj: dict, source: str, lineno: int, block_size: int | None) -> tuple[int, dict]:
    """Validate a metadata line; return the block size it settles on and its extra keys.

    ``block_size`` is the caller's (None: not given): the block size when the line declares
    none, else it must agree with the line's.

    Raises:
        TraceError: an unsupported ``kvroute_trace`` version, or a ``block_size`` that is not an
            int between 1 and ``MAX_BLOCK_SIZE`` or differs from the caller's.
    """
    version = obj["kvroute_trace"]
    if version != FORMAT_VERSION or type(version) is not int:
        raise TraceError(f"unsupported trace format version {version!r} (this reader knows {FORMAT_VERSION})",
                         source, lineno, "kvroute_trace")
    extra = {k: v for k, v in obj.items() if k not in ("kvroute_trace", "block_size")}
    declared = obj.get("block_size")
    if declared is None:
        return (block_size if block_size is not None else MOONCAKE_BLOCK_SIZE), extra
    if type(declared) is not int or not 0 < declared <= MAX_BLOCK_SIZE:
        raise TraceError(f"expected an int between 1 and {MAX_BLOCK_SIZE:,} (tokens), got {declared!r}",
                         source, lineno, "block_size")
    if block_size is not None and block_size != declared:
        raise TraceError(f"file declares block size {declared} but {block_size} was given",
                         source, lineno, "block_size")
    return declared, extra


def _check_parent_prefix(hash_ids: tuple[int, ...], parent: int, known: tuple[tuple[int, ...], int],
                         source: str, lineno: int) -> None:
    """A record with both ``parent`` and ``hash_ids``: its ids must repeat the parent's.

    The prompt is built from the parent (its prompt, its output, then new tokens), so ids that
    contradict the parent's full prompt blocks would describe another prompt than the one
    replayed; the ids past them are not used. ``known`` is the parent's trace ids and how many
    of them are full prompt blocks (for a parent without ``hash_ids``: its nearest ancestor's).
    """
    ids, n_full = known
    n = min(n_full, len(hash_ids))
    if hash_ids[:n] == tuple(ids[:n]):
        return
    i = next(i for i in range(n) if hash_ids[i] != ids[i])
    raise TraceError(
        f"entry {i} is {hash_ids[i]} but block {i} of parent {parent}'s prompt is {ids[i]}; a record "
        f"with a parent extends the parent's prompt, so its first {n} hash_ids must be the "
        f"parent's", source, lineno, "hash_ids")


def _missing_parent_reason(parent: int, request_id: int, lines: list[str], lineno: int, index: int) -> str:
    """Explain why ``parent`` is not an earlier record (only called on the error path).

    ``index`` is the 0-based position of the record on ``lineno``; later records without a
    ``request_id`` get their position as id, as in the reader.
    """
    if parent == request_id:
        return f"record names itself ({parent}) as its parent"
    for later_no in range(lineno + 1, len(lines) + 1):
        text = lines[later_no - 1]
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if type(obj) is not dict or "kvroute_trace" in obj:
            continue
        index += 1
        rid = obj.get("request_id")
        if (index if rid is None else rid) == parent:
            return (f"parent {parent} is a later request (line {later_no}); "
                    f"a parent must come before the records that extend it")
    return f"parent {parent} names no earlier request_id in this trace"
