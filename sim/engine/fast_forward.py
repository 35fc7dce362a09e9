"""Decode-run fast-forward, the engine's half: which steps after a pure-decode step repeat it
exactly, and how the queues and block tables advance over such a run at once.

vLLM steps one at a time. When a step only decodes (every running request, one token each,
nothing admitted, preempted or waiting) and nothing changes for ``n`` more steps (no request
finishes, the free queue covers every block the requests cross into), those ``n`` steps have
the same composition, and their effect on the engine state is known in closed form: the blocks
each request opens are popped from the free queue in (step, running position) order, and the
blocks each fills are registered in the prefix cache. :class:`SchedulerDecodeRuns` finds such
runs and applies them; :class:`ManagerDecodeRuns` allocates and registers a run's blocks with
one pop from the pool when that is provably the same as stepping. The result is the state
``n`` calls of ``Scheduler.schedule`` + ``update`` leave, block id for block id (checked by the
fast-path tests against stepping one at a time).

The timing half (how long the run's steps take, and when each ends) is
``kvroute.sim.timing.decode_run``; the worker (``kvroute.sim.cluster.worker``) joins the two,
and asks its step timer whether it may (``StepTimer.fast_forward``). The compiled scheduler and
manager (``_scheduler.pyx``, ``_kv_cache_manager.pyx``) carry the same methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvroute.sim.engine.request import Request
    from kvroute.sim.engine.scheduler_output import SchedulerOutput


def first_run_step(c: int, block_size: int) -> int:
    """The first step j >= 1 of a decode run with (c + j) % block_size == 0: with ``c`` the
    request's computed tokens before the run, the step that fills a block; with ``c - 1``, the
    step that opens one."""
    return (-c) % block_size or block_size


class SchedulerDecodeRuns:
    """The decode-run methods of :class:`kvroute.sim.engine.scheduler.Scheduler` (a mixin: it
    reads the scheduler's ``config``, ``waiting``, ``running``, ``pool`` and
    ``kv_cache_manager``)."""

    def decode_run_length(self, out: SchedulerOutput) -> int:
        """How many steps after ``out`` would repeat its composition exactly.

        ``out`` must be the step just scheduled. A run exists when the step only decodes (every
        running request, one token each, none admitted or preempted, nothing waiting, and each
        request samples a token in it: not a preempted request recomputing its prompt and
        output one token per step, as a ``long_prefill_token_threshold`` of 1 lets it); it lasts
        while no request finishes (after ``out`` and the returned number of steps, every request
        still has a token to generate) and the free queue covers every block the run's requests
        cross into. Returns 0 when ``out`` is not such a step. Arrivals are the caller's concern.
        """
        if self.waiting or out.preempted or out.admitted or len(out.requests) != len(self.running):
            return 0
        if out.num_batched_tokens != len(out.requests):
            return 0
        max_model_len = self.config.max_model_len
        n = 1 << 62
        for req in out.requests:
            if req.num_output_tokens < 1 or req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                return 0
            left = req.max_tokens - req.num_output_tokens - 2
            room = max_model_len - req.num_prompt_tokens - req.num_output_tokens - 2
            n = min(n, left, room)
        if n <= 0:
            return 0
        return min(n, self._steps_before_blocks_run_out(out.requests, n))

    def _steps_before_blocks_run_out(self, requests: list[Request], n: int) -> int:
        bs = self.config.block_size
        free = self.pool.num_free_blocks
        if len(requests) * (-(-n // bs)) <= free:
            return n
        firsts = [first_run_step(req.num_computed_tokens - 1, bs) for req in requests]

        def blocks_by(j: int) -> int:
            return sum((j - f) // bs + 1 for f in firsts if f <= j)

        lo, hi = 0, n  # largest j with blocks_by(j) <= free
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks_by(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def advance_decode_run(self, requests: list[Request], num_steps: int) -> None:
        """Apply ``num_steps`` decode steps to ``requests`` at once, exactly as that many
        ``schedule()`` + ``update()`` calls would (block allocations and prefix-cache
        registrations in step order, then running order). Only valid for up to
        ``decode_run_length`` steps after the step that ``update`` just applied.
        """
        if num_steps <= 0:
            return
        bs = self.config.block_size
        kv = self.kv_cache_manager
        if self._advance_decode_run_by_request(requests, num_steps):
            return
        events: list[tuple[int, int, int]] = []  # (step, position in running order, kind)
        for pos, req in enumerate(requests):
            c = req.num_computed_tokens  # before run step 1; step j computes token c + j
            for j in range(first_run_step(c - 1, bs), num_steps + 1, bs):
                events.append((j, pos, 0))  # token c + j opens a block
            for j in range(first_run_step(c, bs), num_steps + 1, bs):
                events.append((j, pos, 1))  # token c + j fills its block
        events.sort()
        for _, pos, kind in events:
            req = requests[pos]
            if kind == 0:
                kv.allocate_new_blocks(req, 1)
            else:
                kv.cache_blocks(req, kv.get_num_cached_blocks(req) + 1)
        for req in requests:
            req.num_computed_tokens += num_steps
            req.num_output_tokens += num_steps

    def _advance_decode_run_by_request(self, requests: list[Request], num_steps: int) -> bool:
        """``advance_decode_run`` with one allocation for the whole run and one registration
        per request (``KVCacheManager.allocate_decode_run``), when that is provably the same.
        Returns False, changing nothing, when the hashes do not allow it."""
        if not self.kv_cache_manager.allocate_decode_run(requests, num_steps):
            return False
        for req in requests:
            req.num_computed_tokens += num_steps
            req.num_output_tokens += num_steps
        return True


class ManagerDecodeRuns:
    """The decode-run methods of :class:`kvroute.sim.engine.kv_cache_manager.KVCacheManager` (a
    mixin: it reads the manager's ``pool``, ``block_size``, ``req_to_blocks`` and
    ``num_cached_block``, and calls its ``cache_blocks``)."""

    def append_blocks(self, request: Request, block_ids: list[int]) -> None:
        """Append blocks the caller took from the pool (``get_new_blocks``) to the request's table.

        Raises:
            KeyError: if the request holds no table.
        """
        self.req_to_blocks[request.request_id].extend(block_ids)

    def allocate_decode_run(self, requests: list[Request], num_steps: int) -> bool:
        """The block tables after ``num_steps`` decode steps of ``requests`` (running order; each
        computes one token per step after its ``num_computed_tokens``, which the caller
        advances), with one allocation for the whole run and one registration per request,
        when that is provably the same as stepping: the blocks opened are popped in the
        (step, running position) order of the step-by-step loop, and the blocks filled carry
        hashes that are distinct and not yet cached, so no duplicate entry can arise and the
        registrations commute with each other and with the run's evictions (which only drop
        hashes of free blocks). The caller checks the free queue covers the run.

        Returns:
            False, changing nothing, when the hashes do not allow it (step one at a time then).

        Raises:
            KeyError: if a request holds no table.
        """
        bs = self.block_size
        num_reqs = len(requests)
        opens: list[int] = []  # step * num_reqs + position, one per block opened
        ends: list[int] = []  # blocks each request has registered after the run
        filled: list[int] = []
        for pos, req in enumerate(requests):
            c = req.num_computed_tokens  # before run step 1; step j computes token c + j
            first = first_run_step(c - 1, bs)  # the first step that opens a block
            opens.extend(range(first * num_reqs + pos, num_steps * num_reqs + pos + 1, bs * num_reqs))
            start = self.num_cached_block[req.request_id]
            end = start + len(range(first_run_step(c, bs), num_steps + 1, bs))  # steps that fill one
            ends.append(end)
            filled += req.block_hashes[start:end]
        if len(set(filled)) != len(filled) or not self.pool.none_cached(filled):
            return False
        opens.sort()
        new = self.pool.get_new_blocks(len(opens))
        opened: list[list[int]] = [[] for _ in requests]
        for key, bid in zip(opens, new):
            opened[key % num_reqs].append(bid)
        for req, blocks, end in zip(requests, opened, ends):
            if blocks:
                self.append_blocks(req, blocks)
            self.cache_blocks(req, end)
        return True
