"""Prefix-cache hits lost to eviction, read off a finished run: the prompt tokens of a later turn
that its worker had cached for an earlier turn of the same chat and evicted before it came.

A later turn's prompt extends its parent's: the parent's prompt, its reply, then new text
(``TraceRecord.parent``). vLLM caches every full block whose KV it computed, prompt and reply
alike (all tokens but the last sampled one: ``cache_full_blocks`` up to ``num_computed_tokens``),
and hits a prompt's blocks from the first up to all its tokens but the last
(``find_longest_cache_hit`` with ``max_cache_hit_length = num_tokens - 1``). So when a request
goes to the worker where its nearest ancestor ran and was served, every block of the
ancestor's computed sequence that the request's own prompt reaches is a hit unless the worker
evicted it in between; the blocks it missed there were lost to eviction:

    lost = block_size * max(0, min((A.prompt + A.output - 1) // bs, (R.prompt - 1) // bs)
                               - R.cached // bs)

for request ``R`` and its nearest ancestor ``A`` that ran on ``R``'s worker (``bs``: tokens
per block). The count is a lower bound of the hits eviction cost: it leaves out blocks shared
across chats (a system prompt) and requests without a parent on their worker (any trace
without parent links), and counts a request at its first admission, as ``cached_tokens``
does. It needs nothing from the engine, so it costs a run nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kvroute.sim.cluster.metrics import RECORD_COLUMNS

_ID, _WORKER, _PROMPT, _CACHED, _OUTPUT, _STATUS = (
    RECORD_COLUMNS.index(c) for c in ("request_id", "worker", "prompt_tokens", "cached_tokens", "output_tokens",
                                      "status"))
MAX_ANCESTORS = 1000
"""Turns walked back to find a request's nearest ancestor on its worker."""


def cacheable_blocks(worker_rows: Iterable[Mapping]) -> int:
    """The KV blocks the workers can cache in, all workers: each one's ``num_gpu_blocks`` less
    vLLM's null block, which holds no cache (the capacity ``vllm:kv_cache_usage_perc`` counts).

    Args:
        worker_rows: one mapping per worker with ``num_gpu_blocks`` (``RunResult.worker_rows``).
    """
    return sum(int(w["num_gpu_blocks"]) - 1 for w in worker_rows)


def parent_links(trace) -> dict[int, int | None]:
    """Request id -> the id of the request its prompt extends, or None, for ``trace``'s records
    (``TraceRecord.parent``): what :func:`evicted_history_tokens` walks."""
    return {rec.request_id: rec.parent for rec in trace.records}


def evicted_history_tokens(rows: Iterable[Sequence], parents: Mapping[int, int | None],
                           block_size: int) -> tuple[int, int, int]:
    """Prompt tokens lost to eviction in one run, with the cached and the prompt tokens of its
    served requests (the hit rate is ``cached / prompt``).

    Args:
        rows: the run's records as tuples in ``RECORD_COLUMNS`` order (``RunResult.record_rows``).
        parents: request id -> the id of the request its prompt extends, or None
            (:func:`parent_links` of the run's trace).
        block_size: tokens per KV block.

    Returns:
        ``(lost, cached, prompt)``: tokens, summed over the served requests (``lost``: see the
        module's docstring).
    """
    served = {row[_ID]: row for row in rows if row[_STATUS] == "ok"}
    lost = cached = prompt = 0
    for rid, row in served.items():
        prompt += row[_PROMPT]
        cached += row[_CACHED]
        worker, ancestor, steps = row[_WORKER], parents.get(rid), 0
        while ancestor is not None and steps < MAX_ANCESTORS:
            above = served.get(ancestor)
            if above is not None and above[_WORKER] == worker:
                computed = (above[_PROMPT] + above[_OUTPUT] - 1) // block_size
                reach = min(computed, (row[_PROMPT] - 1) // block_size)
                lost += block_size * max(0, reach - row[_CACHED] // block_size)
                break
            ancestor, steps = parents.get(ancestor), steps + 1
    return lost, cached, prompt
