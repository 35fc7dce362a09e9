"""inference-perf workload configs as traces (``kvroute.traces.inference_perf``): llm-d's
37-capacity config as published, its prompts, stages and arrival times; bad configs."""

from __future__ import annotations

import dataclasses

from collections import Counter

import numpy as np
import pytest

from kvroute.traces.inference_perf import (AIOHTTP_DEFAULT_TIMEOUT_S, TRACE_BLOCK_SIZE, Stage, parse_workload_config,
                                           read_workload_config, workload_trace)
from kvroute.traces.inputs import InputError
from tests.support.paths import INFERENCE_PERF_CONFIGS, PUBLISHED

X37 = INFERENCE_PERF_CONFIGS / "llm-d-37-capacity.yaml"
X37_STAGES = [(9, 30), (3, 210), (4, 180), (5, 120), (6, 120), (8, 90), (10, 70), (12, 60), (15, 50), (20, 50)]
"""The published ladder (rate, duration s), the warm-up stage first."""


def test_the_37_capacity_config_as_published():
    config = read_workload_config(X37)
    sp = config.data
    assert (sp.num_groups, sp.num_prompts_per_group, sp.system_prompt_len, sp.question_len, sp.output_len) == \
        (83, 3, 8000, 1000, 1000)
    assert config.load_type == "constant"
    assert [(s.rate, s.duration_s) for s in config.stages] == X37_STAGES
    assert config.ignore_eos is True and config.request_timeout_s is None
    assert config.client_timeout_s == AIOHTTP_DEFAULT_TIMEOUT_S == 300.0
    assert config.stage_gap_s == 2.0  # load.interval's default 1 s + run_stage's 1 s lead


def test_the_report_markdown_gives_the_same_config():
    report = PUBLISHED / "llm-d-37-capacity-report.md"
    if not report.exists():
        pytest.skip(f"{report} absent")
    from dataclasses import replace

    assert replace(read_workload_config(report), source="") == replace(read_workload_config(X37), source="")


def test_83_x_3_distinct_prompts_with_the_published_lengths():
    trace = workload_trace(read_workload_config(X37), seed=0)
    prompts = Counter(rec.hash_ids for rec in trace.records)
    assert len(prompts) == 83 * 3 == trace.metadata["num_prompts"]
    assert {rec.input_length for rec in trace.records} == {9000}
    assert {rec.output_length for rec in trace.records} == {1000}
    assert trace.block_size == TRACE_BLOCK_SIZE == 16
    shared = 8000 // 16
    assert {len(ids) for ids in prompts} == {563}  # ceil(9000 / 16): the last block holds 8 tokens
    groups = Counter(ids[:shared] for ids in prompts)  # the system prompt's 500 full blocks
    assert len(groups) == 83 and set(groups.values()) == {3}
    # the questions share nothing: every block after the system prompt belongs to one prompt
    own = Counter(block for ids in prompts for block in ids[shared:])
    assert set(own.values()) == {1}
    assert not set(own) & {block for ids in groups for block in ids}


def test_stage_rates_durations_and_request_counts():
    trace = workload_trace(read_workload_config(X37), seed=3)
    stages = trace.metadata["stages"]
    assert [(s["rate"], s["duration_s"]) for s in stages] == X37_STAGES
    counts = Counter(rec.stage for rec in trace.records)
    assert [counts[i] for i in range(10)] == [s["requests"] for s in stages] == [int(r * d) for r, d in X37_STAGES]
    assert len(trace.records) == 6830
    # constant load: exponential gaps scaled to the stage's duration, the last send at its end
    for stage in stages:
        offsets = np.array([rec.timestamp_ms for rec in trace.records if rec.stage == stage["stage"]]) \
            - stage["start_ms"]
        assert np.all(np.diff(offsets) > 0) and offsets[0] > 0
        assert offsets[-1] == pytest.approx(stage["duration_s"] * 1000.0, abs=1e-6)
    starts = [s["start_ms"] for s in stages]
    assert np.diff(starts) == pytest.approx([(d + 2.0) * 1000.0 for _, d in X37_STAGES[:-1]])


