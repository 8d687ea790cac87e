"""Server-side update rules and the duplicate-key merge (Cython, ``nogil``).

Every public function validates its inputs at the Python level (dtype, number of
dimensions, contiguity, matching shapes, row bounds) and raises ``TypeError`` /
``ValueError`` with a message naming the offending argument or value; the numeric loops
then run without the GIL over typed memoryviews, specialised for float32 and float64
(Cython's fused type ``floating``). Hyper-parameters are cast to the table's dtype, so a
float32 table is updated in float32 arithmetic, like numpy does for ``w -= lr * g``.

Update rules (per element, ``g = scale * grad + l2 * w`` the scaled, L2-regularised
gradient of one row)::

    sgd      w -= lr * g
    adagrad  acc += g * g;  w -= lr * g / (sqrt(acc) + eps)
    adam     t += 1 (per row);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g * g;
             w -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)
    ftrl     sigma = (sqrt(n + g * g) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g * g;
             w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2')

SGD: Robbins & Monro, "A stochastic approximation method", Ann. Math. Statist. 1951;
AdaGrad: Duchi, Hazan & Singer, "Adaptive subgradient methods for online learning and
stochastic optimization", JMLR 12, 2011 (diagonal version, §1.1); used by Downpour
SGD, Dean et al., "Large scale distributed deep networks", NIPS 2012, §4.1;
Adam: Kingma & Ba, "Adam: a method for stochastic optimization", ICLR 2015, Algorithm 1
(lazy: touched rows only, bias correction by the row's own update count);
FTRL-Proximal: McMahan et al., "Ad click prediction: a view from the trenches", KDD 2013,
Algorithm 1 (per coordinate, L1 ``l1`` giving exact zeros and L2 ``l2'``).

State layout: AdaGrad's accumulator is an array shaped like the table. Adam and FTRL keep
a row's whole state in one packed record (:func:`state_dtype`: ``m, v, step`` or ``z, n``),
so updating a random row of a large table touches two cache lines (its weights and its
record) instead of one per slot; the weights stay a separate (R, dim) array because
workers read them (pulls, RMA windows).

The sparse rules assume unique rows: a row that appeared twice would receive the L2 term
twice and, for the adaptive rules, two state updates instead of one for the summed
gradient. :func:`apply_sparse` therefore sums duplicate keys with :func:`merge_duplicates`
first — unlike ``w[idx] -= g``, which silently applies only one of several duplicates.
"""

import math
import operator
import threading

import numpy as np

from cython cimport floating
from libc.math cimport copysign, copysignf, fabs, fabsf, pow, sqrt
from libc.stdint cimport int64_t, uint8_t, uint64_t
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer

from hpcps.kernels.keys cimport finite_ptr
from hpcps.kernels.keys import sort_u64

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define hpcps_prefetch(p) __builtin_prefetch((const void *)(p))
    #define hpcps_ctz64(x) __builtin_ctzll(x)
    #else
    #define hpcps_prefetch(p) ((void)0)
    static int hpcps_ctz64(unsigned long long x) { int n = 0; while (!(x & 1u)) { x >>= 1; n++; } return n; }
    #endif
    /* every cache line of [p, p + n), n > 0 bytes (a macro: GCC 12 dropped the prefetches
       of an inline function) */
    #define hpcps_prefetch_span(p, n) do { \
        const char *hpcps_p_ = (const char *)(p), *hpcps_e_ = hpcps_p_ + (n) - 1; \
        for (; hpcps_p_ < hpcps_e_; hpcps_p_ += 64) hpcps_prefetch(hpcps_p_); \
        hpcps_prefetch(hpcps_e_); \
    } while (0)
    """
    void hpcps_prefetch(const void* p) noexcept nogil
    void hpcps_prefetch_span(const void* p, Py_ssize_t n) noexcept nogil
    int hpcps_ctz64(uint64_t x) noexcept nogil

# How many entries ahead the gather in _accumulate_packed prefetches its source row, and
# the scatter of apply_sparse its target row (16 measured best of 0/16/64 there).
cdef enum:
    _PREFETCH_AHEAD = 64
    _PREFETCH_SCATTER = 16

__all__ = [
    "OPTIMIZERS",
    "merge_duplicates",
    "sparse_sgd",
    "sparse_adagrad",
    "sparse_adam",
    "sparse_ftrl",
    "dense_sgd",
    "dense_adagrad",
    "dense_adam",
    "dense_ftrl",
    "apply_sparse",
    "take_rows",
    "rows_finite",
    "state_dtype",
    "new_state",
]

#: Names accepted by :func:`apply_sparse`.
OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")

# merge_duplicates: use the counting path (an int64 array over the key span) when the span
# is at most _DENSE_SPAN_FACTOR * n + _DENSE_SPAN_SLACK keys; otherwise sort.
_DENSE_SPAN_FACTOR = 4
_DENSE_SPAN_SLACK = 1 << 16
# apply_sparse: sum duplicates by a scatter into a zeroed (R, dim) buffer plus a bitmap of
# touched rows when R <= _SCATTER_ROWS_PER_KEY * n + _DENSE_SPAN_SLACK and the buffer takes at
# most _SCRATCH_MAX_BYTES (kept between calls up to that size); otherwise merge by sorting.
# The walk of the bitmap costs about R / 64 word reads, a sort ~50 ns per key here, so the
# scatter wins up to tables far larger than the push (measured: 10 M keys into 64 M rows,
# scatter + walk ~0.1 s, packed sort ~0.5-0.9 s on a loaded 2-core VM).
_SCATTER_ROWS_PER_KEY = 64
# ... and up to _SCATTER_ROWS_PER_KEY_CACHED rows per key when the (R, dim) buffer takes at
# most _SCATTER_CACHED_BYTES (it stays in cache; the radix merge of 4cf9635 costs ~15 ns per
# key): AdaGrad, float32, dim 1, 2026-12-04 on the 2-core test VM, merge / scatter time
# 1.51 at 8,100 keys into 2^20 rows (R/n 129; a BSP step of 3 Adult workers), 1.35 at R/n
# 258 (2^21 rows), 1.30 at 262 (2^19), 1.13 at 388, 0.96 at 517; 16 MiB and larger buffers
# kept the rule above (0.89 at R/n 51 with 2^22 rows, 0.44 at 2^24 rows and R/n 2,071).
_SCATTER_ROWS_PER_KEY_CACHED = 256
_SCATTER_CACHED_BYTES = 8 << 20
# apply_sparse: pushes of at most this many keys are checked for duplicates by comparing every
# pair (n^2 / 2 compares, ~1 us at 64) and, when distinct, stepped without the merge's sort and
# temporaries (issue 20: ~10 us of a small push's apply)
_DISTINCT_MAX = 64
# ... and larger pushes by one pass with a bitmap of the table's rows (kept, as the scatter
# path's), for tables of at most this many rows (a 256 MiB bitmap): a worker pushes distinct
# keys, and stepping them in input order skips the scatter's sum buffer and the bitmap walk
# (AdaGrad, float32, dim 1, 2,657 keys into 2^20 rows, an async Adult push: 46 -> 23 us;
# 100,000 keys into 2^24 rows: 1.67 -> 1.27 ms; 2026-12-05 on the 2-core test VM)
_DISTINCT_BITMAP_ROWS = 1 << 31
_SCRATCH_MAX_BYTES = 1 << 30


# --------------------------------------------------------------------------------------
# Python-level validation helpers
# --------------------------------------------------------------------------------------

def _float_dtype(a, name):
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must have dtype float32 or float64, got {a.dtype}")


def _inplace_array(a, name, ndim):
    """``a`` must be a writeable C-contiguous float32/float64 ndarray with ``ndim`` dims."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} is updated in place and must be a numpy.ndarray, "
                        f"got {type(a).__name__}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    _float_dtype(a, name)
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (it is updated in place)")
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only but is updated in place")
    return a


def _int64_vector(a, name):
    """``a`` as a C-contiguous int64 1-D array (integer input only; copies if needed)."""
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype != np.int64:
        if a.size == 0:
            return np.empty(0, dtype=np.int64)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype (int64), got {a.dtype}")
        if a.dtype == np.uint64 and a.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} has value {int(a.max())} > 2**63 - 1")
    return np.ascontiguousarray(a, dtype=np.int64)


def _values_like(a, name, dtype, ndim):
    """Read-only input ``a``: must have ``dtype`` and ``ndim`` dims; made C-contiguous."""
    a = np.asarray(a)
    if a.dtype != dtype:
        raise TypeError(f"{name} has dtype {a.dtype} but must have dtype {np.dtype(dtype)} "
                        f"(the dtype of w)")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return np.ascontiguousarray(a)


def _finite(x, name):
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def _positive(x, name):
    x = _finite(x, name)
    if not x > 0.0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return x


def _row_error(name, Py_ssize_t i, value, num_rows):
    return ValueError(f"{name}[{i}] = {value} is out of range [0, {num_rows}) "
                      f"(w has {num_rows} rows)")


def _check_rows(const int64_t[::1] rows, int64_t num_rows, name="rows"):
    """Raise ValueError naming the first entry of ``rows`` outside ``[0, num_rows)``."""
    cdef Py_ssize_t i, bad = -1, n = rows.shape[0]
    with nogil:
        for i in range(n):
            if <uint64_t>rows[i] >= <uint64_t>num_rows:
                bad = i
                break
    if bad >= 0:
        raise _row_error(name, bad, rows[bad], num_rows)


def _check_sparse_args(w, rows, grads):
    w = _inplace_array(w, "w", 2)
    rows = _int64_vector(rows, "rows")
    grads = _values_like(grads, "grads", w.dtype, 2)
    if grads.shape[0] != rows.shape[0]:
        raise ValueError(f"grads has {grads.shape[0]} rows but rows has {rows.shape[0]} entries")
    if grads.shape[1] != w.shape[1]:
        raise ValueError(f"grads has {grads.shape[1]} columns but w has dim {w.shape[1]}")
    return w, rows, grads


