"""The objective in plain numpy and scikit-learn's solution of the same problem (no MPI).

``F(w, b) = (1/n) Σ_i [log(1 + exp(m_i)) - y_i m_i] + (l2/2) ||w||²``, ``m_i = b + x_i · w``.

scikit-learn's ``LogisticRegression(C=C)`` minimises ``C Σ_i logloss_i + ½ ||w||²`` with the
intercept not penalised (for ``solver="lbfgs"``); with ``C = 1 / (l2 n)`` that is ``F / l2``,
so both have the same minimiser and the objective values compare as ``F``.
"""

from __future__ import annotations

import time

import numpy as np

from hpcps.core.arrays import distinct


def objective(X, y, w, b: float, l2: float) -> float:
    """``F(w, b)`` evaluated centrally.

    Parameters
    ----------
    X : scipy.sparse matrix (n, num_features)
    y : float64 (n,) in {0, 1}
    w : float64 (num_features,)
    b : float
    l2 : float

    Returns
    -------
    float
        Mean log-loss (nats) plus ``l2/2 ||w||²``; ``np.logaddexp`` keeps it finite for any
        finite margin.
    """
    m = X @ w + b
    y = np.asarray(y, dtype=np.float64)
    return float(np.mean(np.logaddexp(0.0, m) - y * m) + 0.5 * l2 * float(np.dot(w, w)))


def sklearn_solution(X, y, l2: float, tol: float, max_iter: int = 10000) -> dict:
    """Fit ``LogisticRegression(solver="lbfgs", C=1/(l2 n))`` on the columns that occur in
    ``X`` and return the solution in the full feature space.

    The columns no row has get weight 0 at the optimum of both problems (their gradient is
    ``l2 w_j``), so dropping them changes nothing but the time (10x faster on Adult's 2^20
    hashed features).

    Parameters
    ----------
    X : scipy.sparse.csr_matrix (n, num_features)
    y : float64 (n,)
    l2 : float
        >= 0; 0 fits without penalty (``penalty=None``).
    tol : float
        scikit-learn's ``tol`` (max |gradient| of the mean-scaled objective at which L-BFGS-B
        stops).
    max_iter : int

    Returns
    -------
    dict
        ``w`` (float64 (num_features,)), ``b``, ``C``, ``tol``, ``n_iter``, ``seconds``,
        ``objective`` (``F`` at the solution).
    """
    from sklearn.linear_model import LogisticRegression

    n = X.shape[0]
    cols = distinct(X.indices)
    t0 = time.perf_counter()
    if l2 > 0:
        c = 1.0 / (l2 * n)
        clf = LogisticRegression(C=c, solver="lbfgs", tol=tol, max_iter=max_iter)
    else:
        c = float("inf")
        clf = LogisticRegression(penalty=None, solver="lbfgs", tol=tol, max_iter=max_iter)
    clf.fit(X[:, cols], y)
    seconds = time.perf_counter() - t0
    w = np.zeros(X.shape[1], dtype=np.float64)
    w[cols] = clf.coef_[0]
    b = float(clf.intercept_[0])
    return {"w": w, "b": b, "C": c, "tol": tol, "n_iter": int(np.max(clf.n_iter_)),
            "seconds": seconds, "objective": objective(X, y, w, b, l2)}
