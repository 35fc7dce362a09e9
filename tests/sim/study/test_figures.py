"""The figure style (issue 36, item 1): asserted on matplotlib's objects, never on pixels."""

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from kvroute.sim.cluster.cluster import ClusterSpec, simulate
from kvroute.sim.study.figure_style import (PALETTE, interval_errors, parse_figure_formats, policy_colors,
                                            save_figure, scenario_title, series_style, spans_decades)
from kvroute.sim.study.plots import kv_capacity_blocks, load_figure, series_figure, ttft_figure
from kvroute.sim.study.sweep import Scenario, grid, sweep
from kvroute.sim.timing.profile import load_profile
from kvroute.traces.generators import builtin_workload

HEADER = "trace seed_chat: 24 requests | 2 workers on 2 GPUs | profile a6000-qwen2.5-7b (200 KV blocks)"


def _records(policies=("round_robin", "kv_aware")) -> pd.DataFrame:
    spec = ClusterSpec(load_profile("a6000-qwen2.5-7b"), num_workers=2)
    trace = builtin_workload("seed-chat", 8, 3, seed=0)
    frames = []
    for policy in policies:
        name = policy.split(" ")[0]
        run = simulate(trace, ClusterSpec(spec.profile, 2, policy=name), seed=0)
        frames.append(run.records.assign(policy=policy))
    return pd.concat(frames, ignore_index=True)


def _line_colors(ax) -> dict[str, str]:
    return {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()}


def test_policy_colors_are_stable_and_variants_share_them():
    colors = policy_colors(["round_robin", "kv_aware", "round_robin measured", "sglang"])
    assert colors == {"round_robin": PALETTE[0], "kv_aware": PALETTE[1], "sglang": PALETTE[2]}
    predicted, measured = series_style("kv_aware predicted", colors), series_style("kv_aware measured", colors)
    assert predicted["color"] == measured["color"] == PALETTE[1]
    assert (predicted["ls"], predicted["marker"]) != (measured["ls"], measured["marker"])


def test_ttft_figure_names_the_scenario_and_colours_each_policy_once():
    records = _records(("round_robin predicted", "round_robin measured", "kv_aware predicted", "kv_aware measured"))
    colors = policy_colors(["round_robin", "kv_aware"])
    fig = ttft_figure(records, scenario_title(HEADER, ["round_robin", "kv_aware"], "TTFT"), colors)
    title = fig._suptitle.get_text()
    for part in ("seed_chat", "2 workers", "a6000-qwen2.5-7b", "round_robin", "kv_aware"):
        assert part in title
    ax_cdf, ax_turn = fig.axes
    lines = _line_colors(ax_cdf)
    assert lines["round_robin predicted"] == lines["round_robin measured"] == colors["round_robin"]
    assert lines["kv_aware predicted"] == lines["kv_aware measured"] == colors["kv_aware"]
    styles = {line.get_label(): line.get_linestyle() for line in ax_cdf.get_lines()}
    assert styles["kv_aware predicted"] == "-" and styles["kv_aware measured"] == "--"
    turn = _line_colors(ax_turn)
    assert turn["kv_aware measured mean"] == turn["kv_aware predicted p90"] == colors["kv_aware"]
    for ax in fig.axes:
        assert "(" in ax.get_xlabel() and "(" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
    assert ax_cdf.get_xlabel() == "TTFT (s)" and ax_turn.get_ylabel().startswith("TTFT (s)")


def test_ttft_cdf_goes_log_when_ttft_spans_decades():
    records = _records(("round_robin",))
    assert ttft_figure(records).axes[0].get_xscale() == ("log" if spans_decades(
        [records["ttft"].min(), records["ttft"].max()]) else "linear")
    wide = records.copy()
    wide.loc[wide.index[0], "ttft"] = records["ttft"].max() * 100
    assert ttft_figure(wide).axes[0].get_xscale() == "log"


