"""The one place that chooses between the compiled and the pure-Python engine core.

The core is four classes and a function, each with a pure-Python implementation (the reference
the compiled one is tested against) and a Cython one built from ``sim/engine/_*.pyx`` by ``pip install``:

- ``BlockPool``: ``kvroute.sim.engine.block_pool`` or ``kvroute.sim.engine._block_pool``;
- ``KVCacheManager``: ``kvroute.sim.engine.kv_cache_manager`` or ``kvroute.sim.engine._kv_cache_manager``
  (the compiled manager needs the compiled pool);
- ``block_hashes``: ``kvroute.sim.engine.content`` (a list of Python ints) or ``kvroute.sim.engine._content``
  (the same keys as an ``array("q")``, which the compiled pool reads as C int64s);
- ``Request``: ``kvroute.sim.engine.request`` or ``kvroute.sim.engine._request`` (token counters as C integers);
- ``Scheduler``: ``kvroute.sim.engine.scheduler`` or ``kvroute.sim.engine._scheduler`` (the compiled scheduler
  takes only compiled requests and builds the compiled pool and manager).

The compiled ones are used when all were built and import, else the pure-Python ones; both give
the same results (the decode-run times of the timing layer follow the same choice:
``kvroute.sim.timing.compiled``). ``KVROUTE_PURE_PYTHON=1``, read once when this module is first imported,
forces the pure-Python ones.

Attributes:
    BlockPool, KVCacheManager, Request, Scheduler: the classes schedulers,
        workers and clusters build.
    block_hashes: the function workloads hash requests with.
    COMPILED: True when they are the compiled ones.
    REASON: why the pure-Python ones are used ("" when compiled).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from kvroute.sim.engine import block_pool as _pure_pool
from kvroute.sim.engine import content as _pure_content
from kvroute.sim.engine import kv_cache_manager as _pure_manager
from kvroute.sim.engine import request as _pure_request
from kvroute.sim.engine import scheduler as _pure_scheduler

PURE_PYTHON_ENV = "KVROUTE_PURE_PYTHON"

BlockPool: type
KVCacheManager: type
block_hashes: Callable
Request: type
Scheduler: type
_PURE = (_pure_pool.BlockPool, _pure_manager.KVCacheManager,
         _pure_content.block_hashes, _pure_request.Request, _pure_scheduler.Scheduler)
if os.environ.get(PURE_PYTHON_ENV, "") == "1":
    BlockPool, KVCacheManager, block_hashes, Request, Scheduler = _PURE
    COMPILED, REASON = False, f"{PURE_PYTHON_ENV}=1"
else:
    try:
        from kvroute.sim.engine._block_pool import BlockPool
        from kvroute.sim.engine._content import block_hashes
        from kvroute.sim.engine._kv_cache_manager import KVCacheManager
        from kvroute.sim.engine._request import Request
        from kvroute.sim.engine._scheduler import Scheduler
    except ImportError as exc:
        BlockPool, KVCacheManager, block_hashes, Request, Scheduler = _PURE
        COMPILED, REASON = False, f"the compiled engine core is not available ({exc})"
        # NOTE: an install without a C++ compiler says so when it builds (setup.py); a run says
        # it again here, because pip shows build output only on failure.
        warnings.warn(
            f"kvroute: {REASON}; using the pure-Python block pool, KV-cache manager, "
            f"block hashing, request and scheduler (same results, slower). Reinstall with a C++ compiler to build them, or set "
            f"{PURE_PYTHON_ENV}=1 to choose the pure-Python ones and silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        COMPILED, REASON = True, ""


def engine_classes(config) -> tuple[type, type]:
    """``(Request, Scheduler)`` for an engine of ``config`` (an ``EngineConfig``).

    The chosen ``Request`` and ``Scheduler`` above; with ``config.async_scheduling`` and the
    pure-Python core, ``kvroute.sim.engine.async_scheduler.AsyncScheduler`` (the compiled
    scheduler reads ``config.async_scheduling`` itself and steps as vLLM's ``AsyncScheduler``).
    """
    if config.async_scheduling and not COMPILED:
        from kvroute.sim.engine.async_scheduler import AsyncScheduler

        return Request, AsyncScheduler
    return Request, Scheduler
