"""How long a calibration sweep will take, estimated before it runs (``kvroute calibrate measure``
prints it; ``--dry-run`` prints it and stops), and while it runs how long it has left
(:class:`TimeLeft`: the estimate of what is not yet done at the pace of what is done, counting
down while an experiment runs; the progress line's ``about N min left``).

The sweep's wall time is the sum, in the order :func:`kvroute.calibrate.calibration.measure.run_sweep`
runs them, of every experiment's engine time, its requests' front end and the fixed waits of the
client (``/metrics`` scrapes around each experiment, the short sleeps of ``measure.py``):

- **engine**: each request's engine steps from a profile's step-cost model
  (:class:`kvroute.sim.timing.cost_model.StepCost`): a prefill of ``n`` new tokens after ``c``
  cached ones in chunks of at most ``max_num_batched_tokens`` (vLLM v1's chunked prefill:
  ``vllm/v1/core/sched/scheduler.py``), several prefills sent together packed into steps up to
  that budget in the order sent, then one decode step per further output token of the whole
  batch (:meth:`StepCost.decode_run_times`);
- **front end**: once per request sent alone, or once per batch sent together (it overlaps), the
  profile's lone-request overhead (:meth:`kvroute.sim.timing.profile.Overheads.mean_s` plus the
  part after the engine); with a ``frontend`` section (the API processes as queues), a burst of
  ``N`` waits at least for the lane work of its ``N`` requests;
- **fixed**: ``scrape_s`` per ``/metrics`` scrape that measure.py awaits outside a running
  batch (2 per request it times alone and brackets, 2 more per decode and mixed experiment, 2 per server per burst,
  11 per server before its first burst: ``SCRAPES_TIMED + 1``), ``EVENT_WAIT_S`` per request
  alone with KV events, and the warm-up's 5 ms sleep per batch size.

The experiments are dealt to the servers as ``run_sweep`` deals them (round robin, in the plan's
order) and run in the same ``burst_slots`` steps (:func:`sweep_schedule`): in each step the
servers run their segments side by side, so the step lasts as long as its slowest server's
segment, and then the step's bursts run one after another.

Left out: decodes that ride along in prefill steps (each batch's prefill steps and its decode
steps are added, an overestimate of at most one short step per request), the
host model's stretching of steps under load (``host``), and the run-to-run spread of the host's
speed. The estimate is only as good as the profile's step costs for the servers measured: a
derived prior (``kvroute profiles derive``) or a profile of like hardware. The figures it was
checked against are in docs/log/2026-12-05-calibration-time.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from kvroute.calibrate.calibration.measure import EVENT_WAIT_S, SCRAPES_TIMED
from kvroute.calibrate.calibration.sweep_plan import SweepPlan, sweep_schedule
from kvroute.sim.engine.scheduler_output import prefill_pairs
from kvroute.sim.timing.profile import Profile

SCRAPE_S = 0.011
"""Seconds one ``/metrics`` scrape of a vLLM server keeps the client waiting (the API process
renders the page, the client parses it): half the gap between two requests timed alone on the
CPU reference (a settling scrape and the next request's opening one; the figures:
docs/log/2026-12-05-calibration-time.md)."""

WARM_UP_SLEEP_S = 0.005
"""measure.py's ``warm_up`` sleeps this long after starting each batch size's decodes."""

PHASES = ("start", "cold", "cached", "decode", "mixed", "bursts")
"""The estimate's phases, in the order they are printed: ``start`` is the servers' probes and the
warm-up; ``bursts`` the concurrency sweep (``burst`` and ``burst_all`` experiments)."""


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The engine settings the estimate steps through (a server's, or a profile's ``engine``).

    Attributes:
        block_size: KV block, tokens.
        num_gpu_blocks: KV blocks per server (vLLM's count, block 0 included).
        max_num_batched_tokens: step token budget, tokens.
    """

    block_size: int
    num_gpu_blocks: int
    max_num_batched_tokens: int

    @property
    def capacity_tokens(self) -> int:
        """KV tokens one server holds, as ``run_sweep`` counts them: ``(num_gpu_blocks - 1) * block_size``."""
        return (self.num_gpu_blocks - 1) * self.block_size


