"""Golden records: the simulator's per-request output must not change under speed work.

Two workloads, each under round_robin and kv_aware with seed 0:

- the seed burst, 64 chats x 6 turns on 4 workers with the ``a6000-qwen2.5-7b`` prior, replayed
  from ``tests/golden/seed_burst.jsonl`` (written once by ``write_trace`` from ``seed_chat`` with
  every parameter explicit, so a later change of the generator's defaults does not move it);
- the first 1,000 records of the Mooncake conversation trace on 8 workers with the
  ``a100-80gb-qwen2.5-7b`` prior (skipped when ``../shared/traces`` is absent).

The trace file was written once, with the generator of commit a0958e4, by
``write_trace(seed_chat(**SEED_PARAMS), "tests/golden/seed_burst.jsonl")``; it is never
rewritten by the test (the generator's defaults and signature have changed since).

Each golden CSV holds, per request in request-id order, the worker, the send, first-token and
finish times (s, printed with 9 decimals: the fast-forward sums step times in closed form, so
equality is up to that documented rounding), cached and output tokens and preemptions; then
summary rows for the ITL gaps (count, mean, p90) and per-worker counters (steps, prefix-cache
hits, evictions). Rewrite the CSVs only after an intended behaviour change (e.g. a routing
change that moves records), from the code before the change, then check the change against
them::

    KVROUTE_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.format import Trace
from kvroute.traces.reader import read_trace
from tests.support.paths import GOLDEN
from tests.support.shared_traces import shared_trace

SEED_TRACE = GOLDEN / "seed_burst.jsonl"
REGENERATE = os.environ.get("KVROUTE_REGEN_GOLDEN") == "1"
POLICIES = ["round_robin", "kv_aware"]

SEED_PARAMS = dict(
    num_chats=64, num_turns=6, system_words=600, user_words=150, reply_tokens=128,
    tokens_per_word=1.3, template_tokens_per_message=4, generation_prompt_tokens=3,
    think_time_ms=0.0, block_size=16,
)
"""The seed burst as ``seed_chat`` built it when the golden file was written."""


def _fmt(value: float) -> str:
    return "nan" if value is None or value != value else f"{value:.9f}"


def records_csv(trace: Trace, spec: ClusterSpec, seed: int = 0) -> str:
    """The run's golden text: one row per request, then ITL and per-worker summary rows."""
    result = simulate(trace, spec, seed=seed)
    out = io.StringIO()
    out.write("request_id,worker,arrival,first_token,finish,cached_tokens,output_tokens,preemptions\n")
    for row in result.records.itertuples(index=False):
        out.write(f"{row.request_id},{row.worker},{_fmt(row.arrival)},{_fmt(row.first_token)},"
                  f"{_fmt(row.finish)},{row.cached_tokens},{row.output_tokens},{row.preemptions}\n")
    itl = np.asarray(result.itl, dtype=float)
    p90 = float(np.quantile(itl, 0.9)) if len(itl) else float("nan")
    out.write(f"# itl,{len(itl)},{_fmt(float(itl.mean()) if len(itl) else None)},{_fmt(p90)}\n")
    for w in result.workers.itertuples(index=False):
        out.write(f"# worker,{w.worker},{w.num_steps},{w.prefix_cache_queries},{w.prefix_cache_hits},"
                  f"{w.num_preemptions},{w.num_evictions}\n")
    return out.getvalue()


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGENERATE:
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} missing: run KVROUTE_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py")
    expected = path.read_text().splitlines()
    got = text.splitlines()
    for lineno, (want, have) in enumerate(zip(expected, got), start=1):
        assert have == want, f"{name} line {lineno} differs:\n  golden: {want}\n  now:    {have}"
    assert len(got) == len(expected), f"{name}: {len(got)} lines, golden has {len(expected)}"


def test_seed_trace_file_is_the_seed_burst():
    """The golden trace file is what ``seed_chat`` gave for ``SEED_PARAMS`` when it was written:
    384 records, 64 chats of 6 turns, turn 1 of 986 prompt tokens, 128-token replies."""
    trace = read_trace(SEED_TRACE)
    assert len(trace.records) == 384
    assert trace.block_size == 16
    assert {r.output_length for r in trace.records} == {128}
    assert [r.input_length for r in trace.records[::64]] == [986, 1316, 1646, 1976, 2306, 2636]


@pytest.mark.parametrize("policy", POLICIES)
def test_seed_burst_records_unchanged(policy):
    trace = read_trace(SEED_TRACE)
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=4, policy=policy)
    _check(f"seed_burst_{policy}.csv", records_csv(trace, spec))


@pytest.mark.parametrize("policy", POLICIES)
def test_mooncake_first_1000_records_unchanged(policy):
    path = shared_trace("mooncake", "conversation_trace.jsonl")
    full = read_trace(path)
    trace = Trace(records=full.records[:1000], block_size=full.block_size, source=f"{path}[:1000]")
    spec = ClusterSpec(load_profile("a100-80gb-qwen2.5-7b"), num_workers=8, policy=policy)
    _check(f"mooncake_first1000_{policy}.csv", records_csv(trace, spec))
