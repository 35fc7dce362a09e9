"""The policy interface, its registry and the policy-spec syntax shared by every command.

A policy is a class registered under its CLI name with ``@register("name")``. Its constructor
takes the router's seeded generator first and then keyword parameters with defaults; those
parameters are what a spec string can set::

    kv_aware                      the policy with its defaults
    dynamo:overlap_weight=2       one parameter
    dynamo:overlap_weight=2,temperature=0.5
    epp:path/to/config.yaml       a policy with a ``config`` parameter: a bare first item is it

In a comma-separated list of policies (``--policies``), an item ``key=value`` without a colon
belongs to the policy before it, so ``sglang,dynamo:overlap_weight=2,temperature=0.5`` names two
policies. Values are converted to the type of the parameter's default.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvroute.sim.routing.policy_errors import raise_policy_error, raised_at
from kvroute.traces.inputs import C_INT_MAX, InputError, Num


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the router sees of a request.

    Attributes:
        request_id: the request's id.
        session_id: conversation id, or None.
        block_hashes: the prompt's full-block hashes at the engine block size (a list of ints
            or an ``array("q")``, see ``Request.block_hashes``).
        num_prompt_tokens: prompt length, tokens.
    """

    request_id: int
    session_id: object
    block_hashes: Sequence[int]
    num_prompt_tokens: int


class Policy:
    """A routing policy. Subclasses are registered with ``@register(name)``.

    Subclasses implement ``choose``; their ``__init__`` takes ``rng`` (the router's seeded
    generator, used for ties and sampling) and keyword parameters with defaults.

    Attributes:
        name: the CLI name (set by ``register``).
        uses_prefixes: whether the policy reads the router's cache view (``matched_blocks``);
            the routed-prefix index is kept only then, and ``matched_blocks`` raises without it.
        uses_metrics: whether the policy reads the workers' scraped ``/metrics`` (the live
            replay polls the servers only then; ``RouterView.load`` of a scraped signal raises
            without it).
        uses_active_blocks: whether the policy reads the prompt blocks in flight per worker
            (``RouterView.active_blocks``, ``new_blocks``), kept only then.
        routed_ttl_s: seconds a routed prefix stays in the routed cache view after the last
            request routed with it (``RouterView(routed_ttl_s=...)``); None (the default): for good.
        cache_view: the cache view this policy reads (one of ``view.CACHE_VIEWS``), whatever the
            run's ``cache_view``; None (the default) takes the run's. So policies that read
            different sources (llm-d's precise and estimated scorers) compare in one table.
        kv_event_delay_s: seconds before a KV-cache event reaches this policy's gateway; None
            (the default) takes the run's ``kv_event_delay_s``.
    """

    name = ""
    uses_prefixes = False
    uses_metrics = False
    uses_active_blocks = False
    routed_ttl_s: float | None = None
    cache_view: str | None = None
    kv_event_delay_s: float | None = None

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    @property
    def tie_rng(self) -> np.random.Generator:
        """The generator that breaks ties: uniformly among the best, as SGLang's tree (first
        tenant of a hash map), Dynamo's ``DefaultWorkerSelector`` (random among equal logits)
        and llm-d's ``max-score-picker`` (shuffle, then stable sort) do."""
        return self.rng

    def prepare(self, view) -> None:
        """Called once with the view this policy routes through, before the first request (the
        cluster calls it as it builds the gateway). The default does nothing.

        Raises:
            ValueError: the policy cannot run against the cluster behind ``view``.
        """

    @classmethod
    def workload_note(cls, records) -> str:
        """A note for a run's reader when this policy routes ``records`` (trace records) in a
        way its name does not suggest, e.g. by its fallback alone; "" (the default) when not.
        It only describes: routing decisions are ``choose``'s."""
        return ""

    def choose(self, request, view) -> int:
        """The worker index for ``request``.

        Returns:
            A plain ``int`` in ``range(view.num_workers)`` (a numpy integer is accepted and
            converted; a bool, a float or anything out of range makes the run fail with a
            ``PolicyError``).

        Raises:
            RuntimeError: no worker is alive (the live replay records the request as not sent).
        """
        raise NotImplementedError(f"{type(self).__qualname__} does not define choose(request, view)")