# --------------------------------------------------------------------------------------
# merge_duplicates
# --------------------------------------------------------------------------------------

cdef void _minmax(const int64_t[::1] keys, int64_t* kmin, int64_t* kmax) noexcept nogil:
    cdef Py_ssize_t i
    cdef int64_t lo = keys[0], hi = keys[0], k
    for i in range(1, keys.shape[0]):
        k = keys[i]
        if k < lo:
            lo = k
        elif k > hi:
            hi = k
    kmin[0] = lo
    kmax[0] = hi


cdef int64_t _rank_span(const int64_t[::1] keys, int64_t kmin, int64_t[::1] pos,
                        int64_t[::1] ukeys) noexcept nogil:
    """Counting pass over the key span [kmin, kmin + len(pos)); ``pos`` zero-filled.

    On return ``pos[k - kmin]`` is 1 + the rank of ``k`` among the distinct keys (0 if
    absent), ``ukeys[:m]`` holds the distinct keys in ascending order; returns m.
    """
    cdef Py_ssize_t i, s
    cdef int64_t m = 0
    for i in range(keys.shape[0]):
        pos[<uint64_t>keys[i] - <uint64_t>kmin] = 1
    for s in range(pos.shape[0]):
        if pos[s]:
            ukeys[m] = <int64_t>(<uint64_t>kmin + <uint64_t>s)
            m += 1
            pos[s] = m
    return m


cdef _accumulate_by_pos(const int64_t[::1] keys, int64_t kmin, const int64_t[::1] pos,
                        const floating[:, ::1] values, floating[:, ::1] out):
    """``out[rank(keys[i])] += values[i]`` for i = 0, 1, ... (input order; out zero-filled)."""
    cdef Py_ssize_t i, j, r, n = values.shape[0], dim = values.shape[1]
    with nogil:
        for i in range(n):
            r = pos[<uint64_t>keys[i] - <uint64_t>kmin] - 1
            for j in range(dim):
                out[r, j] += values[i, j]


cdef Py_ssize_t _count_runs_packed(const uint64_t[::1] packed, int ibits) noexcept nogil:
    cdef Py_ssize_t t, m = 0
    cdef uint64_t h, prev = 0
    for t in range(packed.shape[0]):
        h = packed[t] >> ibits
        if t == 0 or h != prev:
            m += 1
            prev = h
    return m


cdef _accumulate_packed(const uint64_t[::1] packed, int ibits, int64_t kmin,
                        const floating[:, ::1] values, int64_t[::1] ukeys,
                        floating[:, ::1] out):
    """Walk ``packed`` = sorted ``(key - kmin) << ibits | i``: equal keys are contiguous and
    in increasing i (input order); ``out[run] += values[i]`` (out zero-filled)."""
    cdef Py_ssize_t t, j, i, m = -1, n = packed.shape[0], dim = values.shape[1]
    cdef uint64_t h, prev = 0, mask = (<uint64_t>1 << ibits) - 1
    with nogil:
        for t in range(n):
            if t + _PREFETCH_AHEAD < n:  # the gather below is random: fetch rows early
                hpcps_prefetch(&values[<Py_ssize_t>(packed[t + _PREFETCH_AHEAD] & mask), 0])
            h = packed[t] >> ibits
            i = <Py_ssize_t>(packed[t] & mask)
            if m < 0 or h != prev:
                m += 1
                prev = h
                ukeys[m] = <int64_t>(h + <uint64_t>kmin)
            for j in range(dim):
                out[m, j] += values[i, j]


def _merge_counting(keys, int64_t kmin, span, values):
    cdef const int64_t[::1] kv = keys
    cdef int64_t m
    pos = np.zeros(span, dtype=np.int64)
    ukeys = np.empty(min(span, keys.shape[0]), dtype=np.int64)
    cdef int64_t[::1] pos_v = pos, uk_v = ukeys
    with nogil:
        m = _rank_span(kv, kmin, pos_v, uk_v)
    out = np.zeros((m, values.shape[1]), dtype=values.dtype)
    if values.dtype == np.float32:
        _accumulate_by_pos[float](kv, kmin, pos_v, values, out)
    else:
        _accumulate_by_pos[double](kv, kmin, pos_v, values, out)
    return ukeys[:m], out


cdef void _pack(const int64_t[::1] keys, int64_t kmin, int ibits,
                uint64_t[::1] out) noexcept nogil:
    """out[i] = (keys[i] - kmin) << ibits | i."""
    cdef Py_ssize_t i
    for i in range(keys.shape[0]):
        out[i] = ((<uint64_t>keys[i] - <uint64_t>kmin) << ibits) | <uint64_t>i


cdef bint _distinct(const int64_t[::1] keys) noexcept:
    """Whether no value of ``keys`` repeats (every pair compared: for short arrays)."""
    cdef Py_ssize_t i, j, n = keys.shape[0]
    cdef int64_t k
    with nogil:
        for i in range(1, n):
            k = keys[i]
            for j in range(i):
                if keys[j] == k:
                    return False
    return True


def _merge(keys, values):
    """merge_duplicates on validated inputs (keys int64 (n,), values C-contiguous (n, dim))."""
    cdef const int64_t[::1] kv = keys
    cdef int64_t kmin, kmax
    cdef uint64_t span
    cdef Py_ssize_t n = kv.shape[0], m
    if n == 0 or values.shape[1] == 0:
        ukeys = np.unique(keys)
        return ukeys, np.zeros((ukeys.shape[0], values.shape[1]), dtype=values.dtype)
    with nogil:
        _minmax(kv, &kmin, &kmax)
    span = <uint64_t>kmax - <uint64_t>kmin + 1  # 0 if the keys cover all 2**64 values
    if span != 0 and span <= <uint64_t>(_DENSE_SPAN_FACTOR * n + _DENSE_SPAN_SLACK):
        # Distribution counting over the span: O(n + span), no comparison sort.
        return _merge_counting(keys, kmin, span, values)
    ibits = max(int(n - 1).bit_length(), 1)
    sbits = int(span - 1).bit_length() if span != 0 else 64
    if ibits + sbits > 64:
        # Keys too spread out to pack with their index: rank them with np.unique first.
        ukeys, inv = np.unique(keys, return_inverse=True)
        inv = np.ascontiguousarray(inv.reshape(-1), dtype=np.int64)
        return ukeys, _merge_counting(inv, 0, ukeys.shape[0], values)[1]
    # Pack (key - kmin, i) into one uint64: the packed values are distinct, so any sort gives
    # exactly the (key, input position) order; radix passes over the ibits + sbits bits from
    # 640 values on (numpy's sort was 3-5x slower on the test machine: keys.radix_sort_u64)
    packed = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] pw = packed
    cdef int ib = ibits
    with nogil:                         # one pass, no temporaries (issue 20: small pushes)
        _pack(kv, kmin, ib, pw)
    sort_u64(packed, ibits + sbits)
    cdef const uint64_t[::1] pv = packed
    with nogil:
        m = _count_runs_packed(pv, ib)
    ukeys = np.empty(m, dtype=np.int64)
    out = np.zeros((m, values.shape[1]), dtype=values.dtype)
    if values.dtype == np.float32:
        _accumulate_packed[float](pv, ib, kmin, values, ukeys, out)
    else:
        _accumulate_packed[double](pv, ib, kmin, values, ukeys, out)
    return ukeys, out


def merge_duplicates(keys, values):
    """Sum the rows of ``values`` that share a key.

    Parameters
    ----------
    keys : ndarray of int64, shape (n,)
        Row keys, duplicates allowed, any int64 value (other integer dtypes are converted).
    values : ndarray of float32 or float64, shape (n, dim)
        One row per key (copied to C order if it is not).

    Returns
    -------
    unique_keys : ndarray of int64, shape (m,)
        The distinct keys, sorted ascending.
    summed : ndarray, shape (m, dim), dtype of ``values``
        ``summed[u] = sum of values[i] over i with keys[i] == unique_keys[u]``.

    Raises
    ------
    TypeError
        If ``keys`` is not integer or ``values`` is not float32/float64.
    ValueError
        If ``keys`` is not 1-D, ``values`` is not 2-D, or their lengths differ.

    Notes
    -----
    Deterministic: each output row starts at +0.0 and adds its input rows in input order,
    so the result is bitwise equal to ``np.add.at(np.zeros((m, dim)), inverse, values)``
    with ``unique_keys, inverse = np.unique(keys, return_inverse=True)``.
    Algorithm: when ``max(keys) - min(keys)`` is at most about 4n, distribution counting
    over that span (Knuth, TAOCP vol. 3, 2nd ed., §5.2, Algorithm D) ranks the keys in
    O(n + span); otherwise the pairs ``(key - min(keys), i)`` are packed into one uint64
    each and sorted (all distinct, so any sort gives the stable order), and equal-key runs
    are summed walking the sorted pairs; keys too spread out to pack are ranked with
    ``np.unique``. Empty input gives outputs of shape (0,) and (0, dim).
    """
    keys = _int64_vector(keys, "keys")
    values = np.asarray(values)
    _float_dtype(values, "values")
    if values.ndim != 2:
        raise ValueError(f"values must be 2-D (n, dim), got shape {values.shape}")
    if values.shape[0] != keys.shape[0]:
        raise ValueError(f"values has {values.shape[0]} rows but keys has {keys.shape[0]} entries")
    return _merge(keys, np.ascontiguousarray(values))


# --------------------------------------------------------------------------------------
# Update rules
# --------------------------------------------------------------------------------------

