"""Dynamic tables above the kernel: routing (core.dyntables), shards built from a TableSpec
and an Optimizer, and checkpoints re-distributed to another number of servers
(checkpoint.dynamic) — with real HDF5 files."""

import h5py
import numpy as np
import pytest

from hpcps.checkpoint.dynamic import is_dynamic, restore, write_group
from hpcps.core.dyntables import HashPartition, bytes_per_key, new_shard
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec

I64 = np.iinfo(np.int64)


def _pushes(rng, n_pushes=6, n=400):
    pool = np.concatenate([[0, 1, -1, I64.max, I64.min, 1_099_511_627_000],
                           rng.integers(I64.min, I64.max, size=2000, dtype=np.int64)])
    return [(pool[rng.integers(0, pool.size, size=n)], rng.standard_normal((n, 2)))
            for _ in range(n_pushes)]


def _train(spec, opt, n_servers, pushes, shards=None):
    """Route every push by HashPartition and apply each server's part to its shard."""
    part = HashPartition(n_servers)
    shards = shards or [new_shard(spec, opt, seed=3) for _ in range(n_servers)]
    for keys, g in pushes:
        order, bounds = part.split(keys)
        for s in range(n_servers):
            sel = order[bounds[s]:bounds[s + 1]]
            shards[s].apply(keys[sel], g[sel], 1.0 / 32)
    return shards


def _all(shards):
    """{key: (weights, slots...)} over every shard (each key on exactly one shard)."""
    out = {}
    for t in shards:
        slots = t.slots()
        for i, k in enumerate(t.keys().tolist()):
            assert k not in out
            out[k] = (t.weights()[i].tobytes(), *(a[i].tobytes() for a in slots.values()))
    return out


def test_route_and_split_agree_with_server_of():
    rng = np.random.default_rng(0)
    keys = rng.integers(I64.min, I64.max, size=5000, dtype=np.int64)
    p = HashPartition(3)
    srv, counts, grouped = p.route(keys)
    np.testing.assert_array_equal(srv, p.server_of(keys))
    np.testing.assert_array_equal(counts, np.bincount(srv, minlength=3))
    assert not grouped
    order, bounds = p.split(keys)
    for s in range(3):
        assert np.all(p.server_of(keys[order[bounds[s]:bounds[s + 1]]]) == s)
    assert HashPartition(1).route(keys)[0] is None
    with pytest.raises(ValueError, match="n_servers"):
        HashPartition(0)


@pytest.mark.parametrize("rule", ["adagrad", "ftrl", "adam"])
def test_sharded_dynamic_table_equals_one_fixed_table(rule):
    """Pushes routed over 3 dynamic shards give, key for key, bitwise the weights of one
    fixed table updated by Optimizer.apply (the server's call) with the same pushes, from
    the same per-key random initial values (TableSpec.initial_rows)."""
    rng = np.random.default_rng(1)
    spec = TableSpec("w", num_keys=2, dim=2, dtype="float64", init_std=0.05)
    opt = Optimizer(rule, 0.3, l2=1e-3, initial_accumulator=0.1, lambda1=0.01, lambda2=0.1)
    pushes = _pushes(rng)
    shards = _train(spec, opt, 3, pushes)
    keys = np.unique(np.concatenate([k for k, _ in pushes]))
    pos = {int(k): i for i, k in enumerate(keys)}
    w = spec.initial_rows(keys, 3)
    slots = opt.init_slots(w.shape, w.dtype, w=w)
    for k, g in pushes:
        opt.apply(w, slots, np.array([pos[int(x)] for x in k]), g, 1.0 / 32)
    for s, t in enumerate(shards):
        mine = HashPartition(3).server_of(keys) == s
        np.testing.assert_array_equal(t.gather(keys[mine]), w[mine])
        assert len(t) == mine.sum()                  # only the keys it owns were stored
    # a key never pushed: every shard answers the initial value without storing it
    fresh = np.array([123456789012345], dtype=np.int64)
    np.testing.assert_array_equal(shards[0].gather(fresh), spec.initial_rows(fresh, 3))
    assert shards[0].lookup(fresh)[0] == -1


