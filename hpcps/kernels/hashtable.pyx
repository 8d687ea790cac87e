"""A growable sparse table: open-addressing hash index over a row arena (Cython, ``nogil``).

A *dynamic* table stores only the rows of the keys that occurred. Keys are arbitrary 64-bit
ids: int64 input is taken as is (every value, negatives included), uint64 input is
reinterpreted bitwise (uint64 ``2**64 - 1`` is the key ``-1``); keys come back as int64.

Layout
------
*Row arena*: one record per stored key, in insertion order, each record holding the row's
``dim`` weights and the row's optimizer state right after them, so an update of a row
touches one record (one cache line for ``dim`` 1)::

    offset 0            w        dim x T          (T = float32 or float64)
    offset dim*T        state    sgd: none; adagrad: acc[dim]; ftrl: z[dim], n[dim];
                                 adam: m[dim], v[dim], then step (int64, 8-aligned)
    record size rounded up to a multiple of T's size (of 8 bytes for adam)

The arena grows by 1.5x into a fresh anonymous mapping: the pages past the used rows are
never written, so they cost address space, not resident memory.

*Index*: ``NB`` buckets of 64 bytes (one cache line each, the mapping is page aligned),
each 5 slots: the full keys (uint64 x 5), ``row + 1`` (uint32 x 5; 0 = empty) and a word
holding a mask of the filled slots (they fill in order) and an *overflow* bit. ``h = fmix64(key)``
(MurmurHash3's 64-bit finaliser, a bijection with full avalanche); the home bucket is
``floor(h * NB / 2**64)`` (Lemire's multiply-shift range reduction, so ``NB`` need not be
a power of two). Linear probing by bucket: a probe compares the 5 keys of a bucket
without a branch per slot and goes on to the next bucket only if this one is full and
marked overflowed (an insertion passed it; keys are never removed, so an unmarked or
non-full bucket ends the run). A present key costs one index line (~5 % of keys at load
0.6, 13 % at 0.8 need a second) and never a record; an absent key usually one. Probe
passes compute the home buckets 64 keys ahead and prefetch them. The index grows 1.25x
(all keys re-inserted) when the load (keys / slots) would pass ``max_load`` (0.75): its
load stays in [0.6, 0.75] once it has grown (lower loads probe faster: at 10^6 keys a
lookup pass took 1.50 ms at load 0.55, 1.79 at 0.7, 2.15 at 0.8).

Bytes per stored key: ``record + 12.8 / load``, i.e. record + 17.1 to 21.3 bytes; the
arithmetic minimum is ``8 + dim*T + state`` (key + row + slots, no padding). For
``dim`` 1::

    rule     state            float32 record  float64 record   minimum f32 / f64
    sgd      -                4               8                12 / 16
    adagrad  acc              8               16               16 / 24
    ftrl     z, n             12              24               20 / 32
    adam     m, v, step       24              32               28 / 40

Both live in anonymous private mappings (``mmap``; huge pages asked for from 4 MiB), so
a grown-out buffer returns to the system at once instead of staying in the heap.

Limits: at most ``2**31 - 2`` rows per table.

Key -> server spread
--------------------
:func:`server_of`: ``server(k) = floor(splitmix64(k) * S / 2**64)`` with ``splitmix64(k)``
the first output of SplitMix64 (Steele, Lea & Flood, OOPSLA 2014) seeded with ``k``
(``mix(k + 0x9E3779B97F4A7C15)``, the same mix as ``hpcps.core.tables._splitmix_mix``). A
hash, not a modulo of a key space: consecutive or strided ids (one-hot blocks, low
frequent ids) spread evenly, and the index of each server uses another, independent
mix (fmix64), so a server's keys do not crowd one part of its index.

Updates
-------
:meth:`HashTable.apply` inserts absent keys (their rows start at the table's initial
value), sums the gradient rows of equal keys in input order (never dropping one), then
runs the rule once per distinct row, with exactly the arithmetic of
:mod:`hpcps.kernels.optim` (so a dynamic table gives bitwise the values a fixed table
gives for the same pushes). It runs in two passes, as the fixed table's
``apply_sparse`` after its key -> row step: (1) each key's arena row, by the probe
above (absent keys inserted); (2) the gradient rows summed by row, then every distinct
row stepped in ascending arena order, its record prefetched 32 rows ahead (sparse rows of
an ascending walk are not a stream the hardware prefetcher follows). When the
table has at most ``64 n + 65536`` rows (n: keys in the push) the sums are scattered in
input order into a zeroed (rows, dim) buffer plus a bitmap of the touched rows, both
kept between pushes (``dim * T`` bytes per stored row, as a fixed table of the same rows
keeps); otherwise the rows are merged by ``merge_duplicates`` (a sort).
"""

import math
import mmap

import numpy as np

from hpcps.kernels.optim import merge_duplicates as _merge_duplicates

