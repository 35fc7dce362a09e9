"""Routing policies: choices and tie-breaking, from the router's own knowledge only."""

import numpy as np
import pytest

from kvroute.sim.routing import POLICIES, RouteRequest, RouterView, make_policy, router_rng


def rr(rid, hashes, session=None):
    return RouteRequest(rid, session, list(hashes), len(hashes) * 16)


def view(n=4, stride_tokens=16):
    return RouterView(n, block_size=16, router_block_tokens=stride_tokens)


def test_round_robin_cycles_and_skips_dead_workers():
    policy, v = make_policy("round_robin", np.random.default_rng(0)), view(3)
    assert [policy.choose(rr(i, []), v) for i in range(4)] == [0, 1, 2, 0]
    v.mark_dead(1)
    assert [policy.choose(rr(i, []), v) for i in range(3)] == [2, 0, 2]


def test_least_loaded_picks_the_least_loaded_and_breaks_ties_at_random():
    policy, v = make_policy("least_loaded", np.random.default_rng(0)), view(3)
    v.in_flight[:] = [2, 1, 3]
    assert policy.choose(rr(0, []), v) == 1
    v.in_flight[:] = [2, 1, 1]
    assert {policy.choose(rr(0, []), v) for _ in range(40)} == {1, 2}  # never the busier 0


def test_ties_spread_over_workers_with_the_seed():
    """Two chats starting on idle workers do not both land on worker 0, and 8 sessions on 4
    workers use all 4 (before: always worker 0 first, and only 2 workers for 8 sessions)."""
    for name in ("least_loaded", "kv_aware", "prefix_balanced"):
        chosen = []
        for seed in range(20):
            policy, v = make_policy(name, router_rng(seed)), view(4)
            chosen.append(policy.choose(rr(0, [1, 2], session="a"), v))
        assert set(chosen) == {0, 1, 2, 3}, name
        policy, v = make_policy(name, router_rng(3)), view(4)
        used = []
        for i in range(8):  # one session after another: every worker idle at each choice
            req = rr(i, [100 + i, 200 + i], session=f"s{i}")
            w = policy.choose(req, v)
            v.on_routed(w, req)
            v.on_finished(w)
            used.append(w)
        assert len(set(used)) >= 3, (name, used)  # lowest-index ties used worker 0 only
    a = [make_policy("least_loaded", router_rng(5)).choose(rr(0, []), view(4)) for _ in range(2)]
    assert a[0] == a[1]  # same seed, same choice


def test_router_rng_does_not_shift_the_run_generator():
    run = np.random.default_rng(11)
    router_rng(11).integers(4, size=100)
    assert run.uniform() == np.random.default_rng(11).uniform()


def test_kv_aware_returns_a_chat_to_the_worker_of_its_previous_turn():
    policy, v = make_policy("kv_aware", np.random.default_rng(0)), view(4)
    first = rr(0, [1, 2, 3], session="chat")
    w = policy.choose(first, v)  # idle workers: any of them
    v.on_routed(w, first)
    v.in_flight[:] = [0, 0, 0, 0]
    v.in_flight[w] = 5  # much busier, still preferred: it holds the history
    assert policy.choose(rr(1, [1, 2, 3, 4, 5], session="chat"), v) == w


def test_kv_aware_sends_a_new_session_to_the_least_loaded_even_if_its_prefix_is_shared():
    policy, v = make_policy("kv_aware", np.random.default_rng(0)), view(2)
    v.on_routed(0, rr(0, [1, 2, 3, 4], session="a"))
    assert policy.choose(rr(1, [1, 2, 3, 4, 99], session="b"), v) == 1


def test_kv_aware_without_sessions_needs_half_the_prompt_matched():
    policy, v = make_policy("kv_aware", np.random.default_rng(0)), view(2)
    v.on_routed(0, rr(0, [1, 2, 3, 4]))
    assert policy.choose(rr(1, [1, 2, 3, 4, 5, 6]), v) == 0  # 4 of 6 blocks matched
    assert policy.choose(rr(2, [1, 7, 8, 9, 10, 11]), v) == 1  # 1 of 6: least loaded


