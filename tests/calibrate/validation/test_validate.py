"""Validation mode without vLLM: token synthesis, slots, and the live replay against fake servers.

The fake server speaks the parts of vLLM's OpenAI API the replay uses (streamed completions of
token-id prompts with ``return_token_ids`` and cached-token usage, ``/metrics``, ``/v1/models``,
``/reset_prefix_cache``) and keeps an unbounded prefix cache with vLLM's rules (chained full-block
hashes, prompt plus all but the last output token cached, hits capped at prompt - 1 tokens), so
one-at-a-time replays must match the simulator's hit tokens exactly.
"""

from __future__ import annotations

import dataclasses
import asyncio
import json
import math
import signal
import threading

import numpy as np
import pytest

from kvroute.calibrate.validation.livestream import FifoSlots
from kvroute.calibrate.live.prompts import PromptBuilder, TokenSynth, chained_block_hashes, root_segments
from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec
from kvroute.sim.cluster.metrics import RECORD_COLUMNS, summarize
from kvroute.sim.cluster.workload import Workload
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.generators import seed_chat
from tests.support.paths import GOLDEN

BLOCK = 32


# --------------------------------------------------------------------------------------------
# A fake vLLM server
# --------------------------------------------------------------------------------------------


class FakeVllm:
    """A vLLM-like server on a background thread.

    Args:
        die_after: close every connection (mid-stream) once this many completions have started,
            and stop listening, like a killed server.
        hang: never answer completions.
        token_delay_s: time between streamed tokens.
        token_ids: stream each token's id (vLLM's ``return_token_ids``); False streams text only.
        fail_after: once this many completions have started, answer every later one HTTP 500 with
            ``fail_body`` (vLLM's API process after its engine died).
        cut_after_tokens: break every stream's connection after this many tokens.
        metrics_delay_s: time before each ``/metrics`` answer.
    """

    ENGINE_DEAD = (b'{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root '
                   b'cause.", "type": "InternalServerError", "param": null, "code": 500}}')

    def __init__(self, die_after: int | None = None, hang: bool = False, token_delay_s: float = 0.0005,
                 block_size: int = BLOCK, token_ids: bool = True, fail_after: int | None = None,
                 fail_body: bytes = ENGINE_DEAD, cut_after_tokens: int | None = None,
                 freeze_after: int | None = None, metrics_delay_s: float = 0.0) -> None:
        self.die_after, self.hang, self.delay, self.block_size = die_after, hang, token_delay_s, block_size
        self.metrics_delay_s = metrics_delay_s
        self.freeze_after = freeze_after  # after this many completions, answer nothing (a SIGSTOPped server)
        self.fail_after, self.fail_body, self.cut_after_tokens = fail_after, fail_body, cut_after_tokens
        self.failed = 0
        self.token_ids = token_ids
        self.cache: set[int] = set()
        self.hits = self.queries = 0
        self.started = 0
        self.prompts: list[list[int]] = []
        self.replies: list[tuple[list[int], list[int]]] = []
        self.log: list[str] = []  # "reset" and "completion", in the order they came
        self.dead = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        async def stop():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(5)

    async def _handle(self, reader, writer) -> None:
        try:
            if self.freeze_after is not None and self.started >= self.freeze_after:
                await asyncio.sleep(3600)
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode().split(" ", 2)
            length = 0
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            body = await reader.readexactly(length) if length else b""
            path = path.split("?")[0]
            if path == "/v1/completions":
                await self._complete(json.loads(body), writer)
            elif path == "/v1/models":
                self._json(writer, {"data": [{"id": "fake", "root": "/nonexistent/fake", "max_model_len": 8192}]})
            elif path == "/version":
                self._json(writer, {"version": "0.32.0"})
            elif path == "/metrics":
                await asyncio.sleep(self.metrics_delay_s)
                text = ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                        f'vllm:cache_config_info{{block_size="{self.block_size}",num_gpu_blocks="100000",'
                        f'enable_prefix_caching="True"}} 1.0\n'
                        f"vllm:prefix_cache_queries_total {self.queries}\n"
                        f"vllm:prefix_cache_hits_total {self.hits}\nvllm:num_preemptions_total 0\n")
                self._send(writer, 200, text.encode(), "text/plain")
            elif path == "/reset_prefix_cache" and method == "POST":
                self.cache.clear()
                self.log.append("reset")
                self._json(writer, {"success": True})
            elif path == "/health":
                self._send(writer, 200, b"", "text/plain")
            else:
                self._send(writer, 404, b'{"detail":"Not Found"}', "application/json")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _send(self, writer, status: int, payload: bytes, ctype: str) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + payload)

    def _json(self, writer, doc) -> None:
        self._send(writer, 200, json.dumps(doc).encode(), "application/json")

    def _hashes(self, ids: list[int]) -> list[int]:
        return chained_block_hashes(ids, self.block_size)

    async def _complete(self, req: dict, writer) -> None:
        if self.dead:
            return  # closes the connection at once
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_after is not None and self.started >= self.fail_after:
            self.failed += 1
            self._send(writer, 500, self.fail_body, "application/json")
            return
        self.started += 1
        self.log.append("completion")
        prompt = [int(t) for t in req["prompt"]]
        self.prompts.append(prompt)
        n = len(prompt)
        hashes = self._hashes(prompt)
        hit = 0
        for h in hashes[: (n - 1) // self.block_size]:
            if h not in self.cache:
                break
            hit += 1
        cached = hit * self.block_size
        self.queries += n
        self.hits += cached
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        out: list[int] = []
        for i in range(int(req["max_tokens"])):
            if self.die_after is not None and self.started > self.die_after:
                self.dead = True
                self._server.close()
                writer.transport.abort()
                return
            if self.cut_after_tokens is not None and i >= self.cut_after_tokens:
                writer.transport.abort()
                return
            tok = 100 + (prompt[-1] * 31 + i * 7 + n) % 900
            out.append(tok)
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            if self.token_ids:
                chunk["choices"][0]["token_ids"] = [tok]
            writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await writer.drain()
            await asyncio.sleep(self.delay)
        self.cache.update(self._hashes(prompt + out[:-1]))
        self.replies.append((prompt, out))
        usage = {"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": len(out),
                                          "prompt_tokens_details": {"cached_tokens": cached}}}
        writer.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
def fakes(request):
    servers = []

    def make(n=2, **kw):
        for i in range(n):
            opts = kw.get(f"s{i}", {})
            servers.append(FakeVllm(**opts))
        return servers

    yield make
    for s in servers:
        s.close()


def small_chat(chats=4, turns=3):
    return seed_chat(num_chats=chats, num_turns=turns, system_words=150, user_words=30, reply_tokens=20,
                     block_size=16)


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------


def test_token_synthesis_is_deterministic_and_in_range():
    s = TokenSynth(100, 1700, seed=3)
    a, b = s.tokens(7, 10, 500), s.tokens(7, 10, 500)
    assert (a == b).all() and a.min() >= 100 and a.max() < 1700
    assert (s.tokens(7, 0, 510)[10:] == a).all()  # position, not call, decides the token
    assert (s.tokens(8, 10, 500) != a).mean() > 0.99
    assert (TokenSynth(100, 1700, seed=4).tokens(7, 10, 500) != a).mean() > 0.99
    assert (s.tokens(1 << 48, 0, 64) != s.tokens((1 << 48) + 1, 0, 64)).any()
    with pytest.raises(ValueError):
        TokenSynth(5, 6)


def test_chained_hashes_reuse_a_known_prefix():
    ids = TokenSynth().tokens(1, 0, 300)
    full = chained_block_hashes(ids, 32)
    assert len(full) == 9
    assert chained_block_hashes(ids, 32, full[:4]) == full
    assert chained_block_hashes(ids[:100], 32) == full[:3]
    other = ids.copy()
    other[40] += 1
    h2 = chained_block_hashes(other, 32)
    assert h2[0] == full[0] and all(x != y for x, y in zip(h2[1:], full[1:]))  # a hash names its whole prefix


def test_live_prompts_share_blocks_exactly_where_the_simulated_ones_do():
    """The equality pattern of live block hashes matches the simulator's content hashes, so the
    routing policies see the same structure (replies stand in as the simulator's streams)."""
    trace = small_chat(chats=3, turns=3)
    wl = Workload(trace, BLOCK)
    builder = PromptBuilder(Workload(trace, BLOCK), TokenSynth())
    prompts, sim_to_live, live_to_sim = {}, {}, {}
    for rec in trace.records:
        if rec.parent is None:
            ids = builder.root(rec)
        else:
            parent = wl.by_id[rec.parent]
            ids = builder.child(rec, prompts[parent.request_id], builder.synthetic_output(parent))
        prompts[rec.request_id] = ids
        assert len(ids) == rec.input_length
        _, sim_hashes = wl.build(rec)
        live_hashes = chained_block_hashes(ids, BLOCK)
        for s, l in zip(sim_hashes[: rec.input_length // BLOCK], live_hashes):
            assert sim_to_live.setdefault(s, l) == l
            assert live_to_sim.setdefault(l, s) == s
    assert len(sim_to_live) < sum(r.input_length // BLOCK for r in trace.records)  # some sharing happened


def test_root_segments_match_the_workload():
    rec = TraceRecord(0, 0.0, 40, 5, hash_ids=(3, 4, 9))
    assert root_segments(rec, 16) == [(3, 0, 16), (4, 0, 16), (9, 0, 8)]
    with pytest.raises(ValueError):
        root_segments(TraceRecord(1, 0.0, 40, 5, parent=0), 16)


def test_fifo_slots_serve_in_request_order():
    async def main():
        slots, order = FifoSlots(1), []

        async def user(i):
            await slots.acquire()
            order.append(i)
            await asyncio.sleep(0.001)
            slots.release()

        await asyncio.gather(*(user(i) for i in range(6)))
        return order

    assert asyncio.run(main()) == list(range(6))


# --------------------------------------------------------------------------------------------
# Replay against fake servers
# --------------------------------------------------------------------------------------------


def _replay(trace, servers, **kw):
    replay = LiveReplay(trace, [Endpoint(s.url, "fake") for s in servers], BLOCK, ReplaySpec(**kw))
    asyncio.run(replay.run())
    return replay


def test_replay_samples_the_clients_cpu_time(fakes):
    """The replay keeps the client's CPU seconds over time, ending with the run's total."""
    servers = fakes(2)
    replay = _replay(small_chat(), servers, policy="round_robin", max_in_flight=2)
    times, cpu = zip(*replay.client_cpu)
    assert replay.client_cpu[0] == (0.0, 0.0) and list(times) == sorted(times) and list(cpu) == sorted(cpu)
    assert replay.client_cpu[-1] == (replay.elapsed_s, replay.client_cpu_s) and replay.client_cpu_s > 0


def test_replay_records_have_the_simulator_columns_and_resend_real_replies(fakes):
    servers = fakes(2)
    trace = small_chat()
    replay = _replay(trace, servers, policy="round_robin", max_in_flight=2)
    res = replay.result()
    assert list(res.records.columns) == RECORD_COLUMNS
    assert (res.records["status"] == "ok").all() and len(res.records) == len(trace.records)
    assert (res.records["output_tokens"] == 20).all()
    assert len(res.itl) == len(trace.records) * 19
    s = summarize(res)
    assert s["time_to_complete_s"] > 0 and 0 < s["hit_rate"] < 1
    # a later turn's prompt starts with its parent's prompt and the tokens the server generated
    replies = [r for srv in servers for r in srv.replies]
    first = trace.records[0].input_length
    later = [p for srv in servers for p in srv.prompts if len(p) > first]
    assert len(later) == len(trace.records) - 4
    for p in later:
        assert any(p[: len(q) + len(o)] == q + o for q, o in replies)


def test_a_reply_without_token_ids_is_not_resent_invented(fakes):
    """Closed loop, a server that streams text without token ids: the first turns are measured,
    their later turns are not sent (they would resend an invented reply), each saying why, and
    the replay notes it once."""
    servers = fakes(2, s0={"token_ids": False}, s1={"token_ids": False})
    trace = small_chat(chats=4, turns=3)
    replay = _replay(trace, servers, policy="round_robin", max_in_flight=2)
    records = replay.result().records.set_index("request_id")
    roots = [r.request_id for r in trace.records if r.parent is None]
    assert (records.loc[roots, "status"] == "ok").all()
    later = [r for r in trace.records if r.parent is not None]
    errors = {r.request_id: records.at[r.request_id, "error"] for r in later}
    for r in later:
        if r.parent in roots:
            assert errors[r.request_id] == (f"not sent: the server streamed no token ids for its parent request "
                                            f"{r.parent}'s reply (vLLM's return_token_ids), which this turn resends")
        else:
            assert errors[r.request_id] == f"not sent: its parent request {r.parent} failed"
    assert sum(len(s.prompts) for s in servers) == len(roots)
    assert replay.no_token_ids_note == (f"{len(roots)} replies came without token ids (the servers did not honour "
                                        f"vLLM's return_token_ids), so their later turns were not sent: resending "
                                        f"an invented reply would measure another conversation's hits and TTFT")
    assert replay.warnings == []


def test_replay_keeps_every_token_time_when_asked(fakes):
    """``record_tokens``: one row per output token, the first and last at the record's first
    token and finish, consecutive differences the run's inter-token gaps; off, nothing kept."""
    servers = fakes(2)
    trace = small_chat()
    res = _replay(trace, servers, policy="round_robin", record_tokens=True).result()
    tok, rec = res.tokens, res.records.set_index("request_id")
    assert list(tok.columns) == ["request_id", "token", "time"]
    assert len(tok) == int(rec["output_tokens"].sum()) == 20 * len(trace.records)
    per = tok.groupby("request_id")["time"]
    assert (per.first() == rec["first_token"]).all() and (per.last() == rec["finish"]).all()
    assert sorted(np.concatenate([np.diff(t) for _, t in per])) == pytest.approx(sorted(res.itl))
    assert _replay(trace, fakes(2), policy="round_robin").result().tokens is None


@pytest.mark.parametrize("policy", ["round_robin", "kv_aware"])
def test_one_at_a_time_hits_equal_the_simulation_exactly(fakes, tmp_path, policy):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    trace = small_chat(chats=6, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), (policy,), max_in_flight=1, sim_rounds=1)
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec)
    run = v.runs[0]
    assert run.cache_reset == [True, True] and not run.warm
    live = run.live.workers
    sim = run.sim_runs[0].workers
    assert list(live["prefix_cache_hits"]) == list(sim["prefix_cache_hits"].astype(float))
    assert list(live["prefix_cache_queries"]) == list(sim["prefix_cache_queries"].astype(float))
    assert list(live["usage_cached_tokens"]) == list(sim["prefix_cache_hits"])
    # same routing decision for every request
    lw = run.live.records.set_index("request_id")["worker"]
    sw = run.sim_runs[0].records.set_index("request_id")["worker"]
    assert (lw == sw).all()
    doc = json.loads(write_report(v, tmp_path).read_text())
    w0 = doc["policies"][policy]["workers"]["0"]["hit_tokens"]
    assert w0["predicted"] == w0["measured"] and w0["error_pct"] == 0
    assert doc["warm_cache"] is False and doc["failed_requests"] == 0
    for name in ("report.md", "records_live.parquet", "records_sim.parquet", f"ttft_{policy}.png"):
        assert (tmp_path / name).exists()


def test_two_policies_give_a_change_table_and_kv_aware_hits_more(fakes, tmp_path):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import report_markdown, write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), max_in_flight=1, sim_rounds=2)
    # an odd number of chats: round robin does not happen to keep each chat on one worker
    v = run_validation(small_chat(chats=5, turns=3), load_profile("a6000-qwen2.5-7b"), spec)
    rr, kv = v.runs
    assert kv.measured["hit_rate"] > rr.measured["hit_rate"]
    assert kv.predicted["hit_rate"] > rr.predicted["hit_rate"]
    doc = json.loads(write_report(v, tmp_path).read_text())
    ch = doc["changes"]["kv_aware"]["hit_rate"]
    assert ch["predicted"] > 0 and ch["measured"] > 0 and ch["vs"] == "round_robin"
    md = report_markdown(v)
    assert "## Change vs round_robin" in md and "| hit tokens, worker 1 |" in md
    assert (tmp_path / "ttft_all.png").exists()
    ttft = doc["policies"]["kv_aware"]["metrics"]["ttft_mean_s"]
    lo, hi = ttft["predicted_interval"]
    assert lo <= ttft["predicted"] <= hi and lo < hi  # two simulated rounds differ
    lag = doc["policies"]["kv_aware"]["client_send_lag_s"]
    assert lag["n"] == 10 and 0 <= lag["median"] <= lag["p90"] <= lag["max"]
    assert "after their parent's last token" in md
    import pandas as pd

    live = pd.read_parquet(tmp_path / "records_live.parquet")
    assert set(live["policy"]) == {"round_robin", "kv_aware"} and live["url"].notna().all()


