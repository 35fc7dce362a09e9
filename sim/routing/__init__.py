"""Routing policies behind one interface, shared by the simulator and the live replay.

A policy answers ``choose(request, view) -> worker index``. The ``RouterView`` holds only what a
real gateway can know. Policies live one per module in this package and register themselves
by CLI name (``@register("name")``); ``make_policy("name:key=value", rng)`` builds one.
Ties go uniformly at random among the best, drawn from the router's own seeded generator
(``router_rng(seed)``). Policies never pick a worker the view marks dead.
"""

from kvroute.sim.routing.base import (
    POLICIES,
    Policy,
    RouteRequest,
    check_spec,
    make_policy,
    parse_spec,
    pick_max,
    pick_min,
    policy_params,
    register,
    router_rng,
    split_specs,
)
from kvroute.sim.routing.view import RouterView

# Importing the policy modules registers them, in this order.
from kvroute.sim.routing import round_robin, least_loaded, kv_aware, prefix_balanced, random_choice  # noqa: E402,F401
from kvroute.sim.routing import sglang, dynamo, llmd, session_affinity, power_of_two  # noqa: E402,F401
from kvroute.sim.routing.view import CACHE_VIEWS, LOAD_SIGNALS  # noqa: E402
from kvroute.sim.routing.signals import KVEventIndex, MetricsScrape  # noqa: E402

__all__ = [
    "CACHE_VIEWS", "KVEventIndex", "LOAD_SIGNALS", "MetricsScrape", "POLICIES", "Policy", "RouteRequest", "RouterView", "check_spec", "make_policy", "parse_spec",
    "pick_max", "pick_min", "policy_params", "register", "router_rng", "split_specs",
]
