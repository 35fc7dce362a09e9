"""Round robin: the next live worker in turn."""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import Policy, register


@register("round_robin")
class RoundRobin(Policy):
    """The next live worker in turn, starting at worker 0.

    SGLang's ``round_robin`` policy and Dynamo's ``round-robin`` router mode."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self._next = 0

    def choose(self, request, view) -> int:
        for k in range(view.num_workers):
            w = (self._next + k) % view.num_workers
            if view.alive[w]:
                self._next = w + 1
                return w
        raise RuntimeError("no live worker to route to")
