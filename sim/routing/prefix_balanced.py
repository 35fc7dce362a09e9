"""Prefix-balanced: kv_aware unless its choice is overloaded against the least loaded worker."""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import Policy, check_at_least, register
from kvroute.sim.routing.kv_aware import KVAware


@register("prefix_balanced")
class PrefixBalanced(Policy):
    """KV-aware unless the cache-preferred worker is overloaded, then least loaded.

    Overloaded means its in-flight count exceeds the least loaded worker's by more than
    ``abs_threshold`` requests **and** by more than a factor ``rel_threshold``. The two
    thresholds are those of SGLang's cache-aware router (``balance_abs_threshold``,
    ``balance_rel_threshold``) but the rule differs from SGLang's (policy ``sglang``): here it
    compares the *chosen* worker with the least loaded one after the cache decision, with
    kv_aware's guards (new sessions and short matches go to the least loaded); SGLang compares
    the cluster's most and least loaded workers *before* looking at the cache, whichever worker
    the cache would pick.

    Args:
        rng: the router's generator.
        abs_threshold: in-flight gap above which the preferred worker may be left, requests.
        rel_threshold: ratio above which the preferred worker may be left.

    Raises:
        ValueError: a negative ``abs_threshold`` or a ``rel_threshold`` below 1 (either would
            leave the cache's choice whenever another worker is less loaded), naming it.
    """

    uses_prefixes = True

    def __init__(self, rng: np.random.Generator, abs_threshold: int = 4, rel_threshold: float = 1.5) -> None:
        super().__init__(rng)
        check_at_least("prefix_balanced", 0, abs_threshold=abs_threshold)
        check_at_least("prefix_balanced", 1, rel_threshold=rel_threshold)
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self._kv = KVAware(rng)

    def choose(self, request, view) -> int:
        preferred = self._kv.choose(request, view)
        lightest = view.least_loaded(rng=self.tie_rng)
        load, low = view.in_flight[preferred], view.in_flight[lightest]
        if load - low > self.abs_threshold and load > self.rel_threshold * low:
            return lightest
        return preferred
