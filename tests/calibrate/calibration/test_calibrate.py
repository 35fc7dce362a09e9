"""Calibration without a real server: the fit on synthetic measurements with known coefficients,
the step derivation against the simulator's scheduler, Prometheus parsing, the sweep plan, and
the sweep's bad-input messages against a small fake vLLM server."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvroute.calibrate.live.client import CalibrationError, MetricsSnapshot, ServerInfo, StreamResult, parse_prometheus
from kvroute.calibrate.calibration.fit import fit, lognormal_cv, profile_document, split_holdout
from kvroute.calibrate.calibration.measure import run_sweep
from kvroute.calibrate.calibration.prompt_factory import PromptFactory
from kvroute.calibrate.calibration.sweep_plan import SweepPlan
from kvroute.calibrate.calibration.observations import Observation, build_observations, engine_config, load_sweep
from kvroute.calibrate.calibration.steps import (COEFFICIENTS, decode_context, decode_step, expected_cached_tokens,
                                                 mixed_steps, predict, prefill_steps)
from kvroute.sim.engine.config import EngineConfig
from kvroute.sim.engine.scheduler_output import prefill_pairs
from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.profile import profile_from_dict
from kvroute.sim.engine.request import Request
from kvroute.sim.engine.scheduler import Scheduler

ENGINE = EngineConfig(block_size=32, num_gpu_blocks=65536, max_num_batched_tokens=2048, max_num_seqs=128,
                      max_model_len=32768)
#: Known coefficients with a binding weight floor (steps under 200 tokens sit on it).
TRUE = StepCost(step_overhead_s=1.5e-3, weight_load_s=2.0e-3, per_token_s=1.0e-5, per_request_s=2.0e-5,
                prefill_attn_s=6.0e-9, decode_attn_s=2.0e-8)
API_S, API_PER_TOKEN_S = 5e-3, 1e-6


# --------------------------------------------------------------------------------------------
# synthetic measurements
# --------------------------------------------------------------------------------------------


def _synthetic(noise: float, seed: int = 0) -> list[Observation]:
    """Observations of the full sweep's shapes, timed by TRUE (+ API time for TTFT), times a
    lognormal factor of CV ``noise``."""
    rng = np.random.default_rng(seed)
    f = (lambda: float(rng.lognormal(0, noise))) if noise else (lambda: 1.0)
    plan = SweepPlan()
    obs, e = [], 0
    for rep in range(2):
        for L in plan.cold_lengths:
            st = tuple(prefill_steps(ENGINE, L, 0))
            eng = predict(list(st), TRUE) * f()
            over = (API_S + API_PER_TOKEN_S * L) * f()
            obs.append(Observation(e, "cold", eng + over, st, eng, over, dict(prompt_len=L, prefix_len=0)))
            e += 1
        for P in plan.cached_prefixes:
            for N in plan.cached_new:
                st = tuple(prefill_steps(ENGINE, P + N, P))
                eng = predict(list(st), TRUE) * f()
                over = (API_S + API_PER_TOKEN_S * (P + N)) * f()
                obs.append(Observation(e, "cached", eng + over, st, eng, over, dict(prompt_len=P + N, prefix_len=P)))
                e += 1
        for L in plan.decode_contexts:
            for B in plan.decode_batches:
                st = (decode_step(B, B * decode_context(L, 32)),)
                t = predict(list(st), TRUE) * f()
                obs.append(Observation(e, "decode", t, st, t, math.nan, dict(batch=B, context_len=L)))
                e += 1
        for B in plan.mixed_batches:
            for P in plan.mixed_prefills:
                st = tuple(mixed_steps(ENGINE, B, 1024, 992, 10, P))
                t = predict(list(st), TRUE) * f()
                obs.append(Observation(e, "mixed", t, st, t, math.nan, dict(batch=B, context_len=1024, prefill_len=P)))
                e += 1
    return obs


@pytest.mark.parametrize("overhead", ["fit", "metrics"])
def test_fit_recovers_exact_coefficients_without_noise(overhead):
    res = fit(_synthetic(0.0), holdout=0.25, seed=1, overhead=overhead, loss="linear")
    for k in COEFFICIENTS:
        assert getattr(res.cost, k) == pytest.approx(getattr(TRUE, k), rel=1e-4), k
    assert res.api_server_s == pytest.approx(API_S, rel=1e-3)
    assert res.api_server_per_token_s == pytest.approx(API_PER_TOKEN_S, rel=1e-3)
    assert res.quality["heldout"]["ttft"].median_ape < 1e-6
    assert res.quality["heldout"]["itl"].median_ape < 1e-6


@pytest.mark.parametrize("loss", ["linear", "soft_l1"])
def test_fit_recovers_coefficients_within_tolerance_under_noise(loss):
    """Stated tolerance with 3% lognormal noise on every time: the big terms within 10%, the
    small per-request terms within 35%; held-out median error below 4%."""
    res = fit(_synthetic(0.03, seed=2), holdout=0.25, seed=0, overhead="fit", loss=loss)
    for k in ("step_overhead_s", "weight_load_s", "per_token_s", "prefill_attn_s", "decode_attn_s"):
        assert getattr(res.cost, k) == pytest.approx(getattr(TRUE, k), rel=0.10), k
    assert res.cost.per_request_s == pytest.approx(TRUE.per_request_s, rel=0.35)
    assert res.api_server_s == pytest.approx(API_S, rel=0.10)
    assert res.api_server_per_token_s == pytest.approx(API_PER_TOKEN_S, rel=0.35)
    assert res.quality["heldout"]["ttft"].median_ape < 0.04
    assert res.quality["heldout"]["itl"].median_ape < 0.04
    assert res.quality["heldout"]["ttft"].n > 0 and res.quality["heldout"]["itl"].n > 0


def test_lognormal_cv_from_the_interquartile_range_of_the_logs():
    # logs -1, -0.5, 0, 0.5, 1: quartiles -0.5 and 0.5, so sigma = 1 / 1.349
    ratios = np.exp([-1.0, -0.5, 0.0, 0.5, 1.0])
    assert lognormal_cv(ratios) == pytest.approx(math.sqrt(math.expm1((1 / 1.349) ** 2)), rel=1e-12)
    assert lognormal_cv(np.array([1.0])) == 0.0
    assert lognormal_cv(np.array([0.0, -1.0, 2.0])) == 0.0  # one positive ratio left


def test_lognormal_cv_ignores_rare_stalls_that_inflate_the_standard_deviation():
    from scipy.stats import norm

    logs = 0.3 * norm.ppf((np.arange(1000) + 0.5) / 1000)
    bulk = np.exp(logs)
    assert lognormal_cv(bulk) == pytest.approx(math.sqrt(math.expm1(0.09)), rel=0.01)
    stalled = bulk.copy()
    stalled[::20] *= 30.0  # 5 % of requests wait 30x longer behind another process
    assert np.std(stalled) > 4 * np.std(bulk)
    assert lognormal_cv(stalled) == pytest.approx(lognormal_cv(bulk), rel=0.15)


@pytest.mark.parametrize("noise", [0.03, 0.2])
def test_fit_recovers_the_overhead_spread(noise):
    res = fit(_synthetic(noise, seed=2), holdout=0.25, seed=0, overhead="fit", loss="linear")
    assert res.jitter_cv == pytest.approx(noise, rel=0.25)


def test_fit_needs_both_kinds():
    obs = [o for o in _synthetic(0.0) if o.kind == "cold"]
    with pytest.raises(ValueError, match="TTFT and ITL"):
        fit(obs)


def test_holdout_split_is_seeded_stratified_and_keeps_experiments_together():
    obs = _synthetic(0.0)
    a, b = split_holdout(obs, 0.25, 7), split_holdout(obs, 0.25, 7)
    assert (a == b).all()
    for kind in ("cold", "cached", "decode", "mixed"):
        assert a[[o.kind == kind for o in obs]].any()
    with pytest.raises(ValueError):
        split_holdout(obs, 1.0, 0)


def test_profile_document_is_a_valid_profile():
    res = fit(_synthetic(0.01), seed=0)
    info = ServerInfo(url="http://x:1", model="m", model_root="/m", served_models=("m",), vllm_version="0.32.0",
                      max_model_len=32768, block_size=32, num_gpu_blocks=65536, enable_prefix_caching=True,
                      max_num_batched_tokens=2048, max_num_seqs=128, hardware="CPU test", device="cpu")
    doc = profile_document(res, info, {"started": "2026-11-29T00:00:00+00:00", "urls": ["http://x:1"]}, "t")
    prof = profile_from_dict(json.loads(json.dumps(doc)))
    assert prof.engine.block_size == 32 and prof.engine.max_num_seqs == 128
    assert prof.step_cost == res.cost
    assert doc["provenance"]["kind"] == "measured" and doc["provenance"]["date"] == "2026-11-29"
    assert doc["provenance"]["fit"]["heldout"]["ttft"]["median_ape"] is not None
    assert "async_cpu_fraction" not in doc["engine"] and prof.async_cpu_fraction == 1.0  # sync: stated
    # servers that scheduled asynchronously: their steps have the overlap in them, nothing left to hide
    doc = profile_document(res, replace(info, async_scheduling=True), {"urls": ["http://x:1"]}, "t")
    assert doc["engine"]["async_cpu_fraction"] == 0.0
    assert profile_from_dict(json.loads(json.dumps(doc))).async_cpu_fraction == 0.0
    # the note names the folds the fit used (it said 4-fold whatever --folds was), and none without them
    assert "crossval: 4-fold cross validation" in doc["provenance"]["fit"]["note"]
    for folds, text in ((6, "crossval: 6-fold cross validation"), (0, None)):
        note = profile_document(fit(_synthetic(0.01), seed=0, folds=folds), info, {}, "t")["provenance"]["fit"]["note"]
        assert (text in note) if text else ("crossval" not in note)


# --------------------------------------------------------------------------------------------
# steps against the simulator's scheduler
# --------------------------------------------------------------------------------------------


def test_cold_prefill_is_chunked_by_the_token_budget():
    st = prefill_steps(ENGINE, 5000, 0)
    assert [s.tokens for s in st] == [2048, 2048, 904]
    assert st[1].pairs == pytest.approx(prefill_pairs(2048, 2048))
    assert all(s.reqs == 1 and s.ctx == 0 for s in st)


def test_cached_prefix_computes_only_the_new_tokens():
    (s,) = prefill_steps(ENGINE, 2048 + 100, 2048)
    assert s.tokens == 100 and s.pairs == pytest.approx(prefill_pairs(2048, 100))
    (s,) = prefill_steps(ENGINE, 2048, 2048)  # fully cached, block-aligned: last block recomputed
    assert s.tokens == 32
    assert expected_cached_tokens(ENGINE, 2048, 2048) == 2016
    assert expected_cached_tokens(ENGINE, 2148, 2048) == 2048


def test_decode_step_matches_the_scheduler():
    sched = Scheduler(ENGINE)
    reqs = [Request(i, 100 + 7 * i, 20, list(range(1000 * i, 1000 * i + 4))) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    for _ in range(6):
        out = sched.schedule()
        sched.update(out)
    out = sched.schedule()
    outputs = reqs[0].num_output_tokens
    want = decode_step(5, sum(decode_context(r.num_prompt_tokens, outputs) for r in reqs))
    assert (out.num_batched_tokens, out.num_reqs, out.prefill_token_pairs, out.decode_context_tokens) == (
        want.tokens, want.reqs, want.pairs, want.ctx)


def test_mixed_step_holds_decodes_and_the_new_prompt():
    (s,) = mixed_steps(ENGINE, 4, 1024, 992, 10, 512)
    assert s.tokens == 4 + 512 and s.reqs == 5
    assert s.ctx == 4 * (1024 + 10)
    assert s.pairs == pytest.approx(prefill_pairs(0, 512))
    assert len(mixed_steps(ENGINE, 4, 1024, 992, 10, 4000)) == 2  # 2044 + 1956 tokens


# --------------------------------------------------------------------------------------------
# client pieces, prompts, plan
# --------------------------------------------------------------------------------------------

METRICS_TEXT = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",num_gpu_blocks="65536"} 1.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 2.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 32.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09
"""