# Rule codes of the generic row loops.
cdef enum:
    _R_SGD = 0
    _R_ADAGRAD = 1
    _R_ADAM = 2
    _R_FTRL = 3

_RULE_CODES = {"sgd": _R_SGD, "adagrad": _R_ADAGRAD, "adam": _R_ADAM, "ftrl": _R_FTRL}

# The row loops prefetch the weights and state of the row `ahead` entries ahead, with
# ahead = clamp(_PREFETCH_LINES / (cache lines per row), 2, _PREFETCH_MAX_ROWS): about
# _PREFETCH_LINES lines requested ahead, whatever the row width (from a sweep of sparse
# pushes into 4-16 M-row float32 tables: at dim 1, 64 rows ahead ran 1.9x the speed of 24
# rows ahead and about 3x that of 8; wider rows gained little beyond 48 lines).
_PREFETCH_LINES = 128
_PREFETCH_MAX_ROWS = 64
_PREFETCH_DENSE = 8         # no software prefetch when rows >= table rows / 8


ctypedef struct _Hyper:
    int rule
    double lr           # sgd/adagrad/adam: learning rate; ftrl: alpha
    double l2           # lazy L2 ("magnitude") term added to the gradient, every rule
    double scale        # multiplies the (summed) gradient
    double eps          # adagrad, adam: denominator guard
    double beta1        # adam: decay of the first moment
    double beta2        # adam: decay of the second moment
    int64_t sat1        # adam: 1 - beta1**t == 1.0 (double) for every t >= sat1
    int64_t sat2        # adam: likewise for beta2
    const double* bc_table  # adam: (1 - beta1**t, 1 - beta2**t) for t = 1 .. bc_len
    int64_t bc_len
    double beta         # ftrl: beta of the per-coordinate learning rate
    double lambda1      # ftrl: L1 strength (closed form, exact zeros)
    double lambda2      # ftrl: L2 strength (closed form)


cdef inline void _sgd_row(floating* w, const floating* grad, Py_ssize_t dim, floating lr,
                          floating l2, floating scale) noexcept nogil:
    """w[:dim] -= lr * (scale * grad + l2 * w) — the one place the SGD rule is written."""
    cdef Py_ssize_t j
    cdef floating g
    for j in range(dim):
        g = scale * grad[j] + l2 * w[j]
        w[j] = w[j] - lr * g


cdef inline void _adagrad_row(floating* w, floating* acc, const floating* grad, Py_ssize_t dim,
                              floating lr, floating l2, floating scale,
                              floating eps) noexcept nogil:
    """The diagonal AdaGrad rule on ``dim`` contiguous elements."""
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
    """Adam (Kingma & Ba, Algorithm 1) on ``dim`` contiguous elements; ``bc1 = 1 - b1**t``
    and ``bc2 = 1 - b2**t`` are the bias corrections of this step ``t``."""
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


cdef inline double _bias_correction(double beta, int64_t t, int64_t sat) noexcept nogil:
    """``1 - beta**t`` in double; exactly 1.0 (what the formula rounds to) once t >= sat."""
    if t >= sat:
        return 1.0
    return 1.0 - pow(beta, <double>t)


cdef inline void _ftrl_row(floating* w, floating* z, floating* n, const floating* grad,
                           Py_ssize_t dim, floating alpha, floating beta, floating l1,
                           floating l2p, floating l2, floating scale) noexcept nogil:
    """FTRL-Proximal (McMahan et al. 2013, Algorithm 1) on ``dim`` contiguous coordinates:
    ``w`` holds the closed-form weights of the current ``(z, n)`` before the update.

    The closed form is branch-free in the sign of z (random signs would mispredict):
    ``a = max(|z| - l1, 0)``, ``w = copysign(a, -z) / d + 0`` (the ``+ 0`` turns the -0.0
    of a zeroed coordinate into +0.0; it changes no other value)."""
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
        a = a if a > 0 else 0                          # exact zero when |z| <= lambda1
        d = (beta + sn) / alpha + l2p
        if d > 0:
            if floating is float:
                w[j] = copysignf(a, -zj) / d + <floating>0
            else:
                w[j] = copysign(a, -zj) / d + <floating>0
        else:                                          # beta = lambda2 = 0 and n = 0:
            w[j] = 0                                   # no curvature yet, stay at 0


# One loop per rule (separate functions: each gets its registers to itself). Each updates
# rows ``rows[i]`` (validated, unique) of ``w`` and of the state at ``st`` (``stride`` bytes
# per row) with gradient row ``grads[i]``. Rows are sorted but sparse in a large table,
# which the hardware prefetcher does not foresee: the loops prefetch the weights and state
# of the row ``ahead`` entries ahead (0: none).

cdef void _sgd_rows(floating* w, Py_ssize_t dim, const int64_t* rows, Py_ssize_t m,
                    const floating* grads, Py_ssize_t ahead, const _Hyper* hp) noexcept nogil:
    cdef Py_ssize_t i, r, wb = dim * sizeof(floating)
    cdef floating lr = <floating>hp.lr, l2 = <floating>hp.l2, scale = <floating>hp.scale
    if ahead == 0:                    # (a loop of its own: the test costs the dense case)
        for i in range(m):
            _sgd_row(w + rows[i] * dim, grads + i * dim, dim, lr, l2, scale)
        return
    for i in range(m):
        if i + ahead < m:
            hpcps_prefetch_span(w + rows[i + ahead] * dim, wb)
        r = rows[i]
        _sgd_row(w + r * dim, grads + i * dim, dim, lr, l2, scale)


cdef void _adagrad_rows(floating* w, Py_ssize_t dim, char* st, Py_ssize_t stride,
                        const int64_t* rows, Py_ssize_t m, const floating* grads,
                        Py_ssize_t ahead, const _Hyper* hp) noexcept nogil:
    cdef Py_ssize_t i, r, q, wb = dim * sizeof(floating)
    cdef floating lr = <floating>hp.lr, l2 = <floating>hp.l2, scale = <floating>hp.scale
    cdef floating eps = <floating>hp.eps
    for i in range(m):
        if ahead and i + ahead < m:
            q = rows[i + ahead]
            hpcps_prefetch_span(w + q * dim, wb)
            hpcps_prefetch_span(st + q * stride, stride)
        r = rows[i]
        _adagrad_row(w + r * dim, <floating*>(st + r * stride), grads + i * dim, dim,
                     lr, l2, scale, eps)


cdef void _adam_rows(floating* w, Py_ssize_t dim, char* st, Py_ssize_t stride,
                     const int64_t* rows, Py_ssize_t m, const floating* grads,
                     Py_ssize_t ahead, const _Hyper* hp) noexcept nogil:
    cdef Py_ssize_t i, r, q, wb = dim * sizeof(floating)
    cdef floating lr = <floating>hp.lr, l2 = <floating>hp.l2, scale = <floating>hp.scale
    cdef floating eps = <floating>hp.eps, b1 = <floating>hp.beta1, b2 = <floating>hp.beta2
    cdef const double* table = hp.bc_table
    cdef int64_t t, T = hp.bc_len
    cdef floating* s
    cdef int64_t* step
    cdef double bc1, bc2
    for i in range(m):
        if ahead and i + ahead < m:
            q = rows[i + ahead]
            hpcps_prefetch_span(w + q * dim, wb)
            hpcps_prefetch_span(st + q * stride, stride)
        r = rows[i]
        s = <floating*>(st + r * stride)
        step = <int64_t*>(s + 2 * dim)          # record (m[dim], v[dim], step): 8-aligned
        t = step[0] + 1
        step[0] = t
        if t <= T:                              # 1 - beta**t from the table (no pow)
            bc1 = table[2 * (t - 1)]
            bc2 = table[2 * (t - 1) + 1]
        else:
            bc1 = _bias_correction(hp.beta1, t, hp.sat1)
            bc2 = _bias_correction(hp.beta2, t, hp.sat2)
        _adam_row(w + r * dim, s, s + dim, grads + i * dim, dim, lr, l2, scale, b1, b2, eps,
                  <floating>bc1, <floating>bc2)


cdef void _ftrl_rows(floating* w, Py_ssize_t dim, char* st, Py_ssize_t stride,
                     const int64_t* rows, Py_ssize_t m, const floating* grads,
                     Py_ssize_t ahead, const _Hyper* hp) noexcept nogil:
    cdef Py_ssize_t i, r, q, wb = dim * sizeof(floating)
    cdef floating alpha = <floating>hp.lr, l2 = <floating>hp.l2, scale = <floating>hp.scale
    cdef floating beta = <floating>hp.beta, l1 = <floating>hp.lambda1
    cdef floating l2p = <floating>hp.lambda2
    cdef floating* s
    for i in range(m):
        if ahead and i + ahead < m:
            q = rows[i + ahead]
            hpcps_prefetch_span(w + q * dim, wb)
            hpcps_prefetch_span(st + q * stride, stride)
        r = rows[i]
        s = <floating*>(st + r * stride)
        _ftrl_row(w + r * dim, s, s + dim, grads + i * dim, dim, alpha, beta, l1, l2p, l2,
                  scale)


