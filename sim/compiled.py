"""The one place that chooses between the compiled and the pure-Python engine core.

The core is five classes and a function, each with a pure-Python implementation (the reference
the compiled one is tested against) and a Cython one built from ``sim/_*.pyx`` by ``pip install``:

- ``BlockPool``: ``kvroute.sim.block_pool`` or ``kvroute.sim._block_pool``;
- ``KVCacheManager``: ``kvroute.sim.kv_cache_manager`` or ``kvroute.sim._kv_cache_manager``
  (the compiled manager needs the compiled pool);
- ``DecodeRunTimes``: ``kvroute.sim.decode_run`` or ``kvroute.sim._decode_run``;
- ``block_hashes``: ``kvroute.sim.content`` (a list of Python ints) or ``kvroute.sim._content``
  (the same keys as an ``array("q")``, which the compiled pool reads as C int64s);
- ``Request``: ``kvroute.sim.request`` or ``kvroute.sim._request`` (token counters as C integers);
- ``Scheduler``: ``kvroute.sim.scheduler`` or ``kvroute.sim._scheduler`` (the compiled scheduler
  takes only compiled requests and builds the compiled pool and manager).

The compiled ones are used when all were built and import, else the pure-Python ones; both give
the same results. ``KVROUTE_PURE_PYTHON=1``, read once when this module is first imported,
forces the pure-Python ones.

Attributes:
    BlockPool, KVCacheManager, DecodeRunTimes, Request, Scheduler: the classes schedulers,
        workers and clusters build.
    block_hashes: the function workloads hash requests with.
    COMPILED: True when they are the compiled ones.
    REASON: why the pure-Python ones are used ("" when compiled).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from kvroute.sim import block_pool as _pure_pool
from kvroute.sim import content as _pure_content
from kvroute.sim import decode_run as _pure_decode_run
from kvroute.sim import kv_cache_manager as _pure_manager
from kvroute.sim import request as _pure_request
from kvroute.sim import scheduler as _pure_scheduler

PURE_PYTHON_ENV = "KVROUTE_PURE_PYTHON"

BlockPool: type
KVCacheManager: type
DecodeRunTimes: type
block_hashes: Callable
Request: type
Scheduler: type
_PURE = (_pure_pool.BlockPool, _pure_manager.KVCacheManager, _pure_decode_run.DecodeRunTimes,
         _pure_content.block_hashes, _pure_request.Request, _pure_scheduler.Scheduler)
if os.environ.get(PURE_PYTHON_ENV, "") == "1":
    BlockPool, KVCacheManager, DecodeRunTimes, block_hashes, Request, Scheduler = _PURE
    COMPILED, REASON = False, f"{PURE_PYTHON_ENV}=1"
else:
    try:
        from kvroute.sim._block_pool import BlockPool
        from kvroute.sim._content import block_hashes
        from kvroute.sim._decode_run import DecodeRunTimes
        from kvroute.sim._kv_cache_manager import KVCacheManager
        from kvroute.sim._request import Request
        from kvroute.sim._scheduler import Scheduler
    except ImportError as exc:
        BlockPool, KVCacheManager, DecodeRunTimes, block_hashes, Request, Scheduler = _PURE
        COMPILED, REASON = False, f"the compiled engine core is not available ({exc})"
        # NOTE: an install without a C++ compiler says so when it builds (setup.py); a run says
        # it again here, because pip shows build output only on failure.
        warnings.warn(
            f"kvroute: {REASON}; using the pure-Python block pool, KV-cache manager, decode-run "
            f"times, block hashing, request and scheduler (same results, slower). Reinstall with a C++ compiler to build them, or set "
            f"{PURE_PYTHON_ENV}=1 to choose the pure-Python ones and silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        COMPILED, REASON = True, ""
