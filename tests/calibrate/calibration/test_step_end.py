"""KV-event stamps moved to the end of each request's prefill step (issue 33 item 3, row 5 of
docs/reference/vllm-versions.md): synthetic event streams of one server whose steps have known
ends, stamped as vLLM 0.11.0 (at the end of schedule()), 0.32 sync (at the step's end) and an
async server (the previous step's end under load) would stamp them; the corrected times are
checked exactly (every time a sum of powers of two, so the arithmetic is exact)."""

import math
import time

import numpy as np
import pandas as pd
import pytest

from kvroute.calibrate.calibration.engine_split import (apply_post_engine, correct_sweep_stamps, first_gaps,
                                                        post_engine_time)
from kvroute.calibrate.calibration.step_end import (StampCorrection, merge, next_stamps, others_in_flight,
                                                    prefill_step_ends)

nan = math.nan
SCHED = 1 / 1024  # schedule()'s CPU time between one step's update and the next step's model run
OUT = 1 / 128  # step end -> the client reading the token

# One server, five requests. r0 alone; r1 and r2 sent together (r2 just after r1: r1 in flight);
# r4 untimed (no full block) and in flight when r3 is sent. 0.11.0 steps (model run + update):
# r0's [1/16, 1/8]; r1's prefill step a [9/16, 11/16], r2's b [11/16 + SCHED, 13/16], a decode
# step c [13/16 + SCHED, 7/8] that stores no block; the server's next batch after b is r3's at 2.
SEND = [0.0, 0.5, 0.5 + SCHED, 1.9375, 1.9]
FIRST = [0.125 + OUT, 0.6875 + OUT, 0.8125 + OUT, 2.0 + OUT, 1.95]
DONE = [0.125 + OUT, 0.875 + OUT, 0.875 + OUT, 2.0 + OUT, 2.5]
GAP = [nan, 0.8125 - 0.6875, 0.875 - 0.8125, nan, nan]  # the client's first inter-token gaps
STEP_END = [0.125, 0.6875, 0.8125, 2.0, nan]  # when each prefill step really ended (r3's: 2.0 - 1/16 + 1/16)


def test_vllm_0_11_stamps_at_the_step_start_are_moved_by_the_next_batch_the_fitted_step_or_the_first_gap():
    stamps = [0.0625, 0.5625, 0.6875 + SCHED, 2.0, nan]  # the end of schedule() of each prefill step
    batches = [0.0625, 0.5625, 0.6875 + SCHED, 2.0]
    loaded = others_in_flight(["a"] * 5, SEND, DONE)
    assert list(loaded) == [False, False, True, True, False]
    nxt = next_stamps(batches, stamps)
    assert nxt[:3].tolist() == [0.5625, 0.6875 + SCHED, 2.0] and np.isnan(nxt[3:]).all()
    fitted = [0.0625, 0.125, nan, nan, nan]  # the fitted time of each prefill step alone (alone rows only)
    ends, how = prefill_step_ends("step_start", stamps, FIRST, nxt, GAP, loaded, fitted)
    assert list(how) == ["fitted_step", "next_batch", "first_gap", "uncorrected", "untimed"]
    # r0: 1/16 + its fitted step (its next batch, r1's, came after its first token)
    # r1: the next batch, stamped at the end of schedule(b): late by that schedule()'s time
    # r2: no batch before its first token: its first inter-token gap (step c's period, short by b - c)
    # r3: loaded, one token, no batch: left as stamped
    assert ends[:4].tolist() == [0.125, 0.6875 + SCHED, 0.6875 + SCHED + 0.0625, 2.0]
    assert ends[1] - STEP_END[1] == SCHED and STEP_END[2] - ends[2] == 0.0625 - SCHED
    assert math.isnan(ends[4])
    c = StampCorrection.of("step_start", how)
    assert c.to_dict() == {
        "stamp": "step_start",
        "rule": "stamps early for every request moved to the end of the prefill step by the step's duration, "
                "estimated by next_batch, fitted_step, first_gap in that order (kvroute.calibrate.calibration.step_end)",
        "timed": 4, "as_stamped": 0, "num_corrected": 3,
        "corrected": {"next_batch": 1, "fitted_step": 1, "first_gap": 1}, "uncorrected": 1}


