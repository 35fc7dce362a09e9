"""What each vLLM release does that kvroute's profiles and live path depend on, by version.

Read from the released wheels' source (``pip download vllm==X --no-deps``; the files named on
each rule); the table with every version read is ``docs/reference/vllm-versions.md``. A version
is compared as its leading ``major.minor.patch`` numbers (``"0.11.0"``, ``"0.34.0+cu129"`` and
``"0.32.0"`` of the CPU build alike); an unknown or unparsable version is taken as
:data:`CURRENT`, the newest release read, and said so where it matters.

- :func:`defaults`: the engine settings ``vllm serve`` picks when not told (block size, memory
  utilisation, async scheduling on CUDA, batch limits by GPU memory).
- :func:`reports_zero_cached_tokens`: whether the streamed usage carries
  ``prompt_tokens_details.cached_tokens`` when the hit is 0.
- :func:`reset_reports_success`: whether ``POST /reset_prefix_cache`` answers ``{"success": ...}``.
- :func:`kv_events_as_maps`: the KV-cache events' msgpack form (arrays or maps).
- :func:`kv_event_stamp`: what a KV-event batch's ``ts`` marks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The newest release whose source was read (the default of ``profiles derive --vllm-version``).
CURRENT = "0.34.0"

#: The seed study's release.
STUDY = "0.11.0"

#: Oldest and newest releases the live path was read against (``pyproject.toml``'s ``gpu`` extra).
TESTED_RANGE = ("0.11.0", "0.34.0")

GiB = 2**30


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a version string (``"0.11.0"``, ``"0.34.0+cu129"``,
    ``"0.11"``), or None when it does not start with a number."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version or ""))
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _at_least(version: str | None, bound: tuple[int, int, int]) -> bool:
    v = parse_version(version)
    return (v or parse_version(CURRENT)) >= bound


def family(version: str | None) -> str:
    """``"major.minor"`` of a version (``"0.11"``), or ``"unknown"``."""
    v = parse_version(version)
    return "unknown" if v is None else f"{v[0]}.{v[1]}"


@dataclass(frozen=True, slots=True)
class VllmDefaults:
    """The settings ``vllm serve`` takes when not told, for one release.

    Attributes:
        version: the release.
        block_size: KV block size, tokens (``vllm/config/cache.py``: 16 through 0.33,
            ``DEFAULT_BLOCK_SIZE = 64`` from 0.34; an attention backend may prefer another).
        gpu_memory_utilization: the share of the GPU one instance takes (0.9 through 0.19, 0.92
            from 0.20; from 0.34 unset resolves to 1.0 on CUDA/ROCm, where the extensible KV cache
            is on by default: ``CacheConfig.resolved_gpu_memory_utilization``).
        async_scheduling_cuda: whether async scheduling is on by default on CUDA (``SchedulerConfig.
            async_scheduling`` None resolves to True in ``config/vllm.py`` from 0.14; False before).
            On vLLM's CPU backend it is always off (``platforms/cpu.py``).
        large_gpu_tier: whether GPUs of >= 160 GiB get 16384 batched tokens (``engine/arg_utils.py:
            get_batch_defaults``; present in 0.32-0.34, absent in 0.26).
        cudagraph_memory_profiled: whether the KV cache is sized after the memory CUDA graphs
            will take on CUDA (``v1/worker/gpu_worker.py: determine_available_memory`` subtracts
            ``cudagraph_memory_estimate_applied``; ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
            defaults to 1, and vLLM logs "CUDA graph memory profiling is enabled (default since
            v0.21.0)"); False before 0.21.
    """

    version: str
    block_size: int
    gpu_memory_utilization: float
    async_scheduling_cuda: bool
    large_gpu_tier: bool
    cudagraph_memory_profiled: bool = False

    def async_scheduling(self, device: str = "cuda") -> bool:
        """Async scheduling by default on ``device`` (``"cuda"`` or ``"cpu"``)."""
        return self.async_scheduling_cuda and device != "cpu"

    def batch_defaults(self, gpu_memory_bytes: int, gpu_name: str) -> tuple[int, int]:
        """``(max_num_batched_tokens, max_num_seqs)`` of ``vllm serve`` on a GPU
        (``engine/arg_utils.py: get_batch_defaults``, OpenAI API server context): >= 160 GiB (when
        the release has that tier) 16384 / 1024; >= 70 GiB and not an A100 8192 / 1024; else
        2048 / 256."""
        if self.large_gpu_tier and gpu_memory_bytes >= 160 * GiB:
            return 16384, 1024
        if gpu_memory_bytes >= 70 * GiB and "a100" not in gpu_name.lower():
            return 8192, 1024
        return 2048, 256


def defaults(version: str | None) -> VllmDefaults:
    """The defaults of ``version`` (:class:`VllmDefaults`); an unknown version: :data:`CURRENT`'s."""
    v = parse_version(version) or parse_version(CURRENT)
    name = str(version) if parse_version(version) else CURRENT
    return VllmDefaults(
        version=name,
        block_size=64 if v >= (0, 34, 0) else 16,
        gpu_memory_utilization=1.0 if v >= (0, 34, 0) else 0.92 if v >= (0, 20, 0) else 0.9,
        async_scheduling_cuda=v >= (0, 14, 0),
        large_gpu_tier=v >= (0, 32, 0),
        cudagraph_memory_profiled=v >= (0, 21, 0),
    )


