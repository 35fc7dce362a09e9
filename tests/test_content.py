"""Block hash keys (``sim/content.py``): every key is a signed 64-bit int."""

from __future__ import annotations

from kvroute.sim import content
from kvroute.sim.content import INT64_MAX, block_hashes


def test_a_run_near_the_top_of_the_range_wraps_into_signed_64_bits(monkeypatch):
    monkeypatch.setattr(content, "hash", lambda _t: INT64_MAX - 2, raising=False)
    keys = block_hashes([(7, 0, 5 * 16)], 16)
    assert keys == [INT64_MAX - 2, INT64_MAX - 1, INT64_MAX, -INT64_MAX - 1, -INT64_MAX]


def test_keys_of_a_chat_fit_in_signed_64_bits():
    segments = [(1, 0, 512 * 3), (1 << 48, 0, 100), (2, 0, 512 * 2 + 7)]
    keys = block_hashes(segments, 16)
    assert len(keys) == (512 * 5 + 107) // 16
    assert all(-INT64_MAX - 1 <= k <= INT64_MAX for k in keys)
    assert block_hashes(segments, 16, keys[:96]) == keys  # known: the first segment's blocks
