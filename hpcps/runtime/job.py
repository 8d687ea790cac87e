"""One training job inside an MPI world: split roles, serve or train, report, write outputs.

Called by ``hpcps train`` on every rank of the launch (collective over the world).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import numpy as np

from hpcps import __version__
from hpcps import checkpoint as ckpt
from hpcps.analysis import consistency_report
from hpcps.comm import core
from hpcps.comm.collectives import allreduce_max, barrier, bcast_int, gather_rows
from hpcps.comm.progress import library_version, rma_progress_advice
from hpcps.comm.core import any_rank_failed
from hpcps.comm.rma import allocate_windows, free_windows
from hpcps.comm.transport import ServerEndpoint, WorkerEndpoint, check_ranges
from hpcps.config import ConfigError, check_world, to_dict
from hpcps.core.consistency import policy_from_config
from hpcps.resilience.elastic import Elastic
from hpcps.runtime.output import write_metrics, write_model
from hpcps.server.replica import ServerGroup
from hpcps.server.server import ParameterServer, window_sizes
from hpcps.core.signals import EXIT_REQUEUE
from hpcps.worker.checkpointer import Checkpointer
from hpcps.worker.client import PSClient
from hpcps.worker.trainer import Trainer

# per-rank statistics row gathered at the end (float64); meaning depends on the role; then the
# examples each server counted per epoch ([train] epochs entries)
STAT_FIELDS = ("is_server", "index", "rows", "memory_bytes", "keys_pulled", "keys_pushed",
               "bytes_in", "bytes_out", "requests", "pull_seconds", "push_seconds", "clock_seconds",
               "examples")


def find_restore(cfg, world, resume="auto", out=None):
    """Pick the checkpoint to resume from; the same on every rank. Collective over ``world``.

    Rank 0 looks for the newest *valid* checkpoint under ``cfg.output.dir`` (warning about
    newer ones that are incomplete or corrupt) — or validates the one named by ``resume`` —
    and broadcasts its step; every rank then reads that manifest.

    Parameters
    ----------
    resume : "auto", "never" or a checkpoint directory

    Returns
    -------
    (directory, manifest) or None
    """
    out = out or sys.stdout
    if resume == "never":
        return None
    step = -1
    if world.Get_rank() == 0:
        try:
            if resume == "auto":
                found = ckpt.latest_valid(cfg.output.dir,
                                          warn=lambda m: out.write(f"hpcps: warning: {m}\n"))
                step = int(found[1]["step"]) if found else -1
            else:
                step = int(ckpt.verify(resume)["step"])
        except ckpt.CheckpointError as e:
            out.write(f"hpcps: error: --resume {resume}: {e}\n")
            step = -2
    step = bcast_int(world, step)
    if step == -2:
        raise ckpt.ResumeError(f"cannot resume from {resume} (see rank 0's message)")
    if step < 0:
        return None
    d = ckpt.step_dir(cfg.output.dir, step) if resume == "auto" else resume
    return d, ckpt.read_manifest(d)


class ResourceError(RuntimeError):
    """The job cannot fit this machine (raised identically on every rank before training)."""


def available_memory() -> int | None:
    """Bytes of memory available for new allocations on this node (``MemAvailable`` of
    /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def server_bytes(tables, n_servers: int) -> tuple[int, list[str]]:
    """Bytes of the largest server's shards (rows and optimizer slots) and the arithmetic."""
    from hpcps.core.tables import KeyPartition

    total, parts = 0, []
    for spec, opt in tables:
        rows = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse).range_size
        item = np.dtype(spec.dtype).itemsize
        state = opt.slot_bytes_per_row(spec.dim, spec.dtype)
        b = rows * (spec.dim * item + state)
        total += b
        slots = f" + {state} B {', '.join(opt.slot_names)}" if opt.slot_names else ""
        parts.append(f"{spec.name}: {rows:,} rows x ({spec.dim} x {item} B weights{slots}) "
                     f"= {b / 2**30:,.2f} GiB")
    return total, parts


