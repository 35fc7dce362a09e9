"""Bounds as a rule, not a list (issue 35, Deliver 2): every numeric option of every command
declares its rule in its type (``kvroute.cli.values.Number``: an upper bound that fits what the
value feeds, finite), every integer rule has an upper bound, and every ``Scenario`` number field
declares its ``check``. A new option made with ``type=int``, ``type=float`` or click's ranges
fails here."""

from __future__ import annotations

import dataclasses

import click
import pytest

from kvroute.cli.main import LAZY_COMMANDS, cli
from kvroute.cli.values import Axis, Choice, Number
from kvroute.sim.study.scenario import Scenario
from kvroute.traces.inputs import C_INT_MAX, Num


def all_commands():
    """(path, command) of every command and subcommand."""
    ctx = click.Context(cli)
    stack = [(name, cli.get_command(ctx, name)) for name in LAZY_COMMANDS]
    while stack:
        path, command = stack.pop()
        yield path, command
        if isinstance(command, click.Group):
            stack += [(f"{path} {name}", command.get_command(ctx, name)) for name in command.list_commands(ctx)]


BARE = (click.types.IntParamType, click.types.FloatParamType)


def unbounded(param: click.Parameter) -> bool:
    kind = param.type.item_type if isinstance(param.type, Axis) else param.type
    if isinstance(kind, Number):
        return kind.rule.maximum is None and kind.rule.integer
    if isinstance(kind, click.types._NumberRangeBase):
        return True  # IntRange/FloatRange: no finite check, messages unlike the rest
    return isinstance(kind, BARE)


@pytest.mark.parametrize("path, command", sorted(all_commands(), key=lambda pc: pc[0]), ids=lambda v: str(v))
def test_every_numeric_option_declares_its_bounds(path, command):
    bare = [max(p.opts, key=len) for p in command.params if unbounded(p)]
    assert bare == [], f"kvroute {path}: numeric options without a Number(rule) type: {bare}"


@pytest.mark.parametrize("path, command", sorted(all_commands(), key=lambda pc: pc[0]), ids=lambda v: str(v))
def test_every_choice_option_names_the_closest_choice(path, command):
    bare = [max(p.opts, key=len) for p in command.params
            if isinstance(p.type, click.Choice) and not isinstance(p.type, Choice)]
    assert bare == [], f"kvroute {path}: click.Choice options without the did-you-mean of values.Choice: {bare}"


def test_a_misspelt_choice_names_the_closest_one_and_a_far_one_only_the_list():
    from click.testing import CliRunner

    near = CliRunner().invoke(cli, ["simulate", "--workload", "seedchat"])
    assert near.exit_code == 2
    assert ("Invalid value for '--workload': 'seedchat' is not one of 'seed-chat', 'agent' "
            "(did you mean 'seed-chat'?).") in near.output
    far = CliRunner().invoke(cli, ["calibrate", "fit", "--loss", "zzz"])
    assert far.exit_code == 2 and "'zzz' is not one of 'linear', 'soft_l1', 'huber', 'cauchy'." in far.output
    assert "did you mean" not in far.output
    cased = Choice(["Linear", "Huber"])
    with pytest.raises(click.BadParameter, match=r"did you mean 'Linear'\?"):
        cased.convert("linar", None, None)


def test_an_integer_rule_always_has_an_upper_bound():
    assert Num(integer=True, minimum=0).maximum == C_INT_MAX
    assert Num(integer=True, maximum=5).maximum == 5
    assert Num(minimum=0.0).maximum is None  # a float rule: finite is its bound


def test_every_scenario_number_field_declares_its_check():
    missing = [f.name for f in dataclasses.fields(Scenario)
               if f.metadata.get("type") in (int, float) and "check" not in f.metadata]
    assert missing == []


@pytest.mark.parametrize("workers, gpus, expected", [
    (4, None, [1, 1, 1, 1]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]), (10, 4, [3, 3, 2, 2]), (3, 3, [1, 1, 1]),
])
def test_workers_on_gpu_counts_the_round_robin_deal(workers, gpus, expected):
    """``workers_on_gpu`` is arithmetic now (it looped over every worker per GPU: --workers
    100000 hung in the scenario line), and agrees with ``gpu_of``."""
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile

    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=workers, num_gpus=gpus)
    counts = [spec.workers_on_gpu(g) for g in range(gpus or workers)]
    assert counts == expected == [sum(spec.gpu_of(w) == g for w in range(workers)) for g in range(gpus or workers)]


def test_number_type_takes_exponents_for_ints_and_names_what_it_refuses():
    from kvroute.traces.inputs import RECORDS

    kind = Number(RECORDS)
    assert kind.convert("1e6", None, None) == 1_000_000 and kind.convert("12", None, None) == 12
    for text, message in [("1.5", "expected an int, got 1.5"), ("abc", "'abc' is not a valid integer"),
                          ("1e7", "must be <= 1,000,000, got 10000000"), ("nan", "must be a finite number, got nan"),
                          ("1e308", "must be <= 1,000,000, got 1e+308")]:
        with pytest.raises(click.BadParameter, match=message.replace("+", r"\+").replace(".", r"\.")):
            kind.convert(text, None, None)


def test_regular_files_only(tmp_path):
    import os

    from kvroute.traces.inputs import InputError, check_regular_file

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("x")
    check_regular_file(tmp_path / "file")
    check_regular_file(tmp_path / "missing")  # opening it gives the usual error
    for path, kind in [(tmp_path / "fifo", "a FIFO (named pipe)"), ("/dev/zero", "a device"), (tmp_path, "a directory")]:
        with pytest.raises(InputError, match=f"^{path} is {kind.replace('(', '.').replace(')', '.')}, not a regular file$"):
            check_regular_file(path)


def test_json_nested_too_deep_is_a_value_error():
    from kvroute.traces.inputs import JSON_DECODER

    assert len(JSON_DECODER.decode("[" * 50 + "]" * 50)) == 1
    with pytest.raises(ValueError, match=r"^nested too deep to read \(about 1,000 levels, Python's recursion limit\)$"):
        JSON_DECODER.decode("[" * 100_000 + "]" * 100_000)
