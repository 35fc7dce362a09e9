"""The notes under a comparison's table that the numbers alone do not say (``kvroute.cli.run_notes``)."""

import json
from types import SimpleNamespace

from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.cli.run_notes import kv_turnover_note


def _run(evictions, blocks=(100, 100)):
    rows = [{"num_gpu_blocks": b, "num_evictions": e} for b, e in zip(blocks, evictions)]
    return SimpleNamespace(worker_rows=lambda: rows)


def test_turnover_note_names_each_policy_whose_runs_evicted_the_blocks_held_once_over():
    comparison = SimpleNamespace(policies=["round_robin", "kv_aware", "least_loaded"], runs={
        "round_robin": [_run((150, 150)), _run((250, 250))],  # 400 per run: 2.0 times the 198 held (null blocks out)
        "kv_aware": [_run((99, 98)), _run((99, 98))],         # 197: under once over, left out
        "least_loaded": [_run((300, 0)), _run((0, 0))],       # 150 per run on average: under once over too
    })
    assert kv_turnover_note(comparison, 16) == (
        "Note: the KV cache turned over: per run (mean over rounds) the workers evicted 400 cached blocks under "
        "round_robin, 2.0 times the 198 blocks of 16 tokens they can cache in (3,168 tokens; vLLM keeps one block of "
        "each worker back). Hit rates and TTFT then depend "
        "on KV memory (try --kv-blocks or --workers); the preemption row counts only requests pushed out while "
        "running. Each worker's KV use over time: --time-series.")
    comparison.runs["kv_aware"] = [_run((100, 100))]
    comparison.runs["least_loaded"] = [_run((1000, 1000))]
    assert ("400 cached blocks under round_robin, 2.0 times the 198 blocks of 16 tokens they can cache in (3,168 tokens; "
            "vLLM keeps one block of each worker back); "
            "200 under kv_aware (1.0 times); and 2,000 under least_loaded (10.1 times). Hit") in kv_turnover_note(
        comparison, 16)
    comparison.runs = {p: [_run((10, 10))] for p in comparison.policies}
    assert kv_turnover_note(comparison, 16) == ""


def test_compare_says_when_the_cache_turned_over_and_not_otherwise():
    import re

    args = ["compare", "--chats", "8", "--turns", "3", "--workers", "1", "--policies", "round_robin", "--rounds", "1",
            "--json"]
    roomy = json.loads(CliRunner().invoke(cli, args, catch_exceptions=False).output)
    assert not any("turned over" in n for n in roomy["notes"])
    tight = json.loads(CliRunner().invoke(cli, args + ["--kv-blocks", "300"], catch_exceptions=False).output)
    note = next(n for n in tight["notes"] if "turned over" in n)
    evicted, times = re.search(r"evicted ([\d,]+) cached blocks under round_robin, ([\d.]+) times the 299 blocks of 16 "
                               r"tokens they can cache in \(4,784 tokens; vLLM keeps one block of each worker back\)", note).groups()
    assert int(evicted.replace(",", "")) >= 299 and float(times) == round(int(evicted.replace(",", "")) / 299, 1)


def test_same_routing_note_names_a_policy_that_sent_every_request_where_an_earlier_one_did():
    import pandas as pd

    from kvroute.cli.run_notes import same_routing_note

    def rows(policy, workers):
        return pd.DataFrame({"policy": policy, "round": [0, 0, 1, 1], "request_id": [0, 1, 0, 1], "worker": workers})

    table = pd.concat([rows("round_robin", [0, 1, 0, 1]), rows("kv_aware", [0, 0, 1, 1]),
                       rows("sglang", [0, 0, 1, 1]), rows("dynamo", [0, 0, 1, 0])])
    assert same_routing_note(table) == (
        "Note: sglang routed every request to the worker kv_aware chose, in every round, so their rows differ in "
        "nothing but the name (`kvroute policies` gives each one's rule and thresholds).")
    assert same_routing_note(table[table["policy"] != "sglang"]) == ""
    assert same_routing_note(rows("kv_aware", [0, 0, 1, 1])) == ""


def test_a_reply_cut_to_the_context_left_is_noted_with_one_example(tmp_path):
    """vLLM's OpenAI server lowers max_tokens to max_model_len - prompt (32,768 for the A6000
    prior): the 30,000-token prompts asking 4,000 get 2,768; the 1,000-token ones all they ask."""
    import math

    trace = tmp_path / "t.jsonl"
    with open(trace, "w") as fh:
        for i in range(6):
            n = 30000 if i % 2 else 1000
            fh.write(json.dumps({"request_id": i, "timestamp": i * 100.0, "input_length": n, "output_length": 4000,
                                 "hash_ids": list(range(i * 100, i * 100 + math.ceil(n / 512)))}) + "\n")
    result = CliRunner().invoke(cli, ["compare", "--trace", str(trace), "--policies", "round_robin,kv_aware",
                                      "--rounds", "2", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert ("Note: 12 of 24 served requests (all policies and rounds) asked for more output than max_model_len 32,768 "
            "leaves after their prompt and got what is left, as vLLM's OpenAI server lowers max_tokens; e.g. request "
            "1: 30,000 prompt tokens, 4,000 asked, 2,768 generated") in result.output
    import pandas as pd

    records = pd.read_parquet(tmp_path / "out" / "records.parquet")
    assert sorted(records["output_tokens"].unique()) == [2768, 4000]
    assert "asked for more output" not in CliRunner().invoke(cli, ["compare", "--rounds", "1"]).output


def test_goodput_that_cannot_tell_runs_apart_is_noted():
    from kvroute.cli.run_notes import flat_goodput_note

    def comparison(*shares):
        return SimpleNamespace(rows=[{"policy": "p", "goodput_share": s} for s in shares])

    assert flat_goodput_note(comparison(1.0, 1.0, 1.0), 2.0, 0.1) == (
        "Note: goodput share is 1.000 in every run: every request met TTFT <= 2 s and TPOT <= 0.1 s, so goodput "
        "does not tell the runs apart; --slo-ttft and --slo-tpot set your service's bounds.")
    assert flat_goodput_note(comparison(0.0, 0.0), 0.05, 0.01).startswith(
        "Note: goodput share is 0.000 in every run: no request met TTFT <= 0.05 s and TPOT <= 0.01 s")
    assert flat_goodput_note(comparison(1.0, 0.98), 2.0, 0.1) == ""
    assert flat_goodput_note(comparison(0.5, 0.5), 2.0, 0.1) == ""  # alike, but the bound binds
    tight = CliRunner().invoke(cli, ["compare", "--rounds", "1", "--slo-ttft", "0.3"]).output
    assert "goodput share is" not in tight and "goodput share is 1.000 in every run" in CliRunner().invoke(
        cli, ["compare", "--rounds", "1"]).output


def test_notes_name_a_config_policy_as_the_tables_do():
    """The turnover and front-end notes named epp:../shared/published/...md#random-scheduling where
    the table's column read epp:random-scheduling."""
    from kvroute.cli.run_notes import named_as_tables

    specs = ["epp:../p/report.md#precise", "epp:../p/report.md#precise-load", "kv_aware"]
    notes = ["Note: 9 under epp:../p/report.md#precise-load and 3 under epp:../p/report.md#precise; kv_aware none"]
    assert named_as_tables(notes, specs) == ["Note: 9 under epp:precise-load and 3 under epp:precise; kv_aware none"]
