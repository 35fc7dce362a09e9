"""Block hash keys (``sim/engine/content.py`` and its compiled twin ``sim/engine/_content.pyx``): every key is a
signed 64-bit int, and both give the same keys in the same order (the compiled one from the
``compiled_core`` fixture, tests/conftest.py)."""

from __future__ import annotations

import random
from array import array

import pytest

from kvroute.sim.engine import content
from kvroute.sim.engine.content import GENERATED_CONTENT_BASE, INT64_MAX, block_hashes


def test_a_run_near_the_top_of_the_range_wraps_into_signed_64_bits(monkeypatch):
    monkeypatch.setattr(content, "hash", lambda _t: INT64_MAX - 2, raising=False)
    keys = block_hashes([(7, 0, 5 * 16)], 16)
    assert keys == [INT64_MAX - 2, INT64_MAX - 1, INT64_MAX, -INT64_MAX - 1, -INT64_MAX]


def test_the_compiled_run_wraps_as_the_pure_one(compiled_core):
    """The compiled block_hashes writes a run's keys with ``extend_key_run``'s loop."""
    _content = compiled_core.content
    keys = array("q", [5])
    last = _content.extend_key_run(keys, INT64_MAX - 2, 5)
    assert list(keys) == [5, INT64_MAX - 2, INT64_MAX - 1, INT64_MAX, -INT64_MAX - 1, -INT64_MAX]
    assert last == -INT64_MAX
    with pytest.raises(TypeError):
        _content.extend_key_run(array("d"), 0, 1)
    with pytest.raises(ValueError):
        _content.extend_key_run(keys, 0, 0)


def test_keys_of_a_chat_fit_in_signed_64_bits():
    segments = [(1, 0, 512 * 3), (1 << 48, 0, 100), (2, 0, 512 * 2 + 7)]
    keys = block_hashes(segments, 16)
    assert len(keys) == (512 * 5 + 107) // 16
    assert all(-INT64_MAX - 1 <= k <= INT64_MAX for k in keys)
    assert block_hashes(segments, 16, keys[:96]) == keys  # known: the first segment's blocks


def _random_sequence(rng: random.Random) -> list[tuple[int, int, int]]:
    """Segments as workloads build them: trace blocks (some partial), new text and replies."""
    segments = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.5:
            segments.append((rng.randint(0, 10**6), 0, rng.choice([512, 512, rng.randint(1, 512)])))
        else:
            cid = GENERATED_CONTENT_BASE + rng.randint(0, 10**6)
            segments.append((cid, rng.randint(0, 100), rng.randint(1, 3000)))
    return segments


@pytest.mark.parametrize("seed", range(200))
def test_compiled_keys_equal_the_pure_ones(seed, compiled_core):
    _content = compiled_core.content
    rng = random.Random(seed)
    block_size = rng.choice([1, 7, 16, 16, 32, 512])
    segments = _random_sequence(rng)
    pure = block_hashes(segments, block_size)
    compiled = _content.block_hashes(segments, block_size)
    assert isinstance(compiled, array) and compiled.typecode == "q"
    assert list(compiled) == pure
    # a later turn: the parent's keys given as known (an array, as the compiled workload keeps
    # them), and any prefix of them (the keys after it are then those the pure version gives)
    more = segments + _random_sequence(rng)
    for cut in (len(pure), rng.randint(0, len(pure))):
        expect = block_hashes(more, block_size, pure[:cut])
        assert list(_content.block_hashes(more, block_size, compiled[:cut])) == expect
        assert list(_content.block_hashes(more, block_size, pure[:cut])) == expect
