"""The live replay's KV-cache event feed: each vLLM server's ``BlockStored``/``BlockRemoved``.

A server started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://127.0.0.1:PORT"}'`` (``kvroute serve`` binds it to the API's interface) publishes one ``KVEventBatch`` per engine step on a ZeroMQ PUB
socket as ``[topic, sequence, msgpack payload]`` (``vllm/distributed/kv_events.py``:
``ZmqEventPublisher``). vLLM's block hashes are its own (seeded SHA-256 of parent and tokens);
the router names blocks by ``chained_block_hashes`` of the prompt ids, so each ``BlockStored``
is translated through its ``token_ids``: the router hash of a block chains the router hash of
its parent block (known from an earlier event, or the root) with the block's token ids. A block
whose parent was never seen (stored before the subscription) cannot be named and is skipped.

The translated events feed the same ``KVEventIndex`` the simulator's ``events`` cache view reads.
Each batch also carries the engine core's wall clock when it was published (``KVEventBatch.ts``,
``time.time()`` in ``Scheduler.update_from_output``, after the step's model run and before its
outputs go to the API process), so the batch that stores a request's last full prompt block
times the end of the step that finished its prefill: the engine's first token, per request
(:meth:`LiveKVEvents.stored_at`). What that stamp marks depends on the release
(``kvroute.sim.timing.vllm_versions.kv_event_stamp``): 0.11.0 stamps the batch when it schedules
the step, before the step runs; with async scheduling the stamp is one step early under load
(the fit and validation move such stamps per request: ``kvroute.calibrate.calibration.step_end``,
which also reads each server's next batch, :meth:`LiveKVEvents.next_batch`).

The payload is decoded by kvroute's own reading of vLLM's schema (:func:`decode_batch`), so the
client needs no vLLM, and one client reads every release: the batch is an array ``[ts, events,
data_parallel_rank?]`` in all of them, and each event an array ``[tag, fields...]`` through 0.23
(``KVCacheEvent(array_like=True, tag=True)``) or a map ``{"type": tag, field: value}`` from 0.24
(``vllm/distributed/kv_events.py`` of each wheel; docs/reference/vllm-versions.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvroute.calibrate.live.prompts import chained_block_hashes
from kvroute.sim.routing import KVEventIndex


def check_endpoints(endpoints: Sequence[str], num_servers: int) -> None:
    """``endpoints`` must be one ZeroMQ endpoint per server (``tcp://HOST:PORT``, port in
    1..65535, or ``ipc://PATH``), in the servers' order.

    Raises:
        ValueError: naming the count or the first bad endpoint.
    """
    if len(endpoints) != num_servers:
        raise ValueError(f"one endpoint per server: {len(endpoints)} for {num_servers} server(s)")
    for endpoint in endpoints:
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        if not (endpoint.startswith("ipc://") or (endpoint.startswith("tcp://") and host and port.isdigit())):
            raise ValueError(f"a ZeroMQ endpoint such as tcp://127.0.0.1:8200, got {endpoint!r}")
        if endpoint.startswith("tcp://") and not 0 < int(port) < 65536:
            raise ValueError(f"port {port} out of range 1-65535 in {endpoint!r}")


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One decoded KV-cache event: the fields of vLLM's ``BlockStored``, ``BlockRemoved`` and
    ``AllBlocksCleared`` the feed reads.

    Attributes:
        kind: ``"BlockStored"``, ``"BlockRemoved"``, ``"AllBlocksCleared"`` (or another tag,
            which the feed ignores).
        block_hashes: vLLM's block hashes (ints, or bytes where the server does not set
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
        parent_block_hash: the parent of the first stored block, or None (``BlockStored`` only).
        token_ids: the stored blocks' token ids (``BlockStored`` only).
    """

    kind: str
    block_hashes: tuple = ()
    parent_block_hash: Any = None
    token_ids: tuple = ()


#: Positions of the fields read from an event sent as an array (through vLLM 0.23): the tag
#: first, then the struct's fields in declaration order (``BlockStored``: block_hashes,
#: parent_block_hash, token_ids, block_size, lora_id, medium, ...; ``BlockRemoved``:
#: block_hashes, medium, ...), the same in 0.11-0.23.
_ARRAY_FIELDS = {"BlockStored": (1, 2, 3), "BlockRemoved": (1, None, None)}


class KVEventFormatError(ValueError):
    """A payload that is not a KV-event batch of any vLLM release read."""


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):  # vLLM >= 0.24: {"type": tag, field: value, ...}
        kind = raw.get("type")
        hashes, parent, tokens = raw.get("block_hashes"), raw.get("parent_block_hash"), raw.get("token_ids")
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):  # <= 0.23: [tag, fields...]
        kind = raw[0]
        at = _ARRAY_FIELDS.get(kind, (None, None, None))
        hashes, parent, tokens = (raw[i] if i is not None and i < len(raw) else None for i in at)
    else:
        raise KVEventFormatError(f"a KV-cache event is a tagged array or map, got {type(raw).__name__}")
    if not isinstance(kind, str):
        raise KVEventFormatError("a KV-cache event without its type tag")
    return KVEvent(kind, tuple(hashes or ()), parent, tuple(tokens or ()))


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent]]:
    """``(ts, events)`` of one ``KVEventBatch`` payload (the last frame of a ZeroMQ message).

    Decodes msgpack with ``msgspec`` (no vLLM import) and reads either event form: arrays
    (``array_like=True``, vLLM 0.11-0.23) or maps (0.24-0.34).

    Raises:
        KVEventFormatError (a ValueError): not msgpack, or not ``[ts, [events...], ...]``.
    """
    import msgspec

    try:
        doc = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventFormatError(f"not a msgpack KV-event batch: {exc}") from None
    if isinstance(doc, dict):  # a batch sent as a map (no release read does this)
        doc = [doc.get("ts"), doc.get("events")]
    if not (isinstance(doc, list) and len(doc) >= 2 and isinstance(doc[0], (int, float))
            and isinstance(doc[1], list)):
        raise KVEventFormatError("a KV-event batch is [ts, events, ...]")
    return float(doc[0]), [_event(e) for e in doc[1]]