def test_ttft_by_turn_goes_log_when_its_means_and_p90s_span_decades():
    records = _records(("round_robin",))
    by_turn = records[records["status"] == "ok"].groupby("turn")["ttft"]
    values = [*by_turn.mean(), *by_turn.quantile(0.9)]
    assert ttft_figure(records).axes[1].get_yscale() == ("log" if max(values) / min(values) >= 10 else "linear")
    slow_first = records.assign(ttft=np.where(records["turn"] == 1, 100 * records["ttft"].max(), records["ttft"]))
    turn = ttft_figure(slow_first).axes[1]
    assert turn.get_yscale() == "log"
    assert turn.get_ylim()[0] > 0


@pytest.fixture(scope="module")
def load_rows():
    base = Scenario(workload="agent", chats=3, turns=2, workers=2, history=(2000, 3000))
    return sweep(grid(base, request_rate=[0.5, 2, 16], policy=["round_robin", "kv_aware"]), rounds=2,
                 executor="sequential", progress=False)


def test_load_curve_is_log_across_decades_with_units_and_no_negative_interval(load_rows):
    colors = policy_colors(["round_robin", "kv_aware"])
    fig = load_figure(load_rows, scenario_title("workload agent | workers 2", ["round_robin", "kv_aware"]), colors)
    assert "round_robin, kv_aware" in fig._suptitle.get_text()
    assert len(fig.axes) == 4
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        assert [t for t in ax.get_xticks()] == [0.5, 2.0, 16.0]
        assert ax.get_xlabel() == "offered load (sessions started per s)"
        assert "(" in ax.get_ylabel()
        for container in ax.containers:  # errorbar: (data line, caps, (bar lines,))
            data, _caps, (bars,) = container.lines
            policy = container.get_label()
            assert to_hex(data.get_color()) == colors[policy]
            for segment in bars.get_segments():
                assert segment[:, 1].min() >= 0.0, (ax.get_title(), policy)
    goodput = fig.axes[0]
    assert max(seg[:, 1].max() for c in goodput.containers for seg in c.lines[2][0].get_segments()) <= 1.0
    narrow = load_rows[load_rows["request_rate"] <= 2]
    assert load_figure(narrow).axes[0].get_xscale() == "linear"


def test_interval_errors_clip_to_possible_values():
    err = interval_errors([0.5, 2.0, math.nan], [-0.3, 1.0, math.nan], [1.4, 2.5, math.nan], 0.0, 1.0)
    assert err.tolist() == [[0.5, 1.0, 0.0], [0.5, 0.0, 0.0]]
    assert (interval_errors([3.0], [-5.0], [4.0]) >= 0).all()


def test_series_figure_leaves_out_empty_preemptions_and_draws_kv_capacity():
    profile = load_profile("a6000-qwen2.5-7b")
    trace = builtin_workload("seed-chat", 8, 3, seed=0)
    calm = simulate(trace, ClusterSpec(profile, 2, record_series=True), seed=0).series
    assert calm["vllm:num_preemptions"].sum() == 0
    fig = series_figure(calm, title=scenario_title(HEADER, (), "round_robin, round 0"))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert "preemptions (cumulative)" not in titles
    kv = next(ax for ax in fig.axes if ax.get_title().startswith("KV blocks used"))
    peaks = calm.groupby("worker")["vllm:kv_cache_usage_perc"].max()
    fullest = int(peaks.idxmax())
    assert kv.get_title() == (f"KV blocks used (the fullest, worker {fullest}, peaked at {100 * peaks[fullest]:.1f} % "
                              "of its own blocks)")
    capacity = 2 * (profile.engine.num_gpu_blocks - 1)
    assert kv_capacity_blocks(calm) == {0: profile.engine.num_gpu_blocks - 1, 1: profile.engine.num_gpu_blocks - 1}
    (line,) = [ln for ln in kv.get_lines() if ln.get_label().startswith("KV capacity")]
    assert line.get_ydata()[0] == capacity
    assert "off the top, the axis reaches" in line.get_label()  # a few hundred blocks used of 65k: the axis follows the use
    for ax in fig.axes:
        if ax.get_title():
            assert ax.get_ylabel(), ax.get_title()
    tight_spec = Scenario(chats=8, turns=3, workers=2, kv_blocks=200).spec(record_series=True)
    tight = simulate(trace, tight_spec, seed=0).series
    assert tight["vllm:num_preemptions"].sum() > 0
    fig = series_figure(tight)
    assert "preemptions (cumulative)" in [ax.get_title() for ax in fig.axes]
    kv = next(ax for ax in fig.axes if ax.get_title().startswith("KV blocks used"))
    peaks = tight.groupby("worker")["vllm:kv_cache_usage_perc"].max()  # preempting: one worker near full
    assert peaks.max() > 0.99 and kv.get_title() == (f"KV blocks used (the fullest, worker {int(peaks.idxmax())}, "
                                                     f"peaked at {100 * peaks.max():.1f} % of its own blocks)")
    (line,) = [ln for ln in kv.get_lines() if ln.get_label().startswith("KV capacity")]
    assert line.get_label() == "KV capacity (398 blocks)" and kv.get_ylim()[1] >= 398


