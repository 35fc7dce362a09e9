"""vLLM's ``AsyncScheduler`` (``vllm/v1/core/sched/async_scheduler.py``, vLLM 0.32): the
scheduler an engine core with ``async_scheduling`` runs, one step ahead of its outputs.

The engine core (``vllm/v1/engine/core.py: step_with_batch_queue``, a batch queue of two)
schedules step N+1 before it processes step N's output, so when a step is scheduled the output
of the step before it is still unknown. The scheduler accounts for that with *output
placeholders*:

- ``schedule`` advances ``num_computed_tokens`` as the synchronous scheduler does, then
  (``_update_after_schedule``) every scheduled request whose chunk reaches the end of its known
  tokens plus placeholders (it samples in this step) gets one more placeholder, and every
  scheduled request counts its tokens as in flight.
- The running pass asks ``num_tokens + placeholders - num_computed_tokens`` new tokens, so a
  request whose last token is still in flight is scheduled for its next decode token at once;
  a request whose in-flight steps already sample its last token (``num_computed_tokens + 2 -
  placeholders >= prompt + max_tokens``) is skipped (``Scheduler._schedule_running``).
- ``update`` (``update_from_output`` with ``AsyncScheduler._update_request_with_output``)
  appends the step's sampled tokens, takes one placeholder off per token, registers the blocks
  now full of known tokens (``cache_blocks(num_computed - placeholders)``) and finishes and
  frees a request that reached ``max_tokens``: one step later than the synchronous scheduler,
  because the next step was already scheduled.
- A request preempted while a step of it is in flight loses its placeholders; that step's
  output is still delivered when it is processed (the token is appended and may finish the
  request, which then leaves the waiting queue) but moves no placeholder and registers no
  block (``_preempt_request``: ``num_stale_output_tokens``).

The compiled scheduler (``_scheduler.pyx``) does the same when ``config.async_scheduling`` is
set; this class is the reference and the fallback (``kvroute.sim.engine.compiled.engine_classes``).
What the engine core does around it is the worker's (``kvroute.sim.cluster.worker``); the parity
tests drive both in the same loop (``tests/sim/engine/test_vllm_parity_async.py``).
"""

from __future__ import annotations

from kvroute.sim.engine.request import RequestStatus
from kvroute.sim.engine.scheduler import Scheduler
from kvroute.sim.engine.scheduler_output import SchedulerOutput, StepResult

__all__ = ["AsyncScheduler"]


class AsyncScheduler(Scheduler):
    """The synchronous :class:`~kvroute.sim.engine.scheduler.Scheduler` plus output placeholders.

    ``schedule()`` may be called again before ``update()`` of the step it returned: the caller
    keeps at most two steps unprocessed (vLLM's batch queue) and processes them in order.
    Decode-run fast-forward (``decode_run_length``) is not valid here and returns 0.

    Args:
        config: engine settings (``config.async_scheduling`` need not be set; the worker picks
            this class when it is).
    """

    def schedule(self) -> SchedulerOutput:
        """One step as ``Scheduler.schedule``, then placeholders for the requests that sample
        in it (``AsyncScheduler._update_after_schedule``); ``out.samples`` says which."""
        out = super().schedule()
        samples = out.samples = []
        for req, n in zip(out.requests, out.num_scheduled_tokens):
            req.num_in_flight_tokens += n
            sampling = req.num_computed_tokens >= req.num_prompt_tokens + req.num_output_tokens + req.num_output_placeholders
            if sampling:
                req.num_output_placeholders += 1
            samples.append(sampling)
        return out

    def decode_run_length(self, out: SchedulerOutput) -> int:
        """0: a run of identical decode steps is not advanced at once under async scheduling."""
        return 0

    def update(self, out: SchedulerOutput) -> StepResult:
        """Apply a step's output (``update_from_output``): one token for every request that
        sampled in it, stale ones included; placeholders down, newly known full blocks
        registered, finished requests freed and removed from their queue.

        Raises:
            ValueError: if ``out`` was not scheduled by an ``AsyncScheduler``.
        """
        if out.samples is None:
            raise ValueError("AsyncScheduler.update: the step was not scheduled by an AsyncScheduler")
        emitted: list = []
        finished: list = []
        kv = self.kv_cache_manager
        caching = self.pool.enable_caching
        bs = self.config.block_size
        max_model_len = self.config.max_model_len
        running = RequestStatus.RUNNING
        stopped_waiting = False
        for req, n, sampling in zip(out.requests, out.num_scheduled_tokens, out.samples):
            if req.status >= RequestStatus.FINISHED_LENGTH_CAPPED:
                continue  # finished (or aborted) while this step was in flight
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:
                req.num_stale_output_tokens -= n
            if not sampling:
                continue  # a prefill chunk that does not reach the end samples nothing
            status_before = req.status
            req.num_output_tokens += 1
            emitted.append(req)
            stopped = req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len
            if stopped:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            if not stale:
                req.num_output_placeholders -= 1
            if status_before is running and caching:
                kv.cache_blocks(req, (req.num_computed_tokens - req.num_output_placeholders) // bs)
            if stopped:
                kv.free(req)
                finished.append(req)
                if status_before is not running:
                    stopped_waiting = True
        if finished:
            self.running = [r for r in self.running if r.status is running]
            if stopped_waiting:
                # NOTE: rare: a request preempted with its last token in flight
                for req in finished:
                    if req in self.waiting:
                        self.waiting.remove(req)
        return StepResult(emitted, finished)
