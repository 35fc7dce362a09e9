"""Which servers one ``calibrate measure`` pools (``measure.check_alike``)."""

import pytest


def test_servers_are_pooled_only_alike_and_with_kv_caches_within_two_percent():
    from dataclasses import replace

    from kvroute.calibrate.calibration.measure import check_alike
    from kvroute.calibrate.live.client import CalibrationError, ServerInfo

    one = ServerInfo(url="http://a:1", model="m", model_root="/m", served_models=("m",), vllm_version="0.32.0",
                     max_model_len=32768, block_size=16, num_gpu_blocks=10000, enable_prefix_caching=True,
                     max_num_batched_tokens=2048, max_num_seqs=128, hardware="GPU", device="cuda")
    check_alike([one, replace(one, url="http://b:1", num_gpu_blocks=9800)])  # 2 %: one run's memory profiling
    with pytest.raises(CalibrationError, match=r"servers differ in KV cache: 10000 blocks at http://a:1, 9799 at "
                                               r"http://b:1 .*start one after another"):
        check_alike([one, replace(one, url="http://b:1", num_gpu_blocks=9799)])
    with pytest.raises(CalibrationError, match=r"servers differ in block_size \(http://a:1 vs http://b:1\)"):
        check_alike([one, replace(one, url="http://b:1", block_size=32)])
