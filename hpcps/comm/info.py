"""What MPI is in use, without starting MPI (``hpcps info``)."""

from __future__ import annotations


def mpi_versions() -> tuple[str, str]:
    """``(mpi4py version, first line of the MPI library version)``.

    Does not initialise MPI (``MPI_Get_library_version`` may be called before ``MPI_Init``),
    so no shared-memory segment is left behind. Local; any process may call it.
    """
    import mpi4py

    mpi4py.rc.initialize = False          # only effective if mpi4py.MPI is not imported yet
    from mpi4py import MPI

    return mpi4py.__version__, MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def request_path() -> str:
    """Which request path this build has: ``"compiled"`` (:mod:`hpcps.comm.fastpath`, built
    when setup.py found an MPI compiler wrapper) or why it is the Python one. Does not
    initialise MPI. Local."""
    import mpi4py

    mpi4py.rc.initialize = False
    from hpcps.comm.transport import _FAST_REASON, _fast

    if _fast is None:
        return (f"Python (hpcps.comm.fastpath {_FAST_REASON}; install so that the MPI's mpicc "
                "is on PATH when the package is built, see the README)")
    return f"compiled (hpcps.comm.fastpath, for {_fast.BUILT_FOR})"
