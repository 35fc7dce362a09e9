"""llm-d's scorer plugins, each as the endpoint picker (EPP) configures it.

Mirrored from ``llm-d-inference-scheduler`` (the EPP framework moved there from
``kubernetes-sigs/gateway-api-inference-extension`` in June 2026; paths below are under
``pkg/epp/framework/plugins/scheduling/`` unless said otherwise). Every score is in 0..1; the
profile clamps it to that range and adds it times its weight (``pkg/epp/scheduling/
scheduler_profile.go``, ``runScorerPlugins``).

- ``queue-scorer`` (``scorer/queuedepth/queue.go``): ``(max - waiting) / (max - min)`` over the
  candidates' scraped ``vllm:num_requests_waiting``; 1.0 for all when they are equal.
- ``kv-cache-utilization-scorer`` (``scorer/kvcacheutilization/kvcache_utilization.go``; named
  ``kv-cache-scorer`` before gateway-api-inference-extension PR 1238): ``1 - kv usage``.
- ``load-aware-scorer`` (``scorer/loadaware/load_aware.go``): 0.5 with an empty queue, else
  ``0.5 * (1 - min(waiting, threshold) / threshold)``.
- ``prefix-cache-scorer``, estimated (``scorer/prefix/plugin.go`` over
  ``requestcontrol/dataproducer/approximateprefix/``): matched blocks / prompt blocks from the
  gateway's own approximate index (``ApproxPrefixIndex``).
- ``precise-prefix-cache-scorer`` (``scorer/preciseprefixcache/precise_prefix_cache.go``, with
  ``llm-d-kv-cache-manager``'s ``pkg/kvcache/kvblock_scorer.go``): each server's longest run of
  cached blocks from the first, read from the workers' KV-cache events (the run's ``events``
  cache view), normalised as the released scorer does (v0.2 to v0.8.0, ``utils.go``: min-max over
  the servers that hold the first block, the others 0) or as its main branch does since May 2026
  (``absoluteScoredPods``: matched / prompt blocks).

A scorer answers ``score(request, view, workers)`` and is told the decision (``routed``), which
is when the estimated index learns (llm-d's ``PreRequest``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvroute.sim.routing.approx_prefix import ApproxPrefixIndex

DEFAULT_LRU_CAPACITY = 31250
"""llm-d's ``defaultLRUCapacityPerServer`` (``approximateprefix/types.go``): the per-server LRU
capacity when the server does not report its ``num_gpu_blocks``."""

DEFAULT_MAX_PREFIX_BLOCKS = 256
"""llm-d's ``defaultMaxPrefixBlocks``: prompt blocks looked at per request; later ones are cut."""

NORMALIZATIONS = ("minmax", "absolute")


class Scorer:
    """One scorer plugin.

    Attributes:
        type: llm-d's plugin type.
        cache_view: the run's cache view it reads (``events``, ``exact``, ``routed``), or None.
        uses_metrics: whether it reads the scraped ``/metrics``.
    """

    type = ""
    cache_view: str | None = None
    uses_metrics = False

    def prepare(self, view) -> None:
        """Check the scorer against the cluster behind ``view`` and reset its state; called
        once per run before the first request.

        Raises:
            ValueError: the scorer cannot run against this cluster (the message says why).
        """

    def score(self, request, view, workers: list[int]) -> list[float]:
        """The score of each of ``workers`` for ``request``, in 0..1."""
        raise NotImplementedError

    def routed(self, request, view, worker: int) -> None:
        """``request`` went to ``worker`` (llm-d's ``PreRequest``)."""


def queue_scores(waiting: Sequence[float]) -> list[float]:
    """llm-d's ``queue-scorer`` (``scorer/queuedepth``): ``(max - waiting) / (max - min)`` over the
    candidates' waiting queues, 1.0 for all when they are equal."""
    high, low = max(waiting), min(waiting)
    if high == low:
        return [1.0] * len(waiting)
    return [(high - q) / (high - low) for q in waiting]


def load_aware_score(waiting: float, threshold: int) -> float:
    """llm-d's ``load-aware-scorer`` (``scorer/loadaware``): 0.5 with an empty queue, else
    ``0.5 * (1 - min(waiting, threshold) / threshold)``."""
    return 0.5 if waiting == 0 else 0.5 * (1.0 - min(waiting, threshold) / threshold)


