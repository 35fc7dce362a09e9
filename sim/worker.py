"""One simulated vLLM worker: a SimPy process around the plain Scheduler.

Each iteration schedules a step, holds the worker's GPU for the step time the cost model gives,
applies the step and streams its tokens: a token reaches the client when its step ends. An idle
worker sleeps on an event that ``add_request`` triggers, so there is no polling. GPUs are SimPy
resources of capacity 1: two workers on one GPU alternate their steps, each at half speed.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import simpy

from kvroute.sim.cost_model import StepCost
from kvroute.sim.request import Request
from kvroute.sim.scheduler import Scheduler

if TYPE_CHECKING:
    from kvroute.sim.config import EngineConfig


class Worker:
    """A vLLM engine on a (possibly shared) GPU.

    Args:
        env: the SimPy environment.
        index: worker index behind the router.
        config: engine settings (block count already adjusted for GPU sharing).
        step_cost: step-time coefficients.
        gpu: the GPU's resource when other workers share it; None when the worker owns its GPU
            (holding an uncontended resource would change nothing but cost time).
        on_token: called as ``on_token(request, now)`` for every sampled token.
        on_finish: called as ``on_finish(request, now)`` when a request has all its tokens.

    Attributes:
        scheduler: the engine's scheduler (queues, block pool, prefix-cache counters).
        num_steps: engine steps run.
        busy_time: seconds spent running steps (not waiting for a shared GPU).
        step_log: when ``record_steps`` is set, ``(start, duration, tokens, reqs)`` per step.
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        config: "EngineConfig",
        step_cost: StepCost,
        gpu: simpy.Resource | None,
        on_token,
        on_finish,
        record_steps: bool = False,
    ) -> None:
        self.env = env
        self.index = index
        self.scheduler = Scheduler(config)
        self.step_cost = step_cost
        self.gpu = gpu
        self.on_token = on_token
        self.on_finish = on_finish
        self.num_steps = 0
        self.busy_time = 0.0
        self.step_log: array | None = array("d") if record_steps else None
        self._wakeup: simpy.Event | None = None
        self.process = env.process(self._run())

    def add_request(self, request: Request) -> None:
        """Hand a request to the engine; it joins the waiting queue before the next step."""
        self.scheduler.add_request(request)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _run(self):
        env, scheduler, cost = self.env, self.scheduler, self.step_cost
        while True:
            if not scheduler.has_unfinished_requests():
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            out = scheduler.schedule()
            if out.is_empty():
                # Nothing fits even alone: the cluster checks capacity before the run, so this
                # is a bug, not a workload property.
                raise RuntimeError(
                    f"worker {self.index}: no request can be scheduled "
                    f"(waiting {len(scheduler.waiting)}, running {len(scheduler.running)}, "
                    f"free blocks {scheduler.pool.num_free_blocks})"
                )
            dt = cost.step_time(
                out.num_batched_tokens,
                len(out.requests),
                out.prefill_token_pairs,
                out.decode_context_tokens,
            )
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
                self.step_log.extend((start, dt, out.num_batched_tokens, len(out.requests)))
            result = scheduler.update(out)
            now = env.now
            on_token = self.on_token
            for req in result.emitted:
                on_token(req, now)
            for req in result.finished:
                self.on_finish(req, now)
