"""kvroute's trace format: JSON Lines, one request per line, compatible with Mooncake's files.

A record (one line)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}

Required: ``timestamp`` (ms since the trace start), ``input_length`` and ``output_length``
(tokens). ``hash_ids`` gives one id per prompt block of the trace's block size (Mooncake: 512);
id ``i`` names the whole prefix up to and including block ``i``, so
``len(hash_ids) == ceil(input_length / block_size)``. Optional, for multi-turn sessions:
``request_id`` (default: the record's 0-based position), ``session_id``, ``turn`` (1-based),
``parent`` (the ``request_id`` whose prompt and output this prompt extends) and ``think_time``
(ms after the parent's last token before this turn is sent; closed-loop replay uses it).
A record with a ``parent`` may omit ``hash_ids``: its prompt is the parent's prompt, the
parent's generated output, then ``input_length - parent.input_length - parent.output_length``
new tokens unique to this request. A record with both ``parent`` and ``hash_ids`` is built the
same way; its first ``parent.input_length // block_size`` ids must equal the parent's (the
parent's full prompt blocks; for a parent without ids, those of its nearest ancestor with ids),
or the reader rejects it naming the line and ``hash_ids``. Its later ids are not used.

Limits (:mod:`kvroute.traces.inputs`): lengths at most ``MAX_TOKENS``, block sizes at most
``MAX_BLOCK_SIZE``, hash ids at most ``MAX_HASH_ID`` (2**48 - 1), ``timestamp`` and
``think_time`` finite and between 0 and 1e12 ms (``MILLISECONDS``, the ``SECONDS`` bound); each
key once per line; a trace has at least one record.

An optional first line declares the trace's block size: ``{"kvroute_trace": 1, "block_size": 16}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace.

    Attributes:
        request_id: unique id within the trace.
        timestamp_ms: arrival time (open-loop) or earliest send time, ms since trace start.
        input_length: prompt tokens.
        output_length: tokens to generate.
        hash_ids: ids of the prompt's blocks at the trace's block size (a tuple, or a ``range``
            for readers that number fresh blocks, so no ids are expanded), or None for a record
            whose prompt is fully described by its parent plus new tokens.
        session_id: conversation id, or None.
        turn: 1-based turn within the session, or None.
        parent: request_id this prompt extends, or None.
        think_time_ms: delay after the parent's last token before this request is sent.
        stage: index of the load stage the request is sent in (an inference-perf stage ladder,
            ``kvroute.traces.inference_perf``), or None for a trace without stages.
    """

    request_id: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: Sequence[int] | None = None
    session_id: int | str | None = None
    turn: int | None = None
    parent: int | None = None
    think_time_ms: float = 0.0
    stage: int | None = None


@dataclass(slots=True)
class Trace:
    """A whole trace: records in file order and the block size their ``hash_ids`` use.

    Attributes:
        records: the requests, in file order.
        block_size: tokens per ``hash_ids`` block (Mooncake: 512).
        source: where it came from (a path or a generator's name), for error messages.
    """

    records: list[TraceRecord]
    block_size: int
    source: str = "<memory>"
    metadata: dict = field(default_factory=dict)


def truncate(trace: Trace, n: int) -> Trace:
    """The first ``n`` records, with records whose parent was cut dropped too."""
    kept, ids = [], set()
    for rec in trace.records[:n]:
        if rec.parent is None or rec.parent in ids:
            kept.append(rec)
            ids.add(rec.request_id)
    return Trace(kept, trace.block_size, trace.source, dict(trace.metadata))
