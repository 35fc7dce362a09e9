"""Summary figures of a trace (sizes, sharing of prompt blocks) and a readable table of them."""

from __future__ import annotations

import numpy as np

from kvroute.traces.format import Trace


def resolve_hash_ids(trace: Trace) -> list[tuple[int, ...]]:
    """Every record's prompt block ids, including records given only by a ``parent``.

    A record with ``hash_ids`` keeps them. For a record with a parent and no ``hash_ids``
    (prompt = parent's prompt + parent's output + new tokens), block ``i`` at
    ``trace.block_size`` gets:

    - the parent's id ``i`` if the block lies fully inside the parent's prompt
      (``(i + 1) * block_size <= parent.input_length``);
    - else, if it lies fully inside parent prompt + parent output, an id shared by all records
      extending the same parent (same content: the parent's prompt and the start of its output);
    - else a fresh id used by no other record.

    Fresh ids start above the largest explicit id, so they never collide with file ids.
    Parents must precede their children (as :func:`read_trace` guarantees).

    Returns:
        One tuple per record, in ``trace.records`` order, each of length
        ``ceil(input_length / block_size)``.

    Raises:
        KeyError: a ``parent`` is not an earlier record (not possible for a trace from the reader).
    """
    bs = trace.block_size
    next_id = 1 + max((max(r.hash_ids) for r in trace.records if r.hash_ids), default=-1)
    out: list[tuple[int, ...]] = []
    by_id: dict[int, tuple[int, int, tuple[int, ...]]] = {}
    shared_output: dict[tuple[int, int], int] = {}
    for rec in trace.records:
        ids = rec.hash_ids
        if ids is None:
            p_in, p_out, p_ids = by_id[rec.parent]
            n_blocks = -(-rec.input_length // bs)
            keep = p_in // bs
            ext = list(p_ids[:keep])
            for i in range(keep, n_blocks):
                if (i + 1) * bs <= p_in + p_out:
                    key = (rec.parent, i)
                    if key not in shared_output:
                        shared_output[key] = next_id
                        next_id += 1
                    ext.append(shared_output[key])
                else:
                    ext.append(next_id)
                    next_id += 1
            ids = tuple(ext)
        by_id[rec.request_id] = (rec.input_length, rec.output_length, ids)
        out.append(ids)
    return out


NO_PREFIX_ORIGINS = ("azure_csv", "burstgpt", "vllm_bench_serve")
"""``Trace.metadata["origin"]`` of the formats whose files carry lengths but no prefix (no hash
ids, no text): their readers give each request fresh block ids, so no block repeats."""


def trace_stats(trace: Trace) -> dict:
    """Summary figures of a trace.

    Block figures use :func:`resolve_hash_ids` (so parent-extending records count their implied
    blocks); for traces whose records all carry ``hash_ids`` (Mooncake's) they are the file's
    own ids. A *repeated reference* is a ``hash_ids`` entry whose id appeared in an EARLIER
    record (file order); an id repeated within one record's own list is not a repeat unless an
    earlier record had it. Percentiles are numpy's linear interpolation.

    Returns:
        A dict (insertion-ordered for :func:`format_stats`) with keys ``source``, ``records``,
        ``sessions`` (distinct non-None ``session_id``; only present when any record has one),
        ``block_size`` (tokens), ``input_tokens_{mean,p50,p90,max}``,
        ``output_tokens_{mean,p50,p90,max}`` (tokens), ``block_ids`` (only for a format without
        prefix information, :data:`NO_PREFIX_ORIGINS`: its ids are made up), ``distinct_block_ids``,
        ``block_references`` (total ids over all records), ``repeated_references``,
        ``repeat_share_pct`` (= 100 * repeated / references; 0.0 for no references) and
        ``duration_s`` (last minus first ``timestamp_ms``, in s; 0.0 for closed-loop traces
        whose records all start at 0).
    """
    recs = trace.records
    stats: dict = {"source": trace.source, "records": len(recs)}
    sessions = {r.session_id for r in recs if r.session_id is not None}
    if sessions:
        stats["sessions"] = len(sessions)
    stats["block_size"] = trace.block_size
    for name, values in (("input_tokens", [r.input_length for r in recs]),
                         ("output_tokens", [r.output_length for r in recs])):
        arr = np.asarray(values, dtype=np.float64)
        if arr.size:
            stats[f"{name}_mean"] = float(arr.mean())
            stats[f"{name}_p50"] = float(np.percentile(arr, 50))
            stats[f"{name}_p90"] = float(np.percentile(arr, 90))
            stats[f"{name}_max"] = int(arr.max())
        else:
            stats.update({f"{name}_mean": 0.0, f"{name}_p50": 0.0, f"{name}_p90": 0.0, f"{name}_max": 0})

    seen: set[int] = set()
    references = repeated = 0
    for ids in resolve_hash_ids(trace):
        references += len(ids)
        repeated += sum(1 for h in ids if h in seen)
        seen.update(ids)
    if trace.metadata.get("origin") in NO_PREFIX_ORIGINS:
        stats["block_ids"] = "fresh per request (the file has no prefix information)"
    stats["distinct_block_ids"] = len(seen)
    stats["block_references"] = references
    stats["repeated_references"] = repeated
    stats["repeat_share_pct"] = 100.0 * repeated / references if references else 0.0
    times = [r.timestamp_ms for r in recs]
    stats["duration_s"] = (max(times) - min(times)) / 1000.0 if times else 0.0
    return stats


_LABELS = {
    "source": "source",
    "records": "records",
    "sessions": "sessions",
    "block_size": "block size (tokens)",
    "input_tokens_mean": "input tokens, mean",
    "input_tokens_p50": "input tokens, p50",
    "input_tokens_p90": "input tokens, p90",
    "input_tokens_max": "input tokens, max",
    "output_tokens_mean": "output tokens, mean",
    "output_tokens_p50": "output tokens, p50",
    "output_tokens_p90": "output tokens, p90",
    "output_tokens_max": "output tokens, max",
    "block_ids": "block ids",
    "distinct_block_ids": "distinct block ids",
    "block_references": "block references",
    "repeated_references": "repeat an earlier request",
    "repeat_share_pct": "repeat share (%)",
    "duration_s": "timestamps span (s)",  # 0 for a closed-loop burst: its turns are sent as parents end
}


def format_stats(stats: dict) -> str:
    """Render a :func:`trace_stats` dict as a two-column text table, one figure per line.

    Ints get thousands separators, floats one or two decimals (percentages two). Unknown keys
    are shown under their own name.
    """
    rows = []
    for key, value in stats.items():
        label = _LABELS.get(key, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            text = str(value)
        elif isinstance(value, int):
            text = f"{value:,}"
        elif key.endswith("_pct"):
            text = f"{value:.2f}"
        else:
            text = f"{value:,.1f}"
        rows.append((label, text, isinstance(value, (int, float)) and not isinstance(value, bool)))
    width = max((len(label) for label, _, _ in rows), default=0)
    vwidth = max((len(text) for _, text, numeric in rows if numeric), default=0)
    return "\n".join(f"{label:<{width}}  {text:>{vwidth}}" if numeric else f"{label:<{width}}  {text}"
                     for label, text, numeric in rows)
