"""The notebooks are tests: each runs top to bottom with small parameters, and its key numbers
are checked against the package (01's table against `kvroute compare --json` for the same seeds).

A notebook runs in a fresh kernel from a temporary directory, with a cell injected after its
``parameters`` cell (papermill's convention) and a last cell that prints its key numbers as JSON.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from kvroute.cli.sim_commands import compare as compare_command  # noqa: E402
from kvroute.sim.study.experiment import format_interval  # noqa: E402
from kvroute.sim.study.sweep import Scenario, cost_per_million_tokens, grid, intervals, sweep  # noqa: E402
from tests.support.paths import ROOT, SHARED_TRACES  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
NAMES = ["01_seed_study", "02_more_workers", "03_long_histories", "04_calibration", "05_validation", "06_routers"]
MARK = "KVROUTE-CHECK "

SMALL = {
    "01_seed_study": ("CHATS = 8\nTURNS = [2, 3]\nROUNDS = 2\nA100_TURNS = 2\n"
                      "SENS_TRAJECTORIES = 2\nSENS_ROUNDS = 1\nSENS_NOISE_ROUNDS = 2\nUNC_DRAWS = 2\n"),
    "02_more_workers": ("WORKER_COUNTS = [2, 4]\nHIGHLIGHT = 8\nCHATS_PER_WORKER = 3\nTURNS = 3\nROUNDS = 2\n"
                        "EXECUTOR = 'local'\n"),
    "03_long_histories": ("WORKERS = 2\nSESSIONS = 4\nTURNS = 3\nHISTORY = (8000, 12000)\n"
                          "KV_FRACTIONS = [1.0, 0.02]\nROUNDS = 2\nEXECUTOR = 'local'\n"),
    "04_calibration": "",
    "05_validation": "",
    "06_routers": ("WORKERS = 2\nCHATS = 4\nTURNS = [2]\nPOLICIES = ['round_robin', 'kv_aware', 'sglang']\n"
                   "DELAYS_MS = [0, 200]\nDELAY_POLICIES = ['dynamo']\nGATEWAYS = 2\nGATEWAY_POLICIES = ['kv_aware']\n"
                   "ROUNDS = 2\nMOONCAKE_MAX_REQUESTS = 60\nMOONCAKE_POLICIES = ['kv_aware']\nEXECUTOR = 'sequential'\n"),
}


def load(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


FIGURE_CHECKS = '''
def lowest_interval(fig):
    # The lowest end of any error bar of ``fig`` (matplotlib's errorbar line collections).
    ends = [seg[:, 1].min() for ax in fig.axes for coll in ax.collections
            if hasattr(coll, "get_segments") for seg in coll.get_segments() if len(seg)]
    return float(min(ends)) if ends else None


def overflowing_labels(fig):
    # Axis labels and titles that leave the figure, or run past their panel's side.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # a shown figure is closed: draw it again off screen
    canvas.draw()
    renderer = canvas.get_renderer()
    box, bad = fig.bbox, []
    for ax in fig.axes:
        panel = ax.get_window_extent(renderer)
        for text, along in ((ax.xaxis.label, "x"), (ax.yaxis.label, "y"), (ax.title, "x")):
            if not text.get_text():
                continue
            e = text.get_window_extent(renderer)
            outside = e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1
            longer = (e.width if along == "x" else e.height) > (panel.width if along == "x" else panel.height) + 1
            if outside or longer:
                bad.append(text.get_text())
    return bad


def tick_labels(ax, axis="y"):
    # The labels ``ax`` shows on ``axis``: its major and minor ticks' inside its limits, drawn off screen.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(ax.figure).draw()
    low, high = sorted(getattr(ax, f"get_{axis}lim")())
    along = 0 if axis == "x" else 1
    return [t.get_text() for minor in (False, True) for t in getattr(ax, f"get_{axis}ticklabels")(minor=minor)
            if t.get_text() and low <= t.get_position()[along] <= high]
'''


def run(name: str, workdir: Path, params: str = "", check: str = "") -> tuple[object, object]:
    """Execute notebook ``name`` with ``params`` injected; return (notebook, parsed check output).
    The check may call ``FIGURE_CHECKS``' functions."""
    book = load(name)
    index = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    book.cells.insert(index + 1, nbformat.v4.new_code_cell(params, metadata={"tags": ["injected-parameters"]}))
    if check:
        book.cells.append(nbformat.v4.new_code_cell(FIGURE_CHECKS))
        book.cells.append(nbformat.v4.new_code_cell(f"import json\nprint({MARK!r} + json.dumps({check}))"))
    client = nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()
    assert_clean_outputs(book)
    if not check:
        return book, None
    text = "".join(o.get("text", "") for o in book.cells[-1].outputs if o.output_type == "stream")
    line = next(line for line in text.splitlines() if line.startswith(MARK))
    return book, json.loads(line[len(MARK):])


