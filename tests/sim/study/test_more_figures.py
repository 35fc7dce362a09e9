"""The figure style on the per-stage, tornado and fit figures (issue 36, item 1), asserted on
matplotlib's objects, never on pixels; none of kvroute's figures touches pyplot or the backend."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.colors import to_hex

from kvroute.cli.main import cli
from kvroute.sim.study.figure_style import FIGURE_FORMATS, policy_colors
from kvroute.sim.study.sensitivity import TORNADO_COLORS, Factor, SensitivityResult
from kvroute.sim.study.stages import plot_stages, stages_figure
from tests.support.paths import CALIBRATE_DATA
from tests.support.workloads import SMALL_LADDER

ROOT = Path(__file__).resolve().parents[3]
HEADER = "trace inference-perf:ladder.yaml: 1170 requests | 1 worker on 1 GPU | profile a6000-qwen2.5-7b"


def _stage_table(itl=(0.03, 0.035, 0.07, 0.116)) -> pd.DataFrame:
    """Two policies over a four-stage ladder whose TTFT passes saturation (0.16 s to 138 s)."""
    rows = []
    for policy, slower in (("round_robin", 1.0), ("kv_aware", 0.5)):
        for stage, (rate, mean, p90, tput) in enumerate(((1, 0.39, 0.45, 189.0), (4, 0.16, 0.18, 712.0),
                                                         (16, 0.19, 0.23, 1740.0), (96, 64.4, 138.3, 2077.0))):
            rows.append({"stage": stage, "policy": policy, "rate": float(rate), "ttft_mean": mean * slower,
                         "ttft_p90": p90 * slower, "output_throughput": tput, "itl_mean": itl[stage]})
    return pd.DataFrame(rows)


def _lines(ax) -> dict[str, tuple[str, str]]:
    return {line.get_label(): (to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}


def test_stage_figure_names_the_scenario_colours_each_policy_and_logs_ttft_past_saturation():
    colors = policy_colors(["round_robin", "kv_aware"])
    title = f"Per stage\n{HEADER} | policies round_robin, kv_aware"
    fig = stages_figure(_stage_table(), title, colors)
    assert fig._suptitle.get_text() == title
    ttft, tput, itl = fig.axes
    lines = _lines(ttft)
    assert lines["round_robin mean"] == (colors["round_robin"], "-")
    assert lines["round_robin p90"] == (colors["round_robin"], "--")
    assert lines["kv_aware mean"][0] == lines["kv_aware p90"][0] == colors["kv_aware"] != colors["round_robin"]
    assert _lines(tput)["kv_aware"][0] == _lines(itl)["kv_aware"][0] == colors["kv_aware"]
    # TTFT 0.08..138 s and throughput 189..2077 tok/s span decades: log; ITL 0.03..0.116 s does not
    assert (ttft.get_yscale(), tput.get_yscale(), itl.get_yscale()) == ("log", "log", "linear")
    assert itl.get_ylim()[0] == 0.0
    assert ttft.get_ylabel().startswith("TTFT (s)") and "(tok/s)" in tput.get_ylabel()
    assert itl.get_ylabel() == "ITL mean (s)"
    for ax in fig.axes:
        assert ax.get_xlabel() == "stage (in the order run) and its rate (requests/s)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0\n1/s", "1\n4/s", "2\n16/s", "3\n96/s"]
    # the p90 above 100 s is inside the log axis
    assert ttft.get_ylim()[1] >= 138.3


def test_stage_figure_leaves_out_a_panel_without_numbers():
    fig = stages_figure(_stage_table(itl=(math.nan,) * 4))
    assert [ax.get_title() for ax in fig.axes] == ["TTFT per stage", "output throughput per stage"]
    with pytest.raises(ValueError, match="no stage rows"):
        stages_figure(_stage_table().iloc[0:0])


def test_figures_leave_pyplot_and_the_backend_alone(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    def refuse(*args, **kwargs):
        raise AssertionError("a figure function called matplotlib.use")

    backend, open_figures = matplotlib.get_backend(), plt.get_fignums()
    monkeypatch.setattr(matplotlib, "use", refuse)
    plot_stages(_stage_table(), tmp_path / "stages.png")
    _result().plot(tmp_path / "tornado.svg")
    assert matplotlib.get_backend() == backend and plt.get_fignums() == open_figures
    assert (tmp_path / "stages.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "tornado.svg").read_bytes()[:400]


def test_no_module_of_kvroute_uses_pyplot_or_sets_the_backend():
    offenders = []
    for folder in ("sim", "calibrate", "cli", "traces"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if re.search(r"matplotlib\.use\(|import matplotlib\.pyplot|from matplotlib import pyplot", text):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def _result() -> SensitivityResult:
    """A hand-made screening of two policies: ``a`` raises ``x``'s time, ``b`` lowers it, ``c`` is mixed."""
    def keep(scenario, profile, value):
        return scenario, profile

    factors = [Factor("a", 0.0, 1.0, keep, "s", "stated"), Factor("b", 1.0, 2.0, keep, "x", "stated"),
               Factor("c", 0.0, 0.5, keep, "", "stated")]
    outputs = ["x:time_to_complete_s", "x:hit_rate", "y vs x:time_to_complete_s"]
    effects = {"a": (2.0, 2.0, 1.5), "b": (-1.0, 1.0, 0.2), "c": (0.1, 0.6, 0.8)}  # mu, mu*, conf (a's reaches below 0)
    rows = [{"output": o, "factor": f, "mu": mu, "mu_star": star, "sigma": 0.5, "mu_star_conf": conf, "rank": 0}
            for o in outputs for f, (mu, star, conf) in effects.items()]
    settings = {"scenario": {"workload": "seed-chat", "chats": 8, "turns": 2, "workers": 2, "trace_file": None},
                "profile": "a6000-qwen2.5-7b", "trajectories": 4, "levels": 4, "rounds": 1, "noise_rounds": 2,
                "seed": 0, "points": 16}
    return SensitivityResult(factors, ["x", "y"], outputs, pd.DataFrame(), pd.DataFrame(rows),
                             {o: 1.0 for o in outputs}, {o: 0.25 for o in outputs}, settings)


