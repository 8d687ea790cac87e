"""Continuous fault tolerance with ULFM (User-Level Failure Mitigation, MPI 4 proposal; Bland
et al., "Post-failure recovery of MPI communication capability", IJHPCA 27(3), 2013).

With ``[fault_tolerance] mode = "continue"`` and an MPI built with ULFM (the Open MPI 5 wheel,
launched with ``mpirun --with-ft ulfm``), hpcps communicators return errors instead of aborting
(:func:`errors_return`). A dead peer then surfaces as an ``MPI.Exception`` of class
``ERR_PROC_FAILED``/``ERR_PROC_FAILED_PENDING`` on a rank that talks to it;
:func:`is_peer_failure` tells these apart from other errors without the caller importing
mpi4py.

Detection without revoke. Every wait of a continue-mode job polls (:func:`watch`,
:func:`hpcps.comm.core.waitall`): it tests its requests and probes the parameter-server
communicator with ``MPI.ANY_SOURCE``, which raises ``ERR_PROC_FAILED`` on every rank as soon as
any of its ranks is known to have failed (until the failure is acknowledged, which hpcps never
does on that communicator). Worker collectives run as their non-blocking forms completed by
the same watched wait (:func:`hpcps.comm.core.collective`). So every survivor leaves whatever
it was waiting for, with or without a message from the dead rank, and no communicator is
revoked. ``MPI_Comm_revoke`` is not used because, in Open MPI 5.0.x (seen with 5.0.11), a
revoke while point-to-point messages are in flight on the communicator aborts the sender
("Send error after request freed", ``MPI_ERRORS_ARE_FATAL`` on a NULL communicator): an eager
send whose request the sender already completed gets the revoke's error when its fragment
comes back, and an error on a freed request is fatal. ``tests/tools/ulfm_revoke_repro.py``
reproduces it with mpi4py alone.

Recovery (:func:`shrink`) is collective over the survivors: ``Shrink`` builds a communicator of
the survivors (it does not need a revoked communicator), and the failed ranks are found by
comparing its group with the old one. The callers (server loop, worker loop) then agree on
what the dead ranks had done and rebuild their endpoints (:mod:`hpcps.resilience.recovery`).

RMA windows spanning a dead rank are not used after a failure (Open MPI's ``osc/sm`` is not
tested for post-failure operation; see ``/work/shared`` notes): the continue mode uses
point-to-point pulls.
"""

from __future__ import annotations

import contextlib
import os

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


def watch(comm) -> None:
    """Make every wait of this rank raise as soon as a rank of ``comm`` has failed (or stop
    watching with ``None``); see the module docstring. Local."""
    from hpcps.comm import core

    core.WATCH[:] = [] if comm is None else [comm]


@contextlib.contextmanager
def unwatched():
    """Blocking collectives in the body, as ranks that watch nothing use (processes added with
    ``MPI_Comm_spawn`` before they know the job: MPI never matches a blocking collective with
    a non-blocking one). A :func:`watch` made in the body stays; else the old one is restored.
    Local."""
    from hpcps.comm import core

    saved = core.WATCH[:]
    core.WATCH[:] = []
    try:
        yield
    finally:
        if not core.WATCH:
            core.WATCH[:] = saved


def shrink(comm):
    """Build the communicator of the survivors of ``comm`` and watch it. Collective over the
    surviving ranks of ``comm``.

    Returns
    -------
    new : MPI.Intracomm
        Survivors of ``comm``, in the old rank order, with errors returned.
    failed : list of int
        Ranks of ``comm`` that failed.
    """
    _cancel_orphans()
    new = comm.Shrink()
    errors_return(new)
    watch(new)
    old_group, new_group = comm.Get_group(), new.Get_group()
    alive = MPI.Group.Translate_ranks(new_group, list(range(new.Get_size())), old_group)
    failed = sorted(set(range(comm.Get_size())) - set(alive))
    old_group.Free()
    new_group.Free()
    return new, failed


def _cancel_orphans() -> None:
    """Cancel the requests failed waits left behind and complete those that can complete:
    a receive must not write into its buffer (which the caller may reuse) after recovery.
    Requests that cannot be cancelled (a send already on its way) stay referenced, with their
    buffers, in :data:`hpcps.comm.core.ORPHANS`."""
    from hpcps.comm import core

    still = []
    for reqs, buffers in core.ORPHANS:
        left = []
        for r in reqs:
            try:
                r.Cancel()
            except MPI.Exception:
                pass
            try:
                if not r.Test():
                    left.append(r)
            except MPI.Exception:
                pass
        if left:
            still.append((left, buffers))
    core.ORPHANS[:] = still
