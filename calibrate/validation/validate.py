"""Validation: replay a trace live, simulate the same trace, and compare metric by metric.

For each live round and, within it, each policy in turn (round-major: rr, kv, rr, kv, ..., so
drift of the machine hits every policy alike): every server's prefix cache is reset (``POST /reset_prefix_cache``,
retried until the engine has freed its blocks; a server that refuses leaves the run marked
*warm*), ``/metrics`` is scraped, the trace is replayed live (``kvroute.calibrate.validation.replay``) and
``/metrics`` is scraped again, so per-worker ``vllm:prefix_cache_hits_total`` and
``queries_total`` deltas belong to that run alone. The prediction is the simulator run on the
same trace with the same number of workers, the same client (``max_in_flight``, replay mode)
and the given profile whose engine settings are replaced by what the servers report (block size,
``num_gpu_blocks``, ``max_num_batched_tokens``, ``max_num_seqs``, ``max_model_len``), averaged
over seeded rounds. Ctrl-C stops the live part and keeps what was measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvroute.calibrate.live.client import CalibrationError, MetricsSnapshot, ServerInfo, VllmClient
from kvroute.calibrate.live.prompts import DEFAULT_TOKEN_RANGE, TokenSynth
from kvroute.calibrate.live.server_features import unmodeled_note
from kvroute.calibrate.validation.probe import drifts_against, speed_scale
from kvroute.sim.study.intervals import HOST_RUN_TO_RUN_LOG_SD
from kvroute.sim.timing.speed_scale import SpeedScale, scaled_profile
from kvroute.calibrate.validation.replay import Endpoint, LiveReplay, ReplaySpec
from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.timing.coverage import run_note
from kvroute.sim.study.experiment import compare, compare_uncertain
from kvroute.sim.cluster.metrics import RunResult, summarize
from kvroute.sim.timing.profile import Profile, profile_model_key
from kvroute.sim.timing.vllm_versions import kv_event_stamp
from kvroute.traces.format import Trace

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
PREEMPTIONS = "vllm:num_preemptions_total"
COUNTED = "vllm:request_queue_time_seconds_count"
"""A histogram vLLM observes once per finished request (``settled_scrape`` waits for it)."""


@dataclass(frozen=True, slots=True)
class ValidationSpec:
    """What to validate.

    Attributes:
        urls: server base URLs; worker ``i`` is ``urls[i]``.
        policies: routing policies, run in this order; the first is the baseline of changes.
        max_in_flight: most requests outstanding at the client (1: one at a time); None: no limit.
        closed_loop: later turns wait for their parent; None: closed loop for traces with sessions.
        arrival_spread_s: the simulator's start jitter of root requests, s (the live client sends
            a burst's roots within milliseconds; 0 compares one-at-a-time runs exactly).
        router_block_tokens: the router's prefix-index granularity, tokens; None: the trace's
            (``kvroute.sim.routing.view.routed_index_tokens``).
        timeout_s: limit on one live request, s; passing it marks the worker dead.
        sim_rounds: seeded simulation rounds averaged into the prediction.
        seed: first simulation seed; also seeds prompt tokens and the ``random`` policy.
        model: served model name; None: each server's only model.
        token_range: ``(lo, hi)`` prompt token ids; None: the ordinary ids of the model's
            tokenizer when the server's model directory is readable here, else
            ``DEFAULT_TOKEN_RANGE``.
        client_lag_s: seconds the simulation adds to every later turn's think time, standing
            for the live client's own delay between a reply's last token and sending the next
            turn (the report measures it); 0 simulates the trace as written. None: measured:
            the live runs go first, and the simulation then delays every later turn by a lag
            drawn from theirs (the spread matters, not only the median: chats whose replies
            end in one step otherwise stay in lock-step) and, without a ``max_in_flight`` limit,
            sends each root request at the median of its live send offsets
            (:func:`with_measured_client`).
        uncertainty: profiles drawn from the profile's coefficient uncertainty
            (``kvroute.sim.timing.uncertainty.draw_profiles``), each simulated ``sim_rounds`` times, so
            that the interval a measured value is checked against includes the model's share; 0:
            seeds only.
        prior_range: relative range of a derived prior's coefficients for ``uncertainty``.
        cache_view: where cache-aware policies look, live and simulated: ``routed`` or
            ``events`` (the servers' KV-cache events, read from ``kv_event_endpoints``).
        kv_event_endpoints: each server's ZeroMQ KV-event endpoint, in ``urls`` order.
        live_rounds: live replays of every policy, interleaved round by round (the report gives
            their mean, min-max and, from 3 rounds, the mean's 95 % interval); the prediction is
            the same whatever their number.
        record_tokens: keep every output token's arrival time, live and simulated (the report
            then writes ``tokens_live.parquet`` and ``tokens_sim.parquet``).
        interval_level: nominal coverage of the interval each measured value is checked
            against (``kvroute.sim.study.intervals.combined_interval``; 0.9: 90 %).
        speed_probes: requests per server of a speed probe before the first and after the last
            live round (``kvroute.calibrate.validation.probe``); their drift widens and shifts
            the intervals of time measures. 0: no probes.
        probe_reference: the same probe's samples right after calibrating (``{"ttft_s": [...],
            "itl_s": [...], ...}``), against which the drift is measured; None: against the probe
            as the profile predicts it (``probe.predicted_probe``, kept in ``probes["predicted"]``).
        speed_scale: with speed probes and no ``probe_reference``, predict with the profile
            rescaled to the host's speed the probes measured (``probe.speed_scale``,
            ``kvroute.sim.timing.speed_scale``; ``Validation.speed_scale``), then take the drift
            against that profile's prediction of the probe; False: the profile as it is.
        run_to_run_prior: with one live round, how far one live run of a time measure is taken
            to move from the next (log standard deviation; a change between policies takes
            ``kvroute.sim.study.intervals.change_prior_sd`` of it), where it exceeds the seeds'
            spread; from two live rounds on their own spread is used. 0: none.
    """

    urls: tuple[str, ...]
    policies: tuple[str, ...] = ("round_robin",)
    max_in_flight: int | None = None
    closed_loop: bool | None = None
    arrival_spread_s: float = 0.0
    router_block_tokens: int | None = None
    timeout_s: float = 600.0
    sim_rounds: int = 10
    seed: int = 0
    model: str | None = None
    token_range: tuple[int, int] | None = None
    client_lag_s: float | None = 0.0
    uncertainty: int = 0
    prior_range: float = 0.2
    cache_view: str = "routed"
    kv_event_endpoints: tuple[str, ...] = ()
    live_rounds: int = 1
    record_tokens: bool = False
    interval_level: float = 0.90
    speed_probes: int = 0
    probe_reference: dict | None = None
    speed_scale: bool = True
    run_to_run_prior: float = HOST_RUN_TO_RUN_LOG_SD


@dataclass(slots=True)
class PolicyRun:
    """Prediction and measurement of one policy in one live round.

    Every live round of a policy has its own run; they share the prediction (``predicted``,
    ``sim_runs``, ``predicted_interval``, ``run_values``, ``interval_source``: the same objects).

    Attributes:
        policy: the policy name.
        predicted: summary metrics (``kvroute.sim.cluster.metrics.SUMMARY_METRICS`` keys), mean over rounds.
        predicted_interval: per metric, the 95 % Student-t interval ``(low, high)`` of that mean
            over the simulated rounds (closed-loop bursts vary a lot from seed to seed).
        sim_runs: the simulated runs.
        live: the live records and counters (None before the live run started).
        measured: summary metrics of ``live``.
        cache_reset: per server, whether its prefix cache was reset before the run (None: the
            server did not answer, and the run started with it marked dead).
        before, after: per server ``/metrics`` scrapes around the run (None when unreachable).
        interrupted: Ctrl-C stopped this run.
        client_cpu_s, client_cpu: the client's CPU seconds during the run and their samples
            over time (:class:`~kvroute.calibrate.validation.replay.LiveReplay`).
        run_values: per metric, the value of every simulated single run (the central profile's
            rounds, then each drawn profile's), in the same order for every policy, so changes
            can be paired run by run; a live run is checked against their prediction interval.
        interval_source: ``"seeds"`` or ``"seeds and model (<how the profiles were drawn>)"``.
        live_round: the live round, from 0.
        stamp_correction: what was done to the live records' KV-event engine first-token times
            (``calibration.step_end.StampCorrection``, ``live_stamps.correct_live_stamps``); None
            without them.
    """

    policy: str
    predicted: dict[str, float]
    sim_runs: list[RunResult]
    predicted_interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    live: RunResult | None = None
    measured: dict[str, float] = field(default_factory=dict)
    cache_reset: list[bool | None] = field(default_factory=list)
    before: list[MetricsSnapshot | None] = field(default_factory=list)
    after: list[MetricsSnapshot | None] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)
    interrupted: bool = False
    elapsed_s: float = math.nan
    client_cpu_s: float = math.nan
    client_cpu: list[tuple[float, float]] = field(default_factory=list)
    usage_reported: bool = True
    run_values: dict[str, list[float]] = field(default_factory=dict)
    interval_source: str = "seeds"
    live_round: int = 0
    run_draws: list[int] = field(default_factory=list)
    stamp_correction: object = None

    def take_prediction(self, pred: PolicyRun) -> None:
        """Share ``pred``'s prediction (the fields :func:`predict` fills in)."""
        self.predicted, self.sim_runs, self.predicted_interval = pred.predicted, pred.sim_runs, pred.predicted_interval
        self.run_values, self.interval_source = pred.run_values, pred.interval_source
        self.run_draws = getattr(pred, "run_draws", [])

    @property
    def warm(self) -> bool:
        """Whether some live server's cache could not be reset before the run."""
        return any(ok is False for ok in self.cache_reset)

    def measured_counter(self, name: str, num_servers: int) -> list[float]:
        """Per server, the run's delta of counter ``name`` (NaN where a scrape is missing)."""
        out = []
        for i in range(num_servers):
            b = self.before[i] if i < len(self.before) else None
            a = self.after[i] if i < len(self.after) else None
            out.append(a.delta(b, name) if a is not None and b is not None else math.nan)
        return out

    def predicted_counter(self, column: str) -> list[float]:
        """Per worker, the mean over rounds of the simulator's counter ``column``."""
        stacked = np.array([run.workers[column].to_numpy(float) for run in self.sim_runs])
        return [float(v) for v in stacked.mean(axis=0)]


@dataclass(slots=True)
class Validation:
    """A whole validation: scenario, servers and one :class:`PolicyRun` per policy and live round
    run so far.

    Attributes:
        trace: the trace replayed.
        spec: what was asked.
        servers: what each server reported.
        sim_spec: the simulated cluster (its ``policy`` field is replaced per policy).
        runs: per policy and live round, in run order (round-major).
        notes: remarks for the report (engine settings that differ between servers, ...).
        interrupted: Ctrl-C stopped the validation.
        predicted: every run has its prediction; False when Ctrl-C came after the live rounds,
            before the prediction they wait for was made (the runs then hold measurements only).
        probes: the speed probes' samples (``"before"``, ``"after"``, and ``"predicted"``: the
            reference the profile predicts).
        drift: per probe quantity, the host's drift (``kvroute.sim.timing.drift.Drift``).
        speed_scale: the factors the profile was rescaled by to the probes' speed, or None.
    """

    trace: Trace
    spec: ValidationSpec
    servers: list[ServerInfo]
    sim_spec: ClusterSpec
    runs: list[PolicyRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    predicted: bool = True
    client_lag_s: float = 0.0
    root_offsets_s: dict[int, float] | None = None
    probes: dict = field(default_factory=dict)
    drift: dict = field(default_factory=dict)
    speed_scale: SpeedScale | None = None

    def policy_rounds(self) -> dict[str, list[PolicyRun]]:
        """Per policy (in the order first run), its runs in live-round order."""
        out: dict[str, list[PolicyRun]] = {}
        for run in sorted(self.runs, key=lambda r: r.live_round):
            out.setdefault(run.policy, []).append(run)
        return out


# --------------------------------------------------------------------------------------------
# Server housekeeping
# --------------------------------------------------------------------------------------------


IDENTIFY_WAIT_S, RESET_WAIT_S, SCRAPE_WAIT_S = 30.0, 30.0, 10.0
"""The longest wait, s, for each request identifying a server, resetting its prefix cache and
scraping its ``/metrics``; ``run_validation`` waits less when the live requests' limit is lower."""


async def probe_servers(urls: list[str], model: str | None = None,
                        timeout_s: float = IDENTIFY_WAIT_S) -> list[ServerInfo]:
    """Identify every server and read its engine settings, each request waiting at most
    ``timeout_s`` (s).

    Raises:
        CalibrationError: a server is unreachable or does not serve ``model``.
    """
    infos = []
    for url in urls:
        async with VllmClient(url, model, timeout_s=timeout_s) as client:
            infos.append(await client.probe())
    return infos


async def reset_prefix_cache(url: str, timeout_s: float = RESET_WAIT_S) -> bool | None:
    """Reset one server's prefix cache; see ``VllmClient.reset_prefix_cache`` for the result.
    ``timeout_s``: limit on each request of the reset (a reset sends two or three), s."""
    async with VllmClient(url, timeout_s=timeout_s) as client:
        return await client.reset_prefix_cache()


async def scrape(urls: list[str], timeout_s: float = SCRAPE_WAIT_S,
                 skip: Collection[int] = ()) -> list[MetricsSnapshot | None]:
    """``/metrics`` of every server; None for a server that does not answer within ``timeout_s``
    (s) and for the servers of ``skip`` (indices into ``urls``, not asked)."""

    async def one(url: str) -> MetricsSnapshot | None:
        if url is None:
            return None
        try:
            async with VllmClient(url, timeout_s=timeout_s) as client:
                return await client.metrics()
        except Exception:  # noqa: BLE001 - a dead server has no metrics; the report says so
            return None

    return list(await asyncio.gather(*(one(None if w in skip else u) for w, u in enumerate(urls))))


# --------------------------------------------------------------------------------------------
# Prediction and measurement
# --------------------------------------------------------------------------------------------


def shared_host_note(profile: Profile, servers: list[ServerInfo]) -> str | None:
    """A note when two or more servers run on one machine (their URLs name the same host; every
    loopback name counts as one) and ``profile`` has no host model (``Profile.host``, fitted from
    ``calibrate measure --bursts``): the simulation then prices each server's steps as if it had
    the machine to itself, and a change between policies on a closed-loop burst can come out with
    the wrong sign (docs/log/2026-12-05-policy-change-sign.md). None otherwise."""
    from collections import Counter
    from urllib.parse import urlsplit

    from kvroute.calibrate.live.server import machine_key

    machines = Counter(machine_key(urlsplit(s.url).hostname or "") for s in servers)
    shared = sum(n for n in machines.values() if n > 1)
    if profile.host is not None or not shared:
        return None
    return (f"{shared} of the {len(servers)} servers share a machine, but "
            f"profile {profile.name!r} has no host model (fitted without bursts): it prices each server's steps as "
            "if that server had the machine to itself, so contention for the cores is not predicted and a change "
            "between policies on a closed-loop burst can come out with the wrong sign (the x2 profile gave -27 % "
            "for a measured +33 to +37 % later-turn TTFT change; docs/log/2026-12-05-policy-change-sign.md). "
            "`kvroute calibrate measure` on these servers fits one (its bursts are on by default)")


def servers_of_another_model(profile, servers) -> list[tuple[int, ServerInfo]]:
    """``(index, server)`` of every server whose model (served name or weights' path) is not the
    one ``profile`` was measured on; empty when the profile names no model."""
    measured_on = profile_model_key(profile)
    return [(i, s) for i, s in enumerate(servers)
            if measured_on and measured_on not in f"{s.model} {s.model_root}".lower()]


def cluster_spec(profile: Profile, servers: list[ServerInfo], spec: ValidationSpec) -> tuple[ClusterSpec, list[str]]:
    """The simulated cluster matching the live one, and notes on what differs between servers.

    The profile's step costs and overheads are kept; its engine settings become server 0's.

    Raises:
        ValueError: servers with different block sizes, or a bad ``max_in_flight``.
    """
    from kvroute.calibrate.calibration.observations import engine_config

    notes = []
    sizes = {s.block_size for s in servers}
    if len(sizes) > 1:
        raise ValueError(f"the servers use different KV block sizes {sorted(sizes)}; "
                         "a router's block hashes need one size")
    engines = [engine_config(s) for s in servers]
    for i, e in enumerate(engines[1:], 1):
        if e != engines[0]:
            notes.append(f"server {i} ({servers[i].url}) has engine settings {e} unlike server 0's "
                         f"{engines[0]}; the simulation uses server 0's for every worker")
    measured_on = profile_model_key(profile)
    others = servers_of_another_model(profile, servers)
    if others and len(others) < len(servers):  # mixed models: the servers differ from each other too
        notes.append(f"profile {profile.name!r} describes model {measured_on!r}, but "
                     + ", ".join(f"server {i} ({s.url}) serves {s.model!r}" for i, s in others)
                     + f": the simulation prices every worker with {measured_on!r}'s step costs, so those servers' "
                       "times are another model's")
    elif others:
        notes.append(f"profile {profile.name!r} describes model {measured_on!r}, but the servers serve "
                     f"{sorted({s.model for s in servers})}: its step costs are another model's "
                     f"(calibrate these servers with `kvroute calibrate` and pass --profile)")
    if profile.engine.block_size != engines[0].block_size:
        notes.append(f"profile {profile.name!r} was measured at block size {profile.engine.block_size}; "
                     f"the servers use {engines[0].block_size}")
    version_note = profile.version_note(servers[0].vllm_version, servers[0].async_scheduling)
    if version_note is not None:
        notes.append(version_note)
    host_note = shared_host_note(profile, servers)
    if host_note is not None:
        notes.append(host_note)
    live_profile = dataclasses.replace(profile, engine=engines[0], memory=None)
    cluster = ClusterSpec(
        live_profile, num_workers=len(servers), closed_loop=spec.closed_loop,
        arrival_spread_s=spec.arrival_spread_s, router_block_tokens=spec.router_block_tokens,
        max_in_flight=spec.max_in_flight, cache_view=spec.cache_view, record_series=spec.record_tokens,
    )
    return cluster, notes


def token_range(servers: list[ServerInfo], override: tuple[int, int] | None) -> tuple[int, int]:
    """Prompt token-id range: ``override``, else the tokenizer's ordinary ids when the model
    directory the server loaded is readable here, else ``DEFAULT_TOKEN_RANGE``."""
    if override is not None:
        return override
    from kvroute.calibrate.calibration.tiny_model import token_id_range

    root = Path(servers[0].model_root)
    if (root / "tokenizer.json").is_file() or (root / "config.json").is_file():
        lo, hi = token_id_range(root)
        return max(lo, 0), hi
    return DEFAULT_TOKEN_RANGE


def with_client_lag(trace: Trace, lag_s: float) -> Trace:
    """``trace`` with ``lag_s`` seconds added to the think time of every record that has a parent.

    Raises:
        ValueError: a negative lag.
    """
    if lag_s < 0:
        raise ValueError(f"client lag must be >= 0 s, got {lag_s}")
    if lag_s == 0:
        return trace
    records = [dataclasses.replace(r, think_time_ms=r.think_time_ms + 1000.0 * lag_s) if r.parent is not None else r
               for r in trace.records]
    return dataclasses.replace(trace, records=records)


def send_lags(run: PolicyRun, trace: Trace, slot_limited: bool = False) -> np.ndarray:
    """Closed loop: per later turn sent live, seconds between its parent's last token and its
    send, beyond the trace's think time and, with ``slot_limited`` (the replay had a
    ``max_in_flight``), its wait for a client slot (``client_wait``, which the simulation models
    itself): the client's own work, building the prompt, encoding it, connecting. The simulation
    sends a turn exactly at its parent's last token plus think time (and a free slot), so this is
    what the live workload adds; empty when there is none. (Replays recorded before 2026-12-05
    10:00 UTC kept the prompt's building in ``client_wait`` too, so without a slot limit it is
    not subtracted.)"""
    if run.live is None:
        return np.array([])
    df = run.live.records.set_index("request_id")
    ok = df[df["status"] == "ok"]
    lags = []
    for rec in trace.records:
        if rec.parent is None or rec.request_id not in ok.index or rec.parent not in ok.index:
            continue
        wait = ok.at[rec.request_id, "client_wait"] if slot_limited and "client_wait" in ok.columns else 0.0
        lags.append(ok.at[rec.request_id, "arrival"] - ok.at[rec.parent, "finish"] - rec.think_time_ms / 1000.0
                    - (0.0 if pd.isna(wait) else float(wait)))
    return np.array(lags, float)


def _send_lags(trace: Trace, runs: list[PolicyRun], slot_limited: bool = False) -> np.ndarray:
    """Every later turn's live send lag over ``runs``, s (:func:`send_lags`)."""
    return np.concatenate([send_lags(r, trace, slot_limited) for r in runs] or [np.zeros(0)])


def _median_lag(lags: np.ndarray) -> float:
    return max(float(np.median(lags)), 0.0) if len(lags) else 0.0


def _root_offsets(trace: Trace, runs: list[PolicyRun]) -> dict[int, float]:
    offsets: dict[int, list[float]] = {}
    roots = {r.request_id: r.timestamp_ms / 1000.0 for r in trace.records if r.parent is None}
    for run in runs:
        if run.live is None:
            continue
        df = run.live.records
        df = df[df["request_id"].isin(roots) & df["arrival"].notna()]
        if df.empty:
            continue
        late = {int(rid): float(a) - roots[int(rid)] for rid, a in zip(df["request_id"], df["arrival"])}
        t0 = min(late.values())
        for rid, x in late.items():
            offsets.setdefault(rid, []).append(x - t0)
    return {rid: float(np.median(v)) for rid, v in offsets.items()}


def measured_lags(trace: Trace, runs: list[PolicyRun], slot_limited: bool = False) -> tuple[float, ...]:
    """Every later turn's live send lag over ``runs`` (seconds from the parent's last token to
    the send, beyond think time; negative values, a clock's rounding, as 0), ascending: the
    empirical sample ``ClusterSpec.client_lag_s`` draws from. Its spread, not only its median,
    decides whether chats whose replies end in one engine step send their next turns together
    (on the CPU reference its quartiles lie milliseconds apart: docs/log/from-code-comments.md).
    ``slot_limited``: as :func:`send_lags`."""
    return _lag_sample(_send_lags(trace, runs, slot_limited))


def _lag_sample(lags: np.ndarray) -> tuple[float, ...]:
    return tuple(sorted(max(float(x), 0.0) for x in lags))


def with_measured_client(trace: Trace, runs: list[PolicyRun],
                         slot_limited: bool = False) -> tuple[Trace, tuple[float, ...], float, dict[int, float]]:
    """The simulation's twin of the live client of ``runs``: each later turn waits a send lag
    drawn from the measured ones (:func:`measured_lags`; set it as ``ClusterSpec.client_lag_s``)
    and each root request is sent at its measured offset (its median delay beyond its trace
    timestamp over the runs, relative to the least delayed root of its run: how long the client
    took to put a burst's roots on the wire). ``slot_limited`` (the replay had a ``max_in_flight``):
    the lags leave out the slot waits (:func:`send_lags`) and the roots keep their trace times, as
    the client's slots, not its speed, spaced them.

    Returns:
        ``(trace, lag sample s, median lag s, root offsets s)``: the trace to simulate, the
        sample for ``ClusterSpec.client_lag_s``, and the figures to report.
    """
    lags = _send_lags(trace, runs, slot_limited)
    offsets = {} if slot_limited else _root_offsets(trace, runs)
    return with_root_offsets(trace, offsets), _lag_sample(lags), _median_lag(lags), offsets


def with_root_offsets(trace: Trace, offsets_s: dict[int, float]) -> Trace:
    """``trace`` with every root request listed in ``offsets_s`` sent that many seconds later."""
    if not offsets_s:
        return trace
    records = [dataclasses.replace(r, timestamp_ms=r.timestamp_ms + 1000.0 * offsets_s[r.request_id])
               if r.parent is None and r.request_id in offsets_s else r for r in trace.records]
    return dataclasses.replace(trace, records=records)


def predict(trace: Trace, cluster: ClusterSpec, policies: list[str], rounds: int, seed: int,
            uncertainty: int = 0, prior_range: float = 0.2) -> list[PolicyRun]:
    """Simulate every policy; one :class:`PolicyRun` each, with ``predicted`` filled in.

    ``predicted`` and ``predicted_interval`` come from the central profile's ``rounds`` runs;
    ``run_values`` holds those runs' values and, with ``uncertainty`` > 0, those of ``rounds``
    runs under each of ``uncertainty`` drawn profiles
    (``kvroute.sim.study.experiment.compare_uncertain``).

    Raises:
        ValueError: as ``kvroute.sim.cluster.cluster.simulate`` (capacity, block sizes, policy names).
    """
    if uncertainty:
        uncertain = compare_uncertain(trace, cluster, policies, uncertainty, rounds, seed, prior_range)
        comparison, extra, source = uncertain.base, uncertain.summaries, f"seeds and model ({uncertain.method})"
    else:
        comparison, extra, source = compare(trace, cluster, policies, rounds=rounds, seed=seed), None, "seeds"
    runs = []
    for p in policies:
        iv = comparison.intervals[p]
        rows = comparison.summaries[comparison.summaries["policy"] == p]
        if extra is not None:
            rows = pd.concat([rows, extra[extra["policy"] == p]], ignore_index=True)
        draws = [-1] * int((comparison.summaries["policy"] == p).sum())
        if extra is not None:
            draws += [int(x) for x in extra.loc[extra["policy"] == p, "draw"]]
        runs.append(PolicyRun(policy=p, predicted={k: float(v) for k, v in iv["mean"].items()},
                              sim_runs=comparison.runs[p],
                              predicted_interval={k: (float(iv.at[k, "low"]), float(iv.at[k, "high"]))
                                                  for k in iv.index},
                              run_values={k: [float(v) for v in rows[k]] for k in iv.index},
                              interval_source=source, run_draws=draws))
    return runs


SILENT_BEFORE_THE_RUN = "did not answer before the run"
"""How :func:`measure` ends the reason of a worker it marks dead before the replay starts."""


async def measure(run: PolicyRun, replay: LiveReplay, urls: list[str], timeout_s: float = 600.0) -> None:
    """Reset caches, scrape, replay, scrape: fills ``run``'s live fields (not ``measured``).

    A server that answers neither the reset nor ``/metrics`` (it died in an earlier run) starts
    the replay marked dead, and is not scraped after it. ``timeout_s`` (the live requests' limit,
    s) also bounds each reset request (at most :data:`RESET_WAIT_S`) and scrape (at most
    :data:`SCRAPE_WAIT_S`), so a stopped server costs a run about twice ``timeout_s``.
    Cancellation (Ctrl-C) propagates after the replay recorded what it had.
    """
    reset_s, scrape_s = min(RESET_WAIT_S, timeout_s), min(SCRAPE_WAIT_S, timeout_s)
    run.cache_reset = list(await asyncio.gather(*(reset_prefix_cache(u, reset_s) for u in urls)))
    run.before = await scrape(urls, scrape_s)
    silent = [w for w, (reset, snap) in enumerate(zip(run.cache_reset, run.before)) if reset is None and snap is None]
    for w in silent:
        replay.mark_dead(w, f"{urls[w]} {SILENT_BEFORE_THE_RUN}")
    await replay.run()
    run.after = await settled_scrape(urls, run.before, _finished_per_server(replay, len(urls)),
                                     scrape_s=scrape_s, skip=silent)


def _finished_per_server(replay: LiveReplay, num_servers: int) -> list[int]:
    """Per server, the requests of the replay that got their last token (vLLM records their
    histograms once they finish)."""
    counts = [0] * num_servers
    for rec in replay.records:
        if rec.error is None and rec.finish is not None and 0 <= rec.worker < num_servers:
            counts[rec.worker] += 1
    return counts


async def settled_scrape(urls: list[str], before: list[MetricsSnapshot | None], finished: list[int],
                         timeout_s: float = 2.0, scrape_s: float = SCRAPE_WAIT_S,
                         skip: Collection[int] = ()) -> list[MetricsSnapshot | None]:
    """``/metrics`` of every server but those of ``skip`` (:func:`scrape`), scraped again (up to
    ``timeout_s``, each scrape up to ``scrape_s``) until each server's request histograms count
    the ``finished`` requests sent to it since ``before``: the API server records a request's
    times just after streaming its last token, so a scrape at once can miss the last ones."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        after = await scrape(urls, scrape_s, skip)
        short = [a.delta(b, COUNTED) < n for a, b, n in zip(after, before, finished)
                 if a is not None and b is not None and math.isfinite(a.delta(b, COUNTED))]
        if not any(short) or loop.time() > deadline:
            return after
        await asyncio.sleep(0.01)


def finish_run(run: PolicyRun, replay: LiveReplay, stamps: list[str] | None = None) -> None:
    """Collect the replay's records into ``run`` and summarise them. ``stamps``: per server, what
    its KV-event stamps mark (``vllm_versions.kv_event_stamp``): early ones are moved to the end of
    the prefill step (``live_stamps.correct_live_stamps``)."""
    run.live = replay.result()
    if replay.kv_events is not None and stamps:
        from kvroute.calibrate.validation.live_stamps import correct_live_stamps

        run.stamp_correction = correct_live_stamps(
            run, [replay.kv_batch_times(w) for w in range(len(replay.endpoints))], stamps)
    n = len(replay.endpoints)
    hits, queries, pre = (run.measured_counter(name, n) for name in (HITS, QUERIES, PREEMPTIONS))
    run.live.workers["prefix_cache_hits"] = hits
    run.live.workers["prefix_cache_queries"] = queries
    run.live.workers["num_preemptions"] = pre
    run.measured = summarize(run.live)
    if not (run.live.records["status"] == "ok").any():  # nothing served: no value measured, none compared
        run.measured = {k: (x if k == "failed" else math.nan) for k, x in run.measured.items()}
    run.dead = dict(replay.dead)
    run.interrupted = run.interrupted or replay.interrupted
    run.elapsed_s = replay.elapsed_s
    run.client_cpu_s, run.client_cpu = replay.client_cpu_s, replay.client_cpu
    run.usage_reported = replay.usage_reported


def run_validation(
    trace: Trace,
    profile: Profile,
    spec: ValidationSpec,
    progress: Callable[[str], None] = lambda msg: None,
) -> Validation:
    """Measure every policy of ``spec`` on ``trace`` in ``spec.live_rounds`` interleaved live
    rounds, and predict each policy once.

    Args:
        trace: the requests.
        profile: the workers' profile (step costs and overheads; engine settings come from the
            servers).
        spec: servers, policies and replay mode.
        progress: called with one-line progress messages.

    Returns:
        The validation; on Ctrl-C during a live run, what was measured so far with
        ``interrupted`` set (the interrupted run is included, later rounds are not run). A
        server that died in one run starts the later ones marked dead.

    Raises:
        CalibrationError: a server is unreachable at the start.
        ValueError: the trace cannot run on these servers (block size, capacity), a policy
            name is unknown, or ``spec.live_rounds`` < 1.
    """
    if not spec.urls:
        raise ValueError("give at least one server URL")
    if spec.live_rounds < 1:
        raise ValueError(f"live rounds must be >= 1, got {spec.live_rounds}")
    urls = list(spec.urls)
    servers = asyncio.run(probe_servers(urls, spec.model, min(IDENTIFY_WAIT_S, spec.timeout_s)))
    cluster, notes = cluster_spec(profile, servers, spec)
    validation = Validation(trace, spec, servers, cluster, notes=notes)
    for s in servers:
        if s.unmodeled:
            validation.notes.append(unmodeled_note(s.url, s.unmodeled, "the predictions leave it out"))
    if not all(s.dev_mode for s in servers):
        validation.notes.append("some server runs without VLLM_SERVER_DEV_MODE=1; its prefix cache "
                                "cannot be reset, so its runs may start warm, and its serving features cannot be "
                                "read, so none that kvroute does not model is named")
    measured_lag = spec.client_lag_s is None
    rescale = spec.speed_probes > 0 and spec.speed_scale and not spec.probe_reference
    if not measured_lag and not rescale:
        progress(f"simulating {len(spec.policies)} policies x {spec.sim_rounds} rounds")
        predictions = predict(with_client_lag(trace, spec.client_lag_s), cluster, list(spec.policies),
                              spec.sim_rounds, spec.seed, spec.uncertainty, spec.prior_range)
        validation.client_lag_s = spec.client_lag_s
    lo, hi = token_range(servers, spec.token_range)
    endpoints = [Endpoint(s.url, s.model) for s in servers]
    stamps = [kv_event_stamp(getattr(s, "vllm_version", None), getattr(s, "async_scheduling", None))
              for s in servers]  # what each server's KV-event ts marks (live_stamps.correct_live_stamps)
    if spec.speed_probes > 0:
        validation.probes["before"] = _probe(urls, spec, progress, "before the live rounds")
    engine = cluster.profile.engine
    started = time.monotonic()  # for the time left, in the progress lines
    for live_round, k in ((r, k) for r in range(spec.live_rounds) for k in range(len(spec.policies))):
        run = PolicyRun(policy=spec.policies[k], predicted={}, sim_runs=[], live_round=live_round)
        if not measured_lag and not rescale:
            run.take_prediction(predictions[k])
        replay_spec = ReplaySpec(run.policy, spec.closed_loop, spec.max_in_flight, spec.router_block_tokens,
                                 spec.timeout_s, spec.seed, cache_view=spec.cache_view,
                                 kv_event_endpoints=spec.kv_event_endpoints, record_tokens=spec.record_tokens)
        replay = LiveReplay(trace, endpoints, engine.block_size, replay_spec, TokenSynth(lo, hi, spec.seed),
                            engine.max_model_len)
        validation.runs.append(run)
        runs_done, runs = live_round * len(spec.policies) + k, spec.live_rounds * len(spec.policies)
        progress(f"replaying {len(trace.records)} requests live with {run.policy}"
                 + (f" (live round {live_round + 1} of {spec.live_rounds})" if spec.live_rounds > 1 else "")
                 + f": live run {runs_done + 1} of {runs}"
                 + (f", about {_left(time.monotonic() - started, runs_done, runs)} left" if runs_done else ""))
        try:
            asyncio.run(measure(run, replay, urls, spec.timeout_s))
        except KeyboardInterrupt:
            validation.interrupted = run.interrupted = True
            run.after = _scrape_quietly(urls)
        finally:
            finish_run(run, replay, stamps)
            if replay.events_problem:
                validation.notes.append(f"{run.policy}: {replay.events_problem}; its live records have no engine "
                                        "first-token times")
            validation.notes.extend(f"{run.policy}: {loss}" for loss in replay.events_losses)
            if replay.no_token_ids_note:
                validation.notes.append(f"{run.policy}: {replay.no_token_ids_note}")
            if replay.warnings:
                validation.notes.append(f"{run.policy}: {len(replay.warnings)} streams disagreed with their "
                                        f"usage on the token count (the usage count is used); first: "
                                        f"{replay.warnings[0]}")
        if run.predicted:
            progress(f"{run.policy}: {run.measured['time_to_complete_s']:.2f} s measured, "
                     f"{run.predicted['time_to_complete_s']:.2f} s predicted")
        if validation.interrupted:
            break
    during_rounds = validation.interrupted
    try:
        _after_live_rounds(validation, trace, urls, spec, cluster, rescale, measured_lag, progress)
    except KeyboardInterrupt:
        validation.interrupted = True
    validation.predicted = all(run.sim_runs for run in validation.runs)
    if not validation.predicted:
        validation.notes.append("interrupted before the prediction was made: the live measurements are kept "
                                "without one")
    elif validation.interrupted and not during_rounds:
        validation.notes.append("interrupted after the live rounds")
    return validation


def _after_live_rounds(validation: Validation, trace: Trace, urls: list[str], spec: ValidationSpec,
                       cluster: ClusterSpec, rescale: bool, measured_lag: bool,
                       progress: Callable[[str], None]) -> None:
    """What follows the live rounds: the speed probe after them (with the profile rescaled to
    the probes' speed and the host's drift) and, where it waits for them (a measured client lag,
    a rescaled profile), the prediction of every run; then the profile's run note."""
    if spec.speed_probes > 0 and not validation.interrupted:
        before = f"speed probe before the live rounds: {probe_text(validation.probes['before'])}"
        try:
            validation.probes["after"] = _probe(urls, spec, progress, "after the live rounds")
            validation.notes.append(f"{before}; after them: {probe_text(validation.probes['after'])}")
        except CalibrationError as exc:  # a server lost in the rounds: the measurements stand without it
            validation.notes.append(
                f"{before}; the one after them failed ({exc}), so "
                + ("the profile is rescaled to the probe before them alone and " if rescale else "")
                + "the host's drift is not measured (the intervals hold none)")
            progress(f"warning: {validation.notes[-1]}")
        if rescale:
            validation.speed_scale = speed_scale(cluster, validation.probes.get("before"), validation.probes.get("after"))
            cluster = dataclasses.replace(cluster, profile=scaled_profile(cluster.profile, validation.speed_scale))
            validation.sim_spec = cluster
            validation.notes.append(f"predicted with the profile rescaled to the host's speed the probes measured: "
                                    f"{validation.speed_scale.describe()}")
            progress(validation.notes[-1])
        validation.drift, reference, _ = drifts_against(validation.probes.get("before"), validation.probes.get("after"),
                                                        cluster, spec.probe_reference, spec.speed_probes, spec.seed)
        if not spec.probe_reference and reference is not None:
            validation.probes["predicted"] = reference
    if rescale and not measured_lag and not validation.interrupted:
        progress(f"simulating {len(spec.policies)} policies x {spec.sim_rounds} rounds")
        predictions = predict(with_client_lag(trace, spec.client_lag_s), cluster, list(spec.policies),
                              spec.sim_rounds, spec.seed, spec.uncertainty, spec.prior_range)
        validation.client_lag_s = spec.client_lag_s
        for run in validation.runs:
            run.take_prediction(predictions[spec.policies.index(run.policy)])
    if measured_lag:
        sim_trace, lags, lag, offsets = with_measured_client(trace, validation.runs,
                                                             slot_limited=spec.max_in_flight is not None)
        lagged = dataclasses.replace(cluster, client_lag_s=lags)
        validation.client_lag_s, validation.root_offsets_s = lag, offsets
        progress(f"simulating {len(spec.policies)} policies x {spec.sim_rounds} rounds with the measured client "
                 f"lags ({len(lags)} drawn from, median {1000 * lag:.1f} ms) and root send offsets "
                 f"up to {1000 * max(offsets.values(), default=0.0):.1f} ms"
                 + ("; Ctrl-C again keeps the measurements without it" if validation.interrupted else ""))
        predictions = predict(sim_trace, lagged, list(spec.policies), spec.sim_rounds, spec.seed,
                              spec.uncertainty, spec.prior_range)
        for run in validation.runs:
            run.take_prediction(predictions[spec.policies.index(run.policy)])
    simulated = [r.records for run in validation.runs for r in run.sim_runs]
    if simulated:
        note = run_note(cluster.profile, simulated)
        if note:
            validation.notes.append(note.removeprefix("Note: "))


def _probe(urls: list[str], spec: ValidationSpec, progress: Callable[[str], None], when: str) -> dict:
    """A speed probe of ``spec.speed_probes`` requests per server (``probe.probe_samples``)."""
    from kvroute.calibrate.validation.probe import probe_samples

    samples = asyncio.run(probe_samples(urls, spec.seed, spec.speed_probes, spec.model, progress,
                                        timeout_s=spec.timeout_s))
    progress(f"speed probe {when}: {probe_text(samples)}")
    return samples


def probe_text(samples: dict[str, list[float]]) -> str:
    """A probe's median TTFT and ITL one at a time and in the burst, in words (ms)."""
    from kvroute.calibrate.validation.probe import median

    mid = median(samples)
    return (f"TTFT {1000 * mid['ttft_s']:.1f} ms, ITL {1000 * mid['itl_s']:.2f} ms one at a time; TTFT "
            f"{1000 * mid['burst_ttft_s']:.1f} ms, ITL {1000 * mid['burst_itl_s']:.2f} ms in the burst (medians)")


def _left(elapsed_s: float, done: int, total: int) -> str:
    """The time the ``total - done`` runs left take at the pace of the ``done`` so far, in words."""
    left = elapsed_s / done * (total - done)
    return f"{left:.0f} s" if left < 90 else f"{left / 60:.0f} min"


def _scrape_quietly(urls: list[str]) -> list[MetricsSnapshot | None]:
    try:
        return asyncio.run(scrape(urls))
    except (KeyboardInterrupt, CalibrationError, OSError):
        return [None] * len(urls)
