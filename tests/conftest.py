"""Fixtures shared by every test folder: the two implementations of the engine core.

The engine core has a pure-Python implementation (the reference, and the fallback) and a compiled
twin of each of its modules (Cython, built by ``pip install`` when Cython and a C++ compiler are
there); both must give the same results. :data:`TWINS` names them, in this one place:

- ``core``: a test that takes it runs twice, on the pure-Python core (id ``pure``) and on the
  compiled one (id ``compiled``, skipped, naming the module missing, when it was not built);
- ``compiled_core`` and ``pure_core``: one of them, for a test that compares the two itself
  (``compiled_core`` skips the same way).

A core is an :class:`EngineCore`, e.g. ``core.BlockPool(11)`` or ``core.DecodeRunTimes(...)``.
These fixtures give both implementations whatever ``KVROUTE_PURE_PYTHON`` says: that variable
chooses the core the simulator runs on (``kvroute.sim.engine.compiled``), which tests of a whole
run exercise.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType

import pytest

PURE, COMPILED = "pure", "compiled"

TWINS: dict[str, tuple[str, str]] = {
    "BlockPool": ("kvroute.sim.engine.block_pool", "kvroute.sim.engine._block_pool"),
    "KVCacheManager": ("kvroute.sim.engine.kv_cache_manager", "kvroute.sim.engine._kv_cache_manager"),
    "block_hashes": ("kvroute.sim.engine.content", "kvroute.sim.engine._content"),
    "Request": ("kvroute.sim.engine.request", "kvroute.sim.engine._request"),
    "Scheduler": ("kvroute.sim.engine.scheduler", "kvroute.sim.engine._scheduler"),
    "DecodeRunTimes": ("kvroute.sim.timing.decode_run", "kvroute.sim.timing._decode_run"),
}
"""Each name of the core -> (the pure-Python module that defines it, its compiled twin)."""

NOT_BUILT = "the compiled engine core was not built (no C++ compiler or no Cython at install time)"


@dataclasses.dataclass(frozen=True)
class EngineCore:
    """One implementation of the engine core: the classes and the function of :data:`TWINS`."""

    name: str
    """``"pure"`` or ``"compiled"``."""
    BlockPool: type
    KVCacheManager: type
    block_hashes: Callable
    Request: type
    Scheduler: type
    DecodeRunTimes: type
    content: ModuleType
    """The module of ``block_hashes`` (the compiled one also holds ``extend_key_run``)."""


@functools.cache
def engine_core(name: str) -> EngineCore | str:
    """The core ``name`` (``"pure"`` or ``"compiled"``), or why the compiled one is missing.

    Only a compiled module that is absent counts as not built; one that is there but fails to
    import raises, as any other import error would."""
    if name not in (PURE, COMPILED):
        raise ValueError(f"no engine core named {name!r}: {PURE!r} or {COMPILED!r}")
    modules = {}
    for attr, (pure, compiled) in TWINS.items():
        module = compiled if name == COMPILED else pure
        if name == COMPILED and importlib.util.find_spec(module) is None:
            return f"{NOT_BUILT}: {module} is missing"
        modules[attr] = importlib.import_module(module)
    return EngineCore(name, **{attr: getattr(module, attr) for attr, module in modules.items()},
                      content=modules["block_hashes"])


def _core(name: str) -> EngineCore:
    core = engine_core(name)
    if isinstance(core, str):
        pytest.skip(core)
    return core


@pytest.fixture(params=[PURE, COMPILED])
def core(request) -> EngineCore:
    """The engine core, pure-Python then compiled (skipped with the reason when not built)."""
    return _core(request.param)


@pytest.fixture
def pure_core() -> EngineCore:
    """The pure-Python engine core."""
    return _core(PURE)


@pytest.fixture
def compiled_core() -> EngineCore:
    """The compiled engine core (skipped with the reason when not built)."""
    return _core(COMPILED)
