"""The kvroute command line: main job, JSON output, files written, and clear errors."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.study.experiment import compare
from kvroute.sim.cluster.metrics import SUMMARY_METRICS
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.generators import builtin_workload, seed_chat
from tests.support.shared_traces import shared_trace


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_compare_json_equals_the_python_api_for_the_same_seeds():
    result = invoke("compare", "--turns", "2", "--chats", "8", "--rounds", "2", "--seed", "4", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc["policies"]) == ["round_robin", "least_loaded", "kv_aware"]
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=4)
    # The CLI's seed-chat draws its reply lengths per round from the round's seed.
    api = compare(lambda seed: builtin_workload("seed-chat", 8, 2, seed=seed), spec, ["round_robin", "least_loaded", "kv_aware"],
                  rounds=2, seed=4)
    for policy in api.policies:
        for metric in SUMMARY_METRICS:
            expected = list(api.summaries[api.summaries["policy"] == policy][metric])
            got = doc["policies"][policy][metric]["rounds"]
            assert got == pytest.approx(expected, nan_ok=True), (policy, metric)
    assert "change_vs_baseline_pct" in doc["policies"]["kv_aware"]["hit_rate"]


def test_compare_table_and_output_files(tmp_path):
    result = invoke("compare", "--turns", "2", "--chats", "8", "--rounds", "1", "--policies",
                    "round_robin,kv_aware", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "Δ vs round_robin" in result.output and "hit rate" in result.output
    records = pd.read_parquet(tmp_path / "records.parquet")
    assert len(records) == 2 * 16 and set(records["policy"]) == {"round_robin", "kv_aware"}
    assert (tmp_path / "ttft.png").stat().st_size > 10_000
    assert set(json.loads((tmp_path / "compare.json").read_text())["policies"]) == {"round_robin", "kv_aware"}


def test_unknown_names_list_the_valid_ones():
    result = CliRunner().invoke(cli, ["compare", "--policies", "round_robin,fastest"])
    assert result.exit_code == 2
    assert "unknown policy 'fastest'; valid policies: round_robin, least_loaded, kv_aware" in result.output
    result = CliRunner().invoke(cli, ["compare", "--policies", "round_robin,kv_awre"])
    assert "unknown policy 'kv_awre' (did you mean 'kv_aware'?); valid policies: round_robin," in result.output
    result = CliRunner().invoke(cli, ["simulate", "--profile", "a7000"])
    assert result.exit_code == 2 and "a6000-qwen2.5-7b" in result.output


def test_malformed_trace_names_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [1, 2]}\n')
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:2: field 'hash_ids'" in result.output


def test_trace_generate_then_simulate(tmp_path):
    path = tmp_path / "chats.jsonl"
    assert invoke("trace", "generate", "seed-chat", "--chats", "4", "--turns", "3", "--reply-tokens", "128",
                  "--out", str(path)).exit_code == 0
    result = invoke("simulate", "--trace", str(path), "--policy", "kv_aware", "--json")
    doc = json.loads(result.output)
    assert doc["policies"]["kv_aware"]["failed"]["mean"] == 0.0
    # Each of 4 chats on its own worker: turn 1 finds nothing; turn 2 hits the 69 full blocks of
    # turn 1's 986 + 127 computed tokens, turn 3 the 90 blocks of 1316 + 127.
    assert doc["policies"]["kv_aware"]["hit_rate"]["mean"] == pytest.approx((1104 + 1440) / (986 + 1316 + 1646))


def test_trace_stats_reproduces_the_published_mooncake_figures():
    path = shared_trace("mooncake", "conversation_trace.jsonl")
    doc = json.loads(invoke("trace", "stats", str(path), "--json").output)
    assert doc["records"] == 12031
    assert doc["distinct_block_ids"] == 182790
    assert doc["block_references"] == 288500
    assert doc["repeated_references"] == 105710


def test_generated_trace_with_drawn_lengths_replays_to_identical_records(tmp_path):
    from kvroute.sim.cluster.cluster import simulate
    from kvroute.traces.reader import read_trace

    path = tmp_path / "chats.jsonl"
    result = invoke("trace", "generate", "seed-chat", "--chats", "6", "--turns", "3", "--seed", "7",
                    "--reply-tokens", "lognormal:90:1", "--user-tokens", "uniform:180:210",
                    "--start", "uniform:0:0.01", "--think-time", "exponential:0.2", "--out", str(path))
    assert result.exit_code == 0, result.output
    written = read_trace(path)
    drawn = builtin_workload("seed-chat", 6, 3, "exponential:0.2", 7, "lognormal:90:1", user="uniform:180:210",
                             start_s="uniform:0:0.01")
    assert written.records == drawn.records
    assert len({r.output_length for r in written.records}) > 3  # the lengths really vary
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2, policy="kv_aware")
    a = simulate(written, spec, seed=7).records
    b = simulate(drawn, spec, seed=7).records
    pd.testing.assert_frame_equal(a, b)


def test_length_flags_name_the_flag_in_errors():
    result = CliRunner().invoke(cli, ["compare", "--reply-tokens", "lognormal:90"])
    assert result.exit_code != 0
    assert "Invalid value for '--reply-tokens': lognormal takes 2 number(s)" in result.output
    result = CliRunner().invoke(cli, ["compare", "--think-time", "-1"])
    assert "Invalid value for '--think-time': value must be a finite number >= 0" in result.output


def test_a_derived_prior_is_flagged_under_the_table():
    result = invoke("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin")
    assert "Note: a6000-qwen2.5-7b is a derived prior, not a measurement" in result.output
    assert "later-turn TTFT about 1.5x the measured value" in result.output
    assert ". `--uncertainty 10` adds their share to the intervals;" in result.output
    # simulate has no --uncertainty: its note sends the user to compare
    one = invoke("simulate", "--chats", "4", "--turns", "2", "--rounds", "1")
    assert ". `kvroute compare --uncertainty 10` adds their share to the intervals;" in one.output
    measured = invoke("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin",
                      "--profile", "cpu-tiny-qwen2")
    assert "derived prior" not in measured.output


def test_many_requests_in_flight_without_front_end_terms_are_flagged():
    note = "has no front-end terms: vLLM's API process and the host's CPU are taken as unlimited"
    few = invoke("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin")
    assert note not in few.output
    # 32 chats at once on 2 workers, round-robin: 16 on each
    many = invoke("compare", "--chats", "32", "--turns", "1", "--rounds", "1", "--policies", "round_robin",
                  "--workers", "2")
    assert f"Note: up to 16 requests were in flight on one worker, and a6000-qwen2.5-7b {note}" in many.output
    modelled = invoke("compare", "--chats", "32", "--turns", "1", "--rounds", "1", "--policies", "round_robin",
                      "--workers", "2", "--profile", "cpu-tiny-qwen2-x2-bursts")
    assert note not in modelled.output
    # with front-end terms the note names the serial admission work per prompt token instead
    assert ("Note: up to 16 requests were in flight on one worker, and each server's API process admits them one "
            "after another, 1.25 us per prompt token (cpu-tiny-qwen2-x2-bursts's frontend.per_prompt_token_s), "
            "counting as a busy process on the host while it works (host.contention 1.1)" in modelled.output)
    # of several policies, the note names those that piled up the most (not when every one did)
    both = invoke("compare", "--chats", "32", "--turns", "1", "--rounds", "1", "--policies", "round_robin,llmd",
                  "--workers", "2")  # llmd's prefix score follows the shared system prompt: all 32 on one worker
    assert f"Note: up to 32 requests were in flight on one worker (under llmd), and a6000-qwen2.5-7b {note}" \
        in both.output
    # that profile's workers step at drawn speeds, which the output says
    assert "Note: each worker steps at its own speed, drawn anew every 0.16 s (log-spread 0.30" in modelled.output
    assert "its own speed" not in many.output


def test_the_speed_note_gives_the_periods_the_sweep_allows(tmp_path):
    """A fitted profile keeps the engine-speed period's likelihood interval; the note under the
    table quotes it (an open upper end: one speed per round)."""
    import copy

    doc = copy.deepcopy(load_profile("cpu-tiny-qwen2-x2-bursts").raw)
    doc["provenance"]["fit"].setdefault("bursts", {})["engine_speed_period_interval_s"] = [0.25, 0.63]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    doc["provenance"]["fit"]["bursts"]["engine_speed_period_interval_s"] = [0.63, None]
    (tmp_path / "open.json").write_text(json.dumps(doc))
    args = ("compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies", "round_robin", "--workers", "2")
    assert "(log-spread 0.30, from cpu-tiny-qwen2-x2-bursts's bursts; its sweep allows 0.25 s to 0.63 s)" in invoke(
        *args, "--profile", str(tmp_path / "p.json")).output
    assert "its sweep allows 0.63 s to one speed per round)" in invoke(*args, "--profile", str(tmp_path / "open.json")).output


def test_peak_in_flight_counts_each_worker_and_round_apart():
    import pandas as pd

    from kvroute.sim.timing.coverage import peak_in_flight

    rows = pd.DataFrame({"policy": ["p"] * 5, "round": [0, 0, 0, 1, 1], "worker": [0, 0, 0, 0, 1],
                         "arrival": [0.0, 1.0, 2.0, 0.5, 0.5], "finish": [2.0, 3.0, 4.0, 9.0, 9.0]})
    # round 0, worker 0: [0, 2), [1, 3), [2, 4): two at once at most (a finish at 2.0 goes first)
    assert peak_in_flight(rows) == 2
    assert peak_in_flight(rows.assign(arrival=[0.0, 1.0, 1.5, 0.5, 0.5])) == 3


def test_peak_in_flight_ends_a_failed_request_at_its_last_known_time_and_counts_no_unsent_one():
    import pandas as pd

    from kvroute.sim.timing.coverage import peak_in_flight

    nan = float("nan")
    rows = pd.DataFrame({"worker": [0, 0, 0, -1, -1], "arrival": [0.0, 1.0, 5.0, 0.5, 0.6],
                         "first_token": [1.5, nan, 6.0, nan, nan], "finish": [2.0, nan, nan, nan, nan]})
    # [0, 2); refused at its send: [1, 1); cut off after its first token: [5, 6); never sent: none
    assert peak_in_flight(rows) == 1
    assert peak_in_flight(rows.assign(arrival=[0.0, 1.0, 1.0, 0.5, 0.6])) == 2  # [1, 6) overlaps [0, 2)
    assert peak_in_flight(rows.drop(columns="first_token").assign(arrival=[0.0, 1.0, 1.0, 0.5, 0.6])) == 1


def test_failed_requests_are_counted_under_the_table_and_gpus_named():
    result = invoke("compare", "--chats", "2", "--turns", "2", "--rounds", "1", "--policies", "round_robin",
                    "--max-model-len", "10")
    assert "Warning: every request was rejected (all policies and rounds), so none was served and the table holds " \
           "no latencies: 2 rejected by the engine, e.g. request 0: This model's maximum context length is 10 " \
           "tokens" in result.output
    half = invoke("compare", "--chats", "2", "--turns", "2", "--rounds", "1", "--policies", "round_robin",
                  "--max-model-len", "1000")  # the first turns fit, the second turns do not
    assert "Warning: 2 of 4 requests (50 %) failed (all policies and rounds), so the table's latencies are of the 2 " \
           "served only; e.g. request 2: This model's maximum context length is 1000 tokens. However, your prompt " \
           "contains 1286 input tokens. (a prompt must be shorter than max_model_len: raise --max-model-len or " \
           "shorten the prompts)" in half.output
    ok = invoke("compare", "--chats", "2", "--turns", "2", "--rounds", "1", "--policies", "round_robin")
    assert "requests failed" not in ok.output
    bad = CliRunner().invoke(cli, ["compare", "--gpus", "8"])
    assert bad.exit_code != 0 and "Invalid value for '--gpus': must be between 1 and --workers (4), got 8" in bad.output


def test_every_request_rejected_says_so_and_why_without_the_in_flight_note():
    result = invoke("compare", "--chats", "16", "--turns", "2", "--rounds", "1", "--policies", "round_robin",
                    "--workers", "1", "--max-model-len", "100")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith(("Warning:", "Note:"))]
    assert notes == ["Warning: every request was rejected (all policies and rounds), so none was served and the "
                     "table holds no latencies: 16 rejected by the engine, e.g. request 0: This model's maximum "
                     "context length is 100 tokens. However, your prompt contains 986 input tokens. (a prompt must "
                     "be shorter than max_model_len: raise --max-model-len or shorten the prompts); the other 16 were "
                     "not sent, their parent request having been rejected"], result.output
    assert "in flight" not in result.output


def test_one_round_says_it_has_no_interval():
    one = invoke("simulate", "--chats", "4", "--turns", "2")
    assert "one round per policy, seed 0: no interval (--rounds 2 or more gives one)" in one.output
    assert "± is the 95% interval" not in one.output
    two = invoke("simulate", "--chats", "4", "--turns", "2", "--rounds", "2")
    assert "2 round(s) per policy, seeds 0..1; ± is the 95% interval over rounds" in two.output
    # two rounds give intervals such as [0.0, 1028.3]: the note says why
    assert ("clipped to possible values): with two rounds Student's t has one degree of freedom, 12.7 standard errors "
            "wide each way (4.3 with three);") in two.output
    three = invoke("simulate", "--chats", "4", "--turns", "2", "--rounds", "3")
    assert "degree of freedom" not in three.output


def test_the_front_end_note_names_the_stated_api_contention_of_a_per_core_profile(tmp_path):
    from kvroute.sim.timing.profile import load_profile

    doc = load_profile("cpu-tiny-qwen2-x2-bursts").raw
    doc = {**doc, "name": "per-core", "host": {**doc["host"], "api_on_engine_core": True, "api_contention": 1.0}}
    path = tmp_path / "per-core.json"
    path.write_text(json.dumps(doc))
    result = invoke("compare", "--chats", "32", "--turns", "1", "--rounds", "1", "--policies", "round_robin",
                    "--workers", "2", "--profile", str(path))
    assert ("on its engine's core, taking 2 times as long while the engine has requests (host.api_contention 1, "
            "stated, not measured). Closed-loop TTFT under a kv-aware router hangs on it" in result.output)


def test_serve_without_vllm_says_so_before_starting(monkeypatch):
    """No server is planned or started when vLLM cannot be imported: one line names the extra."""
    import importlib.util

    from click.testing import CliRunner

    from kvroute.cli.main import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    result = CliRunner().invoke(cli, ["serve", "--model", "Qwen/Qwen2.5-7B-Instruct", "-n", "1"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: vLLM is not installed in this Python, so no server can start: "
                                     "python -m pip install -e '.[gpu]' on GPU machines, '.[live]' for vLLM's CPU build")


def test_the_seed_study_note_is_not_printed_under_a_workload_config_run(tmp_path):
    """The a6000 prior's note on the lab's 6-turn run belongs to the seed-chat workload; a
    workload config (inference-perf) is another workload, as the agent workload is."""
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  type: shared_prefix\n  shared_prefix: {num_groups: 2, num_prompts_per_group: 2}\n"
                      "load:\n  type: poisson\n  stages: [{rate: 1, duration: 2}]\n")
    seed_note = "On the lab's 6-turn run this prior predicts"
    assert seed_note in invoke("compare", "--chats", "4", "--turns", "2", "--rounds", "1").output
    out = invoke("compare", "--workload-config", str(config), "--rounds", "1").output
    assert "derived prior" in out and seed_note not in out


def test_group_help_lists_each_commands_first_sentence_whole():
    """click cut the summaries at the terminal's width with '...' (HelpfulGroup wraps them)."""
    for args in ([], ["trace"], ["calibrate"], ["profiles"]):
        result = CliRunner().invoke(cli, [*args, "--help"], terminal_width=80)
        commands = result.output.split("Commands:")[1]
        assert result.exit_code == 0 and "..." not in commands, result.output
    text = " ".join(CliRunner().invoke(cli, ["trace", "--help"], terminal_width=80).output.split())
    assert ("import Convert a trace (Mooncake JSONL, Azure or BurstGPT CSV, ShareGPT conversations, vllm bench "
            "serve result) to kvroute's format, validating it.") in text