from libc.math cimport copysign, copysignf, fabs, fabsf, pow, sqrt
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define hpcps_ht_prefetch(p) __builtin_prefetch((const void *)(p))
    #else
    #define hpcps_ht_prefetch(p) ((void)0)
    #endif
    /* floor(h * c / 2**64): Lemire, "Fast random integer generation in an interval",
       ACM TOMACS 29(1), 2019 */
    static inline unsigned long long hpcps_ht_range(unsigned long long h, unsigned long long c) {
        return (unsigned long long)(((unsigned __int128)h * c) >> 64);
    }
    static inline int hpcps_ht_ctz(unsigned int x) { return __builtin_ctz(x); }
    static inline int hpcps_ht_ctz64(unsigned long long x) { return __builtin_ctzll(x); }

    /* An index bucket: one cache line (the index is page aligned). */
    #include <stdint.h>
    #ifdef __SSE2__
    #include <emmintrin.h>
    #endif
    typedef struct {
        uint64_t key[5];      /* the keys of the filled slots (they fill in order) */
        uint32_t row1[5];     /* arena row + 1; 0: empty */
        uint32_t used;        /* bit s: slot s filled (slots fill in order); bit 5 (32): an insertion passed this full bucket */
    } hpcps_ht_bucket;

    /* Bit s set when slot s of B holds key (filled or not): 4 keys by two SSE2 compares
       (a 64-bit lane is equal when both of its 32-bit halves are), the fifth alone. */
    static inline unsigned hpcps_ht_match(const hpcps_ht_bucket* B, uint64_t key) {
    #ifdef __SSE2__
        __m128i k = _mm_set1_epi64x((long long)key);
        __m128i a = _mm_cmpeq_epi32(_mm_load_si128((const __m128i*)B->key), k);
        __m128i c = _mm_cmpeq_epi32(_mm_load_si128((const __m128i*)(B->key + 2)), k);
        a = _mm_and_si128(a, _mm_shuffle_epi32(a, 0xB1));
        c = _mm_and_si128(c, _mm_shuffle_epi32(c, 0xB1));
        return (unsigned)_mm_movemask_pd(_mm_castsi128_pd(a))
               | ((unsigned)_mm_movemask_pd(_mm_castsi128_pd(c)) << 2)
               | ((unsigned)(B->key[4] == key) << 4);
    #else
        return (unsigned)(B->key[0] == key) | ((unsigned)(B->key[1] == key) << 1)
               | ((unsigned)(B->key[2] == key) << 2) | ((unsigned)(B->key[3] == key) << 3)
               | ((unsigned)(B->key[4] == key) << 4);
    #endif
    }

    /* The row + 1 slot holding key, NULL if absent: linear probing by bucket from bucket
       b; a bucket not marked overflowed ends the run (keys are never removed). */
    static inline const uint32_t* hpcps_ht_find(const hpcps_ht_bucket* ix, uint64_t NB,
                                                uint64_t key, uint64_t b) {
        for (;;) {
            const hpcps_ht_bucket* B = ix + b;
            uint32_t used = B->used;
            unsigned hit = hpcps_ht_match(B, key) & used;   /* bits 0-4: the filled slots */
            if (hit)
                return &B->row1[__builtin_ctz(hit)];
            if (!(used & 32))
                return (const uint32_t*)0;
            if (++b == NB)
                b = 0;
        }
    }
    """
    void hpcps_ht_prefetch(const void* p) noexcept nogil
    uint64_t hpcps_ht_range(uint64_t h, uint64_t c) noexcept nogil
    int hpcps_ht_ctz(unsigned int x) noexcept nogil
    int hpcps_ht_ctz64(uint64_t x) noexcept nogil
    ctypedef struct hpcps_ht_bucket:
        uint64_t key[5]
        uint32_t row1[5]
        uint32_t used
    const uint32_t* hpcps_ht_find(const hpcps_ht_bucket* ix, uint64_t NB, uint64_t key,
                                  uint64_t b) noexcept nogil

__all__ = ["HashTable", "server_of", "table_hash", "record_layout", "RULES", "MAX_LOAD_DEFAULT",
           "INDEX_GROWTH", "INDEX_SLOT_BYTES"]

#: Update rules of :meth:`HashTable.apply` (those of :mod:`hpcps.kernels.optim`).
RULES = ("sgd", "adagrad", "adam", "ftrl")

cdef enum:
    _R_SGD = 0
    _R_ADAGRAD = 1
    _R_ADAM = 2
    _R_FTRL = 3
    _RING = 128             # home buckets computed ahead (a power of two > _AHEAD_INDEX)
    _BUCKET = 5             # slots per index bucket (5 keys + 5 rows + count = 64 bytes)
    _OVERFLOW = 32          # _Bucket.used: an insertion passed this full bucket
    _AHEAD_SCATTER = 48     # keys ahead whose scatter target is prefetched (16: 7-11 % slower)
    _AHEAD_STEP = 32        # rows ahead whose record is prefetched (scatter path)

cdef Py_ssize_t _AHEAD_INDEX = 64       # keys ahead whose home bucket is prefetched
cdef Py_ssize_t _AHEAD_UPDATE = 8       # rows ahead whose record is prefetched (merge path)


_RULE_CODES = {"sgd": _R_SGD, "adagrad": _R_ADAGRAD, "adam": _R_ADAM, "ftrl": _R_FTRL}

cdef uint64_t _GOLDEN = 0x9E3779B97F4A7C15ULL
cdef uint64_t _MAX_ROWS = 0x7FFFFFFEULL           # row + 1 and u + 1 must fit 31 bits
#: Default index load (stored keys / slots) at which the index grows.
MAX_LOAD_DEFAULT = 0.75
#: Index growth factor: the load stays in [0.75 / 1.25, 0.75] = [0.6, 0.75] once grown.
INDEX_GROWTH = 1.25
#: Index bytes per slot (a 64-byte bucket holds 5).
INDEX_SLOT_BYTES = 12.8
_HUGE_MIN = 4 << 20         # mappings from this size ask for transparent huge pages
_ARENA_GROWTH = 1.5
_BUCKET_BYTES = 64
# apply: duplicates summed by a scatter into a (rows, dim) buffer plus a bitmap when the
# table has at most _SCATTER_ROWS_PER_KEY * n + _SCATTER_SLACK rows and the buffer takes at
# most _SCATTER_MAX_BYTES (as hpcps.kernels.optim.apply_sparse); otherwise merged by a sort
_SCATTER_ROWS_PER_KEY = 64
_SCATTER_SLACK = 1 << 16
_SCATTER_MAX_BYTES = 1 << 30


# --------------------------------------------------------------------------------------
# Hashes
# --------------------------------------------------------------------------------------

cdef inline uint64_t _fmix64(uint64_t k) noexcept nogil:
    """MurmurHash3's 64-bit finaliser (Appleby): a bijection of uint64, full avalanche."""
    k ^= k >> 33
    k *= 0xFF51AFD7ED558CCDULL
    k ^= k >> 33
    k *= 0xC4CEB9FE1A85EC53ULL
    k ^= k >> 33
    return k


cdef inline uint64_t _splitmix64(uint64_t k) noexcept nogil:
    """The first output of SplitMix64 seeded with ``k`` (Steele, Lea & Flood 2014)."""
    cdef uint64_t z = k + _GOLDEN
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


def _key_vector(keys, name="keys"):
    """``keys`` as a C-contiguous int64 1-D array; uint64 is reinterpreted bitwise."""
    a = np.asarray(keys)
    if a.ndim != 1:
        a = a.reshape(-1) if a.ndim == 0 else a
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype == np.uint64:
        return np.ascontiguousarray(a).view(np.int64)
    if a.dtype != np.int64:
        if a.size == 0:
            return np.empty(0, dtype=np.int64)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype (int64 or uint64), got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def server_of(keys, n_servers):
    """The server of each key of a dynamic table: ``floor(splitmix64(k) * S / 2**64)``.

    Parameters
    ----------
    keys : int64 or uint64 array-like (n,)
        Any 64-bit ids (uint64 reinterpreted bitwise as int64).
    n_servers : int
        ``S`` >= 1.

    Returns
    -------
    ndarray of int64, shape (n,)
        Values in ``[0, S)``; depends only on the key and ``S``.

    Raises
    ------
    ValueError
        If ``n_servers`` < 1 or ``keys`` is not 1-D.
    TypeError
        For non-integer keys.
    """
    cdef int64_t s = int(n_servers)
    if s < 1:
        raise ValueError(f"n_servers must be >= 1, got {n_servers}")
    k = _key_vector(keys)
    out = np.empty(k.shape[0], dtype=np.int64)
    cdef const int64_t[::1] kv = k
    cdef int64_t[::1] ov = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(kv.shape[0]):
            ov[i] = <int64_t>hpcps_ht_range(_splitmix64(<uint64_t>kv[i]), <uint64_t>s)
    return out


