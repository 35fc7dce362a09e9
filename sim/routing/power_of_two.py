"""Power of two choices: two random workers, the less loaded of them."""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.view import SCRAPED_SIGNALS, checked_load
from kvroute.sim.routing.base import Policy, register


@register("power_of_two")
class PowerOfTwo(Policy):
    """Two live workers drawn at random; the less loaded of them.

    Draw two distinct live workers uniformly and take the one with the lower load
    (Mitzenmacher's two choices; SGLang's ``power_of_two`` policy,
    ``sgl-router/src/policies/power_of_two.rs``, which keeps the first on equal loads; here
    equal loads are broken at random).

    Args:
        rng: the router's generator.
        load: the load signal compared (``RouterView.load``).

    Raises:
        ValueError: a ``load`` not in ``LOAD_SIGNALS``.
    """

    def __init__(self, rng: np.random.Generator, load: str = "in_flight") -> None:
        super().__init__(rng)
        self.load = checked_load("power_of_two", load)
        self.uses_metrics = load in SCRAPED_SIGNALS

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        if len(alive) == 1:
            return alive[0]
        i, j = self.rng.choice(len(alive), size=2, replace=False)
        a, b = alive[int(i)], alive[int(j)]
        loads = view.load(self.load)
        if loads[a] == loads[b]:
            return a if self.rng.random() < 0.5 else b
        return a if loads[a] < loads[b] else b
