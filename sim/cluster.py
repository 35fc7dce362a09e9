"""A cluster run: SimPy environment, GPUs, workers, router and clients; returns the records.

Time of one request: the client sends it (a root at its trace timestamp plus a seeded start
jitter; a later turn when its parent's last token arrived plus its think time); the gateway
routes it at once and forwards it; gateway and API-server overheads (a seeded lognormal factor
around the profile's means) pass before the engine sees it; each token reaches the client when
its engine step ends. A profile with a ``frontend`` or ``host`` section (``kvroute.sim.frontend``)
also queues admissions and streamed tokens in each server's API processes and stretches engine
steps when the host's cores are oversubscribed; runs of decode steps are then simulated one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from kvroute.sim.frontend import ContendedStepCost, Frontends
from kvroute.sim.metrics import RequestRecord, RunResult
from kvroute.sim.profile import Profile
from kvroute.sim.request import Request
from kvroute.sim.routing import RouteRequest, RouterView, make_policy
from kvroute.sim.scheduler import admission_error, clamp_max_tokens
from kvroute.sim.worker import Worker
from kvroute.sim.workload import Workload
from kvroute.traces.format import Trace, TraceRecord


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to simulate.

    Attributes:
        profile: the workers' profile (all workers alike).
        num_workers: vLLM instances behind the router.
        num_gpus: GPUs; worker ``i`` runs on GPU ``i % num_gpus``, so fewer GPUs than workers
            means sharing (memory split per vLLM's rule, steps alternating). Default: one each.
        policy: routing policy name (see ``kvroute.sim.routing.POLICIES``).
        closed_loop: send a later turn when its parent finished (plus think time); None picks
            closed loop for traces with sessions and open loop (timestamps) otherwise.
        arrival_spread_s: each root request's send time gets a uniform jitter in
            ``[0, arrival_spread_s]`` (the lab's burst started within a few ms, not at once).
        router_block_tokens: granularity of the router's routed-prefix index, tokens.
        record_steps: keep a per-step log on each worker.
        fast_forward: advance runs of identical decode steps as one event (same result up to
            floating-point rounding; much faster on long decodes).
        max_in_flight: the client keeps at most this many requests outstanding; the others wait
            in the client in the order they became ready (1 sends requests one at a time).
            None: no limit.
    """

    profile: Profile
    num_workers: int = 4
    num_gpus: int | None = None
    policy: str = "round_robin"
    closed_loop: bool | None = None
    arrival_spread_s: float = 0.005
    router_block_tokens: int = 256
    record_steps: bool = False
    fast_forward: bool = True
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.num_gpus is not None and not 1 <= self.num_gpus <= self.num_workers:
            raise ValueError(f"num_gpus must be between 1 and num_workers, got {self.num_gpus}")
        if self.arrival_spread_s < 0:
            raise ValueError("arrival_spread_s must be >= 0")

    def gpu_of(self, worker: int) -> int:
        """The GPU index worker ``worker`` runs on."""
        return worker % (self.num_gpus or self.num_workers)

    def workers_on_gpu(self, gpu: int) -> int:
        """How many workers share GPU ``gpu``."""
        return sum(1 for w in range(self.num_workers) if self.gpu_of(w) == gpu)


def check_capacity(trace: Trace, profile: Profile) -> None:
    """Fail before a run if some request can never fit in one worker's KV cache.

    A request needs ``ceil(min(prompt + output, max_model_len) / block_size)`` blocks when it is
    alone; prompts vLLM would reject for ``max_model_len`` are not counted.

    Raises:
        ValueError: naming the request, its tokens, the blocks it needs and the blocks available.
    """
    engine = profile.engine
    usable = engine.num_usable_blocks
    for rec in trace.records:
        if admission_error(rec.input_length, engine.max_model_len):
            continue
        tokens = rec.input_length + clamp_max_tokens(rec.input_length, rec.output_length, engine.max_model_len)
        need = math.ceil(tokens / engine.block_size)
        if need > usable:
            raise ValueError(
                f"{trace.source}: request {rec.request_id} needs {need} KV blocks "
                f"({rec.input_length} prompt + {rec.output_length} output tokens at "
                f"{engine.block_size} tokens per block) but a worker of profile "
                f"{profile.name!r} has only {usable} usable blocks "
                f"({usable * engine.block_size} tokens)"
            )


