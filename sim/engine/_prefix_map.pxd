# cython: language_level=3
"""The prefix cache's index for the compiled block pool: block hash (int64) -> block id (int32),
an open-addressing hash table with linear probing and backward-shift deletion (no tombstones).

vLLM keeps this index in a Python dict (``vllm/v1/core/block_pool.py: BlockHashToBlockMap``).
A C++ ``unordered_map`` is slower here: it allocates a node per entry and an
erase walks a bucket chain, so on the Mooncake trace (millions of blocks registered and evicted)
a registration or an eviction costs two to three cache misses, more than the Python dict's. Here a
slot is 16 bytes in one flat array, kept at most a quarter full, and most operations touch one
cache line. ``content.block_hashes`` keys a run of blocks with consecutive ints, registered
together and evicted together: consecutive keys get neighbouring slots (``_slot_of``). On the
keys one worker registers in the first 1,000 Mooncake requests a registration probes 2.0 slots
on average (6.5 with groups of 8 slots kept half full, 1.8 with every key spread alone, which
loses the locality).

Slots live in ``PyMem_*`` memory (seen by ``tracemalloc``); the table doubles when it would be
more than a quarter full (at most 4 x 16 bytes per cached block) and never shrinks. It stops
doubling once it has three slots for every entry it can ever hold (``map_create``), so a pool whose
blocks are all cached keeps it at most a third full instead of doubling it once more to an eighth
(66,534 blocks: 4 MB instead of 8 MB per worker, and no rehash of 65,536 entries).

A table of 512 KB or more (``HUGE_FROM`` = 32,768 slots) is mapped on its own, in whole 2 MB
pages at a 2 MB boundary, and asked for transparent huge pages (Linux ``madvise(MADV_HUGEPAGE)``;
elsewhere, or if the mapping fails, it is ``PyMem_Malloc`` memory as the smaller ones). A table is
filled when it is made, so its 4 KB pages would each cost a page fault: on the first 1,000
Mooncake requests the tables of 8 workers were 57 % of the process's 27,000 page faults and most
of its 70 ms of system time with the mapping from 2 MB up, and a quarter of the 14,500 left with
it (the 512 KB and 1 MB tables). A 512 KB table then holds a 2 MB page: at most 1.5 MB more per
worker than its slots. These mappings are reported to ``tracemalloc`` (domain ``HUGE_DOMAIN``)
at their whole size, the huge pages they hold.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define KVROUTE_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define KVROUTE_PREFETCH(p) ((void)0)
    #endif

    #include <stdint.h>
    #include <stddef.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    /* NOTE: Python 3.11's tracemalloc.h declares these without C linkage in a C++ build; the
       asm labels name the C symbols whatever the header says. */
    int kvroute_tracemalloc_track(unsigned int, uintptr_t, size_t) __asm__("PyTraceMalloc_Track");
    int kvroute_tracemalloc_untrack(unsigned int, uintptr_t) __asm__("PyTraceMalloc_Untrack");
    #endif
    #define KVROUTE_HUGE_PAGE ((size_t)2 << 20)
    #define KVROUTE_HUGE_DOMAIN 0x6b76  /* tracemalloc domain of the mapped tables */

    /* The bytes a mapping of `bytes` spans: rounded up to whole 2 MB pages. */
    static size_t kvroute_huge_span(size_t bytes) {
        return (bytes + KVROUTE_HUGE_PAGE - 1) / KVROUTE_HUGE_PAGE * KVROUTE_HUGE_PAGE;
    }

    /* A zeroed mapping of `bytes` rounded up to whole 2 MB pages, at a 2 MB boundary, advised to
       use transparent huge pages; NULL where that is not available (the caller falls back).
       The caller reports it to tracemalloc (kvroute_track_huge). */
    static void* kvroute_map_huge(size_t bytes) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
        size_t size = kvroute_huge_span(bytes);
        size_t span = size + KVROUTE_HUGE_PAGE;
        char* raw = (char*)mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == (char*)MAP_FAILED) return NULL;
        char* start = (char*)(((uintptr_t)raw + KVROUTE_HUGE_PAGE - 1) & ~(uintptr_t)(KVROUTE_HUGE_PAGE - 1));
        if (start > raw) munmap(raw, (size_t)(start - raw));
        if (raw + span > start + size) munmap(start + size, (size_t)(raw + span - (start + size)));
        madvise(start, size, MADV_HUGEPAGE);  /* a hint: refused, the memory still works */
        return start;
    #else
        (void)bytes;
        return NULL;
    #endif
    }

    /* Report `bytes` at `p` (a kvroute_map_huge mapping) to tracemalloc, replacing an earlier report. */
    static void kvroute_track_huge(void* p, size_t bytes) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
        kvroute_tracemalloc_track(KVROUTE_HUGE_DOMAIN, (uintptr_t)p, bytes);
    #else
        (void)p; (void)bytes;
    #endif
    }

    /* Undo kvroute_map_huge(bytes) and its report. */
    static void kvroute_unmap_huge(void* p, size_t bytes) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
        kvroute_tracemalloc_untrack(KVROUTE_HUGE_DOMAIN, (uintptr_t)p);
        munmap(p, kvroute_huge_span(bytes));
    #else
        (void)p; (void)bytes;
    #endif
    }
    """
    void prefetch "KVROUTE_PREFETCH"(const void* p) noexcept nogil  # a hint: no effect on results
    size_t HUGE_PAGE "KVROUTE_HUGE_PAGE"
    size_t huge_span "kvroute_huge_span"(size_t bytes) noexcept
    void* map_huge "kvroute_map_huge"(size_t bytes) noexcept
    void track_huge "kvroute_track_huge"(void* p, size_t bytes) noexcept
    void unmap_huge "kvroute_unmap_huge"(void* p, size_t bytes) noexcept

