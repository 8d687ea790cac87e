"""The scikit-learn baseline of a logistic job (``[evaluate] sklearn_baseline``), fitted once per
set of features and cached. Local (the chief); no MPI.

Fitting ``LogisticRegression`` on the quick-start features takes 11-78 s on a loaded 2-core
machine, for 1-4 s of training (issue 22.6), and its result depends only on the features
and the penalty: the data files' bytes, the ``[data]`` settings that turn them into features,
``[model] l2`` and the scikit-learn version. Those make the cache key (XXH3-128 of them); the
result is kept as JSON in the cache directory — ``$HPCPS_CACHE_DIR``, else
``$XDG_CACHE_HOME/hpcps``, else ``~/.cache/hpcps`` (``HPCPS_CACHE_DIR=off``: no cache) — under
``baseline/<key>.json``. A re-run,
a copied job that changes anything else (workers, optimizer, consistency, output dir) and
``hpcps check`` reuse it; a changed data file or setting fits again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import xxhash

from hpcps.data.featcache import cache_root, file_digest
from hpcps.core.arrays import distinct


def cache_dir(environ=None) -> Path | None:
    """Where cached baselines live (see the module docstring), ``None`` when the cache is off
    (``HPCPS_CACHE_DIR`` set to ``off`` or empty: :func:`hpcps.data.featcache.cache_root`).
    Local."""
    return cache_root(environ)


def fingerprint(cfg) -> str:
    """Cache key of the baseline of job ``cfg``: XXH3-128 (hex) of the data files' bytes (not
    their paths), the other ``[data]`` settings, ``[model] l2`` and the scikit-learn version.
    Local.

    Raises
    ------
    OSError
        If a data file cannot be read.
    """
    import sklearn

    data = {k: str(v) for k, v in dataclasses.asdict(cfg.data).items()
            if k not in ("path", "test_path")}         # the files count by their bytes
    files = [file_digest(p) for p in (cfg.data.path, cfg.data.test_path) if p is not None]
    key = json.dumps({"data": data, "files": files, "l2": cfg.model.l2,
                      "sklearn": sklearn.__version__}, sort_keys=True)
    return xxhash.xxh3_128(key.encode()).hexdigest()


def cached_baseline(cfg, fit, environ=None) -> dict:
    """The baseline of job ``cfg``: from the cache when its features were fitted before, else
    ``fit(cfg)`` (a dict of JSON values), then kept in the cache. Local.

    Returns
    -------
    dict
        ``fit``'s result, with ``cached`` (bool) and, from the cache, ``fitted_seconds`` (the
        original fit's time) and ``seconds`` (the time to read it back).
    """
    t0 = time.perf_counter()
    root = cache_dir(environ)
    try:
        path = None if root is None else root / "baseline" / f"{fingerprint(cfg)}.json"
    except OSError:
        path = None                          # unreadable data file: the fit will say why
    if path is not None:
        try:
            got = json.loads(path.read_text())
            got.update(cached=True, fitted_seconds=got.get("seconds", 0.0),
                       seconds=time.perf_counter() - t0)
            return got
        except (OSError, ValueError, AttributeError):
            pass
    res = dict(fit(cfg))
    if path is not None:
        from hpcps.runtime.output import OutputError, write_metrics

        try:
            write_metrics(path, res)
        except OutputError:
            pass                             # no cache (read-only home, full disk): fit each time
    res["cached"] = False
    return res


def sklearn_baseline(cfg) -> dict:
    """Fit scikit-learn ``LogisticRegression`` on the job's own features; test metrics. Local.

    Returns
    -------
    dict
        ``C``, ``test_auc``, ``test_logloss``, ``test_accuracy``, ``seconds`` (the fit's
        wall time, with the data loading).
    """
    from sklearn.linear_model import LogisticRegression

    from hpcps.data.source import load_split
    from hpcps.models.logistic_math import binary_metrics

    t0 = time.perf_counter()
    X, y = load_split(cfg.data, "train", 0, 1)
    Xt, yt = load_split(cfg.data, "test", 0, 1)
    X, Xt = compact_columns(X, Xt)
    c = 1.0 / (cfg.model.l2 * X.shape[0]) if cfg.model.l2 > 0 else 1.0
    clf = LogisticRegression(C=c, max_iter=1000)
    clf.fit(X, y)
    m = binary_metrics(yt, clf.predict_proba(Xt)[:, 1])
    return {"C": c, "test_auc": m["auc"], "test_logloss": m["logloss"],
            "test_accuracy": m["accuracy"], "seconds": time.perf_counter() - t0}


def compact_columns(X, Xt):
    """``(X, Xt)`` with only the columns that occur in ``X``, renumbered ``0..k-1`` in order.

    Raw 63-bit feature ids (a dynamic table) give a matrix of ``2**63 - 1`` columns that
    scikit-learn cannot hold a coefficient vector for; a column absent from the training
    rows gets a zero coefficient under L2, so dropping it from ``Xt`` changes no prediction.
    Matrices of at most ``2**24`` columns are returned as they are.

    Parameters
    ----------
    X, Xt : scipy.sparse.csr_matrix, shapes (n, d) and (m, d)

    Returns
    -------
    tuple of scipy.sparse.csr_matrix, shapes (n, k) and (m, k)
    """
    import numpy as np
    import scipy.sparse as sp

    if X.shape[1] <= 1 << 24:
        return X, Xt
    cols = distinct(X.indices)

    def remap(M):
        M = M.tocoo()
        j = np.searchsorted(cols, M.col)
        keep = (j < cols.size) & (cols[np.minimum(j, cols.size - 1)] == M.col)
        return sp.csr_matrix((M.data[keep], (M.row[keep], j[keep])), shape=(M.shape[0], cols.size))

    return remap(X), remap(Xt)