def table_hash(keys):
    """``fmix64`` of each key (uint64 (n,)): the hash a server's index places keys by."""
    k = _key_vector(keys)
    out = np.empty(k.shape[0], dtype=np.uint64)
    cdef const int64_t[::1] kv = k
    cdef uint64_t[::1] ov = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(kv.shape[0]):
            ov[i] = _fmix64(<uint64_t>kv[i])
    return out


# --------------------------------------------------------------------------------------
# Record layout
# --------------------------------------------------------------------------------------

def record_layout(rule, dim, dtype):
    """The arena record of a table: ``(numpy dtype, minimum bytes)``.

    Parameters
    ----------
    rule : {"sgd", "adagrad", "adam", "ftrl"}
    dim : int (>= 1)
    dtype : float32 or float64

    Returns
    -------
    record : numpy.dtype
        Fields ``w`` (T, (dim,)) and the state fields of the rule (``accumulator``; ``m``,
        ``v``, ``step``; ``z``, ``n``) at the offsets in the module docstring; itemsize a
        multiple of T's size (of 8 for Adam). The key is not in the record: the index
        slot holds it.
    minimum : int
        Bytes of key + row + state without padding (the arithmetic minimum per key).

    Raises
    ------
    ValueError, TypeError
        For an unknown rule, ``dim`` < 1 or another dtype.
    """
    if rule not in _RULE_CODES:
        raise ValueError(f"unknown optimizer {rule!r}; valid: {', '.join(map(repr, RULES))}")
    dt = np.dtype(dtype)
    if dt != np.float32 and dt != np.float64:
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    dt = dt.newbyteorder("=")
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    t = dt.itemsize
    names, formats, offsets = ["w"], [(dt, (dim,))], [0]
    end = dim * t
    minimum = 8 + end
    slot_fields = {"sgd": (), "adagrad": ("accumulator",), "ftrl": ("z", "n"),
                   "adam": ("m", "v")}[rule]
    for name in slot_fields:
        names.append(name)
        formats.append((dt, (dim,)))
        offsets.append(end)
        end += dim * t
        minimum += dim * t
    if rule == "adam":
        end = (end + 7) // 8 * 8
        names.append("step")
        formats.append(np.int64)
        offsets.append(end)
        end += 8
        minimum += 8
    align = 8 if rule == "adam" else t
    itemsize = (end + align - 1) // align * align
    rec = np.dtype({"names": names, "formats": formats, "offsets": offsets,
                    "itemsize": itemsize})
    return rec, minimum


# --------------------------------------------------------------------------------------
# Update rules on one row (the arithmetic of hpcps.kernels.optim, operation for operation)
# --------------------------------------------------------------------------------------

ctypedef struct _Hyper:
    int rule
    double lr
    double l2
    double scale
    double eps
    double beta1
    double beta2
    double beta
    double lambda1
    double lambda2


ctypedef fused floating:
    float
    double


cdef inline void _sgd_row(floating* w, const floating* grad, Py_ssize_t dim, floating lr,
                          floating l2, floating scale) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating g
    for j in range(dim):
        g = scale * grad[j] + l2 * w[j]
        w[j] = w[j] - lr * g


cdef inline void _adagrad_row(floating* w, floating* acc, const floating* grad, Py_ssize_t dim,
                              floating lr, floating l2, floating scale,
                              floating eps) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating g, a
    for j in range(dim):
        g = scale * grad[j] + l2 * w[j]
        a = acc[j] + g * g
        acc[j] = a
        w[j] = w[j] - lr * g / (<floating>sqrt(a) + eps)


cdef inline void _adam_row(floating* w, floating* m, floating* v, const floating* grad,
                           Py_ssize_t dim, floating lr, floating l2, floating scale,
                           floating b1, floating b2, floating eps, floating bc1,
                           floating bc2) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating g, mj, vj
    cdef floating c1 = 1 - b1, c2 = 1 - b2
    for j in range(dim):
        g = scale * grad[j] + l2 * w[j]
        mj = b1 * m[j] + c1 * g
        vj = b2 * v[j] + c2 * (g * g)
        m[j] = mj
        v[j] = vj
        w[j] = w[j] - lr * (mj / bc1) / (<floating>sqrt(vj / bc2) + eps)


cdef inline void _ftrl_row(floating* w, floating* z, floating* n, const floating* grad,
                           Py_ssize_t dim, floating alpha, floating beta, floating l1,
                           floating l2p, floating l2, floating scale) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating g, nj, nn, sn, sigma, zj, d, a
    for j in range(dim):
        g = scale * grad[j] + l2 * w[j]
        nj = n[j]
        nn = nj + g * g
        sn = <floating>sqrt(nn)
        sigma = (sn - <floating>sqrt(nj)) / alpha
        zj = z[j] + g - sigma * w[j]
        z[j] = zj
        n[j] = nn
        if floating is float:
            a = fabsf(zj) - l1
        else:
            a = fabs(zj) - l1
        a = a if a > 0 else 0
        d = (beta + sn) / alpha + l2p
        if d > 0:
            if floating is float:
                w[j] = copysignf(a, -zj) / d + <floating>0
            else:
                w[j] = copysign(a, -zj) / d + <floating>0
        else:
            w[j] = 0


ctypedef hpcps_ht_bucket _Bucket     # (defined in C above: 64 bytes)


cdef inline uint64_t _home(uint64_t key, uint64_t NB) noexcept nogil:
    """The home bucket of ``key`` in an index of ``NB`` buckets."""
    return hpcps_ht_range(_fmix64(key), NB)


cdef inline uint64_t _put(_Bucket* ix, uint64_t NB, uint64_t key, uint64_t b,
                          uint32_t row1) noexcept nogil:
    """Store ``key`` (absent) with ``row1`` in the first bucket from ``b`` with an empty
    slot, marking each full bucket passed with ``_OVERFLOW`` (the index is never full);
    returns its slot ``(bucket << 3) | slot``."""
    cdef _Bucket* B
    cdef uint32_t s
    while True:
        B = ix + b
        s = <uint32_t>hpcps_ht_ctz(~B.used)
        if s < _BUCKET:
            B.key[s] = key
            B.row1[s] = row1
            B.used |= (<uint32_t>1) << s
            return (b << 3) | s
        B.used |= _OVERFLOW
        b += 1
        if b == NB:
            b = 0