def test_send_lag_is_arrival_minus_parent_finish_minus_think_time():
    import dataclasses

    import numpy as np
    import pandas as pd

    from kvroute.calibrate.validation.validate import PolicyRun
    from kvroute.calibrate.validation.validate_report import send_lags
    from kvroute.sim.cluster.metrics import RunResult

    trace = small_chat(chats=2, turns=3)
    trace = dataclasses.replace(trace, records=[dataclasses.replace(r, think_time_ms=100.0 if r.parent is not None else 0.0)
                                                for r in trace.records])
    rows = []
    for i, rec in enumerate(trace.records):  # arrivals 0, 1, 2, ... s; each finishes 0.5 s later
        status = "failed" if (rec.session_id, rec.turn) == (trace.records[-1].session_id, 3) else "ok"
        rows.append({"request_id": rec.request_id, "arrival": float(i), "finish": i + 0.5, "status": status})
    live = RunResult(pd.DataFrame(rows), np.array([]), pd.DataFrame(), "round_robin", 0)
    run = PolicyRun("round_robin", {}, [], live=live)
    arrival = {r["request_id"]: r["arrival"] for r in rows}
    want = [arrival[r.request_id] - (arrival[r.parent] + 0.5) - 0.1 for r in trace.records
            if r.parent is not None and not (r.session_id == trace.records[-1].session_id and r.turn == 3)]
    assert len(want) == 3  # four later turns, one failed
    assert send_lags(run, trace).tolist() == pytest.approx(want, abs=1e-12)
    assert len(send_lags(PolicyRun("x", {}, []), trace)) == 0


def test_a_worker_dying_mid_replay_is_survived(fakes, tmp_path):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2, s1={"die_after": 3, "token_delay_s": 0.002})
    trace = small_chat(chats=6, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=3, sim_rounds=1)
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec)
    run = v.runs[0]
    df = run.live.records
    assert list(run.dead) == [1]
    failed = df[df["status"] != "ok"]
    lost = failed[failed["worker"] == 1]
    assert len(lost) >= 1 and lost["error"].str.contains(servers[1].url.split("//")[1]).all()
    assert failed[failed["worker"] == -1]["error"].str.startswith("not sent: its parent request").all()
    ok = df[df["status"] == "ok"]
    assert len(ok) > 0 and (ok["worker"] == 0).sum() >= len(ok) - 3
    assert len(df) == len(trace.records)  # every request is accounted for
    # sessions never touched by a failure completed all their turns
    hurt = set(failed["session_id"])
    assert all(len(g) == 3 for s, g in ok.groupby("session_id") if s not in hurt)
    doc = json.loads(write_report(v, tmp_path).read_text())
    assert doc["policies"]["round_robin"]["dead_workers"].keys() == {"1"}
    assert any("died or timed out" in n for n in doc["notes"])
    assert doc["policies"]["round_robin"]["workers"]["1"]["alive"] is False
    assert doc["failures"] and doc["failures"][0]["error"]


def test_a_hanging_worker_times_out_and_is_marked_dead(fakes):
    servers = fakes(2, s1={"hang": True})
    trace = small_chat(chats=4, turns=2)
    # NOTE: 2 s, not less: on a loaded 2-core host the healthy fake itself took over 0.5 s once
    replay = _replay(trace, servers, policy="round_robin", timeout_s=2.0)
    df = replay.result().records
    assert list(replay.dead) == [1] and "within 2 s" in replay.dead[1]
    assert (df.loc[df["status"] != "ok", "worker"] != 0).all()
    assert (df["status"] == "ok").sum() >= 2 and (df.loc[df["status"] == "ok", "worker"] == 0).all()


def test_all_workers_dead_means_nothing_more_is_sent(fakes):
    servers = fakes(1, s0={"hang": True})
    replay = _replay(small_chat(chats=2, turns=2), servers, timeout_s=0.3)
    df = replay.result().records
    assert (df["status"] == "failed").all() and len(df) == 4
    assert df["error"].str.contains("not sent").sum() == 2


def test_interrupting_keeps_what_was_measured(fakes):
    servers = fakes(2, s0={"token_delay_s": 0.003}, s1={"token_delay_s": 0.003})
    trace = small_chat(chats=4, turns=4)
    replay = LiveReplay(trace, [Endpoint(s.url, "fake") for s in servers], BLOCK, ReplaySpec(max_in_flight=2))

    async def main():
        task = asyncio.create_task(replay.run())
        while replay.num_finished < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    df = replay.result().records
    assert replay.interrupted and len(df) == len(trace.records)
    assert (df["status"] == "ok").sum() >= 3
    assert df["error"].isin(["interrupted", "not sent: the replay was interrupted"]).sum() >= 1
    assert math.isfinite(summarize(replay.result())["ttft_mean_s"])


def test_open_loop_sends_at_timestamps(fakes):
    servers = fakes(2)
    recs = [TraceRecord(i, 100.0 * i, 70, 4, hash_ids=(0, 1, 10 + i)) for i in range(4)]
    replay = _replay(Trace(recs, 32), servers, policy="kv_aware")
    df = replay.result().records
    assert (df["status"] == "ok").all()
    assert np.all(np.diff(df["arrival"].to_numpy()) > 0.08)
    assert df["cached_tokens"].iloc[1:].max() == 64  # the shared two blocks hit after the first


def test_the_clock_starts_when_the_replay_is_ready_to_send(fakes):
    """t = 0 is the first send: the servers' first /metrics poll (0.3 s here) and the HTTP
    client's set-up come before it, so open-loop arrivals keep the trace's spacing."""
    servers = fakes(2, s0={"metrics_delay_s": 0.3}, s1={"metrics_delay_s": 0.3})
    recs = [TraceRecord(i, 100.0 * i, 70, 4, hash_ids=(0, 1, 10 + i)) for i in range(3)]
    replay = _replay(Trace(recs, 32), servers, policy="least_loaded:load=waiting", scrape_interval_s=0.05)
    assert replay.metrics.num_scrapes >= 1
    arrival = replay.result().records.sort_values("request_id")["arrival"].to_numpy()
    assert arrival[0] < 0.08 and np.all(np.abs(arrival - [0.0, 0.1, 0.2]) < 0.08)


def test_open_loop_child_before_its_parent_replied(fakes):
    servers = fakes(1)
    recs = [TraceRecord(0, 0.0, 64, 8, hash_ids=(0, 1)), TraceRecord(1, 0.0, 64 + 8 + 24, 4, parent=0, session_id=0)]
    replay = _replay(Trace(recs, 32), servers, closed_loop=False)
    df = replay.result().records
    assert (df["status"] == "ok").all()
    child = next(p for p in servers[0].prompts if len(p) == 96)
    assert child[:64] == next(p for p in servers[0].prompts if len(p) == 64)


def _invoke_validate(servers, tmp_path, *extra: str):
    """``kvroute validate`` of a 3-chat x 2-turn trace file on ``servers``, round_robin then
    kv_aware one request at a time, one simulated round, plus ``extra`` arguments; returns the
    click result (asserted successful), report.json and the arguments."""
    from click.testing import CliRunner

    from kvroute.cli.validate_command import validate
    from kvroute.traces.writer import write_trace

    trace_file = tmp_path / "chat.jsonl"
    write_trace(small_chat(chats=3, turns=2), trace_file)
    out = tmp_path / "out"
    args = ["--trace", str(trace_file), "--url", servers[0].url, "--url", servers[1].url,
            "--policies", "round_robin,kv_aware", "--profile", "a6000-qwen2.5-7b", "--out", str(out),
            "--max-in-flight", "1", "--rounds", "1", *extra]
    res = CliRunner().invoke(validate, args)
    assert res.exit_code == 0, res.output
    return res, json.loads((out / "report.json").read_text()), args


def test_validate_command(fakes, tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.validate_command import validate

    servers = fakes(2)
    res, doc, _ = _invoke_validate(servers, tmp_path)
    out = tmp_path / "out"
    assert "| time to complete (s) |" in res.output
    assert (out / "report.md").read_text() in res.output  # what it prints is report.md, provenance line included
    assert set(doc["policies"]) == {"round_robin", "kv_aware"} and doc["max_in_flight"] == 1
    # what produced it: the options, kvroute's version, the profile's and the trace file's hashes
    from kvroute.cli.provenance import canonical_sha256, file_sha256, kvroute_version
    from kvroute.sim.timing.profile import load_profile

    prov = doc["provenance"]
    assert prov["command"] == "validate" and prov["version"] == kvroute_version()
    assert prov["options"]["max-in-flight"] == 1 and prov["options"]["rounds"] == 1
    assert prov["options"]["url"] == [servers[0].url, servers[1].url]
    assert prov["profile"] == {"name": "a6000-qwen2.5-7b", "sha256": canonical_sha256(load_profile("a6000-qwen2.5-7b").raw)}
    assert prov["trace"]["sha256"] == file_sha256(tmp_path / "chat.jsonl")
    assert prov["profile"]["sha256"] in (out / "report.html").read_text()
    bad = CliRunner().invoke(validate, ["--url", servers[0].url, "--policy", "nope", "--out", str(out)])
    assert bad.exit_code != 0 and "valid policies" in bad.output
    assert not (out / "tokens_live.parquet").exists()


def test_validate_tokens_writes_live_and_simulated_token_times(fakes, tmp_path):
    import pandas as pd

    _invoke_validate(fakes(2), tmp_path, "--tokens")
    live = pd.read_parquet(tmp_path / "out" / "tokens_live.parquet")
    sim = pd.read_parquet(tmp_path / "out" / "tokens_sim.parquet")
    records = pd.read_parquet(tmp_path / "out" / "records_live.parquet")
    assert set(live["policy"]) == set(sim["policy"]) == {"round_robin", "kv_aware"}
    for frame in (live, sim):  # 6 requests x 20 tokens per policy (one simulated round)
        assert frame.groupby("policy").size().to_dict() == {"round_robin": 120, "kv_aware": 120}
    assert len(live) == records["output_tokens"].sum()


@pytest.mark.parametrize("live_rounds,signum", [(1, signal.SIGINT), (2, signal.SIGINT), (1, signal.SIGTERM)])
def test_ctrl_c_in_the_command_writes_what_was_measured(fakes, tmp_path, live_rounds, signum):
    """Ctrl-C, and SIGTERM the same way: the partial report is written, exit code 130."""
    from tests.support.validate_driver import interrupt_validate

    from kvroute.traces.writer import write_trace

    servers = fakes(2, s0={"token_delay_s": 0.01}, s1={"token_delay_s": 0.01})
    trace_file = tmp_path / "chat.jsonl"
    write_trace(small_chat(chats=5, turns=3), trace_file)
    out = tmp_path / "out"
    # Interrupt once two replies are done: 13 of 15 are then still to come (0.2 s each, one at a
    # time), however loaded the machine is.
    code, err, doc = interrupt_validate(trace_file, [s.url for s in servers], "a6000-qwen2.5-7b", out,
                                        settle_s=0.0, timeout_s=60,
                                        ready=lambda: sum(len(s.replies) for s in servers) >= 2,
                                        extra=("--live-rounds", str(live_rounds)), signum=signum)
    assert code == 130, err
    assert doc["interrupted"] is True and list(doc["policies"]) == ["round_robin"]
    rr = doc["policies"]["round_robin"]
    assert rr.get("live_rounds") == (None if live_rounds == 1 else 1)  # no later round was started
    assert rr["interrupted"] and 0 < rr["failed_requests"] < doc["num_requests"]
    assert rr["metrics"]["ttft_mean_s"]["measured"] > 0
    assert "interrupted" in (out / "report.md").read_text()


def test_ctrl_c_while_predicting_keeps_the_live_measurements_without_a_prediction(fakes, tmp_path, monkeypatch):
    """The measured client lag makes the prediction wait for the live rounds; Ctrl-C then (here:
    the simulation raises it) keeps every live run's records and measured values, exit 130."""
    import pandas as pd
    from click.testing import CliRunner

    from kvroute.calibrate.validation import validate as validate_module
    from kvroute.cli.validate_command import validate
    from kvroute.traces.writer import write_trace

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(validate_module, "predict", interrupted)
    servers = fakes(2)
    trace_file = tmp_path / "chat.jsonl"
    write_trace(small_chat(chats=3, turns=2), trace_file)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("records_sim.parquet", "report.html", "ttft_kv_aware.png", "ttft_all.svg", "notes.txt"):
        (out / name).write_text("an earlier validation's, and the user's notes.txt")
    res = CliRunner().invoke(validate, ["--trace", str(trace_file), "--url", servers[0].url, "--url", servers[1].url,
                                        "--policies", "round_robin,kv_aware", "--profile", "a6000-qwen2.5-7b",
                                        "--out", str(out), "--max-in-flight", "1", "--live-rounds", "2"])
    assert res.exit_code == 130, res.output
    doc = json.loads((out / "report.json").read_text())
    assert doc["interrupted"] is True and doc["predicted"] is False and doc["failed_requests"] == 0
    assert [(r["policy"], r["live_round"]) for r in doc["runs"]] == [
        ("round_robin", 0), ("kv_aware", 0), ("round_robin", 1), ("kv_aware", 1)]
    live = pd.read_parquet(out / "records_live.parquet")
    assert len(live) == 4 * 6 and (live["status"] == "ok").all()
    first = live[(live["policy"] == "round_robin") & (live["live_round"] == 0)]
    assert doc["runs"][0]["measured"]["ttft_mean_s"] == pytest.approx(first["ttft"].mean(), rel=1e-12)
    text = (out / "report.md").read_text()
    assert text.startswith("# Validation, measured only: ") and "nothing is compared" in text
    assert "| metric | round_robin, live round 1 | kv_aware, live round 1 | round_robin, live round 2 |" in text
    assert text.endswith("- interrupted before the prediction was made: the live measurements are kept without one\n")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "records_live.parquet", "report.json", "report.md"]


