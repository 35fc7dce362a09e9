"""The block pool (runs of blocks, list-based free queue) against the per-block reference pool
it replaced, on random streams of allocations, hits, registrations (with duplicate blocks) and
frees (``free_blocks`` and ``free_table``): same free-queue order, same cache lookups, reference counts and eviction counts after
every operation; and the KV-cache events the fast pool publishes add up to its cached blocks."""

import random
from collections import Counter

import pytest

from kvroute.sim.block_pool import BlockPool
from reference_block_pool import ReferenceBlockPool


def _same(fast: BlockPool, ref: ReferenceBlockPool, hashes: range) -> None:
    assert fast.free_queue() == ref.free_queue()
    assert fast.num_free_blocks == ref.num_free_blocks
    assert fast.ref_cnt + [0] * (ref.num_gpu_blocks - len(fast.ref_cnt)) == ref.ref_cnt  # never-used: 0
    assert fast.num_evictions == ref.num_evictions
    assert fast.num_cached_blocks() == ref.num_cached_blocks()
    assert [fast.get_cached_block(h) for h in hashes] == [ref.get_cached_block(h) for h in hashes]


@pytest.mark.parametrize("seed", range(40))
def test_fast_pool_equals_reference_pool(seed):
    rng = random.Random(seed)
    num_blocks = rng.choice([8, 20, 64])
    fast, ref = BlockPool(num_blocks), ReferenceBlockPool(num_blocks)
    events: Counter = Counter()  # hash -> BlockStored minus BlockRemoved events seen

    def listener(stored, hashes):
        for h in hashes:
            events[h] += 1 if stored else -1

    fast.kv_event_listener = listener
    alphabet = range(rng.choice([6, 30]))  # few prefixes: many hits and duplicate blocks
    held: list[tuple[list[int], list[int], int]] = []  # (block ids, chain, registered)
    for _ in range(300):
        op = rng.random()
        if op < 0.5 and fast.num_free_blocks:
            chain = [rng.choice(alphabet) for _ in range(rng.randint(1, 6))]
            # prefix hashes: a chain names its whole prefix, so equal tuples give equal keys
            keys = [hash(tuple(chain[:i + 1])) % 1000 for i in range(len(chain))]
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
            blocks, _, registered = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.5:
                fast.free_blocks(reversed(blocks))
            else:  # hits and registered blocks, exactly the hashed ones, lead the table
                fast.free_table(blocks, registered)
            ref.free_blocks(reversed(blocks))
        _same(fast, ref, range(1000))
        # the events add up to the blocks cached under each hash (duplicates included)
        blocks_cached = Counter(h for h in fast.block_hash if h is not None)
        assert +events == blocks_cached
    for blocks, _, _ in held:
        fast.free_blocks(reversed(blocks))
        ref.free_blocks(reversed(blocks))
    _same(fast, ref, range(1000))
    assert fast.reset_prefix_cache() and ref.reset_prefix_cache()
    _same(fast, ref, range(1000))
    assert fast.get_new_blocks(fast.num_free_blocks) == ref.get_new_blocks(ref.num_free_blocks)
