"""Streamed rows of a job (hpcps.data.lines): every line of many plain/gzip/zstd files read
once per epoch through the reader thread, under a bounded shuffle, a resume mid-epoch and a
re-plan over another number of workers — checked by each row's identity (no MPI)."""

from __future__ import annotations

import gzip
import re
import types

import numpy as np
import pytest
import zstandard

from hpcps.core.planning import epoch_order, epoch_rows
from hpcps.data import DataError
from hpcps.data.criteo import read_criteo_part
from hpcps.data.lineindex import load_index
from hpcps.data.lines import Parser, StreamedRows, row_hashes
from hpcps.data.partition_rows import block_bounds
from hpcps.kernels.criteo import N_CAT, N_INT


def criteo_lines(ids):
    """Criteo rows whose C1 holds the row id (a distinct row per id)."""
    return b"".join(("\t".join([str(i % 2), *[str(i % 7)] * N_INT, f"{i:08x}", *[""] * (N_CAT - 1)])
                     + "\n").encode() for i in ids)


def cfg(**kw):
    d = dict(format="criteo", on_bad_line="error", hash_bits=20, num_features=1 << 20)
    d.update(kw)
    return types.SimpleNamespace(**d)


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.tsv").write_bytes(criteo_lines(range(0, 700)))
    (d / "b.tsv.gz").write_bytes(gzip.compress(criteo_lines(range(700, 1100))))
    (d / "c.tsv").write_bytes(b"")
    (d / "d.tsv.zst").write_bytes(zstandard.ZstdCompressor().compress(criteo_lines(range(1100, 1400))))
    (d / "e.tsv").write_bytes(criteo_lines(range(1400, 1500)).rstrip(b"\n"))   # no last \n
    return d


def reference(path):
    X, y = read_criteo_part(path, 0, 1, hash_bits=20)
    X.sort_indices()
    return row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data)


def hashes(X, y):
    X.sum_duplicates()
    return row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data)


def read_all(rows, order, first=0, batch=37):
    """The row hashes of ``order[first:]`` read in steps of ``batch``."""
    rows.start(order, first)
    out = []
    for a in range(first, order.size, batch):
        r = order[a:a + batch]
        X, y = rows[r], rows.labels[r]
        assert X.shape[0] == y.size == r.size
        out.append(hashes(X, y))
    rows.close()
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def test_index_counts_lines_of_plain_gzip_zstd_and_empty_files(data, tmp_path):
    ix = load_index(data, tmp_path / "cache")
    assert ix.lines.tolist() == [700, 400, 0, 300, 100] and ix.n_lines == 1500
    again = load_index(data, tmp_path / "cache")                 # from the cache
    assert again.fingerprint == ix.fingerprint and again.lines.tolist() == ix.lines.tolist()


def test_an_index_cache_that_cannot_be_written_is_skipped(data, tmp_path):
    """The cache is an optimisation: ``hpcps eval`` of a run whose directory cannot be written
    (an archive) still evaluates (the cache directory here lies under a regular file, which
    no user, root included, can make a directory in)."""
    (tmp_path / "afile").write_text("x")
    ix = load_index(data, tmp_path / "afile" / "line-index")
    assert ix.starts[-1] == load_index(data).starts[-1] > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("afile")] == ["afile"]
    assert (tmp_path / "afile").read_text() == "x"                     # nothing else written


@pytest.mark.parametrize("n_workers", [1, 3, 4])
def test_every_row_once_per_epoch_under_the_block_shuffle(data, n_workers):
    ref = reference(data)
    ix = load_index(data)
    got = []
    for w in range(n_workers):
        lo, hi = block_bounds(ix.n_lines, w, n_workers)
        rows = StreamedRows(ix, Parser(cfg()), lo, hi, unit=64, depth=2)
        order = epoch_order(hi - lo, 5, w, 1, True, 64)
        h = read_all(rows, order)
        assert np.array_equal(h, ref[lo + order])               # the right row for each line
        got.append(h)
    all_h = np.concatenate(got)
    assert sorted(all_h.tolist()) == sorted(ref.tolist())       # each row once, none lost


