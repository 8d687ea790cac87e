"""The RMA progress check at start, end to end. On this machine's MPI (the Open MPI 5 wheel,
Win.Allocate windows: passive progress) nothing is said and RMA pulls are kept. With an MPICH
build named by HPCPS_MPICH_PYTHON (a Python whose mpi4py uses MPICH and whose bin/ has MPICH's
mpirun, e.g. a venv with `pip install mpich mpi4py numpy scipy scikit-learn h5py`) the
warning and the fallback to p2p pulls are checked for real; skipped without it."""

import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, launch, run_in_session, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

JOB = """
name = "rmaprog"
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 3000
hash_bits = 12
[train]
epochs = 1
[consistency]
pull = "rma"
rma_fallback = {fallback}
[output]
dir = "out"
"""


def test_open_mpi_5_keeps_rma_pulls_without_a_warning(tmp_path):
    job = write_job(tmp_path / "j.toml", JOB.format(fallback="true"))
    proc, _ = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BSP (rma pulls)" in proc.stdout and "warning" not in proc.stdout


@pytest.mark.parametrize("fallback", ["true", "false"])
def test_mpich_without_async_progress_warns_and_falls_back(tmp_path, fallback):
    py = os.environ.get("HPCPS_MPICH_PYTHON")
    if not py:
        pytest.skip("set HPCPS_MPICH_PYTHON to a Python with mpi4py on MPICH")
    job = write_job(tmp_path / "j.toml", JOB.format(fallback=fallback))
    env = {k: v for k, v in os.environ.items() if k != "MPIR_CVAR_ASYNC_PROGRESS"}
    env["PYTHONPATH"] = str(ROOT)
    proc = run_in_session([str(Path(py).parent / "mpirun"), "-n", "3", py, "-m", "hpcps",
                           "train", str(job)], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("hpcps: warning: ") == 1
    assert "set MPIR_CVAR_ASYNC_PROGRESS=1" in proc.stdout
    want = "BSP (p2p pulls)" if fallback == "true" else "BSP (rma pulls)"
    assert want in proc.stdout, proc.stdout
