"""Read a ``vllm bench serve --save-result --save-detailed`` result JSON as a :class:`Trace`.

vLLM writes the per-request lists ``input_lens``, ``output_lens``, ``ttfts``, ``itls``,
``latencies``, ``start_times`` and ``errors`` (``vllm/benchmarks/serve.py``, ``benchmark()``'s
``result`` dict; ``start_times`` in vLLM >= 0.11). The trace replays those lengths at those send
times; it carries no prefix information, so every record gets fresh hash ids. The run's measured
summary (``mean_ttft_ms``, ...) is kept in the metadata, to set beside a simulation of the trace.
"""

from __future__ import annotations

import math
import os

from kvroute.traces.inputs import MAX_TOKENS, SECONDS, InputError, describe
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.reader import MOONCAKE_BLOCK_SIZE, TraceError, check_trace_block_size, load_json_document

MEASURED_FIELDS = ("model_id", "request_rate", "duration", "completed", "mean_ttft_ms", "median_ttft_ms",
                   "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "output_throughput")
"""Scalar fields of the result copied to ``metadata["measured"]`` when present."""


def is_vllm_bench_result(doc: object) -> bool:
    """Whether a parsed JSON document looks like a ``vllm bench serve`` result."""
    return type(doc) is dict and "input_lens" in doc and "output_lens" in doc


def read_vllm_bench(path: str | os.PathLike[str], block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Read a ``vllm bench serve`` result JSON saved with ``--save-detailed``.

    Args:
        path: the result ``.json``.
        block_size: tokens per hash id block (default 512).

    Returns:
        A :class:`Trace`, one record per successful request (empty ``errors`` entry and output
        above 0 tokens) in file order: ``request_id`` its 0-based index in the file,
        ``timestamp_ms`` = 1000 x (its ``start_times`` entry - the earliest kept one), or 0 for
        every record when the file has no ``start_times``; ``input_length`` = ``input_lens``,
        ``output_length`` = ``output_lens`` (tokens); fresh ``hash_ids``. ``metadata``:
        ``origin``, ``skipped_failed`` (count), ``timestamps`` (``"start_times"`` or
        ``"absent"``) and ``measured`` (the scalar fields of :data:`MEASURED_FIELDS` present).

    Raises:
        TraceError (a ValueError) naming path and field (``input_lens[i]``): not JSON, not a
            result (no ``input_lens``/``output_lens`` lists), lists of different lengths, a
            length not an int between 0 and ``MAX_TOKENS``, a start time not a finite number
            between 0 and 1e9 s (:data:`~kvroute.traces.inputs.SECONDS`),
            no successful request; a bad ``block_size``.
        OSError: the file cannot be opened.
    """
    source = str(path)
    check_trace_block_size(block_size, path)
    doc = load_json_document(path)
    if not is_vllm_bench_result(doc):
        raise TraceError("not a vllm bench serve result (needs input_lens and output_lens; "
                         "save it with --save-result --save-detailed)", source, None, "input_lens")
    n = _list(doc, "input_lens", source, None)
    _list(doc, "output_lens", source, n)
    starts = doc.get("start_times")
    if starts is not None:
        _list(doc, "start_times", source, n)
    errors = doc.get("errors") or [""] * n
    _list({"errors": errors}, "errors", source, n)
    kept = []
    for i in range(n):
        n_in = _tokens(doc["input_lens"][i], source, f"input_lens[{i}]")
        n_out = _tokens(doc["output_lens"][i], source, f"output_lens[{i}]")
        start = 0.0
        if starts is not None:
            start = starts[i]
            if type(start) not in (int, float) or not math.isfinite(start):
                raise TraceError(f"expected a finite number (s), got {describe(start)}", source, None,
                                 f"start_times[{i}]")
            try:  # vLLM writes time.perf_counter() values: seconds since boot
                SECONDS.check(start)
            except InputError as exc:
                raise TraceError(exc.reason, source, None, f"start_times[{i}]") from None
        if errors[i] or n_in == 0 or n_out == 0:
            continue
        kept.append((i, float(start), n_in, n_out))
    if not kept:
        raise TraceError("no successful request (every one has an error or 0 tokens)", source)
    t0 = min(k[1] for k in kept)
    records, next_id = [], 0
    for i, start, n_in, n_out in kept:
        n_blocks = -(-n_in // block_size)
        records.append(TraceRecord(i, (start - t0) * 1000.0, n_in, n_out, range(next_id, next_id + n_blocks)))
        next_id += n_blocks
    measured = {k: doc[k] for k in MEASURED_FIELDS if type(doc.get(k)) in (int, float, str)}
    return Trace(records, block_size, source,
                 {"origin": "vllm_bench_serve", "skipped_failed": n - len(kept),
                  "timestamps": "start_times" if starts is not None else "absent", "measured": measured})


def _list(doc: dict, key: str, source: str, n: int | None) -> int:
    value = doc.get(key)
    if type(value) is not list:
        raise TraceError(f"expected a list, got {describe(value)}", source, None, key)
    if n is not None and len(value) != n:
        raise TraceError(f"has {len(value)} entries but input_lens has {n}", source, None, key)
    return len(value)


def _tokens(value: object, source: str, field: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_TOKENS:
        raise TraceError(f"expected an int between 0 and {MAX_TOKENS:,} (tokens), got {describe(value)}",
                         source, None, field)
    return value