PROGRESS_MARKS = ("\r", "█", "%|", "it/s", "IProgress")


def assert_clean_outputs(book) -> None:
    """No progress-bar chunks in an executed notebook: no stream output carries a bar's characters,
    and a progress display (``kvroute.sim.study.progress.NotebookBar``) is one output per phase,
    updated in place, ending as one line."""
    for cell in book.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "") + "".join(output.get("data", {}).get("text/plain", ""))
            for mark in PROGRESS_MARKS:
                assert mark not in text, (mark, cell.source[:80], text[:200])
        shown = [o for o in cell.get("outputs", []) if o.output_type == "display_data"
                 and "<progress" in "".join(o.get("data", {}).get("text/html", ""))]
        assert not shown, "a progress display left unfinished"


def printed(book) -> str:
    return "\n".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                     for o in c.outputs if o.output_type == "stream")


def cli_compare(*args: str) -> dict:
    result = CliRunner().invoke(compare_command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# -- the committed files --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_clean_and_parameterised(name):
    book = load(name)
    nbformat.validate(book)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert "parameters" in code[0].metadata.get("tags", []), "the first code cell holds the parameters"
    source = "\n".join(c.source for c in code)
    for forbidden in ("import simpy", "from sim.", "from traces.", "import sim\n", "savefig", "to_csv(",
                      "to_parquet(", "open("):
        assert forbidden not in source, f"{name} uses {forbidden!r}"
    if name != "05_validation":  # 05 reads a JSON report only
        assert "from kvroute." in source


def test_every_notebook_is_tested():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


# -- executed with small parameters ---------------------------------------------------------------

def test_01_seed_study_equals_kvroute_compare(tmp_path):
    book, out = run("01_seed_study", tmp_path, SMALL["01_seed_study"],
                    "{'seed_study': seed_study.to_dict('records'), 'a100': a100_study.to_dict('records'), "
                    "'sens': sens.indices.to_dict('records'), 'unc': uncertain.to_dict()}")
    assert not any(tmp_path.iterdir()), "the notebook wrote files"
    common = ["--chats", "8", "--rounds", "2", "--seed", "0"]
    expected = {t: cli_compare(*common, "--turns", str(t)) for t in (2, 3)}
    assert len(out["seed_study"]) == 2 * 3 * 4
    for row in out["seed_study"]:
        want = expected[row["turns"]]["policies"][row["policy"]][row["metric"]]
        assert (row["mean"], row["low"], row["high"], row["rounds"]) == (
            want["mean"], want["low"], want["high"], want["rounds"]), row
    a100 = ["--profile", "a100-80gb-qwen2.5-7b", "--turns", "2", *common]
    expected = {"2 workers share 1 GPU": cli_compare(*a100, "--workers", "2", "--gpus", "1",
                                                     "--policies", "round_robin,kv_aware"),
                "1 worker, whole GPU": cli_compare(*a100, "--workers", "1", "--policies", "round_robin")}
    assert len(out["a100"]) == 3 * 4
    for row in out["a100"]:
        want = expected[row["arrangement"]]["policies"][row["policy"]][row["metric"]]
        assert (row["mean"], row["rounds"]) == (want["mean"], want["rounds"]), row
    assert "kv_aware vs round_robin" in printed(book)
    series_cell = next(c for c in book.cells if "series_figure(s" in c.source)
    assert "kv_aware: " in printed(book) and "engine-step samples" in printed(book)
    assert sum("image/png" in o.get("data", {}) for o in series_cell.outputs) == 2, "one time-series figure per policy"
    _check_01_sensitivity(book, out)


def _check_01_sensitivity(book, out) -> None:
    """01's sensitivity section equals ``run_sensitivity``, its intervals ``compare --uncertainty``."""
    import pandas as pd

    from kvroute.sim.study.sensitivity import run_sensitivity

    api = run_sensitivity(Scenario(chats=8, turns=2, workers=4, profile="a6000-qwen2.5-7b", seed=0),
                          ["round_robin", "kv_aware"], trajectories=2, rounds=1, noise_rounds=2, seed=0,
                          executor="sequential")
    assert pd.DataFrame(out["sens"]).equals(api.indices)
    want = cli_compare("--chats", "8", "--turns", "2", "--rounds", "2", "--seed", "0", "--uncertainty", "2",
                       "--policies", "round_robin,kv_aware")
    for policy in ("round_robin", "kv_aware"):
        for metric in ("time_to_complete_s", "later_ttft_mean_s", "hit_rate"):
            got, exp = out["unc"]["policies"][policy][metric], want["policies"][policy][metric]
            assert (got["mean"], got["model_interval"]) == (exp["mean"], exp["model_interval"]), (policy, metric)
    assert "mu* per factor" in printed(book)
    tornado_cell = next(c for c in book.cells if "sens.figure(" in c.source)
    assert sum("image/png" in o.get("data", {}) for o in tornado_cell.outputs) == 1, "the tornado, shown once"


def test_02_more_workers_numbers_are_the_sweep(tmp_path):
    book, out = run("02_more_workers", tmp_path, SMALL["02_more_workers"],
                    "{'iv': iv.to_dict('records'), 'gain': gain.reset_index().values.tolist()}")
    assert not any(tmp_path.iterdir())
    scenarios = [Scenario(chats=3 * n, turns=3, workers=n, policy=p)
                 for n in (2, 4) for p in ("round_robin", "least_loaded", "kv_aware")]
    frame = sweep(scenarios, rounds=2, executor="sequential", progress=False)
    frame["prefill_mtok"] = frame["prefill_tokens"] / 1e6
    expected = intervals(frame, ["time_to_complete_s", "hit_rate", "prefill_mtok"], by=["workers", "policy"])
    assert len(out["iv"]) == 6
    for row, want in zip(out["iv"], expected.to_dict("records")):
        for key in ("workers", "policy", "time_to_complete_s", "time_to_complete_s_high", "hit_rate", "prefill_mtok"):
            assert row[key] == want[key], key
    # HIGHLIGHT = 8 is not in the small grid: the closest count is reported
    assert "4 workers, kv_aware vs round_robin: time to complete" in printed(book)


def test_03_long_histories_evictions_goodput_and_cost(tmp_path):
    book, out = run("03_long_histories", tmp_path, SMALL["03_long_histories"],
                    "{'frame': frame.to_dict('records'), 'iv': iv.to_dict('records'), 'kv_blocks': kv_blocks, "
                    "'lowest': [lowest_interval(fig_kv), lowest_interval(fig_cost)], "
                    "'overflowing': overflowing_labels(fig_kv) + overflowing_labels(fig_cost)}")
    assert min(out["lowest"]) >= 0, "an interval below zero"
    # the tables show the figures' intervals: a cost and a count clipped at zero as a time is
    assert min(r[f"{m}_low"] for r in out["iv"] for m in ("num_evictions", "usd_per_mtok_output",
                                                          "usd_per_mtok_total")) == 0.0
    cost_cell = next(c for c in book.cells if "cost = iv.assign(" in c.source)
    shown = "".join(o["data"]["text/plain"] for o in cost_cell.outputs if o.output_type == "display_data")
    assert "$ / M output tokens" in shown and "[-" not in shown
    assert out["overflowing"] == []
    sweep_cell = next(c for c in book.cells if "frame = sweep(" in c.source)
    assert [o["data"]["text/plain"].split(" in ")[0] for o in sweep_cell.outputs if o.output_type == "display_data"
            ] == ["sweep: 12 runs"]  # its progress: one display, updated in place, one line when done
    assert not any(tmp_path.iterdir())
    full, small = out["kv_blocks"]
    assert small == round(0.02 * full)
    iv = {(r["kv_mtok_per_worker"], r["policy"]): r for r in out["iv"]}
    tight, roomy = min(k[0] for k in iv), max(k[0] for k in iv)
    assert iv[(roomy, "kv_aware")]["num_evictions"] == 0
    assert iv[(tight, "round_robin")]["num_evictions"] > 0
    for row in out["frame"]:
        hours = row["time_to_complete_s"] / 3600
        assert row["usd_per_mtok_output"] == pytest.approx(2.0 * 2 * hours / (row["output_tokens"] / 1e6))
        assert 0 <= row["goodput_share"] <= 1
    # one run recomputed outside the notebook gives the same numbers
    base = Scenario(workload="agent", chats=4, turns=3, history=(8000, 12000), reply=(50, 300), think_time_s=1.0,
                    profile="a100-80gb-qwen2.5-7b", workers=2)
    again = sweep(grid(base, kv_blocks=small, policy="kv_aware"), rounds=2, executor="sequential", progress=False)
    mine = [r for r in out["frame"] if r["kv_blocks"] == small and r["policy"] == "kv_aware"]
    assert [r["goodput_share"] for r in mine] == again["goodput_share"].tolist()
    assert [r["usd_per_mtok_output"] for r in mine] == cost_per_million_tokens(again, 2.0).tolist()
    assert "USD per million tokens at $2.00 per GPU-hour (assumed)" in printed(book)


def test_04_calibration_runs_with_or_without_the_profile(tmp_path):
    book, out = run("04_calibration", tmp_path, check="{'found': profile is not None, 'rows': list(coefficients.index), "
                                                       "'ticks': [tick_labels(ax_prefill), tick_labels(ax_decode)]}")
    assert out["rows"] == ["step_overhead_s", "weight_load_s", "per_token_s", "per_request_s",
                           "prefill_attn_s", "decode_attn_s"]
    # step times on log axes labelled as plain numbers, no minor tick labelled 2×10^0
    assert not any("times" in label or "^" in label for labels in out["ticks"] for label in labels)
    if out["found"]:
        assert out["ticks"] == [["2", "5", "10", "20", "50", "100", "200"], ["2", "5", "10", "20", "50"]]
    if not out["found"]:
        assert "not yet available" in printed(book)
    assert not any(tmp_path.iterdir())


def test_05_validation_without_a_report_stops_gracefully(tmp_path):
    book, out = run("05_validation", tmp_path, check="report is None")
    assert out is True
    assert "No validation report" in printed(book)


def test_05_validation_shows_a_report(tmp_path):
    report = tmp_path / "validate" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({
        "trace": "seed_chat", "rounds": 1,
        "policies": {"kv_aware": {"ttft_mean_s": {"predicted": 0.44, "measured": 0.40},
                                  "hit_rate": {"predicted": 0.55, "measured": 0.40}}},
        "changes": {"kv_aware": {"hit_rate": {"predicted": 12.0, "measured": 10.0}}},
        "requests": [{"request_id": 0, "ttft_sim": 0.1, "ttft_live": 0.12}],
    }))
    book, out = run("05_validation", tmp_path, f"REPORT = {str(report)!r}\n",
                    "compared[['quantity', 'error', 'unit']].to_dict('records')")
    assert out == [  # a share's and a change's errors in percentage points, never a percent of a percent
        {"quantity": "policies.kv_aware.ttft_mean_s", "error": pytest.approx(10.0), "unit": "% of measured"},
        {"quantity": "policies.kv_aware.hit_rate", "error": pytest.approx(15.0), "unit": "pp"},
        {"quantity": "changes.kv_aware.hit_rate", "error": pytest.approx(2.0), "unit": "pp"},
    ]


