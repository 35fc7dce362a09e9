"""The corpus of bad inputs from issue 13, each with the one-line message it must give.

Every case runs the real command (click's runner, exceptions not caught) and checks: a non-zero
exit, exactly one ``Error:`` line holding the expected text, and no traceback. The inputs that
used to hang, exhaust memory or recurse too deep run to the end with their requests counted.
Stream-level server answers (negative or string ``cached_tokens``, a cut stream, an empty first
chunk) are in ``calibrate/live/test_live_client.py``; capacity-proportional memory in
``sim/cluster/test_memory.py``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from tests.support.paths import CALIBRATE_DATA


PROFILE = {
    "name": "p",
    "engine": {"block_size": 16, "num_gpu_blocks": 4096},
    "step_cost": {"step_overhead_s": 0.002, "weight_load_s": 0.01, "per_token_s": 1e-4, "per_request_s": 1e-5,
                  "prefill_attn_s": 1e-9, "decode_attn_s": 1e-7},
    "overheads": {"api_server_s": 0.1},
}


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def assert_error(result, expected: str) -> None:
    """Non-zero exit, one ``Error:`` line containing ``expected``, no traceback."""
    out = result.output
    assert result.exit_code != 0, f"silently accepted:\n{out}"
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert expected in errors[0], out
    assert "Traceback" not in out and "internal error" not in out, out


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def jsonl(path: Path, *objs) -> Path:
    return write(path, "".join(json.dumps(o) + "\n" for o in objs))


def profile_file(tmp_path: Path, **changes) -> Path:
    doc = json.loads(json.dumps(PROFILE))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    return write(tmp_path / "profile.json", json.dumps(doc))


# -- traces: lengths and sizes that used to hang or exhaust memory -----------------------------

def test_huge_output_length(tmp_path):
    trace = jsonl(tmp_path / "t.jsonl", {"timestamp": 0, "input_length": 600, "output_length": 10**12,
                                         "hash_ids": [1, 2]})
    assert_error(run("simulate", "--trace", trace),
                 "t.jsonl:1: field 'output_length': length must be <= 134,217,728 tokens, got 1000000000000")


def test_long_output_below_the_limit_runs_capped(tmp_path):
    trace = jsonl(tmp_path / "t.jsonl", {"timestamp": 0, "input_length": 600, "output_length": 10**8,
                                         "hash_ids": [1, 2]})
    result = run("simulate", "--trace", trace, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policies"]["round_robin"]["failed"]["mean"] == 0


def test_azure_huge_context(tmp_path):
    csv = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,1000000000000,10\n")
    assert_error(run("simulate", "--trace", csv),
                 "a.csv:2: field 'ContextTokens': length must be <= 134,217,728 tokens")


def test_azure_counts_that_are_not_a_positive_int_say_so_alike(tmp_path):
    """'x' read "expected a non-negative int", but 0 is refused too (a request has >= 1 token)."""
    for text, reason in (("x", "expected an int >= 1 (tokens), got 'x'"), ("0", "length must be >= 1, got 0")):
        csv = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        f"2023-11-16 18:15:46.6805900,{text},10\n")
        assert_error(run("simulate", "--trace", csv), f"a.csv:2: field 'ContextTokens': {reason}")


def test_azure_long_context_is_rejected_by_max_model_len_without_expanding(tmp_path):
    csv = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,100000000,10\n"
                                    "2023-11-16 18:15:47.6805900,100,10\n")
    result = run("simulate", "--trace", csv, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policies"]["round_robin"]["failed"]["mean"] == 1


def test_absurd_block_size_in_metadata(tmp_path):
    trace = jsonl(tmp_path / "t.jsonl", {"kvroute_trace": 1, "block_size": 10**12},
                  {"timestamp": 0, "input_length": 60_000_000, "output_length": 10, "hash_ids": [1]})
    assert_error(run("simulate", "--trace", trace),
                 "t.jsonl:1: field 'block_size': expected an int between 1 and 1,048,576 (tokens)")


# -- sessions that used to recurse too deep ---------------------------------------------------

def test_two_thousand_turns_run_closed_loop(tmp_path):
    out = tmp_path / "long.jsonl"
    assert run("trace", "generate", "seed-chat", "--chats", 1, "--turns", 2000, "--out", out).exit_code == 0
    result = run("simulate", "--trace", out, "--json")
    assert result.exit_code == 0, result.output
    failed = json.loads(result.output)["policies"]["round_robin"]["failed"]["mean"]
    assert 0 < failed < 2000  # turns past max_model_len fail, and every later turn is counted


def test_six_hundred_record_chain_open_loop(tmp_path):
    objs = [{"kvroute_trace": 1, "block_size": 16}, {"timestamp": 0, "input_length": 16, "output_length": 1,
                                                     "hash_ids": [1]}]
    objs += [{"timestamp": 0, "input_length": 16 + 2 * i, "output_length": 1, "parent": i - 1} for i in range(1, 600)]
    result = run("simulate", "--trace", jsonl(tmp_path / "chain.jsonl", *objs), "--replay", "open", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policies"]["round_robin"]["failed"]["mean"] == 0


# -- wrong numbers that used to pass with exit 0 ------------------------------------------------

@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_profile_non_finite_overhead(tmp_path, value):
    path = profile_file(tmp_path, overheads__api_server_s=value)
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", path),
                 f"field 'overheads.api_server_s': must be a finite number, got {value!r}")


def test_profile_misspelt_coefficient_is_an_error_not_ignored(tmp_path):
    path = profile_file(tmp_path, step_cost__per_tokn_s=1e-5)
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", path),
                 "field 'step_cost.per_tokn_s': unknown field (known: decode_attn_s, per_request_s, per_token_s, "
                 "prefill_attn_s, step_overhead_s, weight_load_s)")


@pytest.mark.parametrize("args, expected", [
    (("--think-time", "inf"), "Invalid value for '--think-time': value must be a finite number >= 0, got inf"),
    (("--think-time", "nan"), "Invalid value for '--think-time': value must be a finite number >= 0, got nan"),
    (("--think-time", "exponential:1e300"), "Invalid value for '--think-time': exponential mean must be <= 1e+09"),
    (("--reply-tokens", "lognormal:90"), "Invalid value for '--reply-tokens': lognormal takes 2 number(s)"),
    (("--request-rate", "0"), "Invalid value for '--request-rate': must be > 0.0, got 0.0"),
    (("--kv-blocks", "0"), "Invalid value for '--kv-blocks': must be >= 2, got 0"),
    (("--max-model-len", "0"), "Invalid value for '--max-model-len': must be >= 1, got 0"),
    (("--max-requests", "-1"), "Invalid value for '--max-requests': must be >= 1, got -1"),
    (("--arrival-spread", "inf"), "Invalid value for '--arrival-spread': must be a finite number, got inf"),
    (("--workers", "0"), "Invalid value for '--workers': must be >= 1, got 0"),
    (("--seed", "-1"), "Invalid value for '--seed': must be >= 0, got -1"),
    (("--slo-ttft", "0"), "Invalid value for '--slo-ttft': must be > 0.0, got 0.0"),
    (("--policy", "kv_aware,kv_aware"), "policy kv_aware listed twice; name each policy once"),
])
def test_simulate_flags(args, expected):
    assert_error(run("simulate", "--chats", 2, "--turns", 1, *args), expected)


def test_compare_policy_listed_twice():
    assert_error(run("compare", "--chats", 2, "--turns", 1, "--policies", "kv_aware,round_robin,kv_aware"),
                 "Invalid value for '--policies': policy kv_aware listed twice")


def test_a_policy_parameter_out_of_range_names_the_flag_before_any_run():
    result = run("compare", "--chats", 2, "--turns", 1, "--policies", "round_robin,kv_aware:min_match_share=2")
    assert_error(result, "Invalid value for '--policies': kv_aware: min_match_share must be in [0, 1], got 2.0")
    assert "time to complete" not in result.output  # no table was started


def test_sensitivity_trajectories_name_the_flag():
    assert_error(run("sensitivity", "--trajectories", 0), "Invalid value for '--trajectories': must be >= 2, got 0")


@pytest.mark.parametrize("args, expected", [
    (("--chats", "0", "--turns", "0"), "Invalid value for '--chats': must be >= 1, got 0"),
    (("--block-size", "0"), "Invalid value for '--block-size': must be >= 1, got 0"),
])
def test_trace_generate_flags(tmp_path, args, expected):
    out = tmp_path / "t.jsonl"
    assert_error(run("trace", "generate", "seed-chat", "--out", out, *args), expected)
    assert not out.exists()


def test_azure_honours_the_block_size(tmp_path):
    from kvroute.cli.scenario import read_any_trace

    csv = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,100,10\n")
    trace = read_any_trace(csv, 16)
    assert trace.block_size == 16 and len(trace.records[0].hash_ids) == 7


@pytest.mark.parametrize("name, text, expected", [
    ("empty.jsonl", "", "empty.jsonl: the trace has no records (an empty file, or only a metadata line)"),
    ("meta.jsonl", '{"kvroute_trace": 1, "block_size": 16}\n', "meta.jsonl: the trace has no records"),
    ("empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "empty.csv: the trace has no data rows"),
])
def test_empty_trace(tmp_path, name, text, expected):
    assert_error(run("simulate", "--trace", write(tmp_path / name, text)), expected)


def test_parent_and_hash_ids_that_disagree(tmp_path):
    trace = jsonl(tmp_path / "t.jsonl", {"kvroute_trace": 1, "block_size": 16},
                  {"timestamp": 0, "input_length": 32, "output_length": 16, "hash_ids": [1, 2]},
                  {"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1, 77, 78, 79], "parent": 0})
    assert_error(run("simulate", "--trace", trace),
                 "t.jsonl:3: field 'hash_ids': entry 1 is 77 but block 1 of parent 0's prompt is 2")


def test_parent_and_hash_ids_that_agree_are_accepted(tmp_path):
    trace = jsonl(tmp_path / "t.jsonl", {"kvroute_trace": 1, "block_size": 16},
                  {"timestamp": 0, "input_length": 32, "output_length": 16, "hash_ids": [1, 2]},
                  {"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1, 2, 78, 79], "parent": 0})
    assert run("simulate", "--trace", trace).exit_code == 0


def test_router_block_tokens_not_a_multiple_of_the_block_size():
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile

    with pytest.raises(ValueError, match="router_block_tokens must be a multiple of the block size 16 "
                                         r"\(or at most one block\), got 24"):
        ClusterSpec(load_profile("a6000-qwen2.5-7b"), router_block_tokens=24)


# -- tracebacks that became errors --------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("[1, 2]", "a profile is a JSON object, got a list"),
    ("null", "a profile is a JSON object, got null"),
    ("{", "profile.json:1: not valid JSON"),
])
def test_profile_not_an_object(tmp_path, text, expected):
    path = write(tmp_path / "profile.json", text)
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", path), expected)


def test_profile_directory(tmp_path, monkeypatch):
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", tmp_path), "is a directory")
    # a folder bearing a shipped profile's name (a run's --out) does not hide the shipped profile
    from kvroute.sim.timing.profile import load_profile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu-tiny-qwen2-x2").mkdir()
    assert load_profile("cpu-tiny-qwen2-x2").name == "cpu-tiny-qwen2-x2"


def test_azure_mixed_time_zones(tmp_path):
    csv = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900+00:00,100,10\n2023-11-16 18:15:47.6805900,100,10\n")
    assert_error(run("simulate", "--trace", csv), "a.csv:3: field 'TIMESTAMP': 2023-11-16 18:15:47.6805900 has no "
                                                  "time zone but the first row's timestamp")


def test_gzip_and_binary_traces(tmp_path):
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"timestamp": 0}\n'))
    assert_error(run("simulate", "--trace", gz), "t.jsonl.gz:1: is gzip-compressed; decompress it first")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b'{"timestamp": 0}\n\xff\xfe\x00')
    assert_error(run("simulate", "--trace", binary), "b.jsonl:2: not UTF-8 text (byte 0xff)")


@pytest.mark.parametrize("fmt, header", [
    ("azure", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"),
    ("burstgpt", b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,x\n"),
])
def test_a_gzip_compressed_csv_is_said_to_be_one(tmp_path, fmt, header):
    """It read "not UTF-8 text (invalid start byte)", without a line or what to do."""
    gz = tmp_path / "t.csv"
    gz.write_bytes(gzip.compress(header))
    assert_error(run("trace", "import", gz, "--format", fmt, "--out", tmp_path / "o.jsonl"),
                 "t.csv:1: is gzip-compressed; decompress it first (gunzip)")


def test_a_file_in_no_trace_format_names_the_formats_kvroute_reads(tmp_path):
    readme = write(tmp_path / "README.md", "# kvroute\n\nA discrete-event simulator of vLLM workers.\n")
    result = run("compare", "--trace", readme, "--rounds", 1, "--policies", "round_robin")
    assert_error(result, f"{readme}: not a trace format kvroute reads (its first line is not a JSON object); "
                         "it reads kvroute or Mooncake JSON Lines (.jsonl), Azure or BurstGPT CSV (.csv), "
                         "ShareGPT or vllm bench serve JSON (.json)")
    assert "malformed JSON" not in result.output
    # JSON Lines under another suffix still reads; a .jsonl file keeps the reader's own message
    renamed = jsonl(tmp_path / "t.txt", {"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]})
    assert run("simulate", "--trace", renamed, "--trace-block-size", 32, "--json").exit_code == 0
    assert_error(run("simulate", "--trace", write(tmp_path / "r.jsonl", "# notes\n")),
                 "r.jsonl:1: malformed JSON: Expecting value at column 1")


def test_url_port_out_of_range(tmp_path):
    assert_error(run("validate", "--url", "http://127.0.0.1:99999", "--out", tmp_path / "v"),
                 "Invalid value for '--url': 'http://127.0.0.1:99999': Port out of range 0-65535")


@pytest.mark.parametrize("second", ["http://127.0.0.1:9", "http://127.0.0.1:9/", "http://localhost:9"])
@pytest.mark.parametrize("command", [["validate"], ["calibrate", "measure"]])
def test_the_same_server_twice_is_refused(tmp_path, second, command):
    assert_error(run(*command, "--url", "http://127.0.0.1:9", "--url", second, "--out", tmp_path / "v"),
                 f"Invalid value for '--url': {second!r} names the same server as 'http://127.0.0.1:9': each --url "
                 "is one worker")
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("events, expected", [
    (["tcp://127.0.0.1:8200"], "Invalid value for '--kv-events': one endpoint per server: 1 for 2 server(s)"),
    (["tcp://127.0.0.1:8200", "tcp://127.0.0.1:70000"],
     "Invalid value for '--kv-events': port 70000 out of range 1-65535 in 'tcp://127.0.0.1:70000'"),
    (["tcp://127.0.0.1:8200", "127.0.0.1:8201"],
     "Invalid value for '--kv-events': a ZeroMQ endpoint such as tcp://127.0.0.1:8200, got '127.0.0.1:8201'"),
    (["tcp://127.0.0.1:8200", "tcp://127.0.0.1:notaport"],
     "Invalid value for '--kv-events': a ZeroMQ endpoint such as tcp://127.0.0.1:8200, got 'tcp://127.0.0.1:notaport'"),
])
@pytest.mark.parametrize("command", [["validate"], ["calibrate", "measure"]])
def test_kv_event_endpoints_one_per_server(tmp_path, events, expected, command):
    urls = ["--url", "http://127.0.0.1:8100", "--url", "http://127.0.0.1:8101"]
    assert_error(run(*command, *urls, *[a for e in events for a in ("--kv-events", e)], "--out", tmp_path / "v"),
                 expected)
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("slots", ["0", "1000000000"])  # a billion slots would be built before any burst ran
def test_burst_slots_in_range(tmp_path, slots):
    assert_error(run("calibrate", "measure", "--url", "http://127.0.0.1:8100", "--burst-slots", slots,
                     "--out", tmp_path / "v"),
                 "Invalid value for '--burst-slots': " + ("must be >= 1, got 0" if slots == "0"
                                                            else "must be <= 1000, got 1000000000"))
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("meta, expected", [
    ("[", "meta.json:1: not valid JSON"),
    ("[1]", "meta.json: expected a JSON object, got a list"),
    ('{"servers": 5}', "meta.json: field 'servers': expected a list of servers, got int (5)"),
    ('{"servers": [{"url": "u"}]}', "meta.json: servers[0]: field 'model': required field missing"),
    ('{"servers": [], "servers": []}', "meta.json: field 'servers': given twice in one object"),
])
def test_bad_meta_json_for_fit(tmp_path, meta, expected):
    write(tmp_path / "meta.json", meta)
    write(tmp_path / "requests.csv", "x\n1\n")
    assert_error(run("calibrate", "fit", tmp_path), expected)


@pytest.mark.parametrize("args, expected", [
    (["--client-core", "1"], "Invalid value for '--client-core': needs --api-cores own"),
    (["--client-core", "-2", "--api-cores", "own"], "Invalid value for '--client-core'"),
    (["--client-core", "one"], "Invalid value for '--client-core': 'one' is not a valid integer"),
])
def test_bad_client_core_for_fit(tmp_path, args, expected):
    assert_error(run("calibrate", "fit", tmp_path, *args), expected)


@pytest.mark.parametrize("name, text, expected", [
    ("requests.csv", "exp_id,ttft_s\n0,0.1\n1,fast\n", "requests.csv:3: field 'ttft_s': expected a number, got 'fast'"),
    ("experiments.csv", "exp_id,api_cpu_s\n0,0.1\n1,\n2,abc\n",
     "experiments.csv:4: field 'api_cpu_s': expected a number, got 'abc'"),  # an empty cell is a missing value
    ("requests.csv", "exp_id,token_times\n0,0.01 0.02\n1,\n2,0.01 abc\n",
     "requests.csv:4: field 'token_times': expected space-separated seconds, got 'abc'"),
    ("requests.csv", "exp_id,token_times\n0,0.01 nan 0.03\n",
     "requests.csv:2: field 'token_times': expected finite seconds, got nan"),
])
def test_bad_number_in_a_sweep_table_for_fit(tmp_path, name, text, expected):
    write(tmp_path / "meta.json", '{"servers": []}')
    write(tmp_path / "requests.csv", "x\n1\n")
    write(tmp_path / name, text)
    assert_error(run("calibrate", "fit", tmp_path), expected)


def test_unreachable_dask_scheduler(monkeypatch):
    pytest.importorskip("distributed")
    from kvroute.sim.study import executors

    monkeypatch.setattr(executors, "DASK_CONNECT_TIMEOUT_S", 0.5)
    assert_error(run("sweep", "--chats", 2, "--turns", 1, "--rounds", 1, "--no-progress",
                     "--address", "tcp://127.0.0.1:1"),
                 "cannot reach the Dask scheduler at tcp://127.0.0.1:1")


def test_dask_local_cluster_is_loopback_without_dashboard(monkeypatch):
    distributed = pytest.importorskip("distributed")
    from kvroute.sim.study import sweep as sweep_module

    seen = {}

    class Refused(Exception):
        pass

    def fake_cluster(**kwargs):
        seen.update(kwargs)
        raise Refused

    monkeypatch.setattr(distributed, "LocalCluster", fake_cluster)
    with pytest.raises(Refused):
        sweep_module.sweep(sweep_module.grid(chats=2, turns=1), executor="dask", progress=False)
    assert seen["host"] == "127.0.0.1" and seen["dashboard_address"] is None


# -- --out checked before the work -------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ("compare", "--chats", 2, "--turns", 1, "--rounds", 1, "--out", "/proc/kvroute-out"),
    ("sweep", "--chats", 2, "--turns", 1, "--rounds", 1, "--no-progress", "--out", "/proc/kvroute-out.csv"),
    ("trace", "generate", "seed-chat", "--out", "/proc/kvroute-out.jsonl"),
])
def test_unwritable_out_fails_before_the_work(command):
    assert_error(run(*command), "cannot write there")


def test_out_that_is_a_file(tmp_path):
    path = write(tmp_path / "file", "x")
    assert_error(run("compare", "--chats", 2, "--turns", 1, "--rounds", 1, "--out", path),
                 "is a file")


def test_failed_write_leaves_no_file(tmp_path):
    from kvroute.traces.outputs import atomic_output

    target = tmp_path / "rows.csv"
    with pytest.raises(OSError, match=f"cannot write {target}: No space left on device"):
        with atomic_output(target) as tmp:
            tmp.write_text("half")
            raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag,value,expected", [
    ("--engine-spin", "-1", "Invalid value for '--engine-spin': must be >= 0"),
    ("--engine-spin", "inf", "Invalid value for '--engine-spin': must be a finite number, got inf"),
    ("--client-busy", "nan", "Invalid value for '--client-busy': must be a finite number, got nan"),
    ("--api-server-count", "0", "Invalid value for '--api-server-count': must be >= 1, got 0"),
])
def test_bad_host_terms_for_fit_name_their_flag(tmp_path, flag, value, expected):
    out = tmp_path / "p.json"
    bursts = CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2-x2-bursts"
    assert_error(run("calibrate", "fit", bursts, "--base-profile",
                     "cpu-tiny-qwen2-x2", "--out", out, flag, value), expected)
    assert not out.exists()


@pytest.mark.parametrize("args, expected", [
    (["--base-profile", "cpu-tiny-qwen2-x2", "--no-bursts"],
     "Error: --bursts/--no-bursts does not apply with --base-profile, which keeps the base's step costs and fits "
     "the burst terms alone (and writes no figure)"),
    (["--base-profile", "cpu-tiny-qwen2-x2", "--folds", "2"], "Error: --folds does not apply with --base-profile"),
    (["--api-cores", "own", "--client-core", "2"],
     "Invalid value for '--client-core': server 2 of a sweep of 2 server(s) (0, 1, ...)"),
    (["--out", "/proc/no/p.json"], "Error: --out /proc/no/p.json: cannot write there"),
])
def test_fit_refuses_before_the_work_what_it_cannot_do(tmp_path, args, expected):
    """Options the burst-only fit has no use for, a client core past the sweep's servers and an
    --out that cannot be written: one line each, before the fit, and nothing written."""
    bursts = CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2-x2-bursts"
    out = ["--out", str(tmp_path / "p.json")] if "--out" not in args else []
    assert_error(run("calibrate", "fit", bursts, *out, *args), expected)
    assert not (tmp_path / "p.json").exists()


def test_a_missing_optional_module_names_its_extra(tmp_path):
    import subprocess
    import sys

    # aiohttp hidden, as on a machine with only the base install
    probe = ("import sys; sys.modules['aiohttp'] = None; sys.argv = ['kvroute', *sys.argv[1:]]\n"
             "from kvroute.cli.main import main; main()")
    out = tmp_path / "v"
    res = subprocess.run([sys.executable, "-c", probe, "validate", "--url", "http://127.0.0.1:8100", "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 1, res
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: this command needs aiohttp, which kvroute does not install by default: "
                      "pip install 'kvroute[gpu]' (GPU servers) or 'kvroute[live]' (vLLM on the CPU)"], res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


# -- issue 35, item 4: silently wrong numbers (rc 0) -------------------------------------------

@pytest.mark.parametrize("name, text, expected", [
    ("t.jsonl", '{"timestamp": 1e308, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n',
     "t.jsonl:1: field 'timestamp': must be <= 1e+12, got 1e+308"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2], "session_id": 1, '
                '"think_time": 1e300}\n',
     "t.jsonl:1: field 'think_time': must be <= 1e+12, got 1e+300"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "0,ChatGPT,100,10,110,Conversation log\n1e308,ChatGPT,100,10,110,Conversation log\n",
     "b.csv:3: field 'Timestamp': must be <= 1e+09, got 1e+308"),
    ("v.json", '{"input_lens": [10, 10], "output_lens": [5, 5], "start_times": [1000.0, 1e308]}',
     "v.json: field 'start_times[1]': must be <= 1e+09, got 1e+308"),
])
def test_trace_timestamp_beyond_the_seconds_bound(tmp_path, name, text, expected):
    assert_error(run("simulate", "--trace", write(tmp_path / name, text)), expected)


@pytest.mark.parametrize("flag, value, expected", [
    ("--store-latency", "inf", "Invalid value for '--store-latency': must be a finite number, got inf"),
    ("--store-latency", "nan", "Invalid value for '--store-latency': must be a finite number, got nan"),
    ("--store-latency", "2e9", "Invalid value for '--store-latency': must be <= 1e+09, got 2000000000.0"),
    ("--kv-event-delay", "nan", "Invalid value for '--kv-event-delay': must be a finite number, got nan"),
    ("--scrape-interval", "nan", "Invalid value for '--scrape-interval': must be a finite number, got nan"),
    ("--scrape-interval", "-1", "Invalid value for '--scrape-interval': must be >= 0.0, got -1.0"),
])
@pytest.mark.parametrize("command", [["simulate"], ["compare", "--rounds", "1"]])
def test_gateway_seconds_finite_and_in_range(command, flag, value, expected):
    assert_error(run(*command, "--chats", 2, "--turns", 1, "--gateway-state", "shared", flag, value), expected)


def test_cluster_spec_refuses_nan_delays():
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile

    with pytest.raises(ValueError, match="field 'kv_event_delay_s': must be a finite number, got nan"):
        ClusterSpec(load_profile("a6000-qwen2.5-7b"), kv_event_delay_s=float("nan"))


@pytest.mark.parametrize("args, expected", [
    (("--block-size", "0"), "Invalid value for '--block-size': must be >= 1, got 0"),
    (("--kv-cache-gib", "-1"), "Invalid value for '--kv-cache-gib': must be >= 1, got -1"),
    (("--kv-cache-gib", "1.5"), "Invalid value for '--kv-cache-gib': expected an int (GiB), got 1.5"),
    (("--kv-cache-gib", "nan"), "Invalid value for '--kv-cache-gib': must be a finite number, got nan"),
    (("--max-model-len", "-5"), "Invalid value for '--max-model-len': must be >= 1, got -5"),
    (("--gpu-memory-utilization", "1.5"), "Invalid value for '--gpu-memory-utilization': must be <= 1.0, got 1.5"),
    (("--port-base", "70000"), "Invalid value for '--port-base': must be <= 65,535, got 70000"),
    (("-n", "0"), "Invalid value for '-n' / '--num-servers': must be >= 1, got 0"),
])
def test_serve_flags_checked_before_vllm(args, expected):
    assert_error(run("serve", "--model", "tiny-qwen2", *args), expected)


def test_serve_planner_keeps_a_given_block_size():
    """A given block size is passed on as given (0 was replaced by the default: ``or``); the
    command refuses 0 before planning."""
    from kvroute.calibrate.live.plan import plan_servers

    assert plan_servers("m", 1, block_size=0, device="cpu")[0].block_size == 0
    assert plan_servers("m", 1, device="cpu")[0].block_size == 32


@pytest.mark.parametrize("name, text, expected", [
    ("s.yaml", "workers: 2\nchats: 2\nworkers: 3\n",
     "s.yaml:3: field 'workers': given twice in one object (each key may appear once)"),
    ("s.json", '{"workers": 2, "workers": 3}', "s.json: field 'workers': given twice in one object"),
])
def test_duplicate_key_in_a_scenario_file(tmp_path, name, text, expected):
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--config", write(tmp_path / name, text)), expected)


def test_yaml_merge_key_may_still_be_overridden():
    import yaml

    from kvroute.traces.yaml_doc import yaml_loader

    doc = yaml.load("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n", yaml_loader())
    assert doc["b"] == {"x": 3, "y": 2}


def test_duplicate_key_in_a_profile(tmp_path):
    text = json.dumps(PROFILE).replace('"block_size": 16', '"block_size": 16, "block_size": 32')
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", write(tmp_path / "profile.json", text)),
                 "profile.json: field 'block_size': given twice in one object (each key may appear once)")


@pytest.mark.parametrize("name, text, expected", [
    ("d.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2], "timestamp": 5}\n',
     "d.jsonl:1: field 'timestamp': given twice in one object"),
    ("d.json", '{"input_lens": [10], "output_lens": [5], "input_lens": [3]}',
     "d.json: field 'input_lens': given twice in one object"),
])
def test_duplicate_key_in_a_trace(tmp_path, name, text, expected):
    assert_error(run("simulate", "--trace", write(tmp_path / name, text)), expected)


def test_an_int_too_long_for_python_names_the_trace_line(tmp_path):
    text = '{"timestamp": ' + "1" * 5000 + ', "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
    assert_error(run("simulate", "--trace", write(tmp_path / "big.jsonl", text)),
                 "big.jsonl:1: unreadable JSON: Exceeds the limit (4300 digits) for integer string conversion")


@pytest.mark.parametrize("args, expected", [
    (("--speedup", "1e-300"), "--speedup 1e-300 puts the trace's last request at 1e+300 s, past the 1e+09 s any "
                              "time may be"),
    (("--request-rate", "1e-300"), "--request-rate 1e-300 puts the trace's last request at 1e+300 s"),
])
def test_rescaled_trace_arrivals_stay_in_the_seconds_bound(tmp_path, args, expected):
    trace = jsonl(tmp_path / "t.jsonl", {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
                  {"timestamp": 1000, "input_length": 600, "output_length": 10, "hash_ids": [3, 4]})
    assert_error(run("simulate", "--trace", trace, "--replay", "open", *args), expected)


def test_generated_arrivals_stay_in_the_seconds_bound():
    assert_error(run("simulate", "--chats", 3, "--turns", 1, "--request-rate", "1e-300", "--arrival", "constant"),
                 "--request-rate 1e-300 puts the last of 3 sessions at 3e+300 s, past the 1e+09 s any time may be")


def test_malformed_whole_file_json_still_names_its_line(tmp_path):
    assert_error(run("simulate", "--trace", write(tmp_path / "v.json", '{"input_lens": [1,')),
                 "v.json:1: malformed JSON: Expecting value at column 19")


def test_an_int_too_long_for_python_in_a_profile(tmp_path):
    text = json.dumps(PROFILE).replace('"num_gpu_blocks": 4096', '"num_gpu_blocks": ' + "9" * 5000)
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", write(tmp_path / "profile.json", text)),
                 "profile.json: not valid JSON: Exceeds the limit (4300 digits) for integer string conversion")


@pytest.mark.parametrize("name", ["s.yaml", "s.json"])
def test_an_int_too_long_for_python_in_a_scenario_file(tmp_path, name):
    text = ("workers: " + "9" * 5000) if name.endswith(".yaml") else '{"workers": ' + "9" * 5000 + "}"
    assert_error(run("simulate", "--config", write(tmp_path / name, text)),
                 f"{name}: Exceeds the limit (4300 digits) for integer string conversion")


EPP_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 16
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
"""


