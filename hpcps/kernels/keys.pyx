"""Key permutation for range partitioning: ``p(k) = (k * A) mod num_keys``.

For ``gcd(A, num_keys) == 1`` the map is a bijection of ``[0, num_keys)`` (``A`` is a unit
of the ring Z/nZ, its inverse is ``pow(A, -1, num_keys)``, so the inverse map is the same
kernel with the inverse multiplier). With ``A`` near ``num_keys / phi`` (phi the golden
ratio) consecutive keys land far apart, in the spirit of Fibonacci / multiplicative hashing
(Knuth, "The Art of Computer Programming", vol. 3, 2nd ed., §6.4, multiplicative hashing
with ``A / w ≈ 1 / phi``), so that keys that are close — one-hot features, frequent ids —
spread over the servers' contiguous key ranges.

The product is formed exactly in 128 bits (``unsigned __int128``, GCC/Clang) so the map is
right for ``num_keys`` and ``A`` up to ``2**63 - 1``; when both are below ``2**32`` a plain
64-bit product is used.
"""

import math
import operator

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t hpcps_mulmod_u64(uint64_t a, uint64_t b, uint64_t n) {
    #if defined(__SIZEOF_INT128__)
        return (uint64_t)(((unsigned __int128)a * (unsigned __int128)b) % n);
    #else
        /* portable fallback: double-and-add; a, b < n < 2**63 so sums never overflow */
        uint64_t r = 0;
        a %= n;
        b %= n;
        while (b) {
            if (b & 1u) { r += a; if (r >= n) r -= n; }
            a += a; if (a >= n) a -= n;
            b >>= 1;
        }
        return r;
    #endif
    }
    /* x mod n for a divisor n fixed over many calls, with m = floor((2**64 - 1) / n):
       Barrett reduction (Barrett, CRYPTO '86; Granlund & Montgomery, PLDI '94): the
       quotient estimate hi64(x * m) is q or q - 1, so one correction gives the remainder —
       a multiply instead of a 64-bit division (several times its latency). */
    static inline uint64_t hpcps_mod_fixed(uint64_t x, uint64_t n, uint64_t m) {
    #if defined(__SIZEOF_INT128__)
        uint64_t q = (uint64_t)(((unsigned __int128)x * m) >> 64);
        uint64_t r = x - q * n;
        return r >= n ? r - n : r;
    #else
        (void)m;
        return x % n;
    #endif
    }
    static inline uint64_t hpcps_div_fixed(uint64_t x, uint64_t n, uint64_t m) {
    #if defined(__SIZEOF_INT128__)
        uint64_t q = (uint64_t)(((unsigned __int128)x * m) >> 64);
        return x - q * n >= n ? q + 1 : q;
    #else
        (void)m;
        return x / n;
    #endif
    }
    """
    uint64_t hpcps_mulmod_u64(uint64_t a, uint64_t b, uint64_t n) nogil
    uint64_t hpcps_mod_fixed(uint64_t x, uint64_t n, uint64_t m) nogil
    uint64_t hpcps_div_fixed(uint64_t x, uint64_t n, uint64_t m) nogil

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define hpcps_keys_prefetch(p) __builtin_prefetch((const void *)(p))
    #else
    #define hpcps_keys_prefetch(p) ((void)0)
    #endif
    /* every cache line of [p, p + n), n > 0 bytes (as in optim.pyx) */
    #define hpcps_keys_prefetch_span(p, n) do { \
        const char *hpcps_p_ = (const char *)(p), *hpcps_e_ = hpcps_p_ + (n) - 1; \
        for (; hpcps_p_ < hpcps_e_; hpcps_p_ += 64) hpcps_keys_prefetch(hpcps_p_); \
        hpcps_keys_prefetch(hpcps_e_); \
    } while (0)
    """
    void hpcps_keys_prefetch_span(const void* p, Py_ssize_t n) noexcept nogil

__all__ = ["permute_keys", "permute_keys_into", "choose_multiplier", "inverse_multiplier",
           "route_keys", "local_rows_into", "unique_inverse", "take_csr_rows"]

_INT64_MAX = (1 << 63) - 1
# 1 / phi = 0.6180339887498948482045868343656..., scaled by 10**19 (rounded down).
_INV_PHI_NUM = 6180339887498948482
_INV_PHI_DEN = 10 ** 19


def _check_space(num_keys, multiplier):
    """Validate and return (num_keys, multiplier reduced mod num_keys) as Python ints."""
    try:
        n = operator.index(num_keys)
        a = operator.index(multiplier)
    except TypeError:
        raise TypeError(f"num_keys and multiplier must be integers, got "
                        f"{type(num_keys).__name__} and {type(multiplier).__name__}") from None
    if not 1 <= n <= _INT64_MAX:
        raise ValueError(f"num_keys must be in [1, 2**63 - 1], got {n}")
    if not 0 <= a <= _INT64_MAX:
        raise ValueError(f"multiplier must be in [0, 2**63 - 1], got {a}")
    if math.gcd(a, n) != 1:
        raise ValueError(f"multiplier {a} is not coprime with num_keys {n} "
                         f"(gcd {math.gcd(a, n)}), so k -> k * {a} mod {n} is not a bijection")
    return n, a % n


cdef Py_ssize_t _permute(const int64_t[::1] keys, uint64_t n, uint64_t a,
                         int64_t[::1] out) noexcept nogil:
    """out[i] = keys[i] * a mod n; stops at and returns the first i with keys[i] outside
    [0, n), else -1."""
    cdef Py_ssize_t i, m = keys.shape[0]
    cdef uint64_t k
    if n <= (<uint64_t>1 << 32):
        # k < n <= 2**32 and a < n: the product fits in 64 bits.
        for i in range(m):
            k = <uint64_t>keys[i]
            if k >= n:
                return i
            out[i] = <int64_t>((k * a) % n)
    else:
        for i in range(m):
            k = <uint64_t>keys[i]
            if k >= n:
                return i
            out[i] = <int64_t>hpcps_mulmod_u64(k, a, n)
    return -1


