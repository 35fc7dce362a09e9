"""One simulated vLLM worker: a SimPy process around the plain Scheduler.

Each iteration schedules a step, holds the worker's GPU for the step time the cost model gives,
applies the step and streams its tokens: a token reaches the client when its step ends. An idle
worker sleeps on an event that ``add_request`` triggers, so there is no polling. GPUs are SimPy
resources of capacity 1: two workers on one GPU alternate their steps, each at half speed.

A run of decode steps whose batch cannot change (nothing waiting, nobody finishing, enough free
blocks) is advanced as one event, where the step timer allows it (its step times depend on
nothing but the batch, ``kvroute.sim.timing.step_timer.StepTimer``): the step times are
summed in closed form and the run is cut short at the step in progress when a request
arrives, so the result equals stepping one at a time (up to floating-point rounding of the
summed times).

A request whose client went away is aborted as vLLM's engine core aborts it
(``abort_request``): the abort is taken in when the step in flight ends, before that step's
output is applied (``EngineCore.step``: ``_process_aborts_queue`` before
``update_from_output``), or at the start of the next loop iteration, before ``schedule()``, if
no step output comes first (``_process_input_queue``); ``Scheduler.finish_requests`` then
frees its blocks. An abort cuts a decode run after the step in progress, as an arrival does.

With async scheduling (``EngineConfig.async_scheduling``) the loop is vLLM's
``EngineCore.step_with_batch_queue`` with a batch queue of two (``_run_async``): the step after
the one in flight is scheduled before the output of the one in flight is processed, and each
step's CPU part overlaps the GPU part of the step before it
(``kvroute.sim.timing.async_overlap``). No decode-run fast-forward then.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from typing import TYPE_CHECKING

import simpy

from kvroute.sim.engine.compiled import engine_classes
from kvroute.sim.engine.request import RequestStatus
from kvroute.sim.timing.compiled import DecodeRunTimes
from kvroute.sim.timing.step_timer import StepTimer
from kvroute.sim.cluster.timeseries import StepSeries

if TYPE_CHECKING:
    from kvroute.sim.engine.config import EngineConfig
    from kvroute.sim.engine.request import Request


class Worker:
    """A vLLM engine on a (possibly shared) GPU.

    Args:
        env: the SimPy environment.
        index: worker index behind the router.
        config: engine settings (block count already adjusted for GPU sharing).
        step_cost: the engine's step timer (``kvroute.sim.timing.host.Host.step_timers``).
        gpu: the GPU's resource when other workers share it; None when the worker owns its GPU
            (holding an uncontended resource would change nothing but cost time).
        on_token: called as ``on_token(request, now)`` for every sampled token.
        on_finish: called as ``on_finish(request, now)`` when a request has all its tokens.
        on_decode_run: called as ``on_decode_run(requests, step_ends, gaps)`` for a run of
            decode steps advanced at once: every request got one token at each time in
            ``step_ends`` (a sequence of floats); ``gaps`` are the differences of consecutive
            ends, an ``array("d")``.
        record_steps: keep ``step_log``, one ``(start, duration, tokens, reqs)`` per step.
        fast_forward: advance runs of identical decode steps as one event where the step timer
            allows it (``StepTimer.fast_forward``) and the GPU is not shared.
        record_series: sample the engine's state after every step into ``series``
            (``kvroute.sim.cluster.timeseries``; a fast-forwarded decode run is one sample).
        async_cpu_s: with ``config.async_scheduling``, the CPU part of every step, s
            (``kvroute.sim.timing.async_overlap.AsyncOverlap.cpu_s``); ignored otherwise.
        admission: ``admission(request)``: seconds the step that first schedules ``request``
            spends on it beyond the step timer's time (``kvroute.sim.timing.profile.Overheads.
            engine_admission``: vLLM sends a newly scheduled request's prompt to the model's
            worker process inside that step); the step takes the sum over its newly scheduled
            requests more. None: nothing added.

    Attributes:
        scheduler: the engine's scheduler (queues, block pool, prefix-cache counters).
        num_aborted: requests aborted while in the engine (``abort_request``).
        num_steps: engine steps run.
        busy_time: seconds spent running steps (not waiting for a shared GPU); with async
            scheduling, their GPU parts (the CPU parts overlap them).
        idle_since: when the engine last ran out of work, s (-inf: not yet).
        step_log: when ``record_steps`` is set, ``(start, duration, tokens, reqs)`` per step,
            flattened into one ``array("d")`` (seconds, seconds, tokens, requests); else None.
        series: the step samples when ``record_series`` is set, else None.
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        config: "EngineConfig",
        step_cost: StepTimer,
        gpu: simpy.Resource | None,
        on_token,
        on_finish,
        on_decode_run,
        record_steps: bool = False,
        fast_forward: bool = True,
        record_series: bool = False,
        async_cpu_s: float = 0.0,
        admission=None,
    ) -> None:
        self.env = env
        self.index = index
        self.async_cpu_s = async_cpu_s
        self.admission = admission
        self.scheduler = engine_classes(config)[1](config)
        self.step_cost = step_cost
        self.gpu = gpu
        self.on_token = on_token
        self.on_finish = on_finish
        self.on_decode_run = on_decode_run
        self.fast_forward = fast_forward and gpu is None and step_cost.fast_forward and not config.async_scheduling
        self.num_steps = 0
        self.busy_time = 0.0
        self.idle_since = -math.inf
        self.step_log: array | None = array("d") if record_steps else None
        self.series = StepSeries(index, self.scheduler) if record_series else None
        self._wakeup: simpy.Event | None = None
        self._arrived: list[Request] = []  # handed over since the last step started
        self._aborted: list[Request] = []  # aborted since the engine last took aborts in
        self.num_aborted = 0
        self.process = env.process(self._run_async() if config.async_scheduling else self._run())

    def add_request(self, request: Request) -> None:
        """Hand a request to the engine; it joins the waiting queue before the next step, and
        its ``queued_ts`` is that step's start (vLLM's QUEUED event: the engine core's loop adds
        the requests that came in during a step after that step, ``EngineCore._process_input_queue``
        then ``Scheduler.add_request``, so vLLM's queue time leaves out the step in progress)."""
        self._arrived.append(request)
        self.scheduler.add_request(request)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def abort_request(self, request: Request) -> None:
        """Abort a request handed to this engine (its client went away), as vLLM does.

        vLLM's API server aborts a request whose client disconnected
        (``vllm/v1/engine/async_llm.py: generate``); the engine core takes the abort in at its
        next step boundary: when the step in flight ends, before its output is processed
        (``vllm/v1/engine/core.py: step``, ``_process_aborts_queue``), or, if the loop reaches
        its next ``schedule()`` first (an async batch queue not yet full), at the start of that
        iteration (``_process_input_queue``); ``EngineCore.abort_requests`` then calls
        ``Scheduler.finish_requests(ids, FINISHED_ABORTED)``, which takes it out of its queue and
        frees its blocks. So the aborted request gets no token from the step in flight. A decode
        run is cut after the step in progress. Aborts taken in together are applied in the order
        they came (vLLM collects their ids in a set, whose order is not fixed). A request already
        finished is left alone. The API server's own abort latency is taken as 0 s.
        """
        self._aborted.append(request)
        # NOTE: wakes only a decode run; an idle engine holds no request to abort
        if self._wakeup is not None and not self._wakeup.triggered and self.scheduler.has_unfinished_requests():
            self._wakeup.succeed()

    def _take_aborts(self) -> None:
        """``EngineCore._process_aborts_queue``: apply the aborts that came since the last time."""
        aborted = self._aborted
        if aborted:
            self._aborted = []
            self.num_aborted += len(self.scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED))

    def holds_core(self, now: float, spin_s: float) -> bool:
        """Whether the engine holds a CPU core at ``now`` (``kvroute.sim.timing.host.Engine``): it
        has work, or ran out of it less than ``spin_s`` seconds ago (``HostModel.engine_spin_s``)."""
        return self.scheduler.has_unfinished_requests() or now - self.idle_since < spin_s

    def _run(self):
        env, scheduler, cost = self.env, self.scheduler, self.step_cost
        while True:
            if not scheduler.has_unfinished_requests():
                self.idle_since = env.now
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            if self._aborted:  # came in after the last step's output (at its very end)
                self._take_aborts()
                if not scheduler.has_unfinished_requests():
                    continue
            if self._arrived:
                self._mark_queued(self._arrived, env.now)
            out = scheduler.schedule()
            extra = 0.0
            if out.admitted:
                extra = self._admission_s(out.admitted)
                self._mark_scheduled(out.admitted, env.now)
            if not out.requests:
                # Nothing fits even alone: the cluster checks capacity before the run, so this
                # is a bug, not a workload property.
                raise RuntimeError(
                    f"worker {self.index}: no request can be scheduled "
                    f"(waiting {len(scheduler.waiting)}, running {len(scheduler.running)}, "
                    f"free blocks {scheduler.pool.num_free_blocks})"
                )
            tokens, reqs = out.num_batched_tokens, len(out.requests)
            dt = cost.step_time(tokens, reqs, out.prefill_token_pairs, out.decode_context_tokens, out.num_decodes)
            if extra:
                dt += extra
            if self.fast_forward:
                run = scheduler.decode_run_length(out)
                if run > 0:
                    yield from self._decode_run(out, dt, run)
                    continue
            if self.gpu is not None:
                with self.gpu.request() as slot:
                    yield slot
                    start = env.now
                    yield env.timeout(dt)
            else:
                start = env.now
                yield env.timeout(dt)
            self.num_steps += 1
            self.busy_time += dt
            if self.step_log is not None:
                self.step_log.extend((start, dt, tokens, reqs))
            self._finish_step(out, env.now)
            if self.series is not None:
                self.series.sample(start, env.now, 1, tokens, reqs)

    def _run_async(self):
        """The engine core's loop with async scheduling (``step_with_batch_queue``, two batches).

        Each iteration takes the arrived requests and, if any request is unfinished, schedules
        a step and queues it. Its CPU part (``async_cpu_s``: scheduling, input preparation and
        the previous output's processing) keeps the engine's thread busy. Unless the queue is
        then full (two steps) the next iteration starts when that CPU part is done; otherwise
        the oldest queued step runs its GPU part now (its own CPU part is done, and so is the
        step before it) and its output is processed when both that GPU part and the new step's
        CPU part are done: its tokens, finishes and freed blocks appear then
        (``kvroute.sim.timing.async_overlap``). On a shared GPU the GPU part holds the GPU.
        """
        env, scheduler, cost = self.env, self.scheduler, self.step_cost
        cpu_s, gpu = self.async_cpu_s, self.gpu
        queue: deque = deque()  # (out, step time): newest first, as vLLM's batch queue
        while True:
            if not queue and not scheduler.has_unfinished_requests():
                self.idle_since = env.now
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            if self._aborted:  # _process_input_queue: before this iteration schedules
                self._take_aborts()
                if not queue and not scheduler.has_unfinished_requests():
                    continue
            if self._arrived:
                self._mark_queued(self._arrived, env.now)
            cpu_done = env.now
            if scheduler.has_unfinished_requests():
                out = scheduler.schedule()
                extra = 0.0
                if out.admitted:
                    extra = self._admission_s(out.admitted)
                    self._mark_scheduled(out.admitted, env.now)
                dt = 0.0
                if out.requests:
                    dt = cost.step_time(out.num_batched_tokens, len(out.requests), out.prefill_token_pairs,
                                        out.decode_context_tokens, out.num_decodes) + extra
                    # NOTE: the CPU part cannot exceed the step (a step timer may give less)
                    cpu_done += cpu_s if cpu_s < dt else dt
                elif not any(q[0].requests for q in queue):
                    # Nothing fits even alone and nothing is in flight: the cluster checks
                    # capacity before the run, so this is a bug, not a workload property.
                    raise RuntimeError(
                        f"worker {self.index}: no request can be scheduled "
                        f"(waiting {len(scheduler.waiting)}, running {len(scheduler.running)}, "
                        f"free blocks {scheduler.pool.num_free_blocks})"
                    )
                queue.appendleft((out, dt))
                if len(queue) < 2:
                    if cpu_done > env.now:
                        yield env.timeout(cpu_done - env.now)
                    continue  # schedule the next step before waiting for this one
            out, dt = queue.pop()
            if out.requests:
                gpu_s = dt - (cpu_s if cpu_s < dt else dt)
                if gpu is not None:
                    with gpu.request() as slot:
                        yield slot
                        start = env.now
                        yield env.timeout(gpu_s)
                else:
                    start = env.now
                    if start + gpu_s > cpu_done:
                        cpu_done = start + gpu_s
                end = start + gpu_s
                tokens, reqs = out.num_batched_tokens, len(out.requests)
                self.num_steps += 1
                self.busy_time += gpu_s
                if self.step_log is not None:
                    self.step_log.extend((start, gpu_s, tokens, reqs))
            if cpu_done > env.now:
                yield env.timeout(cpu_done - env.now)
            if out.requests:
                self._finish_step(out, env.now)
                if self.series is not None:
                    self.series.sample(start, end, 1, tokens, reqs)
            else:
                self._take_aborts()
                scheduler.update(out)

    @staticmethod
    def _mark_queued(arrived: list[Request], now: float) -> None:
        """Stamp the requests handed over since the last step with this step's start, and
        forget them."""
        for req in arrived:
            req.queued_ts = now
        arrived.clear()

    def _admission_s(self, admitted: list[Request]) -> float:
        """Seconds a step spends admitting the requests it schedules for the first time (not
        re-admissions after a preemption: call before :meth:`_mark_scheduled`); 0 without
        ``admission``."""
        admission = self.admission
        if admission is None:
            return 0.0
        return sum(admission(req) for req in admitted if req.scheduled_ts is None)

    @staticmethod
    def _mark_scheduled(admitted: list[Request], now: float) -> None:
        """Stamp a request's first scheduling (vLLM's ``RequestStateStats.scheduled_ts``: set on
        the first SCHEDULED event only, a re-admission after a preemption leaves it)."""
        for req in admitted:
            if req.scheduled_ts is None:
                req.scheduled_ts = now

    def _finish_step(self, out, now: float) -> None:
        """Take in the aborts that came during the step, then apply its output and stream it."""
        if self._aborted:
            self._take_aborts()
        result = self.scheduler.update(out)
        on_token = self.on_token
        for req in result.emitted:
            on_token(req, now)
        for req in result.finished:
            self.on_finish(req, now)

    def _decode_run(self, out, dt: float, run: int):
        """Step ``out`` plus up to ``run`` identical decode steps, as one wait.

        Step j's time grows only through the context every request reads (one more token each
        per step). An arrival cuts the run after the step in progress, as a real engine would
        take the new request into the next step it schedules. An abort cuts it the same way and
        is taken in at the end of that step, before its output: the aborted request gets the
        tokens of the steps before it only.
        """
        env = self.env
        batch = len(out.requests)
        start = env.now
        # Step j of the run costs base + decode_attn_s * (context + batch * j): the same float
        # operations, in the same order, as cost.step_time(batch, batch, 0.0, ...), so every
        # duration and every end time equals stepping one at a time bit for bit.
        times = DecodeRunTimes(self.step_cost, dt, batch, out.decode_context_tokens, run, start)
        last = times.end(run)
        wakeup = self._wakeup = env.event()
        timeout = env.timeout(last - start)
        # NOTE: what ``timeout | wakeup`` (SimPy's AnyOf) does, without building its value:
        # ``resume`` is triggered from the callback of the first of the two to be processed, so
        # the worker resumes one event after it, as it would after the condition.
        resume = env.event()

        def end_wait(_event) -> None:
            if not resume.triggered:
                resume.succeed()

        timeout.callbacks.append(end_wait)
        wakeup.callbacks.append(end_wait)
        yield resume
        self._wakeup = None
        done = run
        if env.now < last:  # an arrival: finish the step in progress, then stop
            now = env.now
            done = times.first_ending_at_or_after(now)
            if times.end(done) > now:
                yield env.timeout(times.end(done) - now)
        self.num_steps += done + 1
        self.busy_time += times.busy_s(done + 1)
        if self.step_log is not None:
            for j in range(done + 1):
                self.step_log.extend((times.end(j) - times.duration(j), times.duration(j), batch, batch))
        # aborts that came during step ``done`` (> 0) are taken in after the steps before it and
        # its schedule, before its output (a decode step's output frees nothing)
        aborted, self._aborted = (self._aborted, []) if done else ([], self._aborted)
        self._finish_step(out, times.end(0))
        if done:
            requests = list(out.requests)
            self.scheduler.advance_decode_run(requests, done)
            if aborted:
                self._aborted = aborted
                self._take_aborts()
                gone = [r for r in requests if r.status == RequestStatus.FINISHED_ABORTED]
                if gone:
                    requests = [r for r in requests if r.status != RequestStatus.FINISHED_ABORTED]
                    if done > 1:
                        self.on_decode_run(gone, times.ends(done), times.gaps(done))
            if requests:
                self.on_decode_run(requests, times.ends(done + 1), times.gaps(done + 1))
        if self.series is not None:
            self.series.sample(start, times.end(done), done + 1, batch, batch)
