"""The package layout is a stack of layers: each package imports only from itself and the layers
below it, and no module imports itself back through others (no cycles).

Every import counts, wherever it stands: at the top of a module, inside a function (a lazy
import) or under ``TYPE_CHECKING``. The layers, bottom first, are :data:`LAYERS`; ``docs/design/
layout.md`` says what each holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

FOLDERS = {"sim": "kvroute.sim", "traces": "kvroute.traces", "calibrate": "kvroute.calibrate", "cli": "kvroute.cli"}
"""Top-level source folder -> its package name (pyproject.toml's package-dir)."""

LAYERS = ("kvroute.traces", "kvroute.sim.engine", "kvroute.sim.timing", "kvroute.sim.routing",
          "kvroute.sim.cluster", "kvroute.sim.study", "kvroute.calibrate.live", "kvroute.calibrate.calibration",
          "kvroute.calibrate.validation", "kvroute.cli")
"""The layers, bottom first: a module may import from its own layer and those before it."""


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([package, *parts])] = path
        for path in sorted((ROOT / folder).rglob("*.pyx")):
            mods[".".join([package, *path.relative_to(ROOT / folder).with_suffix("").parts])] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kvroute modules that ``name`` imports (a ``from X import y`` counts X, or X.y when that is
    a module). ``.pyx`` files are read for their ``import`` and ``from ... import`` lines, their
    ``cimport`` lines too, by the module they name."""
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython: the module of every import and cimport line
        text = "\n".join(f"import {m}" for m in re.findall(r"^\s*(?:from|c?import)\s+(kvroute[\w.]*)", text, re.M))
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t.startswith("kvroute."):
                while t not in MODULES and "." in t:  # a name inside a module: the module
                    t = t.rsplit(".", 1)[0]
                if t in MODULES and t != name:
                    out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    """Index of the layer a module belongs to; -1 for a package's own ``__init__`` above its layers."""
    for i, prefix in enumerate(LAYERS):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return -1


def test_every_module_has_a_layer():
    homeless = [n for n in MODULES if layer(n) < 0 and n not in FOLDERS.values() and n != "kvroute.calibrate"]
    assert homeless == []


def test_imports_only_point_down():
    upward = sorted(f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps
                    if layer(a) >= 0 and layer(b) > layer(a))
    assert upward == []


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: every one is a single module."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_check_sees_imports():
    """The reader finds a known downward import and a lazy one, so an empty result above means something."""
    assert "kvroute.sim.engine.config" in GRAPH["kvroute.sim.engine.scheduler"]
    assert "kvroute.sim.engine._block_pool" in GRAPH["kvroute.sim.engine._scheduler"]
    assert "kvroute.sim.cluster.cluster" in GRAPH["kvroute.sim.study.experiment"]
    assert layer("kvroute.cli.main") == len(LAYERS) - 1


@pytest.mark.parametrize("name", ["kvroute.sim.engine.block_pool", "kvroute.traces.format"])
def test_bottom_modules_import_nothing_above(name):
    assert all(layer(d) <= layer(name) for d in GRAPH[name])
