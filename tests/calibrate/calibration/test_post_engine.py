"""The unloaded front end split at the engine's step: measured (KV-event step times in the
sweep's rows), fitted (``overheads.post_engine_s``) and simulated (every token delayed by it)."""

import math
import time

import pandas as pd
import pytest

from kvroute.calibrate.calibration.engine_split import apply_post_engine, post_engine_time
from kvroute.calibrate.calibration.measure import engine_first_token
from kvroute.calibrate.calibration.sweep_files import REQUEST_COLUMNS, RowWriter
from kvroute.calibrate.live.prompts import chained_block_hashes
from kvroute.calibrate.live.client import CalibrationError, StreamResult
from kvroute.calibrate.live.kv_events import LiveKVEvents
from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import profile_from_dict
from kvroute.traces.format import Trace, TraceRecord
from tests.sim.timing.test_frontend import profile as frontend_profile


def profile(api, post=None, frontend=None, per_token=None):
    """test_frontend's profile (steps 10 ms + 1 ms per batched token, ``api`` s before the engine,
    no jitter) with ``post`` s + ``per_token`` s per prompt token after the engine."""
    doc = frontend_profile(api, frontend).raw
    if post is not None:
        doc["overheads"]["post_engine_s"] = post
    if per_token is not None:
        doc["overheads"]["post_engine_per_token_s"] = per_token
    return profile_from_dict(doc)


