"""What a routing policy must give back, and the error a run stops with when it does not.

The simulator (``kvroute.sim.cluster.cluster.Cluster``) and the live replay
(``kvroute.calibrate.validation.replay.LiveReplay``) make the same checks: every worker a policy's
``choose`` returns must be an ``int`` in ``range(num_workers)`` (:func:`checked_worker`, called
only when a cheap class-and-range test fails), and an exception inside a policy's method becomes a
:class:`PolicyError` naming the policy, its file and the line (:func:`raise_policy_error`,
:func:`prepare_policy`).
"""

from __future__ import annotations

import operator
import os
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

_BASE_MODULE = "kvroute.sim.routing.base"
"""The module of ``Policy`` (named, not imported: ``base`` imports this module; ``policy``
below is a ``kvroute.sim.routing.base.Policy`` or, for ``__init__``, its class)."""


class PolicyError(ValueError):
    """A routing policy misbehaved: ``choose`` returned something that is not a worker index, or
    one of the policy's methods raised. The run stops with it; the CLI prints it as a one-line
    ``Error:`` (a ValueError, like every bad input).

    The message is one line naming the policy, where it came from (the path of a user's file from
    ``KVROUTE_POLICY_FILES`` or of an entry point's module, or ``built in: kvroute/...`` for
    kvroute's own policies, whose errors are kvroute bugs) and what went wrong::

        policy 'minus_one' (negpol.py, choose() defined at line 9) returned -1 from choose(): a worker must be an int in range(4)
        policy 'boom' (negpol.py line 12) raised AttributeError in choose(): ...

    Pickles with its attributes (a process pool sends it back to the parent).

    Attributes:
        policy: the policy's registered name.
        where: the file of the policy's class as the message shows it, or None.
        line: the line that raised, in ``where`` (in another file when the method that raised
            is inherited from a class there: the message names that file); for a value
            ``choose`` returned, the line of its ``def``; or None.
    """

    def __init__(self, message: str, policy: str = "", where: str | None = None, line: int | None = None) -> None:
        # NOTE: args is (message,): unpickling calls PolicyError(message), then restores __dict__
        super().__init__(message)
        self.policy = policy
        self.where = where
        self.line = line



def checked_worker(policy, worker: object, num_workers: int) -> int:
    """``worker``, as ``policy.choose`` returned it, as a plain int in ``range(num_workers)``.

    The slow path of the check both the simulator and the live replay make on every choice; they
    call it only when ``worker.__class__ is not int or not 0 <= worker < num_workers``. An
    ``operator.index``-able integer (numpy's ``int64``, say) is converted; bools are refused.

    Raises:
        PolicyError: ``worker`` is not an integer (a bool, a float, None, ...) or is out of range
            (negative ones too: Python's indexing would send -1 to the last worker).
    """
    if not isinstance(worker, (bool, np.bool_)):
        try:
            index = operator.index(worker)
        except TypeError:
            index = None
        if index is not None and 0 <= index < num_workers:
            return int(index)
    shown = " ".join(repr(worker).split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if worker.__class__ is not int:
        shown += f" (a {type(worker).__qualname__})"
    cls = type(policy)
    where, line = _class_file(cls), None
    location = where
    owner = next((c for c in cls.__mro__ if "choose" in vars(c)), cls)
    code = getattr(vars(owner).get("choose"), "__code__", None)
    if code is not None:  # the line of its def: the value returned has no line of its own
        line = code.co_firstlineno
        defined_in = _class_file(owner)
        location = (f"{where}, choose() defined at line {line}" if defined_in == where
                    else f"{where}; choose() defined at {defined_in} line {line}")
    raise PolicyError(f"policy {policy.name!r} ({location}) returned {shown} from choose(): a worker must be an int "
                      f"in range({num_workers})", policy.name, where, line)


def raise_policy_error(policy, exc: BaseException, method: str) -> NoReturn:
    """Raise ``exc``, raised inside ``method`` of ``policy`` (an instance, or its class for
    ``__init__``), as a :class:`PolicyError` naming the policy, its file and the line that raised:
    the innermost frame of the traceback in the file of the policy's class (or of a class it
    derives from, short of ``Policy``); without one (``choose`` not defined, a wrong ``__init__``
    signature) the file alone.

    Raises:
        PolicyError: always, chained to ``exc`` (``KVROUTE_DEBUG=1`` shows both tracebacks).
        MemoryError: ``exc`` itself when it is one (running out of memory is not the policy's
            error; the CLI says so on its own).
    """
    if isinstance(exc, MemoryError):
        raise exc
    cls = policy if isinstance(policy, type) else type(policy)
    files: dict[str, type] = {}
    for base in cls.__mro__:
        if base.__module__ == _BASE_MODULE and base.__name__ == "Policy":
            break
        path = getattr(sys.modules.get(base.__module__), "__file__", None)
        if path:
            files.setdefault(os.path.realpath(path), base)
    at = raised_at(exc, files)
    line, owner = (at[0], files[at[1]]) if at is not None else (None, cls)
    where = _class_file(cls)
    if line is None:
        location = where
    elif owner is cls or _class_file(owner) == where:
        location = f"{where} line {line}"
    else:  # in a class it derives from, in another file
        location = f"{where}; raised at {_class_file(owner)} line {line}"
    reason = " ".join(str(exc).split())
    reason = f": {reason[:300]}" if reason else ""
    raise PolicyError(f"policy {cls.name!r} ({location}) raised {type(exc).__name__} in {method}(){reason}",
                      cls.name, where, line) from exc


def raised_at(exc: BaseException, paths) -> tuple[int, str] | None:
    """Where in ``paths`` (real paths: ``os.path.realpath``) ``exc`` was raised: ``(line, path)``
    of the innermost frame of its traceback in one of them, or None when no frame is."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        path = os.path.realpath(tb.tb_frame.f_code.co_filename)
        if path in paths:
            found = (tb.tb_lineno, path)
        tb = tb.tb_next
    return found


def prepare_policy(policy, view) -> None:
    """``policy.prepare(view)``, as the simulator and the live replay call it.

    Raises:
        ValueError: as ``Policy.prepare`` (the policy cannot run against the cluster).
        PolicyError: ``prepare`` raised anything else (``raise_policy_error``).
    """
    try:
        policy.prepare(view)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the policy's own code: named in the error
        raise_policy_error(policy, exc, "prepare")


_PACKAGE = Path(__file__).resolve().parents[2]
"""The ``kvroute`` package's folder (a built-in policy's file is shown relative to its parent)."""


def user_policy_file(cls: type) -> str | None:
    """The file a policy class not built into kvroute was imported from (``KVROUTE_POLICY_FILES``,
    an entry point's module), resolved; None for a built-in one or a module without a file."""
    where = _class_file(cls)
    if where.startswith(("built in: ", "module ")):
        return None
    return str(Path(where).resolve())


def _class_file(cls: type) -> str:
    """Where ``cls`` comes from, for an error message: ``built in: kvroute/sim/routing/x.py``, or
    its module's path (a user's file from ``KVROUTE_POLICY_FILES``, an entry point's module)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path is None:
        return f"module {cls.__module__}"
    if cls.__module__.split(".")[0] == "kvroute":
        resolved = Path(path).resolve()
        if resolved.is_relative_to(_PACKAGE):
            return f"built in: {Path('kvroute', resolved.relative_to(_PACKAGE)).as_posix()}"
    return path