@pytest.mark.parametrize("new_n", [2, 4, 3])
def test_checkpoint_restores_on_another_number_of_servers(tmp_path, new_n, monkeypatch):
    """3 shards written to 3 HDF5 files, restored on 2, 4 and 3 servers: every key with its
    weights and state bit-identical, on the server HashPartition(new_n) gives it; training
    on continues bit-identically to the run that never stopped. The shards are read in
    blocks (READ_ROWS; a trial: whole shards raised a restoring server's peak memory by
    ~40 %), sized by owned_count, and the update counts restore_state reads follow the keys
    loaded, block by block."""
    import hpcps.checkpoint.dynamic as dyn

    monkeypatch.setattr(dyn, "READ_ROWS", 7)
    rng = np.random.default_rng(2)
    spec = TableSpec("emb", num_keys=2, dim=2, dtype="float64", init_std=0.1)
    opt = Optimizer("ftrl", 0.2, lambda1=0.01)
    pushes = _pushes(rng, n_pushes=8)
    old = _train(spec, opt, 3, pushes[:4])
    files = []
    for s, t in enumerate(old):
        path = tmp_path / f"shard-{s:04d}.h5"
        with h5py.File(path, "w") as f:
            g = f.create_group("tables/emb")
            write_group(g, t)
            dyn.write_state(g, {"updates": t.keys() % 1000})   # a count that names its key
        files.append(path)
    before = _all(old)
    new = [new_shard(spec, opt, seed=3,
                     capacity=dyn.owned_count(files, "emb", s, new_n)) for s in range(new_n)]
    loaded = [restore(t, files, "emb", s, new_n) for s, t in enumerate(new)]
    assert loaded == [dyn.owned_count(files, "emb", s, new_n) for s in range(new_n)]
    assert sum(loaded) == len(before)
    assert _all(new) == before
    for s, t in enumerate(new):
        assert np.all(HashPartition(new_n).server_of(t.keys()) == s)
        ups = dyn.restore_state(files, "emb", s, new_n)["updates"]
        assert np.array_equal(ups, t.keys() % 1000)
    _train(spec, opt, 3, pushes[4:], shards=old)
    _train(spec, opt, new_n, pushes[4:], shards=new)
    assert _all(new) == _all(old)


def test_restore_refuses_fixed_table_and_mismatches(tmp_path):
    path = tmp_path / "shard-0000.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("tables/w")             # a fixed table's group has no storage
        g.create_dataset("rows", data=np.zeros((4, 1)))
        g.create_dataset("keys", data=np.arange(4))
        assert not is_dynamic(g)
    spec = TableSpec("w", num_keys=2, dim=1, dtype="float64")
    t = new_shard(spec, Optimizer("sgd", 0.1), seed=0)
    with pytest.raises(ValueError, match="'w' was checkpointed as a fixed table"):
        restore(t, [path], "w", 0, 1)
    t.apply([5], np.ones((1, 1)))
    path2 = tmp_path / "shard-0001.h5"
    with h5py.File(path2, "w") as f:
        write_group(f.create_group("tables/w"), t)
    other = new_shard(spec, Optimizer("adagrad", 0.1), seed=0)
    with pytest.raises(ValueError, match="optimizer sgd in the checkpoint"):
        restore(other, [path2], "w", 0, 1)
    with pytest.raises(ValueError, match="no group tables/b"):
        restore(new_shard(spec, Optimizer("sgd", 0.1), seed=0), [path2], "b", 0, 1)


def test_bytes_per_key_figures():
    b = bytes_per_key("adagrad", 1, "float32")
    assert b["minimum"] == 16 and b["record"] == 8
    # 64-byte buckets of 5 slots, load 0.6 .. 0.75
    assert b["low"] == pytest.approx(8 + 12.8 / 0.75) and b["high"] == pytest.approx(8 + 12.8 / 0.6)
    assert b["high"] <= 2 * b["minimum"]


