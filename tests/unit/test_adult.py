"""Tests of hpcps.data.adult: CSV reader, split, featurizer, partitions."""

from __future__ import annotations

import gzip
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.feature_extraction import FeatureHasher

from hpcps.data import DataError
from hpcps.data.adult import (
    CATEGORICAL_COLUMNS,
    FEATURE_COLUMNS,
    NUMERIC_COLUMNS,
    AdultFeaturizer,
    load_adult_columns,
    load_adult_full,
    load_adult_partition,
    split_indices,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADULT = ROOT / "data" / "adult.csv.gz"
HEADER = (
    "age,workclass,fnlwgt,education,educational-num,marital-status,occupation,relationship,"
    "race,gender,capital-gain,capital-loss,hours-per-week,native-country,income"
)


@pytest.fixture(scope="module")
def adult():
    return load_adult_columns(ADULT)


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory):
    """The first 600 data rows of the shipped file, as a plain CSV (fast to parse)."""
    with gzip.open(ADULT, "rt", newline="") as f:
        lines = [next(f) for _ in range(601)]
    path = tmp_path_factory.mktemp("adult") / "adult600.csv"
    path.write_text("".join(lines), newline="")
    return path


def write_csv(path, rows, header=HEADER):
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return path


ROW = "25, Private,226802,11th,7,Never-married,Machine-op-inspct,Own-child,Black,Male,0,0,40,United-States,{}"


# --------------------------------------------------------------------------- reader


def test_load_shipped_file(adult):
    assert len(adult["y"]) == 48842
    assert set(adult) == set(FEATURE_COLUMNS) | {"y"}
    for c in NUMERIC_COLUMNS:
        assert adult[c].dtype == np.float64 and adult[c].shape == (48842,)
    for c in CATEGORICAL_COLUMNS:
        assert adult[c].dtype.kind == "U" and adult[c].shape == (48842,)
    assert adult["y"].dtype == np.float64
    assert set(np.unique(adult["y"])) == {0.0, 1.0}
    assert abs(adult["y"].mean() - 0.239) < 0.001
    assert "?" in set(adult["native-country"])
    assert adult["age"][0] == 25 and adult["workclass"][0] == "Private"


def test_plain_csv_strips_spaces_and_label_variants(tmp_path):
    path = write_csv(tmp_path / "a.csv", [ROW.format(">50K."), ROW.format(" <=50K."), "", ROW.format("<=50K")])
    cols = load_adult_columns(path)
    np.testing.assert_array_equal(cols["y"], [1, 0, 0])
    assert cols["workclass"][0] == "Private"
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    cols_gz = load_adult_columns(gz)
    for k in cols:
        np.testing.assert_array_equal(cols[k], cols_gz[k])


def test_column_order_free(tmp_path):
    names = HEADER.split(",")
    values = ROW.format(">50K").split(",")
    perm = list(reversed(range(len(names))))
    path = write_csv(
        tmp_path / "r.csv", [",".join(values[i] for i in perm)], header=",".join(names[i] for i in perm)
    )
    cols = load_adult_columns(path)
    assert cols["age"][0] == 25 and cols["y"][0] == 1


def test_missing_column_names_file_and_column(tmp_path):
    header = HEADER.replace("hours-per-week,", "")
    row = ROW.format(">50K").replace(",40,", ",")
    path = write_csv(tmp_path / "nohours.csv", [row], header=header)
    with pytest.raises(DataError, match=r"nohours\.csv: missing column 'hours-per-week'"):
        load_adult_columns(path)


def test_bad_numeric_names_file_line_column(tmp_path):
    rows = [ROW.format(">50K"), ROW.format(">50K").replace(",226802,", ",12x,")]
    path = write_csv(tmp_path / "badnum.csv", rows)
    with pytest.raises(DataError, match=r"badnum\.csv:3: column 'fnlwgt': bad numeric value '12x'"):
        load_adult_columns(path)
    rows = [ROW.format(">50K").replace("25,", "?,", 1)]
    with pytest.raises(DataError, match=r"badnum2\.csv:2: column 'age'"):
        load_adult_columns(write_csv(tmp_path / "badnum2.csv", rows))


