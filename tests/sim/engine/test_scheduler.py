"""Exact step composition, prefix hits and preemption order of the simulated vLLM scheduler."""

import pytest

from kvroute.sim.engine.compiled import Request, Scheduler  # compiled, or pure with KVROUTE_PURE_PYTHON=1
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.content import block_hashes
from kvroute.sim.engine.request import RequestStatus
from kvroute.sim.engine.scheduler import admission_error, clamp_max_tokens


def req(rid, prompt_segments, max_tokens, block_size=16):
    """A request over content segments; its output is a stream of its own (content id 9000+rid)."""
    segments = list(prompt_segments) + [(9000 + rid, 0, max_tokens)]
    num_prompt = sum(s[2] for s in prompt_segments)
    return Request(rid, num_prompt, max_tokens, block_hashes(segments, block_size))


def run_to_completion(sched, max_steps=100_000):
    steps = []
    while sched.has_unfinished_requests() and len(steps) < max_steps:
        out = sched.schedule()
        steps.append(out)
        sched.update(out)
    return steps


@pytest.mark.parametrize("length, hit", [(32, 16), (33, 32), (48, 32), (59, 48)])
def test_same_prompt_twice_hits_whole_blocks_and_recomputes_at_least_one_token(length, hit):
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64))
    first, second = req(0, [(1, 0, length)], 4), req(1, [(1, 0, length)], 4)
    sched.add_request(first)
    run_to_completion(sched)
    sched.add_request(second)
    run_to_completion(sched)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == hit
    assert sched.kv_cache_manager.stats.queries == 2 * length
    assert sched.kv_cache_manager.stats.hits == hit


def test_chunked_prefill_does_not_cap_reuse():
    config = EngineConfig(block_size=16, num_gpu_blocks=2200, max_num_batched_tokens=2048, max_model_len=32768)
    sched = Scheduler(config)
    first, second = req(0, [(1, 0, 16384)], 2), req(1, [(1, 0, 16384)], 2)
    sched.add_request(first)
    steps = run_to_completion(sched)
    assert [s.num_scheduled_tokens for s in steps[:8]] == [[2048]] * 8  # 8 chunks of 2048
    sched.add_request(second)
    steps = run_to_completion(sched)
    assert second.num_cached_tokens == 16368
    assert steps[0].num_scheduled_tokens == [16]


def test_a_later_turn_hits_the_reply_blocks_too():
    """Turn 1: 100-token prompt, 50-token reply. Turn 2 resends those 150 tokens plus 50 new."""
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64))
    turn1 = req(0, [(1, 0, 100)], 50)
    sched.add_request(turn1)
    run_to_completion(sched)
    turn2 = req(1, [(1, 0, 100), (9000, 0, 50), (2, 0, 50)], 10)
    sched.add_request(turn2)
    run_to_completion(sched)
    assert turn2.num_cached_tokens == 144


def test_preemption_takes_the_last_running_requests_until_the_allocation_fits():
    """A, B, C running; no free block; A needs two blocks and C alone frees only one: C then B
    are preempted, the waiting queue starts [B, C], and nobody is admitted in that step."""
    config = EngineConfig(block_size=4, num_gpu_blocks=5, max_num_batched_tokens=32,
                          long_prefill_token_threshold=8)
    sched = Scheduler(config)
    a, b, c = req(0, [(1, 0, 16)], 4, 4), req(1, [(2, 0, 4)], 8, 4), req(2, [(3, 0, 4)], 8, 4)
    d = req(3, [(4, 0, 2)], 1, 4)
    for r in (a, b, c):
        sched.add_request(r)
    step1 = sched.schedule()
    assert [r.request_id for r in step1.requests] == [0, 1, 2]
    assert step1.num_scheduled_tokens == [8, 4, 4]
    sched.update(step1)
    assert sched.pool.num_free_blocks == 0
    sched.add_request(d)
    step2 = sched.schedule()
    assert [r.request_id for r in step2.preempted] == [2, 1]
    assert [r.request_id for r in sched.waiting] == [1, 2, 3]
    assert [r.request_id for r in sched.running] == [0]
    assert step2.admitted == []
    assert [r.request_id for r in step2.requests] == [0] and step2.num_scheduled_tokens == [8]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.num_preemptions == 2


