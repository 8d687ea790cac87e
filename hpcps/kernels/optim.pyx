"""Server-side update rules and the duplicate-key merge (Cython, ``nogil``).

Every public function validates its inputs at the Python level (dtype, number of
dimensions, contiguity, matching shapes, row bounds) and raises ``TypeError`` /
``ValueError`` with a message naming the offending argument or value; the numeric loops
then run without the GIL over typed memoryviews, specialised for float32 and float64
(Cython's fused type ``floating``). Hyper-parameters are cast to the table's dtype, so a
float32 table is updated in float32 arithmetic, like numpy does for ``w -= lr * g``.

Update rules (per element, ``g`` the scaled, L2-regularised gradient of one row)::

    sgd      g = scale * grad + l2 * w;  w -= lr * g
    adagrad  g = scale * grad + l2 * w;  acc += g * g;  w -= lr * g / (sqrt(acc) + eps)

SGD: Robbins & Monro, "A stochastic approximation method", Ann. Math. Statist. 1951;
AdaGrad: Duchi, Hazan & Singer, "Adaptive subgradient methods for online learning and
stochastic optimization", JMLR 12, 2011 (diagonal version, §1.1); used by Downpour
SGD, Dean et al., "Large scale distributed deep networks", NIPS 2012, §4.1.

The sparse rules assume unique rows: a row that appeared twice would receive the L2 term
twice and, for AdaGrad, two accumulator updates instead of one for the summed gradient.
:func:`apply_sparse` therefore sums duplicate keys with :func:`merge_duplicates` first —
unlike ``w[idx] -= g``, which silently applies only one of several duplicates.
"""

import math

import numpy as np