def test_bad_label_and_field_count(tmp_path):
    with pytest.raises(DataError, match=r"lab\.csv:2: column 'income'"):
        load_adult_columns(write_csv(tmp_path / "lab.csv", [ROW.format("maybe")]))
    with pytest.raises(DataError, match=r"short\.csv:3: expected 15 fields"):
        load_adult_columns(write_csv(tmp_path / "short.csv", [ROW.format(">50K"), "1,2,3"]))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.csv"):
        load_adult_columns(empty)


# --------------------------------------------------------------------------- split


def test_split_indices():
    train, test = split_indices(1000, 0.2, 7)
    assert train.dtype == np.int64 and test.dtype == np.int64
    assert len(test) == 200 and len(train) == 800
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1000))
    train2, test2 = split_indices(1000, 0.2, 7)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(test, test2)
    assert not np.array_equal(split_indices(1000, 0.2, 8)[1], test)
    np.testing.assert_array_equal(np.sort(np.random.default_rng(7).permutation(1000)[:200]), test)


@pytest.mark.parametrize("frac", [-0.1, 1.0, 1.5])
def test_split_bad_fraction(frac):
    with pytest.raises(ValueError):
        split_indices(10, frac, 0)


# --------------------------------------------------------------------------- featurizer


@pytest.fixture(scope="module")
def fitted(adult):
    train, test = split_indices(len(adult["y"]), 0.2, 0)
    return AdultFeaturizer(hash_bits=20).fit(adult, train), train, test


def test_featurizer_shape_and_counts(adult, fitted):
    feat, train, test = fitted
    rows = test[:3000]
    X = feat.transform(adult, rows)
    assert isinstance(X, sp.csr_matrix) and X.dtype == np.float64
    assert X.shape == (3000, 2**20) and feat.n_features == 2**20 and feat.n_tokens == 105
    assert X.has_sorted_indices
    for r in range(0, 3000, 97):  # unique indices within a row
        idx = X.indices[X.indptr[r] : X.indptr[r + 1]]
        assert np.all(np.diff(idx) > 0)
    assert np.diff(X.indptr).max() <= 105
    np.testing.assert_array_equal(np.asarray(X.sum(axis=1)).ravel(), 105.0)


def test_featurizer_without_crosses(adult, fitted):
    _, train, test = fitted
    feat = AdultFeaturizer(hash_bits=12, crosses=False).fit(adult, train)
    X = feat.transform(adult, test[:500])
    assert X.shape == (500, 4096) and feat.n_tokens == 14
    assert np.diff(X.indptr).max() <= 14
    np.testing.assert_array_equal(np.asarray(X.sum(axis=1)).ravel(), 14.0)


def test_featurizer_deterministic(adult, fitted):
    feat, train, test = fitted
    rows = train[::50]
    X1 = feat.transform(adult, rows)
    X2 = feat.transform(adult, rows)
    X3 = AdultFeaturizer(hash_bits=20).fit(adult, train).transform(adult, rows)
    for X in (X2, X3):
        assert (X1 != X).nnz == 0
        np.testing.assert_array_equal(X1.indices, X.indices)


def test_transform_equals_feature_hasher_on_tokens(adult, fitted):
    feat, _, test = fitted
    rows = test[:200]
    toks = feat.tokens(adult, rows)
    assert all(len(t) == 105 for t in toks)
    assert toks[0][0].startswith("age#") and toks[0][1].startswith("workclass=")
    assert toks[0][14] == toks[0][0] + "^" + toks[0][1]
    ref = FeatureHasher(n_features=2**20, input_type="string", alternate_sign=False).transform(toks)
    assert (feat.transform(adult, rows) != ref).nnz == 0


