# mpi-ranks: 4 5
"""Consistency models end to end through :func:`hpcps.runtime.job.run_job` on real data (UCI Adult).

* SSP with s = 0, and BSP/SSP(0) with RMA pulls, give bit-identical float64 models to BSP
  with p2p pulls;
* a worker slowed down by a test hook: under SSP(2) no worker reads parameters more than 2
  clocks old or runs more than s + 1 clocks ahead of it, and the applied staleness is <= 2;
  under async the fast workers do run ahead and the staleness shows it;
* async Downpour with every rank but one a worker reaches the AUC of BSP within 0.01.

Size-agnostic: run at 4 and 5 ranks (``# mpi-ranks`` above, read by tests/run.py).
"""

import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.config import parse_job
from hpcps.runtime.job import run_job
from hpcps.core.signals import StopRequest
from hpcps.runtime.output import read_model

DATA = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"
JOB = """
name = "cons"
seed = 5
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
hash_bits = {bits}
[model]
dtype = "{dtype}"
l2 = 0.001
[optimizer]
name = "{opt}"
learning_rate = {lr}
[train]
epochs = {epochs}
batch_size = {batch}
[consistency]
{consistency}
[output]
dir = "{out}"
"""


def _run(tmp, tag, consistency, step_hook=None, servers=2, rows=1500, bits=12, dtype="float64",
         opt="sgd", lr=0.5, epochs=2, batch=64):
    comm = MPI.COMM_WORLD
    text = JOB.format(servers=servers, data=DATA, rows=rows, bits=bits, dtype=dtype, opt=opt,
                      lr=lr, epochs=epochs, batch=batch, consistency=consistency,
                      out=tmp / tag)
    cfg = parse_job(text, tmp / f"{tag}.toml")
    with open("/dev/null", "w") as null:
        # a StopRequest (no signal arrives) as `hpcps train` passes one: its stop vote must not
        # tie SSP/async workers together
        summary = run_job(cfg, comm, out=null, step_hook=step_hook, stop=StopRequest())
    comm.Barrier()
    summary = comm.bcast(summary, root=0)            # test-side only (pickle is fine here)
    model = read_model(cfg.output.dir / "model.h5")["tables"] if comm.rank == 0 else None
    return summary, model


@pytest.mark.mpi(min_size=4)
def test_ssp0_and_rma_are_bit_identical_to_bsp(mpi_tmp_path):
    """BSP (one request per worker, server and step: the next step's pulls go with the
    clock), BSP with the pulls apart (``fuse_steps = false``), SSP(0) and both with RMA
    pulls train the same float64 model bit for bit; the fused steps save each server one
    request per worker and step but the last of each epoch."""
    ref, m_ref = _run(mpi_tmp_path, "bsp", 'model = "bsp"')
    runs = {
        "bsp_apart": 'model = "bsp"\n[comm]\nfuse_steps = false',
        "ssp0": 'model = "ssp"\nstaleness = 0',
        "bsp_rma": 'model = "bsp"\npull = "rma"',
        "ssp0_rma": 'model = "ssp"\nstaleness = 0\npull = "rma"',
    }
    for tag, cons in runs.items():
        s, m = _run(mpi_tmp_path, tag, cons)
        if tag == "bsp_apart":
            nw = MPI.COMM_WORLD.size - 2
            saved = nw * (ref["steps"] - ref["epochs"])
            for a, f in zip(s["servers"], ref["servers"]):
                assert a["requests"] - f["requests"] == saved > 0, (a, f)
                assert a["keys_pulled"] == f["keys_pulled"] and a["keys_pushed"] == f["keys_pushed"]
        assert s["consistency"]["staleness"]["max"] == 0, tag
        assert s["consistency"]["staleness"]["updates"] == ref["consistency"]["staleness"]["updates"]
        if MPI.COMM_WORLD.rank == 0:
            assert np.abs(m["weights"]).max() > 1e-3
            for name in ("weights", "bias"):
                assert m[name].dtype == np.float64
                assert np.array_equal(m[name], m_ref[name]), (tag, name)   # bit for bit
    assert ref["consistency"]["staleness"]["max"] == 0
    assert ref["consistency"]["staleness"]["updates"] > 0