def check_memory(cfg, tables, world) -> None:
    """Refuse a job whose tables do not fit the servers' memory, showing the arithmetic.
    Collective over ``world`` (one Allreduce): every rank raises :class:`ResourceError` when
    any server rank's node lacks the memory.

    The test is per node: the shards of all servers placed on one node (by hostname) must fit
    its ``MemAvailable``.
    """
    need, parts = server_bytes(tables, cfg.cluster.servers)
    copies = cfg.fault_tolerance.replicas if cfg.fault_tolerance.mode == "continue" else 1
    if copies > 1:                  # each server also holds a backup of its neighbour's range
        need *= copies
        parts = [f"{p} (x {copies} copies, [fault_tolerance] replicas)" for p in parts]
    roles = core.role_map(world.Get_size(), cfg.cluster.servers)
    is_server = roles[world.Get_rank()] == core.SERVER
    have = available_memory()
    # servers sharing this node (ranks on one host): counted through the node's shared comm
    node = world.Split_type(core.SHARED, key=world.Get_rank())
    try:
        here = int(core.node_sum(node, 1 if is_server else 0))
    finally:
        node.Free()
    short = is_server and have is not None and need * here > have
    if core.any_rank_failed(world, short):
        detail = "; ".join(parts)
        where = (f"{here} server(s) on this node need {here} x {need / 2**30:,.2f} GiB = "
                 f"{here * need / 2**30:,.2f} GiB but {have / 2**30:,.2f} GiB is available"
                 if short else "a server's node lacks the memory (see that rank's message)")
        cures = [f"more servers on more nodes ([cluster] servers = {cfg.cluster.servers} now,"
                 f" {here} on this node)" if here > 1 else
                 f"more servers ([cluster] servers = {cfg.cluster.servers} now)", "fewer keys"]
        if cfg.model.dtype != "float32":
            cures.append('[model] dtype = "float32"')
        raise ResourceError(f"the tables do not fit the servers' memory: per server {detail}; "
                            f"{where}. Use {', '.join(cures[:-1])} or {cures[-1]}.")


def limit_threads(world, ranks_on_node: int | None = None) -> int | None:
    """Give each rank its share of its node's cores for BLAS (:mod:`hpcps.core.threads`), unless
    the user set ``OMP_NUM_THREADS`` or the like. Collective over ``world`` (one
    ``Split_type``) unless the caller counted the node's ranks (``ranks_on_node``). Returns the
    thread count set, or ``None``."""
    from hpcps.core.threads import blas_threads_for, limit_blas_threads

    n = blas_threads_for(core.node_size(world) if ranks_on_node is None else ranks_on_node)
    if n is not None:
        limit_blas_threads(n)
    return n


def load_model(cfg):
    """The job's model (:func:`hpcps.models.make_model`); a model that cannot be loaded is a
    :class:`~hpcps.config.ConfigError` on key ``model.type``, a data file the model cannot
    use (e.g. a prepared file of another kind) one on ``data.path``. Local; every rank calls it."""
    from hpcps.data import DataError
    from hpcps.models import ModelLoadError, make_model

    try:
        return make_model(cfg)
    except ModelLoadError as e:
        raise ConfigError(cfg.path, "model.type", str(e).removeprefix("model.type: ")) from None
    except DataError as e:
        raise ConfigError(cfg.path, "data.path", str(e)) from None


def check_rma_progress(cfg, world, out=None, environ=None, library=None):
    """With ``pull = "rma"``: warn once (rank 0) when this MPI is known to give one-sided
    reads no passive progress, and with ``[consistency] rma_fallback = true`` switch the
    job to p2p pulls. Collective over ``world`` (one broadcast) when ``pull = "rma"``.

    Rank 0's view decides (library version and environment,
    :func:`hpcps.comm.progress.rma_progress_advice`), so every rank takes the same path.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    world : MPI.Intracomm
    out : text stream, optional
        Where rank 0 writes the warning (default ``sys.stdout``).
    environ : mapping, optional
        The environment to judge (default ``os.environ``).
    library : str, optional
        The MPI library version string (default: asked from MPI).

    Returns
    -------
    hpcps.config.JobConfig
        ``cfg`` itself, or a copy with ``consistency.pull = "p2p"`` after a fallback.
    """
    if cfg.consistency.pull != "rma":
        return cfg
    out = out or sys.stdout
    advice = None
    if world.Get_rank() == 0:
        advice = rma_progress_advice(library if library is not None else library_version(),
                                     os.environ if environ is None else environ)
        if advice is not None:
            what = ("falling back to p2p pulls ([consistency] rma_fallback = true)"
                    if cfg.consistency.rma_fallback else "continuing with RMA pulls")
            out.write(f"hpcps: warning: {advice.message()}; {what}\n")
            out.flush()
    if bcast_int(world, int(advice is not None)) and cfg.consistency.rma_fallback:
        return dataclasses.replace(cfg, consistency=dataclasses.replace(cfg.consistency,
                                                                        pull="p2p"))
    return cfg


