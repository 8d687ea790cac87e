"""Agreement after a rank dies (``[fault_tolerance] mode = "continue"``), shared by the server
and worker loops. No mpi4py here: the MPI calls are in :mod:`hpcps.comm.ft`.

Protocol, collective over every surviving rank (servers and workers) once each has caught a
peer failure (:func:`hpcps.comm.ft.is_peer_failure`):

1. revoke the job's communicators and ``Shrink`` the parameter-server communicator;
2. allgather ``[is_server, old_index]`` so every survivor knows the new layout; if a server
   died, every survivor raises :class:`hpcps.comm.ft.ServerLost` (its key range is gone: the
   job stops and restarts from the last checkpoint);
3. split the new role communicators (survivors keep their relative order);
4. the servers agree, for every worker of the old layout, on the number of steps it finished:
   ``C_w`` = the largest number of CLOCK messages any server received from it, and the
   examples of its last step. A worker sends all pushes of a step, to every server, before it
   sends that step's CLOCK to any server, so a server holding the pushes of step ``C_w - 1``
   without its CLOCK applies them (with the examples another server received), and pushes of
   steps ``>= C_w`` are dropped everywhere: every worker's step is applied entirely or not at
   all, and the rows of dropped steps are read again (by the survivors);
5. server 0 broadcasts ``C`` and the examples to everyone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .comm import core, ft


@dataclass
class Recovery:
    """What the survivors agreed on after a failure.

    Attributes
    ----------
    roles : hpcps.comm.core.Roles
        The new layout (``ps``, ``role_comm``, indices and ranks among the survivors).
    dead_workers : list of int
        Worker indices (old layout) of the workers that died.
    clocks : int64 ndarray (n_old_workers,)
        Steps each old worker finished, agreed by the servers (``C_w``).
    examples : int64 ndarray (n_old_workers,)
        Examples of each old worker's last finished step.
    epochs : int64 ndarray (n_old_workers,)
        Epoch (0-based) of that step.
    old_index : dict of int -> int
        New worker index -> old worker index, for the survivors.
    failed_ranks : list of int
        Ranks of the old ``ps`` communicator that failed.
    failed_world_ranks : list of int
        The same ranks in the job's original numbering.
    failed_hosts : list of str
        Their hosts (when known).
    """

    roles: core.Roles
    dead_workers: list
    clocks: np.ndarray
    examples: np.ndarray
    old_index: dict
    failed_ranks: list
    failed_world_ranks: list = field(default_factory=list)
    failed_hosts: list = field(default_factory=list)
    seconds: float = 0.0
    epochs: np.ndarray = None


@dataclass
class FTState:
    """The job's current communicators and the failures survived so far (mutable; the server
    and worker loops replace ``roles`` after each recovery and job.py reads it at the end).

    Attributes
    ----------
    roles : hpcps.comm.core.Roles
    hosts : list of str
        Host of every rank of the original layout (``ps`` rank order), for the event records.
    world_ranks : list of int
        Original ``ps`` rank of every rank of the current ``roles.ps``.
    events : list of dict
        One record per failure: time, failed ranks and hosts, workers lost, examples
        reassigned, recovery seconds.
    recoveries : int
        Failures survived by this rank.
    """

    roles: core.Roles
    hosts: list = field(default_factory=list)
    world_ranks: list = field(default_factory=list)
    events: list = field(default_factory=list)
    recoveries: int = 0


def recover(state: FTState, server_clocks=None, server_examples=None, max_attempts: int = 5,
            server_epochs=None) -> Recovery:
    """Run the recovery protocol (module docstring). Collective over every survivor.

    Parameters
    ----------
    state : FTState
        Updated in place: ``roles`` and ``world_ranks`` describe the survivors afterwards.
    server_clocks, server_examples : int64 array (n_old_workers,), servers only
        CLOCK messages received from each worker and the examples of the last one.
    server_epochs : int64 array (n_old_workers,), servers only
        The epoch of that last CLOCK (default 0).

    Returns
    -------
    Recovery

    Raises
    ------
    hpcps.comm.ft.ServerLost
        On every survivor, when a server died.
    """
    t0 = time.perf_counter()
    for attempt in range(max_attempts):
        try:
            return _recover_once(state, server_clocks, server_examples, server_epochs, t0)
        except Exception as e:          # noqa: BLE001 - only a new failure is retried
            if not ft.is_peer_failure(e) or attempt == max_attempts - 1:
                raise
    raise AssertionError("unreachable")


def _recover_once(state, server_clocks, server_examples, server_epochs, t0) -> Recovery:
    r = state.roles
    old_workers, old_servers = list(r.worker_ranks), list(r.server_ranks)
    new_ps, failed = ft.shrink(r.ps, r.role_comm)
    is_server = r.role == core.SERVER
    layout = ft.allgather_int64(new_ps, [1 if is_server else 0, r.index])
    dead_servers = [old_servers.index(f) for f in failed if f in old_servers]
    dead_workers = [old_workers.index(f) for f in failed if f in old_workers]
    world_ranks = [state.world_ranks[f] for f in range(len(state.world_ranks)) if f not in failed] \
        if state.world_ranks else []
    if dead_servers:
        def where(s):
            w = state.world_ranks[old_servers[s]] if state.world_ranks else old_servers[s]
            return f"server {s} (rank {w}{' on ' + state.hosts[w] if state.hosts else ''})"
        hosts = ", ".join(where(s) for s in dead_servers)
        raise ft.ServerLost(f"{hosts} died: its key range is lost ([fault_tolerance] mode = "
                            "'continue' survives the loss of workers only); the job stops and "
                            "resumes from its last checkpoint on a restart (hpcps run "
                            "--max-restarts, or the Slurm script's requeue)")
    roles = core.rebuild_roles(new_ps, r.role, r.index)
    role_comm, workers = roles.role_comm, list(roles.worker_ranks)
    n_old = len(old_workers)
    agreed = np.zeros(3 * n_old, dtype=np.int64)       # clocks, examples, epochs
    if is_server:
        epochs = np.zeros(n_old, np.int64) if server_epochs is None else server_epochs
        rows = ft.allgather_int64(role_comm, np.concatenate([server_clocks, server_examples, epochs]))
        clocks = rows[:, :n_old]
        best = clocks.argmax(axis=0)
        agreed[:n_old] = clocks.max(axis=0)
        for block in (1, 2):                           # the last CLOCK's, from the best server
            agreed[block * n_old:(block + 1) * n_old] = rows[best, block * n_old + np.arange(n_old)]
    agreed = ft.bcast_int64(new_ps, agreed, root=roles.server_ranks[0])
    failed_world = [state.world_ranks[f] for f in failed] if state.world_ranks else list(failed)
    failed_hosts = [state.hosts[w] for w in failed_world] if state.hosts else []
    state.roles = roles
    state.world_ranks = world_ranks
    state.recoveries += 1
    old_index = {new: int(layout[rank, 1]) for new, rank in enumerate(workers)}
    return Recovery(roles=roles, dead_workers=dead_workers, clocks=agreed[:n_old].copy(),
                    examples=agreed[n_old:2 * n_old].copy(), old_index=old_index, failed_ranks=failed,
                    failed_world_ranks=failed_world, failed_hosts=failed_hosts,
                    seconds=time.perf_counter() - t0, epochs=agreed[2 * n_old:].copy())