@pytest.mark.parametrize("text, expected", [
    (EPP_CONFIG.replace("- type: queue-scorer", "- type: queue-scorr"),
     "epp.yaml:8: field 'plugins[1].type': unknown plugin type 'queue-scorr'"),
    (EPP_CONFIG.replace("  - pluginRef: queue-scorer", "  - weight: 1"),
     "epp.yaml:14: field 'schedulingProfiles[0].plugins[1].pluginRef': missing 'pluginRef'"),
    (EPP_CONFIG.replace("    weight: 2", "    weight: two"),
     "epp.yaml:13: field 'schedulingProfiles[0].plugins[0].weight': must be a number >= 0, got 'two'"),
    (EPP_CONFIG + "- name: prefill\n  plugins: []\n",
     "field 'schedulingProfiles': more than one scheduling profile"),
    ("kind: [", "epp.yaml:1: not valid YAML"),
    # a second picker, named where it is taken (it read "epp.yaml:1: field 'schedulingProfiles'", also
    # in a file without that field)
    (EPP_CONFIG.replace("- type: queue-scorer", "- type: max-score-picker\n- type: random-picker")
     .replace("  - pluginRef: queue-scorer", "  - pluginRef: max-score-picker\n  - pluginRef: random-picker"),
     "epp.yaml:16: field 'schedulingProfiles[0].plugins[2]': a second picker ('random-picker'); the profile takes one"),
    (EPP_CONFIG.split("schedulingProfiles:")[0].replace("- type: queue-scorer",
                                                        "- type: max-score-picker\n- type: random-picker"),
     "epp.yaml:9: field 'plugins[2]': a second picker ('random-picker'); the profile takes one"),
])
def test_a_bad_endpoint_picker_config_names_file_line_and_field(tmp_path, text, expected):
    path = write(tmp_path / "epp.yaml", text)
    assert_error(run("compare", "--chats", 2, "--turns", 1, "--policies", f"round_robin,epp:{path}"),
                 f"Invalid value for '--policies': {tmp_path}/{expected}" if expected.startswith("epp.yaml")
                 else expected)


