"""Token-id prompts for a live replay, built from a trace the way the simulator builds content.

The simulator names prompt content by segments ``(content_id, start, length)``
(``kvroute.sim.cluster.workload``): a root prompt is its ``hash_ids`` blocks (content id = hash id), a
later turn is its parent's prompt, the parent's output, then new tokens of its own. Live, every
``(content_id, position)`` becomes one token id through a fixed mixing function, so equal ids
give equal tokens and different ids give (with overwhelming probability) different blocks. A
later turn resends the parent's *actual* prompt ids and the ids the server streamed back, so the
server's prefix cache sees exactly what a real chat would send.

Router block hashes are chained over the real token ids at the server's block size, as vLLM's
are (``vllm/v1/core/kv_cache_utils.py: hash_block_tokens``), so a hash names the whole prefix;
their values differ from the simulator's but their equality pattern is the same, which is all a
routing policy looks at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvroute.sim.engine.content import ROOT_HASH, Segment
from kvroute.sim.cluster.workload import Workload
from kvroute.traces.format import TraceRecord

#: Token-id range used when the model's tokenizer cannot be read: safe for the tiny test model
#: (about 2,000 ordinary ids) and for Qwen-family vocabularies, whose special ids sit far above.
DEFAULT_TOKEN_RANGE = (100, 1700)

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    z = values.copy()
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


@dataclass(frozen=True, slots=True)
class TokenSynth:
    """Deterministic token ids for content positions.

    Args:
        lo: lowest token id used (inclusive).
        hi: highest token id used (exclusive); ``hi - lo >= 2``.
        seed: changes every token; runs with the same seed send the same prompts.

    Raises:
        ValueError: on an empty or one-id range.
    """

    lo: int = DEFAULT_TOKEN_RANGE[0]
    hi: int = DEFAULT_TOKEN_RANGE[1]
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hi - self.lo < 2 or self.lo < 0:
            raise ValueError(f"token id range [{self.lo}, {self.hi}) must hold at least two ids >= 0")

    def tokens(self, content_id: int, start: int, length: int) -> np.ndarray:
        """Token ids of positions ``start .. start + length - 1`` of stream ``content_id``.

        Returns:
            An int64 array of ``max(length, 0)`` ids in ``[lo, hi)``.
        """
        if length <= 0:
            return np.zeros(0, dtype=np.int64)
        with np.errstate(over="ignore"):
            key = _mix(np.array([content_id & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ np.uint64(self.seed * 0x632BE5AB))
            pos = np.arange(start, start + length, dtype=np.uint64)
            z = _mix(key * _GOLDEN + pos * _M2 + np.uint64(1))
        return (z % np.uint64(self.hi - self.lo)).astype(np.int64) + self.lo

    def segments(self, segments: Sequence[Segment]) -> np.ndarray:
        """Token ids of a whole segment list, in order."""
        parts = [self.tokens(cid, start, length) for cid, start, length in segments]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def root_segments(rec: TraceRecord, trace_block_size: int) -> list[Segment]:
    """The prompt segments of a record without a parent, as ``Workload`` builds them.

    Block ``i`` of the prompt is ``(hash_ids[i], 0, trace_block_size)``; the last block is cut
    to make ``input_length`` tokens.

    Raises:
        ValueError: the record has a parent, or no ``hash_ids`` for a non-empty prompt.
    """
    if rec.parent is not None:
        raise ValueError(f"request {rec.request_id} extends request {rec.parent}; it has no root prompt")
    ids = rec.hash_ids or ()
    if not ids and rec.input_length > 0:
        raise ValueError(f"request {rec.request_id} has neither hash_ids nor a parent")
    segments = [(hid, 0, trace_block_size) for hid in ids]
    if segments:
        segments[-1] = (ids[-1], 0, rec.input_length - trace_block_size * (len(ids) - 1))
    return segments


class PromptBuilder:
    """Prompt token ids of every record of a trace, from its content and what servers returned.

    Args:
        workload: the simulator's view of the trace (roots, children, content ids).
        synth: token ids of content positions.
    """

    def __init__(self, workload: Workload, synth: TokenSynth) -> None:
        self.workload = workload
        self.synth = synth

    def root(self, rec: TraceRecord) -> np.ndarray:
        """A root record's prompt ids (``input_length`` of them)."""
        return self.synth.segments(root_segments(rec, self.workload.trace.block_size))

    def child(self, rec: TraceRecord, parent_prompt: np.ndarray, parent_output: Sequence[int]) -> np.ndarray:
        """A later turn's prompt: the parent's prompt ids, the ids the server generated for it,
        then ``input_length - len(parent_prompt) - len(parent_output)`` new ids of this record
        (none when that is not positive; the result is then cut to ``input_length``)."""
        head = np.concatenate([np.asarray(parent_prompt, dtype=np.int64), np.asarray(parent_output, dtype=np.int64)])
        new = rec.input_length - len(head)
        if new <= 0:
            return head[: rec.input_length]
        return np.concatenate([head, self.synth.tokens(self.workload.new_content_id(rec), 0, new)])

    def synthetic_output(self, rec: TraceRecord) -> np.ndarray:
        """Stand-in ids of ``rec``'s reply for a child sent before the reply exists (open loop):
        the simulator's output content stream of ``rec``."""
        return self.synth.tokens(self.workload.output_content_id(rec), 0, rec.output_length)


def chained_block_hashes(token_ids: Sequence[int], block_size: int, known: Sequence[int] = ()) -> list[int]:
    """Chained hashes of every full block of ``token_ids``.

    Block ``i``'s hash is ``hash((hash of block i-1, *token ids of block i))`` from a fixed root,
    so equal hashes mean equal prefixes. Python's hash of a tuple of ints is the same in every
    process.

    Args:
        token_ids: the sequence.
        block_size: tokens per block (> 0).
        known: hashes already computed for a prefix of this same sequence; reused as they are.

    Returns:
        ``len(token_ids) // block_size`` hashes.

    Raises:
        ValueError: if ``block_size`` is not positive.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    hashes = list(known)
    ids = np.asarray(token_ids, dtype=np.int64)
    full = len(ids) // block_size
    parent = hashes[-1] if hashes else ROOT_HASH
    if len(hashes) < full:
        rows = ids[len(hashes) * block_size : full * block_size].reshape(-1, block_size).tolist()
        for row in rows:
            parent = hash((parent, *row))
            hashes.append(parent)
    return hashes[:full]
