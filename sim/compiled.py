"""The one place that chooses between the compiled and the pure-Python block pool.

``BlockPool`` is the Cython pool (``kvroute.sim._block_pool``, built from ``sim/_block_pool.pyx``
by ``pip install``) when it was built and imports, else the pure-Python one
(``kvroute.sim.block_pool``, the reference the compiled one is tested against). Both have the
same API and give the same results. ``KVROUTE_PURE_PYTHON=1``, read once when this module is
first imported, forces the pure-Python pool.

Attributes:
    BlockPool: the class every scheduler builds its pool from.
    COMPILED: True when ``BlockPool`` is the compiled one.
    REASON: why the pure-Python pool is used ("" when compiled).
"""

from __future__ import annotations

import os
import warnings

from kvroute.sim import block_pool as _pure

PURE_PYTHON_ENV = "KVROUTE_PURE_PYTHON"

BlockPool: type
if os.environ.get(PURE_PYTHON_ENV, "") == "1":
    BlockPool, COMPILED, REASON = _pure.BlockPool, False, f"{PURE_PYTHON_ENV}=1"
else:
    try:
        from kvroute.sim._block_pool import BlockPool
    except ImportError as exc:
        BlockPool, COMPILED = _pure.BlockPool, False
        REASON = f"the compiled block pool is not available ({exc})"
        # NOTE: an install without a C++ compiler says so when it builds (setup.py); a run says
        # it again here, because pip shows build output only on failure.
        warnings.warn(
            f"kvroute: {REASON}; using the pure-Python block pool (same results, slower). "
            f"Reinstall with a C++ compiler to build it, or set {PURE_PYTHON_ENV}=1 to choose "
            "the pure-Python pool and silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        COMPILED, REASON = True, ""
