"""The one place that chooses between the compiled and the pure-Python engine core.

``BlockPool`` and ``KVCacheManager`` are the Cython ones (``kvroute.sim._block_pool`` and
``kvroute.sim._kv_cache_manager``, built from ``sim/*.pyx`` by ``pip install``) when they were
built and import, else the pure-Python ones (``kvroute.sim.block_pool`` and
``kvroute.sim.kv_cache_manager``, the reference the compiled ones are tested against). Both pairs
have the same API and give the same results; a compiled manager needs a compiled pool, so the
two are chosen together. ``KVROUTE_PURE_PYTHON=1``, read once when this module is first
imported, forces the pure-Python pair.

Attributes:
    BlockPool: the class every scheduler builds its pool from.
    KVCacheManager: the class every scheduler builds its block tables from.
    COMPILED: True when both are the compiled ones.
    REASON: why the pure-Python pair is used ("" when compiled).
"""

from __future__ import annotations

import os
import warnings

from kvroute.sim import block_pool as _pure_pool
from kvroute.sim import kv_cache_manager as _pure_manager

PURE_PYTHON_ENV = "KVROUTE_PURE_PYTHON"

BlockPool: type
KVCacheManager: type
if os.environ.get(PURE_PYTHON_ENV, "") == "1":
    BlockPool, KVCacheManager = _pure_pool.BlockPool, _pure_manager.KVCacheManager
    COMPILED, REASON = False, f"{PURE_PYTHON_ENV}=1"
else:
    try:
        from kvroute.sim._block_pool import BlockPool
        from kvroute.sim._kv_cache_manager import KVCacheManager
    except ImportError as exc:
        BlockPool, KVCacheManager = _pure_pool.BlockPool, _pure_manager.KVCacheManager
        COMPILED, REASON = False, f"the compiled engine core is not available ({exc})"
        # NOTE: an install without a C++ compiler says so when it builds (setup.py); a run says
        # it again here, because pip shows build output only on failure.
        warnings.warn(
            f"kvroute: {REASON}; using the pure-Python block pool and KV-cache manager (same "
            f"results, slower). Reinstall with a C++ compiler to build them, or set "
            f"{PURE_PYTHON_ENV}=1 to choose the pure-Python ones and silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        COMPILED, REASON = True, ""