def test_cluster_spec_notes_a_profile_of_another_model():
    from kvroute.calibrate.live.client import ServerInfo
    from kvroute.calibrate.validation.validate import ValidationSpec, cluster_spec
    from kvroute.sim.timing.profile import load_profile

    server = ServerInfo(url="http://x:1", model="tiny-qwen2", model_root="/cache/kvroute/tiny-qwen2",
                        served_models=("tiny-qwen2",), vllm_version="0.32.0", max_model_len=32768, block_size=32,
                        num_gpu_blocks=4096, enable_prefix_caching=True, max_num_batched_tokens=2048,
                        max_num_seqs=128, hardware="CPU", device="cpu")
    spec = ValidationSpec(("http://x:1",))
    cluster, notes = cluster_spec(load_profile("cpu-tiny-qwen2-x2"), [server], spec)
    assert notes == [] and cluster.profile.engine.num_gpu_blocks == 4096
    _, notes = cluster_spec(load_profile("a6000-qwen2.5-7b"), [server], spec)
    assert any("describes model 'qwen2.5-7b-instruct'" in n and "['tiny-qwen2']" in n for n in notes)


def test_cluster_spec_notes_every_server_of_another_model():
    """Mixed models: one server serving the profile's model does not hide the others."""
    import dataclasses

    from kvroute.calibrate.live.client import ServerInfo
    from kvroute.calibrate.validation.validate import ValidationSpec, cluster_spec
    from kvroute.sim.timing.profile import load_profile

    tiny = ServerInfo(url="http://x:1", model="tiny-qwen2", model_root="/cache/kvroute/tiny-qwen2",
                      served_models=("tiny-qwen2",), vllm_version="0.32.0", max_model_len=32768, block_size=32,
                      num_gpu_blocks=4096, enable_prefix_caching=True, max_num_batched_tokens=2048,
                      max_num_seqs=128, hardware="CPU", device="cpu")
    servers = [tiny, dataclasses.replace(tiny, url="http://x:2", model="opt-125m", model_root="/m/opt-125m"),
               dataclasses.replace(tiny, url="http://x:3", model="gpt2", model_root="/m/gpt2")]
    spec = ValidationSpec(tuple(s.url for s in servers))
    _, notes = cluster_spec(load_profile("cpu-tiny-qwen2-x2"), servers, spec)
    assert notes[0] == ("profile 'cpu-tiny-qwen2-x2' describes model 'tiny-qwen2', but server 1 (http://x:2) serves "
                          "'opt-125m', server 2 (http://x:3) serves 'gpt2': the simulation prices every worker with "
                          "'tiny-qwen2''s step costs, so those servers' times are another model's")
    _, notes = cluster_spec(load_profile("cpu-tiny-qwen2-x2"), servers[:1], ValidationSpec(("http://x:1",)))
    assert notes == []


def test_client_lag_delays_every_later_turn_of_the_simulation_exactly():
    from kvroute.calibrate.validation.validate import with_client_lag
    from kvroute.sim.cluster.cluster import ClusterSpec, simulate
    from kvroute.sim.timing.profile import load_profile

    trace = small_chat(chats=3, turns=3)
    lagged = with_client_lag(trace, 0.025)
    assert with_client_lag(trace, 0.0) is trace
    with pytest.raises(ValueError, match="client lag"):
        with_client_lag(trace, -0.001)
    res = simulate(lagged, ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2, arrival_spread_s=0.0))
    df = res.records.set_index("request_id")
    parents = {r.request_id: r.parent for r in trace.records if r.parent is not None}
    assert len(parents) == 6
    for rid, parent in parents.items():
        assert df.at[rid, "arrival"] - df.at[parent, "finish"] == pytest.approx(0.025, abs=1e-9)


def test_drawn_client_lags_delay_each_later_turn_by_one_of_the_sample():
    import dataclasses

    from kvroute.sim.cluster.cluster import ClusterSpec, simulate
    from kvroute.sim.timing.profile import load_profile

    trace = small_chat(chats=4, turns=3)
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2, arrival_spread_s=0.0)
    parents = {r.request_id: r.parent for r in trace.records if r.parent is not None}

    def gaps(s, seed=0):
        df = simulate(trace, s, seed=seed).records.set_index("request_id")
        return [round(df.at[rid, "arrival"] - df.at[p, "finish"], 9) for rid, p in parents.items()]

    assert gaps(spec) == [0.0] * 8  # no sample: the trace's think time alone (0 here)
    one = dataclasses.replace(spec, client_lag_s=(0.025,))
    assert gaps(one) == [0.025] * 8
    two = dataclasses.replace(spec, client_lag_s=(0.002, 0.030))
    drawn = gaps(two)
    assert set(drawn) == {0.002, 0.030} and drawn == gaps(two)  # both values drawn; same seed, same draws
    assert gaps(two, seed=1) != drawn
    with pytest.raises(ValueError, match="client_lag_s"):
        dataclasses.replace(spec, client_lag_s=(-0.001,))


def test_measured_values_are_checked_against_intervals_with_model_uncertainty(fakes, tmp_path):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import report_markdown, write_report
    import math

    from kvroute.sim.study.intervals import combined_interval
    from kvroute.sim.timing.heldout import heldout_spreads
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), max_in_flight=2, sim_rounds=2,
                          uncertainty=2)
    v = run_validation(small_chat(chats=5, turns=3), load_profile("cpu-tiny-qwen2"), spec)
    rr, kv = v.runs
    assert len(kv.run_values["ttft_mean_s"]) == 2 + 2 * 2  # central rounds, then 2 draws x 2 rounds
    assert kv.interval_source.startswith("seeds and model (bootstrap")
    doc = json.loads(write_report(v, tmp_path).read_text())
    m = doc["policies"]["kv_aware"]["metrics"]["ttft_mean_s"]
    # the 90 % interval combining seeds, the drawn profiles, the fit's held-out TTFT error and (no
    # probes here) no drift, in log space
    assert kv.run_draws == [-1, -1, 0, 0, 1, 1]
    heldout = heldout_spreads(load_profile("cpu-tiny-qwen2").raw)["ttft"]
    ci = combined_interval(kv.run_values["ttft_mean_s"], kv.run_draws, [m["measured"]], level=0.9, log_scale=True,
                           bounds=(0.0, math.inf), heldout_log_sd=heldout, prior_sd=spec.run_to_run_prior)
    lo, hi = ci.low, ci.high
    assert m["run_interval"] == [lo, hi] and m["inside"] == (lo <= m["measured"] <= hi)
    # one live round: the host prior stands for the run-to-run spread the seeds understate
    assert m["interval_terms"]["run_source"] == "host prior"
    assert m["interval_terms"]["run_to_run_prior"] == pytest.approx(spec.run_to_run_prior ** 2, rel=1e-12)
    assert m["interval_terms"]["heldout_var"] == pytest.approx(heldout ** 2, rel=1e-12)
    assert doc["interval_level"] == 0.9 and doc["coverage"]["level"] == 0.9
    assert m["interval_terms"]["draws"] == 2 and m["interval_terms"]["central_runs"] == 2
    ch = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["inside"] in (True, False) and ch["run_interval"][0] < ch["run_interval"][1]
    k, n = doc["inside_interval"]["inside"], doc["inside_interval"]["checked"]
    assert 0 <= k <= n and n >= 2 * 9 + 6  # every defined metric and change of both policies
    md = report_markdown(v)
    assert "| inside |" in md and f"{k} of {n} measured values fall inside" in md and "each of 2 profiles drawn" in md


def test_measured_client_lag_runs_live_first_and_simulates_with_lags_drawn_from_the_measured(fakes, tmp_path):
    import dataclasses

    import numpy as np

    from kvroute.calibrate.validation.validate import ValidationSpec, measured_lags, run_validation, with_root_offsets
    from kvroute.calibrate.validation.validate_report import send_lags
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    trace = small_chat(chats=3, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), sim_rounds=1,
                          client_lag_s=None)
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec)
    lags = np.concatenate([send_lags(r, trace) for r in v.runs])
    assert v.client_lag_s == pytest.approx(float(np.median(lags)))
    # the simulation draws each later turn's lag from the measured ones
    assert measured_lags(trace, v.runs) == tuple(sorted(max(float(x), 0.0) for x in lags)) and len(lags) == 12
    for run in v.runs:
        sim = run.sim_runs[0].records.set_index("request_id")
        for rec in trace.records:
            if rec.parent is not None:
                gap = sim.at[rec.request_id, "arrival"] - sim.at[rec.parent, "finish"]
                assert min(abs(gap - x) for x in measured_lags(trace, v.runs)) < 1e-9
    assert set(v.root_offsets_s) == {r.request_id for r in trace.records if r.parent is None}
    assert min(v.root_offsets_s.values()) == 0.0
    assert all(r.predicted and r.measured for r in v.runs)
    doc = json.loads(write_report(v, tmp_path).read_text())
    assert doc["sim_client_lag_s"] == pytest.approx(v.client_lag_s) and doc["sim_client_lag_measured"]
    shifted = with_root_offsets(trace, {0: 0.25})
    assert [r.timestamp_ms for r in shifted.records if r.parent is None][:1] == [250.0]
    assert dataclasses.replace(shifted, records=trace.records) == trace


def test_a_later_turns_send_lag_leaves_out_its_wait_for_a_client_slot():
    """send_lags: send - parent's last token - think time - client_wait (with a max_in_flight
    limit, the wait for a slot, which the simulation models itself); with one request in flight
    live, the lags are the client's own work, not the previous request's duration."""
    import pandas as pd

    from kvroute.calibrate.validation.validate import PolicyRun, send_lags
    from kvroute.sim.cluster.metrics import RunResult

    trace = small_chat(chats=1, turns=3)
    think = [r.think_time_ms / 1000.0 for r in trace.records]
    rows = pd.DataFrame({"request_id": [0, 1, 2], "arrival": [0.0, 1.0 + think[1] + 0.003, 2.5 + think[2] + 0.7],
                         "finish": [1.0, 2.5, 3.0], "status": ["ok"] * 3, "client_wait": [0.0, 0.0, 0.698]})
    run = PolicyRun("round_robin", {}, [], live=RunResult(rows, np.array([]), pd.DataFrame(), "round_robin", 0))
    assert [r.parent for r in trace.records] == [None, 0, 1]
    assert send_lags(run, trace, slot_limited=True) == pytest.approx([0.003, 0.002])
    # a replay without a slot limit subtracts nothing (one recorded before the slot wait was
    # client_wait alone kept the prompt's building in it, part of the client's own lag)
    assert send_lags(run, trace) == pytest.approx([0.003, 0.7])


def test_the_live_client_wait_is_the_wait_for_a_slot_only(fakes):
    """One request in flight, two chats: a turn that found the slot free records client_wait 0
    (its prompt building is its send lag, not a client wait); one that queued records its wait."""
    trace = small_chat(chats=2, turns=2)
    replay = _replay(trace, fakes(1), policy="round_robin", max_in_flight=1)
    df = replay.result().records.set_index("request_id")
    assert (df["status"] == "ok").all()
    roots = [r for r in trace.records if r.parent is None]
    assert {r.timestamp_ms for r in roots} == {0.0}  # both ready at once
    first, second = sorted((r.request_id for r in roots), key=lambda i: df.at[i, "arrival"])
    assert df.at[first, "client_wait"] < 0.01  # the slot was free
    # the second root was ready at the start and got the slot when the first request ended
    assert df.at[second, "client_wait"] >= df.at[first, "finish"] - df.at[first, "arrival"] - 0.01
    assert df.at[second, "arrival"] - df.at[second, "client_wait"] <= df.at[first, "arrival"] + 0.05


# --------------------------------------------------------------------------------------------
# Live rounds: a constructed validation (no server, no simulator) with fixed numbers
# --------------------------------------------------------------------------------------------

GOLDEN_N1 = GOLDEN / "validate_one_round"


def constructed_validation(measured: dict[str, list[dict[str, float]]], live_rounds: int | None = None):
    """A validation of round_robin then kv_aware on a 2-chat x 2-turn trace, built by hand:
    ``measured[policy][r]`` is live round ``r``'s summary (metrics not given read 0.5 s / 0.5);
    predictions, simulated-run values and per-worker counters are fixed numbers. Rounds are
    appended round-major (rr, kv, rr, kv, ...). ``live_rounds``: the spec's (None: the default)."""
    import dataclasses

    import pandas as pd

    from kvroute.calibrate.validation.validate import PolicyRun, Validation, ValidationSpec, cluster_spec
    from kvroute.calibrate.live.client import ServerInfo
    from kvroute.sim.cluster.metrics import RunResult
    from kvroute.sim.timing.profile import load_profile
    from kvroute.calibrate.validation.validate_report import REPORT_METRICS

    trace = small_chat(chats=2, turns=2)
    servers = [ServerInfo(url=f"http://x{port}:{port}", model="tiny-qwen2", model_root="/cache/kvroute/tiny-qwen2",
                          served_models=("tiny-qwen2",), vllm_version="0.32.0", max_model_len=32768, block_size=32,
                          num_gpu_blocks=4096, enable_prefix_caching=True, max_num_batched_tokens=2048,
                          max_num_seqs=128, hardware="CPU", device="cpu") for port in (1, 2)]
    extra = {} if live_rounds is None else {"live_rounds": live_rounds}
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), sim_rounds=3, **extra)
    cluster, notes = cluster_spec(load_profile("cpu-tiny-qwen2-x2"), servers, spec)
    v = Validation(trace, spec, servers, cluster, notes=notes)
    policies = spec.policies
    for r in range(max(len(measured[p]) for p in policies)):
        for k, policy in enumerate(policies):
            if r >= len(measured[policy]):
                continue
            rows = [{"request_id": rec.request_id, "session_id": rec.session_id, "turn": rec.turn,
                     "worker": i % 2, "arrival": float(i), "finish": i + 0.5 + 0.01 * r, "status": "ok", "error": None}
                    for i, rec in enumerate(trace.records)]
            workers = pd.DataFrame({"url": [s.url for s in servers], "alive": [True, True], "requests": [2, 2],
                                    "prefix_cache_hits": [100.0 + 10 * r + k, 200.0], "prefix_cache_queries": [400.0, 500.0],
                                    "usage_cached_tokens": [100, 200], "num_preemptions": [0.0, 0.0]})
            sim_workers = pd.DataFrame({"prefix_cache_hits": [110 + k, 190], "prefix_cache_queries": [400, 500]})
            sim = [RunResult(pd.DataFrame(rows), np.array([]), sim_workers, policy, s) for s in range(3)]
            values = {m: [0.5 + 0.1 * k + 0.05 * s for s in range(3)] for m in REPORT_METRICS}
            values["time_to_complete_s"] = [2.0 - 0.2 * k + 0.1 * s for s in range(3)]
            values["failed"] = [0.0, 0.0, 0.0]
            summary = {m: 0.5 for m in REPORT_METRICS} | {"failed": 0.0} | measured[policy][r]
            run = PolicyRun(policy, {m: float(np.mean(x)) for m, x in values.items()}, sim,
                            predicted_interval={m: (min(x), max(x)) for m, x in values.items()},
                            live=RunResult(pd.DataFrame(rows), np.array([]), workers, policy, 0), measured=summary,
                            cache_reset=[True, True], elapsed_s=1.5 + r, client_cpu_s=0.3 * (1 + k),
                            run_values=values)
            if live_rounds is not None:
                run = dataclasses.replace(run, live_round=r)
            v.runs.append(run)
    return v


