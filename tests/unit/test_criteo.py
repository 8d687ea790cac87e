"""Criteo TSV parsing, streamed multi-file reading, and the criteo-like generator (no MPI)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import zstandard

from hpcps.data import DataError
from hpcps.data.criteo import iter_part, read_criteo_part
from hpcps.data.generate import CriteoLike, generate_criteo_like
from hpcps.data.textstream import Piece, data_files, iter_chunks, plan_parts
from hpcps.kernels.criteo import (MISSING, N_CAT, N_FIELDS, N_INT, CriteoSyntaxError,
                                  feature_ids, format_criteo, int_bins, parse_criteo)


def row(label="1", ints=None, cats=None) -> bytes:
    ints = ints if ints is not None else [""] * N_INT
    cats = cats if cats is not None else [""] * N_CAT
    return ("\t".join([label, *map(str, ints), *cats]) + "\n").encode()


def expected_ids(ints, cats, hash_bits=0, seed=0):
    vals = [MISSING if v == "" else int(int_bins([int(v)])[0]) for v in ints]
    vals += [MISSING if c == "" else int(c, 16) for c in cats]
    return feature_ids(np.arange(N_FIELDS), np.array(vals, dtype=np.int64), hash_bits, seed)


def test_one_row_gives_one_id_per_field_with_log_bins_and_missing_values():
    ints = [5, "", -1, 100, 0, 1, 2, 3, "", 7, 10**12, 20, ""]
    cats = ["68fd1e64", "", "0", "FFFFFFFF"] + ["a"] * 22
    y, indptr, idx, off = parse_criteo(row("1", ints, cats))
    assert y.tolist() == [1.0]
    assert indptr.tolist() == [0, N_FIELDS]
    np.testing.assert_array_equal(idx, expected_ids(ints, cats))
    assert (idx >= 0).all()
    assert int_bins([3, 100, 10**12]).tolist() == [1, 21, 763]     # floor(log(v)**2)


def test_crlf_blank_lines_and_a_last_line_without_newline():
    a = row("0", [1] * N_INT, ["ab"] * N_CAT)
    buf = a.replace(b"\n", b"\r\n") + b"\n\r\n" + a[:-1]
    y, indptr, idx, off = parse_criteo(buf)
    assert y.tolist() == [0.0, 0.0]
    np.testing.assert_array_equal(idx[:N_FIELDS], idx[N_FIELDS:])
    assert off.tolist() == [0, len(a) + 1 + 3]


def test_hash_bits_buckets_and_seed_changes_ids():
    r = row("1", [1] * N_INT, ["ab"] * N_CAT)
    raw = parse_criteo(r)[2]
    b = parse_criteo(r, hash_bits=10)[2]
    np.testing.assert_array_equal(b, raw & 1023)
    assert (parse_criteo(r, seed=7)[2] != raw).all()
    with pytest.raises(ValueError, match="hash_bits"):
        parse_criteo(r, hash_bits=64)


@pytest.mark.parametrize("line, reason", [
    (b"1\t2\n", "2 tab-separated fields, expected 40"),
    (b"0" + b"\t" * 40 + b"\n", "41 tab-separated fields"),
    (b"2" + b"\t" * 39 + b"\n", "label '2' is not 0 or 1"),
    (b"0" + b"\t" * 12 + b"\tx1" + b"\t" * 26 + b"\n", "field I13 'x1' is not a decimal integer"),
    (b"0" + b"\t" * 13 + b"\tzz" + b"\t" * 25 + b"\n", "field C1 'zz' is not hexadecimal"),
    (b"0" + b"\t" * 13 + b"\t" + b"f" * 17 + b"\t" * 25 + b"\n", "is not hexadecimal"),
])
def test_bad_rows_raise_with_the_reason(line, reason):
    with pytest.raises(CriteoSyntaxError, match=reason) as e:
        parse_criteo(row() + line)
    assert e.value.offset == len(row())


def test_written_rows_parse_to_the_ids_of_what_was_drawn():
    rng = np.random.default_rng(3)
    model = CriteoLike(seed=5)
    lab, ints, cats, im, cm, p = model.sample(500, rng)
    buf = format_criteo(lab, ints, cats, im, cm)
    y, indptr, idx, _ = parse_criteo(buf)
    np.testing.assert_array_equal(y, lab)
    vals = np.concatenate([np.where(im.astype(bool), MISSING, int_bins(ints)),
                           np.where(cm.astype(bool), MISSING, cats.astype(np.int64))], axis=1)
    want = feature_ids(np.broadcast_to(np.arange(N_FIELDS), vals.shape), vals)
    np.testing.assert_array_equal(idx.reshape(-1, N_FIELDS), want)
    assert ((p > 0) & (p < 1)).all()


# -- files ----------------------------------------------------------------------------------

def write_rows(path, n, start=0, compress=None):
    text = b"".join(row(str((start + i) % 2), [start + i] + [""] * (N_INT - 1)) for i in range(n))
    opener = {None: open, "gzip": gzip.open, "zstd": zstandard.open}[compress]
    with opener(path, "wb") as f:
        f.write(text)
    return text


def test_data_files_directory_glob_and_errors(tmp_path):
    for name in ["b.tsv", "a.tsv.gz", "_truth.json", ".hidden"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    assert data_files(tmp_path) == [str(tmp_path / "a.tsv.gz"), str(tmp_path / "b.tsv")]
    assert data_files(tmp_path / "*.tsv") == [str(tmp_path / "b.tsv")]
    with pytest.raises(DataError, match="no file matches"):
        data_files(tmp_path / "*.svm")
    with pytest.raises(DataError, match="no such file"):
        data_files(tmp_path / "nope")
    with pytest.raises(DataError, match="holds no data file"):
        data_files(tmp_path / "sub")


@pytest.mark.parametrize("n_parts", [1, 2, 3, 5, 8])
def test_every_row_once_over_plain_gzip_zstd_and_empty_files(tmp_path, n_parts):
    write_rows(tmp_path / "p0.tsv", 37, 0)
    write_rows(tmp_path / "p1.tsv.gz", 23, 100, "gzip")
    (tmp_path / "p2.tsv").write_bytes(b"")
    write_rows(tmp_path / "p3.tsv.zst", 11, 200, "zstd")
    write_rows(tmp_path / "p4.tsv", 5, 300)
    files = data_files(tmp_path)
    first_ids = []
    for part in range(n_parts):
        for b in iter_part(plan_parts(files, part, n_parts), chunk_bytes=97):
            first_ids.append(b.indices.reshape(-1, N_FIELDS)[:, 0])
    got = np.sort(np.concatenate(first_ids))
    want = np.sort(feature_ids(np.zeros(76, dtype=np.int64), int_bins(
        np.r_[np.arange(37), 100 + np.arange(23), 200 + np.arange(11), 300 + np.arange(5)])))
    np.testing.assert_array_equal(got, want)
    X, y = read_criteo_part(tmp_path, 0, 1)
    assert X.shape[0] == 76 and y.sum() == sum(i % 2 for i in
                                                   [*range(37), *range(100, 123), *range(200, 211), *range(300, 305)])


def test_chunks_end_on_line_ends_and_resume_from_an_offset(tmp_path):
    text = write_rows(tmp_path / "a.tsv.gz", 20, 0, "gzip")
    chunks = list(iter_chunks(tmp_path / "a.tsv.gz", chunk_bytes=50))
    assert b"".join(c.data for c in chunks) == text
    assert all(c.data.endswith(b"\n") for c in chunks)
    mid = chunks[len(chunks) // 2]
    rest = list(iter_chunks(tmp_path / "a.tsv.gz", 1000, start=mid.offset, start_line=mid.line))
    assert b"".join(c.data for c in rest) == text[mid.offset:]
    assert rest[0].line == mid.line == text[:mid.offset].count(b"\n") + 1


def test_bad_row_names_file_and_line_in_plain_and_compressed_files(tmp_path):
    good = write_rows(tmp_path / "a.tsv", 9, 0)
    (tmp_path / "a.tsv").write_bytes(good + b"0\tx" + b"\t" * 38 + b"\n")
    with pytest.raises(DataError, match=r"a\.tsv:10: field I1 'x' is not a decimal integer"):
        read_criteo_part(tmp_path / "a.tsv", 1, 2)      # part 1 starts mid-file
    with gzip.open(tmp_path / "b.tsv.gz", "wb") as f:
        f.write(good + b"1" + b"\t" * 38 + b"\n")
    with pytest.raises(DataError, match=r"b\.tsv\.gz:10: 39 tab-separated fields"):
        read_criteo_part(tmp_path / "b.tsv.gz", 0, 1)


def test_truncated_gzip_names_the_file_and_the_byte_offset(tmp_path):
    write_rows(tmp_path / "a.tsv.gz", 2000, 0, "gzip")
    data = (tmp_path / "a.tsv.gz").read_bytes()
    (tmp_path / "a.tsv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"a\.tsv\.gz: gzip stream damaged or truncated after byte \d+"):
        read_criteo_part(tmp_path / "a.tsv.gz", 0, 1)


def test_generator_is_seeded_and_records_the_ground_truth(tmp_path):
    a = generate_criteo_like(tmp_path / "a", rows=3001, files=3, seed=4, compress="zstd")
    b = generate_criteo_like(tmp_path / "b", rows=3001, files=3, seed=4, compress="none")
    assert [f["rows"] for f in a["files"]] == [1000, 1000, 1001]
    truth = json.loads((tmp_path / "a" / "_truth.json").read_text())
    assert truth["seed"] == 4 and 0.6 < truth["files"][0]["truth_auc"] < 0.95
    assert 0.15 < truth["files"][0]["click_rate"] < 0.4
    Xa, ya = read_criteo_part(tmp_path / "a", 0, 1)
    Xb, yb = read_criteo_part(tmp_path / "b", 0, 1)
    assert Xa.shape[0] == 3001
    np.testing.assert_array_equal(ya, yb)
    assert (Xa != Xb).nnz == 0
    c = generate_criteo_like(tmp_path / "c", rows=300, files=1, seed=5)
    assert c["files"][0]["click_rate"] != a["files"][0]["click_rate"]


def test_iter_chunks_reused_buffer_gives_the_same_chunks(tmp_path):
    """``reuse=True`` (views of one buffer, what the Criteo reader parses) yields the chunks
    ``reuse=False`` does — bytes, offsets, line numbers — for plain and gzip files, lines
    longer than a chunk, no last newline, a start offset and a byte range."""
    rng = np.random.default_rng(4)
    lines = [b"x" * int(n) for n in rng.integers(0, 300, size=400)]
    text = b"\n".join(lines)                                   # no last newline
    (tmp_path / "p.txt").write_bytes(text)
    (tmp_path / "g.txt.gz").write_bytes(gzip.compress(text))
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == 10][::57]
    for name in ("p.txt", "g.txt.gz"):
        for chunk in (1, 7, 64, 1000, 1 << 16):
            for start, stop in ((0, None), (starts[3], None), (starts[1], starts[5] + 3)):
                if stop is not None and name.endswith(".gz"):
                    continue
                kw = dict(chunk_bytes=chunk, start=start, stop=stop)
                want = [(c.data, c.offset, c.line) for c in iter_chunks(tmp_path / name, **kw)]
                got = [(bytes(c.data), c.offset, c.line)
                       for c in iter_chunks(tmp_path / name, reuse=True, **kw)]
                assert got == want, (name, chunk, start, stop)
