"""The calibration sweeps against live vLLM servers; raw rows go to disk as they arrive.

Experiments (every prompt is a list of token ids, so prefix sharing is exact):

- ``cold``: a unique prompt of L tokens, ``max_tokens`` 1, alone on an idle engine: TTFT.
- ``cached``: a unique prompt of P tokens (the *warm* request, itself a cold measurement), then
  the same P tokens plus N new ones: TTFT with a cached prefix of known length.
- ``decode``: B requests at once, each a distinct cached context plus one new block (context L),
  ``max_tokens`` T: per-token arrival times from the streams (and the server's inter-token
  latency histogram) give the decode step time.
- ``mixed``: B requests decoding; when each has streamed a few tokens, a cold prompt of P
  tokens arrives: the decode streams' gap around its first token is the mixed step.
- ``burst`` / ``burst_all`` (the concurrency sweep, spread through the others in
  ``burst_slots`` slots: :func:`sweep_schedule`): N cold prompts of one
  shape (L prompt tokens, T output tokens) sent at once to one server (``burst``), or N to every
  server at once (``burst_all``), N = 1..64; then N prompts that share a prefix of P tokens,
  cached on the server by one request first, each with its own new tokens (``prefix_len`` P in
  the rows): several prefills on a cached prefix in one engine step, as a closed-loop chat's
  turns arrive at a server together. Each request's send time is recorded as the client
  really sent it (its send lag under load is measured, not assumed); ``/metrics`` brackets every
  server, so the burst's mean engine queue and prefill times sit beside the client's timings.
  These load the API server and the host as a real burst does (``kvroute.sim.timing.frontend``).

Sequential requests are bracketed by ``/metrics`` scrapes, so the server's own histograms
(``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
``vllm:inter_token_latency_seconds``) separate engine time from API-server overhead. With the
servers' KV-cache event feeds (``kv_events``), every request is also timed at the end of the
engine step that finished its prefill (``engine_first_token_s``, from the batch that stored its
last full prompt block: :class:`kvroute.calibrate.live.kv_events.LiveKVEvents`), which splits
that overhead into the part before the engine and the part after it; ``engine_next_batch_s`` is
the server's next batch, which dates the following step where a release stamps early
(``calibrate fit`` corrects that: ``kvroute.calibrate.calibration.step_end``).

Files in the output directory: ``meta.json`` (plan, servers' settings, status), ``requests.csv``
(one row per request, appended and flushed as each finishes, token arrival times included) and
``experiments.csv`` (one row per experiment with the engine-side metrics); Parquet copies of both
when the sweep ends, however it ends.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvroute.calibrate.calibration.prompt_factory import PromptFactory
from kvroute.calibrate.calibration.sweep_files import (EXPERIMENT_COLUMNS, REQUEST_COLUMNS, RowWriter, check_no_sweep,
                                                      to_parquet)
from kvroute.calibrate.calibration.sweep_plan import SweepPlan, sweep_schedule
from kvroute.calibrate.live.client import (CalibrationError, MetricsSnapshot, ServerInfo, StreamResult, VllmClient,
                                           kv_blocks_alike)
from kvroute.calibrate.live.prompts import chained_block_hashes
from kvroute.calibrate.live.server_features import unmodeled_note

# --------------------------------------------------------------------------------------------
# One server's sweep
# --------------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    client: VllmClient
    info: ServerInfo
    factory: PromptFactory
    requests: RowWriter
    experiments: RowWriter
    t0: float
    metrics_ok: bool = True
    errors: list[str] = field(default_factory=list)
    scrape_cpu_s: float | None = None  # the API process's CPU seconds per /metrics scrape
    worker: int = 0  # this server's index in the sweep's URLs (and KV-event feeds)
    events: Any = None  # LiveKVEvents of every server, or None


def check_alike(infos: list[ServerInfo]) -> None:
    """Refuse servers that one calibration cannot pool: a different model, vLLM release,
    scheduling, block size or batch limits, or KV caches more than ``client.KV_BLOCKS_TOLERANCE`` apart.

    Raises:
        CalibrationError: naming the setting and both servers.
    """
    keys = ("model_root", "vllm_version", "async_scheduling", "block_size", "max_num_batched_tokens",
            "max_num_seqs", "max_model_len")
    for i in infos[1:]:
        diff = [k for k in keys if getattr(i, k) != getattr(infos[0], k)]
        if diff:
            raise CalibrationError(
                f"servers differ in {', '.join(diff)} ({infos[0].url} vs {i.url}); calibrate identical "
                f"workers together and different ones separately"
            )
        blocks = (infos[0].num_gpu_blocks, i.num_gpu_blocks)
        if not kv_blocks_alike(*blocks):
            raise CalibrationError(
                f"servers differ in KV cache: {blocks[0]} blocks at {infos[0].url}, {blocks[1]} at {i.url} (a "
                "profile has one count per worker); servers sharing a GPU must start one after another "
                "(`kvroute serve` does), or be given the same --kv-cache-memory-bytes"
            )


EVENT_WAIT_S = 0.005
"""How long a request alone waits after its stream before its row is written, when the sweep
reads KV events: the engine publishes the step's batch before it hands the outputs on, but our
subscriber reads it in its turn (without the wait, 30 % of the rows of the 2-core reference's
requests alone went untimed)."""

SCRAPES_TIMED = 10
"""Back-to-back ``/metrics`` scrapes whose CPU cost is averaged (``process_cpu_seconds_total``
moves in 10 ms ticks; a scrape of vLLM's page costs about that much)."""


async def _scrape_cpu(ctx: _Ctx) -> float:
    """CPU seconds the server's API process spends per ``/metrics`` scrape, measured once per
    server (NaN when it does not export ``process_cpu_seconds_total``)."""
    if ctx.scrape_cpu_s is None:
        # each reading is taken while its own scrape runs, so SCRAPES_TIMED scrapes' work lies
        # between the first reading and the last (half of each end scrape, all of those between)
        first = await ctx.client.metrics()
        for _ in range(SCRAPES_TIMED - 1):
            await ctx.client.metrics()
        last = await ctx.client.metrics()
        ctx.scrape_cpu_s = last.delta(first, "process_cpu_seconds_total") / SCRAPES_TIMED
    return ctx.scrape_cpu_s


async def _settle(ctx: _Ctx, before: MetricsSnapshot, name: str, count: float, timeout_s: float = 2.0) -> MetricsSnapshot:
    """Scrape ``/metrics`` until ``name``'s count grew by ``count`` (the server records a request's
    histograms just after its last token goes out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        snap = await ctx.client.metrics()
        if snap.delta(before, name) >= count or loop.time() > deadline or math.isnan(snap.get(name)):
            return snap
        await asyncio.sleep(0.005)


def _times(res: StreamResult) -> str:
    return " ".join(f"{t:.6f}" for t in res.token_times)


def engine_first_token(ctx: _Ctx, prompt: Sequence[int], res: StreamResult) -> float:
    """When the engine step that finished ``prompt``'s prefill ended, s after the request was
    sent: the publish time of the KV-event batch of this server that stored the prompt's last
    full block, less the send time (``time.perf_counter()``, brought onto the wall clock now).

    What the stamp marks depends on the server's release (``meta.json``'s ``kv_events.stamp``):
    ``calibrate fit`` moves an early one to the step's end (``kvroute.calibrate.calibration.
    step_end``), with the next batch's time (:func:`engine_stamps`) among its estimates.

    Returns:
        Seconds in ``[0, ttft]``; NaN without KV events, for a failed request or a prompt shorter
        than one block, or when no batch stored that block between the send and the first token
        (its blocks were all cache hits, or the event was missed).
    """
    return engine_stamps(ctx, prompt, res)[0]


def engine_stamps(ctx: _Ctx, prompt: Sequence[int], res: StreamResult) -> tuple[float, float]:
    """``(engine_first_token_s, engine_next_batch_s)``: :func:`engine_first_token` and the stamp of
    this server's next KV-event batch after it (seen by now), both s after the send; NaN where
    unknown (the next one also when the first is)."""
    bs = ctx.info.block_size
    full = len(prompt) // bs
    if ctx.events is None or res.error is not None or full == 0 or not math.isfinite(res.ttft):
        return math.nan, math.nan
    ts = ctx.events.stored_at(ctx.worker, chained_block_hashes(prompt[: full * bs], bs)[-1])
    if ts is None:
        return math.nan, math.nan
    sent = res.t_send + time.time() - time.perf_counter()
    t = ts - sent
    if not 0.0 <= t <= res.ttft:
        return math.nan, math.nan
    following = ctx.events.next_batch(ctx.worker, ts) if hasattr(ctx.events, "next_batch") else None
    return t, (following - sent if following is not None else math.nan)


def cached_tokens(info: ServerInfo, res: StreamResult) -> int | None:
    """The request's cached prompt tokens: the usage block's, or 0 when the server is known to
    report them (``info.reports_cached_tokens``) and left the field out, as vLLM through 0.23 does
    for a zero hit (``if self.enable_prompt_tokens_details and num_cached_tokens``,
    ``entrypoints/openai/serving_completion.py``); None when unknown or the request failed."""
    if res.cached_tokens is not None or res.error is not None or res.prompt_tokens is None:
        return res.cached_tokens
    return 0 if getattr(info, "reports_cached_tokens", None) else None


def _request_row(ctx: _Ctx, exp: dict, role: str, res: StreamResult, prompt: Sequence[int], prefix_len: int,
                 max_tokens: int, expected_cached: int, batch: int = 1) -> dict[str, Any]:
    return dict(
        url=ctx.info.url, exp_id=exp["exp_id"], kind=exp["kind"], role=role, rep=exp["rep"], batch=batch,
        prompt_len=len(prompt), prefix_len=prefix_len, max_tokens=max_tokens,
        t_send_s=round(res.t_send - ctx.t0, 6), ttft_s=res.ttft, t_done_s=res.t_done,
        n_tokens=res.num_tokens, prompt_tokens=res.prompt_tokens, cached_tokens=cached_tokens(ctx.info, res),
        expected_cached=expected_cached, error=res.error, warning=res.warning, token_times=_times(res),
        **dict(zip(("engine_first_token_s", "engine_next_batch_s"), engine_stamps(ctx, prompt, res))),
    )


async def _sequential(ctx: _Ctx, exp: dict, role: str, prompt: list[int], prefix_len: int,
                      expected_cached: int, bracket: bool = True) -> StreamResult:
    """One request alone on the engine, bracketed by metrics scrapes (when ``bracket``); its row
    is written."""
    before = await ctx.client.metrics() if ctx.metrics_ok and bracket else None
    res = await ctx.client.complete(prompt, 1)
    if ctx.events is not None:
        await asyncio.sleep(EVENT_WAIT_S)  # its KV-event batch may still be on its way
    row = _request_row(ctx, exp, role, res, prompt, prefix_len, 1, expected_cached)
    if before is not None and res.error is None:
        after = await _settle(ctx, before, "vllm:request_prefill_time_seconds_count", 1)
        n = after.delta(before, "vllm:request_prefill_time_seconds_count")
        if n == 1:
            row["engine_prefill_s"] = after.delta(before, "vllm:request_prefill_time_seconds_sum")
            row["engine_queue_s"] = after.delta(before, "vllm:request_queue_time_seconds_sum")
            row["engine_ttft_s"] = after.delta(before, "vllm:time_to_first_token_seconds_sum")
            row["overhead_s"] = res.ttft - row["engine_prefill_s"] - row["engine_queue_s"]
        elif math.isnan(n):
            ctx.metrics_ok = False
    ctx.requests.write(row)
    _check(ctx, res, len(prompt))
    return res


def _check(ctx: _Ctx, res: StreamResult, prompt_len: int) -> None:
    if res.error is not None:
        if "maximum context length" in res.error or "max_model_len" in res.error:
            raise CalibrationError(
                f"the server at {ctx.info.url} rejected a {prompt_len}-token prompt: {res.error} "
                f"(max_model_len {ctx.info.max_model_len}); measured rows are kept"
            )
        raise CalibrationError(f"the server at {ctx.info.url} answered HTTP {res.status}: {res.error}")


async def _cold(ctx: _Ctx, exp: dict) -> None:
    await _sequential(ctx, exp, "cold", ctx.factory.unique(exp["prompt_len"]), 0, 0)


async def _cached(ctx: _Ctx, exp: dict) -> None:
    bs = ctx.info.block_size
    P = max(bs, exp["prefix_len"] // bs * bs)
    warm = ctx.factory.unique(P)
    await _sequential(ctx, exp, "warm", warm, 0, 0)
    prompt = warm + ctx.factory.tail(exp["new_len"])
    expected = min(P // bs, (len(prompt) - 1) // bs) * bs
    await _sequential(ctx, exp, "cached", prompt, P, expected)


def _start_streams(ctx: _Ctx, prompts: list[list[int]], max_tokens: int,
                   events: list[asyncio.Event] | None = None, lead: int = 0) -> list[asyncio.Task]:
    """Start one streaming request per prompt; ``events[i]`` is set once stream i has ``lead``
    tokens."""
    def cb(i):
        def on_token(n):
            if events is not None and n >= lead and not events[i].is_set():
                events[i].set()
        return on_token

    tasks = [asyncio.create_task(ctx.client.complete(p, max_tokens, cb(i))) for i, p in enumerate(prompts)]
    if events is not None:
        for task, event in zip(tasks, events):
            task.add_done_callback(lambda _t, e=event: e.set())  # a failed stream must not stall the wait
    return tasks


async def _decode_like(ctx: _Ctx, exp: dict, context_len: int, batch: int, max_tokens: int,
                       prefill_len: int | None, lead: int) -> None:
    bs = ctx.info.block_size
    L = max(2 * bs, context_len // bs * bs)
    # Distinct contexts, each cached first by a request of its own (so the batch starts decoding
    # at once, each request computing one new block): requests sharing one prefix would read the
    # same KV blocks, which caches (a CPU's L3, a GPU's L2) serve faster than real batches of
    # different conversations.
    prompts = []
    for i in range(batch):
        prefix = ctx.factory.unique(L - bs)
        await _sequential(ctx, exp, "warm" if i == 0 else "context", prefix, 0, 0, bracket=i == 0)
        prompts.append(prefix + ctx.factory.tail(bs))
    before = await ctx.client.metrics() if ctx.metrics_ok else None
    t_start = time.perf_counter() - ctx.t0
    events = [asyncio.Event() for _ in prompts] if prefill_len else None
    tasks = _start_streams(ctx, prompts, max_tokens, events, lead)
    pf_res = None
    try:
        if prefill_len:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=ctx.client.timeout_s)
            pf_prompt = ctx.factory.unique(prefill_len)
            pf_before = await ctx.client.metrics() if ctx.metrics_ok else None
            pf_res = await ctx.client.complete(pf_prompt, 1)
            pf_row = _request_row(ctx, exp, "prefill", pf_res, pf_prompt, 0, 1, 0, batch)
            if pf_before is not None and pf_res.error is None:
                # the decodes are far from done, so the one new prefill-time sample is this prompt's:
                # the engine time of the mixed step(s), from scheduling to its first token
                after = await _settle(ctx, pf_before, "vllm:request_prefill_time_seconds_count", 1)
                if after.delta(pf_before, "vllm:request_prefill_time_seconds_count") == 1:
                    pf_row["engine_prefill_s"] = after.delta(pf_before, "vllm:request_prefill_time_seconds_sum")
                    pf_row["engine_queue_s"] = after.delta(pf_before, "vllm:request_queue_time_seconds_sum")
            ctx.requests.write(pf_row)
        results = await asyncio.gather(*tasks)
    except BaseException:
        await _cancel_all(tasks)
        raise
    t_end = time.perf_counter() - ctx.t0
    expected = (L - bs)
    for prompt, res in zip(prompts, results):
        ctx.requests.write(_request_row(ctx, exp, "decode", res, prompt, L - bs, max_tokens, expected, batch))
    erow = dict(url=ctx.info.url, exp_id=exp["exp_id"], kind=exp["kind"], rep=exp["rep"], batch=batch,
                context_len=L, prefix_len=L - bs, prefill_len=prefill_len, max_tokens=max_tokens,
                t_start_s=t_start, t_end_s=t_end)
    if before is not None:
        n_req = batch + (1 if prefill_len else 0)
        after = await _settle(ctx, before, "vllm:e2e_request_latency_seconds_count", n_req)
        cnt = after.delta(before, "vllm:inter_token_latency_seconds_count")
        if cnt > 0:
            erow["itl_engine_s"] = after.delta(before, "vllm:inter_token_latency_seconds_sum") / cnt
            erow["itl_engine_count"] = cnt
    errs = [r.error for r in results if r.error] + ([pf_res.error] if pf_res is not None and pf_res.error else [])
    erow["error"] = errs[0] if errs else None
    ctx.experiments.write(erow)
    for res in results:
        _check(ctx, res, L)
    if pf_res is not None:
        _check(ctx, pf_res, prefill_len)


async def _decode(ctx: _Ctx, exp: dict, plan: SweepPlan) -> None:
    await _decode_like(ctx, exp, exp["context_len"], exp["batch"], plan.decode_tokens, None, 0)


async def _mixed(ctx: _Ctx, exp: dict, plan: SweepPlan) -> None:
    await _decode_like(ctx, exp, plan.mixed_context, exp["batch"], plan.mixed_tokens, exp["prefill_len"],
                       plan.mixed_lead)


async def _burst(ctxs: list[_Ctx], exp: dict) -> None:
    """N requests of one shape sent at once to one server (``burst``) or to each (``burst_all``);
    every request's row and one experiment row per server (engine means and the API process's
    CPU seconds, ``api_cpu_s``, from ``/metrics``).
    With a ``prefix_len`` P > 0 the N prompts of a server share its P-token prefix, which one
    request (row role ``burst_warm``) has cached there before the burst."""
    targets = [ctxs[exp["server"]]] if exp["kind"] == "burst" else ctxs
    N, L, T, P = exp["batch"], exp["prompt_len"], exp["max_tokens"], exp.get("prefix_len", 0)
    if P:
        prompts = []
        for ctx in targets:
            prefix = ctx.factory.unique(P)
            await _sequential(ctx, exp, "burst_warm", prefix, 0, 0, bracket=False)
            prompts.append([prefix + ctx.factory.tail(L - P) for _ in range(N)])
    else:
        prompts = [[ctx.factory.unique(L) for _ in range(N)] for ctx in targets]
    scrape_cpu = [await _scrape_cpu(ctx) if ctx.metrics_ok else math.nan for ctx in targets]
    befores = [await ctx.client.metrics() if ctx.metrics_ok else None for ctx in targets]
    scrapes = [ctx.client.num_scrapes for ctx in targets]
    t_start = time.perf_counter() - targets[0].t0
    tasks = [[asyncio.create_task(ctx.client.complete(p, T)) for p in ps] for ctx, ps in zip(targets, prompts)]
    try:
        results = [await asyncio.gather(*ts) for ts in tasks]
    except BaseException:
        await _cancel_all([t for ts in tasks for t in ts])
        raise
    t_end = time.perf_counter() - targets[0].t0
    for ctx, before, ps, res_list, cost, scraped in zip(targets, befores, prompts, results, scrape_cpu, scrapes):
        for prompt, res in zip(ps, res_list):
            ctx.requests.write(_request_row(ctx, exp, "burst", res, prompt, P, T, P // ctx.info.block_size
                                            * ctx.info.block_size, N))
        erow = dict(url=ctx.info.url, exp_id=exp["exp_id"], kind=exp["kind"], rep=exp["rep"], batch=N,
                    context_len=L, prefill_len=L - P, max_tokens=T, t_start_s=t_start, t_end_s=t_end,
                    **({"prefix_len": P} if P else {}))
        if before is not None:
            after = await _settle(ctx, before, "vllm:e2e_request_latency_seconds_count", N)
            n = after.delta(before, "vllm:request_queue_time_seconds_count")
            if n > 0:
                erow["engine_count"] = n
                erow["engine_queue_s"] = after.delta(before, "vllm:request_queue_time_seconds_sum") / n
                erow["engine_prefill_s"] = after.delta(before, "vllm:request_prefill_time_seconds_sum") / n
            cnt = after.delta(before, "vllm:inter_token_latency_seconds_count")
            if cnt > 0:
                erow["itl_engine_s"] = after.delta(before, "vllm:inter_token_latency_seconds_sum") / cnt
                erow["itl_engine_count"] = cnt
            # CPU seconds of the server's API process over the burst (prometheus_client's process
            # collector, exported by vLLM's API server when it runs one API process), less the
            # scrapes taken after ``before`` (the settling ones)
            cpu = after.delta(before, "process_cpu_seconds_total")
            if math.isfinite(cpu) and math.isfinite(cost):
                erow["api_cpu_s"] = cpu - (ctx.client.num_scrapes - scraped) * cost
                erow["scrape_cpu_s"] = cost
        errs = [r.error for r in res_list if r.error]
        erow["error"] = errs[0] if errs else None
        ctx.experiments.write(erow)
    # every server's rows are written before a failed request stops the sweep
    for ctx, res_list in zip(targets, results):
        for res in res_list:
            _check(ctx, res, L)


async def probe_server(client: VllmClient, factory: PromptFactory, plan: SweepPlan | None = None) -> ServerInfo:
    """Identify a server, check that ``plan`` fits it, and that prefix caching works (a repeated
    two-block prompt must hit the cache).

    Raises:
        CalibrationError: unreachable, wrong model, a plan that does not fit, prefix caching
            off (detected from ``vllm:cache_config_info`` or from the repeated prompt), or no way
            to count the repeated prompt's hits (no ``cached_tokens`` in the responses and no
            ``vllm:prefix_cache_hits_total`` in ``/metrics``).
    """
    info = await client.probe()
    if plan is not None:
        plan.check_fits(info)
    if not info.enable_prefix_caching:
        raise CalibrationError(
            f"prefix caching is off on the server at {info.url} (vllm:cache_config_info "
            f"enable_prefix_caching=False); restart it without --no-enable-prefix-caching: the "
            f"cached-prefix sweep and kvroute's worker model need it"
        )
    prompt = factory.unique(2 * info.block_size + 1)
    before = await client.metrics()
    first = await client.complete(prompt, 1)
    second = await client.complete(prompt, 1)
    for r in (first, second):
        if r.error:
            raise CalibrationError(f"the server at {info.url} rejected a probe request: {r.error}")
    after = await client.metrics()
    hits = second.cached_tokens
    # NOTE: through vLLM 0.23 a zero hit leaves the field out (``and num_cached_tokens``), so the
    # first, cold request of a server that reports hits may lack it; the second must carry it.
    info = replace(info, reports_cached_tokens=hits is not None)
    if hits is None:
        hits = after.delta(before, "vllm:prefix_cache_hits_total")
        if math.isnan(hits):
            raise CalibrationError(
                f"cannot tell whether prefix caching works on the server at {info.url}: its responses carry "
                f"no cached_tokens and its /metrics no vllm:prefix_cache_hits_total; start it with "
                f"--enable-prompt-tokens-details (kvroute serve does)"
            )
    if not hits >= info.block_size:
        raise CalibrationError(
            f"prefix caching is off on the server at {info.url}: the same {len(prompt)}-token prompt sent "
            f"twice found no cached tokens the second time; restart it without --no-enable-prefix-caching"
        )
    return info


async def warm_up(ctx: _Ctx, plan: SweepPlan) -> None:
    """Run, unrecorded, a decode burst of every batch size of the plan and a mixed step: the
    first steps of a new batch shape were measurably slower (up to 40% on the CPU backend)."""
    bs = ctx.info.block_size
    for B in sorted({*plan.decode_batches, *plan.mixed_batches, 1}):
        prompts = [ctx.factory.unique(2 * bs) for _ in range(B)]
        tasks = [asyncio.create_task(ctx.client.complete(p, 24)) for p in prompts]
        try:
            await asyncio.sleep(0.005)
            for L in sorted({64, *plan.mixed_prefills}):
                await ctx.client.complete(ctx.factory.unique(L), 1)
            results = await asyncio.gather(*tasks)
        except BaseException:
            await _cancel_all(tasks)
            raise
        for r in results:
            _check(ctx, r, 2 * bs)


async def _cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait for them, so that none is left running (or with an exception
    nobody reads) after the request that failed or the cancellation that stopped their batch."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _together(coros: Sequence[Any]) -> list:
    """Run ``coros`` concurrently, as ``asyncio.gather``; when one raises, cancel the others and
    wait for them (:func:`_cancel_all`) before raising its exception, so that no server goes on
    measuring, or writing rows, after the sweep has failed."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        await _cancel_all(tasks)
        raise