@pytest.mark.parametrize("rule", ["adam", "ftrl", "sgd"])
def test_checkpoint_group_written_in_blocks_equals_the_whole_arrays(tmp_path, monkeypatch, rule):
    """write_group writes rows and optimizer state from the arena in blocks (a whole copy of
    each raised a server's peak memory at every checkpoint): blocks of 3 rows of 10 give the
    arrays weights() and slots() return, with their dtypes and shapes (adam's step (n,))."""
    import hpcps.checkpoint.dynamic as dyn

    monkeypatch.setattr(dyn, "WRITE_ROWS", 3)
    spec = TableSpec("w", num_keys=2, dim=2, dtype="float32", init_std=0.1)
    t = new_shard(spec, Optimizer(rule, 0.1), seed=0)
    t.apply(np.arange(10, dtype=np.int64) * 7919, np.ones((10, 2), np.float32))
    with h5py.File(tmp_path / "s.h5", "w") as f:
        dyn.write_group(f.create_group("tables/w"), t)
    with h5py.File(tmp_path / "s.h5", "r") as f:
        g = f["tables/w"]
        assert np.array_equal(g["keys"][()], t.keys())
        w = g["rows"][()]
        assert w.dtype == np.float32 and np.array_equal(w, t.weights())
        for name, a in t.slots().items():
            got = g[f"slots/{name}"][()]
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), name


def test_inspect_figures_of_a_dynamic_table_read_shard_by_shard(tmp_path):
    """hpcps inspect read a dynamic table whole and sorted by key (2.1 GB for a 1 GB
    checkpoint at 32.7 M keys, a trial); read shard by shard in blocks, its figures are those
    of the whole table: stats of rows and slots, keys per shard, the ten most-updated keys
    (ties: smaller key first; never-updated rows left out)."""
    from hpcps.analysis.inspection import _dynamic_stats
    from hpcps.analysis.sources import array_stats, read_dynamic
    from hpcps.checkpoint.dynamic import write_state

    rng = np.random.default_rng(5)
    spec = TableSpec("w", num_keys=2, dim=2, dtype="float32", init_std=0.1)
    files = []
    for s, n in enumerate((40, 0, 25)):
        t = new_shard(spec, Optimizer("adagrad", 0.1), seed=s)
        keys = rng.choice(1 << 40, size=n, replace=False).astype(np.int64) * 3 + s
        if n:
            t.apply(keys, rng.standard_normal((n, 2)).astype(np.float32))
        ups = rng.integers(0, 4, size=n).astype(np.uint32)     # many ties, some zeros
        with h5py.File(tmp_path / f"shard-{s}.h5", "w") as f:
            g = f.create_group("tables/w")
            write_group(g, t)
            write_state(g, {"updates": ups})
        files.append(f"shard-{s}.h5")
    man = {"shards": {"files": files}}
    got = _dynamic_stats(tmp_path, man, "w")
    d = read_dynamic(tmp_path, man, "w")
    want = [[int(d["keys"][i]), int(d["updates"][i])]
            for i in np.argsort(-d["updates"].astype(np.int64), kind="stable")[:10]
            if d["updates"][i] > 0]
    assert got["hot_keys"] == want and len(want) == 10
    assert got["server_rows"] == [40, 0, 25] and got["keys_stored"] == 65
    whole = array_stats(d["rows"])
    for k in ("shape", "size", "nonzeros", "nonfinite", "min", "max"):
        assert got[k] == whole[k], k
    assert np.isclose(got["l2"], whole["l2"]) and np.isclose(got["mean"], whole["mean"])
    assert got["slots"]["accumulator"]["shape"] == (65, 2)