cdef enum:
    EMPTY = -1  # the value of a free slot (block ids are >= 0)
    MIN_CAPACITY = 1024
    HUGE_FROM = 32768  # slots (512 KB): the smallest table mapped on its own, in one 2 MB page


cdef struct Slot:
    int64_t key
    int32_t value  # a block id, or EMPTY


cdef struct PrefixMap:
    Slot* slots
    bint huge  # slots is a mapping of its own (map_huge), not PyMem_Malloc memory
    uint64_t mask  # capacity - 1 (capacity is a power of 2)
    int shift  # 64 - log2(capacity)
    Py_ssize_t size  # live entries
    Py_ssize_t max_slots  # the table does not double beyond this many slots (map_create)


cdef inline uint64_t _slot_of(const PrefixMap* m, int64_t key) noexcept nogil:
    """The home slot of ``key``: keys that differ only in their low 2 bits share an aligned
    group of 4 slots, one cache line (so the run of consecutive keys of one request's blocks
    sits in a few lines), and groups are spread by Fibonacci hashing of the remaining bits."""
    cdef uint64_t group = (<uint64_t>(key >> 2) * <uint64_t>0x9E3779B97F4A7C15) >> (m.shift + 2)
    return (group << 2) | (<uint64_t>key & 3)


cdef inline void map_prefetch(const PrefixMap* m, int64_t key) noexcept nogil:
    """Start loading ``key``'s home slot into the cache (batch callers prefetch every key of a
    batch first, so that the slots' memory latencies overlap)."""
    prefetch(&m.slots[_slot_of(m, key)])


cdef inline int map_create(PrefixMap* m, Py_ssize_t max_entries) except -1:
    """Empty table of ``MIN_CAPACITY`` slots for at most ``max_entries`` entries: it doubles up
    to the first power of 2 that is at least ``3 * max_entries`` slots."""
    cdef Py_ssize_t limit = MIN_CAPACITY
    while limit < 3 * max_entries:
        limit *= 2
    m.max_slots = limit
    return map_init(m, MIN_CAPACITY)


cdef inline int map_init(PrefixMap* m, Py_ssize_t capacity) except -1:
    """Empty table with ``capacity`` slots (a power of 2, >= 16)."""
    cdef Py_ssize_t i
    cdef int bits = 0
    cdef size_t size = capacity * sizeof(Slot)
    cdef Slot* slots = <Slot*>map_huge(size) if capacity >= HUGE_FROM else NULL
    cdef bint huge = slots != NULL
    if huge:
        track_huge(slots, huge_span(size))  # one huge page holds it whole: the page is resident
    else:
        slots = <Slot*>PyMem_Malloc(size)
    if slots == NULL:
        raise MemoryError()
    for i in range(capacity):
        slots[i].value = EMPTY
    while (<Py_ssize_t>1 << bits) < capacity:
        bits += 1
    _free_slots(m)
    m.slots = slots
    m.huge = huge
    m.mask = capacity - 1
    m.shift = 64 - bits
    m.size = 0
    return 0


