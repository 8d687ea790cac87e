"""Sparse logistic regression on the parameter server (no MPI).

Tables: ``weights`` (sparse, one float per feature) and ``bias`` (dense, one row). The
gradient kernel is :func:`hpcps.kernels.logistic.logistic_loss_grad`; the loss is the mean
log-loss of the step's examples plus the optional L2 penalty ``l2/2 * ||w||²`` applied
lazily by the servers to the rows a step touches.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from hpcps.core.resources import available_memory
from hpcps.kernels.keys import unique_inverse
from hpcps.kernels.logistic import logistic_loss_grad, logistic_predict
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec
from hpcps.models.names import BIAS, WEIGHTS  # noqa: F401  (the tables' names, used as lr.WEIGHTS)


def logistic_tables(cfg) -> list:
    """``[(TableSpec, Optimizer)]`` of the logistic model of job ``cfg``, in table-id order.

    The weights get ``[model] l2`` (and, with FTRL, its ``l1``/``l2``); the bias gets no
    regularisation, so FTRL's L1 never zeroes the intercept.
    """
    o = cfg.optimizer
    dtype = cfg.model.dtype
    return [
        (TableSpec(WEIGHTS, cfg.data.num_features, 1, dtype, sparse=True),
         Optimizer.from_config(o, l2=cfg.model.l2)),
        (TableSpec(BIAS, 1, 1, dtype, sparse=False),
         Optimizer.from_config(o, l2=0.0, regularize=False)),
    ]


#: Feature spaces up to this size renumber a batch's columns with a scratch array of one
#: int32 per feature (:func:`hpcps.kernels.keys.unique_inverse`, 4 MiB at 2**20 features);
#: larger ones sort (``np.unique``).
MARKS_MAX_FEATURES = 1 << 24


def batch_keys(X, marks=None):
    """Unique feature keys of a CSR batch and the batch's columns renumbered into them.

    Parameters
    ----------
    X : csr_matrix (B, n_features), or a :class:`LocalizedCSR` (its ``global_keys`` are
        the keys)
    marks : int32 ndarray (n_features,) of zeros, optional
        Scratch space kept by the caller (:func:`new_marks`; for a :class:`LocalizedCSR`,
        one entry per column of it, else a new one is made): two linear passes instead of
        a sort of the ``nnz`` columns (10x faster on Adult batches of 256 rows).

    Returns
    -------
    keys : int64 (m,), sorted
    local_indices : int64 (nnz,), positions of ``X.indices`` in ``keys``
    """
    cols = getattr(X, "global_keys", None)    # a LocalizedCSR: its columns' features
    if cols is not None and (marks is None or marks.size != cols.size):
        marks = new_marks(cols.size)
    if marks is not None:
        keys, local = unique_inverse(X.indices, marks)
    else:
        keys, local = np.unique(X.indices, return_inverse=True)
        keys, local = keys.astype(np.int64, copy=False), local.astype(np.int64, copy=False).reshape(-1)
    return (keys if cols is None else cols[keys]), local


#: :func:`localize`: bytes per entry it needs while it renumbers (an int64 renumbering and
#: the int32 column indices kept), and the share of the node's available memory
#: (``MemAvailable``) it may take; beyond that the partition is not localized.
LOCALIZE_BYTES_PER_ENTRY = 12
LOCALIZE_MEMORY_SHARE = 0.25


class LocalizedCSR(csr_matrix):
    """A CSR matrix whose column ``j`` is feature ``global_keys[j]`` (:func:`localize`); a
    row slice or selection of it is one too, with the same ``global_keys``.

    Attributes
    ----------
    global_keys : int64 ndarray (n_columns,), ascending
        The feature (table key) of each column.
    """

    global_keys = None

    def prune(self):
        """As scipy's ``prune`` (drop the space after the ``nnz`` entries), but arrays of
        exactly ``nnz`` entries are kept as they are: a minibatch's are slices of the
        worker's batch buffers (:mod:`hpcps.worker.batches`), which scipy's would copy
        (small views of a large array) when the matrix is made."""
        n = self.nnz
        if self.indices.shape[0] != n or self.data.shape[0] != n:
            super().prune()

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(out, LocalizedCSR):
            out.global_keys = self.global_keys
        return out


def localize(X):
    """``X`` with its columns renumbered into the features it has: key localization, as the
    ``Localizer`` of DMLC's parameter-server applications (wormhole, difacto) maps a block
    of rows' feature ids onto ``[0, distinct)``; here once per worker partition.

    Parameters
    ----------
    X : csr_matrix (n, n_features), int32 or int64 column indices

    Returns
    -------
    LocalizedCSR (n, m) sharing ``X``'s ``data`` and ``indptr`` (int32 column indices),
    ``m`` = the number of distinct columns of ``X``, ``global_keys`` the sorted distinct
    columns; or ``X`` itself when it is not a CSR matrix, is a :class:`LocalizedCSR`
    already, has every column (nothing to gain) or more than ``MARKS_MAX_FEATURES``
    distinct ones (its minibatches would be sorted either way), or when the renumbering
    (``LOCALIZE_BYTES_PER_ENTRY`` bytes per entry while it is made, 4 kept) would take more
    than ``LOCALIZE_MEMORY_SHARE`` of the node's available memory (a partition that fills
    the node's memory is trained as it is).

    Notes
    -----
    One pass of :func:`hpcps.kernels.keys.unique_inverse` over the partition's ``nnz``
    columns (a sort, ``np.unique``, for feature spaces over ``MARKS_MAX_FEATURES``).
    """
    if not isinstance(X, csr_matrix) or isinstance(X, LocalizedCSR) or X.nnz == 0:
        return X
    have = available_memory()
    if have is not None and LOCALIZE_BYTES_PER_ENTRY * X.nnz > have * LOCALIZE_MEMORY_SHARE:
        return X
    keys, local = batch_keys(X, new_marks(X.shape[1]))
    if keys.size == X.shape[1] or keys.size > MARKS_MAX_FEATURES:
        return X
    out = LocalizedCSR((X.data, local.astype(np.int32), X.indptr),
                       shape=(X.shape[0], int(keys.size)), copy=False)
    out.global_keys = keys
    return out


def new_marks(n_features: int):
    """Zeroed scratch for :func:`batch_keys` (int32 ``(n_features,)``), or None for a feature
    space over ``MARKS_MAX_FEATURES``."""
    return np.zeros(int(n_features), dtype=np.int32) if n_features <= MARKS_MAX_FEATURES else None


def loss_and_gradient(X, y, keys_local, w, bias):
    """Summed log-loss, gradient sum over the batch's keys, and bias gradient sum.

    Parameters
    ----------
    X : csr_matrix (B, n_features)
    y : float64 (B,) in {0, 1}
    keys_local : int64 (nnz,), from :func:`batch_keys`
    w : (m,) pulled weights of the batch's keys, float32/float64
    bias : float

    Returns
    -------
    loss_sum : float
    grad : (m,) same dtype as ``w``
    grad_bias : float
    """
    grad = np.empty_like(w)
    indptr = X.indptr.astype(np.int64, copy=False)
    data = X.data.astype(np.float64, copy=False)
    loss, gb = logistic_loss_grad(indptr, keys_local, data, np.ascontiguousarray(y, dtype=np.float64),
                                  np.ascontiguousarray(w), float(bias), grad)
    return loss, grad, gb


def predict(X, keys_local, w, bias) -> np.ndarray:
    """Probabilities P(y = 1 | x), float64 (B,)."""
    out = np.empty(X.shape[0], dtype=np.float64)
    logistic_predict(X.indptr.astype(np.int64, copy=False), keys_local,
                     X.data.astype(np.float64, copy=False), np.ascontiguousarray(w), float(bias), out)
    return out


def load_metrics() -> None:
    """Import scikit-learn's metrics, which :func:`binary_metrics` uses (about 1 s of one core
    the first time: scipy comes with it)."""
    import sklearn.metrics  # noqa: F401


def binary_metrics(y, p) -> dict:
    """Log-loss, ROC AUC and accuracy (threshold 0.5) with scikit-learn's metrics.

    Parameters
    ----------
    y : array_like of float, shape (n,)
        Labels, 0 or 1.
    p : array_like of float, shape (n,)
        Predicted probabilities of label 1 (clipped to [1e-15, 1 - 1e-15]).

    Returns
    -------
    dict
        ``n``; with rows, ``logloss``, ``accuracy`` and ``auc`` (NaN when ``y`` holds one
        label only).

    Raises
    ------
    ValueError
        For ``p`` with a NaN or an infinity, or ``y`` and ``p`` of different lengths.

    Notes
    -----
    The inputs are checked here once; scikit-learn's own per-call checks of them (parameter
    validation, finiteness, target type) are turned off with its ``config_context``: they
    took 4-5 ms of the 8.6 ms these three metrics took on Adult's 9,769 test rows
    (2026-12-04), paid at every epoch's evaluation while the other workers wait. The AUC is
    ``auc(roc_curve(y, p))``, what ``roc_auc_score`` computes for binary labels.
    """
    import sklearn
    from sklearn.metrics import accuracy_score, auc, log_loss, roc_curve

    y = np.asarray(y, dtype=np.float64).reshape(-1)
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if y.size != p.size:
        raise ValueError(f"binary_metrics: {y.size} labels but {p.size} predictions")
    if not np.isfinite(p).all():
        raise ValueError("binary_metrics: the predictions hold a NaN or an infinity")
    p = np.clip(p, 1e-15, 1 - 1e-15)
    res = {"n": int(y.size)}
    if y.size == 0:
        return res
    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        res["logloss"] = float(log_loss(y, p, labels=[0, 1]))
        res["accuracy"] = float(accuracy_score(y, p >= 0.5))
        res["auc"] = (float(auc(*roc_curve(y, p)[:2])) if 0 < y.sum() < y.size
                      else float("nan"))
    return res
