"""A client timeout aborts the request in the engine, as vLLM's API server and engine core do
(``Worker.abort_request``, ``Scheduler.finish_requests``): the abort is taken in at the end of
the step in flight, before its output, and frees the request's blocks there.

The scenario: steps of 10 ms + 1 ms per batched token (``simple_profile``), one worker of 39
usable blocks of 16 tokens, no API-server time. Request 0 (480 prompt tokens, 100 to generate)
is sent at 0; its prefill step ends at 0.49 s, then decode steps of 11 ms end at
0.49 + 0.011 k. Request 1 (160 + 5) is sent at 0.9 s, while request 0 holds 33 blocks, and
cannot be admitted (it needs 11, 6 are free). With a 1 s timeout, request 0 times out at 1.0 s,
in decode step 47 (0.996 to 1.007 s); the engine takes the abort in when that step ends, at
1.007 s, frees request 0's 33 blocks and admits request 1 in the next step (1.007 to 1.177 s).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import Cluster, ClusterSpec, simulate
from kvroute.sim.cluster.metrics import summarize
from kvroute.traces.format import Trace
from tests.sim.cluster.test_cluster import one, simple_profile

TRACE = Trace([one(0, 480, 100, ts=0.0), one(1, 160, 5, ts=900.0)], block_size=16)


def _spec(timeout, **kw):
    return ClusterSpec(simple_profile(num_gpu_blocks=40, api=0.0), num_workers=1, arrival_spread_s=0.0,
                       request_timeout_s=timeout, **kw)


def test_the_timed_out_request_is_aborted_and_its_blocks_freed_at_the_next_step_boundary():
    cluster = Cluster(TRACE, _spec(1.0), seed=0)
    free = {}
    for t in (0.95, 1.0068, 1.0072):  # before the timeout, in step 47, just after it ends
        cluster.env.timeout(t).callbacks.append(
            lambda _e, t=t: free.__setitem__(t, cluster.workers[0].scheduler.pool.num_free_blocks))
    frame = cluster.run().records.set_index("request_id")
    # 0.95 s: request 0 holds ceil((480 + 42) / 16) = 33 blocks; at 1.0068 s still 33 (step 47
    # in flight, its abort waits for the step's end); at 1.0072 s request 1 holds 10 blocks
    assert free == {0.95: 6, 1.0068: 6, 1.0072: 29}
    assert cluster.workers[0].num_aborted == 1
    assert frame.loc[0, "status"] == "failed" and frame.loc[0, "error"].startswith("timed out")
    assert frame.loc[1, "scheduled"] == pytest.approx(1.007, abs=1e-12)
    assert frame.loc[1, "ttft"] == pytest.approx(0.277, abs=1e-12)  # 1.177 - 0.9
    assert frame.loc[1, "e2e"] == pytest.approx(0.321, abs=1e-12)  # + 4 decode steps of 11 ms


def test_the_other_requests_no_longer_wait_for_the_abandoned_one():
    """Before the abort, the engine served request 0 to its end (1.579 s) whether or not its
    client had gone, as the run without a timeout still does: request 1 waited until then."""
    frame = simulate(TRACE, _spec(None), seed=0).records.set_index("request_id")
    assert frame.loc[1, "scheduled"] == pytest.approx(1.579, abs=1e-12)
    assert frame.loc[1, "ttft"] == pytest.approx(0.849, abs=1e-12)
    aborted = simulate(TRACE, _spec(1.0), seed=0).records.set_index("request_id")
    assert frame.loc[1, "ttft"] - aborted.loc[1, "ttft"] == pytest.approx(0.572, abs=1e-12)


def test_an_abort_cuts_a_decode_run_as_stepping_one_at_a_time_does():
    """Request 0 decodes alone (a fast-forwarded run) when its client's timeout fires: the run
    ends at the step in progress and the run's results equal stepping one step at a time."""
    trace = Trace([one(0, 100, 300), one(1, 100, 30), one(2, 50, 20, ts=1200.0)], block_size=16)
    runs = [simulate(trace, ClusterSpec(simple_profile(api=0.0), num_workers=1, arrival_spread_s=0.0,
                                        request_timeout_s=1.0, fast_forward=ff), seed=0) for ff in (False, True)]
    stepped, fast = runs
    assert stepped.records.equals(fast.records)
    assert sorted(stepped.itl) == sorted(fast.itl)
    assert len(stepped.itl) == 29 + 19  # requests 1 and 2, served; request 0's gaps (failed) are left out
    assert stepped.records["status"].tolist() == ["failed", "ok", "ok"]
    assert stepped.workers["num_steps"].tolist() == fast.workers["num_steps"].tolist() == [91]


