"""Calibration against a real vLLM CPU server running the tiny random-weight Qwen2 model.

Run: python -m pytest -m live tests/calibrate/calibration/test_calibrate_live.py   (about 2 minutes, 40 s of it start-up)
"""

from __future__ import annotations

import asyncio
import json
import math
import os

import pytest

from tests.support.live_servers import free_port, tiny_model

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One vLLM CPU server: engine on the first core, API server (and this test process, while
    it measures) on the others, as the reference setup."""
    from kvroute.calibrate.live.cores import cpu_cores
    from kvroute.calibrate.live.server import ServerSpec, serve_one

    model_dir, name = tiny_model(tmp_path_factory)
    cores = cpu_cores()
    engine_core = cores[0] if len(cores) > 1 else None
    spec = ServerSpec(model=model_dir, served_model_name=name, port=free_port(),
                      cpu_core=engine_core, frontend_cores=tuple(cores[1:]) or None, block_size=32,
                      kv_cache_gib=1.0, log_path=tmp_path_factory.mktemp("logs") / "vllm.log",
                      kv_events_port=free_port())
    with serve_one(spec, timeout_s=600) as srv:
        srv.client_cores = tuple(cores[1:]) or None
        yield srv


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan
    from kvroute.calibrate.live.cores import pinned

    out = tmp_path_factory.mktemp("sweep")
    with pinned(server.client_cores):
        summary = asyncio.run(run_sweep([server.url], out, SweepPlan.preset("quick"), seed=11, progress=False,
                                        kv_events=[server.kv_events_endpoint]))
    return out, summary


def test_quick_sweep_completes_and_reads_engine_settings(sweep):
    out, summary = sweep
    assert summary.status == "complete"
    info = summary.servers[0]
    assert info.model == "tiny-qwen2" and info.vllm_version.startswith("0.")
    assert info.block_size == 32 and info.num_gpu_blocks > 1000 and info.enable_prefix_caching
    assert info.max_num_batched_tokens == 2048 and info.max_num_seqs == 128  # vLLM 0.32 CPU defaults
    assert info.max_model_len == 32768 and info.device == "cpu"
    assert info.async_scheduling is False and info.reports_cached_tokens is True  # the CPU backend: sync
    assert info.unmodeled == ()  # kvroute serve's server runs nothing the engine model leaves out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["servers"][0]["unmodeled"] == [] and not any("does not model" in w for w in meta.get("warnings", []))
    assert meta["kv_events"]["stamp"] == "step_end"  # events as maps (0.24+), published after the step
    assert meta["status"] == "complete"
    import pandas as pd

    req = pd.read_csv(out / "requests.csv")
    cached = req[req.role == "cached"]
    assert (cached.cached_tokens == cached.expected_cached).all()  # prefix sharing is exact
    assert (req[req.role.isin(["cold", "warm"])].cached_tokens == 0).all()  # cold is cold
    assert req.engine_prefill_s.notna().sum() > 10  # /metrics separated engine time
    # the KV-cache events timed every request alone whose prompt stored a new full block
    assert meta["kv_events"]["batches"] > 0 and "problem" not in meta["kv_events"]
    assert "losses" not in meta["kv_events"]  # vLLM numbers its batches one by one: no gap, none undecodable
    alone = req[req.role.isin(["cold", "warm"]) & (req.prompt_len >= 32)]
    assert alone.engine_first_token_s.notna().all(), alone[alone.engine_first_token_s.isna()]
    assert ((alone.engine_first_token_s >= 0) & (alone.engine_first_token_s <= alone.ttft_s)).all()


def test_fit_writes_a_profile_the_simulator_loads(sweep, tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.cost_model import StepCost
    from kvroute.sim.timing.profile import load_profile
    from kvroute.sim.engine.request import Request
    from kvroute.sim.engine.scheduler import Scheduler

    out, _ = sweep
    prof_path = tmp_path / "cpu-tiny-live.json"
    res = CliRunner().invoke(calibrate, ["fit", str(out), "--out", str(prof_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(prof_path.read_text())
    for key in ("name", "hardware", "model", "engine", "step_cost", "overheads", "provenance", "sources"):
        assert key in doc
    prov = doc["provenance"]
    assert prov["kind"] == "measured" and prov["server_urls"] and prov["vllm_version"] and prov["hardware"]
    assert prov["fit"]["heldout"]["ttft"]["n"] > 0 and prov["fit"]["heldout"]["itl"]["n"] > 0
    for k in StepCost.__dataclass_fields__:
        v = doc["step_cost"][k]
        assert math.isfinite(v) and v >= 0, k
    assert math.isfinite(doc["overheads"]["api_server_s"]) and doc["overheads"]["api_server_s"] >= 0
    split = prov["fit"]["post_engine"]  # the front end after the engine's step, from the events
    assert split["num_requests"] > 10 and 0 < split["median_s"] < 0.05
    if "cut" not in split:
        assert doc["overheads"]["post_engine_s"] == pytest.approx(split["intercept_s"], rel=1e-5)
    prof = load_profile(prof_path)
    assert prof.engine.block_size == 32 and prof.engine.max_num_batched_tokens == 2048
    sched = Scheduler(prof.engine)
    sched.add_request(Request(0, 3000, 2, list(range(93))))
    out0 = sched.schedule()
    assert 0 < prof.step_cost.step_time(out0.num_batched_tokens, out0.num_reqs, out0.prefill_token_pairs,
                                        out0.decode_context_tokens) < 10.0
    assert (tmp_path / "cpu-tiny-live.fit.png").exists()


@pytest.mark.skipif(os.environ.get("KVROUTE_LIVE_BURST") != "1",
                    reason="depends on the shared machine's load: within its 30 % on a quiet machine, outside it at "
                           "load 4-9 (the runs: docs/log/from-code-comments.md); set KVROUTE_LIVE_BURST=1 to run it")
def test_burst_of_16_last_request_schedule_delay_within_30_percent(server, sweep, tmp_path):
    """Three fresh bursts of 16 cold 256-token prompts (16 output tokens each) on the server; the
    profile fitted to the quick sweep (its bursts included) predicts the last-sent request's
    arrival-to-schedule delay. Measured: its client TTFT minus the burst's mean engine prefill
    time (vllm:request_prefill_time_seconds; the server exports no per-request scheduling
    time); predicted: the same difference in the simulation of each burst at its measured send
    times (kvroute.calibrate.calibration.bursts). Compared: the means over the three bursts (single bursts
    on this shared 2-core machine vary by 2x with the client's own send spread)."""
    from click.testing import CliRunner

    from kvroute.calibrate.calibration.bursts import load_bursts, measured_delay, schedule_delay
    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan
    from kvroute.calibrate.calibration.observations import load_sweep
    from kvroute.calibrate.live.cores import pinned
    from kvroute.sim.timing.profile import load_profile

    out, _ = sweep
    prof_path = tmp_path / "burst-live.json"
    res = CliRunner().invoke(calibrate, ["fit", str(out), "--out", str(prof_path)])
    assert res.exit_code == 0, res.output
    assert "burst errors" in res.output and "one request at a time" in res.output
    prof = load_profile(prof_path)
    assert prof.frontend is not None and prof.host is not None
    plan = SweepPlan(cold_lengths=(), cached_prefixes=(), decode_batches=(), mixed_batches=(),
                     burst_sizes=(16,), burst_shapes=((256, 16),), burst_reps=3, burst_cached_sizes=())
    with pinned(server.client_cores):
        summary = asyncio.run(run_sweep([server.url], tmp_path / "burst", plan, seed=23, progress=False))
    assert summary.status == "complete"
    _, _, req, exp = load_sweep(tmp_path / "burst")
    bursts, _ = load_bursts(req, exp)
    assert [b.batch for b in bursts] == [16, 16, 16]
    measured = sum(measured_delay(b) for b in bursts) / 3
    predicted = sum(schedule_delay(b, prof, seed)["comparable_s"] for b in bursts for seed in range(3)) / 9
    print(f"bursts of 16, last request: arrival-to-schedule measured {1000 * measured:.1f} ms, predicted "
          f"{1000 * predicted:.1f} ms ({100 * (predicted / measured - 1):+.1f} %), load {os.getloadavg()[0]:.2f}")
    assert measured > 0
    assert abs(predicted / measured - 1) <= 0.30


def test_bad_inputs_on_the_live_server(server, tmp_path):
    from kvroute.calibrate.live.client import CalibrationError
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan

    plan = SweepPlan.preset("quick")
    with pytest.raises(CalibrationError, match="it serves: tiny-qwen2"):
        asyncio.run(run_sweep([server.url], tmp_path / "a", plan, model="qwen-7b", progress=False))
    long_plan = SweepPlan(cold_lengths=(40_000,), cached_prefixes=(), decode_batches=(), mixed_batches=())
    with pytest.raises(CalibrationError, match=r"40001 tokens.*max_model_len 32768"):
        asyncio.run(run_sweep([server.url], tmp_path / "b", long_plan, progress=False))
    port = free_port()  # nobody listens there
    with pytest.raises(CalibrationError, match=f"cannot reach the vLLM server at http://127.0.0.1:{port}"):
        asyncio.run(run_sweep([f"http://127.0.0.1:{port}"], tmp_path / "c", plan, progress=False))


@pytest.mark.skipif(os.environ.get("KVROUTE_LIVE_ACCURACY") != "1",
                    reason="the full sweep takes minutes; set KVROUTE_LIVE_ACCURACY=1")
def test_full_sweep_meets_the_accuracy_target(server, tmp_path):
    from kvroute.calibrate.calibration.fit import fit
    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan
    from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweep
    from kvroute.calibrate.live.cores import pinned

    with pinned(server.client_cores):
        asyncio.run(run_sweep([server.url], tmp_path, SweepPlan.preset("full"), seed=5, progress=False))
    meta, servers, req, exp = load_sweep(tmp_path)
    obs, _ = build_observations(req, exp, engine_config(servers[0]))
    r = fit(obs, loss="soft_l1")
    assert r.quality["heldout"]["ttft"].median_ape <= 0.10
    assert r.quality["heldout"]["itl"].median_ape <= 0.10