class Cluster:
    """Workers, router and clients of one run. Use ``simulate`` rather than this directly.

    Args:
        trace: the requests.
        spec: what to simulate.
        seed: seeds the one random generator of the run (jitter, random policy).
    """

    def __init__(self, trace: Trace, spec: ClusterSpec, seed: int) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.env = simpy.Environment()
        num_gpus = spec.num_gpus or spec.num_workers
        self.profiles = [spec.profile.shared(spec.workers_on_gpu(spec.gpu_of(w))) for w in range(spec.num_workers)]
        for profile in {p.engine.num_gpu_blocks: p for p in self.profiles}.values():
            check_capacity(trace, profile)
        gpus = [simpy.Resource(self.env, capacity=1) for _ in range(num_gpus)]
        prof = spec.profile
        self.frontends = Frontends(prof.frontend, spec.num_workers) if prof.frontend is not None else None
        loaded = self.frontends is not None or prof.host is not None
        step_cost = ContendedStepCost(prof.step_cost, prof.host, self._num_busy) if prof.host else prof.step_cost
        self.workers = [
            Worker(
                self.env,
                w,
                self.profiles[w].engine,
                step_cost,
                gpus[spec.gpu_of(w)] if spec.workers_on_gpu(spec.gpu_of(w)) > 1 else None,
                self._on_token,
                self._on_finish,
                self._on_decode_run,
                spec.record_steps,
                spec.fast_forward and not loaded,
            )
            for w in range(spec.num_workers)
        ]
        self.workload = Workload(trace, spec.profile.engine.block_size)
        self.policy = make_policy(spec.policy, self.rng)
        self.view = RouterView(
            spec.num_workers,
            spec.profile.engine.block_size,
            spec.router_block_tokens,
            track_prefixes=self.policy.uses_prefixes,
        )
        self.closed_loop = self.workload.has_sessions if spec.closed_loop is None else spec.closed_loop
        self.records: list[RequestRecord] = []
        self.itl_gaps: list[float] = []
        self._slots = simpy.Resource(self.env, spec.max_in_flight) if spec.max_in_flight else None
        self._held: dict[int, simpy.resources.resource.Request] = {}
        self._overheads = spec.profile.overheads
        self._sigma = math.sqrt(math.log1p(self._overheads.jitter_cv**2))

    def run(self) -> RunResult:
        """Simulate until every request has finished; return the records and counters."""
        spread = self.spec.arrival_spread_s
        sent = self.workload.roots if self.closed_loop else self.workload.trace.records
        for rec in sent:
            jitter = self.rng.uniform(0.0, spread) if spread > 0 else 0.0
            self.env.process(self._client(rec, rec.timestamp_ms / 1000.0 + jitter))
        self.env.run()
        return RunResult.from_cluster(self)

    # -- clients -------------------------------------------------------------------------------

    def _client(self, rec: TraceRecord, send_at: float):
        env = self.env
        if send_at > env.now:
            yield env.timeout(send_at - env.now)
        if self._slots is not None:
            slot = self._held[rec.request_id] = self._slots.request()
            yield slot
        segments, hashes = self.workload.build(rec)
        bs = self.spec.profile.engine.block_size
        route = RouteRequest(rec.request_id, rec.session_id, hashes[: rec.input_length // bs], rec.input_length)
        worker = self.policy.choose(route, self.view)
        self.view.on_routed(worker, route)
        record = RequestRecord(rec, worker, env.now)
        self.records.append(record)
        if self._sigma > 0:
            factor = self.rng.lognormal(-0.5 * self._sigma**2, self._sigma)
        else:
            factor = 1.0
        delay = self._overheads.mean_s(rec.input_length) * factor
        if self.frontends is not None:
            delay += self.frontends.admit(worker, rec.request_id, env.now, rec.input_length)
        yield env.timeout(delay)
        engine = self.profiles[worker].engine
        error = admission_error(rec.input_length, engine.max_model_len)
        if error:
            record.error = error
            record.finish = env.now
            self.view.on_finished(worker)
            self._release_slot(rec.request_id)
            self._release_children(rec)
            return
        max_tokens = clamp_max_tokens(rec.input_length, rec.output_length, engine.max_model_len)
        request = Request(rec.request_id, rec.input_length, max_tokens, hashes, client=record)
        self.workers[worker].add_request(request)

    def _on_token(self, request: Request, now: float) -> None:
        record: RequestRecord = request.client
        if self.frontends is not None:
            now = self.frontends.deliver(record.worker, request.request_id, now)
        if request.num_output_tokens == 1 and record.first_token is None:
            record.first_token = now
        else:
            self.itl_gaps.append(now - record.last_token)
        record.last_token = now

    def _on_decode_run(self, requests: list[Request], step_ends: list[float]) -> None:
        gaps = [b - a for a, b in zip(step_ends, step_ends[1:])]
        last = step_ends[-1]
        for request in requests:
            request.client.last_token = last
            self.itl_gaps.extend(gaps)

    def _on_finish(self, request: Request, now: float) -> None:
        record: RequestRecord = request.client
        if self.frontends is not None:
            now = record.last_token  # the client has the reply when the API streamed its last token
        record.finish = now
        record.cached_tokens = request.num_cached_tokens or 0
        record.output_tokens = request.num_output_tokens
        record.preemptions = request.num_preemptions
        self.view.on_finished(record.worker)
        self._release_slot(record.trace.request_id)
        if self.closed_loop:
            for child in self.workload.children.get(record.trace.request_id, ()):
                self.env.process(self._client(child, now + child.think_time_ms / 1000.0))

    def _num_busy(self) -> int:
        """Engines with work plus API lanes with a backlog, now (the host model's load)."""
        now = self.env.now
        engines = sum(w.scheduler.has_unfinished_requests() for w in self.workers)
        return engines + (self.frontends.num_busy(now) if self.frontends is not None else 0)

    def _release_slot(self, request_id: int) -> None:
        if self._slots is not None:
            self._slots.release(self._held.pop(request_id))

    def _release_children(self, rec: TraceRecord) -> None:
        """A failed request's later turns are never sent (closed loop); record them as skipped."""
        if not self.closed_loop:
            return
        for child in self.workload.children.get(rec.request_id, ()):
            record = RequestRecord(child, -1, self.env.now)
            record.error = f"not sent: its parent request {rec.request_id} failed"
            self.records.append(record)
            self._release_children(child)


def simulate(trace: Trace, spec: ClusterSpec, seed: int = 0) -> RunResult:
    """Run one simulation of ``trace`` on the cluster ``spec``.

    Args:
        trace: the requests.
        spec: profile, workers, GPUs, policy and replay mode.
        seed: seeds the run's one random generator; the same seed gives the same result.

    Returns:
        The run's per-request records and per-worker counters.

    Raises:
        ValueError: a request can never fit in a worker's KV cache, the engine block size
            cannot map the trace's, or the policy name is unknown.
    """
    return Cluster(trace, spec, seed).run()
