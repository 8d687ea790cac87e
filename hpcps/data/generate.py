"""``hpcps data generate criteo-like``: a Criteo-format click log drawn from a known model.

No MPI. The rows are drawn from a seeded ground-truth logistic model over the same features
hpcps reads from Criteo files (:mod:`hpcps.kernels.criteo`), so a trained model's AUC can be
compared with the best possible one, and large benchmarks need no download.

Distributions (seed ``s``, ``numpy.random.default_rng``):

- categorical field ``C(j+1)``, ``j = 0..25``: a vocabulary of ``V_j = round(10**(1 + 5 j/25))``
  values (10 to 10^6), drawn with Zipf probabilities ``p(r) ∝ r**-1.1`` over ranks
  ``r = 1..V_j``; the value written is a 32-bit hash of ``(j, r, s)`` as 8 hex digits;
  missing (empty) with probability 0.02 + 0.2 [j % 5 == 0];
- integer field ``I(i+1)``, ``i = 0..12``: ``floor(exp(N(mu_i, 1.5**2))) - 1`` with
  ``mu_i = 0.25 i`` (non-negative counts with a heavy tail); missing with probability 0.2;
- label: ``Bernoulli(sigmoid(b + sum of the 39 fields' weights))``; the weight of a field's
  value (its log-bin for integer fields, the missing value included) is
  ``sigma * Phi^-1(u)`` with ``u`` a uniform drawn by hashing the feature id with the seed
  (``sigma = 0.3``); ``b = -1.6`` gives a click rate near 0.25 (Criteo's is 0.26).

``_truth.json`` in the output directory (a leading ``_`` keeps it out of the data files a
directory names, as in Hadoop and Spark) records the seed, the distributions, the files with
their rows, and the ground-truth model's AUC and log-loss on each file (the best a model of
these features can reach, up to sampling noise).
"""

from __future__ import annotations

import gzip
import json
import os
import time

import numpy as np
from scipy.special import ndtri
from sklearn.metrics import log_loss, roc_auc_score

from hpcps.kernels.criteo import MISSING, N_CAT, N_INT, feature_ids, format_criteo, int_bins

__all__ = ["GENERATORS", "CriteoLike", "generate_criteo_like"]

SIGMA = 0.3
BIAS = -1.6
ZIPF = 1.1
INT_MISSING = 0.2
#: Rows drawn at a time.
BLOCK = 65_536


def _cat_missing(j: int) -> float:
    return 0.02 + (0.2 if j % 5 == 0 else 0.0)


