"""One streamed completion over aiohttp: the reader that calibration and replay share.

- :func:`new_session`: the aiohttp session a client keeps for one run (pooled keep-alive
  connections, no request limit; the caller owns timeouts).
- :func:`read_completion`: ``POST /v1/completions`` with ``stream: true`` and read its
  server-sent events into a :class:`Stream` (token arrival times, token ids, usage).
- :class:`StreamEvents`: the counting rules applied to each event.

aiohttp is the library ``vllm bench serve`` uses (``vllm/benchmarks/lib/endpoint_request_func.py``);
``bench/bench_client.py`` measures its client CPU cost per streamed chunk against a
hand-written asyncio reader. aiohttp is imported inside the functions, so importing
this module stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvroute.traces.inputs import COUNT, InputError, check_fields, describe

USAGE_SCHEMA = {"prompt_tokens": COUNT, "completion_tokens": COUNT}
"""Rules of a streamed ``usage`` block (``prompt_tokens_details.cached_tokens`` is a COUNT too)."""

DRAIN_S = 0.05
"""Seconds :func:`read_completion` waits at most after ``[DONE]`` for the end of the body, so
that the connection is kept for the next request (:func:`_drain`)."""

#: Seconds an idle pooled connection is kept: under the 5 s after which vLLM's API server
#: (uvicorn, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) closes it, so a request is never written to a
#: connection the server is closing.
KEEPALIVE_S = 4.0


class StreamLost(RuntimeError):
    """The server's connection failed, broke mid-stream, or the stream ended before ``[DONE]``;
    the message names the server."""


def error_message(body: bytes | str) -> str:
    """The message of an error answer, on one line: OpenAI's ``{"error": {"message": ...}}`` or
    FastAPI's ``{"detail": ...}``; an HTML page (another kind of server) by its title; else the
    body's first 300 characters, whitespace runs made one space."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
        err = doc.get("error", doc.get("detail", doc))
        text = str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        if title:
            return f"an HTML page titled {' '.join(title.group(1).split())!r}, not a vLLM server's answer"
    one = " ".join(text.split())
    return one if len(one) <= 300 else one[:300] + " ..."


class StreamEvents:
    """The counting rules of one completion stream's events, for calibration and replay alike.

    Mirrors ``vllm bench serve`` (vLLM 0.32, ``vllm/benchmarks/lib/endpoint_request_func.py:
    async_request_openai_completions`` and ``benchmarks/serve.py: calculate_metrics``): the first
    token is the first chunk with output, and the request's output length is the usage block's
    ``completion_tokens`` when the server sends one. Two deliberate differences: a chunk counts as
    output only when it carries content (token ids, or non-empty ``text`` from a server that
    sends no ids), where ``vllm bench serve`` counts any chunk with a ``choices`` entry, so an
    empty first chunk is not the first token (vLLM sends an empty ``text`` only for a token whose
    text it holds back, and kvroute asks for ``return_token_ids``, so on vLLM the rules agree); and :attr:`warning` is set when the usage count disagrees with the
    tokens counted in the chunks (``vllm bench serve`` keeps the usage count silently). The
    usage block is checked (ints >= 0); a bad one is kept as :attr:`usage_error` and its figures
    as None, so what was measured is not thrown away.

    Attributes:
        url: the server, for messages.
        counted: output tokens counted in the chunks.
        token_ids: the ids received, or None once a chunk with content came without ids.
        prompt_tokens, completion_tokens, cached_tokens: the usage block's figures, or None.
        error: an error event's message, or None.
        usage_error: why the usage block was rejected, or None.
        done: ``[DONE]`` was received.
    """

    __slots__ = ("url", "counted", "token_ids", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "error", "usage_error", "done")

    def __init__(self, url: str) -> None:
        self.url = url
        self.counted = 0
        self.token_ids: list[int] | None = []
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = None
        self.error: str | None = None
        self.usage_error: str | None = None
        self.done = False

    def feed(self, data: bytes) -> tuple[int, list[int] | None]:
        """Apply one event's payload; returns ``(tokens it carried, their ids or None)``.

        Raises:
            ValueError: the payload is not JSON or not an object, its ``choices`` not a list, or
                its ``token_ids`` not a list of integers (the server is broken).
        """
        if data == b"[DONE]":
            self.done = True
            return 0, None
        try:
            chunk = json.loads(data)
        except RecursionError:
            raise ValueError("a stream event is nested too deep to be a completion chunk") from None
        if type(chunk) is not dict:
            raise ValueError(f"a stream event is {describe(chunk)}, expected a JSON object")
        if "error" in chunk:
            self.error = error_message(data) or "an error event without a message"
        choices = chunk.get("choices") or []
        if type(choices) is not list:
            raise ValueError(f"a stream event's choices is {describe(choices)}, expected a list")
        n, ids_out = 0, []
        for choice in choices:
            ids = choice.get("token_ids") if type(choice) is dict else None
            if type(ids) is list and ids:
                bad = [i for i in ids if type(i) is not int]
                if bad:
                    raise ValueError(f"a stream event's token_ids holds {describe(bad[0])}, expected token ids "
                                     "(integers)")
                n += len(ids)
                ids_out.extend(ids)
            elif type(choice) is dict and choice.get("text"):  # content without ids: one token
                n += 1
                ids_out = None
        if n:
            self.counted += n
            if ids_out is None or self.token_ids is None:
                self.token_ids = None
            else:
                self.token_ids.extend(ids_out)
        usage = chunk.get("usage")
        if usage:
            self._usage(usage)
        return n, ids_out

    def _usage(self, usage: object) -> None:
        try:
            figures = check_fields(usage, USAGE_SCHEMA, self.url, prefix="usage.")
            details = usage.get("prompt_tokens_details") or {}
            cached = check_fields(details, {"cached_tokens": COUNT}, self.url,
                                  prefix="usage.prompt_tokens_details.")
        except InputError as exc:
            self.usage_error = str(exc)
            return
        self.prompt_tokens = figures.get("prompt_tokens")
        self.completion_tokens = figures.get("completion_tokens")
        self.cached_tokens = cached.get("cached_tokens")

    @property
    def num_tokens(self) -> int:
        """Output tokens: the usage block's count when given, else the tokens counted."""
        return self.counted if self.completion_tokens is None else self.completion_tokens

    @property
    def warning(self) -> str | None:
        """Set when the usage block's token count differs from the tokens counted in the chunks."""
        if self.completion_tokens is None or self.completion_tokens == self.counted:
            return None
        return (f"{self.url}: usage says {self.completion_tokens} completion tokens but "
                f"{self.counted} came in the stream's chunks; using the usage count")


