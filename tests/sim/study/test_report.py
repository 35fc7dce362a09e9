"""The report page (``kvroute.sim.study.report``): self-contained, exact numbers, escaped text."""

import math

import numpy as np
from matplotlib.figure import Figure

from kvroute.sim.study.report import Cell, Report, Table, exact, render, table_html
from kvroute.sim.study.report_tables import compare_table


def _figure() -> Figure:
    fig = Figure(figsize=(2, 1.5))
    fig.subplots().plot([0, 1], [0, 1])
    return fig


def test_exact_writes_numbers_as_json_does():
    assert [exact(0.1 + 0.2), exact(3), exact(3.0), exact(np.int64(3)), exact(None), exact(math.nan)] == [
        "0.30000000000000004", "3", "3.0", "3", "null", "null"]


def test_page_is_self_contained_and_escapes_text():
    report = Report("a <b> & c", ["trace <x>"], [Table("t", ["m", "v"], [["row & co", Cell("1.0", {"mean": 1.0})]])],
                    [("fig", _figure())], ["note <i>"], "seed: 0\n")
    for kind in ("png", "svg"):
        page = render(report, kind)
        assert "<script" not in page and "<link" not in page and "http" not in page.split("<svg")[0]
        assert "a &lt;b&gt; &amp; c" in page and "note &lt;i&gt;" in page and "row &amp; co" in page
        assert '<td class="num" data-mean="1.0">1.0</td>' in page
    assert 'src="data:image/png;base64,' in render(report, "png")
    svg = render(report, "svg")
    assert "<svg" in svg and "<?xml" not in svg and "<img" not in svg


def test_compare_table_cells_are_the_json_values():
    doc = {"policies": {
        "round_robin": {"hit_rate": {"mean": 0.5, "low": 0.4, "high": 0.6, "rounds": [0.45, 0.55]}},
        "kv_aware": {"hit_rate": {"mean": 0.7, "low": 0.65, "high": 0.75, "rounds": [0.68, 0.72],
                                  "change_vs_baseline_pct": 40.0, "change_vs_baseline_pp": 20.0}},
    }}
    table = compare_table(doc, "2 rounds")
    assert table.header == ["metric", "round_robin", "kv_aware", "Δ vs round_robin"]
    (row,) = table.rows
    assert row[0] == "hit rate (cached/prompt tokens)"
    assert [c.text for c in row[1:]] == ["0.500 ± 0.100", "0.700 ± 0.050", "+20.0 pp"]
    assert row[2].values == {"mean": 0.7, "low": 0.65, "high": 0.75, "rounds": 2}
    assert '<td class="num" data-mean="0.7" data-low="0.65" data-high="0.75" data-rounds="2">' in table_html(table)
    assert row[3].values == {"value": 20.0}


def test_compare_table_shows_whole_counts_without_decimals():
    doc = {"policies": {p: {"failed": {"mean": 320.0, "low": 320.0, "high": 320.0, "rounds": [320.0, 320.0]}}
                        for p in ("round_robin", "kv_aware")}}
    (row,) = compare_table(doc).rows
    assert [c.text for c in row[1:]] == ["320 ± 0", "320 ± 0", ""]  # was 320.0 ± 0.0