def test_vllm_0_32_sync_stamps_at_the_step_end_are_kept():
    stamps = STEP_END  # update_from_output: the step's end
    ends, how = prefill_step_ends("step_end", stamps, FIRST, next_stamps([0.125, 0.6875, 0.8125, 2.0], stamps), GAP,
                                  np.ones(5, dtype=bool), [0.0625] * 5)
    assert ends[:4].tolist() == STEP_END[:4] and math.isnan(ends[4])
    assert list(how) == ["as_stamped"] * 4 + ["untimed"]
    assert StampCorrection.of("step_end", how).text() == (
        "KV-event stamps (step_end): 4 mark the end of the prefill step; none corrected")


def test_async_stamps_are_right_alone_and_one_step_early_under_load():
    # r0 and r1 alone: each batch goes out in update_from_output of its own step. r2, r3, r4 sent
    # while r1 decodes: r2's prefill step b [5/8, 3/4] was scheduled while a ran, so its blocks go
    # out with update_from_output(a) at 5/8; r3's and r4's step c [3/4, 7/8] with update(b) at 3/4,
    # which also carried what step c stored (a block r1 filled); then nothing until 2.
    send = [0.0, 0.5, 0.5625, 0.59375, 0.609375]
    first = [0.125 + OUT, 0.625 + OUT, 0.75 + OUT, 0.875 + OUT, 0.875 + OUT]
    done = [0.125 + OUT, 0.875 + OUT, 0.875 + OUT, 1.0 + OUT, 0.875 + OUT]
    gap = [nan, 0.125, 0.125, 0.125, nan]  # r4: one token
    stamps = [0.125, 0.625, 0.625, 0.75, 0.75]
    batches = [0.125, 0.625, 0.75, 2.0]
    loaded = others_in_flight(["a"] * 5, send, done)
    assert list(loaded) == [False, False, True, True, True]
    ends, how = prefill_step_ends("step_end_alone", stamps, first, next_stamps(batches, stamps), gap, loaded)
    assert list(how) == ["as_stamped", "as_stamped", "next_batch", "first_gap", "uncorrected"]
    assert ends.tolist() == [0.125, 0.625, 0.75, 0.875, 0.75]  # r2 and r3 at their steps' true ends


def test_in_flight_is_per_server_and_needs_both_times():
    # b's request overlaps a's in time but not on its server; a failed request (no finish) counts for no one
    loaded = others_in_flight(["a", "b", "a", "a"], [0.0, 0.5, 1.0, 0.25], [2.0, 3.0, 3.0, nan])
    assert list(loaded) == [False, False, True, False]
    assert list(others_in_flight([0, 0], [0.0, 1.0], [1.0, 2.0])) == [False, True]  # finished as the next was sent


def test_next_stamps_are_strictly_later_batches():
    got = next_stamps([0.5, 0.25, 1.0], [0.25, 0.5, 1.0, nan, 0.0])
    assert got[:2].tolist() == [0.5, 1.0] and got[4] == 0.25
    assert math.isnan(got[2]) and math.isnan(got[3])


def test_merged_corrections_add_their_counts():
    a = StampCorrection("step_start", 3, 0, {"next_batch": 2}, 1)
    b = StampCorrection("step_end_alone", 4, 2, {"next_batch": 1, "first_gap": 1}, 0)
    m = merge([a, None, b])
    assert (m.stamp, m.timed, m.as_stamped, m.corrected, m.uncorrected) == (
        "step_end_alone+step_start", 7, 2, {"next_batch": 3, "first_gap": 1}, 1)
    assert merge([None]) is None


# -- the fit: a sweep's rows -------------------------------------------------------------------


