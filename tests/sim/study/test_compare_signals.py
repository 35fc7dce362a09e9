"""Ctrl-C and SIGTERM stop ``kvroute compare`` (issue 35, item 5): exit code 130, the finished
runs reported and written under ``--out``, and the set marked incomplete by an ``INCOMPLETE``
file naming the runs not finished (also ``compare.json``'s ``incomplete.missing_runs``).

The command runs in a real process for the signals, with standard error on a pseudo-terminal so
its progress bar shows finished runs; the signal is sent once one has, so the test does not depend
on the machine's speed (the waits only guard against a hang).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time

import pandas as pd
import pytest

HANG_GUARD_S = 120
ROUNDS = 40


def _run_until_runs_finished(cmd: list[str], signum: int, finished: int, stdout=subprocess.DEVNULL) -> tuple[int, str]:
    """Start ``cmd`` with standard error on a pseudo-terminal (standard output to ``stdout``),
    send ``signum`` once its bar shows ``finished`` runs done; returns the exit code and what it
    wrote to standard error."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # tqdm draws nothing 0 wide
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not any(int(n) >= finished for n in re.findall(rb"\| *(\d+)/%d " % (2 * ROUNDS), seen)):
            assert proc.poll() is None, seen.decode(errors="replace")
            assert time.monotonic() < deadline, "compare finished no run"
            try:
                seen += os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
        proc.send_signal(signum)
        code = proc.wait(timeout=HANG_GUARD_S)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, seen.decode(errors="replace")


@pytest.mark.parametrize("signum,executor", [(signal.SIGTERM, "sequential"), (signal.SIGTERM, "local"),
                                             (signal.SIGINT, "sequential")])
def test_signal_keeps_finished_rounds_and_marks_the_set_incomplete(tmp_path, signum, executor):
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", "from kvroute.cli.main import main; main()", "compare",
           "--workload", "agent", "--chats", "16", "--turns", "10", "--workers", "4",
           "--policies", "round_robin,kv_aware", "--rounds", str(ROUNDS), "--executor", executor,
           "--max-workers", "2", "--out", str(out)]
    with open(tmp_path / "stdout.txt", "w") as stdout:
        code, err = _run_until_runs_finished(cmd, signum, finished=2, stdout=stdout)
    table = (tmp_path / "stdout.txt").read_text()
    assert code == 130, err
    assert re.search(r"interrupted: \d+ of 80 runs finished", err) and "Traceback" not in err, err
    summary = pd.read_csv(out / "summary.csv")
    doc = json.loads((out / "compare.json").read_text())
    missing = doc["incomplete"]["missing_runs"]
    assert len(summary) >= 2 and len(summary) + len(missing) == 2 * ROUNDS
    assert set(summary["policy"]) == set(doc["policies"])
    # the footer counts the rounds each policy finished, not the rounds asked for
    footer = re.search(rf"interrupted: rounds finished of {ROUNDS} per policy: round_robin (\d+), kv_aware (\d+)", table)
    assert footer, table
    counts = summary["policy"].value_counts()
    assert [int(footer[1]), int(footer[2])] == [counts.get("round_robin", 0), counts.get("kv_aware", 0)]
    assert set(pd.read_parquet(out / "records.parquet")["round"]) == set(summary["round"])
    marker = (out / "INCOMPLETE").read_text()
    assert f"before {len(missing)} run(s) finished" in marker and all(name in marker for name in missing)
    assert list(out.glob(".*tmp*")) == []  # no temporary file left behind


def test_compare_api_raises_with_the_finished_runs(monkeypatch):
    """In-process: a KeyboardInterrupt mid-compare becomes CompareInterrupted with the runs done."""
    from kvroute.sim.study import experiment
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.generators import seed_chat

    calls = {"n": 0}
    real = experiment.simulate

    def simulate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "simulate", simulate)
    trace = seed_chat(num_chats=2, num_turns=2)
    spec = ClusterSpec(profile=load_profile("a6000-qwen2.5-7b"), num_workers=2)
    with pytest.raises(experiment.CompareInterrupted) as info:
        experiment.compare(trace, spec, ["round_robin", "kv_aware"], rounds=2)
    stop = info.value
    assert stop.total == 4 and stop.missing == ["kv_aware round 1"]
    assert stop.comparison.policies == ["round_robin", "kv_aware"]
    assert [len(stop.comparison.runs[p]) for p in stop.comparison.policies] == [2, 1]


def test_finished_rounds_with_a_gap_keep_their_round_numbers():
    """A pool finishes runs in any order: rounds 0 and 2 done, 1 not, are rounds 0 and 2."""
    from kvroute.sim.study import experiment
    from kvroute.sim.cluster.cluster import ClusterSpec, simulate
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.generators import seed_chat

    trace = seed_chat(num_chats=2, num_turns=2)
    spec = ClusterSpec(profile=load_profile("a6000-qwen2.5-7b"), num_workers=2)
    grid = [("round_robin", r) for r in range(3)]
    results = [simulate(trace, spec, seed=0), None, simulate(trace, spec, seed=2)]
    comparison = experiment._comparison(["round_robin"], grid, results, 0, experiment.ServiceClass())
    assert sorted(set(comparison.records()["round"])) == [0, 2]
    assert list(comparison.summaries["round"]) == [0, 2] and list(comparison.summaries["seed"]) == [0, 2]


