"""The one place that chooses between the compiled and the pure-Python decode-run times.

``DecodeRunTimes`` is ``kvroute.sim.timing._decode_run.DecodeRunTimes`` (Cython, built from
``sim/timing/_decode_run.pyx`` by ``pip install``) when the engine core is compiled
(:data:`kvroute.sim.engine.compiled.COMPILED`) and this module was built too, else the pure-Python
``kvroute.sim.timing.decode_run.DecodeRunTimes`` (its reference and fallback; same values, bit
for bit). ``KVROUTE_PURE_PYTHON=1`` therefore chooses the pure-Python one here as well.

Attributes:
    DecodeRunTimes: the class workers build for a decode run.
    COMPILED: True when it is the compiled one.
    REASON: why the pure-Python one is used ("" when compiled).
"""

from __future__ import annotations

from kvroute.sim.engine import compiled as _engine
from kvroute.sim.timing import decode_run as _pure

DecodeRunTimes: type
if _engine.COMPILED:
    try:
        from kvroute.sim.timing._decode_run import DecodeRunTimes
    except ImportError as exc:
        DecodeRunTimes = _pure.DecodeRunTimes
        COMPILED, REASON = False, f"the compiled decode-run times are not available ({exc})"
    else:
        COMPILED, REASON = True, ""
else:
    DecodeRunTimes = _pure.DecodeRunTimes
    COMPILED, REASON = False, _engine.REASON
