"""Continuous fault tolerance with ULFM (User-Level Failure Mitigation, MPI 4 proposal; Bland
et al., "Post-failure recovery of MPI communication capability", IJHPCA 27(3), 2013).

With ``[fault_tolerance] mode = "continue"`` and an MPI built with ULFM (the Open MPI 5 wheel,
launched with ``mpirun --with-ft ulfm``), hpcps communicators return errors instead of aborting
(:func:`errors_return`). A dead peer then surfaces as an ``MPI.Exception`` of class
``ERR_PROC_FAILED``/``ERR_PROC_FAILED_PENDING`` on a rank that talks to it, or ``ERR_REVOKED``
on a rank whose communicator another survivor revoked. :func:`is_peer_failure` tells these
apart from other errors without the caller importing mpi4py.

Recovery (:func:`shrink`) is collective over the survivors: every one revokes the job's
communicators (so that no survivor stays blocked in a receive from a dead rank or in a
collective including it), ``Shrink`` builds a communicator of the survivors, and the failed
ranks are found by comparing its group with the old one. The callers (server loop, worker loop)
then agree on what the dead ranks had done and rebuild their endpoints.

RMA windows spanning a dead rank are not used after a failure (Open MPI's ``osc/sm`` is not
tested for post-failure operation; see ``/work/shared`` notes): the continue mode uses
point-to-point pulls.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

_FAILURE_CLASSES = tuple(getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                                      "ERR_REVOKED") if hasattr(MPI, n))


class ServerLost(RuntimeError):
    """A server rank died; its key range cannot be recovered without replicas, so the job stops
    for a restart from the last checkpoint."""


def ulfm_available(environ=None) -> tuple[bool, str]:
    """Whether this launch can survive the loss of a rank. Local.

    Returns
    -------
    ok : bool
    why : str
        What is missing when ``ok`` is false (for the start-up message).
    """
    env = os.environ if environ is None else environ
    if not hasattr(MPI.Comm, "Shrink") or not _FAILURE_CLASSES:
        return False, "this mpi4py has no ULFM functions (Comm.Shrink)"
    lib = MPI.Get_library_version()
    if "Open MPI" in lib:
        if env.get("OMPI_MCA_mpi_ft_enable", "") not in ("1", "true", "yes"):
            return False, ("Open MPI was launched without ULFM: use `mpirun --with-ft ulfm` "
                           "(hpcps run adds it for this job)")
        return True, ""
    if "MPICH" in lib:
        if env.get("MPIR_CVAR_ENABLE_FT", "") not in ("1", "true", "yes"):
            return False, "MPICH needs MPIR_CVAR_ENABLE_FT=1 for ULFM"
        return True, ""
    return False, f"unknown MPI ({lib.splitlines()[0][:60]}); ULFM support not known"


def errors_return(*comms) -> None:
    """Make MPI errors on ``comms`` raise ``MPI.Exception`` instead of aborting. Local."""
    for c in comms:
        if c is not None and c != MPI.COMM_NULL:
            c.Set_errhandler(MPI.ERRORS_RETURN)


def is_peer_failure(exc: BaseException) -> bool:
    """True if ``exc`` reports a failed or revoked peer (the errors recovery handles)."""
    return isinstance(exc, MPI.Exception) and exc.Get_error_class() in _FAILURE_CLASSES


def is_mpi_error(exc: BaseException) -> bool:
    """True if ``exc`` is an error returned by MPI (any class)."""
    return isinstance(exc, MPI.Exception)


def revoke(*comms) -> None:
    """Revoke ``comms`` (errors ignored: another survivor may have revoked them). Not
    collective: any one rank revoking is enough."""
    for c in comms:
        if c is None or c == MPI.COMM_NULL:
            continue
        try:
            c.Revoke()
        except MPI.Exception:
            pass


def shrink(comm, *others):
    """Revoke ``comm`` and ``others``, then build the communicator of the survivors.
    Collective over the surviving ranks of ``comm``.

    Returns
    -------
    new : MPI.Intracomm
        Survivors of ``comm``, in the old rank order, with errors returned.
    failed : list of int
        Ranks of ``comm`` that failed.
    """
    revoke(comm, *others)
    _drain_orphans()
    new = comm.Shrink()
    errors_return(new)
    old_group, new_group = comm.Get_group(), new.Get_group()
    alive = MPI.Group.Translate_ranks(new_group, list(range(new.Get_size())), old_group)
    failed = sorted(set(range(comm.Get_size())) - set(alive))
    old_group.Free()
    new_group.Free()
    return new, failed


def _drain_orphans() -> None:
    """Complete the requests a failed wait left behind (their communicator is revoked, so
    each completes at once, with an error that is ignored)."""
    from . import core

    while core.ORPHANS:
        r = core.ORPHANS.pop()
        try:
            r.Wait()
        except MPI.Exception:
            pass


def allgather_int64(comm, row) -> np.ndarray:
    """Stack one fixed-length int64 row per rank on every rank → ``(size, n)``. Collective."""
    a = np.ascontiguousarray(row, dtype=np.int64).reshape(-1)
    out = np.empty((comm.Get_size(), a.size), dtype=np.int64)
    comm.Allgather(a, out)
    return out


def bcast_int64(comm, values, root: int) -> np.ndarray:
    """Broadcast an int64 array of a length every rank knows. Collective."""
    a = np.ascontiguousarray(values, dtype=np.int64)
    comm.Bcast(a, root=root)
    return a


def split(comm, color: int, key: int):
    """``comm.Split`` with errors returned on the result. Collective."""
    new = comm.Split(color, key)
    errors_return(new)
    return new


def agree(comm, flag: int = 1) -> int:
    """Fault-tolerant agreement (``MPI_Comm_agree``): the bitwise AND of ``flag`` over the
    survivors; raises the same peer-failure error on every survivor if a rank of ``comm``
    failed. Collective."""
    return int(comm.Agree(int(flag)))
