"""The model file written block by block (:func:`hpcps.runtime.output.write_model`) and the
k-way merge of the servers' sorted chunks (:func:`hpcps.core.dyntables.merge_sorted`). No MPI;
real HDF5 files."""

from __future__ import annotations

from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from hpcps.core.atomic import GuardedFile, write_streamed
from hpcps.runtime.output import ArrayTable, read_model, write_model
from hpcps.core.dyntables import merge_sorted


def _cfg():
    return SimpleNamespace(name="t", text="name = 't'\n# job text\n",
                           data=SimpleNamespace(num_features=4, index_base=1))


def _filters(size):
    """Byte shuffle and gzip level 1 above 4096 elements (level 4 without the shuffle before
    2026-12-05: most of a 10 M-key model's 19 s of writing)."""
    big = size > 4096
    return dict(compression="gzip" if big else None, compression_opts=1 if big else None,
                shuffle=big)


def _reference(path, tables, cfg, step, epoch):
    """The model file as write_model built it in memory before (commit 24fbf35): every
    dataset from its whole array."""
    with h5py.File(path, "w") as f:
        f.attrs["hpcps_version"] = __import__("hpcps").__version__
        f.attrs["job_name"] = cfg.name
        f.attrs["step"] = int(step)
        f.attrs["epoch"] = int(epoch)
        f.attrs["config"] = cfg.text
        f.attrs["num_features"] = int(cfg.data.num_features)
        f.attrs["index_base"] = int(cfg.data.index_base)
        for name, arr in tables.items():
            if isinstance(arr, tuple):
                keys, arr = arr
                k = f.create_dataset(f"{name}_keys", data=keys, chunks=True if keys.size > 1
                                     else None, **_filters(keys.size))
                k.attrs["meaning"] = f"key of each row of {name!r}, ascending"
                d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                     **_filters(arr.size))
                d.attrs["dim"] = arr.shape[1]
                d.attrs["storage"] = "hash"
                d.attrs["meaning"] = (f"rows of dynamic table {name!r}: the keys stored, "
                                      f"row i is key {name}_keys[i]")
                continue
            d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                 **_filters(arr.size))
            d.attrs["dim"] = arr.shape[1]
            d.attrs["meaning"] = f"rows of table {name!r} in original key order"


def _same_file(a_path, b_path):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        assert list(a) == list(b)
        assert list(a.attrs.items()) == list(b.attrs.items())
        for name in a:
            x, y = a[name], b[name]
            assert (x.dtype, x.shape, x.chunks, x.compression, x.compression_opts, x.shuffle) == \
                (y.dtype, y.shape, y.chunks, y.compression, y.compression_opts, y.shuffle), name
            assert list(x.attrs.items()) == list(y.attrs.items()), name
            assert np.array_equal(x[()], y[()]), name


class Uneven:
    """A source yielding blocks of varying sizes up to ``max_rows`` (as the merge does)."""

    def __init__(self, rows, keys=None):
        self.rows, self.keys = rows, keys
        self.dynamic = keys is not None
        self.n_rows, self.dim = rows.shape
        self.dtype = rows.dtype

    def blocks(self, max_rows):
        rng = np.random.default_rng(3)
        a = 0
        while a < self.n_rows:
            b = min(self.n_rows, a + int(rng.integers(1, max_rows + 1)))
            yield (None if self.keys is None else self.keys[a:b]), self.rows[a:b]
            a = b


def _tables(rng):
    keys = np.sort(rng.choice(1 << 62, 30_000, replace=False)).astype(np.int64)
    return {"w": (keys, rng.normal(size=(30_000, 3)).astype(np.float32)),
            "bias": np.ones((1, 1)),
            "d": rng.normal(size=(9_000, 2)),
            "none": (np.zeros(0, np.int64), np.zeros((0, 4))),
            "small": (np.array([5, 9], dtype=np.int64), np.array([[1.0], [2.0]]))}


@pytest.mark.parametrize("chunk_bytes", [1, 40, 1000, 8 << 20])
def test_streamed_model_has_the_datasets_of_the_in_memory_file(tmp_path, chunk_bytes):
    tables = _tables(np.random.default_rng(0))
    _reference(tmp_path / "ref.h5", tables, _cfg(), 7, 2)
    srcs = {n: Uneven(t[1], t[0]) if isinstance(t, tuple) else Uneven(t)
            for n, t in tables.items()}
    write_model(tmp_path / "model.h5", srcs if chunk_bytes < 100 else tables, _cfg(), 7, 2,
                chunk_bytes=chunk_bytes)
    _same_file(tmp_path / "ref.h5", tmp_path / "model.h5")
    got = read_model(tmp_path / "model.h5")
    assert got["attrs"]["step"] == 7 and got["attrs"]["config"] == _cfg().text
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_each_hdf5_chunk_is_written_once_and_never_read_back(tmp_path):
    """Blocks of odd sizes are cut at HDF5 chunk boundaries, so a chunk is complete when it
    is written: even with no chunk cache at all the library reads back only its metadata (a
    few KB), not compressed chunks to complete them (6.4 MB read back without the cut)."""
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(600_000, 2))
    src = Uneven(rows)
    reads = []

    class Counting(GuardedFile):
        def readinto(self, buf):
            n = super().readinto(buf)
            reads.append(n)
            return n

    def fill(out):
        from hpcps.runtime import output
        with h5py.File(out, "w", rdcc_nbytes=0) as f:
            output._write_table(f, "w", src, 100_003, out)

    import hpcps.core.atomic as atomic
    real = atomic.GuardedFile
    atomic.GuardedFile = Counting
    try:
        write_streamed(tmp_path / "m.h5", fill, rows.nbytes)
    finally:
        atomic.GuardedFile = real
    assert sum(reads) < 64 << 10, (len(reads), sum(reads))
    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert np.array_equal(f["w"][()], rows)


