"""``new_dirs_removed_on_failure`` (traces/outputs.py): a command that fails before writing
anything leaves no directory it made, and never removes one that existed or holds a file."""

import pytest

from kvroute.traces.outputs import check_output, new_dirs_removed_on_failure


def test_a_failure_removes_the_empty_directories_it_made_parents_too(tmp_path):
    out = tmp_path / "runs" / "x"
    with pytest.raises(RuntimeError, match="no server"):
        with new_dirs_removed_on_failure(out):
            check_output(out, is_dir=True)
            raise RuntimeError("no server")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_directories_that_existed_or_hold_a_file_stay(tmp_path):
    (tmp_path / "runs").mkdir()
    out = tmp_path / "runs" / "x"
    with pytest.raises(KeyboardInterrupt):
        with new_dirs_removed_on_failure(out):
            check_output(out, is_dir=True)
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []
    deep = tmp_path / "a" / "b"
    with pytest.raises(SystemExit):
        with new_dirs_removed_on_failure(deep):
            check_output(deep, is_dir=True)
            (deep / "meta.json").write_text("{}")  # a run that failed after writing: its rows stay
            raise SystemExit(1)
    assert [p.name for p in deep.iterdir()] == ["meta.json"]


def test_a_run_that_succeeds_keeps_its_directory(tmp_path):
    out = tmp_path / "runs" / "x"
    with new_dirs_removed_on_failure(out):
        check_output(out, is_dir=True)
    assert out.is_dir() and list(out.iterdir()) == []
