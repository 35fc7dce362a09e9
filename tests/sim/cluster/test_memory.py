"""Memory follows what a run uses, not what the cluster could hold (issue 13, item 1).

Peaks are measured with tracemalloc (Python objects and numpy buffers), never with a clock.
Eight one-turn chats use a few hundred blocks, so a pool 16 times larger, or 28 more idle
workers, must cost next to nothing.
"""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.timing.profile import load_profile
from kvroute.sim.cluster.workload import Workload
from kvroute.traces import generators
from kvroute.traces.format import Trace, TraceRecord



def _peak_mb(workers: int, blocks: int) -> float:
    trace = generators.seed_chat(num_chats=8, num_turns=1, block_size=16)
    profile = load_profile("a6000-qwen2.5-7b")
    profile = dataclasses.replace(profile, engine=dataclasses.replace(profile.engine, num_gpu_blocks=blocks),
                                  memory=None)
    tracemalloc.start()
    try:
        simulate(trace, ClusterSpec(profile, num_workers=workers))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1e6


def test_pool_memory_does_not_grow_with_kv_capacity():
    small, large = _peak_mb(2, 2**14), _peak_mb(2, 2**18)
    assert large < small + 2.0, f"peak {large:.1f} MB with 2**18 blocks vs {small:.1f} MB with 2**14"


def test_idle_workers_cost_little_memory():
    few, many = _peak_mb(4, 2**14), _peak_mb(32, 2**14)
    per_worker_kb = (many - few) / 28 * 1000
    assert per_worker_kb < 256, f"{per_worker_kb:.0f} KB per idle worker"


def test_huge_output_is_not_expanded_past_max_model_len():
    """An output of 10**8 tokens is cut at max_model_len before its blocks are hashed."""
    rec = TraceRecord(0, 0.0, 600, 10**8, (1, 2))
    workload = Workload(Trace([rec], 512), 16, max_model_len=32768)
    segments, hashes = workload.build(rec)
    assert sum(s[2] for s in segments) == 32768
    assert len(hashes) == 32768 // 16


def test_rejected_prompt_is_not_hashed():
    rec = TraceRecord(0, 0.0, 10**8, 1, range(10**8 // 512 + 1))
    segments, hashes = Workload(Trace([rec], 512), 16, max_model_len=32768).build(rec)
    assert segments == [] and len(hashes) == 0


def test_long_session_builds_without_recursion():
    """A 5,000-turn chain sent child-first (open loop) builds iteratively, same hashes as in order."""
    recs = [TraceRecord(0, 0.0, 16, 1, (7,))]
    for i in range(1, 5000):
        recs.append(TraceRecord(i, 0.0, recs[-1].input_length + 2, 1, parent=i - 1))
    last = recs[-1]
    child_first = Workload(Trace(recs, 16), 16).build(last)
    in_order = Workload(Trace(recs, 16), 16)
    for rec in recs:
        built = in_order.build(rec)
    assert built == child_first
    assert sum(s[2] for s in built[0]) == last.input_length + last.output_length


def test_reordered_session_builds_every_record_once(monkeypatch):
    """Open-loop arrival spread can send a session's turns out of order: each record is built
    once (its missing ancestors ahead of their own sends, then kept for them), the hashes are
    those of the in-order build, and nothing is kept once every turn is sent."""
    recs = [TraceRecord(0, 0.0, 16, 1, (7,))]
    for i in range(1, 3000):
        recs.append(TraceRecord(i, 0.0, recs[-1].input_length + 2, 1, parent=i - 1))
    order = [recs[i ^ 1] for i in range(len(recs))]  # 1, 0, 3, 2, ...: every child before its parent
    in_order = Workload(Trace(recs, 16), 16)
    want = {rec.request_id: in_order.build(rec) for rec in recs}
    workload = Workload(Trace(recs, 16), 16)
    calls = []
    build_one = Workload._build_one
    monkeypatch.setattr(Workload, "_build_one", lambda self, rec, *a, **k: calls.append(rec.request_id)
                        or build_one(self, rec, *a, **k))
    got = {rec.request_id: workload.build(rec) for rec in order}
    assert got == want
    assert sorted(calls) == list(range(len(recs)))
    assert workload._kept == {} and in_order._kept == {}