def test_tornado_names_the_scenario_and_gives_mu_star_its_unit():
    fig = _result().figure()
    title = fig._suptitle.get_text()
    for part in ("Morris mu*", "seed-chat: 8 chats x 2 turns", "2 workers", "profile a6000-qwen2.5-7b",
                 "policies x, y"):
        assert part in title, title
    ttc, hit, change = fig.axes
    assert (ttc.get_xlabel(), hit.get_xlabel(), change.get_xlabel()) == (
        "mu* (s)", "mu* (share, 0-1)", "mu* (percentage points of the change)")
    for ax in fig.axes:
        bars = {label.get_text(): to_hex(patch.get_facecolor()) for label, patch in zip(ax.get_yticklabels(),
                                                                                        ax.patches)}
        assert bars == {"a": TORNADO_COLORS["raises"], "b": TORNADO_COLORS["lowers"], "c": TORNADO_COLORS["mixed"]}
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0.0
        # whiskers clipped at 0: a's mu* 2 with conf 1.5 draws 0.5..3.5, never below 0
        whiskers = [seg for coll in ax.collections for seg in coll.get_segments()]
        assert whiskers and min(float(np.min(seg[:, 0])) for seg in whiskers) >= 0.0
        noise = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(noise) == 1 and list(noise[0].get_xdata()) == [0.25, 0.25]
    # the legend says what the colours and the dashed line mean
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "raises the output", "lowers it", "mixed signs", "seed noise (sd)",
        "within the seed noise (whisker reaches the line; ? in the tables)"]


def test_effects_within_the_seed_noise_are_hatched_on_the_tornado_and_marked_in_the_tables():
    """One rule (sensitivity.within_noise): c's mu* 0.6 less its conf 0.8 reaches the noise line
    0.25; a (2.0 - 1.5 = 0.5) and b (1.0 - 0.2 = 0.8) stand clear of it."""
    result = _result()
    for ax in result.figure().axes:
        hatches = {label.get_text(): patch.get_hatch() for label, patch in zip(ax.get_yticklabels(), ax.patches)}
        assert hatches == {"a": None, "b": None, "c": "////"}, ax.get_title()
    assert result.format_table("x").splitlines() == [
        "x: mu* per factor (effect of crossing its range)",
        "factor             range      time to complete (s)  hit rate",
        "-----------------  ---------  --------------------  --------",
        "at the base point  (seed sd)              1 (0.25)  1 (0.25)",
        "a                  0..1 s                       +2        +2",
        "b                  1..2 x                       -1        -1",
        "c                  0..0.5                    ~0.6?     ~0.6?",
    ]
    (table, *_rest) = result.report_tables()
    assert [row[-1].text for row in table.rows[1:]] == ["+2", "-1", "~0.6?"]
    assert "? within the seeds' noise: mu* less its 95% interval (mu* - conf) is at most the seeds' sd" in table.caption


