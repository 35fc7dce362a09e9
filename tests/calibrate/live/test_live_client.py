"""The one stream reader (calibrate.vllm.stream: StreamEvents, read_completion) and the client wait column.

Rules of ``vllm bench serve``: the first chunk with content is the first token; the usage
block's count wins over the chunks counted, with a warning when they disagree. A usage block
that fails its checks is a measurement error that keeps what was measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from kvroute.calibrate.live.client import stream_completion
from kvroute.calibrate.live.stream import StreamEvents
from kvroute.calibrate.validation.livestream import stream_tokens
from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.format import Trace, TraceRecord

URL = "http://127.0.0.1:1"


def _event(obj) -> bytes:
    return json.dumps(obj).encode()


def _text(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text}]}


def test_empty_first_chunk_is_not_the_first_token():
    events = StreamEvents(URL)
    assert events.feed(_event(_text(""))) == (0, [])
    assert events.feed(_event(_text("Hello"))) == (1, None)
    assert events.counted == 1 and events.token_ids is None


def test_usage_count_wins_and_disagreement_warns():
    events = StreamEvents(URL)
    for text in ("a", "b", "c"):
        events.feed(_event(_text(text)))
    events.feed(_event({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4}}))
    events.feed(b"[DONE]")
    assert events.done and events.counted == 3 and events.num_tokens == 4
    assert events.warning == (f"{URL}: usage says 4 completion tokens but 3 came in the stream's chunks; "
                              f"using the usage count")


def test_token_ids_are_counted_exactly_without_warning():
    events = StreamEvents(URL)
    events.feed(_event({"choices": [{"text": "ab", "token_ids": [5, 6]}]}))
    events.feed(_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                   "prompt_tokens_details": {"cached_tokens": 0}}}))
    assert events.token_ids == [5, 6] and events.warning is None and events.cached_tokens == 0


@pytest.mark.parametrize("cached, message", [
    (-3, "http://127.0.0.1:1: field 'usage.prompt_tokens_details.cached_tokens': must be >= 0, got -3"),
    ("7", "http://127.0.0.1:1: field 'usage.prompt_tokens_details.cached_tokens': expected an int, "
          "got a string ('7')"),
])
def test_bad_cached_tokens_is_a_measurement_error(cached, message):
    events = StreamEvents(URL)
    events.feed(_event(_text("x")))
    events.feed(_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                   "prompt_tokens_details": {"cached_tokens": cached}}}))
    assert events.usage_error == message
    assert events.cached_tokens is None and events.counted == 1


def test_non_object_event_names_the_problem():
    with pytest.raises(ValueError, match="a stream event is a list, expected a JSON object"):
        StreamEvents(URL).feed(b"[1, 2]")


# -- through a socket: a server that sends crafted events at set times -------------------------

async def _serve(events: list[tuple[float, bytes]], done: bool = True):
    async def handle(reader, writer):
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        await reader.read(1)  # the body has started; its length does not matter here
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for delay, data in events:
            await asyncio.sleep(delay)
            writer.write(b"data: " + data + b"\n\n")
            await writer.drain()
        if done:
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _stream_of_text():
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}}
    return [(0.0, _event(_text(""))), (0.15, _event(_text("a"))), (0.0, _event(_text("bc"))),
            (0.0, _event(_text("d"))), (0.0, _event(usage))]


def test_calibration_stream_ttft_is_the_first_chunk_with_content():
    async def main():
        server, url = await _serve(_stream_of_text())
        async with server:
            return await stream_completion(url, {"prompt": [1, 2]}, 30.0)

    res = asyncio.run(main())
    assert len(res.token_times) == 3 and res.ttft >= 0.15  # not the empty chunk at ~0 s
    assert res.completion_tokens == 4 and res.warning is not None and res.error is None
    assert res.num_tokens == 4


def test_calibration_row_counts_tokens_by_usage_and_keeps_the_warning():
    """``calibrate measure``'s row: n_tokens is the usage count (the bursts' TPOT divides by it)."""
    from types import SimpleNamespace

    from kvroute.calibrate.live.client import StreamResult
    from kvroute.calibrate.calibration.measure import _request_row

    warning = f"{URL}: usage says 4 completion tokens but 3 came in the stream's chunks; using the usage count"
    res = StreamResult(t_send=10.0, token_times=[0.15, 0.2, 0.25], prompt_tokens=2, completion_tokens=4,
                       t_done=0.3, status=200, warning=warning)
    ctx = SimpleNamespace(info=SimpleNamespace(url=URL, block_size=16), t0=9.0, events=None)
    row = _request_row(ctx, {"exp_id": 3, "kind": "burst", "rep": 0}, "burst", res, [7, 8], 0, 4, 0)
    assert (row["n_tokens"], row["warning"], row["token_times"]) == (4, warning, "0.150000 0.200000 0.250000")
    assert (row["t_send_s"], row["ttft_s"], row["t_done_s"]) == (1.0, 0.15, 0.3)


def test_replay_stream_keeps_usage_and_warning():
    async def main():
        server, url = await _serve(_stream_of_text())
        async with server:
            return await stream_tokens(url, {"prompt": [1, 2]}, 30.0)

    res = asyncio.run(main())
    assert res.token_ids == [-1, -1, -1] and res.completion_tokens == 4
    assert res.warning is not None and res.token_times[0] - res.t_send >= 0.15


def test_calibration_stream_cut_before_done_is_an_error():
    from kvroute.calibrate.live.client import CalibrationError

    async def main():
        server, url = await _serve(_stream_of_text()[:3], done=False)
        async with server:
            return await stream_completion(url, {"prompt": [1, 2]}, 30.0)

    with pytest.raises(CalibrationError, match=r"the stream ended before \[DONE\], after 2 tokens"):
        asyncio.run(main())


@pytest.mark.parametrize("usage, body, message", [
    ({"prompt_tokens": 2, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2000}},
     {"prompt": [1, 2], "max_tokens": 4},
     "field 'usage.prompt_tokens_details.cached_tokens': 2000 cached tokens for a 2-token prompt"),
    ({"prompt_tokens": 2, "completion_tokens": 12}, {"prompt": [1, 2], "max_tokens": 4},
     "12 output tokens for max_tokens 4"),
    ({"prompt_tokens": 2, "completion_tokens": 2}, {"prompt": [1, 2], "max_tokens": 2},  # 3 chunks streamed
     "3 output tokens for max_tokens 2"),
])
def test_impossible_counts_are_a_measurement_error_not_a_number(usage, body, message):
    """Issue 35, item 4: cached tokens above the prompt, or more tokens than max_tokens, mark the
    request as a measurement error (calibration: in ``error``; replay: from ``usage_error``)."""
    events = [(0.0, _event(_text("a"))), (0.0, _event(_text("bc"))), (0.0, _event(_text("d"))),
              (0.0, _event({"choices": [], "usage": usage}))]

    async def main():
        server, url = await _serve(events)
        async with server:
            return url, await stream_completion(url, body, 30.0), await stream_tokens(url, body, 30.0)

    url, calibration, replay = asyncio.run(main())
    assert calibration.error == f"measurement error: {url}: {message}"
    assert replay.usage_error == f"{url}: {message}" and replay.error is None


def test_possible_counts_are_not_an_error():
    usage = {"prompt_tokens": 2, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}

    async def main():
        server, url = await _serve([(0.0, _event(_text("abcd"))), (0.0, _event({"choices": [], "usage": usage}))])
        async with server:
            return await stream_completion(url, {"prompt": [1, 2], "max_tokens": 4}, 30.0)

    res = asyncio.run(main())
    assert res.error is None and res.cached_tokens == 2


# -- client wait -----------------------------------------------------------------------------

def test_client_wait_one_request_at_a_time():
    """8 requests 100 ms apart, one in flight: each waits for the previous one to finish."""
    profile = load_profile("a6000-qwen2.5-7b")
    profile = dataclasses.replace(profile, overheads=dataclasses.replace(profile.overheads, jitter_cv=0.0))
    records = [TraceRecord(i, 100.0 * i, 64, 8, (i,)) for i in range(8)]
    spec = ClusterSpec(profile, num_workers=1, max_in_flight=1, arrival_spread_s=0.0, closed_loop=False)
    frame = simulate(Trace(records, 64), spec).records
    assert frame["client_wait"].iloc[0] == 0.0
    for i in range(1, 8):
        expected = frame["finish"].iloc[i - 1] - 0.1 * i
        assert frame["client_wait"].iloc[i] == pytest.approx(max(0.0, expected), abs=1e-9)
        assert frame["arrival"].iloc[i] == pytest.approx(0.1 * i + frame["client_wait"].iloc[i], abs=1e-9)
    assert frame["client_wait"].iloc[7] > 0.5


def test_replay_records_client_wait_one_request_at_a_time():
    """The issue's case live (fake server): 8 requests 100 ms apart, one at a time, each at least
    0.5 s (10 tokens 50 ms apart): request i waits at least 0.4 s * i in the client, and that wait
    is not in its TTFT. Only lower bounds: a loaded machine can only make the waits longer."""
    from tests.calibrate.validation.test_validate import FakeVllm

    from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec

    server = FakeVllm(token_delay_s=0.05, block_size=32)
    try:
        records = [TraceRecord(i, 100.0 * i, 64, 10, (2 * i, 2 * i + 1)) for i in range(8)]
        replay = LiveReplay(Trace(records, 32), [Endpoint(server.url, "fake")], 32,
                            ReplaySpec(closed_loop=False, max_in_flight=1))
        asyncio.run(replay.run())
    finally:
        server.close()
    frame = replay.result().records
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    waits = frame["client_wait"].tolist()
    assert all(w >= 0 for w in waits)
    for i in range(1, 8):
        assert waits[i] >= 0.4 * i - 0.01, waits
    assert frame["ttft"].iloc[7] < waits[7]


def test_replay_does_not_swallow_a_client_error(monkeypatch):
    """A bug in one request's client (a RecursionError, say) stops the replay with that error,
    instead of being left in a task nobody awaits (which made `validate` exit 0)."""
    from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec

    records = [TraceRecord(i, 0.0, 64, 4, (2 * i, 2 * i + 1)) for i in range(3)]
    replay = LiveReplay(Trace(records, 32), [Endpoint("http://127.0.0.1:1", "fake")], 32,
                        ReplaySpec(closed_loop=False))

    async def broken(rec, ready):
        raise RuntimeError("a bug in a client")

    monkeypatch.setattr(replay, "_send", broken)
    with pytest.raises(RuntimeError, match="a bug in a client"):
        asyncio.run(replay.run())
