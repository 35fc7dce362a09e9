"""The block pool (runs of blocks, list-based free queue) against the per-block reference pool
it replaced, on random streams of allocations, hits, registrations (with duplicate blocks) and
frees (``free_blocks`` and ``free_table``): same free-queue order, same cache lookups, reference counts and eviction counts after
every operation; and the KV-cache events the fast pool publishes add up to its cached blocks."""

import random
from collections import Counter

import pytest

from kvroute.sim.engine.block_pool import BlockPool
from reference_block_pool import ReferenceBlockPool


def _same(fast: BlockPool, ref: ReferenceBlockPool, hashes: range) -> None:
    assert fast.free_queue() == ref.free_queue()
    assert fast.num_free_blocks == ref.num_free_blocks
    assert fast.ref_cnt + [0] * (ref.num_gpu_blocks - len(fast.ref_cnt)) == ref.ref_cnt  # never-used: 0
    assert fast.num_evictions == ref.num_evictions
    assert fast.num_cached_blocks() == ref.num_cached_blocks()
    assert [fast.get_cached_block(h) for h in hashes] == [ref.get_cached_block(h) for h in hashes]


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


@pytest.mark.parametrize("seed, runs, num_ops", STREAMS)
def test_fast_pool_equals_reference_pool(seed, runs, num_ops):
    run_random_stream(BlockPool, seed, runs, num_ops)


def run_random_stream(pool_cls, seed: int, runs: bool, num_ops: int, num_blocks: int | None = None,
                      alphabet_size: int | None = None, wide: bool = False) -> None:
    """One random stream on ``pool_cls`` and on the reference pool, compared after every
    operation. ``num_blocks``, ``alphabet_size`` (prefixes to draw from): instead of the
    seed's choice; ``wide``: 64-bit keys (see ``_keys``)."""
    rng = random.Random(seed)
    num_blocks = num_blocks or rng.choice([8, 20, 64] + ([256] if runs else []))
    seen: list[int] = []  # wide keys drawn so far; each comparison looks up a sample of them
    sampler = random.Random(seed + 1)
    key_range = range(8008 if runs else 1000)
    fast, ref = pool_cls(num_blocks), ReferenceBlockPool(num_blocks)
    events: Counter = Counter()  # hash -> BlockStored minus BlockRemoved events seen

    def listener(stored, hashes):
        for h in hashes:
            events[h] += 1 if stored else -1
            if not events[h]:
                del events[h]  # keep the comparison below as cheap as the live entries

    fast.kv_event_listener = listener
    alphabet = range(rng.choice([6, 30]))  # few prefixes: many hits and duplicate blocks
    if alphabet_size:
        alphabet = range(alphabet_size)
    held: list[tuple[list[int], list[int], int]] = []  # (block ids, keys, registered)
    for step in range(num_ops):
        op = rng.random()
        if op < 0.5 and fast.num_free_blocks:
            keys = _keys(rng, alphabet, runs, wide)
            if wide:
                seen.extend(keys)
                key_range = keys + sampler.sample(seen, min(len(seen), 200))
            hit = fast.longest_cache_hit(keys, len(keys) - 1)
            assert hit == ref.longest_cache_hit(keys, len(keys) - 1)
            need = len(keys) + rng.randint(0, 1) - len(hit)  # maybe one partial block more
            touch_free = sum(1 for b in hit if fast.ref_cnt[b] == 0)
            if need + touch_free > fast.num_free_blocks:
                continue
            fast.touch(hit)
            ref.touch(hit)
            new = fast.get_new_blocks(need)
            assert new == ref.get_new_blocks(need)
            blocks = hit + new
            registered = rng.randint(len(hit), len(keys))
            fast.cache_full_blocks(blocks, keys, len(hit), registered)
            ref.cache_full_blocks(blocks, keys, len(hit), registered)
            held.append((blocks, keys, registered))
        elif held:
            blocks, keys, registered = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.5:
                fast.free_blocks(reversed(blocks), reversed(_table_hashes(blocks, keys, registered)))
            else:  # hits and registered blocks, exactly the hashed ones, lead the table
                fast.free_table(blocks, keys, registered)
            ref.free_blocks(reversed(blocks))
        _same(fast, ref, key_range)
        if wide and step % 20:
            continue  # large pools: the checks below, which read every block, every 20th step
        assert fast._shared == {bid for bid, r in enumerate(fast.ref_cnt) if bid and r >= 2}
        # the events add up to the blocks cached under each hash (duplicates included)
        blocks_cached = Counter(h for h in fast.block_hash if h is not None)
        assert +events == blocks_cached
    for blocks, keys, registered in held:
        fast.free_blocks(reversed(blocks), reversed(_table_hashes(blocks, keys, registered)))
        ref.free_blocks(reversed(blocks))
    _same(fast, ref, key_range)
    assert fast.reset_prefix_cache() and ref.reset_prefix_cache()
    _same(fast, ref, key_range)
    assert fast.get_new_blocks(fast.num_free_blocks) == ref.get_new_blocks(ref.num_free_blocks)


def test_free_table_with_a_block_listed_twice_equals_reference_pool():
    """A hash collision inside one chain makes a hit list one block twice; freeing that table
    (shared blocks, one listed twice) keeps the reference's queue order."""
    fast, ref = BlockPool(8), ReferenceBlockPool(8)
    first = fast.get_new_blocks(2)
    assert first == ref.get_new_blocks(2)
    fast.cache_full_blocks(first, [7, 8], 0, 2)
    ref.cache_full_blocks(first, [7, 8], 0, 2)
    fast.free_table(first, [7, 8], 2)
    ref.free_blocks(reversed(first))
    keys = [7, 7, 9]
    hit = fast.longest_cache_hit(keys, 2)
    assert hit == ref.longest_cache_hit(keys, 2) == [1, 1]
    tables = []
    for pool in (fast, ref):
        pool.touch(hit)
        blocks = hit + pool.get_new_blocks(2)
        pool.cache_full_blocks(blocks, keys, 2, 3)
        tables.append(blocks)
    assert tables[0] == tables[1]
    _same(fast, ref, range(10))
    fast.free_table(tables[0], keys, 3)
    ref.free_blocks(reversed(tables[1]))
    _same(fast, ref, range(10))
    assert not fast._shared