def test_one_live_round_reports_as_before(tmp_path):
    """The default (one live round) writes today's report.json and report.md, plus one note."""
    import os

    from kvroute.calibrate.validation.validate_report import ONE_ROUND_NOTE, report_dict

    from kvroute.calibrate.validation.validate_render import report_markdown

    v = constructed_validation({"round_robin": [{"time_to_complete_s": 1.8}], "kv_aware": [{"time_to_complete_s": 1.5}]})
    doc = json.loads(json.dumps(report_dict(v), default=str))
    md = report_markdown(v)
    assert doc["notes"][0] == ONE_ROUND_NOTE and "1.44 s" in ONE_ROUND_NOTE and "--live-rounds 3" in ONE_ROUND_NOTE
    assert md.endswith(f"\n\n## Notes\n\n- {ONE_ROUND_NOTE}\n")
    doc["notes"].remove(ONE_ROUND_NOTE)
    md = md.replace(f"\n## Notes\n\n- {ONE_ROUND_NOTE}\n", "")
    if os.environ.get("KVROUTE_REGEN_GOLDEN"):  # written by the code before --live-rounds (b0f4de5, d77d01d)
        GOLDEN_N1.mkdir(exist_ok=True)
        (GOLDEN_N1 / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
        (GOLDEN_N1 / "report.md").write_text(md)
    assert doc == json.loads((GOLDEN_N1 / "report.json").read_text())
    assert md == (GOLDEN_N1 / "report.md").read_text()


def test_a_change_is_checked_against_the_paired_simulated_changes_of_the_same_sign():
    from kvroute.calibrate.validation.validate_report import change_pair

    v = constructed_validation({"round_robin": [{"time_to_complete_s": 2.0}], "kv_aware": [{"time_to_complete_s": 1.8}]})
    ch = change_pair(v.runs[:1], v.runs[1:], "time_to_complete_s")  # simulated: 2.0/1.8, 2.1/1.9, 2.2/2.0 s
    assert ch["predicted"] == pytest.approx(-100 * 0.2 / 2.1) and ch["measured"] == pytest.approx(-10.0)
    lo, hi = ch["run_interval"]
    assert lo < -9.0 < hi < 0 and ch["inside"] is True


def test_two_live_rounds_interleave_policies_each_from_a_reset_cache(fakes, tmp_path):
    import itertools
    import statistics

    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    trace = small_chat(chats=5, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), max_in_flight=1, sim_rounds=1,
                          live_rounds=2)
    messages = []
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec, progress=messages.append)
    assert [(r.policy, r.live_round) for r in v.runs] == [("round_robin", 0), ("kv_aware", 0),
                                                         ("round_robin", 1), ("kv_aware", 1)]
    replays = [m for m in messages if m.startswith("replaying")]
    assert [m.split(": live run")[0] for m in replays] == [
        f"replaying 15 requests live with {p} (live round {r} of 2)" for r in (1, 2) for p in ("round_robin", "kv_aware")]
    # how much is left: the run's count, and from the second on the time left at the pace so far
    import re

    assert [re.search(r": live run (\d) of 4", m).group(1) for m in replays] == ["1", "2", "3", "4"]
    assert "left" not in replays[0] and all(re.search(r", about \d+ (s|min) left$", m) for m in replays[1:])
    # every run starts from a reset cache: each server saw a reset before each of the four runs' requests
    for s in servers:
        assert [k for k, _ in itertools.groupby(s.log)] == ["reset", "completion"] * 4
    assert all(r.cache_reset == [True, True] for r in v.runs)
    # ... so one at a time, both rounds of a policy hit exactly what the simulation hits
    for run in v.runs:
        assert list(run.live.workers["prefix_cache_hits"]) == list(run.sim_runs[0].workers["prefix_cache_hits"])
    rounds = v.policy_rounds()
    assert rounds["kv_aware"][0].sim_runs is rounds["kv_aware"][1].sim_runs  # one prediction per policy
    doc = json.loads(write_report(v, tmp_path).read_text())
    assert doc["live_rounds"] == 2
    for policy, runs in rounds.items():
        p = doc["policies"][policy]
        assert p["live_rounds"] == 2 and [r["live_round"] for r in p["rounds"]] == [0, 1]
        for metric, m in p["metrics"].items():
            values = [summarize(r.live)[metric] for r in runs]
            assert m["measured_rounds"] == values and m["live_rounds"] == 2 and m["measured_interval"] is None
            assert m["measured"] == statistics.fmean(values)
            assert (m["measured_min"], m["measured_max"]) == (min(values), max(values))
    ch = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["measured_rounds"] == pytest.approx([
        100 * (k.measured["time_to_complete_s"] / r.measured["time_to_complete_s"] - 1)
        for r, k in zip(rounds["round_robin"], rounds["kv_aware"])], rel=1e-12)
    assert ch["measured_interval"][0] < ch["measured_interval"][1]
    import pandas as pd

    live = pd.read_parquet(tmp_path / "records_live.parquet")
    assert len(live) == 4 * 15 and sorted(set(live["live_round"])) == [0, 1]
    assert len(pd.read_parquet(tmp_path / "records_sim.parquet")) == 2 * 15  # the prediction once per policy


def test_live_rounds_report_exact_values_for_a_constructed_case():
    from scipy.stats import t

    from kvroute.calibrate.validation.validate_report import ONE_ROUND_NOTE, report_dict

    from kvroute.calibrate.validation.validate_render import report_markdown
    from kvroute.sim.timing.heldout import heldout_spreads
    from kvroute.sim.timing.profile import load_profile
    from kvroute.sim.study.experiment import prediction_interval

    rr_tc, kv_tc = [1.0, 2.0, 3.0], [0.9, 1.5, 2.7]
    v = constructed_validation({"round_robin": [{"time_to_complete_s": x} for x in rr_tc],
                                "kv_aware": [{"time_to_complete_s": x} for x in kv_tc]}, live_rounds=3)
    doc = report_dict(v)
    assert doc["live_rounds"] == 3 and ONE_ROUND_NOTE not in doc["notes"]
    rr = doc["policies"]["round_robin"]
    m = rr["metrics"]["time_to_complete_s"]
    half = t.ppf(0.975, 2) * 1.0 / 3 ** 0.5
    assert m["predicted"] == pytest.approx(2.1) and m["measured"] == 2.0
    assert m["measured_rounds"] == rr_tc and (m["measured_min"], m["measured_max"]) == (1.0, 3.0)
    assert m["measured_interval"] == [0.0, pytest.approx(2.0 + half)]  # 2.0 - 2.48 s clipped to 0
    assert m["live_rounds"] == 3 and m["predicted_inside_live_range"] is True
    assert m["error_pct"] == pytest.approx(5.0)
    # 90 % interval in log space: the live rounds spread more than the seeds, so their variance / 3
    # (2 degrees of freedom) plus the prediction's own seeds' variance / 3 (2), Welch-Satterthwaite
    import math
    import statistics

    live_var = statistics.variance([math.log(x) for x in rr_tc])
    sim_var = statistics.variance([math.log(x) for x in (2.0, 2.1, 2.2)])
    # plus the fit's held-out error (cpu-tiny-qwen2-x2's, time to complete: the RMS of TTFT's and
    # ITL's log spreads), a known variance: it adds to the total, not to the degrees of freedom
    heldout = sum(x * x for x in heldout_spreads(load_profile("cpu-tiny-qwen2-x2").raw).values()) / 2
    total = live_var / 3 + sim_var / 3 + heldout
    df = total ** 2 / ((live_var / 3) ** 2 / 2 + (sim_var / 3) ** 2 / 2)
    half = t.ppf(0.95, df) * math.sqrt(total)
    assert m["run_interval"] == pytest.approx([2.1 * math.exp(-half), 2.1 * math.exp(half)], rel=1e-12)
    assert m["interval_terms"]["run_source"] == "live rounds"
    assert m["inside"] is True
    assert prediction_interval([2.0, 2.1, 2.2], future=3)[0] > 1.7  # the seeds alone: far narrower
    assert rr["live_rounds"] == 3 and rr["live_wall_time_s"] == 2.5
    assert [r["live_wall_time_s"] for r in rr["rounds"]] == [1.5, 2.5, 3.5]
    assert rr["cache_reset"] == [[True, True]] * 3 and rr["failed_requests"] == 0
    assert rr["workers"]["0"]["hit_tokens"] == {"predicted": 110.0, "measured": 110.0, "error_pct": 0.0}
    assert doc["policies"]["kv_aware"]["workers"]["0"]["hit_tokens"]["measured"] == 111.0
    assert doc["policies"]["kv_aware"]["metrics"]["time_to_complete_s"]["measured"] == pytest.approx(1.7)
    ch = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["measured"] == pytest.approx(-15.0) and ch["predicted"] == pytest.approx(-100 * 0.2 / 2.1)
    assert ch["measured_rounds"] == pytest.approx([-10.0, -25.0, -10.0])
    half = t.ppf(0.975, 2) * 75 ** 0.5 / 3 ** 0.5
    assert ch["measured_interval"] == pytest.approx([-15.0 - half, -15.0 + half])
    assert ch["predicted_inside_measured_interval"] is True and ch["live_rounds"] == 3
    md = report_markdown(v, doc)
    assert "- live: 3 rounds per policy, interleaved" in md
    assert "| time to complete (s) | 2.100 | 2.000 - 2.200 |" in md and "| 2.000 | 1.000 - 3.000 | 0.000 - " in md
    assert "95 % interval over paired rounds" in md and "prediction interval of the mean of 3 live rounds" in md
    # two rounds: no interval of a metric's mean (t(1) is 12.7), but one over the paired changes
    v = constructed_validation({"round_robin": [{"time_to_complete_s": x} for x in rr_tc[:2]],
                                "kv_aware": [{"time_to_complete_s": x} for x in kv_tc[:2]]}, live_rounds=2)
    doc = report_dict(v)
    assert doc["policies"]["round_robin"]["metrics"]["time_to_complete_s"]["measured_interval"] is None
    assert doc["changes"]["kv_aware"]["time_to_complete_s"]["measured_interval"][0] < -25.0


def test_a_server_dying_in_one_live_round_leaves_the_next_round_running_on_the_others(fakes, tmp_path):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import report_markdown, write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2, s1={"die_after": 3, "token_delay_s": 0.002})
    trace = small_chat(chats=6, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=3, sim_rounds=1,
                          live_rounds=2)
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec)
    first, second = v.runs
    assert list(first.dead) == [1] and list(second.dead) == [1]
    assert second.cache_reset == [True, None] and "did not answer before the run" in second.dead[1]
    ok = second.live.records[second.live.records["status"] == "ok"]
    assert len(ok) == len(trace.records) and (ok["worker"] == 0).all()
    doc = json.loads(write_report(v, tmp_path).read_text())
    rr = doc["policies"]["round_robin"]
    assert rr["live_rounds"] == 2 and rr["dead_workers"]["1"].startswith("live round 1: ")
    assert rr["failed_requests"] == len(first.live.records[first.live.records["status"] != "ok"]) > 0
    assert rr["rounds"][1]["dead_workers"].keys() == {"1"} and rr["workers"]["1"]["alive"] is False
    assert {f["live_round"] for f in doc["failures"]} == {0}
    text = report_markdown(v, doc)
    assert "round_robin (live round 2): worker 1" in text
    assert f"round_robin (live round 2): worker 1 ({servers[1].url}) did not answer before the run, so" in text
    assert f"round_robin (live round 1): worker 1 ({servers[1].url}) died or timed out mid-replay" in text


def test_a_stopped_server_costs_each_round_its_request_timeout_not_the_housekeepings(fakes, monkeypatch):
    """A server that accepts connections and answers nothing (SIGSTOP): every request to the
    servers (identifying them, resets, scrapes) waits at most the live requests' limit, not 30 s
    or 10 s, and the round after the one that lost it asks it twice (/metrics before
    the reset, which is then not sent, and the scrape before the run), not after the run."""
    from kvroute.calibrate.validation import validate
    from kvroute.sim.timing.profile import load_profile

    waits: list[float] = []
    asked: list[str] = []

    class Recording(validate.VllmClient):
        def __init__(self, url, model=None, timeout_s=600.0):
            super().__init__(url, model, timeout_s)
            waits.append(timeout_s)

        async def _request(self, method, path, **params):
            asked.append(f"{self.url} {method} {path}")
            return await super()._request(method, path, **params)

    monkeypatch.setattr(validate, "VllmClient", Recording)
    servers = fakes(2, s1={"freeze_after": 2, "token_delay_s": 0.002})
    trace = small_chat(chats=4, turns=2)
    spec = validate.ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=2, sim_rounds=1,
                                   live_rounds=2, timeout_s=0.5)
    v = validate.run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec,
                                progress=lambda msg: asked.append(msg) if "live run 2 of 2" in msg else None)
    first, second = v.runs
    assert list(first.dead) == [1] and "within 0.5 s" in first.dead[1]
    assert second.cache_reset == [True, None] and "did not answer before the run" in second.dead[1]
    assert second.before[1] is None and second.after[1] is None
    assert set(waits) == {0.5}
    later = asked[next(i for i, a in enumerate(asked) if "live run 2 of 2" in a):]
    assert [a for a in later if a.startswith(servers[1].url)] == [f"{servers[1].url} GET /metrics"] * 2


def test_validate_command_live_rounds(fakes, tmp_path):
    from click.testing import CliRunner

    from kvroute.cli.validate_command import validate

    res, doc, args = _invoke_validate(fakes(2), tmp_path, "--live-rounds", "2")
    assert "| live min - max |" in res.output and "(live round 2 of 2)" in res.output
    assert doc["live_rounds"] == 2 and doc["policies"]["kv_aware"]["live_rounds"] == 2
    bad = CliRunner().invoke(validate, args[:-1] + ["0"])
    assert bad.exit_code == 2 and "Invalid value for '--live-rounds': must be >= 1, got 0" in bad.output


def test_live_rounds_share_one_prediction_with_the_client_lag_measured_over_every_round(fakes):
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_report import send_lags
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    trace = small_chat(chats=3, turns=3)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin", "kv_aware"), sim_rounds=1,
                          client_lag_s=None, live_rounds=2)
    messages = []
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec, progress=messages.append)
    assert len(v.runs) == 4 and sum(m.startswith("simulating") for m in messages) == 1
    assert v.client_lag_s == pytest.approx(float(np.median(np.concatenate([send_lags(r, trace) for r in v.runs]))))
    for runs in v.policy_rounds().values():
        assert runs[0].predicted and all(r.sim_runs is runs[0].sim_runs and r.predicted is runs[0].predicted
                                         for r in runs)


