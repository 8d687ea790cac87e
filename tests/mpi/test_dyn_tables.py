# mpi-ranks: 3 4
"""A dynamic (hash) weights table under BSP trains the model of the single-process reference
(<= 1e-12 relative, float64) and bitwise the model of the same job with a fixed table
(issue 18). Real data (a subset of UCI Adult with hashed crosses), the whole job through
:func:`hpcps.runtime.job.run_job`, half the ranks serve (1 of 3, 2 of 4)."""

import io
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.config import parse_job
from hpcps.runtime.job import run_job
from hpcps.runtime.output import read_model
from tests.mpi.test_bsp_equivalence import JOB, ROWS, reference

DATA = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"


def run(comm, tmp, name, l2, extra=""):
    servers = comm.size // 2
    text = JOB.format(servers=servers, data=DATA, rows=ROWS, l2=l2, out=tmp / name) + extra
    cfg = parse_job(text, tmp / f"{name}.toml")
    out = io.StringIO()
    summary = run_job(cfg, comm, out=out)
    comm.Barrier()
    return cfg, summary, out.getvalue()


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_bsp_with_a_dynamic_table_equals_the_reference_and_the_fixed_table(mpi_tmp_path, l2):
    comm = MPI.COMM_WORLD
    cfg, summary, text = run(comm, mpi_tmp_path, "hash", l2, '[tables.weights]\nstorage = "hash"\n')
    fixed_cfg, _, _ = run(comm, mpi_tmp_path, "fixed", l2)
    if comm.rank != 0:
        return
    model = read_model(cfg.output.dir / "model.h5")
    keys = model["tables"]["weights_keys"]
    w = model["tables"]["weights"][:, 0]
    b = model["tables"]["bias"][0, 0]
    assert keys.size and np.all(np.diff(keys) > 0)          # ascending, distinct
    w_ref, b_ref = reference(cfg, comm.size - comm.size // 2)
    assert np.abs(w_ref).max() > 1e-3                        # the model did move
    np.testing.assert_allclose(w, w_ref[keys], rtol=1e-12, atol=1e-14)
    # every key the reference moved is stored; the others never left zero
    missing = np.setdiff1d(np.flatnonzero(w_ref), keys)
    assert missing.size == 0, missing[:10]
    assert b == pytest.approx(b_ref, rel=1e-12)
    # bitwise the fixed table's rows of the same keys
    fixed = read_model(fixed_cfg.output.dir / "model.h5")["tables"]
    assert np.array_equal(fixed["weights"][keys, 0], w)
    assert np.all(np.delete(fixed["weights"][:, 0], keys) == 0)
    assert fixed["bias"][0, 0] == b
    # the summary counts the keys stored per server; they add up to the model's keys
    stored = [d["keys_stored"]["weights"] for d in summary["servers"]]
    assert sum(stored) == keys.size and all(n > 0 for n in stored), stored
    assert "weights" in text and "keys stored" in text, text


@pytest.mark.mpi(min_size=3)
def test_model_file_streamed_in_small_chunks_equals_the_whole_tables(mpi_tmp_path):
    """model.h5 written chunk by chunk from 2 or 3 servers (3 or 4 ranks, 1 worker) with a
    chunk of ~1 KB — a dynamic table merged from the servers' sorted chunks in ~90 blocks,
    a permuted fixed table in key ranges, a dense one — has exactly the datasets (keys,
    rows, dtypes, shapes, HDF5 chunks, compression, attributes) of the same tables pulled
    whole (``pull_keys_rows``, ``pull_table``: the path before) and written from memory.
    The chief held at most 2 chunks of received rows and keys at once, and received each
    row once."""
    import h5py
    from types import SimpleNamespace

    from hpcps.comm import core
    from hpcps.core.optim import Optimizer
    from hpcps.core.tables import TableSpec
    from hpcps.runtime.output import write_model
    from hpcps.worker.export import model_tables
    from tests.mpi.test_protocol import _ps

    comm = MPI.COMM_WORLD
    tables = [(TableSpec("h", (1 << 63) - 1, 3, "float32", storage="hash"), Optimizer("sgd", 1.0)),
              (TableSpec("w", 10007, 2, "float64", sparse=True), Optimizer("adagrad", 0.5)),
              (TableSpec("b", 5, 1, "float64", sparse=False), Optimizer("sgd", 1.0))]
    cfg = SimpleNamespace(name="stream", text="name = 'stream'\n",
                          data=SimpleNamespace(num_features=10007, index_base=-1))
    path = comm.bcast(mpi_tmp_path if comm.rank == 0 else None)
    chunk = 1000

    def work(client, roles):
        rng = np.random.default_rng(7)
        hkeys = rng.choice(1 << 62, 4000, replace=False).astype(np.int64)
        for step in range(2):
            client.push("h", np.concatenate([hkeys, hkeys[:500]]),
                        rng.standard_normal((4500, 3)).astype(np.float32), n_examples=1)
            client.push("w", rng.integers(0, 10007, 3000), rng.standard_normal((3000, 2)),
                        n_examples=1)
            client.push("b", [0, 3, 3], rng.standard_normal((3, 1)), n_examples=1)
            client.clock(1)
        whole = {"h": client.pull_keys_rows("h"), "w": client.pull_table("w"),
                 "b": client.pull_table("b")}
        write_model(path / "whole.h5", whole, cfg, 2, 1)
        streams = model_tables(client)
        before = client.ep.stats.messages["pull_shard"]
        write_model(path / "model.h5", streams, cfg, 2, 1, chunk_bytes=chunk)
        return whole, streams, client.ep.stats.messages["pull_shard"] - before

    roles, got = _ps(comm, comm.size - 1, tables, work)
    if roles.role != core.WORKER:
        return
    whole, streams, requests = got
    keys, rows = whole["h"]
    assert keys.size == 4000 and np.all(np.diff(keys) > 0)
    with h5py.File(path / "whole.h5", "r") as a, h5py.File(path / "model.h5", "r") as b:
        assert list(a) == list(b) == ["b", "h", "h_keys", "w"]
        assert dict(a.attrs) == dict(b.attrs)
        for name in a:
            x, y = a[name], b[name]
            assert (x.dtype, x.shape, x.chunks, x.compression) == \
                (y.dtype, y.shape, y.chunks, y.compression), name
            assert list(x.attrs.items()) == list(y.attrs.items()), name
            assert np.array_equal(x[()], y[()]), name
        assert np.array_equal(b["h_keys"][()], keys) and np.array_equal(b["h"][()], rows)
    n_servers = comm.size - 1
    for name, s in streams.items():
        table_bytes = s.n_rows * (s.dim * s.dtype.itemsize + (8 if s.dynamic else 0))
        assert s.received == table_bytes, (name, s.received, table_bytes)
        assert 0 < s.held_max <= 2 * chunk, (name, s.held_max)
    assert streams["h"].counts() and len(streams["h"].counts()) == n_servers
    assert all(n > 0 for n in streams["h"].counts())        # a real merge
    # h: 80 KB in 1 KB blocks from every server; w: 160 KB in blocks of 62 keys
    assert requests > 80 * n_servers + 2 * 160_000 // chunk, requests
    print(f"\n{requests} PULL_SHARD requests; held at most "
          f"{ {n: s.held_max for n, s in streams.items()} } B")