def test_within_noise_compares_the_low_end_of_mu_stars_interval_with_the_seeds_sd():
    from kvroute.sim.study.sensitivity import within_noise

    # the guide's cell (docs/guide/sensitivity.md): agent workload, round_robin later-turn TTFT mean,
    # overheads.api_server_s: mu* 1.6 x the seeds' sd, but its interval's low end below it
    assert within_noise(0.634406, 0.393881, 0.384788) is True
    assert within_noise(1.62, 0.3, 0.394) is False  # 1.32 clear of 0.394
    assert within_noise(0.394, 0.0, 0.394) is True  # at the line
    assert within_noise(0.0, 0.0, 0.01) is False  # nothing moved: no effect, not noise
    assert within_noise(0.3, math.nan, 0.394) is True  # no interval: mu* itself
    assert within_noise(0.3, 0.1, math.nan) is False  # one noise round: unknown


def test_tornado_leaves_out_the_panel_of_an_output_no_factor_moved_for_one_group():
    result = _result()
    result.indices.loc[result.indices["output"] == "y vs x:time_to_complete_s", ["mu", "mu_star", "mu_star_conf"]] = 0.0
    fig = result.figure()
    assert [ax.get_title() for ax in fig.axes] == ["x\ntime to complete (s)", "x\nhit rate"]
    assert "(1 output(s) no factor moved left out)" in fig._suptitle.get_text()
    assert len(result.figure(outputs=result.outputs).axes) == 3  # asked for: drawn