def release_groups() -> list[tuple[str, str, VllmDefaults]]:
    """The minor releases of :data:`TESTED_RANGE` grouped where :func:`defaults` gives the same
    block size, memory utilisation, async scheduling on CUDA and CUDA-graph memory profiling:
    ``(first, last, defaults)``
    with ``first``/``last`` as ``"major.minor"``, oldest first (``profiles derive --help``
    lists them)."""
    (major, low, _), (_, high, _) = (parse_version(v) for v in TESTED_RANGE)
    groups: list[tuple[str, str, VllmDefaults]] = []
    for minor in range(low, high + 1):
        release, d = f"{major}.{minor}", defaults(f"{major}.{minor}.0")
        if groups and _memory_and_scheduling(groups[-1][2]) == _memory_and_scheduling(d):
            groups[-1] = (groups[-1][0], release, groups[-1][2])
        else:
            groups.append((release, release, d))
    return groups


def _memory_and_scheduling(d: VllmDefaults) -> tuple:
    """The defaults :func:`release_groups` groups releases by."""
    return d.block_size, d.gpu_memory_utilization, d.async_scheduling_cuda, d.cudagraph_memory_profiled


def reports_zero_cached_tokens(version: str | None) -> bool:
    """Whether a server started with ``--enable-prompt-tokens-details`` sends ``cached_tokens``
    when it is 0: from 0.24 (``... and num_cached_tokens is not None``); through 0.23 the field is
    left out for a zero hit (``if self.enable_prompt_tokens_details and num_cached_tokens``,
    ``entrypoints/openai/serving_completion.py`` in 0.11, ``completion/serving.py`` in 0.20-0.23)."""
    return _at_least(version, (0, 24, 0))


def reset_reports_success(version: str | None) -> bool:
    """Whether ``POST /reset_prefix_cache`` answers ``{"success": bool}``: from 0.26
    (``entrypoints/serve/dev/cache/api_router.py``); through 0.25 it answers 200 with an empty
    body whether or not the engine reset (the engine refuses while a request holds blocks,
    ``v1/core/block_pool.py: reset_prefix_cache``)."""
    return _at_least(version, (0, 26, 0))


def kv_events_as_maps(version: str | None) -> bool:
    """Whether the events inside a KV-event batch are msgpack maps (``KVCacheEvent`` without
    ``array_like``, from 0.24) rather than arrays (``array_like=True`` through 0.23). The batch
    itself (``EventBatch``: ts, events, data_parallel_rank) is an array in every release read
    (``distributed/kv_events.py``)."""
    return _at_least(version, (0, 24, 0))


KV_EVENT_STAMPS = {
    "step_start": "the end of schedule() of the step that stored the block, before its model run "
                  "(vLLM 0.11.0: the batch is published in Scheduler.schedule)",
    "step_end": "the end of the step that stored the block (Scheduler.update_from_output, sync scheduling)",
    "step_end_alone": "the end of the step that stored the block for a request alone; one step early "
                      "under load (async scheduling: update_from_output(N) publishes what schedule(N+1) stored)",
}
"""What a KV-event batch's ``ts`` marks, by :func:`kv_event_stamp`'s answer."""


def kv_event_stamp(version: str | None, async_scheduling: bool | None) -> str:
    """What a KV-event batch's ``ts`` (``time.time()`` when it was published) marks for a server
    of ``version`` (a key of :data:`KV_EVENT_STAMPS`).

    0.11.0 publishes the events at the end of ``Scheduler.schedule``, so the batch storing a
    prompt's last block is stamped before that prefill step runs; from 0.11.1 they are published
    in ``update_from_output``, after the step (``v1/core/sched/scheduler.py``). With async
    scheduling (``async_scheduling`` True, or None on a release where it is on by default on
    CUDA) step N+1 is scheduled before step N's output is processed, so the batch published after
    step N carries what step N+1 stored: right for a request alone, one step early under load.
    """
    v = parse_version(version) or parse_version(CURRENT)
    if v <= (0, 11, 0):
        return "step_start"
    on = defaults(version).async_scheduling_cuda if async_scheduling is None else async_scheduling
    return "step_end_alone" if on else "step_end"
