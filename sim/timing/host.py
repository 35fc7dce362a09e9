"""One run's host: its API lanes, the load on its CPU cores, and each worker's step timer.

A profile's ``frontend`` and ``host`` sections (:class:`~kvroute.sim.timing.frontend.FrontendModel`,
:class:`~kvroute.sim.timing.frontend.HostModel`) say what the API processes and the cores cost;
:class:`Host` holds them while a run goes: the API lanes (:class:`~kvroute.sim.timing.frontend.Frontends`),
the busy processes the host model counts, on the whole host or per core, and the step timer of
each worker (:meth:`Host.step_timers`, a :class:`~kvroute.sim.timing.step_timer.StepTimer`). The
cluster asks it for the timers and hands it the workers' engines once they exist
(:attr:`Host.engines`); it reads of an engine only whether it holds a core (:class:`Engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from kvroute.sim.timing.cost_model import StepCost
from kvroute.sim.timing.frontend import ContendedStepCost, EngineSpeed, FrontendModel, Frontends, HostModel
from kvroute.sim.timing.step_timer import StepTimer


class Engine(Protocol):
    """What the host model reads of a worker's engine (``kvroute.sim.cluster.worker.Worker``)."""

    def holds_core(self, now: float, spin_s: float) -> bool:
        """Whether the engine holds a CPU core at ``now``: it has work, or ran out of it less
        than ``spin_s`` seconds ago (``HostModel.engine_spin_s``)."""
        ...


class StreamedStepCost:
    """A :class:`~kvroute.sim.timing.cost_model.StepCost`'s step times for a worker whose tokens
    stream through API lanes (a ``frontend`` section without a ``host`` one): the same times,
    but no fast-forward, as the lanes take every step's outputs at that step's end, in time
    order (:meth:`Frontends.deliver`), which a run advanced as one event would skip.

    Args:
        cost: the calibrated step cost.
    """

    __slots__ = ("step_time",)
    fast_forward = False

    def __init__(self, cost: StepCost) -> None:
        # NOTE: the cost's own bound method, so a step costs no call more than with the StepCost
        self.step_time = cost.step_time


def engine_speeds(host: HostModel | None, num_workers: int, seed: int) -> list[float]:
    """Each worker's step-time factor for one run, or for the run's first period when
    ``HostModel.engine_speed_period_s`` is set (``HostModel.engine_speed_sigma``): lognormal
    with mean 1, from a generator of its own spawned from ``seed`` (the run's other draws do
    not move); all 1.0 without a host model or with a zero spread."""
    sigma = host.engine_speed_sigma if host is not None else 0.0
    if sigma <= 0.0:
        return [1.0] * num_workers
    rng = np.random.default_rng(seed).spawn(3)[2]
    return [float(f) for f in rng.lognormal(-0.5 * sigma * sigma, sigma, num_workers)]


def engine_speed_processes(host: HostModel, num_workers: int, seed: int) -> list[EngineSpeed | None]:
    """Per worker, its :class:`EngineSpeed` over the run (None: factor 1 throughout). The first
    period's factors are :func:`engine_speeds`'; later periods' come from one generator per
    worker, spawned from another child of ``seed``."""
    if host.engine_speed_sigma <= 0.0:
        return [None] * num_workers
    first = engine_speeds(host, num_workers, seed)
    rngs = np.random.default_rng(seed).spawn(4)[3].spawn(num_workers)
    return [EngineSpeed(host.engine_speed_sigma, host.engine_speed_period_s, rng, f) for rng, f in zip(rngs, first)]


