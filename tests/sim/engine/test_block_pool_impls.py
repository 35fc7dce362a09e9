"""Both engine cores, the pure-Python one (``sim/engine/block_pool.py``, ``sim/engine/kv_cache_manager.py``)
and the compiled one (``sim/engine/_block_pool.pyx``, ``sim/engine/_kv_cache_manager.pyx``), on the same exact
tests: the small cases of test_block_pool.py (pool and KV-cache manager), the random streams of
test_block_pool_reference.py against the pure pool, vLLM's as vLLM writes it (plus streams with 64-bit
keys and pools large enough to grow the compiled prefix index), the decode-run steps of the
manager (``allocate_decode_run`` of both managers on random runs, hashes as lists and as
``array("q")``), and the errors bad input gives. Then which core a scheduler builds
(``kvroute.sim.engine.compiled``). The two cores come from the ``core``, ``pure_core`` and
``compiled_core`` fixtures (tests/conftest.py)."""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import sys
from array import array

import pytest

from kvroute.sim.engine import compiled
from kvroute.sim.engine.config import EngineConfig
from tests.sim.engine import test_block_pool, test_block_pool_reference

EXACT_CASES = [name for name, fn in inspect.getmembers(test_block_pool, inspect.isfunction)
               if name.startswith("test_") and not inspect.signature(fn).parameters]


@pytest.mark.parametrize("case", EXACT_CASES)
def test_exact_cases(core, case, monkeypatch):
    monkeypatch.setattr(test_block_pool, "BlockPool", core.BlockPool)
    monkeypatch.setattr(test_block_pool, "KVCacheManager", core.KVCacheManager)
    getattr(test_block_pool, case)()


def test_decode_run_steps_of_the_kv_cache_manager(core):
    """The table steps ``Scheduler.advance_decode_run`` takes, on a pool of 11 blocks."""
    pool = core.BlockPool(11)
    kv = core.KVCacheManager(pool, block_size=4, max_model_len=1024)
    req = test_block_pool.make_request(0, 6, [101], max_tokens=10)
    assert kv.allocate_slots(req, 6) and kv.get_block_ids(req) == [1, 2]
    assert kv.get_num_cached_blocks(req) == 1
    kv.allocate_new_blocks(req, 2)
    kv.append_blocks(req, pool.get_new_blocks(1))
    assert kv.get_block_ids(req) == [1, 2, 3, 4, 5]
    kv.cache_blocks(req, 3)
    kv.cache_blocks(req, 2)  # already registered: nothing
    assert kv.get_num_cached_blocks(req) == 3
    assert [pool.get_cached_block(h) for h in req.block_hashes[:4]] == [1, 2, 3, None]
    assert kv.req_to_blocks == {0: [1, 2, 3, 4, 5]} and kv.num_cached_block == {0: 3}
    other = test_block_pool.make_request(1, 4, [])
    for step in (lambda: kv.allocate_new_blocks(other, 1), lambda: kv.cache_blocks(other, 1),
                 lambda: kv.get_num_cached_blocks(other), lambda: kv.append_blocks(other, [6])):
        with pytest.raises(KeyError):
            step()
    kv.free(req)
    assert pool.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1] and kv.get_block_ids(req) == []


