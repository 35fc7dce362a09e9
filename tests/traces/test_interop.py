"""Importers of other tools' files (ShareGPT, BurstGPT, vllm bench serve) and the vllm bench-style result."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.traces.burstgpt import read_burstgpt
from kvroute.traces.detect import detect_format, read_any
from kvroute.traces.reader import TraceError, read_trace
from kvroute.traces.sharegpt import char_estimate, read_sharegpt
from kvroute.traces.vllm_bench import read_vllm_bench


SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "x" * 8},      # 2 tokens at 4 chars/token
        {"from": "gpt", "value": "y" * 12},       # 3
        {"from": "human", "value": "z" * 5},      # 2 (ceil 1.25)
        {"from": "gpt", "value": "w" * 4},        # 1
    ]},
    {"id": "b", "messages": [
        {"role": "system", "content": "s" * 40},  # 10
        {"role": "user", "content": "u" * 4},     # 1
        {"role": "assistant", "content": "r"},    # 1
    ]},
    {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
]


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_sharegpt_turns_are_a_session_with_parents(tmp_path):
    trace = read_sharegpt(_write(tmp_path, "s.json", SHAREGPT), block_size=4)
    rows = [(r.request_id, r.session_id, r.turn, r.parent, r.input_length, r.output_length,
             None if r.hash_ids is None else list(r.hash_ids)) for r in trace.records]
    assert rows == [
        (0, "a", 1, None, 2, 3, [0]),
        (1, "a", 2, 0, 7, 1, None),   # 2 + 3 history + 2 new
        (2, "b", 1, None, 11, 1, [1, 2, 3]),
    ]
    assert trace.metadata["skipped_conversations"] == 1 and trace.metadata["repeated_ids"] == 0
    assert "4 characters per token" in trace.metadata["tokens"]


def test_sharegpt_conversations_with_one_id_stay_two_sessions(tmp_path):
    twice = [SHAREGPT[0], {**SHAREGPT[1], "id": "a"}]
    trace = read_sharegpt(_write(tmp_path, "s.json", twice), block_size=4)
    assert [(r.session_id, r.turn) for r in trace.records] == [("a", 1), ("a", 2), ("a#1", 1)]
    assert trace.metadata["repeated_ids"] == 1
    result = CliRunner().invoke(cli, ["trace", "import", str(_write(tmp_path, "t.json", twice)), "--out",
                                      str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0 and "note: 1 conversation(s) whose id an earlier one has became session" in \
        result.output, result.output


def test_sharegpt_custom_counter_and_round_trip_through_import(tmp_path):
    src = _write(tmp_path, "s.json", SHAREGPT)
    trace = read_sharegpt(src, 16, count_tokens=char_estimate(1.0))
    assert [r.input_length for r in trace.records] == [8, 25, 44]
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "import", str(src), "--out", str(out), "--chars-per-token", "1"])
    assert result.exit_code == 0, result.output
    back = read_trace(out)
    assert [(r.input_length, r.output_length, r.parent) for r in back.records] == [(8, 12, None), (25, 4, 0), (44, 1, None)]
    assert back.block_size == 16


def test_sharegpt_errors_name_record_and_field(tmp_path):
    bad = [{"id": "a", "conversations": [{"from": "human", "value": "x"}, {"from": "robot", "value": "y"}]}]
    with pytest.raises(TraceError, match=r"s.json: field '\[0\].conversations\[1\].from': unknown role 'robot'"):
        read_sharegpt(_write(tmp_path, "s.json", bad), 16)
    with pytest.raises(TraceError, match=r"field '\[0\].conversations\[0\].value': missing"):
        read_sharegpt(_write(tmp_path, "s.json", [{"conversations": [{"from": "human"}]}]), 16)
    with pytest.raises(TraceError, match="no conversation has a user message answered"):
        read_sharegpt(_write(tmp_path, "s.json", [{"conversations": []}]), 16)


def test_sharegpt_tokenizer_without_transformers_is_a_clear_error(monkeypatch):
    import sys

    from kvroute.traces.sharegpt import tokenizer_counter

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="needs the transformers package"):
        tokenizer_counter("gpt2")


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
5.5,ChatGPT,1000,0,1000,Conversation log
7.25,GPT-4,20,3,23,API log
"""


