"""The aiohttp stream reader (kvroute.calibrate.live.stream.read_completion) against an aiohttp.web
server that sends crafted server-sent events: counting rules, errors naming the server, one
pooled connection for many requests."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import web

from kvroute.calibrate.live.client import CalibrationError, VllmClient
from kvroute.calibrate.validation.livestream import WorkerLost, stream_tokens
from kvroute.calibrate.live.stream import StreamLost, new_session, read_completion

BODY = {"model": "m", "prompt": [1, 2], "max_tokens": 3, "stream": True}


def _data(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _server(events: list[bytes], status: int = 200, done: bool = True, gap_s: float = 0.0,
                  tail_s: float = 0.0):
    """An aiohttp.web server answering every POST /v1/completions with ``events``, ending the
    body ``tail_s`` after ``[DONE]``; returns ``(runner, url, peers)`` where ``peers`` collects
    each request's client port."""
    peers: list[int] = []

    async def complete(request):
        peers.append(request.transport.get_extra_info("peername")[1])
        await request.read()
        if status != 200:
            return web.json_response({"error": {"message": "This model's maximum context length is 64 tokens."}},
                                     status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
            await asyncio.sleep(gap_s)
        if done:
            await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(tail_s)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", peers


def _run(events, requests: int = 1, timeout_s: float = 30.0, **kw):
    async def main():
        runner, url, peers = await _server(events, **kw)
        try:
            async with new_session() as session:
                results = [await read_completion(session, url, BODY, timeout_s) for _ in range(requests)]
            return url, peers, results
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _text(text: str, ids=None) -> dict:
    choice = {"index": 0, "text": text}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3,
                                  "prompt_tokens_details": {"cached_tokens": 0}}}


def test_ids_usage_and_one_pooled_connection():
    events = [_data(_text("a", [5])), _data(_text("bc", [6, 7])), _data(USAGE)]
    url, peers, results = _run(events, requests=3)
    for res in results:
        assert res.status == 200 and res.error is None and res.warning is None and res.usage_error is None
        assert res.token_ids == [5, 6, 7] and len(res.token_times) == 3 and res.num_tokens == 3
        assert res.token_times[1] == res.token_times[2]  # one chunk of two tokens: two equal times
        assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens) == (2, 3, 0)
        assert res.t_send <= res.token_times[0] <= res.t_done
    assert len(peers) == 3 and len(set(peers)) == 1  # keep-alive: one connection served all three


def test_the_connection_is_kept_when_the_body_ends_after_done():
    """vLLM ends the chunked body in a write of its own after [DONE]: the reader waits for that
    end, so the pooled connection serves the next request (it used to be closed: one connection
    per request)."""
    url, peers, results = _run([_data(_text("a", [5])), _data(USAGE)], requests=4, tail_s=0.005)
    assert [r.token_ids for r in results] == [[5]] * 4
    assert len(peers) == 4 and len(set(peers)) == 1


def test_a_body_held_open_after_done_costs_its_connection_not_the_answer():
    """A server that holds the body open past [DONE] (and past the request's whole timeout):
    the answer is kept, ended at [DONE]; its connection is not reused."""
    url, peers, results = _run([_data(_text("a", [5])), _data(USAGE)], requests=2, tail_s=0.5, timeout_s=0.3)
    assert [(r.status, r.error, r.token_ids) for r in results] == [(200, None, [5])] * 2
    assert all(r.t_done >= r.token_times[-1] for r in results)
    assert len(set(peers)) == 2


def test_send_time_is_when_the_request_was_written_on_any_session():
    """new_session's trace hook stamps t_send after the connection is made; a plain aiohttp
    session falls back to the time before the call. Either way send <= first token <= done."""
    import time

    import aiohttp

    async def main():
        runner, url, _ = await _server([_data(_text("a", [5])), _data(USAGE)])
        try:
            out = []
            for make in (new_session, aiohttp.ClientSession):
                async with make() as session:
                    before = time.perf_counter()
                    out.append((before, await read_completion(session, url, BODY, 30.0)))
            return out
        finally:
            await runner.cleanup()

    for before, res in asyncio.run(main()):
        assert before < res.t_send <= res.token_times[0] <= res.t_done


def test_first_token_is_the_first_chunk_with_content_and_comments_are_skipped():
    events = [_data(_text("")), b": ping\n\n", _data(_text("a")), _data(_text("b")),
              _data({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}})]
    url, _, (res,) = _run(events, gap_s=0.05)
    assert res.token_ids == [-1, -1] and res.num_tokens == 3
    assert res.token_times[0] - res.t_send >= 0.05  # not the empty chunk, sent at once
    assert res.warning == (f"{url}: usage says 3 completion tokens but 2 came in the stream's chunks; "
                           f"using the usage count")


def test_events_split_across_reads_are_joined():
    whole = _data(_text("a", [5])) + _data(USAGE)
    events = [whole[:7], whole[7:30], whole[30:]]
    _, _, (res,) = _run(events, gap_s=0.01)
    assert res.token_ids == [5] and res.completion_tokens == 3 and res.warning is not None