def test_validate_against_an_unreachable_server_leaves_no_empty_output_directory(tmp_path):
    import socket

    from click.testing import CliRunner

    from kvroute.cli.validate_command import validate

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "runs" / "validate"
    res = CliRunner().invoke(validate, ["--url", f"http://127.0.0.1:{port}", "--chats", "2", "--turns", "1",
                                        "--out", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "127.0.0.1" in res.output
    assert not out.exists() and not out.parent.exists()  # runs/ was made by the run too
    bad = CliRunner().invoke(validate, ["--url", f"http://127.0.0.1:{port}", "--profile", "nope", "--out", str(out)])
    assert bad.exit_code == 2 and "'--profile'" in bad.output  # refused after --out was checked (and made)
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    kept.mkdir()
    CliRunner().invoke(validate, ["--url", f"http://127.0.0.1:{port}", "--out", str(kept)])
    assert kept.is_dir()  # a directory the user made stays


def test_engine_times_split_ttft_into_queue_prefill_and_front_end_exactly():
    """Measured: histogram deltas over all servers (sum / count), a dead server left out;
    predicted: the simulated records' vLLM-defined times, pooled over runs."""
    import pandas as pd

    from kvroute.calibrate.validation.engine_times import engine_rows, measured_times
    from kvroute.calibrate.validation.validate import PolicyRun
    from kvroute.calibrate.live.client import MetricsSnapshot
    from kvroute.sim.cluster.metrics import RunResult

    def snap(queue, prefill, decode, n, ttft=0.0):
        return MetricsSnapshot({"vllm:request_queue_time_seconds_sum": queue, "vllm:request_queue_time_seconds_count": n,
                                "vllm:request_prefill_time_seconds_sum": prefill,
                                "vllm:request_prefill_time_seconds_count": n,
                                "vllm:request_decode_time_seconds_sum": decode,
                                "vllm:request_decode_time_seconds_count": n,
                                "vllm:time_to_first_token_seconds_sum": ttft,
                                "vllm:time_to_first_token_seconds_count": n}, {})

    nan = float("nan")

    def row(rid, ttft, queue, prefill, decode, status="ok"):
        return (rid, None, None, 0, 0.0, ttft, 1.0, ttft, 1.0, 0.1, 100, 0, 5, 0, status, None, 0.0, nan, nan,
                queue, prefill, decode, nan)

    sims = [RunResult(pd.DataFrame([row(0, 0.2, 0.01, 0.05, 0.4), row(1, 0.3, 0.03, 0.07, 0.6)], columns=RECORD_COLUMNS),
                      np.array([]), pd.DataFrame(), "kv_aware", 0),
            RunResult(pd.DataFrame([row(0, 0.2, 0.02, 0.06, 0.5), row(1, nan, nan, nan, nan, "failed")],
                                   columns=RECORD_COLUMNS), np.array([]), pd.DataFrame(), "kv_aware", 1)]
    run = PolicyRun("kv_aware", {"ttft_mean_s": 0.25}, sims, measured={"ttft_mean_s": 0.3},
                    before=[snap(1.0, 2.0, 3.0, 10), snap(0.0, 0.0, 0.0, 0), None],
                    after=[snap(1.06, 2.3, 4.2, 13, ttft=0.6), snap(0.04, 0.1, 0.8, 1, ttft=0.4), snap(9.0, 9.0, 9.0, 9)])
    got = measured_times(run)
    assert got["queue_time"] == pytest.approx(0.1 / 4) and got["prefill_time"] == pytest.approx(0.4 / 4)
    assert got["decode_time"] == pytest.approx(2.0 / 4)
    assert got["front_end"] == pytest.approx(0.3 - 0.025 - 0.1)
    assert got["api_front_end"] == pytest.approx(1.0 / 4 - 0.025 - 0.1)  # vLLM's TTFT 0.25 s
    assert got["client"] == pytest.approx(0.3 - 0.25)
    rows = engine_rows([run])
    assert rows["queue_time"]["predicted"] == pytest.approx(0.02)  # (0.01 + 0.03 + 0.02) / 3 finished
    assert rows["prefill_time"]["predicted"] == pytest.approx(0.06)
    assert rows["decode_time"]["predicted"] == pytest.approx(0.5)
    assert rows["front_end"]["predicted"] == pytest.approx(0.25 - 0.02 - 0.06)
    assert rows["client"]["predicted"] is None and rows["client"]["measured"] == pytest.approx(0.05)
    assert rows["ttft"] == {"label": "TTFT, all requests (client)", "predicted": 0.25, "measured": 0.3,
                            "error_pct": pytest.approx(100 * (0.25 - 0.3) / 0.3)}
    # both sides under a millisecond: agreement, not a relative error (15 us measured, 0 predicted
    # was "-100 %")
    from kvroute.calibrate.validation.engine_times import TIME_RESOLUTION_S

    assert TIME_RESOLUTION_S == 1e-3
    quiet = dataclasses.replace(run, before=[snap(0.0, 2.0, 3.0, 10)], after=[snap(0.000015, 2.3, 4.2, 11)])
    quiet.sim_runs = [RunResult(pd.DataFrame([row(0, 0.2, 0.0, 0.05, 0.4)], columns=RECORD_COLUMNS), np.array([]),
                                pd.DataFrame(), "kv_aware", 0)]
    rows = engine_rows([quiet])
    assert rows["queue_time"] == {"label": "engine queue time", "predicted": 0.0, "measured": pytest.approx(1.5e-5),
                                  "error_pct": None}
    assert rows["prefill_time"]["error_pct"] == pytest.approx(100 * (0.05 - 0.3) / 0.3)
    # a server without these histograms (another vLLM) gives None, not a wrong number
    bare = PolicyRun("kv_aware", {}, [], measured={}, before=[MetricsSnapshot({}, {})], after=[MetricsSnapshot({}, {})])
    assert math.isnan(measured_times(bare)["queue_time"])


def test_the_client_lag_line_says_what_the_simulation_does_with_the_measured_lags():
    """Measured lags are drawn from, a fixed lag is added to each later turn, 0 adds none."""
    from kvroute.calibrate.validation.validate_render import _lag_text

    lag = {"n": 4, "median": 0.0015, "p90": 0.004, "max": 0.005}
    head = "; the client sent later turns 1.5 ms (median, p90 4.0 ms) after their parent's last token, "
    assert _lag_text(lag, 0.0015, measured=True) == (
        head + "the simulation draws each later turn's lag from these measured ones (--client-lag measured)")
    assert _lag_text(lag, 0.002) == head + "the simulation adds 2.0 ms to each (--client-lag)"
    assert _lag_text(lag, 0.0) == head + "which the simulation does not add (--client-lag 0)"
    assert _lag_text(None, 0.0) == ""


def test_two_live_rounds_say_that_their_own_spread_replaces_the_host_prior():
    from kvroute.calibrate.validation.validate_report import TWO_ROUNDS_NOTE, report_dict

    two = {"round_robin": [{}, {}], "kv_aware": [{}, {}]}
    assert TWO_ROUNDS_NOTE in report_dict(constructed_validation(two, live_rounds=2))["notes"]
    three = {p: [{}, {}, {}] for p in two}
    assert TWO_ROUNDS_NOTE not in report_dict(constructed_validation(three, live_rounds=3))["notes"]
    v = constructed_validation(two, live_rounds=2)
    v.spec = dataclasses.replace(v.spec, run_to_run_prior=0.0)  # no prior set: nothing is ignored
    assert TWO_ROUNDS_NOTE not in report_dict(v)["notes"]


def test_convoy_rows_split_later_turns_at_the_engines_first_token():
    import pandas as pd

    from kvroute.calibrate.validation.engine_times import convoy_rows
    from kvroute.calibrate.validation.validate import PolicyRun
    from kvroute.sim.cluster.metrics import RunResult

    nan = float("nan")

    def row(rid, worker, turn, arrival, engine_first, first, status="ok"):
        return (rid, rid % 10, turn, worker, arrival, first, first + 1.0, first - arrival, 1.0, 0.1, 100, 0, 5, 0,
                status, None, 0.0, nan, nan, nan, nan, nan, engine_first)

    def result(rows):
        return RunResult(pd.DataFrame(rows, columns=RECORD_COLUMNS), np.array([]), pd.DataFrame(), "kv_aware", 0)

    # a convoy of two later turns on worker 0 (sent at 1.0 and 1.01 s), one on worker 1, a first
    # turn (left out) and a failed request (left out)
    sim = result([row(0, 0, 1, 0.0, 0.02, 0.03), row(1, 0, 2, 1.0, 1.02, 1.021), row(2, 0, 2, 1.01, 1.05, 1.052),
                  row(3, 1, 2, 1.0, 1.03, 1.031), row(4, 1, 2, 1.1, nan, nan, "failed")])
    live = result([row(0, 0, 1, 0.0, 0.02, 0.03), row(1, 0, 2, 1.0, 1.03, 1.036), row(2, 0, 2, 1.01, 1.06, 1.068),
                   row(3, 1, 2, 1.0, 1.04, 1.046)])
    run = PolicyRun("kv_aware", {}, [sim], live=live, measured={})
    rows = convoy_rows([run])
    assert [(r["position"], r["count"]) for r in rows] == [(1, 2), (2, 1)]
    first, second = rows
    assert first["predicted_engine"] == pytest.approx((0.02 + 0.03) / 2)
    assert first["measured_engine"] == pytest.approx((0.03 + 0.04) / 2)
    assert first["measured_out"] == pytest.approx(0.006) and first["predicted_out"] == pytest.approx(0.001)
    assert second["measured_engine"] == pytest.approx(0.05) and second["measured_out"] == pytest.approx(0.008)
    assert second["measured_ttft"] == pytest.approx(0.058) and second["predicted_ttft"] == pytest.approx(0.042)
    # live records without engine first-token times (servers without KV-cache events): no rows
    untimed = result([row(1, 0, 2, 1.0, nan, 1.036)])
    assert convoy_rows([PolicyRun("kv_aware", {}, [sim], live=untimed, measured={})]) == []


@pytest.mark.parametrize("behaviour, expected", [
    ("fails", "reading the KV-cache events of tcp://127.0.0.1:1, tcp://127.0.0.1:2 failed: "
              "ModuleNotFoundError: No module named 'msgspec'"),
    ("silent", "no KV-cache event arrived from tcp://127.0.0.1:1, tcp://127.0.0.1:2"),
    ("works", None),
    ("lossy", None),
])
def test_a_kv_event_feed_that_gives_nothing_is_reported(fakes, monkeypatch, behaviour, expected):
    """A feed that fails or stays silent is the run's events problem; one that loses batches on
    the way is not, and its losses are kept for the run's notes."""
    import msgspec

    from kvroute.calibrate.live.kv_events import LiveKVEvents

    async def run(self):
        if behaviour == "fails":
            raise ModuleNotFoundError("No module named 'msgspec'")
        if behaviour == "works":
            self.apply(0, [], ts=0.0)
        if behaviour == "lossy":
            for seq in (0, 3):
                self.receive(1, [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([0.0, []])])
        await asyncio.Event().wait()  # subscribed until cancelled

    monkeypatch.setattr(LiveKVEvents, "run", run)
    replay = _replay(small_chat(), fakes(2), kv_event_endpoints=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
    assert (replay.result().records["status"] == "ok").all()  # the replay itself goes on
    if expected is None:
        assert replay.events_problem is None
    else:
        assert replay.events_problem.startswith(expected)
    assert replay.events_losses == ([] if behaviour != "lossy" else [
        "tcp://127.0.0.1:2: 2 KV-event batch(es) lost (gaps in the sequence numbers); the KV-event index may "
        "miss their blocks"])
    assert replay.result().records["engine_first_token"].isna().all()  # no block was ever stored


def test_open_loop_prompts_of_a_reordered_session_are_built_once(monkeypatch):
    """Open loop, every turn of a 2,000-turn session sent before its parent: each prompt is built
    once (an ancestor built ahead is kept for its own send), each equals the in-order prompt, and
    nothing is kept once every turn is sent."""
    recs = [TraceRecord(0, 0.0, 16, 1, (7,))]
    for i in range(1, 2000):
        recs.append(TraceRecord(i, 0.0, recs[-1].input_length + 2, 1, parent=i - 1))
    trace = Trace(recs, 16)
    spec = ReplaySpec(closed_loop=False)
    in_order = LiveReplay(trace, [Endpoint("http://127.0.0.1:1", "fake")], BLOCK, spec)
    want = {r.request_id: in_order._prompt_ids(r).tolist() for r in recs}
    replay = LiveReplay(trace, [Endpoint("http://127.0.0.1:1", "fake")], BLOCK, spec)
    built = []
    child = replay.prompts.child
    monkeypatch.setattr(replay.prompts, "child", lambda rec, *a: built.append(rec.request_id) or child(rec, *a))
    got = {r.request_id: replay._prompt_ids(r).tolist() for r in (recs[i ^ 1] for i in range(len(recs)))}
    assert got == want
    assert sorted(built) == list(range(1, len(recs)))
    assert replay._prompt == {} and in_order._prompt == {}


def test_validate_exits_non_zero_when_no_request_was_measured(fakes, tmp_path):
    """Servers that drop every completion: the report is written (nothing is lost) and the
    command fails, since no number in it was measured."""
    from click.testing import CliRunner

    from kvroute.cli.validate_command import validate
    from kvroute.traces.writer import write_trace

    servers = fakes(2, s0={"die_after": 0}, s1={"die_after": 0})
    trace_file = tmp_path / "chat.jsonl"
    write_trace(small_chat(chats=2, turns=2), trace_file)
    out = tmp_path / "out"
    args = ["--trace", str(trace_file), "--policies", "round_robin", "--profile", "a6000-qwen2.5-7b",
            "--out", str(out), "--rounds", "1", "--timeout", "5"]
    for s in servers:
        args += ["--url", s.url]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == ("Error: no live request was measured (each one failed or was not "
                                              "sent: report.md says why)")
    assert (out / "report.json").exists()


def test_speed_probes_around_the_live_rounds_give_the_drift_the_intervals_use(fakes, tmp_path):
    """--speed-probes 2: two probe requests per server one at a time and a burst of four per server
    before the first and after the last live round, against the profile's prediction of the same
    probe (no probe after calibrating); the drift of each probe quantity goes into the report and
    shifts and widens the time intervals."""
    from kvroute.calibrate.validation.probe import PREDICTED_ROUNDS, PROBE_BURST, fits_long
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_report import report_dict
    from kvroute.sim.timing.drift import metric_drift
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=1, sim_rounds=2,
                          speed_probes=2, interval_level=0.8)
    v = run_validation(small_chat(chats=2, turns=2), load_profile("cpu-tiny-qwen2"), spec)
    assert set(v.probes) == {"before", "after", "predicted"}
    for when in ("before", "after"):
        assert len(v.probes[when]["ttft_s"]) == 4 and len(v.probes[when]["burst_ttft_s"]) == 2 * PROBE_BURST
    assert len(v.probes["predicted"]["ttft_s"]) == 4 * PREDICTED_ROUNDS
    assert len(v.probes["predicted"]["burst_itl_s"]) == 2 * PROBE_BURST * PREDICTED_ROUNDS
    long = {"long_ttft", "long_itl"} if fits_long(v.servers[0].max_model_len) else set()
    assert not long  # the fake servers' context is shorter than the long part's 8,224 tokens: it is left out
    assert set(v.drift) == {"ttft", "itl", "burst_ttft", "burst_itl"} | long
    assert all(d.factor > 0 for d in v.drift.values())
    doc = report_dict(v)
    assert doc["interval_level"] == 0.8 and set(doc["drift"]) == set(v.drift)
    assert doc["probe_reference"] == "predicted"
    assert v.sim_spec.profile.name == "cpu-tiny-qwen2 x probe"  # predicted with the probes' speed
    assert doc["speed_scale"] == v.speed_scale.to_dict() and v.speed_scale.source.startswith("speed probes")
    m = doc["policies"]["round_robin"]["metrics"]["ttft_mean_s"]
    assert m["interval_terms"]["drift_factor"] == pytest.approx(metric_drift("ttft_mean_s", v.drift).factor)
    assert doc["policies"]["round_robin"]["metrics"]["hit_rate"]["interval_terms"]["drift_factor"] == 1.0
    # the interval is centred on the prediction times the drift, which the report gives beside it
    factor = metric_drift("ttft_mean_s", v.drift).factor
    assert m["drift_factor"] == pytest.approx(factor) and m["predicted_with_drift"] == pytest.approx(m["predicted"] * factor)
    lo, hi = m["run_interval"]
    assert lo < m["predicted_with_drift"] < hi
    assert "predicted_with_drift" not in doc["policies"]["round_robin"]["metrics"]["hit_rate"]
    # and the error against that centre beside the error against the prediction
    assert m["error_pct_with_drift"] == pytest.approx(100 * (m["predicted"] * factor - m["measured"]) / m["measured"])
    from kvroute.calibrate.validation.validate_render import report_markdown

    md = report_markdown(v, doc)
    assert f"(x{factor:.2f} drift: " in md
    assert f"| {m['error_pct']:+.1f}% (drift: {m['error_pct_with_drift']:+.1f}%) |" in md
    # the probes before and after the rounds, in words, among the notes; their samples in report.json
    from kvroute.calibrate.validation.validate import probe_text

    assert (f"speed probe before the live rounds: {probe_text(v.probes['before'])}; after them: "
            f"{probe_text(v.probes['after'])}") in doc["notes"]
    assert doc["probes"]["before"]["ttft_s"] == v.probes["before"]["ttft_s"]


@pytest.mark.parametrize("fault, why", [("die_after", "Cannot connect"), ("freeze_after", "TimeoutError")])
def test_a_server_lost_in_the_rounds_fails_the_probe_after_them_and_loses_nothing(fakes, tmp_path, fault, why):
    """--speed-probes with a server killed (or stopped) during the live rounds: the probe after
    them cannot reach it, so the profile is rescaled to the probe before them alone, no drift is
    measured, a note says so, and the live rounds are reported with their prediction."""
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(2, s1={fault: 7})  # the probe before the rounds sends each server 2 + 4 requests
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=2, sim_rounds=1,
                          speed_probes=2, timeout_s=1.0)
    v = run_validation(small_chat(chats=4, turns=2), load_profile("cpu-tiny-qwen2"), spec)
    assert set(v.probes) == {"before"} and v.drift == {} and v.predicted and not v.interrupted
    assert v.speed_scale is not None and list(v.runs[0].dead) == [1]
    note = next(n for n in v.notes if "the one after them failed" in n)
    assert why in note and note.endswith("so the profile is rescaled to the probe before them alone and the host's "
                                         "drift is not measured (the intervals hold none)")
    doc = json.loads(write_report(v, tmp_path).read_text())
    rr = doc["policies"]["round_robin"]
    assert rr["failed_requests"] > 0 and rr["dead_workers"].keys() == {"1"}
    assert rr["metrics"]["time_to_complete_s"]["measured"] > 0 and rr["metrics"]["time_to_complete_s"]["predicted"] > 0


def test_the_html_page_states_the_reports_own_level_and_what_the_intervals_hold():
    """report.html carries report.md's interval level (not a fixed 95 %), the change intervals and
    the closing coverage paragraph."""
    from kvroute.calibrate.validation.validate_report import report_dict
    from kvroute.calibrate.validation.validate_render import coverage_text, policy_line, report_page
    from kvroute.sim.study.report import render

    v = constructed_validation({"round_robin": [{"time_to_complete_s": 1.8}], "kv_aware": [{"time_to_complete_s": 1.5}]})
    doc = json.loads(json.dumps(report_dict(v), default=str))
    page = report_page(doc, [])
    policy = page.tables[0]
    assert policy.header[3] == "90 % interval of one live run"
    changes = page.tables[-1]
    assert changes.header[3] == "90 % interval of one live run"
    assert page.notes[0] == coverage_text(doc)
    # 2 policies x 9 checked metrics + 6 changes: the failed-request count is compared, not checked
    assert coverage_text(doc).startswith(f"{doc['inside_interval']['inside']} of 24 measured values fall inside their "
                                         "90 % prediction interval. Each interval is of one live run")
    head = render(page).split("<table")[1].split("</tr>")[0]
    # the checked interval at the report's level; 95 % only for the spread of the prediction's seeds
    assert "<th>90 % interval of one live run</th>" in head and head.count("95 %") == 1
    assert "<th>95 % interval of the prediction</th>" in head
    # what report.md gives per policy is on the page too: the live run's line, each worker's hit
    # tokens and where the time goes
    assert policy.note == policy_line(doc, doc["policies"]["round_robin"])
    assert policy.note.startswith("live wall time 1.5 s, client CPU 20 % of it, failed requests 0")
    assert [row[0] for row in policy.rows[-2:]] == ["hit tokens, worker 0", "hit tokens, worker 1"]
    assert [c.text for c in policy.rows[-2][1:]] == ["110", "-", "-", "100", "-", "+10.0%"]  # whole counts
    times = page.tables[1]
    assert times.table_id == "times-round_robin" and times.caption.startswith("round_robin: Where the time goes")
    assert [row[0] for row in times.rows] == [r["label"] for r in doc["policies"]["round_robin"]["engine_times"].values()]
    assert [t.table_id for t in page.tables] == ["policy-round_robin", "times-round_robin", "policy-kv_aware",
                                                  "times-kv_aware", "changes"]


def test_a_report_without_probes_says_when_every_time_is_off_by_one_factor():
    """speed_hint: the geometric mean of measured / predicted over time to complete, TTFT, ITL
    and E2E of every policy; a note from x1.5 either way when every time is off the same way."""
    from kvroute.calibrate.validation.validate_report import speed_hint

    def doc(*pairs):
        keys = ("time_to_complete_s", "ttft_mean_s", "itl_mean_s", "e2e_mean_s", "hit_rate")
        return {"policies": {"rr": {"metrics": {k: {"predicted": p, "measured": m} for k, (p, m) in zip(keys, pairs)}}}}

    slow = speed_hint(doc((1.0, 4.0), (0.1, 0.4), (0.01, 0.04), (1.0, 4.0), (0.5, 0.1)))  # hit rate is not a time
    assert slow.startswith("the measured times are x4.00 the predicted ones on average") and "--speed-probes 3" in slow
    assert speed_hint(doc((4.0, 1.0), (0.4, 0.1))).startswith("the measured times are x0.25")
    assert speed_hint(doc((1.0, 1.4), (0.1, 0.14))) is None  # within x1.5
    assert speed_hint(doc((1.0, 4.0), (0.1, 0.05))) is None  # not all off the same way
    assert speed_hint(doc((1.0, 4.0))) is None  # one time is not a pattern
    # TTFT and ITL off in opposite directions, each by x1.5 or more: prefill and decode at other speeds
    mixed = speed_hint(doc((1.0, 1.1), (0.5, 0.1), (0.01, 0.02)))
    assert mixed.startswith("the measured TTFT is x0.20 the predicted and the measured ITL x2.00") and \
        "--speed-probes 3" in mixed
    assert speed_hint(doc((1.0, 1.1), (0.5, 0.1), (0.01, 0.014))) is None  # ITL within x1.5


def test_servers_sharing_a_machine_under_a_profile_without_a_host_model_get_a_note():
    """Two URLs on one machine (every loopback name is one) and no host model: the note; a host
    model, or servers on separate machines: none."""
    from kvroute.calibrate.live.client import ServerInfo
    from kvroute.calibrate.live.server import machine_key
    from kvroute.calibrate.validation.validate import shared_host_note
    from kvroute.sim.timing.profile import load_profile

    assert [machine_key(h) for h in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "127.0.0.2", "GPU-1")] == \
        ["loopback"] * 5 + ["gpu-1"]

    def servers(*urls):
        return [ServerInfo(url=u, model="tiny-qwen2", model_root="/m", served_models=("tiny-qwen2",),
                           vllm_version="0.32.0", max_model_len=32768, block_size=32, num_gpu_blocks=4096,
                           enable_prefix_caching=True, max_num_batched_tokens=2048, max_num_seqs=128,
                           hardware="CPU", device="cpu") for u in urls]

    plain, with_host = load_profile("cpu-tiny-qwen2-x2"), load_profile("cpu-tiny-qwen2-x2-bursts")
    assert plain.host is None and with_host.host is not None
    note = shared_host_note(plain, servers("http://127.0.0.1:8100", "http://localhost:8101", "http://gpu-2:8000"))
    assert note.startswith("2 of the 3 servers share a machine, but profile 'cpu-tiny-qwen2-x2' has no host model")
    assert "docs/log/2026-12-05-policy-change-sign.md" in note
    assert shared_host_note(with_host, servers("http://127.0.0.1:8100", "http://127.0.0.1:8101")) is None
    assert shared_host_note(plain, servers("http://gpu-1:8000", "http://GPU-2:8000")) is None
    assert shared_host_note(plain, servers("http://gpu-1:8000")) is None


