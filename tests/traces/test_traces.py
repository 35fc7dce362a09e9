"""Tests of kvroute.traces: readers, writer, generators, stats and the block-size rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvroute.traces.azure import read_azure_csv
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.generators import agent_sessions, seed_chat
from kvroute.traces.reader import TraceError, check_block_sizes, read_trace
from kvroute.traces.stats import format_stats, resolve_hash_ids, trace_stats
from kvroute.traces.writer import write_trace
from tests.support.shared_traces import shared_trace

CONVERSATION = ("mooncake", "conversation_trace.jsonl")
FIRST20 = ("mooncake", "mooncake_trace_first20.jsonl")
AZURE_CONV = ("azure", "AzureLLMInferenceTrace_conv.csv")


def _write_lines(tmp_path: Path, lines: list, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


# ---------------------------------------------------------------- real traces

def test_conversation_trace_exact_figures():
    trace = read_trace(shared_trace(*CONVERSATION))
    assert len(trace.records) == 12_031
    assert trace.block_size == 512
    stats = trace_stats(trace)
    assert stats["records"] == 12_031
    assert stats["distinct_block_ids"] == 182_790
    assert stats["block_references"] == 288_500
    assert stats["repeated_references"] == 105_710
    assert round(stats["repeat_share_pct"], 2) == 36.64
    assert "sessions" not in stats
    text = format_stats(stats)
    assert "182,790" in text and "36.64" in text


def test_mooncake_first20_loads_unchanged():
    trace = read_trace(shared_trace(*FIRST20))
    assert len(trace.records) == 20
    first = trace.records[0]
    assert (first.request_id, first.timestamp_ms, first.input_length) == (0, 0.0, 6755)
    assert first.hash_ids[:3] == (0, 1, 2)
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in trace.records)


def test_azure_conv_loads():
    trace = read_azure_csv(shared_trace(*AZURE_CONV))
    assert len(trace.records) == 19_366
    assert trace.block_size == 512
    first, second = trace.records[0], trace.records[1]
    assert first.timestamp_ms == 0.0
    assert (first.input_length, first.output_length) == (374, 44)
    assert second.timestamp_ms == pytest.approx(4314.579)  # 18:15:50.995169 - 18:15:46.680590
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in trace.records)
    stats = trace_stats(trace)
    assert stats["repeated_references"] == 0  # no prefix information: nothing shared
    assert stats["distinct_block_ids"] == stats["block_references"]
    assert stats["block_ids"] == "fresh per request (the file has no prefix information)"  # the ids are made up


def test_azure_errors_name_line_and_field(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,lots,109\n")
    with pytest.raises(TraceError) as info:
        read_azure_csv(path)
    assert (info.value.line, info.value.field) == (3, "ContextTokens")
    assert str(path) in str(info.value) and ":3" in str(info.value)

    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n")
    with pytest.raises(TraceError) as info:
        read_azure_csv(path)
    assert (info.value.line, info.value.field) == (2, "TIMESTAMP")

    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(TraceError) as info:
        read_azure_csv(path)
    assert (info.value.line, info.value.field) == (1, "GeneratedTokens")

    for count in ("1_000", "+5", "\u0661\u0662"):  # int() reads each: 1000, 5, 12
        path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{count},44\n",
                        encoding="utf-8")
        with pytest.raises(TraceError, match="expected an int >= 1") as info:
            read_azure_csv(path)
        assert (info.value.line, info.value.field) == (2, "ContextTokens")



@pytest.mark.parametrize("line,message", [
    ('{"timestamp": 1, "input_len', "malformed JSON: Unterminated string starting at column 18"),
    ('{"timestamp": 1, x}', "malformed JSON: Expecting property name enclosed in double quotes at column 18"),
])
def test_malformed_json_names_line_and_column(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n\n' + line + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value) == f"{path}:3: {message}"  # the blank line 2 is skipped, and counted


def test_hash_ids_from_the_simulators_own_range_are_refused(tmp_path):
    """An id of 2**48 or more would name the same blocks as a reply the simulator generated (a
    false cache hit); 2**48 - 1 is the largest id read."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 281474976710655]}\n'
                    '{"timestamp": 1, "input_length": 1000, "output_length": 5, "hash_ids": [0, 281474976710656]}\n')
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (2, "hash_ids")
    assert "entry 1 is 281474976710656, above the largest hash id 2**48 - 1" in str(info.value)