async def _sweep_one(ctx: _Ctx, exps: list[dict], plan: SweepPlan, begin: Callable[[dict], None],
                     tick: Callable[[dict], None]) -> None:
    """Run ``exps`` on ``ctx``'s server one at a time, calling ``begin`` before and ``tick``
    after each."""
    runners = {"cold": lambda e: _cold(ctx, e), "cached": lambda e: _cached(ctx, e),
               "decode": lambda e: _decode(ctx, e, plan), "mixed": lambda e: _mixed(ctx, e, plan)}
    for exp in exps:
        begin(exp)
        await runners[exp["kind"]](exp)
        tick(exp)


# --------------------------------------------------------------------------------------------
# The whole sweep: run_sweep and its steps
# --------------------------------------------------------------------------------------------


@dataclass
class _Sweep:
    """What one :func:`run_sweep` has opened and how it is going, for closing it however it ends.

    ``meta`` stays empty until the servers are probed and found alike, when ``meta.json`` is
    first written; ``status`` is ``"failed"`` until the sweep completes or its end is named.
    """

    out: Path
    clients: list[VllmClient]
    t_wall: float  # time.monotonic() at the start, s
    infos: list[ServerInfo] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    writers: list[RowWriter] = field(default_factory=list)  # requests.csv, experiments.csv
    ctxs: list[_Ctx] = field(default_factory=list)
    feed: Any = None  # LiveKVEvents, or None
    subscriber: asyncio.Task | None = None  # the feed's reader, once it started
    status: str = "failed"
    done: int = 0  # experiments and bursts done (_Progress.close)
    events_meta: dict[str, Any] | None = None  # meta.json's kv_events, once the feed is stopped
    warnings: tuple[str, ...] = ()


