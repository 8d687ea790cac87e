"""Worker-side sparse logistic regression: loss, gradient and prediction on a CSR batch.

Model: ``P(y = 1 | x) = sigmoid(m)``, margin ``m = bias + sum_j x_j w_j``, labels in
``{0, 1}`` (values in ``[0, 1]`` are accepted and treated as soft labels). Per example
the negative log-likelihood is::

    loss = y * softplus(-m) + (1 - y) * softplus(m),   softplus(z) = log(1 + exp(z))

with gradient ``(sigmoid(m) - y) * x`` with respect to ``w`` and ``sigmoid(m) - y`` with
respect to the bias (Bishop, "Pattern Recognition and Machine Learning", 2006, §4.3.2,
eqs. (4.90)-(4.91); Hastie, Tibshirani & Friedman, "The Elements of Statistical
Learning", 2nd ed., §4.4.1).

Numerical stability: with ``e = exp(-|m|)`` (never overflows, in ``(0, 1]``)::

    softplus(m)  = max(m, 0)  + log1p(e)
    softplus(-m) = max(-m, 0) + log1p(e)
    sigmoid(m)   = 1 / (1 + e)  if m >= 0  else  e / (1 + e)

so loss, probability and gradient stay finite for any finite margin (e.g. ±1000), and the
small losses of confidently right predictions keep full relative precision (the
``log1p(exp(-|m|))`` form of softplus, cf. Mächler, "Accurately computing
log(1 - exp(-|a|)) assessed by the Rmpfr package", CRAN vignette, 2012).

CSR input (Saad, "Iterative Methods for Sparse Linear Systems", 2nd ed., 2003, §3.4):
row ``b`` has entries ``indices[indptr[b]:indptr[b+1]]`` / ``data[...]``. Column indices
are *local*: positions in ``w``, the weights pulled for the batch's distinct keys.
"""

import numpy as np

from cython cimport floating
from libc.math cimport exp, fabs, log1p
from libc.stdint cimport int32_t, int64_t, uint64_t

__all__ = ["logistic_loss_grad", "logistic_predict"]

ctypedef fused index_t:
    int32_t
    int64_t


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------

def _index_arrays(indptr, indices):
    """Both as C-contiguous int32 or int64 arrays of one common dtype."""
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    for name, a in (("indptr", indptr), ("indices", indices)):
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError(f"{name} must have an integer dtype (int64 or int32), got {a.dtype}")
    if indptr.dtype == np.int32 and indices.dtype == np.int32:
        dt = np.int32
    else:
        dt = np.int64
        for name, a in (("indptr", indptr), ("indices", indices)):
            if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
                raise ValueError(f"{name} has value {int(a.max())} > 2**63 - 1")
    return (np.ascontiguousarray(indptr, dtype=dt), np.ascontiguousarray(indices, dtype=dt))


def _float64_vector(a, name):
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "fiub" and a.size:
        raise TypeError(f"{name} must be numeric (float64), got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float64)


def _weights(w):
    w = np.asarray(w)
    if w.ndim != 1:
        raise ValueError(f"w must be 1-D (n,), got shape {w.shape}")
    if w.dtype != np.float32 and w.dtype != np.float64:
        raise TypeError(f"w must have dtype float32 or float64, got {w.dtype}")
    return np.ascontiguousarray(w)


def _output(out, name, dtype, n):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} is an output and must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {out.dtype}")
    if out.ndim != 1 or out.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{name} must be C-contiguous and writeable")
    return out


cdef Py_ssize_t _bad_indptr(const index_t[::1] indptr, Py_ssize_t nnz) noexcept nogil:
    """First b with indptr[b] outside [indptr[b-1], nnz] (indptr[-1] := 0), or -1."""
    cdef Py_ssize_t b
    cdef int64_t prev = 0
    for b in range(indptr.shape[0]):
        if indptr[b] < prev or indptr[b] > nnz:
            return b
        prev = indptr[b]
    return -1


def _check_csr(indptr, indices, data, Py_ssize_t nnz):
    """Validate the row pointers: 0 <= indptr[0] <= ... <= indptr[B] <= nnz."""
    cdef Py_ssize_t bad
    if indptr.shape[0] < 1:
        raise ValueError("indptr must have at least one entry (B + 1 for B rows)")
    if indices.shape[0] != data.shape[0]:
        raise ValueError(f"indices has {indices.shape[0]} entries but data has {data.shape[0]}")
    if indptr.dtype == np.int32:
        bad = _bad_indptr[int32_t](indptr, nnz)
    else:
        bad = _bad_indptr[int64_t](indptr, nnz)
    if bad >= 0:
        raise ValueError(f"indptr[{bad}] = {indptr[bad]} is invalid: indptr must be "
                         f"non-decreasing, start >= 0 and end <= nnz = {nnz}")


