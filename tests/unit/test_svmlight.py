"""Tests of hpcps.data.svmlight: byte-range sharding, index base, errors."""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_svmlight_file

from hpcps.data import DataError
from hpcps.data.svmlight import byte_ranges, read_svmlight_part, write_svmlight

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
FIXTURES = [(DATA / "small_1based.svm", 1, 8), (DATA / "small_0based.svm", 0, 5)]


def read_all_parts(path, n_parts, n_features, index_base, dtype=np.float64):
    parts = [
        read_svmlight_part(path, k, n_parts, n_features=n_features, index_base=index_base, dtype=dtype)
        for k in range(n_parts)
    ]
    for X, y in parts:
        assert sp.issparse(X) and X.format == "csr"
        assert X.shape[1] == n_features and X.shape[0] == y.shape[0]
        assert X.has_sorted_indices
        assert y.dtype == np.float64
    X = sp.vstack([X for X, _ in parts], format="csr")
    y = np.concatenate([y for _, y in parts])
    return X, y, [X.shape[0] for X, _ in parts]


def assert_same_rows(X, y, X_ref, y_ref):
    assert X.shape == X_ref.shape
    np.testing.assert_array_equal(X.indptr, X_ref.indptr)
    np.testing.assert_array_equal(X.indices, X_ref.indices)
    np.testing.assert_array_equal(X.data, X_ref.data)
    np.testing.assert_array_equal(y, y_ref)


# --------------------------------------------------------------------------- byte_ranges


@pytest.mark.parametrize("size", [0, 1, 7, 100])
@pytest.mark.parametrize("n_parts", [1, 2, 3, 8, 150])
def test_byte_ranges_cover_file(tmp_path, size, n_parts):
    path = tmp_path / "f.svm"
    path.write_bytes(b"x" * size)
    ranges = byte_ranges(path, n_parts)
    assert len(ranges) == n_parts
    pos = 0
    for offset, length in ranges:
        assert offset == pos and length >= 0
        pos += length
    assert pos == size


def test_byte_ranges_bad_n_parts(tmp_path):
    path = tmp_path / "f.svm"
    path.write_bytes(b"1 1:1\n")
    with pytest.raises(ValueError):
        byte_ranges(path, 0)


# --------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("path,index_base,n_features", FIXTURES)
def test_fixture_whole_file_matches_sklearn(path, index_base, n_features):
    X_ref, y_ref = load_svmlight_file(str(path), n_features=n_features, zero_based=(index_base == 0))
    X, y, _ = read_all_parts(path, 1, n_features, index_base)
    assert_same_rows(X, y, sp.csr_matrix(X_ref), (y_ref > 0).astype(np.float64))


