"""Grow a running job: add workers while it trains (elastic scale-out).

How a user asks
    * in the job file, for a fixed plan (what the tests use): ``[elastic] add_workers = N``,
      ``at_step = K`` — N workers join when the workers' clock reaches K;
    * from outside, while the job runs: ``hpcps grow RUN_DIR --workers N`` checks that a job
      runs there (``RUN_DIR/running.json``, written by the chief while it trains) and writes
      ``RUN_DIR/grow-request.json``. The chief (worker 0) looks for it at most once a second,
      between two steps; the workers agree on it in the vote they hold anyway for stop
      signals (under BSP one Allreduce per step; under SSP/async a non-blocking vote, then
      the largest clock) and add the workers at that clock. The outcome goes to
      ``RUN_DIR/grow-answer.json`` (read by ``hpcps grow``) and to the job's log.

Protocol at the agreed clock ``T`` (collective over every rank; :meth:`Elastic.grow`)
    1. each worker pushes what it holds (Downpour), ends its stop vote and sends GROW to every
       server after its last request of clock ``T``; a server that has GROW from every
       worker has answered all their requests, and its clock is ``T``;
    2. every rank calls ``MPI_Comm_spawn`` over the job's communicator (root: the chief):
       ``N`` processes ``python -m hpcps join`` (:mod:`hpcps.comm.spawn`);
    3. both sides ``Merge`` the intercommunicator: the old ranks first, in their old order;
    4. the chief broadcasts what the new workers need (:class:`JoinPlan`): the job file's
       text and path, the output directory, the pull mode in use, the clock, the epoch and
       the plan of its segments, and the table layout — int64 and UTF-8/JSON buffers, no
       pickle;
    5. the new workers parse the job, load the model and compare its tables with the layout;
       all ranks agree that they could (one Allreduce). If one could not, the new processes
       leave and the job goes on as before, saying why;
    6. the roles are rebuilt over the merged communicator as after a failure
       (:func:`hpcps.comm.core.rebuild_roles`): the new workers get indices ``n_old ..
       n_old + N - 1``; with ``pull = "rma"`` new windows are allocated (headers for the new
       worker count), the servers copy their shards into them and the old ones are freed;
    7. every worker — old and new — re-plans the rows of the epoch that nobody has read over
       the ``n_old + N`` workers (:func:`hpcps.core.planning.epoch_rows`, as after a failure
       or a restart on another worker count), so every example of the epoch is read exactly
       once; later epochs use the new partition. From clock ``T`` on the servers wait for every
       worker (BSP/SSP) and sum their pushes in worker order.

Where the launcher cannot start processes (:func:`hpcps.comm.spawn.spawn_unavailable`), or
the spawn fails (no free slot), every rank learns it at the request, the chief says why and
the job continues without growing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcps.comm import core, ft, notices, spawn
from hpcps.comm.collectives import allreduce_max, barrier, bcast_array
from hpcps.comm.membership import Membership
from hpcps.comm.rma import allocate_windows
from hpcps.comm.rma import free_windows
from hpcps.config import parse_job
from hpcps.core.runplan import RunPlan
from hpcps.core.threads import usable_cores
from hpcps.models.load import load_model
from hpcps.resilience.grow_request import (REQUEST, RUNNING, GrowError, read_request, unlink, write_answer,
                           write_running)
from hpcps.resilience.recovery import FTState
from hpcps.server.shard import window_sizes

#: Seconds between two looks of the chief for a request.
POLL_SECONDS = 1.0
#: Seconds an added worker waits for the job's plan (its own job file is not read yet).
JOIN_TIMEOUT = 300.0
_FORMAT = 1


class GrowthFailed(RuntimeError):
    """A process died, or MPI failed, while workers were being added: the ranks are between
    two layouts, so the job stops (and resumes from its last checkpoint on a restart)."""


def _failed(e: BaseException, clock) -> BaseException:
    """``e`` as a :class:`GrowthFailed` when it is an MPI error (so that continue mode does
    not take it for a failure it can recover from), else ``e`` itself."""
    if not ft.is_mpi_error(e):
        return e
    at = f" at clock {clock}" if clock is not None else ""
    return GrowthFailed(f"a process died or MPI failed while workers were being added{at} "
                        f"({e}); the job stops and resumes from its last checkpoint on a restart "
                        "(hpcps run --max-restarts, or the Slurm script's requeue)")


# ------------------------------------------------------------------------- the join plan


@dataclass
class JoinPlan:
    """What added workers need to start at clock ``clock`` (broadcast by the chief).

    Attributes
    ----------
    clock : int
        Worker clock at which they join (every old worker's clock).
    epoch : int
        Epoch in progress (0-based).
    n_old : int
        Workers before the growth.
    plan : list of [n_workers, steps_done]
        The epoch's segments so far, the one just ended included
        (:func:`hpcps.core.planning.epoch_rows`).
    job_text, job_path, output_dir, pull : str
        The job file, where it lies (relative data paths), the run directory, and the pull
        mode in use (``rma_fallback`` may have switched it to p2p).
    tables : int64 ndarray (n_tables, 4)
        ``num_keys, dim, sparse, itemsize`` of every table, in table-id order.
    world_ranks : list of int
        Continue mode: original rank numbers of the merged communicator (empty otherwise).
    range_ranks : list of int
        Continue mode: the rank (of the merged communicator) holding each key range, which
        after a server loss is not always ``server_ranks[r]`` (empty otherwise).
    server_ids : list of int
        Continue mode: original indices of the servers alive (empty otherwise).
    hosts : list of str
        Continue mode: the host of every original rank number before the growth (empty
        otherwise).
    nonfinite_rejected : int
        Steps rejected so far by the workers' vote on non-finite values (BSP), which every
        worker counts alike.
    """

    clock: int
    epoch: int
    n_old: int
    plan: list
    job_text: str
    job_path: str
    output_dir: str
    pull: str
    tables: np.ndarray
    world_ranks: list = field(default_factory=list)
    nonfinite_rejected: int = 0
    range_ranks: list = field(default_factory=list)
    server_ids: list = field(default_factory=list)
    hosts: list = field(default_factory=list)

    @staticmethod
    def layout(specs) -> np.ndarray:
        """The table layout of ``specs`` (list of TableSpec), int64 ``(n_tables, 4)``."""
        return np.array([[s.num_keys, s.dim, int(s.sparse), np.dtype(s.dtype).itemsize]
                         for s in specs], dtype=np.int64).reshape(-1, 4)

    def check_tables(self, specs) -> None:
        """Raise ``ValueError`` naming the first table whose layout differs from ``specs``."""
        mine = self.layout(specs)
        if mine.shape != self.tables.shape:
            raise ValueError(f"the running job has {self.tables.shape[0]} table(s), this "
                             f"worker's model {mine.shape[0]}")
        for spec, a, b in zip(specs, self.tables, mine):
            if not np.array_equal(a, b):
                raise ValueError(f"table {spec.name!r}: the running job has (num_keys, dim, "
                                 f"sparse, itemsize) = {tuple(map(int, a))}, this worker's "
                                 f"model {tuple(map(int, b))}")

    @classmethod
    def bcast(cls, comm, plan: "JoinPlan | None", root: int) -> "JoinPlan":
        """Broadcast ``plan`` from ``root`` (None elsewhere) with buffer calls. Collective."""
        ints = blob = None
        if plan is not None:
            ints = np.concatenate([[_FORMAT, plan.clock, plan.epoch, plan.n_old],
                                   plan.tables.reshape(-1)]).astype(np.int64)
            blob = np.frombuffer(json.dumps({
                "plan": plan.plan, "job_text": plan.job_text, "job_path": plan.job_path,
                "output_dir": plan.output_dir, "pull": plan.pull,
                "world_ranks": plan.world_ranks, "range_ranks": list(plan.range_ranks),
                "server_ids": list(plan.server_ids), "hosts": list(plan.hosts),
                "nonfinite_rejected": plan.nonfinite_rejected}).encode(), dtype=np.uint8)
        ints = bcast_array(comm, ints, np.int64, root)
        blob = bcast_array(comm, blob, np.uint8, root)
        if int(ints[0]) != _FORMAT:
            raise RuntimeError(f"join plan format {int(ints[0])}, expected {_FORMAT}")
        d = json.loads(blob.tobytes().decode())
        return cls(clock=int(ints[1]), epoch=int(ints[2]), n_old=int(ints[3]), plan=d["plan"],
                   job_text=d["job_text"], job_path=d["job_path"], output_dir=d["output_dir"],
                   pull=d["pull"], tables=ints[4:].reshape(-1, 4).copy(),
                   world_ranks=list(d["world_ranks"]), range_ranks=list(d["range_ranks"]),
                   server_ids=list(d["server_ids"]), hosts=list(d["hosts"]),
                   nonfinite_rejected=int(d["nonfinite_rejected"]))


# ------------------------------------------------------------------- the job's membership


class Elastic:
    """The growth of the job, over its membership (:class:`hpcps.comm.membership.Membership`:
    roles, tables, RMA windows; in continue mode the same object as the
    :class:`hpcps.resilience.recovery.FTState`'s, so a recovery and a growth change one
    layout, each through :meth:`Membership.change`). One per rank; ``hpcps.runtime.job``
    reads the final ``roles`` and ``windows``.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    membership : hpcps.comm.membership.Membership
        This rank's layout (roles, tables, RMA windows; empty windows for p2p pulls).
    ft_state : hpcps.resilience.recovery.FTState or None
    out : text stream for the chief's messages
    run : hpcps.core.runplan.RunPlan, optional
        The run's decisions (the pull mode in use, after an RMA fallback); default: as
        ``cfg`` says.

    Attributes
    ----------
    events : list of dict
        The chief's record of every growth and refused request (time, clock, epoch, workers
        added, rows re-planned, seconds).
    unavailable : str or None
        Why this launch cannot add processes (:func:`hpcps.comm.spawn.spawn_unavailable`).
    """

    def __init__(self, cfg, membership, ft_state=None, out=None, run=None):
        self.cfg = cfg
        self.run = run if run is not None else RunPlan.of(cfg)
        # the rank's one membership object (continue mode: the recovery changes it too)
        self.membership = membership
        self.specs = membership.specs
        self.ft = ft_state
        self.out = out or sys.stdout
        self.events: list = []
        self.intercomms: list = []
        self.unavailable = spawn.spawn_unavailable()
        if cfg.comm.aggregate != "off":           # groups are formed once, at the start
            self.unavailable = ("its workers step in groups ([comm] aggregate = "
                                f"{cfg.comm.aggregate!r}), formed at the start")
        self.run_dir = Path(cfg.output.dir)
        self._next_poll = 0.0
        self._started = time.time()
        self.node_ranks = 0                       # ranks on this node after the last growth
        self.request: dict | None = None          # chief: a request taken, not yet acted on

    def oversubscribed(self) -> bool:
        """Whether this node has more ranks than usable cores since the last growth. Local."""
        return self.node_ranks > usable_cores()

    @property
    def roles(self):
        """This rank's :class:`~hpcps.comm.core.Roles` (the membership's)."""
        return self.membership.roles

    @property
    def windows(self) -> list:
        """The RMA windows of the current layout (the membership's)."""
        return self.membership.windows

    # ------------------------------------------------------------ triggers (workers)
    def planned(self, clock: int) -> tuple[int, bool]:
        """Workers the job file adds at ``clock`` (``[elastic] add_workers`` once the clock
        reaches ``at_step``) and whether they may share cores. Local; the same on every
        worker."""
        e = self.cfg.elastic
        return (e.add_workers, e.oversubscribe) if e.add_workers and clock == e.at_step else (0, False)

    def poll_request(self) -> tuple[int, bool]:
        """Chief: the workers a ``hpcps grow`` request asks for (0 if none), looking at the run
        directory at most every :data:`POLL_SECONDS`. A request taken is offered until it is
        acted on (:meth:`grow` answers it). A bad or unserviceable request is answered at once.
        Local."""
        if self.request is not None:
            return int(self.request["workers"]), bool(self.request["oversubscribe"])
        now = time.monotonic()
        if now < self._next_poll:
            return 0, False
        self._next_poll = now + POLL_SECONDS
        path = self.run_dir / REQUEST
        if not path.exists():
            return 0, False
        try:
            req = read_request(path)
        except GrowError as e:
            self._answer({"id": None}, "refused", str(e))
            unlink(path)
            return 0, False
        unlink(path)
        who = f"{req.get('user', '?')}@{req.get('host', '?')}"
        if self.unavailable:
            self._answer(req, "refused", f"cannot add workers to this job: {self.unavailable}")
            return 0, False
        self.request = req
        self._say(f"hpcps: request from {who}: add {req['workers']} worker(s); the workers "
                  "agree on the clock")
        return int(req["workers"]), bool(req["oversubscribe"])

    def cancel_request(self, why: str) -> None:
        """Chief: answer a taken request without acting on it (the job stops). Local."""
        if self.request is not None:
            self._answer(self.request, "refused", why)
            self.request = None

    # ------------------------------------------------------------ growth (every rank)
    def grow(self, n: int, clock: int, adopt=None, oversubscribe: bool = False, join=None):
        """Add ``n`` workers at ``clock`` (module docstring, steps 2-6). Collective over every
        rank of the job; the workers call it after sending GROW (:meth:`PSClient.grow`), the
        servers once they have GROW from every worker.

        Parameters
        ----------
        n : int
        clock : int
        adopt : callable() or None
            The server's step into the new layout, read from the membership (changed already):
            called between the allocation of the new windows and the release of the old ones,
            before any worker reads a new window (a server moves its shards into them). A
            worker passes None and follows the membership once this returns
            (:meth:`hpcps.worker.trainer.Trainer.follow`).
        oversubscribe : bool
        join : JoinPlan or None
            The chief's plan for the new workers (None elsewhere).

        Returns
        -------
        dict or None
            The event (time, seconds, workers, ...) when the workers were added, ``None``
            when they were not (the same on every rank; the chief has said why).
        """
        r, m = self.roles, self.membership
        t0 = time.perf_counter()
        world_ranks = []                              # continue mode: numbers of the new layout
        if self.ft is not None:
            # new numbers after every number ever used (a dead rank's too: its host is kept)
            top = max(max(m.world_ranks, default=-1) + 1, len(m.hosts))
            world_ranks = list(m.world_ranks) + list(range(top, top + n))
            if join is not None:
                join.world_ranks = world_ranks
                join.server_ids = list(m.server_ids)
                join.hosts = list(m.hosts)
        event = {"time": time.time(), "clock": int(clock), "workers_requested": int(n),
                 "trigger": "request" if self.request is not None else "job file"}
        if core.any_rank_failed(r.ps, self.unavailable is not None):
            return self._refused(event, f"cannot add workers: {self.unavailable or 'see rank 0'}")
        timeout = self.cfg.elastic.join_timeout
        with core.watchdog(r.ps, timeout, f"adding {n} worker(s) at clock {clock}"):
            inter, error = spawn.spawn_workers(r.ps, n, r.worker_ranks[0], oversubscribe,
                                               deadline=timeout)
            if inter is not None:
                return self._handshake(inter, r, n, clock, adopt, join, event, t0, world_ranks)
        slots = spawn.universe_size(r.ps)
        return self._refused(event, f"{error} (the launch has {slots} slot(s) for "
                                    f"{r.ps.Get_size()} running rank(s); give mpirun more "
                                    "slots, or let the new workers share cores: [elastic] "
                                    "oversubscribe = true, hpcps grow --oversubscribe)")

    def _handshake(self, inter, r, n, clock, adopt, join, event, t0, world_ranks):
        """Steps 3-6 on the parents' side (:meth:`grow`); collective with the new workers."""
        event["spawn_seconds"] = round(time.perf_counter() - t0, 3)
        with ft.unwatched():            # the new workers' collectives are blocking ones
            return self._meet(inter, r, n, clock, adopt, join, event, t0, world_ranks)

    def _meet(self, inter, r, n, clock, adopt, join, event, t0, world_ranks):
        """:meth:`_handshake` after the spawn. Collective with the new workers."""
        try:
            merged = spawn.merge(inter, high=False)
            ft.errors_return(merged)                  # a process lost now: an error, not a hang
            chief = int(allreduce_max(merged, np.array([merged.Get_rank() if r.is_chief else -1],
                                                       dtype=np.int64))[0])
            JoinPlan.bcast(merged, join, chief)
            if core.any_rank_failed(merged, False):  # a new worker could not load the job
                merged.Free()
                spawn.disconnect(inter)
                return self._refused(event, "the new workers could not start (their error is above)")
            layout = {}
            if self.ft is not None:                   # continue mode's failure records
                hosts = core.allgather_hostnames(merged)
                layout = dict(world_ranks=world_ranks,
                              hosts=list(self.membership.hosts) + hosts[r.ps.Get_size():])
            old_windows = list(self.windows)
            roles = self._settle(merged, r.role, r.index, adopt, **layout)
        except Exception as e:                        # noqa: BLE001 - see GrowthFailed
            raise _failed(e, clock) from e
        if old_windows:
            free_windows(old_windows)                 # collective over the old ranks
        r.free()
        self.intercomms.append(inter)
        self._watch()
        event.update(workers_added=int(n), workers=roles.n_workers,
                     seconds=round(time.perf_counter() - t0, 3))
        if r.is_chief:
            self.events.append(event)
            if self.request is not None:
                self._answer(self.request, "grown", f"{n} worker(s) added at clock {clock}: "
                             f"{roles.n_workers} workers", clock=clock, workers=roles.n_workers)
                self.request = None
            self.mark_running()
        return event

    def _settle(self, merged, role, key, adopt, **layout):
        """Step 6: roles over ``merged``, BLAS threads for the node's new rank count
        (``node_ranks``), new RMA windows, the membership's change (with ``layout``: continue
        mode's ``world_ranks`` and ``hosts``), ``adopt``; the input-error notices go over
        ``merged`` from now on (:func:`hpcps.comm.notices.follow`). Returns the new roles.
        Collective over ``merged`` (old and new ranks alike)."""
        roles = core.rebuild_roles(merged, role, key)
        notices.follow(merged)
        self.node_ranks = core.node_size(merged)
        core.limit_threads(merged, self.node_ranks)
        windows = []
        if self.run.pull == "rma":
            sizes = (window_sizes(self.specs, roles.index, roles.n_servers, roles.n_workers)
                     if role == core.SERVER else [0] * len(self.specs))
            windows = allocate_windows(merged, sizes)
        self.membership.change(roles, windows=windows, **layout)
        if adopt is not None:
            adopt()
        if windows:
            barrier(merged)                           # shards copied before any read
        return roles

    def _watch(self) -> None:
        """Continue mode: every wait watches the job's new communicator. Local."""
        if self.ft is not None:
            ft.watch(self.roles.ps)

    @classmethod
    def join(cls, out=None, deadline=None):
        """In a process started by :meth:`grow` (``hpcps join``): meet the job, load it, take
        the new layout. Collective with every rank of the job (the other side of steps 3-6).

        ``deadline``: the timer that ends this process if it has not joined in time
        (:func:`hpcps.core.procs.exit_after`, started before ``MPI_Init``), cancelled here once
        it has joined or left.

        Returns
        -------
        (Elastic, JoinPlan, cfg, model) or None
            None when this or another new worker could not load the job (it then leaves).

        Raises
        ------
        hpcps.comm.core.LaunchError
            When this process was not started by a running job.
        """
        parent = spawn.parent()
        if parent is None:
            raise core.LaunchError("`hpcps join` is started by a running job to add workers "
                                   "(hpcps grow, [elastic] add_workers); it cannot run by itself")
        try:
            merged = spawn.merge(parent, high=True)
            ft.errors_return(merged)
            with core.watchdog(merged, JOIN_TIMEOUT, "meeting the running job"):
                chief = int(allreduce_max(merged, np.array([-1], dtype=np.int64))[0])
                plan = JoinPlan.bcast(merged, None, chief)
        except Exception as e:                        # noqa: BLE001 - see GrowthFailed
            raise _failed(e, None) from e
        error = None
        try:
            cfg = parse_job(plan.job_text, plan.job_path)
            if cfg.output.dir != Path(plan.output_dir):
                raise ValueError(f"the running job writes to {plan.output_dir}, its job file "
                                 f"read here to {cfg.output.dir}")
            model = load_model(cfg)
            specs = [t[0] for t in model.tables()]
            plan.check_tables(specs)
        except Exception as e:                   # noqa: BLE001 - reported, then the job goes on
            error = f"{type(e).__name__}: {e}"
        if core.any_rank_failed(merged, error is not None):
            if error:
                sys.stderr.write(f"hpcps: added worker {merged.Get_rank()} on {core.hostname()}: "
                                 f"{error}\n")
                sys.stderr.flush()
            merged.Free()
            spawn.disconnect(parent)
            if deadline is not None:
                deadline.cancel()
            return None
        ft_state = None
        membership = Membership(None, specs=specs, range_ranks=plan.range_ranks)
        if cfg.fault_tolerance.mode == "continue" and plan.world_ranks:
            f = cfg.fault_tolerance
            hosts = core.allgather_hostnames(merged)    # as the running job does
            membership.world_ranks = list(plan.world_ranks)
            membership.hosts = list(plan.hosts) + hosts[parent.Get_remote_size():]
            membership.server_ids = list(plan.server_ids)
            ft_state = FTState(n_ranges=len(plan.range_ranks), replicas=f.replicas,
                               on_server_loss=f.on_server_loss, run_dir=Path(plan.output_dir),
                               membership=membership)
        # the running job's pull mode (p2p after its RMA fallback), not the job file's
        run = dataclasses.replace(RunPlan.of(cfg), pull=plan.pull,
                                  rma_fallback=plan.pull != cfg.consistency.pull)
        self = cls(cfg, membership, ft_state, out, run=run)
        key = plan.n_old + merged.Get_rank() - parent.Get_remote_size()   # after the old ones
        try:
            with core.watchdog(merged, cfg.elastic.join_timeout, "joining the running job"):
                self._settle(merged, core.WORKER, key, None)
        except Exception as e:                        # noqa: BLE001 - see GrowthFailed
            raise _failed(e, plan.clock) from e
        if deadline is not None:
            deadline.cancel()
        self._watch()
        self.intercomms.append(parent)
        return self, plan, cfg, model

    def close(self) -> None:
        """Disconnect the intercommunicators of the growths (after the roles' communicators
        were freed). Collective with the processes at their other ends."""
        for inter in self.intercomms:
            spawn.disconnect(inter)
        self.intercomms = []

    # ------------------------------------------------------------ run directory (chief)
    def mark_running(self) -> None:
        """Chief: write ``RUN_DIR/running.json`` (who runs, how many workers, whether it can
        grow), which ``hpcps grow`` checks. Local."""
        r = self.roles
        write_running(self.run_dir, {
            "job": self.cfg.name, "job_file": str(self.cfg.path), "pid": os.getpid(),
            "host": socket.gethostname(), "started": self._started,
            "mode": self.cfg.cluster.mode, "workers": r.n_workers, "servers": r.n_servers,
            "can_grow": self.unavailable is None, "why_not": self.unavailable or ""})

    def clear_running(self) -> None:
        """Chief: remove ``RUN_DIR/running.json`` at the end; a request still pending is
        answered (the job ended before acting on it). Local."""
        self.cancel_request("the job ended before the workers could be added")
        pending = self.run_dir / REQUEST
        if pending.exists():
            try:
                self._answer(read_request(pending), "refused", "the job ended before it read "
                             "the request")
            except GrowError:
                pass
            unlink(pending)
        unlink(self.run_dir / RUNNING)

    def _refused(self, event: dict, why: str):
        if self.roles.is_chief:
            event["refused"] = why
            self.events.append(event)
            self._say(f"hpcps: {why}; the job continues with {self.roles.n_workers} worker(s)")
            if self.request is not None:
                self._answer(self.request, "refused", why)
                self.request = None
        return None

    def _answer(self, req: dict, status: str, message: str, **extra) -> None:
        write_answer(self.run_dir, req.get("id"), status, message, **extra)
        if status != "grown":
            self._say(f"hpcps: grow request refused: {message}")

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