def _column_error(indices, Py_ssize_t pos, Py_ssize_t n):
    return ValueError(f"column index indices[{pos}] = {indices[pos]} is out of range "
                      f"[0, {n}) (len(w) = {n})")


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------

cdef inline double _margin(const index_t[::1] indices, const double[::1] data,
                           const floating[::1] w, Py_ssize_t lo, Py_ssize_t hi,
                           double bias, Py_ssize_t* bad) noexcept nogil:
    """bias + sum_j data[j] * w[indices[j]]; sets *bad to the first bad j (else untouched)."""
    cdef Py_ssize_t j
    cdef index_t col
    cdef uint64_t n = <uint64_t>w.shape[0]
    cdef double s = 0.0
    for j in range(lo, hi):
        col = indices[j]
        if <uint64_t>col >= n:
            bad[0] = j
            return 0.0
        s += data[j] * w[col]
    return s + bias


cdef inline double _sigmoid_from(double m, double e) noexcept nogil:
    """sigmoid(m) given e = exp(-|m|)."""
    if m >= 0.0:
        return 1.0 / (1.0 + e)
    return e / (1.0 + e)


cdef (double, double, Py_ssize_t) _loss_grad_typed(
        const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
        const double[::1] y, const floating[::1] w, double bias, floating[::1] grad):
    cdef Py_ssize_t b, j, nrows = indptr.shape[0] - 1, bad = -1
    cdef double m, e, p, r, yb, t, loss = 0.0, gbias = 0.0
    with nogil:
        for j in range(grad.shape[0]):
            grad[j] = 0
        for b in range(nrows):
            m = _margin(indices, data, w, indptr[b], indptr[b + 1], bias, &bad)
            if bad >= 0:
                break
            yb = y[b]
            e = exp(-fabs(m))
            # y * max(-m, 0) + (1 - y) * max(m, 0), written so that y in {0, 1} never
            # multiplies an infinite margin by 0.
            if m > 0.0:
                t = (1.0 - yb) * m if yb != 1.0 else 0.0
            else:
                t = -yb * m if yb != 0.0 else 0.0
            loss += t + log1p(e)
            p = _sigmoid_from(m, e)
            r = p - yb
            gbias += r
            for j in range(indptr[b], indptr[b + 1]):
                grad[indices[j]] += <floating>(r * data[j])
    return loss, gbias, bad


cdef Py_ssize_t _predict_typed(const index_t[::1] indptr, const index_t[::1] indices,
                               const double[::1] data, const floating[::1] w, double bias,
                               double[::1] out):
    cdef Py_ssize_t b, nrows = indptr.shape[0] - 1, bad = -1
    cdef double m
    with nogil:
        for b in range(nrows):
            m = _margin(indices, data, w, indptr[b], indptr[b + 1], bias, &bad)
            if bad >= 0:
                break
            out[b] = _sigmoid_from(m, exp(-fabs(m)))
    return bad


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------

