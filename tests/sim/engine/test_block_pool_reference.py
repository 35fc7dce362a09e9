"""Random streams that check a block pool against the pure-Python one (``sim/engine/block_pool.py``,
vLLM's pool as vLLM writes it: the source of truth), and a case with a block listed twice.

A stream draws allocations, hits, registrations (with duplicate blocks) and frees, and compares
after every operation the free-queue order, cache lookups, hashes, reference counts, eviction
counts and KV-cache events of the two pools; the events must add up to the cached blocks. The
pool under test frees a request's table by ``free_table`` or by ``free_blocks`` with the
table's hashes, at random; the reference frees it as vLLM does (``free_blocks`` on the reversed
table).

test_block_pool_impls.py runs these on both cores: the compiled twin
(``sim/engine/_block_pool.pyx``) against the pure pool, and the pure pool's ``free_table``
against its own ``free_blocks``."""

import random
from collections import Counter

from kvroute.sim.engine.block_pool import BlockPool as PurePool

BlockPool = PurePool
"""The pool ``test_free_table_with_a_block_listed_twice_equals_reference_pool`` compares with the
pure pool (test_block_pool_impls.py sets it to each core's)."""


def _same(pool, ref: PurePool, hashes) -> None:
    assert pool.free_queue() == ref.free_queue()
    assert pool.num_free_blocks == ref.num_free_blocks
    n = ref.num_gpu_blocks
    # a block id at or above len(ref_cnt) was never used: 0 references
    assert pool.ref_cnt + [0] * (n - len(pool.ref_cnt)) == ref.ref_cnt + [0] * (n - len(ref.ref_cnt))
    assert pool.num_evictions == ref.num_evictions
    assert pool.num_cached_blocks() == ref.num_cached_blocks()
    assert [pool.get_cached_block(h) for h in hashes] == [ref.get_cached_block(h) for h in hashes]


def _table_hashes(blocks: list[int], keys: list[int], registered: int) -> list[int | None]:
    """The hash each block of a table carries: its key if registered (or hit), else None."""
    return keys[:registered] + [None] * (len(blocks) - registered)


def _keys(rng: random.Random, alphabet: range, runs: bool, wide: bool = False) -> list[int]:
    """Prefix hashes of a random chain (a chain names its whole prefix, so equal tuples give
    equal keys). With ``runs``, each chain element stands for a run of 1-8 blocks keyed
    ``first + m`` as content.block_hashes keys a run inside one segment. ``wide``: keys are
    whole tuple hashes (anywhere in the signed 64-bit range), not small ints."""
    chain = [rng.choice(alphabet) for _ in range(rng.randint(1, 6))]
    top = None if wide else 1000
    if not runs:
        return [_cut(hash(tuple(chain[:i + 1])), top) for i in range(len(chain))]
    keys: list[int] = []
    for i in range(len(chain)):
        first = _cut(hash(tuple(chain[:i + 1])), top) * (1 if wide else 8)
        keys.extend(range(first, first + 1 + hash((i, chain[i])) % 8))
    return keys


def _cut(h: int, top: int | None) -> int:
    return h if top is None else h % top


STREAMS = (
    [(seed, False, 300) for seed in range(60)]
    + [(seed, True, 300) for seed in range(40)]
    + [(seed, runs, 3000) for seed in range(4) for runs in (False, True)]
)
"""``(seed, runs, num_ops)`` of the random streams."""