def test_06_routers_tables_are_the_sweep(tmp_path):
    mooncake = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
    params = SMALL["06_routers"] + f"MOONCAKE = {str(mooncake)!r}\n"
    book, out = run("06_routers", tmp_path, params,
                    "{'policies': policies_iv.to_dict('records'), 'policies_table': policies_table.to_dict('records'), "
                    "'delay': delay_iv.to_dict('records'), "
                    "'gateways': gateway_iv.to_dict('records'), "
                    "'mooncake': None if mooncake is None else mooncake.to_dict('records')}")
    assert not any(tmp_path.iterdir())
    base = Scenario(chats=4, turns=2, workers=2)
    again = sweep(grid(base, policy=["round_robin", "kv_aware", "sglang"]), rounds=2, executor="sequential",
                  progress=False)
    expected = intervals(again, ["time_to_complete_s", "hit_rate"], by=["turns", "policy"])
    for row, want in zip(out["policies"], expected.to_dict("records")):
        assert (row["policy"], row["time_to_complete_s"], row["hit_rate"]) == (
            want["policy"], want["time_to_complete_s"], want["hit_rate"])
    # the table's cells are kvroute compare's: a time's interval clipped at zero shows its ends, not a ±
    for row, want in zip(out["policies_table"], expected.to_dict("records")):
        for m in ("time_to_complete_s", "hit_rate"):
            assert row[m] == format_interval(want[m], want[f"{m}_low"], want[f"{m}_high"], 2), (row["policy"], m)
    assert all(row["time_to_complete_s"].endswith("]") for row in out["policies_table"])  # 2 rounds reach 0 s
    assert [(r["policy"], r["delay_ms"]) for r in out["delay"]] == [("dynamo", 0), ("dynamo", 200)]
    arrangements = [r["arrangement"] for r in out["gateways"]]
    assert arrangements == ["1 gateway", "2 gateways, local state", "2 gateways, shared store 50 ms",
                            "2 gateways, shared store 1 ms"]
    if mooncake.exists():
        assert [(r["policy"], r["delay_ms"]) for r in out["mooncake"]] == [("kv_aware", 0), ("kv_aware", 200)]
    else:
        assert "section skipped" in printed(book)
    assert "2 turns: fastest" in printed(book)

