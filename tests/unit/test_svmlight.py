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


# ------------------------------------------------------------- int64 indices, duplicates


@pytest.mark.parametrize("index", [2**31 - 1, 2**31, 2**31 + 7, 2**32, 2**32 + 5, 2**62])
@pytest.mark.parametrize("index_base", [0, 1])
def test_indices_beyond_int32_are_exact_int64(tmp_path, index, index_base):
    path = tmp_path / "wide.svm"
    path.write_bytes(f"1 {index_base}:1 {index}:2.5\n-1 {index + 1}:-1\n".encode())
    nf = index + 2
    for n_parts in (1, 2, 5):
        X, y, _ = read_all_parts(path, n_parts, nf, index_base)
        assert X.shape == (2, nf) and X.indices.dtype == np.int64
        np.testing.assert_array_equal(X.indices, [0, index - index_base, index + 1 - index_base])
        np.testing.assert_array_equal(X.data, [1.0, 2.5, -1.0])
        np.testing.assert_array_equal(y, [1, 0])


@pytest.mark.parametrize("index", [2**31, 2**32, 2**32 + 1, 2**63 - 1])
def test_huge_index_beyond_the_table_names_file_line_and_index(tmp_path, index):
    path = tmp_path / "huge.svm"
    path.write_bytes(f"1 1:1\n# c\n0 2:1 {index}:1\n".encode())
    with pytest.raises(DataError, match=rf"huge\.svm:3: feature index {index} \(index_base=1\) "
                                        r"is out of range for n_features=8"):
        read_svmlight_part(path, 0, 1, n_features=8, index_base=1)


@pytest.mark.parametrize("index", [b"9223372036854775808", b"18446744073709551616", b"9" * 40])
def test_index_beyond_int64_is_an_error(tmp_path, index):
    path = tmp_path / "i64.svm"
    path.write_bytes(b"1 1:1\n0 " + index + b":1\n")
    with pytest.raises(DataError, match=r"i64\.svm:2: feature index in .* does not fit in int64"):
        read_svmlight_part(path, 0, 1, n_features=2**63 - 1, index_base=1)


def test_duplicate_index_is_an_error_by_default(tmp_path):
    path = tmp_path / "dup.svm"
    path.write_bytes(b"1 1:1 2:1\r\n# c\n0 2:1 5:0.5 5:0.25 7:1\n")
    with pytest.raises(DataError, match=r"dup\.svm:3: duplicate feature index 5 in a row "
                                        r"\(set \[data\] duplicate_indices = \"sum\""):
        read_svmlight_part(path, 0, 1, n_features=8, index_base=1)
    X, y = read_svmlight_part(path, 0, 1, n_features=8, index_base=1, duplicates="sum")
    np.testing.assert_array_equal(X.toarray(), [[1, 1, 0, 0, 0, 0, 0, 0],
                                                [0, 1, 0, 0, 0.75, 0, 1, 0]])
    assert X.has_canonical_format
    with pytest.raises(ValueError, match="duplicates"):
        read_svmlight_part(path, 0, 1, n_features=8, index_base=1, duplicates="first")


def test_unsorted_indices_are_an_error_even_when_summing(tmp_path):
    path = tmp_path / "uns.svm"
    path.write_bytes(b"1 1:1\n0 3:1 2:1 3:1\n")
    for dup in ("error", "sum"):
        with pytest.raises(DataError, match=r"uns\.svm:2: feature indices must increase along a "
                                            r"row: 2 after 3"):
            read_svmlight_part(path, 0, 1, n_features=8, index_base=1, duplicates=dup)


