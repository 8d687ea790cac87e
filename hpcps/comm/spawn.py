"""Dynamic processes: add worker ranks to a running job with ``MPI_Comm_spawn`` (MPI 4.1 §11.8).

:mod:`hpcps.resilience.elastic` decides when and how many; this module holds the MPI calls. Behaviour of
the Open MPI 5 wheel measured on the test machine with a minimal reproducer (parents ``Dup``
their world, ``Spawn`` children running the same Python, both sides ``Merge`` the
intercommunicator, ``Bcast`` and ``Allreduce`` over the merged communicator, ``Disconnect``):

* 3 parents + 2 children under ``mpirun`` (oversubscribed): works, ``Spawn`` returns in
  1.3–2.4 s (the children's Python start-up and ``MPI_Init``); also under ``--with-ft ulfm``;
  the root of the spawn may be any parent rank.
* no free slot (``mpirun -n 2`` on 2 cores without oversubscription): ``Spawn`` raises
  ``MPI_ERR_UNKNOWN`` on every parent when the communicator returns errors, and the parents
  can go on (an Allreduce afterwards works) — but ``mpirun`` then exits with status 213 at the
  end, and prints "All nodes which are allocated for this job are already filled".
* the spawn info keys ``map_by = ":OVERSUBSCRIBE"`` and ``bind_to = "none"`` let the children
  share cores with the running ranks (``map_by`` alone fails: "binding more processes than
  cpus"); ``mpirun --map-by :OVERSUBSCRIBE`` or ``PRTE_MCA_rmaps_default_mapping_policy=
  :oversubscribe`` of the launch is inherited by spawns.
* ``MPI_UNIVERSE_SIZE`` is the number of slots (2 here), also when the launch oversubscribes
  them, so it cannot tell in advance whether a spawn will find room.
* a singleton (no ``mpirun``) cannot spawn here (Open MPI starts a ``prte`` daemon, which
  refuses to run as root); an hpcps job has at least 2 ranks anyway.
* ``MPI_Abort`` on a parent also kills the spawned processes.

No connect/accept handshake is needed: ``Spawn`` works with this MPI. Where the launcher cannot
start processes for a running job (Open MPI's ranks started by ``srun``: Slurm's PMIx server
does not implement ``PMIx_Spawn``), :func:`spawn_unavailable` says so before any attempt.
"""

from __future__ import annotations

import os
import sys

from mpi4py import MPI

from hpcps.comm.core import any_rank_failed

#: Arguments after the Python executable that start an added worker (``hpcps join``).
JOIN_ARGS = ("-m", "hpcps", "join")
#: The option of ``hpcps join`` giving the seconds within which it must have joined.
DEADLINE_OPTION = "--deadline"


def spawn_unavailable(environ=None, library: str | None = None) -> str | None:
    """Why this launch cannot add processes, or ``None`` when a spawn may work. Local; the
    same on every rank of one launch (environment and library).

    Open MPI spawns only inside a job started by its own ``mpirun``/``prterun`` (which sets
    ``PRTE_LAUNCHED``); ranks started by Slurm's ``srun`` have no runtime to start more.
    MPICH's ``mpiexec`` (Hydra) spawns; under ``srun`` (``SLURM_STEP_ID`` without Hydra's
    ``PMI_PORT``/``PMI_FD``) it cannot. Free slots are not checked here (see the module
    docstring): a spawn without room fails and is reported then.
    """
    env = os.environ if environ is None else environ
    lib = library if library is not None else MPI.Get_library_version()
    if "Open MPI" in lib:
        if env.get("PRTE_LAUNCHED") != "1":
            how = "srun" if env.get("SLURM_STEP_ID") else "a launcher other than its mpirun"
            return (f"Open MPI can add processes only to a job started by its own mpirun; this "
                    f"one was started by {how} (in a Slurm allocation, launch with `mpirun "
                    "--bind-to none` inside the batch script, as slurm/train.sbatch does for "
                    "the Open MPI wheel)")
        return None
    if "MPICH" in lib and env.get("SLURM_STEP_ID") and not (env.get("PMI_PORT") or env.get("PMI_FD")):
        return "MPICH ranks started by srun cannot spawn; launch with mpiexec (Hydra)"
    return None