@pytest.mark.parametrize("policies, expected", [
    ("epp", "Invalid value for '--policies': epp: give the EndpointPickerConfig file, epp:FILE"),
    ("epp:missing.yaml", "Invalid value for '--policies': missing.yaml: cannot read: No such file or directory"),
    ("llmd-precise:normalize=max", "precise-prefix-cache-scorer: unknown normalize 'max'; valid: minmax, absolute"),
    ("llmd-precise:kv_event_delay_s=-3", "llmd-precise: kv_event_delay_s must be -1 (the run's --kv-event-delay) "
                                         "or 0 to 1e9 s, got -3.0"),
    ("llmd-estimated:max_blocks=0", "llmd-estimated: max_blocks must be >= 1, got 0"),
    ("llmd-load:picker=best", "llmd-load: unknown picker 'best'; valid: max, weighted, random"),
    # each names its parameter and value (they read "block size and LRU capacity must be >= 0",
    # "overlap_weight and temperature must be >= 0", "weights must be >= 0")
    ("llmd-estimated:block_tokens=-16", "llmd-estimated: block_tokens must be >= 0, got -16"),
    ("llmd-estimated:lru_capacity=-1", "llmd-estimated: lru_capacity must be >= 0, got -1"),
    ("llmd-estimated:prefix_weight=-1", "llmd-estimated: the weight of prefix-cache-scorer must be >= 0, got -1"),
    ("dynamo:temperature=-1", "dynamo: temperature must be >= 0, got -1"),
    ("llmd:kv_weight=-2", "llmd: kv_weight must be >= 0, got -2"),
    ("llmd:load_threshold=0", "llmd: load_threshold must be >= 1, got 0"),
    ("sglang:balance_rel_threshold=0.5", "sglang: balance_rel_threshold must be >= 1, got 0.5"),
    ("prefix_balanced:abs_threshold=-5", "prefix_balanced: abs_threshold must be >= 0, got -5"),
    ("prefix_balanced:rel_threshold=0.5", "prefix_balanced: rel_threshold must be >= 1, got 0.5"),
])
def test_llm_d_policy_parameters_are_checked_before_any_run(policies, expected):
    assert_error(run("compare", "--chats", 2, "--turns", 1, "--policies", policies), expected)


