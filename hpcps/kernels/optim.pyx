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
stochastic optimization", JMLR 12, 2011 (diagonal variant, §1 and eq. (1)); used by Downpour
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
from libc.stdint cimport int64_t, uint64_t

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


def _check_rows(const int64_t[::1] rows, int64_t num_rows, name="rows"):
    """Raise ValueError naming the first entry of ``rows`` outside ``[0, num_rows)``."""
    cdef Py_ssize_t i, bad = -1, n = rows.shape[0]
    with nogil:
        for i in range(n):
            if <uint64_t>rows[i] >= <uint64_t>num_rows:
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"{name}[{bad}] = {rows[bad]} is out of range [0, {num_rows}) "
                         f"(w has {num_rows} rows)")


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

cdef Py_ssize_t _slots_by_counting(const int64_t[::1] keys, int64_t kmin, int64_t[::1] pos,
                                   int64_t[::1] slot) noexcept nogil:
    """Counting pass over the key span; returns the number of distinct keys.

    ``pos`` (span,) zero-filled on entry. On return ``slot[i]`` is the rank of ``keys[i]``
    among the distinct keys, and ``pos[k - kmin]`` is that rank + 1 (0 if k is absent).
    """
    cdef Py_ssize_t i, s, n = keys.shape[0], span = pos.shape[0]
    cdef int64_t m = 0
    for i in range(n):
        pos[<uint64_t>keys[i] - <uint64_t>kmin] = 1
    for s in range(span):
        if pos[s]:
            m += 1
            pos[s] = m
    for i in range(n):
        slot[i] = pos[<uint64_t>keys[i] - <uint64_t>kmin] - 1
    return m


cdef void _fill_unique_from_pos(const int64_t[::1] pos, int64_t kmin,
                                int64_t[::1] ukeys) noexcept nogil:
    cdef Py_ssize_t s, span = pos.shape[0]
    for s in range(span):
        if pos[s]:
            ukeys[pos[s] - 1] = <int64_t>(<uint64_t>kmin + <uint64_t>s)


cdef Py_ssize_t _slots_by_order(const int64_t[::1] sorted_keys, const int64_t[::1] order,
                                int64_t[::1] slot, int64_t[::1] ukeys) noexcept nogil:
    """Given keys in sorted order and the permutation, fill slot / ukeys; return m."""
    cdef Py_ssize_t t, n = sorted_keys.shape[0]
    cdef int64_t m = -1
    cdef int64_t k
    for t in range(n):
        k = sorted_keys[t]
        if m < 0 or k != ukeys[m]:
            m += 1
            ukeys[m] = k
        slot[order[t]] = m
    return m + 1


cdef void _accumulate(const int64_t[::1] slot, const floating[:, ::1] values,
                      floating[:, ::1] out) noexcept nogil:
    """``out[slot[i]] += values[i]`` for i = 0, 1, ... in input order (out zero-filled)."""
    cdef Py_ssize_t i, j, s, n = values.shape[0], dim = values.shape[1]
    if dim == 1:
        for i in range(n):
            out[slot[i], 0] += values[i, 0]
    else:
        for i in range(n):
            s = slot[i]
            for j in range(dim):
                out[s, j] += values[i, j]


