# mpi-ranks: 3 4
"""BSP with N workers equals one process doing minibatch SGD on the concatenated minibatches.

float64 tables, plain SGD, real data (a subset of UCI Adult with hashed crosses); the whole
job runs through :func:`hpcps.runtime.job.run_job` and the final model file is compared with a numpy
reference computed on rank 0 (≤ 1e-12 relative).
"""

import io
import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.config import parse_job
from hpcps.data.source import load_split
from hpcps.runtime.job import run_job
from hpcps.runtime.output import read_model

ROWS = 1500


def tp_compiled() -> bool:
    """Whether the compiled request path is built (:mod:`hpcps.comm.fastpath`)."""
    from hpcps.comm import transport

    return transport._fast is not None

JOB = """
name = "bsp_eq"
seed = 3
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
hash_bits = 12
[model]
dtype = "float64"
l2 = {l2}
[optimizer]
name = "sgd"
learning_rate = 0.5
[train]
epochs = 2
batch_size = 64
[output]
dir = "{out}"
"""


def reference(cfg, n_workers):
    """Single-process minibatch SGD over the concatenation of the workers' batches per step."""
    parts = [load_split(cfg.data, "train", i, n_workers) for i in range(n_workers)]
    B = cfg.train.batch_size
    steps = max(math.ceil(X.shape[0] / B) for X, _ in parts)
    w = np.zeros(cfg.data.num_features)
    b = 0.0
    lr, l2 = cfg.optimizer.learning_rate, cfg.model.l2
    for epoch in range(cfg.train.epochs):
        orders = [np.random.default_rng([cfg.seed, i, epoch]).permutation(X.shape[0])
                  for i, (X, _) in enumerate(parts)]
        for s in range(steps):
            gw = np.zeros_like(w)
            touched = np.zeros(w.size, dtype=bool)
            gb, n = 0.0, 0
            for (X, y), order in zip(parts, orders):
                rows = order[s * B:(s + 1) * B]
                if not rows.size:
                    continue
                Xb, yb = X[rows], y[rows]
                p = 1.0 / (1.0 + np.exp(-(Xb @ w + b)))
                gw += Xb.T @ (p - yb)
                gb += float(np.sum(p - yb))
                touched[Xb.indices] = True
                n += rows.size
            gw = gw / n
            gw[touched] += l2 * w[touched]
            w -= lr * gw
            b -= lr * gb / n
    return w, b


