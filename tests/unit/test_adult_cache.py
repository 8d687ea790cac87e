"""The on-disk cache of featurized Adult splits (hpcps.data.featcache, used by
load_adult_partition): the same arrays, bit for bit, with or without it; damaged entries
ignored and rewritten; keyed by the file's bytes; disabled by HPCPS_CACHE_DIR=off; a hit
imports no scikit-learn. Real files, real subprocesses."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from hpcps.data import featcache
from hpcps.data.adult import load_adult_partition
from hpcps.runtime.baseline import cached_baseline
from tests.unit.test_adult import ADULT, ROOT


@pytest.fixture(scope="module")
def csv600(tmp_path_factory):
    """The first 600 data rows of the shipped file, as a plain CSV."""
    with gzip.open(ADULT, "rt", newline="") as f:
        lines = [next(f) for _ in range(601)]
    path = tmp_path_factory.mktemp("adultc") / "adult600.csv"
    path.write_text("".join(lines), newline="")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("HPCPS_CACHE_DIR", str(d))
    return d


def entries(d):
    return sorted((d / "adult").glob("*.npz")) if (d / "adult").is_dir() else []


def uncached(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setenv("HPCPS_CACHE_DIR", "off")
        return load_adult_partition(*args, **kw)


def assert_identical(got, want):
    (X, y), (Xw, yw) = got, want
    assert isinstance(X, sp.csr_matrix) and X.shape == Xw.shape
    for a, b in ((X.data, Xw.data), (X.indices, Xw.indices), (X.indptr, Xw.indptr), (y, yw)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert X.has_sorted_indices and X.has_canonical_format


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("bits", [12, 0])
def test_hit_and_miss_are_bit_identical_to_no_cache(csv600, cache, monkeypatch, split, bits):
    kw = dict(hash_bits=bits)
    for n_parts in (1, 3, 7):
        want = [uncached(monkeypatch, csv600, split, k, n_parts, **kw) for k in range(n_parts)]
        got = [load_adult_partition(csv600, split, k, n_parts, **kw) for k in range(n_parts)]
        for g, w in zip(got, want):
            assert_identical(g, w)
    (entry,) = entries(cache)                # one entry per split and setting, whatever the parts
    assert not [p for p in entry.parent.iterdir() if p.suffix == ".tmp"]
    ino = entry.stat().st_ino
    again = load_adult_partition(csv600, split, 2, 3, **kw)
    assert entry.stat().st_ino == ino        # a hit: not rewritten
    assert_identical(again, uncached(monkeypatch, csv600, split, 2, 3, **kw))
    if bits:
        assert again[0].indices.dtype == np.int32
    else:
        assert again[0].indices.dtype == np.int64 and again[0].indices.max() > 2**40


def test_entry_per_setting(csv600, cache):
    load_adult_partition(csv600, "train", 0, 2, hash_bits=12)
    load_adult_partition(csv600, "test", 0, 2, hash_bits=12)
    load_adult_partition(csv600, "train", 0, 2, hash_bits=13)
    load_adult_partition(csv600, "train", 0, 2, hash_bits=12, max_rows=500)
    load_adult_partition(csv600, "train", 0, 2, hash_bits=12, split_seed=1)
    load_adult_partition(csv600, "train", 0, 2, hash_bits=12, crosses=False)
    load_adult_partition(csv600, "train", 1, 2, hash_bits=12)          # the same entry
    assert len(entries(cache)) == 6


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "tampered"])
def test_damaged_entry_is_ignored_and_replaced(csv600, cache, monkeypatch, damage):
    want = uncached(monkeypatch, csv600, "train", 1, 3, hash_bits=12)
    load_adult_partition(csv600, "train", 0, 3, hash_bits=12)
    (entry,) = entries(cache)
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"PK\x03\x04" + os.urandom(1000))
    elif damage == "empty":
        entry.write_bytes(b"")
    else:                                    # a valid .npz whose indices are out of range
        with np.load(entry) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["indices"] = arrays["indices"] + np.int32(1 << 12)
        with open(entry, "wb") as f:
            np.savez_compressed(f, **arrays)
    ino = entry.stat().st_ino
    assert_identical(load_adult_partition(csv600, "train", 1, 3, hash_bits=12), want)
    assert entry.stat().st_ino != ino        # rewritten ...
    assert entry.read_bytes() == raw         # ... as it was
    assert len(entries(cache)) == 1


def test_load_csr_checks(tmp_path):
    """Each inconsistency makes load_csr return None (then the caller featurizes)."""
    X = sp.csr_matrix(np.array([[0, 1.0, 0, 2.0], [1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 3.0, 0]]))
    y = np.array([1.0, 0.0, 0.0, 1.0])
    path = tmp_path / "e.npz"
    assert featcache.save_csr(path, "k1", X, y)
    indptr, indices, data, yy = featcache.load_csr(path, "k1", 4)
    assert indptr.dtype == np.int32 and data.dtype == np.float64
    np.testing.assert_array_equal(data, X.data)
    np.testing.assert_array_equal(yy, y)
    assert featcache.load_csr(path, "k2", 4) is None                  # another key
    assert featcache.load_csr(path, "k1", 5) is None                  # another width
    assert featcache.load_csr(path, "k1", 4, row_sum=3.0) is None     # row sums 3, 1, 0, 3
    assert featcache.load_csr(tmp_path / "missing.npz", "k1", 4) is None
    with np.load(path) as z:
        good = {k: z[k] for k in z.files}

    def bad(**change):
        arrays = dict(good, **change)
        arrays = {k: v for k, v in arrays.items() if v is not None}
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return featcache.load_csr(path, "k1", 4) is None

    assert not bad()
    assert bad(indptr=np.array([0, 2, 1, 1, 4], np.int32))            # decreasing
    assert bad(indptr=np.array([0, 2, 3, 3, 5], np.int32))            # does not end at nnz
    assert bad(indptr=np.array([1, 2, 3, 3, 4], np.int32))            # does not start at 0
    assert bad(indptr=good["indptr"][:-1])                            # wrong length
    assert bad(indices=np.array([3, 1, 0, 2], np.int32))              # unsorted within a row
    assert bad(indices=np.array([1, 1, 0, 2], np.int32))              # repeated within a row
    assert bad(indices=np.array([1, 3, 0, -1], np.int32))             # negative
    assert bad(indices=good["indices"].astype(np.float64))            # dtype
    assert bad(data=np.array([1, 2, 0, 3], np.uint8))                 # a zero value
    assert bad(data=np.array([1, 2, 1], np.uint8))                    # wrong length
    assert bad(y=np.array([1.0, 0.5, 0.0, 1.0]))                      # not a label
    assert bad(y=good["y"].astype(np.float32))
    assert bad(shape=np.array([4, 4, 1]))
    assert bad(extra=np.zeros(1))                                     # unknown array
    assert bad(key=None)                                              # missing array
    arrays = dict(good, data=np.array(["x"], dtype=object))
    with open(path, "wb") as f:
        np.savez(f, **arrays)                                         # pickled: not loaded
    assert featcache.load_csr(path, "k1", 4) is None


def test_changed_file_bytes_change_the_key(csv600, cache, tmp_path, monkeypatch):
    copy = tmp_path / "copy.csv"
    copy.write_bytes(csv600.read_bytes())
    first = load_adult_partition(csv600, "train", 0, 2, hash_bits=12)
    assert_identical(load_adult_partition(copy, "train", 0, 2, hash_bits=12), first)
    assert len(entries(cache)) == 1          # same bytes, other path: the same entry
    text = copy.read_text()
    flipped = text.replace("<=50K", "@", 1).replace(">50K", "<=50K", 1).replace("@", ">50K", 1)
    assert flipped != text
    copy.write_text(flipped)                 # same size, one label less or more
    changed = load_adult_partition(copy, "train", 0, 2, hash_bits=12)
    assert len(entries(cache)) == 2
    assert not np.array_equal(changed[1], first[1])
    assert_identical(changed, uncached(monkeypatch, copy, "train", 0, 2, hash_bits=12))


@pytest.mark.parametrize("value", ["off", "", "OFF"])
def test_disabled_cache_writes_nothing(csv600, tmp_path, monkeypatch, value):
    monkeypatch.setenv("HPCPS_CACHE_DIR", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert featcache.cache_root() is None
    load_adult_partition(csv600, "test", 0, 2, hash_bits=12)
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()
    # the baseline cache obeys it too: fitted every time
    calls = []
    from hpcps.config import load_job
    from tests.helpers import write_job
    cfg = load_job(write_job(tmp_path / "j.toml", f'name = "j"\n[data]\nformat = "adult_csv"\n'
                             f'path = "{csv600}"\n[output]\ndir = "{tmp_path / "out"}"\n'))
    for _ in range(2):
        got = cached_baseline(cfg, lambda c: calls.append(1) or {"test_auc": 0.5})
        assert got["cached"] is False
    assert len(calls) == 2 and not (tmp_path / "xdg").exists()


def test_cache_root_locations(tmp_path):
    assert featcache.cache_root({"HPCPS_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert featcache.cache_root({"XDG_CACHE_HOME": "/x"}) == featcache.Path("/x/hpcps")
    home = featcache.Path.home()
    assert featcache.cache_root({}) == home / ".cache" / "hpcps"


def test_unusable_directory_means_no_cache(csv600, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("HPCPS_CACHE_DIR", str(blocker / "cache"))
    want = uncached(monkeypatch, csv600, "train", 0, 2, hash_bits=12)
    assert_identical(load_adult_partition(csv600, "train", 0, 2, hash_bits=12), want)
    assert blocker.read_text() == "not a directory"


def _run(code, env, *args):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()


LOAD = (
    "import sys, hashlib\n"
    "from hpcps.data.adult import load_adult_partition\n"
    "X, y = load_adult_partition(sys.argv[1], sys.argv[2], 0, 2, hash_bits=12)\n"
    "print(hashlib.sha256(X.indices.tobytes() + X.indptr.tobytes() + X.data.tobytes()"
    " + y.tobytes()).hexdigest(), 'sklearn' in sys.modules)\n"
)


def test_a_hit_imports_no_sklearn(csv600, cache):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    miss = _run(LOAD, env, csv600, "test").split()
    hit = _run(LOAD, env, csv600, "test").split()
    assert miss[1] == "True"                 # featurizing uses FeatureHasher
    assert hit == [miss[0], "False"]
    assert len(entries(cache)) == 1


def test_concurrent_misses_make_one_entry(csv600, cache):
    """Three processes start on a cold cache at once: the same arrays, one entry, no
    temporary files left."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, str(csv600), "train"], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].split()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    assert len(entries(cache)) == 1
    assert [p.suffix for p in (cache / "adult").iterdir()].count(".tmp") == 0
