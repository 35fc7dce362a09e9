"""Client CPU cost per streamed chunk: the aiohttp reader against a hand-written asyncio reader.

    python bench/bench_client.py                    # a fake SSE server (aiohttp.web, own process)
    python bench/bench_client.py --url http://127.0.0.1:8100 --model tiny-qwen2   # a vLLM server

Every round streams ``--requests`` completions of ``--tokens`` tokens, ``--concurrency`` at a
time, through one reader, and charges the client process's CPU time (``time.process_time``,
user + system) to the chunks received. Readers alternate round by round (A B A B ...) so machine
load falls on both alike; the medians and the ratio to the reference are printed:

- ``asyncio``: a hand-written HTTP/1.1 reader on plain asyncio streams, the reference (one
  connection per request, ``Connection: close``);
- ``aiohttp``: ``kvroute.calibrate.live.stream.read_completion`` on one pooled session;
- ``httpx``: ``httpx.AsyncClient.stream`` with ``aiter_bytes`` and the same event split, when
  httpx is installed.

The fake server sends vLLM-shaped chunks (one token id each, chunked transfer encoding, as
uvicorn does) ``--gap-ms`` apart, so each chunk arrives on its own as decode steps do. The
server runs in another process, so its CPU is not charged to the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from urllib.parse import urlsplit

from kvroute.calibrate.live.stream import StreamEvents, new_session, read_completion

# -- the reference: a hand-written reader on plain asyncio streams ---------------------------------


class AsyncioStream:
    """One streamed ``POST /v1/completions`` over plain asyncio (HTTP/1.1, server-sent events)."""

    def __init__(self, url: str, body: dict) -> None:
        self._parts = urlsplit(url)
        self._payload = json.dumps(body).encode()
        self._reader = self._writer = None
        self._chunked = False
        self.status = 0

    async def open(self) -> int:
        parts = self._parts
        head = (
            f"POST {parts.path.rstrip('/')}/v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(self._payload)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self._reader, self._writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        self._writer.write(head + self._payload)
        await self._writer.drain()
        self.status = int((await self._reader.readline()).split()[1])
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            self._chunked |= k.strip().lower() == "transfer-encoding" and "chunked" in v.lower()
        return self.status

    async def _chunks(self):
        reader = self._reader
        while True:
            if self._chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                yield (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    return
                yield data

    def events(self):
        return sse_events(self._chunks())

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def sse_events(chunks):
    """``(arrival time, data)`` of each ``data:`` event in an async iterator of byte chunks: the
    event split both baseline readers use (the production reader, ``stream._events``, does it
    inline to save a generator hop per event)."""
    buf = b""
    async for data in chunks:
        now = time.perf_counter()
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            event = event.strip()
            if event.startswith(b"data:"):
                yield now, event[5:].strip()


async def asyncio_read(state, url: str, body: dict) -> int:
    conn = AsyncioStream(url, body)
    times = []
    try:
        await conn.open()
        events = StreamEvents(url)
        async for t, data in conn.events():
            n, _ = events.feed(data)
            if events.done:
                break
            times.extend([t] * n)
    finally:
        conn.close()
    return len(times)


async def aiohttp_read(session, url: str, body: dict) -> int:
    return len((await read_completion(session, url, body, 600.0)).token_times)


async def httpx_read(client, url: str, body: dict) -> int:
    times = []
    events = StreamEvents(url)
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        async for now, data in sse_events(resp.aiter_bytes()):
            n, _ = events.feed(data)
            times.extend([now] * n)
    return len(times)


class Reader:
    """One reader with its per-run state (a session for the pooled ones)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __aenter__(self):
        if self.name == "aiohttp":
            self.state, self.read = new_session(), aiohttp_read
        elif self.name == "httpx":
            import httpx

            self.state, self.read = httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=512)), httpx_read
        else:
            self.state, self.read = None, asyncio_read
        return self

    async def __aexit__(self, *exc):
        if self.name == "aiohttp":
            await self.state.close()
        elif self.name == "httpx":
            await self.state.aclose()


# -- the fake server -------------------------------------------------------------------------------


def _serve(port_out, gap_s: float) -> None:
    from aiohttp import web

    async def complete(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        for i in range(n):
            chunk = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None,
                                  "stop_reason": None, "token_ids": [100 + i % 900]}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(gap_s)
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                                          "prompt_tokens_details": {"cached_tokens": 0}}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port_out.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the measurement -------------------------------------------------------------------------------


async def one_round(reader: Reader, url: str, model: str, requests: int, tokens: int, concurrency: int):
    """``(client CPU s, wall s, chunks)`` of one round through ``reader``."""
    sem = asyncio.Semaphore(concurrency)
    body = {"model": model, "prompt": list(range(1, 33)), "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}

    async def one():
        async with sem:
            return await reader.read(reader.state, url, body)

    async with reader:
        c0, w0 = time.process_time(), time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(requests)))
        return time.process_time() - c0, time.perf_counter() - w0, sum(counts)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a vLLM server's base URL (default: start a fake SSE server)")
    ap.add_argument("--model", default="fake")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap-ms", type=float, default=2.0, help="fake server: time between chunks")
    args = ap.parse_args()

    server = None
    url = args.url
    if url is None:
        ctx = multiprocessing.get_context("spawn")
        port = ctx.Queue()
        server = ctx.Process(target=_serve, args=(port, args.gap_ms / 1000.0), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{port.get(timeout=60)}"
    url = url.rstrip("/")
    names = ["asyncio", "aiohttp"]
    try:
        import httpx  # noqa: F401

        names.append("httpx")
    except ImportError:
        pass
    per_chunk = {n: [] for n in names}
    walls = {n: [] for n in names}
    try:
        for name in names:  # warm-up: imports, first connections, the server's caches
            asyncio.run(one_round(Reader(name), url, args.model, args.concurrency, args.tokens, args.concurrency))
        for _ in range(args.rounds):
            for name in names:
                cpu, wall, chunks = asyncio.run(one_round(Reader(name), url, args.model, args.requests,
                                                          args.tokens, args.concurrency))
                per_chunk[name].append(cpu / chunks)
                walls[name].append(wall)
    finally:
        if server is not None:
            server.terminate()
            server.join(5)
    ref = statistics.median(per_chunk["asyncio"])
    print(f"server {args.url or 'fake SSE (aiohttp.web, own process)'}; {args.rounds} rounds of "
          f"{args.requests} requests x {args.tokens} tokens, {args.concurrency} at a time")
    print(f"{'reader':8} {'client CPU per chunk':>21} {'ratio to asyncio':>17} {'round wall s':>13}")
    for name in names:
        med = statistics.median(per_chunk[name])
        print(f"{name:8} {med * 1e6:18.1f} us {med / ref:17.2f} {statistics.median(walls[name]):13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