def run_job(cfg, world, out=None, resume="auto", stop=None, step_hook=None) -> dict | None:
    """Run job ``cfg`` on communicator ``world``. Collective over ``world``.

    Returns the summary dict on the chief (world rank 0), ``{"stopped_by_signal": bool}``
    elsewhere. ``resume`` is ``"auto"``, ``"never"`` or a checkpoint directory
    (:func:`find_restore`). ``stop`` (:class:`hpcps.core.signals.StopRequest`) lets a signal end
    the training after one checkpoint. ``step_hook(worker_index, clock)``, if given, is called
    by every worker in each step between computing the gradient and pushing it (tests slow a
    worker down with it).

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
        from hpcps.sandblaster.run import run_sandblaster
        return run_sandblaster(cfg, world, out, resume=resume, stop=stop, step_hook=step_hook)
    cfg = check_rma_progress(cfg, world, out)
    policy = policy_from_config(cfg.consistency)
    model = load_model(cfg)
    tables = model.tables()
    specs = [t[0] for t in tables]
    restore = find_restore(cfg, world, resume, out)
    if restore is not None:
        ckpt.check_compatible(restore[0], restore[1], specs,  # every rank, before any traffic
                              slots={spec.name: opt.slot_names for spec, opt in tables})
    check_memory(cfg, tables, world)
    check_ranges(world, cfg.cluster.servers)
    roles = core.split_roles(world, cfg.cluster.servers)
    ft_state = _fault_tolerance(cfg, roles, world, out)
    windows = []
    if cfg.consistency.pull == "rma":           # one window per table (collective)
        sizes = (window_sizes(specs, roles.index, roles.n_servers, roles.n_workers)
                 if roles.role == core.SERVER else [0] * len(specs))
        windows = allocate_windows(roles.ps, sizes)
    elastic = Elastic(cfg, roles, specs, windows, ft_state, out)
    return _run_roles(cfg, elastic, model, tables, policy, out, restore=restore, stop=stop,
                      step_hook=step_hook)


def join_job(out=None, stop=None) -> dict:
    """Run as a worker added to a running job (``hpcps join``, started by
    :meth:`hpcps.resilience.elastic.Elastic.grow`): meet the job, then train as its other workers do.
    Collective with every rank of the running job.

    Returns
    -------
    dict
        ``{"stopped_by_signal": bool}``; ``{"joined": False}`` when the job could not be
        loaded here (the job goes on without this process).
    """
    out = out or sys.stdout
    joined = Elastic.join(out)
    if joined is None:
        return {"joined": False, "stopped_by_signal": False}
    elastic, plan, cfg, model = joined
    return _run_roles(cfg, elastic, model, model.tables(), policy_from_config(cfg.consistency),
                      out, stop=stop, join=plan)


def _run_roles(cfg, elastic, model, tables, policy, out, restore=None, stop=None,
               step_hook=None, join=None) -> dict:
    """Serve or train on the layout of ``elastic`` (servers and workers of the launch, or an
    added worker when ``join`` is given), then gather the statistics and write the outputs.
    Collective over every rank of the job (which may change while it runs)."""
    roles, windows, ft_state = elastic.roles, elastic.windows, elastic.ft
    specs = [t[0] for t in tables]
    t_start = time.perf_counter()
    stats = np.zeros(len(STAT_FIELDS) + cfg.train.epochs)
    stats[1] = roles.index
    result = None
    history: list = []
    try:
        if roles.is_chief:
            elastic.mark_running()
        server = client = trainer = None
        ranges = None
        if roles.role == core.SERVER:
            ep = ServerEndpoint(roles.ps, cfg.comm.max_message_bytes)
            if ft_state is not None:                 # key ranges as primary and backup
                server = ServerGroup(ep, ft_state, roles.index, roles.worker_ranks, tables,
                                     policy, seed=cfg.seed, restore=restore, elastic=elastic)
            else:
                server = ParameterServer(ep, roles.index, roles.n_servers, roles.worker_ranks,
                                         tables, policy, seed=cfg.seed, windows=windows,
                                         run_dir=cfg.output.dir, restore=restore,
                                         elastic=elastic)
            if windows:
                barrier(roles.ps)                    # windows initialised before any read
            server.serve()
            roles, windows = elastic.roles, elastic.windows
            if ft_state is not None:
                ranges = server.range_rows()
            load = server.load()
            stats[0] = 1
            stats[1] = load["server"]
            stats[12] = load["examples"]
            stats[2:9] = [load[k] for k in ("rows", "memory_bytes", "keys_pulled", "keys_pushed",
                                            "bytes_in", "bytes_out", "requests")]
            for e, n in load["examples_per_epoch"].items():
                if 0 <= e < cfg.train.epochs:
                    stats[len(STAT_FIELDS) + e] = n
        else:
            # the rank holding each key range (an added worker after a server loss: from the plan)
            range_ranks = join.range_ranks if join is not None and join.range_ranks else \
                roles.server_ranks
            ep = WorkerEndpoint(roles.ps, range_ranks, cfg.comm.max_message_bytes)
            client = PSClient(ep, specs, len(range_ranks), policy, roles.n_workers, windows)
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
                write_metrics(cfg.output.dir / "metrics.json",
                              {"job": cfg.name, "hpcps_version": __version__,
                               "config": to_dict(cfg), "epochs": history})

            trainer = Trainer(cfg, roles.index, roles.n_workers, client, roles.role_comm,
                              roles.is_chief, on_epoch=on_epoch, out=out, policy=policy,
                              step_hook=step_hook, stop=stop, model=model, ft_state=ft_state,
                              elastic=elastic)
            checkpointer = Checkpointer(cfg, client, roles.role_comm, roles.is_chief,
                                        roles.n_workers, [o.slot_specs(t.dim, t.dtype) for t, o in tables], out,
                                        async_cut=not policy.aggregate, flush=trainer.steps.flush)
            result = trainer.run(restore=restore[1] if restore else None, checkpointer=checkpointer,
                                 join=join)
            roles, windows = elastic.roles, elastic.windows
            history[:] = trainer.history
            result["checkpoints"] = {"count": checkpointer.count if checkpointer else 0,
                                     "seconds": checkpointer.seconds if checkpointer else 0.0,
                                     "bytes": checkpointer.bytes if checkpointer else 0}
            stats[0] = -1 if result["stopped_by_signal"] else 0
            final = None
            if roles.is_chief and not result["stopped_by_signal"]:
                final = {s.name: client.pull_table(s.name) for s in specs}
            client.stop()
            s = client.ep.stats
            stats[4:9] = [s.keys.get("pull", 0), s.keys.get("push", 0), s.total("bytes_in"),
                          s.total("bytes_out"), s.total("messages")]
            stats[9:12] = [s.seconds.get("pull", 0.0), s.seconds.get("push", 0.0),
                           s.seconds.get("clock", 0.0)]
            if roles.is_chief and final is not None:
                path = write_model(cfg.output.dir / "model.h5", final, cfg,
                                   step=result["clock"], epoch=result["epochs"])
                result["model_path"] = str(path)
        world = roles.ps                     # the job's ranks now (after failures, growths)
        if roles.role != core.SERVER:            # servers: their original index (above)
            stats[1] = roles.index
        if ft_state is not None:
            if ranges is None:
                ranges = np.full((ft_state.n_ranges, 5), -1, dtype=np.int64)
            ranges = allreduce_max(world, ranges)
        rows = gather_rows(world, stats)
        hosts = core.allgather_hostnames(world)      # rows[i] ran on hosts[i]
        stopped = bool(any_rank_failed(world, stats[0] == -1))
        crows = gather_rows(world, consistency_report.local_row(
            server is not None, roles.index, server.staleness if server else None, client,
            trainer.steps if trainer else None, windows))
        free_windows(windows)                        # collective; normal exit path
        # any rank (workers added after a failure never saw it): all leave the same way
        survived = any_rank_failed(world, survived_failure(ft_state))
        if survived:
            _closing_barrier(roles.ps)               # every survivor is done with MPI
    finally:
        if roles.is_chief:
            elastic.clear_running()
        if ft_state is not None:
            from hpcps.comm import ft
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
    summary = _summary(cfg, result, rows, time.perf_counter() - t_start, hosts)
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
    if ft_state is not None:
        summary["ranges"] = [{"range": r, "server": int(v[0]), "clock": int(v[1]),
                              "examples": int(v[2]), "lost_steps": int(v[3])}
                             for r, v in enumerate(ranges)]
        summary["replicas"] = cfg.fault_tolerance.replicas
        summary["replication_bytes"] = int(ranges[:, 4].clip(0).sum())
    summary["consistency"] = consistency_report.summarize(
        crows, policy, cfg.consistency.pull, 8 + np.dtype(cfg.model.dtype).itemsize)
    _finish_metrics(cfg, summary, history)
    _print_summary(summary, history, out)
    summary["skip_finalize"] = survived
    return summary


def _closing_barrier(comm) -> None:
    """The survivors' last meeting before they leave without ``MPI_Finalize``. Collective.

    Blocking and unwatched: a rank that left it first exits at once, and a watched wait of a
    slower rank would report that exit as a failure (seen under load in 1 of 3 benchmark
    runs). A peer failure here is ignored: every rank has written its outputs already."""
    from hpcps.comm import ft

    try:
        with ft.unwatched():
            barrier(comm)
    except Exception as e:                   # noqa: BLE001 - only a peer failure is ignored
        if not ft.is_peer_failure(e):
            raise


def survived_failure(ft_state) -> bool:
    """True after this rank survived the loss of another (continue mode). Local."""
    return ft_state is not None and ft_state.recoveries > 0


def _fault_tolerance(cfg, roles, world, out):
    """The :class:`hpcps.resilience.recovery.FTState` of a continue-mode job, or ``None`` (restart mode,
    or an MPI without ULFM: then rank 0 says so and a failure stops the job as usual). Local
    decision, identical on every rank (same environment and library)."""
    if cfg.fault_tolerance.mode != "continue":
        return None
    from hpcps.comm import ft
    from hpcps.resilience.recovery import FTState

    ok, why = ft.ulfm_available()
    if not ok:
        if world.Get_rank() == 0:
            out.write(f"hpcps: warning: [fault_tolerance] mode = 'continue' is not available: "
                      f"{why}; a lost rank stops the job for a restart from its last checkpoint\n")
            out.flush()
        return None
    ft.errors_return(roles.ps, roles.role_comm)
    ft.watch(roles.ps)              # every wait notices a failed rank (no revoke)
    n = world.Get_size()
    f = cfg.fault_tolerance
    return FTState(roles=roles, hosts=core.allgather_hostnames(roles.ps),
                   world_ranks=list(range(n)), n_ranges=roles.n_servers,
                   replicas=f.replicas, on_server_loss=f.on_server_loss,
                   server_ids=list(range(roles.n_servers)), run_dir=cfg.output.dir)


def run_allreduce(cfg, world, out=None, stop=None, step_hook=None) -> dict:
    """Run job ``cfg`` as the AllReduce baseline (:mod:`hpcps.worker.allreduce`): every rank a
    worker holding the whole model, BSP by construction. Collective over ``world``.

    Checkpoints are not written in this mode (``[checkpoint]`` is ignored, with a note).

    Returns
    -------
    dict
        The summary on rank 0 (same keys as :func:`run_job`'s, ``servers`` empty),
        ``{"stopped_by_signal": bool}`` elsewhere.

    Raises
    ------
    hpcps.config.ConfigError
        If ``[consistency] model`` is not ``"bsp"`` (identically on every rank).
    """
    from hpcps.worker.allreduce import AllReduceClient

    out = out or sys.stdout
    if cfg.consistency.model != "bsp":
        raise ConfigError(cfg.path, "consistency.model",
                          f"mode = 'allreduce' is synchronous by construction; use 'bsp', got "
                          f"{cfg.consistency.model!r}")
    model = load_model(cfg)
    tables = model.tables()
    comm = world.Dup()
    t_start = time.perf_counter()
    rank = comm.Get_rank()
    history: list = []
    try:
        client = AllReduceClient(comm, tables, seed=cfg.seed)
        if rank == 0 and (cfg.checkpoint.every_steps or cfg.checkpoint.every_seconds):
            out.write("hpcps: note: mode = 'allreduce' writes no checkpoints; [checkpoint] is "
                      "ignored\n")

        def on_epoch(rec):
            history[:] = trainer.history
            write_metrics(cfg.output.dir / "metrics.json",
                          {"job": cfg.name, "hpcps_version": __version__, "config": to_dict(cfg),
                           "epochs": history})

        trainer = Trainer(cfg, rank, comm.Get_size(), client, comm, rank == 0, on_epoch=on_epoch,
                          out=out, step_hook=step_hook, stop=stop, model=model)
        result = trainer.run()
        history[:] = trainer.history
        stats = np.array([client.bytes_in, client.bytes_out, client.comm_seconds,
                          client.collectives], dtype=np.float64)
        rows = gather_rows(comm, stats)
        stopped = bool(any_rank_failed(comm, result["stopped_by_signal"]))
        if rank == 0 and not stopped:
            path = write_model(cfg.output.dir / "model.h5",
                               {s.name: client.pull_table(s.name) for s in client.specs}, cfg,
                               step=result["clock"], epoch=result["epochs"])
            result["model_path"] = str(path)
    finally:
        comm.Free()
    if rank != 0:
        return {"stopped_by_signal": stopped}
    if stopped:
        out.write(f"stopped by signal at clock {result['clock']} (mode 'allreduce' keeps no "
                  "checkpoint)\n")
        return {"stopped_by_signal": True}
    wall = time.perf_counter() - t_start
    summary = {
        "mode": "allreduce", "wall_seconds": wall, "train_seconds": result["seconds"],
        "examples": result["examples"], "examples_per_second": result["examples_per_second"],
        "steps": result["steps"], "epochs": result["epochs"],
        "model_path": result.get("model_path"),
        "checkpoints": {"count": 0, "seconds": 0.0, "bytes": 0, "share_of_run": 0.0},
        "servers": [],
        "workers": [{"index": i, "bytes_in": int(r[0]), "bytes_out": int(r[1]),
                     "allreduce_seconds": float(r[2]), "collectives": int(r[3])}
                    for i, r in enumerate(rows)],
    }
    _finish_metrics(cfg, summary, history)
    tot = sum(w["allreduce_seconds"] for w in summary["workers"])
    vol = sum(w["bytes_in"] for w in summary["workers"])
    out.write(f"  allreduce: {len(rows)} ranks, {_mb(vol)} received by all ranks, collectives "
              f"{tot:.2f} s (summed over ranks)\n")
    _print_summary(summary, history, out)
    return summary


def _finish_metrics(cfg, summary, history) -> None:
    """Add the scikit-learn baseline when the job asks for it and write ``metrics.json``.
    Rank 0 only."""
    if cfg.evaluate.sklearn_baseline and cfg.model.type == "logistic":
        summary["baseline"] = sklearn_baseline(cfg)
        if history:
            summary["baseline"]["auc_gap"] = summary["baseline"]["test_auc"] - history[-1]["test_auc"]
    write_metrics(cfg.output.dir / "metrics.json",
                  {"job": cfg.name, "hpcps_version": __version__, "config": to_dict(cfg),
                   "epochs": history, "summary": summary})


def _summary(cfg, result, rows, wall, hosts=None) -> dict:
    servers, workers = [], []
    for i, r in enumerate(rows):
        d = dict(zip(STAT_FIELDS, (float(v) for v in r)))
        d["host"] = hosts[i] if hosts else ""
        d["examples_per_epoch"] = [int(v) for v in r[len(STAT_FIELDS):]]   # servers: per epoch
        (servers if d["is_server"] == 1 else workers).append(d)
    servers.sort(key=lambda d: d["index"])
    return {
        "wall_seconds": wall,
        "train_seconds": result["seconds"],
        "examples": result["examples"],
        "examples_per_second": result["examples_per_second"],
        "steps": result["steps"],
        "epochs": result["epochs"],
        "model_path": result.get("model_path"),
        "checkpoints": dict(result["checkpoints"],
                            share_of_run=result["checkpoints"]["seconds"] / wall if wall else 0.0),
        "servers": [dict({k: int(d[k]) for k in ("index", "rows", "memory_bytes", "keys_pulled",
                                                  "keys_pushed", "bytes_in", "bytes_out",
                                                  "requests", "examples")},
                         examples_per_epoch=d["examples_per_epoch"], host=d["host"])
                    for d in servers],
        "workers": [{"index": int(d["index"]), "bytes_pulled": int(d["bytes_in"]),
                     "bytes_pushed": int(d["bytes_out"]), "pull_seconds": d["pull_seconds"],
                     "push_seconds": d["push_seconds"], "clock_seconds": d["clock_seconds"],
                     "host": d["host"]}
                    for d in sorted(workers, key=lambda d: d["index"])],
    }


def _mb(n) -> str:
    return f"{n / 1e6:,.1f} MB"


def _print_summary(s, history, out) -> None:
    w = out.write
    w(f"done: {s['epochs']} epoch(s), {s['steps']} steps, {s['examples']:,} examples in "
      f"{s['train_seconds']:.1f} s ({s['examples_per_second']:,.0f} ex/s)\n")
    for d in s["servers"]:
        w(f"  server {d['index']}: {d['rows']:,} rows ({_mb(d['memory_bytes'])}); pushed in "
          f"{_mb(d['bytes_in'])} ({d['keys_pushed']:,} keys), pulled out {_mb(d['bytes_out'])} "
          f"({d['keys_pulled']:,} keys), {d['requests']:,} requests\n")
    if s.get("mode") != "allreduce":
        tot_pull = sum(d["pull_seconds"] for d in s["workers"])
        tot_push = sum(d["push_seconds"] for d in s["workers"])
        w(f"  workers: pull wait {tot_pull:.2f} s, push {tot_push:.2f} s (summed over workers)\n")
    by_host: dict = {}
    for kind in ("server", "worker"):
        for d in s.get(kind + "s", []):
            if d.get("host"):
                by_host.setdefault(d["host"], []).append(f"{kind} {d['index']}")
    if by_host:
        w("  hosts: " + "; ".join(f"{h}: {', '.join(r)}" for h, r in by_host.items()) + "\n")
    if history and all(k in history[-1] for k in ("test_auc", "test_logloss", "test_accuracy")):
        h = history[-1]
        w(f"  hpcps                              test AUC {h['test_auc']:.4f}  log-loss "
          f"{h['test_logloss']:.4f}  accuracy {h['test_accuracy']:.4f}\n")
    elif history:
        w("  hpcps  test " + "  ".join(f"{k[5:]} {v:.4f}" for k, v in history[-1].items()
                                      if k.startswith("test_") and k != "test_rows") + "\n")
    if "baseline" in s:
        b = s["baseline"]
        w(f"  scikit-learn LogisticRegression    test AUC {b['test_auc']:.4f}  log-loss "
          f"{b['test_logloss']:.4f}  accuracy {b['test_accuracy']:.4f}  (same features, "
          f"C = 1/(l2 n) = {b['C']:.4g}; {b['seconds']:.1f} s)\n")
        if "auc_gap" in b:
            w(f"  AUC gap (scikit-learn - hpcps): {b['auc_gap']:+.4f}\n")
    c = s["checkpoints"]
    if c["count"]:
        w(f"  checkpoints: {c['count']} written, {_mb(c['bytes'])}, {c['seconds']:.2f} s "
          f"({100 * c['share_of_run']:.1f} % of the run)\n")
    if "consistency" in s:
        for line in consistency_report.lines(s["consistency"]):
            w(line + "\n")
    if s.get("model_path"):
        w(f"  model: {s['model_path']}\n")
    out.flush()


def sklearn_baseline(cfg) -> dict:
    """Fit scikit-learn ``LogisticRegression`` on the job's own features; test metrics. Local."""
    from sklearn.linear_model import LogisticRegression

    from hpcps.data.source import load_split
    from hpcps.models.logistic_math import binary_metrics

    t0 = time.perf_counter()
    X, y = load_split(cfg.data, "train", 0, 1)
    Xt, yt = load_split(cfg.data, "test", 0, 1)
    c = 1.0 / (cfg.model.l2 * X.shape[0]) if cfg.model.l2 > 0 else 1.0
    clf = LogisticRegression(C=c, max_iter=1000)
    clf.fit(X, y)
    m = binary_metrics(yt, clf.predict_proba(Xt)[:, 1])
    return {"C": c, "test_auc": m["auc"], "test_logloss": m["logloss"],
            "test_accuracy": m["accuracy"], "seconds": time.perf_counter() - t0}