async def _probe_servers(clients: list[VllmClient], factories: list[PromptFactory], plan: SweepPlan,
                         hardware: str | None) -> list[ServerInfo]:
    """Every server's settings (:func:`probe_server`, one after another), with ``hardware`` in place
    of what they report when given.

    Raises:
        CalibrationError: a server unreachable or unfit for ``plan``, or the servers not alike
            (:func:`check_alike`).
    """
    infos = [await probe_server(c, f, plan) for c, f in zip(clients, factories)]
    if hardware:
        infos = [replace(i, hardware=hardware, sources={**i.sources, "hardware": "--hardware"}) for i in infos]
    check_alike(infos)
    return infos


def _write_first_meta(out: Path, urls: Sequence[str], plan: SweepPlan, seed: int, token_range: tuple[int, int],
                      infos: list[ServerInfo], started: _dt.datetime) -> dict[str, Any]:
    """Write ``out/meta.json`` of a sweep about to measure (status ``running``) and return its contents."""
    meta = dict(
        status="running", started=started.isoformat(timespec="seconds"), seed=seed, urls=list(urls),
        token_range=list(token_range), plan=asdict(plan), servers=[i.to_dict() for i in infos],
        client_host=dict(cores=os.cpu_count(), loadavg_start=list(os.getloadavg())),
    )
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


