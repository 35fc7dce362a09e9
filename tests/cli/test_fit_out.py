"""``calibrate fit RUN_DIR --out X`` writes only beside X, never inside RUN_DIR."""

from __future__ import annotations

import hashlib
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


def test_fit_keeps_the_probe_measure_took_after_its_sweep_and_validate_finds_it(tmp_path):
    """``probe.json`` (``calibrate measure``'s probe right after the sweep) goes into the profile as
    ``provenance.calibration_probe``; ``calibration_reference`` returns its samples for the same
    servers (in any order, a trailing slash aside) and none, saying why, for others."""
    import json

    from kvroute.calibrate.validation.probe import calibration_probe, calibration_reference

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    samples = {"ttft_s": [0.061, 0.060], "itl_s": [0.0029, 0.0030], "long_ttft_s": [0.4], "long_itl_s": [0.0031],
               "burst_ttft_s": [0.2, 0.21], "burst_itl_s": [0.004, 0.0041]}
    urls = ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    probe = calibration_probe(samples, urls, "2026-12-05T22:50:00+00:00")
    (run / "probe.json").write_text(json.dumps(probe))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["calibrate", "fit", str(run), "--out", str(out), "--bootstrap", "0",
                                      "--folds", "0"])
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    assert raw["provenance"]["calibration_probe"] == {"taken_utc": "2026-12-05T22:50:00+00:00", "urls": urls,
                                                      "reps": 3, "samples": samples}
    got, why = calibration_reference(raw, ["http://127.0.0.1:8101/", "http://127.0.0.1:8100"])
    assert got == samples
    assert why == "the probe taken right after the profile's calibration sweep (2026-12-05T22:50:00+00:00)"
    assert calibration_reference(raw, ["http://127.0.0.1:8100"]) == (None, (
        "the profile's calibration probe timed other servers (http://127.0.0.1:8100, http://127.0.0.1:8101), so it "
        "is not used"))
    assert calibration_reference({"provenance": {}}, urls) == (None, "the profile holds no calibration probe")
    (run / "probe.json").write_text("{")
    result = CliRunner().invoke(cli, ["calibrate", "fit", str(run), "--out", str(out), "--bootstrap", "0",
                                      "--folds", "0"])
    assert result.exit_code == 0 and f"warning: {run / 'probe.json'}: not read" in result.output
    assert "calibration_probe" not in json.loads(out.read_text())["provenance"]
