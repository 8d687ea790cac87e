"""A Sandblaster L-BFGS job on MPI ranks: the coordinator, server and worker loops.

Selected by ``[cluster] mode = "sandblaster"``; :func:`hpcps.runtime.job.run_job` hands the job to
:func:`run_sandblaster`. Roles (:mod:`hpcps.comm.sandblaster`): world rank 0 coordinates,
the last ``[cluster] servers`` ranks serve, the ranks in between work.

Setup
    Every worker reads the whole training split (any unit may go to any worker), cuts it into
    ``[lbfgs] work_units`` units and reports a fingerprint of the data (the coordinator refuses
    workers that read different data); worker 0 sends the active keys to the coordinator, which
    tells each server its compact index range (:mod:`hpcps.sandblaster.shard`).
Iterations
    The coordinator runs :class:`hpcps.sandblaster.lbfgs.LBFGS` with :class:`MPIMachine`: each
    program is broadcast to the servers; for an ``EVAL`` the workers are told to start, the
    servers send them the point, the workers ask the coordinator for units until none is left,
    send their gradient sums to the servers and their loss sums and timings to the coordinator;
    the servers reduce the program's results to the coordinator.
End
    The servers send their part of ``x`` to the coordinator, which writes ``model.h5`` (the
    weights in original key order, as the parameter-server mode does) and ``metrics.json``,
    evaluates the test split and, with ``[evaluate] sklearn_baseline``, compares the objective
    with scikit-learn's.

Not supported in this mode: checkpoints and ``--resume DIR`` (a run restarts from scratch), and
the ``[optimizer]``, ``[train]`` (except ``progress_seconds``) and ``[consistency]`` sections,
which are ignored.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from hpcps.checkpoint import ResumeError
from hpcps.comm import core
from hpcps.comm.collectives import gather_rows
from hpcps.comm.sandblaster import (CMD_EVAL, CMD_STOP, COORDINATOR, SERVER, CoordinatorLink,
                                ServerLink, WorkerLink, node_total, split_sandblaster)
from hpcps.config import check_world
from hpcps.runtime.output import write_model
from hpcps.runtime.rundir import MetricsFile, RunDir
from hpcps.core.signals import EXIT_REQUEUE
from hpcps.core.tables import KeyPartition
from hpcps.sandblaster.baseline import objective, sklearn_solution
from hpcps.sandblaster.lbfgs import LBFGS, Reply, X, n_slots
from hpcps.sandblaster.local import to_original_order
from hpcps.sandblaster.program import EVAL, GATHER, STOP, TAIL_OPS, Program
from hpcps.sandblaster.shard import ShardVectors, bias_server, compact_bounds, shard_layouts
from hpcps.sandblaster.units import UnitScheduler, WorkUnits

#: Width of the float64 rows workers send to the coordinator (setup fingerprint, and per
#: evaluation: loss sum, rows, units, busy seconds, waiting seconds, stop flag).
STATS_WIDTH = 6
#: scikit-learn ``tol`` of the reference solution (its default 1e-4 stops ~2e-4 above the
#: optimum on Adult, relative).
REFERENCE_TOL = 1e-8
#: Per-rank statistics row gathered at the end.
RANK_FIELDS = ("role", "index", "bytes_in", "bytes_out", "messages", "mpi_seconds",
               "memory_bytes", "n_weights")
_ROLE_CODE = {COORDINATOR: 0, "worker": 1, SERVER: 2}


class DataMismatchError(RuntimeError):
    """Workers read different training data (every worker must see the same rows)."""


def run_sandblaster(cfg, world, out=None, resume="auto", stop=None, step_hook=None) -> dict:
    """Run Sandblaster job ``cfg`` on communicator ``world``. Collective over ``world``.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
        With ``cluster.mode == "sandblaster"``.
    world : MPI.Intracomm
        At least ``cluster.servers + 2`` ranks.
    out : text stream, optional
        Progress and summary (coordinator only); default stdout.
    resume : str
        ``"auto"`` or ``"never"`` (equivalent here: there are no checkpoints).
    stop : hpcps.core.signals.StopRequest or None
        A stop signal on any rank ends the run after the current iteration; the model reached
        so far is written and ``stopped_by_signal`` is true.
    step_hook : callable(worker_index, evaluation) or None
        Called by every worker before each work unit it computes (tests slow a worker with it).

    Returns
    -------
    dict
        On the coordinator (world rank 0) the summary (also in ``metrics.json``); elsewhere
        ``{"stopped_by_signal": bool}``.

    Raises
    ------
    hpcps.config.ConfigError, hpcps.comm.core.LaunchError, hpcps.checkpoint.ResumeError
        Before any traffic, identically on every rank (world too small, ``--resume DIR``).
    hpcps.runtime.job.ResourceError
        On every rank when the servers' vectors do not fit a node's memory.
    DataMismatchError
        On the coordinator when workers read different data (the job is then aborted by
        :func:`hpcps.comm.core.abort_on_error`).
    """
    out = out or sys.stdout
    core.check_launch(world)
    check_world(cfg, world.Get_size())
    if resume not in ("auto", "never"):
        what = "--resume require" if resume == "require" else f"cannot resume from {resume}"
        raise ResumeError(f"cluster.mode = 'sandblaster' writes no checkpoints; {what}")
    t_start = time.perf_counter()
    roles = split_sandblaster(world, cfg.cluster.servers)
    row = np.zeros(len(RANK_FIELDS))
    row[0], row[1] = _ROLE_CODE[roles.role], roles.index
    state = None
    try:
        if roles.role == COORDINATOR:
            link = CoordinatorLink(roles, cfg.comm.max_message_bytes)
            state = _coordinator(cfg, roles, link, out, stop)
        elif roles.role == SERVER:
            link = ServerLink(roles, cfg.comm.max_message_bytes)
            row[6], row[7] = _server(cfg, roles, link, stop)
        else:
            link = WorkerLink(roles, cfg.comm.max_message_bytes)
            row[6], row[7] = _worker(cfg, roles, link, stop, step_hook)
        s = link.stats
        row[2:6] = [s.total("bytes_in"), s.total("bytes_out"), s.total("messages"),
                    s.total("seconds")]
        rows = gather_rows(world, row)
        mine = state is not None and state["result"].status == "stopped"
        stopped = core.any_rank_failed(world, mine)
    finally:
        roles.free()
    if roles.role != COORDINATOR:
        return {"stopped_by_signal": stopped}
    return _finish(cfg, state, rows, link, out, time.perf_counter() - t_start)


# ----------------------------------------------------------------------------- memory


def _check_memory(cfg, roles, need: int) -> None:
    """Refuse the job when the ranks of one node need more than its ``MemAvailable``.
    Collective over ``roles.world``; raises ``ResourceError`` on every rank."""
    from hpcps.runtime.job import ResourceError, available_memory

    here = node_total(roles.world, need)
    have = available_memory()
    short = have is not None and here > have
    if core.any_rank_failed(roles.world, short):
        where = (f"the ranks on this node need {here / 2**30:,.2f} GiB for the L-BFGS vectors "
                 f"but {have / 2**30:,.2f} GiB is available" if short else
                 "a node lacks the memory (see that rank's message)")
        raise ResourceError(f"the Sandblaster vectors do not fit: {where}; each server keeps "
                            f"5 + 2 x history = {n_slots(cfg.lbfgs.history)} float64 vectors of "
                            f"its active keys. Use more servers ([cluster] servers = "
                            f"{cfg.cluster.servers} now) or a shorter [lbfgs] history.")


# ------------------------------------------------------------------------ coordinator


class MPIMachine:
    """The coordinator's machine for :class:`hpcps.sandblaster.lbfgs.LBFGS`: programs go to the
    servers over MPI, evaluations dispatch work units to the workers. Coordinator only.

    Parameters
    ----------
    link : hpcps.comm.sandblaster.CoordinatorLink
    scheduler : UnitScheduler
    n_rows : int
        Training rows (the sum the workers' rows must reach at every evaluation).
    layouts : list of ShardLayout
    stop : StopRequest or None
        The coordinator's own stop request.

    Attributes
    ----------
    busy, waiting : float64 (n_workers,)
        Seconds each worker spent computing units / otherwise inside evaluations.
    programs, evaluations : int
    """

    def __init__(self, link, scheduler: UnitScheduler, n_rows: int, layouts, stop=None):
        self.link = link
        self.scheduler = scheduler
        self.n_rows = int(n_rows)
        self.layouts = layouts
        self.stop = stop
        w = scheduler.n_workers
        self.busy = np.zeros(w)
        self.waiting = np.zeros(w)
        self.eval_seconds = 0.0
        self.programs = 0
        self.evaluations = 0
        self.gathered = None

    def run(self, prog: Program) -> Reply:
        """Send ``prog`` to the servers, run its evaluation if it ends with ``EVAL``, collect
        the results (see module docstring)."""
        link = self.link
        link.send_program(prog.ops, prog.scalars)
        self.programs += 1
        loss = 0.0
        stop = bool(self.stop is not None and self.stop.requested)
        tail = prog.tail
        if tail == EVAL:
            t0 = time.perf_counter()
            self.evaluations += 1
            sched = self.scheduler
            link.command_workers(CMD_EVAL, self.evaluations)
            sched.start(self.evaluations)
            while not sched.complete:
                worker, eval_id, done = link.recv_unit_request()
                link.send_unit(worker, sched.answer(worker, eval_id, done))
            st = link.gather_worker_stats(STATS_WIDTH)
            if int(st[:, 1].sum()) != self.n_rows or int(st[:, 2].sum()) != sched.n_units:
                raise RuntimeError(f"evaluation {self.evaluations}: workers covered "
                                   f"{int(st[:, 1].sum())} rows in {int(st[:, 2].sum())} units, "
                                   f"expected {self.n_rows} in {sched.n_units}")
            loss = float(sum(st[:, 0].tolist()))          # in worker order
            self.busy += st[:, 3]
            self.waiting += st[:, 4]
            stop = stop or bool(st[:, 5].max() > 0)
            self.eval_seconds += time.perf_counter() - t0
        elif tail == GATHER:
            n = self.layouts[-1].stop if self.layouts else 0
            w = np.zeros(n, dtype=np.float64)
            bias = np.zeros(1, dtype=np.float64)
            for s, lay in enumerate(self.layouts):
                link.recv_shard(s, w[lay.start:lay.stop], bias if lay.has_bias else None)
            self.gathered = (w, float(bias[0]))
        sums, maxes = link.reduce_results(prog.n_sums, prog.n_maxes)
        if tail == EVAL:
            stop = stop or bool(maxes[-1] > 0)
        return Reply(sums, maxes, loss, stop)


def _coordinator(cfg, roles, link, out, stop) -> dict:
    """The coordinator's part (world rank 0 only): setup, L-BFGS, gather the model, stop the
    others. Returns what :func:`_finish` needs."""
    nf, k = cfg.data.num_features, roles.n_servers
    fp = link.gather_worker_stats(STATS_WIDTH)
    if not (fp == fp[0]).all():
        raise DataMismatchError(
            "workers read different training data ([rows, units, active keys, nnz, sum of "
            f"labels, sum of active positions] per worker: {fp.tolist()}); every worker must "
            "read the same file")
    n_rows, n_units, n_active = (int(v) for v in fp[0, :3])
    active = link.recv_active()
    if active.size != n_active:
        raise DataMismatchError(f"worker 0 sent {active.size} active keys, expected {n_active}")
    bounds = compact_bounds(nf, k, active)
    link.bcast_bounds(bounds)
    layouts = shard_layouts(nf, k, bounds)
    _check_memory(cfg, roles, 0)
    w = out.write
    w(f"sandblaster: 1 coordinator, {roles.n_workers} worker(s), {k} server(s); {n_rows:,} "
      f"training rows in {n_units} work units; {n_active:,} of {nf:,} keys active; L-BFGS "
      f"m = {cfg.lbfgs.history}; objective F = mean log-loss + {cfg.model.l2:g}/2 ||w||^2\n")
    out.flush()
    last_print = [time.perf_counter()]

    def progress(rec):
        now = time.perf_counter()
        if now - last_print[0] >= cfg.train.progress_seconds or rec["iteration"] == 1:
            last_print[0] = now
            w(f"iter {rec['iteration']:5d}  F {rec['objective']:.10f}  max|g| "
              f"{rec['grad_max']:.2e}  step {rec['step']:.3g}  evals {rec['evaluations']}  "
              f"{rec['seconds']:.1f} s\n")
            out.flush()

    sched = UnitScheduler(n_units, roles.n_workers)
    machine = MPIMachine(link, sched, n_rows, layouts, stop)
    lbfgs = LBFGS.from_config(machine, cfg.lbfgs, on_iteration=progress)
    result = lbfgs.run()
    machine.run(Program().gather(X))
    machine.run(Program().stop())
    link.command_workers(CMD_STOP, 0)
    wc, bias = machine.gathered
    return {"result": result, "machine": machine, "scheduler": sched, "active": active,
            "weights": to_original_order(wc, active, nf), "bias": bias, "n_rows": n_rows,
            "n_units": n_units, "layouts": layouts}


# ----------------------------------------------------------------------------- server


def _server(cfg, roles, link, stop) -> tuple[int, int]:
    """A server's loop (server ranks only): run programs on this shard until ``STOP``.
    Returns (bytes held, weights held)."""
    bounds = link.recv_bounds()
    lay = shard_layouts(cfg.data.num_features, roles.n_servers, bounds)[roles.index]
    slots = n_slots(cfg.lbfgs.history)
    _check_memory(cfg, roles, 8 * (slots * lay.size + 2 * lay.n_weights))
    store = ShardVectors(lay, slots, cfg.model.l2)
    gw = np.zeros(lay.n_weights, dtype=np.float64)
    scratch = np.zeros(lay.n_weights, dtype=np.float64)
    gb = np.zeros(1, dtype=np.float64) if lay.has_bias else None
    while True:
        ops, scalars = link.recv_program()
        sums = store.run_body(ops, scalars)
        maxes: list = []
        tail = int(ops[-1, 0]) if len(ops) and int(ops[-1, 0]) in TAIL_OPS else None
        if tail == EVAL:
            link.send_params(*store.parts(int(ops[-1, 1])))
            link.recv_grad_sum(gw, gb, scratch)
            s2, maxes = store.finish_eval(ops[-1], scalars[-1], gw, gb,
                                          stop is not None and stop.requested)
            sums += s2
        elif tail == GATHER:
            link.send_shard(*store.parts(int(ops[-1, 1])))
        if sums or maxes:
            link.reduce_results(sums, maxes)
        if tail == STOP:
            return store.nbytes + gw.nbytes + scratch.nbytes, lay.n_weights


# ----------------------------------------------------------------------------- worker


def _worker(cfg, roles, link, stop, step_hook) -> tuple[int, int]:
    """A worker's loop (worker ranks only): read the data, then compute work units at every
    evaluation until ``CMD_STOP``. Returns (bytes of its vectors, active keys)."""
    from hpcps.data.source import load_split

    nf, k = cfg.data.num_features, roles.n_servers
    Xtr, ytr = load_split(cfg.data, "train", 0, 1)
    units = WorkUnits(Xtr, ytr, KeyPartition(nf, k, permute=True).positions,
                      cfg.lbfgs.work_units)
    del Xtr, ytr
    link.gather_stats(units.fingerprint())
    if roles.index == 0:
        link.send_active(units.active)
    layouts = shard_layouts(nf, k, compact_bounds(nf, k, units.active))
    _check_memory(cfg, roles, 8 * 3 * units.n_active)
    w = np.zeros(units.n_active, dtype=np.float64)
    acc = np.zeros_like(w)
    bias = np.zeros(1, dtype=np.float64)
    gbias = np.zeros(1, dtype=np.float64)
    w_parts = [w[lay.start:lay.stop] for lay in layouts]
    acc_parts = [acc[lay.start:lay.stop] for lay in layouts]
    bsrv = bias_server(k)
    while True:
        cmd, eval_id = link.recv_command()
        if cmd == CMD_STOP:
            return w.nbytes + acc.nbytes, units.n_active
        if cmd != CMD_EVAL:
            raise RuntimeError(f"worker {roles.index}: unknown command {cmd}")
        t_eval = time.perf_counter()
        link.recv_params(w_parts, bias, bsrv)
        acc[:] = 0.0
        loss = gb = busy = 0.0
        rows = done_units = 0
        done = -1
        while True:
            u = link.request_unit(eval_id, done)
            if u < 0:
                break
            t0 = time.perf_counter()
            if step_hook is not None:
                step_hook(roles.index, eval_id)
            lu, gu = units.accumulate(u, w, float(bias[0]), acc)
            busy += time.perf_counter() - t0
            loss += lu
            gb += gu
            rows += units.units[u].y.size
            done_units += 1
            done = u
        gbias[0] = gb
        link.send_grads(acc_parts, gbias, bsrv)
        link.gather_stats([loss, rows, done_units, busy, time.perf_counter() - t_eval - busy,
                           1.0 if stop is not None and stop.requested else 0.0])


# ----------------------------------------------------------------------------- outputs


def _finish(cfg, state, rows, link, out, wall) -> dict:
    """Coordinator only, after the other ranks are done: test metrics, baseline, model and
    metrics files, printed summary."""
    from hpcps.data.source import load_split
    from hpcps.models.logistic_math import binary_metrics, predict

    res, machine, sched = state["result"], state["machine"], state["scheduler"]
    wts, bias = state["weights"], state["bias"]
    Xt, yt = load_split(cfg.data, "test", 0, 1)
    idx = Xt.indices.astype(np.int64)
    test = binary_metrics(yt, predict(Xt, idx, wts, bias))
    stopped = res.status == "stopped"
    units = sched.done_by
    workers = [{"index": i, "units": int(units[i]),
                "unit_share": float(units[i] / max(1, units.sum())),
                "busy_seconds": float(machine.busy[i]),
                "waiting_seconds": float(machine.waiting[i])}
               for i in range(sched.n_workers)]
    by_role = {c: [dict(zip(RANK_FIELDS, r.tolist())) for r in rows if int(r[0]) == c]
               for c in (0, 1, 2)}
    for wk in by_role[1]:
        d = workers[int(wk["index"])]
        d.update(bytes_in=int(wk["bytes_in"]), bytes_out=int(wk["bytes_out"]))
    servers = [{"index": int(r["index"]), "active_keys": int(r["n_weights"]),
                "key_range": [state["layouts"][int(r["index"])].lo,
                              state["layouts"][int(r["index"])].hi],
                "memory_bytes": int(r["memory_bytes"]), "bytes_in": int(r["bytes_in"]),
                "bytes_out": int(r["bytes_out"]), "messages": int(r["messages"])}
               for r in sorted(by_role[2], key=lambda r: r["index"])]
    summary = {
        "mode": "sandblaster",
        "status": res.status,
        "stopped_by_signal": stopped,
        "objective": res.objective,
        "grad_max": res.grad_max,
        "iterations": res.iterations,
        "evaluations": res.evaluations,
        "programs": machine.programs,
        "train_seconds": res.seconds,
        "evaluation_seconds": machine.eval_seconds,
        "wall_seconds": wall,
        "rows": state["n_rows"],
        "work_units": state["n_units"],
        "active_keys": int(state["active"].size),
        "test": {k: test.get(k) for k in ("auc", "logloss", "accuracy", "n")},
        "workers": workers,
        "servers": servers,
        "coordinator": {"bytes_in": int(link.stats.total("bytes_in")),
                        "bytes_out": int(link.stats.total("bytes_out")),
                        "messages": int(link.stats.total("messages"))},
    }
    path = write_model(RunDir(cfg.output.dir).model, {"weights": wts.reshape(-1, 1),
                                                     "bias": np.array([[bias]])},
                       cfg, step=res.iterations, epoch=res.evaluations)
    summary["model_path"] = str(path)
    record = {"epoch": res.evaluations, "clock": res.iterations, "seconds": res.seconds,
              "train_objective": res.objective, "test_logloss": test.get("logloss"),
              "test_auc": test.get("auc"), "test_accuracy": test.get("accuracy"),
              "test_rows": test["n"]}
    if cfg.evaluate.sklearn_baseline:
        summary["baseline"] = _baseline(cfg, wts, bias, res.objective, Xt, yt)
    MetricsFile(cfg).final([record], summary, iterations=res.history)
    _print_summary(summary, record, out)
    return summary


def _baseline(cfg, wts, bias, f_ours, Xt, yt) -> dict:
    """scikit-learn's solution (tol 1e-8 and its default 1e-4) and the objective gaps. Local."""
    from hpcps.data.source import load_split
    from hpcps.models.logistic_math import binary_metrics

    X, y = load_split(cfg.data, "train", 0, 1)
    l2 = cfg.model.l2
    ref = sklearn_solution(X, y, l2, REFERENCE_TOL)
    dflt = sklearn_solution(X, y, l2, 1e-4)
    f_central = objective(X, y, wts, bias, l2)
    p = 1.0 / (1.0 + np.exp(-(Xt @ ref["w"] + ref["b"])))
    m = binary_metrics(yt, p)

    def gap(f):
        return (f - ref["objective"]) / abs(ref["objective"])

    return {"C": ref["C"], "tol": ref["tol"], "n_iter": ref["n_iter"], "seconds": ref["seconds"],
            "objective": ref["objective"], "objective_hpcps": f_central,
            "objective_hpcps_distributed": f_ours, "relative_gap": gap(f_central),
            "test_auc": m.get("auc"), "test_logloss": m.get("logloss"),
            "test_accuracy": m.get("accuracy"),
            "default_tol": {"tol": dflt["tol"], "n_iter": dflt["n_iter"],
                            "seconds": dflt["seconds"], "objective": dflt["objective"],
                            "relative_gap": gap(dflt["objective"])}}


def _mb(n) -> str:
    return f"{n / 1e6:,.2f} MB"


def _print_summary(s, rec, out) -> None:
    w = out.write
    why = {"gradient": "max|grad| <= tolerance", "f_tolerance": "objective stopped falling",
           "max_iterations": "max_iterations reached", "line_search_failed": "line search failed",
           "stopped": "stopped by a signal"}[s["status"]]
    w(f"done ({why}): {s['iterations']} iterations, {s['evaluations']} evaluations (passes over "
      f"{s['rows']:,} rows in {s['work_units']} work units), {s['programs']:,} programs to the "
      f"servers, {s['train_seconds']:.1f} s\n")
    w(f"  objective F = {s['objective']:.12g}, max|grad F| = {s['grad_max']:.2e}\n")
    for d in s["workers"]:
        w(f"  worker {d['index']}: {d['units']:,} units ({100 * d['unit_share']:.1f} %), busy "
          f"{d['busy_seconds']:.2f} s, waiting {d['waiting_seconds']:.2f} s\n")
    for d in s["servers"]:
        w(f"  server {d['index']}: {d['active_keys']:,} active keys of range "
          f"{d['key_range']}, {_mb(d['memory_bytes'])}; in {_mb(d['bytes_in'])}, out "
          f"{_mb(d['bytes_out'])}, {d['messages']:,} messages\n")
    def num(v):
        return "n/a" if v is None else f"{v:.4f}"

    w(f"  hpcps                              test AUC {num(rec['test_auc'])}  log-loss "
      f"{num(rec['test_logloss'])}  accuracy {num(rec['test_accuracy'])}\n")
    if "baseline" in s:
        b = s["baseline"]
        w(f"  scikit-learn LogisticRegression    test AUC {num(b['test_auc'])}  log-loss "
          f"{num(b['test_logloss'])}  accuracy {num(b['test_accuracy'])}\n")
        w(f"  objective: hpcps {b['objective_hpcps']:.12g}, scikit-learn (lbfgs, tol "
          f"{b['tol']:g}, {b['n_iter']} iterations, {b['seconds']:.1f} s) {b['objective']:.12g}: "
          f"relative gap {b['relative_gap']:+.2e}; scikit-learn with its default tol 1e-4: "
          f"{b['default_tol']['relative_gap']:+.2e}\n")
    if s["stopped_by_signal"]:
        w(f"stopped by signal after iteration {s['iterations']}: the model so far is written; "
          f"this mode has no checkpoints (a relaunch starts afresh); exit status {EXIT_REQUEUE}\n")
    w(f"  model: {s['model_path']}\n")
    out.flush()