def _run(mpi_tmp_path, name, l2, batch, rows, extra=""):
    """Run the job on every rank; rank 0 gets ``(cfg, summary, weights, bias)``."""
    from pathlib import Path

    comm = MPI.COMM_WORLD
    data = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"
    servers = comm.size // 2                    # any size: half the ranks serve (1 of 3, 2 of 4)
    text = JOB.format(servers=servers, data=data, rows=rows, l2=l2, out=mpi_tmp_path / name)
    text = text.replace("batch_size = 64", f"batch_size = {batch}") + extra
    cfg = parse_job(text, mpi_tmp_path / f"{name}.toml")
    summary = run_job(cfg, comm, out=open("/dev/null", "w"))
    comm.Barrier()
    if comm.rank != 0:
        return cfg, None, None, None
    model = read_model(cfg.output.dir / "model.h5")
    return cfg, summary, model["tables"]["weights"][:, 0], model["tables"]["bias"][0, 0]


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("l2, max_bytes", [(0.0, None), (0.01, None), (0.01, 2048)])
def test_bsp_equals_minibatch_sgd_on_concatenation(mpi_tmp_path, l2, max_bytes):
    """Batches of 64: each step's request to a server (~10 KB) is one message, taken in by the
    server's compiled loop; with ``max_message_bytes = 2048`` it is several messages (the
    general path, not the compiled loop)."""
    comm = MPI.COMM_WORLD
    extra = f"[comm]\nmax_message_bytes = {max_bytes}\n" if max_bytes else ""
    cfg, summary, w, b = _run(mpi_tmp_path, "run", l2, 64, ROWS, extra)
    if comm.rank == 0:
        workers, steps = comm.size - comm.size // 2, summary["steps"]
        compiled = 0 if max_bytes or not tp_compiled() else workers * (steps - cfg.train.epochs)
        assert [s["requests_compiled"] for s in summary["servers"]] == (
            [compiled] * (comm.size // 2))
        w_ref, b_ref = reference(cfg, comm.size - comm.size // 2)
        assert np.abs(w_ref).max() > 1e-3                    # the model did move
        np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
        assert b == pytest.approx(b_ref, rel=1e-12)


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(not tp_compiled(), reason="hpcps.comm.fastpath not built")
def test_compiled_step_loop_is_bit_identical_to_the_general_path(mpi_tmp_path, monkeypatch):
    """Batches of 1: each step's request to a server is one message, taken in by the server's
    compiled loop (``ServerEndpoint.take_steps``, counted in the run summary); the same job
    with that loop turned off trains bit-identical weights, and both are the reference's
    (480 small steps: rounding of the reference's other summation order reaches ~1e-11)."""
    from hpcps.comm import transport

    comm = MPI.COMM_WORLD
    cfg, summary, w, b = _run(mpi_tmp_path, "compiled", 0.01, 1, ROWS // 5)
    monkeypatch.setattr(transport.ServerEndpoint, "steps_compiled", property(lambda self: False))
    _, summary_off, w_off, b_off = _run(mpi_tmp_path, "general", 0.01, 1, ROWS // 5)
    if comm.rank == 0:
        workers, steps = comm.size - comm.size // 2, summary["steps"]
        # every fused step (all but each epoch's last, sent as a PUSH_CLOCK) on every server
        assert [s["requests_compiled"] for s in summary["servers"]] == (
            [workers * (steps - cfg.train.epochs)] * (comm.size // 2))
        assert [s["requests_compiled"] for s in summary_off["servers"]] == [0] * (comm.size // 2)
        np.testing.assert_array_equal(w, w_off)
        assert b == b_off
        w_ref, b_ref = reference(cfg, workers)
        assert np.abs(w_ref).max() > 1e-3
        np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-14)
        assert b == pytest.approx(b_ref, rel=1e-9)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_allreduce_mode_equals_minibatch_sgd_on_concatenation(mpi_tmp_path, l2):
    """``[cluster] mode = "allreduce"`` on N ranks = N BSP workers = the same reference, so the
    two architectures train the same model from the same job file."""
    from pathlib import Path

    comm = MPI.COMM_WORLD
    data = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"
    text = JOB.format(servers=1, data=data, rows=ROWS, l2=l2, out=mpi_tmp_path / "ar")
    text = text.replace("servers = 1", 'mode = "allreduce"')
    cfg = parse_job(text, mpi_tmp_path / "job.toml")
    out = io.StringIO()
    summary = run_job(cfg, comm, out=out)
    comm.Barrier()
    if comm.rank == 0:
        assert summary["mode"] == "allreduce" and summary["servers"] == []
        # the banner names the mode, not a pull mode it does not have (issue 22, item 10)
        assert "AllReduce of the gradients (BSP by construction)" in out.getvalue()
        assert "allreduce pulls" not in out.getvalue()
        assert all(w["bytes_in"] > 0 for w in summary["workers"])
        model = read_model(cfg.output.dir / "model.h5")
        w_ref, b_ref = reference(cfg, comm.size)
        w = model["tables"]["weights"][:, 0]
        b = model["tables"]["bias"][0, 0]
        assert np.abs(w_ref).max() > 1e-3
        np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
        assert b == pytest.approx(b_ref, rel=1e-12)


@pytest.mark.mpi(min_size=3)
def test_rma_pulls_equal_the_reference_and_the_report_counts_the_keys_read(mpi_tmp_path):
    """BSP with RMA pulls trains the same model; the summary does not print the servers'
    pull key count (0: the workers read the windows) but the keys the workers read
    (issue 22, item 10: ``pulled out 4.2 MB (0 keys)``)."""
    from pathlib import Path

    comm = MPI.COMM_WORLD
    data = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"
    text = JOB.format(servers=1, data=data, rows=ROWS, l2=0.0, out=mpi_tmp_path / "rma")
    text += '[consistency]\npull = "rma"\n'
    cfg = parse_job(text, mpi_tmp_path / "job.toml")
    out = io.StringIO()
    summary = run_job(cfg, comm, out=out)
    comm.Barrier()
    if comm.rank == 0:
        text = out.getvalue()
        assert summary["consistency"]["pull"] == "rma", text
        read = sum(w["keys_pulled"] for w in summary["workers"])
        assert read > 0 and summary["servers"][0]["keys_pulled"] == 0
        assert "(0 keys)" not in text, text
        assert f"workers: read {read:,} keys (" in text, text
        model = read_model(cfg.output.dir / "model.h5")
        w_ref, _ = reference(cfg, comm.size - 1)
        np.testing.assert_allclose(model["tables"]["weights"][:, 0], w_ref, rtol=1e-12,
                                   atol=1e-14)
