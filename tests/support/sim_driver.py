"""Drive kvroute's Scheduler with the same request stream as ``vllm_driver.run_vllm`` and
return the same ``StepRecord``/``DriverResult`` shapes, so the two can be compared field by field.

Block hashes come from the real token ids (prompt, then the outputs ``output_token`` generates),
chained per full block, so equal tokens give equal hashes exactly as in vLLM.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kvroute.sim.engine.async_scheduler import AsyncScheduler
from kvroute.sim.engine.compiled import Request, Scheduler  # compiled, or pure with KVROUTE_PURE_PYTHON=1
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.request import Request as PureRequest
from kvroute.sim.engine.request import RequestStatus
from kvroute.sim.engine.scheduler import Scheduler as PureScheduler
from tests.support.vllm_driver import DriverRequest, DriverResult, StepRecord, _aborts_by_step, default_output_token


def token_block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``tokens``."""
    hashes, parent = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start:start + block_size]))
        hashes.append(parent)
    return hashes


class _Stream:
    """The driver's requests as kvroute's scheduler sees them: added as they arrive, with integer
    ids (``names`` maps them back) and block hashes of their prompt and generated tokens."""

    def __init__(self, requests: list[DriverRequest], request_class, block_size: int,
                 output_token: Callable[[str, int], int]) -> None:
        self.pending = sorted(requests, key=lambda r: r.arrival_step)  # stable: ties keep list order
        self.request_class, self.block_size, self.output_token = request_class, block_size, output_token
        self.names: dict[int, str] = {}
        self.objects: dict[str, object] = {}

    def add_arrivals(self, sched, step: int) -> None:
        while self.pending and self.pending[0].arrival_step <= step:
            r = self.pending.pop(0)
            rid = len(self.names)
            self.names[rid] = r.request_id
            tokens = list(r.prompt_token_ids) + [self.output_token(r.request_id, k) for k in range(r.max_tokens)]
            self.objects[r.request_id] = self.request_class(rid, len(r.prompt_token_ids), r.max_tokens,
                                                            token_block_hashes(tokens, self.block_size))
            sched.add_request(self.objects[r.request_id])

    def record_schedule(self, sched, out, rec: StepRecord) -> None:
        """What ``out`` scheduled, admitted and preempted, and the queues after it, as ``rec``."""
        names = self.names
        rec.scheduled = {names[r.request_id]: n for r, n in zip(out.requests, out.num_scheduled_tokens)}
        admitted = {id(r) for r in out.admitted}
        for r, n in zip(out.requests, out.num_scheduled_tokens):
            if id(r) in admitted:
                rec.admitted[names[r.request_id]] = r.num_computed_tokens - n
        rec.preempted = [names[r.request_id] for r in out.preempted]
        rec.waiting = [names[r.request_id] for r in sched.waiting]
        rec.running = [names[r.request_id] for r in sched.running]

    def abort(self, sched, request_ids: list[str], rec: StepRecord) -> bool:
        """Abort ``request_ids`` one at a time (as ``vllm_driver._abort``); True if any was aborted."""
        any_aborted = False
        for rid in request_ids:
            req = self.objects.get(rid)
            if req is not None:
                done = sched.finish_requests([req], RequestStatus.FINISHED_ABORTED)
                rec.aborted += [self.names[r.request_id] for r in done]
                any_aborted = any_aborted or bool(done)
        return any_aborted


def _result(sched, steps: list[StepRecord]) -> DriverResult:
    stats = sched.kv_cache_manager.stats
    return DriverResult(steps=steps, prefix_cache_queries=stats.queries, prefix_cache_hits=stats.hits,
                        num_preemptions=sched.num_preemptions, vllm_version="kvroute")


