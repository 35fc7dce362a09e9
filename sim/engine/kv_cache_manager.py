"""Per-request KV block tables over a BlockPool (``vllm/v1/core/kv_cache_manager.py`` and
``single_type_kv_cache_manager.py`` for one full-attention group), and vLLM's prefix-cache
counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvroute.sim.engine.block_pool import BlockPool
from kvroute.sim.engine.fast_forward import ManagerDecodeRuns
from kvroute.sim.engine.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters as vLLM exports them, recorded once per admission: ``requests`` and
    ``preempted_requests`` count requests, the others tokens.

    ``queries``/``hits`` are ``vllm:prefix_cache_queries_total``/``hits_total``: tokens of first
    admissions (``request.num_tokens``) and their cached tokens. Re-admissions after preemption
    go to ``preempted_queries``/``preempted_hits``, which no Prometheus metric exports
    (``vllm/v1/metrics/stats.py: PrefixCacheStats.record``).
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one admission of ``num_tokens`` tokens of which ``num_hits`` were cached."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager(ManagerDecodeRuns):
    """Block tables of the requests of one worker.

    Args:
        pool: the worker's BlockPool.
        block_size: tokens per block.
        max_model_len: longest sequence; slots are never allocated past it.

    Attributes:
        stats: prefix-cache counters (:class:`PrefixCacheStats`: queries and hits in tokens,
            admissions in requests).
    """

    def __init__(self, pool: BlockPool, block_size: int, max_model_len: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.req_to_blocks: dict[int, list[int]] = {}
        self.num_cached_block: dict[int, int] = {}
        self.stats = PrefixCacheStats()

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Look up the longest cached prefix of a request that has no computed tokens.

        The hit is capped at ``request.num_tokens - 1`` tokens, so at least one token is always
        computed and a fully cached, block-aligned prompt recomputes its last block.

        Returns:
            ``(hit block ids, hit tokens)``; nothing is taken until ``allocate_slots``, and
            nothing is counted here: the scheduler records the hit in ``stats`` once the
            admission's ``allocate_slots`` succeeds (``Scheduler._schedule_waiting``).
        """
        if not self.pool.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit = self.pool.longest_cache_hit(request.block_hashes, max_blocks)
        return hit, len(hit) * self.block_size

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[int] = (),  # type: ignore[assignment]
        full_sequence: bool = False,
    ) -> bool:
        """Whether ``allocate_slots`` with the same arguments would succeed.

        Blocks needed = ceil(tokens needing a slot / block_size) - blocks already held - hit
        blocks, plus every hit block with no reference (it sits in the free queue, so taking it
        uses free capacity). With ``full_sequence`` (admission, vLLM's default
        ``scheduler_reserve_full_isl``) the whole current sequence must fit, not only this chunk.
        """
        pool = self.pool
        num_held = len(self.req_to_blocks.get(request.request_id, ()))
        # hit blocks with no reference sit in the free queue: taking them uses free capacity
        num_evictable = pool.num_evictable(new_computed_blocks) if new_computed_blocks else 0
        num_local = num_held + len(new_computed_blocks)
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        bs = self.block_size
        free = pool.num_free_blocks
        if full_sequence:
            full = min(request.num_tokens, self.max_model_len)
            need = max(-(-full // bs) - num_local, 0) + num_evictable
            if need > free:
                return False
        slots = min(num_computed + num_new_tokens, self.max_model_len)
        need = max(-(-slots // bs) - num_local, 0) + num_evictable
        return need <= free

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[int] = (),  # type: ignore[assignment]
        full_sequence: bool = False,
    ) -> bool:
        """Give ``request`` the blocks for its hit and its next ``num_new_tokens`` tokens.

        On success the hit blocks are touched and appended, new blocks are popped from the head
        of the free queue, and every block that becomes full with the scheduled tokens is
        registered in the prefix cache now (vLLM caches at schedule time).

        Returns:
            False, changing nothing, when the blocks do not fit (see ``can_allocate``).
        """
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if blocks is not None and not new_computed_blocks and not full_sequence:
            return self._extend_running(request, blocks, num_new_tokens)
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks, full_sequence):
            return False
        if blocks is None:
            blocks = self.req_to_blocks[rid] = []
            self.num_cached_block[rid] = 0
        pool = self.pool
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_block[rid] = len(blocks)
        bs = self.block_size
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * bs
        slots = min(num_computed + num_new_tokens, self.max_model_len)
        need = -(-slots // bs) - len(blocks)
        if need > 0:
            blocks.extend(pool.get_new_blocks(need))
        num_full = min(num_computed + num_new_tokens, request.num_tokens) // bs
        start = self.num_cached_block[rid]
        if num_full > start:
            pool.cache_full_blocks(blocks, request.block_hashes, start, num_full)
            self.num_cached_block[rid] = num_full
        return True

    def _extend_running(self, request: Request, blocks: list[int], num_new_tokens: int) -> bool:
        # Hot path of every step: a running request (no prefix lookup, no admission check)
        # takes the same decision as ``can_allocate`` with nothing hit.
        bs = self.block_size
        end = request.num_computed_tokens + num_new_tokens
        slots = end if end < self.max_model_len else self.max_model_len
        need = -(-slots // bs) - len(blocks)
        if need > 0:
            if need > self.pool.num_free_blocks:
                return False
            blocks.extend(self.pool.get_new_blocks(need))
        num_tokens = request.num_prompt_tokens + request.num_output_tokens
        num_full = (end if end < num_tokens else num_tokens) // bs
        rid = request.request_id
        start = self.num_cached_block[rid]
        if num_full > start:
            self.pool.cache_full_blocks(blocks, request.block_hashes, start, num_full)
            self.num_cached_block[rid] = num_full
        return True

    def free(self, request: Request) -> None:
        """Release a finished or preempted request's blocks, last block first."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        num_hashed = self.num_cached_block.pop(rid, 0)
        if blocks:
            # The table's first num_cached_block blocks are exactly its cached ones (hits, then
            # blocks registered as they filled); nothing is cached when caching is off.
            self.pool.free_table(blocks, request.block_hashes, num_hashed if self.pool.enable_caching else 0)

    def get_block_ids(self, request: Request) -> list[int]:
        """The request's block table (a copy)."""
        return list(self.req_to_blocks.get(request.request_id, ()))

    # -- block tables one step at a time (also the fallback of a decode run) ---------------------

    def allocate_new_blocks(self, request: Request, num_blocks: int) -> None:
        """Append ``num_blocks`` blocks popped from the free queue to the request's table
        (``SingleTypeKVCacheManager.allocate_new_blocks``); the caller checks they are free.

        Raises:
            KeyError: if the request holds no table.
        """
        self.req_to_blocks[request.request_id].extend(self.pool.get_new_blocks(num_blocks))

    def cache_blocks(self, request: Request, num_full_blocks: int) -> None:
        """Register the request's blocks up to ``num_full_blocks`` in the prefix cache
        (``SingleTypeKVCacheManager.cache_blocks``); nothing when they already are.

        Raises:
            KeyError: if the request holds no table.
        """
        rid = request.request_id
        blocks = self.req_to_blocks[rid]
        start = self.num_cached_block[rid]
        if num_full_blocks > start:
            self.pool.cache_full_blocks(blocks, request.block_hashes, start, num_full_blocks)
            self.num_cached_block[rid] = num_full_blocks

    def get_num_cached_blocks(self, request: Request) -> int:
        """How many of the request's blocks are registered (or hits): a prefix of its table.

        Raises:
            KeyError: if the request holds no table.
        """
        return self.num_cached_block[request.request_id]