@dataclass(slots=True)
class Stream:
    """One streamed completion as the client saw it; times are ``time.perf_counter()`` values, s.

    Attributes:
        t_send: when the request's headers were written, after any connection set-up (so
            TTFT, measured from it, leaves connection set-up out); with a session not made by
            :func:`new_session`, just before the request was handed to aiohttp (``vllm bench
            serve``'s start).
        token_times: arrival time of every output token counted in the chunks (a chunk of k
            tokens gives k equal times).
        token_ids: the output token ids, in order (-1 for a token that came without its id).
        prompt_tokens, cached_tokens, completion_tokens: the usage block (None if absent;
            ``cached_tokens`` needs ``--enable-prompt-tokens-details`` on the server).
        t_done: when the stream ended (``[DONE]``, an error answer or an error event).
        status: HTTP status.
        error: the server's error message (of an HTTP error answer, whose status is in ``status``,
            or of an error event), or None.
        usage_error: why the usage block failed its checks (its figures are then None), or why
            the counts are impossible (:func:`impossible_counts`; figures kept), or None.
        warning: set when usage and the streamed chunks disagree on the token count.
    """

    t_send: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    t_done: float = math.nan
    status: int = 0
    error: str | None = None
    usage_error: str | None = None
    warning: str | None = None

    @property
    def num_tokens(self) -> int:
        """Output tokens, as ``vllm bench serve`` counts them: usage when given, else counted."""
        return len(self.token_times) if self.completion_tokens is None else self.completion_tokens


def impossible_counts(url: str, body: dict, res: Stream) -> str | None:
    """Why a whole answer's counts cannot be right, or None: more ``cached_tokens`` than the
    prompt has tokens (the usage's ``prompt_tokens``, else the ids sent), or more output tokens
    (usage or streamed) than the request's ``max_tokens``. The caller records such an answer as
    a measurement error, not as a number."""
    prompt = body.get("prompt")
    sent = len(prompt) if type(prompt) is list else None
    limit = res.prompt_tokens if res.prompt_tokens is not None else sent
    if res.cached_tokens is not None and limit is not None and res.cached_tokens > limit:
        return (f"{url}: field 'usage.prompt_tokens_details.cached_tokens': {res.cached_tokens} cached tokens "
                f"for a {limit}-token prompt")
    max_tokens = body.get("max_tokens")
    got = max(res.num_tokens, len(res.token_times))
    if type(max_tokens) is int and got > max_tokens:
        return f"{url}: {got} output tokens for max_tokens {max_tokens}"
    return None


