"""The scikit-learn baseline is fitted once per set of features (issue 22.6): a re-run or a
copied job reads it back; changed data or a changed feature setting fits again. Real Adult
data, real scikit-learn fits."""

import shutil

from hpcps.config import load_job
from hpcps.runtime.baseline import cached_baseline, sklearn_baseline
from tests.helpers import DATA, write_job

JOB = """
name = "{name}"
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "{data}"
max_rows = 3000
hash_bits = {bits}
[model]
l2 = 0.001
[evaluate]
sklearn_baseline = true
[output]
dir = "{out}"
"""


def job(tmp_path, name, data=DATA, bits=12, servers=1):
    return load_job(write_job(tmp_path / f"{name}.toml", JOB.format(
        name=name, data=data, bits=bits, servers=servers, out=tmp_path / name)))


def test_the_baseline_is_fitted_once_per_set_of_features(tmp_path):
    env = {"HPCPS_CACHE_DIR": str(tmp_path / "cache")}
    fits = []

    def fit(cfg):
        fits.append(cfg.name)
        return sklearn_baseline(cfg)

    first = cached_baseline(job(tmp_path, "a"), fit, env)
    assert fits == ["a"] and first["cached"] is False and 0.5 < first["test_auc"] < 1
    # a re-run, and a copy that changes only the layout: read back, not fitted
    again = cached_baseline(job(tmp_path, "a"), fit, env)
    copy = cached_baseline(job(tmp_path, "b", servers=2), fit, env)
    assert fits == ["a"] and again["cached"] and copy["cached"]
    assert again["test_auc"] == copy["test_auc"] == first["test_auc"]
    assert again["fitted_seconds"] == first["seconds"]
    # other features (hash_bits), or other bytes in the data file: fitted again
    cached_baseline(job(tmp_path, "c", bits=13), fit, env)
    other = tmp_path / "adult_copy.csv.gz"
    shutil.copyfile(DATA, other)
    cached_baseline(job(tmp_path, "d", data=other), fit, env)            # same bytes: cached
    with open(other, "ab") as f:
        f.write(b"\0")                        # appended bytes change the fingerprint
    try:
        cached_baseline(job(tmp_path, "e", data=other), fit, env)
    except Exception:                         # noqa: BLE001 - a damaged gzip may not load
        pass
    assert fits == ["a", "c", "e"]


def test_compact_columns_keeps_the_training_columns_of_raw_ids():
    """A matrix over raw 63-bit ids cannot be fit as is; the baseline fits the columns the
    training rows use (a test-only column has a zero coefficient under L2 anyway)."""
    import numpy as np
    import scipy.sparse as sp

    from hpcps.runtime.baseline import compact_columns

    big = 2**63 - 1
    X = sp.csr_matrix((np.ones(4), [5, 2**62, 7, 2**62], [0, 2, 4]), shape=(2, big))
    Xt = sp.csr_matrix((np.ones(3), [2**62, 9, 5], [0, 2, 3]), shape=(2, big))
    a, b = compact_columns(X, Xt)
    assert a.shape == (2, 3) and b.shape == (2, 3)
    assert a.toarray().tolist() == [[1, 0, 1], [0, 1, 1]]       # columns 5, 7, 2**62
    assert b.toarray().tolist() == [[0, 0, 1], [1, 0, 0]]       # 9 dropped
    small = sp.csr_matrix(np.eye(3))
    assert compact_columns(small, small)[0] is small
