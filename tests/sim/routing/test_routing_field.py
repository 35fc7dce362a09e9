"""The field's routers, each on the exact cases its documented behaviour fixes."""

import math

import numpy as np
import pytest

from kvroute.sim.routing import (KVEventIndex, MetricsScrape, RouteRequest, RouterView, make_policy, parse_spec,
                                 router_rng, split_specs)
from kvroute.sim.routing.dynamo import softmax_probabilities


def rr(rid, hashes, session=None, tokens=None):
    return RouteRequest(rid, session, list(hashes), len(hashes) * 16 if tokens is None else tokens)


def view(n=2, metrics=None):
    return RouterView(n, block_size=16, router_block_tokens=16, metrics=metrics)


# -- SGLang cache-aware ----------------------------------------------------------------------

def sglang_case(loads, matched_blocks, total_blocks=8):
    policy, v = make_policy("sglang", router_rng(0)), view(2)
    v.on_routed(0, rr(0, range(1, matched_blocks + 1)))  # worker 0 holds the prefix
    v.in_flight[:] = loads
    return policy.choose(rr(1, range(1, total_blocks + 1)), v)


def test_sglang_imbalanced_cluster_goes_to_the_least_loaded():
    # 70 - 5 = 65 > 64 and 70 > 1.5 * 5: imbalanced, so the worker with load 5 wins
    assert sglang_case([70, 5], matched_blocks=8) == 1
    assert sglang_case([5, 70], matched_blocks=8) == 0


def test_sglang_balanced_cluster_keeps_cache_affinity():
    # 60 - 5 = 55 <= 64: balanced, and 8 of 8 blocks matched on the busier worker 0
    assert sglang_case([60, 5], matched_blocks=8) == 0


def test_sglang_short_match_goes_to_the_least_loaded():
    # 2 of 8 blocks = 0.25 <= cache_threshold 0.3: least loaded, although worker 0 matches
    assert sglang_case([3, 1], matched_blocks=2) == 1
    assert sglang_case([3, 1], matched_blocks=3) == 0  # 0.375 > 0.3: affinity


def test_sglang_thresholds_are_parameters():
    policy = make_policy("sglang:balance_abs_threshold=100", router_rng(0))
    v = view(2)
    v.on_routed(0, rr(0, range(1, 9)))
    v.in_flight[:] = [70, 5]
    assert policy.choose(rr(1, range(1, 9)), v) == 0  # 65 <= 100: balanced


# -- Dynamo KV router ------------------------------------------------------------------------

def dynamo_view():
    """Built through the view's own bookkeeping. Worker 0: blocks 1-4 cached by a finished
    request (an earlier turn: not in flight), 10 blocks in flight prefilled and 2 in flight
    not yet (32 tokens to prefill): 12 active blocks. Worker 1: 2 blocks in flight, prefilled."""
    v = RouterView(2, block_size=16, router_block_tokens=16, track_active_blocks=True)
    for rid, worker, hashes in ((10, 0, [1, 2, 3, 4]), (11, 0, range(40, 50)), (12, 0, [60, 61]), (13, 1, [70, 71])):
        v.on_routed(worker, rr(rid, hashes))
    for rid in (10, 11, 13):
        v.on_first_token(rid)
    v.on_finished(0, 10)
    assert (v.outstanding_tokens, v.active_blocks) == ([32, 0], [12, 2])
    return v


def test_dynamo_cost_on_a_hand_computed_two_worker_case():
    """Dynamo's decode term counts the blocks in flight and the prompt's blocks no request in
    flight holds; the cached prefix lowers the prefill term only (``sequence.rs``
    ``potential_blocks_and_tokens``: ``new_blocks + active_blocks``)."""
    req = rr(1, range(1, 9))  # 8 blocks, 128 tokens
    # w0: prefill (32 + 128 - 4 * 16) / 16 = 6, decode 12 + 8 = 20; w1: prefill 8, decode 2 + 8 = 10
    policy = make_policy("dynamo", router_rng(0))
    assert policy.logits(req, dynamo_view(), [0, 1]) == [26.0, 18.0]
    assert policy.choose(req, dynamo_view()) == 1
    heavy = make_policy("dynamo:overlap_weight=6", router_rng(0))
    assert heavy.logits(req, dynamo_view(), [0, 1]) == [56.0, 58.0]
    assert heavy.choose(req, dynamo_view()) == 0
    tie = make_policy("dynamo:overlap_weight=5", router_rng(0))
    assert tie.logits(req, dynamo_view(), [0, 1]) == [50.0, 50.0]
    assert {make_policy("dynamo:overlap_weight=5", router_rng(s)).choose(req, dynamo_view())
            for s in range(10)} == {0, 1}