POLICIES: dict[str, type[Policy]] = {}
"""Registered policies by CLI name, in registration order."""


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: register a Policy subclass under ``name`` (its CLI name).

    Raises:
        ValueError: the name is empty, contains ``:``, ``,``, ``=`` or a space, or is taken by
            another class.
    """
    if not name or any(c in name for c in ":,= "):
        raise ValueError(f"policy name {name!r} must be non-empty and free of ':', ',', '=' and spaces")

    def decorate(cls: type[Policy]) -> type[Policy]:
        other = POLICIES.get(name)
        if other is not None and other is not cls:
            raise ValueError(f"policy name {name!r} is already registered by {other.__module__}.{other.__qualname__}")
        cls.name = name
        POLICIES[name] = cls
        return cls

    return decorate


def load_user_policies() -> None:
    """Import the policies of ``kvroute.policies`` entry points and ``KVROUTE_POLICY_FILES``
    (called again, it imports nothing new: modules are cached and a file already imported is
    skipped).

    Raises:
        ValueError: a listed path is missing, a folder or not a ``.py`` file, or fails to import
            (the message names it).
    """
    import importlib.metadata
    import importlib.util
    import os
    import sys

    for entry in importlib.metadata.entry_points(group="kvroute.policies"):
        entry.load()
    for path in filter(None, os.environ.get("KVROUTE_POLICY_FILES", "").split(os.pathsep)):
        name = "kvroute_user_policy_" + os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules:
            continue
        if not os.path.isfile(path):
            reason = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
            if "," in path and os.pathsep != ",":
                reason += f" (the files are separated by {os.pathsep!r}, not ',')"
            raise ValueError(f"KVROUTE_POLICY_FILES: {path} {reason}")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None:  # importlib knows no loader for the suffix
            raise ValueError(f"KVROUTE_POLICY_FILES: {path} is not a Python file (.py)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raised = raised_at(exc, {os.path.realpath(path)})
            at = f" at line {raised[0]}" if raised and not isinstance(exc, SyntaxError) else ""  # a SyntaxError says it
            raise ValueError(f"KVROUTE_POLICY_FILES: {path} failed to import{at}: {exc}") from exc


def _user_files_note() -> str:
    """What ``KVROUTE_POLICY_FILES`` gave, for an unknown policy's error: each file and the
    policies it registered, or how to name one when it is unset."""
    import os

    from kvroute.sim.routing.policy_errors import user_policy_file

    paths = [p for p in os.environ.get("KVROUTE_POLICY_FILES", "").split(os.pathsep) if p]
    if not paths:
        return "a policy of your own is imported from its file: KVROUTE_POLICY_FILES=FILE.py"
    registered: dict[str, list[str]] = {}
    for name, cls in POLICIES.items():
        file = user_policy_file(cls)
        if file is not None:
            registered.setdefault(file, []).append(name)
    return "KVROUTE_POLICY_FILES: " + "; ".join(
        f"{p} registers {', '.join(registered.get(os.path.realpath(p), [])) or 'no policy (no @register)'}"
        for p in paths)


def policy_params(cls: type[Policy]) -> dict[str, object]:
    """A policy's settable parameters and their defaults, in constructor order."""
    sig = inspect.signature(cls.__init__)
    return {
        p.name: p.default
        for p in list(sig.parameters.values())[2:]  # self, rng
        if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
    }


