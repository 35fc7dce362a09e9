"""KV-aware: the worker whose routed history holds the longest prefix of the prompt."""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import Policy, register


@register("kv_aware")
class KVAware(Policy):
    """The live worker whose routed history holds the longest prefix of this prompt.

    For a chat this is the worker that served the previous turn. Three guards keep a prefix
    that every request shares (a common system prompt) from pulling all traffic to the first
    worker that saw it:

    - the first request of a session the router has not seen goes to the least loaded worker;
    - the best match must cover at least ``min_match_share`` of the prompt's blocks
      (a share like SGLang's ``cache_threshold``), otherwise the least loaded worker wins;
    - ties between equally long matches go to the least loaded of them.

    Args:
        rng: the router's generator.
        min_match_share: share of the prompt's blocks the best match must cover, 0..1.
    """

    uses_prefixes = True

    def __init__(self, rng: np.random.Generator, min_match_share: float = 0.5) -> None:
        super().__init__(rng)
        if not 0.0 <= min_match_share <= 1.0:
            raise ValueError(f"kv_aware: min_match_share must be in [0, 1], got {min_match_share}")
        self.min_match_share = min_match_share

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        rng = self.tie_rng
        if request.session_id is not None and request.session_id not in view.sessions:
            return view.least_loaded(alive, rng)
        matched = view.matched_blocks(request.block_hashes, request.request_id)
        best = max(matched[w] for w in alive)
        num_blocks = len(request.block_hashes)
        if best == 0 or best < self.min_match_share * num_blocks:
            return view.least_loaded(alive, rng)
        return view.least_loaded([w for w in alive if matched[w] == best], rng)