def test_the_kv_panel_draws_the_blocks_the_prefix_cache_holds_over_those_in_use():
    from kvroute.sim.cluster.timeseries import gauge_mean

    trace = builtin_workload("seed-chat", 8, 3, seed=0)
    series = simulate(trace, Scenario(chats=8, turns=3, workers=2, kv_blocks=200).spec(record_series=True),
                      seed=0).series
    fig = series_figure(series, bins=50)
    kv = next(ax for ax in fig.axes if ax.get_title().startswith("KV blocks used"))
    (cached,) = [ln for ln in kv.get_lines() if ln.get_label() == "blocks in the prefix cache (in use or free)"]
    edges = np.linspace(float(series["start"].min()), float(series["end"].max()), 51)
    want = gauge_mean(series, "kv_blocks_cached", edges).sum(axis=0)
    assert cached.get_ydata().tolist() == [*want, want[-1]]
    used = gauge_mean(series, "kv_blocks_used", edges).sum(axis=0)
    assert want.max() > used.max()  # freed blocks stay cached (a request's partial last block is never cached)
    assert [t.get_text() for t in kv.get_legend().get_texts()] == [
        "blocks in the prefix cache (in use or free)", "KV capacity (398 blocks)"]


def test_figure_formats_are_checked_and_written(tmp_path):
    assert parse_figure_formats("PNG, svg,png") == ("png", "svg")
    with pytest.raises(ValueError, match=r"unknown figure format 'jpg'; valid: png, pdf, svg"):
        parse_figure_formats("png,jpg")
    with pytest.raises(ValueError, match="at least one"):
        parse_figure_formats(" , ")
    fig = ttft_figure(_records(("round_robin",)))
    paths = save_figure(fig, tmp_path / "ttft", ("png", "pdf", "svg"))
    assert [p.name for p in paths] == ["ttft.png", "ttft.pdf", "ttft.svg"]
    heads = [p.read_bytes()[:5] for p in paths]
    assert heads[0] == b"\x89PNG\r" and heads[1] == b"%PDF-" and b"<svg" in paths[2].read_bytes()[:2000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ttft.pdf", "ttft.png", "ttft.svg"]  # no temporary left
    again = save_figure(fig, tmp_path / "again", ("pdf", "svg"))
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths[1:]]  # no dates: same bytes


def test_scenario_title_wraps_long_scenarios():
    title = scenario_title("x" * 50 + " | " + "y" * 80, ["round_robin"], "what")
    assert title.splitlines()[0] == "what"
    assert all(len(line) <= 110 for line in title.splitlines())
    assert np.all([part in title for part in ("round_robin", "x" * 50)])


def test_the_kv_capacity_legend_is_outside_the_kv_panel():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    series = simulate(builtin_workload("seed-chat", 8, 3, seed=0), ClusterSpec(load_profile("a6000-qwen2.5-7b"), 2,
                                                                               record_series=True), seed=0).series
    fig = series_figure(series, title=scenario_title(HEADER, (), "round_robin, round 0"))
    FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    kv = next(ax for ax in fig.axes if ax.get_title().startswith("KV blocks used"))
    legend = kv.get_legend().get_window_extent(renderer)
    assert legend.y1 <= kv.get_window_extent(renderer).y0  # below the panel: no stacked area under it
    for ax in fig.axes:  # and over no other panel
        assert not legend.overlaps(ax.get_window_extent(renderer)), ax.get_title()