def test_json_lines_end_at_newline_only(tmp_path):
    """str.splitlines also broke lines at U+2028 (inside a JSON string: valid JSON Lines, refused)
    and at a form feed (every later line number one off)."""
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], "note": "a\u2028b"}'
    path.write_text(good + "\r\n\x0c\n" + '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": "x"}\n',
                    encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (3, "hash_ids")
    path.write_text(good + "\r\n", encoding="utf-8")
    assert [r.input_length for r in read_trace(path).records] == [10]


# ---------------------------------------------------------------- round trip

def _sample_trace() -> Trace:
    records = [
        TraceRecord(0, 0.0, 20, 5, (0, 1)),
        TraceRecord(1, 12.5, 40, 7, (0, 2, 3), session_id="s1", turn=1),
        TraceRecord(7, 100.0, 60, 3, None, session_id="s1", turn=2, parent=1, think_time_ms=250.5),
        TraceRecord(3, 3000.0, 17, 1, (9, 10), session_id=4),
    ]
    return Trace(records=records, block_size=16, source="sample", metadata={"note": "x", "n": [1, 2]})


def test_write_read_round_trip(tmp_path):
    trace = _sample_trace()
    path = tmp_path / "out.jsonl"
    write_trace(trace, path)
    back = read_trace(path)
    assert back.records == trace.records
    assert back.block_size == 16
    assert back.metadata == trace.metadata
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"kvroute_trace": 1, "block_size": 16, "note": "x", "n": [1, 2]}
    # defaults are omitted: position-equal request_id, None fields, zero think time
    assert json.loads(lines[1]) == {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [0, 1]}
    assert json.loads(lines[3])["request_id"] == 7 and "hash_ids" not in json.loads(lines[3])


def test_round_trip_generators(tmp_path):
    for trace in (seed_chat(num_chats=3, num_turns=3, think_time_ms=1.5),
                  agent_sessions(np.random.default_rng(1), num_sessions=3)):
        path = tmp_path / f"{trace.source}.jsonl"
        write_trace(trace, path)
        back = read_trace(path)
        assert (back.records, back.block_size, back.metadata) == (trace.records, trace.block_size, trace.metadata)


def test_round_trip_mooncake(tmp_path):
    first20 = shared_trace(*FIRST20)
    original = read_trace(first20)
    path = tmp_path / "first20.jsonl"
    write_trace(original, path)
    assert read_trace(path).records == original.records
    # Mooncake lines come out as they went in, after the metadata line
    assert path.read_text().splitlines()[1:] == first20.read_text().splitlines()


def test_block_size_sources(tmp_path):
    rec = {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}
    plain = _write_lines(tmp_path, [rec])
    assert read_trace(plain, block_size=16).block_size == 16
    with pytest.raises(TraceError):  # at 512, 20 tokens need one id
        read_trace(plain)
    declared = _write_lines(tmp_path, [{"kvroute_trace": 1, "block_size": 16}, rec], "d.jsonl")
    assert read_trace(declared).block_size == 16
    with pytest.raises(TraceError) as info:
        read_trace(declared, block_size=32)
    assert (info.value.line, info.value.field) == (1, "block_size")