cdef inline void _free_slots(PrefixMap* m) noexcept:
    if m.huge:
        unmap_huge(m.slots, (<size_t>m.mask + 1) * sizeof(Slot))
    else:
        PyMem_Free(m.slots)
    m.slots = NULL
    m.huge = False


cdef inline void map_free(PrefixMap* m) noexcept:
    _free_slots(m)
    m.size = 0


cdef inline Py_ssize_t _find(const PrefixMap* m, int64_t key) noexcept nogil:
    """The slot holding ``key``, or -1."""
    cdef uint64_t i = _slot_of(m, key)
    while m.slots[i].value != EMPTY:
        if m.slots[i].key == key:
            return <Py_ssize_t>i
        i = (i + 1) & m.mask
    return -1


cdef inline int32_t map_get(const PrefixMap* m, int64_t key) noexcept nogil:
    """The value stored under ``key``, or EMPTY."""
    cdef Py_ssize_t i = _find(m, key)
    return EMPTY if i < 0 else m.slots[i].value


cdef inline int _grow(PrefixMap* m) except -1:
    cdef PrefixMap old_map = m[0]
    cdef Slot* old = m.slots
    cdef Py_ssize_t n = <Py_ssize_t>m.mask + 1
    cdef Py_ssize_t j, size = m.size
    cdef uint64_t i
    m.slots = NULL
    m.huge = False
    map_init(m, 2 * n)  # on MemoryError the old slots are lost: the pool is unusable anyway
    for j in range(n):
        if old[j].value != EMPTY:
            i = _slot_of(m, old[j].key)
            while m.slots[i].value != EMPTY:
                i = (i + 1) & m.mask
            m.slots[i] = old[j]
    m.size = size
    _free_slots(&old_map)
    return 0


cdef inline int32_t map_setdefault(PrefixMap* m, int64_t key, int32_t value) except? -2:
    """Store ``value`` under ``key`` unless the key is present; the value now stored under it
    (``dict.setdefault``)."""
    cdef uint64_t i
    if 4 * (m.size + 1) > <Py_ssize_t>m.mask + 1 and <Py_ssize_t>m.mask + 1 < m.max_slots:  # a quarter full
        _grow(m)
    i = _slot_of(m, key)
    while m.slots[i].value != EMPTY:
        if m.slots[i].key == key:
            return m.slots[i].value
        i = (i + 1) & m.mask
    m.slots[i].key = key
    m.slots[i].value = value
    m.size += 1
    return value


cdef inline void map_replace(PrefixMap* m, int64_t key, int32_t value) noexcept nogil:
    """Store ``value`` under ``key`` if present."""
    cdef Py_ssize_t i = _find(m, key)
    if i >= 0:
        m.slots[i].value = value


cdef inline void map_erase(PrefixMap* m, int64_t key) noexcept nogil:
    """Remove ``key`` if present; the entries after it in its probe run move back to stay
    reachable (Knuth's algorithm R)."""
    cdef Py_ssize_t found = _find(m, key)
    cdef uint64_t i, j, home
    if found < 0:
        return
    i = j = <uint64_t>found
    while True:
        j = (j + 1) & m.mask
        if m.slots[j].value == EMPTY:
            break
        home = _slot_of(m, m.slots[j].key)
        # the entry at j stays when its home lies cyclically in (i, j]
        if i <= j:
            if i < home and home <= j:
                continue
        elif i < home or home <= j:
            continue
        m.slots[i] = m.slots[j]
        i = j
    m.slots[i].value = EMPTY
    m.size -= 1


cdef inline void map_clear(PrefixMap* m) noexcept nogil:
    cdef uint64_t i
    for i in range(m.mask + 1):
        m.slots[i].value = EMPTY
    m.size = 0
