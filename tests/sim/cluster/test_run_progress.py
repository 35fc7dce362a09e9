"""Progress inside a run: reported from the event loop without changing the run."""

from __future__ import annotations

import pandas as pd
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.study.scenario import Scenario
from kvroute.sim.cluster import cluster
from kvroute.sim.cluster.cluster import simulate


def test_progress_reports_time_and_position_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(cluster, "PROGRESS_EVERY", 50)
    trace = Scenario(workload="seed-chat", turns=3, chats=8).trace()
    spec = Scenario(profile="a6000-qwen2.5-7b", workers=2).spec()
    reports = []
    with_bar = simulate(trace, spec, seed=3, progress=lambda now, sent, total: reports.append((now, sent, total)))
    plain = simulate(trace, spec, seed=3)
    pd.testing.assert_frame_equal(with_bar.records, plain.records)
    assert len(reports) > 2
    times = [r[0] for r in reports]
    assert times == sorted(times) and times[-1] == plain.records["finish"].max()
    assert reports[-1][1:] == (24, 24) and all(r[2] == 24 for r in reports)


def test_quiet_flag_is_accepted_and_prints_the_table_only():
    result = CliRunner().invoke(cli, ["simulate", "--chats", "2", "--turns", "2", "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "simulating" not in result.output and "TTFT mean (s)" in result.output