@pytest.mark.parametrize("content,reason", [
    (b"1 1:1 qid:2\n", "expected INDEX:VALUE|feature index is not"),
    (b"1 qid:x 1:1\n", "qid must be an integer"),
    (b"1 1:1 3\n", "expected INDEX:VALUE, got '3'"),
    (b"1 -3:1\n", "feature index is not a non-negative integer"),
    (b"1 1:1e400\n", "non-finite feature value inf"),
    (b"1 1:1\x002:1\n", "could not convert string to float"),
])
def test_more_malformed_lines(tmp_path, content, reason):
    path = tmp_path / "mm.svm"
    path.write_bytes(b"0 1:1\n" + content)
    with pytest.raises(DataError, match=rf"mm\.svm:2: ({reason})"):
        read_svmlight_part(path, 0, 1, n_features=8, index_base=1)


# ------------------------------------------------------------ hypothesis: more properties


@st.composite
def wide_rows(draw):
    """Random rows over a key space of up to 2**62 features, duplicates allowed."""
    n_features = draw(st.sampled_from([3, 2**31 + 3, 2**32 + 9, 2**62]))
    rows = []
    for _ in range(draw(st.integers(0, 12))):
        label = draw(st.sampled_from([0.0, 1.0]))
        cols = sorted(draw(st.lists(st.integers(0, n_features - 1), max_size=6)))
        vals = [draw(st.integers(-8, 8)) / 4 for _ in cols]
        rows.append((label, cols, vals))
    return n_features, rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=wide_rows(), index_base=st.sampled_from([0, 1]), n_parts=st.integers(1, 9),
       crlf=st.booleans())
def test_random_wide_files_round_trip_with_duplicates_summed(tmp_path_factory, data, index_base,
                                                             n_parts, crlf):
    """Written rows (int64 indices, repeated indices) read back exactly, duplicates summed,
    whatever the byte-range split."""
    n_features, rows = data
    eol = "\r\n" if crlf else "\n"
    text = "".join(
        f"{'+1' if label else '-1'}" + "".join(f" {c + index_base}:{v!r}" for c, v in zip(cols, vals)) + eol
        for label, cols, vals in rows)
    path = tmp_path_factory.mktemp("wide") / "w.svm"
    path.write_text(text, newline="")
    X, y, counts = read_all_parts(path, n_parts, n_features, index_base) if not any(
        len(set(c)) < len(c) for _, c, _ in rows) else (None, None, None)
    if X is not None:                       # no duplicates: the default mode reads it too
        assert sum(counts) == len(rows)
    parts = [read_svmlight_part(path, k, n_parts, n_features=n_features, index_base=index_base,
                                duplicates="sum") for k in range(n_parts)]
    Xs = sp.vstack([p[0] for p in parts], format="csr") if rows else None
    assert sum(p[0].shape[0] for p in parts) == len(rows)
    for i, (label, cols, vals) in enumerate(rows):
        want = {}
        for c, v in zip(cols, vals):
            want[c] = want.get(c, 0.0) + v
        lo, hi = Xs.indptr[i], Xs.indptr[i + 1]
        assert list(Xs.indices[lo:hi]) == sorted(want)
        assert list(Xs.data[lo:hi]) == [want[c] for c in sorted(want)]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]),
                                  [label for label, _, _ in rows])
    if X is not None and rows:
        assert_same_rows(X, y, Xs, np.concatenate([p[1] for p in parts]))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_rows=st.integers(1, 40), n_features=st.integers(1, 30),
       index_base=st.sampled_from([0, 1]), n_parts=st.integers(1, 12))
def test_write_then_read_round_trips(tmp_path_factory, seed, n_rows, n_features, index_base,
                                     n_parts):
    """write_svmlight (scikit-learn's writer) then the byte-range reader: the same matrix,
    value for value what scikit-learn's own reader makes of the file."""
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_features, density=0.3, format="csr", random_state=rng)
    X.data = rng.normal(size=X.nnz) * 10.0 ** rng.integers(-5, 6, size=X.nnz)
    y = (rng.random(n_rows) > 0.5).astype(np.float64)
    path = tmp_path_factory.mktemp("rt") / "rt.svm"
    write_svmlight(X, y, path, index_base)
    X2, y2, counts = read_all_parts(path, n_parts, n_features, index_base)
    assert sum(counts) == n_rows
    # the writer prints %.16g (not always exact); scikit-learn's reader is the oracle of
    # what the text says, and both are within 1e-15 (relative) of the matrix written
    X_ref, y_ref = load_svmlight_file(str(path), n_features=n_features,
                                      zero_based=(index_base == 0))
    assert_same_rows(X2, y2, sp.csr_matrix(X_ref), (y_ref > 0).astype(np.float64))
    np.testing.assert_allclose(X2.toarray(), X.toarray(), rtol=1e-15, atol=0)
    np.testing.assert_array_equal(y2, y)