def test_a_block_size_argument_given_as_an_integral_float_is_that_int(tmp_path):
    """16.0 passes the block-size rule as 16, so the trace's block size is the int, and a child
    with its own hash_ids is checked against its parent's full blocks (a float count of them
    made the check raise TypeError)."""
    parent = {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}
    child = {"timestamp": 1, "input_length": 40, "output_length": 1, "parent": 0, "hash_ids": [0, 1, 2]}
    trace = read_trace(_write_lines(tmp_path, [parent, child]), block_size=16.0)
    assert type(trace.block_size) is int and trace.block_size == 16
    assert trace.records[1].hash_ids == (0, 1, 2)


# ---------------------------------------------------------------- malformed files

GOOD = {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [0]}

MALFORMED = [
    # (name, bad line, expected field)
    ("malformed json", '{"timestamp": 0, "input_length": 20', None),
    ("not an object", "[1, 2, 3]", None),
    ("missing field", {"timestamp": 0, "output_length": 5, "hash_ids": [0]}, "input_length"),
    ("missing timestamp", {"input_length": 20, "output_length": 5, "hash_ids": [0]}, "timestamp"),
    ("wrong type length", {**GOOD, "input_length": "20"}, "input_length"),
    ("float length", {**GOOD, "output_length": 5.0}, "output_length"),
    ("bool length", {**GOOD, "output_length": True}, "output_length"),
    ("wrong type timestamp", {**GOOD, "timestamp": "0"}, "timestamp"),
    ("negative timestamp", {**GOOD, "timestamp": -1}, "timestamp"),
    ("negative input", {**GOOD, "input_length": -1, "hash_ids": []}, "input_length"),
    ("negative output", {**GOOD, "output_length": -5}, "output_length"),
    ("zero output", {**GOOD, "output_length": 0}, "output_length"),
    ("too many hash ids", {**GOOD, "hash_ids": [0, 1]}, "hash_ids"),
    ("too few hash ids", {**GOOD, "input_length": 600}, "hash_ids"),
    ("hash ids not a list", {**GOOD, "hash_ids": 0}, "hash_ids"),
    ("hash id not int", {**GOOD, "hash_ids": ["a"]}, "hash_ids"),
    ("negative hash id", {**GOOD, "hash_ids": [-3]}, "hash_ids"),
    ("duplicate request_id", {**GOOD, "request_id": 0}, "request_id"),
    ("unknown parent", {**GOOD, "parent": 99}, "parent"),
    ("later parent", {**GOOD, "request_id": 5, "parent": 6}, "parent"),
    ("self parent", {**GOOD, "request_id": 5, "parent": 5}, "parent"),
    ("short extension", {"timestamp": 0, "input_length": 24, "output_length": 5, "parent": 0}, "input_length"),
    ("no hash_ids no parent", {"timestamp": 0, "input_length": 20, "output_length": 5}, "hash_ids"),
    ("bad turn", {**GOOD, "turn": 0}, "turn"),
    ("bad think_time", {**GOOD, "think_time": -1}, "think_time"),
    ("bad session_id", {**GOOD, "session_id": [1]}, "session_id"),
    ("misplaced metadata", {"kvroute_trace": 1, "block_size": 512}, "kvroute_trace"),
]


