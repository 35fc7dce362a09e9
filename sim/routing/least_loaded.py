"""Least loaded: the live worker with the fewest requests in flight at this gateway."""

from __future__ import annotations

from kvroute.sim.routing.base import Policy, register


@register("least_loaded")
class LeastLoaded(Policy):
    """The live worker with the fewest requests in flight at the router."""

    def choose(self, request, view) -> int:
        return view.least_loaded(rng=self.tie_rng)