def sweep_rows(stamps, nxt):
    """The five requests above as ``requests.csv`` rows (times after each send): r0 a cold row
    alone, r1 and r2 a burst of two, r3 a cold row, r4 a burst row without a full block."""
    tokens = [[0.125 + OUT], [0.6875 + OUT, 0.8125 + OUT, 0.875 + OUT], [0.8125 + OUT, 0.875 + OUT], [2.0 + OUT],
              [1.95, 2.5]]
    rows = []
    for i, (role, kind) in enumerate([("cold", "cold"), ("burst", "burst"), ("burst", "burst"), ("cold", "cold"),
                                      ("burst", "burst")]):
        s = SEND[i]
        rows.append(dict(url="http://a", exp_id=i if kind == "cold" else 1, kind=kind, role=role,
                         batch=2 if kind == "burst" else 1, prompt_len=64 * (i + 1), prefix_len=0,
                         max_tokens=len(tokens[i]),
                         t_send_s=s, ttft_s=FIRST[i] - s, t_done_s=DONE[i] - s, n_tokens=len(tokens[i]),
                         cached_tokens=0, error=None, token_times=" ".join(f"{t - s:.10f}" for t in tokens[i]),
                         engine_first_token_s=stamps[i] - s, engine_next_batch_s=nxt[i] - s))
    return pd.DataFrame(rows)


def test_a_0_11_sweep_is_corrected_per_row_for_the_front_end_split_and_the_bursts():
    from kvroute.calibrate.calibration.bursts import load_bursts

    stamps = [0.0625, 0.5625, 0.6875 + SCHED, 2.0, nan]
    req = sweep_rows(stamps, next_stamps([0.0625, 0.5625, 0.6875 + SCHED, 2.0], stamps))
    assert first_gaps(req["token_times"])[1:3].tolist() == [0.125, 0.0625]
    rows, how = correct_sweep_stamps(req, "step_start", lambda prompt, cached: 0.0625)
    assert list(how) == ["fitted_step", "next_batch", "first_gap", "uncorrected", "untimed"]
    assert (rows["engine_first_token_s"] + req["t_send_s"])[:4].tolist() == [0.125, 0.6875 + SCHED,
                                                                               0.6875 + SCHED + 0.0625, 2.0]
    assert req["engine_first_token_s"][0] == 0.0625  # the input is left as it was
    # the front-end split reads the corrected alone rows: r0 (1/128 after its step) and r3 (as stamped)
    split = post_engine_time(rows)
    assert (split.num_requests, split.num_alone, split.median_s, split.intercept_s) == (2, 2, OUT, OUT)
    assert post_engine_time(req, "step_start", lambda prompt, cached: 0.0625) == split
    alone = StampCorrection.of("step_start", how[[0, 3]])
    doc = {"overheads": {"api_server_s": 0.02, "api_server_per_token_s": 0.0}}
    apply_post_engine(doc, split, "step_start", alone)
    assert doc["provenance"]["fit"]["post_engine"]["kv_event_stamp_correction"]["corrected"] == {"fitted_step": 1}
    assert doc["provenance"]["fit"]["post_engine"]["kv_event_stamp_correction"]["uncorrected"] == 1
    assert ("vLLM 0.11.0 stamps it when it schedules the step, so the end of that step was estimated per request "
            "(1 by fitted step): the fitted time of that step was added; 1 left as stamped (no estimate)"
            in doc["sources"]["overheads.post_engine_s"])
    # the burst of r1 and r2 (r4 untimed: the burst's engine_first_s is not measured without it)
    (burst,), _ = load_bursts(rows.drop(index=4), pd.DataFrame())
    assert burst.measured["engine_first_s"] == ((0.6875 + SCHED - 0.5) + (0.6875 + 0.0625 - 0.5)) / 2


def test_a_sync_sweep_and_an_old_sweep_without_the_next_batch_are_left_as_they_are():
    req = sweep_rows(STEP_END, [nan] * 5)
    rows, how = correct_sweep_stamps(req, "step_end", lambda prompt, cached: 0.0625)
    pd.testing.assert_series_equal(rows["engine_first_token_s"], req["engine_first_token_s"])
    assert list(how) == ["as_stamped"] * 4 + ["untimed"]
    old = req.drop(columns=["engine_next_batch_s", "token_times"])  # alone rows without the new columns
    rows, how = correct_sweep_stamps(old, "step_start", None)  # and no fitted step: nothing to estimate with
    assert list(how) == ["uncorrected"] * 4 + ["untimed"]
    pd.testing.assert_series_equal(rows["engine_first_token_s"], req["engine_first_token_s"])
    untimed = old.drop(columns=["engine_first_token_s"])  # a sweep without KV events
    rows, how = correct_sweep_stamps(untimed, "step_start")
    assert rows is untimed and how is None