def test_unhashed_tokens_keep_their_own_63_bit_ids(adult, fitted):
    """hash_bits = 0 (a dynamic table): one id per distinct token and cross, XXH64 of the
    token modulo 2**63 - 1, no buckets; the same tokens as the hashed featurizer."""
    import xxhash

    feat, train, test = fitted
    raw = AdultFeaturizer(hash_bits=0).fit(adult, train)
    assert raw.n_features == 2**63 - 1
    rows = test[:300]
    X = raw.transform(adult, rows)
    toks = raw.tokens(adult, rows)
    assert X.shape == (300, 2**63 - 1)
    assert np.all(X.data == 1.0) and np.all(np.diff(X.indptr) == 105)      # no collisions
    want = sorted(xxhash.xxh64_intdigest(t.encode()) % (2**63 - 1) for t in toks[7])
    assert X.indices[X.indptr[7]:X.indptr[8]].tolist() == want
    ids = np.unique(X.indices)
    hashed = np.unique(feat.transform(adult, rows).indices)
    assert ids.size > hashed.size and ids.max() > 2**40    # distinct crosses kept apart
    assert ids.size == len({t for r in toks for t in r})


def test_bins(adult, fitted):
    feat, train, _ = fitted
    edges = feat.bin_edges_
    assert set(edges) == set(NUMERIC_COLUMNS)
    assert len(edges["age"]) == 7 and np.all(np.diff(edges["age"]) > 0)
    np.testing.assert_array_equal(edges["capital-gain"], [0.0])  # mostly zero: zero vs positive
    toks = feat.tokens(adult, train[:2000])
    gains = adult["capital-gain"][train[:2000]]
    bins = np.array([t[10] for t in toks])
    assert set(bins[gains == 0]) == {"capital-gain#0"} and set(bins[gains > 0]) == {"capital-gain#1"}


def test_fit_uses_given_rows_only(adult, fitted):
    feat, train, test = fitted
    changed = {k: v.copy() for k, v in adult.items()}
    for c in NUMERIC_COLUMNS:
        changed[c][test] = 1e9
    feat2 = AdultFeaturizer(hash_bits=20).fit(changed, train)
    for c in NUMERIC_COLUMNS:
        np.testing.assert_array_equal(feat.bin_edges_[c], feat2.bin_edges_[c])
    changed["age"][train] = 1e9
    assert not np.array_equal(AdultFeaturizer().fit(changed, train).bin_edges_["age"], feat.bin_edges_["age"])


def test_featurizer_errors(adult):
    with pytest.raises(ValueError):
        AdultFeaturizer(hash_bits=-1)
    with pytest.raises(ValueError):
        AdultFeaturizer(hash_bits=31)
    with pytest.raises(ValueError):
        AdultFeaturizer(numeric_bins=0)
    with pytest.raises(ValueError, match="not fitted"):
        AdultFeaturizer().transform(adult, [0])
    with pytest.raises(ValueError):
        AdultFeaturizer().fit(adult, np.array([], dtype=np.int64))


def test_deterministic_across_processes(small_csv):
    """Hashing does not depend on PYTHONHASHSEED (no Python hash())."""
    code = (
        "import sys, hashlib; from hpcps.data.adult import load_adult_full\n"
        "X, y = load_adult_full(sys.argv[1], 'train', hash_bits=18)\n"
        "print(hashlib.sha256(X.indices.astype('int64').tobytes() + X.indptr.astype('int64').tobytes()"
        " + X.data.tobytes() + y.tobytes()).hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code, str(small_csv)], env=env, check=True,
                             capture_output=True, text=True)
        digests.add(out.stdout.strip())
    X, y = load_adult_full(small_csv, "train", hash_bits=18)
    import hashlib

    here = hashlib.sha256(
        X.indices.astype("int64").tobytes() + X.indptr.astype("int64").tobytes() + X.data.tobytes() + y.tobytes()
    ).hexdigest()
    assert digests == {here}