def _scraped(view, who: str):
    if view.metrics is None:
        raise ValueError(f"{who}: needs the workers' /metrics (none connected)")
    return view.metrics.current()


class QueueScorer(Scorer):
    """``queue-scorer``: min-max normalised waiting queue, shorter is better."""

    type = "queue-scorer"
    uses_metrics = True

    def score(self, request, view, workers):
        scraped = _scraped(view, self.type)
        return queue_scores([scraped[w][1] for w in workers])


class KVCacheUtilizationScorer(Scorer):
    """``kv-cache-utilization-scorer``: one minus the scraped KV-cache usage."""

    type = "kv-cache-utilization-scorer"
    uses_metrics = True

    def score(self, request, view, workers):
        scraped = _scraped(view, self.type)
        return [1.0 - scraped[w][2] for w in workers]


class LoadAwareScorer(Scorer):
    """``load-aware-scorer``: 0.5 when nothing waits, falling to 0 at ``threshold`` waiting.

    Raises:
        ValueError: a threshold < 1.
    """

    type = "load-aware-scorer"
    uses_metrics = True

    def __init__(self, threshold: int = 128) -> None:
        if threshold < 1:
            raise ValueError(f"load-aware-scorer: threshold must be >= 1, got {threshold}")
        self.threshold = threshold

    def score(self, request, view, workers):
        scraped = _scraped(view, self.type)
        return [load_aware_score(scraped[w][1], self.threshold) for w in workers]