def test_an_async_sweep_moves_the_loaded_rows_only():
    send = [0.0, 0.5, 0.5625, 0.59375, 0.609375]
    first = [0.125 + OUT, 0.625 + OUT, 0.75 + OUT, 0.875 + OUT, 0.875 + OUT]
    done = [0.125 + OUT, 0.875 + OUT, 0.875 + OUT, 1.0 + OUT, 0.875 + OUT]
    stamps, nxt = [0.125, 0.625, 0.625, 0.75, 0.75], [0.625, 0.75, 0.75, 2.0, 2.0]
    tokens = [[first[0]], [first[1], 0.75 + OUT, done[1]], [first[2], done[2]], [first[3], done[3]], [first[4]]]
    req = pd.DataFrame([dict(url="u", role="burst", t_send_s=send[i], ttft_s=first[i] - send[i],
                             t_done_s=done[i] - send[i], prompt_len=64, error=None,
                             token_times=" ".join(f"{t - send[i]:.10f}" for t in tokens[i]),
                             engine_first_token_s=stamps[i] - send[i], engine_next_batch_s=nxt[i] - send[i])
                        for i in range(5)])
    rows, how = correct_sweep_stamps(req, "step_end_alone", lambda prompt, cached: 1.0)  # alone rows: none needed
    assert list(how) == ["as_stamped", "as_stamped", "next_batch", "first_gap", "uncorrected"]
    assert (rows["engine_first_token_s"] + rows["t_send_s"]).tolist() == [0.125, 0.625, 0.75, 0.875, 0.75]


# -- validation: live records ------------------------------------------------------------------


def test_live_records_are_corrected_per_worker_and_counted_in_the_report_entry():
    from kvroute.calibrate.validation.engine_times import stamp_note
    from kvroute.calibrate.validation.live_stamps import correct_live_stamps
    from kvroute.calibrate.validation.validate import PolicyRun
    from kvroute.sim.cluster.metrics import RECORD_COLUMNS, TOKEN_COLUMNS, RunResult

    def row(rid, worker, arrival, first, finish, engine_first, out=2):
        return (rid, rid, 1, worker, arrival, first, finish, first - arrival, finish - arrival, nan, 100, 0, out, 0,
                "ok", None, 0.0, nan, nan, nan, nan, nan, engine_first)

    # worker 0 async (the async case above), worker 1 vLLM 0.11.0: one request alone, its next
    # batch (a decode step storing a block) at the end of its prefill step + SCHED
    records = pd.DataFrame([row(0, 0, 0.0, 0.125 + OUT, 0.125 + OUT, 0.125, 1),
                            row(1, 0, 0.5, 0.625 + OUT, 0.875 + OUT, 0.625, 3),
                            row(2, 0, 0.5625, 0.75 + OUT, 0.875 + OUT, 0.625),
                            row(3, 0, 0.59375, 0.875 + OUT, 1.0 + OUT, 0.75),
                            row(4, 0, 0.609375, 0.875 + OUT, 0.875 + OUT, 0.75, 1),
                            row(5, 1, 0.0, 0.125 + OUT, 0.25 + OUT, 0.0625),
                            row(6, 1, 3.0, 3.5, 3.5, nan, 1)], columns=RECORD_COLUMNS)
    tokens = pd.DataFrame([(3, 1, 0.875 + OUT), (3, 2, 1.0 + OUT)], columns=TOKEN_COLUMNS)  # r3's only
    run = PolicyRun("round_robin", {}, [], live=RunResult(records, np.array([]), pd.DataFrame(), "round_robin", 0,
                                                            tokens=tokens), measured={})
    got = correct_live_stamps(run, [np.array([0.125, 0.625, 0.75, 2.0]), np.array([0.0625, 0.125 + SCHED])],
                              ["step_end_alone", "step_start"])
    eft = run.live.records["engine_first_token"]
    assert eft[:6].tolist() == [0.125, 0.625, 0.75, 0.875, 0.75, 0.125 + SCHED] and math.isnan(eft[6])
    assert got.to_dict()["corrected"] == {"next_batch": 2, "first_gap": 1}
    assert (got.stamp, got.timed, got.as_stamped, got.uncorrected) == ("step_end_alone+step_start", 6, 2, 1)

    class Server:
        vllm_version, async_scheduling = "0.34.0", True

    assert stamp_note([Server()], got) == ("step_end_alone", (
        "1 of the 6 live engine first-token times are about one step early (their servers' KV-event stamps mark "
        "the step before, and neither the server's next batch nor the request's own first inter-token gap dated "
        "that step): for them the measured 'engine' convoy column is short by about one step and 'out' long"))
    assert stamp_note([Server()], StampCorrection("step_end_alone", 6, 2, {"next_batch": 4}, 0)) == (
        "step_end_alone", None)
    assert stamp_note([Server()])[1].startswith("the servers schedule asynchronously")  # no correction: the note
    untimed = PolicyRun("round_robin", {}, [], live=RunResult(records.iloc[6:], np.array([]), pd.DataFrame(),
                                                              "round_robin", 0), measured={})
    assert correct_live_stamps(untimed, [np.zeros(0)] * 2, ["step_start"] * 2) is None


