"""Serving features a vLLM server may run that kvroute's engine model does not: read from the
``vllm_config`` that ``/server_info?config_format=json`` returns (``VLLM_SERVER_DEV_MODE=1``), so
that a calibration or validation on such a server says so instead of folding the feature's effect
silently into fitted step costs or prediction errors.

Field names and defaults are vLLM 0.32.0's (``vllm/config/scheduler.py``, ``cache.py``,
``parallel.py``, ``vllm.py``); a field a release does not have is read as its default. The list is
``docs/reference/fidelity-to-vllm.md``'s "What the engine does not model", restricted to what the
config shows (a Mamba hybrid does not show in it).
"""

from __future__ import annotations

from typing import Any


def _section(cfg: dict, name: str) -> dict:
    section = cfg.get(name)
    return section if isinstance(section, dict) else {}


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def unmodeled_features(vllm_config: Any) -> tuple[str, ...]:
    """What the server runs beyond kvroute's engine model, one phrase each naming the vLLM field
    (``"speculative decoding (speculative_config)"``), in a fixed order; ``()`` for a server on
    vLLM's defaults or a config that is not an object.

    Args:
        vllm_config: ``/server_info``'s ``vllm_config`` as JSON (vLLM's ``VllmConfig`` dumped
            by pydantic); missing sections and fields count as vLLM's defaults.
    """
    if not isinstance(vllm_config, dict):
        return ()
    sched = _section(vllm_config, "scheduler_config")
    cache = _section(vllm_config, "cache_config")
    par = _section(vllm_config, "parallel_config")
    found = []
    if sched.get("policy", "fcfs") not in ("fcfs", None):
        found.append(f"{sched['policy']} scheduling (scheduler_config.policy; kvroute schedules first come, first served)")
    if sched.get("enable_chunked_prefill") is False:
        found.append("chunked prefill off (scheduler_config.enable_chunked_prefill; kvroute always chunks)")
    if sched.get("scheduler_reserve_full_isl") is False:
        found.append("admission on the first chunk only (scheduler_config.scheduler_reserve_full_isl; "
                     "kvroute admits a prompt only when all of it fits)")
    if (watermark := _number(sched.get("watermark"))) is not None and watermark > 0:
        found.append(f"a KV watermark of {watermark:g} (scheduler_config.watermark)")
    if sched.get("max_num_active_seqs") is not None:
        found.append(f"at most {sched['max_num_active_seqs']} running requests "
                     "(scheduler_config.max_num_active_seqs; kvroute caps them at max_num_seqs)")
    if sched.get("long_prefill_token_threshold_adaptive") is True:
        found.append("an adaptive long-prefill cap (scheduler_config.long_prefill_token_threshold_adaptive)")
    for key in ("max_num_queued_reqs", "max_num_queued_tokens"):
        if sched.get(key) is not None:
            found.append(f"HTTP 503 past {sched[key]} queued (scheduler_config.{key}; kvroute queues every request)")
    if (interval := _number(sched.get("stream_interval"))) is not None and interval > 1:
        found.append(f"streaming every {interval:g} tokens (scheduler_config.stream_interval; "
                     "kvroute streams each token at the end of its step)")
    if vllm_config.get("speculative_config") is not None:
        found.append("speculative decoding (speculative_config)")
    if vllm_config.get("kv_transfer_config") is not None:
        found.append("a KV connector: CPU offloading, LMCache or prefill/decode disaggregation (kv_transfer_config)")
    if cache.get("sliding_window") is not None:
        found.append(f"sliding-window attention of {cache['sliding_window']} tokens (cache_config.sliding_window; "
                     "kvroute caches every layer as full attention)")
    for key, what in (("data_parallel_size", "data parallel"), ("pipeline_parallel_size", "pipeline parallel")):
        if (size := _number(par.get(key))) is not None and size > 1:
            found.append(f"{what} of {size:g} (parallel_config.{key})")
    return tuple(found)


def unmodeled_note(url: str, features: tuple[str, ...], effect: str) -> str:
    """One line for a server that runs ``features`` (:func:`unmodeled_features`), ending with what
    that means for the run (``effect``: "the fit folds their effect into the step costs")."""
    return (f"{url} runs {'; '.join(features)}, which kvroute's engine does not model: {effect} "
            "(docs/reference/fidelity-to-vllm.md#what-the-engine-does-not-model)")