def test_dynamo_prefix_in_flight_lowers_the_decode_term():
    """A request in flight on worker 0 holding blocks 1-5: the new prompt's first 5 blocks add
    nothing to worker 0's active blocks (5 of them are already counted)."""
    v = dynamo_view()
    v.on_routed(0, rr(14, range(1, 6)))
    v.on_first_token(14)
    assert v.active_blocks == [17, 2] and v.new_blocks(0, list(range(1, 9))) == 3
    # w0: prefill (32 + 128 - 5 * 16) / 16 = 5, decode 17 + 3 = 20; w1 as before, 18
    assert make_policy("dynamo", router_rng(0)).logits(rr(1, range(1, 9)), v, [0, 1]) == [25.0, 18.0]


def test_the_routed_view_forgets_a_prefix_its_ttl_after_the_last_routing():
    """Dynamo's --no-kv-events index expires entries (router_ttl_secs, 120 s): a prefix routed to
    worker 0 at t = 0 matches until t = 120 and not after; routing it again renews it."""
    now = [0.0]
    v = RouterView(2, block_size=16, router_block_tokens=16, routed_ttl_s=120.0, clock=lambda: now[0])
    v.on_routed(0, rr(1, [1, 2, 3]))
    v.on_routed(1, rr(2, [1, 2]))
    now[0] = 119.0
    assert v.matched_blocks([1, 2, 3]) == [3, 2]
    v.on_routed(1, rr(3, [1, 2]))  # worker 1's blocks 1-2 renewed until 239 s
    now[0] = 120.0
    assert v.matched_blocks([1, 2, 3]) == [0, 2]
    now[0] = 239.0
    assert v.matched_blocks([1, 2, 3]) == [0, 0]
    plain = view(1)
    plain.on_routed(0, rr(1, [1, 2]))
    assert plain.routed_ttl_s is None and plain.matched_blocks([1, 2]) == [2]  # other policies keep them
    policy = make_policy("dynamo:ttl_s=30", router_rng(0))
    assert (policy.routed_ttl_s, make_policy("dynamo", router_rng(0)).routed_ttl_s) == (30.0, 120.0)
    with pytest.raises(ValueError, match="ttl_s must be > 0 s, got 0"):
        make_policy("dynamo:ttl_s=0", router_rng(0))
    with pytest.raises(ValueError, match="needs a clock"):
        RouterView(1, block_size=16, routed_ttl_s=120.0)


def test_blocks_shared_by_requests_in_flight_count_once():
    v = RouterView(1, block_size=16, router_block_tokens=16, track_active_blocks=True)
    v.on_routed(0, rr(1, [1, 2, 3]))
    v.on_routed(0, rr(2, [1, 2, 9]))
    assert v.active_blocks == [4] and v.new_blocks(0, [1, 2, 3, 8]) == 1 and v.new_blocks(0, [5, 1]) == 2
    v.on_finished(0, 1)
    assert v.active_blocks == [3] and v.new_blocks(0, [1, 2, 3]) == 1
    v.on_finished(0, 2)
    assert v.active_blocks == [0] and v.new_blocks(0, [1, 2, 9]) == 3
    with pytest.raises(RuntimeError, match="track_active_blocks"):
        view(1).new_blocks(0, [1])


def test_dynamo_softmax_temperature():
    # logits (20, 18) normalise to (1, 0): p = exp(-x / T) normalised
    p = softmax_probabilities([20.0, 18.0], 1.0)
    assert p[1] == pytest.approx(1 / (1 + math.exp(-1)))
    assert softmax_probabilities([5.0, 5.0], 0.7) == [0.5, 0.5]
    req = rr(1, range(1, 9))
    picks = [make_policy("dynamo:temperature=1.0", router_rng(s)).choose(req, dynamo_view()) for s in range(400)]
    again = [make_policy("dynamo:temperature=1.0", router_rng(s)).choose(req, dynamo_view()) for s in range(400)]
    assert picks == again  # seeded
    assert 0.65 < picks.count(1) / 400 < 0.81  # p = 0.731
    with pytest.raises(ValueError):
        softmax_probabilities([1.0], 0.0)


# -- llm-d -----------------------------------------------------------------------------------