def test_the_coverage_paragraph_gives_the_widths_the_largest_term_and_the_live_range():
    """Median width of the time intervals (high / low) and of the changes (pp); past x3, the term
    that makes most of the times' width; with several live rounds, how many predictions lie in
    the rounds' min-max."""
    from kvroute.calibrate.validation.validate_render import _live_range_text, _width_text

    def metric(label, lo, hi, in_range, **terms):
        return {"label": label, "run_interval": [lo, hi], "inside": True, "predicted_inside_live_range": in_range,
                "interval_terms": {"drift_factor": 1.0, "prediction_seeds": 0.001, "heldout_var": 0.0,
                                   "drift_var": 0.0, **terms}}

    doc = {"live_rounds": 3, "policies": {"round_robin": {"metrics": {
        "time_to_complete_s": metric("time to complete (s)", 1.0, 8.0, False, heldout_var=0.4),
        "ttft_mean_s": metric("TTFT mean (s)", 0.1, 0.5, True, heldout_var=0.2),
        "itl_mean_s": metric("ITL mean (s)", 0.002, 0.004, False, run_to_run=0.05),
        "hit_rate": metric("hit rate (cached/prompt tokens)", 0.5, 0.6, True),
        "failed": {"label": "failed requests", "run_interval": [None, None], "inside": None}}}},
        "changes": {"kv_aware": {"time_to_complete_s": {"run_interval": [-40.0, 10.0], "inside": True},
                                 "ttft_mean_s": {"run_interval": [-100.0, 50.0], "inside": False}}}}
    text, = _width_text(doc)
    # times x8, x5, x2 (the hit rate is a share): median x5; changes 50 and 150 pp: median 100
    assert text.startswith("Median width: x5.00 (high / low) for times, 100 pp for changes. These intervals are wide, "
                           "mostly from the fit's held-out error")
    assert text.endswith("one from a quick sweep narrows with a full one (kvroute calibrate measure, then fit), one "
                         "from a full sweep does not.")
    doc["policies"]["round_robin"]["metrics"]["time_to_complete_s"]["run_interval"] = [1.0, 2.0]
    assert _width_text(doc) == ["Median width: x2.00 (high / low) for times, 100 pp for changes."]
    assert _live_range_text(doc) == ["The prediction itself lies within the live rounds' min - max for 2 of 4 values."]
    assert _live_range_text({**doc, "live_rounds": None}) == []


