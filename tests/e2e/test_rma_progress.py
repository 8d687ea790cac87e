"""The RMA progress check at start, end to end. On this machine's MPI (the Open MPI 5 wheel,
Win.Allocate windows: passive progress) nothing is said and RMA pulls are kept. With an MPICH
build named by HPCPS_MPICH_PYTHON (a Python whose mpi4py uses MPICH and whose bin/ has MPICH's
mpirun, e.g. a venv with `pip install mpich mpi4py numpy scipy scikit-learn h5py`) the
warning and the fallback to p2p pulls are checked for real; skipped without it."""

import os
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, launch, mpi_env, mpirun, run_in_session, write_job

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


def test_rma_pulls_after_a_clock_with_single_copy_off_trains(tmp_path):
    """``hpcps train``, 1 server + 1 worker, RMA pulls, Open MPI's single-copy shared memory
    off (``OMPI_MCA_smsc=^cma``, as in containers without CMA): a push then needs the
    sender's progress, and a worker that spun on the window after its clock never sent it
    (issue 23.2: the server waited in recv_values for ever). Timed out, not hung."""
    body = JOB.format(fallback="false").replace("[train]", "[cluster]\nservers = 1\n[train]")
    job = write_job(tmp_path / "j.toml", body)
    proc, _ = launch(2, ["train", job], cwd=tmp_path, timeout=240,
                     env=mpi_env(OMPI_MCA_smsc="^cma"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BSP (rma pulls)" in proc.stdout and "RMA reads" in proc.stdout, proc.stdout


@pytest.mark.parametrize("setting", ["smsc=^cma", "max_message_bytes=1024"])
def test_rma_pull_after_a_large_deferred_push_one_server_one_worker(tmp_path, setting):
    """tests/e2e/rma_push_driver.py: 1 server + 1 worker push 200,000 keys with the clock,
    then read them through the window, 3 steps; with single-copy off, or in 1,024-byte
    chunks (hundreds of sends that the receiver's queue cannot take at once). Every step
    reads the ones of every step before (-1, -2, -3)."""
    env = mpi_env(OMPI_MCA_smsc="^cma") if setting == "smsc=^cma" else mpi_env()
    max_bytes = 1 << 30 if setting == "smsc=^cma" else 1024
    driver = ROOT / "tests" / "e2e" / "rma_push_driver.py"
    proc = run_in_session([mpirun(), "-n", "2", sys.executable, str(driver), "200000",
                           str(max_bytes)], cwd=tmp_path, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == "step 0: [-1.0] step 1: [-2.0] step 2: [-3.0] done".split(), \
        proc.stdout