@pytest.mark.parametrize("bad,field", [(b, f) for _, b, f in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_record_names_file_line_field(tmp_path, bad, field):
    # line 1: a good record (request 0, 20 tokens + 5 output), line 2: blank, line 3: the bad one,
    # line 4: a record with request_id 6 (so "later parent" has a later target)
    later = {**GOOD, "request_id": 6}
    path = _write_lines(tmp_path, [GOOD, "", bad, later])
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == str(path)
    assert err.line == 3
    assert err.field == field
    message = str(err)
    assert f"{path}:3" in message
    if field is not None:
        assert f"'{field}'" in message


def test_parent_error_messages_distinguish_later_and_unknown(tmp_path):
    later = {**GOOD, "request_id": 6}
    path = _write_lines(tmp_path, [GOOD, {**GOOD, "request_id": 5, "parent": 6}, later])
    with pytest.raises(TraceError, match=r"later request \(line 3\)"):
        read_trace(path)
    path = _write_lines(tmp_path, [GOOD, {**GOOD, "parent": 42}])
    with pytest.raises(TraceError, match="names no earlier"):
        read_trace(path)


def test_mooncake_record_with_too_many_ids_is_malformed(tmp_path):
    path = _write_lines(tmp_path, [{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0, 1]}])
    with pytest.raises(TraceError, match=r"needs ceil\(20/512\) = 1") as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (1, "hash_ids")


def test_bad_metadata_line(tmp_path):
    rec = {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [0]}
    for meta, field in (({"kvroute_trace": 2, "block_size": 16}, "kvroute_trace"),
                        ({"kvroute_trace": 1, "block_size": 0}, "block_size"),
                        ({"kvroute_trace": 1, "block_size": "16"}, "block_size")):
        path = _write_lines(tmp_path, [meta, rec])
        with pytest.raises(TraceError) as info:
            read_trace(path)
        assert (info.value.line, info.value.field) == (1, field)


def test_parent_extension_without_hash_ids_is_valid(tmp_path):
    child = {"timestamp": 0, "input_length": 25, "output_length": 2, "parent": 0, "turn": 2}
    parent = {**GOOD, "hash_ids": [0, 1]}
    trace = read_trace(_write_lines(tmp_path, [parent, child]), block_size=16)
    assert trace.records[1].parent == 0 and trace.records[1].hash_ids is None
    # resolved ids: block 0 (tokens 0-15) is inside the parent's 20-token prompt; block 1 is new
    assert resolve_hash_ids(trace) == [(0, 1), (0, 2)]


# ---------------------------------------------------------------- generators

def test_seed_chat_turn1_and_turn2_token_counts():
    trace = seed_chat()
    assert trace.block_size == 16
    assert len(trace.records) == 64 * 6
    system = round(600 * 1.3) + 4  # 784
    user = round(150 * 1.3) + 4  # 199
    t1 = trace.records[0]
    assert (system, user) == (784, 199)
    assert t1.input_length == system + user + 3 == 986
    assert (t1.output_length, t1.turn, t1.session_id, t1.parent, t1.timestamp_ms) == (128, 1, 0, None, 0.0)
    assert len(t1.hash_ids) == math.ceil(986 / 16) == 62
    # the 49 blocks fully inside the system prompt are shared, the other 13 are the chat's own
    other = trace.records[1].hash_ids
    assert t1.hash_ids[:49] == other[:49] == tuple(range(49))
    assert not set(t1.hash_ids[49:]) & set(other[49:])
    assert all(h >= 0 for r in trace.records[:64] for h in r.hash_ids)
    t2 = trace.records[64]
    assert (t2.session_id, t2.turn, t2.parent, t2.hash_ids) == (0, 2, 0, None)
    assert t2.input_length == 986 + 128 + 199 + 3 == 1316
    assert t2.output_length == 128 and t2.think_time_ms == 0.0
    last = trace.records[-1]
    assert (last.session_id, last.turn, last.input_length) == (63, 6, 986 + 5 * (128 + 202))
    assert [r.turn for r in trace.records[::64]] == [1, 2, 3, 4, 5, 6]
    assert [r.request_id for r in trace.records] == list(range(len(trace.records)))


def test_seed_chat_think_time_and_block_size():
    trace = seed_chat(num_chats=2, num_turns=2, think_time_ms=250.0, block_size=512)
    assert trace.records[2].think_time_ms == 250.0
    # 784 system tokens hold one full 512-token block (shared id 0); the second block is the chat's
    assert trace.records[0].hash_ids == (0, 1) and trace.records[1].hash_ids == (0, 2)

def test_agent_sessions_deterministic_and_within_bounds():
    a = agent_sessions(np.random.default_rng(7))
    b = agent_sessions(np.random.default_rng(7))
    c = agent_sessions(np.random.default_rng(8))
    assert a.records == b.records
    assert a.records != c.records
    by_id = {r.request_id: r for r in a.records}
    assert len({r.session_id for r in a.records}) == 16
    for r in a.records:
        assert 50 <= r.output_length <= 300
        assert r.input_length <= 32_000
        if r.turn == 1:
            assert 8_000 <= r.input_length and r.parent is None
            assert len(r.hash_ids) == math.ceil(r.input_length / 16)
            assert r.hash_ids[:125] == tuple(range(125))  # 2000-token system prompt, shared
        else:
            p = by_id[r.parent]
            assert (p.session_id, p.turn + 1) == (r.session_id, r.turn)
            assert 200 <= r.input_length - p.input_length - p.output_length <= 1000
            assert 0.0 <= r.think_time_ms <= 2000.0
    assert max(r.turn for r in a.records) <= 10
    assert trace_stats(a)["sessions"] == 16


def test_agent_sessions_shrinks_the_default_system_prompt_to_a_short_history():
    short = agent_sessions(np.random.default_rng(0), num_sessions=2, history_tokens=(1000, 2000))
    assert short.metadata["params"]["system_tokens"] == 1000
    assert [(r.input_length, len(r.hash_ids)) for r in short.records[:2]] == [(1851, 116), (1075, 68)]
    assert short.records[0].hash_ids[:63] == tuple(range(63))              # 1000 // 16 = 62 blocks shared
    assert short.records[1].hash_ids[:63] == tuple(range(62)) + (116,)
    assert agent_sessions(np.random.default_rng(0)).metadata["params"]["system_tokens"] == 2000
    with pytest.raises(ValueError, match=r"system_tokens must be in \[0, history_tokens\[0\]=1000\], got 2000"):
        agent_sessions(np.random.default_rng(0), history_tokens=(1000, 2000), system_tokens=2000)


def test_agent_sessions_validates_arguments():
    with pytest.raises(ValueError):
        agent_sessions(np.random.default_rng(0), system_tokens=9000)
    with pytest.raises(ValueError):
        agent_sessions(np.random.default_rng(0), new_tokens=(10, 5))


# ---------------------------------------------------------------- block-size rule

@pytest.mark.parametrize("engine", [1, 2, 8, 16, 32, 48, 512])
def test_check_block_sizes_accepts_divisors_and_multiples(engine):
    check_block_sizes(16, engine)


def test_check_block_sizes_explains_what_works():
    with pytest.raises(TraceError) as info:
        check_block_sizes(16, 24)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "1, 2, 4, 8, 16" in message and "32, 48, 64" in message and "24" in message
    with pytest.raises(ValueError):
        check_block_sizes(512, 0)


def test_resolve_hash_ids_shares_parent_output_between_siblings():
    parent = TraceRecord(0, 0.0, 20, 20, (0, 1))  # prompt 20 + output 20 = 40 tokens
    a = TraceRecord(1, 0.0, 50, 1, None, parent=0)
    b = TraceRecord(2, 0.0, 45, 1, None, parent=0)
    ids = resolve_hash_ids(Trace([parent, a, b], block_size=16))
    # block 0 inside the parent's prompt; block 1 (tokens 16-31) inside prompt+output: shared by
    # both children; blocks 2+ hold each child's own tokens
    assert ids[0] == (0, 1)
    assert ids[1][:2] == ids[2][:2] == (0, 2)
    assert ids[1][2:] == (3, 4) and ids[2][2:] == (5,)


def test_a_missing_field_names_the_lines_misspelt_key(tmp_path):
    path = _write_lines(tmp_path, [{"timestamp": 0, "input_length": 20, "output_lenght": 5, "hash_ids": [0]}])
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.field == "output_length" and info.value.line == 1
    assert info.value.reason == "required field missing (the line has 'output_lenght': misspelt?)"
    path = _write_lines(tmp_path, [{"timestamp": 0, "input_length": 20, "hash_ids": [0]}])
    with pytest.raises(TraceError, match=r"field 'output_length': required field missing$"):
        read_trace(path)