def run_sim(requests: list[DriverRequest], *, block_size: int, num_gpu_blocks: int,
            max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
            long_prefill_token_threshold: int = 0, max_steps: int = 100_000,
            output_token: Callable[[str, int], int] = default_output_token,
            pure: bool = False) -> DriverResult:
    """Step kvroute's Scheduler like ``run_vllm`` steps vLLM's (same idle-step convention): the
    compiled one when built, or with ``pure`` the pure-Python one."""
    request_class = PureRequest if pure else Request
    sched = (PureScheduler if pure else Scheduler)(EngineConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, long_prefill_token_threshold=long_prefill_token_threshold))
    stream = _Stream(requests, request_class, block_size, output_token)
    aborts = _aborts_by_step(requests)
    steps: list[StepRecord] = []
    step = 0
    while step < max_steps and (stream.pending or sched.has_unfinished_requests()):
        stream.add_arrivals(sched, step)
        rec = StepRecord(step=step)
        steps.append(rec)
        step += 1
        if not sched.has_unfinished_requests():
            rec.free_blocks = sched.pool.num_free_blocks
            continue
        evictions = sched.pool.num_evictions
        out = sched.schedule()
        stream.record_schedule(sched, out, rec)
        stream.abort(sched, aborts.get(rec.step, []), rec)  # before the step's output
        result = sched.update(out)
        rec.finished = [stream.names[r.request_id] for r in result.finished]
        rec.evictions = sched.pool.num_evictions - evictions
        rec.free_blocks = sched.pool.num_free_blocks
    return _result(sched, steps)


def run_sim_async(requests: list[DriverRequest], *, block_size: int, num_gpu_blocks: int,
                  max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                  long_prefill_token_threshold: int = 0, max_steps: int = 100_000,
                  output_token: Callable[[str, int], int] = default_output_token,
                  pure: bool = False) -> DriverResult:
    """Step kvroute's async scheduler in the loop ``vllm_driver.run_vllm_async`` steps vLLM's
    (``EngineCore.step_with_batch_queue``, batch queue of 2); vLLM's ``has_requests`` also
    counts requests finished since the last ``schedule()``, mirrored by ``finished_pending``.
    The compiled scheduler (with ``async_scheduling``) when built, or with ``pure`` (or
    ``KVROUTE_PURE_PYTHON=1``) the pure-Python ``AsyncScheduler``."""
    pure = pure or Scheduler is PureScheduler
    request_class = PureRequest if pure else Request
    sched = (AsyncScheduler if pure else Scheduler)(EngineConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, long_prefill_token_threshold=long_prefill_token_threshold,
        async_scheduling=True))
    stream = _Stream(requests, request_class, block_size, output_token)
    aborts = _aborts_by_step(requests)
    deferred: list[str] = []
    steps: list[StepRecord] = []
    batch_queue: deque = deque()
    finished_pending = False
    step = 0
    while step < max_steps and (stream.pending or sched.has_unfinished_requests() or finished_pending or batch_queue
                                or deferred):
        rec = StepRecord(step=step)
        steps.append(rec)
        evictions = sched.pool.num_evictions
        # vLLM's has_requests() counts the aborted ones until the next schedule(), as finished ones
        finished_pending = stream.abort(sched, deferred, rec) or finished_pending
        deferred = []
        stream.add_arrivals(sched, step)
        step += 1
        if sched.has_unfinished_requests() or finished_pending:
            finished_pending = False
            out = sched.schedule()
            stream.record_schedule(sched, out, rec)
            batch_queue.appendleft(out)
            if len(batch_queue) < 2 and (out.requests or sched.has_unfinished_requests()):
                deferred = aborts.get(rec.step, [])
                rec.evictions = sched.pool.num_evictions - evictions
                rec.free_blocks = sched.pool.num_free_blocks
                continue
        elif not batch_queue:
            deferred = aborts.get(rec.step, [])
            rec.free_blocks = sched.pool.num_free_blocks
            continue
        out = batch_queue.pop()
        finished_pending = stream.abort(sched, aborts.get(rec.step, []), rec) or finished_pending
        result = sched.update(out)
        rec.finished = [stream.names[r.request_id] for r in result.finished]
        finished_pending = finished_pending or bool(result.finished)
        rec.evictions = sched.pool.num_evictions - evictions
        rec.free_blocks = sched.pool.num_free_blocks
    return _result(sched, steps)