def _key_slots(arr):
    """Sorted distinct keys ``ukeys`` (m,) and ``slot`` (n,) with ``ukeys[slot] == keys``.

    ``arr``: validated int64 (n,) C-contiguous array.
    """
    cdef const int64_t[::1] keys = arr
    cdef Py_ssize_t i, n = keys.shape[0]
    cdef int64_t kmin, kmax
    cdef uint64_t span
    cdef Py_ssize_t m
    cdef int64_t[::1] slot_v, ukeys_v, pos_v, sorted_v, order_v
    slot = np.empty(n, dtype=np.int64)
    if n == 0:
        return np.empty(0, dtype=np.int64), slot
    kmin = keys[0]
    kmax = keys[0]
    with nogil:
        for i in range(1, n):
            if keys[i] < kmin:
                kmin = keys[i]
            elif keys[i] > kmax:
                kmax = keys[i]
    span = <uint64_t>kmax - <uint64_t>kmin + 1  # 0 if the keys cover all 2**64 values
    slot_v = slot
    if span != 0 and span <= <uint64_t>(_DENSE_SPAN_FACTOR * n + _DENSE_SPAN_SLACK):
        # Counting sort over the span: O(n + span), no comparison sort.
        pos = np.zeros(span, dtype=np.int64)
        pos_v = pos
        with nogil:
            m = _slots_by_counting(keys, kmin, pos_v, slot_v)
        ukeys = np.empty(m, dtype=np.int64)
        ukeys_v = ukeys
        with nogil:
            _fill_unique_from_pos(pos_v, kmin, ukeys_v)
        return ukeys, slot
    # Sort path. Pack (key - kmin, i) into one uint64 when it fits: the packed values are
    # distinct, so numpy's fast (unstable, SIMD) sort yields exactly the (key, i) order.
    ibits = max(int(n - 1).bit_length(), 1)
    sbits = int(span - 1).bit_length() if span != 0 else 64
    if ibits + sbits <= 64:
        packed = (arr.view(np.uint64) - np.uint64(<uint64_t>kmin)) << np.uint64(ibits)
        packed |= np.arange(n, dtype=np.uint64)
        packed.sort()
        order = (packed & np.uint64((1 << ibits) - 1)).view(np.int64)
        sorted_keys = ((packed >> np.uint64(ibits)) + np.uint64(<uint64_t>kmin)).view(np.int64)
        del packed
    else:
        order = np.argsort(arr, kind="stable")
        sorted_keys = arr[order]
    order_v = order
    sorted_v = sorted_keys
    ukeys = np.empty(n, dtype=np.int64)
    ukeys_v = ukeys
    with nogil:
        m = _slots_by_order(sorted_v, order_v, slot_v, ukeys_v)
    return ukeys[:m].copy(), slot


cdef _merge_typed(const int64_t[::1] slot, const floating[:, ::1] values, floating[:, ::1] out):
    with nogil:
        _accumulate(slot, values, out)


def _merge(keys, values):
    """merge_duplicates on validated inputs (keys int64 (n,), values C-contiguous (n, dim))."""
    ukeys, slot = _key_slots(keys)
    out = np.zeros((ukeys.shape[0], values.shape[1]), dtype=values.dtype)
    if values.shape[0] and values.shape[1]:
        if values.dtype == np.float32:
            _merge_typed[float](slot, values, out)
        else:
            _merge_typed[double](slot, values, out)
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
    Deterministic: each output row starts at +0.0 and adds its input rows in input order
    (the result is bitwise equal to ``np.add.at(np.zeros((m, dim)), slot, values)``).
    The key-to-row map comes from a counting pass over ``[min(keys), max(keys)]`` when that
    span is at most about 4n, otherwise from a sort of the keys (Knuth, TAOCP vol. 3, §5.2,
    distribution counting / sorting); the summation itself never depends on the sort.
    Empty input gives outputs of shape (0,) and (0, dim).
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

cdef _sparse_sgd_typed(floating[:, ::1] w, const int64_t[::1] rows,
                       const floating[:, ::1] grads, double lr_, double l2_, double scale_):
    cdef Py_ssize_t i, j, r, m = rows.shape[0], dim = w.shape[1]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_, g
    with nogil:
        for i in range(m):
            r = rows[i]
            for j in range(dim):
                g = scale * grads[i, j] + l2 * w[r, j]
                w[r, j] = w[r, j] - lr * g


cdef _sparse_adagrad_typed(floating[:, ::1] w, floating[:, ::1] acc, const int64_t[::1] rows,
                           const floating[:, ::1] grads, double lr_, double l2_,
                           double scale_, double eps_):
    cdef Py_ssize_t i, j, r, m = rows.shape[0], dim = w.shape[1]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_
    cdef floating eps = <floating>eps_, g, a
    with nogil:
        for i in range(m):
            r = rows[i]
            for j in range(dim):
                g = scale * grads[i, j] + l2 * w[r, j]
                a = acc[r, j] + g * g
                acc[r, j] = a
                w[r, j] = w[r, j] - lr * g / (<floating>sqrt(a) + eps)