LATER_TTFT = ["later_ttft_mean_s", "later_ttft_p50_s", "later_ttft_p90_s", "later_ttft_p99_s"]


def _bars(container) -> list[tuple[float, float]]:
    """An errorbar container's bars as ``(low, high)`` per point, in drawing order."""
    _data, _caps, (bars,) = container.lines
    return [(float(seg[0, 1]), float(seg[1, 1])) for seg in bars.get_segments()]


@pytest.fixture(scope="module")
def three_round_rows():
    """Load rows whose every round has later turns (``load_rows``' second round has none)."""
    base = Scenario(workload="agent", chats=4, turns=3, workers=2, history=(2000, 8000))
    return sweep(grid(base, request_rate=[0.5, 16], policy=["round_robin", "kv_aware"]), rounds=3,
                 executor="sequential", progress=False)


def test_load_figure_shows_the_tables_ttft_with_their_intervals_and_names_it(three_round_rows):
    from kvroute.sim.study.sweep import intervals, lead_ttft

    load_rows = three_round_rows
    fig = load_figure(load_rows)
    assert [ax.get_title() for ax in fig.axes] == [
        "goodput (share of requests in SLO)\nin SLO: TTFT <= 2.0 s and TPOT <= 0.1 s",
        "TTFT p50, turns >= 2 (s)", "TTFT p90, turns >= 2 (s)", "output throughput (tok/s)"]
    assert lead_ttft(load_rows, "p90") == "later_ttft_p90_s"
    iv = intervals(load_rows, ["later_ttft_p90_s"])  # the sweep table's rows: mean and 95 % interval
    p90 = fig.axes[2]
    for container in p90.containers:
        want = iv[iv["policy"] == container.get_label()].sort_values("request_rate")
        data = container.lines[0]
        assert data.get_ydata().tolist() == want["later_ttft_p90_s"].tolist()
        assert _bars(container) == list(zip(want["later_ttft_p90_s_low"], want["later_ttft_p90_s_high"]))
    # the legend is the figure's, under the panels: none sits inside a panel on the curves
    assert [ax.get_legend() for ax in fig.axes] == [None] * 4
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["round_robin", "kv_aware"]
    assert legend.get_window_extent().y1 < min(ax.get_tightbbox().y0 for ax in fig.axes)  # below the x labels too


def test_load_figure_of_a_workload_without_later_turns_shows_all_turns(load_rows):
    single = load_rows.assign(**{m: math.nan for m in LATER_TTFT}, slo_ttft_s=0.5, slo_tpot_s=0.05)
    fig = load_figure(single)
    assert [ax.get_title() for ax in fig.axes] == [
        "goodput (share of requests in SLO)\nin SLO: TTFT <= 0.5 s and TPOT <= 0.05 s",
        "TTFT p50 (s)", "TTFT p90 (s)", "output throughput (tok/s)"]
    kv = next(c for c in fig.axes[2].containers if c.get_label() == "kv_aware")
    rows = single[single["policy"] == "kv_aware"]
    assert kv.lines[0].get_ydata().tolist() == rows.groupby("request_rate")["ttft_p90_s"].mean().tolist()


def test_load_figure_puts_ttft_on_a_log_axis_when_its_means_span_decades(load_rows):
    fig = load_figure(load_rows)
    ttft_means = load_rows.groupby(["policy", "request_rate"])["later_ttft_p50_s"].mean()
    wide = ttft_means.max() / ttft_means.min() >= 10
    assert fig.axes[1].get_yscale() == ("log" if wide else "linear")
    slow = load_rows.assign(later_ttft_p50_s=np.where(load_rows["policy"] == "round_robin",
                                                      1000 * load_rows["later_ttft_p50_s"], load_rows["later_ttft_p50_s"]))
    axes = load_figure(slow).axes
    assert axes[1].get_yscale() == "log" and axes[1].get_ylim()[0] > 0
    assert axes[3].get_yscale() == "linear"  # throughput stays linear from 0