def _keys_vector(keys):
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {keys.shape}")
    if keys.dtype != np.int64:
        if keys.size == 0:
            return np.empty(0, dtype=np.int64)
        if keys.dtype.kind not in "iu":
            raise TypeError(f"keys must have an integer dtype (int64), got {keys.dtype}")
        if keys.dtype == np.uint64 and keys.max() > _INT64_MAX:
            bad = keys[keys > _INT64_MAX][0]
            raise ValueError(f"key {int(bad)} is outside the key space (num_keys <= 2**63 - 1)")
    return np.ascontiguousarray(keys, dtype=np.int64)


def _check_out(out, keys):
    """``out`` must be a writeable C-contiguous int64 array shaped like ``keys``."""
    if not isinstance(out, np.ndarray) or out.dtype != np.int64:
        raise TypeError("out must be a numpy.ndarray of dtype int64")
    if out.shape != keys.shape:
        raise ValueError(f"out has shape {out.shape} but keys has shape {keys.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable")


def permute_keys_into(keys, num_keys, multiplier, out):
    """Write ``(keys * multiplier) mod num_keys`` into ``out`` (exact, 128-bit product).

    Parameters
    ----------
    keys : ndarray of int64, shape (n,)
        Keys in ``[0, num_keys)`` (other integer dtypes are converted).
    num_keys : int
        Size of the key space, ``1 <= num_keys <= 2**63 - 1``.
    multiplier : int
        ``A`` in ``[0, 2**63 - 1]`` with ``gcd(A, num_keys) == 1``.
    out : ndarray of int64, shape (n,), C-contiguous, writeable
        Output positions in ``[0, num_keys)``. May be ``keys`` itself (in place). If an
        error is raised, the entries before the offending key are written, the rest are not.

    Returns
    -------
    out : ndarray of int64, shape (n,)
        The ``out`` argument.

    Raises
    ------
    TypeError
        If ``keys`` is not integer, ``num_keys``/``multiplier`` are not integers, or ``out``
        is not an int64 ndarray.
    ValueError
        If a key is ``< 0`` or ``>= num_keys`` (the message names the first such key and
        ``num_keys``), ``out`` has the wrong shape or is not C-contiguous/writeable,
        ``num_keys``/``multiplier`` are out of range, or ``gcd(multiplier, num_keys) != 1``.

    Notes
    -----
    Bijective because the multiplier is invertible modulo ``num_keys``; multiplicative
    hashing per Knuth, TAOCP vol. 3, §6.4. See :func:`choose_multiplier`.
    """
    n, a = _check_space(num_keys, multiplier)
    keys = _keys_vector(keys)
    _check_out(out, keys)
    cdef const int64_t[::1] kv = keys
    cdef int64_t[::1] ov = out
    cdef uint64_t un = n, ua = a
    cdef Py_ssize_t bad
    with nogil:
        bad = _permute(kv, un, ua, ov)
    if bad >= 0:
        raise ValueError(f"key {keys[bad]} (at position {bad}) is outside the key space "
                         f"[0, {n}) (num_keys = {n})")
    return out


def permute_keys(keys, num_keys, multiplier):
    """Permuted positions ``p(k) = (k * multiplier) mod num_keys`` of ``keys``.

    Parameters
    ----------
    keys : ndarray of int64, shape (n,)
        Keys in ``[0, num_keys)`` (other integer dtypes are converted).
    num_keys : int
        Size of the key space, ``1 <= num_keys <= 2**63 - 1``.
    multiplier : int
        ``A`` in ``[0, 2**63 - 1]`` with ``gcd(A, num_keys) == 1`` (use
        :func:`choose_multiplier`; for the inverse map pass :func:`inverse_multiplier`).

    Returns
    -------
    positions : ndarray of int64, shape (n,)
        ``p(keys)``, in ``[0, num_keys)``, computed exactly (128-bit product).

    Raises
    ------
    TypeError
        If ``keys`` is not integer or ``num_keys``/``multiplier`` are not integers.
    ValueError
        If a key is ``< 0`` or ``>= num_keys`` (the message names the first offending key
        and ``num_keys``), ``num_keys``/``multiplier`` are out of range, or
        ``gcd(multiplier, num_keys) != 1`` (the map would not be a bijection).

    Notes
    -----
    Multiplicative hashing, Knuth, TAOCP vol. 3, 2nd ed., §6.4; a bijection of
    ``[0, num_keys)`` since the multiplier is a unit modulo ``num_keys``.
    """
    keys = _keys_vector(keys)
    return permute_keys_into(keys, num_keys, multiplier, np.empty(keys.shape[0], dtype=np.int64))