async def _open_measurement(sweep: _Sweep, factories: list[PromptFactory], kv_events: Sequence[str]) -> None:
    """Open ``requests.csv`` and ``experiments.csv``, make each server's :class:`_Ctx` (its times
    from now), reset every server's prefix cache (a refusal is a warning), and start the KV-event
    feed of ``kv_events`` when there are any."""
    req_w = RowWriter(sweep.out / "requests.csv", REQUEST_COLUMNS)
    exp_w = RowWriter(sweep.out / "experiments.csv", EXPERIMENT_COLUMNS)
    sweep.writers = [req_w, exp_w]
    t0 = time.perf_counter()
    sweep.ctxs = [_Ctx(c, i, f, req_w, exp_w, t0, worker=k)
                  for k, (c, i, f) in enumerate(zip(sweep.clients, sweep.infos, factories))]
    await _reset_prefix_caches(sweep.ctxs)
    if kv_events:
        await _start_kv_events(sweep, kv_events)


async def _reset_prefix_caches(ctxs: list[_Ctx]) -> None:
    """Reset every server's prefix cache; a reset refused or not confirmed is one of that
    server's ``errors`` (a warning, not a failure)."""
    for ctx in ctxs:
        if not await ctx.client.reset_prefix_cache():
            ctx.errors.append(f"could not reset the prefix cache ({ctx.client.reset_note}; start the server "
                              "with VLLM_SERVER_DEV_MODE=1)")