from cython cimport floating
from libc.math cimport sqrt
from libc.stdint cimport int64_t, uint8_t, uint64_t

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define hpcps_prefetch(p) __builtin_prefetch((const void *)(p))
    #else
    #define hpcps_prefetch(p) ((void)0)
    #endif
    """
    void hpcps_prefetch(const void* p) noexcept nogil

# How many entries ahead the gather in _accumulate_packed prefetches its source row.
cdef enum:
    _PREFETCH_AHEAD = 64

__all__ = [
    "OPTIMIZERS",
    "merge_duplicates",
    "sparse_sgd",
    "sparse_adagrad",
    "dense_sgd",
    "dense_adagrad",
    "apply_sparse",
]

#: Names accepted by :func:`apply_sparse`.
OPTIMIZERS = ("sgd", "adagrad")

# merge_duplicates: use the counting path (an int64 array over the key span) when the span
# is at most _DENSE_SPAN_FACTOR * n + _DENSE_SPAN_SLACK keys; otherwise sort.
_DENSE_SPAN_FACTOR = 4
_DENSE_SPAN_SLACK = 1 << 16


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


def _check_acc(acc, w, name="acc"):
    acc = _inplace_array(acc, name, w.ndim)
    if acc.dtype != w.dtype:
        raise TypeError(f"{name} has dtype {acc.dtype} but w has dtype {w.dtype}")
    if acc.shape != w.shape:
        raise ValueError(f"{name} has shape {acc.shape} but w has shape {w.shape}")
    return acc


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
    # Pack (key - kmin, i) into one uint64: the packed values are distinct, so numpy's fast
    # (SIMD, unstable) sort gives exactly the (key, input position) order.
    packed = (keys.view(np.uint64) - np.uint64(<uint64_t>kmin)) << np.uint64(ibits)
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    cdef const uint64_t[::1] pv = packed
    cdef int ib = ibits
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


cdef _rows_step(floating[:, ::1] w, floating[:, ::1] acc, bint adagrad,
                const int64_t[::1] rows, const floating[:, ::1] grads,
                double lr_, double l2_, double scale_, double eps_):
    """Update rows ``rows[i]`` of ``w`` (and ``acc``) with ``grads[i]``; rows validated."""
    cdef Py_ssize_t i, r, m = rows.shape[0], dim = w.shape[1]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_
    cdef floating eps = <floating>eps_
    if m == 0 or dim == 0:
        return
    with nogil:
        for i in range(m):
            r = rows[i]
            if adagrad:
                _adagrad_row(&w[r, 0], &acc[r, 0], &grads[i, 0], dim, lr, l2, scale, eps)
            else:
                _sgd_row(&w[r, 0], &grads[i, 0], dim, lr, l2, scale)


cdef Py_ssize_t _scatter_add(const int64_t[::1] keys, const floating[:, ::1] grads,
                             floating[:, ::1] G, uint8_t[::1] touched):
    """``G[keys[i]] += grads[i]`` in input order, marking touched rows; returns the first i
    with keys[i] outside [0, len(G)) (stopping there), else -1."""
    cdef Py_ssize_t i, j, n = keys.shape[0], dim = grads.shape[1], bad = -1
    cdef uint64_t R = <uint64_t>G.shape[0], k
    with nogil:
        for i in range(n):
            if i + _PREFETCH_AHEAD < n and <uint64_t>keys[i + _PREFETCH_AHEAD] < R:
                hpcps_prefetch(&G[keys[i + _PREFETCH_AHEAD], 0])
            k = <uint64_t>keys[i]
            if k >= R:
                bad = i
                break
            touched[k] = 1
            for j in range(dim):
                G[k, j] += grads[i, j]
    return bad


cdef _touched_step(floating[:, ::1] w, floating[:, ::1] acc, bint adagrad,
                   const uint8_t[::1] touched, const floating[:, ::1] G,
                   double lr_, double l2_, double scale_, double eps_):
    """Update every touched row ``r`` of ``w`` (and ``acc``) with ``G[r]``."""
    cdef Py_ssize_t r, R = w.shape[0], dim = w.shape[1]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_
    cdef floating eps = <floating>eps_
    with nogil:
        for r in range(R):
            if touched[r]:
                if adagrad:
                    _adagrad_row(&w[r, 0], &acc[r, 0], &G[r, 0], dim, lr, l2, scale, eps)
                else:
                    _sgd_row(&w[r, 0], &G[r, 0], dim, lr, l2, scale)


cdef _flat_step(floating[::1] w, floating[::1] acc, bint adagrad, const floating[::1] grads,
                double lr_, double l2_, double scale_, double eps_):
    cdef Py_ssize_t n = w.shape[0]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_
    cdef floating eps = <floating>eps_
    if n == 0:
        return
    with nogil:
        if adagrad:
            _adagrad_row(&w[0], &acc[0], &grads[0], n, lr, l2, scale, eps)
        else:
            _sgd_row(&w[0], &grads[0], n, lr, l2, scale)


def _run_rows_step(w, acc, adagrad, rows, grads, lr, l2, scale, eps):
    if w.dtype == np.float32:
        _rows_step[float](w, acc, adagrad, rows, grads, lr, l2, scale, eps)
    else:
        _rows_step[double](w, acc, adagrad, rows, grads, lr, l2, scale, eps)


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
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    _check_rows(rows, w.shape[0])
    _run_rows_step(w, None, False, rows, grads, lr, l2, scale, 1.0)


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
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    eps = _positive(eps, "eps")
    _check_rows(rows, w.shape[0])
    _run_rows_step(w, acc, True, rows, grads, lr, l2, scale, eps)


def _check_dense_args(w, grads):
    w = _inplace_array(w, "w", 1)
    grads = _values_like(grads, "grads", w.dtype, 1)
    if grads.shape[0] != w.shape[0]:
        raise ValueError(f"grads has length {grads.shape[0]} but w has length {w.shape[0]}")
    return w, grads


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
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    if w.dtype == np.float32:
        _flat_step[float](w, None, False, grads, lr, l2, scale, 1.0)
    else:
        _flat_step[double](w, None, False, grads, lr, l2, scale, 1.0)


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
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    eps = _positive(eps, "eps")
    if w.dtype == np.float32:
        _flat_step[float](w, acc, True, grads, lr, l2, scale, eps)
    else:
        _flat_step[double](w, acc, True, grads, lr, l2, scale, eps)


def _single_slot(slots):
    """AdaGrad's accumulator from ``slots``: an ndarray, or a 1-element list/tuple of one."""
    if isinstance(slots, (list, tuple)):
        if len(slots) != 1:
            raise ValueError(f"adagrad needs exactly one slot array (acc), got {len(slots)}")
        slots = slots[0]
    if slots is None:
        raise ValueError("adagrad needs its accumulator: slots must be an array shaped like w")
    return slots


