"""The live path against vLLM 0.11.0's response shapes, and the per-release rules (issue 33, rows 2-8).

``calibrate measure --preset quick``, ``calibrate fit`` and ``validate`` run end to end against the
0.11 stub of ``tests/support/vllm011_stub.py`` (its shapes read from the 0.11.0 wheel): cached tokens
left out for a zero hit, a reset answered 200 with an empty body, no ``system_env``, KV-cache
events as msgpack arrays stamped when the step is scheduled.
"""

from __future__ import annotations

import asyncio
import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("aiohttp", reason="aiohttp is not installed (the test extra brings it)")

from kvroute.calibrate.live.client import ServerInfo, StreamResult, VllmClient  # noqa: E402
from kvroute.sim.timing import vllm_versions as vv  # noqa: E402
from tests.support.vllm011_stub import BLOCK, Vllm011Stub  # noqa: E402


@pytest.fixture
def stub():
    servers = []

    def make(**kw):
        s = Vllm011Stub(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


# --------------------------------------------------------------------------------------------
# The version table (rules read from the wheels; docs/reference/vllm-versions.md)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version, block, memory, async_cuda", [
    ("0.11.0", 16, 0.9, False), ("0.13.0", 16, 0.9, False), ("0.14.0", 16, 0.9, True),
    ("0.19.0", 16, 0.9, True), ("0.20.0", 16, 0.92, True), ("0.33.0", 16, 0.92, True),
    ("0.34.0", 64, 1.0, True), ("0.34.0+cu129", 64, 1.0, True), ("nonsense", 64, 1.0, True),
])
def test_defaults_by_release(version, block, memory, async_cuda):
    d = vv.defaults(version)
    assert (d.block_size, d.gpu_memory_utilization, d.async_scheduling("cuda")) == (block, memory, async_cuda)
    assert d.async_scheduling("cpu") is False


@pytest.mark.parametrize("version, zero_cached, reset_json, maps, stamp_sync", [
    ("0.11.0", False, False, False, "step_start"),
    ("0.11.1", False, False, False, "step_end"),
    ("0.23.0", False, False, False, "step_end"),
    ("0.24.0", True, False, True, "step_end"),
    ("0.25.0", True, False, True, "step_end"),
    ("0.26.0", True, True, True, "step_end"),
    ("0.34.0", True, True, True, "step_end"),
])
def test_wire_rules_by_release(version, zero_cached, reset_json, maps, stamp_sync):
    assert vv.reports_zero_cached_tokens(version) is zero_cached
    assert vv.reset_reports_success(version) is reset_json
    assert vv.kv_events_as_maps(version) is maps
    assert vv.kv_event_stamp(version, False) == stamp_sync
    assert vv.kv_event_stamp(version, True) == ("step_start" if version == "0.11.0" else "step_end_alone")


