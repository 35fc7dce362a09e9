"""The live replay's stream of one completion with its token ids, and client-side FIFO slots.

A replayed chat must resend the exact ids the server generated, so replay keeps them (vLLM's
``"return_token_ids": true`` puts them in every streamed chunk). The stream is read by
:func:`kvroute.calibrate.live.stream.read_completion`, the reader calibration uses too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from kvroute.calibrate.live.stream import Stream, StreamLost, new_session, read_completion

__all__ = ["FifoSlots", "Stream", "WorkerLost", "stream_tokens"]


class WorkerLost(RuntimeError):
    """A server's connection failed, broke mid-stream or timed out."""


async def stream_tokens(
    url: str, body: dict, timeout_s: float, on_tokens: Callable[[int, float], None] | None = None,
    session: Any = None,
) -> Stream:
    """POST ``body`` to ``url``/v1/completions and read the stream, keeping the token ids.

    Args:
        url: server base URL.
        body: the completion request (``stream`` and ``return_token_ids`` should be set).
        timeout_s: limit on the whole request, s.
        on_tokens: called as ``on_tokens(k, t)`` when ``k`` tokens arrive at ``perf_counter`` t.
        session: an open :func:`kvroute.calibrate.live.stream.new_session`; None: one for this request.

    Returns:
        The stream (times are ``perf_counter`` values); an HTTP error status is returned in
        ``status`` and ``error`` (``"HTTP <status>: <message>"``), an error event in ``error``.

    Raises:
        WorkerLost: connection refused, reset or closed early, or ``timeout_s`` passed.
    """
    own = session is None
    if own:
        session = new_session()
    try:
        res = await read_completion(session, url, body, timeout_s, on_tokens)
    except StreamLost as exc:
        raise WorkerLost(str(exc)) from exc
    finally:
        if own:
            await session.close()
    if res.status != 200:
        res.error = f"HTTP {res.status}: {res.error}"
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
