"""The published step times that derived profiles are checked against (bench/published_profiles.py,
bench/published/data/published_steps.csv): the file loads, every row names its source, and every
row's model and GPU derive. The errors themselves are measurements, reported by the script
(docs/log/2026-12-05-derived-vs-published.md), not asserted here."""

from __future__ import annotations

import csv
import importlib.util
import re
import sys

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "bench" / "published_profiles.py"


def _script():
    spec = importlib.util.spec_from_file_location("published_profiles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pp():
    return _script()


def test_csv_loads_and_every_row_has_a_source(pp):
    rows = pp.read_published()
    assert len(rows) == 107
    by_source = {}
    for r in rows:
        by_source[pp.short_source(r)] = by_source.get(pp.short_source(r), 0) + 1
        if r.repo.startswith("https://"):
            assert r.commit == "" and r.paths  # a page: its URL and where on it
        else:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", r.repo)
            assert re.fullmatch(r"[0-9a-f]{40}", r.commit)
            assert r.paths
        assert r.note or r.source == "Vidur"
    assert by_source == {"Vidur": 30, "AIConfigurator vLLM 0.14.0": 35, "AIConfigurator vLLM 0.24.0": 40,
                         "InferenceBench": 1, "Musgrave": 1}


def test_each_configuration_has_the_five_measures(pp):
    configs = {}
    for r in pp.read_published():
        if r.scope == "step-e2e":
            continue
        key = (r.source, r.model, r.gpu, r.tp, r.dtype)
        configs.setdefault(key, set()).add((r.measure, r.tokens or r.batch))
    assert len(configs) == 21
    for measures in configs.values():
        assert measures == {("prefill", 512), ("prefill", 2048), ("decode", 1), ("decode", 16), ("decode", 64)}


def test_every_row_derives(pp):
    for r in pp.read_published():
        assert pp.derived_seconds(r) > 0


def test_a_row_without_a_source_is_a_one_line_error(pp, tmp_path):
    with open(pp.DATA, newline="", encoding="utf-8") as fh:
        header, first = list(csv.reader(fh))[:2]
    first[pp.COLUMNS.index("repo")] = ""
    path = tmp_path / "published.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([header, first])
    with pytest.raises(ValueError) as err:
        pp.read_published(path)
    assert str(err.value) == f"{path}:2: field 'repo': every row needs its source and repository (or URL)"