def choose_multiplier(num_keys):
    """A multiplier ``A`` for :func:`permute_keys`: odd, coprime with ``num_keys``, ≈ n / φ.

    Parameters
    ----------
    num_keys : int
        Size of the key space, ``1 <= num_keys <= 2**63 - 1``.

    Returns
    -------
    A : int
        The odd integer in ``[1, num_keys)`` with ``gcd(A, num_keys) == 1`` closest to
        ``num_keys * 0.6180339887...`` (ties: the smaller); ``1`` for ``num_keys`` 1 or 2.

    Raises
    ------
    TypeError
        If ``num_keys`` is not an integer.
    ValueError
        If ``num_keys`` is outside ``[1, 2**63 - 1]``.

    Notes
    -----
    The golden-ratio multiplier of Fibonacci hashing (Knuth, TAOCP vol. 3, 2nd ed., §6.4)
    spreads consecutive keys evenly; computed in exact integer arithmetic. Coprimality makes
    ``k -> k * A mod num_keys`` a bijection.
    """
    try:
        n = operator.index(num_keys)
    except TypeError:
        raise TypeError(f"num_keys must be an integer, got {type(num_keys).__name__}") from None
    if not 1 <= n <= _INT64_MAX:
        raise ValueError(f"num_keys must be in [1, 2**63 - 1], got {n}")
    if n <= 2:
        return 1
    target = (n * _INV_PHI_NUM + _INV_PHI_DEN // 2) // _INV_PHI_DEN
    d = 0
    while True:  # terminates: A = 1 always qualifies
        for a in ((target - d, target + d) if d else (target,)):
            if 1 <= a < n and a & 1 and math.gcd(a, n) == 1:
                return a
        d += 1


def inverse_multiplier(num_keys, multiplier):
    """The multiplier of the inverse permutation: ``pow(multiplier, -1, num_keys)``.

    Parameters
    ----------
    num_keys : int
        Size of the key space, ``1 <= num_keys <= 2**63 - 1``.
    multiplier : int
        ``A`` with ``gcd(A, num_keys) == 1``.

    Returns
    -------
    B : int
        In ``[0, num_keys)``, with ``permute_keys(permute_keys(k, n, A), n, B) == k``
        (``0`` when ``num_keys == 1``).

    Raises
    ------
    ValueError
        If the arguments are out of range or not coprime.

    Notes
    -----
    Modular inverse (extended Euclid, Knuth, TAOCP vol. 2, 3rd ed., §4.5.2).
    """
    n, a = _check_space(num_keys, multiplier)
    return pow(a, -1, n) if n > 1 else 0


# --------------------------------------------------------------------------------------
# One pass over a request's keys: the client's grouping by server, the server's local rows
# --------------------------------------------------------------------------------------

cdef inline uint64_t _perm1(uint64_t k, uint64_t n, uint64_t a, uint64_t m) noexcept nogil:
    """p(k) = k * a mod n for k < n (the identity for a == 1); m = (2**64 - 1) // n."""
    if a == 1:
        return k
    if n <= (<uint64_t>1 << 32):
        return hpcps_mod_fixed(k * a, n, m)
    return hpcps_mulmod_u64(k, a, n)


cdef Py_ssize_t _route(const int64_t[::1] keys, uint64_t n, uint64_t a, uint64_t rsize,
                       int64_t[::1] srv, int64_t[::1] counts, int* grouped) noexcept nogil:
    """srv[i] = p(keys[i]) // rsize, counts[srv[i]] += 1, grouped = srv ascending; returns the
    first i with keys[i] outside [0, n) (stopping there), else -1."""
    cdef Py_ssize_t i, m = keys.shape[0]
    cdef uint64_t k
    cdef int64_t s, prev = 0
    cdef uint64_t mn = (<uint64_t>0xFFFFFFFFFFFFFFFF) // n, mr = (<uint64_t>0xFFFFFFFFFFFFFFFF) // rsize
    grouped[0] = 1
    for i in range(m):
        k = <uint64_t>keys[i]
        if k >= n:
            return i
        s = <int64_t>hpcps_div_fixed(_perm1(k, n, a, mn), rsize, mr)
        srv[i] = s
        counts[s] += 1
        if s < prev:
            grouped[0] = 0
        prev = s
    return -1


cdef Py_ssize_t _in_space(const int64_t[::1] keys, uint64_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(keys.shape[0]):
        if <uint64_t>keys[i] >= n:
            return i
    return -1


def route_keys(keys, num_keys, multiplier, range_size, n_servers):
    """Owner server of each key, in one pass: what a client needs to split a request.

    Parameters
    ----------
    keys : ndarray of int64, shape (n,)
        Keys in ``[0, num_keys)`` (other integer dtypes are converted).
    num_keys, multiplier : int
        The key permutation (see :func:`permute_keys`; ``multiplier`` 1 = identity).
    range_size : int
        Permuted positions per server (``ceil(num_keys / n_servers)``), >= 1.
    n_servers : int
        >= 1.

    Returns
    -------
    servers : int64 ndarray (n,) or None
        ``p(keys) // range_size``; None when ``n_servers == 1`` (every key is server 0's;
        the keys are only checked).
    counts : int64 ndarray (n_servers,)
        Keys per server.
    grouped : bool
        True when ``servers`` is non-decreasing (the request is grouped by server already).

    Raises
    ------
    ValueError
        For a key outside ``[0, num_keys)`` (the message names the first such key), or bad
        ``num_keys``/``multiplier``/``range_size``/``n_servers``.

    Notes
    -----
    The same map as :func:`permute_keys` followed by an integer division, fused in one
    nogil loop (no temporary of permuted positions).
    """
    n, a = _check_space(num_keys, multiplier)
    keys = _keys_vector(keys)
    cdef int64_t ns = operator.index(n_servers), rs = operator.index(range_size)
    if ns < 1 or rs < 1 or int(ns) * int(rs) < n:
        raise ValueError(f"range_size {rs} x n_servers {ns} does not cover num_keys {n}")
    counts = np.zeros(ns, dtype=np.int64)
    cdef const int64_t[::1] kv = keys
    cdef uint64_t un = n, ua = a if n > 1 else 1, urs = rs
    cdef Py_ssize_t bad
    cdef int grouped = 1
    cdef int64_t[::1] sv, cv
    if ns == 1:
        with nogil:
            bad = _in_space(kv, un)
        if bad < 0:
            counts[0] = keys.shape[0]
        srv = None
    else:
        srv = np.empty(keys.shape[0], dtype=np.int64)
        sv, cv = srv, counts
        with nogil:
            bad = _route(kv, un, ua, urs, sv, cv, &grouped)
    if bad >= 0:
        raise ValueError(f"key {keys[bad]} is outside the key space [0, {n})")
    return srv, counts, bool(grouped)


cdef uint64_t NOT_HERE = <uint64_t>0xFFFFFFFFFFFFFFFF     # no local row (see outside)


cdef inline void _copy_row(char* out, Py_ssize_t i, const char* w, uint64_t r,
                           Py_ssize_t rowb) noexcept nogil:
    """``out``'s row ``i`` = ``w``'s row ``r`` (``rowb`` bytes each); dim-1 float32 and
    float64 rows (the sparse tables) as one load and store, no call."""
    if rowb == 4:
        (<uint32_t*>out)[i] = (<const uint32_t*>w)[r]
    elif rowb == 8:
        (<uint64_t*>out)[i] = (<const uint64_t*>w)[r]
    else:
        memcpy(out + i * rowb, w + r * rowb, rowb)


def route_split(keys, values, num_keys, multiplier, range_size, n_servers):
    """A request's keys, and the rows of ``values`` that go with them, grouped by server in
    one call: :func:`route_keys`, the counting order of :func:`group_order` and the copies
    ``keys[order]``, ``values[order]`` fused (issue 20: a worker's push and pull of several
    servers paid one Python call and one temporary array for each). Local; no MPI.

    Parameters
    ----------
    keys : int64 ndarray (n,), C-contiguous
        Keys in ``[0, num_keys)``.
    values : ndarray (n, ...), C-contiguous, or None
        Rows that go with the keys (a push's values).
    num_keys, multiplier, range_size, n_servers : int
        As :func:`route_keys`.

    Returns
    -------
    keys_g : int64 ndarray (n,)
        The keys grouped by server, each server's in their order in ``keys``: ``keys``
        itself when they are grouped already, else a new array.
    values_g : ndarray (n, ...) or None
        ``values`` likewise (itself, or a new array).
    bounds : int64 ndarray (n_servers + 1,)
        ``keys_g[bounds[s]:bounds[s + 1]]`` are server ``s``'s.
    order : int64 ndarray (n,) or None
        ``keys_g == keys[order]``; None when ``keys_g`` is ``keys``.

    Raises
    ------
    ValueError
        As :func:`route_keys` (the first key outside ``[0, num_keys)`` named), or for
        ``values`` whose length is not ``n``.
    TypeError
        For keys that are not a C-contiguous int64 vector, or ``values`` not C-contiguous.
    """
    if type(keys) is not np.ndarray or keys.dtype != np.int64 or keys.ndim != 1:
        raise TypeError("route_split: keys must be a C-contiguous int64 vector")
    cdef const int64_t[::1] kv = keys          # TypeError/ValueError when not contiguous
    cdef Py_ssize_t n_k = kv.shape[0], rowb = 0, i, j
    if values is not None and (type(values) is not np.ndarray or values.shape[0] != n_k):
        raise ValueError(f"route_split: values must be an ndarray of {n_k} rows")
    srv, counts, grouped = route_keys(keys, num_keys, multiplier, range_size, n_servers)
    cdef int64_t ns = counts.shape[0]
    bounds = np.zeros(ns + 1, dtype=np.int64)
    counts.cumsum(out=bounds[1:])
    if grouped:
        return keys, values, bounds, None
    if values is not None:
        if not values.flags.c_contiguous:
            raise TypeError("route_split: values must be a C-contiguous ndarray")
        rowb = values.nbytes // n_k if n_k else 0
    order = np.empty(n_k, dtype=np.int64)
    keys_g = np.empty(n_k, dtype=np.int64)
    values_g = None if values is None else np.empty_like(values)
    nxt = bounds[:-1].copy()
    cdef const int64_t[::1] sv = srv
    cdef int64_t[::1] ov = order, gv = keys_g, xv = nxt
    cdef const char* vp = NULL
    cdef char* gp = NULL
    cdef const unsigned char[::1] vb
    cdef unsigned char[::1] gb
    if values_g is not None and n_k and rowb:
        vb = values.reshape(-1).view(np.uint8)
        gb = values_g.reshape(-1).view(np.uint8)
        vp = <const char*>&vb[0]
        gp = <char*>&gb[0]
    with nogil:
        for i in range(n_k):
            j = xv[sv[i]]
            xv[sv[i]] = j + 1
            ov[j] = i
            gv[j] = kv[i]
            if gp != NULL:
                _copy_row(gp, j, vp, <uint64_t>i, rowb)
    return keys_g, values_g, bounds, order


cdef inline uint64_t _local_row(uint64_t k, uint64_t n, uint64_t a, uint64_t mn, uint64_t lo,
                                uint64_t hi, int* outside) noexcept nogil:
    """The local row ``p(k) - lo`` of key ``k`` on the server holding [lo, hi) of the permuted
    space, or NOT_HERE with ``outside`` = 1 (``k`` outside [0, n)) or 0 (``p(k)`` outside
    [lo, hi))."""
    cdef uint64_t p
    if k >= n:
        outside[0] = 1
        return NOT_HERE
    p = _perm1(k, n, a, mn)
    if p < lo or p >= hi:
        outside[0] = 0
        return NOT_HERE
    return p - lo


cdef Py_ssize_t _local_rows(const int64_t[::1] keys, uint64_t n, uint64_t a, uint64_t lo,
                            uint64_t hi, int64_t[::1] out, int* outside) noexcept nogil:
    """out[i] = p(keys[i]) - lo; returns the first i whose key is outside [0, n)
    (outside = 1) or whose position is outside [lo, hi) (outside = 0), stopping there."""
    if keys.shape[0] == 0:
        return -1
    return local_rows_ptr(&keys[0], keys.shape[0], n, a, lo, hi, &out[0], outside)


def local_rows_into(keys, num_keys, multiplier, lo, hi, out):
    """Local rows ``p(keys) - lo`` of keys that must lie in the key range ``[lo, hi)``.

    Parameters
    ----------
    keys : ndarray of int64, shape (n,)
    num_keys, multiplier : int
        The key permutation (see :func:`permute_keys`).
    lo, hi : int
        The server's key range in the permuted space, ``0 <= lo <= hi <= num_keys``.
    out : ndarray of int64, shape (n,), C-contiguous, writeable
        Receives the rows; may be ``keys`` itself (in place: the server turns a request's
        keys into rows without a new array).

    Returns
    -------
    out

    Raises
    ------
    ValueError
        Naming the first key outside ``[0, num_keys)`` or outside the key range; ``out`` is
        then partly written.
    """
    n, a = _check_space(num_keys, multiplier)
    keys = _keys_vector(keys)
    _check_out(out, keys)
    lo, hi = operator.index(lo), operator.index(hi)
    if not 0 <= lo <= hi <= n:
        raise ValueError(f"key range [{lo}, {hi}) is not inside [0, {n})")
    cdef const int64_t[::1] kv = keys
    cdef int64_t[::1] ov = out
    cdef uint64_t un = n, ua = a if n > 1 else 1, ulo = lo, uhi = hi
    cdef Py_ssize_t bad
    cdef int outside = 0
    with nogil:
        bad = _local_rows(kv, un, ua, ulo, uhi, ov, &outside)
    if bad >= 0:
        if outside:
            raise ValueError(f"key {keys[bad]} is outside the key space [0, {n})")
        raise ValueError(f"key {keys[bad]} does not belong to this server (key range "
                         f"[{lo}, {hi}) of the permuted space)")
    return out


# --------------------------------------------------------------------------------------
# distinct keys of a minibatch
# --------------------------------------------------------------------------------------

ctypedef fused col_t:
    int32_t
    int64_t


cdef Py_ssize_t _collect(const col_t[::1] cols, int32_t[::1] marks, int64_t[::1] uniq) noexcept nogil:
    """First pass: mark each column once, collect the distinct ones (unsorted); returns their
    number, or -1 - position of the first column outside ``[0, marks.size)``."""
    cdef Py_ssize_t j, u = 0, n = marks.shape[0]
    cdef int64_t c
    for j in range(cols.shape[0]):
        c = cols[j]
        if c < 0 or c >= n:
            for c in range(u):          # leave the marks clean
                marks[uniq[c]] = 0
            return -1 - j
        if marks[c] == 0:
            marks[c] = 1
            uniq[u] = c
            u += 1
    return u


cdef void _renumber(const col_t[::1] cols, int32_t[::1] marks, const int64_t[::1] keys,
                    int64_t[::1] local) noexcept nogil:
    """Second pass: ``local[j]`` = position of ``cols[j]`` in the sorted ``keys``; then the
    marks are zero again."""
    cdef Py_ssize_t i, j
    for i in range(keys.shape[0]):
        marks[keys[i]] = <int32_t>(i + 1)
    for j in range(cols.shape[0]):
        local[j] = marks[cols[j]] - 1
    for i in range(keys.shape[0]):
        marks[keys[i]] = 0


cdef enum:
    RADIX_BITS = 11       # digit width of radix_sort_u64 (2,048 counters: 16 KiB on the stack)
    RADIX_MIN = 640       # sort_u64: fewer values are sorted by numpy


cdef void radix_sort_u64(uint64_t* a, uint64_t* tmp, Py_ssize_t n, int bits) noexcept nogil:
    """Sort ``a[0:n]`` ascending in place by its low ``bits`` bits (the others zero), ``tmp``
    scratch of ``n`` values: least-significant-digit radix sort, digits of
    11 bits, a digit shared by every value skipped (Knuth, TAOCP vol. 3,
    §5.2.5). numpy 2.4's ``sort`` of uint64 ran at 24 ns per value for 8,100 values and
    52 ns for 10^6 on this project's test machine (AMD EPYC, family 25 model 17, whose
    AVX-512 numpy uses), these passes at 5.4 and 10.7 ns (2026-12-04)."""
    cdef Py_ssize_t i, c, s
    cdef Py_ssize_t counts[2048]
    cdef int shift = 0
    cdef uint64_t d, v
    cdef uint64_t* src = a
    cdef uint64_t* dst = tmp
    cdef uint64_t* t
    if n < 2:
        return
    if n <= 32:                                   # insertion sort
        for i in range(1, n):
            v = a[i]
            c = i
            while c > 0 and a[c - 1] > v:
                a[c] = a[c - 1]
                c -= 1
            a[c] = v
        return
    while shift < bits:
        for i in range(2048):
            counts[i] = 0
        for i in range(n):
            counts[(src[i] >> shift) & 2047] += 1
        if counts[(src[0] >> shift) & 2047] == n:  # one digit value: nothing to move
            shift += RADIX_BITS
            continue
        s = 0
        for i in range(2048):
            c = counts[i]
            counts[i] = s
            s += c
        for i in range(n):
            v = src[i]
            d = (v >> shift) & 2047
            dst[counts[d]] = v
            counts[d] += 1
        t = src
        src = dst
        dst = t
        shift += RADIX_BITS
    if src != a:
        memcpy(a, src, n * sizeof(uint64_t))


def sort_u64(values, int bits=64):
    """Sort the uint64 array ``values`` (C-contiguous, writeable) ascending in place, its
    values below ``2**bits``, with :func:`radix_sort_u64` (numpy's sort below 640 values:
    4.1 us against 0.4 us for 64 values, 8.0 against 12.5 for 1,024); returns it. Local.

    Raises
    ------
    ValueError
        For another dtype or layout, or ``bits`` outside [1, 64].
    """
    if (not isinstance(values, np.ndarray) or values.dtype != np.uint64 or values.ndim != 1
            or not values.flags.c_contiguous or not values.flags.writeable):
        raise ValueError("sort_u64: values must be a writeable C-contiguous uint64 vector")
    if not 1 <= bits <= 64:
        raise ValueError(f"sort_u64: bits must be in [1, 64], got {bits}")
    cdef Py_ssize_t n = values.shape[0]
    if n < RADIX_MIN:             # numpy's small sorts (sorting networks) are faster there
        values.sort()
        return values
    tmp = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] av = values, tv = tmp
    with nogil:
        radix_sort_u64(&av[0], &tv[0], n, bits)
    return values


def group_order(groups, bounds):
    """The stable order that groups ``groups`` by value: ``np.argsort(groups, kind="stable")``
    in one counting pass (Knuth, TAOCP vol. 3, §5.2, distribution counting) instead of a
    comparison sort (numpy's stable sort ran at 34 ns per value for 8,100 int64 values on the
    test machine). Local; no MPI.

    Parameters
    ----------
    groups : int64 array (n,)
        Group (server, owner) of each position, in ``[0, bounds.size - 1)``.
    bounds : int64 array (g + 1,)
        ``bounds[s]`` = the positions of groups below ``s`` (the prefix sums of the counts,
        ``bounds[0]`` = 0, ``bounds[g]`` = n).

    Returns
    -------
    order : int64 array (n,)
        ``order[bounds[s]:bounds[s + 1]]`` are the positions of group ``s``, ascending.

    Raises
    ------
    ValueError
        For a group outside ``[0, g)`` or bounds that do not fit the groups' counts.
    """
    cdef const int64_t[::1] gv = np.ascontiguousarray(groups, dtype=np.int64).reshape(-1)
    ends = np.ascontiguousarray(bounds, dtype=np.int64).reshape(-1)
    nxt = ends.copy()
    cdef const int64_t[::1] ev = ends
    cdef int64_t[::1] nv = nxt
    cdef Py_ssize_t i, n = gv.shape[0], g = ev.shape[0] - 1, bad = -1
    cdef int64_t s
    if g < 1 or ev[0] != 0 or ev[g] != n:
        raise ValueError(f"group_order: bounds {ends[:8]} do not fit {n} positions")
    order = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] ov = order
    with nogil:
        for i in range(n):
            s = gv[i]
            if s < 0 or s >= g or nv[s] >= ev[s + 1]:
                bad = i
                break
            ov[nv[s]] = i
            nv[s] += 1
    if bad >= 0:
        raise ValueError(f"group_order: group {int(gv[bad])} at position {bad} is outside "
                         f"[0, {g}) or over its count in bounds")
    if not np.array_equal(nxt[:-1], ends[1:]):
        raise ValueError("group_order: bounds do not fit the groups' counts")
    return order