def test_an_abort_with_async_scheduling_frees_the_blocks_too():
    spec = _spec(1.0)
    profile = replace(spec.profile, engine=replace(spec.profile.engine, async_scheduling=True))
    cluster = Cluster(TRACE, replace(spec, profile=profile), seed=0)
    frame = cluster.run().records.set_index("request_id")
    assert cluster.workers[0].num_aborted == 1
    assert frame["status"].tolist() == ["failed", "ok"]
    assert cluster.workers[0].scheduler.pool.num_free_blocks == 39


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("record_series", [False, True])
def test_the_itl_pools_the_gaps_of_the_served_requests_only(fast_forward, record_series):
    """As the live client counts ITL (``calibrate/validation/replay.py``, ``vllm bench serve``'s
    ``calculate_metrics``): a request that ends failed adds no gaps, even those it streamed
    before its client gave up. Requests 0 (16 prompt tokens, 200 to generate) and 1 (16 + 10)
    are sent at 0 and prefilled in one step (0.042 s); they decode together in steps of 12 ms
    until request 1 has its 10 tokens (9 gaps, at 0.150 s); request 0 decodes alone in steps of
    11 ms until its 1 s timeout (77 more gaps, 86 in all, interleaved with request 1's at first)."""
    trace = Trace([one(0, 16, 200), one(1, 16, 10)], block_size=16)
    spec = ClusterSpec(simple_profile(api=0.0), num_workers=1, arrival_spread_s=0.0, request_timeout_s=1.0,
                       fast_forward=fast_forward, record_series=record_series)
    run = simulate(trace, spec, seed=0)
    assert run.records["status"].tolist() == ["failed", "ok"]
    assert run.itl.tolist() == pytest.approx([0.012] * 9, abs=1e-12)  # request 1's only, not 9 + 86
    summary = summarize(run)
    assert summary["itl_mean_s"] == pytest.approx(0.012, abs=1e-12)
    assert summary["itl_p90_s"] == pytest.approx(0.012, abs=1e-12)
    if record_series:  # the per-token times keep every request's tokens; the ITL is request 1's
        tokens = run.tokens
        assert tokens.groupby("request_id").size().tolist() == [87, 10]
        assert np.diff(tokens.loc[tokens["request_id"] == 1, "time"].to_numpy()).tolist() == run.itl.tolist()


def test_a_timeout_that_never_fires_leaves_the_itl_as_it_was():
    """The gaps keep the order they came in, so the ITL of a run whose requests are all served
    is the run's without a timeout, bit for bit (its mean too)."""
    trace = Trace([one(i, 100 + 16 * i, 20 + 5 * i, ts=3.0 * i) for i in range(12)], block_size=16)
    runs = [simulate(trace, ClusterSpec(simple_profile(api=0.0), num_workers=2, arrival_spread_s=0.0,
                                        request_timeout_s=timeout), seed=0) for timeout in (None, 1e6)]
    assert (runs[1].records["status"] == "ok").all()
    assert runs[0].itl.tobytes() == runs[1].itl.tobytes()
    assert len(runs[0].itl) == sum(19 + 5 * i for i in range(12))