def test_llmd_weighted_score_on_a_hand_computed_case():
    # worker 0: 3 of 4 blocks cached, 2 waiting, KV 50 %; worker 1: nothing cached, 0 waiting, KV 10 %
    metrics = MetricsScrape(lambda: [(1, 2, 0.5), (1, 0, 0.1)])
    v = view(2, metrics)
    v.on_routed(0, rr(0, [1, 2, 3]))
    req = rr(1, [1, 2, 3, 4])
    policy = make_policy("llmd", router_rng(0))
    # w0: 3 * 0.75 + 2 * 0 + 2 * 0.5 = 3.25; w1: 3 * 0 + 2 * 1 + 2 * 0.9 = 3.8
    assert policy.scores(req, v, [0, 1]) == pytest.approx([3.25, 3.8])
    assert policy.choose(req, v) == 1
    cache_first = make_policy("llmd:prefix_weight=5", router_rng(0))
    assert cache_first.scores(req, v, [0, 1]) == pytest.approx([4.75, 3.8])
    assert cache_first.choose(req, v) == 0
    # load-aware scorer: 0.5 for an empty queue, 0.5 * (1 - 2 / 128) otherwise
    load_only = make_policy("llmd:prefix_weight=0,queue_weight=0,kv_weight=0,load_weight=1", router_rng(0))
    assert load_only.scores(req, v, [0, 1]) == pytest.approx([0.5 * (1 - 2 / 128), 0.5])


# -- session affinity and power of two -------------------------------------------------------

def test_session_affinity_is_a_consistent_hash():
    policy, v = make_policy("session_affinity", router_rng(0)), view(4)
    first = {s: policy.choose(rr(0, [], session=s), v) for s in range(40)}
    assert first == {s: policy.choose(rr(1, [], session=s), v) for s in range(40)}
    assert len(set(first.values())) == 4
    v.mark_dead(2)
    after = {s: policy.choose(rr(2, [], session=s), v) for s in range(40)}
    assert all(after[s] == first[s] for s in range(40) if first[s] != 2)  # only worker 2's moved
    assert 2 not in after.values()


def test_power_of_two_takes_the_less_loaded_of_two():
    v = view(3)
    v.in_flight[:] = [9, 0, 5]
    picks = [make_policy("power_of_two", router_rng(s)).choose(rr(0, []), v) for s in range(60)]
    assert set(picks) == {1, 2}  # 0 loses every pair it is in


# -- specs -----------------------------------------------------------------------------------

def test_policy_specs_parse_with_parameters():
    assert split_specs("sglang,dynamo:overlap_weight=2,temperature=0.5,llmd") == [
        "sglang", "dynamo:overlap_weight=2,temperature=0.5", "llmd"]
    assert parse_spec("dynamo:overlap_weight=2,temperature=0.5") == ("dynamo", {"overlap_weight": 2.0, "temperature": 0.5})
    with pytest.raises(ValueError, match="no parameter 'weight'; its parameters: overlap_weight, temperature"):
        parse_spec("dynamo:weight=1")
    with pytest.raises(ValueError, match="not a valid float"):
        parse_spec("dynamo:temperature=hot")
    with pytest.raises(ValueError, match="before any policy"):
        split_specs("x=1,sglang")


# -- signals ---------------------------------------------------------------------------------

def test_scrape_holds_values_until_the_next_scrape():
    live = [(1, 0, 0.1)]
    m = MetricsScrape(lambda: list(live), interval_s=0.05)
    m.scrape()
    live[0] = (3, 2, 0.4)
    assert m.current() == [(1, 0, 0.1)]
    m.scrape()
    assert m.current() == [(3, 2, 0.4)]
    assert MetricsScrape(lambda: list(live)).current() == [(3, 2, 0.4)]  # interval 0: live


def test_kv_event_index_counts_copies():
    idx = KVEventIndex(2)
    idx.apply(0, True, [1, 2, 3])
    idx.apply(0, True, [2])  # a second copy of 2
    idx.apply(1, True, [1])
    assert idx.matched_blocks([1, 2, 3, 4]) == [3, 1]
    idx.apply(0, False, [2])
    assert idx.matched_blocks([1, 2, 3]) == [3, 1]  # one copy of 2 left
    idx.apply(0, False, [2])
    assert idx.matched_blocks([1, 2, 3]) == [1, 1]
    assert idx.cached(0) == {1, 3}


def test_kv_event_index_counts_copies_within_one_batch():
    """A delayed feed merges one instant's stores into one batch: its repeats are copies too
    (two copies in one batch, one removed, read as none)."""
    idx = KVEventIndex(1)
    idx.apply(0, True, [5, 5, 6])
    assert (idx.copies(0, 5), idx.copies(0, 6)) == (2, 1)
    idx.apply(0, False, [5])
    assert idx.copies(0, 5) == 1  # was 0
    idx.apply(0, True, [6, 7, 7, 7])  # one held before, one repeated
    assert (idx.copies(0, 6), idx.copies(0, 7)) == (2, 3)
    idx.apply(0, False, [5, 6, 7, 7])
    assert idx.cached(0) == {6, 7} and idx.copies(0, 7) == 1