def _decode_run_state(seed: int, core, as_array: bool):
    """Requests admitted and decoded a few steps, then one ``allocate_decode_run``; the tables,
    the free queue and the cached hashes after it (keys drawn from a small range, some shared
    with an earlier request still cached, so some runs are refused)."""
    from kvroute.sim.engine.request import Request

    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    pool = core.BlockPool(rng.randint(40, 120))
    kv = core.KVCacheManager(pool, block_size=bs, max_model_len=10_000)

    def hashes(n):
        keys = [rng.randint(-30, 30) if rng.random() < 0.1 else rng.getrandbits(63) for _ in range(n)]
        return array("q", keys) if as_array else keys

    old = Request(99, 5 * bs, 1, hashes(6))
    assert kv.allocate_slots(old, 5 * bs)
    kv.free(old)  # its hashes stay cached
    requests = []
    for rid in range(rng.randint(1, 5)):
        num_prompt, max_tokens = rng.randint(1, 3 * bs), rng.randint(5, 12 * bs)
        keys = hashes((num_prompt + max_tokens) // bs)
        if rng.random() < 0.3 and len(keys) > 2:
            keys[rng.randrange(len(keys))] = old.block_hashes[rng.randrange(6)]
        req = Request(rid, num_prompt, max_tokens, keys)
        assert kv.allocate_slots(req, num_prompt, full_sequence=True)
        req.num_computed_tokens = num_prompt
        for _ in range(rng.randint(0, 2)):  # a few single decode steps
            assert kv.allocate_slots(req, 1)
            req.num_computed_tokens += 1
        requests.append(req)
    left = min(r.max_tokens - (r.num_computed_tokens - r.num_prompt_tokens) for r in requests) - 1
    num_steps = rng.randint(0, max(0, min(left, pool.num_free_blocks * bs // len(requests) - bs)))
    done = kv.allocate_decode_run(requests, num_steps)
    return (done, kv.req_to_blocks, kv.num_cached_block, pool.free_queue(), pool.block_hash,
            pool.num_evictions)


@pytest.mark.parametrize("seed", range(60))
def test_allocate_decode_run_of_both_managers_agree(seed, pure_core, compiled_core):
    """The compiled ``allocate_decode_run`` (hashes as an array or a list) leaves the state the
    pure one leaves, refusals included."""
    pure = _decode_run_state(seed, pure_core, False)
    assert _decode_run_state(seed, compiled_core, True) == pure
    assert _decode_run_state(seed, compiled_core, False) == pure


def test_allocate_decode_run_refuses_when_a_filled_hash_is_cached_or_repeated(core):
    pool = core.BlockPool(20)
    kv = core.KVCacheManager(pool, block_size=2, max_model_len=100)
    req = test_block_pool.make_request(0, 3, [1, 2, 3, 3], max_tokens=10, block_size=2)
    assert kv.allocate_slots(req, 3)
    req.num_computed_tokens = 3
    assert not kv.allocate_decode_run([req], 6)  # would fill blocks 1, 2, 3: hashes 2, 3, 3
    assert kv.get_block_ids(req) == [1, 2] and pool.num_free_blocks == 17
    assert kv.allocate_decode_run([req], 2)  # fills block 1 (hash 2), opens block 3
    assert kv.get_num_cached_blocks(req) == 2 and kv.get_block_ids(req) == [1, 2, 3]
    other = test_block_pool.make_request(1, 3, [7, 8], max_tokens=10, block_size=2)
    cached = test_block_pool.make_request(2, 2, [8], block_size=2)
    assert kv.allocate_slots(other, 3) and kv.allocate_slots(cached, 2)  # hash 8 is cached
    other.num_computed_tokens = 3
    assert not kv.allocate_decode_run([other], 2)  # would fill block 1 under hash 8
    assert kv.get_block_ids(other) == [4, 5] and pool.num_free_blocks == 13


@pytest.mark.parametrize("seed, runs, num_ops", test_block_pool_reference.STREAMS)
def test_random_stream_equals_reference_pool(core, seed, runs, num_ops):
    test_block_pool_reference.run_random_stream(core.BlockPool, seed, runs, num_ops)


@pytest.mark.parametrize("seed, runs", [(seed, runs) for seed in range(3) for runs in (False, True)])
def test_wide_keys_and_a_growing_prefix_index(core, seed, runs):
    """64-bit keys (negative ones too), evicted; with runs, a pool of 1,200 blocks holding
    about 1,100 distinct hashes at the peak, so the compiled index grows twice past its first
    1,024 slots and deletes inside long probe runs."""
    test_block_pool_reference.run_random_stream(core.BlockPool, seed, runs, 600, num_blocks=1200 if runs else 300,
                                                alphabet_size=400 if runs else 5000, wide=True)


def test_free_table_with_a_block_listed_twice(core, monkeypatch):
    monkeypatch.setattr(test_block_pool_reference, "BlockPool", core.BlockPool)
    test_block_pool_reference.test_free_table_with_a_block_listed_twice_equals_reference_pool()


def test_bad_input_gives_the_python_pools_errors(core):
    impl = core.BlockPool
    with pytest.raises(ValueError, match=r"must be >= 2 \(block 0 is reserved\), got 1"):
        impl(1)
    pool = impl(11)
    first = pool.get_new_blocks(3)
    with pytest.raises(ValueError, match="cannot get 8 free blocks, only 7 free"):
        pool.get_new_blocks(8)
    assert pool.get_new_blocks(0) == [] and pool.get_new_blocks(-1) == []
    with pytest.raises(TypeError):
        pool.get_new_blocks(1.5)
    with pytest.raises(IndexError):
        pool.touch([9])  # never handed out
    with pytest.raises(IndexError):
        pool.num_evictable([9])
    with pytest.raises(TypeError):
        pool.touch(["1"])
    assert pool.free_queue() == list(range(4, 11)) and pool.ref_cnt == [1, 1, 1, 1]
    # lookups of values no pool could have stored find nothing
    assert pool.get_cached_block(1 << 70) is None and pool.get_cached_block("x") is None
    assert pool.longest_cache_hit([1 << 70], 1) == [] and pool.none_cached([1 << 70, None])
    pool.free_table(first, [], 0)
    assert pool.free_queue() == [3, 2, 1] + list(range(4, 11))


def test_memory_follows_the_blocks_used(core):
    """A pool of 2**24 blocks costs what its used blocks cost (``tracemalloc`` sees both)."""
    import tracemalloc

    tracemalloc.start()
    try:
        pool = core.BlockPool(1 << 24)
        pool.cache_full_blocks(pool.get_new_blocks(100), list(range(100)), 0, 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes"
    assert pool.num_free_blocks == (1 << 24) - 101 and pool.num_cached_blocks() == 100


def test_the_compiled_pool_is_in_use_when_built(compiled_core):
    if os.environ.get(compiled.PURE_PYTHON_ENV) == "1":
        pytest.skip(f"{compiled.PURE_PYTHON_ENV}=1 chooses the pure-Python core")
    assert compiled.COMPILED, compiled.REASON
    scheduler = compiled.Scheduler(EngineConfig())  # the scheduler the chooser picked builds its pool
    assert type(scheduler.pool) is compiled_core.BlockPool
    assert type(scheduler.kv_cache_manager) is compiled_core.KVCacheManager
    from kvroute.sim.timing import compiled as timing_compiled
    assert timing_compiled.DecodeRunTimes.__module__ == "kvroute.sim.timing._decode_run"
    assert compiled.block_hashes.__module__ == "kvroute.sim.engine._content"


def test_pure_python_is_chosen_by_the_environment():
    code = ("from kvroute.sim.engine import compiled; from kvroute.sim.timing import compiled as timing; "
            "print(compiled.COMPILED, compiled.BlockPool.__module__, compiled.KVCacheManager.__module__, "
            "timing.DecodeRunTimes.__module__, compiled.block_hashes.__module__)")
    env = {**os.environ, compiled.PURE_PYTHON_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "kvroute.sim.engine.block_pool", "kvroute.sim.engine.kv_cache_manager",
                                  "kvroute.sim.timing.decode_run", "kvroute.sim.engine.content"]
    assert out.stderr == ""  # chosen, so no warning