def test_every_stage_starts_again_at_the_first_prompt():
    """run_stage calls get_data() anew: request k of every stage sends prompt k of one order."""
    trace = workload_trace(read_workload_config(X37), seed=1)
    by_stage = {}
    for rec in trace.records:
        by_stage.setdefault(rec.stage, []).append(rec.hash_ids)
    first = by_stage[0]
    assert len(set(first[:249])) == 249 and first[249:270] == first[:21]  # 270 requests: the order wraps
    for prompts in by_stage.values():
        assert prompts[:200] == first[:200]
        assert prompts[249:260] == prompts[:11]


def test_same_seed_same_trace_and_seeds_move_order_and_times():
    config = read_workload_config(X37)
    a, b, c = workload_trace(config, 5), workload_trace(config, 5), workload_trace(config, 6)
    assert a.records == b.records
    assert [r.timestamp_ms for r in a.records] != [r.timestamp_ms for r in c.records]
    assert [r.hash_ids for r in a.records] != [r.hash_ids for r in c.records]


def _doc(load_type="poisson", stages=({"rate": 4, "duration": 10},), **shared):
    return {"data": {"type": "shared_prefix",
                     "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 2, "system_prompt_len": 40,
                                       "question_len": 10, "output_len": 5, **shared}},
            "load": {"type": load_type, "stages": [dict(stage) for stage in stages]}}


def test_poisson_stage_sends_its_count_second_by_second():
    config = parse_workload_config(_doc(stages=({"rate": 4, "duration": 10}, {"rate": 2.5, "duration": 3})))
    trace = workload_trace(config, 0)
    counts = Counter(rec.stage for rec in trace.records)
    assert counts == {0: 40, 1: 7}
    # each second's requests are spread over that second and the last of a busy second ends it
    times = np.array([rec.timestamp_ms for rec in trace.records if rec.stage == 0]) / 1000.0
    seconds = Counter(np.floor(times - 1e-9).astype(int))
    assert np.all(np.diff(times) > 0)
    assert all(np.any(np.isclose(times, s + 1.0)) for s in seconds if s < int(times[-1]))


def test_boundary_block_belongs_to_the_prompt():
    """A system prompt that ends inside a block: that block is each prompt's own."""
    config = parse_workload_config(_doc(system_prompt_len=40, question_len=10))  # 40 = 2.5 blocks of 16
    trace = workload_trace(config, 0)
    prompts = {rec.hash_ids for rec in trace.records}
    assert len(prompts) == 4 and {len(ids) for ids in prompts} == {4}  # ceil(50 / 16)
    assert len({ids[:2] for ids in prompts}) == 2 and len({ids[2] for ids in prompts}) == 4


def test_aliases_of_inference_perf_are_read():
    doc = _doc()
    sp = doc["data"]["shared_prefix"]
    sp["num_unique_system_prompts"] = sp.pop("num_groups")
    sp["num_users_per_system_prompt"] = sp.pop("num_prompts_per_group")
    assert parse_workload_config(doc).data.num_prompts == 4


def test_request_timeout_and_interval_are_read():
    doc = _doc()
    doc["load"].update(request_timeout=45, interval=3)
    config = parse_workload_config(doc)
    assert (config.client_timeout_s, config.stage_gap_s) == (45.0, 4.0)
    assert workload_trace(config, 0).metadata["request_timeout_s"] == 45.0


