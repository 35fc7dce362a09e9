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
from tests.support.vllm_driver import DriverRequest, DriverResult, StepRecord, default_output_token


def token_block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``tokens``."""
    hashes, parent = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start:start + block_size]))
        hashes.append(parent)
    return hashes


def _aborts_by_step(requests: list[DriverRequest]) -> dict[int, list[str]]:
    by_step: dict[int, list[str]] = {}
    for r in requests:
        if r.abort_step is not None:
            by_step.setdefault(r.abort_step, []).append(r.request_id)
    return by_step


def _abort(sched, objects: dict, request_ids: list[str], rec: StepRecord, names: dict) -> bool:
    """Abort ``request_ids`` one at a time (as ``vllm_driver._abort``); True if any was aborted."""
    any_aborted = False
    for rid in request_ids:
        req = objects.get(rid)
        if req is not None:
            done = sched.finish_requests([req], RequestStatus.FINISHED_ABORTED)
            rec.aborted += [names[r.request_id] for r in done]
            any_aborted = any_aborted or bool(done)
    return any_aborted


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
    names: dict[int, str] = {}
    objects: dict[str, object] = {}
    aborts = _aborts_by_step(requests)
    pending = sorted(requests, key=lambda r: r.arrival_step)
    steps: list[StepRecord] = []
    step = 0
    while step < max_steps and (pending or sched.has_unfinished_requests()):
        while pending and pending[0].arrival_step <= step:
            r = pending.pop(0)
            rid = len(names)
            names[rid] = r.request_id
            tokens = list(r.prompt_token_ids) + [output_token(r.request_id, k) for k in range(r.max_tokens)]
            objects[r.request_id] = request_class(rid, len(r.prompt_token_ids), r.max_tokens,
                                                  token_block_hashes(tokens, block_size))
            sched.add_request(objects[r.request_id])
        rec = StepRecord(step=step)
        steps.append(rec)
        step += 1
        if not sched.has_unfinished_requests():
            rec.free_blocks = sched.pool.num_free_blocks
            continue
        evictions = sched.pool.num_evictions
        out = sched.schedule()
        rec.scheduled = {names[r.request_id]: n for r, n in zip(out.requests, out.num_scheduled_tokens)}
        admitted = {id(r) for r in out.admitted}
        for r, n in zip(out.requests, out.num_scheduled_tokens):
            if id(r) in admitted:
                rec.admitted[names[r.request_id]] = r.num_computed_tokens - n
        rec.preempted = [names[r.request_id] for r in out.preempted]
        rec.waiting = [names[r.request_id] for r in sched.waiting]
        rec.running = [names[r.request_id] for r in sched.running]
        _abort(sched, objects, aborts.get(rec.step, []), rec, names)  # before the step's output
        result = sched.update(out)
        rec.finished = [names[r.request_id] for r in result.finished]
        rec.evictions = sched.pool.num_evictions - evictions
        rec.free_blocks = sched.pool.num_free_blocks
    stats = sched.kv_cache_manager.stats
    return DriverResult(steps=steps, prefix_cache_queries=stats.queries, prefix_cache_hits=stats.hits,
                        num_preemptions=sched.num_preemptions, vllm_version="kvroute")


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
    names: dict[int, str] = {}
    objects: dict[str, object] = {}
    aborts = _aborts_by_step(requests)
    deferred: list[str] = []
    pending = sorted(requests, key=lambda r: r.arrival_step)
    steps: list[StepRecord] = []
    batch_queue: deque = deque()
    finished_pending = False
    step = 0
    while step < max_steps and (pending or sched.has_unfinished_requests() or finished_pending or batch_queue
                                or deferred):
        rec = StepRecord(step=step)
        steps.append(rec)
        evictions = sched.pool.num_evictions
        # vLLM's has_requests() counts the aborted ones until the next schedule(), as finished ones
        finished_pending = _abort(sched, objects, deferred, rec, names) or finished_pending
        deferred = []
        while pending and pending[0].arrival_step <= step:
            r = pending.pop(0)
            rid = len(names)
            names[rid] = r.request_id
            tokens = list(r.prompt_token_ids) + [output_token(r.request_id, k) for k in range(r.max_tokens)]
            objects[r.request_id] = request_class(rid, len(r.prompt_token_ids), r.max_tokens,
                                                  token_block_hashes(tokens, block_size))
            sched.add_request(objects[r.request_id])
        step += 1
        if sched.has_unfinished_requests() or finished_pending:
            finished_pending = False
            out = sched.schedule()
            rec.scheduled = {names[r.request_id]: n for r, n in zip(out.requests, out.num_scheduled_tokens)}
            admitted = {id(r) for r in out.admitted}
            for r, n in zip(out.requests, out.num_scheduled_tokens):
                if id(r) in admitted:
                    rec.admitted[names[r.request_id]] = r.num_computed_tokens - n
            rec.preempted = [names[r.request_id] for r in out.preempted]
            rec.waiting = [names[r.request_id] for r in sched.waiting]
            rec.running = [names[r.request_id] for r in sched.running]
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
        finished_pending = _abort(sched, objects, aborts.get(rec.step, []), rec, names) or finished_pending
        result = sched.update(out)
        rec.finished = [names[r.request_id] for r in result.finished]
        finished_pending = finished_pending or bool(result.finished)
        rec.evictions = sched.pool.num_evictions - evictions
        rec.free_blocks = sched.pool.num_free_blocks
    stats = sched.kv_cache_manager.stats
    return DriverResult(steps=steps, prefix_cache_queries=stats.queries, prefix_cache_hits=stats.hits,
                        num_preemptions=sched.num_preemptions, vllm_version="kvroute")