def test_serve_dry_run_prints_each_servers_command_and_environment_and_starts_nothing(monkeypatch, tmp_path):
    import importlib.util
    import shlex
    import signal

    from click.testing import CliRunner

    from kvroute.calibrate.live import cores
    from kvroute.cli.main import cli

    monkeypatch.setattr(cores, "detect_gpus", lambda: list(range(8)))
    real = importlib.util.find_spec  # no vLLM needed to look
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(cli, ["serve", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--tp", "4",
                                      "--host", "10.0.0.5", "--kv-events-port-base", "8200", "--dry-run",
                                      "--log-dir", str(tmp_path / "logs")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"# http://10.0.0.5:8100 on GPUs 0,1,2,3, log {tmp_path / 'logs' / 'vllm-8100.log'}"
    argv = shlex.split(lines[1])
    assert argv[:5] == ["env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1,2,3", "DO_NOT_TRACK=1",
                        "VLLM_NO_USAGE_STATS=1"]
    assert argv[argv.index("--host") + 1] == "10.0.0.5" and argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert '"endpoint": "tcp://*:8200"' in argv[argv.index("--kv-events-config") + 1]  # not loopback: TCP
    assert lines[2].startswith("# http://10.0.0.5:8101 on GPUs 4,5,6,7") and len(lines) == 5
    assert lines[4] == ("# vLLM is not installed in this Python, so these lines cannot run here: python -m pip install "
                        "-e '.[gpu]' on GPU machines, '.[live]' for vLLM's CPU build (README)")  # a preview still runs
    assert not (tmp_path / "logs").exists()  # nothing made, nothing started
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # nothing to stop


def test_serve_dry_run_without_gpus_says_it_plans_cpu_servers_and_how_to_preview_a_gpu_host(monkeypatch):
    from click.testing import CliRunner

    from kvroute.calibrate.live import cores
    from kvroute.cli.main import cli

    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])
    cpu = CliRunner().invoke(cli, ["serve", "--model", "Qwen/Qwen2.5-7B-Instruct", "-n", "1", "--dry-run"])
    assert cpu.exit_code == 0 and cpu.output.splitlines()[0] == (
        "# no GPU used: servers on vLLM's CPU backend; to preview a GPU host, name its GPUs: "
        "CUDA_VISIBLE_DEVICES=0,1,2,3 kvroute serve ... --dry-run")
    tp = CliRunner().invoke(cli, ["serve", "--model", "m", "--tp", "4", "--dry-run"])
    assert tp.exit_code == 1 and tp.output.strip().endswith(
        "name them: CUDA_VISIBLE_DEVICES=0,1,2,3 kvroute serve ... --dry-run")


