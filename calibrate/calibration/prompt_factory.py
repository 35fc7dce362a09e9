"""Token-id prompts for the calibration sweep: unique where asked, so a cold prompt is really cold."""

from __future__ import annotations

import numpy as np


class PromptFactory:
    """Token-id prompts from a seeded generator, unique where asked.

    Every :meth:`unique` prompt starts with a two-token header that encodes a counter, so no two
    unique prompts of one factory share even their first block (a "cold" prompt is really cold);
    the remaining ids are uniform in ``[lo, hi)``.

    Args:
        rng: the numpy Generator to draw from (the caller seeds it).
        lo, hi: token-id range, ``hi - lo >= 2``; keep it inside the tokenizer's ordinary tokens.

    Raises:
        ValueError: on an empty range.
    """

    def __init__(self, rng: np.random.Generator, lo: int = 100, hi: int = 1700) -> None:
        if hi - lo < 2:
            raise ValueError(f"token range [{lo}, {hi}) is too small")
        self.rng, self.lo, self.hi = rng, lo, hi
        self._count = 0

    def unique(self, n: int) -> list[int]:
        """A prompt of ``n`` tokens sharing no block with any other unique prompt of this factory
        (its first two tokens are a header no other prompt has).

        Raises:
            ValueError: ``n < 2`` (one token cannot hold the header) or the factory has used up
                its ``(hi - lo)**2`` headers.
        """
        if n < 2:
            raise ValueError(f"a unique prompt needs at least two tokens (its header), got {n}")
        span = self.hi - self.lo
        if self._count >= span * span:
            raise ValueError("prompt factory exhausted its unique headers")
        head = [self.lo + self._count // span, self.lo + self._count % span]
        self._count += 1
        return head + self.tail(n - 2)

    def tail(self, n: int) -> list[int]:
        """``n`` random token ids (to append to a prefix)."""
        return [int(x) for x in self.rng.integers(self.lo, self.hi, size=n)]