def logistic_loss_grad(indptr, indices, data, y, w, bias, grad):
    """Summed log-loss and gradient of logistic regression on a CSR minibatch.

    Parameters
    ----------
    indptr : ndarray of int64 (or int32), shape (B + 1,)
        CSR row pointers; must be non-decreasing with ``0 <= indptr[0]`` and
        ``indptr[B] <= nnz``.
    indices : ndarray of int64 (or int32), shape (nnz,)
        Local column indices, each in ``[0, n)``: positions in ``w``. (If ``indptr`` and
        ``indices`` have different integer dtypes both are converted to int64.)
    data : ndarray of float64, shape (nnz,)
        Feature values (other numeric dtypes are converted to float64).
    y : ndarray of float64, shape (B,)
        Labels in ``{0, 1}`` (soft labels in ``[0, 1]`` also work).
    w : ndarray of float32 or float64, shape (n,)
        Weights pulled for the batch's distinct keys.
    bias : float
        Intercept.
    grad : ndarray, shape (n,), dtype of ``w``, C-contiguous, writeable
        Output. Zero-filled, then receives the gradient *sum* over the batch,
        ``grad[c] = sum_b sum_{j in row b, indices[j] == c} (p_b - y_b) * data[j]``
        (accumulated in the dtype of ``w``). Unspecified if an error is raised.

    Returns
    -------
    loss_sum : float
        Sum over the B examples of the log-loss, in nats (not the mean).
    grad_bias : float
        Sum over the batch of ``p_b - y_b``, the gradient with respect to ``bias``.

    Raises
    ------
    TypeError
        For non-integer index arrays, ``w`` not float32/float64, or ``grad`` not an ndarray
        of the dtype of ``w``.
    ValueError
        For mismatched lengths (``len(y) != B``, ``len(indices) != len(data)``,
        ``grad.shape != w.shape``), invalid ``indptr``, or a column index outside
        ``[0, n)`` (the message gives the position, the value and the bound).

    Notes
    -----
    Loss and gradient: Bishop, PRML 2006, §4.3.2 (eqs. 4.90-4.91). Computed stably
    through ``e = exp(-|m|)``; see the module docstring. Margins are accumulated in float64
    whatever the dtype of ``w``.
    """
    indptr, indices = _index_arrays(indptr, indices)
    data = _float64_vector(data, "data")
    y = _float64_vector(y, "y")
    w = _weights(w)
    grad = _output(grad, "grad", w.dtype, w.shape[0])
    _check_csr(indptr, indices, data, data.shape[0])
    if y.shape[0] != indptr.shape[0] - 1:
        raise ValueError(f"y has {y.shape[0]} labels but indptr describes "
                         f"{indptr.shape[0] - 1} rows")
    bias = float(bias)
    if indptr.dtype == np.int32:
        if w.dtype == np.float32:
            loss, gbias, bad = _loss_grad_typed[int32_t, float](indptr, indices, data, y, w, bias, grad)
        else:
            loss, gbias, bad = _loss_grad_typed[int32_t, double](indptr, indices, data, y, w, bias, grad)
    else:
        if w.dtype == np.float32:
            loss, gbias, bad = _loss_grad_typed[int64_t, float](indptr, indices, data, y, w, bias, grad)
        else:
            loss, gbias, bad = _loss_grad_typed[int64_t, double](indptr, indices, data, y, w, bias, grad)
    if bad >= 0:
        raise _column_error(indices, bad, w.shape[0])
    return loss, gbias


def logistic_predict(indptr, indices, data, w, bias, out):
    """Probabilities ``P(y = 1 | x) = sigmoid(bias + x . w)`` for a CSR batch.

    Parameters
    ----------
    indptr : ndarray of int64 (or int32), shape (B + 1,)
        CSR row pointers (non-decreasing, ``0 <= indptr[0]``, ``indptr[B] <= nnz``).
    indices : ndarray of int64 (or int32), shape (nnz,)
        Local column indices in ``[0, n)``.
    data : ndarray of float64, shape (nnz,)
        Feature values.
    w : ndarray of float32 or float64, shape (n,)
        Weights.
    bias : float
        Intercept.
    out : ndarray of float64, shape (B,), C-contiguous, writeable
        Output probabilities in ``[0, 1]``. Unspecified if an error is raised.

    Raises
    ------
    TypeError
        For non-integer index arrays, ``w`` not float32/float64, or ``out`` not a float64
        ndarray.
    ValueError
        For mismatched lengths, invalid ``indptr`` or a column index outside ``[0, n)``
        (the message gives the position, the value and the bound).

    Notes
    -----
    Logistic function evaluated stably for either sign of the margin (module docstring);
    model as in Bishop, PRML 2006, §4.3.2.
    """
    indptr, indices = _index_arrays(indptr, indices)
    data = _float64_vector(data, "data")
    w = _weights(w)
    _check_csr(indptr, indices, data, data.shape[0])
    out = _output(out, "out", np.float64, indptr.shape[0] - 1)
    bias = float(bias)
    if indptr.dtype == np.int32:
        if w.dtype == np.float32:
            bad = _predict_typed[int32_t, float](indptr, indices, data, w, bias, out)
        else:
            bad = _predict_typed[int32_t, double](indptr, indices, data, w, bias, out)
    else:
        if w.dtype == np.float32:
            bad = _predict_typed[int64_t, float](indptr, indices, data, w, bias, out)
        else:
            bad = _predict_typed[int64_t, double](indptr, indices, data, w, bias, out)
    if bad >= 0:
        raise _column_error(indices, bad, w.shape[0])
