"""``bench/bench_coverage.py``: what it says about the runs behind its figures."""

from __future__ import annotations

import importlib.util
import json

from tests.support.paths import ROOT


def _bench_coverage():
    """``bench/bench_coverage.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("bench_coverage", ROOT / "bench" / "bench_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, name: str, measured: str, **host) -> object:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"label": name, "measured": measured, "host": host}))
    return folder


def test_the_runs_behind_the_coverage_count_distinct_days_and_machines(tmp_path):
    """Issue 37 asks for runs on >= 3 different days or machines: distinct (UTC day, machine)
    pairs; a machine is its host name and machine id, else only what its CPU says."""
    bench = _bench_coverage()
    vm = {"machine": "x86_64", "cpu": "AMD EPYC", "cores": 2, "hostname": "vm", "machine_id": "abc"}
    same_day = [_run(tmp_path, f"r{k}", f"2026-12-05T0{k}:00+00:00", **vm) for k in range(3)]
    assert bench.runs_behind(same_day) == (
        "3 runs on 1 day(s) (2026-12-05) and 1 machine(s), 1 distinct day-and-machine pair(s); issue 37 asks for "
        "runs on >= 3 different days or machines: not met")
    other_day = _run(tmp_path, "r3", "2026-12-06T01:00+00:00", **vm)
    other_vm = _run(tmp_path, "r4", "2026-12-05T09:00+00:00", **{**vm, "machine_id": "def"})
    assert bench.runs_behind(same_day + [other_day, other_vm]).endswith(
        "2 day(s) (2026-12-05, 2026-12-06) and 2 machine(s), 3 distinct day-and-machine pair(s); issue 37 asks for "
        "runs on >= 3 different days or machines: met")
    assert bench.machine_of({"host": {"machine": "x86_64", "cpu": "AMD EPYC", "cores": 2}}) == "x86_64 AMD EPYC x2"
    assert bench.machine_of({"host": vm}) == "vm/abc"
    host = bench.this_host()
    assert set(host) == {"machine", "cpu", "cores", "isa", "hostname", "machine_id"} and host["cores"] >= 1
    assert host["isa"] is None or (set(host["isa"]) <= set(bench.ISA_FLAGS)
                                   and host["isa"] == [f for f in bench.ISA_FLAGS if f in host["isa"]])


def test_a_bad_run_json_is_a_one_line_error_before_any_rescoring(tmp_path):
    import pytest

    bench = _bench_coverage()
    bad = tmp_path / "r0"
    bad.mkdir()
    (bad / "run.json").write_text('{"label": "r0",\n "measured": }')
    with pytest.raises(SystemExit, match=r"r0/run\.json:2: not valid JSON \(Expecting value, column 14\)"):
        bench.runs_behind([bad])
    (bad / "run.json").write_text("[1]")
    with pytest.raises(SystemExit, match="a run.json is a JSON object, got list"):
        bench.runs_behind([bad])
    (bad / "run.json").unlink()
    assert bench.runs_behind([bad]).startswith("1 runs on 0 day(s) (unknown) and 0 machine(s)")


def test_the_coverage_is_also_counted_by_day_and_machine():
    """Issue 37's condition is about runs on different days or machines: a line counts each pair."""
    bench = _bench_coverage()
    vm = {"machine": "x86_64", "cpu": "AMD EPYC", "cores": 2, "hostname": "vm", "machine_id": "3d1219c7c4c5404a"}
    assert bench.place_of({"measured": "2026-12-07T00:06+00:00", "host": vm}) == "2026-12-07 vm/3d1219c7"
    assert bench.place_of({"host": vm}) == "unknown"
    assert bench.place_of({"measured": "2026-12-07T00:06+00:00", "host": {**vm, "machine_id": None}}) == \
        "2026-12-07 vm"
    row = {"profile": "p", "level": 0.9, "shape": "s", "metric": "hit_rate", "interval": [0.1, 0.2], "live_rounds": 3}
    rows = [{**row, "run": "a", "place": "2026-12-05 vm/1", "inside": True},
            {**row, "run": "b", "place": "2026-12-05 vm/1", "inside": False},
            {**row, "run": "c", "place": "2026-12-06 vm/1", "inside": True}]
    lines = bench.coverage_report(rows)
    assert lines[1] == "  by run:     a 1/1, b 0/1, c 1/1"
    assert lines[2] == "  by day and machine: 2026-12-05 vm/1 1/2, 2026-12-06 vm/1 1/1"
    assert not any("by day" in line for line in bench.coverage_report([{k: v for k, v in r.items() if k != "place"}
                                                                       for r in rows]))


def test_a_place_named_by_its_cpu_keeps_a_slash_in_the_name_whole():
    """It split the CPU's name at its first '/', so two machines differing after it became one."""
    bench = _bench_coverage()
    cpu = {"machine": "x86_64", "cpu": "AMD Ryzen 7 PRO 4750U w/ Radeon Graphics"}
    eight = bench.place_of({"measured": "2026-12-05T01:00+00:00", "host": {**cpu, "cores": 8}})
    assert eight == "2026-12-05 x86_64 AMD Ryzen 7 PRO 4750U w/ Radeon Graphics x8"
    assert eight != bench.place_of({"measured": "2026-12-05T01:00+00:00", "host": {**cpu, "cores": 16}})
