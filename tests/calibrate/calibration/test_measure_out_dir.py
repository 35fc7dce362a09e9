"""``kvroute calibrate measure`` that fails before measuring (no server at --url, a wrong --model)
leaves no --out directory it made; one the user made stays, with whatever is in it."""

from __future__ import annotations

import socket

from click.testing import CliRunner

from kvroute.cli.calibrate_commands import calibrate
from tests.calibrate.calibration.test_calibrate import fake_server  # noqa: F401 - the fixture


def _free_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _measure(url: str, out, *extra: str):
    return CliRunner().invoke(calibrate, ["measure", "--url", url, "--out", str(out), "--preset", "quick",
                                          "--no-progress", *extra])


def test_no_server_leaves_no_out_directory_it_made(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    result = _measure(url, tmp_path / "runs" / "x")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: cannot reach the vLLM server at {url}")
    assert list(tmp_path.iterdir()) == []  # neither runs/x nor runs
    empty, used = tmp_path / "empty", tmp_path / "used"  # the user's: they stay, with their files
    empty.mkdir()
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert _measure(url, empty).exit_code == 1
    assert _measure(url, used).exit_code == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "used"]
    assert list(empty.iterdir()) == [] and [p.name for p in used.iterdir()] == ["notes.txt"]


def test_a_wrong_model_leaves_no_out_directory(fake_server, tmp_path):  # noqa: F811
    s = fake_server(model="tiny-qwen2")
    result = _measure(s.url, tmp_path / "runs" / "x", "--model", "llama")
    assert result.exit_code == 1
    assert result.output == (f"Error: the server at {s.url} does not serve model 'llama'; it serves: "
                             "tiny-qwen2\n")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_holding_a_sweep_is_refused_and_kept_as_it_is(tmp_path):
    """A second sweep would append its rows (experiment ids from 0 again) under the first's."""
    import asyncio

    import pytest

    from kvroute.calibrate.calibration.measure import run_sweep
    from kvroute.calibrate.calibration.sweep_plan import SweepPlan
    from kvroute.calibrate.live.client import CalibrationError

    out = tmp_path / "sweep"
    out.mkdir()
    rows = "url,exp_id\nhttp://a,0\nhttp://a,1\nhttp://a,2\n"
    (out / "requests.csv").write_text(rows)
    (out / "meta.json").write_text('{"status": "interrupted"}')
    result = _measure(f"http://127.0.0.1:{_free_port()}", out)
    assert result.exit_code == 1
    assert result.output == (f"Error: --out {out} already holds a sweep (requests.csv, meta.json: 3 measured "
                             "requests, status 'interrupted' in meta.json); a second sweep there would mix its rows "
                             "with those: measure into a new directory, or remove this one first\n")
    assert (out / "requests.csv").read_text() == rows and sorted(p.name for p in out.iterdir()) == [
        "meta.json", "requests.csv"]
    with pytest.raises(CalibrationError, match="already holds a sweep"):  # the library refuses as well
        asyncio.run(run_sweep(["http://127.0.0.1:9"], out, SweepPlan.preset("quick")))