@pytest.mark.parametrize("policy, expected", [
    ("llmd-estimated:block_tokens=24",
     "policy llmd-estimated: prefix-cache-scorer: block size 24 tokens must be a multiple of the engine's block size 16"),
    ("epp:{path}", "epp.yaml:7: field 'plugins[0].parameters.tokenProcessorConfig.blockSize': block size 64 must "
                   "equal the engine's block size 16"),
])
def test_llm_d_block_sizes_the_engine_cannot_serve_are_one_line_errors(tmp_path, policy, expected):
    path = write(tmp_path / "epp.yaml", EPP_CONFIG.replace("blockSize: 16", "blockSize: 64"))
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--policy", policy.format(path=path)), expected)


@pytest.mark.parametrize("args, expected", [
    (("--max-concurrency", "0"), "Invalid value for '--max-concurrency': must be >= 1, got 0"),
    (("--request-timeout", "0"), "Invalid value for '--request-timeout': must be > 0.0, got 0.0"),
    (("--request-timeout", "nan"), "Invalid value for '--request-timeout': must be a finite number, got nan"),
    (("--request-timeout", "1e12"), "Invalid value for '--request-timeout': must be <= 1e+09, got 1000000000000.0"),
    (("--workload-config", "/no/such.yaml"), "Invalid value for '--workload-config': /no/such.yaml does not exist"),
])
def test_client_limit_and_workload_config_flags(args, expected):
    assert_error(run("simulate", *args), expected)


