"""Live replay: a trace sent to real vLLM servers through the simulator's own routing policies.

The same ``Policy`` and ``RouterView`` objects the simulator uses decide where each request
goes; the view learns only what this client knows (its own in-flight counts, what it routed,
which workers failed). Replay follows the simulator's client (``kvroute.sim.cluster.cluster``):

- closed loop (traces with sessions, by default): every root is sent at its timestamp, a later
  turn when its parent's last token arrived plus its think time; a chat whose turn failed stops
  and its later turns are recorded as not sent;
- open loop: every request at its timestamp; a turn sent before its parent's reply exists
  carries the simulator's stand-in reply tokens instead;
- ``max_in_flight`` slots are handed out in the order requests became ready (FIFO).

Prompts are token ids (``kvroute.calibrate.live.prompts``); outputs are forced to the trace's length
(``ignore_eos``) and streamed with their token ids, which a later turn resends. Records have the
simulator's columns (``kvroute.sim.cluster.metrics.RECORD_COLUMNS``); times are seconds since the replay
started; with the servers' KV-cache events (``ReplaySpec.kv_event_endpoints``) a record also
carries when the engine's step produced its first token. A worker whose connection breaks or
whose request times out, or that answers HTTP 5xx saying its engine died (or ``DEAD_AFTER_5XX`` 5xx in a
row), is marked dead: its in-flight requests fail with the error, the policy
stops choosing it, and the replay goes on.
Cancelling :meth:`LiveReplay.run` (Ctrl-C) records the requests in flight as interrupted.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.calibrate.validation.livestream import FifoSlots, WorkerLost, stream_tokens
from kvroute.calibrate.live.prompts import PromptBuilder, TokenSynth, chained_block_hashes
from kvroute.calibrate.live.kv_events import LiveKVEvents
from kvroute.calibrate.live.metrics_scrape import LiveMetrics
from kvroute.calibrate.live.stream import new_session
from kvroute.sim.cluster.metrics import RequestRecord, RunResult, records_frame, tokens_frame
from kvroute.sim.routing import RouteRequest, RouterView, make_policy, router_rng
from kvroute.sim.routing.view import routed_index_tokens
from kvroute.sim.routing.policy_errors import checked_worker, prepare_policy, raise_policy_error
from kvroute.sim.engine.scheduler import clamp_max_tokens
from kvroute.sim.cluster.workload import Workload
from kvroute.traces.format import Trace, TraceRecord

CPU_SAMPLE_S = 0.05
"""Seconds between samples of the client's CPU time (:attr:`LiveReplay.client_cpu`)."""
DEAD_AFTER_5XX = 3
"""HTTP 5xx replies in a row after which a worker is marked dead (an API process whose engine died)."""
ENGINE_DEAD_SIGNS = ("enginecore encountered an issue", "enginedeaderror", "engine is dead", "engine core is dead")
"""Lower-case words of a 5xx reply that mark its worker dead at once: vLLM's EngineDeadError
answers HTTP 500 "EngineCore encountered an issue. See stack trace (above) for the root cause."
"""


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """How to replay.

    Attributes:
        policy: routing policy name (``kvroute.sim.routing.POLICIES``).
        closed_loop: later turns wait for their parent; None: closed loop when the trace has
            sessions, as the simulator decides.
        max_in_flight: most requests outstanding at once (1: one at a time); None: no limit.
        router_block_tokens: granularity of the router's routed-prefix index, tokens; None: the
            trace's, as the simulator's (``kvroute.sim.routing.view.routed_index_tokens``).
        timeout_s: limit on one request from send to its last token, s; passing it marks the
            worker dead.
        seed: seeds the router's generator (ties, random choices).
        scrape_interval_s: seconds between polls of the servers' ``/metrics`` for a policy that
            reads them (``Policy.uses_metrics``); 0 polls back to back.
        cache_view: ``routed`` (the router's routed-prefix index) or ``events`` (the servers'
            KV-cache events, ``kvroute.calibrate.live.kv_events``).
        kv_event_endpoints: each server's ZeroMQ event endpoint, in server order: read by the
            ``events`` view, and with either view used to time each request's engine first token
            (records' ``engine_first_token``, from the batch that stored its last full prompt block).
        record_tokens: keep every output token's arrival time (records' ``token_times``, and the
            result's ``tokens``, ``kvroute.sim.cluster.metrics.tokens_frame``).
    """

    policy: str = "round_robin"
    closed_loop: bool | None = None
    max_in_flight: int | None = None
    router_block_tokens: int | None = None
    timeout_s: float = 600.0
    seed: int = 0
    scrape_interval_s: float = 0.0
    cache_view: str = "routed"
    kv_event_endpoints: tuple[str, ...] = ()
    record_tokens: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One server behind the router: base URL and served model name."""

    url: str
    model: str


class LiveReplay:
    """One live replay of a trace under one policy.

    Args:
        trace: the requests.
        endpoints: the servers, worker ``i`` being ``endpoints[i]``.
        block_size: the servers' KV block size, tokens (router hashes use it).
        spec: policy and replay mode.
        synth: token ids of content positions.
        max_model_len: the servers' longest sequence; ``max_tokens`` is clamped as the server
            would clamp it. None: no clamp.

    Attributes:
        records: one per request sent or skipped so far (in send order).
        itl_gaps: every inter-token gap of the requests served whole, s.
        dead: worker -> why it was marked dead.
        interrupted: the run was cancelled before it finished.
        elapsed_s: wall time of :meth:`run`, s.
        client_cpu_s: CPU seconds this process (the client: streams, router, KV events) used
            during :meth:`run`, all threads (``time.process_time``).
        client_cpu: ``(seconds since the start, client CPU seconds so far)`` every
            ``CPU_SAMPLE_S`` during :meth:`run`: the client's load over time.
        usage_reported: every server that answered reported its cached prompt tokens (one that
            reported some and left the field out of others is vLLM <= 0.23 leaving out a zero
            hit: those read 0).

    Raises:
        ValueError: unknown policy, no endpoint, or a block size that cannot map the trace's.
        PolicyError (a ValueError): the policy's ``__init__`` or ``prepare`` raised (see
            :meth:`run` for ``choose``).
    """

    def __init__(
        self,
        trace: Trace,
        endpoints: Sequence[Endpoint],
        block_size: int,
        spec: ReplaySpec = ReplaySpec(),
        synth: TokenSynth = TokenSynth(),
        max_model_len: int | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("a live replay needs at least one server")
        self.trace = trace
        self.endpoints = list(endpoints)
        self.block_size = block_size
        self.spec = spec
        self.max_model_len = max_model_len
        self.workload = Workload(trace, block_size)
        self.prompts = PromptBuilder(self.workload, synth)
        self.policy = make_policy(spec.policy, router_rng(spec.seed))
        self.metrics = LiveMetrics([ep.url for ep in endpoints], spec.scrape_interval_s)
        self.kv_events = None
        cache_view = self.policy.cache_view or spec.cache_view  # a policy may name its own (Policy.cache_view)
        if cache_view == "events" or spec.kv_event_endpoints:
            if len(spec.kv_event_endpoints) != len(endpoints):
                raise ValueError(f"{'cache view events' if cache_view == 'events' else 'kv_event_endpoints'} "
                                 f"needs one KV-event endpoint per server: "
                                 f"{len(spec.kv_event_endpoints)} for {len(endpoints)} servers")
            self.kv_events = LiveKVEvents(spec.kv_event_endpoints, block_size)
        if cache_view == "exact":
            raise ValueError(f"policy {spec.policy!r} reads the exact cache view, which a live gateway cannot see")
        index_tokens = spec.router_block_tokens or routed_index_tokens(trace.block_size, block_size)
        self.view = RouterView(len(endpoints), block_size, index_tokens,
                               track_prefixes=self.policy.uses_prefixes,
                               metrics=self.metrics.scrape if self.policy.uses_metrics else None,
                               cache_view=cache_view,
                               events=self.kv_events.index if cache_view == "events" else None,
                               track_active_blocks=self.policy.uses_active_blocks,
                               routed_ttl_s=self.policy.routed_ttl_s, clock=self.now)
        prepare_policy(self.policy, self.view)
        self.closed_loop = self.workload.has_sessions if spec.closed_loop is None else spec.closed_loop
        self.records: list[RequestRecord] = []
        self.itl_gaps: list[float] = []
        self.dead: dict[int, str] = {}
        self._errors_5xx = [0] * len(endpoints)  # per worker, HTTP 5xx replies since its last success
        self.interrupted = False
        self.elapsed_s = 0.0
        self.client_cpu_s = 0.0
        self.client_cpu: list[tuple[float, float]] = []
        self.usage_reported = True
        self._reports_cached: set[int] = set()  # workers whose answers carried cached_tokens
        self._missing_cached: set[int] = set()  # workers with an answer without it
        self.warnings: list[str] = []  # the stream reader's notes (usage vs counted tokens)
        self._no_ids: set[int] = set()  # replies streamed without token ids whose later turns were skipped
        self.events_problem: str | None = None  # why the KV-cache events timed nothing, if they did not
        self.events_losses: list[str] = []  # servers whose KV-event feed lost or skipped batches
        self._t0 = 0.0
        self._wall0 = 0.0  # time.time() at self._t0: the servers' event clock
        self._last_block: dict[int, int] = {}  # request id -> router hash of its last full prompt block
        self._session = None  # the aiohttp session of :meth:`run`
        self._tasks: set[asyncio.Task] = set()
        self._slots: FifoSlots | None = None
        self._streams: list[dict[int, asyncio.Task]] = [{} for _ in endpoints]
        self._killed: dict[int, str] = {}
        self._prompt: dict[int, np.ndarray] = {}  # request id -> prompt ids sent (kept for children)
        self._output: dict[int, list[int]] = {}  # request id -> output ids received
        self._pending = {rid: len(kids) for rid, kids in self.workload.children.items()}  # children not built
        self._sent: set[int] = set()  # kept prompts whose own request was sent

    # -- public ---------------------------------------------------------------------------------

    @property
    def num_finished(self) -> int:
        """Requests that got all their tokens so far."""
        return sum(1 for r in self.records if r.finish is not None and r.error is None)

    def now(self) -> float:
        """Seconds since :meth:`run` started."""
        return time.perf_counter() - self._t0

    async def run(self) -> None:
        """Replay the whole trace; returns when every request finished, failed or was skipped.

        Raises:
            asyncio.CancelledError: when cancelled (Ctrl-C); requests in flight are first
                recorded as failed with ``"interrupted"`` and :attr:`interrupted` is set.
            PolicyError (``kvroute.sim.routing``): the policy's ``choose`` returned something other
                than a worker index in ``range(len(endpoints))``, or raised (a RuntimeError
                while every worker is dead is the policy's "no live worker": that request is
                recorded as not sent); it stops the replay as a client's error does (below).
            Exception: the first error a request's client raised (not a failed request, which is
                recorded), after the other clients were cancelled.
        """
        self._slots = FifoSlots(self.spec.max_in_flight) if self.spec.max_in_flight else None
        sent = self.workload.roots if self.closed_loop else self.trace.records
        poller = subscriber = sampler = None
        self._session = new_session()
        cpu0 = self._start_clock()  # started again below; an error in the set-up is timed from here
        try:
            if self.policy.uses_metrics:
                await self.metrics.first_poll()  # the gateway knows the servers' state before the first request
                poller = asyncio.get_running_loop().create_task(self.metrics.run())
            if self.kv_events is not None:
                subscriber = await self.kv_events.start()
            # t = 0 is when the replay is ready to send (its HTTP client loaded, the servers' load
            # polled, the KV-event feeds joined): the trace's first arrival, as in the simulator
            cpu0 = self._start_clock()
            sampler = asyncio.get_running_loop().create_task(self._sample_cpu(cpu0))
            for rec in sent:
                self._spawn(rec, rec.timestamp_ms / 1000.0)
            while self._tasks:
                done, _ = await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_EXCEPTION)
                # read every finished task's exception, so that none is logged later by the GC
                errors = [t.exception() for t in done if not t.cancelled()]
                error = next((e for e in errors if e is not None), None)
                if error is not None:  # a bug or a bad input in a client: stop, never swallow it
                    for task in list(self._tasks):
                        task.cancel()
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                    raise error
        except asyncio.CancelledError:
            self.interrupted = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            raise
        finally:
            for task in (poller, subscriber, sampler):
                if task is not None:
                    task.cancel()
                    (outcome,) = await asyncio.gather(task, return_exceptions=True)
                    if task is subscriber:
                        self.events_problem = self.kv_events.problem(outcome)
                        self.events_losses = self.kv_events.losses()
            self.elapsed_s = self.now()
            self.client_cpu_s = time.process_time() - cpu0
            self.client_cpu.append((self.elapsed_s, self.client_cpu_s))
            await self._session.close()
            self._session = None

    def _start_clock(self) -> float:
        """Set t = 0 of :meth:`now` and the servers' event clock to now; returns the process's
        CPU time now, s."""
        self._wall0, self._t0 = time.time(), time.perf_counter()
        self.client_cpu = [(0.0, 0.0)]
        return time.process_time()

    async def _sample_cpu(self, cpu0: float) -> None:
        """Append ``(now, CPU seconds since cpu0)`` to :attr:`client_cpu` every ``CPU_SAMPLE_S``."""
        while True:
            await asyncio.sleep(CPU_SAMPLE_S)
            self.client_cpu.append((self.now(), time.process_time() - cpu0))

    def result(self) -> RunResult:
        """Records and counters of what was replayed so far, in the simulator's shape.

        Requests never sent because the run was interrupted are recorded as failed with worker
        -1. ``workers`` has one row per server: ``worker``, ``url``, ``alive``, ``requests``
        routed there and ``usage_cached_tokens`` (sum of the usage's cached tokens).
        """
        records = list(self.records)
        if self.kv_events is not None:
            self._engine_first_tokens(records)
        if self.interrupted:
            seen = {r.trace.request_id for r in records}
            for rec in self.trace.records:
                if rec.request_id not in seen:
                    skipped = RequestRecord(rec, -1, self.elapsed_s)
                    skipped.error = "not sent: the replay was interrupted"
                    records.append(skipped)
        frame = records_frame(records)
        rows = []
        for w, ep in enumerate(self.endpoints):
            mine = frame[frame["worker"] == w]
            rows.append({"worker": w, "url": ep.url, "alive": w not in self.dead, "requests": len(mine),
                         "usage_cached_tokens": int(mine.loc[mine["status"] == "ok", "cached_tokens"].sum())})
        return RunResult(records=frame, itl=np.asarray(self.itl_gaps, dtype=float), workers=pd.DataFrame(rows),
                         policy=self.spec.policy, seed=self.spec.seed,
                         tokens=tokens_frame(records) if self.spec.record_tokens else None)

    def kv_batch_times(self, worker: int) -> np.ndarray:
        """The stamps of every KV-event batch of ``worker`` seen, s since the run's start (the
        clock of the records' ``engine_first_token``), ascending; empty without the event feed."""
        if self.kv_events is None:
            return np.zeros(0)
        return np.asarray(self.kv_events.batch_stamps(worker), dtype=float) - self._wall0

    def _engine_first_tokens(self, records: list[RequestRecord]) -> None:
        """Set each finished record's ``engine_first_token`` (s since the run's start) from the
        KV-event batch that stored its last full prompt block: the end of the engine step that
        finished its prefill, as stamped (a release that stamps early is corrected afterwards:
        ``live_stamps.correct_live_stamps``). Left None when that block was not stored during the
        request (a prompt whose full blocks were all cache hits, or shorter than one block) or its
        event was not seen."""
        for record in records:
            last = self._last_block.get(record.trace.request_id)
            if last is None or record.first_token is None:
                continue
            ts = self.kv_events.stored_at(record.worker, last)
            if ts is not None:
                t = ts - self._wall0
                if record.arrival <= t <= record.first_token:
                    record.engine_first_token = t

    # -- clients --------------------------------------------------------------------------------

    def _spawn(self, rec: TraceRecord, send_at: float) -> None:
        task = asyncio.get_running_loop().create_task(self._client(rec, send_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _client(self, rec: TraceRecord, send_at: float) -> None:
        delay = send_at - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        ready = self.now()
        if self._slots is not None:
            await self._slots.acquire()
        try:
            await self._send(rec, self.now() - ready)
        finally:
            if self._slots is not None:
                self._slots.release()

    async def _send(self, rec: TraceRecord, slot_wait: float) -> None:
        prompt = self._prompt_ids(rec)
        hashes = chained_block_hashes(prompt, self.block_size)
        route = RouteRequest(rec.request_id, rec.session_id, hashes, len(prompt))
        try:
            worker = self.policy.choose(route, self.view)
        except Exception as exc:  # noqa: BLE001 - the policy's code (maybe a user's): named in the error
            if not (isinstance(exc, RuntimeError) and not self.view.alive_workers()):
                raise_policy_error(self.policy, exc, "choose")
            record = RequestRecord(rec, -1, self.now())  # every worker is dead
            record.error = f"not sent: {exc}"
            self.records.append(record)
            self._skip_children(rec)
            return
        n = len(self.endpoints)
        if worker.__class__ is not int or not 0 <= worker < n:  # the simulator's check (Cluster._route)
            worker = checked_worker(self.policy, worker, n)
        self.view.on_routed(worker, route)
        if hashes and self.kv_events is not None:
            self._last_block[rec.request_id] = hashes[-1]
        record = RequestRecord(rec, worker, self.now())
        self.records.append(record)
        ok = False
        try:
            ok = await self._stream(rec, worker, prompt, record)
        finally:
            if record.error is None and record.finish is None:
                record.error = "interrupted"
            # ready to send -> a client slot (max_in_flight), as the simulator's client_wait
            record.client_wait = max(0.0, slot_wait)
            self.view.on_finished(worker, rec.request_id)
        if not ok:
            self._skip_children(rec)
        elif rec.request_id not in self._no_ids:
            self._on_done(rec, record)

    async def _stream(self, rec: TraceRecord, worker: int, prompt: np.ndarray, record: RequestRecord) -> bool:
        ep = self.endpoints[worker]
        max_tokens = rec.output_length
        if self.max_model_len is not None:
            max_tokens = max(1, clamp_max_tokens(len(prompt), max_tokens, self.max_model_len))
        body = {
            "model": ep.model, "prompt": prompt.tolist(), "max_tokens": int(max_tokens),
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
        }
        # this request's gaps join the run's ITL only if it is served whole: a failed request's partial
        # stream is no served request's timing (summarize takes the other timings from ok requests only)
        t0, gaps = self._t0, array("d")
        times = record.token_times = array("d") if self.spec.record_tokens else None

        def on_tokens(k: int, t: float) -> None:
            now = t - t0
            if record.first_token is None:
                record.first_token = now
                self.view.on_first_token(rec.request_id)
            else:
                gaps.append(now - record.last_token)
            gaps.extend([0.0] * (k - 1))
            record.last_token = now
            record.output_tokens += k
            if times is not None:  # k tokens in one chunk arrive together
                times.extend([now] * k)

        task = asyncio.get_running_loop().create_task(
            stream_tokens(ep.url, body, self.spec.timeout_s, on_tokens, self._session))
        self._streams[worker][rec.request_id] = task
        try:
            res = await task
        except WorkerLost as exc:
            record.error = str(exc)
            self.mark_dead(worker, str(exc))
            return False
        except asyncio.CancelledError:
            reason = self._killed.pop(rec.request_id, None)
            current = asyncio.current_task()
            if reason is None or (current is not None and current.cancelling()):
                raise
            record.error = reason
            return False
        finally:
            self._streams[worker].pop(rec.request_id, None)
        record.arrival = res.t_send - t0
        if res.error is not None:
            record.error = res.error
            self._server_error(worker, res.status, res.error)
            return False
        self._errors_5xx[worker] = 0
        record.finish = record.last_token if record.last_token is not None else res.t_send - t0
        if res.completion_tokens is not None:  # usage over counted chunks, as vllm bench serve
            record.output_tokens = res.completion_tokens
        if res.warning is not None:
            self.warnings.append(res.warning)
        if res.usage_error is not None:  # the stream is whole: its children go on
            record.error = f"measurement error: {res.usage_error}"
        else:
            self.itl_gaps.extend(gaps)
        record.cached_tokens = res.cached_tokens or 0
        # NOTE: through vLLM 0.23 a server that reports cached tokens leaves the field out for a
        # zero hit (``and num_cached_tokens``), so only a server that never reported lacks the flag
        (self._reports_cached if res.cached_tokens is not None else self._missing_cached).add(worker)
        self.usage_reported = not (self._missing_cached - self._reports_cached)
        if rec.request_id in self._pending:
            if self.closed_loop and record.output_tokens and min(res.token_ids, default=-1) < 0:  # -1: no id
                # the later turns resend this reply: without its ids they would resend an invented
                # one, and their hits and TTFT would not be the replayed conversation's
                self._no_ids.add(rec.request_id)
                self._skip_children(rec, f"not sent: the server streamed no token ids for its parent request "
                                         f"{rec.request_id}'s reply (vLLM's return_token_ids), which this turn "
                                         f"resends")
                return True
            self._output[rec.request_id] = res.token_ids
        return True

    def _on_done(self, rec: TraceRecord, record: RequestRecord) -> None:
        if self.closed_loop:
            for child in self.workload.children.get(rec.request_id, ()):
                self._spawn(child, record.finish + child.think_time_ms / 1000.0)

    def _skip_children(self, rec: TraceRecord, reason: str | None = None) -> None:
        """A failed turn's later turns are never sent (closed loop), as in the simulator;
        ``reason`` is the error of ``rec``'s own children (default: their parent failed)."""
        if not self.closed_loop:
            return
        for parent, children in self.workload.subtree(rec):
            for child in children:
                skipped = RequestRecord(child, -1, self.now())
                skipped.error = (reason if reason is not None and parent is rec
                                 else f"not sent: its parent request {parent.request_id} failed")
                self.records.append(skipped)
            self._release(parent.request_id, all_children=True)

    @property
    def no_token_ids_note(self) -> str | None:
        """Why some later turns were not sent: replies streamed without token ids (closed loop),
        or None when every reply that later turns resend came with its ids."""
        if not self._no_ids:
            return None
        return (f"{len(self._no_ids)} replies came without token ids (the servers did not honour vLLM's "
                f"return_token_ids), so their later turns were not sent: resending an invented reply would "
                f"measure another conversation's hits and TTFT")

    def _server_error(self, worker: int, status: int, error: str) -> None:
        """Mark ``worker`` dead on a reply that says its engine died (vLLM's EngineDeadError:
        HTTP 500 "EngineCore encountered an issue", every request after the engine process is
        killed while the API process still answers), or on ``DEAD_AFTER_5XX`` HTTP 5xx in a row."""
        if status < 500:
            return
        self._errors_5xx[worker] += 1
        text = error.lower()
        if any(sign in text for sign in ENGINE_DEAD_SIGNS):
            self.mark_dead(worker, f"its engine died ({error})")
        elif self._errors_5xx[worker] >= DEAD_AFTER_5XX:
            self.mark_dead(worker, f"{self._errors_5xx[worker]} requests in a row failed with HTTP 5xx ({error})")

    def mark_dead(self, worker: int, reason: str) -> None:
        """Stop routing to ``worker`` and fail its requests in flight with ``reason``."""
        if worker in self.dead:
            return
        self.dead[worker] = reason
        self.view.mark_dead(worker)
        note = f"worker {worker} ({self.endpoints[worker].url}) failed: {reason}"
        for rid, task in list(self._streams[worker].items()):
            if not task.done():
                self._killed[rid] = note
                task.cancel()

    # -- prompts --------------------------------------------------------------------------------

    def _prompt_ids(self, rec: TraceRecord) -> np.ndarray:
        """The ids to send for ``rec`` (call it once, when ``rec`` is sent); each record's ids are
        built once and kept while a later build needs them: until its own send, and until each
        of its children is built."""
        # Ancestors not built yet (open loop: a child sent first) are built oldest first, in a
        # loop rather than by recursion, since sessions can be thousands of turns deep, and kept
        # for their own sends.
        chain = [rec]
        while chain[-1].request_id not in self._prompt and chain[-1].parent is not None:
            chain.append(self.workload.by_id[chain[-1].parent])
        prompt = self._prompt.get(chain[-1].request_id)
        if prompt is not None:  # built earlier for a child sent first (open loop)
            chain.pop()
        for link in reversed(chain):
            prompt = self._prompt_one(link, prompt, ahead=link is not rec)
        self._sent.add(rec.request_id)
        if rec.request_id not in self._pending:  # every child built already, or none
            self._prompt.pop(rec.request_id, None)
            self._sent.discard(rec.request_id)
        return prompt

    def _prompt_one(self, rec: TraceRecord, parent_prompt: np.ndarray | None, ahead: bool) -> np.ndarray:
        """The ids of ``rec`` given its parent's (None for a root); ``ahead``: built before its
        own send, for a child sent first, and so kept for it."""
        if rec.parent is None:
            prompt = self.prompts.root(rec)
        else:
            parent = self.workload.by_id[rec.parent]
            output = self._output.get(parent.request_id)
            if output is None:  # open loop: the parent's reply does not exist yet
                output = self.prompts.synthetic_output(parent)
            prompt = self.prompts.child(rec, parent_prompt, output)
            self._release(parent.request_id)
        if ahead or rec.request_id in self._pending:
            self._prompt[rec.request_id] = prompt
        return prompt

    def _release(self, request_id: int, all_children: bool = False) -> None:
        """One child of ``request_id`` was built (or all were dropped): free what it no longer needs."""
        left = 0 if all_children else self._pending.get(request_id, 0) - 1
        if left <= 0:
            self._pending.pop(request_id, None)
            self._output.pop(request_id, None)
            if all_children or request_id in self._sent:  # else kept for its own send (open loop)
                self._prompt.pop(request_id, None)
                self._sent.discard(request_id)
        else:
            self._pending[request_id] = left
