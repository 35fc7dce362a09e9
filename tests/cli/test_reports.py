"""``report.html`` of compare, sweep and validate (issue 36, item 2), ``--figure-format`` (item 1)
and progress that stays out of pipes (item 3)."""

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.cluster.metrics import SUMMARY_METRICS
from kvroute.sim.study.report import exact
from kvroute.sim.study.sweep import intervals
from tests.support.paths import ROOT

SMALL = ["--chats", "6", "--turns", "2", "--workers", "2"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BAR_MARKS = ("\r", "█", "▏", "▎", "▍", "▌", "▋", "▊", "▉", "it/s", "%|")


class Page(HTMLParser):
    """The tables (id -> rows of (text, data attributes)), images and tags of a report page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, dict]]]] = {}
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.refs: list[str] = []
        self._table = self._row = self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.refs += [v for k, v in attrs.items() if k in ("src", "href") and v]
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", f"table{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ["", {k[5:]: v for k, v in attrs.items() if k.startswith("data-")}]
        elif tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append(tuple(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None


def assert_self_contained(page: Page) -> None:
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    assert all(ref.startswith("data:") for ref in page.refs), [r[:40] for r in page.refs if not r.startswith("data:")]


def compare_cells_equal_json(page: Page, doc: dict) -> int:
    """Assert every number of the compare table equals compare.json's; return the cells checked."""
    labels = {label: metric for metric, label in SUMMARY_METRICS.items()}
    policies = list(doc["policies"])
    checked = 0
    rows = page.tables["compare-table"]
    assert len(rows) == len(doc["policies"][policies[0]])
    for row in rows:
        metric = labels[row[0][0]]
        cells = iter(row[1:])
        for i, policy in enumerate(policies):
            entry = doc["policies"][policy][metric]
            _text, data = next(cells)
            assert (data["mean"], data["low"], data["high"]) == tuple(exact(entry[k]) for k in ("mean", "low", "high"))
            assert data["rounds"] == exact(len(entry["rounds"]))
            checked += 1
            if "model_interval" in entry:  # --uncertainty: the prediction interval with the model's share
                _text, data = next(cells)
                assert (data["low"], data["high"]) == tuple(exact(entry["model_interval"][k]) for k in ("low", "high"))
                checked += 1
            if i:
                _text, data = next(cells)
                key = "change_vs_baseline_pp" if "change_vs_baseline_pp" in entry else "change_vs_baseline_pct"
                assert data["value"] == exact(entry.get(key))
                if "model_interval" in entry:
                    _text, data = next(cells)
                    iv = entry[key.replace("change_vs_baseline", "change_model_interval")]
                    assert (data["low"], data["high"]) == (exact(iv["low"]), exact(iv["high"]))
        assert next(cells, None) is None
    return checked


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "run"
    result = CliRunner().invoke(cli, ["compare", *SMALL, "--rounds", "2", "--out", str(out), "--time-series",
                                      "--figure-format", "png,pdf,svg"])
    assert result.exit_code == 0, result.output
    return out, result


def test_compare_report_is_self_contained_and_its_numbers_are_compare_json(compare_run):
    out, result = compare_run
    assert "report.html" in result.output
    text = (out / "report.html").read_text()
    page = Page(text)
    assert_self_contained(page)
    doc = json.loads((out / "compare.json").read_text())
    assert compare_cells_equal_json(page, doc) == len(SUMMARY_METRICS) * 3
    # the TTFT figure and one time-series figure per policy, inlined as PNG
    assert len(page.images) == 1 + 3 and all(src.startswith("data:image/png;base64,") for src in page.images)
    assert "trace seed_chat: 12 requests" in text and "policies round_robin, least_loaded, kv_aware" in text
    assert "Note: a6000-qwen2.5-7b is a derived prior" in text  # the notes printed under the table
    assert (out / "scenario.yaml").read_text().splitlines()[0] in text  # provenance
    for name in ("ttft", "timeseries-kv_aware"):
        assert all((out / f"{name}.{fmt}").stat().st_size > 1000 for fmt in ("png", "pdf", "svg"))


def test_compare_report_numbers_match_an_uncertainty_run(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", *SMALL, "--rounds", "2", "--uncertainty", "2",
                                      "--policies", "round_robin,kv_aware", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "compare.json").read_text())
    assert "uncertainty" in doc
    assert compare_cells_equal_json(Page((out / "report.html").read_text()), doc) == len(SUMMARY_METRICS) * 4
    drawn = pd.read_csv(out / "uncertainty.csv")  # the draws' runs, on their own seeds: seed + (d + 1) * rounds
    assert list(drawn.columns) == ["policy", "round", "seed", *SUMMARY_METRICS, "draw"]
    assert drawn[["draw", "policy", "round", "seed"]].values.tolist() == [
        [0, "round_robin", 0, 2], [0, "round_robin", 1, 3], [0, "kv_aware", 0, 2], [0, "kv_aware", 1, 3],
        [1, "round_robin", 0, 4], [1, "round_robin", 1, 5], [1, "kv_aware", 0, 4], [1, "kv_aware", 1, 5]]
    # every file of the run is a row of docs/reference/cli.md's output-files table
    cli_md = (ROOT / "docs" / "reference" / "cli.md").read_text()
    table = cli_md.split("## Output files", 1)[1].split("\n## ", 1)[0]
    documented = {name for line in table.splitlines() if line.startswith("| `")
                  for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])}
    written = {re.sub(r"vllm-bench-\w+\.json", "vllm-bench-<policy>.json", p.name) for p in out.iterdir()}
    assert written - documented == set()


