"""The prompt blocks a gateway has in flight on one worker, as Dynamo's router counts them.

Dynamo's ``ActiveSequences`` (``lib/llm/src/kv_router/sequence.rs``) keeps every block hash of
the requests in flight on a worker, a block shared by several once (``unique_blocks``); its
decode cost is ``active_blocks`` (their number) plus the ``new_blocks`` a request would add.

Block hashes are chained (a block's hash names its whole prefix, as vLLM's and the router's
are), so the blocks in flight are the union of root-to-leaf paths of a tree, and two prompts
that share a block share every block before it. Hence, with ``lcp(p, q)`` the longest common
prefix of two prompts (found by bisection: equality along a path is a prefix):

- a prompt ``p`` adds ``len(p) - max lcp(p, q)`` distinct blocks over the prompts ``q`` in
  flight, and its removal takes away as many, the max over those that stay;
- its ``new_blocks`` are that same difference.

Only prompts with the same first block can share any, so each is compared with those alone:
the work per request is the number of such prompts times ``log2(len(p))``, not ``len(p)``.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(p: Sequence[int], q: Sequence[int], lo: int = 0) -> int:
    """Blocks the chained hash lists ``p`` and ``q`` share from the start, given that they share
    at least ``lo`` (bisection: chained hashes that agree at position ``i`` agree at every
    position before it)."""
    hi = min(len(p), len(q))
    if hi and p[hi - 1] == q[hi - 1]:  # one a prefix of the other, or equal
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if p[mid - 1] == q[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class InFlightPrompts:
    """The chained block-hash lists of the requests in flight on one worker.

    Attributes:
        num_blocks: distinct blocks among them (Dynamo's ``active_blocks``).
    """

    __slots__ = ("num_blocks", "_by_root")

    def __init__(self) -> None:
        self.num_blocks = 0
        self._by_root: dict[int, list[Sequence[int]]] = {}  # first block hash -> prompts in flight

    def __len__(self) -> int:
        return self.num_blocks

    def depth(self, hashes: Sequence[int]) -> int:
        """Blocks of ``hashes`` from the start that a prompt in flight holds (its longest common
        prefix with any of them)."""
        if not len(hashes):
            return 0
        best, n = 1, len(hashes)  # the prompts compared share the first block
        group = self._by_root.get(hashes[0])
        if not group:
            return 0
        for other in group:
            # only a prompt that shares the block past the best so far can improve on it
            if best < n and best < len(other) and other[best] == hashes[best]:
                best = common_prefix(hashes, other, best + 1)
        return best

    def new_blocks(self, hashes: Sequence[int]) -> int:
        """Blocks ``hashes`` would add to :attr:`num_blocks` (Dynamo's ``new_blocks``)."""
        return len(hashes) - self.depth(hashes)

    def add(self, hashes: Sequence[int]) -> None:
        """A request with prompt blocks ``hashes`` is now in flight (kept by reference: the
        caller must not change the list while it is)."""
        if not len(hashes):
            return
        self.num_blocks += self.new_blocks(hashes)
        self._by_root.setdefault(hashes[0], []).append(hashes)

    def remove(self, hashes: Sequence[int]) -> None:
        """The request added with ``hashes`` (the same object) is no longer in flight.

        Raises:
            KeyError: ``hashes`` was not added.
        """
        if not len(hashes):
            return
        group = self._by_root[hashes[0]]
        at = next((i for i, q in enumerate(group) if q is hashes), None)
        if at is None:
            raise KeyError("these prompt blocks are not in flight")
        group.pop(at)
        self.num_blocks -= self.new_blocks(hashes)
        if not group:
            del self._by_root[hashes[0]]