def test_change_intervals_stop_at_minus_100_percent():
    """A change of a time or share cannot fall by more than 100 %: its checked interval and the
    paired rounds' interval are clipped there."""
    from kvroute.calibrate.validation.validate_report import report_dict

    v = constructed_validation({"round_robin": [{"time_to_complete_s": 1.0}, {"time_to_complete_s": 1.0}],
                                "kv_aware": [{"time_to_complete_s": 0.05}, {"time_to_complete_s": 3.0}]},
                               live_rounds=2)
    ch = report_dict(v)["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["measured_rounds"] == [pytest.approx(-95.0), pytest.approx(200.0)]
    assert ch["run_interval"][0] == -100.0 and ch["measured_interval"][0] == -100.0
    assert ch["run_interval"][1] > 200.0 and ch["measured_interval"][1] > 200.0


def test_report_html_holds_every_table_and_scenario_line_of_report_md():
    """report.md and report.html are rendered from the same tables: with three live rounds each
    md table (header and rows) is on the page, and so is every scenario line."""
    from kvroute.calibrate.validation.validate_report import report_dict
    from kvroute.calibrate.validation.validate_render import (markdown_table, report_markdown, report_page,
                                                              scenario_lines)

    v = constructed_validation({p: [{"time_to_complete_s": x} for x in (1.8, 2.0, 1.6)]
                                for p in ("round_robin", "kv_aware")}, live_rounds=3)
    doc = json.loads(json.dumps(report_dict(v), default=str))
    md, page = report_markdown(v, doc), report_page(doc, [])
    assert [t.table_id for t in page.tables] == ["policy-round_robin", "times-round_robin", "policy-kv_aware",
                                                  "times-kv_aware", "changes"]
    for table in page.tables:
        assert "\n".join(markdown_table(table)) in md
    assert page.tables[0].header[5:8] == ["live min - max", "95 % interval of the live mean", "prediction in live range"]
    assert page.tables[-1].header[5] == "95 % interval over paired rounds"
    assert scenario_lines(doc)[1].startswith("live: 3 rounds per policy")
    assert all(line.replace("`", "") in page.scenario for line in scenario_lines(doc))


def test_a_profile_that_misses_its_held_out_experiments_by_far_gets_a_note():
    from kvroute.calibrate.validation.validate_report import ROUGH_FIT_LOG_SD, rough_fit_note

    assert ROUGH_FIT_LOG_SD == 0.5
    assert rough_fit_note("cpu2", {"ttft": 0.13, "itl": 0.26}) is None
    assert rough_fit_note("cpu2", {}) is None
    note = rough_fit_note("cpu2q", {"ttft": 0.3, "itl": 1.2})
    assert note.startswith("profile 'cpu2q' misses the experiments its fit held out by a log sd of 1.20 for ITL "
                           "(one sd is x3.3): its predictions are rough")


def test_the_coverage_paragraph_counts_the_values_without_an_interval_and_md_names_its_provenance():
    from kvroute.calibrate.validation.validate_render import _unchecked_text, report_markdown

    doc = {"policies": {"rr": {"metrics": {"hit_rate": {"inside": None}, "failed": {"inside": None},
                                           "ttft_mean_s": {"inside": True}}}},
           "changes": {"kv": {"hit_rate": {"inside": None}, "ttft_mean_s": {"inside": False}}}}
    assert _unchecked_text(doc) == ["2 more value(s) have no interval, as no term gives them a spread (with --rounds 1, "
                                    "a share the seeds do not move); they are not counted."]
    doc["policies"]["rr"]["metrics"]["hit_rate"]["inside"] = doc["changes"]["kv"]["hit_rate"]["inside"] = True
    assert _unchecked_text(doc) == []  # the failed-request count is never checked, so not named
    v = constructed_validation({"round_robin": [{}], "kv_aware": [{}]})
    from kvroute.calibrate.validation.validate_report import report_dict

    doc = report_dict(v)
    doc["provenance"] = {"version": "0.1.0", "command": "validate", "profile": {"name": "p", "sha256": "ab" * 32}}
    assert report_markdown(v, doc).endswith("\n\nMade by kvroute 0.1.0 (`validate`), profile `p` (sha256 abababababab); "
                                            "every option and the trace's hash are in report.json (provenance).\n")


def test_simulated_changes_pair_runs_seed_by_seed_and_keep_their_draws():
    """A pair with a missing value is dropped, and the drawn profile of each kept pair stays beside it."""
    from kvroute.calibrate.validation.validate import PolicyRun
    from kvroute.calibrate.validation.validate_report import simulated_changes

    base = PolicyRun("round_robin", {}, [], run_values={"time_to_complete_s": [2.0, None, 4.0, 5.0],
                                                        "hit_rate": [0.5, 0.6, 0.7, 0.8]})
    other = PolicyRun("kv_aware", {}, [], run_values={"time_to_complete_s": [1.0, 3.0, 5.0, None],
                                                      "hit_rate": [0.75, 0.6, 0.7, 0.9]}, run_draws=[-1, -1, 0, 1])
    assert simulated_changes(base, other, "time_to_complete_s") == ([-50.0, 25.0], [-1, 0])
    changes, draws = simulated_changes(base, other, "hit_rate")  # a share's change in percentage points
    assert changes == pytest.approx([25.0, 0.0, 0.0, 10.0]) and draws == [-1, -1, 0, 1]


def test_the_bench_and_the_report_check_against_the_same_intervals(monkeypatch):
    """``bench/bench_validate.py``'s coverage rows and ``kvroute validate``'s report take their
    intervals from the same functions: the same live rounds give the same interval ends."""
    import importlib.util

    import kvroute.sim.cluster.metrics

    from kvroute.calibrate.validation.validate_report import report_dict
    from tests.support.paths import ROOT

    spec = importlib.util.spec_from_file_location("bench_validate", ROOT / "bench" / "bench_validate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rounds = {"round_robin": [{"time_to_complete_s": t, "later_ttft_mean_s": f} for t, f in
                              [(2.0, 0.40), (2.3, 0.45), (1.9, 0.38)]],
              "kv_aware": [{"time_to_complete_s": t, "later_ttft_mean_s": f} for t, f in
                           [(1.7, 0.30), (1.9, 0.36), (1.8, 0.31)]]}
    v = constructed_validation(rounds, live_rounds=3)
    # the bench's older 95 % difference interval (interval_pp) re-summarizes the simulated runs,
    # whose hand-built records here have only a few columns; it is not what this test compares
    monkeypatch.setattr(kvroute.sim.cluster.metrics, "summarize", lambda run: {"time_to_complete_s": 1.0,
                                                                             "later_ttft_mean_s": 1.0})
    doc = json.loads(json.dumps(report_dict(v), default=str))
    rows, _ = bench.score("s", "p", v.runs[:2], v, rounds=3, load=(0.0, 0.0), level=v.spec.interval_level,
                          profile_raw=v.sim_spec.profile.raw)
    by = {(r["policy"], r["metric"]): r["interval"] for r in rows}
    for policy in ("round_robin", "kv_aware"):
        for metric in ("time_to_complete_s", "later_ttft_mean_s", "tpot_mean_s"):
            assert by[policy, metric] == pytest.approx(doc["policies"][policy]["metrics"][metric]["run_interval"])
    for metric in ("time_to_complete_s", "later_ttft_mean_s"):
        checked = doc["changes"]["kv_aware"][metric]["run_interval"]
        assert by["kv_aware vs round_robin", f"change {metric}"] == pytest.approx(checked)
        assert checked[0] < checked[1]


def test_a_failed_request_s_partial_stream_is_not_timed(fakes):
    """ITL pools the gaps of requests served whole only, as the other timings take ok requests only."""
    servers = fakes(1, s0={"cut_after_tokens": 5})
    replay = _replay(small_chat(chats=2, turns=1), servers, policy="round_robin", max_in_flight=1)
    res = replay.result()
    assert (res.records["status"] != "ok").all() and list(replay.dead) == [0]
    assert len(res.itl) == 0  # the first request's 4 gaps before the cut were counted before
    s = summarize(res)
    assert math.isnan(s["itl_mean_s"]) and math.isnan(s["itl_p90_s"])


def test_a_run_with_no_request_served_has_no_measured_metrics(fakes, tmp_path):
    """Every request failed: nothing is measured, compared or counted, and the note says none was served."""
    from kvroute.calibrate.validation.validate import ValidationSpec, run_validation
    from kvroute.calibrate.validation.validate_render import write_report
    from kvroute.sim.timing.profile import load_profile

    servers = fakes(1, s0={"cut_after_tokens": 5})
    trace = small_chat(chats=2, turns=2)
    spec = ValidationSpec(tuple(s.url for s in servers), ("round_robin",), max_in_flight=1, sim_rounds=1)
    v = run_validation(trace, load_profile("a6000-qwen2.5-7b"), spec)
    run = v.runs[0]
    assert run.measured["failed"] == 4.0
    assert all(math.isnan(x) for k, x in run.measured.items() if k != "failed")
    doc = json.loads(write_report(v, tmp_path).read_text())
    metrics = doc["policies"]["round_robin"]["metrics"]
    assert all(m["measured"] is None and m["inside"] is None for k, m in metrics.items() if k != "failed")
    assert doc["inside_interval"]["checked"] == 0
    assert "round_robin: none of the 4 requests was served (all failed or were not sent), so it has no measured " \
           "metrics: its values and the changes involving it are not compared" in doc["notes"]
    assert not any("cover the rest" in n for n in doc["notes"])
    md = (tmp_path / "report.md").read_text()
    assert "were not measured (no request of that run was served, see the notes); they are not counted." in md


def test_an_engine_dead_500_marks_its_worker_dead(fakes):
    """vLLM's API process answers HTTP 500 "EngineCore encountered an issue" once its engine died:
    the worker is dead at the first such answer, as with a refused connection."""
    servers = fakes(2, s1={"fail_after": 1})
    replay = _replay(small_chat(chats=4, turns=2), servers, policy="round_robin", max_in_flight=1)
    assert replay.dead == {1: "its engine died (HTTP 500: EngineCore encountered an issue. See stack trace "
                              "(above) for the root cause.)"}
    assert servers[1].failed == 1 and servers[1].started == 1
    df = replay.result().records
    assert (df.loc[df["status"] == "ok", "worker"] != 1).sum() >= 1


def test_three_5xx_in_a_row_mark_a_worker_dead(fakes, tmp_path):
    servers = fakes(2, s1={"fail_after": 0, "fail_body": b'{"error": {"message": "Internal Server Error"}}'})
    replay = _replay(small_chat(chats=8, turns=1), servers, policy="round_robin", max_in_flight=1)
    assert replay.dead == {1: "3 requests in a row failed with HTTP 5xx (HTTP 500: Internal Server Error)"}
    assert servers[1].failed == 3
    df = replay.result().records
    # round robin: 0, 1, 0, 1, 0, 1 (the third 500: dead), then 0, 0
    assert df["worker"].tolist() == [0, 1, 0, 1, 0, 1, 0, 0] and (df["status"] == "ok").sum() == 5


def test_a_run_cut_short_is_not_checked_against_the_whole_trace():
    """An interrupted run, or one that lost a worker, keeps its values but is not checked or counted:
    its prediction is of the whole trace on every worker."""
    from kvroute.calibrate.validation.validate_report import report_dict
    from kvroute.calibrate.validation.validate_render import report_markdown

    def report(**cut):
        v = constructed_validation({"round_robin": [{"time_to_complete_s": 1.8}],
                                    "kv_aware": [{"time_to_complete_s": 1.5}]})
        for k, x in cut.items():
            setattr(v.runs[1], k, x)
        return v, json.loads(json.dumps(report_dict(v), default=str))

    _, whole = report()
    for cut, why in (({"interrupted": True}, "interrupted"), ({"dead": {1: "gone"}}, "worker 1 died"),
                     ({"interrupted": True, "dead": {0: "a", 1: "b"}}, "interrupted, workers 0, 1 died")):
        v, doc = report(**cut)
        assert doc["policies"]["round_robin"] == whole["policies"]["round_robin"]
        kv, kv_whole = doc["policies"]["kv_aware"]["metrics"], whole["policies"]["kv_aware"]["metrics"]
        was = [k for k, m in kv_whole.items() if m["inside"] is not None]
        assert was and all(kv[k]["inside"] is None and kv[k]["not_checked"] == why
                           and kv[k]["measured"] == kv_whole[k]["measured"] for k in was)
        changes = [c for ch in doc["changes"].values() for c in ch.values()]
        n_changes = sum(c["inside"] is not None for ch in whole["changes"].values() for c in ch.values())
        assert n_changes and sum(c.get("not_checked") == why for c in changes) == n_changes
        assert doc["inside_interval"]["checked"] == whole["inside_interval"]["checked"] - len(was) - n_changes
        md = report_markdown(v, doc)
        assert f"not checked: {why}" in md
        assert (f"{len(was) + n_changes} value(s) were not checked, as their live run was cut short ({why}) while "
                "the prediction is of the whole trace on every worker; they are not counted.") in md


def _cut_rounds(rr_tc, kv_tc, cut: dict):
    """:func:`constructed_validation` with three live rounds of the times to complete ``rr_tc``,
    ``kv_tc``, and ``cut[(policy, round)]`` (rounds from 0) set on that run (``dead``,
    ``interrupted``); its report.json dict, read back from JSON."""
    from kvroute.calibrate.validation.validate_report import report_dict

    v = constructed_validation({"round_robin": [{"time_to_complete_s": x} for x in rr_tc],
                                "kv_aware": [{"time_to_complete_s": x} for x in kv_tc]}, live_rounds=3)
    for run in v.runs:
        for k, x in cut.get((run.policy, run.live_round), {}).items():
            setattr(run, k, x)
    return v, json.loads(json.dumps(report_dict(v), default=str))


def _log_interval(center: float, live: list[float], seeds: list[float], heldout_var: float) -> list[float]:
    """The 90 % interval of the mean of the live rounds ``live`` (s) when their spread is above the
    seeds' ``seeds``: log space, Welch-Satterthwaite (intervals.md), centred on ``center``."""
    import statistics

    from scipy.stats import t

    live_var = statistics.variance([math.log(x) for x in live]) / len(live)
    sim_var = statistics.variance([math.log(x) for x in seeds]) / len(seeds)
    total = live_var + sim_var + heldout_var
    df = total ** 2 / (live_var ** 2 / (len(live) - 1) + sim_var ** 2 / (len(seeds) - 1))
    half = float(t.ppf(0.95, df)) * math.sqrt(total)
    return [center * math.exp(-half), center * math.exp(half)]


def _heldout_var() -> float:
    """cpu-tiny-qwen2-x2's held-out error of the time to complete (log variance: the mean of TTFT's and ITL's)."""
    from kvroute.sim.timing.heldout import heldout_spreads
    from kvroute.sim.timing.profile import load_profile

    return sum(x * x for x in heldout_spreads(load_profile("cpu-tiny-qwen2-x2").raw).values()) / 2


def test_a_live_round_cut_short_is_left_out_of_the_mean_the_others_are_checked_over():
    """Three live rounds, round_robin's second lost a worker: its values are the mean of rounds 1
    and 3, checked against the interval of the mean of two rounds; the changes pair rounds 1 and 3."""
    import statistics

    from scipy.stats import t

    from kvroute.calibrate.validation.validate_render import report_markdown

    _, whole = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {})
    v, doc = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", 1): {"dead": {1: "gone"}}})
    rr = doc["policies"]["round_robin"]
    m = rr["metrics"]["time_to_complete_s"]
    assert m["measured"] == 2.0 and whole["policies"]["round_robin"]["metrics"]["time_to_complete_s"]["measured"] == 3.0
    assert m["measured_rounds"] == [1.0, 5.0, 3.0] and m["left_out"] == [{"live_round": 1, "why": "worker 1 died"}]
    assert m["live_rounds"] == 2 and (m["measured_min"], m["measured_max"]) == (1.0, 3.0)
    assert m["measured_interval"] is None and m["predicted_inside_live_range"] is True
    expected = _log_interval(2.1, [1.0, 3.0], [2.0, 2.1, 2.2], _heldout_var())
    assert m["run_interval"] == pytest.approx(expected, rel=1e-12)
    assert m["interval_terms"]["live_rounds"] == 2 and m["interval_terms"]["run_source"] == "live rounds"
    assert m["inside"] is True and "not_checked" not in m
    assert {k: x["inside"] for k, x in rr["metrics"].items()} == {k: k != "failed" or None for k in rr["metrics"]}
    assert [r["cut_short"] for r in rr["rounds"]] == [None, "worker 1 died", None]
    assert doc["policies"]["kv_aware"] == whole["policies"]["kv_aware"]  # none of its rounds was cut short
    ch = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["measured"] == pytest.approx(-10.0) and ch["measured_rounds"] == pytest.approx([-10.0, -70.0, -10.0])
    assert ch["left_out"] == [{"live_round": 1, "why": "round_robin: worker 1 died"}] and ch["live_rounds"] == 2
    # the two pairs' changes agree (-10 %), so the seeds' paired changes (-10, -9.52, -9.09 %) make the spread
    sim = [100 * (k / b - 1) for b, k in ((2.0, 1.8), (2.1, 1.9), (2.2, 2.0))]
    half = float(t.ppf(0.95, 2)) * math.sqrt(statistics.variance(sim) * (1 / 2 + 1 / 3))
    assert ch["run_interval"] == pytest.approx([statistics.fmean(sim) - half, statistics.fmean(sim) + half], rel=1e-12)
    assert ch["inside"] is True
    md = report_markdown(v, doc)
    assert ("; left out of the measured means, their min - max and intervals, as cut short: live round 2 (worker 1 "
            "died); each value is checked against the interval of the mean of the 2 whole round(s)\n") in md
    assert ("Each change pairs live round i of a policy with live round i of round_robin and counts the pairs whole "
            "on both sides: kv_aware left out live round 2 (round_robin: worker 1 died), 2 pair(s) counted.") in md
    assert ("15 value(s) are checked over the live rounds that ran whole only, the rounds cut short (named under each "
            "table) left out, each against the interval of the mean of the rounds left.") in md
    assert "| 90 % interval of the mean of the live rounds that ran whole |" in md
    assert ("Each interval is of the mean of the live rounds it counts (of the 3 run, those cut short are left out) "
            "and combines") in md  # it read "of the mean of 3 live rounds" before saying they were left out
    assert doc["inside_interval"]["checked"] == whole["inside_interval"]["checked"]