def test_sensitivity_writes_each_format_and_a_report_whose_numbers_are_the_runs(tmp_path):
    out = tmp_path / "sens"
    result = CliRunner().invoke(cli, ["sensitivity", "--chats", "6", "--turns", "2", "--workers", "2",
                                      "--policies", "round_robin,kv_aware", "--trajectories", "2", "--rounds", "1",
                                      "--noise-rounds", "2", "--groups", "overheads,start_spread",
                                      "--executor", "sequential", "--figure-format", "png,svg", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (out / "tornado.png").read_bytes()[:4] == b"\x89PNG" and b"<svg" in (out / "tornado.svg").read_bytes()
    page = (out / "report.html").read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert page.count('src="data:image/png;base64,') == 1 and "Tornado: mu* per factor" in page
    assert re.findall(r'<table id="([^"]+)"', page) == ["sensitivity-round_robin", "sensitivity-kv_aware",
                                                        "sensitivity-kv_aware-vs-round_robin", "sensitivity-factors"]
    cells = re.findall(r'data-mu-star="([^"]+)" data-mu="([^"]+)" data-sigma="[^"]+" data-conf="[^"]+"', page)
    doc = json.loads((out / "sensitivity.json").read_text())
    by_factor = {(row["output"], row["factor"]): row for row in doc["indices"]}
    assert len(cells) == len(by_factor) == 4 * 4 * 3
    # table order: group, then factor, then output; every cell carries the run's own mu* and mu
    want = [(by_factor[o, f["name"]]["mu_star"], by_factor[o, f["name"]]["mu"])
            for g in ("round_robin", "kv_aware", "kv_aware vs round_robin") for f in doc["factors"]
            for o in [name for name in dict.fromkeys(r["output"] for r in doc["indices"]) if name.split(":")[0] == g]]
    assert [(float(a), float(b)) for a, b in cells] == [(float(a), float(b)) for a, b in want]
    assert '<pre id="provenance">' in page and "kvroute sensitivity" in page


@pytest.mark.parametrize("args, flag", [(["sensitivity", "--figure-format", "png,jpg"], "--figure-format"),
                                        (["calibrate", "fit", ".", "--figure-format", "gif"], "--figure-format"),
                                        (["calibrate", "fit", ".", "--report", "fit.jpg"], "--report")])
def test_an_unknown_figure_format_is_one_line_naming_the_flag(args, flag):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and f"Invalid value for '{flag}'" in lines[0], result.output


def test_calibrate_fit_lists_the_same_formats():
    from kvroute.cli import fit_command

    assert fit_command.FIGURE_FORMATS == FIGURE_FORMATS


def test_fit_figure_names_the_profile_with_units_and_log_axes(tmp_path):
    from kvroute.calibrate.calibration.fit import fit, fit_figure, plot_report
    from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweeps

    _meta, servers, req, exp = load_sweeps([CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2"])
    obs, _notes = build_observations(req, exp, engine_config(servers[0]), "auto")
    result = fit(obs, 0.25, 0, "auto", "soft_l1", True, 0, 0)
    fig = fit_figure(result, "profile tiny: tiny-qwen2 on CPU, vLLM 0.32.0")
    assert fig._suptitle.get_text().splitlines() == ["Step-cost fit: measured against predicted, prefill and decode",
                                                     "profile tiny: tiny-qwen2 on CPU, vLLM 0.32.0"]
    for ax in fig.axes:
        assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
        assert re.search(r"(ms|tokens|requests)\)$", ax.get_xlabel()) and "(ms)" in ax.get_ylabel(), ax.get_xlabel()
    paths = plot_report(result, tmp_path / "p.fit.svg", "profile tiny", ("png", "pdf"))
    assert [p.name for p in paths] == ["p.fit.svg", "p.fit.png", "p.fit.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_a_workload_config_compare_writes_the_stage_figure_per_format_and_in_the_report(tmp_path):
    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", "--workload-config", str(config), "--policies", "round_robin,kv_aware",
                                      "--executor", "sequential", "--quiet", "--figure-format", "png,svg",
                                      "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} >= {"stages.png", "stages.svg", "ttft.png", "ttft.svg", "report.html"}
    page = (out / "report.html").read_text()
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", page)
    assert captions[-1] == "Per stage: TTFT, output throughput and ITL, one line per policy"
    assert page.count('src="data:image/png;base64,') == len(captions) == 2
    svg = (out / "stages.svg").read_text()
    assert "trace inference-perf:ip.yaml: 28 requests" in svg and "policies round_robin, kv_aware" in svg


def test_tornado_leaves_out_a_metric_no_factor_moved_and_keeps_a_row_per_policy():
    result = _result()
    result.indices.loc[result.indices["output"] == "x:hit_rate", ["mu", "mu_star", "mu_star_conf"]] = 0.0
    fig = result.figure()
    assert [ax.get_title() for ax in fig.axes] == ["x\ntime to complete (s)", "y vs x\ntime to complete change %"]
    assert [ax.get_subplotspec().colspan.start for ax in fig.axes] == [0, 0]  # one column: a row per group
    assert "(1 output(s) no factor moved left out)" in fig._suptitle.get_text()
    assert len(result.figure(outputs=result.outputs).axes) == 3  # asked for: drawn


# -- layout: nothing drawn over anything else (the fresh-user trial), measured on the drawn extents --

def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # a bare Figure has no renderer of its own
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return renderer


def _tall_tornado() -> SensitivityResult:
    """The screening of a real run's shape: 14 factors, two policies, every headline metric (a
    figure 16 inches tall), with mu* up to 0.035 (ticks every 0.005 by default)."""
    from kvroute.sim.study.sensitivity import HEADLINE_METRICS, output_names

    def keep(scenario, profile, value):
        return scenario, profile

    names = [f"step_cost.factor_{i}_s" for i in range(14)]
    factors = [Factor(name, 0.0, 1.0, keep, "s", "stated") for name in names]
    outputs = output_names(["round_robin", "kv_aware"], HEADLINE_METRICS)
    rows = [{"output": o, "factor": f, "mu": 0.0025 * i, "mu_star": 0.0025 * i, "sigma": 0.001,
             "mu_star_conf": 0.001, "rank": 0} for o in outputs for i, f in enumerate(names)]
    settings = {"scenario": {"workload": "seed-chat", "chats": 8, "turns": 2, "workers": 2, "trace_file": None},
                "profile": "a6000-qwen2.5-7b", "trajectories": 2, "levels": 4, "rounds": 1, "noise_rounds": 2,
                "seed": 0, "points": 30}
    return SensitivityResult(factors, ["round_robin", "kv_aware"], outputs, pd.DataFrame(), pd.DataFrame(rows),
                             {o: 0.0 for o in outputs}, {o: 0.01 for o in outputs}, settings)


def test_the_tornado_title_clears_the_panel_titles_and_its_ticks_keep_apart():
    fig = _tall_tornado().figure()
    assert fig.get_figheight() > 12
    renderer = _renderer(fig)
    title = fig._suptitle.get_window_extent(renderer)
    assert min(title.y0 - ax.title.get_window_extent(renderer).y1 for ax in fig.axes) >= 0  # pixels
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:])]
        # at least a label's height between neighbours (0.000 and 0.005 used to touch)
        assert len(boxes) >= 3 and min(gaps) >= boxes[0].height, (ax.get_title(), [t.get_text() for t in
                                                                                  ax.get_xticklabels()])


def test_a_one_column_tornado_keeps_its_title_and_legend_on_the_figure():
    result = _result()
    result.indices.loc[result.indices["output"] == "x:hit_rate", ["mu", "mu_star", "mu_star_conf"]] = 0.0
    fig = result.figure()
    assert [ax.get_subplotspec().colspan.start for ax in fig.axes] == [0, 0]
    renderer = _renderer(fig)
    for artist in (fig._suptitle, fig.legends[0]):
        box = artist.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)

def test_stage_figure_legend_is_below_the_panels_not_over_their_lines():
    fig = stages_figure(_stage_table(), f"Per stage\n{HEADER}", policy_colors(["round_robin", "kv_aware"]))
    renderer = _renderer(fig)
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["round_robin", "kv_aware", "TTFT p90 (dashed, hollow)"]
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert box.y1 <= ax.get_tightbbox(renderer).y0, ax.get_title()  # below each panel and its tick labels


def test_fit_figure_gives_every_series_of_a_panel_its_own_marker():
    import zlib

    from kvroute.calibrate.calibration.fit import fit, fit_figure
    from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweeps

    _meta, servers, req, exp = load_sweeps([CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2-x2"])
    obs, _notes = build_observations(req, exp, engine_config(servers[0]), "auto")
    fig = fit_figure(fit(obs, 0.25, 0, "auto", "soft_l1", True, 0, 0), "profile p")
    for ax in fig.axes[:3]:  # the decode panel's series are contexts on one colour scale
        looks = {}
        for coll in ax.collections:
            if not coll.get_label() or coll.get_label().startswith("_") or not len(coll.get_offsets()):
                continue
            face = coll.get_facecolor()
            edge = coll.get_edgecolor()
            looks[coll.get_label()] = (f"marker {zlib.crc32(coll.get_paths()[0].vertices.round(3).tobytes())}",
                                       to_hex(face[0], keep_alpha=True) if len(face) else "none",
                                       to_hex(edge[0], keep_alpha=True) if len(edge) else "none")
        assert len(looks) >= 4 and len(set(looks.values())) == len(looks), (ax.get_title(), looks)


def test_fit_figure_decode_legend_sits_beside_the_panel_one_entry_per_context_line():
    from kvroute.calibrate.calibration.fit import fit, fit_figure
    from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweeps

    _meta, servers, req, exp = load_sweeps([CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2-x2"])
    obs, _notes = build_observations(req, exp, engine_config(servers[0]), "auto")
    fig = fit_figure(fit(obs, 0.25, 0, "auto", "soft_l1", True, 0, 0), "profile p")
    ax = fig.axes[3]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["128", "1,024", "4,096", "16,384"]
    assert [line.get_label() for line in ax.get_lines()] == ["128", "1,024", "4,096", "16,384"]
    renderer = _renderer(fig)
    # outside the plotting area, so that no context's line is ever under it
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_fit_figure_labels_a_narrow_log_axis_in_plain_numbers():
    """An axis spanning less than a decade (a quick sweep's ITL) labels its minor ticks 2, 3, 4, 6,
    not 2x10^0 in mathtext."""
    from kvroute.calibrate.calibration.fit import fit, fit_figure
    from kvroute.calibrate.calibration.observations import build_observations, engine_config, load_sweeps

    _meta, servers, req, exp = load_sweeps([CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2"])
    obs, _notes = build_observations(req, exp, engine_config(servers[0]), "auto")
    fig = fit_figure(fit(obs, 0.25, 0, "auto", "soft_l1", True, 0, 0), "profile p")
    ax = fig.axes[1]
    ax.set_ylim(1.5, 9.0)
    _renderer(fig)  # draws: the formatters label the ticks
    labels = [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
    assert labels and all(re.fullmatch(r"\d+(\.\d+)?", text) for text in labels), labels
    assert "2" in labels and "3" in labels


def test_short_names_cut_config_paths_and_keep_clashes_whole():
    from kvroute.sim.study.figure_style import short_names

    assert short_names(["round_robin", "epp:/a/b/report.md#precise-scheduling",
                        "epp:config=/x/y/p.yaml,kv_event_delay_s=0.05", "epp:/x/p.yaml measured", "epp:rel.yaml",
                        "epp:/a/x.yaml", "epp:/b/x.yaml"]) == {
        "round_robin": "round_robin",
        "epp:/a/b/report.md#precise-scheduling": "epp:precise-scheduling",
        "epp:config=/x/y/p.yaml,kv_event_delay_s=0.05": "epp:config=p.yaml,kv_event_delay_s=0.05",
        "epp:/x/p.yaml measured": "epp:p.yaml measured",
        "epp:rel.yaml": "epp:rel.yaml",
        "epp:/a/x.yaml": "epp:/a/x.yaml",  # both would read epp:x.yaml
        "epp:/b/x.yaml": "epp:/b/x.yaml",
    }