def test_http_error_is_returned_with_its_message():
    _, _, (res,) = _run([], status=400)
    assert (res.status, res.error, res.token_times) == (400, "This model's maximum context length is 64 tokens.", [])


def test_error_event_ends_the_stream():
    events = [_data(_text("a", [5])), _data({"error": {"message": "engine died"}})]
    _, _, (res,) = _run(events, done=False)
    assert res.error == "engine died" and res.token_ids == [5]


def test_stream_cut_before_done_names_the_server_and_the_tokens():
    with pytest.raises(StreamLost) as err:
        _run([_data(_text("a", [5])), _data(_text("b", [6]))], done=False)
    assert str(err.value).startswith("lost the vLLM server at http://127.0.0.1:")
    assert str(err.value).endswith(": ConnectionResetError: the stream ended before [DONE], after 2 tokens")


def test_a_bad_event_names_the_server():
    with pytest.raises(StreamLost, match=r"http://127.0.0.1:\d+: ValueError: a stream event is a list, "
                                         r"expected a JSON object"):
        _run([_data(b"[1, 2]")])


@pytest.mark.parametrize("event, reason", [
    (b'{"choices": [{"index": 0, "token_ids": [null]}]}', r"token_ids holds null, expected token ids"),
    (b'{"choices": [{"index": 0, "token_ids": [1.7, true]}]}', r"token_ids holds .*1\.7.*, expected token ids"),
    (b'{"choices": 5}', r"choices is int \(5\), expected a list"),
    (b"[" * 100_000 + b"]" * 100_000, r"nested too deep"),
])
def test_a_malformed_chunk_loses_the_stream_naming_the_server_not_the_run(event, reason):
    """Each crashed the replay with a TypeError or RecursionError that nothing caught, so a
    validate run wrote nothing; ids 1.7 and true were taken as 1 and 1."""
    with pytest.raises(StreamLost, match=rf"^lost the vLLM server at http://127.0.0.1:\d+: ValueError: a stream "
                                         rf"event.*{reason}"):
        _run([_data(_text("a", [5])), _data(event)])


def test_an_error_event_without_a_message_is_an_error():
    events = [_data(_text("a", [5])), _data({"error": {"message": ""}})]
    _, _, (res,) = _run(events, done=False)
    assert res.error == "an error event without a message" and res.token_ids == [5]


def test_crlf_line_ends_split_events_too():
    """Valid SSE, as some proxies send it; a CRLF split across two reads still counts."""
    whole = (_data(_text("a", [5])) + _data(USAGE) + b"data: [DONE]\n\n").replace(b"\n", b"\r\n")
    cut = whole.index(b"\r\n") + 1  # between a CR and its LF
    _, _, (res,) = _run([whole[:cut], whole[cut:]], done=False, gap_s=0.01)
    assert res.token_ids == [5] and res.completion_tokens == 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connection_is_one_line_naming_the_server_for_both_callers():
    url = f"http://127.0.0.1:{_closed_port()}"

    async def replay():
        return await stream_tokens(url, BODY, 5.0)

    with pytest.raises(WorkerLost, match=f"^lost the vLLM server at {url}: ClientConnectorError"):
        asyncio.run(replay())

    async def probe():
        async with VllmClient(url, timeout_s=5.0) as client:
            return await client.probe()

    with pytest.raises(CalibrationError, match=f"^cannot reach the vLLM server at {url}: ClientConnectorError"):
        asyncio.run(probe())


def test_timeout_is_one_line_naming_the_server():
    async def main():
        runner, url, _ = await _server([_data(_text("a", [5]))], done=False, gap_s=1.0)
        try:
            async with new_session() as session:
                await read_completion(session, url, BODY, 0.2)
        finally:
            await runner.cleanup()
        return url

    with pytest.raises(StreamLost, match=r"^no complete answer from http://127.0.0.1:\d+ within 0.2 s$"):
        asyncio.run(main())


def test_metrics_error_status_names_the_server():
    async def main():
        app = web.Application()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with VllmClient(url) as client:
                await client.metrics()
        finally:
            await runner.cleanup()

    with pytest.raises(CalibrationError, match=r"^http://127.0.0.1:\d+/metrics answered 404: 404: Not Found$"):
        asyncio.run(main())


def test_error_message_reads_openai_fastapi_and_plain_bodies():
    from kvroute.calibrate.live.stream import error_message

    assert error_message(b'{"error": {"message": "too long", "type": "BadRequestError"}}') == "too long"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"  # FastAPI's, unwrapped as documented
    assert error_message(b'{"detail": {"message": "engine dead"}}') == "engine dead"
    assert error_message(b"Internal Server Error") == "Internal Server Error"
    assert error_message("x" * 600) == "x" * 300 + " ..."
    page = (b'<!DOCTYPE HTML>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>Error response</title>\n'
            b'</head>\n<body>\n<h1>Error response</h1>\n<p>Error code: 404</p>\n</body>\n</html>\n')
    assert error_message(page) == "an HTML page titled 'Error response', not a vLLM server's answer"  # http.server's
    assert error_message(b"line one\n  line two\n") == "line one line two"
    assert error_message(b'{"detail": "a\\nb"}') == "a b"