# ------------------------------------------------ line endings and byte-order marks (issue 21)

def test_bare_cr_line_endings_are_refused_at_line_1_naming_the_line_ending(tmp_path):
    """Old Mac files end lines in CR alone. Read as one line, a '#' comment on the first
    line swallowed the other rows: 3 rows trained as 1, silently (issue 21.2). Refused at
    line 1 for every split of the file: part 0 holds the one 'line'."""
    path = tmp_path / "mac.svm"
    path.write_bytes(b"1 1:1 # first row\r0 2:1\r1 3:1\r")
    for n_parts in (1, 2, 5):
        with pytest.raises(DataError, match=r"mac\.svm:1: .*carriage return \(CR\).*LF or CRLF"):
            read_all_parts(path, n_parts, 4, 1)
    # without a comment too (it was an "expected INDEX:VALUE" error on the next row's label)
    path.write_bytes(b"1 1:1\r0 2:1\r1 3:1\r")
    with pytest.raises(DataError, match=r"mac\.svm:1: .*carriage return \(CR\)"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


def test_a_bare_cr_inside_an_lf_file_is_refused_at_its_line(tmp_path):
    path = tmp_path / "mixed.svm"
    path.write_bytes(b"1 1:1\n0 2:1\r1 3:1\n1 4:1\n")
    with pytest.raises(DataError, match=r"mixed\.svm:2: .*carriage return"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


def test_crlf_and_a_final_cr_are_line_ends(tmp_path):
    """CRLF (and CR CR LF, a twice-converted file) end lines; a CR at the end of the file
    ends the last line."""
    path = tmp_path / "win.svm"
    path.write_bytes(b"1 1:1 # c\r\n0 2:1\r\r\n1 3:1\r")
    X, y, _ = read_all_parts(path, 1, 4, 1)
    np.testing.assert_array_equal(X.toarray(), [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
    np.testing.assert_array_equal(y, [1, 0, 1])


def test_utf8_bom_is_skipped_and_the_rows_read_exactly(tmp_path):
    """A UTF-8 byte-order mark before the first label was 'could not convert string to
    float: '\\ufeff1'' (issue 21.5): it is skipped, every split reads the same rows."""
    plain = b"1 1:1 3:0.5\n-1 2:1\n1 4:2\n"
    ref = tmp_path / "plain.svm"
    ref.write_bytes(plain)
    path = tmp_path / "bom.svm"
    path.write_bytes(b"\xef\xbb\xbf" + plain)
    X_ref, y_ref, _ = read_all_parts(ref, 1, 4, 1)
    for n_parts in (1, 2, 3, 40):
        X, y, _ = read_all_parts(path, n_parts, 4, 1)
        assert_same_rows(X, y, X_ref, y_ref)
    # line numbers are not shifted by the mark
    path.write_bytes(b"\xef\xbb\xbf" + b"1 1:1\n1 2:x\n")
    with pytest.raises(DataError, match=r"bom\.svm:2: could not convert"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


@pytest.mark.parametrize("bom,name", [(b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")])
def test_utf16_text_is_refused_naming_the_encoding(tmp_path, bom, name):
    path = tmp_path / "u16.svm"
    path.write_bytes(bom + "1 1:1\n".encode("utf-16-le" if bom == b"\xff\xfe" else "utf-16-be"))
    with pytest.raises(DataError, match=rf"u16\.svm:1: .*{name}"):
        read_svmlight_part(path, 0, 1, n_features=4, index_base=1)


# ------------------------------------------- values bit-identical to scikit-learn's parser

def _tricky_value(rng):
    """A finite value in one of the decimal forms svmlight files hold."""
    k = rng.integers(16)
    x = float(rng.standard_normal() * 10.0 ** rng.integers(-8, 9))
    if k == 0:
        return repr(x)                                   # shortest round trip, 17 digits
    if k == 1:
        return f"{x:.17g}"
    if k == 2:
        return f"{x:.{rng.integers(0, 12)}e}".replace("e", "eE"[rng.integers(2)])
    if k == 3:
        return f"{x:.{rng.integers(0, 25)}f}"
    if k == 4:
        return ("+" if x >= 0 else "") + f"{x:.6g}"      # '+' sign
    if k == 5:
        return f"{abs(x) % 1:.{rng.integers(1, 20)}f}"[1:]   # leading '.', no integer part
    if k == 6:
        return "-." + "".join(map(str, rng.integers(0, 10, rng.integers(1, 24))))
    if k == 7:
        return str(int(rng.integers(-(2**62), 2**62)))   # beyond 2**53: rounded
    if k == 8:
        return "0." + "0" * int(rng.integers(15, 40)) + str(int(rng.integers(1, 10**6)))
    if k == 9:
        return f"{rng.integers(0, 10**6)}e{rng.integers(-320, 300)}"   # subnormal to huge
    if k == 10:
        return "".join(map(str, rng.integers(0, 10, rng.integers(17, 30)))) + "." + \
            "".join(map(str, rng.integers(0, 10, rng.integers(0, 8))))   # long mantissa
    if k == 11:
        return str(rng.choice(["0", "-0", "1", "1.", "+.5", "-0.0", "00012", "9007199254740993",
                               "9007199254740992", "4.9e-324", "1.7976931348623157e308"]))
    return str(rng.choice(["1", "-1", "0.5", "2.25"]))


def test_values_bit_identical_to_sklearn(tmp_path):
    """Labels and values of a file of tricky decimal forms (17 significant digits,
    exponents, '+', a leading '.', long mantissas, subnormals, -0) with qid fields,
    comments, tabs and CRLF line ends: bitwise what scikit-learn's parser reads."""
    rng = np.random.default_rng(19)
    lines = []
    for i in range(3000):
        label = str(rng.choice(["1", "-1", "+1", "0", "1.0", "-1.000"]))
        toks = [label]
        if i % 7 == 0:
            toks.append(f"qid:{rng.integers(0, 100)}")
        cols = np.sort(rng.choice(500, size=rng.integers(0, 12), replace=False)) + 1
        toks += [f"{c}:{_tricky_value(rng)}" for c in cols]
        sep = " " if i % 5 else "\t"
        line = sep.join(toks)
        if i % 11 == 0:
            line += "  # a comment 3:4"
        lines.append(line + ("\r\n" if i % 13 == 0 else "\n"))
    lines.insert(10, "# a comment line\n")
    path = tmp_path / "tricky.svm"
    path.write_text("".join(lines))
    X_ref, y_ref = load_svmlight_file(str(path), n_features=501, zero_based=False)
    for n_parts in (1, 3):
        X, y, _ = read_all_parts(path, n_parts, 501, 1)
        np.testing.assert_array_equal(X.indptr, X_ref.indptr)
        np.testing.assert_array_equal(X.indices, X_ref.indices)
        np.testing.assert_array_equal(X.data.view(np.uint64), X_ref.data.view(np.uint64))
        np.testing.assert_array_equal(y, (y_ref > 0).astype(np.float64))


def test_kernel_int32_indices_equal_int64_ones():
    from hpcps.kernels.svmlight import parse_svmlight

    buf = b"1 1:0.5 7:2 # c\n-1 qid:3 2:1 2:4\n\n0\n1 3:1e-3 2147483646:1\r\n"
    a = parse_svmlight(buf, 0, 2**31 - 1, sum_duplicates=True)
    b = parse_svmlight(buf, 0, 2**31 - 1, sum_duplicates=True, index_dtype=np.int32)
    assert a[1].dtype == a[2].dtype == np.int64 and b[1].dtype == b[2].dtype == np.int32
    for x, z in zip(a, b):
        np.testing.assert_array_equal(x, z)
    with pytest.raises(ValueError, match="int32 holds no index of n_features=2147483648"):
        parse_svmlight(buf, 0, 2**31, index_dtype=np.int32)
    with pytest.raises(ValueError, match="index_dtype must be int64 or int32"):
        parse_svmlight(buf, 0, 10, index_dtype=np.int16)


def test_part_keeps_the_parsed_int32_arrays(tmp_path):
    """The kernel writes int32 indices for a table scipy indexes with int32: the matrix
    holds the parsed arrays (no int64 -> int32 cast of every index)."""
    path = tmp_path / "f.svm"
    path.write_bytes(b"1 1:1 3:2\n0 2:1\n")
    X, _ = read_svmlight_part(path, 0, 1, n_features=2**31 - 1, index_base=1)
    assert X.indices.dtype == np.int32 and X.indptr.dtype == np.int32
    X, _ = read_svmlight_part(path, 0, 1, n_features=2**31, index_base=1)
    assert X.indices.dtype == np.int64
    np.testing.assert_array_equal(X.indices, [0, 2, 1])


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 4079, 4080, 4081, 4096, 65537, 1 << 20])
def test_sizing_pass_counts_every_lf_and_colon(n):
    """The outputs are sized by these counts (16 bytes a step, byte counters flushed every
    255 steps): an undercount would write past the arrays."""
    from hpcps.kernels.svmlight import _count_lf_colon

    rng = np.random.default_rng(n)
    for p in ([0.3, 0.3, 0.2, 0.1, 0.1], [0.0, 1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0]):
        buf = rng.choice(np.frombuffer(b"\n:a1 ", np.uint8), size=n, p=p).tobytes()
        assert _count_lf_colon(buf) == (buf.count(b"\n"), buf.count(b":"))


def test_parse_into_reused_buffers_equals_fresh_arrays():
    """``out=``: chunk after chunk parsed into the same buffers (grown when a chunk needs more)
    gives the arrays of a fresh parse, for svmlight and Criteo, from bytes or a uint8 view."""
    from hpcps.kernels.criteo import N_CAT, N_INT, parse_criteo
    from hpcps.kernels.svmlight import parse_svmlight

    rng = np.random.default_rng(2)
    out_s, out_c = {}, {}
    for t in range(40):
        n = int(rng.integers(0, 60 if t % 10 else 600))
        lines = []
        for i in range(n):
            cols = np.unique(rng.integers(0, 30, size=int(rng.integers(0, 6))))
            lines.append(f"{i % 2} " + " ".join(f"{c}:{rng.normal():.5g}" for c in cols))
        buf = ("\n".join(lines) + "\n").encode() if lines else b""
        view = np.frombuffer(buf, dtype=np.uint8)
        for dtype in (np.int32, np.int64):
            want = parse_svmlight(buf, 0, 30, index_dtype=dtype)
            got = parse_svmlight(view, 0, 30, index_dtype=dtype, out=out_s)
            for w, g in zip(want, got):
                assert w.dtype == g.dtype and np.array_equal(w, g)
        crit = b"".join(("\t".join([str(i % 2), *[str(i % 9 - 1)] * N_INT, f"{i:08x}", *[""] * (N_CAT - 1)])
                         + "\n").encode() for i in range(n))
        want = parse_criteo(crit, 20, 1)
        got = parse_criteo(np.frombuffer(crit, dtype=np.uint8), 20, 1, out=out_c)
        for w, g in zip(want, got):
            assert np.array_equal(w, g)
