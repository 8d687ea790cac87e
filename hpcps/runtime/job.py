"""One training job inside an MPI world: the wiring. Split roles, serve or train, gather the
report, write the outputs.

Called by ``hpcps train`` on every rank of the launch (collective over the world). The checks
before training live in :mod:`hpcps.runtime.preflight`, the AllReduce mode in
:mod:`hpcps.runtime.allreduce`, the report in :mod:`hpcps.runtime.report` and the writes of
``metrics.json`` in :mod:`hpcps.runtime.metrics`.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.analysis import consistency_report
from hpcps.comm import core
from hpcps.comm import ft
from hpcps.comm.collectives import allreduce_max, barrier, gather_rows
from hpcps.comm.group import form_groups
from hpcps.comm.core import any_rank_failed
from hpcps.comm.rma import allocate_windows, free_windows
from hpcps.comm.membership import Membership
from hpcps.comm.transport import ServerEndpoint, check_ranges
from hpcps.config import check_world
from hpcps.core import log
from hpcps.core.atomic import jsonable
from hpcps.core.consistency import policy_from_config
from hpcps.core.signals import EXIT_REQUEUE
from hpcps.resilience.elastic import Elastic
from hpcps.resilience.recovery import FTState
from hpcps.resilience.replica import ServerGroup
from hpcps.resilience.supervisor import Supervisor
from hpcps.runtime import metrics
from hpcps.runtime.allreduce import run_allreduce
from hpcps.runtime.output import write_model
from hpcps.runtime.rundir import RunDir, find_restore, growth_records, launch_records
from hpcps.runtime.preflight import (  # noqa: F401 - importable from here as before
    ResourceError, available_memory, check_memory, check_rma_progress, limit_threads,
    load_model, server_bytes)
from hpcps.runtime.report import RankStats, print_summary, sklearn_baseline, summarize  # noqa: F401
from hpcps.sandblaster.run import run_sandblaster
from hpcps.server.server import ParameterServer, window_sizes
from hpcps.worker.checkpointer import Checkpointer
from hpcps.worker.client import PSClient
from hpcps.worker.export import model_tables
from hpcps.worker.trainer import Trainer



def run_job(cfg, world, out=None, resume="auto", stop=None, step_hook=None,
            restart=None) -> dict | None:
    """Run job ``cfg`` on communicator ``world``. Collective over ``world``.

    Returns the summary dict on the chief (world rank 0), ``{"stopped_by_signal": bool}``
    elsewhere, ``{"already_finished": True, ...}`` on every rank when the run had finished.
    ``resume`` is ``"auto"``, ``"require"``, ``"never"`` or a checkpoint directory
    (:func:`find_restore`). ``stop`` (:class:`hpcps.core.signals.StopRequest`) lets a signal end
    the training after one checkpoint. ``step_hook(worker_index, clock)``, if given, is called
    by every worker in each step between computing the gradient and pushing it (tests slow a
    worker down with it). ``restart``: ``(n, status)`` when ``hpcps run`` relaunched the job
    after a failure (restart ``n``, the failed launch's exit status), recorded with every
    launch of the run in ``metrics.json`` (``summary.launches``).

    Raises
    ------
    hpcps.config.ConfigError, hpcps.comm.core.LaunchError, hpcps.checkpoint.ResumeError
        Before any parameter-server traffic, identically on every rank.
    """
    out = out or sys.stdout
    core.check_launch(world)
    check_world(cfg, world.Get_size())
    limit_threads(world)
    if cfg.cluster.mode == "allreduce":
        return run_allreduce(cfg, world, out, stop=stop, step_hook=step_hook)
    if cfg.cluster.mode == "sandblaster":        # batch L-BFGS (hpcps.sandblaster)
        return run_sandblaster(cfg, world, out, resume=resume, stop=stop, step_hook=step_hook)
    run = check_rma_progress(cfg, world, out)     # the pull mode in use (cfg unchanged)
    policy = policy_from_config(cfg.consistency)
    model = load_model(cfg)
    tables = model.tables()
    specs = [t[0] for t in tables]
    restore = find_restore(cfg, world, resume, out)
    if restore is not None and restore.finished:      # every rank: the record stays as it is
        return {"stopped_by_signal": False, "already_finished": True}
    if restore is not None:
        ckpt.check_compatible(restore[0], restore[1], specs,  # every rank, before any traffic
                              slots={spec.name: opt.slot_names for spec, opt in tables})
        if restore.refuse:
            raise ckpt.ResumeError(restore.refuse)
    check_memory(cfg, tables, world)
    check_ranges(world, cfg.cluster.servers)
    roles = core.split_roles(world, cfg.cluster.servers)
    continue_mode = _continue_mode(cfg, roles, world, out)
    hosts = core.allgather_hostnames(roles.ps) if continue_mode else ()
    windows = []
    if run.pull == "rma":                       # one window per table (collective)
        sizes = (window_sizes(specs, roles.index, roles.n_servers, roles.n_workers)
                 if roles.role == core.SERVER else [0] * len(specs))
        windows = allocate_windows(roles.ps, sizes)
    # the job's layout on this rank, built once: read by the server and worker loops, and
    # changed by the recovery and the growth (hpcps.comm.membership)
    membership = Membership(roles, windows, specs=specs, hosts=hosts,
                            world_ranks=range(world.Get_size()) if continue_mode else (),
                            server_ids=range(roles.n_servers) if continue_mode else ())
    ft_state = None
    if continue_mode:
        f = cfg.fault_tolerance
        ft_state = FTState(membership, n_ranges=roles.n_servers, replicas=f.replicas,
                           on_server_loss=f.on_server_loss, run_dir=cfg.output.dir)
    elastic = Elastic(cfg, membership, ft_state, out, run=run)
    return _run_roles(cfg, elastic, model, tables, policy, out, restore=restore, stop=stop,
                      step_hook=step_hook, restart=restart)


def join_job(out=None, stop=None, deadline=None) -> dict:
    """Run as a worker added to a running job (``hpcps join``, started by
    :meth:`hpcps.resilience.elastic.Elastic.grow`): meet the job, then train as its other workers do.
    Collective with every rank of the running job. ``deadline``: see
    :meth:`~hpcps.resilience.elastic.Elastic.join`.

    Returns
    -------
    dict
        ``{"stopped_by_signal": bool}``; ``{"joined": False}`` when the job could not be
        loaded here (the job goes on without this process).
    """
    out = out or sys.stdout
    joined = Elastic.join(out, deadline)
    if joined is None:
        return {"joined": False, "stopped_by_signal": False}
    elastic, plan, cfg, model = joined
    m = elastic.membership                 # this worker's number in the job, in its lines
    me = m.roles.ps.Get_rank()
    log.set_rank(m.world_ranks[me] if m.world_ranks else me)
    return _run_roles(cfg, elastic, model, model.tables(), policy_from_config(cfg.consistency),
                      out, stop=stop, join=plan)


def _run_roles(cfg, elastic, model, tables, policy, out, restore=None, stop=None,
               step_hook=None, join=None, restart=None) -> dict:
    """Serve or train on the layout of ``elastic`` (servers and workers of the launch, or an
    added worker when ``join`` is given), then gather the statistics and write the outputs.
    Collective over every rank of the job (which may change while it runs)."""
    roles, windows, ft_state = elastic.roles, elastic.windows, elastic.ft
    if not policy.bsp:
        core.shorten_timer_slack()          # replies come soon after requests (not BSP)
    specs = [t[0] for t in tables]
    t_start = time.perf_counter()
    mine = RankStats(index=roles.index)          # this rank's counters for the report
    result = None
    history: list = []
    launches = []                     # this run's launches, this one last (workers)
    examples_before: dict = {}        # examples per epoch of the earlier launches (chief)
    try:
        if roles.is_chief:
            elastic.mark_running()
        server = client = trainer = group = supervisor = None
        served = roles.worker_ranks          # a server's workers
        if cfg.comm.aggregate == "node":     # one per group and server (collective)
            group, served = form_groups(roles, cfg.comm.group_workers)
        if roles.role == core.SERVER:
            ep = ServerEndpoint(roles.ps, cfg.comm.max_message_bytes)
            if ft_state is not None:                 # key ranges as primary and backup
                server = ServerGroup(ep, ft_state, roles.index, roles.worker_ranks, tables,
                                     policy, seed=cfg.seed, restore=restore, elastic=elastic)
            else:
                args = (ep, roles.index, roles.n_servers, served, tables, policy)
                common = dict(windows=windows, run_dir=cfg.output.dir, elastic=elastic)
                server = (ParameterServer.from_checkpoint(*args, restore=restore, seed=cfg.seed,
                                                            **common)
                          if restore is not None else
                          ParameterServer.initial(*args, seed=cfg.seed, **common))
            if windows:
                barrier(roles.ps)                    # windows initialised before any read
            server.serve()
        else:
            # the rank holding each key range: the membership's (an added worker after a
            # server loss: from the join plan)
            client = PSClient(elastic.membership, policy, cfg.comm.max_message_bytes, group)
            if restore is not None:
                client.clock_value = int(restore[1]["step"])
            if join is not None:
                client.clock_value = join.clock
            if ft_state is not None and policy.aggregate:
                client.keep_pushes()                 # sent again to a range after a failure
            if windows and join is None:
                barrier(roles.ps)

            def on_epoch(rec):
                # the trainer's history: epochs of earlier launches (from the checkpoint) + this
                history[:] = trainer.history
                metrics.write_epochs(cfg, history)

            trainer = Trainer(cfg, roles.index, roles.n_workers, client, roles.role_comm,
                              roles.is_chief, on_epoch=on_epoch, out=out, policy=policy,
                              step_hook=step_hook, stop=stop, model=model, ft_state=ft_state,
                              elastic=elastic)
            checkpointer = Checkpointer(cfg, client, roles.role_comm, roles.is_chief,
                                        roles.n_workers, [o.slot_specs(t.dim, t.dtype) for t, o in tables], out,
                                        async_cut=not policy.aggregate, flush=trainer.steps.flush)
            if join is None:
                earlier, this_launch = launch_records(restore, restart)
                launches = earlier + [this_launch]
                elastic.events[:0] = growth_records(restore)      # earlier launches' growths
                if roles.is_chief and restore is not None:      # read now: it may be pruned
                    examples_before.update(ckpt.shard_examples_per_epoch(restore.directory))
                known = json.dumps(launches)
                checkpointer.more = lambda: {"launches": known,
                                             "growth": json.dumps(jsonable(elastic.events))}
            supervisor = Supervisor(trainer, checkpointer)
            result = supervisor.run(restore=restore[1] if restore else None, join=join,
                                    wrap_up=lambda res: _wrap_up(cfg, res, client, elastic, group,
                                                                 checkpointer))
        while True:
            try:
                # the totals of every rank; a peer lost now (continue mode) is recovered, then
                # the servers serve and the workers finish again (STOP) on the survivors
                report = _report(cfg, elastic, server, client, trainer, result, mine, len(specs))
                break
            except Exception as e:           # noqa: BLE001 - only a lost peer is recovered
                if ft_state is None or not ft.is_peer_failure(e):
                    raise
                if server is not None:
                    server.recover()
                    server.serve()
                elif supervisor.last is not None:
                    result = supervisor.finish(recover=True)
                else:                      # no step ran here: nothing to finish again
                    raise
        roles, windows, ranges, rows, hosts, stopped, crows, survived = report
        if trainer is not None:
            history[:] = trainer.history
        free_windows(windows)                        # collective; normal exit path
        if survived:
            _closing_barrier(roles.ps)               # every survivor is done with MPI
    finally:
        if roles.is_chief:
            elastic.clear_running()
        if ft_state is not None:
            ft.watch(None)
        roles.free()
    if not survived:
        elastic.close()                              # disconnect from added workers / parents
    if not roles.is_chief:
        return {"stopped_by_signal": stopped, "skip_finalize": survived}
    if stopped:
        out.write(f"stopped by signal after a checkpoint at clock {result['clock']}; exit status "
                  f"{EXIT_REQUEUE} asks the batch script to requeue the job\n")
        out.flush()
        return {"stopped_by_signal": True}
    summary = summarize(result, [RankStats.from_row(r, len(specs)) for r in rows],
                        time.perf_counter() - t_start, hosts, [t.name for t in specs])
    if launches:
        launches[-1]["steps"] = summary["steps"]
        summary["run_steps"] = int(result["clock"])      # every launch's, to the end
        summary["launches"] = launches
        summary["restarts"] = sum("restart" in r for r in launches)
    if ft_state is not None:
        summary["failures"] = list(ft_state.events)
        if ft_state.events and summary["servers"]:
            # the survivors' own counts leave out what dead workers had done: the examples
            # applied are the servers' count (every server applies every example's step)
            applied = max(d["examples"] for d in summary["servers"])
            summary["examples_counted_by_surviving_workers"] = summary["examples"]
            summary["examples"] = applied
            t = summary["train_seconds"]
            summary["examples_per_second"] = applied / t if t else 0.0
    if elastic.events:
        summary["growth"] = list(elastic.events)
    if summary["servers"]:
        # every launch's examples per epoch (found by a trial: a run of several launches could
        # be checked for "every example once per epoch" only from summary.launches): the
        # earlier launches' up to the checkpoint resumed, then this launch's (servers' counts)
        now = summary["servers"][0]["examples_per_epoch"]
        summary["examples_per_epoch"] = [examples_before.get(e, 0) + int(n)
                                         for e, n in enumerate(now)]
    if ft_state is not None:
        summary["ranges"] = [{"range": r, "server": int(v[0]), "clock": int(v[1]),
                              "examples": int(v[2]), "lost_steps": int(v[3])}
                             for r, v in enumerate(ranges)]
        summary["replicas"] = cfg.fault_tolerance.replicas
        summary["replication_bytes"] = int(ranges[:, 4].clip(0).sum())
    summary["consistency"] = consistency_report.summarize(
        crows, policy, elastic.run.pull, 8 + np.dtype(cfg.model.dtype).itemsize)
    metrics.write_final(cfg, summary, history)
    print_summary(summary, history, out)
    summary["skip_finalize"] = survived
    return summary


def _wrap_up(cfg, result, client, elastic, group, checkpointer) -> None:
    """A worker's part in the end of the run after its totals (``result``, completed here): the
    chief exports the model, then STOP to the servers. Collective over the workers; run again
    after a peer lost meanwhile (continue mode: :meth:`~hpcps.resilience.supervisor.Supervisor.finish`)."""
    roles = elastic.roles
    result["checkpoints"] = {"count": checkpointer.count, "seconds": checkpointer.seconds,
                             "bytes": checkpointer.bytes}
    if roles.is_chief and not result["stopped_by_signal"]:
        # streamed from the servers in chunks while it is written (hpcps.worker.export):
        # the chief never holds a whole table
        t0 = time.perf_counter()
        path = write_model(RunDir(cfg.output.dir).model, model_tables(client), cfg,
                           step=result["clock"], epoch=result["epochs"])
        result["model_path"] = str(path)
        # a trial's 32 M-key model.h5 took 44 s to write, reported nowhere
        result["model_seconds"] = time.perf_counter() - t0
        result["model_bytes"] = path.stat().st_size
    if group is not None:
        # a server's workers are one per group: the chief's last requests (the final
        # checkpoint, the model's PULL_SHARDs) to a server it does not own must be
        # answered before that server's own workers tell it to stop
        barrier(roles.role_comm)
    client.stop()
    if group is not None:
        group.free()


def _report(cfg, elastic, server, client, trainer, result, mine, n_tables) -> tuple:
    """Every rank's totals, gathered on the job's ranks of now (after failures, growths):
    ``(roles, windows, ranges, rows, hosts, stopped, consistency rows, survived)``.
    Collective over every rank of the job."""
    roles, windows, ft_state = elastic.roles, elastic.windows, elastic.ft
    world = roles.ps
    ranges = None
    if server is not None:                   # servers: their original index
        if ft_state is not None:
            ranges = server.range_rows()
        mine = RankStats.of_server(server.load(), cfg.train.epochs)
    else:
        mine.index = roles.index
        mine.stopped = bool(result["stopped_by_signal"])
        mine.add_client(client.ep.stats)
    if ft_state is not None:
        if ranges is None:
            ranges = np.full((ft_state.n_ranges, 5), -1, dtype=np.int64)
        ranges = allreduce_max(world, ranges)
    rows = gather_rows(world, mine.to_row(cfg.train.epochs, n_tables))
    hosts = core.allgather_hostnames(world)      # rows[i] ran on hosts[i]
    stopped = bool(any_rank_failed(world, mine.stopped))
    crows = gather_rows(world, consistency_report.local_row(
        server is not None, roles.index, server.staleness if server else None, client,
        trainer.steps if trainer else None, windows))
    # any rank (workers added after a failure never saw it): all leave the same way
    survived = any_rank_failed(world, survived_failure(ft_state))
    return roles, windows, ranges, rows, hosts, stopped, crows, survived


def _closing_barrier(comm) -> None:
    """The survivors' last meeting before they leave without ``MPI_Finalize``. Collective.

    Blocking and unwatched: a rank that left it first exits at once, and a watched wait of a
    slower rank would report that exit as a failure (seen under load in 1 of 3 benchmark
    runs). A peer failure here is ignored: every rank has written its outputs already."""
    try:
        with ft.unwatched():
            barrier(comm)
    except Exception as e:                   # noqa: BLE001 - only a peer failure is ignored
        if not ft.is_peer_failure(e):
            raise


def survived_failure(ft_state) -> bool:
    """True after this rank survived the loss of another (continue mode). Local."""
    return ft_state is not None and ft_state.recoveries > 0


def _continue_mode(cfg, roles, world, out) -> bool:
    """Whether a failed rank is survived (``[fault_tolerance] mode = "continue"`` with ULFM):
    then errors are returned on the job's communicators and every wait watches them. In
    restart mode, or on an MPI without ULFM (rank 0 then says so), a failure stops the job as
    usual. Local decision, identical on every rank (same environment and library)."""
    if cfg.fault_tolerance.mode != "continue":
        return False
    ok, why = ft.ulfm_available()
    if not ok:
        if world.Get_rank() == 0:
            out.write(f"hpcps: warning: [fault_tolerance] mode = 'continue' is not available: "
                      f"{why}; a lost rank stops the job for a restart from its last checkpoint\n")
            out.flush()
        return False
    ft.errors_return(roles.ps, roles.role_comm)
    ft.watch(roles.ps)              # every wait notices a failed rank (no revoke)
    return True
