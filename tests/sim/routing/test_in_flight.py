"""The blocks in flight per worker (Dynamo's unique_blocks) against a per-block count."""

import random
from collections import Counter

import pytest

from kvroute.sim.routing.in_flight import InFlightPrompts, common_prefix


def chained(tokens):
    """Chained hashes of a token path: block i's names the whole prefix, as vLLM's do."""
    out, h = [], 7
    for t in tokens:
        h = hash((h, t))
        out.append(h)
    return out


def test_common_prefix_of_chained_lists():
    a, b = chained([1, 2, 3, 4]), chained([1, 2, 9, 4])
    assert [common_prefix(a, b), common_prefix(a, a), common_prefix(a, a[:2]), common_prefix(a, chained([5]))] == \
        [2, 4, 2, 0]


@pytest.mark.parametrize("seed", range(20))
def test_counts_equal_a_per_block_count_of_the_union(seed):
    """Random prompts from a small token tree (so they share prefixes of every length), added and
    removed in random order: the distinct blocks and each prompt's new blocks equal those of a
    per-block count of everything in flight."""
    rng = random.Random(seed)
    held, ref, live = InFlightPrompts(), Counter(), []
    for _ in range(300):
        if live and rng.random() < 0.45:
            p = live.pop(rng.randrange(len(live)))
            held.remove(p)
            ref.subtract(p)
            ref = +ref
        else:
            p = chained([rng.randrange(3) for _ in range(rng.randrange(0, 12))])
            assert held.new_blocks(p) == sum(1 for h in p if h not in ref)
            held.add(p)
            ref.update(p)
            live.append(p)
        assert held.num_blocks == len(held) == len(+ref)
    with pytest.raises(KeyError):  # a list never added (equal to one in flight or not)
        held.remove(chained([0, 1, 2, 0, 1]))
