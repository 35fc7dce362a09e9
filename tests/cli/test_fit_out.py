"""``calibrate fit RUN_DIR --out X`` writes only beside X, never inside RUN_DIR."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from kvroute.cli.main import cli
from tests.support.paths import CALIBRATE_DATA

RUN = CALIBRATE_DATA / "calibrate-cpu-tiny-qwen2"


def _listing(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_fit_with_out_leaves_the_run_directory_untouched(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "fit_points.csv").unlink()  # an output of an earlier fit: rewriting it with equal bytes would go unseen
    before = _listing(run)
    out = tmp_path / "fitted" / "p.json"
    result = CliRunner().invoke(cli, ["calibrate", "fit", str(run), "--out", str(out), "--bootstrap", "0",
                                      "--folds", "0"])
    assert result.exit_code == 0, result.output
    assert _listing(run) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.fit.png", "p.fit_points.csv", "p.json"]
    # the sweep predates the servers' report of async scheduling; a CPU server never schedules so
    doc = json.loads(out.read_text())
    assert doc["engine"]["async_scheduling"] is False and "CPU backend" in doc["sources"]["engine.async_scheduling"]