class PrefixCacheScorer(Scorer):
    """``prefix-cache-scorer`` with llm-d's approximate prefix index (the estimated form).

    The prompt is cut into blocks of ``block_tokens`` tokens, at most ``max_blocks`` of them; a
    trailing partial block is one more entry (llm-d hashes it too), unique to the request, so it
    takes LRU room and never matches. A prompt shorter than one block has no blocks (score 0).
    Where llm-d cuts the request body's characters at 4 per token (``averageCharactersPerToken``),
    this counts tokens.

    Args:
        block_tokens: tokens per block; 0 auto-tunes to the engine's block size (llm-d's
            ``autoTune``, from the scraped ``vllm:cache_config_info``). A multiple of it otherwise.
        lru_capacity: entries per server's LRU; 0 auto-tunes to each worker's ``num_gpu_blocks``
            (``DEFAULT_LRU_CAPACITY`` where the view does not know them).
        max_blocks: blocks looked at per prompt (``maxPrefixBlocksToMatch``).
        max_tokens: if > 0, blocks looked at are ``max_tokens // block size`` instead
            (``maxPrefixTokensToMatch``, which takes precedence in llm-d).
        fallback_capacity: the LRU capacity when auto-tuning and the view does not know the
            workers' ``num_gpu_blocks`` (the live replay): ``lruCapacityPerServer``.
        owner: who the arguments came from, as a bad one's error names it (a policy whose
            parameters they are, e.g. ``llmd-estimated``); None: this scorer's ``type``.

    Raises:
        ValueError: a negative size or capacity, max_blocks < 1; at ``prepare``, a block size
            that is not a multiple of the engine's.
    """

    type = "prefix-cache-scorer"

    def __init__(self, block_tokens: int = 0, lru_capacity: int = 0,
                 max_blocks: int = DEFAULT_MAX_PREFIX_BLOCKS, max_tokens: int = 0,
                 fallback_capacity: int = DEFAULT_LRU_CAPACITY, owner: str | None = None) -> None:
        from kvroute.sim.routing.base import check_at_least

        owner = owner or self.type
        # 0: auto-tuned (block size, LRU capacity) or no limit (tokens)
        check_at_least(owner, 0, block_tokens=block_tokens, lru_capacity=lru_capacity, max_tokens=max_tokens)
        check_at_least(owner, 1, max_blocks=max_blocks, fallback_capacity=fallback_capacity)
        self.block_tokens = block_tokens
        self.lru_capacity = lru_capacity
        self.max_blocks = max_blocks
        self.max_tokens = max_tokens
        self.fallback_capacity = fallback_capacity
        self.index: ApproxPrefixIndex | None = None
        self._last: tuple[int, list] | None = None

    def prepare(self, view) -> None:
        block = self.block_tokens or view.block_size
        if block % view.block_size:
            raise ValueError(f"prefix-cache-scorer: block size {block} tokens must be a multiple of the engine's "
                             f"block size {view.block_size}")
        self.stride = block // view.block_size
        self.block = block
        self.limit = max(1, self.max_tokens // block) if self.max_tokens else self.max_blocks
        if self.lru_capacity:
            capacities = [self.lru_capacity] * view.num_workers
        else:
            known = getattr(view, "num_gpu_blocks", None)
            capacities = list(known) if known else [self.fallback_capacity] * view.num_workers
        self.index = ApproxPrefixIndex(capacities)
        self._last = None

    def hashes(self, request) -> list:
        """The index entries of ``request``'s prompt (llm-d's ``hashPrompt``)."""
        if request.num_prompt_tokens < self.block:
            return []
        full = list(request.block_hashes[self.stride - 1::self.stride][:self.limit])
        if len(full) < self.limit and request.num_prompt_tokens % self.block:
            full.append(("partial", request.request_id))
        return full

    def score(self, request, view, workers):
        if self.index is None:
            self.prepare(view)
        hashes = self.hashes(request)
        self._last = (request.request_id, hashes)
        if not hashes:
            return [0.0] * len(workers)
        counts = self.index.match(hashes)
        return [counts[w] / len(hashes) for w in workers]

    def routed(self, request, view, worker):
        last = self._last
        hashes = last[1] if last is not None and last[0] == request.request_id else self.hashes(request)
        if hashes:
            self.index.add(worker, hashes)


class PrecisePrefixCacheScorer(Scorer):
    """``precise-prefix-cache-scorer``: the longest cached prefix as the KV-cache events say.

    Args:
        block_size: tokens per block of llm-d's token processor (``tokenProcessorConfig.
            blockSize``); 0 takes the engine's. llm-d recomputes vLLM's block hashes at this
            size, so it must equal the engine's block size (``--block-size``), or no hash matches.
        normalize: ``minmax`` (released scorer) or ``absolute`` (matched / prompt blocks).
        cache_view: the cache source it reads: ``events`` (llm-d's KV-event index), or
            ``exact`` for reference.

    Raises:
        ValueError: a negative block size, an unknown normalisation or cache view; at
            ``prepare``, a block size other than the engine's.
    """

    type = "precise-prefix-cache-scorer"
    source = ""
    """Where the scorer was configured (an EndpointPickerConfig file and field), for messages."""

    def __init__(self, block_size: int = 0, normalize: str = "minmax", cache_view: str = "events") -> None:
        if block_size < 0:
            raise ValueError(f"precise-prefix-cache-scorer: block size must be >= 0, got {block_size}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"precise-prefix-cache-scorer: unknown normalize {normalize!r}; "
                             f"valid: {', '.join(NORMALIZATIONS)}")
        if cache_view not in ("events", "exact"):
            raise ValueError(f"precise-prefix-cache-scorer: cache view must be events or exact, got {cache_view!r}")
        self.block_size = block_size
        self.normalize = normalize
        self.cache_view = cache_view

    def prepare(self, view) -> None:
        if self.block_size and self.block_size != view.block_size:
            raise ValueError(f"{self.source or 'precise-prefix-cache-scorer'}: block size {self.block_size} must "
                             f"equal the engine's block size {view.block_size} (llm-d recomputes vLLM's block "
                             "hashes; at another size none match): a profile of "
                             f"{self.block_size}-token blocks (kvroute profiles derive --block-size "
                             f"{self.block_size}), or blockSize {view.block_size} in the config")

    def score(self, request, view, workers):
        matched = view.matched_blocks(request.block_hashes, request.request_id)
        return normalized([matched[w] for w in workers], len(request.block_hashes), self.normalize)


def normalized(matched: Sequence[int], total: int, how: str = "minmax") -> list[float]:
    """Precise prefix scores from matched blocks per candidate.

    ``minmax``: the candidates holding at least the first block are scaled from their fewest
    (0) to their most (1) matched blocks, 1.0 each when they are equal; the others 0.
    ``absolute``: ``min(matched / total, 1)``, 0 when ``total`` is 0.
    """
    if how == "absolute":
        return [min(m / total, 1.0) if total > 0 and m > 0 else 0.0 for m in matched]
    held = [m for m in matched if m > 0]
    if not held:
        return [0.0] * len(matched)
    high, low = max(held), min(held)
    if high == low:
        return [1.0 if m > 0 else 0.0 for m in matched]
    return [(m - low) / (high - low) if m > 0 else 0.0 for m in matched]