def test_load_figure_refuses_rows_of_several_goodput_bounds(load_rows):
    mixed = load_rows.assign(slo_ttft_s=[1.0 if i % 2 else 2.0 for i in range(len(load_rows))])
    with pytest.raises(ValueError, match=r"2 goodput bounds \(TTFT <= 2.0 s, TPOT <= 0.1 s; TTFT <= 1.0 s, "
                                         r"TPOT <= 0.1 s\): draw one at a time"):
        load_figure(mixed)


def test_lead_ttft_is_later_turns_when_any_row_has_one():
    from kvroute.sim.study.sweep import lead_ttft

    multi = pd.DataFrame({"later_ttft_mean_s": [math.nan, 0.3], "ttft_mean_s": [0.1, 0.2]})
    assert lead_ttft(multi, "mean") == "later_ttft_mean_s"
    assert lead_ttft(multi.assign(later_ttft_mean_s=math.nan), "mean") == "ttft_mean_s"
    assert lead_ttft(pd.DataFrame({"ttft_p50_s": [0.1]}), "p50") == "ttft_p50_s"
    with pytest.raises(ValueError, match="unknown TTFT statistic 'p95'; valid: mean, p50, p90, p99"):
        lead_ttft(multi, "p95")


def test_load_figure_draws_each_other_swept_setting_as_its_own_line_not_a_pooled_mean():
    from kvroute.sim.study.sweep import intervals

    base = Scenario(workload="agent", chats=3, turns=2, history=(2000, 3000))
    rows = sweep(grid(base, request_rate=[0.5, 2], workers=[1, 2], policy=["round_robin"]), rounds=1,
                 executor="sequential", progress=False)
    fig = load_figure(rows)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["round_robin, workers=1", "round_robin, workers=2"]
    throughput = {c.get_label(): c.lines[0] for c in fig.axes[3].containers}
    iv = intervals(rows, ["output_throughput_tps"], by=["workers", "request_rate"])
    for workers in (1, 2):
        want = iv[iv["workers"] == workers].sort_values("request_rate")["output_throughput_tps"].tolist()
        assert throughput[f"round_robin, workers={workers}"].get_ydata().tolist() == want
    assert throughput["round_robin, workers=1"].get_linestyle() != throughput["round_robin, workers=2"].get_linestyle()
    assert (throughput["round_robin, workers=1"].get_color() == throughput["round_robin, workers=2"].get_color())
    kv = sweep(grid(base, request_rate=[0.5, 2], kv_blocks=[None, 3000], policy=["round_robin"]), rounds=1,
               executor="sequential", progress=False)  # a setting left to the profile (None) keeps its line
    assert [t.get_text() for t in load_figure(kv).legends[0].get_texts()] == [
        "round_robin, kv_blocks=default", "round_robin, kv_blocks=3000"]


