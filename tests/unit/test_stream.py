"""Streamed minibatches: bounded read-ahead, and every row exactly once across resume and
re-split, checked by each row's identity (no MPI)."""

from __future__ import annotations

import gzip
import time
from collections import Counter

import numpy as np
import pytest

from hpcps.data import DataError
from hpcps.data.criteo import stream_parser
from hpcps.data.stream import StreamReader, Work, split_work
from hpcps.data.textstream import data_files, plan_parts
from hpcps.kernels.criteo import MISSING, N_CAT, N_FIELDS, N_INT, feature_ids


def write_ids(path, ids, gz=False):
    """Criteo rows whose C1 holds the row id (so its feature id identifies the row)."""
    lines = b"".join(("\t".join([str(i % 2), *[str(i % 7)] * N_INT, f"{i:08x}", *[""] * (N_CAT - 1)])
                      + "\n").encode() for i in ids)
    (gzip.open if gz else open)(path, "wb").write(lines)


def row_key(row_id):
    return feature_ids(np.full(len(row_id), N_INT), np.asarray(row_id, dtype=np.int64))


@pytest.fixture
def files(tmp_path):
    write_ids(tmp_path / "a.tsv", range(0, 700))
    write_ids(tmp_path / "b.tsv.gz", range(700, 1100), gz=True)
    (tmp_path / "c.tsv").write_bytes(b"")
    write_ids(tmp_path / "d.tsv", range(1100, 1500))
    return data_files(tmp_path)


def as_work(pieces):
    return [Work(p.path, p.start, p.stop) for p in pieces]


def reader(work, **kw):
    parse, error = stream_parser()
    kw.setdefault("window_bytes", 4000)
    return StreamReader(work, parse, kw.pop("batch_size", 64), error, **kw)


def ids_of(batches):
    return np.concatenate([b.indices.reshape(-1, N_FIELDS)[:, N_INT] for b in batches]) \
        if batches else np.zeros(0, dtype=np.int64)


ALL = Counter(row_key(np.arange(1500)).tolist())


@pytest.mark.parametrize("n_workers", [1, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_per_epoch(files, n_workers, shuffle):
    got = []
    for w in range(n_workers):
        with reader(as_work(plan_parts(files, w, n_workers)), shuffle=shuffle, seed=3) as r:
            batches = list(r)
        assert all(b.y.size == 64 for b in batches[:-1])
        got.append(ids_of(batches))
    assert Counter(np.concatenate(got).tolist()) == ALL


def test_shuffle_permutes_within_windows_and_depends_on_the_epoch(files):
    work = as_work(plan_parts(files, 0, 1))
    plain = ids_of(list(reader(work)))
    e0 = ids_of(list(reader(work, shuffle=True, epoch=0)))
    e0b = ids_of(list(reader(work, shuffle=True, epoch=0)))
    e1 = ids_of(list(reader(work, shuffle=True, epoch=1)))
    assert (e0 == e0b).all() and (e0 != plain).any() and (e0 != e1).any()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("after", [1, 5, 11, 23])
def test_resume_from_the_remaining_work_continues_the_same_order(files, shuffle, after):
    work = as_work(plan_parts(files, 0, 1))
    whole = ids_of(list(reader(work, shuffle=shuffle, seed=9)))
    r = reader(work, shuffle=shuffle, seed=9)
    first = [next(r) for _ in range(after)]
    r.close()
    saved = [Work.from_row(w.to_row()) for w in first[-1].remaining]     # as a checkpoint keeps it
    rest = list(reader(saved, shuffle=shuffle, seed=9))
    np.testing.assert_array_equal(np.concatenate([ids_of(first), ids_of(rest)]), whole)


@pytest.mark.parametrize("new_workers", [1, 2, 5])
def test_re_split_after_a_loss_or_growth_reads_every_row_once(files, new_workers):
    consumed, remaining = [], []
    for w, steps in zip(range(3), [2, 3, 0]):
        r = reader(as_work(plan_parts(files, w, 3)), shuffle=True, seed=1)
        got = [next(r) for _ in range(steps)]
        r.close()
        consumed.append(ids_of(got))
        remaining += got[-1].remaining if got else as_work(plan_parts(files, w, 3))
    parts = split_work(remaining, new_workers)
    assert len(parts) == new_workers
    for part in parts:
        consumed.append(ids_of(list(reader(part, shuffle=True, seed=1))))
    assert Counter(np.concatenate(consumed).tolist()) == ALL


def test_read_ahead_is_bounded_by_the_queue_and_one_window(files):
    work = as_work(plan_parts(files, 0, 1))
    r = reader(work, batch_size=16, depth=2, window_bytes=2000)
    next(r)
    time.sleep(0.5)                        # the thread fills the queue, then must wait
    window_rows = 2000 // 60 + 2           # rows are about 60-70 bytes
    assert r.rows <= 16 * (2 + 2) + 2 * window_rows
    r.close()
    assert not r._thread.is_alive()


def test_a_bad_row_raises_from_next_naming_file_and_line(tmp_path):
    write_ids(tmp_path / "a.tsv", range(100))
    with open(tmp_path / "a.tsv", "ab") as f:
        f.write(b"1\tnot-an-int" + b"\t" * 38 + b"\n")
    r = reader(as_work(plan_parts(data_files(tmp_path), 0, 1)), batch_size=10)
    with pytest.raises(DataError, match=r"a\.tsv:101: field I1 'not-an-int' is not a decimal integer"):
        list(r)


def test_split_work_errors_and_plain_cuts_at_line_starts(files):
    with pytest.raises(ValueError, match="n_parts"):
        split_work([], 0)
    parts = split_work(as_work(plan_parts(files, 0, 1)), 3)
    for part in parts:
        for w in part:
            if w.start:
                with open(w.path, "rb") as f:
                    f.seek(w.start - 1)
                    assert f.read(1) == b"\n"
    assert MISSING > 0
