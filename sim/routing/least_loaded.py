"""Least loaded: the live worker with the fewest requests in flight at this gateway."""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.view import SCRAPED_SIGNALS, checked_load
from kvroute.sim.routing.base import Policy, pick_min, register


@register("least_loaded")
class LeastLoaded(Policy):
    """The live worker with the lowest load; ties at random.

    Args:
        rng: the router's generator (ties).
        load: the load signal (``RouterView.load``): ``in_flight`` (this gateway's requests in
            flight, the default), ``tokens``, or a scraped ``/metrics`` signal.

    Raises:
        ValueError: a ``load`` not in ``LOAD_SIGNALS``.
    """

    def __init__(self, rng: np.random.Generator, load: str = "in_flight") -> None:
        super().__init__(rng)
        self.load = checked_load("least_loaded", load)
        self.uses_metrics = load in SCRAPED_SIGNALS

    def choose(self, request, view) -> int:
        if self.load == "in_flight":
            return view.least_loaded(rng=self.tie_rng)
        loads = view.load(self.load)
        return pick_min(view.alive_workers(), loads.__getitem__, self.tie_rng)