def test_prefill_chunks_share_a_step_with_decodes():
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=10))
    a = req(0, [(1, 0, 4)], 5)
    sched.add_request(a)
    sched.update(sched.schedule())  # a's prompt: first token
    b = req(1, [(2, 0, 20)], 2)
    sched.add_request(b)
    step = sched.schedule()
    assert [(r.request_id, n) for r, n in zip(step.requests, step.num_scheduled_tokens)] == [(0, 1), (1, 9)]
    assert step.num_batched_tokens == 10
    assert step.decode_context_tokens == 5
    assert step.prefill_token_pairs == 9 * (0 + 10 / 2)


def test_long_prefill_threshold_applies_only_when_another_request_competes():
    alone = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, long_prefill_token_threshold=8))
    alone.add_request(req(0, [(1, 0, 40)], 2))
    assert alone.schedule().num_scheduled_tokens == [40]
    busy = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, long_prefill_token_threshold=8))
    busy.add_request(req(0, [(1, 0, 40)], 2))
    busy.add_request(req(1, [(2, 0, 40)], 2))
    assert busy.schedule().num_scheduled_tokens == [8, 8]


def test_max_num_seqs_caps_the_running_queue():
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, max_num_seqs=2))
    for i in range(3):
        sched.add_request(req(i, [(i + 1, 0, 8)], 3))
    step = sched.schedule()
    assert [r.request_id for r in step.requests] == [0, 1]
    assert [r.request_id for r in sched.waiting] == [2]


def test_head_of_line_blocking_stops_admission():
    # 6 usable blocks of 4 tokens; the head needs 7 blocks for its whole prompt.
    sched = Scheduler(EngineConfig(block_size=4, num_gpu_blocks=7, max_num_batched_tokens=8))
    big, small = req(0, [(1, 0, 26)], 1, 4), req(1, [(2, 0, 3)], 1, 4)
    sched.add_request(big)
    sched.add_request(small)
    step = sched.schedule()
    assert step.is_empty()
    assert [r.request_id for r in sched.waiting] == [0, 1]


def test_admission_needs_the_whole_prompt_to_fit_not_just_the_chunk():
    sched = Scheduler(EngineConfig(block_size=4, num_gpu_blocks=5, max_num_batched_tokens=4))
    sched.add_request(req(0, [(1, 0, 20)], 1, 4))  # 5 blocks > 4 usable, although a chunk is 1
    assert sched.schedule().is_empty()


def test_first_token_comes_from_the_step_that_finishes_the_prompt():
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=16))
    r = req(0, [(1, 0, 40)], 3)
    sched.add_request(r)
    emitted = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        emitted.append(len(sched.update(out).emitted))
    assert emitted == [0, 0, 1, 1, 1]  # chunks 16, 16, 8 (first token), then two decodes
    assert r.num_computed_tokens == 42  # the last sampled token's KV is never computed


def test_prompt_at_or_over_max_model_len_is_rejected_and_long_outputs_clamped():
    assert admission_error(100, 100) is not None
    assert "maximum context length is 100 tokens" in admission_error(150, 100)
    assert admission_error(99, 100) is None
    assert clamp_max_tokens(90, 50, 100) == 10
    assert clamp_max_tokens(10, 50, 100) == 50


def test_a_step_counts_its_one_token_requests_as_decodes():
    """``num_decodes``: the one-token requests of a step beside any number of prefill chunks
    (a contended step timer's streaming share counts them)."""
    sched = Scheduler(EngineConfig(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=64))
    for i in range(3):
        sched.add_request(req(i, [(10 + i, 0, 5)], 4))
    first = sched.schedule()
    assert (first.num_decodes, first.num_reqs, first.decode_context_tokens) == (0, 3, 0)
    sched.update(first)
    for i in range(3, 5):
        sched.add_request(req(i, [(10 + i, 0, 20)], 4))
    mixed = sched.schedule()
    assert [n for n in mixed.num_scheduled_tokens] == [1, 1, 1, 20, 20]
    assert (mixed.num_decodes, mixed.num_batched_tokens, mixed.decode_context_tokens) == (3, 43, 3 * 6)
