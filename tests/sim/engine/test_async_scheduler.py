"""kvroute's AsyncScheduler stepped as vLLM's engine core steps it with async scheduling:
step N+1 scheduled before step N's update (exact values; vLLM's own scheduler is compared in
``test_vllm_parity_async.py``)."""

import pytest

from kvroute.sim.engine import compiled
from kvroute.sim.engine.async_scheduler import AsyncScheduler
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.request import Request, RequestStatus
from kvroute.sim.engine.scheduler import Scheduler

CONFIG = EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=256, async_scheduling=True)


def request(rid, prompt, max_tokens):
    return Request(rid, prompt, max_tokens, [1000 * rid + i for i in range((prompt + max_tokens) // 16)])


def test_next_decode_is_scheduled_before_the_previous_token_is_known():
    sched = AsyncScheduler(CONFIG)
    req = request(0, 40, 3)
    sched.add_request(req)
    prefill = sched.schedule()
    assert prefill.num_scheduled_tokens == [40] and prefill.samples == [True]
    assert (req.num_computed_tokens, req.num_output_placeholders) == (40, 1)
    decode = sched.schedule()  # before the prefill's update: one placeholder in flight
    assert decode.num_scheduled_tokens == [1]
    assert (req.num_computed_tokens, req.num_output_placeholders, req.num_output_tokens) == (41, 2, 0)
    result = sched.update(prefill)
    assert result.emitted == [req] and not result.finished
    assert (req.num_output_tokens, req.num_output_placeholders) == (1, 1)
    third = sched.schedule()
    assert third.num_scheduled_tokens == [1]
    sched.update(decode)
    # the in-flight step samples the last token: the request is skipped, the step is empty
    assert sched.schedule().is_empty()
    held = sched.pool.num_free_blocks
    result = sched.update(third)
    assert result.finished == [req] and req.status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert sched.pool.num_free_blocks == held + 3  # freed at the update, one step after sync
    assert not sched.has_unfinished_requests()


def test_a_prefill_chunk_samples_nothing_and_gets_no_placeholder():
    sched = AsyncScheduler(EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=32,
                                        async_scheduling=True))
    req = request(0, 40, 2)
    sched.add_request(req)
    first = sched.schedule()
    assert first.num_scheduled_tokens == [32] and first.samples == [False]
    second = sched.schedule()  # the rest of the prompt, while the first chunk is in flight
    assert second.num_scheduled_tokens == [8] and second.samples == [True]
    assert sched.update(first).emitted == []
    assert req.num_output_placeholders == 1


def test_a_preempted_request_still_gets_its_token_in_flight():
    # 3 usable blocks of 16: two 16-token prompts, then a decode needs a block each
    sched = AsyncScheduler(EngineConfig(block_size=16, num_gpu_blocks=4, max_num_batched_tokens=256,
                                        async_scheduling=True))
    a, b = request(0, 16, 5), request(1, 16, 5)
    sched.add_request(a)
    sched.add_request(b)
    step1 = sched.schedule()
    assert step1.num_scheduled_tokens == [16, 16]
    step2 = sched.schedule()  # a takes the third block; b cannot: b preempts itself
    assert step2.preempted == [b] and step2.num_scheduled_tokens == [1]
    assert (b.num_output_placeholders, b.num_stale_output_tokens) == (0, 16)
    result = sched.update(step1)
    assert result.emitted == [a, b] and b.num_output_tokens == 1  # delivered, stale
    assert (b.num_output_placeholders, b.num_stale_output_tokens) == (0, 0)
    assert list(sched.waiting) == [b] and b.status is RequestStatus.PREEMPTED


def test_sync_steps_are_refused_and_fast_forward_is_off():
    sched = AsyncScheduler(CONFIG)
    sched.add_request(request(0, 40, 3))
    assert sched.decode_run_length(sched.schedule()) == 0
    sync = Scheduler(EngineConfig())
    sync.add_request(request(1, 40, 3))
    with pytest.raises(ValueError, match="not scheduled by an AsyncScheduler"):
        sched.update(sync.schedule())


def test_the_compiled_core_steps_async_too():
    chosen = compiled.engine_classes(CONFIG)
    assert chosen == ((compiled.Request, compiled.Scheduler) if compiled.COMPILED else (Request, AsyncScheduler))
    assert compiled.engine_classes(EngineConfig()) == (compiled.Request, compiled.Scheduler)
    sched = chosen[1](CONFIG)
    req = chosen[0](0, 40, 2, list(range(2)))
    sched.add_request(req)
    first = sched.schedule()
    second = sched.schedule()
    assert (first.samples, second.samples) == ([True], [True])
    assert (req.num_computed_tokens, req.num_output_placeholders) == (41, 2)
    assert sched.update(first).emitted == [req]
    assert sched.schedule().is_empty()
    assert sched.update(second).finished == [req]
    assert sched.decode_run_length(first) == 0


@pytest.mark.parametrize("seed", range(40))
def test_compiled_and_pure_async_schedulers_take_the_same_steps(seed):
    """Random streams stepped in the engine core's async loop by both implementations."""
    import random

    from tests.support.sim_driver import run_sim_async
    from tests.support.vllm_driver import DriverRequest

    rng = random.Random(seed)
    reqs = [DriverRequest(f"r{i}", [rng.randrange(4) for _ in range(rng.randrange(1, 90))],
                          rng.randrange(1, 40), rng.randrange(0, 30)) for i in range(rng.randrange(2, 10))]
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs)
    config = dict(block_size=rng.choice([4, 8, 16]), max_num_batched_tokens=rng.choice([16, 64, 512]),
                  max_num_seqs=rng.randrange(1, 6), max_model_len=4096,
                  long_prefill_token_threshold=rng.choice([0, 8]))
    config["num_gpu_blocks"] = -(-longest // config["block_size"]) + 1 + rng.randrange(12)
    a, b = run_sim_async(reqs, **config), run_sim_async(reqs, **config, pure=True)
    assert a.steps == b.steps
    assert (a.prefix_cache_hits, a.num_preemptions) == (b.prefix_cache_hits, b.num_preemptions)
