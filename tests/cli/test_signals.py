"""``cli/signals.py``: SIGTERM takes Ctrl-C's path while a command runs, and only then."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kvroute.cli.signals import sigterm_as_sigint


def test_sigterm_raises_keyboard_interrupt_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_sigint():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):  # the handler runs between bytecodes, at once
                pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_in_asyncio_run_cancels_the_task_so_its_cleanup_runs():
    cleaned = []

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the clean-up may await, as run_sweep's does
            cleaned.append(True)

    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_sigint():
            asyncio.run(work())
    assert cleaned == [True]


def _terminate_self(*args, **kwargs):
    """Stands in for a command's work: SIGTERM arrives while it runs."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10**7):  # the handler runs between bytecodes, at once
        pass
    raise AssertionError("SIGTERM did not stop the work")


@pytest.mark.parametrize("target, args", [
    ("kvroute.sim.study.sensitivity.run_sensitivity", ["sensitivity", "--trajectories", "2", "--rounds", "1"]),
    ("kvroute.calibrate.calibration.fit.fit", ["calibrate", "fit", "{sweep}", "--out", "{tmp}/p.json"]),
    ("kvroute.traces.generators.builtin_workload", ["trace", "generate", "seed-chat", "--out", "{tmp}/t.jsonl"]),
    ("kvroute.cli.trace_commands.read_any_trace", ["trace", "import", "{trace}", "--out", "{tmp}/t.jsonl"]),
    ("kvroute.cli.trace_commands.read_any_trace", ["trace", "stats", "{trace}"]),
    ("pandas.read_parquet", ["plot-series", "{trace}"]),
])
def test_sigterm_stops_the_other_commands_as_ctrl_c(tmp_path, monkeypatch, target, args):
    """sensitivity, calibrate fit, trace generate/import/stats and plot-series take Ctrl-C's path
    on SIGTERM (issue 35): "interrupted", exit code 130, nothing written, the handler restored."""
    from click.testing import CliRunner

    from kvroute.cli.main import cli
    from tests.support.paths import CALIBRATE_DATA

    trace = tmp_path / "in.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    monkeypatch.setattr(target, _terminate_self)
    before = signal.getsignal(signal.SIGTERM)
    args = [a.format(tmp=tmp_path, trace=trace, sweep=CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2") for a in args]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "Traceback" not in result.output
    assert signal.getsignal(signal.SIGTERM) is before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
