"""The API-server processes and the host's cores as resources (optional profile section).

vLLM's OpenAI server is one Python process per server by default (``--api-server-count`` more,
``vllm/entrypoints/cli/serve.py: run_multi_api_server``). One asyncio thread in it does a
request's admission (parse the JSON body, validate, tokenise or read the token ids, hand the
request to the engine core: ``OpenAIServingCompletion.create_completion`` ->
``AsyncLLM.add_request``) and, for every engine step, the outputs of every running request
(``AsyncLLM.output_handler`` detokenises them through ``OutputProcessor.process_outputs``, then
each request's generator formats and writes one SSE chunk per token). The work is serial, so a
burst of arrivals waits behind one another and behind the streaming of running requests, while
the engine core (its own process) keeps stepping. Model here:

- Each server owns ``api_server_count`` first-in-first-out lanes (one per API process). A request
  joins, at its send time, the lane free soonest (lowest index on a tie; the kernel spreads
  connections over the processes' shared socket); its outputs go to the same lane.
- Admission holds the lane for ``per_request_s + per_prompt_token_s * prompt tokens``. The
  request's unloaded pre-engine time stays the profile's ``overheads`` draw (the same seeded
  lognormal as without this section); the lane only adds its queueing wait in front of it, so
  one request at a time is predicted exactly as without this section.
- Every engine step's outputs hold the lane for ``per_step_s`` once (``AsyncLLM.output_handler``
  takes one ``EngineCoreOutputs`` batch per step and runs ``process_outputs`` over it), then every
  token of the step for ``per_output_token_s`` (its detokenising and its SSE chunk, written by its
  request's own generator); a token reaches the client when its work ends.

A lane is a plain Lindley recursion (``start = max(now, free_at)``): exact for FIFO when work is
submitted in time order, which the SimPy event loop guarantees; only the client's wait for the
result passes simulated time.

Host model: ``cores`` CPU cores shared by every busy process (engines with work, API lanes with
a backlog, ``other_busy`` stated processes busy throughout, and ``client_busy`` processes of the
load-generating client, busy while some API process has work queued: the client writes the
requests and reads the token streams the API processes write, and waits otherwise). An engine that ran
out of work stays busy for ``engine_spin_s`` more: vLLM's worker reads the engine core's
scheduler output from a shared-memory queue and busy-polls it for ``busy_loop_s`` = 1 s after its
last read before it parks (``vllm/distributed/device_communicators/shm_broadcast.py``,
``MessageQueue``); measured here, a tiny-model CPU server served one request every 180 ms (busy
46 % of the time) while its worker process used 89 % of a core, 1 % once idle for seconds. The step-cost
coefficients were measured with ``baseline_busy`` processes busy; each busy process beyond
``max(cores, baseline_busy)`` stretches an engine step by ``contention / cores`` of its time
(fair sharing of CPU-bound processes gives ``contention`` = 1; the fit measures it). Each
engine also runs at its own speed for the whole run (``engine_speed_sigma``: a lognormal factor
on its step times, mean 1), as identical servers sharing a host's cores do. With each server's
API process on its own engine's core (``api_on_engine_core``) the load is counted per core, and
the sharing goes both ways: lane work queued while that engine has requests takes
``1 + api_contention`` times as long.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields
from typing import Callable


def _check_terms(terms, section: str, count: str, skip: tuple[str, ...] = ()) -> None:
    """``terms.<count>`` must be >= 1 and every other field (but ``skip``) finite and >= 0.

    Raises:
        ValueError: naming ``section.field`` and the value.
    """
    n = getattr(terms, count)
    if n < 1:
        raise ValueError(f"{section}.{count} must be >= 1, got {n}")
    for f in fields(terms):
        v = getattr(terms, f.name)
        if f.name != count and f.name not in skip and not (v >= 0.0 and v != float("inf")):
            raise ValueError(f"{section}.{f.name} must be finite and >= 0, got {v!r}")


@dataclass(frozen=True, slots=True)
class FrontendModel:
    """Service times of one server's API process(es), seconds.

    Attributes:
        api_server_count: API processes per server (vLLM ``--api-server-count``, default 1).
        per_request_s: lane time of admitting one request.
        per_prompt_token_s: lane time per prompt token of admitting it.
        per_output_token_s: lane time per streamed output token (detokenise + SSE chunk).
        per_step_s: lane time per engine step that has outputs for the lane (receiving and
            decoding the step's output batch), paid before its first token.

    Raises:
        ValueError: a count below 1 or a negative or non-finite time.
    """

    api_server_count: int = 1
    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0
    per_step_s: float = 0.0

    def __post_init__(self) -> None:
        _check_terms(self, "frontend", "api_server_count")

    def admission_s(self, num_prompt_tokens: int) -> float:
        """Lane time of admitting a request of ``num_prompt_tokens`` prompt tokens, s."""
        return self.per_request_s + self.per_prompt_token_s * num_prompt_tokens


MAX_ENGINE_SPEED_SIGMA = 2.0
"""Largest accepted ``HostModel.engine_speed_sigma``: one standard deviation is then a factor
e**2 = 7.4 between engines, far beyond any measured spread."""

MIN_ENGINE_SPEED_PERIOD_S = 0.001
"""Shortest accepted ``HostModel.engine_speed_period_s`` other than 0, s: the fit tries 20 ms and
longer (``calibrate.calibration.speed.WINDOW_PERIODS``), and each worker draws one factor per
period up to its step's start, so a period of nanoseconds would draw billions."""


@dataclass(frozen=True, slots=True)
class HostModel:
    """The host's CPU cores and how busy processes stretch engine steps.

    Attributes:
        cores: CPU cores every process of the arrangement shares.
        contention: step stretch per busy process beyond the baseline, in units of
            ``1 / cores`` (1.0 = fair processor sharing; 0 = no effect).
        baseline_busy: busy processes while the step costs were calibrated (their effect is
            already in the coefficients).
        baseline_stream_busy: processes that streamed tokens while the decode step costs were
            calibrated (each sweep server's API process and the measuring client; 0: none
            counted). A decode step of B requests was timed while every server's API process
            streamed B tokens per step and the client read them, so they count in its baseline
            for the share of the step that streaming fills (``baseline``); a prefill step was
            timed with the API processes idle. Without this, streaming work that the decode
            coefficients already contain is charged again as contention.
        other_busy: processes besides the engines and API lanes that are busy throughout.
        client_busy: processes of the load-generating client on the same host, busy while some
            API lane has a backlog (a closed-loop client waiting on long prefills is idle).
        engine_spin_s: seconds an engine keeps its core busy after it runs out of work (vLLM's
            shared-memory queue busy-polls for 1 s; 0 counts engines only while they have work).
        engine_speed_sigma: log-spread of engine speed between workers: each worker's steps
            take ``exp(sigma * z - sigma**2 / 2)`` times the model's (z standard normal, seeded;
            mean factor 1), drawn once per worker and run, or anew every
            ``engine_speed_period_s``.
        engine_speed_period_s: how long one drawn speed lasts, s: worker ``w``'s factor for the
            steps starting in ``[k P, (k + 1) P)`` is its ``k``-th draw (:class:`EngineSpeed`);
            0: one factor for the whole run. On the 2-core reference the servers' speed
            difference did not persist from one burst to the next (lag-one correlation 0.14) and
            shrank with the burst's length (log-spread 0.39-0.67 over bursts under 0.5 s,
            0.06-0.13 over bursts of 2-5 s), so a factor per run overstated it for runs longer
            than a few seconds. Identical servers
            sharing a host's cores do not run at one speed: on the 2-core reference, N identical
            requests sent to both servers at once finished with a log-spread of 0.17-0.36
            between the servers, and the slower one changed from burst to burst. Without it,
            identical workers step in lock-step and closed-loop turns reach the router together.
        api_on_engine_core: each server's API process runs on its own engine's core, one core per
            server (``kvroute serve --api-cores own``): worker ``w``'s steps are stretched by the
            processes on its core alone, its engine, its own API lanes' share and the client's
            ``client_busy`` spread over the cores, against a baseline of ``baseline / cores`` per
            core. Computed by the same :meth:`stretch` with the per-core count times ``cores``.
            False: every busy process competes for every core.
        api_contention: with ``api_on_engine_core``, the other side of that sharing: API-lane
            work queued while its server's engine has work takes ``1 + api_contention`` times
            its service time (fair sharing of the one core gives 1; the engine's idle busy-poll
            yields the core, so only an engine with requests counts). 0: lanes never stretched.
            Without it, every prompt's admission costs the same whether the engine computes
            beside it or not, and a fit that must slow a burst's later admissions behind a
            running prefill can only do so by stretching engine steps more (host ``contention``
            at its bound of 4 in every sweep of the 2-core reference), which then also slows
            closed-loop chats whose turns arrive at an idle engine.
        client_core: with ``api_on_engine_core``, the worker whose core the load-generating client
            is pinned to (``calibrate measure --client-cores``, ``bench_validate.py --client-cores``;
            server ``i`` of ``kvroute serve`` runs on core ``i``): that worker's steps count the
            client's share of its core (``client_busy`` times the busiest API lane's share of
            the step) as fair sharing, ``1 + share`` times as long whatever the fitted
            ``contention``, and the other workers none of it (a run with fewer workers than
            ``client_core + 1`` has the client on a core none of its workers runs on). -1: the client floats, its share
            counted with the other busy processes and spread over the cores. Stated, not
            fitted. A pinned client slows the worker on its core alone, so that worker's
            later-turn TTFT and TPOT run longer than the other's; counted as spread over the
            cores, both workers run alike, closed-loop turns under round_robin reach the servers
            closer together than live, and kv_aware's TTFT change against round_robin comes out
            short (the measurements behind this: docs/log/from-code-comments.md).

    Raises:
        ValueError: ``cores < 1``, negative terms or ``client_core`` below -1.
    """

    cores: int
    contention: float = 0.0
    baseline_busy: float = 0.0
    baseline_stream_busy: float = 0.0
    other_busy: float = 0.0
    engine_spin_s: float = 0.0
    client_busy: float = 0.0
    engine_speed_sigma: float = 0.0
    engine_speed_period_s: float = 0.0
    api_on_engine_core: bool = False
    api_contention: float = 0.0
    client_core: int = -1

    def __post_init__(self) -> None:
        _check_terms(self, "host", "cores", skip=("client_core",))
        if self.client_core < -1:
            raise ValueError(f"host.client_core must be a worker index or -1 (floating), got {self.client_core!r}")
        if 0.0 < self.engine_speed_period_s < MIN_ENGINE_SPEED_PERIOD_S:
            raise ValueError(f"host.engine_speed_period_s must be 0 (one draw per run) or >= "
                             f"{MIN_ENGINE_SPEED_PERIOD_S} s, got {self.engine_speed_period_s!r}")
        if self.engine_speed_sigma > MAX_ENGINE_SPEED_SIGMA:
            raise ValueError(f"host.engine_speed_sigma must be <= {MAX_ENGINE_SPEED_SIGMA} (a log-spread; 0.2-0.4 "
                             f"measured on a shared 2-core host), got {self.engine_speed_sigma!r}")

    def baseline(self, step_s: float, stream_s: float) -> float:
        """Busy processes behind a step's calibrated time: ``baseline_busy``, plus
        ``baseline_stream_busy`` for the share ``min(1, stream_s / step_s)`` of the step that the
        API work of streaming its decode tokens fills (``stream_s``, s: 0 for a step without
        decodes)."""
        if stream_s <= 0.0 or self.baseline_stream_busy == 0.0:
            return self.baseline_busy
        share = stream_s / step_s if step_s > stream_s else 1.0
        return self.baseline_busy + self.baseline_stream_busy * share

    def stretch(self, busy: float, baseline: float | None = None) -> float:
        """Factor on an engine step's time with ``busy`` engines and API lanes busy (plus
        ``other_busy``): ``1 + contention * max(0, busy + other_busy - max(cores, baseline)) / cores``,
        ``baseline`` the step's (:meth:`baseline`; default ``baseline_busy``)."""
        extra = busy + self.other_busy - max(self.cores, self.baseline_busy if baseline is None else baseline)
        return 1.0 + self.contention * extra / self.cores if extra > 0 else 1.0


class EngineSpeed:
    """One worker's step-time factor over a run (``HostModel.engine_speed_sigma``,
    ``engine_speed_period_s``): piecewise constant, a mean-one lognormal draw per period, drawn
    in period order from the worker's own generator when first needed, so the factor of a
    period depends only on the seed and the period's index.

    Args:
        sigma: log-spread of the factor.
        period_s: seconds one draw lasts (0: one draw for the whole run).
        rng: the worker's generator (unused when ``first`` covers a run of one draw).
        first: the factor of the first period, drawn by the caller
            (``kvroute.sim.timing.host.engine_speeds``): the same factor a run with one
            speed per run (period 0) gets.
    """

    __slots__ = ("sigma", "period_s", "rng", "factors")

    def __init__(self, sigma: float, period_s: float, rng, first: float) -> None:
        self.sigma, self.period_s, self.rng = sigma, period_s, rng
        self.factors = [first]

    def at(self, now: float) -> float:
        """The factor of a step starting at ``now`` (s)."""
        if self.period_s <= 0.0:
            return self.factors[0]
        k = int(now // self.period_s)
        factors = self.factors
        while len(factors) <= k:
            factors.append(float(self.rng.lognormal(-0.5 * self.sigma * self.sigma, self.sigma)))
        return factors[k]


class FifoLane:
    """One API process: first-in-first-out work, one item at a time (plain class, no SimPy).

    Attributes:
        free_at: when the lane finishes the work submitted so far, s.
        busy_time: total time its work takes, s (stretched items count stretched).
        step_at: emit time of the last engine step whose outputs the lane took, s (NaN: none).
    """

    __slots__ = ("free_at", "busy_time", "step_at", "_stretched")

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_time = 0.0
        self.step_at = float("nan")
        self._stretched: deque[tuple[float, float, float]] = deque()  # (start, end, factor) of stretched items

    def submit(self, now: float, service_s: float, factor: float = 1.0) -> tuple[float, float]:
        """Queue ``service_s`` seconds of work at time ``now``, taking ``factor`` times as long
        (the core shared with a computing engine, ``HostModel.api_contention``); returns
        ``(start, end)``.

        Calls must come in non-decreasing ``now`` (FIFO order is submission order).
        """
        start = now if now > self.free_at else self.free_at
        end = start + service_s * factor
        self.free_at = end
        self.busy_time += end - start
        if factor != 1.0:
            self._stretched.append((start, end, factor))
        return start, end

    def busy(self, now: float) -> bool:
        """Whether work submitted before ``now`` is still unfinished at ``now``."""
        return self.free_at > now

    def work_left(self, now: float) -> float:
        """CPU time the lane's unfinished work still needs at ``now``, s: its remaining time,
        with a stretched item's remainder divided by its factor (half of a doubled item's
        elapsed time is the engine's share of the core, not the lane's work)."""
        left = self.free_at - now
        if left <= 0.0:
            return 0.0
        stretched = self._stretched
        while stretched and stretched[0][1] <= now:
            stretched.popleft()
        for start, end, factor in stretched:
            part = end - (start if start > now else now)
            left -= part - part / factor
        return left


class Frontends:
    """Every server's API lanes, and which lane serves which request.

    Args:
        model: service times (all servers alike).
        num_workers: servers.
        slowdown: ``slowdown(worker, now)``: the factor on the service time of lane work that
            ``worker``'s server queues at ``now`` (``HostModel.api_contention``); None: 1.
    """

    def __init__(self, model: FrontendModel, num_workers: int,
                 slowdown: Callable[[int, float], float] | None = None) -> None:
        self.model = model
        self.lanes = [[FifoLane() for _ in range(model.api_server_count)] for _ in range(num_workers)]
        self._lane_of: dict[int, FifoLane] = {}
        self.slowdown = slowdown

    def admit(self, worker: int, request_id: int, now: float, num_prompt_tokens: int) -> float:
        """Queue the admission of a request sent at ``now`` to ``worker``; returns its wait
        before its admission starts, s (0 on an idle lane)."""
        lanes = self.lanes[worker]
        lane = min(lanes, key=lambda ln: ln.free_at if ln.free_at > now else now)
        self._lane_of[request_id] = lane
        factor = 1.0 if self.slowdown is None else self.slowdown(worker, now)
        start, _ = lane.submit(now, self.model.admission_s(num_prompt_tokens), factor)
        return start - now

    def deliver(self, worker: int, request_id: int, now: float, extra_s: float = 0.0) -> float:
        """Queue the streaming of one token emitted at ``now``, with ``extra_s`` more lane work
        (s; a request's first output: ``Overheads.post_engine_s``); returns when the client gets it.

        The first token a lane takes from an engine step emitted at ``now`` also pays the step's
        ``per_step_s`` (tokens of one step share their emit time)."""
        lane = self._lane_of.get(request_id) or self.lanes[worker][0]
        service = self.model.per_output_token_s + extra_s
        if lane.step_at != now:
            lane.step_at = now
            service += self.model.per_step_s
        factor = 1.0 if self.slowdown is None else self.slowdown(worker, now)
        return lane.submit(now, service, factor)[1]

    def release(self, request_id: int) -> None:
        """Forget which lane serves ``request_id``: it is finished or abandoned, and streams no
        more tokens (so the map holds the requests in flight, not every request of the run)."""
        self._lane_of.pop(request_id, None)

    def num_busy(self, now: float) -> int:
        """API lanes (all servers) with unfinished work at ``now``."""
        return sum(lane.busy(now) for lanes in self.lanes for lane in lanes)

    def busy_shares(self, now: float, duration: float) -> list[float]:
        """Per lane (all servers), the share of ``[now, now + duration]`` its queued work fills,
        by the CPU time it still needs (:meth:`FifoLane.work_left`: its remaining time, unless
        ``slowdown`` stretched it, when only its own share of the core counts)."""
        if duration <= 0:
            return [float(lane.busy(now)) for lanes in self.lanes for lane in lanes]
        return [min(duration, lane.work_left(now)) / duration for lanes in self.lanes for lane in lanes]


class ContendedStepCost:
    """A step-cost model whose times are stretched by the host's busy processes.

    A :class:`~kvroute.sim.timing.step_timer.StepTimer` without fast-forward: a step's time
    depends on the clock and the host's load when it starts, not on its batch alone.
    :meth:`kvroute.sim.timing.host.Host.step_timers` builds one per worker.

    Args:
        cost: the calibrated step cost.
        host: the host model.
        busy: ``busy(d)``: the mean number of busy processes over the next ``d`` seconds, as far
            as work already queued tells (an API lane with 35 ms of admission work left adds
            0.035 / d to a step of ``d`` seconds, not a whole process).
        speed: this worker's step-time factor (``HostModel.engine_speed_sigma``): None for 1, or
            an :class:`EngineSpeed`, read at ``now()``.
        now: the simulation clock (``env.now``), s.
        frontend: the API lanes' service times, for the streaming share of a decode step's
            calibration baseline (``HostModel.baseline``); None: no streaming counted.
        client: ``client(d)``: the share of the next ``d`` seconds that a load-generating client
            pinned to this engine's core takes from it (``HostModel.client_core``); the step
            then takes ``1 + client(d)`` times as long, fair sharing of one core by two
            CPU-bound processes, whatever the fitted ``contention``. None: no pinned client.
    """

    __slots__ = ("cost", "host", "busy", "speed", "now", "per_step_s", "per_token_s", "client")
    fast_forward = False

    def __init__(self, cost, host: HostModel, busy: Callable[[float], float], speed: EngineSpeed | None = None,
                 now: Callable[[], float] = lambda: 0.0, frontend: FrontendModel | None = None,
                 client: Callable[[float], float] | None = None) -> None:
        self.cost, self.host, self.busy, self.speed, self.now = cost, host, busy, speed, now
        self.client = client
        streams = frontend is not None and host.baseline_stream_busy > 0.0
        self.per_step_s = frontend.per_step_s if streams else 0.0
        self.per_token_s = frontend.per_output_token_s if streams else 0.0

    def step_time(self, num_batched_tokens: int, num_reqs: int, prefill_token_pairs: float,
                  decode_context_tokens: int, num_decodes: int | None = None) -> float:
        """The calibrated step time ``d`` times the speed factor now times
        ``host.stretch(busy(d), host.baseline(d, streaming))``, s. The streaming behind a step's
        calibration: ``per_step_s + per_output_token_s`` times its ``num_decodes`` decoding
        requests (when None, as the sweep's steps have them: all in a decode-only step, all but
        one beside a prefill chunk), none for a step without decodes; times ``1 + client(d)``
        beside a pinned client."""
        base = self.cost.step_time(num_batched_tokens, num_reqs, prefill_token_pairs, decode_context_tokens)
        if self.speed is not None:
            factor = self.speed.at(self.now())
            if factor != 1.0:
                base *= factor
        stream = 0.0
        if decode_context_tokens > 0 and (self.per_step_s > 0.0 or self.per_token_s > 0.0):
            decoding = num_decodes if num_decodes is not None else (
                num_reqs if num_batched_tokens == num_reqs else num_reqs - 1)
            stream = self.per_step_s + self.per_token_s * decoding
        stretched = base * self.host.stretch(self.busy(base), self.host.baseline(base, stream))
        if self.client is not None:
            stretched *= 1.0 + self.client(base)
        return stretched


def frontend_from_dict(doc: dict | None, where: str) -> FrontendModel | None:
    """The ``frontend`` section of a profile, or None when absent.

    Raises:
        ValueError: an unknown field or a bad value, naming ``where`` and the field.
    """
    if doc is None:
        return None
    return _build(FrontendModel, doc, where, "frontend", ints=("api_server_count",))


def host_from_dict(doc: dict | None, where: str) -> HostModel | None:
    """The ``host`` section of a profile, or None when absent.

    Raises:
        ValueError: a missing ``cores``, an unknown field or a bad value, naming ``where``.
    """
    if doc is None:
        return None
    if "cores" not in doc:
        raise ValueError(f"{where}: section 'host' lacks 'cores'")
    return _build(HostModel, doc, where, "host", ints=("cores", "client_core"), bools=("api_on_engine_core",))


def _build(cls, doc, where: str, section: str, ints: tuple[str, ...], bools: tuple[str, ...] = ()):
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: section {section!r} must be an object")
    fields = cls.__dataclass_fields__
    unknown = sorted(k for k in doc if k not in fields and not k.startswith("_"))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} in section {section!r}; known: {sorted(fields)}")
    kw = {}
    for k, v in doc.items():
        if k in bools:
            if not isinstance(v, bool):
                raise ValueError(f"{where}: {section}.{k} must be true or false, got {v!r}")
            kw[k] = v
        elif k in fields:
            # float(True) is 1.0 and float("2") 2.0: a JSON true or string is no number
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{where}: {section}.{k} must be a number, got {v!r}")
            if k in ints and isinstance(v, float) and not v.is_integer():  # int(1.5) is 1: counts are whole
                raise ValueError(f"{where}: {section}.{k} must be a whole number, got {v!r}")
            kw[k] = int(v) if k in ints else float(v)
    try:
        return cls(**kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
