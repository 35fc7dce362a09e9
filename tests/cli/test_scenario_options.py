"""One scenario type: the commands' scenario options are generated from ``Scenario``'s fields, so
every command that runs a workload has every workload option, with one default and one check."""

import dataclasses
import importlib
import json

import pytest
from click.testing import CliRunner

from kvroute.cli.main import LAZY_COMMANDS, cli
from kvroute.cli.scenario import FLAGS, OPTION_FIELDS
from kvroute.cli.trace_commands import generate
from kvroute.sim.cluster.cluster import ClusterSpec
from kvroute.sim.routing import DEFAULT_POLICIES
from kvroute.sim.study.scenario import SCENARIO_FIELDS, Scenario, ScenarioError
from kvroute.traces.generators import WORKLOAD_SIZES
from kvroute.traces.reader import read_trace


def command(name: str):
    module, attribute, _ = LAZY_COMMANDS[name]
    return getattr(importlib.import_module(module), attribute)


def options(cmd) -> dict:
    """Long flag -> click parameter."""
    return {flag: param for param in cmd.params for flag in param.opts if flag.startswith("--")}


WORKLOAD_FIELDS = [name for name, f in OPTION_FIELDS.items() if f.metadata["group"] == "workload"]


@pytest.mark.parametrize("name", ["simulate", "compare", "sweep", "sensitivity"])
def test_every_scenario_field_is_an_option_named_as_the_field_with_its_default(name):
    flags = options(command(name))
    for field in dataclasses.fields(Scenario):
        if field.name not in OPTION_FIELDS:
            continue
        param = flags[FLAGS[field.name]]
        assert param.name == field.name, field.name  # no rename table between options and fields
        if name != "sweep":
            assert param.default == field.default, field.name
        assert param.help.startswith(field.metadata["help"]), field.name


@pytest.mark.parametrize("name", ["simulate", "compare", "sweep", "sensitivity", "validate", "trace generate"])
def test_every_workload_command_has_every_workload_option_with_one_default(name):
    cmd = generate if name == "trace generate" else command(name)
    flags = options(cmd)
    for field in WORKLOAD_FIELDS:
        if name == "trace generate" and field == "workload":
            continue  # its KIND argument
        param = flags[FLAGS[field]]
        assert param.name == field
        if name != "sweep":
            assert param.default == OPTION_FIELDS[field].default, (name, field)
    assert "--history" in flags


def test_one_default_policy_set():
    baseline = DEFAULT_POLICIES[0]
    assert baseline == "round_robin"
    assert ClusterSpec.__dataclass_fields__["policy"].default == Scenario().policy == baseline
    assert options(command("simulate"))["--policy"].default == baseline
    for name in ("compare", "sweep", "sensitivity"):
        assert options(command(name))["--policies"].default == ",".join(DEFAULT_POLICIES), name
    from kvroute.cli.validate_command import _policies

    assert _policies((), None) == list(DEFAULT_POLICIES)


def test_the_agent_workload_has_one_default_size_everywhere(tmp_path):
    assert Scenario(workload="agent").sizes == WORKLOAD_SIZES["agent"] == (16, 10)
    assert Scenario().sizes == WORKLOAD_SIZES["seed-chat"] == (64, 6)
    out = tmp_path / "agent.jsonl"
    result = CliRunner().invoke(cli, ["trace", "generate", "agent", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert read_trace(out).records == Scenario(workload="agent").trace().records
    run = CliRunner().invoke(cli, ["simulate", "--workload", "agent", "--json"])
    assert run.exit_code == 0, run.output
    assert f"{len(read_trace(out).records)} requests" in json.loads(run.output)["scenario"]


def test_history_runs_on_compare_and_is_checked_as_the_scenario_checks_it():
    ok = CliRunner().invoke(cli, ["simulate", "--workload", "agent", "--chats", "2", "--turns", "2",
                                  "--history", "8000-9000", "--json"])
    assert ok.exit_code == 0, ok.output
    short = CliRunner().invoke(cli, ["simulate", "--workload", "agent", "--chats", "2", "--turns", "2",
                                     "--history", "1000-2000", "--json"])  # under the 2,000-token system prompt
    assert short.exit_code == 0, short.output
    bad = CliRunner().invoke(cli, ["compare", "--history", "8000"])
    assert bad.exit_code == 2 and "Invalid value for '--history': applies to the agent workload only" in bad.output
    with pytest.raises(ScenarioError, match="history applies to the agent workload only") as info:
        Scenario(history=8000)
    assert info.value.field == "history"
    # --start shapes seed-chat's first sends only: the agent generator had ignored it silently
    bad = CliRunner().invoke(cli, ["trace", "generate", "agent", "--start", "5", "--chats", "2", "--out", "/dev/null"])
    assert bad.exit_code == 2 and "Invalid value for '--start': applies to the seed-chat workload only" in bad.output
    with pytest.raises(ScenarioError, match="start_s applies to the seed-chat workload only") as info:
        Scenario(workload="agent", start_s="uniform:0:5")
    assert info.value.field == "start_s"
    with pytest.raises(ValueError, match="kv_blocks must be >= 2, got 1"):
        Scenario(kv_blocks=1)
    bad = CliRunner().invoke(cli, ["simulate", "--kv-blocks", "1"])
    assert "Invalid value for '--kv-blocks': must be >= 2, got 1" in bad.output


def test_generator_options_with_a_trace_file_are_one_error_naming_them(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 40, "output_length": 4,
                                         "hash_ids": [i]}) + "\n" for i in range(4)))
    bad = CliRunner().invoke(cli, ["compare", "--trace", str(trace), "--workload", "agent", "--chats", "3",
                                   "--turns", "2", "--max-requests", "2"])
    assert bad.exit_code == 2, bad.output
    errors = [line for line in bad.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --workload, --chats, --turns do not apply with --trace: they shape the generated "
                      "workload, and a trace file's records are replayed as they are"], bad.output
    # every generator option is named, in the order of --help
    given = {"workload": "agent", "chats": 2, "turns": 2, "reply": 10, "think_time_s": 1.0, "max_tokens": 8,
             "user": 5, "start_s": 1.0, "arrival": "constant"}
    with pytest.raises(ScenarioError) as info:
        Scenario(trace_file=str(trace), **given)
    assert str(info.value).startswith("--workload, --chats, --turns, --reply-tokens, --think-time, --max-tokens, "
                                      "--user-tokens, --start, --arrival do not apply with --trace")
    # the options that do apply to a trace file still run
    ok = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--max-requests", "3",
                                  "--request-rate", "2", "--workers", "2", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["policies"]["round_robin"]["failed"]["mean"] == 0
    # sensitivity's workload factors vary the generated lengths: with a trace, named as its --groups
    bad = CliRunner().invoke(cli, ["sensitivity", "--trace", str(trace), "--trace-block-size", "64",
                                   "--groups", "workload,start_spread"])
    assert bad.exit_code == 2 and "Invalid value for '--groups': the workload group varies the generated " \
                                  "workload's lengths; a --trace file's are given (leave it out)" in bad.output