INFERENCE_PERF = ("data:\n  type: {data}\n  shared_prefix: {{num_groups: 2, num_prompts_per_group: 2}}\n"
                  "load:\n  type: {load}\n  stages: [{{rate: {rate}, duration: 2}}]\n")


@pytest.mark.parametrize("values, expected", [
    (dict(data="random"), "c.yaml:2: field 'data.type': unsupported 'random'; kvroute reads shared_prefix"),
    (dict(load="concurrent"), "c.yaml:5: field 'load.type': unsupported 'concurrent'; kvroute reads constant, poisson"),
    (dict(rate="-1"), "c.yaml:6: field 'load.stages[0].rate': must be > 0.0, got -1"),
    (dict(rate=".nan"), "c.yaml:6: field 'load.stages[0].rate': must be a finite number, got nan"),
])
def test_bad_workload_configs_name_file_line_and_field(tmp_path, values, expected):
    text = INFERENCE_PERF.format(**{"data": "shared_prefix", "load": "poisson", "rate": 1, **values})
    assert_error(run("simulate", "--workload-config", write(tmp_path / "c.yaml", text)), expected)


def test_a_workload_config_with_a_trace_or_a_rate_names_the_flag(tmp_path):
    config = write(tmp_path / "c.yaml", INFERENCE_PERF.format(data="shared_prefix", load="poisson", rate=1))
    assert_error(run("simulate", "--workload-config", config, "--request-rate", "2"),
                 "Invalid value for '--request-rate': cannot be combined with --workload-config")
    assert_error(run("simulate", "--workload-config", config, "--trace", config),
                 "Invalid value for '--trace': cannot be combined with --workload-config")
    assert_error(run("simulate", "--workload-config", config, "--chats", "3"),
                 "--chats does not apply with --workload-config: it shapes the generated workload, and the config's "
                 "data and load sections set the workload")