def take_csr_rows(rows, indptr, indices, data, out_indptr, out_indices, out_data):
    """Rows ``rows`` of a CSR matrix, one after the other, copied into buffers the caller
    keeps (a minibatch's rows without a new matrix per step). Local; no MPI.

    Parameters
    ----------
    rows : int64 array (n,)
        Rows to take, in ``[0, indptr.size - 1)``, in the order wanted (repeats allowed).
    indptr : int64 array (R + 1,)
        Row pointers of the matrix (ascending, ``indptr[0]`` = 0).
    indices, data : C-contiguous arrays (nnz,), any fixed-size dtypes
        Column indices and values of the matrix.
    out_indptr : int64 array (>= n + 1,), writeable
        Receives the row pointers of the rows taken (``out_indptr[0]`` = 0).
    out_indices, out_data : writeable C-contiguous arrays, the dtypes of ``indices`` and
        ``data``
        Receive the rows' entries when they are long enough.

    Returns
    -------
    int
        The entries of the rows taken, ``m``; they were copied when ``out_indices`` and
        ``out_data`` hold at least ``m`` items, else nothing but ``out_indptr`` was written
        (grow them and call again).

    Raises
    ------
    IndexError
        For a row outside the matrix (naming it and its position).
    ValueError
        For mismatched dtypes, arrays that are not C-contiguous, or ``out_indptr`` too short.
    """
    cdef const int64_t[::1] rv = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    cdef const int64_t[::1] pv = indptr
    cdef int64_t[::1] ov = out_indptr
    cdef Py_ssize_t n = rv.shape[0], R = pv.shape[0] - 1, i, bad = -1
    cdef int64_t r, a, m = 0
    if (indices.dtype != out_indices.dtype or data.dtype != out_data.dtype
            or not (indices.flags.c_contiguous and data.flags.c_contiguous
                    and out_indices.flags.c_contiguous and out_data.flags.c_contiguous)):
        raise ValueError("take_csr_rows: indices/data and their buffers need the same dtypes, "
                         "C-contiguous")
    if ov.shape[0] < n + 1 or R < 0:
        raise ValueError(f"take_csr_rows: out_indptr holds {ov.shape[0]} values, {n + 1} needed")
    with nogil:
        ov[0] = 0
        for i in range(n):
            r = rv[i]
            if r < 0 or r >= R:
                bad = i
                break
            m += pv[r + 1] - pv[r]
            ov[i + 1] = m
    if bad >= 0:
        raise IndexError(f"take_csr_rows: row {int(rv[bad])} at position {bad} is outside "
                         f"[0, {R})")
    if m > out_indices.shape[0] or m > out_data.shape[0] or m == 0:
        return m
    cdef Py_ssize_t isz = indices.itemsize, dsz = data.itemsize
    cdef const unsigned char[::1] src_i = indices.reshape(-1).view(np.uint8)
    cdef const unsigned char[::1] src_d = data.reshape(-1).view(np.uint8)
    cdef unsigned char[::1] dst_i = out_indices.reshape(-1).view(np.uint8)
    cdef unsigned char[::1] dst_d = out_data.reshape(-1).view(np.uint8)
    cdef const unsigned char* si = &src_i[0]
    cdef const unsigned char* sd = &src_d[0]
    cdef unsigned char* di = &dst_i[0]
    cdef unsigned char* dd = &dst_d[0]
    with nogil:
        for i in range(n):
            r = rv[i]
            a = pv[r]
            memcpy(di + ov[i] * isz, si + a * isz, (ov[i + 1] - ov[i]) * isz)
            memcpy(dd + ov[i] * dsz, sd + a * dsz, (ov[i + 1] - ov[i]) * dsz)
    return m