def rec(rid, length, out, t=0.0):
    return TraceRecord(rid, t, length, out, tuple(range(rid * 1000, rid * 1000 + -(-length // 16))))


def run(prof, records, series=False):
    """The run's records, or with ``series`` the run (its ``tokens`` then kept)."""
    spec = ClusterSpec(prof, num_workers=1, arrival_spread_s=0.0, record_series=series)
    res = simulate(Trace(records, block_size=16), spec, seed=0)
    return res if series else res.records


# -- simulated ---------------------------------------------------------------------------------


def test_a_lone_request_is_predicted_as_before_with_its_tokens_later_than_its_steps():
    # prefill step 10 + 100 ms, two decode steps of 11 ms; 20 ms front end, 5 ms of it after the engine
    before = run(profile(0.020), [rec(0, 100, 3)]).iloc[0]
    after = run(profile(0.015, post=0.005), [rec(0, 100, 3)]).iloc[0]
    assert before["ttft"] == pytest.approx(0.130) and after["ttft"] == pytest.approx(0.130)
    assert before["engine_first_token"] == pytest.approx(0.130)
    assert after["engine_first_token"] == pytest.approx(0.125)
    assert after["e2e"] == pytest.approx(0.152) and after["tpot"] == pytest.approx(0.011)


def test_every_token_is_delayed_by_the_same_time():
    records = [rec(0, 100, 6), rec(1, 40, 4, t=50.0)]  # the second joins the first's decodes
    plain = run(profile(0.0), records, series=True)
    late = run(profile(0.0, post=0.004), records, series=True)
    assert len(late.tokens) == 10
    assert list(late.tokens["time"]) == pytest.approx(list(plain.tokens["time"] + 0.004))
    assert list(late.records["finish"] - plain.records["finish"]) == pytest.approx([0.004, 0.004])
    assert list(late.records["engine_first_token"]) == list(plain.records["engine_first_token"])
    assert list(late.records["tpot"]) == pytest.approx(list(plain.records["tpot"]))


def test_a_burst_reaches_the_engine_sooner_when_part_of_the_front_end_follows_it():
    # two 100-token prompts at once; before: both reach the engine at 20 ms and share one step
    # (10 + 200 ms); with 15 ms of the 20 after the engine, they reach it at 5 ms: same step,
    # 15 ms earlier, and the client sees their tokens at the same time as before.
    both = [rec(0, 100, 1), rec(1, 100, 1)]
    before = run(profile(0.020), both)
    after = run(profile(0.005, post=0.015), both)
    assert list(before["engine_first_token"]) == pytest.approx([0.230, 0.230])
    assert list(after["engine_first_token"]) == pytest.approx([0.215, 0.215])
    assert list(after["ttft"]) == pytest.approx(list(before["ttft"]))


def test_with_a_frontend_the_lanes_work_on_a_lone_token_is_part_of_the_measured_time():
    fe = {"per_step_s": 0.0005, "per_output_token_s": 0.0005}
    row = run(profile(0.015, post=0.005, frontend=fe), [rec(0, 100, 1)]).iloc[0]
    assert row["ttft"] == pytest.approx(0.130)  # 15 + 110 + (1 ms lane + 4 ms delay)
    small = profile(0.0, post=0.0005, frontend=fe)
    assert small.overheads.post_engine_delay_s(small.frontend, 100) == 0.0


def test_with_a_frontend_it_is_lane_work_on_the_first_output_queued_and_stretched_like_any():
    # two 100-token prompts at once share one 210 ms step; each first output then holds the one
    # API lane 5 ms, so the second reaches the client 5 ms after the first; later tokens pay none
    fe = {"per_step_s": 0.0, "per_output_token_s": 0.0}
    rows = run(profile(0.0, post=0.005, frontend=fe), [rec(0, 100, 2), rec(1, 100, 2)])
    assert list(rows["engine_first_token"]) == pytest.approx([0.210, 0.210])
    assert list(rows["first_token"]) == pytest.approx([0.215, 0.220])
    assert list(rows["finish"]) == pytest.approx([0.222, 0.222])  # the decode step: 10 + 2 ms
    # beside a busy engine on its core (api_contention 1), the first output's work takes twice as long
    host = {"cores": 1, "api_on_engine_core": True, "api_contention": 1.0}
    doc = {**profile(0.0, post=0.005, frontend=fe).raw, "host": host}
    row = run(profile_from_dict(doc), [rec(0, 100, 3)]).iloc[0]
    assert row["first_token"] - row["engine_first_token"] == pytest.approx(0.010)


def test_the_delay_grows_with_the_prompt():
    # 1 ms + 10 us per prompt token after the engine: 2 ms for 100 tokens, 5 ms for 400
    prof = profile(0.0, post=0.001, per_token=1e-5)
    rows = run(prof, [rec(0, 100, 2), rec(1, 400, 2, t=10_000.0)])  # the second 10 s later, alone
    assert list(rows["first_token"] - rows["engine_first_token"]) == pytest.approx([0.002, 0.005])
    assert list(rows["tpot"]) == pytest.approx([0.011, 0.011])  # one decode step of 10 + 1 ms, delayed alike


def test_a_profile_without_the_field_predicts_exactly_as_before():
    records = [rec(i, 50 + 7 * i, 3 + i % 4, t=0.01 * i) for i in range(20)]
    a, b = run(profile(0.02), records), run(profile(0.02, post=0.0), records)
    pd.testing.assert_frame_equal(a, b)


# -- fitted ------------------------------------------------------------------------------------


def requests_frame(rows):
    return pd.DataFrame(rows, columns=["role", "error", "prompt_len", "ttft_s", "engine_first_token_s"])


def test_post_engine_time_is_a_line_in_prompt_length_over_requests_alone_timed_in_the_engine():
    # 2 ms + 1 us per prompt token after the engine
    req = requests_frame([
        ("cold", None, 100, 0.0200, 0.0179),
        ("warm", None, 1100, 0.0300, 0.0269),
        ("cached", None, 2100, 0.0120, 0.0079),
        ("context", None, 3100, 0.0400, 0.0349),
        ("cold", None, 500, 0.020, math.nan),   # not timed: counted alone, not in the line
        ("burst", None, 100, 0.500, 0.100),     # under load: not read
        ("cold", "HTTP 500", 100, 0.0, 0.0),    # failed
    ])
    split = post_engine_time(req)
    assert (split.intercept_s, split.per_token_s) == pytest.approx((0.002, 1e-6))
    assert (split.median_s, split.q25_s, split.q75_s) == pytest.approx((0.0036, 0.00285, 0.00435))
    assert (split.num_requests, split.num_alone) == (4, 5)


def test_no_engine_times_no_split():
    assert post_engine_time(pd.DataFrame({"role": ["cold"], "error": [None], "prompt_len": [10],
                                          "ttft_s": [0.01]})) is None
    assert post_engine_time(requests_frame([("cold", None, 10, 0.01, math.nan)])) is None


def line(a, b):
    return post_engine_time(requests_frame([("cold", None, n, a + b * n + 0.01, 0.01) for n in (100, 200, 300)]))


def test_the_split_moves_its_line_out_of_the_api_server_line():
    doc = {"overheads": {"api_server_s": 0.009, "api_server_per_token_s": 3e-6}}
    apply_post_engine(doc, line(0.006, 1e-6))
    assert doc["overheads"] == pytest.approx({"api_server_s": 0.003, "api_server_per_token_s": 2e-6,
                                              "post_engine_s": 0.006, "post_engine_per_token_s": 1e-6})
    assert "cut" not in doc["provenance"]["fit"]["post_engine"]
    small = {"overheads": {"api_server_s": 0.002, "api_server_per_token_s": 0.0}}
    apply_post_engine(small, line(0.006, 1e-6))
    assert small["overheads"] == {"api_server_s": 0.0, "api_server_per_token_s": 0.0, "post_engine_s": 0.002,
                                  "post_engine_per_token_s": 0.0}
    assert small["provenance"]["fit"]["post_engine"]["cut"] == {
        "post_engine_s": "cut to what api_server_s held",
        "post_engine_per_token_s": "cut to what api_server_per_token_s held"}


# -- measured ----------------------------------------------------------------------------------


class BlockStored:  # the fields of vllm.distributed.kv_events.BlockStored the feed reads
    def __init__(self, block_hashes, parent_block_hash, token_ids):
        self.block_hashes, self.parent_block_hash, self.token_ids = block_hashes, parent_block_hash, token_ids


class Info:
    block_size = 4


class Ctx:
    def __init__(self, events, worker=0):
        self.info, self.events, self.worker = Info(), events, worker


def stored(prompt, vllm_hashes):
    """One BlockStored event per full block of ``prompt``, chained by ``vllm_hashes``."""
    return [BlockStored([h], vllm_hashes[i - 1] if i else None, prompt[4 * i: 4 * i + 4])
            for i, h in enumerate(vllm_hashes)]


def test_a_row_is_timed_by_the_batch_that_stored_its_last_full_block():
    prompt = list(range(100, 110))  # two full blocks and two tokens
    feed = LiveKVEvents(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], block_size=4)
    now_wall, now = time.time(), time.perf_counter()
    feed.apply(1, stored(prompt, [11, 12])[:1], ts=now_wall - 0.008)  # the first block, in an earlier step
    feed.apply(1, stored(prompt, [11, 12])[1:], ts=now_wall - 0.004)
    assert feed.stored_at(1, chained_block_hashes(prompt, 4)[-1]) == now_wall - 0.004
    res = StreamResult(t_send=now - 0.010, token_times=[0.009])
    assert engine_first_token(Ctx(feed, worker=1), prompt, res) == pytest.approx(0.006, abs=5e-4)
    assert math.isnan(engine_first_token(Ctx(feed, worker=0), prompt, res))  # the other server stored nothing
    assert math.isnan(engine_first_token(Ctx(None, worker=1), prompt, res))  # no feed
    assert math.isnan(engine_first_token(Ctx(feed, worker=1), prompt[:3], res))  # no full block
    late = StreamResult(t_send=now - 0.010, token_times=[0.005])  # stored after the first token: not this request's
    assert math.isnan(engine_first_token(Ctx(feed, worker=1), prompt, late))
    early = StreamResult(t_send=now - 0.001, token_times=[0.0005])  # stored before the send: a cache hit
    assert math.isnan(engine_first_token(Ctx(feed, worker=1), prompt, early))


def test_rows_are_not_appended_under_another_header(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text(",".join(REQUEST_COLUMNS[:-1]) + "\n")
    with pytest.raises(CalibrationError, match=r"requests.csv:1: its columns differ from this version's "
                                               r"\(24 against 25: engine_next_batch_s\)"):
        RowWriter(path, REQUEST_COLUMNS)
    RowWriter(tmp_path / "new.csv", REQUEST_COLUMNS).close()
    RowWriter(tmp_path / "new.csv", REQUEST_COLUMNS).close()
    assert (tmp_path / "new.csv").read_text().count("\n") == 1


def test_the_fit_writes_the_engine_admission_capped_at_the_api_server_term():
    """calibrate fit writes overheads.engine_admission_s / _per_token_s from its overhead split,
    each at most the API-server term it is part of (a fit whose API-server line came out at 0 on
    the 0.11 stub wrote an admission the profile loader refuses)."""
    from kvroute.calibrate.calibration.fit import _admission

    parts = {"engine_admission_s": 0.00210839, "engine_admission_per_token_s": 3.96076e-07}
    assert _admission(parts, 0.0058688, 1.2468e-06) == parts
    assert _admission(parts, 0.0, 1.2468e-06) == {"engine_admission_s": 0.0, "engine_admission_per_token_s": 3.96076e-07}
    assert _admission({"engine_admission_s": 0.000164075, "engine_admission_per_token_s": 0.0}, 0.0, 0.0) == {}
    assert _admission({"fitted_intercept_s": 0.004}, 0.004, 0.0) == {}  # a fit that did not split the overhead
    capped = _admission({"engine_admission_s": 0.0012345678, "engine_admission_per_token_s": 0.0}, 0.0012345678, 0.0)
    assert capped["engine_admission_s"] <= 0.0012345678  # six digits would round it up past the cap: kept as is


def test_the_admission_is_capped_again_after_the_front_end_split():
    """The front-end split moves the part after the engine out of the API-server terms; the
    admission written before it is capped at what is left (the 0.11 stub's fit wrote 0.78 us per
    token against 0.30 us left), and dropped when nothing is left of either."""
    from kvroute.calibrate.calibration.fit import cap_admission

    o = {"api_server_s": 0.004, "api_server_per_token_s": 3.03906e-07,
         "engine_admission_s": 0.002, "engine_admission_per_token_s": 7.79775e-07}
    cap_admission(o)
    assert (o["engine_admission_s"], o["engine_admission_per_token_s"]) == (0.002, 3.03906e-07)
    o = {"api_server_s": 0.0, "api_server_per_token_s": 0.0, "engine_admission_s": 0.001,
         "engine_admission_per_token_s": 1e-07}
    cap_admission(o)
    assert o == {"api_server_s": 0.0, "api_server_per_token_s": 0.0}


def _sweep_whose_split_empties_the_api_per_token_term(run):
    """test_calibrate's synthetic sweep (API server 5 ms + 1 us per prompt token) written to
    ``run``, with what ``calibrate fit`` needs to split the front end and fit bursts: the engine's
    admission (0.1 ms + 4.05e-14 s per prompt token, the CI run's figure) in its prefill times,
    KV-event first-token times 2 ms + 2 us per prompt token before the client's first token (more
    per token than the API line holds), and test_bursts' bursts of 2 requests on one and on both
    servers (one 256-token shape)."""
    import json

    from kvroute.calibrate.calibration.bursts import simulate_burst
    from tests.calibrate.calibration.test_bursts import _bursts, base_profile
    from tests.calibrate.calibration.test_calibrate import _info, _write_synthetic_run

    _write_synthetic_run(run)
    req = pd.read_csv(run / "requests.csv")
    alone = req["role"].isin(["cold", "cached"])
    length = req.loc[alone, "prompt_len"].astype(float)
    req.loc[alone, "engine_prefill_s"] += 1e-4 + 4.05e-14 * length
    req.loc[alone, "engine_first_token_s"] = req.loc[alone, "ttft_s"] - (2e-3 + 2e-6 * length)
    req["url"], req["error"] = "http://s:1", None
    bursts, first = [], int(req["exp_id"].max()) + 1
    for k, b in enumerate(_bursts(base_profile(), sizes=(2,), shapes=((256, 4),))):
        res = simulate_burst(b, base_profile())  # every request alike: the burst's mean figures
        ttft, tpot = res["ttft_mean_s"], res["tpot_mean_s"]
        bursts += [dict(url=f"http://s{i % b.num_servers}", exp_id=first + k, kind=b.kind, role="burst", batch=b.batch,
                        prompt_len=b.prompt_len, prefix_len=0, max_tokens=b.max_tokens, t_send_s=t, ttft_s=ttft,
                        t_done_s=ttft + 3 * tpot, n_tokens=b.max_tokens, error=None,
                        token_times=" ".join(f"{ttft + j * tpot:.6f}" for j in range(b.max_tokens)))
                   for i, t in enumerate(b.send_s)]
    pd.concat([req, pd.DataFrame(bursts)], ignore_index=True).to_csv(run / "requests.csv", index=False)
    meta = json.loads((run / "meta.json").read_text())
    meta.update(servers=[_info(async_scheduling=False).to_dict()], urls=["http://s:1", "http://s:2"],
                client_host={"cores": 2})  # async scheduling off: the KV-event stamps mark the step's end
    (run / "meta.json").write_text(json.dumps(meta))


def test_the_fit_caps_the_admission_after_the_front_end_split_and_before_the_bursts_fit(tmp_path):
    """calibrate fit on a sweep whose front-end split empties the API server's per-token term
    (2 us per token after the engine, 1 us in the API line) while the admission's per-token term
    comes out at 4.05e-14 s: the admission is capped at the 0.0 left before the bursts' fit loads
    the document as a profile, which refuses an admission above its API term (a live CI run failed
    so when the cap ran after the bursts' fit)."""
    import json

    from click.testing import CliRunner

    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.profile import load_profile

    _sweep_whose_split_empties_the_api_per_token_term(tmp_path / "run")
    out = tmp_path / "p.json"
    result = CliRunner().invoke(calibrate, ["fit", str(tmp_path / "run"), "--out", str(out), "--loss", "linear",
                                            "--bootstrap", "0", "--folds", "0", "--client-busy", "0"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["provenance"]["fit"]["overhead_parts"]["engine_admission_per_token_s"] == 4.05e-14  # as fitted
    assert doc["provenance"]["fit"]["post_engine"]["cut"] == {
        "post_engine_per_token_s": "cut to what api_server_per_token_s held"}
    prof = load_profile(out)
    assert prof.frontend is not None and "bursts" in doc["provenance"]["fit"]  # the bursts' fit ran
    o = prof.overheads
    assert (o.api_server_s, o.api_server_per_token_s, o.post_engine_s, o.post_engine_per_token_s) == (
        0.003, 0.0, 0.002, 1e-06)
    assert (o.engine_admission_s, o.engine_admission_per_token_s) == (0.0001, 0.0)  # capped at the API term
