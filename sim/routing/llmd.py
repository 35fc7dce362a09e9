"""llm-d's inference scheduler (the Gateway API inference extension's endpoint picker).

Mirrored from ``llm-d-inference-scheduler`` ``pkg/epp/framework/plugins/scheduling``:

- ``prefix-cache-scorer`` (``scorer/prefix``): matched blocks / prompt blocks, 0..1, from the
  approximate prefix index (the view's cache source; llm-d's ``precise-prefix-cache-scorer``
  reads vLLM's KV events instead: use the ``events`` cache view);
- ``queue-scorer`` (``scorer/queuedepth``): ``(max - waiting) / (max - min)`` over the
  candidates from the scraped ``vllm:num_requests_waiting``; 1.0 for all when equal;
- ``kv-cache-utilization-scorer`` (``scorer/kvcacheutilization``): ``1 - kv usage``;
- ``load-aware-scorer`` (``scorer/loadaware``): 0.5 with an empty queue, else
  ``0.5 * (1 - min(waiting, threshold) / threshold)``, threshold 128;
- the profile's total is the weighted sum (``SchedulerProfile.runScorerPlugins``); the
  ``max-score-picker`` shuffles then sorts stably, so ties are uniform;
  ``weighted-random-picker`` draws by A-Res keys ``u ** (1 / score)``; ``random-picker``
  draws uniformly.

Default weights are the inference-pool chart's default profile
(``config/charts/epplib/templates/_config.yaml``): queue 2, kv-cache utilisation 2, prefix
cache 3; the load-aware scorer is not in it (weight 0 here).
"""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import Policy, check_at_least, pick_max, register
from kvroute.sim.routing.epp_scorers import load_aware_score, queue_scores

PICKERS = ("max", "weighted", "random")


@register("llmd")
class LLMDScheduler(Policy):
    """llm-d's weighted scorers and picker.

    Args:
        rng: the router's generator (ties, pickers).
        prefix_weight: weight of the prefix-cache scorer.
        queue_weight: weight of the queue scorer.
        kv_weight: weight of the KV-cache utilisation scorer.
        load_weight: weight of the load-aware scorer.
        load_threshold: the load-aware scorer's queue depth at which its score reaches 0.
        picker: ``max`` (max-score-picker), ``weighted`` (weighted-random-picker) or
            ``random``.

    Raises:
        ValueError: negative weights, a threshold < 1 or an unknown picker.
    """

    uses_prefixes = True

    def __init__(self, rng: np.random.Generator, prefix_weight: float = 3.0, queue_weight: float = 2.0,
                 kv_weight: float = 2.0, load_weight: float = 0.0, load_threshold: int = 128,
                 picker: str = "max") -> None:
        super().__init__(rng)
        check_at_least("llmd", 0, prefix_weight=prefix_weight, queue_weight=queue_weight, kv_weight=kv_weight,
                       load_weight=load_weight)
        check_at_least("llmd", 1, load_threshold=load_threshold)
        if picker not in PICKERS:
            raise ValueError(f"llmd: unknown picker {picker!r}; valid: {', '.join(PICKERS)}")
        self.prefix_weight = prefix_weight
        self.queue_weight = queue_weight
        self.kv_weight = kv_weight
        self.load_weight = load_weight
        self.load_threshold = load_threshold
        self.picker = picker
        self.uses_prefixes = prefix_weight > 0
        self.uses_metrics = queue_weight > 0 or kv_weight > 0 or load_weight > 0

    def scores(self, request, view, workers: list[int]) -> list[float]:
        """The weighted total score of each of ``workers``."""
        total = [0.0] * len(workers)
        if self.prefix_weight:
            matched = view.matched_blocks(request.block_hashes, request.request_id)
            n = len(request.block_hashes)
            for i, w in enumerate(workers):
                total[i] += self.prefix_weight * (matched[w] / n if n else 0.0)
        if self.queue_weight or self.kv_weight or self.load_weight:
            scraped = view.metrics.current() if view.metrics is not None else None
            if scraped is None:
                raise ValueError("llmd: the queue, KV and load scorers need the workers' /metrics")
            waiting = [scraped[w][1] for w in workers]
            queue = queue_scores(waiting)
            for i, w in enumerate(workers):
                kv = 1.0 - scraped[w][2]
                load = load_aware_score(waiting[i], self.load_threshold)
                total[i] += self.queue_weight * queue[i] + self.kv_weight * kv + self.load_weight * load
        return total

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        if self.picker == "random":
            return alive[int(self.rng.integers(len(alive)))]
        score = dict(zip(alive, self.scores(request, view, alive)))
        if self.picker == "max":
            return pick_max(alive, score.__getitem__, self.rng)
        keys = {w: (self.rng.random() ** (1.0 / score[w]) if score[w] > 0 else 0.0) for w in alive}
        return pick_max(alive, keys.__getitem__, self.rng)
