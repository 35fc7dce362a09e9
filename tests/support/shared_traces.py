"""The lab's real traces, read in place from ``../shared/traces`` beside the repository (never
copied into it), and the one skip every test gives when they are absent (a clone elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import SHARED_TRACES


def shared_trace(*parts: str) -> Path:
    """``SHARED_TRACES`` joined with ``parts``, e.g. ``shared_trace("mooncake", "conversation_trace.jsonl")``.

    Skips the calling test, naming the file, when it is absent.
    """
    path = SHARED_TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} absent: the lab's traces are read from ../shared/traces beside the repository "
                    f"(docs/reference/trace-formats.md)")
    return path