@pytest.mark.mpi(min_size=2)
def test_async_with_one_worker_is_bit_identical_to_bsp(mpi_tmp_path):
    """One worker (every other rank a server): async Downpour with n_fetch = n_push = 1
    reads, before each step, every update of the steps before it (its pushes leave with its clock, ahead of
    the next fetch), so it is BSP. The step reuses the fetch's rows and keys and pushes its
    gradient unmerged: the model must be the same bit for bit (AdaGrad, float64). So must it
    with each step's push, clock and next fetch in one request per server (the default) and
    with the fetch apart (``fuse_steps = false``), which costs each server one request more
    per step but the last of each epoch."""
    servers = MPI.COMM_WORLD.size - 1
    ref, m_ref = _run(mpi_tmp_path, "bsp1", 'model = "bsp"', servers=servers, opt="adagrad",
                      lr=0.1)
    for tag, cons in (("async1", 'model = "async"'),
                      ("async1_apart", 'model = "async"\n[comm]\nfuse_steps = false')):
        s, m = _run(mpi_tmp_path, tag, cons, servers=servers, opt="adagrad", lr=0.1)
        assert s["consistency"]["staleness"]["max"] == 0
        assert s["examples"] == ref["examples"] > 0
        if MPI.COMM_WORLD.rank == 0:
            assert np.abs(m["weights"]).max() > 1e-3
            for name in ("weights", "bias"):
                assert np.array_equal(m[name], m_ref[name]), (tag, name)
        if tag == "async1":
            fused = s
    saved = s["steps"] - s["epochs"]               # one worker
    for a, f in zip(s["servers"], fused["servers"]):
        assert a["requests"] - f["requests"] == saved > 0, (a, f)
        assert a["keys_pulled"] == f["keys_pulled"] and a["keys_pushed"] == f["keys_pushed"]


def _slow_worker_1(index, clock):
    if index == 1:
        time.sleep(0.03)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("pull", ["p2p", "rma"])
def test_slowed_worker_ssp_bound_and_async_runs_ahead(mpi_tmp_path, pull):
    s = 2
    ssp, _ = _run(mpi_tmp_path, f"ssp_{pull}", f'model = "ssp"\nstaleness = {s}\npull = "{pull}"',
                  step_hook=_slow_worker_1, servers=1, rows=3000, batch=32)
    c = ssp["consistency"]
    assert c["staleness"]["max"] <= s and c["staleness"]["updates"] > 0
    for w in c["workers"]:
        assert w["read_age_max"] <= s, w          # never read parameters more than s clocks old
        assert w["lead_max"] <= s, w              # at a read: at most s clocks ahead, so at
                                                  # most s + 1 ahead after finishing the step
    fast = [w for w in c["workers"] if w["index"] != 1]
    assert max(w["lead_max"] for w in fast) == s  # the slow worker did hold the others back
    assert c["staleness"]["max"] == s

    # ~19 steps per epoch (was 5): the fast workers' lead must not depend on how fast a
    # loaded machine runs their steps (it failed under load with 5)
    asy, _ = _run(mpi_tmp_path, f"async_{pull}", f'model = "async"\npull = "{pull}"',
                  step_hook=_slow_worker_1, servers=1, rows=3000, batch=32)
    a = asy["consistency"]
    fast = [w for w in a["workers"] if w["index"] != 1]
    assert max(w["lead_max"] for w in fast) > s + 1, a["workers"]
    assert a["staleness"]["max"] > s + 1, a["staleness"]
    assert a["staleness_unit"] == "updates"


@pytest.mark.mpi(min_size=5)
def test_async_with_several_workers_converges_like_bsp(mpi_tmp_path):
    """1 server, every other rank a worker. Runs on any size >= 4; min_size 5 keeps it to the
    larger of this file's two sizes (three runs of 20,000 rows: the costliest test here)."""
    common = dict(servers=1, rows=20000, bits=18, dtype="float32", opt="adagrad", lr=0.1,
                  epochs=2, batch=256)
    bsp, _ = _run(mpi_tmp_path, "bsp4", 'model = "bsp"', **common)
    asy, _ = _run(mpi_tmp_path, "async4", 'model = "async"\npull = "rma"', **common)
    dp, _ = _run(mpi_tmp_path, "downpour4", 'model = "async"\nn_fetch = 2\nn_push = 2',
                 **common)
    assert len(asy["consistency"]["workers"]) == MPI.COMM_WORLD.size - 1
    auc = {}
    for tag, s in (("bsp", bsp), ("async", asy), ("downpour", dp)):
        path = Path(s["model_path"]).parent / "metrics.json"
        if MPI.COMM_WORLD.rank == 0:
            import json
            auc[tag] = json.loads(path.read_text())["epochs"][-1]["test_auc"]
    if MPI.COMM_WORLD.rank == 0:
        assert auc["bsp"] > 0.88, auc
        assert abs(auc["async"] - auc["bsp"]) <= 0.01, auc
        assert abs(auc["downpour"] - auc["bsp"]) <= 0.01, auc
    assert asy["consistency"]["staleness"]["mean"] > 0