def test_the_failed_requests_row_counts_every_round_those_cut_short_too():
    """A fresh user killed a server in round 2 of 3: 107 requests failed, and the row read 0.000
    ("0.000 in every round"), the mean of the whole rounds; it is a count, never checked, so it is
    the mean of every round, as the policy's failure count is their sum."""
    from kvroute.calibrate.validation.validate_report import report_dict

    v = constructed_validation({"round_robin": [{"time_to_complete_s": 1.0, "failed": f} for f in (0, 107, 0)],
                                "kv_aware": [{"time_to_complete_s": 0.9, "failed": 0}] * 3}, live_rounds=3)
    cut = next(r for r in v.runs if r.policy == "round_robin" and r.live_round == 1)
    cut.dead = {1: "gone"}
    m = json.loads(json.dumps(report_dict(v), default=str))["policies"]["round_robin"]["metrics"]
    assert m["failed"]["measured"] == pytest.approx(107 / 3) and m["failed"]["measured_rounds"] == [0, 107, 0]
    assert m["failed"]["live_rounds"] == 3 and m["failed"]["left_out"] == [] and m["failed"]["inside"] is None
    assert m["time_to_complete_s"]["live_rounds"] == 2  # the checked ones leave the round out


def test_a_policys_whole_trace_totals_are_of_the_rounds_that_ran_whole():
    """round_robin's second round lost a worker after 0.4 s with 10 hit tokens on worker 0: the
    wall time, the client's CPU share and the workers' means are of rounds 1 and 3, as the metrics'
    are; its failures, dead workers and its entry under ``rounds`` still count it."""
    from kvroute.calibrate.validation.validate_render import report_markdown
    from kvroute.sim.cluster.metrics import RunResult

    v, _ = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {})
    live = next(r for r in v.runs if (r.policy, r.live_round) == ("round_robin", 1)).live
    workers = live.workers.copy()
    workers.loc[0, "prefix_cache_hits"], workers.loc[0, "requests"] = 10.0, 1
    cut = {"dead": {1: "gone"}, "elapsed_s": 0.4, "client_cpu_s": 0.1,
           "live": RunResult(live.records, live.itl, workers, live.policy, live.seed)}
    v, doc = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", 1): cut})
    rr = doc["policies"]["round_robin"]
    assert rr["live_wall_time_s"] == 2.5  # rounds 1 and 3: 1.5 s and 3.5 s (all three: 1.8 s)
    assert rr["client_cpu_share"] == pytest.approx((0.3 / 1.5 + 0.3 / 3.5) / 2, rel=1e-12)
    w0 = rr["workers"]["0"]
    assert (w0["hit_tokens"]["measured"], w0["requests"]) == (110.0, 2.0)  # all three: 76.67 and 1.67
    assert rr["dead_workers"] == {"1": "live round 2: gone"}
    assert [r["live_wall_time_s"] for r in rr["rounds"]] == [1.5, 0.4, 3.5]
    md = report_markdown(v, doc)
    assert "live wall time 2.5 s (mean of 2 rounds that ran whole), client CPU 14 % of it, failed requests 0" in md
    assert "live wall time 2.5 s (mean of 3 rounds), client CPU" in md  # kv_aware: 1.5, 2.5 and 3.5 s


def test_with_every_live_round_cut_short_nothing_is_checked():
    """round_robin lost worker 1 in every round: its values are the mean of all three, keep their
    interval (of three rounds) and are not checked, nor is any change; kv_aware's are. With whole
    rounds on each side but no pair of them whole, the changes alone are not checked."""
    from kvroute.calibrate.validation.validate_render import report_markdown

    dead = {"dead": {1: "gone"}}
    _, whole = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {})
    v, doc = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", r): dead for r in range(3)})
    m = doc["policies"]["round_robin"]["metrics"]["time_to_complete_s"]
    assert m["measured"] == 3.0 and m["inside"] is None and m["not_checked"] == "worker 1 died"
    assert m["live_rounds"] == 3 and (m["measured_min"], m["measured_max"]) == (1.0, 5.0)
    assert m["left_out"] == [{"live_round": r, "why": "worker 1 died"} for r in range(3)]
    assert m["run_interval"] == pytest.approx(_log_interval(2.1, [1.0, 5.0, 3.0], [2.0, 2.1, 2.2], _heldout_var()),
                                              rel=1e-12)
    assert all(x["inside"] is None for x in doc["policies"]["round_robin"]["metrics"].values())
    assert doc["policies"]["kv_aware"] == whole["policies"]["kv_aware"]
    changes = doc["changes"]["kv_aware"]
    assert all(c["inside"] is None and c["not_checked"] == "worker 1 died" for c in changes.values())
    assert changes["time_to_complete_s"]["measured"] == pytest.approx(100 * (1.7 / 3.0 - 1))
    assert doc["inside_interval"]["checked"] == whole["inside_interval"]["checked"] - 9 - 6
    md = report_markdown(v, doc)
    assert ("; every live round was cut short (live round 1 (worker 1 died), live round 2 (worker 1 died), live round "
            "3 (worker 1 died)): the means are of them all, not checked\n") in md
    assert ("15 value(s) were not checked, as every live round (for a change, every pair of rounds) behind them was "
            "cut short (worker 1 died) while the prediction is of the whole trace on every worker") in md
    assert "kv_aware left out live round 1 (round_robin: worker 1 died), live round 2 (round_robin: worker 1 died), " \
           "live round 3 (round_robin: worker 1 died), no pair whole, so its changes are over every pair and not " \
           "checked." in md
    # round_robin whole in round 1 only, kv_aware in rounds 2 and 3: each policy checked, no change
    _, doc = _cut_rounds([1.0, 5.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", 1): dead, ("round_robin", 2): dead,
                                                            ("kv_aware", 0): dead})
    rr, kv = (doc["policies"][p]["metrics"]["time_to_complete_s"] for p in ("round_robin", "kv_aware"))
    assert (rr["measured"], rr["live_rounds"], rr["interval_terms"]["run_source"]) == (1.0, 1, "host prior")
    assert rr["predicted_inside_live_range"] is None  # one round: no range to lie in
    assert (kv["measured"], kv["live_rounds"]) == (pytest.approx(2.1), 2)
    assert rr["inside"] is False and kv["inside"] is True
    assert all(c["inside"] is None and c["not_checked"] == "worker 1 died" for c in doc["changes"]["kv_aware"].values())


def test_a_change_pairs_only_the_rounds_whole_on_both_sides():
    """round_robin's round 1 lost a worker and kv_aware's round 3 was interrupted: each policy's
    values are over its two whole rounds, and the change over the one pair whole on both sides
    (round 2), checked as one live round is: the seeds' paired changes and the host prior."""
    import statistics

    from scipy.stats import t

    from kvroute.calibrate.validation.validate_render import report_markdown
    from kvroute.sim.study.intervals import HOST_RUN_TO_RUN_LOG_SD

    v, doc = _cut_rounds([1.0, 2.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", 0): {"dead": {1: "gone"}},
                                                           ("kv_aware", 2): {"interrupted": True}})
    rr, kv = (doc["policies"][p]["metrics"]["time_to_complete_s"] for p in ("round_robin", "kv_aware"))
    assert rr["measured"] == 2.5 and rr["left_out"] == [{"live_round": 0, "why": "worker 1 died"}]
    assert kv["measured"] == pytest.approx(1.2) and kv["left_out"] == [{"live_round": 2, "why": "interrupted"}]
    assert rr["inside"] is True and kv["inside"] is True
    ch = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert ch["measured"] == pytest.approx(-25.0) and ch["live_rounds"] == 1
    assert ch["measured_rounds"] == pytest.approx([-10.0, -25.0, -10.0]) and ch["measured_interval"] is None
    assert ch["left_out"] == [{"live_round": 0, "why": "round_robin: worker 1 died"},
                              {"live_round": 2, "why": "kv_aware: interrupted"}]
    sim = [100 * (k / b - 1) for b, k in ((2.0, 1.8), (2.1, 1.9), (2.2, 2.0))]
    c = statistics.fmean(sim)
    prior = 100 * (1 + c / 100) * math.sqrt(2) * HOST_RUN_TO_RUN_LOG_SD  # change_prior_sd: one pair of rounds
    seeds = statistics.variance(sim) / 3
    total = prior ** 2 + seeds
    half = float(t.ppf(0.95, total ** 2 / (seeds ** 2 / 2))) * math.sqrt(total)
    assert ch["run_interval"] == pytest.approx([c - half, c + half], rel=1e-12)
    assert ch["interval_terms"]["run_source"] == "host prior" and ch["interval_terms"]["live_rounds"] == 1
    assert ch["inside"] is True  # -25 % against -27.5 % - +8.4 %
    md = report_markdown(v, doc)
    assert ("kv_aware left out live round 1 (round_robin: worker 1 died), live round 3 (kv_aware: interrupted), "
            "1 pair(s) counted.") in md


def test_the_bench_leaves_out_the_rounds_cut_short_as_the_report_does(monkeypatch):
    """bench_validate scores each measured value over the same whole rounds, against the same
    interval, as validate's report; scored one round at a time, a round cut short is not checked."""
    import importlib.util

    import kvroute.sim.cluster.metrics
    from tests.support.paths import ROOT

    spec = importlib.util.spec_from_file_location("bench_validate", ROOT / "bench" / "bench_validate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # the bench's older difference interval (interval_pp) re-summarizes the simulated runs' few columns
    monkeypatch.setattr(kvroute.sim.cluster.metrics, "summarize", lambda run: {"time_to_complete_s": 1.0,
                                                                             "later_ttft_mean_s": 1.0})
    v, doc = _cut_rounds([1.0, 2.0, 3.0], [0.9, 1.5, 2.7], {("round_robin", 0): {"dead": {1: "gone"}},
                                                           ("kv_aware", 2): {"interrupted": True}})
    rows, _ = bench.score("s", "p", v.runs[:2], v, rounds=3, load=(0.0, 0.0), level=v.spec.interval_level,
                          profile_raw=v.sim_spec.profile.raw, one_round=True, run_to_run_prior=0.08)
    means = {(r["policy"], r["metric"]): r for r in rows if not r.get("one_round")}
    for policy in ("round_robin", "kv_aware"):
        report = doc["policies"][policy]["metrics"]["time_to_complete_s"]
        row = means[policy, "time_to_complete_s"]
        assert (row["measured"], row["left_out"], row["inside"]) == (report["measured"], report["left_out"], True)
        assert row["interval"] == pytest.approx(report["run_interval"], rel=1e-12)
    row = means["kv_aware vs round_robin", "change time_to_complete_s"]
    report = doc["changes"]["kv_aware"]["time_to_complete_s"]
    assert row["measured"] == pytest.approx(-25.0) and row["left_out"] == report["left_out"] and row["live_rounds"] == 1
    assert row["interval"] == pytest.approx(report["run_interval"], rel=1e-12) and row["inside"] is True
    single = {(r["policy"], r["round"]): r["inside"] for r in rows
              if r.get("one_round") and r["metric"] == "time_to_complete_s"}
    assert [single["round_robin", j] is None for j in range(3)] == [True, False, False]
    assert [single["kv_aware", j] is None for j in range(3)] == [False, False, True]
    changes = [r for r in rows if r.get("one_round") and r["metric"] == "change time_to_complete_s"]
    assert [r["inside"] is None for r in changes] == [True, False, True]
    assert [r.get("not_checked") for r in changes] == ["worker 1 died", None, "interrupted"]


def test_no_speed_hint_when_the_profile_is_another_models():
    """Times all x4 the predicted ones suggest --speed-probes, unless every server serves another
    model than the profile's: then the model, not the host's speed, is what differs."""
    import dataclasses

    from kvroute.calibrate.validation.validate_report import report_dict

    slow = {"time_to_complete_s": 8.0, "ttft_mean_s": 2.4, "itl_mean_s": 2.4, "e2e_mean_s": 2.4}
    v = constructed_validation({"round_robin": [slow], "kv_aware": [slow]})
    assert any(n.startswith("the measured times are x") for n in report_dict(v)["notes"])
    v.servers[:] = [dataclasses.replace(s, model="opt-125m", model_root="/cache/opt-125m") for s in v.servers]
    assert not any(n.startswith("the measured times are x") for n in report_dict(v)["notes"])


def test_a_prediction_outside_the_live_range_says_on_which_side_and_shows_digits_that_differ():
    """Three decimals showed a predicted 0.02652 s against live rounds of 0.02736-0.02804 s as
    0.027 against 0.027 - 0.028 with "no" beside it; the cell now says below, and by how much."""
    from kvroute.calibrate.validation.validate_render import _live_range_cell, markdown_table
    from kvroute.sim.study.report import Table

    def cell(predicted, low, high, flag):
        return _live_range_cell({"predicted": predicted, "measured_min": low, "measured_max": high,
                                 "predicted_inside_live_range": flag})

    assert cell(0.02652, 0.02736, 0.02804, False).text == "no: below (0.02652 < 0.02736)"
    assert cell(2.5, 1.6, 1.9, False).text == "no: above"  # 2.500 against 1.900: the digits differ
    assert cell(1.7, 1.6, 1.9, True).text == "yes" and cell(None, 1.6, 1.9, None).text == "-"
    table = Table("t", ["prediction in live range"], [[cell(2.5, 1.6, 1.9, False)]])
    assert markdown_table(table)[-1] == "| **no: above** |"


def test_a_live_range_of_one_value_reads_as_one_value():
    """A hit rate of 0.8125 in every round read "0.812 - 0.812" beside "no: below (0.8118 < 0.8125)";
    with one round left in the mean (the others cut short) it is that round's value."""
    from kvroute.calibrate.validation.validate_render import _live_min_max, _live_range_cell

    m = {"predicted": 0.8118, "measured_min": 0.8125, "measured_max": 0.8125, "predicted_inside_live_range": False,
         "live_rounds": 3}
    assert _live_min_max(m) == "0.812 in all 3 rounds"
    assert _live_min_max({**m, "live_rounds": 1}) == "0.812 (one round)"
    assert _live_range_cell(m).text == "no: below (0.8118 < 0.8125)"
    assert _live_min_max({"measured_min": 1.6, "measured_max": 1.9}) == "1.600 - 1.900"
    assert _live_min_max({"measured_min": None, "measured_max": None}) == "-"


def test_a_prediction_equal_to_the_live_rounds_but_for_the_last_bit_lies_in_their_range():
    """A hit rate exact to the token read "no: above (0.7907 > 0.7907)": predicted
    0.7907181671317375 against a measured 0.7907181671317374, each computed its own way."""
    import math

    from kvroute.calibrate.validation.validate_report import report_dict
    from kvroute.sim.study.intervals import within

    predicted = float(np.mean([0.5, 0.55, 0.6]))  # constructed_validation's round_robin prediction
    below = math.nextafter(predicted, 0.0)
    v = constructed_validation({"round_robin": [{"hit_rate": below}] * 2, "kv_aware": [{"hit_rate": 0.6}] * 2},
                               live_rounds=2)
    m = report_dict(v)["policies"]["round_robin"]["metrics"]["hit_rate"]
    assert m["predicted"] == predicted and m["measured_max"] == below < predicted
    assert m["predicted_inside_live_range"] is True  # was False
    assert within(predicted, below, below) is True
    assert within(predicted * (1 + 1e-9), below, below) is False  # a real difference still counts
    assert within(None, 0.0, 1.0) is None and within(0.5, math.nan, 1.0) is None and within(math.inf, 0, 1) is None
