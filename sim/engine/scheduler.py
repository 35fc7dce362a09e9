"""vLLM v1's step scheduler for one engine (``vllm/v1/core/sched/scheduler.py: schedule``,
``update_from_output``), with chunked prefill on, FCFS, recompute preemption and no speculative
decoding. This class steps synchronously (the CPU backend's setting); vLLM's ``AsyncScheduler``
is ``kvroute.sim.engine.async_scheduler`` (the output placeholders it adds are read here, and
are 0 without it).

One step: a token budget of ``max_num_batched_tokens`` shared by prefill chunks and decodes.
Pass 1 walks the running queue in order; a request whose blocks cannot be allocated preempts the
last running request (possibly itself) until they fit. Pass 2 admits waiting requests in FCFS
order, only when pass 1 preempted nothing, and stops at the first that does not fit. Plain class:
no SimPy, no clock.
"""

from __future__ import annotations

from collections import deque

from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.block_pool import BlockPool
from kvroute.sim.engine.fast_forward import SchedulerDecodeRuns
from kvroute.sim.engine.kv_cache_manager import KVCacheManager
from kvroute.sim.engine.request import Request, RequestStatus
from kvroute.sim.engine.scheduler_output import SchedulerOutput, StepResult, prefill_pairs

__all__ = ["Scheduler", "SchedulerOutput", "StepResult", "admission_error", "clamp_max_tokens"]


def admission_error(num_prompt_tokens: int, max_model_len: int) -> str | None:
    """The error vLLM returns for a prompt it rejects, or None.

    vLLM 0.32 rejects a prompt that leaves no room for one output token, i.e.
    ``num_prompt_tokens >= max_model_len`` (``renderers/params.py: _token_len_check``, and the
    engine's ``input_processor.py: _validate_prompt_len``); a longer ``max_tokens`` is clamped
    instead (see ``clamp_max_tokens``).
    """
    if num_prompt_tokens >= max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {num_prompt_tokens} input tokens."
        )
    return None