class Host:
    """The API lanes and CPU cores of one run's host.

    Args:
        frontend: the profile's API-process service times (None: no API lanes).
        host: the profile's host model (None: steps take their calibrated times).
        num_workers: servers, one engine each.
        now: the simulation clock, s.

    Attributes:
        frontends: every server's API lanes, or None without ``frontend``.
        engines: the workers' engines, by index; the cluster sets them once they exist (the
            load functions read them only while the run goes).
    """

    def __init__(self, frontend: FrontendModel | None, host: HostModel | None, num_workers: int,
                 now: Callable[[], float]) -> None:
        self.frontend, self.host, self.num_workers, self.now = frontend, host, num_workers, now
        self.engines: Sequence[Engine] = ()
        self.frontends = Frontends(frontend, num_workers, self._lane_slowdown()) if frontend is not None else None

    def step_timers(self, cost: StepCost, seed: int) -> list[StepTimer]:
        """Each worker's step timer: with a host model, a :class:`ContendedStepCost` reading
        this host's load (:meth:`busy_for`), the worker's drawn speed (children 2 and 3 of
        ``seed``, :func:`engine_speed_processes`) and a pinned client's share
        (:meth:`client_share`); with API lanes alone, a :class:`StreamedStepCost`; else
        ``cost`` itself, the only one that allows fast-forward."""
        host, n = self.host, self.num_workers
        if host is None:
            return [cost if self.frontends is None else StreamedStepCost(cost)] * n
        client = self.client_worker()
        return [ContendedStepCost(cost, host, self.busy_for(w), speed, self.now, self.frontend,
                                  self.client_share if w == client else None)
                for w, speed in enumerate(engine_speed_processes(host, n, seed))]

    def busy_for(self, worker: int) -> Callable[[float], float]:
        """The load function worker ``worker``'s step timer reads: the whole host's
        (:meth:`num_busy`), or with ``host.api_on_engine_core`` its own core's times ``cores``
        (:meth:`num_busy_on_core`)."""
        if self.host.api_on_engine_core:
            return lambda duration: self.num_busy_on_core(worker, duration)
        return self.num_busy

    def num_busy_on_core(self, worker: int, duration: float) -> float:
        """``cores`` times the load on ``worker``'s core over the next ``duration`` seconds: its
        engine (with work or spinning, as in :meth:`num_busy`), its own API lanes' shares, and
        the client's ``host.client_busy`` share (while some lane is busy) spread over the cores;
        a client pinned to one core (``host.client_core``) counts there as a fair share instead
        (:meth:`client_share`, :class:`~kvroute.sim.timing.frontend.ContendedStepCost`).
        Times ``cores``, so that :meth:`HostModel.stretch` turns it into the per-core stretch
        ``1 + contention * max(0, load + other_busy / cores - max(1, baseline / cores))``."""
        now = self.now()
        host = self.host
        engine = float(self.engines[worker].holds_core(now, host.engine_spin_s))
        if self.frontends is None:
            return host.cores * engine
        # NOTE: by CPU time, not elapsed (busy_shares): a lane stretched by its engine
        # (api_contention) takes the core for its own work only; counting its stretched time
        # would charge the engine for its own share too (and break the decode streaming baseline).
        shares = self.frontends.busy_shares(now, duration)
        per = self.frontends.model.api_server_count
        own = sum(shares[worker * per:(worker + 1) * per])
        if host.client_core >= 0:  # pinned: a fair share of one core (client_share), none here
            return host.cores * (engine + own)
        return host.cores * (engine + own) + self.client_load(shares)

    def client_worker(self) -> int:
        """The worker whose core the measuring client is pinned to (``HostModel.client_core``
        with ``api_on_engine_core``), or -1."""
        host = self.host
        return host.client_core if host is not None and host.api_on_engine_core and self.frontends is not None else -1

    def client_share(self, duration: float) -> float:
        """The pinned client's share of its core over the next ``duration`` seconds
        (:meth:`client_load` of the lanes' shares of that interval)."""
        return self.client_load(self.frontends.busy_shares(self.now(), duration))

    def client_load(self, shares: list[float]) -> float:
        """Busy client processes, given the API lanes' busy ``shares`` of an interval:
        ``host.client_busy`` times the largest (the client reads what the lanes stream)."""
        return self.host.client_busy * max(shares, default=0.0)

    def _lane_slowdown(self) -> Callable[[int, float], float] | None:
        """The API lanes' service-time factor (``HostModel.api_contention``): ``1 +
        api_contention`` while the server's engine has requests, else 1; None without it."""
        host = self.host
        if host is None or not host.api_on_engine_core or host.api_contention <= 0.0:
            return None
        stretched = 1.0 + host.api_contention
        return lambda worker, now: stretched if self.engines[worker].holds_core(now, 0.0) else 1.0

    def num_busy(self, duration: float = 0.0) -> float:
        """The host model's load over the next ``duration`` seconds (0: now): engines with work
        (or that ran out of it less than ``host.engine_spin_s`` ago), each API lane's share of the
        interval its queued work fills, and the client's ``host.client_busy`` processes for the
        share during which some lane is busy (the client reads what the lanes stream)."""
        now = self.now()
        host = self.host
        spin = host.engine_spin_s if host is not None else 0.0
        engines = sum(e.holds_core(now, spin) for e in self.engines)
        if self.frontends is None:
            return float(engines)
        shares = self.frontends.busy_shares(now, duration)
        client = self.client_load(shares) if host is not None else 0.0
        return engines + sum(shares) + client