# -- the feed ----------------------------------------------------------------------------------


def test_the_feed_keeps_each_servers_batch_stamps_and_a_row_gets_the_next_one():
    from kvroute.calibrate.calibration.measure import engine_stamps
    from kvroute.calibrate.live.client import StreamResult
    from kvroute.calibrate.live.kv_events import LiveKVEvents
    from tests.calibrate.calibration.test_post_engine import Ctx, stored

    prompt = list(range(100, 110))
    feed = LiveKVEvents(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], block_size=4)
    now_wall, now = time.time(), time.perf_counter()
    feed.apply(1, stored(prompt, [11, 12]), ts=now_wall - 0.008)
    feed.apply(1, [], ts=now_wall - 0.002)  # the next step's batch (its events are not read here)
    feed.apply(1, [], ts=now_wall - 0.005)  # out of order: kept sorted
    feed.apply(0, [], ts=now_wall - 0.001)
    assert feed.batch_stamps(1) == [now_wall - 0.008, now_wall - 0.005, now_wall - 0.002]
    assert feed.next_batch(1, now_wall - 0.008) == now_wall - 0.005 and feed.next_batch(1, now_wall) is None
    first, nxt = engine_stamps(Ctx(feed, worker=1), prompt, StreamResult(t_send=now - 0.010, token_times=[0.009]))
    assert first == pytest.approx(0.002, abs=5e-4) and nxt - first == pytest.approx(0.003, abs=1e-6)
    assert all(math.isnan(x) for x in engine_stamps(Ctx(None), prompt, StreamResult(t_send=now, token_times=[0.1])))


def test_pooled_sweeps_are_on_their_own_clocks():
    # the same URL and times in two pooled sweeps (observations.load_sweeps' sweep column): not in flight together
    req = pd.DataFrame(dict(url=["u", "u"], sweep=[0, 1], t_send_s=[0.0, 0.25], t_done_s=[1.0, 1.0],
                            ttft_s=[0.5, 0.5], engine_first_token_s=[0.25, 0.25], prompt_len=[64, 64],
                            role=["burst", "burst"], error=[None, None]))
    rows, how = correct_sweep_stamps(req, "step_end_alone", lambda prompt, cached: 0.125)
    assert list(how) == ["as_stamped", "as_stamped"]
    rows, how = correct_sweep_stamps(req.drop(columns=["sweep"]), "step_end_alone", lambda prompt, cached: 0.125)
    assert list(how) == ["as_stamped", "uncorrected"] and rows["engine_first_token_s"].tolist() == [0.25, 0.25]