def test_batch_defaults_by_gpu_and_release():
    gib = 2**30
    assert vv.defaults("0.11.0").batch_defaults(179 * gib, "NVIDIA B200") == (8192, 1024)
    assert vv.defaults("0.34.0").batch_defaults(179 * gib, "NVIDIA B200") == (16384, 1024)
    assert vv.defaults("0.34.0").batch_defaults(80 * gib, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert vv.defaults("0.34.0").batch_defaults(80 * gib, "NVIDIA H100 80GB HBM3") == (8192, 1024)


# --------------------------------------------------------------------------------------------
# Row 2: cached tokens left out for a zero hit
# --------------------------------------------------------------------------------------------


def _info(**kw) -> ServerInfo:
    base = dict(url="http://s:1", model="m", model_root="/m", served_models=("m",), vllm_version="0.11.0",
                max_model_len=32768, block_size=16, num_gpu_blocks=65536, enable_prefix_caching=True,
                max_num_batched_tokens=2048, max_num_seqs=256)
    return ServerInfo(**{**base, **kw})


@pytest.mark.parametrize("reports, reported, expected", [
    (True, None, 0),      # 0.11 with --enable-prompt-tokens-details: a zero hit is left out
    (True, 32, 32),
    (False, None, None),  # a server without the flag: unknown, not 0
    (None, None, None),   # not probed
])
def test_missing_cached_tokens_read_0_only_from_a_server_that_reports_them(reports, reported, expected):
    from kvroute.calibrate.calibration.measure import cached_tokens

    res = StreamResult(t_send=0.0, token_times=[0.1], prompt_tokens=40, cached_tokens=reported, completion_tokens=1)
    assert cached_tokens(_info(reports_cached_tokens=reports), res) == expected
    failed = StreamResult(t_send=0.0, error="boom", status=500)
    assert cached_tokens(_info(reports_cached_tokens=True), failed) is None


# --------------------------------------------------------------------------------------------
# Rows 3 and 6: the reset and /server_info
# --------------------------------------------------------------------------------------------


def test_probe_of_a_0_11_server_reads_sync_scheduling_and_unknown_hardware(stub):
    s = stub()

    async def main():
        async with VllmClient(s.url) as c:
            return await c.probe()

    info = asyncio.run(main())
    assert (info.vllm_version, info.block_size, info.max_num_batched_tokens, info.max_num_seqs) == ("0.11.0", 16, 2048, 256)
    assert info.async_scheduling is False and info.dev_mode is True
    assert (info.hardware, info.device) == ("unknown", "cuda")
    assert "no system_env" in info.sources["hardware"]
    assert info.sources["async_scheduling"].endswith("/server_info scheduler_config.async_scheduling")


def test_an_empty_reset_answer_counts_only_on_an_idle_engine(stub):
    s = stub(token_delay_s=0.01)

    async def main():
        async with VllmClient(s.url, s.model) as c:
            idle = await c.reset_prefix_cache(attempts=1)
            idle_note = c.reset_note
            busy = asyncio.create_task(c.complete(list(range(100, 164)), 200))
            while not s.running:
                await asyncio.sleep(0.001)
            refused = await c.reset_prefix_cache(attempts=2, wait_s=0.01)
            busy_note = c.reset_note
            busy.cancel()
            return idle, idle_note, refused, busy_note

    idle, idle_note, refused, busy_note = asyncio.run(main())
    assert idle is True and idle_note == "reset: empty answer (vLLM <= 0.25) while /metrics showed the engine idle"
    assert refused is False
    assert busy_note == ("not confirmed: empty answer (vLLM <= 0.25) while /metrics showed 1 request(s) held; "
                         "the engine refuses a reset while blocks are held")
    assert s.resets["refused"] == 2


def test_a_refusal_in_0_26_json_is_not_a_success():
    from aiohttp import web

    async def refuse(request):
        return web.json_response({"success": False})

    async def main():
        app = web.Application()
        app.router.add_post("/reset_prefix_cache", refuse)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with VllmClient(url) as c:
                return await c.reset_prefix_cache(attempts=2, wait_s=0.0), c.reset_note
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == (False, 'refused: {"success": false} (a request still holds blocks)')


# --------------------------------------------------------------------------------------------
# End to end: measure, fit and validate against 0.11's shapes
# --------------------------------------------------------------------------------------------


def test_measure_quick_and_fit_against_0_11(stub, tmp_path):
    from kvroute.cli.calibrate_commands import calibrate
    from kvroute.sim.timing.profile import load_profile

    pytest.importorskip("zmq", reason="pyzmq is not installed (the test extra brings it)")
    events = f"ipc://{tmp_path}/events.sock"
    s = stub(kv_events=events)
    out = tmp_path / "run"
    result = CliRunner().invoke(calibrate, ["measure", "--url", s.url, "--out", str(out), "--preset", "quick",
                                            "--no-bursts", "--no-progress", "--kv-events", events])
    assert result.exit_code == 0, result.output
    assert "vLLM 0.11.0 (async scheduling off), block size 16" in result.output
    assert "note: the servers did not say their hardware" in result.output and "warning:" not in result.output
    meta = json.loads((out / "meta.json").read_text())
    server = meta["servers"][0]
    assert (server["vllm_version"], server["async_scheduling"], server["reports_cached_tokens"]) == ("0.11.0", False, True)
    assert meta["kv_events"]["stamp"] == "step_start" and meta["kv_events"]["batches"] > 0
    assert "warnings" not in meta and s.resets == {"done": 1, "refused": 0}
    req = pd.read_csv(out / "requests.csv")
    cold = req[req["role"] == "cold"]
    assert (cold["cached_tokens"] == 0).all()  # left out on the wire, read as 0 (row 2)
    cached = req[req["role"] == "cached"]
    assert len(cached) and (cached["cached_tokens"] == cached["expected_cached"]).all()
    assert cold["engine_first_token_s"].notna().sum() >= len(cold) // 2  # array-form events decoded (row 4)

    profile = tmp_path / "p.json"
    result = CliRunner().invoke(calibrate, ["fit", str(out), "--out", str(profile), "--loss", "linear"])
    assert result.exit_code == 0, result.output
    doc = json.loads(profile.read_text())
    assert doc["engine"]["vllm_version"] == "0.11.0" and doc["engine"]["async_scheduling"] is False
    assert doc["provenance"]["async_scheduling"] is False
    assert doc["provenance"]["fit"]["post_engine"]["kv_event_stamp"] == "step_start"  # row 5
    assert "the fitted time of that step was added" in doc["sources"]["overheads.post_engine_s"]
    fix = doc["provenance"]["fit"]["post_engine"]["kv_event_stamp_correction"]  # every stamp early: none as stamped
    assert (fix["stamp"], fix["as_stamped"]) == ("step_start", 0) and fix["corrected"]["fitted_step"] > 0
    assert fix["num_corrected"] + fix["uncorrected"] == fix["timed"] == doc["provenance"]["fit"]["post_engine"][
        "num_requests"]
    p = load_profile(profile)
    assert (p.vllm_version, p.async_scheduling) == ("0.11.0", False)


def test_validate_against_0_11_writes_the_servers_release(stub, tmp_path):
    from kvroute.cli.validate_command import validate

    s = stub()
    out = tmp_path / "v"
    result = CliRunner().invoke(validate, ["--url", s.url, "--workload", "seed-chat", "--chats", "3", "--turns", "2",
                                           "--policies", "round_robin", "--profile", "cpu-tiny-qwen2",
                                           "--out", str(out), "--rounds", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    server = doc["servers"][0]
    assert (server["vllm_version"], server["async_scheduling"], server["hardware"]) == ("0.11.0", False, "unknown")
    entry = doc["policies"]["round_robin"]
    assert entry["usage_reported_cached_tokens"] is True  # zero hits left out, the rest reported
    assert entry["cache_reset"] == [True]
    notes = " ".join(doc["notes"])
    assert "measured or derived for vLLM 0.32.0, used for vLLM 0.11.0" in notes
    assert "vLLM 0.11.0 (async scheduling off)" in (out / "report.md").read_text()


def test_validate_with_0_11_events_moves_every_stamp_or_counts_it(stub, tmp_path):
    from kvroute.cli.validate_command import validate

    pytest.importorskip("zmq", reason="pyzmq is not installed (the test extra brings it)")
    events = f"ipc://{tmp_path}/events.sock"
    # tokens 20 ms apart: the run lasts seconds, not the tens of milliseconds in which, on a loaded
    # host, the event subscription (ZeroMQ's late joiner) could miss every batch
    s = stub(kv_events=events, token_delay_s=0.02)
    out = tmp_path / "v"
    result = CliRunner().invoke(validate, ["--url", s.url, "--workload", "seed-chat", "--chats", "4", "--turns", "3",
                                           "--policies", "round_robin", "--profile", "cpu-tiny-qwen2", "--out",
                                           str(out), "--rounds", "1", "--kv-events", events, "--tokens"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    entry = doc["policies"]["round_robin"]
    # NOTE: it failed once with a KeyError here, on a loaded host, and not in 6 runs beside
    # two busy loops: the notes say why the next time (a feed that gave nothing names itself there)
    assert "convoys_stamp_correction" in entry, doc["notes"]
    fix = entry["convoys_stamp_correction"]  # row 5: stamped when scheduled, so none marks the step's end
    assert (entry["convoys_kv_event_stamp"], fix["stamp"], fix["as_stamped"]) == ("step_start", "step_start", 0)
    assert fix["timed"] > 0 and fix["num_corrected"] + fix["uncorrected"] == fix["timed"]
    assert ("convoys_note" in entry) == (fix["uncorrected"] > 0)
    assert f"{fix['num_corrected']} were early and moved to it" in (out / "report.md").read_text()


def test_a_profile_names_another_release_in_a_note():
    from kvroute.sim.timing.profile import load_profile

    prior = load_profile("a6000-qwen2.5-7b")
    assert (prior.vllm_version, prior.async_scheduling) == ("0.11.0", False)
    assert prior.version_note("0.11.2", False) is None
    assert prior.version_note("0.34.0", True) == (
        "profile a6000-qwen2.5-7b: measured or derived for vLLM 0.11.0, used for vLLM 0.34.0; async scheduling off "
        "in the profile, on on the servers (defaults, step overlap and the live path differ across releases: "
        "docs/reference/vllm-versions.md)")
    assert math.isclose(prior.gpu_memory_utilization, 0.9)


def test_a_servers_hardware_names_the_gpus_it_uses_not_the_hosts():
    from kvroute.calibrate.live.client import _hardware_from_system_env

    host = {"nvidia_gpu_models": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: a)\n" + "\n".join(
        f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {i})" for i in range(1, 8))}
    assert _hardware_from_system_env(host) == ("8 x NVIDIA H100 80GB HBM3", "cuda")
    assert _hardware_from_system_env(host, 4) == ("4 x NVIDIA H100 80GB HBM3", "cuda")  # a TP4 server
    mixed = {"nvidia_gpu_models": "GPU 0: NVIDIA A100-SXM4-80GB\nGPU 1: NVIDIA RTX A6000\nGPU 2: NVIDIA RTX A6000"}
    assert _hardware_from_system_env(mixed, 1) == ("1 of 1 x NVIDIA A100-SXM4-80GB, 2 x NVIDIA RTX A6000", "cuda")
    assert _hardware_from_system_env(mixed, 3) == ("1 x NVIDIA A100-SXM4-80GB, 2 x NVIDIA RTX A6000", "cuda")
