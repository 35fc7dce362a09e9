# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
# distutils: language = c++
"""Block hashes of a segment list, compiled: the same keys, in the same order, as the pure-Python
``kvroute.sim.engine.content.block_hashes`` (the reference and fallback; ``kvroute.sim.engine.compiled``
chooses), returned as an ``array("q")`` (signed 64-bit ints, 8 bytes a block) instead of a list
of Python ints.

The compiled block pool and KV-cache manager read such an array's items as C int64s, so the
millions of keys a Mooncake run hashes never become Python objects: a run of whole blocks
inside one segment (32 engine blocks of a 512-token trace block) is written as consecutive
int64s, and a chat turn's known prefix is copied with one ``memcpy``. The ``hash()`` calls are
the pure version's, on tuples of the same Python ints, and ``h + m`` wraps modulo 2**64 as
there (unsigned C arithmetic, cast back to signed).
"""

from cpython.array cimport array, clone, resize
from libc.stdint cimport int64_t, uint64_t

from array import array as py_array

from kvroute.sim.engine.content import ROOT_HASH

cdef array INT64S = py_array("q")


cdef inline int64_t _add_wrapped(int64_t key, Py_ssize_t m) noexcept:
    """``key + m`` modulo 2**64, as a signed 64-bit int."""
    return <int64_t>(<uint64_t>key + <uint64_t>m)


cdef inline int64_t _write_run(int64_t* out, int64_t first, Py_ssize_t count) noexcept:
    """``out[m] = first + m`` (wrapped) for m < count, count >= 1; the last key written."""
    cdef Py_ssize_t m
    for m in range(count):
        out[m] = _add_wrapped(first, m)
    return _add_wrapped(first, count - 1)


def extend_key_run(array hashes not None, int64_t first, Py_ssize_t count) -> int:
    """Append the keys of a run, ``first + m`` for m < ``count`` >= 1 (each wrapped into signed
    64 bits), to the ``array("q")`` ``hashes``, as ``block_hashes`` writes them; the last key.

    Raises:
        TypeError: if ``hashes`` is not an ``array("q")``.
        ValueError: if ``count < 1``.
    """
    if hashes.ob_descr.typecode != b"q":
        raise TypeError(f"hashes must be an array('q'), got typecode {hashes.typecode!r}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    cdef Py_ssize_t n = len(hashes)
    resize(hashes, n + count)
    return _write_run(<int64_t*>hashes.data.as_longlongs + n, first, count)


def block_hashes(segments, Py_ssize_t block_size, known=None) -> array:
    """Hashes of every full block of ``segments`` (``content.block_hashes``), as an
    ``array("q")``.

    Args:
        segments: the sequence, as ``(content_id, start, length)`` triples.
        block_size: tokens per block, > 0.
        known: hashes already computed for a prefix of this same sequence (a list or an
            ``array("q")``, copied with one ``memcpy``); reused, not recomputed.

    Returns:
        ``num_tokens(segments) // block_size`` signed 64-bit keys, the first ``len(known)``
        equal to ``known``.
    """
    cdef array hashes = py_array("q", known) if known else clone(INT64S, 0, False)
    cdef Py_ssize_t count = len(hashes)  # keys written so far
    cdef Py_ssize_t pos = count * block_size
    cdef int64_t parent = <int64_t>hashes.data.as_longlongs[count - 1] if count else <int64_t>ROOT_HASH
    cdef Py_ssize_t n = len(segments)
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t start, length, offset, avail, full, take, need
    cdef int64_t first
    cdef int64_t* data
    cdef object seg, cid
    cdef list pieces = []
    for seg in segments:
        total += <Py_ssize_t>seg[2]
    # room for every key the loop can write; cut to what it wrote at the end
    resize(hashes, count + total // block_size + 1)
    data = <int64_t*>hashes.data.as_longlongs
    while i < n and pos >= <Py_ssize_t>segments[i][2]:  # skip segments the known blocks cover
        pos -= <Py_ssize_t>segments[i][2]
        i += 1
    offset = pos
    need = block_size
    while i < n:
        cid, start, length = segments[i]
        avail = length - offset
        if need == block_size and avail >= block_size:
            # a run of whole blocks inside one segment: one hash(), block m keyed first + m
            full = avail // block_size
            first = hash((parent, cid, start + offset, block_size))
            parent = _write_run(data + count, first, full)
            count += full
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
            data[count] = parent
            count += 1
            pieces.clear()
            need = block_size
    resize(hashes, count)
    return hashes