def test_a_source_that_yields_the_wrong_number_of_rows_leaves_no_file(tmp_path):
    src = Uneven(np.ones((100, 1)))
    src.n_rows = 120
    with pytest.raises(ValueError, match="table 'w': 100 rows written of 120"):
        write_model(tmp_path / "model.h5", {"w": src}, _cfg(), 1, 0, chunk_bytes=80)
    assert list(tmp_path.iterdir()) == []


def test_a_write_failing_part_way_is_kept_from_hdf5_and_raised_after(tmp_path):
    """A real write error other than a full disk: the file size limit (RLIMIT_FSIZE, 200 KB)
    makes a write fail with EFBIG part-way. HDF5 finishes normally (it segfaulted when a
    failed write reached it), the OutputError names the file, the reason and the size, and
    nothing is left behind. In a child process (the limit is per process)."""
    import subprocess
    import sys

    code = f"""
import errno, resource, signal, sys
import numpy as np
from pathlib import Path
from types import SimpleNamespace
from hpcps.runtime.output import OutputError, write_model
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # EFBIG instead of the signal
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
cfg = SimpleNamespace(name="t", text="", data=SimpleNamespace(num_features=1, index_base=None))
try:
    write_model(Path({str(tmp_path)!r}) / "model.h5",
                {{"w": np.random.default_rng(0).normal(size=(300_000, 1))}}, cfg, 1, 0,
                chunk_bytes=64 << 10)
except OutputError as e:
    print(e.errno == errno.EFBIG, e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("True "), proc.stdout + proc.stderr[-2000:]
    assert (f"cannot write {tmp_path / 'model.h5'}: File too large; it needs about 2.4"
            in proc.stdout), proc.stdout
    assert list(tmp_path.iterdir()) == []


def _servers(rng, n_keys, n_servers, dim=2):
    keys = rng.choice(1 << 62, n_keys, replace=False).astype(np.int64)
    owner = rng.integers(0, n_servers, n_keys)
    rows = rng.normal(size=(n_keys, dim))
    shards = []
    for s in range(n_servers):
        k, r = keys[owner == s], rows[owner == s]
        o = np.argsort(k)
        shards.append((k[o], r[o]))
    order = np.argsort(keys)
    return shards, keys[order], rows[order]


def _fetcher(shards, log=None):
    def fetch(asks):
        if log is not None:
            log.append(list(asks))
        return [(shards[s][0][a:a + n].copy(), shards[s][1][a:a + n].copy()) for s, a, n in asks]
    return fetch


@pytest.mark.parametrize("n_servers,per", [(1, 5), (2, 1), (3, 7), (3, 1000), (5, 33)])
def test_merge_yields_every_key_once_ascending_within_the_bound(n_servers, per):
    rng = np.random.default_rng(n_servers * 100 + per)
    shards, keys, rows = _servers(rng, 2_000, n_servers)
    counts = [s[0].size for s in shards]
    stats, log = {}, []
    blocks = list(merge_sorted(counts, _fetcher(shards, log), per, stats=stats))
    k = np.concatenate([b[0] for b in blocks])
    r = np.concatenate([b[1] for b in blocks])
    assert np.array_equal(k, keys) and np.array_equal(r, rows)
    row = 8 + 2 * 8
    assert all(b[0].size <= n_servers * per for b in blocks)
    # the chunks held plus the block yielded: at most 2 chunks of every server
    assert stats["held_max"] <= 2 * n_servers * per * row, stats
    # every key is asked for once, in chunks of at most per keys
    assert sum(n for asks in log for _, _, n in asks) == 2_000
    assert max(n for asks in log for _, _, n in asks) <= per
    assert stats["blocks"] == len(blocks) >= 2_000 // (n_servers * per)


def test_merge_of_servers_with_no_keys():
    shards = [(np.zeros(0, np.int64), np.zeros((0, 2))), (np.array([3, 8]), np.ones((2, 2))),
              (np.zeros(0, np.int64), np.zeros((0, 2)))]
    blocks = list(merge_sorted([0, 2, 0], _fetcher(shards), 1))
    assert [b[0].tolist() for b in blocks] == [[3], [8]]
    assert list(merge_sorted([0, 0], _fetcher(shards), 4)) == []


def test_merge_refuses_a_key_on_two_servers_and_an_unsorted_chunk():
    a = (np.array([1, 5, 9]), np.zeros((3, 1)))
    b = (np.array([2, 5, 7]), np.zeros((3, 1)))
    with pytest.raises(RuntimeError, match="table 'emb': key 5 was sent by two servers"):
        list(merge_sorted([3, 3], _fetcher([a, b]), 3, name="emb"))
    c = (np.array([4, 2, 7]), np.zeros((3, 1)))
    with pytest.raises(RuntimeError, match="table 'emb': server 1's chunk at 0 is not strictly"):
        list(merge_sorted([3, 3], _fetcher([a, c]), 3, name="emb"))
    d = (np.array([4, 6, 5]), np.zeros((3, 1)))        # ascending chunks of 2, then back
    with pytest.raises(RuntimeError, match="server 0's chunk at 2 does not continue"):
        list(merge_sorted([3], _fetcher([d]), 2, name="emb"))


def test_array_table_checks_its_shapes():
    with pytest.raises(ValueError, match="2 keys for 3 rows"):
        ArrayTable(np.zeros((3, 1)), keys=np.array([1, 2]))
    with pytest.raises(ValueError, match="must be 2-D"):
        ArrayTable(np.zeros(3))