ctypedef struct _Tab:
    _Bucket* index
    uint64_t NB
    char* arena
    Py_ssize_t rec
    Py_ssize_t size
    Py_ssize_t grow_at
    Py_ssize_t rows_cap


cdef Py_ssize_t _rows_pass(_Tab* t, const int64_t* keys, Py_ssize_t n, Py_ssize_t start,
                           int64_t* rows, const char* tmpl, int64_t* newkeys,
                           Py_ssize_t before) noexcept nogil:
    """Insert-or-find: ``rows[i]`` = arena row of ``keys[i]`` for i in ``[start, n)``.

    The home buckets of the keys ``_AHEAD_INDEX`` ahead are computed into a ring and
    prefetched, so a probe usually finds its bucket's line in cache; a probe compares the
    full keys held by the slots (``hpcps_ht_find``; a new key: :func:`_put`) and never reads
    a record. A new row is written from ``tmpl`` (``NULL``: left as is) and its key to ``newkeys[row - before]``
    (``NULL``: not kept). Returns the i at which it stopped because the index or the arena
    is full (n when done)."""
    cdef Py_ssize_t i, rec = t.rec, ahead = _AHEAD_INDEX
    cdef uint64_t k, q, NB = t.NB
    cdef _Bucket* ix = t.index
    cdef const uint32_t* f
    cdef uint64_t ring[_RING]
    cdef int64_t r
    for i in range(start, min(start + ahead, n)):
        q = _home(<uint64_t>keys[i], NB)
        ring[i & (_RING - 1)] = q
        hpcps_ht_prefetch(ix + q)
    for i in range(start, n):
        if i + ahead < n:
            q = _home(<uint64_t>keys[i + ahead], NB)
            ring[(i + ahead) & (_RING - 1)] = q
            hpcps_ht_prefetch(ix + q)
        k = <uint64_t>keys[i]
        f = hpcps_ht_find(ix, NB, k, ring[i & (_RING - 1)])
        if f != NULL:
            r = <int64_t>f[0] - 1
        else:
            if t.size >= t.grow_at or t.size >= t.rows_cap:
                return i
            r = t.size
            if tmpl != NULL:
                memcpy(t.arena + r * rec, tmpl, rec)
            if newkeys != NULL:
                newkeys[r - before] = <int64_t>k
            _put(ix, NB, k, ring[i & (_RING - 1)], <uint32_t>(r + 1))
            t.size += 1
        rows[i] = r
    return n


cdef inline void _step_row(char* r, const floating* g, Py_ssize_t soff, Py_ssize_t step_off,
                           Py_ssize_t dim, const _Hyper* hp) noexcept nogil:
    """Run rule ``hp.rule`` on the record at ``r`` with the summed gradient ``g``."""
    cdef floating* w = <floating*>r
    cdef floating* s = <floating*>(r + soff)
    cdef int64_t t
    if hp.rule == _R_SGD:
        _sgd_row(w, g, dim, <floating>hp.lr, <floating>hp.l2, <floating>hp.scale)
    elif hp.rule == _R_ADAGRAD:
        _adagrad_row(w, s, g, dim, <floating>hp.lr, <floating>hp.l2, <floating>hp.scale,
                     <floating>hp.eps)
    elif hp.rule == _R_FTRL:
        _ftrl_row(w, s, s + dim, g, dim, <floating>hp.lr, <floating>hp.beta,
                  <floating>hp.lambda1, <floating>hp.lambda2, <floating>hp.l2,
                  <floating>hp.scale)
    else:
        t = (<int64_t*>(r + step_off))[0] + 1
        (<int64_t*>(r + step_off))[0] = t
        # 1 - beta**t in double, as optim's table/_bias_correction give it (bitwise)
        _adam_row(w, s, s + dim, g, dim, <floating>hp.lr, <floating>hp.l2,
                  <floating>hp.scale, <floating>hp.beta1, <floating>hp.beta2,
                  <floating>hp.eps, <floating>(1.0 - pow(hp.beta1, <double>t)),
                  <floating>(1.0 - pow(hp.beta2, <double>t)))


cdef inline void _prefetch_record(const char* r, Py_ssize_t rec) noexcept nogil:
    """Prefetch every cache line of the record at ``r`` (``rec`` bytes)."""
    cdef Py_ssize_t j = 0
    hpcps_ht_prefetch(r)
    j = 64 - (<Py_ssize_t>r & 63)
    while j < rec:
        hpcps_ht_prefetch(r + j)
        j += 64


cdef Py_ssize_t _scatter_update(char* arena, Py_ssize_t rec, Py_ssize_t soff,
                                Py_ssize_t step_off, Py_ssize_t dim, const int64_t* rows,
                                const floating* grads, Py_ssize_t n, floating* buf,
                                uint64_t* bitmap, Py_ssize_t nwords, int64_t* urows,
                                const _Hyper* hp) noexcept nogil:
    """Sum the gradient rows of equal rows into ``buf[row]`` (zero on entry, +0.0 plus the
    rows in input order, as ``merge_duplicates``), mark them in ``bitmap``, list the
    marked rows in ascending arena order (clearing ``bitmap``), then step them in that
    order, prefetching the record and sum ``_AHEAD_STEP`` rows ahead, and clear ``buf``
    for the next push. ``urows`` gets the rows
    stepped; returns their number."""
    cdef Py_ssize_t i, j, wi, u, m = 0
    cdef int64_t r
    cdef uint64_t word
    cdef floating* o
    cdef const floating* g
    for i in range(n):
        if i + _AHEAD_SCATTER < n:
            r = rows[i + _AHEAD_SCATTER]
            hpcps_ht_prefetch(buf + r * dim)
            hpcps_ht_prefetch(bitmap + (r >> 6))
        r = rows[i]
        bitmap[r >> 6] |= (<uint64_t>1) << (r & 63)
        if dim == 1:
            buf[r] += grads[i]
        else:
            o = buf + r * dim
            g = grads + i * dim
            for j in range(dim):
                o[j] += g[j]
    for wi in range(nwords):                  # the touched rows, ascending
        word = bitmap[wi]
        if word == 0:
            continue
        bitmap[wi] = 0
        while word:
            urows[m] = (<int64_t>wi << 6) + hpcps_ht_ctz64(word)
            word &= word - 1
            m += 1
    for u in range(m):                        # records prefetched _AHEAD_STEP rows ahead
        if u + _AHEAD_STEP < m:
            r = urows[u + _AHEAD_STEP]
            _prefetch_record(arena + r * rec, rec)
            hpcps_ht_prefetch(buf + r * dim)
        r = urows[u]
        o = buf + r * dim
        _step_row(arena + r * rec, o, soff, step_off, dim, hp)
        if dim == 1:
            o[0] = 0
        else:
            for j in range(dim):
                o[j] = 0
    return m


