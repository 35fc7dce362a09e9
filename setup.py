"""Build hook for the compiled engine core (Cython, C++): ``kvroute.sim.engine._block_pool``,
``_kv_cache_manager``, ``_content``, ``_request``, ``_scheduler`` (``sim/engine/*.pyx``) and
``kvroute.sim.timing._decode_run`` (``sim/timing/_decode_run.pyx``); everything else is declared
in pyproject.toml.

The extensions are optional: when Cython is missing or the C++ build fails (no compiler), the
install still succeeds, with a warning, and ``kvroute.sim.engine.compiled`` and
``kvroute.sim.timing.compiled`` fall back to the pure-Python modules beside them, which give
the same results.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _warn(why: str) -> None:
    bar = "=" * 78
    print(f"\n{bar}\nWARNING: the compiled engine core (kvroute.sim.engine._block_pool, _kv_cache_manager, "
          f"_decode_run, _content, _request, _scheduler) was not built ({why}).\nkvroute will use the pure-Python modules: same "
          f"results, slower.\n{bar}\n", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing when the compiler cannot build an extension."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler or platform error: fall back
            _warn(f"{type(exc).__name__}: {exc}")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _warn(f"{type(exc).__name__}: {exc}")


MODULES = ["engine._block_pool", "engine._kv_cache_manager", "engine._content", "engine._request",
           "engine._scheduler", "timing._decode_run"]
"""The compiled modules of ``kvroute.sim``, each ``kvroute.sim.<package>.<name>`` from
``sim/<package>/<name>.pyx``."""


def _cython_include() -> str:
    """A folder where the ``.pxd`` files sit under their package path (``kvroute/sim/<package>/``),
    so that ``cimport kvroute.sim.<package>.<name>`` finds them although the package lives in
    ``sim/``."""
    root = os.path.join("build", "cython-include")
    for package in ("engine", "timing"):
        folder = os.path.join(root, "kvroute", "sim", package)
        os.makedirs(folder, exist_ok=True)
        for pxd in glob.glob(os.path.join("sim", package, "*.pxd")):
            shutil.copy(pxd, folder)
    for init in ("kvroute", "kvroute/sim", "kvroute/sim/engine", "kvroute/sim/timing"):
        open(os.path.join(root, init, "__init__.pxd"), "w").close()
    return root


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    # NOTE: -ffp-contract=off: no fused multiply-add, so compiled float arithmetic rounds as
    # Python's does (MSVC, which never contracts by default, ignores the flag with a warning).
    exts = [Extension(f"kvroute.sim.{name}", [f"sim/{name.replace('.', '/')}.pyx"], language="c++",
                      extra_compile_args=["-ffp-contract=off"]) for name in MODULES]
    try:
        return cythonize(exts, language_level=3, include_path=[_cython_include()], quiet=True)
    except Exception as exc:  # noqa: BLE001 - a Cython error must not fail the install
        _warn(f"Cython failed: {type(exc).__name__}: {exc}")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
