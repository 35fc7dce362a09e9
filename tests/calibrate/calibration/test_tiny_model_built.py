"""The tiny model's build marker: what ``kvroute serve`` reads before saying it builds one."""

from __future__ import annotations

import json
from dataclasses import asdict

from kvroute.calibrate.calibration.tiny_model import TinySpec, tiny_model_built


def test_a_folder_holds_the_tiny_model_only_with_a_marker_of_the_same_spec(tmp_path):
    assert not tiny_model_built(tmp_path)
    (tmp_path / "kvroute-tiny.json").write_text(json.dumps(asdict(TinySpec())))
    assert tiny_model_built(tmp_path)
    (tmp_path / "kvroute-tiny.json").write_text(json.dumps({**asdict(TinySpec()), "seed": -1}))
    assert not tiny_model_built(tmp_path)
    (tmp_path / "kvroute-tiny.json").write_text("{not json")
    assert not tiny_model_built(tmp_path)


def test_a_failed_import_names_the_torch_extras_to_uninstall(tmp_path, monkeypatch):
    """vLLM's CPU wheel brought torchvision, torchaudio and torchcodec builds that broke
    transformers' Qwen2 import; ``serve`` then said to install what was installed."""
    import importlib.util
    import sys

    import pytest

    from kvroute.calibrate.calibration import tiny_model

    real = importlib.util.find_spec
    installed = {"torchvision", "torchcodec"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in installed else None if name == "torchaudio" else real(name, *a))
    assert tiny_model.torch_extras_hint() == (
        "; torchvision, torchcodec are installed, and vLLM's CPU wheel brings builds of them that break "
        "transformers' model imports: python -m pip uninstall -y torchvision torchcodec (docs/guide/calibrate-on-cpu.md)")
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it raises ImportError
    # (without the live extra torch is missing too, and its import fails first: the hint is the same)
    with pytest.raises(ImportError, match=r"(torch|transformers).*; torchvision, torchcodec are installed.*uninstall -y "):
        tiny_model.build_tiny_model(tmp_path)
    installed.clear()
    assert tiny_model.torch_extras_hint() == ""