def test_prometheus_parsing_sums_engines_and_keeps_info_labels():
    samples = parse_prometheus(METRICS_TEXT)
    assert ("vllm:request_prefill_time_seconds_sum", {"engine": "0", "model_name": "m"}, 0.5) in samples
    snap = MetricsSnapshot.from_text(METRICS_TEXT)
    assert snap.get("vllm:prefix_cache_hits_total") == 96.0
    assert snap.info["vllm:cache_config_info"]["num_gpu_blocks"] == "65536"
    later = MetricsSnapshot.from_text(METRICS_TEXT.replace("} 0.5", "} 0.75").replace("} 3.0", "} 4.0"))
    assert later.delta(snap, "vllm:request_prefill_time_seconds_sum") == pytest.approx(0.25)
    assert math.isnan(snap.get("vllm:absent"))


def test_prompt_factory_is_seeded_unique_and_in_range():
    a = PromptFactory(np.random.default_rng(3), 100, 200)
    b = PromptFactory(np.random.default_rng(3), 100, 200)
    pa = [a.unique(64) for _ in range(50)]
    assert pa == [b.unique(64) for _ in range(50)]
    assert len({tuple(p[:32]) for p in pa}) == 50  # no two share a first block
    assert all(100 <= t < 200 for p in pa for t in p)
    assert len(a.unique(2)) == 2
    with pytest.raises(ValueError, match=r"^a unique prompt needs at least two tokens \(its header\), got 1$"):
        a.unique(1)  # one token cannot hold the header: it would repeat the 100th prompt's first token


