"""``kvroute serve``'s GPU plan with ``CUDA_VISIBLE_DEVICES`` naming UUIDs or MIG ids
(calibrate/live/cores.py ``detect_gpus``, plan.py ``plan_servers``); no GPU needed."""

from __future__ import annotations

import pytest

from kvroute.calibrate.live import cores
from kvroute.calibrate.live.cores import detect_gpus
from kvroute.calibrate.live.plan import plan_servers
from kvroute.calibrate.live.server import ServerSpec


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES with UUIDs and MIG ids
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("visible, expected", [
    ("0,1", [0, 1]),
    (" 2 ,\t3 , ", [2, 3]),
    ("GPU-8f3a1b2c-0000-1111-2222-333344445555,GPU-9f3a1b2c-0000-1111-2222-333344445555",
     ["GPU-8f3a1b2c-0000-1111-2222-333344445555", "GPU-9f3a1b2c-0000-1111-2222-333344445555"]),
    ("MIG-4b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff, MIG-GPU-8f3a/1/0",
     ["MIG-4b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff", "MIG-GPU-8f3a/1/0"]),
    ("1, GPU-8f3a", [1, "GPU-8f3a"]),
    ("0,-1,1", [0]),  # CUDA sees no device from an invalid index on
    ("", []),
    (" , ", []),
])
def test_visible_devices_are_taken_as_written(monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert detect_gpus() == expected


def test_each_server_is_pinned_to_its_uuid(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa, GPU-bbb")
    specs = plan_servers("m", device="auto")
    assert [(s.cuda_device, s.cpu_core, s.port) for s in specs] == [("GPU-aaa", None, 8100), ("GPU-bbb", None, 8101)]
    assert [s.environment({})["CUDA_VISIBLE_DEVICES"] for s in specs] == ["GPU-aaa", "GPU-bbb"]
    two = plan_servers("m", 4, workers_per_gpu=2, gpu_memory_utilization=0.8, device="gpu")
    assert [s.environment({})["CUDA_VISIBLE_DEVICES"] for s in two] == ["GPU-aaa", "GPU-aaa", "GPU-bbb", "GPU-bbb"]
    assert ServerSpec("m", cuda_device=3).environment({})["CUDA_VISIBLE_DEVICES"] == "3"


def test_an_empty_visible_list_is_named_in_the_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " ")
    with pytest.raises(ValueError, match=r"no GPU found \(CUDA_VISIBLE_DEVICES=' ' names none\)"):
        plan_servers("m", 1, device="gpu")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(cores.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="nvidia-smi -L lists none and CUDA_VISIBLE_DEVICES is unset"):
        plan_servers("m", 1, device="gpu")
