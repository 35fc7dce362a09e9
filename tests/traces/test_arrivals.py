"""Load control: arrival processes for generated sessions and rescaled trace timestamps."""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.study.plots import plot_load_curve
from kvroute.traces.arrivals import arrival_times, parse_arrival, rescaled, with_session_starts
from kvroute.traces.format import Trace, TraceRecord
from kvroute.traces.generators import builtin_workload



def test_constant_arrivals_are_exact():
    """As vllm bench serve sends them: the k-th after k gaps of 1 / rate."""
    assert arrival_times(4, 2.0, "constant", None).tolist() == [0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("process, cv", [("poisson", 1.0), ("gamma:2", 2.0), ("gamma:0.5", 0.5)])
def test_random_gaps_have_the_rate_and_cv(process, cv):
    """vllm bench serve's get_request: n gaps, their sums rescaled so the last is at n / rate
    exactly, whatever the seed."""
    for seed in range(3):
        times = arrival_times(40000, 4.0, process, np.random.default_rng(seed))
        gaps = np.diff(times, prepend=0.0)
        assert times[-1] == pytest.approx(10_000.0, rel=1e-12) and times[0] > 0
        assert gaps.mean() == pytest.approx(0.25, rel=1e-12)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)
    assert arrival_times(1, 4.0, "poisson", np.random.default_rng(0)).tolist() == [0.25]
    assert arrival_times(0, 4.0, "poisson", np.random.default_rng(0)).tolist() == []


@pytest.mark.parametrize("text, message", [("weibull", "unknown arrival process"), ("gamma:0", "CV must be"),
                                           ("gamma:x", "gamma needs a CV"), ("poisson:3", "unknown arrival")])
def test_bad_processes_are_clear_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_arrival(text)
    with pytest.raises(ValueError, match="--request-rate must be a finite number > 0"):
        arrival_times(3, float("nan"), "poisson", np.random.default_rng(0))


def test_sessions_start_at_their_arrival_and_later_turns_keep_the_stamp():
    trace = builtin_workload("seed-chat", 3, 2, seed=0, reply=128, request_rate=2.0, arrival="constant")
    assert [(r.session_id, r.turn, r.timestamp_ms) for r in trace.records] == [
        (0, 1, 500.0), (1, 1, 1000.0), (2, 1, 1500.0), (0, 2, 500.0), (1, 2, 1000.0), (2, 2, 1500.0)]
    # the lengths are drawn first, so a rate leaves them as they were
    plain = builtin_workload("seed-chat", 3, 2, seed=0)
    timed = builtin_workload("seed-chat", 3, 2, seed=0, request_rate=2.0)
    assert [r.output_length for r in plain.records] == [r.output_length for r in timed.records]


def _trace(stamps):
    records = [TraceRecord(i, float(t), 32, 4, (i,)) for i, t in enumerate(stamps)]
    return Trace(records, 16, "toy")


def test_rescaled_by_speedup_and_to_a_rate():
    trace = _trace([0, 1000, 3000, 4000])
    assert [r.timestamp_ms for r in rescaled(trace, speedup=2.0).records] == [0.0, 500.0, 1500.0, 2000.0]
    # mean rate (4 - 1) / 4 s = 0.75/s; at 3/s the trace takes 1 s
    assert [r.timestamp_ms for r in rescaled(trace, rate=3.0).records] == pytest.approx([0, 250, 750, 1000])
    with pytest.raises(ValueError, match="one timestamp"):
        rescaled(_trace([5, 5]), rate=1.0)
    with pytest.raises(ValueError, match="give one of"):
        rescaled(trace)
    with pytest.raises(ValueError, match="--speedup must be a finite number > 0"):
        rescaled(trace, speedup=0.0)