def run_random_stream(pool_cls, seed: int, runs: bool, num_ops: int, num_blocks: int | None = None,
                      alphabet_size: int | None = None, wide: bool = False) -> None:
    """One random stream on ``pool_cls`` and on the pure pool, compared after every operation.
    ``num_blocks``, ``alphabet_size`` (prefixes to draw from): instead of the seed's choice;
    ``wide``: 64-bit keys (see ``_keys``)."""
    rng = random.Random(seed)
    num_blocks = num_blocks or rng.choice([8, 20, 64] + ([256] if runs else []))
    seen: list[int] = []  # wide keys drawn so far; each comparison looks up a sample of them
    sampler = random.Random(seed + 1)
    key_range = range(8008 if runs else 1000)
    pool, ref = pool_cls(num_blocks), PurePool(num_blocks)
    events: Counter = Counter()  # hash -> BlockStored minus BlockRemoved events seen
    calls: list = []  # the pool's listener calls since the last comparison
    ref_calls: list = []

    def listener(stored, hashes):
        calls.append((stored, list(hashes)))
        for h in hashes:
            events[h] += 1 if stored else -1
            if not events[h]:
                del events[h]  # keep the comparison below as cheap as the live entries

    pool.kv_event_listener = listener
    ref.kv_event_listener = lambda stored, hashes: ref_calls.append((stored, list(hashes)))
    alphabet = range(rng.choice([6, 30]))  # few prefixes: many hits and duplicate blocks
    if alphabet_size:
        alphabet = range(alphabet_size)
    held: list[tuple[list[int], list[int], int]] = []  # (block ids, keys, registered)
    for step in range(num_ops):
        op = rng.random()
        if op < 0.5 and pool.num_free_blocks:
            keys = _keys(rng, alphabet, runs, wide)
            if wide:
                seen.extend(keys)
                key_range = keys + sampler.sample(seen, min(len(seen), 200))
            assert pool.none_cached(keys) == ref.none_cached(keys)
            hit = pool.longest_cache_hit(keys, len(keys) - 1)
            assert hit == ref.longest_cache_hit(keys, len(keys) - 1)
            need = len(keys) + rng.randint(0, 1) - len(hit)  # maybe one partial block more
            touch_free = pool.num_evictable(hit)
            assert touch_free == ref.num_evictable(hit) == sum(1 for b in hit if ref.ref_cnt[b] == 0)
            if need + touch_free > pool.num_free_blocks:
                continue
            pool.touch(hit)
            ref.touch(hit)
            new = pool.get_new_blocks(need)
            assert new == ref.get_new_blocks(need)
            blocks = hit + new
            registered = rng.randint(len(hit), len(keys))
            pool.cache_full_blocks(blocks, keys, len(hit), registered)
            ref.cache_full_blocks(blocks, keys, len(hit), registered)
            held.append((blocks, keys, registered))
        elif held:
            blocks, keys, registered = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.5:
                pool.free_blocks(reversed(blocks), reversed(_table_hashes(blocks, keys, registered)))
            else:  # hits and registered blocks, exactly the hashed ones, lead the table
                pool.free_table(blocks, keys, registered)
            ref.free_blocks(reversed(blocks))
        _same(pool, ref, key_range)
        assert calls == ref_calls
        calls.clear()
        ref_calls.clear()
        if wide and step % 20:
            continue  # large pools: the checks below, which read every block, every 20th step
        assert pool.block_hash == ref.block_hash
        # the events add up to the blocks cached under each hash (duplicates included)
        assert +events == Counter(h for h in ref.block_hash if h is not None)
    for blocks, keys, registered in held:
        pool.free_blocks(reversed(blocks), reversed(_table_hashes(blocks, keys, registered)))
        ref.free_blocks(reversed(blocks))
    _same(pool, ref, key_range)
    assert pool.reset_prefix_cache() and ref.reset_prefix_cache()
    _same(pool, ref, key_range)
    assert pool.block_hash == ref.block_hash == [None] * num_blocks
    assert pool.get_new_blocks(pool.num_free_blocks) == ref.get_new_blocks(ref.num_free_blocks)
    assert calls == ref_calls == []


def test_free_table_with_a_block_listed_twice_equals_reference_pool():
    """A hash collision inside one chain makes a hit list one block twice; freeing that table
    (shared blocks, one listed twice) keeps the pure pool's queue order."""
    pool, ref = BlockPool(8), PurePool(8)
    first = pool.get_new_blocks(2)
    assert first == ref.get_new_blocks(2)
    pool.cache_full_blocks(first, [7, 8], 0, 2)
    ref.cache_full_blocks(first, [7, 8], 0, 2)
    pool.free_table(first, [7, 8], 2)
    ref.free_blocks(reversed(first))
    keys = [7, 7, 9]
    hit = pool.longest_cache_hit(keys, 2)
    assert hit == ref.longest_cache_hit(keys, 2) == [1, 1]
    tables = []
    for p in (pool, ref):
        p.touch(hit)
        blocks = hit + p.get_new_blocks(2)
        p.cache_full_blocks(blocks, keys, 2, 3)
        tables.append(blocks)
    assert tables[0] == tables[1]
    assert pool.ref_cnt[1] == ref.ref_cnt[1] == 2
    _same(pool, ref, range(10))
    pool.free_table(tables[0], keys, 3)
    ref.free_blocks(reversed(tables[1]))
    _same(pool, ref, range(10))
    assert ref.free_queue() == [4, 5, 6, 7, 2, 3, 1]