# -- issue 35, items 6-8: bounds as a rule, no "internal error", every error names its input ---

BIG = str(2**63)


def run_main(capsys, *args: str) -> tuple[int, str]:
    """Run the real entry point (``kvroute.cli.main.main``, whose last line of defence prints
    "internal error"), in this process; returns its exit code and standard error."""
    import sys

    from kvroute.cli.main import main

    argv = sys.argv
    sys.argv = ["kvroute", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err


@pytest.fixture
def corpus(tmp_path):
    """The files the corpus names (``{dir}`` in a case's arguments is this folder)."""
    import os

    os.mkfifo(tmp_path / "fifo")
    write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    write(tmp_path / "deep-profile.json", '{"a": ' * 100_000 + "1" + "}" * 100_000)
    write(tmp_path / "deep.yaml", "[" * 100_000 + "]" * 100_000)
    write(tmp_path / "huge.yaml", "workers: 1.0e308\n")
    doc = json.loads(json.dumps(PROFILE))
    doc["engine"]["num_gpu_blocks"] = 10**12
    write(tmp_path / "blocks.json", json.dumps(doc))
    jsonl(tmp_path / "rid.jsonl", {"kvroute_trace": 1, "block_size": 16},
          {"timestamp": 0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2], "request_id": 2**70})
    jsonl(tmp_path / "t.jsonl", {"kvroute_trace": 1, "block_size": 16},
          {"timestamp": 0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2]})
    return tmp_path


S = ("--chats", "2", "--turns", "1")
URL = ("--url", "http://127.0.0.1:1")