JOIN_TIMEOUT_S = 5.0
"""Seconds :meth:`LiveKVEvents.start` waits at most for every subscription to connect before the
first request (a server that publishes nothing is then reported by :meth:`LiveKVEvents.problem`)."""

JOIN_GRACE_S = 0.1
"""Seconds :meth:`LiveKVEvents.start` waits after the last subscriber's handshake: the
subscription is sent once the handshake succeeds, and the publisher's I/O thread applies it
shortly after (a ZeroMQ subscriber misses what is published before its subscription is in)."""


class KVEventTranslator:
    """vLLM block hashes of one server to the router's, from the events' token ids.

    Args:
        block_size: the server's KV block size, tokens.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[int, int] = {}  # vLLM block hash -> router block hash
        self.num_unnamed = 0

    def stored(self, block_hashes: Sequence[int], parent: int | None, token_ids: Sequence[int]) -> list[int]:
        """Router hashes of the blocks of one ``BlockStored`` event (empty if its parent is unknown)."""
        bs = self.block_size
        if parent is None:
            known = []
        elif parent in self._ours:
            known = [self._ours[parent]]
        else:
            self.num_unnamed += len(block_hashes)
            return []
        # NOTE: a dummy first block carries the parent's hash as an already-known prefix.
        ids = [0] * (bs * len(known)) + list(token_ids)
        ours = chained_block_hashes(ids, bs, known)[len(known):]
        for vh, h in zip(block_hashes, ours):
            self._ours[vh] = h
        return ours[: len(block_hashes)]

    def removed(self, block_hashes: Sequence[int]) -> list[int]:
        """Router hashes of the blocks of one ``BlockRemoved`` event (those it could name)."""
        return [self._ours[vh] for vh in block_hashes if vh in self._ours]


class LiveKVEvents:
    """Subscribes to every server's KV-event socket and keeps ``index`` up to date.

    Args:
        endpoints: ZeroMQ endpoints, worker ``i`` publishing on ``endpoints[i]``
            (``tcp://127.0.0.1:PORT``).
        block_size: the servers' KV block size, tokens.

    Attributes:
        index: the ``KVEventIndex`` to give the ``RouterView``.
        num_batches: event batches received and applied, all servers.
        num_lost: per server, batches missed between the sequence numbers received (ZeroMQ PUB
            drops what a slow subscriber cannot take; vLLM numbers its batches from 0, one by
            one: ``ZmqEventPublisher``). Their stores and removals never reach ``index``, and
            blocks chained on a missed store cannot be named (``translators[i].num_unnamed``).
        num_undecodable: per server, payloads :func:`decode_batch` refused; the feed skips
            them and goes on (``first_undecodable`` keeps the first reason per server).
    """

    def __init__(self, endpoints: Sequence[str], block_size: int) -> None:
        self.endpoints = list(endpoints)
        self.index = KVEventIndex(len(self.endpoints))
        self.translators = [KVEventTranslator(block_size) for _ in self.endpoints]
        self.num_batches = 0
        self._stored_ts: list[dict[int, float]] = [{} for _ in self.endpoints]
        self._batch_ts: list[list[float]] = [[] for _ in self.endpoints]
        self._joined: list[asyncio.Event] = []  # one per endpoint, set by run() on its handshake
        self.num_joined = 0
        self.num_lost = [0] * len(self.endpoints)
        self.num_undecodable = [0] * len(self.endpoints)
        self.first_undecodable: list[str | None] = [None] * len(self.endpoints)
        self._last_seq: list[int | None] = [None] * len(self.endpoints)

    def stored_at(self, worker: int, block_hash: int) -> float | None:
        """Wall-clock time (``time.time()``, s) of the last batch of ``worker`` that stored the
        block with router hash ``block_hash``; None if none was seen."""
        return self._stored_ts[worker].get(block_hash)

    def batch_stamps(self, worker: int) -> list[float]:
        """Wall-clock times (``time.time()``, s) of every timed batch of ``worker`` seen, ascending
        (one server publishes them in step order). The next one after a request's stamp dates the
        step after its prefill step (``kvroute.calibrate.calibration.step_end``)."""
        return list(self._batch_ts[worker])

    def next_batch(self, worker: int, ts: float) -> float | None:
        """The stamp of ``worker``'s first batch seen later than ``ts`` (s), or None."""
        from bisect import bisect_right

        stamps = self._batch_ts[worker]
        i = bisect_right(stamps, ts)
        return stamps[i] if i < len(stamps) else None

    def apply(self, worker: int, events, ts: float | None = None) -> None:
        """Apply one decoded batch's events of ``worker`` (:class:`KVEvent`, as
        :func:`decode_batch` gives them, or objects with vLLM's event class names and fields),
        published at wall-clock time ``ts`` (s; None: not timed)."""
        tr = self.translators[worker]
        stamps = self._stored_ts[worker]
        if ts is not None:
            seen = self._batch_ts[worker]
            if seen and ts < seen[-1]:  # out of order (not from one publisher): kept sorted
                from bisect import insort

                insort(seen, ts)
            else:
                seen.append(ts)
        for event in events:
            kind = event.kind if isinstance(event, KVEvent) else type(event).__name__
            if kind == "BlockStored":
                named = tr.stored(event.block_hashes, event.parent_block_hash, event.token_ids)
                if ts is not None:
                    for h in named:
                        stamps[h] = ts
                self.index.apply(worker, True, named)
            elif kind == "BlockRemoved":
                self.index.apply(worker, False, tr.removed(event.block_hashes))
            elif kind == "AllBlocksCleared":
                self.index.apply(worker, False, [h for h in self.index.cached(worker)
                                                 for _ in range(self.index.copies(worker, h))])
        self.num_batches += 1

    async def start(self) -> asyncio.Task:
        """:meth:`run` as a task of the running loop, returned once every subscription has
        connected (its ZeroMQ handshake succeeded, ``num_joined`` counts them) and
        :data:`JOIN_GRACE_S` has passed, or after :data:`JOIN_TIMEOUT_S` (a ZeroMQ subscriber
        misses what is published before its subscription reaches the publisher; a fixed wait is
        too short on a loaded host)."""
        self._joined = [asyncio.Event() for _ in self.endpoints]
        task = asyncio.get_running_loop().create_task(self.run())
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._joined)), JOIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass
        if not task.done():
            await asyncio.sleep(JOIN_GRACE_S)
        return task

    def receive(self, worker: int, frames: Sequence[bytes]) -> None:
        """Take one ZeroMQ message of ``worker``: ``[topic, sequence, payload]`` (the sequence
        8 bytes big-endian), or any message whose last frame is the payload. A jump in the
        sequence adds the batches skipped to ``num_lost``; a payload :func:`decode_batch`
        refuses is counted in ``num_undecodable`` and skipped, so one bad batch costs that batch
        only."""
        if len(frames) >= 3 and len(frames[-2]) == 8:
            seq = int.from_bytes(frames[-2], "big")
            last = self._last_seq[worker]
            if last is not None and seq > last + 1:
                self.num_lost[worker] += seq - last - 1
            if last is None or seq > last:
                self._last_seq[worker] = seq
        try:
            ts, events = decode_batch(frames[-1])
        except KVEventFormatError as exc:
            self.num_undecodable[worker] += 1
            if self.first_undecodable[worker] is None:
                self.first_undecodable[worker] = str(exc)
            return
        self.apply(worker, events, ts)

    def losses(self) -> list[str]:
        """One line per server whose feed lost batches or skipped payloads (empty when none
        did), naming its endpoint and the counts: what a run's notes and ``meta.json`` say of
        an index that may have missed stores and removals."""
        lines = []
        for endpoint, lost, bad, first in zip(self.endpoints, self.num_lost, self.num_undecodable,
                                              self.first_undecodable):
            parts = ([f"{lost} KV-event batch(es) lost (gaps in the sequence numbers)"] if lost else []) + (
                [f"{bad} undecodable payload(s) skipped (first: {first})"] if bad else [])
            if parts:
                lines.append(f"{endpoint}: " + "; ".join(parts) + "; the KV-event index may miss their blocks")
        return lines

    def problem(self, outcome) -> str | None:
        """Why the feed (its task ended with ``outcome``: its exception, or None) gave nothing,
        or None when it received batches."""
        endpoints = ", ".join(self.endpoints)
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            return f"reading the KV-cache events of {endpoints} failed: {type(outcome).__name__}: {outcome}"
        if self.num_batches == 0 and any(self.num_undecodable):
            first = next(reason for reason in self.first_undecodable if reason is not None)
            return (f"no KV-cache event batch from {endpoints} could be read ({sum(self.num_undecodable)} "
                    f"undecodable; first: {first})")
        if self.num_batches == 0:
            joined = "" if self.num_joined else "; no subscription connected"
            return (f"no KV-cache event arrived from {endpoints} (servers started without --kv-events-config, "
                    f"or another port?{joined})")
        return None

    async def run(self) -> None:
        """Receive until cancelled (needs ``pyzmq`` and ``msgspec``: the ``gpu`` extra; no vLLM)."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context()
        sockets, monitors = [], []
        joined = self._joined or [asyncio.Event() for _ in self.endpoints]
        try:
            for endpoint in self.endpoints:
                sock = ctx.socket(zmq.SUB)
                sockets.append(sock)
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                monitors.append(sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED))
                sock.connect(endpoint)

            async def watch(worker: int, monitor) -> None:
                await monitor.recv_multipart()  # the only event it was asked for: the handshake
                self.num_joined += 1
                joined[worker].set()

            async def receive(worker: int, sock) -> None:
                while True:
                    self.receive(worker, await sock.recv_multipart())

            await asyncio.gather(*(watch(w, m) for w, m in enumerate(monitors)),
                                 *(receive(w, s) for w, s in enumerate(sockets)))
        finally:
            for monitor in monitors:
                monitor.close(linger=0)
            for sock in sockets:
                sock.close(linger=0)
            ctx.term()
