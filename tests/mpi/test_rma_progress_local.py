# mpi-ranks: 1 2
"""This machine's MPI library judged by hpcps.comm.progress like its version string (needs
mpi4py, so not in tests/unit; every rank checks the same local facts, at any size)."""

from hpcps.comm.progress import library_version, rma_progress_advice


def test_this_machines_mpi_is_judged_like_its_string():
    lib = library_version()
    assert lib and "\x00" not in lib
    assert rma_progress_advice(lib, {"MPIR_CVAR_ASYNC_PROGRESS": "1", "OMPI_MCA_osc": "sm"}) is None
