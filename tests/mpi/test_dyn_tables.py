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
