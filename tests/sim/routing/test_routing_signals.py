"""What the gateway sees, and when: KV-event-fed cache views, scrapes and gateway replicas."""

import bisect
import dataclasses

import pytest

from kvroute.sim.cluster.cluster import Cluster, ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces import generators


def small_profile(blocks=200):
    p = load_profile("a6000-qwen2.5-7b")
    return dataclasses.replace(p, engine=dataclasses.replace(p.engine, num_gpu_blocks=blocks), memory=None)


def trace(chats=8, turns=3):
    return generators.builtin_workload("seed-chat", chats, turns, 0.0, 0)


def watch(cluster):
    """Record every worker's cached hash set after each change, and check the gateway's
    KV-event index after each step against the set as of ``kv_event_delay_s`` ago."""
    delay = cluster.spec.kv_event_delay_s
    history = {w.index: ([-1.0], [frozenset()]) for w in cluster.workers}
    checks = []
    for w in cluster.workers:
        pool = w.scheduler.pool
        inner = pool.kv_event_listener

        def listener(stored, hashes, inner=inner, pool=pool, times=history[w.index][0], sets=history[w.index][1]):
            inner(stored, hashes)
            now = cluster.env.now
            if times[-1] == now:
                sets[-1] = frozenset(pool._cached)
            else:
                times.append(now)
                sets.append(frozenset(pool._cached))

        pool.kv_event_listener = listener
        finish = w._finish_step

        def finish_step(out, now, finish=finish, idx=w.index):
            finish(out, now)
            times, sets = history[idx]
            expected = sets[bisect.bisect_right(times, cluster.env.now - delay) - 1]
            checks.append(cluster.events.cached(idx) == expected)

        w._finish_step = finish_step
    return checks


@pytest.mark.parametrize("delay", [0.0, 0.0123, 0.2])
def test_kv_event_view_equals_the_worker_cache_as_of_the_delay(delay):
    spec = ClusterSpec(small_profile(), num_workers=2, policy="dynamo", cache_view="events",
                       kv_event_delay_s=delay, fast_forward=False)
    cluster = Cluster(trace(), spec, seed=0)
    checks = watch(cluster)
    cluster.run()
    assert sum(w.scheduler.pool.num_evictions for w in cluster.workers) > 0  # evictions were seen
    assert len(checks) > 100 and all(checks)


def test_defaults_keep_todays_view():
    t = trace(16, 3)
    base = simulate(t, ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=4, policy="kv_aware"), 3)
    same = simulate(t, ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=4, policy="kv_aware",
                                   scrape_interval_s=0.0, kv_event_delay_s=0.0, gateways=1), 3)
    assert base.records.equals(same.records)


def test_exact_and_instant_events_route_alike():
    t = trace(16, 4)
    spec = ClusterSpec(small_profile(), num_workers=4, policy="dynamo", cache_view="exact")
    exact = simulate(t, spec, 1)
    events = simulate(t, dataclasses.replace(spec, cache_view="events"), 1)
    assert exact.records["worker"].tolist() == events.records["worker"].tolist()


def hit_rate(result):
    r = result.records
    return r["cached_tokens"].sum() / r["prompt_tokens"].sum()


def test_gateway_replicas_lose_hits_with_local_state_and_recover_them_shared():
    t = trace(32, 6)
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=4, policy="kv_aware")
    one = simulate(t, spec, 0)
    local = simulate(t, dataclasses.replace(spec, gateways=4), 0)
    shared = simulate(t, dataclasses.replace(spec, gateways=4, gateway_state="shared", store_latency_s=0.05), 0)
    # turns of a chat spread over workers: 0.876 -> 0.779 of prompt tokens hit (seed 0)
    assert hit_rate(local) < hit_rate(one) - 0.08
    assert hit_rate(shared) == pytest.approx(hit_rate(one), abs=0.02)
    # the store's 50 ms is paid by every request before it reaches the engine
    assert shared.records["ttft"].median() > one.records["ttft"].median() + 0.04


def test_vllm_metrics_page_parses_into_the_scraped_signals():
    from kvroute.calibrate.live.metrics_scrape import parse_vllm_metrics

    page = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 4096.0