def test_load_figure_draws_a_chats_sweep_against_sessions_all_started_at_once():
    from kvroute.sim.study.plots import load_axis

    base = Scenario(workload="agent", turns=2, workers=2, history=(2000, 3000))
    rows = sweep(grid(base, chats=[2, 4, 8], policy=["round_robin", "kv_aware"]), executor="sequential",
                 progress=False)
    assert load_axis(rows) == "chats"
    fig = load_figure(rows)
    assert len(fig.axes) == 4
    for ax in fig.axes:
        assert ax.get_xlabel() == "sessions (all started at once)"
        assert [c.get_label() for c in ax.containers] == ["round_robin", "kv_aware"]
        # two series a fifth of the narrowest gap (2 sessions) apart, centred on the loads
        drawn = [c.lines[0].get_xdata().tolist() for c in ax.containers]
        assert drawn == [pytest.approx([1.8, 3.8, 7.8], abs=1e-12), pytest.approx([2.2, 4.2, 8.2], abs=1e-12)]
        assert ax.get_xticks().tolist() == [2.0, 4.0, 8.0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["round_robin", "kv_aware"]
    at_a_rate = load_figure(rows.assign(request_rate=2.0))
    assert at_a_rate.axes[0].get_xlabel() == "sessions (started at 2 per s)"
    both = rows.assign(request_rate=[1.0, 2.0] * (len(rows) // 2))
    with pytest.raises(ValueError, match=r"^the rows sweep both request_rate and chats: hold one fixed \(one "
                                         r"--request-rate, or one --chats\) to draw the load curve against the other$"):
        load_figure(both)


def test_dodged_series_sit_symmetrically_around_their_x_on_a_log_axis():
    from kvroute.sim.study.figure_style import dodged

    x = [0.0625, 1.0]
    assert list(dodged(x, 1, 3)) == x  # the middle one stays
    left, right = dodged(x, 0, 3), dodged(x, 2, 3)
    assert left * right == pytest.approx(np.square(x), rel=1e-12)  # symmetric in log space
    assert right / np.asarray(x) == pytest.approx([2 ** 0.06] * 2)
    assert list(dodged(x, 0, 1)) == x  # one series: not moved


def test_spread_along_spans_a_fifth_of_the_narrowest_gap_between_ticks():
    from kvroute.sim.study.figure_style import spread_along

    linear = [spread_along([2, 4, 10], k, 3, [2, 4, 10], log=False).tolist() for k in range(3)]
    assert linear == [pytest.approx([1.8, 3.8, 9.8], abs=1e-12), [2.0, 4.0, 10.0],
                      pytest.approx([2.2, 4.2, 10.2], abs=1e-12)]
    # log axis: the narrowest gap is one power of two (0.5 -> 1), so the outer series sit
    # 2 ** +-0.1 from the middle one
    left, right = (spread_along([0.5, 1, 16], k, 3, [0.5, 1, 16], log=True) for k in (0, 2))
    assert right / np.array([0.5, 1, 16]) == pytest.approx([2 ** 0.1] * 3, rel=1e-12)
    assert left * right == pytest.approx(np.square([0.5, 1, 16]), rel=1e-12)
    assert spread_along([3.0], 0, 1, [3.0], log=False).tolist() == [3.0]  # one series: not moved
    assert spread_along([3.0], 0, 2, [3.0], log=False).tolist() == pytest.approx([2.7])  # one tick: its size
    assert spread_along([0.0], 1, 2, [0.0], log=False).tolist() == pytest.approx([0.1])  # a tick at 0: 1


def test_a_policy_that_routed_alike_is_named_so_in_the_ttft_legend():
    records = _records(("round_robin", "kv_aware")).assign(round=0)
    twin = records[records["policy"] == "kv_aware"].assign(policy="least_loaded")
    fig = ttft_figure(pd.concat([records, twin], ignore_index=True))
    ax_cdf, ax_turn = fig.axes
    assert [line.get_label() for line in ax_cdf.get_lines()] == [
        "round_robin", "kv_aware", "least_loaded (routed as kv_aware)"]
    assert "least_loaded (routed as kv_aware) mean" in _line_colors(ax_turn)
    moved = twin.assign(worker=np.where(twin["request_id"] == twin["request_id"].max(), 1 - twin["worker"], twin["worker"]))
    assert "least_loaded" in _line_colors(ttft_figure(pd.concat([records, moved])).axes[0])
    # measured and predicted runs of one policy are not one simulation under two names
    variants = _records(("kv_aware predicted", "kv_aware measured")).assign(round=0)
    assert set(_line_colors(ttft_figure(variants).axes[0])) == {"kv_aware predicted", "kv_aware measured"}


def test_a_series_that_routed_alike_at_every_load_is_named_so_in_the_load_legend():
    base = Scenario(workload="agent", chats=3, turns=2, history=(2000, 3000))
    rows = sweep(grid(base, request_rate=[0.5, 2], workers=[1, 2], policy=["round_robin", "kv_aware"]), rounds=1,
                 executor="sequential", progress=False)
    labels = [t.get_text() for t in load_figure(rows).legends[0].get_texts()]
    # one worker: every policy sends every request to it; two: kv_aware keeps sessions together
    assert labels == ["round_robin, workers=1", "kv_aware (routed as round_robin), workers=1",
                      "round_robin, workers=2", "kv_aware, workers=2"]
    one_load = rows[(rows["workers"] == 1) & ~((rows["policy"] == "kv_aware") & (rows["request_rate"] == 2))]
    assert [t.get_text() for t in load_figure(one_load).legends[0].get_texts()] == ["round_robin", "kv_aware"]
