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