def test_burstgpt_rows_skip_failures_and_start_at_zero(tmp_path):
    path = _write(tmp_path, "b.csv", BURST)
    assert detect_format(path) == "burstgpt"
    trace = read_burstgpt(path, 512)
    assert [(r.request_id, r.timestamp_ms, r.input_length, r.output_length, list(r.hash_ids))
            for r in trace.records] == [(0, 0.0, 472, 18, [0]), (1, 2250.0, 20, 3, [1])]
    assert trace.metadata == {"origin": "burstgpt", "skipped_failed_rows": 1}
    assert [r.session_id for r in trace.records] == [None, None]
    # a failed first row sends nothing: time 0 is the first kept row's (it added 0.5 s of idle time)
    failed_first = BURST.replace("Log Type\n", "Log Type\n4,ChatGPT,900,0,900,Conversation log\n")
    late = read_burstgpt(_write(tmp_path, "b2.csv", failed_first), 512)
    assert [r.timestamp_ms for r in late.records] == [0.0, 2250.0] and late.metadata["skipped_failed_rows"] == 2


def test_burstgpt_1_2_session_ids_are_kept_and_no_parent_made(tmp_path):
    path = _write(tmp_path, "b.csv", "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                                     "Total tokens,Log Type\n"
                                     "5,abc123,1.2,ChatGPT,472,18,490,Conversation log\n"
                                     "6,abc123,0.8,ChatGPT,530,20,550,Conversation log\n"
                                     "7,,0.1,GPT-4,20,3,23,API log\n")
    assert detect_format(path) == "burstgpt"
    trace = read_burstgpt(path, 512)
    assert [(r.session_id, r.parent) for r in trace.records] == [("abc123", None), ("abc123", None), (None, None)]


def test_burstgpt_errors_name_line_and_column(tmp_path):
    with pytest.raises(TraceError, match=r"b.csv:3: field 'Response tokens': expected an int"):
        read_burstgpt(_write(tmp_path, "b.csv", BURST.replace(",0,1000", ",lots,1000")))
    with pytest.raises(TraceError, match=r"b.csv:2: field 'Request tokens': expected an int"):
        read_burstgpt(_write(tmp_path, "b.csv", BURST.replace(",472,", ",4_72,")))
    assert read_burstgpt(_write(tmp_path, "b.csv", BURST.replace(",472,", ",472.0,"))).records[0].input_length == 472
    with pytest.raises(TraceError, match=r"b.csv:1: field 'Request tokens': column missing"):
        read_burstgpt(_write(tmp_path, "b.csv", "Timestamp,Response tokens\n1,2\n"))
    with pytest.raises(TraceError, match=r"b.csv:3: field 'Timestamp': 1.0 s is earlier"):
        read_burstgpt(_write(tmp_path, "b.csv", BURST.replace("5.5,", "1,")))


def _bench_result(**extra):
    doc = {"model_id": "m", "request_rate": 2.0, "mean_ttft_ms": 12.5, "input_lens": [100, 30, 50],
           "output_lens": [10, 0, 5], "ttfts": [0.1, 0.0, 0.2], "latencies": [1.0, 0.0, 0.5],
           "start_times": [1000.5, 1000.0, 1001.25], "errors": ["", "timeout", ""]}
    doc.update(extra)
    return doc


def test_vllm_bench_result_becomes_a_trace(tmp_path):
    path = _write(tmp_path, "r.json", _bench_result())
    assert detect_format(path) == "vllm-bench"
    trace = read_any(path)
    assert [(r.request_id, r.timestamp_ms, r.input_length, r.output_length) for r in trace.records] == [
        (0, 0.0, 100, 10), (2, 750.0, 50, 5)]
    assert trace.metadata["skipped_failed"] == 1
    assert trace.metadata["measured"] == {"model_id": "m", "request_rate": 2.0, "mean_ttft_ms": 12.5}


def test_vllm_bench_errors_name_the_field(tmp_path):
    with pytest.raises(TraceError, match=r"field 'output_lens': has 2 entries but input_lens has 3"):
        read_vllm_bench(_write(tmp_path, "r.json", _bench_result(output_lens=[1, 2])))
    with pytest.raises(TraceError, match=r"field 'input_lens\[1\]': expected an int"):
        read_vllm_bench(_write(tmp_path, "r.json", _bench_result(input_lens=[1, "x", 3])))
    with pytest.raises(TraceError, match="not a vllm bench serve result"):
        read_vllm_bench(_write(tmp_path, "r.json", {"duration": 1}))


def test_simulate_runs_on_an_imported_format_directly(tmp_path):
    path = _write(tmp_path, "b.csv", BURST)
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "trace " in json.loads(result.output)["scenario"]


