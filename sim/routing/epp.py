"""llm-d's endpoint picker as configured in the field: weighted scorers, one picker, and the cache
view each configuration reads.

One scheduling profile (``single-profile-handler``): every live worker is a candidate; each
scorer's score (``epp_scorers``), clamped to 0..1, times its weight, summed; then the picker
(``pkg/epp/framework/plugins/scheduling/picker/`` of ``llm-d-inference-scheduler``):
``max-score-picker`` (shuffle, stable sort by score: ties uniform), ``weighted-random-picker``
(A-Res keys ``u ** (1 / score)``; all scores 0: uniform) or ``random-picker`` (uniform). After the
pick each scorer is told the decision (``PreRequest``: the estimated index learns).

The cache view belongs to the policy: a configuration with the precise prefix scorer reads the
workers' KV-cache events whatever the run's ``--cache-view``, and one with the estimated scorer
keeps its own index, so one ``compare`` holds both. Presets (weights from llm-d's well-lit path
guides, ``llm-d/llm-d`` ``guides/``):

- ``llmd-precise``: precise prefix 2, KV utilisation 1, queue 1
  (``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``,
  image v0.8.0-rc.1; the earlier ``guides/precise-prefix-cache-aware/gaie-kv-events/values.yaml``,
  image v0.5.x, used 3 / 2 / 2: ``llmd-precise:prefix_weight=3,kv_weight=2,queue_weight=2``);
- ``llmd-estimated``: queue 2, KV utilisation 2, estimated prefix 3
  (``guides/inference-scheduling/scheduler/inference-scheduling.values.yaml``, and the EPP's
  built-in default, ``pkg/epp/config/loader/defaults.go``);
- ``llmd-load``: queue 1, KV utilisation 1, no prefix scorer;
- ``epp``: an ``EndpointPickerConfig`` YAML file (``epp_config``): ``epp:FILE`` or ``epp:config=FILE``; or
  one of a Markdown report's blocks, ``epp:REPORT.md#NAME``.
"""

from __future__ import annotations

import numpy as np

from kvroute.sim.routing.base import Policy, pick_max, register
from kvroute.sim.routing.epp_scorers import (DEFAULT_LRU_CAPACITY, DEFAULT_MAX_PREFIX_BLOCKS, KVCacheUtilizationScorer,
                                             PrecisePrefixCacheScorer, PrefixCacheScorer, QueueScorer, Scorer)

PICKERS = ("max", "weighted", "random")


class EndpointPicker(Policy):
    """Weighted scorers and a picker, as one llm-d scheduling profile.

    Args:
        rng: the router's generator (ties, pickers).
        scorers: ``(scorer, weight)`` pairs; weights >= 0.
        picker: ``max``, ``weighted`` or ``random``.
        kv_event_delay_s: seconds before a KV-cache event reaches this gateway; None: the run's.

    Attributes:
        cache_view: the view source its scorers read (``Policy.cache_view``).

    Raises:
        ValueError: a negative weight, an unknown picker, or scorers reading different cache views.
    """

    def __init__(self, rng: np.random.Generator, scorers: list[tuple[Scorer, float]], picker: str = "max",
                 kv_event_delay_s: float | None = None) -> None:
        super().__init__(rng)
        for scorer, weight in scorers:
            if weight < 0:
                raise ValueError(f"{self.name or 'epp'}: the weight of {scorer.type} must be >= 0, got {weight:g}")
        if picker not in PICKERS:
            raise ValueError(f"{self.name or 'epp'}: unknown picker {picker!r}; valid: {', '.join(PICKERS)}")
        views = {s.cache_view for s, _ in scorers if s.cache_view is not None}
        if len(views) > 1:
            raise ValueError(f"{self.name or 'epp'}: scorers read different cache views ({', '.join(sorted(views))})")
        self.scorers = [(s, float(w)) for s, w in scorers]
        self.picker = picker
        self.cache_view = views.pop() if views else None
        self.kv_event_delay_s = kv_event_delay_s
        self.uses_prefixes = any(isinstance(s, PrecisePrefixCacheScorer) for s, _ in scorers)
        self.uses_metrics = any(s.uses_metrics for s, _ in scorers)
        self._view = None

    def prepare(self, view) -> None:
        for scorer, _ in self.scorers:
            try:
                scorer.prepare(view)
            except ValueError as exc:
                raise ValueError(f"policy {self.name}: {exc}") from None
        self._view = view

    def scores(self, request, view, workers: list[int]) -> list[float]:
        """The weighted total score of each of ``workers``."""
        if self._view is not view:
            self.prepare(view)
        total = [0.0] * len(workers)
        for scorer, weight in self.scorers:
            for i, s in enumerate(scorer.score(request, view, workers)):
                total[i] += min(max(s, 0.0), 1.0) * weight
        return total

    def choose(self, request, view) -> int:
        alive = view.alive_workers()
        if not alive:
            raise RuntimeError("no live worker to route to")
        score = dict(zip(alive, self.scores(request, view, alive)))
        if self.picker == "random" or (self.picker == "weighted" and not any(v > 0 for v in score.values())):
            worker = alive[int(self.rng.integers(len(alive)))]
        elif self.picker == "max":
            worker = pick_max(alive, score.__getitem__, self.rng)
        else:
            keys = {w: (max(self.rng.random(), 1e-10) ** (1.0 / score[w]) if score[w] > 0 else 0.0) for w in alive}
            worker = pick_max(alive, keys.__getitem__, self.rng)
        for scorer, _ in self.scorers:
            scorer.routed(request, view, worker)
        return worker