@dataclass(frozen=True, slots=True)
class SweepEstimate:
    """A sweep's estimated wall time.

    Attributes:
        total_s: wall time, s (the sum of ``phases``).
        phases: seconds per phase (:data:`PHASES`): each step's slowest server's experiments by kind,
            then the step's bursts.
        context_s: of the decode and mixed phases, the seconds spent prefilling the decode contexts
            one at a time before each batch.
        engine_s, front_end_s, fixed_s: the same wall time split into engine steps, request front
            ends and the client's scrapes and sleeps, s.
        num_experiments: one-at-a-time experiments.
        num_bursts: concurrency-sweep experiments.
        num_requests: requests sent (contexts and warm requests included; probes and warm-up not).
        num_servers: servers measured together.
        profile: the name of the profile whose step costs were used.
        not_estimated: experiment kinds the estimate does not know (counted as 0 s).
        experiment_s: each experiment's share of ``total_s`` by ``exp_id``, s: in each step the
            experiments of its slowest server (the others run beside them, 0 s) and each burst
            (a server's first burst with the scrapes timed before it); with ``phases["start"]``
            they add up to ``total_s``. :class:`TimeLeft` paces a running sweep by them.
    """

    total_s: float
    phases: dict[str, float]
    context_s: float
    engine_s: float
    front_end_s: float
    fixed_s: float
    num_experiments: int
    num_bursts: int
    num_requests: int
    num_servers: int
    profile: str
    not_estimated: tuple[str, ...] = ()
    experiment_s: dict[int, float] = field(default_factory=dict)

    def line(self) -> str:
        """One line for a person: the total and the phases, said to be an estimate."""
        mins = self.total_s / 60.0
        when = f"{mins:.0f} min ({self.total_s:.0f} s)" if mins >= 2 else f"{self.total_s:.0f} s"
        parts = ", ".join(f"{p} {self.phases[p]:.0f} s" for p in PHASES if self.phases.get(p, 0.0) >= 0.5)
        ctx = (f"; {self.context_s:.0f} s of it prefilling the decode contexts one at a time"
               if self.context_s >= 0.5 else "")
        miss = f"; not estimated: {', '.join(self.not_estimated)}" if self.not_estimated else ""
        return (f"estimated sweep time: about {when} for {self.num_experiments} experiments "
                f"and {self.num_bursts} bursts ({self.num_requests} requests) on {self.num_servers} server(s): "
                f"{parts}{ctx}. An estimate from {self.profile}'s step costs and front end "
                f"(engine {self.engine_s:.0f} s, front end {self.front_end_s:.0f} s, scrapes and waits "
                f"{self.fixed_s:.0f} s); a slower or busier host takes longer{miss}")


class _Clock:
    """Seconds of one experiment, kept apart by what they are."""

    __slots__ = ("engine", "front", "fixed", "context", "requests")

    def __init__(self) -> None:
        self.engine = self.front = self.fixed = self.context = 0.0
        self.requests = 0

    @property
    def total(self) -> float:
        return self.engine + self.front + self.fixed

    def add(self, other: "_Clock") -> None:
        self.engine += other.engine
        self.front += other.front
        self.fixed += other.fixed
        self.context += other.context
        self.requests += other.requests