"""
    assert parse_vllm_metrics(page) == (3, 2, 0.25)
    with pytest.raises(ValueError, match="no vllm:num_requests_running"):
        parse_vllm_metrics("up 1\n")


def test_two_engines_sum_their_requests_and_average_their_kv_usage():
    """A fraction stays a fraction (0.6 and 0.7 summed read 1.3); the old gauge name counts only
    without the new one; a timestamp is not the value; a line without a finite value is refused."""
    from kvroute.calibrate.live.metrics_scrape import parse_vllm_metrics

    page = ('vllm:num_requests_running{engine="0"} 3 1700000000000\nvllm:num_requests_running{engine="1"} 4\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engine="1"} 0.75\n'
            'vllm:gpu_cache_usage_perc{engine="0"} 0.5\nvllm:gpu_cache_usage_perc{engine="1"} 0.75\n')
    assert parse_vllm_metrics(page) == (7, 0, 0.625)
    assert parse_vllm_metrics("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5\n") == (1, 0, 0.5)
    for bad in ("vllm:num_requests_running\n", "vllm:num_requests_running +Inf\n"):
        with pytest.raises(ValueError, match="has no (finite )?value"):
            parse_vllm_metrics(bad)


def test_policies_say_whether_they_read_metrics():
    from kvroute.sim.routing import make_policy, router_rng

    assert make_policy("llmd", router_rng(0)).uses_metrics
    assert not make_policy("llmd:queue_weight=0,kv_weight=0", router_rng(0)).uses_metrics
    assert make_policy("least_loaded:load=queue", router_rng(0)).uses_metrics
    assert not make_policy("kv_aware", router_rng(0)).uses_metrics


def test_live_metrics_poll_every_server():
    import asyncio

    from aiohttp import web

    from kvroute.calibrate.live.metrics_scrape import LiveMetrics
    from kvroute.calibrate.live.stream import new_session

    pages = ["vllm:num_requests_running 1\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage_perc 0.5\n",
             "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.125\n"]

    def answer(text):
        async def page(request):
            return web.Response(text=text)
        return page

    async def poll(served):
        runners, urls = [], []
        for w in range(2):
            app = web.Application()
            app.router.add_get("/metrics", answer(served[w]))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}" + "/" * w)  # the second with a slash
        live = LiveMetrics(urls)
        try:
            async with new_session() as session:
                await live.poll_once(session, strict=True)
            return live
        finally:
            for runner in runners:
                await runner.cleanup()

    live = asyncio.run(poll(pages))
    assert live.scrape.current() == [(1, 4, 0.5), (0, 0, 0.125)]
    with pytest.raises(ValueError, match=r"http://127.0.0.1:\d+/: the /metrics page has no vllm:num_requests_running"):
        asyncio.run(poll([pages[0], "up 1\n"]))


class BlockStored:  # the fields of vLLM's event that the translator reads
    def __init__(self, block_hashes, parent_block_hash, token_ids):
        self.block_hashes, self.parent_block_hash, self.token_ids = block_hashes, parent_block_hash, token_ids


class BlockRemoved:
    def __init__(self, block_hashes):
        self.block_hashes = block_hashes


def test_live_kv_events_are_named_by_the_routers_own_hashes():
    from kvroute.calibrate.live.kv_events import LiveKVEvents
    from kvroute.calibrate.live.prompts import chained_block_hashes

    prompt = list(range(100, 228))  # 4 blocks of 32
    ours = chained_block_hashes(prompt, 32)
    live = LiveKVEvents(["tcp://a", "tcp://b"], block_size=32)
    # server 1 stores the first 3 blocks in one event, then the 4th chained to vLLM's hash 13
    live.apply(1, [BlockStored([11, 12, 13], None, prompt[:96])])
    live.apply(1, [BlockStored([14], 13, prompt[96:128])])
    assert live.index.matched_blocks(ours) == [0, 4]
    live.apply(1, [BlockRemoved([12])])
    assert live.index.matched_blocks(ours) == [0, 1]
    live.apply(0, [BlockStored([99], 77, prompt[32:64])])  # parent never seen: cannot be named
    assert live.translators[0].num_unnamed == 1 and live.index.cached(0) == set()


def test_live_kv_events_time_the_batch_that_stored_each_block():
    from kvroute.calibrate.live.kv_events import LiveKVEvents
    from kvroute.calibrate.live.prompts import chained_block_hashes

    prompt = list(range(100, 228))  # 4 blocks of 32
    ours = chained_block_hashes(prompt, 32)
    live = LiveKVEvents(["tcp://a"], block_size=32)
    live.apply(0, [BlockStored([11, 12], None, prompt[:64])], ts=100.25)
    live.apply(0, [BlockStored([13, 14], 12, prompt[64:128])], ts=100.5)
    assert [live.stored_at(0, h) for h in ours] == [100.25, 100.25, 100.5, 100.5]
    live.apply(0, [BlockRemoved([14])], ts=101.0)
    live.apply(0, [BlockStored([14], 13, prompt[96:128])], ts=102.0)  # stored again: the later batch
    assert live.stored_at(0, ours[3]) == 102.0
    live.apply(0, [BlockStored([15], None, prompt[:32])])  # an untimed batch leaves the times alone
    assert live.stored_at(0, ours[0]) == 100.25 and live.stored_at(0, 12345) is None
