"""Exact behaviour of the block pool and KV cache manager (vLLM v1 prefix caching)."""

import pytest

from kvroute.sim.engine.block_pool import BlockPool
from kvroute.sim.engine.kv_cache_manager import KVCacheManager
from kvroute.sim.engine.request import Request


def make_request(rid, num_prompt, hashes, max_tokens=1, block_size=4):
    """A request whose first full blocks carry ``hashes``; later full blocks get unique ones."""
    full = (num_prompt + max_tokens) // block_size
    padded = list(hashes) + [10_000 * (rid + 1) + i for i in range(len(hashes), full)]
    return Request(rid, num_prompt, max_tokens, padded)


def test_free_queue_starts_in_id_order_without_the_null_block():
    pool = BlockPool(11)
    assert pool.free_queue() == list(range(1, 11))
    assert pool.num_free_blocks == 10
    assert pool.usage() == 0.0


def test_new_blocks_come_from_the_head():
    pool = BlockPool(11)
    assert pool.get_new_blocks(3) == [1, 2, 3]
    assert pool.free_queue() == list(range(4, 11))
    assert pool.usage() == pytest.approx(0.3)


def test_freed_request_goes_to_the_tail_in_reverse_so_its_suffix_is_evicted_first():
    pool = BlockPool(11)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    req = make_request(0, 12, [101, 102, 103])
    assert kv.allocate_slots(req, 12)
    assert kv.get_block_ids(req) == [1, 2, 3]
    kv.free(req)
    # Hashed blocks go to the tail, last block first.
    assert pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]


def test_unhashed_blocks_go_to_the_head():
    pool = BlockPool(11)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    req = make_request(0, 10, [101, 102])  # 2 full blocks + a partial third one
    assert kv.allocate_slots(req, 10)
    assert kv.get_block_ids(req) == [1, 2, 3]
    kv.free(req)
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]


def test_eviction_takes_the_suffix_block_never_the_prefix():
    """Blocks [1, 2, 3] of a finished request are cached; a new request needing one block
    evicts block 3, whatever happens elsewhere."""
    pool = BlockPool(4)  # usable blocks 1, 2, 3
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    first = make_request(0, 12, [101, 102, 103])
    assert kv.allocate_slots(first, 12)
    kv.free(first)
    assert pool.free_queue() == [3, 2, 1]
    other = make_request(1, 3, [])
    assert kv.allocate_slots(other, 3)
    assert kv.get_block_ids(other) == [3]
    assert pool.get_cached_block(103) is None
    assert pool.get_cached_block(101) == 1 and pool.get_cached_block(102) == 2
    assert pool.num_evictions == 1


def test_a_lost_first_block_hides_the_rest_of_the_prefix():
    pool = BlockPool(5)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    first = make_request(0, 12, [101, 102, 103])
    assert kv.allocate_slots(first, 12)
    kv.free(first)
    # Evict block 1 only by reusing the free blocks ahead of it: queue is [4, 3, 2, 1].
    filler = make_request(1, 16, [])
    assert kv.allocate_slots(filler, 16)
    assert kv.get_block_ids(filler) == [4, 3, 2, 1]
    kv.free(filler)
    again = make_request(2, 13, [101, 102, 103])
    hit, tokens = kv.get_computed_blocks(again)
    assert (hit, tokens) == ([], 0)


def test_hit_blocks_in_the_free_queue_count_against_free_capacity():
    pool = BlockPool(5)  # usable 4
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    first = make_request(0, 12, [101, 102, 103])
    assert kv.allocate_slots(first, 12)
    kv.free(first)
    # 13 tokens: 3 hit blocks (all evictable, ref 0) + 1 new block = 4 needed of 4 free.
    again = make_request(1, 13, [101, 102, 103])
    hit, tokens = kv.get_computed_blocks(again)
    assert hit == [1, 2, 3] and tokens == 12
    assert kv.can_allocate(again, 1, hit, full_sequence=True)
    hog = make_request(2, 4, [])
    assert kv.allocate_slots(hog, 4)  # takes block 4, the only uncached one
    assert not kv.can_allocate(again, 1, hit, full_sequence=True)


def test_touching_a_hit_removes_it_from_the_free_queue_and_counts_references():
    pool = BlockPool(6)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    a = make_request(0, 8, [101, 102])
    assert kv.allocate_slots(a, 8)
    b = make_request(1, 9, [101, 102])
    hit, tokens = kv.get_computed_blocks(b)
    assert (hit, tokens) == ([1, 2], 8)
    assert kv.allocate_slots(b, 1, hit)
    assert pool.ref_cnt[1] == 2 and pool.ref_cnt[2] == 2
    assert kv.get_block_ids(b) == [1, 2, 3]
    kv.free(a)
    assert pool.ref_cnt[1] == 1 and 1 not in pool.free_queue()
    kv.free(b)
    assert pool.free_queue() == [3, 4, 5, 2, 1]  # partial block 3 has no hash: head


def test_identical_blocks_are_not_merged_and_the_first_registered_wins():
    pool = BlockPool(8)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    a, b = make_request(0, 8, [101, 102]), make_request(1, 8, [101, 102])
    assert kv.allocate_slots(a, 8) and kv.allocate_slots(b, 8)
    assert kv.get_block_ids(a) == [1, 2] and kv.get_block_ids(b) == [3, 4]
    assert pool.get_cached_block(101) == 1
    kv.free(a)
    kv.free(b)
    # Evict block 1 (and 2): reuse everything up to them.
    filler = make_request(2, 4 * 5, [])
    assert kv.allocate_slots(filler, 20)
    assert kv.get_block_ids(filler) == [5, 6, 7, 2, 1]
    assert pool.get_cached_block(101) == 3  # the duplicate still serves hits


def test_blocks_are_registered_when_scheduled_not_when_computed():
    pool = BlockPool(11)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    req = make_request(0, 12, [101, 102, 103])
    assert kv.allocate_slots(req, 6)  # a chunk of 6 tokens: block 1 full, block 2 half
    assert pool.get_cached_block(101) == 1
    assert pool.get_cached_block(102) is None


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(6)
    kv = KVCacheManager(pool, block_size=4, max_model_len=1024)
    req = make_request(0, 8, [101, 102])
    assert kv.allocate_slots(req, 8)
    assert not pool.reset_prefix_cache()
    kv.free(req)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(101) is None and pool.num_cached_blocks() == 0


def test_pool_needs_a_usable_block():
    with pytest.raises(ValueError, match="block 0 is reserved"):
        BlockPool(1)