def spawn_workers(comm: MPI.Intracomm, n: int, root: int, oversubscribe: bool = False,
                  wdir: str | None = None, deadline: float | None = None):
    """Start ``n`` new processes running ``python -m hpcps join`` (the Python of this rank).
    Collective over ``comm``: every rank calls it with the same ``n`` and ``root``;
    ``oversubscribe`` and ``wdir`` are used at ``root`` only.

    Parameters
    ----------
    comm : MPI.Intracomm
        Every rank of the job (servers and workers, ``Roles.ps``).
    n : int
        Processes to start, >= 1 (the same on every rank).
    root : int
        Rank of ``comm`` whose arguments count (the chief).
    oversubscribe : bool
        Open MPI: let the new processes share cores with running ranks (spawn info
        ``map_by = ":OVERSUBSCRIBE"``, ``bind_to = "none"``).
    wdir : str, optional
        Working directory of the new processes (default: the root's).
    deadline : float, optional
        Seconds within which each new process must have joined the job (MPI_Init, the
        handshake, the new layout), counted from its start; it ends itself after them
        (``hpcps join --deadline``, :func:`hpcps.core.procs.exit_after`), since an abort of
        the job does not end it (Open MPI 5 under ULFM). Default: no deadline.

    Returns
    -------
    intercomm : MPI.Intercomm or None
        Parents <-> children, or None when the spawn failed (on every rank).
    error : str
        Why it failed ("" on success), as the MPI library reports it.

    Raises
    ------
    RuntimeError
        When the spawn failed on some ranks only, or started fewer processes than asked
        (neither was seen with Open MPI 5; the job cannot continue consistently).
    """
    info = MPI.Info.Create()
    errhandler = comm.Get_errhandler()
    inter, error = None, ""
    try:
        if comm.Get_rank() == root:
            info.Set("wdir", wdir or os.getcwd())
            if oversubscribe and "Open MPI" in MPI.Get_library_version():
                info.Set("map_by", ":OVERSUBSCRIBE")
                info.Set("bind_to", "none")
        comm.Set_errhandler(MPI.ERRORS_RETURN)     # a failed spawn must not abort the job
        try:
            args = list(JOIN_ARGS)
            if deadline is not None:
                args += [DEADLINE_OPTION, f"{float(deadline):g}"]
            inter = comm.Spawn(sys.executable, args=args, maxprocs=int(n), info=info, root=root)
        except MPI.Exception as e:
            error = f"MPI_Comm_spawn of {n} process(es) failed: {e.Get_error_string()}"
    finally:
        comm.Set_errhandler(errhandler)
        errhandler.Free()
        info.Free()
    failed = any_rank_failed(comm, inter is None)
    if failed and inter is not None:
        raise RuntimeError("MPI_Comm_spawn failed on some ranks only")
    if inter is not None and inter.Get_remote_size() != int(n):
        raise RuntimeError(f"MPI_Comm_spawn started {inter.Get_remote_size()} of {n} processes")
    return inter, (error or "the spawn failed on another rank") if failed else ""


def parent() -> MPI.Intercomm | None:
    """The intercommunicator to the job that spawned this process, or ``None`` if it was not
    spawned. Local."""
    p = MPI.Comm.Get_parent()
    return None if p == MPI.COMM_NULL else p


def merge(inter: MPI.Intercomm, high: bool) -> MPI.Intracomm:
    """One intracommunicator of both groups of ``inter``: the group passing ``high=False``
    (the parents) first, in their old order, then the other. Collective over both groups."""
    return inter.Merge(high=high)


def disconnect(inter: MPI.Intercomm) -> None:
    """``MPI_Comm_disconnect``: wait for pending traffic on ``inter`` and free it. Collective
    over both groups."""
    inter.Disconnect()


def universe_size(comm: MPI.Intracomm) -> int | None:
    """``MPI_UNIVERSE_SIZE`` (slots the launcher knows of), or ``None``. Local."""
    v = comm.Get_attr(MPI.UNIVERSE_SIZE)
    return int(v) if v is not None else None