def test_matched_blocks_is_the_longest_prefix_per_worker():
    v = view(3)
    v.on_routed(0, rr(0, [1, 2, 3]))
    v.on_routed(1, rr(1, [1, 2, 9]))
    assert v.matched_blocks([1, 2, 3, 4]) == [3, 2, 0]
    assert v.matched_blocks([5, 2, 3]) == [0, 0, 0]  # no prefix without its first block


def test_router_index_granularity():
    v = RouterView(2, block_size=16, router_block_tokens=32)  # every second block is indexed
    v.on_routed(0, rr(0, [1, 2, 3, 4]))
    assert v.matched_blocks([1, 2, 3, 4, 5]) == [4, 0]
    assert v.matched_blocks([1, 2, 3]) == [2, 0]


def test_prefix_balanced_leaves_an_overloaded_cache_holder():
    policy, v = make_policy("prefix_balanced", np.random.default_rng(0)), view(2)
    v.on_routed(0, rr(0, [1, 2, 3], session="s"))
    v.in_flight[:] = [3, 0]
    assert policy.choose(rr(1, [1, 2, 3, 4], session="s"), v) == 0  # gap 3 <= 4: stay
    v.in_flight[:] = [6, 1]
    assert policy.choose(rr(1, [1, 2, 3, 4], session="s"), v) == 1  # gap 5 > 4 and 6 > 1.5


def test_random_is_seeded():
    a = make_policy("random", np.random.default_rng(7))
    b = make_policy("random", np.random.default_rng(7))
    v = view(4)
    assert [a.choose(rr(i, []), v) for i in range(20)] == [b.choose(rr(i, []), v) for i in range(20)]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid policies: round_robin, least_loaded, kv_aware"):
        make_policy("fastest", np.random.default_rng(0))
    assert list(POLICIES) == ["round_robin", "least_loaded", "kv_aware", "prefix_balanced", "random",
                              "sglang", "dynamo", "llmd", "session_affinity", "power_of_two",
                              "llmd-precise", "llmd-estimated", "llmd-load", "epp"]


def test_no_live_worker_is_an_error():
    v = view(1)
    v.mark_dead(0)
    with pytest.raises(RuntimeError, match="no live worker"):
        make_policy("least_loaded", np.random.default_rng(0)).choose(rr(0, []), v)


@pytest.mark.parametrize("policy", ["least_loaded", "power_of_two", "sglang"])
def test_a_misspelt_load_signal_is_refused_when_the_policy_is_made(policy):
    """``least_loaded:load=queu`` was accepted and failed at its first request, as a kvroute bug."""
    from kvroute.sim.routing import check_spec

    with pytest.raises(ValueError, match=rf"^{policy}: load must be one of in_flight, tokens, running, waiting, "
                                         r"queue, kv_usage; got 'queu'$"):
        make_policy(f"{policy}:load=queu", np.random.default_rng(0))
    with pytest.raises(ValueError, match="got 'queu'"):
        check_spec(f"{policy}:load=queu")
    assert make_policy(f"{policy}:load=queue", np.random.default_rng(0)).load == "queue"


def test_the_routed_index_defaults_to_the_traces_block_so_sglang_keeps_a_chat_on_its_worker():
    """``routed_index_tokens``: the trace's block up to 256 tokens, in whole engine blocks. At a
    fixed 256-token step a seed-chat first turn (986 tokens: 784 shared, the rest the chat's own)
    left its own part out of the index, so its later turns matched only the shared prefix that
    every worker held and SGLang's rule scattered them."""
    from kvroute.sim.cluster.cluster import ClusterSpec, simulate
    from kvroute.sim.routing.view import routed_index_tokens
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.generators import builtin_workload

    assert [routed_index_tokens(t, e) for t, e in ((16, 16), (16, 32), (512, 16), (100, 16), (64, 64))] == [
        16, 32, 256, 96, 64]
    trace = builtin_workload("seed-chat", 128, 6, seed=0)
    whole = {}
    for tokens in (None, 256):
        spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), 8, policy="sglang", router_block_tokens=tokens)
        records = simulate(trace, spec, seed=0).records
        whole[tokens] = int((records.groupby("session_id")["worker"].nunique() == 1).sum())
    assert whole == {None: 106, 256: 35}
