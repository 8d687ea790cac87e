# mpi-ranks: 2 3
"""The start-up check of RMA progress (hpcps.runtime.job.check_rma_progress) on a real world
communicator: rank 0 judges, warns once, and every rank takes the same path (a
:class:`hpcps.core.runplan.RunPlan`; the config is not rewritten)."""

import io

import pytest
from mpi4py import MPI

from hpcps.config import parse_job
from hpcps.core.runplan import RunPlan
from hpcps.runtime.job import check_rma_progress
from tests.unit.test_rma_progress import MPICH, OMPI5

JOB = """
name = "rmafb"
[data]
format = "svmlight"
path = "{train}"
test_path = "{train}"
index_base = 1
n_features = 4
[consistency]
pull = "{pull}"
{extra}
"""


def cfg(mpi_tmp_path, pull="rma", extra=""):
    train = mpi_tmp_path / "t.svm"
    if MPI.COMM_WORLD.Get_rank() == 0:
        train.write_text("1 1:1\n0 2:1\n")
    MPI.COMM_WORLD.Barrier()
    return parse_job(JOB.format(train=train, pull=pull, extra=extra), mpi_tmp_path / "j.toml")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fallback", [False, True])
def test_mpich_without_async_progress_warns_once_and_falls_back_if_asked(mpi_tmp_path, fallback):
    world = MPI.COMM_WORLD
    c = cfg(mpi_tmp_path, extra=f"rma_fallback = {'true' if fallback else 'false'}")
    out = io.StringIO()
    # only rank 0's view counts: the others are given an Open MPI 5 string and still follow
    lib = MPICH if world.Get_rank() == 0 else OMPI5
    got = check_rma_progress(c, world, out, environ={}, library=lib)
    text = out.getvalue()
    if world.Get_rank() == 0:
        assert text.count("hpcps: warning: ") == 1
        assert "set MPIR_CVAR_ASYNC_PROGRESS=1" in text
        assert ("falling back to p2p pulls" in text) == fallback
    else:
        assert text == ""
    assert got.pull == ("p2p" if fallback else "rma") and got.rma_fallback == fallback
    assert c.consistency.pull == "rma"           # a run-time value: the config stays as read


@pytest.mark.mpi(min_size=2)
def test_no_warning_when_progress_is_there(mpi_tmp_path):
    world = MPI.COMM_WORLD
    c = cfg(mpi_tmp_path, extra="rma_fallback = true")
    for lib, env in ((MPICH, {"MPIR_CVAR_ASYNC_PROGRESS": "1"}), (OMPI5, {}), (None, {})):
        out = io.StringIO()
        got = check_rma_progress(c, world, out, environ=env, library=lib)
        assert out.getvalue() == "" and got == RunPlan(pull="rma")
    p2p = cfg(mpi_tmp_path, pull="p2p")
    assert check_rma_progress(p2p, world, io.StringIO(), environ={}, library=MPICH) == \
        RunPlan(pull="p2p")