def unique_inverse(cols, marks):
    """Distinct keys of a minibatch and its columns renumbered into them, in two linear
    passes over ``cols`` instead of a sort of them (``np.unique(cols, return_inverse=True)``
    sorts all ``nnz`` entries; here only the distinct keys are sorted). Local; no MPI.

    Parameters
    ----------
    cols : int32 or int64 array (nnz,)
        Column (feature) ids of the batch, e.g. a CSR matrix's ``indices``; in
        ``[0, marks.size)``.
    marks : int32 array (n_features,), C-contiguous, all zeros
        Scratch space the caller keeps between calls (one entry per feature); zeros again on
        return, also after an error.

    Returns
    -------
    keys : int64 (m,), ascending, the distinct values of ``cols``
    local : int64 (nnz,), ``keys[local] == cols``

    Raises
    ------
    ValueError
        For a column outside ``[0, marks.size)`` (naming its position), or ``marks`` that is
        not a C-contiguous int32 vector of fewer than 2**31 entries.
    TypeError
        For ``cols`` of another dtype than int32/int64.

    Notes
    -----
    The same result as ``np.unique(cols, return_inverse=True)`` (tested against it); a
    counting (bucket) renumbering, Knuth, TAOCP vol. 3, §5.2 (distribution counting).
    """
    cols = np.ascontiguousarray(cols).reshape(-1)
    if cols.dtype != np.int32 and cols.dtype != np.int64:
        raise TypeError(f"cols must be int32 or int64, got {cols.dtype}")
    if (not isinstance(marks, np.ndarray) or marks.dtype != np.int32 or marks.ndim != 1
            or not marks.flags.c_contiguous or not marks.flags.writeable
            or marks.shape[0] >= 2**31):
        raise ValueError("marks must be a writeable C-contiguous int32 vector of fewer than "
                         "2**31 entries (all zeros)")
    uniq = np.empty(min(cols.shape[0], marks.shape[0]), dtype=np.int64)   # the distinct ones
    cdef Py_ssize_t u
    if cols.dtype == np.int32:
        u = _collect[int32_t](cols, marks, uniq)
    else:
        u = _collect[int64_t](cols, marks, uniq)
    if u < 0:
        j = -1 - u
        raise ValueError(f"column {int(cols[j])} at position {j} is outside [0, {marks.shape[0]})")
    keys = uniq[:u].copy()
    if u > 1:                      # ascending: radix passes over the distinct keys only
        sort_u64(keys.view(np.uint64), max(1, (marks.shape[0] - 1).bit_length()))
    local = np.empty(cols.shape[0], dtype=np.int64)
    if cols.dtype == np.int32:
        _renumber[int32_t](cols, marks, keys, local)
    else:
        _renumber[int64_t](cols, marks, keys, local)
    return keys, local


