"""What the launcher (mpirun, Hydra, srun) says about the job in each process's environment:
the world size, the ranks on this node, whether each rank has a core. No MPI calls (importable
without mpi4py)."""

from __future__ import annotations

import os

__all__ = ["launcher_world_size", "launcher_local_size", "cores_dedicated"]


def launcher_world_size(environ=None) -> int | None:
    """World size announced by the launcher's environment, or ``None`` when not launched.

    Reads the variables Open MPI (``OMPI_COMM_WORLD_SIZE``), MPICH/Hydra and PMI-2
    (``PMI_SIZE``) and Slurm's ``srun`` (``SLURM_STEP_NUM_TASKS``, only inside a job step)
    set for each launched process.
    """
    env = os.environ if environ is None else environ
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if env.get(var, "").isdigit():
            return int(env[var])
    if env.get("SLURM_STEP_ID") and env.get("SLURM_STEP_NUM_TASKS", "").isdigit():
        return int(env["SLURM_STEP_NUM_TASKS"])
    return None


def launcher_local_size(environ=None) -> int | None:
    """Ranks the launcher started on this node, from its environment, or ``None`` if unknown.

    Open MPI sets ``OMPI_COMM_WORLD_LOCAL_SIZE``, MPICH/Hydra ``MPI_LOCALNRANKS``, Slurm's
    ``srun`` ``SLURM_STEP_TASKS_PER_NODE`` (e.g. ``"4"`` or ``"4(x2)"``, inside a step).
    Local; reads the environment only.
    """
    env = os.environ if environ is None else environ
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if env.get(var, "").isdigit():
            return int(env[var])
    if env.get("SLURM_STEP_ID"):
        first = env.get("SLURM_STEP_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
        if first.isdigit():
            return int(first)
    return None


def cores_dedicated(environ=None, cores=None) -> bool:
    """True when the launcher put at most one rank per core on this node (so a rank may poll
    without sleeping); False when it oversubscribed the cores or did not say. Local."""
    n = launcher_local_size(environ)
    cores = os.cpu_count() if cores is None else cores
    return n is not None and cores is not None and n <= cores
