"""A cluster run: SimPy environment, GPUs, workers, router and clients; returns the records.

Time of one request: the client sends it (a root at its trace timestamp plus a seeded start
jitter; a later turn when its parent's last token arrived plus its think time); the gateway
routes it at once and forwards it; gateway and API-server overheads (a seeded lognormal factor
around the profile's means) pass before the engine sees it; each token reaches the client when
its engine step ends. A profile with a ``frontend`` or ``host`` section (``kvroute.sim.timing.frontend``)
also queues admissions and streamed tokens in each server's API processes and stretches engine
steps when the host's cores are oversubscribed (``kvroute.sim.timing.host``: the lanes, the load
and each worker's step timer); runs of decode steps are then simulated one by one.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from kvroute.sim.cluster.collector import paused_collector
from kvroute.sim.engine.compiled import Request, engine_classes  # Request: the annotations' type
from kvroute.sim.timing.async_overlap import AsyncOverlap
from kvroute.sim.timing.host import Host
from kvroute.sim.timing.step_timer import StepTimer
from kvroute.sim.cluster.metrics import RequestRecord, RunResult
from kvroute.sim.cluster.timeseries import series_frame
from kvroute.sim.timing.profile import Profile
from kvroute.sim.routing.view import routed_index_tokens
from kvroute.sim.routing import (CACHE_VIEWS, DEFAULT_POLICIES, KVEventIndex, MetricsScrape, RouteRequest, RouterView,
                                 make_policy, router_rng)
from kvroute.sim.routing.policy_errors import checked_worker, prepare_policy, raise_policy_error
from kvroute.sim.engine.scheduler import admission_error, clamp_max_tokens
from kvroute.sim.cluster.worker import Worker
from kvroute.sim.cluster.workload import Workload
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.inputs import SECONDS


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to simulate.

    Attributes:
        profile: the workers' profile (all workers alike).
        num_workers: vLLM instances behind the router.
        num_gpus: GPUs; worker ``i`` runs on GPU ``i % num_gpus``, so fewer GPUs than workers
            means sharing (memory split per vLLM's rule, steps alternating). Default: one each.
        policy: routing policy name (see ``kvroute.sim.routing.POLICIES``); default the
            baseline of ``kvroute.sim.routing.DEFAULT_POLICIES``, round_robin.
        closed_loop: send a later turn when its parent finished (plus think time); None picks
            closed loop for traces with sessions and open loop (timestamps) otherwise.
        arrival_spread_s: each request the client sends at its timestamp (the roots in closed
            loop; every request in open loop) gets a uniform jitter in ``[0, arrival_spread_s]``
            on its send time (the lab's burst started within a few ms, not at once).
        router_block_tokens: granularity of the router's routed-prefix index, tokens; None: the
            trace's (``kvroute.sim.routing.view.routed_index_tokens``).
        record_steps: keep a per-step log on each worker.
        record_series: sample each worker's state after every engine step
            (``kvroute.sim.cluster.timeseries``) and keep every output token's arrival time; off, the
            run does neither and costs nothing extra.
        fast_forward: advance runs of identical decode steps as one event (same result up to
            floating-point rounding; much faster on long decodes).
        max_in_flight: the client keeps at most this many requests outstanding; the others wait
            in the client in the order they became ready (1 sends requests one at a time).
            None: no limit.
        scrape_interval_s: the gateway scrapes each worker's ``/metrics`` (running, waiting,
            KV usage) every this many seconds; 0 reads them live at each decision.
        cache_view: where cache-aware policies look up prefixes: ``routed`` (the gateway's
            routed-prefix index), ``events`` (the workers' KV-cache events) or ``exact``; a
            policy that names its own (``Policy.cache_view``, e.g. ``llmd-precise``) reads that.
        kv_event_delay_s: KV-cache events reach the gateway this many seconds after the
            worker's block pool changed (``cache_view="events"``).
        gateways: gateway replicas behind a front load balancer.
        gateway_lb: the front balancer: ``round_robin`` or ``random`` over replicas.
        gateway_state: ``local`` (each replica keeps its own in-flight counts, sessions and
            routed-prefix index) or ``shared`` (one store of those for all replicas). State a
            policy keeps itself stays per replica either way: llm-d's approximate prefix index
            (``llmd-estimated``, ``epp``) lives in the policy, one per replica.
        store_latency_s: with shared state, seconds each request waits on the store (read
            before the decision, write after) before it is forwarded. The lab's Redis: 0.05
            before its fix (writes one after another), about 0.001 after.
        client_lag_s: the client's own delay before it sends a later turn, beyond the think
            time, s: an empirical sample (a live client's measured send lags); each later turn
            draws one uniformly from a generator of its own (seeded from the run's seed, so the
            run's other draws do not move). Empty: none. Its spread matters in closed-loop
            bursts: chats whose replies end in one engine step stay in lock-step when their
            next turns all wait the same time.
        request_timeout_s: the client abandons a request this many seconds after sending it
            (aiohttp's total timeout, as ``vllm bench serve``, aiperf and inference-perf set it):
            the request is recorded as failed (``timed out``; the gaps between the tokens it
            streamed are left out of the run's ITL, ``RunResult.itl``), its concurrency slot and the
            gateway's count of it are released, and the engine aborts it as vLLM's does
            (the API server aborts a request whose client disconnected,
            ``vllm/v1/engine/async_llm.py: generate``, with no latency of its own here; the
            engine takes the abort in at its next step boundary and frees the request's
            blocks: ``Worker.abort_request``). None: no limit.
    """

    profile: Profile
    num_workers: int = 4
    num_gpus: int | None = None
    policy: str = DEFAULT_POLICIES[0]
    closed_loop: bool | None = None
    arrival_spread_s: float = 0.005
    router_block_tokens: int | None = None
    record_steps: bool = False
    record_series: bool = False
    fast_forward: bool = True
    max_in_flight: int | None = None
    scrape_interval_s: float = 0.0
    cache_view: str = "routed"
    kv_event_delay_s: float = 0.0
    gateways: int = 1
    gateway_lb: str = "round_robin"
    gateway_state: str = "local"
    store_latency_s: float = 0.0
    client_lag_s: tuple[float, ...] = ()
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.request_timeout_s is not None and not 0 < self.request_timeout_s <= SECONDS.maximum:
            raise ValueError(f"request_timeout_s must be a finite number > 0 (s), got {self.request_timeout_s}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.num_gpus is not None and not 1 <= self.num_gpus <= self.num_workers:
            raise ValueError(f"num_gpus must be between 1 and num_workers, got {self.num_gpus}")
        if not 0 <= self.arrival_spread_s < math.inf:
            raise ValueError(f"arrival_spread_s must be a finite number >= 0, got {self.arrival_spread_s}")
        block_size = self.profile.engine.block_size
        if self.router_block_tokens is not None and (self.router_block_tokens < 1 or (
                self.router_block_tokens > block_size and self.router_block_tokens % block_size)):
            raise ValueError(f"router_block_tokens must be a multiple of the block size {block_size} "
                             f"(or at most one block), got {self.router_block_tokens}")
        for name in ("scrape_interval_s", "kv_event_delay_s", "store_latency_s"):
            SECONDS.check(getattr(self, name), name)  # finite, 0 to 1e9 s (NaN fails, unlike min() < 0)
        if self.cache_view not in CACHE_VIEWS:
            raise ValueError(f"unknown cache view {self.cache_view!r}; valid: {', '.join(CACHE_VIEWS)}")
        if self.gateways < 1:
            raise ValueError(f"gateways must be >= 1, got {self.gateways}")
        if not all(0.0 <= x < math.inf for x in self.client_lag_s):
            raise ValueError("client_lag_s must hold finite numbers >= 0 (seconds)")
        if self.gateway_lb not in ("round_robin", "random"):
            raise ValueError(f"gateway_lb must be round_robin or random, got {self.gateway_lb!r}")
        if self.gateway_state not in ("local", "shared"):
            raise ValueError(f"gateway_state must be local or shared, got {self.gateway_state!r}")

    def gpu_of(self, worker: int) -> int:
        """The GPU index worker ``worker`` runs on."""
        return worker % (self.num_gpus or self.num_workers)

    def workers_on_gpu(self, gpu: int) -> int:
        """How many workers share GPU ``gpu`` (workers are dealt round-robin: ``gpu_of``)."""
        gpus = self.num_gpus or self.num_workers
        return self.num_workers // gpus + (1 if gpu < self.num_workers % gpus else 0)


REPLAY_MODES: dict[str, bool | None] = {"auto": None, "closed": True, "open": False}
"""``--replay`` names -> ``ClusterSpec.closed_loop`` (closed: later turns wait for their parent;
open: trace timestamps; auto: the trace decides)."""


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
        output = clamp_max_tokens(rec.input_length, rec.output_length, engine.max_model_len)
        need = math.ceil((rec.input_length + output) / engine.block_size)
        if need > usable:
            cut = f" (of {rec.output_length} asked, cut at max_model_len {engine.max_model_len})" \
                if output < rec.output_length else ""
            raise ValueError(
                f"{trace.source}: request {rec.request_id} needs {need} KV blocks "
                f"({rec.input_length} prompt + {output} output tokens{cut} at "
                f"{engine.block_size} tokens per block) but a worker of profile "
                f"{profile.name!r} has only {usable} usable blocks "
                f"({usable * engine.block_size} tokens)"
            )


class Cluster:
    """Workers, router and clients of one run. Use ``simulate`` rather than this directly.

    Args:
        trace: the requests.
        spec: what to simulate.
        seed: seeds the run's random generator (jitter, overheads) and, through children
            spawned from it, the router's (ties, random choices), the gateway balancer's, the
            engine speeds' (``kvroute.sim.timing.host``) and the client lags'.

    Raises:
        ValueError, PolicyError: as :func:`simulate` (building the cluster, or :meth:`run`).
    """

    def __init__(self, trace: Trace, spec: ClusterSpec, seed: int) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.env = simpy.Environment()
        self.profiles = self._worker_profiles(trace)
        # the engine's request class: compiled, or pure-Python with async scheduling
        self._request_class = engine_classes(spec.profile.engine)[0]
        step_timers = self._build_host(seed)
        on_token, on_decode_run = self._token_callbacks()
        on_finish = self._finish_callback()
        self.workers = self._build_workers(step_timers, on_token, on_finish, on_decode_run)
        self.host.engines = self.workers
        self.workload = Workload(trace, spec.profile.engine.block_size, spec.profile.engine.max_model_len)
        self._build_gateways(seed)
        self.closed_loop = self.workload.has_sessions if spec.closed_loop is None else spec.closed_loop
        self.records: list[RequestRecord] = []
        self._num_done = 0  # requests finished, failed or skipped so far
        self._plan_stages(trace)
        self._build_client(seed)

    def _worker_profiles(self, trace: Trace) -> list[Profile]:
        """Each worker's profile (its GPU's memory split between the workers sharing it), in
        worker order; raises ValueError (``check_capacity``) when a request of ``trace`` can
        never fit in one of their KV caches."""
        spec = self.spec
        profiles = [spec.profile.shared(spec.workers_on_gpu(spec.gpu_of(w))) for w in range(spec.num_workers)]
        for profile in {p.engine.num_gpu_blocks: p for p in profiles}.values():
            check_capacity(trace, profile)
        return profiles

    def _build_host(self, seed: int) -> list[StepTimer]:
        """The API lanes, the host's load and one step timer per worker (kvroute.sim.timing.host);
        returns the step timers, in worker order."""
        prof = self.spec.profile
        self.host = Host(prof.frontend, prof.host, self.spec.num_workers, lambda: self.env.now)
        self.frontends = self.host.frontends
        return self.host.step_timers(prof.step_cost, seed)

    def _token_callbacks(self) -> tuple[Callable[[Request, float], None], Callable[..., None]]:
        """The workers' ``on_token`` and ``on_decode_run``, chosen once for the run's options
        (time series, client timeout); sets up ``itl_gaps``, the gaps they fill, and with a
        timeout the record of whose gaps they are."""
        # every inter-token gap, s, in the order the client got them (an array: 3.8 M on Mooncake);
        # the result keeps those of the requests served (``_served_gaps``)
        self.itl_gaps = array("d")
        # NOTE: token times and the owners of the ITL gaps are kept by other callbacks, chosen
        # once here, so a run without them (no time series, no timeout) pays no test per token.
        # The owning ones wrap the plain ones; the timed ones wrap either (``_token``, ``_decode_run``).
        self._gap_owners: list[int] | None = None
        self._token, self._decode_run = self._on_token, self._on_decode_run
        if self.spec.request_timeout_s is not None:
            # itl_gaps in runs of one request's gaps: its index in self.records, and the run's length
            # (lists: array("q").append parses its argument, 3x the time of list.append)
            self._gap_owners, self._gap_counts = [], []
            self._record_index: dict[int, int] = {}  # request id -> index in self.records
            self._token, self._decode_run = _owning(self._on_token, self._on_decode_run, self.itl_gaps,
                                                    self._gap_owners, self._gap_counts, self._record_index)
        if self.spec.record_series:
            return self._on_token_timed, self._on_decode_run_timed
        return self._token, self._decode_run

    def _finish_callback(self) -> Callable[[Request, float], None]:
        """The workers' ``on_finish``; with a client timeout it also keeps ``_in_engine``."""
        # the engine's requests by id while in an engine, to abort them (a run with a timeout)
        self._in_engine: dict[int, Request] | None = None
        if self.spec.request_timeout_s is None:
            return self._on_finish
        self._in_engine = {}
        return _forgetting(self._on_finish, self._in_engine)

    def _build_workers(self, step_timers: list[StepTimer], on_token: Callable[[Request, float], None],
                       on_finish: Callable[[Request, float], None], on_decode_run: Callable[..., None]) -> list[Worker]:
        """One worker per index, each with its profile's engine and its step timer; the workers
        sharing a GPU take turns on it (one SimPy resource of capacity 1 per GPU)."""
        spec, prof = self.spec, self.spec.profile
        gpus = [simpy.Resource(self.env, capacity=1) for _ in range(spec.num_gpus or spec.num_workers)]
        return [
            Worker(
                self.env,
                w,
                self.profiles[w].engine,
                step_timers[w],
                gpus[spec.gpu_of(w)] if spec.workers_on_gpu(spec.gpu_of(w)) > 1 else None,
                on_token,
                on_finish,
                on_decode_run,
                spec.record_steps,
                spec.fast_forward,
                spec.record_series,
                async_cpu_s=AsyncOverlap(prof.async_cpu_fraction).cpu_s(prof.step_cost),
                admission=((lambda request, o=prof.overheads: o.engine_admission(request.num_prompt_tokens))
                           if prof.overheads.has_engine_admission else None),
            )
            for w in range(spec.num_workers)
        ]

    def _build_gateways(self, seed: int) -> None:
        """Policies and views of the gateway replicas, and the worker signals they read."""
        spec, n = self.spec, self.spec.num_workers
        workers = self.workers
        self.metrics = MetricsScrape(
            lambda: [(len(w.scheduler.running), len(w.scheduler.waiting), w.scheduler.pool.usage()) for w in workers],
            spec.scrape_interval_s,
        )
        rng = router_rng(seed)
        rngs = [rng] + (rng.spawn(spec.gateways - 1) if spec.gateways > 1 else [])
        self.policies = [make_policy(spec.policy, r) for r in rngs]
        # the cache view and event delay belong to the policy where it names them (Policy.cache_view)
        cache_view = self.policies[0].cache_view or spec.cache_view
        delay = self.policies[0].kv_event_delay_s
        self._event_delay_s = spec.kv_event_delay_s if delay is None else delay
        self.events = None
        if cache_view == "events":
            self.events = KVEventIndex(n)
            self._pending_events: list | None = None
            self._pending_due = -1.0
            for w in workers:
                w.scheduler.pool.kv_event_listener = self._event_listener(w.index)
        exact = None
        if cache_view == "exact":
            pools = [w.scheduler.pool for w in workers]
            exact = lambda hashes: [len(p.longest_cache_hit(hashes, len(hashes))) for p in pools]  # noqa: E731
        num_views = 1 if spec.gateway_state == "shared" else spec.gateways
        trace_block = self.workload.trace.block_size
        index_tokens = spec.router_block_tokens or routed_index_tokens(trace_block, spec.profile.engine.block_size)
        self.views = [
            RouterView(n, spec.profile.engine.block_size, index_tokens,
                       track_prefixes=self.policies[0].uses_prefixes, cache_view=cache_view,
                       metrics=self.metrics if self.policies[0].uses_metrics else None, events=self.events,
                       exact=exact, track_active_blocks=self.policies[0].uses_active_blocks,
                       routed_ttl_s=self.policies[0].routed_ttl_s, clock=lambda: self.env.now)
            for _ in range(num_views)
        ]
        for g, policy in enumerate(self.policies):
            view = self.views[g if num_views > 1 else 0]
            view.num_gpu_blocks = [p.engine.num_gpu_blocks for p in self.profiles]
            prepare_policy(policy, view)
        self.policy, self.view = self.policies[0], self.views[0]
        self._lb_rng = np.random.default_rng(seed).spawn(2)[1]
        self._lb_next = 0
        self._view_of: dict[int, RouterView] = {}

    def _event_listener(self, worker: int):
        events, delay, env, n = self.events, self._event_delay_s, self.env, self.spec.num_workers
        if delay == 0:
            return lambda stored, hashes: events.apply(worker, stored, hashes)

        def deliver(batch) -> None:
            for w, (removed, stored) in enumerate(batch):
                # NOTE: removals first: a block removed at an instant was stored before it (a block
                # cached at schedule time is held by its request until a later step), and copies
                # are counted, so the order within one instant does not change the result.
                events.apply(w, False, removed)
                events.apply(w, True, stored)

        def later(stored: bool, hashes) -> None:
            if env.now != self._pending_due:
                self._pending_due = env.now
                batch = self._pending_events = [([], []) for _ in range(n)]
                env.timeout(delay).callbacks.append(lambda _ev: deliver(batch))
            self._pending_events[worker][stored].extend(hashes)

        return later

    def _plan_stages(self, trace: Trace) -> None:
        """The load stages of an open-loop trace that has them (kvroute.traces.inference_perf):
        each stage is sent once every request of the one before it is done, the trace's stage gap
        later. ``_stage_left`` (requests not yet done, per stage) stays None without stages."""
        self._stage_left: list[int] | None = None
        stages = trace.metadata.get("stages") if not self.closed_loop else None
        if stages and all(rec.stage is not None for rec in trace.records):
            self._stage_records: list[list[TraceRecord]] = [[] for _ in stages]
            for rec in trace.records:
                self._stage_records[rec.stage].append(rec)
            self._stage_left = [len(recs) for recs in self._stage_records]
            self._stage_starts_ms = [stage["start_ms"] for stage in stages]
            self._stage_gap_s = float(trace.metadata.get("stage_gap_s", 0.0))

    def _build_client(self, seed: int) -> None:
        """The client's side: its concurrency slots, the overheads around the engine (a seeded
        lognormal factor of spread ``_sigma``, the delay after each token's step) and the
        generator of later turns' send lags."""
        spec = self.spec
        prof = spec.profile
        self._slots = simpy.Resource(self.env, spec.max_in_flight) if spec.max_in_flight else None
        self._held: dict[int, simpy.resources.resource.Request] = {}
        self._overheads = spec.profile.overheads
        # NOTE: the seed's children 0-3 seed the router, the gateway balancer and the engine speeds
        self._lag_rng = np.random.default_rng(seed).spawn(5)[4] if spec.client_lag_s else None
        self._sigma = math.sqrt(math.log1p(self._overheads.jitter_cv**2))
        # the time after each token's step (Overheads.post_engine_delay_s), or None: none; with
        # API lanes, lane work on a request's first output, else a pure delay of every token
        self._post = (lambda request: self._overheads.post_engine_delay_s(prof.frontend, request.num_prompt_tokens)) \
            if self._overheads.has_post_engine else None

    def _gateway(self) -> int:
        """The replica the front load balancer sends the next request to."""
        if self.spec.gateways == 1:
            return 0
        if self.spec.gateway_lb == "random":
            return int(self._lb_rng.integers(self.spec.gateways))
        g = self._lb_next
        self._lb_next = (g + 1) % self.spec.gateways
        return g

    def _scraper(self):
        total, interval = len(self.workload.trace.records), self.spec.scrape_interval_s
        while self._num_done < total:
            self.metrics.scrape()
            yield self.env.timeout(interval)

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> RunResult:
        """Simulate until every request has finished; return the records and counters.

        ``progress(now_s, sent, total)`` (optional) is called every ``PROGRESS_EVERY`` events
        and at the end with the simulated time, the requests dealt with so far (sent, or recorded
        as not sent after a parent failed) and the trace's size;
        the events and their order are the same with or without it.

        Raises:
            PolicyError: the policy returned something other than a worker index, or raised
                (:func:`simulate`).
        """
        # NOTE: without the cyclic collector (kvroute.sim.cluster.collector): its passes over what the
        # run keeps were 4-5 % of the whole Mooncake trace's time.
        with paused_collector():
            if self.spec.scrape_interval_s > 0:
                self.env.process(self._scraper())
            if self._stage_left is not None:
                self._start_at_once(self._start_stage, 0)
            else:
                spread = self.spec.arrival_spread_s
                sent = self.workload.roots if self.closed_loop else self.workload.trace.records
                starts = []
                for rec in sent:
                    jitter = self.rng.uniform(0.0, spread) if spread > 0 else 0.0
                    starts.append((rec, rec.timestamp_ms / 1000.0 + jitter))
                self._start_at_once(self._start_clients, starts)
            if progress is None:
                self.env.run()
            else:
                self._run_reporting(progress)
            return self._result()

    def _result(self) -> RunResult:
        """The finished run's records and per-worker counters."""
        rows = []
        for w in self.workers:
            st = w.scheduler.kv_cache_manager.stats
            rows.append(
                {
                    "worker": w.index,
                    "gpu": self.spec.gpu_of(w.index),
                    "num_gpu_blocks": w.scheduler.config.num_gpu_blocks,
                    "num_steps": w.num_steps,
                    "busy_time": w.busy_time,
                    "prefix_cache_queries": st.queries,
                    "prefix_cache_hits": st.hits,
                    "preempted_queries": st.preempted_queries,
                    "preempted_hits": st.preempted_hits,
                    "num_preemptions": w.scheduler.num_preemptions,
                    "num_evictions": w.scheduler.pool.num_evictions,
                }
            )
        logs = None
        if self.spec.record_steps:
            logs = [np.asarray(w.step_log).reshape(-1, 4) for w in self.workers]
        series = None
        if self.spec.record_series:
            series = series_frame([w.series for w in self.workers])
        itl = self.itl_gaps if self._gap_owners is None else self._served_gaps()
        return RunResult.from_rows(self.spec.policy, self.seed, self.records, rows, itl, logs, series)

    def _served_gaps(self) -> array | np.ndarray:
        """The ITL gaps of the requests served (status ok), in the order they came: a request
        that ended failed (its client timed out, perhaps mid-reply) adds none, as the live
        client counts ITL (``kvroute.calibrate.validation.replay``). Only a run with a timeout
        keeps the owners; without one no request that streamed tokens can fail."""
        failed = np.array([r.error is not None or r.finish is None for r in self.records], dtype=bool)
        if not failed.any():
            return self.itl_gaps
        owners = np.array(self._gap_owners, dtype=np.int64)
        served = np.repeat(~failed[owners], np.array(self._gap_counts, dtype=np.int64))
        return np.frombuffer(self.itl_gaps, dtype=float)[served]

    def _run_reporting(self, progress: Callable[[float, int, int], None]) -> None:
        """``env.run()`` as SimPy runs it (one ``step`` per event until none is left), reporting."""
        from simpy.core import EmptySchedule

        env, total, count = self.env, len(self.workload.trace.records), 0
        try:
            while True:
                env.step()
                count += 1
                if count % PROGRESS_EVERY == 0:
                    progress(env.now, len(self.records), total)
        except EmptySchedule:
            pass
        progress(env.now, len(self.records), total)

    # -- clients -------------------------------------------------------------------------------

    # NOTE: a client is a chain of callbacks on the events it waits for, not a SimPy process:
    # the same events in the same order, without a process's generator resumptions. A client
    # starts where its process did: the roots in trace order in the one step of one process
    # where the run starts (not a process's start and end events each, 2 of the 4 events a
    # root cost), a closed-loop child in a one-step process of its own when its parent
    # finishes (``_start_at_once``).

    def _start_at_once(self, start: Callable[..., None], *args) -> None:
        """Call ``start(*args)`` where a new process's first step runs: in an urgent event at the
        current time (SimPy's ``Initialize``), after the event being processed and before the
        time's normal events."""
        # NOTE: a process of one step, because a new process is SimPy's one public way to run
        # code in an urgent event (``Process.interrupt`` is the other, by throwing into a
        # running process). ``Event.succeed`` and ``Timeout`` schedule a normal one, after the
        # events already due now (another worker's step ending at the same time), which would
        # change the order of events; ``Environment.schedule(event, URGENT)`` is public but
        # processes only an event marked as succeeded, which only ``succeed`` (normal priority)
        # does publicly. The process's end adds one event with no callbacks (normal priority,
        # same time): it changes no order, and costs about 2 us per later turn more than an
        # event set up by hand through SimPy's private fields (2 % of a closed-loop run).
        self.env.process(_first_step(start, args))

    def _start_clients(self, starts: list[tuple[TraceRecord, float]]) -> None:
        for rec, send_at in starts:
            self._client(rec, send_at)

    def _start_stage(self, index: int) -> None:
        """Start load stage ``index`` now: its requests at their offsets from the stage's start
        in the trace (plus the arrival jitter); a stage without requests ends at once."""
        base = self.env.now - self._stage_starts_ms[index] / 1000.0
        spread = self.spec.arrival_spread_s
        starts = []
        for rec in self._stage_records[index]:
            jitter = self.rng.uniform(0.0, spread) if spread > 0 else 0.0
            starts.append((rec, base + rec.timestamp_ms / 1000.0 + jitter))
        self._start_clients(starts)
        if not starts:
            self._stage_ended(index)

    def _client_done(self, rec: TraceRecord) -> None:
        """``rec`` is done for its client (finished, failed or abandoned): the last of its stage
        ends the stage (inference-perf's ``run_stage`` waits for every request it sent)."""
        left = self._stage_left
        left[rec.stage] -= 1
        if left[rec.stage] == 0:
            self._stage_ended(rec.stage)

    def _stage_ended(self, index: int) -> None:
        if index + 1 < len(self._stage_left):
            self.env.timeout(self._stage_gap_s).callbacks.append(lambda _event: self._start_stage(index + 1))

    def _time_out(self, rec: TraceRecord, record: RequestRecord) -> None:
        """The client's timeout of ``rec`` fired: unless it is done, abandon it (failed)."""
        if record.finish is not None:
            return
        record.error = f"timed out: no full reply {self.spec.request_timeout_s:g} s after it was sent"
        record.finish = self.env.now
        view = self._view_of.pop(rec.request_id, None)
        if view is not None:
            view.on_finished(record.worker, rec.request_id)
        request = self._in_engine.pop(rec.request_id, None)
        if request is not None:
            self.workers[record.worker].abort_request(request)
        if self.frontends is not None:
            self.frontends.release(rec.request_id)
        self._num_done += 1
        self._release_slot(rec.request_id)
        self._release_children(rec)
        if self._stage_left is not None:
            self._client_done(rec)

    def _client(self, rec: TraceRecord, send_at: float) -> None:
        """Send ``rec`` at ``send_at`` (seconds): wait for it, then for a concurrency slot."""
        env = self.env
        if send_at > env.now:
            env.timeout(send_at - env.now).callbacks.append(lambda _event: self._ready(rec))
        else:
            self._ready(rec)

    def _ready(self, rec: TraceRecord) -> None:
        ready = self.env.now
        if self._slots is not None:
            slot = self._held[rec.request_id] = self._slots.request()
            slot.callbacks.append(lambda _event: self._route(rec, ready))
        else:
            self._route(rec, ready)

    def _route(self, rec: TraceRecord, ready: float) -> None:
        """Route ``rec`` (sent at ``ready``, holding its slot), then pass it through the gateway's
        shared store and the API server."""
        env = self.env
        segments, hashes = self.workload.build(rec)
        bs = self.spec.profile.engine.block_size
        route = RouteRequest(rec.request_id, rec.session_id, hashes[: rec.input_length // bs], rec.input_length)
        g = self._gateway()
        view = self.views[g if len(self.views) > 1 else 0]
        policy, n = self.policies[g], self.spec.num_workers
        try:
            worker = policy.choose(route, view)
        except Exception as exc:  # noqa: BLE001 - the policy's code (maybe a user's): named in the error
            raise_policy_error(policy, exc, "choose")
        if worker.__class__ is not int or not 0 <= worker < n:  # NOTE: once per request: the cheap check first
            worker = checked_worker(policy, worker, n)
        view.on_routed(worker, route)
        self._view_of[rec.request_id] = view
        record = RequestRecord(rec, worker, env.now)
        record.client_wait = env.now - ready
        if self.spec.record_series:
            record.token_times = array("d")
        self.records.append(record)
        if self.spec.request_timeout_s is not None:
            self._record_index[rec.request_id] = len(self.records) - 1
            self.env.timeout(self.spec.request_timeout_s).callbacks.append(
                lambda _event: self._time_out(rec, record))
        if self.spec.gateway_state == "shared" and self.spec.store_latency_s > 0:
            env.timeout(self.spec.store_latency_s).callbacks.append(
                lambda _event: self._front_end(rec, record, worker, hashes))
        else:
            self._front_end(rec, record, worker, hashes)

    def _front_end(self, rec: TraceRecord, record: RequestRecord, worker: int, hashes) -> None:
        env = self.env
        if self._sigma > 0:
            factor = self.rng.lognormal(-0.5 * self._sigma**2, self._sigma)
        else:
            factor = 1.0
        delay = self._overheads.pre_engine_mean_s(rec.input_length) * factor  # the engine admission in its step
        if self.frontends is not None:
            delay += self.frontends.admit(worker, rec.request_id, env.now, rec.input_length)
        env.timeout(delay).callbacks.append(lambda _event: self._arrive(rec, record, worker, hashes))

    def _arrive(self, rec: TraceRecord, record: RequestRecord, worker: int, hashes) -> None:
        """``rec`` reaches worker ``worker``'s engine, or fails its admission check there."""
        env = self.env
        if record.error is not None:  # abandoned by its client (timed out) before it got here
            return
        engine = self.profiles[worker].engine
        error = admission_error(rec.input_length, engine.max_model_len)
        if error:
            record.error = error
            record.finish = env.now
            self._view_of.pop(rec.request_id).on_finished(worker, rec.request_id)
            self._num_done += 1
            self._release_slot(rec.request_id)
            self._release_children(rec)
            if self._stage_left is not None:
                self._client_done(rec)
            return
        max_tokens = clamp_max_tokens(rec.input_length, rec.output_length, engine.max_model_len)
        request = self._request_class(rec.request_id, rec.input_length, max_tokens, hashes, client=record)
        if self._in_engine is not None:
            self._in_engine[rec.request_id] = request
        self.workers[worker].add_request(request)

    def _on_token(self, request: Request, now: float) -> None:
        record: RequestRecord = request.client
        engine_now = now
        first = request.num_output_tokens == 1 and record.first_token is None
        if self.frontends is not None:
            # the part of the front end after the engine is the API process's work on the first output
            extra = self._post(request) if first and self._post is not None else 0.0
            now = self.frontends.deliver(record.worker, request.request_id, now, extra)
        elif self._post is not None:
            now += self._post(request)
        if first:
            record.first_token = now
            record.engine_first_token = engine_now
            self._view_of[request.request_id].on_first_token(request.request_id)
        else:
            self.itl_gaps.append(now - record.last_token)
        record.last_token = now

    def _on_decode_run(self, requests: list[Request], step_ends, gaps: array) -> None:
        # every request of the run adds the same gaps (a copy)
        last = step_ends[-1]
        extend = self.itl_gaps.extend
        post = self._post
        for request in requests:
            request.client.last_token = last if post is None else last + post(request)
            extend(gaps)

    def _on_token_timed(self, request: Request, now: float) -> None:
        self._token(request, now)
        record: RequestRecord = request.client
        record.token_times.append(record.last_token)

    def _on_decode_run_timed(self, requests: list[Request], step_ends, gaps: array) -> None:
        self._decode_run(requests, step_ends, gaps)
        later = step_ends[1:]  # the run's first step came through on_token
        post = self._post
        for request in requests:
            if post is None:
                request.client.token_times.extend(later)
            else:
                delay = post(request)
                request.client.token_times.extend([t + delay for t in later])

    def _on_finish(self, request: Request, now: float) -> None:
        record: RequestRecord = request.client
        record.engine_last_token = now
        if self.frontends is not None:
            now = record.last_token  # the client has the reply when the API streamed its last token
            self.frontends.release(request.request_id)
        elif self._post is not None:
            now += self._post(request)
        record.finish = now
        record.cached_tokens = request.num_cached_tokens or 0
        record.output_tokens = request.num_output_tokens
        record.preemptions = request.num_preemptions
        record.queued = request.queued_ts
        record.scheduled = request.scheduled_ts
        self._view_of.pop(request.request_id).on_finished(record.worker, request.request_id)
        self._num_done += 1
        if (self._slots is not None or self._stage_left is not None) and now > self.env.now:
            # the client holds its slot, and its stage waits, until it has the reply's last token
            self.env.timeout(now - self.env.now).callbacks.append(lambda _event: self._replied(record.trace))
        else:
            self._replied(record.trace)
        if self.closed_loop:
            lags = self.spec.client_lag_s
            for child in self.workload.children.get(record.trace.request_id, ()):
                lag = lags[int(self._lag_rng.integers(len(lags)))] if lags else 0.0
                send_at = now + child.think_time_ms / 1000.0 + lag
                self._start_at_once(self._client, child, send_at)

    def _replied(self, rec: TraceRecord) -> None:
        """The client has ``rec``'s whole reply: it frees its concurrency slot, and the last
        reply of a load stage ends the stage."""
        self._release_slot(rec.request_id)
        if self._stage_left is not None:
            self._client_done(rec)

    def _release_slot(self, request_id: int) -> None:
        if self._slots is not None:
            self._slots.release(self._held.pop(request_id))

    def _release_children(self, rec: TraceRecord) -> None:
        """A failed request's later turns are never sent (closed loop); record them as skipped."""
        if not self.closed_loop:
            return
        for parent, children in self.workload.subtree(rec):
            for child in children:
                record = RequestRecord(child, -1, self.env.now)
                record.error = f"not sent: its parent request {parent.request_id} failed"
                self.records.append(record)
                self._num_done += 1


def _forgetting(on_finish, in_engine: dict):
    """The finish callback of a run with a client timeout: a finished request leaves
    ``in_engine`` (request id to engine request, what a timeout aborts). A request whose client
    gave up is aborted in the engine (``Worker.abort_request``) and never finishes there."""

    def finish(request: Request, now: float) -> None:
        del in_engine[request.request_id]
        on_finish(request, now)

    return finish


def _owning(on_token, on_decode_run, itl_gaps: array, owners: list[int], counts: list[int], index: dict[int, int]):
    """The token callbacks of a run with a client timeout: ``on_token`` and ``on_decode_run``,
    which add gaps to ``itl_gaps``, each also noting whose gaps it added, as runs: ``owners``
    gets the request's index in the records (``index``: by request id) and ``counts`` how many
    gaps in a row are its (``Cluster._served_gaps`` leaves out the failed requests' ones)."""
    add_owner, add_count = owners.append, counts.append

    def token(request: Request, now: float) -> None:
        before = len(itl_gaps)
        on_token(request, now)
        if len(itl_gaps) != before:
            add_owner(index[request.request_id])
            add_count(1)

    def decode_run(requests: list[Request], step_ends, gaps: array) -> None:
        on_decode_run(requests, step_ends, gaps)
        n = len(gaps)
        if n:  # each request's gaps, one request after the other (Cluster._on_decode_run)
            for request in requests:
                add_owner(index[request.request_id])
                add_count(n)

    return token, decode_run


def _first_step(start: Callable[..., None], args: tuple):
    """The generator of a process that calls ``start(*args)`` in its first step and ends
    (:meth:`Cluster._start_at_once`)."""
    start(*args)
    yield from ()


PROGRESS_EVERY = 4096
"""Events between two progress reports of :meth:`Cluster.run`."""


def simulate(trace: Trace, spec: ClusterSpec, seed: int = 0,
             progress: Callable[[float, int, int], None] | None = None) -> RunResult:
    """Run one simulation of ``trace`` on the cluster ``spec``.

    Args:
        trace: the requests.
        spec: profile, workers, GPUs, policy and replay mode.
        seed: seeds the run's generators (its own and those spawned from the seed: :class:`Cluster`);
            the same seed gives the same result.
        progress: optional ``progress(now_s, sent, total)`` reporter (:meth:`Cluster.run`).

    Returns:
        The run's per-request records and per-worker counters.

    Raises:
        ValueError: a request can never fit in a worker's KV cache, the engine block size
            cannot map the trace's, or the policy name is unknown.
        PolicyError (a ValueError, ``kvroute.sim.routing``): the policy's ``choose`` returned
            something other than a worker index in ``range(spec.num_workers)``, or one of its
            methods (``__init__``, ``prepare``, ``choose``) raised; the message names the policy,
            its file and the line.
    """
    return Cluster(trace, spec, seed).run(progress)