async def _start_kv_events(sweep: _Sweep, endpoints: Sequence[str]) -> None:
    """Subscribe to the servers' KV-cache events at ``endpoints`` and give the feed to every server's context."""
    from kvroute.calibrate.live.kv_events import LiveKVEvents

    sweep.feed = LiveKVEvents(endpoints, sweep.infos[0].block_size)
    sweep.subscriber = await sweep.feed.start()
    for ctx in sweep.ctxs:
        ctx.events = sweep.feed


class _Progress:
    """The sweep's progress and time left: :meth:`begin` and :meth:`tick` around the warm-up (key
    ``"start"``) and around each experiment and burst (its ``exp_id``); the bar counts experiments
    and bursts, not the warm-up. Times given to ``pace`` are seconds since this was made.

    Args:
        total: experiments and bursts.
        pace: what ``on_start`` returned; it gives the time left when it has ``begin``, ``done``
            and ``left_s`` (else the time left is by count).
        show: show a bar, refreshed every ``REFRESH_S`` seconds; without it nothing is shown and
            ``pace`` is not called.
    """

    def __init__(self, total: int, pace: Any, show: bool) -> None:
        self.total = total
        self.done = 0  # experiments and bursts done
        self.bar = self.left = self._refresher = None
        self._t0 = time.monotonic()
        if show:
            from kvroute.sim.study.progress import REFRESH_S, keep_refreshed, progress_bar

            self.left = pace if all(hasattr(pace, m) for m in ("begin", "done", "left_s")) else None
            self.bar = progress_bar(total, "calibration sweep", "experiment",
                                    time_left=None if self.left is None else self.left.left_s)
            self._refresher = asyncio.create_task(keep_refreshed(self.bar, REFRESH_S))

    def begin(self, key: int | str) -> None:
        """``key`` begins."""
        if self.left is not None:
            self.left.begin(key, time.monotonic() - self._t0)

    def tick(self, key: int | str) -> None:
        """``key`` is done."""
        if self.left is not None:
            self.left.done(key, time.monotonic() - self._t0)
        if key == "start":
            return
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    async def close(self) -> int:
        """Stop the refreshing and close the bar; returns the experiments and bursts done."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        if self.bar is not None:
            self.bar.close()
        return self.done


async def _measure(sweep: _Sweep, plan: SweepPlan, seed: int, show_progress: bool, pace: Any) -> None:
    """Run the plan's experiments and bursts that fit the smallest server's KV cache, with
    progress (:class:`_Progress`); ``sweep.status`` becomes ``"complete"`` once all are done, and
    ``sweep.done`` is set however it ends (:meth:`_Progress.close`)."""
    capacity = min((i.num_gpu_blocks - 1) * i.block_size for i in sweep.infos)
    exps = plan.experiments(capacity, seed)
    bursts = plan.bursts(len(sweep.ctxs), len(exps), capacity)
    progress = _Progress(len(exps) + len(bursts), pace, show_progress)
    try:
        await _run_schedule(sweep.ctxs, plan, exps, bursts, seed, progress)
        sweep.status = "complete"
    finally:
        sweep.done = await progress.close()


async def _run_schedule(ctxs: list[_Ctx], plan: SweepPlan, exps: list[dict], bursts: list[dict], seed: int,
                        progress: _Progress) -> None:
    """Warm every server up (:func:`warm_up`, concurrently), then deal ``exps`` round-robin to the
    servers and run them in the segments of :func:`sweep_schedule` (each server its share one at
    a time, the servers concurrently), each segment followed by its chunk of ``bursts``, one at a
    time. When one server's experiment fails, the others' are cancelled (:func:`_together`)."""
    shares = [exps[k::len(ctxs)] for k in range(len(ctxs))]
    progress.begin("start")
    await _together([warm_up(ctx, plan) for ctx in ctxs])
    progress.tick("start")
    for segments, chunk in sweep_schedule(shares, bursts, plan.burst_slots, seed):
        await _together([_sweep_one(ctx, seg, plan, lambda e: progress.begin(e["exp_id"]),
                                    lambda e: progress.tick(e["exp_id"]))
                         for ctx, seg in zip(ctxs, segments)])
        for exp in chunk:
            progress.begin(exp["exp_id"])
            await _burst(ctxs, exp)
            progress.tick(exp["exp_id"])


async def _close(sweep: _Sweep, kv_events: Sequence[str]) -> None:
    """End the sweep, in this order: stop the KV-event feed, close the row writers and the clients;
    then, when ``meta.json`` was written, write its final state and the Parquet copies of the rows."""
    sweep.events_meta = await _stop_kv_events(sweep, kv_events)
    for w in sweep.writers:
        w.close()
    for c in sweep.clients:
        await c.__aexit__(None, None, None)
    sweep.warnings = (tuple(unmodeled_note(c.info.url, c.info.unmodeled, "the fit folds their effect into the step costs")
                            for c in sweep.ctxs if c.info.unmodeled)
                      + tuple(f"{c.info.url}: {e}" for c in sweep.ctxs for e in c.errors)
                      + tuple((sweep.events_meta or {}).get("losses", ())))
    if sweep.meta:
        _write_final_meta(sweep)
        to_parquet(sweep.out / "requests.csv")
        to_parquet(sweep.out / "experiments.csv")


async def _stop_kv_events(sweep: _Sweep, endpoints: Sequence[str]) -> dict[str, Any] | None:
    """Stop the KV-event feed; returns what ``meta.json`` says of it (endpoints, batches, the
    release's stamp and what it marks, ``problem`` when it timed nothing, and ``losses`` when
    batches were lost or skipped: :meth:`LiveKVEvents.losses`), or None when no feed started."""
    if sweep.subscriber is None:
        return None
    sweep.subscriber.cancel()
    (outcome,) = await asyncio.gather(sweep.subscriber, return_exceptions=True)
    from kvroute.sim.timing.vllm_versions import KV_EVENT_STAMPS, kv_event_stamp

    stamp = kv_event_stamp(sweep.infos[0].vllm_version, sweep.infos[0].async_scheduling)
    events_meta = {"endpoints": list(endpoints), "batches": sweep.feed.num_batches, "stamp": stamp,
                   "stamp_marks": KV_EVENT_STAMPS[stamp]}
    problem = sweep.feed.problem(outcome)
    if problem is not None:
        events_meta["problem"] = problem
    if losses := sweep.feed.losses():
        events_meta["losses"] = losses
    return events_meta


def _write_final_meta(sweep: _Sweep) -> None:
    """Rewrite ``meta.json`` with how the sweep ended: its KV-event feed, warnings, status, the
    experiments and bursts done (``experiments_done``; all of them when complete), finish time,
    wall time (s) and the client host's load average."""
    meta = sweep.meta
    if sweep.events_meta is not None:
        meta["kv_events"] = sweep.events_meta
    if sweep.warnings:
        meta["warnings"] = list(sweep.warnings)
    meta["status"] = sweep.status
    meta["experiments_done"] = sweep.done
    meta["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    meta["elapsed_s"] = round(time.monotonic() - sweep.t_wall, 1)
    meta.setdefault("client_host", {})["loadavg_end"] = list(os.getloadavg())
    (sweep.out / "meta.json").write_text(json.dumps(meta, indent=2))


@dataclass(frozen=True, slots=True)
class MeasureSummary:
    """What a sweep left on disk.

    Attributes:
        out_dir: the output directory.
        servers: each server's settings.
        num_requests: rows in ``requests.csv`` written by this run.
        num_experiments: experiments and bursts finished (all of the plan's that fit).
        status: ``"complete"``: :func:`run_sweep` raises on a sweep interrupted or failed, whose
            ``meta.json`` says how it ended (``status``, ``experiments_done``).
        elapsed_s: wall time, s.
        events_problem: why the KV-event feeds timed nothing, or None (also when not asked for).
        warnings: what went wrong without stopping the sweep (a prefix-cache reset refused or
            not confirmed, KV-event batches lost or skipped), each naming the server; also in
            ``meta.json`` as ``warnings``.
    """

    out_dir: Path
    servers: list[ServerInfo]
    num_requests: int
    num_experiments: int
    status: str
    elapsed_s: float
    events_problem: str | None = None
    warnings: tuple[str, ...] = ()


async def run_sweep(
    urls: Sequence[str],
    out_dir: str | Path,
    plan: SweepPlan,
    model: str | None = None,
    seed: int = 0,
    token_range: tuple[int, int] = (100, 1700),
    progress: bool = True,
    hardware: str | None = None,
    timeout_s: float = 600.0,
    kv_events: Sequence[str] = (),
    on_start: Callable[[list[ServerInfo]], Any] | None = None,
) -> MeasureSummary:
    """Probe every server, check the plan fits, then run the sweep; experiments are dealt
    round-robin to the servers, which run concurrently (each runs its own share one at a time),
    with the concurrency sweep in ``plan.burst_slots`` slots between parts of them
    (:func:`sweep_schedule`).

    Args:
        urls: base URLs of identical servers (same hardware, model and settings).
        out_dir: output directory (created), holding no sweep yet (:func:`~kvroute.calibrate.calibration.
            sweep_files.check_no_sweep`).
        plan: the sweep.
        model: served model name; None: each server's only model.
        seed: seeds the prompts (``numpy.random.default_rng(seed)``).
        token_range: ``[lo, hi)`` of prompt token ids.
        progress: show progress (`kvroute.sim.study.progress`: a bar on a terminal or in a notebook,
            plain lines in a log once the sweep has run 30 s), refreshed every
            :data:`~kvroute.sim.study.progress.REFRESH_S` seconds while it runs (a log gets its
            lines during a long experiment too).
        hardware: hardware description overriding what the servers report.
        timeout_s: limit on one request, s.
        kv_events: each server's KV-cache event endpoint, in the order of ``urls`` (``kvroute
            serve --kv-events-port-base``), or none: each row's ``engine_first_token_s`` then
            times the engine step that finished the request's prefill (NaN without).
        on_start: called with the servers' settings once they are probed and found alike, before
            anything is measured (``kvroute calibrate measure`` prints its time estimate there:
            :mod:`kvroute.calibrate.calibration.sweep_time`). What it returns, if it has
            ``begin(key, at_s)``, ``done(key, at_s)`` and ``left_s(elapsed_s)`` (such as
            :class:`kvroute.calibrate.calibration.sweep_time.TimeLeft` of this sweep's estimate:
            the estimate of the experiments not done, at the pace of those done), gives the
            progress its time left: ``begin`` and ``done`` are called with ``"start"`` around the
            warm-up and with each experiment's ``exp_id`` around it, ``at_s`` the seconds since
            the warm-up began; else the time left is by count.

    Returns:
        A :class:`MeasureSummary`.

    Raises:
        CalibrationError: ``out_dir`` holds a sweep already, a bad server or plan (nothing measured
            yet), or a failure mid-sweep (the
            rows measured so far are on disk; ``meta.json`` says ``failed``).
    """
    out = Path(out_dir)
    check_no_sweep(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    started = _dt.datetime.now(_dt.timezone.utc)
    t_wall = time.monotonic()
    sweep = _Sweep(out, [VllmClient(u, model, timeout_s) for u in urls], t_wall)
    for c in sweep.clients:
        await c.__aenter__()
    try:
        factories = [PromptFactory(np.random.default_rng(rng.integers(2**63)), *token_range) for _ in sweep.clients]
        sweep.infos = await _probe_servers(sweep.clients, factories, plan, hardware)
        pace = on_start(sweep.infos) if on_start is not None else None
        sweep.meta = _write_first_meta(out, urls, plan, seed, token_range, sweep.infos, started)
        await _open_measurement(sweep, factories, kv_events)
        await _measure(sweep, plan, seed, progress, pace)
    except (asyncio.CancelledError, KeyboardInterrupt):
        sweep.status = "interrupted"
        raise
    except CalibrationError as exc:
        sweep.status = f"failed: {exc}"
        raise
    finally:
        await _close(sweep, kv_events)
    return MeasureSummary(out, sweep.infos, sweep.writers[0].rows if sweep.writers else 0, sweep.done, sweep.status,
                          time.monotonic() - sweep.t_wall, (sweep.events_meta or {}).get("problem"), sweep.warnings)