@pytest.mark.parametrize("change, field, reason", [
    (lambda d: d["data"].update(type="random"), "data.type", "unsupported 'random'; kvroute reads shared_prefix"),
    (lambda d: d["load"].update(type="concurrent"), "load.type",
     "unsupported 'concurrent'; kvroute reads constant, poisson"),
    (lambda d: d["load"].update(stages=[{"rate": 0, "duration": 3}]), "load.stages[0].rate", "must be > 0.0, got 0"),
    (lambda d: d["load"].update(stages=[{"rate": 1, "duration": 2.5}]), "load.stages[0].duration",
     "expected an int (s), got 2.5"),
    (lambda d: d["load"].update(stages=[{"rate": 1}]), "load.stages[0].duration", "required field missing"),
    (lambda d: d["load"].update(stages=[]), "load.stages", "expected a list of stages"),
    (lambda d: d["load"].update(stages=[{"rate": 0.01, "duration": 10}, {"rate": 0.5, "duration": 1}]), "load.stages",
     "every stage sends int(rate x duration) = 0 requests"),
    (lambda d: d["load"]["stages"][0].update(num_requests=5), "load.stages[0].num_requests",
     "should not be set for poisson load"),
    (lambda d: d["load"].update(request_timeout=0), "load.request_timeout", "must be > 0.0, got 0"),
    (lambda d: d["data"]["shared_prefix"].update(num_groups=0), "data.shared_prefix.num_groups", "must be >= 1"),
    (lambda d: d["data"]["shared_prefix"].update(question_len={"mean": 10, "min": 1, "max": 20}),
     "data.shared_prefix.question_len", "length distributions are not supported"),
    (lambda d: d.pop("load"), "load", "required section missing"),
])
def test_bad_configs_name_the_field(change, field, reason):
    doc = _doc()
    change(doc)
    with pytest.raises(InputError) as info:
        parse_workload_config(doc, "x.yaml")
    message = str(info.value)
    assert message.startswith(f"x.yaml: field '{field}': ") and reason in message and "\n" not in message


@pytest.mark.parametrize("old, new, expected", [
    ("num_groups: 83", "num_groups: -3", "ip1.yaml:42: field 'data.shared_prefix.num_groups': must be >= 1, got -3"),
    ("    - rate: 4\n", "    - rate: 0\n", "ip1.yaml:10: field 'load.stages[2].rate': must be > 0.0, got 0"),
    ("      duration: 180\n", "", "ip1.yaml:10: field 'load.stages[2].duration': required field missing"),
    ("  stages:\n", "  request_timeout: -1\n  stages:\n",
     "ip1.yaml:5: field 'load.request_timeout': must be > 0.0, got -1"),
    ("  ignore_eos: true", "  ignore_eos: 1",
     "ip1.yaml:34: field 'server.ignore_eos': expected true or false, got int (1)"),
    ("type: shared_prefix", "type: random", "ip1.yaml:40: field 'data.type': unsupported 'random'; kvroute reads "
                                            "shared_prefix"),
    ("  shared_prefix:\n", "  shared_prefix: [83]\n  trace:\n",
     "ip1.yaml:41: field 'data.shared_prefix': expected a mapping, got a list"),
])
def test_a_bad_value_names_its_line(tmp_path, old, new, expected):
    assert _error_of_edited(tmp_path / "ip1.yaml", old, new) == f"{tmp_path}/{expected}"


def _error_of_edited(path, old: str, new: str) -> str:
    """The error of reading the shipped llm-d config written to ``path`` with ``old`` replaced by ``new``."""
    path.write_text(X37.read_text().replace(old, new, 1))
    with pytest.raises(InputError) as info:
        read_workload_config(path)
    return str(info.value)


def test_a_markdown_report_names_the_line_in_the_md_file(tmp_path):
    path = tmp_path / "r.md"
    path.write_text("# Run 7\n\nThe config:\n\n```yaml\n" + X37.read_text().replace("num_groups: 83", "num_groups: -3")
                    + "```\n")
    with pytest.raises(InputError) as info:
        read_workload_config(path)
    # line 42 of the YAML, after the 5 lines before it in the .md file
    assert str(info.value) == f"{path}:47: field 'data.shared_prefix.num_groups': must be >= 1, got -3"


def test_the_published_report_names_the_line_in_the_md_file(tmp_path):
    report = PUBLISHED / "llm-d-37-capacity-report.md"
    if not report.exists():
        pytest.skip(f"{report} absent")
    path = tmp_path / "report.md"
    path.write_text(report.read_text().replace("num_groups: 83", "num_groups: -3", 1))
    with pytest.raises(InputError) as info:
        read_workload_config(path)
    assert str(info.value) == f"{path}:79: field 'data.shared_prefix.num_groups': must be >= 1, got -3"


UNKNOWN = "unknown key (inference-perf 0.7.0 refuses it too); "


