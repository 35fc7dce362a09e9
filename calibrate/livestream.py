"""Streaming one completion with its token ids, and client-side FIFO slots, for the live replay.

``kvroute.calibrate.client.stream_completion`` keeps only token arrival times; a replayed chat
must resend the exact ids the server generated, so this reader keeps them too (vLLM's
``"return_token_ids": true`` puts them in every streamed chunk). It reads the server-sent events
with plain asyncio streams, for the reason given there (httpx's per-chunk cost slows a server
that shares the machine).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvroute.calibrate.client import CompletionStream, StreamEvents, _error_message


class WorkerLost(RuntimeError):
    """A server's connection failed, broke mid-stream or timed out."""


# --------------------------------------------------------------------------------------------
# One streamed completion, with its token ids
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Stream:
    """One streamed completion as the client saw it.

    Attributes:
        t_send: ``time.perf_counter()`` just before the request was written, s.
        token_times: ``perf_counter`` arrival time of every output token, s (a chunk of k
            tokens gives k equal times).
        token_ids: the output token ids, in order.
        prompt_tokens, cached_tokens, completion_tokens: the usage block (None if absent;
            ``cached_tokens`` needs ``--enable-prompt-tokens-details`` on the server).
        status: HTTP status.
        error: the server's error message, or None.
        usage_error: why the usage block failed its checks (its figures are then None), or None.
        warning: set when usage and the streamed chunks disagree on the token count.
    """

    t_send: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    status: int = 0
    error: str | None = None
    usage_error: str | None = None
    warning: str | None = None


def _on_event(res: Stream, events: StreamEvents, data: bytes, now: float, on_tokens) -> bool:
    """Apply one server-sent event (parsed by the shared :class:`StreamEvents`); True at ``[DONE]``."""
    n, ids = events.feed(data)
    if n:
        res.token_ids.extend(ids if ids is not None else [-1] * n)  # -1: a server without token ids
        res.token_times.extend([now] * n)
        if on_tokens is not None:
            on_tokens(n, now)
    if events.error is not None:
        res.error = events.error
    return events.done


async def stream_tokens(
    url: str, body: dict, timeout_s: float, on_tokens: Callable[[int, float], None] | None = None
) -> Stream:
    """POST ``body`` to ``url``/v1/completions and read the stream, keeping the token ids.

    Args:
        url: server base URL.
        body: the completion request (``stream`` and ``return_token_ids`` should be set).
        timeout_s: limit on the whole request, s.
        on_tokens: called as ``on_tokens(k, t)`` when ``k`` tokens arrive at ``perf_counter`` t.

    Returns:
        The stream; an HTTP error status or an error event is returned in ``status``/``error``.

    Raises:
        WorkerLost: connection refused, reset or closed early, or ``timeout_s`` passed.
    """
    res = Stream(t_send=time.perf_counter())
    conn = CompletionStream(url, body)
    try:
        async with asyncio.timeout(timeout_s):
            res.status = await conn.open()
            res.t_send = conn.t_send
            if res.status != 200:
                res.error = f"HTTP {res.status}: {_error_message(await conn.body())}"
                return res
            events = StreamEvents(url)
            async for now, data in conn.events():
                if _on_event(res, events, data, now, on_tokens):
                    break
            if not events.done and res.error is None:
                raise ConnectionResetError("the stream ended before [DONE]")
            res.prompt_tokens, res.completion_tokens = events.prompt_tokens, events.completion_tokens
            res.cached_tokens, res.usage_error, res.warning = events.cached_tokens, events.usage_error, events.warning
    except TimeoutError as exc:
        raise WorkerLost(f"no complete answer from {url} within {timeout_s:g} s") from exc
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        raise WorkerLost(f"lost {url}: {type(exc).__name__}: {exc or 'no answer'}") from exc
    finally:
        conn.close()
    return res


# --------------------------------------------------------------------------------------------
# Client-side slots, first come first served
# --------------------------------------------------------------------------------------------


class FifoSlots:
    """At most ``size`` holders; waiters get a slot in the order they asked (as SimPy's
    ``Resource``, which the simulated client uses)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {size}")
        self.free = size
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        """Wait for a slot."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot while being cancelled: pass it on
            else:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiter, else to the pool."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1