def _dyn_checkpoint(directory, rng, key_sets, spec):
    """A checkpoint-like directory of dynamic table ``w``: one shard file per key set (rows
    written by :func:`write_group` after AdaGrad steps on those keys), an empty manifest file
    and the :class:`~hpcps.analysis.sources.Source` of it."""
    from hpcps.analysis.sources import Source

    directory.mkdir()
    files = []
    for s, keys in enumerate(key_sets):
        t = new_shard(spec, Optimizer("adagrad", 0.1), seed=s)
        if keys.size:
            t.apply(keys, rng.standard_normal((keys.size, spec.dim)).astype(np.float32))
        with h5py.File(directory / f"shard-{s}.h5", "w") as f:
            write_group(f.create_group("tables/w"), t)
        files.append(f"shard-{s}.h5")
    h5py.File(directory / "manifest.h5", "w").close()
    return Source("checkpoint", directory, {"shards": {"files": files},
                                            "partition": {"w": {"storage": "hash"}}})


def test_diff_of_dynamic_checkpoints_by_key_in_blocks(tmp_path, monkeypatch):
    """hpcps diff read every array of both sources whole (3 GB at 30 M keys, a trial): it
    now reads one array at a time, merges the sorted keys and compares in blocks; the
    figures equal those of the whole tables aligned by key (read_dynamic), rows and slots,
    also against a model file whose keys are not in order; a key stored twice is named."""
    from hpcps.analysis import diff as D
    from hpcps.analysis.sources import AnalysisError, read_dynamic

    monkeypatch.setattr(D, "BLOCK", 7)                    # many blocks, one partial
    rng = np.random.default_rng(11)
    spec = TableSpec("w", num_keys=2, dim=2, dtype="float32", init_std=0.1)
    pool = rng.choice(1 << 50, size=120, replace=False).astype(np.int64)
    a = _dyn_checkpoint(tmp_path / "a", rng, [pool[:40], pool[40:40], pool[40:90]], spec)
    b = _dyn_checkpoint(tmp_path / "b", rng, [pool[70:120], pool[20:70]], spec)
    da, db = (read_dynamic(s.path, s.meta, "w") for s in (a, b))
    common, ia, ib = np.intersect1d(da["keys"], db["keys"], return_indices=True)
    rows = {r["name"]: r for r in D.diff(a, b)["rows"]}
    assert sorted(rows) == ["w", "w__accumulator"]
    for name, x, y in (("w", da["rows"], db["rows"]),
                       ("w__accumulator", da["slots"]["accumulator"], db["slots"]["accumulator"])):
        d = np.abs(x[ia].astype(np.float64) - y[ib])
        r = rows[name]
        assert (r["keys_common"], r["only_a"], r["only_b"]) == (70, 20, 30), r
        assert r["size"] == d.size == 140 and r["differing"] == np.count_nonzero(d) > 0
        assert r["max_abs"] == d.max() and np.isclose(r["mean_abs"], d.mean(), rtol=1e-12)
    # a model file of B's table, keys in no order: the same figures for the weights
    perm = rng.permutation(db["keys"].size)
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f.attrs["job_name"], f.attrs["config"] = "dyn", ""
        f["w_keys"], f["w"] = db["keys"][perm], db["rows"][perm]
    got = {r["name"]: r for r in D.diff(a, tmp_path / "m.h5")["rows"]}
    assert {k: got["w"][k] for k in ("max_abs", "differing", "keys_common")} == \
        {k: rows["w"][k] for k in ("max_abs", "differing", "keys_common")}
    assert got["w__accumulator"]["status"] == "only in A"
    bad = _dyn_checkpoint(tmp_path / "bad", rng, [pool[:10], pool[5:12]], spec)
    with pytest.raises(AnalysisError, match=f"key {int(pool[5:10].min())} is stored twice"):
        D.diff(bad, a)