def _run_result():
    import numpy as np
    import pandas as pd

    from kvroute.sim.cluster.metrics import RECORD_COLUMNS, RunResult

    nan = float("nan")
    rows = [  # request_id, session, turn, worker, arrival, first, finish, ttft, e2e, tpot, prompt, cached, out, pre,
        # status, error, wait, queued, scheduled, queue_time, prefill_time, decode_time, engine_first_token
        (0, None, None, 0, 0.0, 0.5, 2.5, 0.5, 2.5, 0.5, 100, 0, 5, 0, "ok", None, 0.0, 0.1, 0.1, 0.0, 0.4, 2.0, 0.5),
        (1, None, None, 1, 1.0, 1.25, 1.25, 0.25, 0.25, nan, 40, 0, 1, 0, "ok", None, 0.5, 1.1, 1.15, 0.05, 0.1, 0.0,
         1.25),
        (2, None, None, -1, 1.5, nan, nan, nan, nan, nan, 9000, 0, 0, 0, "failed", "prompt too long", 0.0, nan, nan,
         nan, nan, nan, nan),
    ]
    return RunResult(pd.DataFrame(rows, columns=RECORD_COLUMNS), np.array([0.5, 0.5, 0.5, 0.5]), pd.DataFrame(),
                     "kv_aware", 0)


def test_vllm_bench_result_fields_follow_vllm_rules():
    from datetime import datetime

    from kvroute.sim.study.bench_result import vllm_bench_result
    from kvroute.sim.cluster.metrics import ServiceClass

    doc = vllm_bench_result(_run_result(), ServiceClass(1.0, 0.4), "m", "kv_aware", date=datetime(2026, 1, 2, 3, 4, 5))
    assert doc["date"] == "20260102-030405" and doc["request_rate"] == "inf"
    assert (doc["completed"], doc["failed"], doc["duration"]) == (2, 1, 2.5)
    assert (doc["total_input_tokens"], doc["total_output_tokens"]) == (140, 6)
    assert doc["output_lens"] == [5, 1, 0] and doc["input_lens"] == [100, 40, 9000]
    assert doc["ttfts"] == [0.5, 0.25, 0.0] and doc["errors"] == ["", "", "prompt too long"]
    # request 0's TPOT (2.5 - 0.5) / 4 = 0.5 > 0.4, request 1's is 0 (one token): one good request
    assert doc["request_goodput"] == 1 / 2.5
    assert doc["mean_tpot_ms"] == 500.0 and doc["mean_ttft_ms"] == 375.0 and doc["p50_e2el_ms"] == 1375.0
    assert doc["max_concurrent_requests"] == 2
    json.dumps(doc, allow_nan=False)


def test_written_bench_result_reads_back_as_the_same_requests(tmp_path):
    from kvroute.sim.study.bench_result import vllm_bench_result
    from kvroute.sim.cluster.metrics import ServiceClass

    path = _write(tmp_path, "r.json", vllm_bench_result(_run_result(), ServiceClass(), "m", "x"))
    trace = read_vllm_bench(path)
    assert [(r.request_id, r.timestamp_ms, r.input_length, r.output_length) for r in trace.records] == [
        (0, 0.0, 100, 5), (1, 1000.0, 40, 1)]


def test_compare_out_writes_one_bench_result_per_policy(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "2", "--workers", "2", "--rounds", "1",
                                      "--policies", "round_robin,dynamo:overlap_weight=2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.glob("vllm-bench-*.json"))
    assert names == ["vllm-bench-dynamo_overlap_weight_2.json", "vllm-bench-round_robin.json"]
    doc = json.loads((out / names[1]).read_text())
    assert doc["label"] == "round_robin" and doc["num_prompts"] == 8 and doc["completed"] == 8


def test_sharegpt_tokens_counted_by_a_local_tokenizer(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[live]' brings it)")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from kvroute.traces.sharegpt import tokenizer_counter

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    count = tokenizer_counter(str(tmp_path / "tok"))
    assert count("hello world hello") == 3 and count("") == 1
    conv = [{"conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "hello"}]}]
    trace = read_sharegpt(_write(tmp_path, "s.json", conv), 16, count)
    assert [(r.input_length, r.output_length) for r in trace.records] == [(2, 1)]


def test_bench_result_files_and_titles_name_a_config_policy_by_its_file():
    """``epp:../x/report.md#precise`` wrote ``vllm-bench-epp_.._x_report.md_precise.json`` and put
    the whole path in the figures' titles; tables and legends already showed ``epp:precise``."""
    from kvroute.sim.study.bench_result import result_filenames
    from kvroute.sim.study.figure_style import scenario_title

    specs = ["epp:../x/report.md#precise", "epp:/runs/a/load.yaml", "dynamo:overlap_weight=2", "epp:/b/load.yaml"]
    assert result_filenames(specs) == {
        "epp:../x/report.md#precise": "vllm-bench-epp_precise.json",
        "epp:/runs/a/load.yaml": "vllm-bench-epp__runs_a_load.yaml.json",  # two load.yaml: kept whole
        "dynamo:overlap_weight=2": "vllm-bench-dynamo_overlap_weight_2.json",
        "epp:/b/load.yaml": "vllm-bench-epp__b_load.yaml.json"}
    assert scenario_title("seed-chat", specs[:3]) == (
        "seed-chat | policies epp:precise, epp:load.yaml, dynamo:overlap_weight=2")