CORPUS_35 = [
    # item 6: no upper bound (hangs, gigabytes, MemoryError)
    (("simulate", *S, "--workers", "100000"), "Invalid value for '--workers': must be <= 10,000, got 100000"),
    (("simulate", *S, "--rounds", BIG), f"Invalid value for '--rounds': must be <= 10,000, got {BIG}"),
    (("compare", *S, "--rounds", BIG), "Invalid value for '--rounds': must be <= 10,000"),
    (("sensitivity", "--trajectories", BIG), "Invalid value for '--trajectories': must be <= 10,000"),
    (("sensitivity", "--noise-rounds", BIG), "Invalid value for '--noise-rounds': must be <= 10,000"),
    (("sensitivity", "--trajectories", "10000", "--rounds", "10000"),
     "(--trajectories 10000 x 15 points x --rounds 10000 + --noise-rounds 5) x 3 policies is 4,500,000,015 "
     "simulation runs, more than the 1,000,000 one command may plan"),
    (("simulate", "--chats", "1e7", "--turns", "1"), "Invalid value for '--chats': must be <= 1,000,000, got 10000000"),
    (("simulate", "--chats", "1", "--turns", "1e9"), "Invalid value for '--turns': must be <= 1,000,000"),
    (("simulate", "--chats", "100000", "--turns", "1000"),
     "--chats 100,000 x --turns 1,000 is 100,000,000 requests, more than the 1,000,000 one trace may hold"),
    (("trace", "generate", "seed-chat", "--chats", "1e9", "--out", "{dir}/g.jsonl"),
     "Invalid value for '--chats': must be <= 1,000,000, got 1000000000"),
    (("simulate", "--trace", "/dev/zero"), "Invalid value for '--trace': /dev/zero is a device, not a regular file"),
    (("simulate", "--trace", "{dir}/fifo"), "fifo is a FIFO (named pipe), not a regular file"),
    (("simulate", *S, "--reply-tokens", "empirical:/dev/zero"),
     "Invalid value for '--reply-tokens': empirical sample /dev/zero is a device, not a regular file"),
    (("trace", "import", "{dir}/fifo", "--out", "{dir}/o.jsonl"),
     "Invalid value for 'SOURCE': {dir}/fifo is a FIFO (named pipe), not a regular file"),
    (("simulate", "--config", "/dev/zero"), "Invalid value for '--config': /dev/zero is a device"),
    (("simulate", *S, "--profile", "{dir}/fifo"), "Invalid value for '--profile': {dir}/fifo is a FIFO"),
    (("plot-series", "{dir}/fifo"), "Invalid value for 'SERIES_FILE': {dir}/fifo is a FIFO"),
    (("compare", *S, "--uncertainty", BIG), "Invalid value for '--uncertainty': must be <= 10,000"),
    (("compare", *S, "--rounds", "10000", "--uncertainty", "10000"),
     "3 policies x --rounds 10000 x (--uncertainty 10000 + 1) is 300,030,000 simulation runs"),
    (("sweep", *S, "--workers", "1,2", "--kv-blocks", "5,99999999999"),
     "Invalid value for '--kv-blocks': must be <= 2,147,483,647, got 99999999999"),
    (("simulate", *S, "--gateways", "2000"), "Invalid value for '--gateways': must be <= 1024, got 2000"),
    (("simulate", *S, "--scrape-interval", "1e-300"),
     "Invalid value for '--scrape-interval': must be 0 (live) or >= 0.001 s, got 1e-300"),
    (("simulate", *S, "--request-rate", "1", "--arrival", "gamma:1e308"),
     "Invalid value for '--arrival': gamma CV must be a finite number > 0 and <= 100, got 'gamma:1e308'"),
    (("compare", *S, "--policies", "dynamo:overlap_weight=1e308"),
     "Invalid value for '--policies': policy 'dynamo': overlap_weight must be <= 1e+09, got 1e+308"),
    (("simulate", "--config", "{dir}/huge.yaml"), "huge.yaml:1: option 'workers': must be <= 10,000, got 1e+308"),
    (("simulate", *S, "--policy", "epp:{dir}/fifo"), "Invalid value for '--policy': {dir}/fifo is a FIFO"),
    (("simulate", *S, "--policy", "epp:{dir}/deep.yaml"), "Invalid value for '--policy': {dir}/deep.yaml: nested too deep"),
    (("simulate", "--workload-config", "/dev/zero"), "Invalid value for '--workload-config': /dev/zero is a device"),
    (("simulate", "--workload-config", "{dir}/deep.yaml"), "{dir}/deep.yaml: nested too deep to read"),
    # item 7: what was "internal error"
    (("simulate", *S, "--max-tokens", BIG), "Invalid value for '--max-tokens': must be <= 134,217,728"),
    (("simulate", *S, "--kv-blocks", BIG), "Invalid value for '--kv-blocks': must be <= 2,147,483,647"),
    (("simulate", *S, "--kv-blocks", "3000000000"), "Invalid value for '--kv-blocks': must be <= 2,147,483,647"),
    (("simulate", *S, "--gateways", BIG), "Invalid value for '--gateways': must be <= 1024"),
    (("validate", *URL, "--out", "{dir}/v", "--seed", BIG), "Invalid value for '--seed': must be <= 4,294,967,295"),
    (("simulate", *S, "--profile", "{dir}/blocks.json"),
     "blocks.json: field 'engine.num_gpu_blocks': must be <= 2,147,483,647, got 1000000000000"),
    (("simulate", *S, "--profile", "{dir}/deep-profile.json"),
     "deep-profile.json: not valid JSON: nested too deep to read (about 1,000 levels, Python's recursion limit)"),
    (("simulate", "--trace", "{dir}/deep.json"), "deep.json: unreadable JSON: nested too deep to read (about 1,000 levels, Python's recursion limit)"),
    (("simulate", "--config", "{dir}/deep.yaml"), "Invalid value for '--config': {dir}/deep.yaml: nested too deep"),
    (("profiles", "derive", "--gpu", "H100-SXM", "--model", "{dir}/deep-profile.json"),
     "Invalid value for '--model': {dir}/deep-profile.json: not valid JSON: nested too deep to read (about 1,000 levels, Python's recursion limit)"),
    (("simulate", "--trace", "{dir}/rid.jsonl"), "rid.jsonl:2: field 'request_id': expected an int within "
                                                 "+-9,223,372,036,854,775,807 (int64)"),
    (("calibrate", "measure", *URL, "--out", "{dir}/m", "--client-cores", "x"),
     "Invalid value for '--client-cores': 'x' is not a core id or a LOW-HIGH range of them"),
    (("calibrate", "measure", *URL, "--out", "{dir}/m", "--client-cores", "0-99999999999"),
     "Invalid value for '--client-cores': '0-99999999999': cores must be among this process's"),
    (("validate", *URL, "--out", "{dir}/v", "--client-cores", "-1"), "Invalid value for '--client-cores'"),
    (("calibrate", "measure", *URL, "--out", "{dir}/m", "--token-range", "0:99999999999"),
     "Invalid value for '--token-range': must be LO:HI token ids with 0 <= LO < HI <= 2,147,483,647"),
    (("serve", "--model", "tiny-qwen2", "--vllm-args", "'x"),
     "Invalid value for '--vllm-args': No closing quotation in \"'x\""),
    (("serve", "--model", "tiny-qwen2", "--log-dir", "/proc/kvroute-x"), "--log-dir /proc/kvroute-x: cannot write there"),
    (("trace", "import", "{dir}/t.jsonl", "--out", "{dir}/o.jsonl", "--chars-per-token", "1e-300"),
     "Invalid value for '--chars-per-token': must be >= 0.1, got 1e-300"),
    # item 8: errors that named nothing
    (("sensitivity", "--prior-range", "1"), "Invalid value for '--prior-range': must be < 1.0, got 1.0"),
    (("sensitivity", "--coverage", "nan"), "Invalid value for '--coverage': must be a finite number, got nan"),
    (("sensitivity", "--kv-range", "0"), "Invalid value for '--kv-range': must be > 0.0, got 0.0"),
    (("sensitivity", "--levels", "3"), "Invalid value for '--levels': must be even, got 3"),
    (("sensitivity", "--spread-range", "0:inf"), "Invalid value for '--spread-range': must be a finite number, got inf"),
    (("sensitivity", "--jitter-cv-range", "0.5:0.1"),
     "Invalid value for '--jitter-cv-range': LOW must be below HIGH, got '0.5:0.1'"),
    (("validate", *URL, "--out", "{dir}/v", "--uncertainty", "1e9"),
     "Invalid value for '--uncertainty': must be <= 10,000, got 1000000000"),
]


@pytest.mark.parametrize("args, expected", CORPUS_35, ids=lambda v: " ".join(v)[:60] if isinstance(v, tuple) else None)
def test_issue_35_corpus_names_its_input_and_is_never_an_internal_error(corpus, capsys, args, expected):
    args = [a.replace("{dir}", str(corpus)) for a in args]
    code, err = run_main(capsys, *args)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code != 0 and len(errors) == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    assert expected.replace("{dir}", str(corpus)) in errors[0], err


def sweep_copy(tmp_path: Path, name: str, change) -> Path:
    """A copy of the shipped tiny sweep with ``change(requests)`` applied (written as CSV)."""
    import shutil

    import pandas as pd

    src = CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2"
    out = tmp_path / name
    out.mkdir()
    shutil.copy(src / "meta.json", out)
    shutil.copy(src / "experiments.parquet", out)
    requests = pd.read_parquet(src / "requests.parquet")
    requests["error"] = requests["error"].astype(object)
    change(requests).to_csv(out / "requests.csv", index=False)
    return out


def _ttft(value):
    def change(r):
        r.loc[r["role"] != "decode", "ttft_s"] = value
        return r
    return change


def _decode_failed(r):
    r.loc[r["role"] == "decode", "error"] = "HTTP 500"
    return r


