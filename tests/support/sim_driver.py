"""Drive kvroute's Scheduler with the same request stream as ``vllm_driver.run_vllm`` and
return the same ``StepRecord``/``DriverResult`` shapes, so the two can be compared field by field.

Block hashes come from the real token ids (prompt, then the outputs ``output_token`` generates),
chained per full block, so equal tokens give equal hashes exactly as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from kvroute.sim.engine.compiled import Request, Scheduler  # compiled, or pure with KVROUTE_PURE_PYTHON=1
from kvroute.sim.engine.config import EngineConfig
from tests.support.vllm_driver import DriverRequest, DriverResult, StepRecord, default_output_token


def token_block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``tokens``."""
    hashes, parent = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start:start + block_size]))
        hashes.append(parent)
    return hashes


def run_sim(requests: list[DriverRequest], *, block_size: int, num_gpu_blocks: int,
            max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
            long_prefill_token_threshold: int = 0, max_steps: int = 100_000,
            output_token: Callable[[str, int], int] = default_output_token) -> DriverResult:
    """Step kvroute's Scheduler like ``run_vllm`` steps vLLM's (same idle-step convention)."""
    sched = Scheduler(EngineConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, long_prefill_token_threshold=long_prefill_token_threshold))
    names: dict[int, str] = {}
    pending = sorted(requests, key=lambda r: r.arrival_step)
    steps: list[StepRecord] = []
    step = 0
    while step < max_steps and (pending or sched.has_unfinished_requests()):
        while pending and pending[0].arrival_step <= step:
            r = pending.pop(0)
            rid = len(names)
            names[rid] = r.request_id
            tokens = list(r.prompt_token_ids) + [output_token(r.request_id, k) for k in range(r.max_tokens)]
            sched.add_request(Request(rid, len(r.prompt_token_ids), r.max_tokens,
                                      token_block_hashes(tokens, block_size)))
        rec = StepRecord(step=step)
        steps.append(rec)
        step += 1
        if not sched.has_unfinished_requests():
            continue
        out = sched.schedule()
        rec.scheduled = {names[r.request_id]: n for r, n in zip(out.requests, out.num_scheduled_tokens)}
        admitted = {id(r) for r in out.admitted}
        for r, n in zip(out.requests, out.num_scheduled_tokens):
            if id(r) in admitted:
                rec.admitted[names[r.request_id]] = r.num_computed_tokens - n
        rec.preempted = [names[r.request_id] for r in out.preempted]
        rec.waiting = [names[r.request_id] for r in sched.waiting]
        rec.running = [names[r.request_id] for r in sched.running]
        result = sched.update(out)
        rec.finished = [names[r.request_id] for r in result.finished]
    stats = sched.kv_cache_manager.stats
    return DriverResult(steps=steps, prefix_cache_queries=stats.queries, prefix_cache_hits=stats.hits,
                        num_preemptions=sched.num_preemptions, vllm_version="kvroute")