def test_uncertain_compare_interrupted_in_a_draw_keeps_the_central_comparison(monkeypatch):
    from kvroute.sim.study import experiment
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.generators import seed_chat

    calls = {"n": 0}
    real = experiment.simulate

    def simulate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4 + 2:  # the second run of the first drawn profile
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "simulate", simulate)
    spec = ClusterSpec(profile=load_profile("a6000-qwen2.5-7b"), num_workers=2)
    with pytest.raises(experiment.CompareInterrupted) as info:
        experiment.compare_uncertain(seed_chat(num_chats=2, num_turns=2), spec, ["round_robin", "kv_aware"], 2,
                                     rounds=2)
    stop = info.value
    assert stop.total == 12 and len(stop.missing) == 8 and all("uncertainty draw" in m for m in stop.missing)
    assert [len(stop.comparison.runs[p]) for p in stop.comparison.policies] == [2, 2]


def test_interrupted_while_writing_leaves_the_marker(monkeypatch, tmp_path):
    """Stopped between two output files: exit code 130, and INCOMPLETE says the set was cut short."""
    from click.testing import CliRunner

    from kvroute.cli import sim_commands

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_commands, "_write_bench_results", stop)
    out = tmp_path / "out"
    res = CliRunner().invoke(sim_commands.compare, ["--chats", "2", "--turns", "2", "--rounds", "1", "--out", str(out)])
    assert res.exit_code == 130, res.output
    assert (out / "summary.csv").exists()
    assert "stopped while writing" in (out / "INCOMPLETE").read_text()
    assert "incomplete" not in json.loads((out / "compare.json").read_text())


def test_a_finished_compare_leaves_no_marker(tmp_path):
    from click.testing import CliRunner

    from kvroute.cli import sim_commands

    out = tmp_path / "out"
    (out).mkdir()
    (out / "INCOMPLETE").write_text("from an earlier, interrupted run\n")
    res = CliRunner().invoke(sim_commands.compare, ["--chats", "2", "--turns", "2", "--rounds", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert not (out / "INCOMPLETE").exists() and (out / "compare.json").exists()


def test_a_stop_after_the_last_run_keeps_every_run(monkeypatch):
    """In-process: a KeyboardInterrupt while the finished runs are summarised gives them all in the
    CompareInterrupted, none missing (it lost them all before)."""
    from kvroute.sim.study import experiment
    from kvroute.sim.cluster.cluster import ClusterSpec
    from kvroute.sim.timing.profile import load_profile
    from kvroute.traces.generators import seed_chat

    real, calls = experiment._comparison, {"n": 0}

    def summarise(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(experiment, "_comparison", summarise)
    spec = ClusterSpec(profile=load_profile("a6000-qwen2.5-7b"), num_workers=2)
    with pytest.raises(experiment.CompareInterrupted) as info:
        experiment.compare(seed_chat(num_chats=2, num_turns=2), spec, ["round_robin", "kv_aware"], rounds=2)
    stop = info.value
    assert (stop.total, stop.missing) == (4, [])
    assert len(stop.comparison.summaries) == 4 and stop.comparison.policies == ["round_robin", "kv_aware"]


def test_interrupts_deferred_holds_the_first_signal_and_raises_on_the_second():
    from kvroute.sim.study.executors import Stop, interrupts_deferred

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with interrupts_deferred() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs at the next bytecode; the sleep gives it one
        assert held == ["SIGTERM"]
        with pytest.raises(Stop):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert held == ["SIGTERM"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


@pytest.mark.parametrize("when", ["summarising", "writing"])
def test_compare_stopped_after_its_runs_writes_the_whole_set(tmp_path, monkeypatch, when):
    """``kvroute compare --out``: SIGTERM after every run finished (while compare summarises them,
    or while the CLI writes the set) leaves the whole set, no INCOMPLETE file, exit 130."""
    from click.testing import CliRunner

    from kvroute.cli import sim_commands
    from kvroute.cli.main import cli
    from kvroute.sim.study import experiment

    def sigterm_then(real):
        calls = {"n": 0}

        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 1:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
            return real(*args, **kwargs)
        return wrapped

    if when == "summarising":
        monkeypatch.setattr(experiment, "_comparison", sigterm_then(experiment._comparison))
    else:
        monkeypatch.setattr(sim_commands, "_write_outputs", sigterm_then(sim_commands._write_outputs))
    out = tmp_path / "out"
    done = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "3", "--workers", "2", "--rounds", "2",
                                    "--executor", "sequential", "--out", str(out)])
    assert done.exit_code == 130, done.output
    said = {"summarising": "interrupted after all 6 runs finished: their results are whole",
            "writing": f"interrupted (SIGTERM) after every run finished: the results above and in {out} are whole"}
    assert said[when] in done.output, done.output
    assert not (out / "INCOMPLETE").exists()
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 2 * 3  # three default policies x two rounds, all of them
    assert "incomplete" not in json.loads((out / "compare.json").read_text())
    assert (out / "report.html").exists() and (out / "scenario.yaml").exists()