@pytest.mark.parametrize("api_cores, where", [
    ("own", "CPU core 0, its API process too"),
    ("spare", "CPU core 0, its API process moved to core(s) 1 once up (taskset -p -c 1 API_PID; this line does not)"),
    ("any", "CPU core 0, its API process moved to core(s) 0,1 once up (taskset -p -c 0,1 API_PID; this line does "
            "not)")])
def test_serve_dry_run_pins_each_line_as_serve_pins_the_server(monkeypatch, api_cores, where):
    """A pasted line runs where serve would start the server (taskset on its engine's core); where
    serve moves the API process after start, the comment says how."""
    from click.testing import CliRunner

    from kvroute.calibrate.live import cores
    from kvroute.cli.main import cli

    monkeypatch.setattr(cores, "detect_gpus", lambda: [])
    monkeypatch.setattr(cores, "cpu_cores", lambda: [0, 1])
    out = CliRunner().invoke(cli, ["serve", "--model", "m", "-n", "1", "--api-cores", api_cores,
                                   "--dry-run"]).output.splitlines()
    assert out[1] == f"# http://127.0.0.1:8100 on {where}, log vllm-8100.log"
    assert out[2].startswith("taskset -c 0 env ")


@pytest.mark.parametrize("host", ["", "not a host", "::1", "999.1.1.1", "-bad", "a" * 64])
def test_serve_refuses_a_host_that_is_no_ipv4_address_or_host_name(host):
    from click.testing import CliRunner

    from kvroute.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--model", "m", "-n", "1", "--host", host, "--dry-run"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: Invalid value for '--host': not an IPv4 address or host name: "
                                              f"{host!r}")