# --------------------------------------------------------------------------------------
# a server's work on one request (issue 20: one call instead of several)
# --------------------------------------------------------------------------------------

cdef bint _finite32(const uint32_t* v, Py_ssize_t n) noexcept nogil:
    """No NaN or infinity among n float32 bit patterns: a value is NaN or infinite exactly
    when its exponent bits are all ones; an integer OR-reduction (vectorised by the
    compiler, no branch per value)."""
    cdef Py_ssize_t i
    cdef uint32_t bad = 0
    for i in range(n):
        bad |= <uint32_t>((v[i] & 0x7f800000u) == 0x7f800000u)
    return bad == 0


cdef bint _finite64(const uint64_t* v, Py_ssize_t n) noexcept nogil:
    """As :func:`_finite32` for float64 bit patterns."""
    cdef Py_ssize_t i
    cdef uint64_t bad = 0
    for i in range(n):
        bad |= <uint64_t>((v[i] & 0x7ff0000000000000u) == 0x7ff0000000000000u)
    return bad == 0


def push_rows_inplace(keys, int64_t num_keys, int64_t multiplier, int64_t lo, int64_t hi,
                      values):
    """A received push at its server, in one call: its keys turned into local rows in place
    (``p(keys) - lo``, as :func:`local_rows_into` with ``out=keys``) and whether its values
    are all finite.

    Parameters
    ----------
    keys : ndarray of int64, shape (n,), C-contiguous, writeable
        Overwritten with the local rows.
    num_keys, multiplier : int
        The key permutation, already validated (:class:`hpcps.core.tables.KeyPartition`;
        ``multiplier`` in ``[1, num_keys)`` and coprime with it, or 1).
    lo, hi : int
        The server's key range in the permuted space.
    values : ndarray of float32 or float64, C-contiguous
        The push's rows (any shape).

    Returns
    -------
    bool
        True when no value is NaN or infinite (exponent bits all ones).

    Raises
    ------
    ValueError
        Naming the first key outside ``[0, num_keys)`` or outside ``[lo, hi)``.
    TypeError
        For values of another dtype.
    """
    # raw buffers, not typed memoryviews: their set-up cost more than the work of a small
    # push (issue 20)
    cdef Py_buffer kb, vb
    cdef uint64_t un = <uint64_t>num_keys, ua = <uint64_t>multiplier if num_keys > 1 else 1
    cdef uint64_t mn
    cdef Py_ssize_t bad = -1, i, m
    cdef int outside = 0, kind
    cdef bint ok = True
    cdef int64_t* kp
    cdef uint64_t r
    if keys.dtype != np.int64:
        raise TypeError(f"keys must be int64, got {keys.dtype}")
    if values.dtype == np.float32:
        kind = 4
    elif values.dtype == np.float64:
        kind = 8
    else:
        raise TypeError(f"values must be float32 or float64, got {values.dtype}")
    PyObject_GetBuffer(keys, &kb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        PyObject_GetBuffer(values, &vb, PyBUF_C_CONTIGUOUS)
        try:
            kp = <int64_t*>kb.buf
            m = kb.len // 8
            with nogil:
                if m:
                    mn = (<uint64_t>0xFFFFFFFFFFFFFFFF) // un
                    for i in range(m):
                        r = _local_row(<uint64_t>kp[i], un, ua, mn, <uint64_t>lo, <uint64_t>hi,
                                       &outside)
                        if r == NOT_HERE:
                            bad = i
                            break
                        kp[i] = <int64_t>r
                if bad < 0 and vb.len:
                    if kind == 4:
                        ok = _finite32(<const uint32_t*>vb.buf, vb.len // 4)
                    else:
                        ok = _finite64(<const uint64_t*>vb.buf, vb.len // 8)
        finally:
            PyBuffer_Release(&vb)
    finally:
        PyBuffer_Release(&kb)
    if bad >= 0:
        _raise_row(keys, bad, outside, num_keys, lo, hi)
    return ok


def _raise_row(keys, Py_ssize_t bad, int outside, num_keys, lo, hi):
    """The ValueError of :func:`local_rows_into` for entry ``bad`` (its key was read before
    the entries before it were overwritten, so ``keys[bad]`` is still the key)."""
    if outside:
        raise ValueError(f"key {keys[bad]} is outside the key space [0, {num_keys})")
    raise ValueError(f"key {keys[bad]} does not belong to this server (key range "
                     f"[{lo}, {hi}) of the permuted space)")


cdef Py_ssize_t local_rows_ptr(const int64_t* keys, Py_ssize_t m, uint64_t n, uint64_t a,
                               uint64_t lo, uint64_t hi, int64_t* out,
                               int* outside) noexcept nogil:
    """``out[i] = p(keys[i]) - lo`` for the ``m`` keys at ``keys`` (``out`` may be ``keys``);
    returns the first i with a key outside [0, n) (outside = 1) or outside [lo, hi)
    (outside = 0), stopping there, else -1. ``n`` >= 1. For C callers (keys.pxd:
    :func:`hpcps.comm.fastpath.step_parts`)."""
    cdef Py_ssize_t i
    cdef uint64_t r, mn = (<uint64_t>0xFFFFFFFFFFFFFFFF) // n
    for i in range(m):
        r = _local_row(<uint64_t>keys[i], n, a, mn, lo, hi, outside)
        if r == NOT_HERE:
            return i
        out[i] = <int64_t>r
    return -1


cdef Py_ssize_t take_rows_ptr(const char* w, uint64_t num_rows, Py_ssize_t rowb,
                              const int64_t* rows, Py_ssize_t m, char* out) noexcept nogil:
    """out row i = w row ``rows[i]`` (rows of ``rowb`` bytes) for the ``m`` local rows at
    ``rows``; returns the first i with a row outside [0, num_rows), stopping there, else -1
    (for C callers, keys.pxd: :func:`hpcps.comm.fastpath.send_rows`)."""
    cdef Py_ssize_t i
    cdef uint64_t r
    for i in range(m):
        r = <uint64_t>rows[i]
        if r >= num_rows:
            return i
        _copy_row(out, i, w, r, rowb)
    return -1


cdef bint finite_ptr(const void* v, Py_ssize_t nbytes, int itemsize) noexcept nogil:
    """Whether the ``nbytes`` bytes at ``v``, float32 (``itemsize`` 4) or float64 (8) values,
    are all finite (for C callers, keys.pxd)."""
    if itemsize == 4:
        return _finite32(<const uint32_t*>v, nbytes // 4)
    return _finite64(<const uint64_t*>v, nbytes // 8)


cdef Py_ssize_t gather_local_ptr(const int64_t* keys, Py_ssize_t m, uint64_t n, uint64_t a,
                                 uint64_t lo, uint64_t hi, const char* w, Py_ssize_t rowb,
                                 char* out, int* outside, Py_ssize_t ahead) noexcept nogil:
    """out row i = w row p(keys[i]) - lo for the ``m`` keys at ``keys`` (rows of ``rowb``
    bytes); returns the first i with a key outside [0, n) (outside = 1) or outside [lo, hi)
    (outside = 0), else -1 (declared in keys.pxd for C callers: :mod:`hpcps.comm.fastpath`). With ``ahead`` > 0 the local row of
    the key ``ahead`` entries on is computed first and its row prefetched (random rows of a
    table larger than the caches: latency bound), each key's row computed once and kept in
    a ring until its turn (``ahead`` at most 63)."""
    cdef Py_ssize_t i, j
    cdef uint64_t r, q, mn = (<uint64_t>0xFFFFFFFFFFFFFFFF) // n
    cdef uint64_t ring[64]            # ring[i & 63]: the row of key i (computed ahead)
    if ahead > 63:
        ahead = 63
    if ahead > m:
        ahead = m
    if ahead > 0:
        for j in range(ahead):       # rows of the first keys, prefetched
            r = _local_row(<uint64_t>keys[j], n, a, mn, lo, hi, outside)
            if r == NOT_HERE:
                return j
            ring[j] = r
            hpcps_keys_prefetch_span(w + r * rowb, rowb)
        for i in range(m):
            r = ring[i & 63]
            j = i + ahead
            if j < m:
                q = _local_row(<uint64_t>keys[j], n, a, mn, lo, hi, outside)
                if q == NOT_HERE:
                    return j
                ring[j & 63] = q
                hpcps_keys_prefetch_span(w + q * rowb, rowb)
            _copy_row(out, i, w, r, rowb)
        return -1
    for i in range(m):
        r = _local_row(<uint64_t>keys[i], n, a, mn, lo, hi, outside)
        if r == NOT_HERE:
            return i
        _copy_row(out, i, w, r, rowb)
    return -1


def gather_local(keys, int64_t num_keys, int64_t multiplier, int64_t lo, int64_t hi, w, out,
                 Py_ssize_t ahead=0):
    """A pull at its server, in one pass: ``out[i] = w[p(keys[i]) - lo]`` (the rows of the
    keys, no array of local rows in between).

    Parameters
    ----------
    keys : ndarray of int64, shape (n,), C-contiguous
    num_keys, multiplier, lo, hi : int
        As :func:`push_rows_inplace`.
    w : ndarray, shape (hi - lo, dim), C-contiguous
        The shard's rows.
    out : ndarray, shape (n, dim), dtype of ``w``, C-contiguous, writeable
    ahead : int
        0, or prefetch the row of the key this many entries on (at most 63; for large pulls
        of a table larger than the caches: no array of local rows in between, unlike
        :func:`local_rows_into` followed by a prefetching gather).

    Returns
    -------
    out

    Raises
    ------
    ValueError
        Naming the first key outside ``[0, num_keys)`` or ``[lo, hi)``, or for ``w``/``out``
        of different dtypes, shapes or layouts.
    """
    if (w.dtype != out.dtype or w.ndim != 2 or out.shape != (keys.shape[0], w.shape[1])
            or not w.flags.c_contiguous or not out.flags.c_contiguous
            or w.shape[0] != hi - lo):
        raise ValueError(f"gather_local: w {w.dtype} {w.shape} and out {out.dtype} "
                         f"{out.shape} do not fit {keys.shape[0]} keys of the range [{lo}, {hi})")
    cdef const int64_t[::1] kv = keys
    cdef const unsigned char[::1] wb = w.reshape(-1).view(np.uint8)
    cdef unsigned char[::1] ob = out.reshape(-1).view(np.uint8)
    cdef uint64_t un = <uint64_t>num_keys, ua = <uint64_t>multiplier if num_keys > 1 else 1
    cdef Py_ssize_t rowb = w.shape[1] * w.itemsize, bad = -1
    cdef int outside = 0
    if kv.shape[0] == 0 or rowb == 0:
        return out
    if wb.shape[0] == 0:              # an empty shard: every key is someone else's
        return local_rows_into(keys, num_keys, multiplier, lo, hi, np.empty_like(keys))
    with nogil:
        bad = gather_local_ptr(&kv[0], kv.shape[0], un, ua, <uint64_t>lo, <uint64_t>hi,
                               <const char*>&wb[0], rowb, <char*>&ob[0], &outside, ahead)
    if bad >= 0:
        _raise_row(keys, bad, outside, num_keys, lo, hi)
    return out
