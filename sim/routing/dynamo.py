"""NVIDIA Dynamo's KV router cost (``--router-mode kv``).

Mirrored from ``lib/llm/src/kv_router/scheduler.rs`` (``DefaultWorkerSelector::worker_logit``,
``softmax_sample``) and the router's ``ActiveSequences::potential_blocks_and_tokens``
(``lib/llm/src/kv_router/sequence.rs``). Per worker, with ``bs`` the block size::

    prefill_blocks = (outstanding prefill tokens + prompt tokens - overlap blocks * bs) / bs
    decode_blocks  = active blocks + new blocks
    logit          = overlap_weight * prefill_blocks + decode_blocks

Outstanding prefill tokens, active blocks and new blocks are the router's own bookkeeping of
what it sent (``RouterView.outstanding_tokens``, ``active_blocks``, ``new_blocks``): the
distinct prompt blocks of the requests in flight on the worker, and the prompt's blocks past
the longest prefix one of them holds. The cache overlap enters the prefill term only; it
comes from the view's cache source (Dynamo's default is KV events, ``--no-kv-events`` the
routed-prefix approximation). A prefix cached but no longer in flight (an earlier turn of a
chat) lowers the prefill term and leaves the decode term whole, as in Dynamo.
Temperature 0 takes the lowest logit (ties: Dynamo prefers the smaller radix tree, then random;
here random). Otherwise logits are min-max normalised and a worker is drawn with probability
proportional to ``exp(-normalised / temperature)`` (uniform when all logits are equal).
Defaults: ``overlap_score_weight`` 1.0, ``router_temperature`` 0.0 (Dynamo's ``KvRouterConfig``).
"""

from __future__ import annotations

import math

import numpy as np

from kvroute.sim.routing.base import Policy, check_at_least, pick_min, register


def softmax_probabilities(logits: list[float], temperature: float) -> list[float]:
    """Dynamo's sampling probabilities for cost ``logits`` (lower cost, higher probability).

    Raises:
        ValueError: a temperature <= 0 (0 means argmin, not sampling).
    """
    if temperature <= 0:
        raise ValueError("softmax sampling needs a temperature > 0")
    low, high = min(logits), max(logits)
    if low == high:
        return [1.0 / len(logits)] * len(logits)
    weights = [math.exp(-(v - low) / ((high - low) * temperature)) for v in logits]
    total = sum(weights)
    return [w / total for w in weights]


@register("dynamo")
class DynamoKVRouter(Policy):
    """Dynamo's KV-router cost: weighted prefill blocks still to compute plus decode blocks.

    Args:
        rng: the router's generator (ties, softmax draws).
        overlap_weight: weight of the prefill term (``--kv-overlap-score-weight``); 0 ignores
            the cache.
        temperature: ``--router-temperature``; 0 takes the cheapest worker.
        ttl_s: seconds a routed prefix counts in the routed cache view (``--no-kv-events``)
            after the last request routed with it (``--router-ttl``; ``KvRouterConfig``'s
            ``router_ttl_secs`` 120 s); the KV-event and exact views do not expire.

    Raises:
        ValueError: a negative weight or temperature, a ``ttl_s`` not above 0.
    """

    uses_prefixes = True
    uses_active_blocks = True

    def __init__(self, rng: np.random.Generator, overlap_weight: float = 1.0, temperature: float = 0.0,
                 ttl_s: float = 120.0) -> None:
        super().__init__(rng)
        check_at_least("dynamo", 0, overlap_weight=overlap_weight, temperature=temperature)
        if not ttl_s > 0:
            raise ValueError(f"dynamo: ttl_s must be > 0 s, got {ttl_s:g}")
        self.overlap_weight = overlap_weight
        self.temperature = temperature
        self.routed_ttl_s = ttl_s

    def logits(self, request, view, workers: list[int]) -> list[float]:
        """The cost of sending ``request`` to each of ``workers`` (blocks)."""
        bs = view.block_size
        matched = view.matched_blocks(request.block_hashes, request.request_id)
        out = []
        for w in workers:
            overlap = matched[w]
            prefill = view.outstanding_tokens[w] + max(request.num_prompt_tokens - overlap * bs, 0)
            decode = view.active_blocks[w] + view.new_blocks(w, request.block_hashes)
            out.append(self.overlap_weight * prefill / bs + decode)
        return out

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        cost = dict(zip(alive, self.logits(request, view, alive)))
        if self.temperature == 0:
            return pick_min(alive, cost.__getitem__, self.rng)
        probs = softmax_probabilities(list(cost.values()), self.temperature)
        u, acc = self.rng.random(), 0.0
        for w, p in zip(alive, probs):
            acc += p
            if u <= acc:
                return w
        return alive[-1]
