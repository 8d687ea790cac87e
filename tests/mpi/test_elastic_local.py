# mpi-ranks: 1 2
"""The parts of growth that live in MPI modules but need no communication (moved out of
tests/unit, which cannot import mpi4py): every rank runs the same local checks, so the file
passes at any size."""

import pytest

from hpcps.comm.spawn import spawn_unavailable
from hpcps.core.tables import TableSpec
from hpcps.resilience.elastic import JoinPlan


def test_spawn_unavailable_under_srun_and_fine_under_mpirun():
    ompi = "Open MPI v5.0.9, package: Open MPI ..."
    assert spawn_unavailable({"PRTE_LAUNCHED": "1"}, ompi) is None
    why = spawn_unavailable({"SLURM_STEP_ID": "0"}, ompi)
    assert "srun" in why and "mpirun" in why
    assert "mpirun" in spawn_unavailable({}, ompi)
    mpich = "MPICH Version: 4.2"
    assert "srun" in spawn_unavailable({"SLURM_STEP_ID": "0"}, mpich)
    assert spawn_unavailable({"PMI_PORT": "x:1"}, mpich) is None


def test_join_plan_layout_mismatch_names_the_table():
    specs = [TableSpec("w", 100, 1, "float32", sparse=True), TableSpec("b", 1, 1, "float32", sparse=False)]
    plan = JoinPlan(clock=3, epoch=0, n_old=2, plan=[[2, 3]], job_text="", job_path="",
                    output_dir="", pull="p2p", tables=JoinPlan.layout(specs))
    plan.check_tables(specs)
    other = [TableSpec("w", 200, 1, "float32", sparse=True), specs[1]]
    with pytest.raises(ValueError, match=r"table 'w': the running job has .* = \(100, 1, 1, 4\)"):
        plan.check_tables(other)
    with pytest.raises(ValueError, match="2 table"):
        plan.check_tables(specs[:1])