cdef _rows_step(floating[:, ::1] w, char* st, Py_ssize_t stride, const int64_t[::1] rows,
                const floating[:, ::1] grads, const _Hyper* hp):
    cdef Py_ssize_t m = rows.shape[0], dim = w.shape[1], ahead
    cdef Py_ssize_t lines = (dim * sizeof(floating) + 63) // 64 + (stride + 63) // 64
    if m == 0 or dim == 0:
        return
    ahead = max(2, min(_PREFETCH_MAX_ROWS, _PREFETCH_LINES // lines))
    if m * _PREFETCH_DENSE >= w.shape[0]:
        ahead = 0           # the rows cover much of the table: the hardware prefetcher sees a stream
    with nogil:
        if hp.rule == _R_SGD:
            _sgd_rows(&w[0, 0], dim, &rows[0], m, &grads[0, 0], ahead, hp)
        elif hp.rule == _R_ADAGRAD:
            _adagrad_rows(&w[0, 0], dim, st, stride, &rows[0], m, &grads[0, 0], ahead, hp)
        elif hp.rule == _R_ADAM:
            _adam_rows(&w[0, 0], dim, st, stride, &rows[0], m, &grads[0, 0], ahead, hp)
        else:
            _ftrl_rows(&w[0, 0], dim, st, stride, &rows[0], m, &grads[0, 0], ahead, hp)


cdef Py_ssize_t _scatter_bits(const int64_t[::1] keys, const floating[:, ::1] grads,
                              floating* G, uint64_t* bits, Py_ssize_t R) noexcept nogil:
    """``G[keys[i]] += grads[i]`` in input order (G: a zeroed (R, dim) buffer), setting bit
    ``keys[i]`` of the bitmap ``bits``; returns the first i with keys[i] outside [0, R)
    (stopping there), else -1."""
    cdef Py_ssize_t i, j, n = keys.shape[0], dim = grads.shape[1]
    cdef uint64_t k, q, uR = <uint64_t>R
    cdef floating* row
    for i in range(n):
        if i + _PREFETCH_SCATTER < n:
            q = <uint64_t>keys[i + _PREFETCH_SCATTER]
            if q < uR:
                hpcps_prefetch(G + q * dim)
                hpcps_prefetch(bits + (q >> 6))
        k = <uint64_t>keys[i]
        if k >= uR:
            return i
        bits[k >> 6] |= (<uint64_t>1) << (k & 63)
        if dim == 1:
            G[k] += grads[i, 0]
        else:
            row = G + k * dim
            for j in range(dim):
                row[j] += grads[i, j]
    return -1


cdef bint _distinct_bits(const int64_t[::1] keys, uint64_t* bits, uint64_t R) noexcept nogil:
    """Whether every key is in ``[0, R)`` and none repeats, by a bitmap of ``R`` bits (all
    zero on entry and on return: the bits set are cleared); O(n)."""
    cdef Py_ssize_t i, j, n = keys.shape[0], stop = n
    cdef uint64_t k, m
    for i in range(n):
        k = <uint64_t>keys[i]
        if k >= R:
            stop = i
            break
        m = (<uint64_t>1) << (k & 63)
        if bits[k >> 6] & m:
            stop = i
            break
        bits[k >> 6] |= m
    for j in range(stop):
        k = <uint64_t>keys[j]
        bits[k >> 6] &= ~((<uint64_t>1) << (k & 63))
    return stop == n


cdef Py_ssize_t _take_touched(uint64_t* bits, Py_ssize_t nwords, floating* G, Py_ssize_t dim,
                              int64_t* rows, floating* out) noexcept nogil:
    """Walk the bitmap in ascending row order: ``rows[m] = r``, ``out[m] = G[r]`` for every
    set bit r, clearing the bit and zeroing ``G[r]`` (the buffers are left all zero for the
    next push); returns the number of rows m."""
    cdef Py_ssize_t wi, j, m = 0
    cdef int64_t r
    cdef uint64_t x
    cdef floating* g
    for wi in range(nwords):
        x = bits[wi]
        if x == 0:
            continue
        bits[wi] = 0
        while x:
            r = (<int64_t>wi << 6) + hpcps_ctz64(x)
            x &= x - 1
            rows[m] = r
            if dim == 1:
                out[m] = G[r]
                G[r] = 0
            else:
                g = G + r * dim
                for j in range(dim):
                    out[m * dim + j] = g[j]
                    g[j] = 0
            m += 1
    return m


class _Scratch:
    """The zeroed accumulation buffer and touched-row bitmap of :func:`apply_sparse`'s
    scatter path, kept between calls (allocating them per push costs a page fault per 4 KiB:
    ~40 ms for a 64 M-row float32 table here). Invariant: all zero when not in use (the walk
    that reads the sums clears what the scatter set)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._clear()

    def _clear(self):
        self.G = {}         # dtype -> flat zeroed buffer
        self.out = {}       # dtype -> flat buffer for the sums of the touched rows
        self.bits = np.zeros(0, dtype=np.uint64)
        self.rows = np.zeros(0, dtype=np.int64)

    def take(self, Py_ssize_t R, Py_ssize_t dim, Py_ssize_t n, dtype):
        """``(G, bits, rows, out, cached)``: G flat (>= R*dim,) and bits (>= ceil(R/64),)
        zeroed; rows (>= min(n, R),) int64 and out (>= min(n, R)*dim,) for the touched rows.
        Cached buffers are this object's (the caller then holds ``lock`` until
        :meth:`give`), else fresh ones (another thread is using the cache)."""
        cached = self.lock.acquire(blocking=False)
        nw = (R + 63) // 64
        m = min(n, R)
        if not cached:
            return (np.zeros(R * dim, dtype=dtype), np.zeros(nw, dtype=np.uint64),
                    np.empty(m, dtype=np.int64), np.empty(m * dim, dtype=dtype), False)
        G = self.G.get(dtype)
        if G is None or G.shape[0] < R * dim:
            G = self.G[dtype] = np.zeros(R * dim, dtype=dtype)
        out = self.out.get(dtype)
        if out is None or out.shape[0] < m * dim:
            out = self.out[dtype] = np.empty(m * dim, dtype=dtype)
        if self.bits.shape[0] < nw:
            self.bits = np.zeros(nw, dtype=np.uint64)
        if self.rows.shape[0] < m:
            self.rows = np.empty(m, dtype=np.int64)
        return G, self.bits, self.rows, out, True

    def give(self, cached, bint clean):
        """End a use; ``clean`` False (an error left entries set) drops the cached buffers,
        as does a cache grown beyond ``_SCRATCH_MAX_BYTES``."""
        if not cached:
            return
        if not clean or (sum(a.nbytes for d in (self.G, self.out) for a in d.values())
                         + self.bits.nbytes + self.rows.nbytes > _SCRATCH_MAX_BYTES):
            self._clear()
        self.lock.release()


_SCRATCH = _Scratch()


cdef bint _distinct_rows(keys, Py_ssize_t R):
    """Whether the rows ``keys`` (int64) are distinct and in ``[0, R)``: one pass over them
    with the scatter path's kept bitmap (:func:`_distinct_bits`; a fresh one while another
    thread holds it)."""
    cdef const int64_t[::1] kv = keys
    cdef uint64_t[::1] bv
    cdef bint ok
    cached = _SCRATCH.lock.acquire(blocking=False)
    nw = (R + 63) // 64
    try:
        if not cached:
            bits = np.zeros(nw, dtype=np.uint64)
        else:
            if _SCRATCH.bits.shape[0] < nw:
                _SCRATCH.bits = np.zeros(nw, dtype=np.uint64)
            bits = _SCRATCH.bits
        bv = bits
        with nogil:
            ok = _distinct_bits(kv, &bv[0], <uint64_t>R)
    finally:
        if cached:
            _SCRATCH.lock.release()
    return ok


cdef _scatter_path(w, keys, grads, state, _Params p):
    """Sum the gradient rows of equal keys with a scatter into a zeroed (R, dim) buffer and
    a touched-row bitmap, take the touched rows in ascending order with their sums, step
    them. Raises ValueError (nothing modified) for a key outside [0, R)."""
    cdef Py_ssize_t R = w.shape[0], dim = w.shape[1], n = keys.shape[0], bad, m
    cdef Py_ssize_t nw = (R + 63) // 64
    cdef const int64_t[::1] kv = keys
    G, bits, rows, summed, cached = _SCRATCH.take(R, dim, n, w.dtype)
    summed = summed[:min(n, R) * dim].reshape(min(n, R), dim)
    cdef uint64_t[::1] bv = bits
    cdef int64_t[::1] rv = rows
    cdef float[::1] G32
    cdef double[::1] G64
    cdef float[:, ::1] s32
    cdef double[:, ::1] s64
    cdef const float[:, ::1] g32
    cdef const double[:, ::1] g64
    try:
        if w.dtype == np.float32:
            G32, s32, g32 = G, summed, grads
            with nogil:
                bad = _scatter_bits[float](kv, g32, &G32[0], &bv[0], R)
                m = _take_touched[float](&bv[0], nw, &G32[0], dim, &rv[0], &s32[0, 0])
        else:
            G64, s64, g64 = G, summed, grads
            with nogil:
                bad = _scatter_bits[double](kv, g64, &G64[0], &bv[0], R)
                m = _take_touched[double](&bv[0], nw, &G64[0], dim, &rv[0], &s64[0, 0])
        if bad < 0:
            _run_rows(w, state, rows[:m], summed[:m], p)
    except BaseException:
        _SCRATCH.give(cached, False)
        raise
    _SCRATCH.give(cached, True)
    if bad >= 0:
        raise _row_error("keys", bad, keys[bad], R)      # w is untouched so far


cdef Py_ssize_t _take(const floating[:, ::1] w, const int64_t[::1] rows,
                      floating[:, ::1] out, Py_ssize_t ahead) noexcept nogil:
    """out[i] = w[rows[i]], prefetching the row ``ahead`` entries ahead; returns the first i
    with rows[i] outside [0, len(w)) (stopping there), else -1."""
    cdef Py_ssize_t i, j, n = rows.shape[0], dim = w.shape[1]
    cdef Py_ssize_t wb = dim * sizeof(floating)
    cdef uint64_t R = <uint64_t>w.shape[0], r, q
    for i in range(n):
        if i + ahead < n:
            q = <uint64_t>rows[i + ahead]
            if q < R:
                hpcps_prefetch_span(&w[q, 0], wb)
        r = <uint64_t>rows[i]
        if r >= R:
            return i
        if dim == 1:
            out[i, 0] = w[r, 0]
        else:
            for j in range(dim):
                out[i, j] = w[r, j]
    return -1


def rows_finite(w, rows):
    """Whether every value of the rows ``w[rows]`` is finite (no NaN or infinity), read in
    place (no gathered copy): the server's check of the rows an update wrote.

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous
    rows : ndarray of int64, shape (n,)
        Rows in ``[0, R)``, any order, duplicates allowed.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        For a row outside ``[0, R)`` (naming it) or ``w`` not 2-D C-contiguous.
    TypeError
        For ``w`` not float32/float64 or ``rows`` not int64.
    """
    cdef Py_buffer wb, rb
    cdef Py_ssize_t i, n, rowb, bad = -1
    cdef uint64_t R, r
    cdef bint ok = True
    cdef int isz
    cdef const char* wp
    cdef const int64_t* rp
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise ValueError("w must be a 2-D numpy array")
    _float_dtype(w, "w")
    if rows.dtype != np.int64:
        raise TypeError(f"rows must be int64, got {rows.dtype}")
    isz = w.itemsize
    R, rowb = <uint64_t>w.shape[0], w.shape[1] * w.itemsize
    PyObject_GetBuffer(w, &wb, PyBUF_C_CONTIGUOUS)
    try:
        PyObject_GetBuffer(rows, &rb, PyBUF_C_CONTIGUOUS)
        try:
            n = rb.len // 8
            rp = <const int64_t*>rb.buf
            wp = <const char*>wb.buf
            with nogil:
                for i in range(n):
                    r = <uint64_t>rp[i]
                    if r >= R:
                        bad = i
                        break
                    if ok and not finite_ptr(wp + r * rowb, rowb, isz):
                        ok = False
        finally:
            PyBuffer_Release(&rb)
    finally:
        PyBuffer_Release(&wb)
    if bad >= 0:
        raise _row_error("rows", bad, rows[bad], R)
    return ok


def take_rows(w, rows, out):
    """Gather rows of a table into ``out``: ``out[i] = w[rows[i]]`` (a pull's reply).

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous
    rows : ndarray of int64, shape (n,)
        Rows in ``[0, R)``, any order, duplicates allowed.
    out : ndarray, shape (n, dim), dtype of ``w``, C-contiguous, writeable

    Returns
    -------
    out

    Raises
    ------
    TypeError, ValueError
        For other dtypes or shapes, or a row outside ``[0, R)`` (named; ``out`` is then
        partly written).

    Notes
    -----
    Random rows of a table larger than the caches are latency bound; the loop prefetches
    about 128 cache lines ahead (up to 64 rows), like the update loops: 1 M random rows of a
    4 M-row float32 table in ~2.3 ms here, ``np.take`` ~6.4 ms.
    """
    w = np.asarray(w)
    _float_dtype(w, "w")
    if w.ndim != 2 or not w.flags.c_contiguous:
        raise ValueError(f"w must be a C-contiguous 2-D array, got shape {w.shape}")
    rows = _int64_vector(rows, "rows")
    if (not isinstance(out, np.ndarray) or out.dtype != w.dtype
            or out.shape != (rows.shape[0], w.shape[1]) or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ValueError(f"out must be a writeable C-contiguous {w.dtype} array of shape "
                         f"({rows.shape[0]}, {w.shape[1]})")
    cdef Py_ssize_t bad = -1
    cdef const int64_t[::1] rv = rows
    cdef const float[:, ::1] w32
    cdef const double[:, ::1] w64
    cdef float[:, ::1] o32
    cdef double[:, ::1] o64
    cdef Py_ssize_t ahead = max(2, min(_PREFETCH_MAX_ROWS,
                                       _PREFETCH_LINES // (-(-w.shape[1] * w.itemsize // 64))))
    if rows.shape[0] == 0 or w.shape[1] == 0:
        _check_rows(rows, w.shape[0])
        return out
    if w.dtype == np.float32:
        w32, o32 = w, out
        with nogil:
            bad = _take[float](w32, rv, o32, ahead)
    else:
        w64, o64 = w, out
        with nogil:
            bad = _take[double](w64, rv, o64, ahead)
    if bad >= 0:
        raise _row_error("rows", bad, rows[bad], w.shape[0])
    return out


# --------------------------------------------------------------------------------------
# Hyper-parameters and state validation
# --------------------------------------------------------------------------------------

def _saturation(beta):
    """Smallest t >= 1 from which ``1.0 - beta**t`` is exactly 1.0 in double (C ``pow``).

    ``math.pow`` calls the same C library ``pow`` as the kernel, so the shortcut taken for
    t >= this value returns exactly what the formula would (``beta**t <= 2**-54``).
    """
    if beta == 0.0:
        return 1
    t = max(1, int(math.ceil(54.0 * math.log(2.0) / -math.log(beta))))
    while t > 1 and 1.0 - math.pow(beta, t - 1) == 1.0:
        t -= 1
    while 1.0 - math.pow(beta, t) != 1.0:
        t += 1
    return t


def _unit_interval(x, name):
    x = _finite(x, name)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {x}")
    return x


def _nonnegative(x, name):
    x = _finite(x, name)
    if not x >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


# Adam: bias-correction tables, (1 - beta1**t, 1 - beta2**t) for t = 1 .. len, per (beta1, beta2)
_BC_TABLE_MAX = 1 << 15
_bc_tables = {}


def _bc_table(double beta1, double beta2, int64_t sat1, int64_t sat2):
    """float64 (T, 2): row t - 1 holds ``_bias_correction`` of beta1 and beta2 at step t, for
    t = 1 .. T = min(max(sat1, sat2), _BC_TABLE_MAX) (later steps: computed, or exactly 1).
    Built with the same C ``pow`` as the kernel, so table and formula agree bitwise."""
    key = (beta1, beta2)
    tab = _bc_tables.get(key)
    if tab is not None:
        return tab
    cdef int64_t t, T = min(max(sat1, sat2), _BC_TABLE_MAX)
    tab = np.empty((T, 2), dtype=np.float64)
    cdef double[:, ::1] tv = tab
    with nogil:
        for t in range(1, T + 1):
            tv[t - 1, 0] = _bias_correction(beta1, t, sat1)
            tv[t - 1, 1] = _bias_correction(beta2, t, sat2)
    if len(_bc_tables) >= 16:       # a few hyper-parameter sets at a time; callers hold refs
        _bc_tables.clear()
    _bc_tables[key] = tab
    return tab


cdef class _Params:
    """Validated hyper-parameters (``hp``) and the objects their pointers refer to."""
    cdef _Hyper hp
    cdef object table


cdef _Params _hyper(str name, lr, l2, scale, eps, beta1, beta2, beta, lambda1, lambda2):
    """Validated hyper-parameters of rule ``name`` (only the ones it uses are checked)."""
    cdef _Params p = _Params()
    cdef double[:, ::1] tv
    p.hp.rule = _RULE_CODES[name]
    p.hp.lr = _positive(lr, "alpha (learning rate)") if name == "ftrl" else _finite(lr, "lr")
    p.hp.l2 = _finite(l2, "l2")
    p.hp.scale = _finite(scale, "scale")
    p.hp.eps = _positive(eps, "eps") if name in ("adagrad", "adam") else 1.0
    p.hp.beta1 = p.hp.beta2 = 0.0
    p.hp.sat1 = p.hp.sat2 = 1
    p.hp.bc_table = NULL
    p.hp.bc_len = 0
    p.hp.beta = p.hp.lambda1 = p.hp.lambda2 = 0.0
    if name == "adam":
        p.hp.beta1 = _unit_interval(beta1, "beta1")
        p.hp.beta2 = _unit_interval(beta2, "beta2")
        p.hp.sat1 = _saturation(p.hp.beta1)
        p.hp.sat2 = _saturation(p.hp.beta2)
        p.table = _bc_table(p.hp.beta1, p.hp.beta2, p.hp.sat1, p.hp.sat2)
        tv = p.table
        p.hp.bc_table = &tv[0, 0]
        p.hp.bc_len = tv.shape[0]
    elif name == "ftrl":
        p.hp.beta = _nonnegative(beta, "beta")
        p.hp.lambda1 = _nonnegative(lambda1, "lambda1")
        p.hp.lambda2 = _nonnegative(lambda2, "lambda2")
    return p


def state_dtype(name, dim, dtype):
    """The numpy record dtype of one row of the packed optimizer state of ``name``.

    Adam and FTRL keep all per-row state in one record next to each other, so that updating
    a row touches the weights' cache line and one state line, not one line per slot.

    Parameters
    ----------
    name : {"adam", "ftrl"}
        The update rule.
    dim : int
        Values per row of the table (>= 1).
    dtype : float32 or float64
        The table's dtype.

    Returns
    -------
    numpy.dtype
        ``adam``: fields ``m`` (dtype, (dim,)), ``v`` (dtype, (dim,)), ``step`` (int64) —
        first and second moment estimates and the number of updates the row has received;
        ``ftrl``: fields ``z`` (dtype, (dim,)), ``n`` (dtype, (dim,)) — McMahan et al.'s
        ``z_i`` and ``n_i``. No padding; ``step`` is at byte ``2 * dim * itemsize``, a
        multiple of 8, so it is aligned in every record.

    Raises
    ------
    ValueError
        If ``name`` has no packed state or ``dim`` < 1.
    TypeError
        If ``dtype`` is not float32/float64.

    Notes
    -----
    A state array is ``np.zeros(num_rows, dtype=state_dtype(name, dim, dtype))``
    (:func:`new_state`); ``state["m"]`` etc. are (num_rows, dim) views of one slot.
    """
    dt = np.dtype(dtype)
    if dt != np.float32 and dt != np.float64:
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    dt = dt.newbyteorder("=")
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if name == "adam":
        return np.dtype([("m", dt, (dim,)), ("v", dt, (dim,)), ("step", np.int64)])
    if name == "ftrl":
        return np.dtype([("z", dt, (dim,)), ("n", dt, (dim,))])
    raise ValueError(f"optimizer {name!r} has no packed state (only 'adam' and 'ftrl')")


def new_state(name, num_rows, dim, dtype):
    """A zero-filled packed state (:func:`state_dtype`) for ``num_rows`` rows.

    Parameters
    ----------
    name : {"adam", "ftrl"}
    num_rows : int
    dim : int
    dtype : float32 or float64

    Returns
    -------
    ndarray, shape (num_rows,), dtype ``state_dtype(name, dim, dtype)``
        All moments, step counts, ``z`` and ``n`` zero (the rules' initial state).

    Raises
    ------
    ValueError, TypeError
        As :func:`state_dtype`; ValueError if ``num_rows`` < 0.

    Notes
    -----
    Kingma & Ba (ICLR 2015) Algorithm 1 and McMahan et al. (KDD 2013) Algorithm 1 both
    start from zero state.
    """
    num_rows = int(num_rows)
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    return np.zeros(num_rows, dtype=state_dtype(name, dim, dtype))


def _check_state(state, w, name):
    """The packed state of rule ``name`` for table ``w``: checked, not copied."""
    if isinstance(state, (list, tuple)):
        if len(state) != 1:
            raise ValueError(f"{name} needs exactly one state array, got {len(state)}")
        state = state[0]
    if state is None:
        raise ValueError(f"{name} needs its state: an array made by new_state({name!r}, "
                         f"{w.shape[0]}, {w.shape[1]}, {w.dtype})")
    if not isinstance(state, np.ndarray):
        raise TypeError(f"state is updated in place and must be a numpy.ndarray, "
                        f"got {type(state).__name__}")
    want = state_dtype(name, max(w.shape[1], 1), w.dtype)
    if state.dtype != want:
        raise TypeError(f"state has dtype {state.dtype} but {name} on a {w.dtype} table of dim "
                        f"{w.shape[1]} needs {want} (see state_dtype)")
    if state.shape != (w.shape[0],):
        raise ValueError(f"state has shape {state.shape} but w has {w.shape[0]} rows")
    if not state.flags.c_contiguous:
        raise ValueError("state must be C-contiguous (it is updated in place)")
    if not state.flags.writeable:
        raise ValueError("state is read-only but is updated in place")
    if state.size and state.ctypes.data % 8:
        raise ValueError("state must be 8-byte aligned")
    return state


def _check_acc(acc, w, name="acc"):
    if isinstance(acc, (list, tuple)):
        if len(acc) != 1:
            raise ValueError(f"adagrad needs exactly one slot array (acc), got {len(acc)}")
        acc = acc[0]
    if acc is None:
        raise ValueError("adagrad needs its accumulator: slots must be an array shaped like w")
    acc = _inplace_array(acc, name, w.ndim)
    if acc.dtype != w.dtype:
        raise TypeError(f"{name} has dtype {acc.dtype} but w has dtype {w.dtype}")
    if acc.shape != w.shape:
        raise ValueError(f"{name} has shape {acc.shape} but w has shape {w.shape}")
    return acc


def _slot_state(name, w, slots):
    """The (validated) state object of rule ``name``: None, acc or the packed records."""
    if name == "sgd":
        return None
    if name == "adagrad":
        return _check_acc(slots, w, "slots (adagrad accumulator)")
    return _check_state(slots, w, name)


cdef char* _base(object arr, Py_ssize_t* stride) except NULL:
    """Byte address of row 0 of a non-empty state array and its row stride in bytes. The
    caller keeps ``arr`` alive."""
    cdef uint8_t[::1] b = arr.reshape(-1).view(np.uint8)
    stride[0] = arr.strides[0]
    return <char*>&b[0]


cdef _run_rows(w, state, rows, grads, _Params p):
    """Run rule ``p`` on validated, unique ``rows`` with gradient rows ``grads[i]``."""
    cdef Py_ssize_t stride = 0
    cdef char* st
    if rows.shape[0] == 0 or w.size == 0:
        return
    # SGD has no state: pass w's address (never dereferenced through st, stride 0)
    st = _base(w if state is None else state, &stride)
    if state is None:
        stride = 0
    if w.dtype == np.float32:
        _rows_step[float](w, st, stride, rows, grads, &p.hp)
    else:
        _rows_step[double](w, st, stride, rows, grads, &p.hp)


# --------------------------------------------------------------------------------------
# Public kernels
# --------------------------------------------------------------------------------------

def sparse_sgd(w, rows, grads, lr, l2=0.0, scale=1.0):
    """Plain SGD step on selected rows of a table, in place.

    For each ``i``: ``g = scale * grads[i] + l2 * w[rows[i]]``, then
    ``w[rows[i]] -= lr * g`` (elementwise over ``dim``, in the dtype of ``w``).

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table (parameter rows), updated in place.
    rows : ndarray of int64, shape (m,)
        Local row indices in ``[0, R)``. They must be unique — the caller guarantees this,
        e.g. with :func:`merge_duplicates` (as :func:`apply_sparse` does); duplicates are not
        detected and would be updated twice, each time with the L2 term.
    grads : ndarray, shape (m, dim), same dtype as ``w``
        Gradient rows (typically sums over examples; see ``scale``).
    lr : float
        Learning rate (step size), in units of ``w`` per unit of ``g``.
    l2 : float, default 0.0
        L2 penalty coefficient, applied lazily to the touched rows only.
    scale : float, default 1.0
        Multiplies ``grads`` (e.g. ``1 / n_examples`` to turn a gradient sum into a mean).

    Raises
    ------
    TypeError
        If ``w`` is not a float32/float64 ndarray, or ``grads`` has a different dtype.
    ValueError
        If shapes do not match, ``w`` is not C-contiguous/writeable, a hyper-parameter is
        not finite, or a row is outside ``[0, R)`` (the message gives the offending value
        and the bound). All checks happen before ``w`` is modified.

    Notes
    -----
    Stochastic gradient descent: Robbins & Monro, Ann. Math. Statist. 22(3), 1951. The
    L2 term is "lazy": it only decays the rows the update touches.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    cdef _Params p = _hyper("sgd", lr, l2, scale, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    _check_rows(rows, w.shape[0])
    _run_rows(w, None, rows, grads, p)


def sparse_adagrad(w, acc, rows, grads, lr, l2=0.0, scale=1.0, eps=1e-8):
    """Diagonal AdaGrad step on selected rows of a table, in place.

    For each ``i``, elementwise over ``dim`` with ``r = rows[i]``::

        g = scale * grads[i] + l2 * w[r]
        acc[r] += g * g
        w[r] -= lr * g / (sqrt(acc[r]) + eps)

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table, updated in place.
    acc : ndarray, same shape and dtype as ``w``, C-contiguous, writeable
        Running sums of squared gradients (AdaGrad's per-coordinate state), updated in place.
    rows : ndarray of int64, shape (m,)
        Unique local row indices in ``[0, R)`` (see :func:`sparse_sgd`; duplicates would
        update the accumulator twice instead of once with the summed gradient).
    grads : ndarray, shape (m, dim), same dtype as ``w``
        Gradient rows.
    lr : float
        Learning rate (base step size).
    l2 : float, default 0.0
        L2 penalty coefficient (lazy: touched rows only).
    scale : float, default 1.0
        Multiplies ``grads``.
    eps : float, default 1e-8
        Denominator guard, > 0.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays or mismatched dtypes among ``w``, ``acc``, ``grads``.
    ValueError
        For mismatched shapes, non-contiguous/read-only ``w`` or ``acc``, non-finite
        hyper-parameters, ``eps <= 0``, or a row outside ``[0, R)`` (message gives the value
        and the bound). All checks happen before anything is modified.

    Notes
    -----
    Duchi, Hazan & Singer, "Adaptive subgradient methods for online learning and stochastic
    optimization", JMLR 12:2121-2159, 2011 (diagonal update, §1.1, ``delta = eps``);
    the rule used by Downpour SGD, Dean et al., "Large scale distributed deep networks",
    NIPS 2012, §4.1.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    acc = _check_acc(acc, w)
    cdef _Params p = _hyper("adagrad", lr, l2, scale, eps, 0.0, 0.0, 0.0, 0.0, 0.0)
    _check_rows(rows, w.shape[0])
    _run_rows(w, acc, rows, grads, p)


def sparse_adam(w, state, rows, grads, lr, l2=0.0, scale=1.0, beta1=0.9, beta2=0.999,
                eps=1e-8):
    """Lazy Adam step on selected rows of a table, in place, with a step count per row.

    For each ``i``, with ``r = rows[i]`` and ``s = state[r]`` (elementwise over ``dim``)::

        s.step += 1;  t = s.step
        g = scale * grads[i] + l2 * w[r]
        s.m = beta1 * s.m + (1 - beta1) * g
        s.v = beta2 * s.v + (1 - beta2) * g * g
        w[r] -= lr * (s.m / (1 - beta1**t)) / (sqrt(s.v / (1 - beta2**t)) + eps)

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table, updated in place.
    state : ndarray, shape (R,), dtype ``state_dtype("adam", dim, w.dtype)``, writeable
        Per-row moments ``m``, ``v`` (like ``w``) and update count ``step`` (int64),
        updated in place (:func:`new_state` makes one).
    rows : ndarray of int64, shape (m,)
        Unique local row indices in ``[0, R)`` (duplicates would count two steps).
    grads : ndarray, shape (m, dim), same dtype as ``w``
        Gradient rows.
    lr : float
        Step size (Kingma & Ba's alpha).
    l2 : float, default 0.0
        L2 penalty coefficient added to the gradient (lazy: touched rows only).
    scale : float, default 1.0
        Multiplies ``grads``.
    beta1, beta2 : float, default 0.9, 0.999
        Exponential decay rates of the moment estimates, in [0, 1).
    eps : float, default 1e-8
        Denominator guard, > 0.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays, mismatched dtypes, or a state of another record
        dtype (message shows the one needed).
    ValueError
        For mismatched shapes, non-contiguous/read-only arrays, non-finite hyper-parameters,
        ``beta1``/``beta2`` outside [0, 1), ``eps <= 0``, or a row outside ``[0, R)``.
        All checks happen before anything is modified.

    Notes
    -----
    Kingma & Ba, "Adam: a method for stochastic optimization", ICLR 2015, Algorithm 1,
    applied "lazily": only the rows a step touches have their moments decayed and updated,
    and the bias corrections use the row's own update count ``t`` rather than the global
    step. A row's updates are then exactly Adam run on the sequence of gradients that row
    received: a row first touched late gets ``m / (1 - beta1) = g`` and
    ``v / (1 - beta2) = g**2``, a first step of size ``lr`` as in Adam's first step. With
    a global count ``T`` instead, the first update of a rarely touched row would divide
    ``(1 - beta1) g`` and ``(1 - beta2) g**2`` by factors close to 1 and take a step of
    ``lr (1 - beta1) / sqrt(1 - beta2)`` — 3.2 ``lr`` with the default betas.
    ``1 - beta**t`` is computed in double with C ``pow`` (exactly 1.0 once it rounds to
    1.0; then ``pow`` is skipped), cast to the table's dtype, and every other operation is
    in the table's dtype.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    state = _check_state(state, w, "adam")
    cdef _Params p = _hyper("adam", lr, l2, scale, eps, beta1, beta2, 0.0, 0.0, 0.0)
    _check_rows(rows, w.shape[0])
    _run_rows(w, state, rows, grads, p)


def sparse_ftrl(w, state, rows, grads, alpha, beta=1.0, lambda1=0.0, lambda2=0.0, l2=0.0,
                scale=1.0):
    """FTRL-Proximal step on selected rows of a table, in place (per coordinate).

    For each ``i``, with ``r = rows[i]`` and ``s = state[r]``, elementwise over ``dim``::

        g = scale * grads[i] + l2 * w[r]
        sigma = (sqrt(s.n + g * g) - sqrt(s.n)) / alpha
        s.z += g - sigma * w[r]
        s.n += g * g
        w[r] = 0                                                     if |s.z| <= lambda1
               -(s.z - sign(s.z) lambda1) / ((beta + sqrt(s.n)) / alpha + lambda2)  else

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table, updated in place. Before a row's first update it must equal the closed
        form of its ``(z, n)`` (zero for zero state; ``hpcps.core.optim.Optimizer.init_slots``
        builds ``z`` for non-zero initial weights).
    state : ndarray, shape (R,), dtype ``state_dtype("ftrl", dim, w.dtype)``, writeable
        Per-coordinate ``z`` and ``n`` (like ``w``), updated in place.
    rows : ndarray of int64, shape (m,)
        Unique local row indices in ``[0, R)``.
    grads : ndarray, shape (m, dim), same dtype as ``w``
        Gradient rows.
    alpha : float
        Learning rate alpha (> 0): per-coordinate rate ``alpha / (beta + sqrt(n))``.
    beta : float, default 1.0
        Learning-rate offset beta (>= 0).
    lambda1 : float, default 0.0
        L1 strength (>= 0); a coordinate with ``|z| <= lambda1`` is exactly 0.
    lambda2 : float, default 0.0
        L2 strength of the closed form (>= 0).
    l2 : float, default 0.0
        L2 penalty added to the gradient, as for the other rules (lazy, touched rows only).
    scale : float, default 1.0
        Multiplies ``grads``.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays, mismatched dtypes, or a state of another record dtype.
    ValueError
        For mismatched shapes, non-contiguous/read-only arrays, non-finite hyper-parameters,
        ``alpha <= 0``, negative ``beta``/``lambda1``/``lambda2``, or a row outside ``[0, R)``.
        All checks happen before anything is modified.

    Notes
    -----
    McMahan et al., "Ad click prediction: a view from the trenches", KDD 2013, Algorithm 1
    (per-coordinate FTRL-Proximal with L1 and L2). ``lambda1`` and ``lambda2`` regularise
    the sum of all the steps' losses (the paper's objective), whereas ``l2`` is part of
    each step's gradient — a penalty on the mean loss like the other rules' ``l2`` (what
    some libraries call an "L2 shrinkage" term). If ``beta = lambda2 = 0`` and ``n = 0``
    the denominator is 0; the weight is then set to 0.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    state = _check_state(state, w, "ftrl")
    cdef _Params p = _hyper("ftrl", alpha, l2, scale, 1.0, 0.0, 0.0, beta, lambda1, lambda2)
    _check_rows(rows, w.shape[0])
    _run_rows(w, state, rows, grads, p)


def _check_dense_args(w, grads):
    w = _inplace_array(w, "w", 1)
    grads = _values_like(grads, "grads", w.dtype, 1)
    if grads.shape[0] != w.shape[0]:
        raise ValueError(f"grads has length {grads.shape[0]} but w has length {w.shape[0]}")
    return w, grads


cdef _flat_step(floating[::1] w, floating[::1] s1, floating[::1] s2,
                const floating[::1] grads, const _Hyper* hp, int64_t t):
    """One rule on a whole flat block: ``s1``/``s2`` are acc (adagrad), m/v (adam), z/n (ftrl);
    ``t`` the 1-based step number (adam)."""
    cdef Py_ssize_t n = w.shape[0]
    if n == 0:
        return
    with nogil:
        if hp.rule == _R_SGD:
            _sgd_row(&w[0], &grads[0], n, <floating>hp.lr, <floating>hp.l2, <floating>hp.scale)
        elif hp.rule == _R_ADAGRAD:
            _adagrad_row(&w[0], &s1[0], &grads[0], n, <floating>hp.lr, <floating>hp.l2,
                         <floating>hp.scale, <floating>hp.eps)
        elif hp.rule == _R_ADAM:
            _adam_row(&w[0], &s1[0], &s2[0], &grads[0], n, <floating>hp.lr, <floating>hp.l2,
                      <floating>hp.scale, <floating>hp.beta1, <floating>hp.beta2,
                      <floating>hp.eps, <floating>_bias_correction(hp.beta1, t, hp.sat1),
                      <floating>_bias_correction(hp.beta2, t, hp.sat2))
        else:
            _ftrl_row(&w[0], &s1[0], &s2[0], &grads[0], n, <floating>hp.lr, <floating>hp.beta,
                      <floating>hp.lambda1, <floating>hp.lambda2, <floating>hp.l2,
                      <floating>hp.scale)


cdef _run_flat(w, s1, s2, grads, const _Hyper* hp, int64_t t=0):
    if w.dtype == np.float32:
        _flat_step[float](w, s1, s2, grads, hp, t)
    else:
        _flat_step[double](w, s1, s2, grads, hp, t)


def dense_sgd(w, grads, lr, l2=0.0, scale=1.0):
    """Plain SGD step on a whole flat block, in place: ``w -= lr * (scale * grads + l2 * w)``.

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (n,), C-contiguous, writeable
        The block, updated in place (pass ``table.reshape(-1)`` for a 2-D table).
    grads : ndarray, shape (n,), same dtype as ``w``
        Gradient.
    lr : float
        Learning rate.
    l2 : float, default 0.0
        L2 penalty coefficient.
    scale : float, default 1.0
        Multiplies ``grads``.

    Raises
    ------
    TypeError
        If ``w`` is not a float32/float64 ndarray or ``grads`` has another dtype.
    ValueError
        If the lengths differ, ``w`` is not 1-D, C-contiguous and writeable, or a
        hyper-parameter is not finite.

    Notes
    -----
    Robbins & Monro, Ann. Math. Statist. 22(3), 1951.
    """
    w, grads = _check_dense_args(w, grads)
    cdef _Params p = _hyper("sgd", lr, l2, scale, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    _run_flat(w, None, None, grads, &p.hp)


def dense_adagrad(w, acc, grads, lr, l2=0.0, scale=1.0, eps=1e-8):
    """Diagonal AdaGrad step on a whole flat block, in place.

    Elementwise: ``g = scale * grads + l2 * w; acc += g * g; w -= lr * g / (sqrt(acc) + eps)``.

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (n,), C-contiguous, writeable
        The block, updated in place.
    acc : ndarray, shape (n,), dtype of ``w``, C-contiguous, writeable
        Sums of squared gradients, updated in place.
    grads : ndarray, shape (n,), dtype of ``w``
        Gradient.
    lr : float
        Learning rate.
    l2 : float, default 0.0
        L2 penalty coefficient.
    scale : float, default 1.0
        Multiplies ``grads``.
    eps : float, default 1e-8
        Denominator guard, > 0.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays or mismatched dtypes.
    ValueError
        For mismatched lengths, non-contiguous/read-only ``w`` or ``acc``, non-finite
        hyper-parameters or ``eps <= 0``.

    Notes
    -----
    Duchi, Hazan & Singer, JMLR 12, 2011, §1.1 (diagonal); Dean et al., NIPS 2012, §4.1.
    """
    w, grads = _check_dense_args(w, grads)
    acc = _check_acc(acc, w)
    cdef _Params p = _hyper("adagrad", lr, l2, scale, eps, 0.0, 0.0, 0.0, 0.0, 0.0)
    _run_flat(w, acc, None, grads, &p.hp)


def _step_number(step):
    try:
        t = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an integer, got {type(step).__name__}") from None
    if not 1 <= t <= np.iinfo(np.int64).max:
        raise ValueError(f"step must be >= 1 (the 1-based number of this update), got {t}")
    return t


def dense_adam(w, m, v, grads, step, lr, l2=0.0, scale=1.0, beta1=0.9, beta2=0.999, eps=1e-8):
    """Adam step on a whole flat block, in place (every coordinate updated every step).

    Elementwise, with ``t = step``::

        g = scale * grads + l2 * w
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        w -= lr * (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (n,), C-contiguous, writeable
        The block, updated in place.
    m, v : ndarray, shape (n,), dtype of ``w``, C-contiguous, writeable
        First and second moment estimates (zero before the first step), updated in place.
    grads : ndarray, shape (n,), dtype of ``w``
        Gradient.
    step : int
        The 1-based number of this update of the block (the caller counts: 1, 2, ...).
    lr : float
        Step size (alpha).
    l2 : float, default 0.0
        L2 penalty coefficient added to the gradient.
    scale : float, default 1.0
        Multiplies ``grads``.
    beta1, beta2 : float, default 0.9, 0.999
        Moment decay rates, in [0, 1).
    eps : float, default 1e-8
        Denominator guard, > 0.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays, mismatched dtypes, or a non-integer ``step``.
    ValueError
        For mismatched lengths, non-contiguous/read-only arrays, ``step < 1``, non-finite
        hyper-parameters, betas outside [0, 1) or ``eps <= 0``.

    Notes
    -----
    Kingma & Ba, "Adam: a method for stochastic optimization", ICLR 2015, Algorithm 1.
    Same arithmetic as :func:`sparse_adam` (bias corrections in double, the rest in the
    block's dtype), so a dense block equals a sparse table whose rows are all touched.
    """
    w, grads = _check_dense_args(w, grads)
    m = _check_acc(m, w, "m")
    v = _check_acc(v, w, "v")
    t = _step_number(step)
    cdef _Params p = _hyper("adam", lr, l2, scale, eps, beta1, beta2, 0.0, 0.0, 0.0)
    _run_flat(w, m, v, grads, &p.hp, t)


def dense_ftrl(w, z, n, grads, alpha, beta=1.0, lambda1=0.0, lambda2=0.0, l2=0.0, scale=1.0):
    """FTRL-Proximal step on a whole flat block, in place (per coordinate).

    Elementwise: the rule of :func:`sparse_ftrl` on every coordinate.

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (n,), C-contiguous, writeable
        The block (the closed form of ``z``, ``n`` before the step), updated in place.
    z, n : ndarray, shape (n,), dtype of ``w``, C-contiguous, writeable
        McMahan et al.'s per-coordinate ``z`` and ``n`` (zero initially), updated in place.
    grads : ndarray, shape (n,), dtype of ``w``
        Gradient.
    alpha : float
        Learning rate alpha, > 0.
    beta : float, default 1.0
        Learning-rate offset, >= 0.
    lambda1, lambda2 : float, default 0.0
        L1 and L2 strengths of the closed form, >= 0.
    l2 : float, default 0.0
        L2 penalty added to the gradient.
    scale : float, default 1.0
        Multiplies ``grads``.

    Raises
    ------
    TypeError
        For non-float32/float64 arrays or mismatched dtypes.
    ValueError
        For mismatched lengths, non-contiguous/read-only arrays, non-finite
        hyper-parameters, ``alpha <= 0`` or negative ``beta``/``lambda1``/``lambda2``.

    Notes
    -----
    McMahan et al., "Ad click prediction: a view from the trenches", KDD 2013, Algorithm 1.
    """
    w, grads = _check_dense_args(w, grads)
    z = _check_acc(z, w, "z")
    n = _check_acc(n, w, "n")
    cdef _Params p = _hyper("ftrl", alpha, l2, scale, 1.0, 0.0, 0.0, beta, lambda1, lambda2)
    _run_flat(w, z, n, grads, &p.hp)


def apply_sparse(name, w, slots, keys, grads, lr, l2=0.0, scale=1.0, eps=1e-8, *, beta1=0.9,
                 beta2=0.999, beta=1.0, lambda1=0.0, lambda2=0.0):
    """Apply one optimizer step for a push with possibly duplicate keys, in place.

    Sums the gradient rows of equal keys (:func:`merge_duplicates`), then runs the rule
    once per distinct row, in one pass over the row's weights and state. This is the
    correct semantics for a minibatch step — contrary to ``w[keys] -= lr * grads``, which
    for a repeated key keeps only one of its updates.

    Parameters
    ----------
    name : {"sgd", "adagrad", "adam", "ftrl"}
        Update rule (:func:`sparse_sgd`, :func:`sparse_adagrad`, :func:`sparse_adam`,
        :func:`sparse_ftrl`).
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table shard, updated in place.
    slots : None or ndarray or sequence of one ndarray
        Optimizer state: ignored for ``"sgd"``; for ``"adagrad"`` the accumulator ``acc``
        (same shape and dtype as ``w``); for ``"adam"``/``"ftrl"`` the packed per-row state
        (:func:`new_state`). A 1-element list/tuple holding it is accepted.
    keys : ndarray of int64, shape (n,)
        Local row indices in ``[0, R)``, duplicates allowed.
    grads : ndarray, shape (n, dim), same dtype as ``w``
        Gradient rows, one per key.
    lr : float
        Learning rate (FTRL's alpha, > 0 for ``"ftrl"``).
    l2 : float, default 0.0
        L2 penalty coefficient added to the gradient (once per distinct touched row).
    scale : float, default 1.0
        Multiplies the summed gradient rows (e.g. ``1 / n_examples``).
    eps : float, default 1e-8
        AdaGrad/Adam denominator guard (> 0); ignored otherwise.
    beta1, beta2 : float, default 0.9, 0.999
        Adam's moment decay rates, in [0, 1); ignored otherwise.
    beta, lambda1, lambda2 : float, default 1.0, 0.0, 0.0
        FTRL's learning-rate offset and L1/L2 strengths (>= 0); ignored otherwise.

    Raises
    ------
    ValueError
        For an unknown ``name`` (the message lists the valid ones), mismatched shapes, a
        key outside ``[0, R)`` (message gives the value and the bound), missing optimizer
        state, hyper-parameters out of range. Nothing is modified when an error is raised.
    TypeError
        For non-float32/float64 arrays, mismatched dtypes or a state of another dtype.

    Notes
    -----
    Update rules: see :func:`sparse_sgd` (Robbins & Monro 1951), :func:`sparse_adagrad`
    (Duchi, Hazan & Singer, JMLR 2011; Dean et al., NIPS 2012, §4.1), :func:`sparse_adam`
    (Kingma & Ba, ICLR 2015, Algorithm 1, lazy, per-row step counts) and
    :func:`sparse_ftrl` (McMahan et al., KDD 2013, Algorithm 1). Summation: a push whose
    keys are all distinct (found by one pass with a bitmap of the table's rows, cleared after
    it; tables of at most 2^31 rows) has nothing to sum: its rows are stepped in input
    order. Otherwise, when the table
    has at most about ``64 n`` rows, or ``256 n`` while the buffer below takes at most 8 MiB
    (and in any case it fits in 1 GiB), the gradient rows
    are added, in input order, into a zeroed ``(R, dim)`` buffer while a bitmap marks the
    touched rows; a walk of the bitmap (``R / 64`` words) then takes every touched row, in
    ascending order, with its sum, and clears both for the next push (the buffers are kept
    between calls: O(n + R / 64) and no page faults); otherwise via
    :func:`merge_duplicates` (O(n log n)). Both give bitwise the same result as
    ``merge_duplicates`` followed by the rule on the unique rows. Thread-safe: a call made
    while another thread uses the kept buffers gets fresh ones.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(map(repr, OPTIMIZERS))}")
    w, keys, grads = _check_sparse_args(w, keys, grads)
    state = _slot_state(name, w, slots)
    cdef _Params p = _hyper(name, lr, l2, scale, eps, beta1, beta2, beta, lambda1, lambda2)
    R, n = w.shape[0], keys.shape[0]
    if n == 0 or w.shape[1] == 0:
        _check_rows(keys, R, "keys")
        return
    scratch = R * w.shape[1] * w.itemsize
    per_key = (_SCATTER_ROWS_PER_KEY_CACHED if scratch <= _SCATTER_CACHED_BYTES
               else _SCATTER_ROWS_PER_KEY)
    if n > _DISTINCT_MAX and R <= _DISTINCT_BITMAP_ROWS and _distinct_rows(keys, R):
        # Distinct rows (a worker's push; issue 20): stepped in input order, as below.
        _run_rows(w, state, keys, grads + grads.dtype.type(0.0), p)
        return
    if R <= per_key * n + _DENSE_SPAN_SLACK and scratch <= _SCRATCH_MAX_BYTES:
        # Table not much larger than the push: scatter the sums in input order (bitwise the
        # same as merge_duplicates), then step every touched row, in ascending order.
        _scatter_path(w, keys, grads, state, p)
        return
    _check_rows(keys, R, "keys")
    if n <= _DISTINCT_MAX and _distinct(keys):
        # A small push of distinct rows (a worker's keys are distinct): nothing to merge.
        # Each row's step reads only its own row, so input order gives what ascending order
        # does; 0.0 + g is what the merge's zeroed sums hold (-0.0 becomes +0.0): bitwise
        # the same result.
        _run_rows(w, state, keys, grads + grads.dtype.type(0.0), p)
        return
    rows, summed = _merge(keys, grads)
    _run_rows(w, state, rows, summed, p)
