"""Hits lost to eviction (``kvroute.sim.cluster.eviction``): the rule on hand-made rows, a run
where a chat's next turn comes back after its blocks were evicted, and the turnover note."""

import json

from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.cluster.eviction import evicted_history_tokens, parent_links
from kvroute.sim.cluster.metrics import RECORD_COLUMNS
from kvroute.traces.format import Trace, TraceRecord
from tests.sim.cluster.test_cluster import simple_profile


def _row(rid, worker, prompt, cached, output, status="ok"):
    row = dict.fromkeys(RECORD_COLUMNS)
    row.update(request_id=rid, worker=worker, prompt_tokens=prompt, cached_tokens=cached, output_tokens=output,
               status=status)
    return tuple(row[c] for c in RECORD_COLUMNS)


def test_a_turn_loses_the_blocks_its_nearest_ancestor_on_its_worker_computed_that_it_missed():
    parents = {0: None, 1: 0, 2: 1, 3: 2, 9: None}
    rows = [
        _row(0, 0, 100, 0, 20),   # computed 119 tokens: 7 full blocks of 16
        _row(1, 1, 140, 0, 20),   # on another worker: not its ancestor's, nothing lost
        _row(2, 0, 180, 32, 20),  # nearest ancestor on worker 0 is request 0: 7 blocks, hit 2: 5 lost
        _row(3, 0, 220, 192, 5),  # request 2 computed 199 tokens, 12 blocks, all hit (192 = 12 x 16)
        _row(9, 0, 64, 0, 1),     # no parent
    ]
    assert evicted_history_tokens(rows, parents, 16) == (5 * 16, 224, 704)
    # vLLM's hit stops before a prompt's last token: a prompt of 49 tokens reaches 3 blocks at most
    assert evicted_history_tokens([_row(0, 0, 100, 0, 20), _row(2, 0, 49, 0, 1)], parents | {2: 0}, 16)[0] == 48
    # a failed ancestor is not one (it computed nothing to keep); a failed request counts nothing
    assert evicted_history_tokens([_row(0, 0, 100, 0, 20, "failed"), _row(2, 0, 180, 0, 1)], parents | {2: 0}, 16) \
        == (0, 0, 180)


def _turns(kv_blocks):
    # turn 1 (64 tokens, one reply token: 64 computed, 4 blocks), another chat's 144-token prompt,
    # then turn 2 (turn 1 + its reply + 15 new tokens: 80 tokens)
    trace = Trace([TraceRecord(0, 0.0, 64, 1, tuple(range(0, 4)), session_id=0, turn=1),
                   TraceRecord(1, 1000.0, 144, 1, tuple(range(100, 109)), session_id=1, turn=1),
                   TraceRecord(2, 0.0, 80, 1, None, session_id=0, turn=2, parent=0, think_time_ms=2000.0)],
                  block_size=16)
    return trace, simulate(trace, ClusterSpec(simple_profile(num_gpu_blocks=kv_blocks), num_workers=1,
                                              arrival_spread_s=0.0))


def test_a_chat_turn_that_comes_back_after_its_blocks_were_evicted_loses_them():
    trace, tight = _turns(11)  # 10 usable blocks: the other chat's 9 push out three of turn 1's 4
    parents = parent_links(trace)
    assert list(tight.records["cached_tokens"]) == [0, 0, 16]  # a prefix goes last block first: block 0 stays
    # turn 1 computed 64 tokens (4 blocks), turn 2 reaches (80 - 1) // 16 = 4: hit 1, 3 lost
    assert evicted_history_tokens(tight.record_rows(), parents, 16) == (48, 16, 288)
    _, roomy = _turns(1000)
    assert list(roomy.records["cached_tokens"]) == [0, 0, 64]
    assert evicted_history_tokens(roomy.record_rows(), parents, 16) == (0, 64, 288)


def test_compare_says_what_share_of_the_prompt_tokens_the_turnover_cost():
    args = ["compare", "--chats", "8", "--turns", "3", "--workers", "1", "--policies", "round_robin", "--rounds", "2",
            "--json"]
    tight = json.loads(CliRunner().invoke(cli, args + ["--kv-blocks", "300"], catch_exceptions=False).output)
    roomy = json.loads(CliRunner().invoke(cli, args, catch_exceptions=False).output)
    note = next(n for n in tight["notes"] if "turned over" in n)
    assert "later turns computed again" in note and "lower bounds" in note
    hit = float(note.split("(hit rate ")[1].split(";")[0])
    assert hit == round(tight["policies"]["round_robin"]["hit_rate"]["mean"], 3)
    with_them = float(note.split(" with them)")[0].rsplit(" ", 1)[1])
    # one worker sees every turn of every chat: with the lost tokens back, the hit rate of a cache
    # that never evicts
    assert abs(with_them - roomy["policies"]["round_robin"]["hit_rate"]["mean"]) < 0.01


def test_the_turnover_note_gives_no_cost_for_a_trace_without_parent_links():
    from types import SimpleNamespace

    from kvroute.cli.run_notes import kv_turnover_note

    trace, run = _turns(11)
    run = SimpleNamespace(seed=0, worker_rows=lambda: [{"num_gpu_blocks": 3, "num_evictions": 6}],
                          record_rows=run.record_rows)
    comparison = SimpleNamespace(policies=["round_robin"], runs={"round_robin": [run]})
    linked = kv_turnover_note(comparison, 16, trace)
    assert "later turns computed again 16.7 % of the prompt tokens" in linked and "lower bounds" in linked
    unlinked = Trace([TraceRecord(r.request_id, r.timestamp_ms, r.input_length, r.output_length,
                                  r.hash_ids or tuple(range(0, 4)) + (200,)) for r in trace.records], block_size=16)
    note = kv_turnover_note(comparison, 16, unlinked)
    assert "computed again" not in note and "lower bounds" not in note
    assert note == kv_turnover_note(comparison, 16)  # as without a trace


def test_a_policy_under_once_over_that_lost_history_is_named_with_what_it_lost():
    """A policy that evicted 0.92 times the blocks and computed 2.2 M prompt tokens again was left
    out of the note: only evictions of at least the blocks held made it speak."""
    from types import SimpleNamespace

    from kvroute.cli.run_notes import kv_turnover_note

    trace, run = _turns(11)
    run = SimpleNamespace(seed=0, worker_rows=lambda: [{"num_gpu_blocks": 11, "num_evictions": 6}],
                          record_rows=run.record_rows)
    comparison = SimpleNamespace(policies=["round_robin"], runs={"round_robin": [run]})
    assert kv_turnover_note(comparison, 16, trace, time_series=True) == (
        "Note: the KV cache evicted history that later turns needed: per run (mean over rounds) the workers evicted 6 "
        "cached blocks under round_robin, 0.60 times the 10 blocks of 16 tokens they can cache in (160 tokens; vLLM "
        "keeps one block of each worker back), and later turns computed again 16.7 % of the prompt tokens that their "
        "worker had cached for the chat's earlier turn and evicted (hit rate 0.056; 0.222 with them). Those shares are "
        "lower bounds (blocks shared across chats are not counted). Hit rates and TTFT then depend on KV memory (try "
        "--kv-blocks or --workers); the preemption row counts only requests pushed out while running. Each worker's KV "
        "use over time: the timeseries-<policy> figures.")
    assert kv_turnover_note(comparison, 16) == ""  # no trace: nothing lost to read, and under once over
