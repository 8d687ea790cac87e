"""Agreement after a rank dies (``[fault_tolerance] mode = "continue"``), shared by the server
and worker loops. No mpi4py here: the MPI calls are in :mod:`hpcps.comm.ft` and
:mod:`hpcps.comm.core`.

Protocol, collective over every surviving rank (servers and workers) once each has caught a
peer failure (:func:`hpcps.comm.ft.is_peer_failure`):

1. ``Shrink`` the parameter-server communicator (every survivor leaves what it was waiting
   for by itself: :mod:`hpcps.comm.ft`, no communicator is revoked);
2. allgather one int64 row per survivor (:func:`report_row`): a server gives its place on the
   ring, the clock of every key-range copy it holds, and per old worker the CLOCK messages
   it received and the examples of the last; a worker gives its own clock, the epochs it
   finished (passed their closing barrier) and, per range, the first step whose pushes it
   still keeps (:class:`hpcps.worker.client.PSClient` keeps every push and CLOCK until the
   range's backup has acknowledged that step);
3. every survivor computes the same :class:`Plan` from the rows (:func:`make_plan`): where
   each range lives now (:mod:`hpcps.core.placement`: the backup of a dead primary takes over, a
   new backup is named for every range that lost one), which ranges have no copy left, and
   the steps each worker finished;
4. a range with no copy left stops the job (:class:`hpcps.comm.ft.ServerLost`, on every
   survivor) with ``on_server_loss = "restart"``; with ``"reload"`` the first server picks
   the newest valid checkpoint this run wrote and broadcasts its step ``K``; the range is
   reloaded from it (its initial values when there is none, ``K = 0``);
5. the role communicators are split again (:func:`hpcps.comm.core.rebuild_roles`).

Steps. ``C_w``, the steps old worker ``w`` finished, is the largest number of CLOCK messages a
surviving server received from it — or, for a survivor that keeps its pushes, its own clock
if larger (a CLOCK may have been lost in flight when the communicator was revoked). A worker
sends all pushes of a step before that step's CLOCK, so a server holding a dead worker's
pushes of step ``C_w - 1`` without its CLOCK applies them (with the examples another server
received), and pushes of steps ``>= C_w`` are dropped everywhere: every worker's step is
applied entirely or not at all.

Key ranges. Each range resumes at ``base_r = max(S_r, B_r)``, where ``S_r`` is the clock of
the copy it resumes from (its primary's, its backup's, or the checkpoint's ``K``) and
``B_r`` the largest first step any surviving worker still keeps for it. The range drops what
its surviving workers sent and it had not applied; they send their kept pushes and CLOCKs
of steps ``base_r .. C_w - 1`` again. A backup acknowledges every clock before a worker can
read it, so ``B_r <= S_r`` whenever a copy survived: nothing is lost and nothing applied twice.
For a reloaded range ``base_r - K`` steps of updates are lost (``lost_steps``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from hpcps.comm import core, ft
from hpcps.comm.collectives import allgather_rows, bcast_int
from hpcps.resilience.plan import (Plan, ServerReport, WorkerReport, lost_message, make_plan,
                                   report_row)

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
        Steps each old worker finished (``C_w``).
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
    seconds : float
        Time the agreement took on this rank.
    plan : Plan
    dead_servers : list of int
        Original indices of the servers that died.
    owner_ranks : tuple of int
        ``ps`` rank (new layout) of each range's primary: where workers send its requests.
    base : int64 ndarray (n_ranges,)
        Clock each range resumes at; surviving workers send their kept steps from it.
    lost_steps : int64 ndarray (n_ranges,)
        Steps of updates each range lost (reloaded ranges only).
    reload_step : int or None
        Step of the checkpoint the lost ranges are reloaded from (0 with no checkpoint:
        initial values); None when no range was lost.
    resend : bool
        Surviving workers send their kept pushes again (BSP/SSP).
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
    plan: Plan | None = None
    dead_servers: list = field(default_factory=list)
    owner_ranks: tuple = ()
    base: np.ndarray | None = None
    lost_steps: np.ndarray | None = None
    reload_step: int | None = None
    resend: bool = False


class FTState:
    """Continue mode's state: the job's membership (shared with :class:`~hpcps.resilience.elastic.Elastic`)
    and the failures survived so far (mutable; a recovery changes the membership in place and
    the job's wiring reads it at the end).

    Attributes
    ----------
    membership : hpcps.comm.membership.Membership
        The one membership object of this rank: ``roles``, ``hosts`` (host of every rank of the
        original layout, ``ps`` rank order), ``world_ranks`` (original ``ps`` rank of every
        rank of the current ``roles.ps``), ``server_ids`` (original index of each server of
        the current layout), ``range_ranks``; also readable here by those names. A recovery
        changes it (:meth:`~hpcps.comm.membership.Membership.change`).
    events : list of dict
        One record per failure: time, failed ranks and hosts, workers lost, examples
        reassigned, ranges moved or reloaded, steps lost, recovery seconds.
    recoveries : int
        Failures survived by this rank.
    n_ranges : int
        Key ranges of the partition (the servers of the launch).
    replicas : int
        Copies of each range (``[fault_tolerance] replicas``).
    on_server_loss : str
        ``"reload"`` or ``"restart"`` (``[fault_tolerance] on_server_loss``).
    run_dir : path-like or None
        Where the checkpoints are (to reload a lost range).
    """

    def __init__(self, membership, n_ranges=1, replicas=1, on_server_loss="restart",
                 run_dir=None, events=None, recoveries=0):
        self.membership = membership
        self.events = list(events) if events is not None else []
        self.recoveries = recoveries
        self.n_ranges = n_ranges
        self.replicas = replicas
        self.on_server_loss = on_server_loss
        self.run_dir = run_dir

    roles = property(lambda self: self.membership.roles)
    hosts = property(lambda self: self.membership.hosts)
    world_ranks = property(lambda self: self.membership.world_ranks)
    server_ids = property(lambda self: self.membership.server_ids)


def recover(state: FTState, report, reload_step_of=None, max_attempts: int = 5) -> Recovery:
    """Run the recovery protocol (module docstring). Collective over every survivor.

    Parameters
    ----------
    state : FTState
        Updated in place: ``roles``, ``world_ranks`` and ``server_ids`` describe the survivors
        afterwards.
    report : ServerReport or WorkerReport
        This rank's row.
    reload_step_of : callable() -> int, servers only
        The step of the checkpoint a lost range is reloaded from (0: none, initial values);
        called on the first surviving server only, when a range was lost.

    Returns
    -------
    Recovery

    Raises
    ------
    hpcps.comm.ft.ServerLost
        On every survivor, when a range has no surviving copy and ``on_server_loss`` is
        ``"restart"`` (or no server survived).
    """
    t0 = time.perf_counter()
    for attempt in range(max_attempts):
        try:
            return _recover_once(state, report, reload_step_of, t0)
        except Exception as e:          # noqa: BLE001 - only a new failure is retried
            if not ft.is_peer_failure(e) or attempt == max_attempts - 1:
                raise
    raise AssertionError("unreachable")


def _recover_once(state, report, reload_step_of, t0) -> Recovery:
    r = state.roles
    old_workers, old_servers = list(r.worker_ranks), list(r.server_ranks)
    new_ps, failed = ft.shrink(r.ps)
    n_old, n_ranges = len(old_workers), state.n_ranges
    is_server = r.role == core.SERVER
    rows = allgather_rows(new_ps, report_row(report, n_ranges, n_old))
    survivors = [f for f in range(r.ps.Get_size()) if f not in failed]
    worker_old_index = [old_workers.index(o) if o in old_workers else -1 for o in survivors]
    old_ids = state.server_ids or list(range(len(old_servers)))
    plan = make_plan(rows, n_ranges, state.replicas, n_old, old_ids, worker_old_index)
    dead_workers = [old_workers.index(f) for f in failed if f in old_workers]
    failed_world = [state.world_ranks[f] for f in failed] if state.world_ranks else list(failed)
    failed_hosts = [state.hosts[w] if w < len(state.hosts) else "" for w in failed_world] \
        if state.hosts else []
    if plan.lost_ranges and (state.on_server_loss != "reload" or not plan.alive_ids):
        raise ft.ServerLost(lost_message(state.on_server_loss, plan, failed_world))
    reload_step = None
    if plan.lost_ranges:
        first = [i for i in range(len(rows)) if rows[i, 0] == 1 and rows[i, 1] == plan.alive_ids[0]][0]
        step = 0
        if is_server and int(report.server_id) == plan.alive_ids[0] and reload_step_of is not None:
            step = int(reload_step_of())
        reload_step = bcast_int(new_ps, step, root=first)
    my_key = int(report.server_id) if is_server else r.index
    roles = core.rebuild_roles(new_ps, r.role, my_key)
    workers = list(roles.worker_ranks)
    old_index = {new: worker_old_index[rank] for new, rank in enumerate(workers)}
    owner_ranks = tuple(roles.server_ranks[plan.alive_ids.index(c[0])] for c in plan.chains)
    state.membership.change(
        roles, range_ranks=owner_ranks, server_ids=plan.alive_ids,
        world_ranks=[state.world_ranks[f] for f in survivors] if state.world_ranks else [])
    state.recoveries += 1
    k = reload_step or 0
    return Recovery(roles=roles, dead_workers=dead_workers, clocks=plan.clocks.copy(),
                    examples=plan.examples.copy(), old_index=old_index, failed_ranks=failed,
                    failed_world_ranks=failed_world, failed_hosts=failed_hosts,
                    seconds=time.perf_counter() - t0, plan=plan, dead_servers=plan.dead_ids,
                    owner_ranks=owner_ranks, base=plan.base(k), lost_steps=plan.lost_steps(k),
                    reload_step=reload_step, resend=plan.resend, epochs=plan.last_epochs.copy())


