"""Random: a live worker drawn uniformly."""

from __future__ import annotations

from kvroute.sim.routing.base import Policy, register


@register("random")
class RandomPolicy(Policy):
    """A live worker drawn uniformly with the router's seeded generator.

    SGLang's ``random`` policy."""

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        return alive[int(self.rng.integers(len(alive)))]
