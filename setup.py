"""Build hook for the one compiled module, ``kvroute.sim._block_pool`` (``sim/_block_pool.pyx``,
Cython, C++); everything else is declared in pyproject.toml.

The extension is optional: when Cython is missing or the C++ build fails (no compiler), the
install still succeeds, with a warning, and ``kvroute.sim.compiled`` falls back to the
pure-Python pool (``sim/block_pool.py``), which gives the same results.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

EXTENSION = "kvroute.sim._block_pool"  # NOTE: full name: the package kvroute.sim lives in sim/


def _warn(why: str) -> None:
    bar = "=" * 78
    print(f"\n{bar}\nWARNING: {EXTENSION} was not built ({why}).\nkvroute will use the "
          f"pure-Python block pool: same results, slower.\n{bar}\n", file=sys.stderr)


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


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    ext = Extension(EXTENSION, ["sim/_block_pool.pyx"], language="c++")
    return cythonize([ext], language_level=3, include_path=["sim"], quiet=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
