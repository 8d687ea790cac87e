"""The Adult job's featurized splits saved once as ``.npz`` for the benchmark processes.

Featurizing Adult with hashed crosses takes seconds per process; the benchmarks that start
many processes (``bench_torch_ps.py``, ``bench_scaling.py``) featurize once with hpcps's own
featurizer (:func:`hpcps.data.source.load_split`) and read the arrays back. No MPI.
"""

from __future__ import annotations

import numpy as np

import benchlib

benchlib.ensure_importable()

DEFAULT_JOB = benchlib.ROOT / "jobs" / "adult_lr.toml"


def save_npz(job, path, max_rows: int = 0) -> None:
    """Featurize ``job``'s train and test splits and save them to ``path`` (only the first
    ``max_rows`` rows of the file when > 0).

    Keys: ``num_features``; per split ``{split}_indptr``, ``_indices``, ``_data`` (CSR) and
    ``_y`` (labels in {0, 1}).
    """
    from hpcps.config import load_job
    from hpcps.data.source import load_split

    import dataclasses

    cfg = load_job(job)
    if max_rows:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_rows=max_rows))
    arrays = {"num_features": np.array(cfg.data.num_features)}
    for split in ("train", "test"):
        X, y = load_split(cfg.data, split, 0, 1)
        X = X.tocsr()
        arrays.update({f"{split}_indptr": X.indptr, f"{split}_indices": X.indices,
                       f"{split}_data": X.data, f"{split}_y": y})
    np.savez(path, **arrays)


def load_part(path, split: str, part: int, n_parts: int):
    """Rows of block ``part`` of ``n_parts`` (``numpy.array_split`` blocks) of a split saved by
    :func:`save_npz`: ``(indptr, indices, data, y, num_features)`` as numpy arrays."""
    z = np.load(path)
    indptr, indices, data, y = (z[f"{split}_{k}"] for k in ("indptr", "indices", "data", "y"))
    bounds = np.array_split(np.arange(y.size), n_parts)[part]
    lo, hi = (int(bounds[0]), int(bounds[-1]) + 1) if bounds.size else (0, 0)
    a, b = int(indptr[lo]), int(indptr[hi])
    return (indptr[lo:hi + 1] - a, indices[a:b], data[a:b], y[lo:hi], int(z["num_features"]))