cdef void _update_rows(char* arena, Py_ssize_t rec, Py_ssize_t soff,
                       Py_ssize_t step_off, Py_ssize_t dim, const int64_t* urows,
                       Py_ssize_t m, const floating* summed, const _Hyper* hp) noexcept nogil:
    """Step the records ``urows[u]`` (distinct) with gradient ``summed[u]``, prefetching
    the record ``_AHEAD_UPDATE`` rows ahead."""
    cdef Py_ssize_t u, j, ahead = _AHEAD_UPDATE
    cdef char* r
    for u in range(m):
        if u + ahead < m:
            r = arena + urows[u + ahead] * rec
            hpcps_ht_prefetch(r)
            j = 64
            while j < rec:
                hpcps_ht_prefetch(r + j)
                j += 64
        _step_row(arena + urows[u] * rec, summed + u * dim, soff, step_off, dim, hp)


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

def _anonymous(Py_ssize_t nbytes):
    """A zero-filled uint8 array of ``nbytes`` in its own anonymous mapping: its pages cost
    memory only once written, and all of it returns to the system when the array is
    dropped (a heap block of ``malloc`` may stay resident after ``free``)."""
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= _HUGE_MIN and hasattr(mmap, "MADV_HUGEPAGE"):
        try:        # random probes: 2 MiB pages spare a TLB miss per access (numpy does so too)
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(m, dtype=np.uint8)[:nbytes]


def _finite(x, name):
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def set_prefetch(index_ahead=None, update_ahead=None):
    """Set how many keys ahead a probe pass prefetches the home bucket (default 64, at
    most 127) and how many rows ahead the merge path's update prefetches the record
    (default 8); returns the previous ``(index, update)``. The weights do not depend on
    them. For benchmarks.

    Raises
    ------
    ValueError
        For a distance below 1 or above its bound (127, 1024).
    """
    global _AHEAD_INDEX, _AHEAD_UPDATE
    old = (int(_AHEAD_INDEX), int(_AHEAD_UPDATE))
    for v, hi in ((index_ahead, _RING - 1), (update_ahead, 1024)):
        if v is not None and not 1 <= int(v) <= hi:
            raise ValueError(f"prefetch distance must be in [1, {hi}], got {v}")
    if index_ahead is not None:
        _AHEAD_INDEX = int(index_ahead)
    if update_ahead is not None:
        _AHEAD_UPDATE = int(update_ahead)
    return old