def test_block_shuffle_stays_within_blocks_and_depends_on_the_epoch():
    a = epoch_order(1000, 3, 0, 0, True, 100)
    assert sorted(a.tolist()) == list(range(1000))
    assert all(set(a[k:k + 100] // 100) == {k // 100} for k in range(0, 1000, 100))
    assert not np.array_equal(a, epoch_order(1000, 3, 0, 1, True, 100))


def test_resume_mid_epoch_and_replan_over_other_worker_counts_read_each_row_once(data):
    """Segments as a checkpoint (epoch, step, plan) or a lost/added worker leave them."""
    ref = reference(data)
    ix = load_index(data)
    batch, unit = 16, 50
    sizes = [b - a for a, b in (block_bounds(ix.n_lines, w, 3) for w in range(3))]
    seen = []
    plan = [[3, 7]]            # 3 workers ran 7 steps, then 2 workers ran 5, then 4 finish
    lists = epoch_rows(sizes, [], 3, 0, 2, True, batch, unit)
    for w in range(3):
        seen.append(lists[w][:7 * batch])
    lists = epoch_rows(sizes, plan, 2, 0, 2, True, batch, unit)
    for w in range(2):
        seen.append(lists[w][:5 * batch])
    plan = plan + [[2, 5]]
    lists = epoch_rows(sizes, plan, 4, 0, 2, True, batch, unit)
    got = []
    whole = StreamedRows(ix, Parser(cfg()), 0, ix.n_lines, unit=unit, depth=3)
    for seg in seen + lists:
        got.append(read_all(whole, seg, batch=batch))
        assert np.array_equal(got[-1], ref[seg])
    assert sorted(np.concatenate(got).tolist()) == sorted(ref.tolist())
    # a restart at step 4 of worker 1's first segment reads the rest, from inside a block
    lo, hi = block_bounds(ix.n_lines, 1, 3)
    order = epoch_order(hi - lo, 0, 1, 2, True, unit)
    part = StreamedRows(ix, Parser(cfg()), lo, hi, unit=unit, depth=2)
    assert np.array_equal(read_all(part, order, first=4 * batch, batch=batch), ref[lo + order[4 * batch:]])


def test_bad_line_names_file_and_line_even_in_gzip(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    lines = criteo_lines(range(300)).split(b"\n")
    lines[200] = b"1\tnot-a-number" + b"\t" * 38
    (d / "a.tsv").write_bytes(criteo_lines(range(1000, 1100)))
    (d / "b.tsv.gz").write_bytes(gzip.compress(b"\n".join(lines)))
    ix = load_index(d)
    rows = StreamedRows(ix, Parser(cfg()), 0, ix.n_lines, unit=64)
    rows.start(np.arange(ix.n_lines))
    with pytest.raises(DataError, match=r"b\.tsv\.gz:201: "):
        for a in range(0, ix.n_lines, 50):
            rows[np.arange(a, min(a + 50, ix.n_lines))]
    rows.close()
    skip = StreamedRows(ix, Parser(cfg(on_bad_line="skip")), 0, ix.n_lines, unit=64)
    skip.start(np.arange(ix.n_lines))
    n = sum(skip[np.arange(a, min(a + 50, ix.n_lines))].shape[0] for a in range(0, ix.n_lines, 50))
    assert n == ix.n_lines - 1 and skip.report()["skipped"] == 1
    skip.close()


def test_truncated_gzip_is_named(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.tsv.gz").write_bytes(gzip.compress(criteo_lines(range(5000)))[:-300])
    with pytest.raises(DataError, match=r"a\.tsv\.gz: gzip stream damaged or truncated"):
        load_index(d)


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_truncated_stream_is_named_at_the_last_byte_decoded(tmp_path, kind):
    """A fresh user's trial: a truncated gzip file was named at the start of the 4 MiB block
    that failed (byte 0 of any file under 4 MiB; byte 67,108,864 of one whose first
    70,451,441 bytes decode), not where its readable data end."""
    import zlib

    import zstandard

    data = criteo_lines(range(20000))
    if kind == "gzip":
        packed = gzip.compress(data)
        cut = packed[:len(packed) * 2 // 3]
        readable = len(zlib.decompressobj(31).decompress(cut))
        name = "a.tsv.gz"
    else:
        packed = zstandard.ZstdCompressor().compress(data)
        cut = packed[:len(packed) * 2 // 3]
        readable = len(zstandard.ZstdDecompressor().decompressobj().decompress(cut))
        name = "a.tsv.zst"
    d = tmp_path / "d"
    d.mkdir()
    (d / name).write_bytes(cut)
    with pytest.raises(DataError) as e:
        load_index(d)
    m = re.search(r"truncated after byte (\d+) of its decompressed data \(line (\d+)\)", str(e.value))
    pos, line = int(m.group(1)), int(m.group(2))
    assert readable > 100_000 and readable - 200_000 <= pos <= readable, (pos, readable)
    assert line == data[:pos].count(b"\n") + 1


def test_svmlight_streamed_blank_comment_and_bad_label_lines(tmp_path):
    p = tmp_path / "s.svm"
    p.write_bytes(b"1 1:1 3:2\n\n# note\n-1 2:1\n2 1:1\n0 3:1\n")
    ix = load_index(p)
    c = cfg(format="svmlight", index_base=1, n_features=3, duplicate_indices="error", num_features=3)
    rows = StreamedRows(ix, Parser(c), 0, ix.n_lines, unit=4)
    rows.start(np.arange(ix.n_lines))
    with pytest.raises(DataError, match=r"s\.svm:5: label 2\.0 is not -1, 0 or \+1"):
        rows[np.arange(6)]
    rows.close()
    c.on_bad_line = "skip"
    rows = StreamedRows(ix, Parser(c), 0, ix.n_lines, unit=4)
    rows.start(np.arange(ix.n_lines))
    X, y = rows[np.arange(6)], rows.labels[np.arange(6)]
    assert y.tolist() == [1.0, 0.0, 0.0] and X.toarray().tolist() == [[1, 0, 2], [0, 1, 0], [0, 0, 1]]
    assert rows.report()["skipped"] == 1
    rows.close()


def test_queue_depth_bounds_what_is_read_ahead(data):
    ix = load_index(data)
    rows = StreamedRows(ix, Parser(cfg()), 0, ix.n_lines, unit=50, depth=2)
    rows.start(np.arange(ix.n_lines))
    rows[np.arange(10)]
    import time

    time.sleep(0.3)
    # one unit in use, two queued, one parsed and waiting to be queued: at most 4 * 50 lines
    assert rows.stats["lines"] <= 4 * 50
    rows.close()


def test_counters_add_up_over_epochs(data):
    ix = load_index(data)
    rows = StreamedRows(ix, Parser(cfg()), 0, ix.n_lines, unit=100, depth=2)
    for epoch in range(2):
        read_all(rows, epoch_order(ix.n_lines, 0, 0, epoch, True, 100))
    rep = rows.report()
    assert rep["lines"] == 2 * ix.n_lines
    assert rep["bytes"] == 2 * sum(len(criteo_lines([i])) for i in range(ix.n_lines)) - 2   # e.tsv: no last \n


def test_partitions_keep_compressed_files_whole(data):
    ix = load_index(data)          # a.tsv 700 plain, b.tsv.gz 400, c.tsv 0, d.tsv.zst 300, e.tsv 100
    for n_parts in (1, 2, 3, 4, 7, 20):
        bounds = [ix.part_bounds(ix.n_lines, p, n_parts) for p in range(n_parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == ix.n_lines
        assert all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))       # contiguous
        for lo, hi in bounds:                                               # no cut inside
            for cut in (lo, hi):
                f, j = ix.locate(min(cut, ix.n_lines - 1))
                if 0 < cut < ix.n_lines and ix.files[f].endswith((".gz", ".zst")):
                    assert j == 0, (n_parts, bounds)
    # 3 parts: cuts at 500 (plain a.tsv, kept) and 1000 (inside b.tsv.gz 700..1100 -> 1100)
    assert [ix.part_bounds(1500, p, 3) for p in range(3)] == [(0, 500), (500, 1100), (1100, 1500)]


def _csr(X, y):
    return (y.tolist(), X.indptr.astype(np.int64).tolist(), X.indices.astype(np.int64).tolist(),
            X.data.tolist())


@pytest.mark.parametrize("fmt", ["criteo", "svmlight"])
def test_step_slices_and_other_requests_give_the_same_rows(tmp_path, fmt):
    """A step's rows ``order[a:b]`` are served as a slice of the unit (its rows are put in
    the order's sequence once); any other request (a copy in another order, a subset) goes
    through the per-row search: both give the same rows, blank and skipped lines dropped."""
    if fmt == "criteo":
        p = tmp_path / "c.tsv"
        p.write_bytes(criteo_lines(range(500)))
        c = cfg()
    else:
        rng = np.random.default_rng(3)
        lines = []
        for i in range(500):
            k = rng.integers(4)
            lines.append(b"" if k == 0 else b"# c" if k == 1 else
                         f"{i % 2} {i % 5 + 1}:{i} {i % 5 + 7}:0.5".encode())
        p = tmp_path / "s.svm"
        p.write_bytes(b"\n".join(lines) + b"\n")
        c = cfg(format="svmlight", index_base=1, n_features=20, duplicate_indices="error",
                num_features=20)
    ix = load_index(p)
    order = epoch_order(ix.n_lines, 0, 0, 1, True, 64)
    for first in (0, 45):
        a_rows = StreamedRows(ix, Parser(c), 0, ix.n_lines, unit=64, depth=2)
        b_rows = StreamedRows(ix, Parser(c), 0, ix.n_lines, unit=64, depth=2)
        a_rows.start(order, first)
        b_rows.start(order, first)
        for a in range(first, order.size, 50):                   # batches across units
            r = order[a:a + 50]
            got = _csr(a_rows[r], a_rows.labels[r])
            s = np.array(r[::-1])                                # another order: searched
            Xb, yb = b_rows[s], b_rows.labels[s]
            back = np.arange(yb.size)[::-1]
            want = _csr(Xb[back], yb[back])
            assert got == want
        a_rows.close()
        b_rows.close()


def test_rows_of_a_unit_already_passed_are_refused(data):
    ix = load_index(data)
    order = np.arange(ix.n_lines)
    rows = StreamedRows(ix, Parser(cfg()), 0, ix.n_lines, unit=100, depth=2)
    rows.start(order)
    rows[order[0:50]]
    rows[order[300:350]]                                        # units 0..2 passed
    with pytest.raises(RuntimeError, match="outside the order being read"):
        rows[order[50:100]]
    rows.close()


def test_text_kernels_newline_end_and_take_rows():
    import scipy.sparse as sp

    from hpcps.kernels.text import newline_end, take_rows

    rng = np.random.default_rng(5)
    for _ in range(500):
        b = rng.choice(np.frombuffer(b"\na", np.uint8), size=rng.integers(0, 40)).tobytes()
        k = int(rng.integers(0, 8))
        ends = [i + 1 for i, ch in enumerate(b) if ch == 10]
        want = (0, 0) if k == 0 else (k, ends[k - 1]) if len(ends) >= k else (len(ends), -1)
        assert newline_end(b, k) == want
    for t in range(100):
        X = sp.random(int(rng.integers(1, 30)), 50, density=0.2, format="csr", random_state=t)
        rows = rng.integers(0, X.shape[0], size=rng.integers(0, 40)).astype(np.int64)
        ref = X[rows]
        for small, src in ((False, np.int64), (True, np.int64), (False, np.int32), (True, np.int32)):
            for d in (X.data, None):
                p, i, dd = take_rows(X.indptr.astype(src), X.indices.astype(src), d, rows, small)
                assert p.dtype == i.dtype == (np.int32 if small else np.int64)
                assert p.tolist() == ref.indptr.tolist() and i.tolist() == ref.indices.tolist()
                assert (dd is None) if d is None else dd.tolist() == ref.data.tolist()
    with pytest.raises(IndexError, match=r"row 1 outside \[0, 1\)"):
        take_rows(np.array([0, 1]), np.array([3]), None, np.array([1]))
    with pytest.raises(TypeError, match="indices must be a contiguous 1-d int32 or int64 array"):
        take_rows(np.array([0, 1]), np.array([3.0]), None, np.array([0]))


def test_svmlight_streamed_over_plain_and_gzip_files_equals_the_whole_file_reader(tmp_path):
    """The reader parses unit after unit into the same reused buffers (the read buffer, the
    parser's outputs): the rows of every unit, of reads that span two files and of a shuffled
    order are those of :func:`read_svmlight_part`, and the buffers are not reallocated."""
    from hpcps.data.linereader import LineReader
    from hpcps.data.svmlight import read_svmlight_part

    rng = np.random.default_rng(11)
    d = tmp_path / "d"
    d.mkdir()
    texts = []
    for f in range(3):
        lines = []
        for i in range(300 + 50 * f):
            k = int(rng.integers(12))
            cols = np.sort(rng.choice(40, size=int(rng.integers(0, 9)), replace=False)) + 1
            vals = [f"{v:.6g}" for v in rng.normal(size=cols.size)]
            lines.append(b"" if k == 0 else b"# c" if k == 1 else
                         (f"{(-1) ** i:+d} " + " ".join(f"{c}:{v}" for c, v in zip(cols, vals))).encode())
        texts.append(b"\n".join(lines) + b"\n")
    (d / "a.svm").write_bytes(texts[0])
    (d / "b.svm.gz").write_bytes(gzip.compress(texts[1]))
    (d / "c.svm").write_bytes(texts[2])
    (tmp_path / "b.svm").write_bytes(texts[1])
    ref = []
    for p in (d / "a.svm", tmp_path / "b.svm", d / "c.svm"):
        X, y = read_svmlight_part(p, 0, 1, n_features=40, index_base=1)
        ref.append(row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data))
    ref = np.concatenate(ref)
    c = cfg(format="svmlight", index_base=1, n_features=40, duplicate_indices="error", num_features=40)
    ix = load_index(d)
    reader = LineReader(ix, Parser(c))
    for a in range(0, ix.n_lines, 70):          # 70 lines a read; some span two files
        reader.read(a, min(a + 70, ix.n_lines))
        if a == 0:
            bufs = {k: v for k, v in reader.out.items()}
            store = reader.store
    assert all(reader.out[k] is v for k, v in bufs.items()) and reader.store is store
    # one read buffer per reader, lent to the cursor it reads from: each cursor keeps only
    # its unread rest (a new user's 7.5 GB run: a 32 MiB buffer per file of a worker's share
    # stayed until the end of the epoch)
    assert len(reader.cursors) == 3
    assert all(c.store is not store and c.store.size < store.size for c in reader.cursors.values())
    reader.close()
    for unit in (64, 1000):
        rows = StreamedRows(ix, Parser(c), 0, ix.n_lines, unit=unit, depth=2)
        order = epoch_order(ix.n_lines, 0, 0, 2, True, unit)
        rows.start(order)
        got = []
        for a in range(0, order.size, 33):
            X, y = rows[order[a:a + 33]], rows.labels[order[a:a + 33]]
            got.append(hashes(X, y))
        rows.close()
        got = np.concatenate(got)
        assert sorted(got.tolist()) == sorted(ref.tolist())


def test_row_hashes_with_empty_rows_last_and_between():
    """An empty last row made ``np.add.reduceat`` raise IndexError (its start is the end of
    the arrays): every row hashes as it does alone."""
    y = np.array([1.0, 0.0, 1.0, 0.0])
    indptr = np.array([0, 2, 2, 3, 3], dtype=np.int64)
    indices = np.array([1, 4, 2], dtype=np.int64)
    data = np.array([0.5, -1.0, 2.0])
    h = row_hashes(y, indptr, indices, data)
    for i in range(4):
        a, b = indptr[i], indptr[i + 1]
        alone = row_hashes(y[i:i + 1], np.array([0, b - a]), indices[a:b], data[a:b])
        assert h[i] == alone[0]
    assert h[3] == 0 and h[1] == 0


def test_svmlight_without_n_features_reads_the_dynamic_id_space_and_names_its_bound(tmp_path):
    """Found by a trial: the streamed reader took ``int(data_cfg.n_features)``, None for a
    dynamic table without ``n_features`` (a TypeError on every rank); and an id of 2**63 - 1
    was refused as "out of range for n_features=9223372036854775807", a key the job does not
    set. Streamed and in memory alike, ids up to 2**63 - 2 are read exactly; 2**63 - 1 is
    refused naming the largest id a dynamic table accepts."""
    from hpcps.config.sections import DYNAMIC_KEYS
    from hpcps.data.linereader import LineReader
    from hpcps.data.svmlight import read_svmlight_part

    big = (2**53 + 1, 2**63 - 2)
    p = tmp_path / "d.svm"
    p.write_text(f"1 5:1 {big[0]}:1\n0 7:1 {big[1]}:1\n")
    c = cfg(format="svmlight", index_base=0, n_features=None, duplicate_indices="error",
            num_features=DYNAMIC_KEYS)
    reader = LineReader(load_index(p), Parser(c))
    y, indptr, indices, _, _ = reader.read(0, 2)
    reader.close()
    assert indices.dtype == np.int64 and indices.tolist() == [5, big[0], 7, big[1]]
    X, _ = read_svmlight_part(p, 0, 1, n_features=None, index_base=0)
    assert X.shape[1] == DYNAMIC_KEYS and X.indices.tolist() == [5, big[0], 7, big[1]]
    p.write_text(f"1 5:1\n0 7:1 {2**63 - 1}:1\n")
    want = (f"d.svm:2: feature index {2**63 - 1} (index_base=0) is above {2**63 - 2} "
            f"(2**63 - 2), the largest id a dynamic table accepts")
    reader = LineReader(load_index(p), Parser(c))
    with pytest.raises(DataError, match=re.escape(want)) as e:
        reader.read(0, 2)
    reader.close()
    assert "n_features" not in str(e.value)
    with pytest.raises(DataError, match=re.escape(want)) as e:
        read_svmlight_part(p, 0, 1, n_features=None, index_base=0)
    assert "n_features" not in str(e.value)
    # a declared n_features is still named as such
    with pytest.raises(DataError, match="out of range for n_features=100"):
        read_svmlight_part(p, 0, 1, n_features=100, index_base=0)


def test_a_directory_or_glob_of_small_plain_files_streams(tmp_path):
    """Found by a helper: `path = "dd"` (a directory of small plain svmlight files, `stream`
    unset) was judged in-memory by size, and the in-memory reader opened the directory:
    IsADirectoryError on every rank."""
    from hpcps.data.lines import streams

    d = tmp_path / "dd"
    d.mkdir()
    for i in range(2):
        (d / f"part-{i}.svm").write_text("1 1:1\n0 2:1\n")
    cfg = types.SimpleNamespace(format="svmlight", stream=None, stream_above_mb=1024.0,
                                path=str(d), test_path=None)
    assert streams(cfg)
    cfg.path = str(d / "part-*.svm")
    assert streams(cfg)
    cfg.path = str(d / "part-0.svm")                 # one small plain file: in memory
    assert not streams(cfg)
    cfg.test_path = str(d)
    assert streams(cfg)
    cfg.stream, cfg.path, cfg.test_path = False, str(d), None   # set: as set
    assert not streams(cfg)
    cfg.stream = None
    cfg.path = str(tmp_path / "missing.svm")
    with pytest.raises(DataError):
        streams(cfg)
