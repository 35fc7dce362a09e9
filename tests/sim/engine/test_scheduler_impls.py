"""The compiled scheduler and request (``kvroute.sim.engine._scheduler``, ``_request``) against the
pure-Python ones they were written from: the same steps, token counts, step sums, preemptions,
finishes, decode runs and prefix-cache counters on random request streams, with preemption
(small pools), chunked prefill caps and shared prefixes. Both come from the ``pure_core`` and
``compiled_core`` fixtures (tests/conftest.py)."""

import dataclasses
import random

import pytest

from kvroute.sim.engine import compiled
from kvroute.sim.engine import request as pure_request
from kvroute.sim.engine import scheduler as pure_scheduler
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.request import RequestStatus


def _state(req):
    return (req.request_id, req.num_computed_tokens, req.num_output_tokens, req.num_cached_tokens,
            req.num_preemptions, req.status)


def _out(out):
    for f in dataclasses.fields(out):  # the compiled scheduler fills every field
        getattr(out, f.name)
    return ([r.request_id for r in out.requests], list(out.num_scheduled_tokens), out.num_batched_tokens,
            out.prefill_token_pairs, out.decode_context_tokens, [r.request_id for r in out.preempted],
            [r.request_id for r in out.admitted])


def _stream(rng: random.Random, n: int, block_size: int):
    """(arrival step, prompt tokens, max tokens, block hashes) with shared prefixes."""
    prefixes = [[rng.getrandbits(62) for _ in range(rng.randint(1, 6))] for _ in range(3)]
    out = []
    for i in range(n):
        prompt = rng.randint(1, 300)
        max_tokens = rng.randint(1, 90)
        num_blocks = (prompt + max_tokens) // block_size
        hashes = list(rng.choice(prefixes)) if rng.random() < 0.7 else []
        hashes = (hashes + [rng.getrandbits(62) for _ in range(num_blocks)])[:num_blocks]
        out.append((rng.randint(0, 60), prompt, max_tokens, hashes))
    return sorted(out, key=lambda r: r[0])


def _run(scheduler_cls, request_cls, config, stream, decode_runs: bool, aborts=None):
    """Step ``stream``; ``aborts`` maps a step to the request ids aborted after it was scheduled,
    before its output (``finish_requests``, as the engine core between model and output)."""
    sched = scheduler_cls(config)
    pending = list(enumerate(stream))
    requests, trail = [], []
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            rid, (_, prompt, max_tokens, hashes) = pending.pop(0)
            req = request_cls(rid, prompt, max_tokens, list(hashes))
            requests.append(req)
            sched.add_request(req)
        step += 1
        if not sched.has_unfinished_requests():
            continue
        out = sched.schedule()
        trail.append(_out(out))
        if not out.requests:
            raise AssertionError(f"{scheduler_cls.__module__}: nothing scheduled")
        run = sched.decode_run_length(out) if decode_runs and not pending else 0
        if aborts and step in aborts:
            gone = sched.finish_requests([r for r in requests if r.request_id in aborts[step]],
                                         RequestStatus.FINISHED_ABORTED)
            trail.append(("aborted", [r.request_id for r in gone], sched.pool.num_free_blocks))
            run = 0 if gone else run
        result = sched.update(out)
        assert [getattr(result, f.name) is not None for f in dataclasses.fields(result)]
        trail.append(([r.request_id for r in result.emitted], [r.request_id for r in result.finished], run))
        if run and not result.finished:
            done = min(run, 1 + step % 7)
            sched.advance_decode_run(list(out.requests), done)
        trail.append(([_state(r) for r in requests], len(sched.waiting), [r.request_id for r in sched.running],
                      sched.num_preemptions, sched.pool.num_free_blocks))
        assert step < 100_000
    stats = sched.kv_cache_manager.stats
    trail.append((stats.requests, stats.queries, stats.hits, stats.preempted_requests, stats.preempted_queries,
                  stats.preempted_hits))
    return trail