def test_fixture_contents_one_based():
    X, y = read_svmlight_part(DATA / "small_1based.svm", 0, 1, n_features=8, index_base=1)
    assert X.shape == (7, 8)
    np.testing.assert_array_equal(y, [1, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(X[0].toarray(), [[0.5, 0, 2, 0, 0, 0, -1.25, 0]])
    assert X[2].nnz == 0  # label-only row
    np.testing.assert_array_equal(X[3].toarray(), [[1, 0, 0, 1, 0, 0, 0, 0.03]])


def test_fixture_contents_zero_based():
    X, y = read_svmlight_part(DATA / "small_0based.svm", 0, 1, n_features=5, index_base=0)
    assert X.shape == (5, 5)
    np.testing.assert_array_equal(y, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(
        X.toarray(),
        [[1, 0, 0, 0.25, 0], [0, 2, 0, 0, 0], [0, 0, 0, 0, 0], [-1, 0, 1, 0, 9], [0, 0, 0, 0, 1]],
    )


@pytest.mark.parametrize("path,index_base,n_features", FIXTURES)
def test_fixture_every_n_parts(path, index_base, n_features):
    """Every n_parts from 1 to past the file size: each row exactly once, in order."""
    X_ref, y_ref, _ = read_all_parts(path, 1, n_features, index_base)
    size = os.path.getsize(path)
    for n_parts in range(1, size + 4):
        X, y, counts = read_all_parts(path, n_parts, n_features, index_base)
        assert_same_rows(X, y, X_ref, y_ref)
        if n_parts > X_ref.shape[0]:
            assert 0 in counts


def test_float32_dtype():
    X, y = read_svmlight_part(DATA / "small_1based.svm", 0, 2, n_features=8, index_base=1, dtype=np.float32)
    assert X.dtype == np.float32 and y.dtype == np.float64


# --------------------------------------------------------------------------- hypothesis

value_st = st.sampled_from(["1", "0.5", "-2", "3e-2", "1.25", "7", "-0.125", "100"])
label_st = st.sampled_from([("+1", 1.0), ("-1", 0.0), ("1", 1.0), ("0", 0.0), ("1.0", 1.0), ("-1.0", 0.0)])


@st.composite
def svmlight_lines(draw, index_base, n_features):
    """(line bytes, row or None); row = (label01, {col: value}) with col zero-based."""
    kind = draw(st.sampled_from(["row", "row", "row", "comment", "blank"]))
    if kind == "comment":
        return b"#" + draw(st.sampled_from([b"", b" note", b" 1 2:3 #"])), None
    if kind == "blank":
        return draw(st.sampled_from([b"", b" ", b"\t", b"  \t "])), None
    text, label = draw(label_st)
    cols = sorted(draw(st.sets(st.integers(0, n_features - 1), max_size=5)))
    vals = [draw(value_st) for _ in cols]
    parts = [text]
    if draw(st.booleans()):
        parts.append(f"qid:{draw(st.integers(0, 9))}")
    parts += [f"{c + index_base}:{v}" for c, v in zip(cols, vals)]
    sep = draw(st.sampled_from([" ", "\t", "  "]))
    line = sep.join(parts)
    if draw(st.booleans()):
        line += draw(st.sampled_from([" ", " # tail", "#x"]))
    return line.encode(), (label, {c: float(v) for c, v in zip(cols, vals)})


@st.composite
def svmlight_files(draw):
    index_base = draw(st.sampled_from([0, 1]))
    n_features = draw(st.integers(1, 12))
    lines = draw(st.lists(svmlight_lines(index_base, n_features), max_size=25))
    ends = [draw(st.sampled_from([b"\n", b"\r\n"])) for _ in lines]
    if lines and draw(st.booleans()):
        ends[-1] = b""  # no final newline
    content = b"".join(line + end for (line, _), end in zip(lines, ends))
    rows = [row for _, row in lines if row is not None]
    return content, rows, index_base, n_features


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=svmlight_files(), frac=st.floats(0.0, 1.0))
def test_parts_concatenate_to_whole_file(data, frac):
    content, rows, index_base, n_features = data
    n_parts = 1 + int(frac * (len(content) + 2))  # 1 .. size + 3
    dense = np.zeros((len(rows), n_features))
    for i, (_, feats) in enumerate(rows):
        for c, v in feats.items():
            dense[i, c] = v
    y_ref = np.array([label for label, _ in rows], dtype=np.float64)
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "h.svm"
        path.write_bytes(content)
        X, y, counts = read_all_parts(path, n_parts, n_features, index_base)
    assert len(counts) == n_parts
    np.testing.assert_array_equal(X.toarray(), dense)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(np.diff(X.indptr), [len(f) for _, f in rows])


# --------------------------------------------------------------------------- edge cases


def test_empty_file(tmp_path):
    path = tmp_path / "empty.svm"
    path.write_bytes(b"")
    for n_parts in (1, 3):
        X, y, counts = read_all_parts(path, n_parts, 4, 1)
        assert X.shape == (0, 4) and y.shape == (0,) and counts == [0] * n_parts


def test_comments_only_file(tmp_path):
    path = tmp_path / "c.svm"
    path.write_bytes(b"# nothing\n\n# here\n")
    for n_parts in range(1, 25):
        X, y, _ = read_all_parts(path, n_parts, 4, 0)
        assert X.shape == (0, 4)


def test_fewer_rows_than_parts(tmp_path):
    path = tmp_path / "two.svm"
    path.write_bytes(b"1 1:1\n-1 2:1\n")
    X, y, counts = read_all_parts(path, 10, 3, 1)
    assert sum(counts) == 2 and counts.count(0) == 8
    np.testing.assert_array_equal(X.toarray(), [[1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(y, [1, 0])


def test_single_label_only_row_without_newline(tmp_path):
    path = tmp_path / "one.svm"
    path.write_bytes(b"1")
    X, y, counts = read_all_parts(path, 3, 2, 1)
    assert counts == [0, 0, 1] and X.nnz == 0  # the line starts in the last range
    np.testing.assert_array_equal(y, [1.0])


def test_index_base_shift(tmp_path):
    path = tmp_path / "b.svm"
    path.write_bytes(b"1 1:5 3:6\n")
    X1, _ = read_svmlight_part(path, 0, 1, n_features=4, index_base=1)
    X0, _ = read_svmlight_part(path, 0, 1, n_features=4, index_base=0)
    np.testing.assert_array_equal(X1.toarray(), [[5, 0, 6, 0]])
    np.testing.assert_array_equal(X0.toarray(), [[0, 5, 0, 6]])


@pytest.mark.parametrize("bad", [2, -1, True, "auto", None, 0.0])
def test_index_base_must_be_explicit(bad):
    with pytest.raises(ValueError, match="index_base"):
        read_svmlight_part(DATA / "small_0based.svm", 0, 1, n_features=5, index_base=bad)
    with pytest.raises(ValueError, match="index_base"):
        write_svmlight(np.eye(2), np.ones(2), "unused.svm", bad)


@pytest.mark.parametrize("part,n_parts", [(-1, 2), (2, 2), (0, 0)])
def test_bad_part(part, n_parts):
    with pytest.raises(ValueError):
        read_svmlight_part(DATA / "small_0based.svm", part, n_parts, n_features=5, index_base=0)


def test_feature_index_out_of_range_names_file_line_and_index(tmp_path):
    path = tmp_path / "big.svm"
    path.write_bytes(b"1 1:1\n# c\n1 2:1 9:1 12:1\n1 3:1\n")
    with pytest.raises(DataError, match=r"big\.svm:3: feature index 9 .*n_features=8"):
        read_svmlight_part(path, 0, 1, n_features=8, index_base=1)
    # the same index is fine zero-based with one more column... and reported zero-based
    with pytest.raises(DataError, match=r"big\.svm:3: feature index 12 "):
        read_svmlight_part(path, 0, 1, n_features=12, index_base=0)
    # only the part that holds the line fails
    X, _ = read_svmlight_part(path, 0, 4, n_features=8, index_base=1)
    assert X.shape == (1, 8)
    with pytest.raises(DataError, match=str(path.name)):
        read_all_parts(path, 4, 8, 1)


def test_zero_index_in_one_based_file(tmp_path):
    path = tmp_path / "z.svm"
    path.write_bytes(b"1 1:1\n1 0:1\n")
    with pytest.raises(DataError, match=r"z\.svm:2"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


@pytest.mark.parametrize("content,line", [(b"1 1:1\n1 2:x\n", 2), (b"1 2:1 1:1\n", 1), (b"abc 1:1\n", 1)])
def test_malformed_line(tmp_path, content, line):
    path = tmp_path / "m.svm"
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"m\.svm:{line}:"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


@pytest.mark.parametrize("label", [b"2", b"0.5", b"-2", b"nan"])
def test_bad_label_names_file(tmp_path, label):
    path = tmp_path / "lab.svm"
    path.write_bytes(b"1 1:1\n" + label + b" 2:1\n")
    with pytest.raises(DataError, match=r"lab\.svm:2: label"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


def test_labels_mapped(tmp_path):
    path = tmp_path / "l.svm"
    path.write_bytes(b"+1\n-1\n0\n1\n1.0\n-1.0\n")
    _, y = read_svmlight_part(path, 0, 1, n_features=1, index_base=1)
    np.testing.assert_array_equal(y, [1, 0, 0, 1, 1, 0])


def test_compressed_rejected(tmp_path):
    path = tmp_path / "f.svm.gz"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="compressed"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


@pytest.mark.parametrize("index_base", [0, 1])
def test_write_roundtrip(tmp_path, index_base):
    rng = np.random.default_rng(0)
    X = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    X.data = np.round(X.data, 3)
    y = (rng.random(40) > 0.5).astype(np.float64)
    path = tmp_path / "rt.svm"
    write_svmlight(X, y, path, index_base)
    for n_parts in (1, 3, 7):
        X2, y2, _ = read_all_parts(path, n_parts, 30, index_base)
        np.testing.assert_array_equal(X2.toarray(), X.toarray())
        np.testing.assert_array_equal(y2, y)
    # reading with the wrong base shifts (or fails), never silently "auto"-guesses
    try:
        X3, _ = read_svmlight_part(path, 0, 1, n_features=31, index_base=1 - index_base)
    except DataError:
        return
    assert not np.array_equal(X3.toarray()[:, :30], X.toarray())