class _Sent:
    """One request's send time, set by :func:`_on_headers_sent` (aiohttp's ``trace_request_ctx``)."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t: float | None = None


async def _on_headers_sent(session: Any, context: Any, params: Any) -> None:
    sent = context.trace_request_ctx
    if isinstance(sent, _Sent):
        sent.t = time.perf_counter()


def new_session() -> Any:
    """An ``aiohttp.ClientSession`` for one run's requests to any number of servers.

    No limit on connections (the callers limit requests in flight themselves), idle connections
    kept :data:`KEEPALIVE_S`, no total timeout (each request sets its own). A trace hook stamps
    when each streamed request's headers were written, after any connection set-up (see
    :attr:`Stream.t_send`). Close it with ``await session.close()``.
    """
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_on_headers_sent)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 trace_configs=[trace])


async def _events(content, res: Stream, events: StreamEvents,
                  on_tokens: Callable[[int, float], None] | None) -> None:
    """Read server-sent events from an aiohttp ``StreamReader`` until ``[DONE]`` or the end."""
    buf = b""
    ids_out, times = res.token_ids, res.token_times
    async for data in content.iter_any():
        now = time.perf_counter()
        buf += data
        if b"\r" in buf:  # CRLF line ends (valid SSE; some proxies send them), also split across reads
            buf = buf.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            event = event.strip()
            if not event.startswith(b"data:"):  # comments (": ping") and other fields
                continue
            n, ids = events.feed(event[5:].strip())
            if n:
                ids_out.extend(ids if ids is not None else [-1] * n)
                times.extend([now] * n)
                if on_tokens is not None:
                    on_tokens(n, now)
            if events.done or events.error is not None:
                return


async def _drain(content) -> None:
    """Read what follows ``[DONE]`` (the end of the chunked body) for at most :data:`DRAIN_S`:
    aiohttp returns a connection to the pool only when its response was read to the end, and
    vLLM's server sends that end in a write of its own after ``[DONE]``. A server that sends
    more, or keeps the body open, costs that connection only (it is closed, as before)."""
    import aiohttp

    try:
        async with asyncio.timeout(DRAIN_S):
            while await content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass


async def read_completion(
    session: Any, url: str, body: dict, timeout_s: float,
    on_tokens: Callable[[int, float], None] | None = None,
) -> Stream:
    """POST ``body`` to ``url``/v1/completions and read the whole stream.

    Args:
        session: from :func:`new_session`.
        url: server base URL.
        body: the completion request (``stream`` set; ``stream_options.include_usage`` and
            ``return_token_ids`` for the usage block and the ids).
        timeout_s: limit on the whole request, from send to ``[DONE]``, s.
        on_tokens: called as ``on_tokens(k, t)`` when ``k`` tokens arrive at ``perf_counter`` t.

    Returns:
        The stream; an HTTP error status or an error event is returned in ``status``/``error``,
        a usage block that fails its checks, or counts no server can give
        (:func:`impossible_counts`), in ``usage_error``.

    Raises:
        StreamLost: connection refused, reset or closed before ``[DONE]`` (naming the server and
            the tokens received), an event that is not a JSON object, or ``timeout_s`` passed.
    """
    import aiohttp

    url = url.rstrip("/")
    payload = json.dumps(body).encode()
    res = Stream(t_send=time.perf_counter())
    sent = _Sent()
    try:
        async with asyncio.timeout(timeout_s) as limit:
            async with session.post(f"{url}/v1/completions", data=payload, trace_request_ctx=sent,
                                    headers={"Content-Type": "application/json"}) as resp:
                if sent.t is not None:
                    res.t_send = sent.t
                res.status = resp.status
                if resp.status != 200:
                    res.error = error_message(await resp.read()) or f"HTTP {resp.status}"
                else:
                    events = StreamEvents(url)
                    await _events(resp.content, res, events, on_tokens)
                    if not events.done and events.error is None:
                        raise ConnectionResetError(
                            f"the stream ended before [DONE], after {len(res.token_times)} tokens")
                    res.t_done = time.perf_counter()
                    limit.reschedule(None)  # the answer is whole: the drain below cannot lose it
                    await _drain(resp.content)
                    res.error = events.error
                    res.prompt_tokens, res.completion_tokens = events.prompt_tokens, events.completion_tokens
                    res.cached_tokens, res.usage_error = events.cached_tokens, events.usage_error
                    res.warning = events.warning
                    if res.usage_error is None:
                        res.usage_error = impossible_counts(url, body, res)
    except TimeoutError as exc:
        raise StreamLost(f"no complete answer from {url} within {timeout_s:g} s") from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise StreamLost(f"lost the vLLM server at {url}: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split()) or 'no answer'}") from exc
    if math.isnan(res.t_done):
        res.t_done = time.perf_counter()
    return res