# --------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("split", ["train", "test"])
def test_partitions_cover_split_once(small_csv, split):
    X_full, y_full = load_adult_full(small_csv, split, hash_bits=16)
    assert X_full.shape == ({"train": 480, "test": 120}[split], 2**16)
    for n_parts in range(1, 8):
        parts = [load_adult_partition(small_csv, split, k, n_parts, hash_bits=16) for k in range(n_parts)]
        sizes = [X.shape[0] for X, _ in parts]
        assert sizes == [len(a) for a in np.array_split(np.arange(X_full.shape[0]), n_parts)]
        X = sp.vstack([X for X, _ in parts], format="csr")
        y = np.concatenate([y for _, y in parts])
        assert (X != X_full).nnz == 0
        np.testing.assert_array_equal(y, y_full)


def test_partition_rows_match_split(small_csv):
    cols = load_adult_columns(small_csv)
    train, test = split_indices(600, 0.2, 0)
    _, y = load_adult_full(small_csv, "test")
    np.testing.assert_array_equal(y, cols["y"][test])
    _, y = load_adult_partition(small_csv, "train", 1, 3)
    np.testing.assert_array_equal(y, cols["y"][np.array_split(train, 3)[1]])


def test_empty_parts(tmp_path):
    path = write_csv(tmp_path / "ten.csv", [ROW.format(">50K")] * 10)
    sizes = []
    for k in range(5):
        X, y = load_adult_partition(path, "test", k, 5, hash_bits=10)
        assert X.shape[1] == 1024 and X.dtype == np.float64 and y.dtype == np.float64
        sizes.append(X.shape[0])
    assert sizes == [1, 1, 0, 0, 0]


def test_max_rows(small_csv):
    X1, y1 = load_adult_partition(ADULT, "train", 1, 2, hash_bits=16, max_rows=600)
    X2, y2 = load_adult_partition(small_csv, "train", 1, 2, hash_bits=16)
    assert (X1 != X2).nnz == 0
    np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize(
    "args,kwargs",
    [
        (("valid", 0, 1), {}),
        (("train", 1, 1), {}),
        (("train", -1, 2), {}),
        (("test", 0, 0), {}),
        (("train", 0, 1), {"max_rows": -1}),
        (("train", 0, 1), {"hash_bits": 40}),
    ],
)
def test_partition_bad_args_before_reading(tmp_path, args, kwargs):
    with pytest.raises(ValueError):
        load_adult_partition(tmp_path / "does-not-exist.csv", *args, **kwargs)


def test_data_layer_never_imports_mpi4py():
    code = (
        "import sys, hpcps.data, hpcps.data.adult, hpcps.data.svmlight, hpcps.data.partition_rows\n"
        "sys.exit(1 if 'mpi4py' in sys.modules else 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_utf8_bom_and_bare_cr_line_endings_read_exactly(tmp_path):
    """A UTF-8 byte-order mark before the header made its first column '\\ufeffage', so
    'missing column age' (issue 21.5 for the CSV reader); old Mac (CR) line endings are line
    ends for the csv module (issue 21.2): both read the same rows as the plain file."""
    rows = [ROW.format(">50K"), ROW.format("<=50K").replace("25,", "31,", 1)]
    ref = load_adult_columns(write_csv(tmp_path / "plain.csv", rows))
    text = HEADER + "\n" + "".join(r + "\n" for r in rows)
    for name, data in [("bom.csv", b"\xef\xbb\xbf" + text.encode()),
                       ("mac.csv", text.replace("\n", "\r").encode()),
                       ("bom_mac.csv.gz", gzip.compress(b"\xef\xbb\xbf" + text.replace("\n", "\r").encode()))]:
        (tmp_path / name).write_bytes(data)
        cols = load_adult_columns(tmp_path / name)
        for k in ref:
            np.testing.assert_array_equal(cols[k], ref[k], err_msg=name)