class SweepTimer:
    """Times a plan's experiments on one profile's engine.

    Args:
        plan: the sweep.
        profile: step costs (``step_cost``), front end (``overheads``, ``frontend``).
        num_servers: servers measured together, >= 1.
        shape: the servers' engine settings; default the profile's ``engine``.
        scrape_s: seconds per ``/metrics`` scrape the client waits for (:data:`SCRAPE_S`).
        kv_events: whether the sweep reads KV events (``EVENT_WAIT_S`` after each request alone).

    Raises:
        ValueError: ``num_servers < 1`` or a negative ``scrape_s``.
    """

    def __init__(self, plan: SweepPlan, profile: Profile, num_servers: int = 1, shape: EngineShape | None = None,
                 scrape_s: float = SCRAPE_S, kv_events: bool = False) -> None:
        if not scrape_s >= 0.0:
            raise ValueError(f"scrape_s must be >= 0, got {scrape_s!r}")
        if num_servers < 1:
            raise ValueError(f"num_servers must be >= 1, got {num_servers!r}")
        eng = profile.engine
        self.plan, self.profile, self.num_servers = plan, profile, num_servers
        self.shape = shape or EngineShape(eng.block_size, eng.num_gpu_blocks, eng.max_num_batched_tokens)
        self.cost = profile.step_cost
        self.scrape_s = scrape_s
        self.event_wait_s = EVENT_WAIT_S if kv_events else 0.0

    # -- requests --------------------------------------------------------------------------

    def front_s(self, prompt_len: int) -> float:
        """A lone request's front end, s: the overhead before the engine plus the part after it."""
        o = self.profile.overheads
        return o.mean_s(prompt_len) + o.post_engine_s + o.post_engine_per_token_s * prompt_len

    def prefills_s(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Engine seconds of prefills sent together, ``(cached, new)`` tokens each, packed in the
        order given into steps of at most ``max_num_batched_tokens`` tokens (a request's remainder
        carries into the next step)."""
        budget = self.shape.max_num_batched_tokens
        total = 0.0
        tokens = reqs = 0
        pairs = 0.0
        for cached, new in chunks:
            done = 0
            while done < new:
                n = min(new - done, budget - tokens)
                pairs += prefill_pairs(cached + done, n)
                tokens += n
                reqs += 1
                done += n
                if tokens == budget:
                    total += self.cost.step_time(tokens, reqs, pairs, 0)
                    tokens = reqs = 0
                    pairs = 0.0
        if tokens:
            total += self.cost.step_time(tokens, reqs, pairs, 0)
        return total

    def decodes_s(self, batch: int, context: int, steps: int) -> float:
        """Engine seconds of ``steps`` decode steps of ``batch`` requests after a prefill to
        ``context`` tokens each (step ``j`` reads ``batch * (context + j)`` context tokens)."""
        return math.fsum(self.cost.decode_run_times(batch, batch * context, steps)) if steps > 0 else 0.0

    def _alone(self, clock: _Clock, prompt_len: int, cached: int = 0, scrapes: int = 2) -> None:
        """A request timed alone (``_sequential``): front end, its prefill, ``scrapes`` scrapes."""
        clock.front += self.front_s(prompt_len)
        clock.engine += self.prefills_s([(cached, prompt_len - cached)])
        clock.fixed += scrapes * self.scrape_s + self.event_wait_s
        clock.requests += 1

    # -- experiments -----------------------------------------------------------------------

    def experiment(self, exp: dict[str, Any]) -> _Clock | None:
        """Seconds of one experiment of :meth:`SweepPlan.experiments` or :meth:`SweepPlan.bursts`
        on its server(s), or None for a kind this estimate does not know."""
        kind = exp["kind"]
        c = _Clock()
        bs = self.shape.block_size
        p = self.plan
        if kind == "cold":
            self._alone(c, exp["prompt_len"])
        elif kind == "cached":
            P = max(bs, exp["prefix_len"] // bs * bs)
            n = P + exp["new_len"]
            self._alone(c, P)
            self._alone(c, n, min(P // bs, (n - 1) // bs) * bs)
        elif kind in ("decode", "mixed"):
            mixed = kind == "mixed"
            B = exp["batch"]
            L = max(2 * bs, (p.mixed_context if mixed else exp["context_len"]) // bs * bs)
            T = p.mixed_tokens if mixed else p.decode_tokens
            ctx = _Clock()
            for i in range(B):  # the contexts, one at a time; the first one bracketed
                self._alone(ctx, L - bs, scrapes=2 if i == 0 else 0)
            c.add(ctx)
            c.context = ctx.total
            c.fixed += 2 * self.scrape_s  # before the batch, settling after it
            c.front += self.front_s(L)
            c.engine += self.prefills_s([(L - bs, bs)] * B)
            c.requests += B
            if mixed:  # one decode step becomes the mixed step with the cold prompt's prefill
                P = exp["prefill_len"]
                c.engine += self.decodes_s(B, L, T - 2)
                c.engine += self.cost.step_time(B + P, B + 1, prefill_pairs(0, P), B * (L + p.mixed_lead))
                c.requests += 1
            else:
                c.engine += self.decodes_s(B, L, T - 1)
        elif kind in ("burst", "burst_all"):
            targets = 1 if kind == "burst" else self.num_servers
            N, L, T, P = exp["batch"], exp["prompt_len"], exp["max_tokens"], exp.get("prefix_len", 0)
            cached = 0
            if P:
                for _ in range(targets):  # the prefix, cached on each server in turn
                    self._alone(c, P, scrapes=0)
                cached = P // bs * bs
            c.fixed += 2 * targets * self.scrape_s  # before and settling, server after server
            engine = self.prefills_s([(cached, L - cached)] * N) + self.decodes_s(N, L, T - 1)
            fe = self.profile.frontend
            lanes = (N * (fe.admission_s(L) + fe.per_output_token_s * T) / fe.api_server_count
                     if fe is not None else 0.0)
            c.front += self.front_s(L) + max(0.0, lanes - engine)
            c.engine += engine
            c.requests += N * targets
        else:
            return None
        return c

    # -- the sweep --------------------------------------------------------------------------

    def start(self) -> _Clock:
        """The servers' probes (one after another: two requests of ``2 * block_size + 1`` tokens,
        the second a cache hit, and about five other calls counted as scrapes) and the warm-up (all
        servers at once: per batch size ``B``, ``B`` decodes of 24 tokens beside one-token prompts
        of 64 tokens and the mixed prefill lengths)."""
        c = _Clock()
        bs = self.shape.block_size
        for _ in range(self.num_servers):
            self._alone(c, 2 * bs + 1, scrapes=5)
            self._alone(c, 2 * bs + 1, cached=2 * bs, scrapes=0)
        p = self.plan
        for B in sorted({*p.decode_batches, *p.mixed_batches, 1}):
            decodes = self.front_s(2 * bs) + self.prefills_s([(0, 2 * bs)] * B) + self.decodes_s(B, 2 * bs, 23)
            alone = sum(self.front_s(L) + self.prefills_s([(0, L)]) for L in sorted({64, *p.mixed_prefills}))
            c.engine += max(decodes, WARM_UP_SLEEP_S + alone)
            c.fixed += WARM_UP_SLEEP_S
        return c

    def estimate(self, seed: int = 0) -> SweepEstimate:
        """The sweep on the servers (``seed`` as given to ``run_sweep``: it orders the
        experiments and deals the bursts to the slots)."""
        num_servers = self.num_servers
        cap = self.shape.capacity_tokens
        exps = self.plan.experiments(cap, seed)
        bursts = self.plan.bursts(num_servers, len(exps), cap)
        shares = [exps[k::num_servers] for k in range(num_servers)]
        phases = dict.fromkeys(PHASES, 0.0)
        wall = _Clock()
        unknown: set[str] = set()
        start = self.start()
        phases["start"] = start.total
        wall.add(start)
        wall.requests = 0
        context = 0.0
        shares_s: dict[int, float] = {}
        first_scrapes = set(range(num_servers)) if bursts else set()
        for segments, chunk in sweep_schedule(shares, bursts, self.plan.burst_slots, seed):
            timed = []
            for seg in segments:
                clocks = []
                for exp in seg:
                    clock = self.experiment(exp)
                    if clock is None:
                        unknown.add(exp["kind"])
                        clock = _Clock()
                    wall.requests += clock.requests
                    clocks.append((exp, clock))
                timed.append(clocks)
            slowest = max(timed, key=lambda cl: sum(x.total for _, x in cl), default=[])
            for exp, clock in slowest:
                phases[exp["kind"]] += clock.total
                shares_s[exp["exp_id"]] = clock.total
                context += clock.context
                wall.engine += clock.engine
                wall.front += clock.front
                wall.fixed += clock.fixed
            for exp in chunk:
                clock = self.experiment(exp)
                if clock is None:
                    unknown.add(exp["kind"])
                    continue
                # each server's first burst times SCRAPES_TIMED + 1 scrapes first
                touched = first_scrapes & ({exp["server"]} if exp["kind"] == "burst" else set(range(num_servers)))
                first_scrapes -= touched
                clock.fixed += len(touched) * (SCRAPES_TIMED + 1) * self.scrape_s
                phases["bursts"] += clock.total
                shares_s[exp["exp_id"]] = clock.total
                wall.add(clock)
        return SweepEstimate(
            total_s=math.fsum(phases.values()), phases=phases, context_s=context, engine_s=wall.engine,
            front_end_s=wall.front, fixed_s=wall.fixed, num_experiments=len(exps), num_bursts=len(bursts),
            num_requests=wall.requests, num_servers=num_servers, profile=self.profile.name,
            not_estimated=tuple(sorted(unknown)), experiment_s=shares_s)


def estimate_sweep(plan: SweepPlan, profile: Profile, num_servers: int, seed: int = 0,
                   shape: EngineShape | None = None, scrape_s: float = SCRAPE_S,
                   kv_events: bool = False) -> SweepEstimate:
    """The wall time of ``plan`` on ``num_servers`` identical servers with ``profile``'s step
    costs and front end (see the module's docstring for what is counted).

    Args:
        plan: the sweep.
        profile: step costs and front end; its ``engine`` gives the engine settings unless
            ``shape`` does (the probed servers' block size, KV blocks and step budget).
        num_servers: servers measured together, >= 1.
        seed: the sweep's seed.
        shape: the servers' engine settings, or None.
        scrape_s: seconds per ``/metrics`` scrape (:data:`SCRAPE_S`).
        kv_events: whether the sweep reads KV events.

    Returns:
        A :class:`SweepEstimate`.

    Raises:
        ValueError: ``num_servers < 1`` or a negative ``scrape_s``.
    """
    return SweepTimer(plan, profile, num_servers, shape, scrape_s, kv_events).estimate(seed)


PRIOR_SHARE = 0.05
"""How much the estimate's own pace weighs in :class:`TimeLeft`: as much as this share of the
sweep's estimated seconds measured (once 5 % of the sweep is done the two weigh the same). Small,
because the host's speed of the day moves every step cost alike: on the CPU reference the cold
and cached prompts (the first 13 s of the 519 s estimate) ran at the decode experiments' pace, within
a few per cent (docs/log/2026-12-05-calibration-time.md)."""


class TimeLeft:
    """The wall time a running sweep has left, from its estimate and the pace of the work finished.

    The experiments differ by orders of magnitude (a cold 16-token prompt against 64 decodes of
    16k-token contexts) and the sweep runs the short ones first, so a count of experiments done
    says little of the time left; and the host's speed of the day moves every step cost alike
    (docs/log/2026-12-05-calibration-time.md has the measurements). So the time left is
    the estimate of what is not yet done at the pace, real seconds per estimated second,
    ``(E + K) / (D + K)``: ``D`` the estimated seconds of what is done (the warm-up, then each
    experiment's :attr:`SweepEstimate.experiment_s`) and ``E`` the seconds from the warm-up's
    start to the last of them ending, blended with the estimate's own pace 1 as if it were
    ``K = prior_share * P`` estimated seconds (``P`` the estimated total) measured at that pace.
    What has not begun counts its estimate times the pace; what runs counts its estimate times
    the pace less the seconds since it began, down to 0 (one that overruns its estimate adds
    nothing until it ends; of a step's servers only the slowest has estimated seconds, so one
    such runs at a time). So while an experiment runs the time left falls with the wall time
    and then holds; when it ends the pace takes in its real time.

    All times are seconds since the warm-up began (the progress bar's elapsed time).

    Args:
        estimate: the sweep's estimate (same plan, seed, servers and engine settings as the run).
        prior_share: ``K / P``, >= 0 (:data:`PRIOR_SHARE`).

    Raises:
        ValueError: a negative ``prior_share``.
    """

    def __init__(self, estimate: SweepEstimate, prior_share: float = PRIOR_SHARE) -> None:
        if not prior_share >= 0.0:
            raise ValueError(f"prior_share must be >= 0, got {prior_share!r}")
        self.pending: dict[int | str, float] = {"start": estimate.phases.get("start", 0.0), **estimate.experiment_s}
        self.planned_s = math.fsum(self.pending.values())
        self.prior_s = prior_share * self.planned_s
        self.done_s = 0.0
        self.done_at_s = 0.0  # when the last estimated seconds were done
        self.began_at_s: dict[int | str, float] = {}  # of the keys pending that began

    def begin(self, key: int | str, at_s: float) -> None:
        """Count an experiment (its ``exp_id``) or the warm-up (``"start"``) as running from
        ``at_s``; a key not estimated, done, or begun before is left as it is."""
        if key in self.pending:
            self.began_at_s.setdefault(key, at_s)

    def done(self, key: int | str, at_s: float) -> None:
        """Count an experiment or the warm-up as done at ``at_s``; a key not estimated, or done
        before, counts 0 s and leaves the pace as it is."""
        self.began_at_s.pop(key, None)
        share = self.pending.pop(key, 0.0)
        if share > 0.0:
            self.done_s += share
            self.done_at_s = at_s

    def pace(self) -> float:
        """Real seconds per estimated second of the work done, ``(E + K) / (D + K)``; 1 before
        any (with ``prior_share`` 0)."""
        if self.done_s + self.prior_s <= 0.0:
            return 1.0
        return (self.done_at_s + self.prior_s) / (self.done_s + self.prior_s)

    def left_s(self, elapsed_s: float) -> float | None:
        """Seconds left after ``elapsed_s``: the pace times the estimate of what has not begun,
        plus, for what runs, the pace times its estimate less the seconds since it began (each
        at least 0); None when nothing was estimated (``P`` = 0)."""
        if self.planned_s <= 0.0:
            return None
        pace = self.pace()
        waiting = math.fsum(s for key, s in self.pending.items() if key not in self.began_at_s)
        running = math.fsum(max(0.0, pace * self.pending[key] - max(0.0, elapsed_s - began))
                            for key, began in self.began_at_s.items())
        return pace * waiting + running