def _info(**kw) -> ServerInfo:
    base = dict(url="http://s:1", model="m", model_root="/m", served_models=("m",), vllm_version="0.32.0",
                max_model_len=32768, block_size=32, num_gpu_blocks=65536, enable_prefix_caching=True,
                max_num_batched_tokens=2048, max_num_seqs=128)
    return ServerInfo(**{**base, **kw})


def test_plan_longer_than_max_model_len_gets_one_clear_message():
    with pytest.raises(CalibrationError, match=r"16448 tokens.*max_model_len 8192"):
        SweepPlan().check_fits(_info(max_model_len=8192))
    clipped = SweepPlan().clipped(8192)
    clipped.check_fits(_info(max_model_len=8192))
    assert max(clipped.cold_lengths) <= 8191


def test_plan_leaves_out_decode_points_that_overflow_the_cache():
    exps = SweepPlan().experiments(capacity_tokens=100_000)
    assert all(e["batch"] * (e["context_len"] + 64) <= 90_000 for e in exps if e["kind"] == "decode")
    assert any(e["kind"] == "decode" for e in exps)


# --------------------------------------------------------------------------------------------
# a fake vLLM server: bad inputs and interrupted sweeps
# --------------------------------------------------------------------------------------------


class _FakeVllm:
    """Just enough of vLLM's OpenAI server for the sweep: models, version, metrics, streaming
    completions with a prefix cache over 32-token blocks; ``die_after`` drops the connection of
    every completion after that many."""

    def __init__(self, model="tiny", max_model_len=32768, caching=True, die_after=None):
        self.model, self.max_model_len, self.caching, self.die_after = model, max_model_len, caching, die_after
        self.cache: set[int] = set()
        self.completions = 0
        self.m = dict(prefill=0.0, n=0, itl=0.0, itl_n=0, e2e_n=0, cpu=0.0)
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def _json(self, code, doc):
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, {"data": [{"id": fake.model, "root": "/m", "max_model_len": fake.max_model_len}]})
                elif self.path == "/version":
                    self._json(200, {"version": "0.32.0"})
                elif self.path == "/metrics":
                    m = fake.m
                    text = (
                        f'vllm:cache_config_info{{block_size="32",enable_prefix_caching="{fake.caching}",'
                        f'num_gpu_blocks="65536"}} 1.0\n'
                        f"vllm:request_prefill_time_seconds_sum {m['prefill']}\n"
                        f"vllm:request_prefill_time_seconds_count {m['n']}\n"
                        f"vllm:request_queue_time_seconds_sum 0.0\n"
                        f"vllm:time_to_first_token_seconds_sum {m['prefill']}\n"
                        f"vllm:inter_token_latency_seconds_sum {m['itl']}\n"
                        f"vllm:inter_token_latency_seconds_count {m['itl_n']}\n"
                        f"vllm:e2e_request_latency_seconds_count {m['e2e_n']}\n"
                        f"process_cpu_seconds_total {m['cpu']}\n"
                    ).encode()
                    with fake.lock:
                        fake.m["cpu"] += 0.125  # a scrape's own CPU, seen by the next scrape
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/reset_prefix_cache":
                    fake.cache.clear()
                    return self._json(200, {"success": True})
                req = json.loads(body)
                if req["model"] != fake.model:
                    return self._json(404, {"error": {"message": f"The model `{req['model']}` does not exist."}})
                prompt = req["prompt"]
                if len(prompt) >= fake.max_model_len:
                    return self._json(400, {"error": {"message": "This model's maximum context length is "
                                                      f"{fake.max_model_len} tokens."}})
                with fake.lock:
                    fake.completions += 1
                    if fake.die_after is not None and fake.completions > fake.die_after:
                        self.close_connection = True
                        return
                    cached, h = 0, 0
                    for k in range((len(prompt) - 1) // 32):
                        h = hash((h, tuple(prompt[32 * k: 32 * k + 32])))
                        if fake.caching and h in fake.cache:
                            cached = 32 * (k + 1)
                        else:
                            break
                    h = 0
                    for k in range(len(prompt) // 32):
                        h = hash((h, tuple(prompt[32 * k: 32 * k + 32])))
                        fake.cache.add(h)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                n = req["max_tokens"]
                for i in range(n):
                    time.sleep(0.002)
                    chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n,
                                                  "prompt_tokens_details": {"cached_tokens": cached}}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                with fake.lock:
                    fake.m["prefill"] += 0.001 + 1e-6 * (len(prompt) - cached)
                    fake.m["n"] += 1
                    fake.m["itl"] += 0.001 * (n - 1)
                    fake.m["itl_n"] += n - 1
                    fake.m["e2e_n"] += 1
                    fake.m["cpu"] += 0.25  # API CPU seconds per completion (a power of two: exact sums)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    servers = []

    def make(**kw):
        s = _FakeVllm(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


TINY_PLAN = SweepPlan(cold_lengths=(16, 64), cold_reps=1, cached_prefixes=(64,), cached_new=(8,), cached_reps=1,
                      decode_batches=(1, 2), decode_contexts=(96,), decode_tokens=8, decode_reps=1,
                      mixed_batches=(2,), mixed_prefills=(64,), mixed_context=96, mixed_tokens=200, mixed_reps=1)


def _sweep(url, out, plan=TINY_PLAN, model=None):
    return asyncio.run(run_sweep([url], out, plan, model=model, progress=False))


def test_sweep_against_fake_server_writes_rows_and_fits(fake_server, tmp_path):
    s = fake_server()
    summary = _sweep(s.url, tmp_path)
    assert summary.status == "complete" and summary.num_experiments == len(TINY_PLAN.experiments())
    meta, servers, req, exp = load_sweep(tmp_path)
    assert meta["status"] == "complete" and servers[0].block_size == 32
    assert (tmp_path / "requests.parquet").exists()
    assert set(req["role"]) >= {"cold", "warm", "cached", "decode", "context", "prefill"}
    assert (req.loc[req.role == "cached", "cached_tokens"] == 64).all()
    obs, notes = build_observations(req, exp, engine_config(servers[0]))
    assert {o.kind for o in obs} == {"cold", "cached", "decode", "mixed"}, notes


def test_unreachable_server_is_one_clear_message(tmp_path):
    with pytest.raises(CalibrationError, match=r"cannot reach the vLLM server at http://127.0.0.1:9"):
        _sweep("http://127.0.0.1:9", tmp_path)


def test_wrong_model_name_lists_served_models(fake_server, tmp_path):
    s = fake_server(model="tiny-qwen2")
    with pytest.raises(CalibrationError, match=r"does not serve model 'llama'; it serves: tiny-qwen2"):
        _sweep(s.url, tmp_path, model="llama")


def test_prefix_caching_off_is_detected(fake_server, tmp_path):
    s = fake_server(caching=False)
    with pytest.raises(CalibrationError, match="prefix caching is off"):
        _sweep(s.url, tmp_path)


def test_sweep_past_max_model_len_names_length_and_limit(fake_server, tmp_path):
    s = fake_server(max_model_len=64)
    with pytest.raises(CalibrationError, match=r"max_model_len 64"):
        _sweep(s.url, tmp_path)
    assert not (tmp_path / "requests.csv").exists()  # refused before measuring


def test_server_dying_mid_sweep_keeps_the_rows(fake_server, tmp_path):
    s = fake_server(die_after=2 + 5 + 4)  # 2 probe requests, 5 warm-up requests, 4 measured
    with pytest.raises(CalibrationError, match="lost the vLLM server"):
        _sweep(s.url, tmp_path)
    meta, _, req, _ = load_sweep(tmp_path)
    assert len(req) == 4 and meta["status"].startswith("failed")
    # the 4 measured requests were 3 whole experiments (seed 0's order: the cached one sends two)
    assert meta["experiments_done"] == 3 == req["exp_id"].nunique()


class _ScriptedClient:
    """A stand-in for ``VllmClient``: every completion answers at once, HTTP 500 when ``fail``;
    ``cached_tokens`` as given (None: not reported); ``/metrics`` empty."""

    def __init__(self, fail=False, cached_tokens=0):
        self.fail, self.cached_tokens, self.num_scrapes = fail, cached_tokens, 0

    async def complete(self, prompt, max_tokens, *_):
        t = time.perf_counter()
        if self.fail:
            return StreamResult(t_send=t, error="boom", status=500)
        return StreamResult(t_send=t, token_times=[0.01] * max_tokens, prompt_tokens=len(prompt),
                            cached_tokens=self.cached_tokens, completion_tokens=max_tokens, t_done=0.02, status=200)

    async def metrics(self):
        return MetricsSnapshot(values={}, info={}, taken_at=0.0)

    async def probe(self):
        return _info()


def test_a_failed_request_in_a_burst_on_all_servers_keeps_every_servers_rows(tmp_path):
    from kvroute.calibrate.calibration import measure
    from kvroute.calibrate.calibration.sweep_files import EXPERIMENT_COLUMNS, REQUEST_COLUMNS, RowWriter

    requests = RowWriter(tmp_path / "requests.csv", REQUEST_COLUMNS)
    experiments = RowWriter(tmp_path / "experiments.csv", EXPERIMENT_COLUMNS)
    ctxs = [measure._Ctx(_ScriptedClient(fail=k == 0), _info(url=f"http://s{k}"),
                         PromptFactory(np.random.default_rng(k)), requests, experiments, time.perf_counter(),
                         metrics_ok=False, worker=k) for k in range(2)]
    burst = dict(kind="burst_all", rep=0, batch=3, prompt_len=64, prefix_len=0, max_tokens=4, exp_id=7)
    with pytest.raises(CalibrationError, match=r"^the server at http://s0 answered HTTP 500: boom$"):
        asyncio.run(measure._burst(ctxs, burst))
    requests.close()
    experiments.close()
    # the second server's three answers and its experiment row are kept beside the first's failure
    assert pd.read_csv(tmp_path / "requests.csv").groupby("url").size().to_dict() == {"http://s0": 3, "http://s1": 3}
    exp = pd.read_csv(tmp_path / "experiments.csv")
    assert exp["url"].tolist() == ["http://s0", "http://s1"] and exp["error"].fillna("").tolist() == ["boom", ""]


def test_one_servers_failure_cancels_the_other_servers_experiments():
    from kvroute.calibrate.calibration import measure

    written = []

    async def fails():
        await asyncio.sleep(0.01)
        raise CalibrationError("server 0 failed")

    async def measures():
        for k in range(5):
            await asyncio.sleep(0.02)
            written.append(k)

    async def sweep():
        with pytest.raises(CalibrationError, match="server 0 failed"):
            await measure._together([fails(), measures()])
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.sleep(0.1)  # a sibling left running would write on
        return left

    assert asyncio.run(sweep()) == [] and written == []


def test_a_server_that_cannot_show_its_cache_hits_is_refused():
    from kvroute.calibrate.calibration.measure import probe_server

    with pytest.raises(CalibrationError, match=r"^cannot tell whether prefix caching works on the server at "
                                               r"http://s:1: its responses carry no cached_tokens and its "
                                               r"/metrics no vllm:prefix_cache_hits_total; start it with "
                                               r"--enable-prompt-tokens-details \(kvroute serve does\)$"):
        asyncio.run(probe_server(_ScriptedClient(cached_tokens=None), PromptFactory(np.random.default_rng(0))))
    info = asyncio.run(probe_server(_ScriptedClient(cached_tokens=64), PromptFactory(np.random.default_rng(0))))
    assert info.reports_cached_tokens
    with pytest.raises(CalibrationError, match="found no cached tokens the second time"):
        asyncio.run(probe_server(_ScriptedClient(cached_tokens=0), PromptFactory(np.random.default_rng(0))))


def test_fit_command_writes_a_loadable_profile_and_report(tmp_path):
    """The CLI path end to end on synthetic raw rows timed by TRUE."""
    from click.testing import CliRunner

    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.profile import load_profile

    _write_synthetic_run(tmp_path / "run")
    out = tmp_path / "prof" / "synthetic.json"
    result = CliRunner().invoke(calibrate, ["fit", str(tmp_path / "run"), "--out", str(out), "--loss", "linear",
                                       "--bootstrap", "3"])
    assert result.exit_code == 0, result.output
    prof = load_profile(out)
    assert prof.name == "synthetic"
    assert prof.step_cost.decode_attn_s == pytest.approx(TRUE.decode_attn_s, rel=1e-3)
    assert (tmp_path / "prof" / "synthetic.fit.png").stat().st_size > 10_000
    assert len(prof.uncertainty.samples) == 3 and prof.uncertainty.fields[-1] == "overheads.jitter_cv"


def test_fit_leaves_out_and_counts_rows_with_impossible_counts(tmp_path):
    """Issue 35, item 4: cached tokens 1000x the prompt, or 3x max_tokens streamed, are
    measurement errors: fit leaves those rows out and says how many."""
    from click.testing import CliRunner

    from kvroute.cli.calibrate_commands import calibrate

    _write_synthetic_run(tmp_path / "run")
    path = tmp_path / "run" / "requests.csv"
    req = pd.read_csv(path)
    req["n_tokens"] = req["max_tokens"]
    req.loc[0, "cached_tokens"] = 1000 * req.loc[0, "prompt_len"]  # exp 0: a 16-token cold prompt
    decode = req.index[req["role"] == "decode"][0]
    req.loc[decode, "n_tokens"] = 3 * req.loc[decode, "max_tokens"]
    req.to_csv(path, index=False)
    out = tmp_path / "p.json"
    result = CliRunner().invoke(calibrate, ["fit", str(tmp_path / "run"), "--out", str(out), "--loss", "linear"])
    assert result.exit_code == 0, result.output
    assert ("note: 2 request row(s) left out as measurement errors (counts no server can give: cached tokens "
            "above the prompt, or more tokens than max_tokens); first: measurement error: 16000 cached tokens "
            "for a 16-token prompt") in result.output
    assert "exp 0: request failed or sent no token; left out" in result.output


def _split_run(whole: Path, a: Path, b: Path) -> None:
    """Two sweeps of one run: the experiments with even ids in ``a``, the odd ones (ids
    renumbered from 0) in ``b``; the same meta data in both but the start time."""
    req, exp = pd.read_csv(whole / "requests.csv"), pd.read_csv(whole / "experiments.csv")
    meta = json.loads((whole / "meta.json").read_text())
    for d, parity in ((a, 0), (b, 1)):
        d.mkdir()
        (d / "meta.json").write_text(json.dumps(dict(meta, started=f"2026-11-29T0{parity}:00:00+00:00")))
        for df, name in ((req, "requests.csv"), (exp, "experiments.csv")):
            part = df[df["exp_id"] % 2 == parity].copy()
            part["exp_id"] //= 2
            part.to_csv(d / name, index=False)


def test_pooled_sweeps_keep_experiments_apart_and_fit_as_one(tmp_path):
    """Two sweeps pooled (``load_sweeps``): the second's experiment ids follow the first's, every
    row says its sweep, and the fit of both halves equals the fit of the whole run."""
    from click.testing import CliRunner

    from dataclasses import asdict

    from kvroute.calibrate.calibration.observations import load_sweeps
    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.profile import load_profile

    _write_synthetic_run(tmp_path / "run")
    _split_run(tmp_path / "run", tmp_path / "a", tmp_path / "b")
    meta, servers, req, exp = load_sweeps([tmp_path / "a", tmp_path / "b"])
    _, _, req_a, _ = load_sweep(tmp_path / "a")
    n_a = int(req_a["exp_id"].max()) + 1
    assert n_a == 11  # 21 experiments (9 TTFT, 12 decode): ids 0, 2, .., 20 here, 1, 3, .., 19 in b
    assert sorted(req.loc[req["sweep"] == 1, "exp_id"].unique()) == list(range(11, 21))
    assert sorted(exp["exp_id"]) == sorted(exp["exp_id"].unique())
    assert len(req) == len(pd.read_csv(tmp_path / "run" / "requests.csv"))
    assert meta["sweeps"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    runner = CliRunner()
    for args, name in (([str(tmp_path / "run")], "whole"), ([str(tmp_path / "a"), str(tmp_path / "b")], "pooled")):
        result = runner.invoke(calibrate, ["fit", *args, "--out", str(tmp_path / f"{name}.json"), "--loss", "linear",
                                           "--bootstrap", "0", "--holdout", "0", "--folds", "0"])
        assert result.exit_code == 0, result.output
    whole, pooled = load_profile(tmp_path / "whole.json"), load_profile(tmp_path / "pooled.json")
    assert asdict(pooled.step_cost) == pytest.approx(asdict(whole.step_cost), rel=1e-9)
    assert pooled.step_cost.decode_attn_s == pytest.approx(TRUE.decode_attn_s, rel=1e-3)
    assert pooled.raw["provenance"]["sweeps_pooled"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    result = runner.invoke(calibrate, ["fit", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 2 and "several RUN_DIRs: give --out" in result.output


def test_pooled_sweeps_of_different_engines_or_one_sweep_twice_name_the_folder_and_field(tmp_path):
    from kvroute.calibrate.calibration.observations import load_sweeps

    _write_synthetic_run(tmp_path / "a")
    _write_synthetic_run(tmp_path / "b")
    with pytest.raises(ValueError, match=r"b/meta.json: field 'started': the same sweep as .*/a \(both started "
                                         r"2026-11-29T00:00:00\+00:00\): its rows would count double"):
        load_sweeps([tmp_path / "a", tmp_path / "b"])  # a copy
    with pytest.raises(ValueError, match=r"a: given twice \(also as .*/a\)"):
        load_sweeps([tmp_path / "a", tmp_path / "b", tmp_path / "a"])
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    meta["servers"][0]["block_size"] = 16
    meta["started"] = "2026-11-30T00:00:00+00:00"
    (tmp_path / "b" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"b/meta.json: field 'servers\[0\]\.block_size': block_size 16, where "
                                         r".*/a has 32: pool sweeps of one engine only"):
        load_sweeps([tmp_path / "a", tmp_path / "b"])


def test_pooled_sweeps_of_servers_restarted_between_them_may_differ_by_a_few_kv_blocks(tmp_path):
    from kvroute.calibrate.calibration.observations import load_sweeps

    _write_synthetic_run(tmp_path / "a")
    _write_synthetic_run(tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    meta["started"] = "2026-11-30T00:00:00+00:00"
    meta["servers"][0]["num_gpu_blocks"] = 65536 + 1310  # 2.0 % more: what a restart found, one cache
    (tmp_path / "b" / "meta.json").write_text(json.dumps(meta))
    pooled, servers, _, _ = load_sweeps([tmp_path / "a", tmp_path / "b"])
    assert servers[0].num_gpu_blocks == 65536 and len(pooled["sweeps"]) == 2  # the first sweep's count
    meta["servers"][0]["num_gpu_blocks"] = 65536 + 1338  # 2.04 % more: another cache
    (tmp_path / "b" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"field 'servers\[0\]\.num_gpu_blocks': num_gpu_blocks 66874, where "
                                         r".*/a has 65536: pool sweeps of one engine only"):
        load_sweeps([tmp_path / "a", tmp_path / "b"])


def _write_synthetic_run(d: Path) -> None:
    d.mkdir(parents=True)
    info = _info()
    (d / "meta.json").write_text(json.dumps({"status": "complete", "started": "2026-11-29T00:00:00+00:00",
                                             "urls": [info.url], "servers": [info.to_dict()]}))
    rows, exps, e = [], [], 0
    for L in (16, 128, 512, 2048, 4096, 8192):
        for P in (0, 1024):
            if P >= L:
                continue
            eng = predict(prefill_steps(ENGINE, L, P), TRUE)
            over = API_S + API_PER_TOKEN_S * L
            rows.append(dict(exp_id=e, kind="cold", role="cached" if P else "cold", prompt_len=L, prefix_len=P,
                             max_tokens=1, t_send_s=0.0, ttft_s=eng + over, token_times=f"{eng + over:.9f}",
                             cached_tokens=P, expected_cached=P, engine_prefill_s=eng, engine_queue_s=0.0))
            e += 1
    for L in (128, 1024, 4096):
        for B in (1, 4, 16, 64):
            T = 16
            itl = predict([decode_step(B, B * decode_context(L, T / 2))], TRUE)
            for i in range(B):
                rows.append(dict(exp_id=e, kind="decode", role="decode", prompt_len=L, prefix_len=L - 32, max_tokens=T,
                                 t_send_s=0.0, ttft_s=0.01, token_times=" ".join(f"{0.01 + k * itl:.9f}" for k in range(T))))
            exps.append(dict(exp_id=e, kind="decode", batch=B, context_len=L, itl_engine_s=itl))
            e += 1
    pd.DataFrame(rows).to_csv(d / "requests.csv", index=False)
    pd.DataFrame(exps).to_csv(d / "experiments.csv", index=False)


def test_bursts_run_in_ascending_size_and_count_a_shared_prefix_once_against_the_cache():
    plan = SweepPlan(burst_sizes=(16, 1, 4), burst_shapes=((64, 4),), burst_reps=1, burst_cached_sizes=(8, 2),
                     burst_cached_shapes=((2048, 16, 4),))
    shape = lambda bursts: [(b["batch"], b["prefix_len"]) for b in bursts]  # noqa: E731
    # 90 % of 2,500 tokens = 2,250: eight 2,068-token prompts sharing a 2,048-token prefix take
    # 2,048 + 8 x (16 + 4) = 2,208 of it
    assert shape(plan.bursts(1, 0, capacity_tokens=2500)) == [(1, 0), (4, 0), (16, 0), (2, 2048), (8, 2048)]
    assert shape(plan.bursts(1, 0, capacity_tokens=2400)) == [(1, 0), (4, 0), (16, 0), (2, 2048)]  # 2,160


def test_concurrency_sweep_writes_bursts_on_one_and_all_servers(fake_server, tmp_path):
    from kvroute.calibrate.calibration.bursts import load_bursts

    a, b = fake_server(), fake_server()
    from dataclasses import replace

    plan = replace(TINY_PLAN, burst_sizes=(1, 3), burst_shapes=((64, 4),), burst_reps=1, burst_cached_sizes=(2,),
                   burst_cached_shapes=((64, 16, 4),))
    summary = asyncio.run(run_sweep([a.url, b.url], tmp_path, plan, progress=False))
    assert summary.status == "complete"
    assert summary.num_experiments == len(plan.experiments()) + len(plan.bursts(2, 0))
    meta, _, req, exp = load_sweep(tmp_path)
    assert meta["client_host"]["cores"] >= 1 and len(meta["client_host"]["loadavg_end"]) == 3
    # the bursts ran between the one-at-a-time experiments, not after them (SweepPlan.burst_slots)
    burst_rows = exp["kind"].str.startswith("burst")
    assert exp.loc[burst_rows, "t_start_s"].min() < exp.loc[~burst_rows, "t_start_s"].max()
    bursts, notes = load_bursts(req, exp)
    assert notes == []
    assert [(x.kind, x.num_servers, x.batch, len(x.send_s), x.prefix_len) for x in bursts] == [
        ("burst", 1, 1, 1, 0), ("burst_all", 2, 1, 2, 0), ("burst", 1, 3, 3, 0), ("burst_all", 2, 3, 6, 0),
        ("burst", 1, 2, 2, 64), ("burst_all", 2, 2, 4, 64)]
    warm = req[req["role"] == "burst_warm"]
    assert warm["prompt_len"].tolist() == [64, 64, 64]  # one per server and cached burst, before it
    assert all(x.send_s[0] == 0.0 and x.measured["ttft_mean_s"] > 0 for x in bursts)
    # the API process's CPU seconds over each burst, per loaded server: 0.25 s per completion,
    # once the settling scrapes' 0.125 s each (timed back to back per server) are taken off
    assert [x.measured["api_cpu_s"] for x in bursts] == [0.25, 0.25, 0.75, 0.75, 0.5, 0.5]
    assert set(exp.loc[exp["kind"].str.startswith("burst"), "scrape_cpu_s"]) == {0.125}


def test_a_proportional_api_server_time_keeps_its_jitter():
    """An API-server line through 0 (intercept clipped to 0, slope > 0) gave jitter_cv 0: the CV
    was taken only with an intercept above 0, though the line is positive at every prompt."""
    from dataclasses import replace

    from kvroute.calibrate.calibration.fit import fit_cost

    rng = np.random.default_rng(1)
    obs = []
    for o in _synthetic(0.0):
        if o.kind in ("cold", "cached"):
            # a line whose intercept lies below 0 (-50 us), positive at every measured prompt
            over = (1.1e-5 * o.desc["prompt_len"] - 5e-5) * float(rng.lognormal(0, 0.1))
            o = replace(o, measured_s=o.engine_s + over, overhead_s=over)
        obs.append(o)
    assert min(o.desc["prompt_len"] for o in obs if o.kind == "cold") * 1.1e-5 > 5e-5
    fitted = fit_cost(obs)
    assert fitted.parts["api_server_from_metrics_s"] == 0.0  # the intercept, clipped
    assert 0.05 < fitted.jitter_cv < 0.2  # was 0.0; about the 0.1 drawn


def test_fit_quality_records_absolute_log_errors_beside_percentage_errors():
    """An under-prediction by half and an over-prediction by 2x are the same log error (log 2)
    but 50 % and 100 % as percentages; the profile's held-out spread reads the log errors."""
    from kvroute.calibrate.calibration.fit import quality

    q = quality(np.array([2.0, 1.0, 1.0, 4.0]), np.array([1.0, 2.0, 1.0, 4.0]))
    assert (q.median_ape, q.p90_ape) == (0.25, pytest.approx(0.85))
    assert q.median_abs_log == pytest.approx(math.log(2) / 2) and q.p90_abs_log == pytest.approx(math.log(2))
    none = quality(np.array([1.0]), np.array([0.0]))  # no positive prediction: no log error
    assert math.isnan(none.median_abs_log) and math.isnan(none.p90_abs_log)