@pytest.mark.parametrize("new_n", [1, 2, 3, 4])
def test_restore_hashes_each_key_once_and_equals_the_separate_passes(tmp_path, new_n,
                                                                     monkeypatch):
    """A server's restore (DynamicShard.create) read and hashed every old shard's keys three
    times (owned_count, restore, restore_state): find_owned hashes each key once and
    restore_all reads each block of owned keys once for rows, slots, update counts and last
    clocks. In blocks of 7 keys, on 1 to 4 servers from 3: the table (records and index
    size) and the state equal those of the separate passes bit for bit, int64 counts of an
    older checkpoint saturated to uint32 as DynamicShard did them; the shard restored by
    DynamicShard.create (TTL, admission) holds them."""
    import hpcps.checkpoint.dynamic as dyn
    from hpcps.server.dynshard import DynamicShard, _saturated

    monkeypatch.setattr(dyn, "READ_ROWS", 7)
    rng = np.random.default_rng(4)
    spec = TableSpec("emb", num_keys=2, dim=2, dtype="float64", init_std=0.1)
    opt = Optimizer("adagrad", 0.2)
    old = _train(spec, opt, 3, _pushes(rng, n_pushes=4))
    files = []
    for s, t in enumerate(old):
        path = tmp_path / f"shard-{s:04d}.h5"
        with h5py.File(path, "w") as f:
            f.attrs["server"], f.attrs["n_servers"] = s, 3
            g = f.create_group("tables/emb")
            write_group(g, t)
            ups = t.keys() % 1000 + (s == 1) * (1 << 33)        # int64, some beyond uint32
            dyn.write_state(g, {"updates": ups, "last_clock": t.keys() % 97 + 5,
                                "sketch": rng.integers(0, 9, (4, 1 << 18)), "sketch_total": 40 + s,
                                "admitted": 7 * s, "rejected": s, "evicted": 2})
            del g["updates"]
            g.create_dataset("updates", data=ups.astype(np.int64))
        files.append(path)
    hashed = []
    owned_of = dyn.HashPartition.owned
    monkeypatch.setattr(dyn.HashPartition, "owned",
                        lambda self, k, s: hashed.append(len(k)) or owned_of(self, k, s))
    n_old = sum(len(t) for t in old)
    for s in range(new_n):
        ref = new_shard(spec, opt, seed=3, capacity=dyn.owned_count(files, "emb", s, new_n))
        assert restore(ref, files, "emb", s, new_n) == len(ref)
        want = dyn.restore_state(files, "emb", s, new_n)
        hashed.clear()
        owned = dyn.find_owned(files, "emb", s, new_n)
        assert sum(hashed) == n_old and owned.count == len(ref)       # each key hashed once
        t = new_shard(spec, opt, seed=3, capacity=owned.count)
        loaded, got = dyn.restore_all(t, files, "emb", owned)
        assert sum(hashed) == n_old and loaded == len(ref)            # and not again
        assert np.array_equal(t.keys(), ref.keys()) and t.index_slots == ref.index_slots
        assert t._records(0, len(t)).tobytes() == ref._records(0, len(ref)).tobytes()
        assert got["updates"].dtype == np.uint32
        assert np.array_equal(got["updates"], _saturated(want["updates"]))
        assert np.array_equal(got["last_clock"], want["last_clock"])
        assert np.array_equal(got["sketch"], want["sketch"])
        assert {k: got[k] for k in ("sketch_total", "admitted", "rejected", "evicted")} == \
            {k: want[k] for k in ("sketch_total", "admitted", "rejected", "evicted")}
        dspec = TableSpec("emb", (1 << 63) - 1, 2, "float64", storage="hash", init_std=0.1,
                          ttl_steps=50, min_count=2)
        man = {"shards": {"files": [f.name for f in files]}, "step": 9}
        sh = DynamicShard.create(dspec, opt, s, new_n, 3, 8, restore=(tmp_path, man))
        assert sh.table._records(0, len(ref)).tobytes() == ref._records(0, len(ref)).tobytes()
        assert np.array_equal(sh.updates, got["updates"])
        assert np.array_equal(sh.last_clock, want["last_clock"])
        assert (sh.admitted, sh.rejected, sh.evicted) == (want["admitted"], want["rejected"],
                                                          want["evicted"])
        assert np.array_equal(sh.admission.counts, want["sketch"])
        assert sh.admission.total == want["sketch_total"]
    other = dyn.find_owned(files[:2], "emb", 0, new_n)
    with pytest.raises(ValueError, match="not those found owned"):
        dyn.restore_all(new_shard(spec, opt, seed=3), files, "emb", other)