def test_a_scenario_file_may_use_the_earlier_parameter_names(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("profile_name: a6000-qwen2.5-7b\ntrace_path: null\nchats: 2\nturns: 1\n")
    a = CliRunner().invoke(cli, ["simulate", "--config", str(config), "--json"])
    b = CliRunner().invoke(cli, ["simulate", "--chats", "2", "--turns", "1", "--json"])
    assert a.exit_code == b.exit_code == 0, a.output
    assert a.output == b.output


def test_fields_are_the_scenario_fields():
    assert set(OPTION_FIELDS) == set(SCENARIO_FIELDS) - {"policy"}


@pytest.mark.parametrize("name", ["simulate", "compare", "sweep", "sensitivity"])
def test_every_simulating_command_takes_quiet_to_hide_its_progress_bar(name):
    assert options(command(name))["--quiet"].is_flag


@pytest.mark.parametrize("value, message", [
    ("40000-30000", "'40000-30000': a range LOW-HIGH needs 0 <= LOW <= HIGH"),
    ("0", "'0': a token count is 1 to 134217728"),
    ("200000000", "'200000000': a token count is 1 to 134217728"),
    ("abc", "'abc' is neither a token count nor a range LOW-HIGH"),
    ("-5", "'-5' is neither a token count nor a range LOW-HIGH"),
])
def test_a_bad_history_says_what_is_wrong_with_it(value, message):
    """It said "neither a token count nor a range" of a reversed range or a count of 0 too."""
    result = CliRunner().invoke(cli, ["compare", "--workload", "agent", "--history", value])
    assert result.exit_code == 2
    assert f"Invalid value for '--history': {message}" in result.output


def test_a_good_history_is_a_count_or_a_range():
    from kvroute.cli.lengths import history_value

    assert (history_value("3000"), history_value("0-5"), history_value([100, 200])) == (3000, (0, 5), (100, 200))


@pytest.mark.parametrize("reply", [0, "fixed:0", "0.5", (0, 0), "uniform:0:0.9", "normal:0.4:0", "exponential:0"])
def test_a_reply_whose_every_draw_rounds_below_one_token_is_refused(reply):
    from kvroute.traces.lengths import parse_dist

    """The generator raised such a reply to 1 token without a word (vLLM samples at least one)."""
    with pytest.raises(ScenarioError) as info:
        Scenario(workload="agent" if isinstance(reply, tuple) else "seed-chat", reply=reply)
    assert info.value.field == "reply" and "must allow a reply of at least 1 token" in str(info.value)
    for fine in ("uniform:0:4", "0.7", "uniform:0.2:0.8", "normal:0:1", "exponential:1"):  # a draw of 1 or more
        assert Scenario(reply=fine).reply == fine and parse_dist(fine, "reply").largest_tokens >= 1  # 0.7 rounds to 1
    result = CliRunner().invoke(cli, ["compare", "--reply-tokens", "0"])
    assert result.exit_code == 2 and ("Invalid value for '--reply-tokens': must allow a reply of at least 1 token "
                                      "(vLLM samples at least one: max_tokens >= 1), got 'fixed:0'") in result.output
