"""SGLang's cache-aware router (sgl-router / sgl-model-gateway, policy ``cache_aware``).

Mirrored from ``sgl-model-gateway/src/policies/cache_aware.rs`` (``CacheAwarePolicy::
select_worker``) and ``sgl-router/src/policies/tree.rs`` (``Tree::prefix_match``):

1. Loads are the gateway's own in-flight counts per worker (``Worker::load``). The cluster is
   *imbalanced* iff ``max - min > balance_abs_threshold`` **and** ``max > min *
   balance_rel_threshold`` over all workers; then the least loaded worker wins, whatever the
   cache says (the prompt is still added to the tree for that worker).
2. Otherwise the longest prefix match in the approximate tree decides: if the match rate
   (matched / prompt length; SGLang counts characters, here tokens) exceeds
   ``cache_threshold``, the worker holding that match wins; else the least loaded worker
   (current gateway; the older ``sgl-router`` sent it to the worker with the smallest tree).

Defaults are those of the gateway's command line, which a deployment starts it with
(``--cache-threshold`` 0.3, ``--balance-abs-threshold`` 64, ``--balance-rel-threshold`` 1.5:
``default_value_t`` in its ``main.rs``). The library's ``impl Default for CacheAwareConfig``
(``src/policies/mod.rs``), used only when code builds the config, has 0.5, 32 and 1.1; older
``sglang_router`` releases used 0.5, 32 and 1.0001.

Ties: the tree returns the first tenant of the deepest matched node in hash-map order, and
``min_by_key`` the first least loaded worker; here both are uniform among the tied workers.
"""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.view import SCRAPED_SIGNALS, checked_load
from kvroute.sim.routing.base import Policy, check_at_least, pick_max, pick_min, register


@register("sglang")
class SGLangCacheAware(Policy):
    """SGLang's cache-aware rule: balance the cluster first, then follow the longest match.

    Args:
        rng: the router's generator (ties).
        cache_threshold: match rate (matched prompt tokens / prompt tokens) that must be
            exceeded to follow the cache, 0..1.
        balance_abs_threshold: cluster load spread (max - min) above which, with the relative
            condition, the least loaded worker is taken, requests.
        balance_rel_threshold: ratio max / min above which, with the absolute condition, the
            least loaded worker is taken.
        load: the load signal (``RouterView.load``); SGLang's is ``in_flight``.

    Raises:
        ValueError: a threshold out of range, or a ``load`` not in ``LOAD_SIGNALS``.
    """

    uses_prefixes = True

    def __init__(self, rng: np.random.Generator, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 load: str = "in_flight") -> None:
        super().__init__(rng)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"sglang: cache_threshold must be in [0, 1], got {cache_threshold}")
        check_at_least("sglang", 0, balance_abs_threshold=balance_abs_threshold)
        check_at_least("sglang", 1, balance_rel_threshold=balance_rel_threshold)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.load = checked_load("sglang", load)
        self.uses_metrics = load in SCRAPED_SIGNALS

    def is_imbalanced(self, loads: list) -> bool:
        """SGLang's imbalance test over the given loads."""
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        loads = view.load(self.load)
        least = lambda: pick_min(alive, loads.__getitem__, self.rng)  # noqa: E731
        if not alive:
            raise RuntimeError("no live worker to route to")
        if self.is_imbalanced([loads[w] for w in alive]):
            return least()
        matched = view.matched_blocks(request.block_hashes, request.request_id)
        best = max(matched[w] for w in alive)
        rate = best * view.block_size / request.num_prompt_tokens if request.num_prompt_tokens else 0.0
        if rate > self.cache_threshold:
            return pick_max([w for w in alive if matched[w] == best], lambda w: 0, self.rng)
        return least()