def test_a_closed_loop_rate_counts_sessions_not_turns():
    """A generated session trace at 2 sessions/s, rescaled to 2/s for a closed-loop replay, keeps
    its session starts; counting every turn (their own timestamps unused) gave about 2/turns."""
    from kvroute.traces.generators import builtin_workload

    trace = builtin_workload("seed-chat", 16, 6, seed=0, request_rate=2.0)
    roots = [r.timestamp_ms for r in trace.records if r.parent is None]
    again = rescaled(trace, rate=2.0, sessions=True)
    # (16 - 1) sessions over the span of their starts: the same rate
    assert [r.timestamp_ms for r in again.records if r.parent is None] == pytest.approx(
        [t * (15 / (max(roots) - min(roots)) * 1000 / 2.0) for t in roots])
    per_request = rescaled(trace, rate=2.0)
    last = max(r.timestamp_ms for r in per_request.records if r.parent is None)
    assert last > 5 * max(r.timestamp_ms for r in again.records if r.parent is None)
    with pytest.raises(ValueError, match="all sessions start at one timestamp"):
        rescaled(builtin_workload("seed-chat", 4, 2, seed=0), rate=1.0, sessions=True)


def test_session_starts_for_records_without_sessions():
    shifted = with_session_starts(_trace([0, 0, 10]), np.array([1.0, 2.0, 3.0]))
    assert [r.timestamp_ms for r in shifted.records] == [1000.0, 2000.0, 3010.0]


def test_cli_rate_options_and_the_load_curve(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["sweep", "--chats", "6", "--turns", "2", "--workers", "2", "--policies",
                              "round_robin,kv_aware", "--request-rate", "1,50", "--rounds", "1", "--executor",
                              "sequential", "--no-progress", "--plot-load", str(tmp_path / "load.png"),
                              "--out", str(tmp_path / "rows.parquet")])
    assert out.exit_code == 0, out.output
    rows = pd.read_parquet(tmp_path / "rows.parquet")
    assert sorted(rows["request_rate"].unique().tolist()) == [1.0, 50.0]
    slow = rows[rows["request_rate"] == 1.0]["time_to_complete_s"]
    fast = rows[rows["request_rate"] == 50.0]["time_to_complete_s"]
    # 6 sessions at 1/s: the last starts at 6 s, the first after one gap (1.17 s for seed 0): the starts
    # span 4.83 s, of which the burst's queueing at 50/s gives some back; at least half of it shows
    from kvroute.traces.generators import arrival_rng

    starts = arrival_times(6, 1.0, "poisson", arrival_rng(0))
    assert starts[-1] - starts[0] == pytest.approx(4.828, abs=1e-3)
    assert (slow.to_numpy() > fast.to_numpy() + 0.5 * (starts[-1] - starts[0])).all()
    assert (tmp_path / "load.png").stat().st_size > 10_000
    bad = runner.invoke(cli, ["compare", "--speedup", "2"])
    assert bad.exit_code != 0 and "--speedup rescales a --trace file" in bad.output
    bad = runner.invoke(cli, ["compare", "--arrival", "weibull"])
    assert bad.exit_code != 0 and "unknown arrival process" in bad.output
    with pytest.raises(ValueError, match="needs rows with a request_rate"):
        plot_load_curve(rows.assign(request_rate=None), tmp_path / "x.png")


def _starts(trace: Trace) -> list[float]:
    return [r.timestamp_ms for r in trace.records if r.parent is None]


def test_arrivals_are_common_across_lengths_and_lengths_across_rates():
    """The sessions' arrival gaps come from a stream of their own: before, they were drawn after
    the lengths from the same one, so a sweep of reply lengths or think times at one rate also
    drew new arrivals at every point."""
    from kvroute.traces.generators import arrival_rng

    short = builtin_workload("agent", 8, 3, seed=0, reply=(50, 100), request_rate=2.0)
    long = builtin_workload("agent", 8, 3, seed=0, reply=(500, 1000), request_rate=2.0, think_time_s="exponential:3")
    assert _starts(short) == _starts(long)
    assert [r.output_length for r in short.records] != [r.output_length for r in long.records]
    assert _starts(short) == (1000.0 * arrival_times(8, 2.0, "poisson", arrival_rng(0))).tolist()
    faster = builtin_workload("agent", 8, 3, seed=0, reply=(50, 100), request_rate=4.0)
    assert [r.input_length for r in faster.records] == [r.input_length for r in short.records]
    assert _starts(faster) != _starts(short)
    assert _starts(builtin_workload("agent", 8, 3, seed=1, reply=(50, 100), request_rate=2.0)) != _starts(short)