def clamp_max_tokens(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """``max_tokens`` as vLLM's OpenAI server passes it on: at most ``max_model_len - prompt``
    (``entrypoints/serve/utils/api_utils.py: get_max_tokens``)."""
    return min(max_tokens, max_model_len - num_prompt_tokens)


class Scheduler(SchedulerDecodeRuns):
    """The waiting and running queues of one engine and the step algorithm over them.

    Args:
        config: engine settings.

    Attributes:
        waiting: FCFS queue; preempted requests return to its front.
        running: requests holding blocks, in admission order.
        kv_cache_manager: block tables and prefix-cache counters.
        num_preemptions: preemptions so far (``vllm:num_preemptions_total``).
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.kv_cache_manager = KVCacheManager(self.pool, config.block_size, config.max_model_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # -- queue management ---------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Append a new request to the waiting queue."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting) or bool(self.running)

    def finish_requests(self, requests, finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[Request]:
        """Finish requests from outside the scheduler: vLLM's ``Scheduler.finish_requests``
        (``vllm/v1/core/sched/scheduler.py``, vLLM 0.32), which ``EngineCore.abort_requests``
        calls with ``FINISHED_ABORTED`` when the API server aborts a request whose client went
        away.

        First every request given that is still in this engine (running, or waiting or
        preempted in the waiting queue) is taken out of its queue, the others keeping their
        order; then each, in the order given, gets ``finished_status`` and its blocks are freed
        (``_free_request``: last block first; blocks already registered stay in the prefix cache
        as evictable). A request that is finished, or not in this engine, is skipped, as is a
        repeat. A step already scheduled that holds an aborted request samples nothing for it
        when its output is applied (``update`` skips finished requests).

        Args:
            requests: the requests (objects of this engine's request class).
            finished_status: a finished status (``FINISHED_ABORTED`` for an abort).

        Returns:
            The requests finished by this call, in the order given.

        Raises:
            ValueError: if ``finished_status`` is not a finished status.
        """
        if finished_status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_ABORTED):
            raise ValueError(f"finish_requests: {finished_status!r} is not a finished status")
        finished_status = RequestStatus(finished_status)
        valid: list[Request] = []
        seen: set[int] = set()
        from_running: set[int] = set()
        from_waiting: list[Request] = []
        for req in requests:
            key = id(req)
            if key in seen or req.status >= RequestStatus.FINISHED_LENGTH_CAPPED:
                continue
            if req.status is RequestStatus.RUNNING:
                from_running.add(key)
            elif req in self.waiting:
                from_waiting.append(req)
            else:
                continue  # not in this engine (vLLM: an unknown request id)
            seen.add(key)
            valid.append(req)
        if from_running:
            self.running = [r for r in self.running if id(r) not in from_running]
        for req in from_waiting:
            self.waiting.remove(req)
        for req in valid:
            req.status = finished_status
            self.kv_cache_manager.free(req)
        return valid

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose the requests and token counts of the next step and allocate their blocks.

        Advances each scheduled request's ``num_computed_tokens`` by its scheduled tokens (vLLM
        does so right after scheduling).
        """
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        num_eligible = len(self.running) + len(self.waiting)
        # NOTE: the long-prefill cap applies only when another request competes for the step.
        threshold = self.config.long_prefill_token_threshold if num_eligible > 1 else 0
        budget = self._schedule_running(out, budget, threshold)
        if not out.preempted and self.waiting:
            self._schedule_waiting(out, budget, threshold)
        for req, n in zip(out.requests, out.num_scheduled_tokens):
            req.num_computed_tokens += n
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int) -> int:
        running = self.running
        kv = self.kv_cache_manager
        max_model_len = self.config.max_model_len
        req_index = 0
        while req_index < len(running) and budget > 0:
            req = running[req_index]
            computed = req.num_computed_tokens
            placeholders = req.num_output_placeholders  # 0 without async scheduling
            if placeholders and computed + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens:
                # NOTE: async scheduling: the step in flight already samples the last token.
                req_index += 1
                continue
            num_new = req.num_prompt_tokens + req.num_output_tokens + placeholders - computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if num_new > max_model_len - computed - 1:
                num_new = max_model_len - computed - 1
            if num_new <= 0:
                req_index += 1
                continue
            scheduled = True
            while not kv.allocate_slots(req, num_new):
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            self._add_to_output(out, req, num_new, computed)
            budget -= num_new
            req_index += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None:
        waiting, running = self.waiting, self.running
        kv = self.kv_cache_manager
        max_num_seqs = self.config.max_num_seqs
        while budget > 0 and waiting:
            if len(running) >= max_num_seqs:
                break
            req = waiting[0]
            hit_blocks: list[int] = []
            num_hit = 0
            looked_up = req.num_computed_tokens == 0
            if looked_up:
                hit_blocks, num_hit = kv.get_computed_blocks(req)
            num_computed = req.num_computed_tokens + num_hit
            num_new = req.num_prompt_tokens + req.num_output_tokens - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if not kv.allocate_slots(req, num_new, hit_blocks, full_sequence=True):
                break  # NOTE: head-of-line blocking: the rest of the queue waits too.
            waiting.popleft()
            running.append(req)
            if looked_up:
                # vLLM records prefix-cache stats at admission only, not on failed lookups, and
                # none with prefix caching off (KVCacheManager.record_prefix_cache_stats).
                if self.pool.enable_caching:
                    kv.stats.record(req.num_tokens, num_hit, preempted=req.num_preemptions > 0)
                if req.num_cached_tokens is None:
                    req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_computed
            out.admitted.append(req)
            self._add_to_output(out, req, num_new, num_computed)
            budget -= num_new

    @staticmethod
    def _add_to_output(out: SchedulerOutput, req: Request, num_new: int, computed: int) -> None:
        out.requests.append(req)
        out.num_scheduled_tokens.append(num_new)
        out.num_batched_tokens += num_new
        if num_new == 1:
            out.decode_context_tokens += computed + 1
            out.num_decodes += 1
        else:
            out.prefill_token_pairs += prefill_pairs(computed, num_new)

    def _preempt(self, req: Request) -> None:
        """Free a running request's blocks and put it at the front of the waiting queue."""
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        # async scheduling: the output in flight is still delivered, but moves no counter
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput) -> StepResult:
        """Apply a finished step: sample one token for every request whose prompt (and, after a
        preemption, replayed output) is computed; finish and free those that reach
        ``max_tokens`` or ``max_model_len``.
        """
        emitted: list[Request] = []
        finished: list[Request] = []
        max_model_len = self.config.max_model_len
        running = RequestStatus.RUNNING
        for req in out.requests:
            if req.status is not running:
                continue
            if req.num_computed_tokens < req.num_prompt_tokens + req.num_output_tokens:
                continue  # a prefill chunk that does not finish the sequence samples nothing
            req.num_output_tokens += 1
            emitted.append(req)
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                finished.append(req)
        if finished:
            for req in finished:
                self.kv_cache_manager.free(req)
            self.running = [r for r in self.running if r.status is running]
        return StepResult(emitted, finished)
