"""Engine settings of one simulated vLLM worker, with vLLM's defaults and their sources."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM engine arguments the worker model obeys.

    Attributes:
        block_size: tokens per KV block. vLLM default 16 (``vllm/config/cache.py``); the CPU
            backend requires a multiple of 32.
        num_gpu_blocks: KV blocks in the pool, including the reserved null block 0, as vLLM
            reports it in ``vllm:cache_config_info``. Usable blocks are ``num_gpu_blocks - 1``.
        max_num_batched_tokens: token budget of one engine step. ``vllm serve`` uses 2048 on
            devices under 70 GiB and 8192 on H100-class devices (``engine/arg_utils.py``).
        max_num_seqs: most requests in the running queue (256 under 70 GiB, 1024 on H100-class).
        max_model_len: longest sequence (prompt + output) the server accepts, in tokens.
        long_prefill_token_threshold: cap on one prefill chunk when more than one request is
            running or waiting; 0 disables it (vLLM 0.32's default, ``vllm/config/scheduler.py``).
        enable_prefix_caching: vLLM's prefix caching; on by default in the v1 engine.
        async_scheduling: vLLM's ``SchedulerConfig.async_scheduling``: the engine core
            schedules step N+1 before it processes step N's output (``vllm/v1/engine/core.py:
            step_with_batch_queue``, a batch queue of 2) and the scheduler is vLLM's
            ``AsyncScheduler`` (``vllm/v1/core/sched/async_scheduler.py``), see
            ``kvroute.sim.engine.async_scheduler``. Off on the CPU backend and in vLLM 0.11;
            on by default on CUDA from the 0.14 line. Off by default here.

    Raises:
        ValueError: on a non-positive size or a pool without a usable block.
    """

    block_size: int = 16
    num_gpu_blocks: int = 4096
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 32768
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_gpu_blocks < 2:
            raise ValueError(
                f"EngineConfig.num_gpu_blocks must be at least 2 (block 0 is reserved), "
                f"got {self.num_gpu_blocks}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError("EngineConfig.long_prefill_token_threshold must be >= 0")

    def vllm_refusal(self) -> tuple[str, str] | None:
        """``(field, reason)`` when vLLM 0.32 would refuse to start with these settings
        (``SchedulerConfig.verify_max_model_len``, chunked prefill on): ``max_num_batched_tokens``
        below ``max_num_seqs``, or ``long_prefill_token_threshold`` above ``max_model_len``;
        None when it would start. The simulator runs such settings (small ones exercise the
        scheduler in tests); a profile or an option that asks for them is refused with this."""
        if self.max_num_batched_tokens < self.max_num_seqs:
            return ("max_num_batched_tokens", f"{self.max_num_batched_tokens} is below max_num_seqs "
                    f"({self.max_num_seqs}): vLLM refuses to start with it")
        if self.long_prefill_token_threshold > self.max_model_len:
            return ("long_prefill_token_threshold", f"{self.long_prefill_token_threshold} is above max_model_len "
                    f"({self.max_model_len}): vLLM refuses to start with it")
        return None

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can use: all but the reserved null block 0."""
        return self.num_gpu_blocks - 1
