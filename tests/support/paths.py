"""The folders tests read, found from this file's place (``tests/support/``) once, so that a test
does not depend on how deep its own folder is."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
"""``tests/``."""
ROOT = TESTS.parent
"""The repository's root (``sim/``, ``calibrate/``, ``bench/``, ``notebooks/``, ...)."""
GOLDEN = TESTS / "golden"
"""The golden records (``tests/golden/``)."""
CALIBRATE_DATA = ROOT / "calibrate" / "data"
"""The measured calibration sweeps shipped with the source."""
SHARED_TRACES = ROOT.parent / "shared" / "traces"
"""The public traces, in ``../shared/traces`` beside the clone (absent on most machines)."""
INFERENCE_PERF_CONFIGS = TESTS / "data" / "inference-perf"
"""inference-perf YAML configs as published (``tests/data/inference-perf/``)."""
PUBLISHED = ROOT.parent / "shared" / "published"
"""Published reports and results, in ``../shared/published`` beside the clone (absent on most machines)."""