class CriteoLike:
    """The ground-truth model and row sampler (see the module docstring).

    Parameters
    ----------
    seed : int
        Seeds both the model's weights and the rows.
    """

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.vocab = [int(round(10 ** (1 + 5 * j / 25))) for j in range(N_CAT)]
        self._cdf = []
        for v in self.vocab:
            w = np.arange(1, v + 1, dtype=np.float64) ** -ZIPF
            c = np.cumsum(w)
            self._cdf.append(c / c[-1])
        self._hex = [(feature_ids(np.full(v, N_INT + j), np.arange(1, v + 1), 0, self.seed)
                      & 0xFFFFFFFF).astype(np.uint32) for j, v in enumerate(self.vocab)]

    def weights(self, fields: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Ground-truth weight of each (field, binned value); float64, same shape."""
        ids = feature_ids(fields, values, 0, self.seed ^ 0x5DEECE66D).astype(np.uint64)
        u = ((ids >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -52
        return SIGMA * ndtri(u)

    def sample(self, n: int, rng: np.random.Generator):
        """``n`` rows: (labels uint8, ints int64 (n,13), cats uint32 (n,26), int_missing,
        cat_missing uint8, p float64 = the true click probability)."""
        ints = np.floor(np.exp(rng.normal(0.25 * np.arange(N_INT), 1.5, size=(n, N_INT)))).astype(np.int64) - 1
        int_missing = (rng.random((n, N_INT)) < INT_MISSING).astype(np.uint8)
        cats = np.empty((n, N_CAT), dtype=np.uint32)
        cat_missing = np.empty((n, N_CAT), dtype=np.uint8)
        logit = np.full(n, BIAS)
        bins = np.where(int_missing.astype(bool), MISSING, int_bins(ints))
        for i in range(N_INT):
            logit += self.weights(np.full(n, i), bins[:, i])
        for j in range(N_CAT):
            r = np.searchsorted(self._cdf[j], rng.random(n), side="right")
            r = np.minimum(r, self.vocab[j] - 1)
            cats[:, j] = self._hex[j][r]
            cat_missing[:, j] = rng.random(n) < _cat_missing(j)
            vals = np.where(cat_missing[:, j].astype(bool), MISSING, cats[:, j].astype(np.int64))
            logit += self.weights(np.full(n, N_INT + j), vals)
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < p).astype(np.uint8)
        return labels, ints, cats, int_missing, cat_missing, p

    def describe(self) -> dict:
        return {"seed": self.seed, "zipf_exponent": ZIPF, "vocabulary": self.vocab,
                "weight_sigma": SIGMA, "bias": BIAS, "int_missing": INT_MISSING,
                "cat_missing": [_cat_missing(j) for j in range(N_CAT)],
                "int_fields": "floor(exp(N(0.25 i, 1.5^2))) - 1"}


def _writer(path: str, compress: str):
    if compress == "gzip":
        return gzip.open(path, "wb", compresslevel=1)
    if compress == "zstd":
        import zstandard

        return zstandard.open(path, "wb", cctx=zstandard.ZstdCompressor(level=1))
    return open(path, "wb")


_SUFFIX = {"none": ".tsv", "gzip": ".tsv.gz", "zstd": ".tsv.zst"}


def generate_criteo_like(out: str | os.PathLike, rows: int, files: int = 1, seed: int = 0,
                         compress: str = "none", progress=None) -> dict:
    """Write ``rows`` rows in ``files`` files ``part-00000.tsv[.gz|.zst]`` and ``_truth.json``.

    Parameters
    ----------
    out : str or path-like
        Output directory (created; existing ``part-*`` files of the same names are replaced).
    rows, files : int
        ``rows >= 1``, ``1 <= files <= rows``; file ``k`` gets rows
        ``[k * rows // files, (k + 1) * rows // files)``.
    seed : int
    compress : {"none", "gzip", "zstd"}
    progress : callable(str) or None
        Called with a line per file written.

    The same ``seed``, ``rows`` and ``files`` give the same bytes: file ``k``'s rows come from
    ``numpy.random.default_rng([seed, 1, k])`` in blocks of :data:`BLOCK` rows (memory about
    1 kB per row of a block).

    Returns
    -------
    dict
        What ``_truth.json`` holds, plus ``"path"`` (the directory).

    Raises
    ------
    ValueError
        On a bad ``rows``, ``files`` or ``compress``.
    """
    if rows < 1 or files < 1 or files > rows:
        raise ValueError(f"need rows >= 1 and 1 <= files <= rows, got rows={rows}, files={files}")
    if compress not in _SUFFIX:
        raise ValueError(f"compress must be one of {sorted(_SUFFIX)}, got {compress!r}")
    os.makedirs(out, exist_ok=True)
    model = CriteoLike(seed)
    info = {"format": "criteo", **model.describe(), "rows": rows, "compress": compress, "files": []}
    t0 = time.perf_counter()
    for k in range(files):
        lo, hi = k * rows // files, (k + 1) * rows // files
        name = f"part-{k:05d}{_SUFFIX[compress]}"
        path = os.path.join(out, name)
        tmp = os.path.join(out, f".{name}.tmp")
        ys, ps = [], []
        rng = np.random.default_rng([seed, 1, k])
        with _writer(tmp, compress) as f:
            for a in range(lo, hi, BLOCK):
                lab, ints, cats, im, cm, p = model.sample(min(BLOCK, hi - a), rng)
                f.write(format_criteo(lab, ints, cats, im, cm))
                ys.append(lab)
                ps.append(p)
        os.replace(tmp, path)
        y, p = np.concatenate(ys), np.concatenate(ps)
        entry = {"name": name, "rows": hi - lo, "bytes": os.path.getsize(path),
                 "click_rate": float(y.mean()),
                 "truth_auc": float(roc_auc_score(y, p)) if 0 < y.sum() < y.size else None,
                 "truth_log_loss": float(log_loss(y, p, labels=[0, 1]))}
        info["files"].append(entry)
        if progress:
            progress(f"{path}: {entry['rows']:,} rows, {entry['bytes'] / 1e6:.1f} MB, "
                     f"truth AUC {entry['truth_auc']}, {time.perf_counter() - t0:.1f} s")
    with open(os.path.join(out, "_truth.json"), "w") as f:
        json.dump(info, f, indent=1)
    return {**info, "path": os.fspath(out)}


#: name -> generator(out, rows, files, seed, compress, progress) for ``hpcps data generate``.
GENERATORS = {"criteo-like": generate_criteo_like}