def _check_delay(name: str, delay: float) -> float | None:
    if delay != delay or delay > 1e9 or (delay < 0 and delay != -1):
        raise ValueError(f"{name}: kv_event_delay_s must be -1 (the run's --kv-event-delay) or 0 to 1e9 s, got {delay}")
    return None if delay == -1 else delay


@register("llmd-precise")
class LLMDPrecise(EndpointPicker):
    """llm-d's precise well-lit path: KV-event prefix scorer, KV utilisation and queue scorers.

    Args:
        prefix_weight, kv_weight, queue_weight: the scorers' weights (guide: 2, 1, 1).
        normalize: the prefix score's normalisation, ``minmax`` or ``absolute``.
        kv_event_delay_s: seconds before a KV-cache event reaches the gateway; -1: the run's
            ``--kv-event-delay``.
        cache_view: ``events`` (llm-d's KV-event index) or ``exact``.
        picker: ``max``, ``weighted`` or ``random``.
    """

    def __init__(self, rng: np.random.Generator, prefix_weight: float = 2.0, kv_weight: float = 1.0,
                 queue_weight: float = 1.0, normalize: str = "minmax", kv_event_delay_s: float = -1.0,
                 cache_view: str = "events", picker: str = "max") -> None:
        scorers = [(PrecisePrefixCacheScorer(normalize=normalize, cache_view=cache_view), prefix_weight),
                   (KVCacheUtilizationScorer(), kv_weight), (QueueScorer(), queue_weight)]
        super().__init__(rng, scorers, picker, _check_delay(self.name, kv_event_delay_s))


@register("llmd-estimated")
class LLMDEstimated(EndpointPicker):
    """llm-d's default well-lit path: queue and KV utilisation scorers and the estimated prefix scorer.

    Args:
        queue_weight, kv_weight, prefix_weight: the scorers' weights (guide: 2, 2, 3).
        block_tokens: tokens per index block; 0: the engine's block size (auto-tuned).
        lru_capacity: index entries per server; 0: each worker's num_gpu_blocks (auto-tuned).
        max_blocks: prompt blocks looked at (llm-d's maxPrefixBlocksToMatch).
        picker: ``max``, ``weighted`` or ``random``.

    Raises:
        ValueError: a negative weight, block size or capacity, ``max_blocks`` < 1, or an unknown
            picker, naming this policy.
    """

    def __init__(self, rng: np.random.Generator, queue_weight: float = 2.0, kv_weight: float = 2.0,
                 prefix_weight: float = 3.0, block_tokens: int = 0, lru_capacity: int = 0,
                 max_blocks: int = DEFAULT_MAX_PREFIX_BLOCKS, picker: str = "max") -> None:
        prefix = PrefixCacheScorer(block_tokens, lru_capacity, max_blocks, owner=self.name)  # its parameters are ours
        scorers = [(QueueScorer(), queue_weight), (KVCacheUtilizationScorer(), kv_weight), (prefix, prefix_weight)]
        super().__init__(rng, scorers, picker)


@register("llmd-load")
class LLMDLoad(EndpointPicker):
    """llm-d with load scorers only: queue and KV utilisation, no prefix scorer.

    Args:
        queue_weight, kv_weight: the scorers' weights (1, 1).
        picker: ``max``, ``weighted`` or ``random``.
    """

    def __init__(self, rng: np.random.Generator, queue_weight: float = 1.0, kv_weight: float = 1.0,
                 picker: str = "max") -> None:
        super().__init__(rng, [(QueueScorer(), queue_weight), (KVCacheUtilizationScorer(), kv_weight)], picker)


@register("epp")
class EPPConfigPolicy(EndpointPicker):
    """An llm-d EndpointPickerConfig YAML file as the policy: epp:FILE.

    Args:
        config: the file's path (``epp:FILE`` is short for ``epp:config=FILE``), or
            ``REPORT.md#NAME`` for a Markdown report's block (``epp_config.read_endpoint_picker_config``).
        kv_event_delay_s: seconds before a KV-cache event reaches the gateway; -1: the run's.

    Raises:
        ValueError: no file given; ``InputError`` (a ValueError) naming the file, line and field
            of what it cannot read or does not support.
    """

    def __init__(self, rng: np.random.Generator, config: str = "", kv_event_delay_s: float = -1.0) -> None:
        from kvroute.sim.routing.epp_config import read_endpoint_picker_config

        if not config:
            raise ValueError("epp: give the EndpointPickerConfig file, epp:FILE")
        parsed = read_endpoint_picker_config(config)
        super().__init__(rng, parsed.scorers, parsed.picker, _check_delay("epp", kv_event_delay_s))
        self.config = config


__all__ = ["DEFAULT_LRU_CAPACITY", "EPPConfigPolicy", "EndpointPicker", "LLMDEstimated", "LLMDLoad", "LLMDPrecise",
           "PICKERS"]