def test_compare_report_holds_the_stage_table_of_a_staged_workload(tmp_path):
    from tests.support.workloads import SMALL_LADDER

    config = tmp_path / "ip.yaml"
    config.write_text(SMALL_LADDER)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["compare", "--workload-config", str(config), "--policies", "round_robin,kv_aware",
                                      "--rounds", "2", "--executor", "sequential", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = Page((out / "report.html").read_text())
    stages = pd.read_csv(out / "stages.csv")
    rows = page.tables["stages"]
    assert len(rows) == len(stages) == 4
    for row, want in zip(rows, stages.to_dict("records")):
        assert float(row[list(stages.columns).index("ttft_mean")][1]["value"]) == pytest.approx(want["ttft_mean"],
                                                                                                 rel=1e-12)
    assert len(page.images) == 2  # the TTFT figure and the stage figure


@pytest.mark.parametrize("command", [["compare", *SMALL], ["sweep", *SMALL, "--request-rate", "1,2"]])
def test_unknown_figure_format_is_a_one_line_error_naming_the_flag(tmp_path, command):
    result = CliRunner().invoke(cli, [*command, "--out", str(tmp_path / "x"), "--figure-format", "png,jpg"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "Error: Invalid value for '--figure-format': unknown figure format 'jpg'; valid: png, pdf, svg")
    assert not (tmp_path / "x").exists()


def test_sweep_report_tables_are_the_rows(tmp_path):
    out = tmp_path / "sweep.parquet"
    result = CliRunner().invoke(cli, ["sweep", *SMALL, "--policies", "round_robin,kv_aware", "--request-rate",
                                      "0.5,8", "--rounds", "2", "--executor", "sequential", "--out", str(out),
                                      "--show", "time_to_complete_s,hit_rate", "--plot-load",
                                      str(tmp_path / "load.svg"), "--figure-format", "pdf"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["load.pdf", "load.svg", "sweep.parquet",
                                                         "sweep.report.html", "sweep.scenario.yaml"]
    page = Page((tmp_path / "sweep.report.html").read_text())
    assert_self_contained(page)
    assert len(page.images) == 1  # the load curve
    assert ("Goodput (TTFT &lt;= 2.0 s and TPOT &lt;= 0.1 s), TTFT p50 and p90 (turns &gt;= 2, as the tables) and "
            "output throughput against offered load (error bars: 95% interval over rounds, as the tables)"
            in (tmp_path / "sweep.report.html").read_text())
    rows = pd.read_parquet(out)
    for metric in ("time_to_complete_s", "hit_rate"):
        iv = intervals(rows, [metric])
        table = page.tables[f"sweep-{metric}"]
        assert len(table) == 2  # one row per request rate
        for row in table:
            rate = float(row[0][0])
            for (text, data), policy in zip(row[1:], ["round_robin", "kv_aware"]):
                want = iv[(iv["request_rate"] == rate) & (iv["policy"] == policy)].iloc[0]
                assert (data["mean"], data["low"], data["high"]) == (
                    exact(want[metric]), exact(want[f"{metric}_low"]), exact(want[f"{metric}_high"]))


def _browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def test_compare_report_renders_in_headless_chromium(compare_run, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip(f"no headless browser found (looked for {', '.join(BROWSERS)} on PATH; "
                    "Debian: apt-get install chromium)")
    out, _ = compare_run
    url = (out / "report.html").resolve().as_uri()
    flags = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--user-data-dir="
             + str(tmp_path / "profile")]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=300).stdout
    page = Page(dom)
    doc = json.loads((out / "compare.json").read_text())
    assert compare_cells_equal_json(page, doc) == len(SUMMARY_METRICS) * 3  # the browser's DOM, not the file
    assert len(page.images) == 4 and all(src.startswith("data:image/png;base64,") for src in page.images)
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, "--window-size=1280,2400", f"--screenshot={shot}", url], capture_output=True,
                   timeout=300)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    assert len({tuple(p) for p in pixels[::16, ::16].reshape(-1, pixels.shape[-1]).round(2)}) > 50  # drawn, not blank


def test_validate_writes_report_html_with_shared_policy_colours(tmp_path):
    from tests.calibrate.validation.test_validate import FakeVllm, _invoke_validate

    servers = [FakeVllm(), FakeVllm()]
    try:
        res, doc, _ = _invoke_validate(servers, tmp_path, "--figure-format", "png,svg")
    finally:
        for server in servers:
            server.close()
    out = tmp_path / "out"
    assert "report.html" in res.output
    page = Page((out / "report.html").read_text())
    assert_self_contained(page)
    assert len(page.images) == 3  # every policy together, then one per policy
    assert all((out / f"ttft_{name}.{fmt}").exists() for name in ("all", "round_robin", "kv_aware")
               for fmt in ("png", "svg"))
    for policy, entry in doc["policies"].items():
        rows = page.tables[f"policy-{policy}"]
        assert len(rows) == len(entry["metrics"]) + len(entry["workers"])  # then each worker's hit tokens
        assert [row[0][0] for row in rows[len(entry["metrics"]):]] == [f"hit tokens, worker {w}" for w in entry["workers"]]
        assert len(page.tables[f"times-{policy}"]) == len(entry["engine_times"])
        for row, m in zip(rows, entry["metrics"].values()):
            assert row[0][0] == m["label"]
            assert row[1][1]["predicted"] == exact(m["predicted"]) and row[4][1]["measured"] == exact(m["measured"])


# -- progress -------------------------------------------------------------------------------------

def _run_piped(tmp_path: Path, *args: str) -> str:
    log = tmp_path / "log.txt"
    with open(log, "w") as handle:  # stdout and stderr to a file, as `... 2>&1 | tee` or `> log 2>&1`
        proc = subprocess.run([sys.executable, "-c", "from kvroute.cli.main import main; main()", *args], stdout=handle,
                              stderr=subprocess.STDOUT, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text
    return text


@pytest.mark.parametrize("command", [
    ["sweep", *SMALL, "--policies", "round_robin,kv_aware", "--rounds", "2", "--executor", "sequential"],
    ["compare", *SMALL, "--rounds", "2"],
])
def test_a_run_piped_to_a_file_has_no_progress_bar(tmp_path, command):
    text = _run_piped(tmp_path, *command)
    assert "time to complete" in text  # the run's table is there ...
    for mark in BAR_MARKS:  # ... and no bar
        assert mark not in text, mark


@pytest.mark.parametrize("command, phase", [
    (["sweep", *SMALL, "--policies", "round_robin", "--rounds", "1", "--executor", "sequential"], "sweep"),
    (["compare", *SMALL, "--rounds", "1"], "simulating"),
    (["sensitivity", *SMALL, "--trajectories", "2", "--rounds", "1", "--noise-rounds", "1", "--groups", "overheads",
      "--executor", "sequential"], "sensitivity"),
])
def test_every_long_command_keeps_its_plain_lines_in_a_pipe(monkeypatch, command, phase):
    """Piped (CliRunner's output is not a terminal), each command's phase gets the plain lines of a
    long phase, not no progress at all (sensitivity turned it off when standard error was no TTY)."""
    from kvroute.sim.study import progress

    made = []

    class Recorded(progress.LineProgress):
        def __init__(self, total, desc, *args, **kw):
            made.append(desc)
            super().__init__(total, desc, *args, **kw)

    monkeypatch.setattr(progress, "LineProgress", Recorded)
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    assert made == [phase]


def test_progress_kind_follows_where_output_goes(monkeypatch):
    import io

    from kvroute.sim.study import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(progress.progress_bar(3, "sweep", "run", enabled=False, stream=Tty()), progress.NoBar)
    terminal = progress.progress_bar(3, "sweep", "run", stream=Tty())
    assert type(terminal).__module__.startswith("tqdm")
    terminal.close()
    piped = io.StringIO()
    bar = progress.progress_bar(3, "calibration sweep", "experiment", stream=piped)
    assert isinstance(bar, progress.LineProgress)
    bar.interval = 0.0  # a phase running long: plain lines, what it does and how much is left
    bar.update()
    bar.update()
    bar.update()
    bar.close()
    lines = piped.getvalue().splitlines()
    assert len(lines) == 3 and re.fullmatch(r"calibration sweep: 1 of 3 experiments done, about \d+ s left", lines[0])
    assert lines[2] == "calibration sweep: 3 of 3 experiments done in 0 s"  # tests/sim/study/test_progress_lines.py
    assert not any(mark in piped.getvalue() for mark in BAR_MARKS)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    shown = []

    class Handle:
        def update(self, view):
            shown.append(view)

    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda view, display_id: shown.append(view) or Handle())
    bar = progress.progress_bar(4, "sweep", "run", stream=io.StringIO())
    assert isinstance(bar, progress.NotebookBar)
    bar.min_interval = 0.0
    for _ in range(4):
        bar.update()
    bar.close()
    assert len(shown) == 6  # one display, updated in place: four updates and the final line
    assert '<progress value="2" max="4">' in shown[2]._repr_html_()
    assert re.fullmatch(r"sweep: 4 runs in \d+ s", repr(shown[-1]))


def test_progress_takes_its_time_left_from_the_caller_where_given():
    """A caller whose items take very different times (the calibration sweep) gives the time
    left; without an answer from it, the count's is shown."""
    import io

    from kvroute.sim.study import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    piped = io.StringIO()
    bar = progress.progress_bar(3, "calibration sweep", "experiment", stream=piped, time_left=lambda elapsed: 300.0)
    bar.interval = 0.0
    bar.refresh()  # before the first is done: the caller's estimate
    bar.update()
    bar.time_left = lambda elapsed: None
    bar.update()
    lines = piped.getvalue().splitlines()
    assert lines[:2] == ["calibration sweep: 0 of 3 experiments done, about 5 min left",
                         "calibration sweep: 1 of 3 experiments done, about 5 min left"]
    assert re.fullmatch(r"calibration sweep: 2 of 3 experiments done, about \d+ s left", lines[2])
    terminal = Tty()
    left = [300.0]
    bar = progress.progress_bar(3, "calibration sweep", "experiment", stream=terminal, time_left=lambda elapsed: left[0])
    left[0] = 120.0
    bar.refresh()  # the refresher's (keep_refreshed): the caller's time left anew, nothing done
    bar.update(3)
    bar.close()
    first, refreshed, last = terminal.getvalue().strip("\r\n").split("\r")
    assert re.search(r"\| 0/3 \[[0-9:]+, about 5 min left\]$", first)  # tqdm's bar, the caller's time left
    assert re.search(r"\| 0/3 \[[0-9:]+, about 2 min left\]$", refreshed)
    assert re.search(r"\| 3/3 \[[0-9:]+\]$", last)  # none once all are done


def test_a_cell_says_when_only_some_rounds_have_a_value():
    """Turn 2 of a 1-chat run fails in two rounds of four (its prompt passes max_model_len with
    the longer replies): its later-turn TTFT is the mean and t interval of the two rounds that
    have one, and the cell says so."""
    result = CliRunner().invoke(cli, ["compare", "--chats", "1", "--turns", "2", "--rounds", "4", "--max-model-len",
                                      "1290", "--policies", "round_robin", "--executor", "sequential", "--json"])
    assert result.exit_code == 0, result.output
    rounds = json.loads(result.output[result.output.index("{"):])["policies"]["round_robin"]["later_ttft_mean_s"]
    values = [v for v in rounds["rounds"] if v is not None]
    assert len(rounds["rounds"]) == 4 and len(values) == 2
    table = CliRunner().invoke(cli, ["compare", "--chats", "1", "--turns", "2", "--rounds", "4", "--max-model-len",
                                     "1290", "--policies", "round_robin", "--executor", "sequential"]).output
    from scipy import stats

    half = abs(values[0] - values[1]) / 2 * stats.t.ppf(0.975, 1)  # sd / sqrt(2) of two values
    line = next(line for line in table.splitlines() if line.startswith("TTFT mean, turns >= 2"))
    assert line.endswith(f"{sum(values) / 2:.3f} ± {half:.3f} (2 of 4 rounds)"), line


def test_summary_csv_writes_counts_whole(tmp_path):
    result = CliRunner().invoke(cli, ["compare", *SMALL, "--rounds", "1", "--max-model-len", "1290",
                                      "--executor", "sequential", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    import csv

    rows = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert all(row["failed"].isdigit() and row["preemptions"].isdigit() for row in rows), rows[0]
    assert any(int(row["failed"]) > 0 for row in rows)  # a count that is not 0 too (prompts past 1,290 tokens)
