"""Routing policies behind one interface, shared by the simulator and the live replay.

A policy answers ``choose(request, view) -> worker index``. The ``RouterView`` holds only what a
real gateway can know. Policies live one per module in this package and register themselves
by CLI name (``@register("name")``); ``make_policy("name:key=value", rng)`` builds one.
Ties go uniformly at random among the best, drawn from the router's own seeded generator
(``router_rng(seed)``). Policies never pick a worker the view marks dead.

User policies: a module that defines a ``Policy`` subclass decorated with ``@register("name")``
is registered when imported. Two ways to have the CLI import it: an entry point in the group
``kvroute.policies`` of an installed package, or the environment variable
``KVROUTE_POLICY_FILES`` (``.py`` paths separated by ``os.pathsep``; sweep processes inherit it).
They are imported when a spec names a policy that is not built in, and by ``kvroute policies``
(``load_user_policies``): a run of built-in policies does not pay for scanning the installed
packages' entry points (docs/log/speed-passes.md).
"""

from kvroute.sim.routing.policy_errors import PolicyError
from kvroute.sim.routing.base import (
    POLICIES,
    Policy,
    RouteRequest,
    check_spec,
    make_policy,
    parse_spec,
    pick_max,
    pick_min,
    load_user_policies,
    policy_params,
    register,
    router_rng,
    split_specs,
)
from kvroute.sim.routing.view import RouterView

# Importing the policy modules registers them, in this order.
from kvroute.sim.routing import round_robin, least_loaded, kv_aware, prefix_balanced, random_choice  # noqa: E402,F401
from kvroute.sim.routing import sglang, dynamo, llmd, session_affinity, power_of_two  # noqa: E402,F401
from kvroute.sim.routing import epp  # noqa: E402,F401  (llmd-precise, llmd-estimated, llmd-load, epp)
from kvroute.sim.routing.view import CACHE_VIEWS, LOAD_SIGNALS  # noqa: E402
from kvroute.sim.routing.signals import KVEventIndex, MetricsScrape  # noqa: E402

DEFAULT_POLICIES = ("round_robin", "least_loaded", "kv_aware")
"""The policies every command that compares policies runs by default (``compare``, ``sweep``,
``sensitivity``, ``validate``), the first the baseline of the change columns. One policy left
unset (``ClusterSpec.policy``, ``Scenario.policy``, ``simulate --policy``) is the first:
round_robin, what a vLLM deployment without a cache-aware router does."""

__all__ = [
    "CACHE_VIEWS", "DEFAULT_POLICIES", "KVEventIndex", "LOAD_SIGNALS", "MetricsScrape", "POLICIES", "Policy", "PolicyError", "RouteRequest", "RouterView", "check_spec", "load_user_policies", "make_policy", "parse_spec",
    "pick_max", "pick_min", "policy_params", "register", "router_rng", "split_specs",
]