cdef _dense_sgd_typed(floating[::1] w, const floating[::1] grads,
                      double lr_, double l2_, double scale_):
    cdef Py_ssize_t i, n = w.shape[0]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_, g
    with nogil:
        for i in range(n):
            g = scale * grads[i] + l2 * w[i]
            w[i] = w[i] - lr * g


cdef _dense_adagrad_typed(floating[::1] w, floating[::1] acc, const floating[::1] grads,
                          double lr_, double l2_, double scale_, double eps_):
    cdef Py_ssize_t i, n = w.shape[0]
    cdef floating lr = <floating>lr_, l2 = <floating>l2_, scale = <floating>scale_
    cdef floating eps = <floating>eps_, g, a
    with nogil:
        for i in range(n):
            g = scale * grads[i] + l2 * w[i]
            a = acc[i] + g * g
            acc[i] = a
            w[i] = w[i] - lr * g / (<floating>sqrt(a) + eps)


def _run_sparse_sgd(w, rows, grads, lr, l2, scale):
    if w.dtype == np.float32:
        _sparse_sgd_typed[float](w, rows, grads, lr, l2, scale)
    else:
        _sparse_sgd_typed[double](w, rows, grads, lr, l2, scale)


def _run_sparse_adagrad(w, acc, rows, grads, lr, l2, scale, eps):
    if w.dtype == np.float32:
        _sparse_adagrad_typed[float](w, acc, rows, grads, lr, l2, scale, eps)
    else:
        _sparse_adagrad_typed[double](w, acc, rows, grads, lr, l2, scale, eps)


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
    Stochastic gradient descent: Robbins & Monro, Ann. Math. Statist. 22(3), 1951; the
    lazy, sparse form of the L2 term as in Bottou, "Stochastic gradient descent tricks",
    Neural Networks: Tricks of the Trade, 2012, §5.1.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    _check_rows(rows, w.shape[0])
    if rows.shape[0] and w.shape[1]:
        _run_sparse_sgd(w, rows, grads, lr, l2, scale)


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
    optimization", JMLR 12:2121-2159, 2011 (diagonal update, eq. (1) with ``delta = eps``);
    the rule used by Downpour SGD, Dean et al., "Large scale distributed deep networks",
    NIPS 2012, §4.1.
    """
    w, rows, grads = _check_sparse_args(w, rows, grads)
    acc = _check_acc(acc, w)
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    eps = _positive(eps, "eps")
    _check_rows(rows, w.shape[0])
    if rows.shape[0] and w.shape[1]:
        _run_sparse_adagrad(w, acc, rows, grads, lr, l2, scale, eps)


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
        _dense_sgd_typed[float](w, grads, lr, l2, scale)
    else:
        _dense_sgd_typed[double](w, grads, lr, l2, scale)


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
    Duchi, Hazan & Singer, JMLR 12, 2011, eq. (1); Dean et al., NIPS 2012, §4.1.
    """
    w, grads = _check_dense_args(w, grads)
    acc = _check_acc(acc, w)
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    eps = _positive(eps, "eps")
    if w.dtype == np.float32:
        _dense_adagrad_typed[float](w, acc, grads, lr, l2, scale, eps)
    else:
        _dense_adagrad_typed[double](w, acc, grads, lr, l2, scale, eps)


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
    (Duchi, Hazan & Singer, JMLR 2011; Dean et al., NIPS 2012, §4.1). Summing duplicates
    first is what a parameter server does for one aggregated minibatch step (Li et al.,
    "Scaling distributed machine learning with the parameter server", OSDI 2014, §3).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(map(repr, OPTIMIZERS))}")
    w, keys, grads = _check_sparse_args(w, keys, grads)
    lr, l2, scale = _finite(lr, "lr"), _finite(l2, "l2"), _finite(scale, "scale")
    acc = None
    if name == "adagrad":
        acc = _check_acc(_single_slot(slots), w, "slots (adagrad accumulator)")
        eps = _positive(eps, "eps")
    _check_rows(keys, w.shape[0], "keys")
    if keys.shape[0] == 0 or w.shape[1] == 0:
        return
    rows, summed = _merge(keys, grads)
    if name == "sgd":
        _run_sparse_sgd(w, rows, summed, lr, l2, scale)
    else:
        _run_sparse_adagrad(w, acc, rows, summed, lr, l2, scale, eps)