@pytest.mark.parametrize("old, new, expected", [
    ("system_prompt_len", "system_promt_len",  # the reported typo: every prompt was 1,100 tokens, not 9,000
     "ip2.yaml:44: field 'data.shared_prefix.system_promt_len': " + UNKNOWN + "did you mean 'system_prompt_len'?"),
    ("  type: constant\n", "  type: constant\n  intervall: 3\n",
     "ip2.yaml:5: field 'load.intervall': " + UNKNOWN + "did you mean 'interval'?"),
    ("      duration: 180", "      durration: 180",
     "ip2.yaml:11: field 'load.stages[2].durration': " + UNKNOWN + "did you mean 'duration'?"),
    ("    - rate: 3\n", "    - qps: 3\n", "ip2.yaml:8: field 'load.stages[1].qps': " + UNKNOWN
     + "the keys of load.stages[1] are rate, duration, num_requests, concurrency_level"),
    ("  type: shared_prefix\n", "  type: shared_prefix\n  shared_prefixes: {}\n",
     "ip2.yaml:41: field 'data.shared_prefixes': " + UNKNOWN + "did you mean 'shared_prefix'?"),
    ("  ignore_eos: true", "  ignore_eos: true\n  ignore_eoss: false",
     "ip2.yaml:35: field 'server.ignore_eoss': " + UNKNOWN + "did you mean 'ignore_eos'?"),
    ("report:", "reprot:", "ip2.yaml:48: field 'reprot': " + UNKNOWN + "did you mean 'report'?"),
])
def test_an_unknown_key_names_its_line_and_the_closest_known_key(tmp_path, old, new, expected):
    assert _error_of_edited(tmp_path / "ip2.yaml", old, new) == f"{tmp_path}/{expected}"


def test_an_unknown_key_in_a_markdown_report_names_the_line_in_the_md_file(tmp_path):
    path = tmp_path / "r.md"
    path.write_text("# Run 7\n\nThe config:\n\n```yaml\n"
                    + X37.read_text().replace("system_prompt_len", "system_promt_len") + "```\n")
    with pytest.raises(InputError) as info:
        read_workload_config(path)
    assert str(info.value) == (f"{path}:49: field 'data.shared_prefix.system_promt_len': " + UNKNOWN
                               + "did you mean 'system_prompt_len'?")  # line 44 of the YAML, 5 lines before it
    report = PUBLISHED / "llm-d-37-capacity-report.md"
    if report.exists():
        path.write_text(report.read_text().replace("system_prompt_len", "system_promt_len", 1))
        with pytest.raises(InputError, match=r"r\.md:81: field 'data\.shared_prefix\.system_promt_len': unknown"):
            read_workload_config(path)


def test_an_unknown_key_of_a_parsed_dict_has_no_line():
    doc = _doc()
    doc["load"]["stages"][0]["durration"] = 3
    with pytest.raises(InputError) as info:
        parse_workload_config(doc, "x.yaml")
    assert str(info.value) == "x.yaml: field 'load.stages[0].durration': " + UNKNOWN + "did you mean 'duration'?"


def test_keys_inference_perf_knows_but_kvroute_does_not_model_are_left_unread():
    doc = _doc(seed=7, num_unique_system_prompts=None)
    doc["load"].update(base_seed=3, request_retries=2, worker_max_tcp_connections=10, stage_teardown_grace_seconds=0)
    doc["data"].update(use_chat_template=False, path=None)
    doc.update(server={"type": "vllm", "model_name": "m", "base_url": "http://x", "ignore_eos": True},
               api={"type": "completion", "streaming": True}, tokenizer={"anything": 1}, report={"x": 1})
    # server.model_name is kept, for the note that the profile simulates another model
    assert parse_workload_config(doc) == dataclasses.replace(parse_workload_config(_doc()), model_name="m")


@pytest.mark.parametrize("path", [*sorted(INFERENCE_PERF_CONFIGS.glob("*.yaml")),
                                  PUBLISHED / "llm-d-37-capacity-report.md"], ids=lambda p: p.name)
def test_the_shipped_and_published_configs_have_no_unknown_key(path):
    if not path.exists():
        pytest.skip(f"{path} absent")
    assert read_workload_config(path).stages


def test_a_key_twice_names_file_line_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("load:\n  type: constant\n  type: poisson\n")
    with pytest.raises(InputError, match=r"c\.yaml:3: field 'type': given twice"):
        read_workload_config(path)


def test_stage_num_requests():
    assert Stage(2.5, 3).num_requests == 7 and Stage(20, 50).num_requests == 1000