cdef class HashTable:
    """A dynamic sparse table: rows of ``dim`` values for the keys that occurred.

    Parameters
    ----------
    dim : int
        Values per row (>= 1).
    dtype : float32 or float64, default float64
    rule : {"sgd", "adagrad", "adam", "ftrl"}, default "sgd"
        The update rule of :meth:`apply`; fixes the record layout (:func:`record_layout`).
    lr : float
        Learning rate (FTRL's alpha, > 0).
    l2, eps, beta1, beta2, beta, lambda1, lambda2 : float
        As :func:`hpcps.kernels.optim.apply_sparse` (``l2`` lazy, added to the gradient).
    initial_accumulator : float, default 0.0
        AdaGrad's starting sum of squared gradients of a new row (>= 0).
    init : callable or None
        ``init(keys) -> ndarray (n, dim)`` of the table's dtype: the initial weights of the
        rows of ``keys`` (int64 (n,)), e.g. ``TableSpec.initial_rows`` with the job seed;
        ``None``: zeros. Called for the new rows of a push and for the absent keys of a
        gather; must depend only on the key. FTRL's new rows get the ``z`` whose closed
        form is their weight, as ``hpcps.core.optim.Optimizer.init_slots`` does.
    capacity : int, default 0
        Keys to make room for up front (the table grows anyway).
    max_load : float, default 0.75
        Index load (stored keys / slots) at which the index grows 1.25x, in (0, 0.95].

    Raises
    ------
    ValueError, TypeError
        For a bad rule, dim, dtype or hyper-parameter (the message names it).

    Notes
    -----
    Not thread-safe: one thread at a time (the server's loop) may use a table.
    """

    cdef readonly Py_ssize_t dim
    cdef readonly Py_ssize_t size
    cdef readonly object dtype
    cdef readonly str rule
    cdef readonly Py_ssize_t record_bytes
    cdef readonly Py_ssize_t min_record_bytes
    cdef readonly object record_dtype
    cdef readonly double max_load
    cdef readonly double initial_accumulator
    cdef object init
    cdef _Hyper hp
    cdef Py_ssize_t soff, step_off
    cdef object _index        # uint8 (NB * 64,): the buckets
    cdef object _arena        # uint8 (rows_cap * record_bytes,)
    cdef _Bucket* index
    cdef uint64_t NB          # buckets (slots: NB * _BUCKET)
    cdef Py_ssize_t grow_at
    cdef char* arena
    cdef Py_ssize_t rows_cap
    cdef object _scratch      # apply's buffers: rows, distinct rows, new keys
    cdef object _sbuf         # apply's scatter buffer (rows_cap * dim) and bitmap, kept zero
    cdef Py_ssize_t _last_m   # distinct rows the last apply stepped (last_rows)
    cdef object _template     # one record holding a new row's state (w zero)

    def __init__(self, dim, dtype="float64", rule="sgd", *, lr=0.01, l2=0.0, eps=1e-8,
                 beta1=0.9, beta2=0.999, beta=1.0, lambda1=0.0, lambda2=0.0,
                 initial_accumulator=0.0, init=None, capacity=0, max_load=MAX_LOAD_DEFAULT):
        rec, minimum = record_layout(rule, dim, dtype)
        self.record_dtype = rec
        self.record_bytes = rec.itemsize
        self.min_record_bytes = minimum
        self.dim = int(dim)
        self.dtype = rec.fields["w"][0].base
        self.rule = rule
        self.soff = self.dim * self.dtype.itemsize
        self.step_off = rec.fields["step"][1] if rule == "adam" else 0
        self.hp.rule = _RULE_CODES[rule]
        self.hp.lr = _finite(lr, "lr")
        if rule == "ftrl" and not self.hp.lr > 0:
            raise ValueError(f"alpha (learning rate) must be > 0, got {self.hp.lr}")
        self.hp.l2 = _finite(l2, "l2")
        self.hp.scale = 1.0
        self.hp.eps = _finite(eps, "eps")
        if rule in ("adagrad", "adam") and not self.hp.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.hp.eps}")
        self.hp.beta1 = _finite(beta1, "beta1")
        self.hp.beta2 = _finite(beta2, "beta2")
        if rule == "adam" and not (0 <= self.hp.beta1 < 1 and 0 <= self.hp.beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {beta1}, {beta2}")
        self.hp.beta = _finite(beta, "beta")
        self.hp.lambda1 = _finite(lambda1, "lambda1")
        self.hp.lambda2 = _finite(lambda2, "lambda2")
        if rule == "ftrl" and min(self.hp.beta, self.hp.lambda1, self.hp.lambda2) < 0:
            raise ValueError("beta, lambda1 and lambda2 must be >= 0")
        self.initial_accumulator = _finite(initial_accumulator, "initial_accumulator")
        if self.initial_accumulator < 0:
            raise ValueError(f"initial_accumulator must be >= 0, got {initial_accumulator}")
        ml = float(max_load)
        if not 0 < ml <= 0.95:
            raise ValueError(f"max_load must be in (0, 0.95], got {max_load}")
        self.max_load = ml
        if init is not None and not callable(init):
            raise TypeError(f"init must be callable or None, got {type(init).__name__}")
        self.init = init
        tmpl = np.zeros(1, dtype=rec)
        if rule == "adagrad":
            tmpl["accumulator"] = self.initial_accumulator
        self._template = tmpl.view(np.uint8)
        self.size = 0
        self.rows_cap = 0
        self._arena = None
        self.arena = NULL
        self._index = None
        self.index = NULL
        self.NB = 0
        self._scratch = None
        self._sbuf = None
        self._last_m = 0
        cap = int(capacity)
        if cap < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._new_index(max(16, int(math.ceil(cap / ml)) + 1))
        self._grow_arena(max(cap, 16))

    # ---------------------------------------------------------------- storage growth

    def _new_index(self, Py_ssize_t slots):
        """Replace the index by one of at least ``slots`` slots (whole buckets) holding
        every stored key."""
        cdef Py_ssize_t i, j
        cdef uint64_t NB = (slots + _BUCKET - 1) // _BUCKET, oldNB = self.NB
        idx = _anonymous(NB * _BUCKET_BYTES)     # zero pages: all empty; page aligned
        cdef uint8_t[::1] iv = idx
        cdef _Bucket* ip = <_Bucket*>&iv[0]
        cdef _Bucket* old = self.index
        with nogil:
            for i in range(<Py_ssize_t>oldNB):
                for j in range(hpcps_ht_ctz(~(old[i].used & 31))):
                    _put(ip, NB, old[i].key[j], _home(old[i].key[j], NB), old[i].row1[j])
        self._index = idx
        self.index = ip
        self.NB = NB
        slots = NB * _BUCKET
        self.grow_at = min(<Py_ssize_t>(self.max_load * slots), slots - 1)

    def _grow_arena(self, Py_ssize_t rows):
        """Make room for ``rows`` records (copying the stored ones)."""
        if rows <= self.rows_cap:
            return
        if <uint64_t>rows > _MAX_ROWS:
            rows = <Py_ssize_t>_MAX_ROWS
            if rows <= self.rows_cap:
                raise ValueError(f"a dynamic table holds at most {int(_MAX_ROWS):,} keys "
                                 f"per server")
        buf = _anonymous(rows * self.record_bytes)      # pages are backed when written
        if self.size:
            buf[:self.size * self.record_bytes] = self._arena[:self.size * self.record_bytes]
        cdef uint8_t[::1] bv = buf
        self._arena = buf
        self.arena = <char*>&bv[0]
        self.rows_cap = rows

    def _make_room(self):
        """Grow the index and/or the arena so that one more key fits."""
        if self.size >= self.grow_at:
            self._new_index(max(int(self.NB * _BUCKET * INDEX_GROWTH),
                                int((self.size + 2) / self.max_load) + 1))
        if self.size >= self.rows_cap:
            self._grow_arena(max(int(self.rows_cap * _ARENA_GROWTH), self.size + 1))

    # ---------------------------------------------------------------- probing

    cdef Py_ssize_t _lookup_loop(self, const int64_t* keys, Py_ssize_t n,
                                 int64_t* rows) noexcept nogil:
        """rows[i] = row of keys[i] or -1 (home buckets prefetched ahead); returns the
        number absent."""
        cdef Py_ssize_t i, absent = 0, ahead = _AHEAD_INDEX
        cdef uint64_t q, NB = self.NB
        cdef const uint32_t* f
        cdef uint64_t ring[_RING]
        for i in range(min(ahead, n)):
            q = _home(<uint64_t>keys[i], NB)
            ring[i & (_RING - 1)] = q
            hpcps_ht_prefetch(self.index + q)
        for i in range(n):
            if i + ahead < n:
                q = _home(<uint64_t>keys[i + ahead], NB)
                ring[(i + ahead) & (_RING - 1)] = q
                hpcps_ht_prefetch(self.index + q)
            f = hpcps_ht_find(self.index, NB, <uint64_t>keys[i], ring[i & (_RING - 1)])
            rows[i] = -1 if f == NULL else <int64_t>f[0] - 1
            if rows[i] < 0:
                absent += 1
        return absent

    # ---------------------------------------------------------------- public API

    def __len__(self):
        return self.size

    @property
    def index_slots(self):
        """Slots of the index (its load is ``len(self) / index_slots``)."""
        return int(self.NB) * _BUCKET

    @property
    def nbytes(self):
        """Bytes of the index (64 per bucket of 5 slots) plus the used arena records
        (resident memory of the data)."""
        return int(self.NB) * _BUCKET_BYTES + self.size * self.record_bytes

    def lookup(self, keys):
        """Arena row of each key, -1 for an absent key (nothing inserted).

        Parameters
        ----------
        keys : int64 or uint64 array-like (n,)

        Returns
        -------
        ndarray of int64, shape (n,)
        """
        k = _key_vector(keys)
        rows = np.empty(k.shape[0], dtype=np.int64)
        cdef const int64_t[::1] kv = k
        cdef int64_t[::1] rv = rows
        if k.shape[0]:
            with nogil:
                self._lookup_loop(&kv[0], kv.shape[0], &rv[0])
        return rows

    def insert(self, keys):
        """Insert the absent keys (their rows at the initial value) and return every key's
        arena row (insert-or-find; duplicates get the same row).

        Parameters
        ----------
        keys : int64 or uint64 array-like (n,)

        Returns
        -------
        ndarray of int64, shape (n,)

        Raises
        ------
        ValueError
            If the table would exceed ``2**31 - 2`` keys (the keys inserted so far stay).
        """
        k = _key_vector(keys)
        rows = np.empty(k.shape[0], dtype=np.int64)
        cdef Py_ssize_t i = 0, n = k.shape[0], before = self.size
        if n == 0:
            return rows
        newkeys = np.empty(n if self.init is not None else 1, dtype=np.int64)
        cdef const int64_t[::1] kv = k
        cdef int64_t[::1] rv = rows
        cdef int64_t[::1] nv = newkeys
        cdef int64_t* nk = &nv[0] if self.init is not None else NULL
        cdef uint8_t[::1] tv = self._template
        cdef const char* tmpl = <const char*>&tv[0]
        cdef _Tab t
        try:
            while i < n:
                self._fill(&t)
                with nogil:
                    i = _rows_pass(&t, &kv[0], n, i, &rv[0], tmpl, nk, before)
                self.size = t.size
                if i < n:
                    self._make_room()
        finally:
            if self.size > before:
                self._init_rows(before, self.size, newkeys)
        return rows

    def _records(self, lo=0, hi=None):
        """Structured view of the records ``[lo, hi)`` (default: all stored)."""
        hi = self.size if hi is None else hi
        rb = self.record_bytes
        return self._arena[lo * rb:hi * rb].view(self.record_dtype)

    def _init_rows(self, Py_ssize_t lo, Py_ssize_t hi, newkeys):
        """Initial weights (``init``) and FTRL's matching ``z`` for the new rows [lo, hi)
        (their keys: ``newkeys[:hi - lo]``); zero weights and the template state are
        already in place."""
        if self.init is None or hi <= lo:
            return
        recs = self._records(lo, hi)
        w = self._initial(newkeys[:hi - lo])
        recs["w"] = w
        if self.rule == "ftrl" and np.any(w):
            dt = self.dtype.type        # as hpcps.core.optim.Optimizer.init_slots
            c = dt(self.hp.beta / self.hp.lr + self.hp.lambda2)
            recs["z"] = -c * w - np.sign(w).astype(self.dtype) * dt(self.hp.lambda1)

    def _initial(self, keys):
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        w = np.asarray(self.init(keys))
        if w.shape != (keys.shape[0], self.dim) or w.dtype != self.dtype:
            raise ValueError(f"init returned {w.dtype} {w.shape}, expected {self.dtype} "
                             f"({keys.shape[0]}, {self.dim})")
        return w

    def gather(self, keys, out=None):
        """The weights of each key (a pull's reply); an absent key gets the initial value
        (zeros or ``init``) and is not inserted.

        Parameters
        ----------
        keys : int64 or uint64 array-like (n,)
            Any order, duplicates allowed.
        out : ndarray (n, dim) of the table's dtype, C-contiguous, writeable, optional

        Returns
        -------
        ndarray (n, dim)

        Raises
        ------
        ValueError
            If ``out`` has another shape, dtype or layout.
        """
        k = _key_vector(keys)
        cdef Py_ssize_t n = k.shape[0], dim = self.dim, absent = 0
        if out is None:
            out = np.empty((n, dim), dtype=self.dtype)
        elif (not isinstance(out, np.ndarray) or out.dtype != self.dtype
              or out.shape != (n, dim) or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise ValueError(f"out must be a writeable C-contiguous {self.dtype} array of "
                             f"shape ({n}, {dim})")
        if n == 0:
            return out
        rows = np.empty(n, dtype=np.int64)
        cdef const int64_t[::1] kv = k
        cdef int64_t[::1] rv = rows
        cdef uint8_t[:, ::1] ov = out.view(np.uint8)
        cdef Py_ssize_t wb = dim * self.dtype.itemsize
        with nogil:
            absent = self._gather_loop(&kv[0], n, &rv[0], <char*>&ov[0, 0], wb)
        if absent and self.init is not None:
            miss = np.flatnonzero(rows < 0)
            out[miss] = self._initial(k[miss])
        return out

    cdef Py_ssize_t _gather_loop(self, const int64_t* keys, Py_ssize_t n, int64_t* rows,
                                 char* out, Py_ssize_t wb) noexcept nogil:
        cdef Py_ssize_t i, absent, rec = self.record_bytes, ahead = _AHEAD_UPDATE
        absent = self._lookup_loop(keys, n, rows)
        for i in range(n):
            if i + ahead < n and rows[i + ahead] >= 0:
                hpcps_ht_prefetch(self.arena + rows[i + ahead] * rec)
            if rows[i] < 0:
                memset(out + i * wb, 0, wb)
            else:
                memcpy(out + i * wb, self.arena + rows[i] * rec, wb)
        return absent

    def apply(self, keys, grads, scale=1.0):
        """One optimizer step for a push: insert the absent keys, sum the gradient rows of
        equal keys (input order, from +0.0), run the rule once per distinct row.

        Parameters
        ----------
        keys : int64 or uint64 array-like (n,)
            Duplicates allowed (summed, never dropped).
        grads : ndarray (n, dim) of the table's dtype
        scale : float, default 1.0
            Multiplies the summed gradient (e.g. 1 / examples).

        Raises
        ------
        TypeError, ValueError
            For another dtype or shape, a non-finite ``scale``, more than ``2**31 - 2``
            keys in one push or in the table. Nothing is modified when the arguments
            are wrong.

        Notes
        -----
        Bitwise the result of ``hpcps.kernels.optim.apply_sparse`` on a fixed table whose
        rows hold the same values: the same summation order and the same arithmetic.
        """
        k = _key_vector(keys)
        g = np.asarray(grads)
        if g.dtype != self.dtype:
            raise TypeError(f"grads has dtype {g.dtype} but the table has dtype {self.dtype}")
        if g.ndim != 2 or g.shape != (k.shape[0], self.dim):
            raise ValueError(f"grads has shape {g.shape}, expected ({k.shape[0]}, {self.dim})")
        sc = _finite(scale, "scale")
        cdef Py_ssize_t n = k.shape[0], m
        if n == 0:
            self._last_m = 0
            return
        if <uint64_t>n > _MAX_ROWS:
            raise ValueError(f"a push of {n:,} keys is more than {int(_MAX_ROWS):,}")
        g = np.ascontiguousarray(g)
        if self._scratch is None or self._scratch[0].shape[0] < n:
            self._scratch = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
                             np.empty(n, dtype=np.int64))
        rows, urows, newkeys = self._scratch
        cdef const int64_t[::1] kv = k
        cdef int64_t[::1] rv = rows
        cdef int64_t[::1] uv = urows
        cdef int64_t[::1] nv = newkeys
        cdef int64_t* nk = &nv[0] if self.init is not None else NULL
        cdef uint8_t[::1] tv = self._template
        cdef const char* tmpl = <const char*>&tv[0]
        cdef _Hyper hp = self.hp
        hp.scale = sc
        cdef _Tab t
        cdef Py_ssize_t i = 0, before = self.size, nwords
        self._last_m = 0
        while True:                               # each key's row; new keys inserted
            self._fill(&t)
            with nogil:
                i = _rows_pass(&t, &kv[0], n, i, &rv[0], tmpl, nk, before)
            self.size = t.size
            if i == n:
                break
            try:
                self._make_room()
            except BaseException:
                self._init_rows(before, self.size, newkeys)
                raise
        self._init_rows(before, self.size, newkeys)
        self._fill(&t)
        cdef Py_ssize_t R = self.size, dim = self.dim
        cdef bint f32 = self.dtype == np.float32
        cdef const float[:, ::1] g32
        cdef const double[:, ::1] g64
        cdef float[::1] b32
        cdef double[::1] b64
        cdef uint64_t[::1] bmv
        if (R <= _SCATTER_ROWS_PER_KEY * n + _SCATTER_SLACK
                and R * dim * self.dtype.itemsize <= _SCATTER_MAX_BYTES):
            nwords = (R + 63) >> 6
            if self._sbuf is None or self._sbuf[0].shape[0] < R * dim:
                cap = max(self.rows_cap, R)
                self._sbuf = (np.zeros(cap * dim, dtype=self.dtype),
                              np.zeros((cap + 63) >> 6, dtype=np.uint64))
            buf, bitmap = self._sbuf
            bmv = bitmap
            if f32:
                g32, b32 = g, buf
                with nogil:
                    m = _scatter_update[float](t.arena, t.rec, self.soff, self.step_off, dim,
                                               &rv[0], &g32[0, 0], n, &b32[0], &bmv[0],
                                               nwords, &uv[0], &hp)
            else:
                g64, b64 = g, buf
                with nogil:
                    m = _scatter_update[double](t.arena, t.rec, self.soff, self.step_off, dim,
                                                &rv[0], &g64[0, 0], n, &b64[0], &bmv[0],
                                                nwords, &uv[0], &hp)
        else:                                     # a large table: merge by sorting the rows
            ur, summed = _merge_duplicates(rows[:n], g)
            m = ur.shape[0]
            urows[:m] = ur
            summed = np.ascontiguousarray(summed)
            if f32:
                g32 = summed
                with nogil:
                    _update_rows[float](t.arena, t.rec, self.soff, self.step_off, dim,
                                        &uv[0], m, &g32[0, 0], &hp)
            else:
                g64 = summed
                with nogil:
                    _update_rows[double](t.arena, t.rec, self.soff, self.step_off, dim,
                                         &uv[0], m, &g64[0, 0], &hp)
        self._last_m = m

    def last_rows(self):
        """The distinct arena rows the last :meth:`apply` stepped, int64 (m,) ascending:
        a view of a scratch buffer, valid until the next ``apply`` (copy
        it to keep it). Empty before the first apply and after an empty one."""
        if self._scratch is None:
            return np.empty(0, dtype=np.int64)
        return self._scratch[1][:self._last_m]

    cdef void _fill(self, _Tab* t):
        t.index = self.index
        t.NB = self.NB
        t.arena = self.arena
        t.rec = self.record_bytes
        t.size = self.size
        t.grow_at = self.grow_at
        t.rows_cap = self.rows_cap

    # ---------------------------------------------------------------- contents

    def keys(self):
        """The stored keys in arena (insertion) order: int64 (size,), a copy (a walk of
        the index)."""
        out = np.empty(self.size, dtype=np.int64)
        cdef int64_t[::1] ov = out
        cdef Py_ssize_t i
        cdef Py_ssize_t j
        cdef _Bucket* ip = self.index
        if self.size:
            with nogil:
                for i in range(<Py_ssize_t>self.NB):
                    for j in range(hpcps_ht_ctz(~(ip[i].used & 31))):
                        ov[ip[i].row1[j] - 1] = <int64_t>ip[i].key[j]
        return out

    def weights(self):
        """The stored rows in arena order: (size, dim) of the table's dtype, a copy."""
        return np.ascontiguousarray(self._records()["w"]).reshape(self.size, self.dim)

    @property
    def slot_names(self):
        """Names of the optimizer state fields (as ``hpcps.core.optim.Optimizer``)."""
        return {"sgd": (), "adagrad": ("accumulator",), "adam": ("m", "v", "step"),
                "ftrl": ("z", "n")}[self.rule]

    def slots(self):
        """``{slot name: array}`` of the stored rows in arena order (copies): (size, dim)
        of the table's dtype, ``step`` int64 (size,)."""
        recs = self._records()
        out = {}
        for s in self.slot_names:
            a = np.ascontiguousarray(recs[s])
            out[s] = a if s == "step" else a.reshape(self.size, self.dim)
        return out

    def load(self, keys, weights, slots=None):
        """Insert rows with given values (a checkpoint's shard): the keys must be absent.

        Parameters
        ----------
        keys : int64 or uint64 array-like (n,), distinct
        weights : array (n, dim), cast to the table's dtype
        slots : dict, optional
            ``{slot name: array}`` as :meth:`slots` returns; missing: the initial state.

        Raises
        ------
        ValueError
            If a key repeats or is already stored, or a shape does not fit (the table is
            then unchanged).
        """
        k = _key_vector(keys)
        n = k.shape[0]
        w = np.asarray(weights)
        if w.shape != (n, self.dim):
            raise ValueError(f"weights has shape {w.shape}, expected ({n}, {self.dim})")
        slots = dict(slots or {})
        for s, a in slots.items():
            if s not in self.slot_names:
                raise ValueError(f"slot {s!r} is not one of {self.rule}'s {self.slot_names}")
            want = (n,) if s == "step" else (n, self.dim)
            if np.shape(a) != want:
                raise ValueError(f"slot {s!r} has shape {np.shape(a)}, expected {want}")
        if n == 0:
            return
        # a sort, not np.unique: numpy >= 2.3's hashes the keys, 30x slower at 2^20 random
        # keys (247 vs 8 ms) and most of a restore's time (2.5 s of 3.1 at 10.1 M keys)
        srt = np.sort(k)
        if n > 1 and bool((srt[1:] == srt[:-1]).any()):
            raise ValueError("load: the keys are not distinct")
        del srt
        present = self.lookup(k) >= 0
        if present.any():
            raise ValueError(f"load: key {int(k[np.argmax(present)])} is already stored")
        before = self.size
        save_init, self.init = self.init, None
        try:
            self.insert(k)
        finally:
            self.init = save_init
        recs = self._records(before, before + n)
        recs["w"] = w
        for s, a in slots.items():
            recs[s] = a