@pytest.mark.parametrize("seed", range(12))
def test_same_steps_as_the_python_scheduler(seed, pure_core, compiled_core):
    rng = random.Random(seed)
    block_size = rng.choice([4, 16])
    config = EngineConfig(block_size=block_size, num_gpu_blocks=rng.choice([40, 80, 400]),
                          max_num_batched_tokens=rng.choice([64, 256, 2048]), max_num_seqs=rng.choice([2, 8, 256]),
                          max_model_len=rng.choice([120, 400, 4096]),
                          long_prefill_token_threshold=rng.choice([0, 0, 48]),
                          enable_prefix_caching=rng.random() < 0.85)
    stream = _stream(rng, 40, block_size)
    stream = [s for s in stream if s[1] < config.max_model_len]
    # a request that cannot fit alone is refused before a run (check_capacity); leave those out
    usable = config.num_gpu_blocks - 1
    stream = [s for s in stream if -(-min(s[1] + s[2], config.max_model_len) // block_size) <= usable]
    for decode_runs in (False, True):
        want = _run(pure_core.Scheduler, pure_core.Request, config, stream, decode_runs)
        got = _run(compiled_core.Scheduler, compiled_core.Request, config, stream, decode_runs)
        assert got == want


def test_compiled_request_matches_the_python_one(pure_core, compiled_core):
    a = compiled_core.Request(7, 20, 5, [1, 2], client="c")
    b = pure_core.Request(7, 20, 5, [1, 2], client="c")
    assert _state(a) == _state(b) and a.num_tokens == b.num_tokens == 20 and repr(a) == repr(b)
    assert (a.queued_ts, a.scheduled_ts, a.client, a.block_hashes) == (None, None, "c", [1, 2])
    assert a.status is RequestStatus.WAITING
    for cls in (compiled_core.Request, pure_core.Request):
        with pytest.raises(ValueError, match="prompt must have at least one token"):
            cls(1, 0, 5, [])
        with pytest.raises(ValueError, match="max_tokens must be >= 1"):
            cls(1, 5, 0, [])


def test_compiled_core_is_chosen_when_built():
    if compiled.COMPILED:
        assert compiled.Scheduler.__module__ == "kvroute.sim.engine._scheduler"
        assert compiled.Request.__module__ == "kvroute.sim.engine._request"
    else:
        assert compiled.Scheduler is pure_scheduler.Scheduler and compiled.Request is pure_request.Request


@pytest.mark.parametrize("seed", range(8))
def test_aborts_take_the_same_steps_as_the_python_scheduler(seed, pure_core, compiled_core):
    """``finish_requests(..., FINISHED_ABORTED)`` on running, waiting and preempted requests at
    random steps (vLLM's abort): the same queues, frees, evictions and steps after it."""
    rng = random.Random(1000 + seed)
    block_size = rng.choice([4, 16])
    config = EngineConfig(block_size=block_size, num_gpu_blocks=rng.choice([40, 80]),
                          max_num_batched_tokens=rng.choice([64, 256]), max_num_seqs=rng.choice([2, 8]),
                          max_model_len=400, enable_prefix_caching=True)
    stream = [s for s in _stream(rng, 30, block_size) if s[1] < config.max_model_len
              and -(-min(s[1] + s[2], config.max_model_len) // block_size) <= config.num_gpu_blocks - 1]
    aborts: dict[int, list[int]] = {}
    for rid, (arrival, *_rest) in enumerate(stream):
        if rng.random() < 0.4:
            aborts.setdefault(arrival + 1 + rng.randint(0, 40), []).append(rid)
    for decode_runs in (False, True):
        want = _run(pure_core.Scheduler, pure_core.Request, config, stream, decode_runs, aborts)
        got = _run(compiled_core.Scheduler, compiled_core.Request, config, stream, decode_runs, aborts)
        assert got == want
        assert sum(1 for t in want if t[0] == "aborted" and t[1]) > 0  # some aborts hit a live request


def _states_by_step(core, config, stream, decode_runs: bool) -> dict[int, list]:
    """Every request's state after each step (``update``), stepping one at a time or, with
    ``decode_runs``, jumping each decode run whole (``advance_decode_run``): then only the steps
    a run ends on are recorded."""
    sched = core.Scheduler(config)
    requests = [core.Request(rid, prompt, max_tokens, list(hashes)) for rid, (prompt, max_tokens, hashes)
                in enumerate(stream)]
    for req in requests:
        sched.add_request(req)
    states, step = {}, 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        run = sched.decode_run_length(out) if decode_runs else 0
        result = sched.update(out)
        step += 1
        if run and not result.finished:
            sched.advance_decode_run(list(out.requests), run)
            step += run
        states[step] = ([_state(r) for r in requests], sched.pool.num_free_blocks)
        assert step < 100_000
    return states


@pytest.mark.parametrize("seed", range(40))
def test_decode_runs_with_one_token_prefill_chunks_end_where_stepping_does(seed, pure_core, compiled_core):
    """``long_prefill_token_threshold`` 1: a preempted request recomputes its prompt and output one
    token per step, a step of one token that samples nothing. It is not a decode: a run that took
    it for one gave it output tokens it never sampled."""
    rng = random.Random(seed)
    block_size = rng.choice([2, 4])
    config = EngineConfig(block_size=block_size, num_gpu_blocks=rng.randint(8, 40), max_num_batched_tokens=12,
                          max_num_seqs=rng.randint(2, 6), max_model_len=80, long_prefill_token_threshold=1)
    stream = []
    for _ in range(rng.randint(2, 6)):
        prompt, max_tokens = rng.randint(1, 15), rng.randint(1, 30)
        stream.append((prompt, max_tokens, [rng.randint(0, 3) * 1000 + k
                                            for k in range((prompt + max_tokens) // block_size)]))
    usable = config.num_gpu_blocks - 1
    stream = [s for s in stream if -(-(s[0] + s[1]) // block_size) <= usable]
    for core in (pure_core, compiled_core):
        stepped = _states_by_step(core, config, stream, decode_runs=False)
        jumped = _states_by_step(core, config, stream, decode_runs=True)
        assert jumped == {step: stepped[step] for step in jumped}


@pytest.mark.parametrize("caching, counted", [(True, (1, 40, 0)), (False, (0, 0, 0))])
def test_prefix_cache_counters_count_nothing_with_prefix_caching_off(caching, counted, pure_core, compiled_core):
    """vLLM 0.32 records a lookup at admission only where prefix caching is on
    (``KVCacheManager.record_prefix_cache_stats``): with it off, the queries counter stays at 0."""
    for core in (pure_core, compiled_core):
        sched = core.Scheduler(EngineConfig(enable_prefix_caching=caching))
        sched.add_request(core.Request(0, 40, 4, []))
        sched.update(sched.schedule())
        stats = sched.kv_cache_manager.stats
        assert (stats.requests, stats.queries, stats.hits) == counted


@pytest.mark.parametrize("status", [4, RequestStatus.FINISHED_ABORTED])
def test_a_finished_status_given_as_its_number_is_the_status(status, pure_core, compiled_core):
    """``finish_requests(..., 4)`` aborts as ``FINISHED_ABORTED`` does in both schedulers: the step in
    flight samples nothing for it; a number that is no finished status is refused."""
    for core in (pure_core, compiled_core):
        sched = core.Scheduler(EngineConfig(async_scheduling=True))
        req = core.Request(0, 40, 4, [])
        sched.add_request(req)
        out = sched.schedule()
        assert sched.finish_requests([req], status) == [req] and req.status is RequestStatus.FINISHED_ABORTED
        assert sched.update(out).emitted == [] and req.num_output_tokens == 0
        with pytest.raises(ValueError, match=r"^finish_requests: 5 is not a finished status$"):
            sched.finish_requests([req], 5)