@pytest.mark.parametrize("name, change, expected", [
    ("inf", _ttft(1e308), "inf/requests.csv:2: field 'ttft_s': must be a finite number of seconds within +-1e+09, "
                          "got 1e+308"),
    ("slow", _ttft(1e5), "the fit of {dir}/slow gives no valid profile, so nothing is written: {dir}/slow/profile.json: "
                         "field 'overheads.api_server_s': must be <= 3600.0"),
    ("nocol", lambda r: r.drop(columns=["max_tokens"]),
     "nocol/requests.csv: lacks the column(s) max_tokens (calibrate measure writes them)"),
    ("failed", _decode_failed, "{dir}/failed: need both TTFT and ITL observations to fit (have 105 TTFT, 0 ITL); "
                               "left out: 96 x a request failed; meta.json status 'complete'"),
    ("nodecode", lambda r: r[r["role"] != "decode"],
     "need both TTFT and ITL observations to fit (have 105 TTFT, 0 ITL); left out: none; meta.json status 'complete'"),
])
def test_fit_names_the_rows_and_columns_at_fault(tmp_path, capsys, name, change, expected):
    run_dir = sweep_copy(tmp_path, name, change)
    code, err = run_main(capsys, "calibrate", "fit", run_dir, "--bootstrap", "2", "--folds", "0", "--no-bursts")
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1 and "internal error" not in err, err
    assert expected.replace("{dir}", str(tmp_path)) in errors[0], err
    assert not (run_dir / "profile.json").exists()


def test_fit_refuses_a_server_with_more_blocks_than_a_c_int(tmp_path, capsys):
    run_dir = sweep_copy(tmp_path, "blocks", lambda r: r)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["servers"][0]["num_gpu_blocks"] = 10**12
    (run_dir / "meta.json").write_text(json.dumps(meta))
    code, err = run_main(capsys, "calibrate", "fit", run_dir)
    assert code == 1 and "internal error" not in err, err
    assert (f"Error: {run_dir}/meta.json: servers[0]: field 'num_gpu_blocks': must be <= 2,147,483,647, "
            "got 1000000000000") in err


def test_trace_generate_on_a_full_disk_names_the_file(tmp_path, capsys, monkeypatch):
    import os

    real_replace = os.replace

    def full(src, dst):  # the write itself went through; the disk fills as it is closed and renamed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "g.jsonl"
    code, err = run_main(capsys, "trace", "generate", "seed-chat", "--chats", 2, "--turns", 1, "--out", out)
    monkeypatch.setattr(os, "replace", real_replace)
    assert code == 1 and "internal error" not in err, err
    assert f"Error: cannot write {out}: No space left on device" in err
    assert list(tmp_path.iterdir()) == []  # no cut file, no temporary left behind


@pytest.mark.parametrize("name, text", [
    ("a.csv", "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,10\n"),
    ("b.csv", "\ufeffTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "0,ChatGPT,100,10,110,Conversation log\n"),
    ("t.jsonl", '\ufeff{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'),
    ("v.json", '\ufeff{"input_lens": [100], "output_lens": [10], "start_times": [0.0]}'),
])
def test_a_utf8_bom_is_accepted(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = run("simulate", "--trace", path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policies"]["round_robin"]["failed"]["mean"] == 0


def test_no_speed_scale_without_speed_probes_names_the_flag(tmp_path):
    """--no-speed-scale only changes a run with --speed-probes; alone it is refused, not ignored
    (checked before any server is contacted)."""
    assert_error(run("validate", "--url", "http://127.0.0.1:9", "--out", tmp_path / "v", "--no-speed-scale"),
                 "Invalid value for '--no-speed-scale': applies with --speed-probes N (N >= 1)")


@pytest.mark.parametrize("history, expected", [
    ("0-0", "Invalid value for '--history': a (low, high) token range needs ints 1 <= low <= high, got (0, 0)"),
    ("0-10", "Invalid value for '--history': a (low, high) token range needs ints 1 <= low <= high, got (0, 10)"),
    ("1", "Invalid value for '--history': expected tokens H >= 2 (meaning H/2-H) or a (low, high) range, got 1"),
])
def test_an_agent_history_leaves_every_first_prompt_a_token(tmp_path, history, expected):
    """--history 0-0 wrote a trace with input_length 0, which `trace stats` then refused."""
    assert_error(run("trace", "generate", "agent", "--history", history, "--chats", 1, "--turns", 2,
                     "--out", tmp_path / "a.jsonl"), expected)
    assert not (tmp_path / "a.jsonl").exists()


def test_the_agent_generator_refuses_an_empty_first_prompt():
    import numpy as np

    from kvroute.traces.generators import agent_sessions

    with pytest.raises(ValueError, match=r"history_tokens must be a range 1 <= low <= high, got \(0, 5\)"):
        agent_sessions(num_sessions=1, num_turns=1, history_tokens=(0, 5), rng=np.random.default_rng(0))


# -- engine settings vLLM refuses to start with (vLLM 0.32 SchedulerConfig.verify_max_model_len) --

def test_profile_whose_batch_budget_is_below_max_num_seqs(tmp_path):
    path = profile_file(tmp_path, engine__max_num_batched_tokens=128, engine__max_num_seqs=256)
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", path),
                 "field 'engine.max_num_batched_tokens': 128 is below max_num_seqs (256): vLLM refuses to start")


def test_max_model_len_below_the_profiles_long_prefill_threshold(tmp_path):
    path = profile_file(tmp_path, engine__long_prefill_token_threshold=4096)
    assert run("simulate", "--chats", 2, "--turns", 1, "--profile", path).exit_code == 0
    assert_error(run("simulate", "--chats", 2, "--turns", 1, "--profile", path, "--max-model-len", 2048),
                 "engine.long_prefill_token_threshold 4096 is above max_model_len (2048): vLLM refuses to start")


@pytest.mark.parametrize("command, expected", [
    (("compare", "--executor", "sequential", "--address", "tcp://127.0.0.1:9"),
     "--address sends the runs to a Dask cluster and --executor sequential runs them here: give one"),
    (("sweep", "--policies", "round_robin", "--executor", "local", "--address", "tcp://127.0.0.1:9"),
     "--address sends the runs to a Dask cluster and --executor local runs them here: give one"),
    (("compare", "--uncertainty", "2", "--executor", "dask"),
     "--uncertainty runs in this process; --executor dask does not apply (leave it out)"),
    (("compare", "--uncertainty", "2", "--address", "tcp://127.0.0.1:9"),
     "--uncertainty runs in this process; --address tcp://127.0.0.1:9 does not apply (leave it out)"),
])
def test_executor_options_that_would_be_ignored_are_refused(command, expected):
    """They were silently overridden: --address won over --executor, and --uncertainty ran in
    this process whatever --executor or --address said."""
    assert_error(run(*command, "--chats", 2, "--turns", 1), expected)


@pytest.mark.parametrize("line, expected", [
    ('reply_tokens: "lognormal:3"', "c.yaml:2: option 'reply_tokens': lognormal takes 2 number(s), got 1"),
    ("think_time: abc", "c.yaml:2: option 'think_time': cannot read 'abc'"),
])
def test_a_config_files_length_distribution_is_checked_naming_the_file_and_line(tmp_path, line, expected):
    """A distribution's own check (the option's callback) ran only when click applied the file,
    so the error named the option as if typed, not the file and line."""
    path = write(tmp_path / "c.yaml", f"chats: 2\n{line}\n")
    assert_error(run("compare", "--config", path), f"Invalid value for '--config': {tmp_path}/{expected}")