def apply_sparse(name, w, slots, keys, grads, lr, l2=0.0, scale=1.0, eps=1e-8):
    """Apply one optimizer step for a push with possibly duplicate keys, in place.

    Sums the gradient rows of equal keys (:func:`merge_duplicates`), then runs
    :func:`sparse_sgd` or :func:`sparse_adagrad` once per distinct row. This is the
    correct semantics for a minibatch step — contrary to ``w[keys] -= lr * grads``, which
    for a repeated key keeps only one of its updates.

    Parameters
    ----------
    name : {"sgd", "adagrad"}
        Update rule.
    w : ndarray of float32 or float64, shape (R, dim), C-contiguous, writeable
        The table shard, updated in place.
    slots : None or ndarray or sequence of one ndarray
        Optimizer state. Ignored for ``"sgd"``; for ``"adagrad"`` the accumulator ``acc``
        (same shape and dtype as ``w``; a 1-element list/tuple holding it is accepted).
    keys : ndarray of int64, shape (n,)
        Local row indices in ``[0, R)``, duplicates allowed.
    grads : ndarray, shape (n, dim), same dtype as ``w``
        Gradient rows, one per key.
    lr : float
        Learning rate.
    l2 : float, default 0.0
        L2 penalty coefficient (applied once per distinct touched row).
    scale : float, default 1.0
        Multiplies the summed gradient rows (e.g. ``1 / n_examples``).
    eps : float, default 1e-8
        AdaGrad denominator guard (> 0); ignored for ``"sgd"``.

    Raises
    ------
    ValueError
        For an unknown ``name`` (the message lists the valid ones), mismatched shapes, a
        key outside ``[0, R)`` (message gives the value and the bound), missing AdaGrad
        state, non-finite hyper-parameters. Nothing is modified when an error is raised.
    TypeError
        For non-float32/float64 arrays or mismatched dtypes.

    Notes
    -----
    Update rules: see :func:`sparse_sgd` (Robbins & Monro 1951) and :func:`sparse_adagrad`
    (Duchi, Hazan & Singer, JMLR 2011; Dean et al., NIPS 2012, §4.1). Summation: when the
    table has at most about ``4 n`` rows the gradient rows are added, in input order, into
    a zeroed ``(R, dim)`` buffer and every touched row is stepped (O(n + R)); otherwise via
    :func:`merge_duplicates` (O(n log n)). Both give bitwise the same result as
    ``merge_duplicates`` followed by ``sparse_sgd`` / ``sparse_adagrad``.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(map(repr, OPTIMIZERS))}")
    w, keys, grads = _check_sparse_args(w, keys, grads)
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    acc = None
    if name == "adagrad":
        acc = _check_acc(_single_slot(slots), w, "slots (adagrad accumulator)")
        eps = _positive(eps, "eps")
    else:
        eps = 1.0  # unused by SGD
    R, n = w.shape[0], keys.shape[0]
    adagrad = name == "adagrad"
    if n == 0 or w.shape[1] == 0:
        _check_rows(keys, R, "keys")
        return
    if R * w.shape[1] <= _DENSE_SPAN_FACTOR * n * w.shape[1] + _DENSE_SPAN_SLACK:
        # Table not much larger than the push: sum into a dense (R, dim) buffer in input
        # order (bitwise the same sums as merge_duplicates), then step every touched row.
        G = np.zeros(w.shape, dtype=w.dtype)
        touched = np.zeros(R, dtype=np.uint8)
        if w.dtype == np.float32:
            bad = _scatter_add[float](keys, grads, G, touched)
        else:
            bad = _scatter_add[double](keys, grads, G, touched)
        if bad >= 0:
            raise _row_error("keys", bad, keys[bad], R)  # w is untouched so far
        if w.dtype == np.float32:
            _touched_step[float](w, acc, adagrad, touched, G, lr, l2, scale, eps)
        else:
            _touched_step[double](w, acc, adagrad, touched, G, lr, l2, scale, eps)
        return
    _check_rows(keys, R, "keys")
    rows, summed = _merge(keys, grads)
    _run_rows_step(w, acc, adagrad, rows, summed, lr, l2, scale, eps)
