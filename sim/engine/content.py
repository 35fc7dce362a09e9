"""Token content as segments, and vLLM's chained block hashes over it.

A sequence is a list of segments ``(content_id, start, length)``: ``length`` tokens taken from
position ``start`` of the token stream named ``content_id``. Equal streams at equal positions are
equal tokens, so two sequences share a block exactly when the segment pieces covering that block
are equal; no token ids need to exist. Content ids are non-negative ints: trace ``hash_ids`` as
they are, and ids allocated by the run (``ContentIds``) for new user text and generated output.

Block ``i``'s hash is ``hash((hash of block i-1, pieces of block i))`` with a fixed root, so a
hash names the whole prefix up to its block, as in vLLM (``vllm/v1/core/kv_cache_utils.py:
hash_block_tokens``). Only full blocks get a hash. A run of whole blocks inside one segment is
hashed once: its first block gets the chained hash ``h`` and its block ``m`` the key ``h + m``
(one ``hash()`` per 512-token trace block instead of 32; the keys still identify the prefix).
Every key is a signed 64-bit int, as the compiled block pool stores them: ``hash()`` returns one,
and ``h + m`` wraps around modulo 2**64 when it passes 2**63 - 1 (a run that starts within its
own length of the top of the range: probability about length / 2**64). Python's tuple hash of ints is
deterministic across processes (no string hashing is involved), so the same input gives the
same run.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvroute.traces.inputs import MAX_HASH_ID

Segment = tuple[int, int, int]
"""``(content_id, start, length)``; tokens ``start .. start + length - 1`` of stream ``content_id``."""

ROOT_HASH = 0x6B76726F757465  # parent hash of block 0 (vLLM seeds it with NONE_HASH)
INT64_MAX = (1 << 63) - 1  # every key is in [-2**63, 2**63 - 1]
GENERATED_CONTENT_BASE = MAX_HASH_ID + 1  # run-allocated content ids start here, above any trace id


@dataclass(slots=True)
class ContentIds:
    """Allocator of fresh content ids for one run (no global counter).

    Attributes:
        next_id: the id the next call returns; starts above every trace ``hash_id``.
    """

    next_id: int = GENERATED_CONTENT_BASE

    def new(self) -> int:
        """A content id no other stream of this run uses."""
        value = self.next_id
        self.next_id += 1
        return value


def _wrap64(key: int) -> int:
    """``key`` modulo 2**64, as a signed 64-bit int."""
    return (key + (1 << 63)) % (1 << 64) - (1 << 63)


def num_tokens(segments: list[Segment]) -> int:
    """Total tokens of a segment list."""
    return sum(seg[2] for seg in segments)


def block_hashes(
    segments: list[Segment], block_size: int, known: list[int] | None = None
) -> list[int]:
    """Hashes of every full block of ``segments``.

    Args:
        segments: the sequence, as ``(content_id, start, length)`` triples.
        block_size: tokens per block.
        known: hashes already computed for a prefix of this same sequence (for a chat turn, the
            parent's prompt-plus-output hashes); they are reused, not recomputed.

    Returns:
        ``num_tokens(segments) // block_size`` hashes, the first ``len(known)`` equal to ``known``.
    """
    hashes = list(known) if known else []
    pos = len(hashes) * block_size
    parent = hashes[-1] if hashes else ROOT_HASH
    append = hashes.append
    n = len(segments)
    i = 0
    while i < n and pos >= segments[i][2]:  # skip segments the known blocks cover
        pos -= segments[i][2]
        i += 1
    offset = pos
    pieces: list[int] = []
    need = block_size
    while i < n:
        cid, start, length = segments[i]
        avail = length - offset
        if need == block_size and avail >= block_size:
            # Fast path: a run of whole blocks inside one segment (at the trace's 512-token
            # granularity, 32 engine blocks). The run's first block gets the chained hash; block
            # m of the run gets that hash + m. The key still names the whole prefix (the run's
            # parent, stream and start fix every token up to block m), so equal keys mean equal
            # prefixes exactly when chained hashes would, and the run costs one hash() call.
            full = avail // block_size
            first = hash((parent, cid, start + offset, block_size))
            parent = first + full - 1
            if parent <= INT64_MAX:
                hashes.extend(range(first, first + full))
            else:  # wrap into signed 64 bits (never below: hash() > -2**63)
                hashes.extend(_wrap64(key) for key in range(first, first + full))
                parent = _wrap64(parent)
            offset += full * block_size
            avail -= full * block_size
            if avail == 0:
                i += 1
                offset = 0
                continue
        take = avail if avail < need else need
        pieces.extend((cid, start + offset, take))
        need -= take
        offset += take
        if offset == length:
            i += 1
            offset = 0
        if need == 0:
            parent = hash((parent, *pieces))
            append(parent)
            pieces.clear()
            need = block_size
    return hashes