def _convert(policy: str, key: str, text: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            value = int(text)
        elif isinstance(default, float):
            value = float(text)
        else:
            return text
    except ValueError:
        raise ValueError(f"policy {policy!r}: {key}={text!r} is not a valid {type(default).__name__}") from None
    try:  # every number finite and bounded (kvroute.traces.inputs); the policy checks its own range
        return PARAMETER_INT.check(value) if isinstance(default, int) else PARAMETER_FLOAT.check(value)
    except InputError as exc:
        raise ValueError(f"policy {policy!r}: {key} {exc.reason}") from None


PARAMETER_INT = Num(integer=True, minimum=-C_INT_MAX, maximum=C_INT_MAX)
PARAMETER_FLOAT = Num(minimum=-1e9, maximum=1e9)
"""The bounds of any policy parameter before the policy's own checks: a finite number within +-1e9."""


def check_at_least(owner: str, minimum: float, **values: float) -> None:
    """Check a policy's (or scorer's) parameters against their lower bound.

    Raises:
        ValueError: the first of ``values`` below ``minimum``, naming ``owner``, the parameter
            and its value (``dynamo: temperature must be >= 0, got -1``).
    """
    for name, value in values.items():
        if value < minimum:
            raise ValueError(f"{owner}: {name} must be >= {minimum:g}, got {value:g}")


def parse_spec(spec: str) -> tuple[str, dict[str, object]]:
    """Split ``name:key=value,key=value`` into the registered name and typed parameters.

    Raises:
        ValueError: unknown policy (listing the valid ones), unknown parameter (listing the
            policy's parameters) or a value of the wrong type.
    """
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    cls = POLICIES.get(name)
    if cls is None:
        load_user_policies()
        cls = POLICIES.get(name)
    if cls is None:
        close = difflib.get_close_matches(name, POLICIES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown policy {name!r}{hint}; valid policies: {', '.join(POLICIES)} ({_user_files_note()})")
    defaults = policy_params(cls)
    params: dict[str, object] = {}
    for n, item in enumerate(filter(None, (s.strip() for s in rest.split(",")))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq and n == 0 and "config" in defaults:  # ``epp:FILE`` is ``epp:config=FILE``
            key, eq, value = "config", "=", item
        if not eq:
            raise ValueError(f"policy {name!r}: parameter {item!r} must be key=value")
        if key not in defaults:
            valid = ", ".join(defaults) or "none"
            raise ValueError(f"policy {name!r} has no parameter {key!r}; its parameters: {valid}")
        params[key] = _convert(name, key, value.strip(), defaults[key])
    return name, params


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of policy specs (``a,b:x=1,y=2,c``) into specs.

    An item with ``=`` and no ``:`` continues the parameters of the spec before it.

    Raises:
        ValueError: a parameter comes before any policy name.
    """
    specs: list[str] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" in item and ":" not in item:
            if not specs:
                raise ValueError(f"parameter {item!r} comes before any policy name")
            joiner = "," if ":" in specs[-1] else ":"
            specs[-1] = f"{specs[-1]}{joiner}{item}"
        else:
            specs.append(item)
    return specs


def check_spec(spec: str) -> str:
    """Validate a policy spec and return it unchanged (for config fields): its name and
    parameters, and their values as the policy's ``__init__`` checks them (a policy is made with a
    throwaway generator).

    Raises:
        ValueError: as ``make_policy`` (``PolicyError`` is one).
    """
    make_policy(spec, np.random.default_rng(0))
    return spec


def router_rng(seed: int) -> np.random.Generator:
    """The router's generator for a run seeded ``seed``: a child spawned from the run's
    generator, so that its draws never shift the run's own (start jitter, overheads).
    The simulator and the live replay both use it, so they break ties alike."""
    return np.random.default_rng(seed).spawn(1)[0]


def make_policy(spec: str, rng: np.random.Generator) -> Policy:
    """A fresh policy from its spec (``name`` or ``name:key=value,...``).

    Args:
        spec: the policy's CLI name, optionally with parameters.
        rng: the router's seeded generator (ties, random choices, sampling).

    Raises:
        ValueError: as ``parse_spec``, or a parameter value the policy rejects.
        PolicyError: the policy's ``__init__`` raised anything else
            (``kvroute.sim.routing.policy_errors.raise_policy_error``).
    """
    name, params = parse_spec(spec)
    cls = POLICIES[name]
    try:
        return cls(rng, **params)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the policy's own code: named in the error
        raise_policy_error(cls, exc, "__init__")


def pick_min(candidates: list[int], key, rng: np.random.Generator | None) -> int:
    """The candidate with the smallest ``key(c)``; equal keys are broken uniformly at random
    with ``rng`` (the lowest index when ``rng`` is None). Draws only when there is a tie.

    Raises:
        RuntimeError: no candidate (no live worker).
    """
    if not candidates:
        raise RuntimeError("no live worker to route to")
    best = min(key(c) for c in candidates)
    tied = [c for c in candidates if key(c) == best]
    if len(tied) == 1 or rng is None:
        return tied[0]
    return tied[int(rng.integers(len(tied)))]


def pick_max(candidates: list[int], key, rng: np.random.Generator | None) -> int:
    """As ``pick_min`` for the largest ``key(c)``."""
    return pick_min(candidates, lambda c: -key(c), rng)
