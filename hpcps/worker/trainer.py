"""The worker role: read this worker's data partition, pull, compute gradients, push, clock.

Under BSP every worker runs the same number of steps per epoch (the largest partition's
``ceil(rows / batch_size)``); a worker whose partition is exhausted still clocks each step
with zero examples, so no server waits for it.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from hpcps.comm.collectives import Vote, allgather_rows, allreduce_max, allreduce_sum, barrier, gatherv
from hpcps.core.consistency import BSP
from hpcps.worker.steps import NonFiniteGuard, make_steps

#: Test rows evaluated per pull when the model is evaluated at the end of an epoch.
EVAL_CHUNK = 8192


def epoch_order(n_rows: int, seed: int, worker: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Order in which ``worker`` reads its ``n_rows`` rows in ``epoch``, int64.

    Drawn from numpy's PCG64 seeded with ``[seed, worker, epoch]``, so a position
    ``(epoch, step)`` fully restores a reader's random state after a restart.
    """
    if not shuffle:
        return np.arange(n_rows, dtype=np.int64)
    return np.random.default_rng([seed, worker, epoch]).permutation(n_rows).astype(np.int64)


def epoch_rows(part_sizes, plan, n_workers, seed, epoch, shuffle, batch_size) -> list:
    """Rows (global indices into the split) each of ``n_workers`` workers reads in the rest
    of an epoch that was interrupted and resumed on different numbers of workers.

    Parameters
    ----------
    part_sizes : sequence of int
        Row counts of the partitions of the epoch's first segment (``plan[0][0]`` workers);
        the split is their concatenation in worker order.
    plan : list of [n_workers, steps_done]
        The epoch's earlier segments, oldest first; ``steps_done`` is one count for all the
        segment's workers or a list of one count per worker (a segment ended by the loss of a
        worker, :mod:`hpcps.resilience.recovery`).
    n_workers : int
        Workers of the segment about to run.

    Returns
    -------
    list of int64 ndarray, one per worker: contiguous blocks of the rows that no earlier
    segment reached (in the order the earlier readers would have read them), so that every
    row of the epoch is read exactly once over all segments.
    """
    offsets = np.concatenate([[0], np.cumsum(part_sizes)]).astype(np.int64)
    lists = [offsets[w] + epoch_order(int(n), seed, w, epoch, shuffle)
             for w, n in enumerate(part_sizes)]
    for k, (n_k, done) in enumerate(plan):
        if len(lists) != n_k:
            raise ValueError(f"epoch plan segment {k} has {n_k} workers but {len(lists)} row lists")
        per = list(done) if isinstance(done, (list, tuple)) else [done] * n_k
        if len(per) != n_k:
            raise ValueError(f"epoch plan segment {k} has {n_k} workers but {len(per)} step counts")
        rest = (np.concatenate([r[int(d) * batch_size:] for r, d in zip(lists, per)]) if lists
                else np.empty(0, np.int64))
        nxt = plan[k + 1][0] if k + 1 < len(plan) else n_workers
        lists = np.array_split(rest, nxt)
    return lists


@dataclass
class Segment:
    """What a worker reads from a change of layout (a lost worker, added workers) to the end
    of the epoch, and its data for the later epochs (:meth:`Trainer._regroup`).

    Attributes
    ----------
    Xe, ye : the whole training split (``order`` indexes it)
    order : int64 ndarray
        This worker's rows for the rest of the epoch.
    steps : int
        Steps every worker runs in the rest of the epoch.
    plan : list of [n_workers, steps_done]
        The epoch's segments before this one.
    X, y, Xt, yt : this worker's training and test partitions (later epochs, evaluation)
    steps_full : int
        Steps of a whole epoch on the new partition.
    sizes : list of int
        Rows of the partitions of the epoch's first segment.
    remaining : list of int
        Rows of the rest of the epoch, per worker.
    """

    Xe: object
    ye: object
    order: np.ndarray
    steps: int
    plan: list
    X: object
    y: object
    Xt: object
    yt: object
    steps_full: int
    sizes: list
    remaining: list


def _done_max(done) -> int:
    return max(done) if isinstance(done, (list, tuple)) else int(done)


def _peer_failure(e: BaseException) -> bool:
    from hpcps.comm.ft import is_peer_failure

    return is_peer_failure(e)


def _fmt_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Trainer:
    """Minibatch training loop of one worker.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    index, n_workers : int
        This worker's index and the number of workers (its data partition).
    client : hpcps.worker.client.PSClient
    comm : MPI.Intracomm
        The workers' communicator (for the per-epoch metrics collectives).
    is_chief : bool
        Worker 0 prints progress and collects the metrics.
    on_epoch : callable(dict) or None
        Called on the chief with each epoch's metrics record.
    policy : hpcps.core.consistency.Policy, optional
        Consistency policy (default BSP); picks the step runner (:mod:`hpcps.worker.steps`).
    step_hook : callable(worker_index, clock) or None
        Called in every step after the gradient is computed and before it is pushed (tests
        use it to slow one worker's computation down).
    model : hpcps.models.base.Model
        The model (default: the one ``cfg.model.type`` names).
    ft_state : hpcps.resilience.recovery.FTState or None
        Continue mode: survive the loss of workers (collective recovery with the servers).
    elastic : hpcps.resilience.elastic.Elastic or None
        Workers may be added while the job runs (``[elastic]``, ``hpcps grow``).
    """

    def __init__(self, cfg, index, n_workers, client, comm, is_chief, on_epoch=None, out=None,
                 stop=None, policy=None, step_hook=None, model=None, ft_state=None,
                 elastic=None):
        self.ft = ft_state
        self.elastic = elastic
        self.vote = None                  # non-blocking vote on stops and growth (SSP/async)
        self._stop_target = None          # clock at which the workers act on a vote
        self._pending = None
        if model is None:
            from hpcps.models import make_model

            model = make_model(cfg)
        self.model = model
        self.cfg = cfg
        self.index = index
        self.n_workers = n_workers
        self.client = client
        self.comm = comm
        self.is_chief = is_chief
        self.on_epoch = on_epoch
        self.out = out or sys.stdout
        self.history: list[dict] = []
        self.stop = stop                  # hpcps.core.signals.StopRequest or None
        self.stopped_by_signal = False
        self.policy = policy or BSP()
        self.step_hook = step_hook
        # non-finite steps: under BSP with a positive limit the workers vote every step (on
        # self.comm, which a recovery in continue mode replaces)
        limit = cfg.train.max_nonfinite_steps
        vote = limit > 0 and self.policy.aggregate and self.policy.staleness == 0
        agree = (lambda code: allgather_rows(self.comm, [code])[:, 0]) if vote else None
        self.guard = NonFiniteGuard(index, limit, agree, say=self._say_guard if vote else self._say)
        self.steps = make_steps(self.policy, client, model, index, step_hook, self.guard)
        self._t_clock = time.time()       # when this worker last finished a step
        self._gap_event = None            # failure record waiting for the next step's time
        self._catch_up_to = None          # clock the others had reached at the last recovery
        self.epochs_done = 0              # epochs whose closing barrier completed here
        self._epochs_agreed = 0           # the most any worker had finished, at the last recovery

    def run(self, restore=None, checkpointer=None, join=None) -> dict:
        """Train for ``cfg.train.epochs`` epochs. Collective over the workers' communicator.

        Parameters
        ----------
        restore : dict or None
            Manifest of the checkpoint to resume from (:func:`hpcps.checkpoint.read_manifest`):
            training continues at its epoch and step; with another number of workers than the
            checkpointed job, the rows the interrupted epoch had not reached yet are split over
            the new workers (:func:`epoch_rows`), so every row is still read once per epoch.
        checkpointer : hpcps.worker.checkpointer.Checkpointer or None
            Consulted after every step (collective when ``every_seconds`` is set).
        join : hpcps.resilience.elastic.JoinPlan or None
            This worker was added to the running job (``hpcps join``): it starts at the plan's
            clock, in its epoch, on its share of the rows nobody has read yet — the same
            re-plan the other workers make at that clock (:meth:`_grow`).
        """
        cfg, t = self.cfg, self.cfg.train
        self._stop_target = None
        seg = None
        if join is not None:
            start_epoch, start_step, plan = join.epoch, 0, join.plan
            n_train = n_test = 0                    # (the chief's start-up line only)
            if self.guard.agree is not None:       # the voted count is the same on every worker
                self.guard.rejected = join.nonfinite_rejected
            seg = self._regroup_or_recover(join.epoch, join.plan, checkpointer)
            X, y, Xt, yt, steps_full = seg.X, seg.y, seg.Xt, seg.yt, seg.steps_full
        else:
            X, y = self.model.load("train", self.index, self.n_workers)
            Xt, yt = self.model.load("test", self.index, self.n_workers)
            n_train, n_test = (int(v) for v in allreduce_sum(self.comm, np.array([X.shape[0], Xt.shape[0]], dtype=np.int64)))
            if n_train == 0:
                from hpcps.data import DataError
                raise DataError(f"{cfg.data.path}: no training rows (empty file, or only comments "
                                "and blank lines)")
            if n_test == 0:       # every epoch is evaluated on the test rows: none is a mistake
                from hpcps.data import DataError
                where = cfg.data.test_path or f"{cfg.data.path} (its test split)"
                raise DataError(f"{where}: no test rows (empty file, or only comments and blank "
                                "lines)")
            steps_full = self._max_steps(X.shape[0])
            if t.max_steps:
                steps_full = min(steps_full, t.max_steps)
            start_epoch, start_step, plan = 0, 0, []
            if restore is not None:
                start_epoch, start_step = int(restore["epoch"]), int(restore["step_in_epoch"])
                plan = json.loads(restore.get("epoch_plan", "[]"))
                if int(restore["n_workers"]) != self.n_workers:
                    plan = plan + [[int(restore["n_workers"]), start_step]]
                    start_step = 0
                # records of the epoch being resumed (and later) are recomputed
                self.history = [r for r in restore["history"] if r["epoch"] <= start_epoch]
                if checkpointer is not None:     # its checkpoint exists: at_end need not rewrite it
                    checkpointer.last_step = int(restore["step"])
                if self.guard.agree is not None:  # the voted count is the same on every worker
                    self.guard.rejected = int(restore.get("nonfinite_rejected", 0))
            if self.is_chief:
                self._banner(restore, n_train, n_test, steps_full, start_epoch, start_step, plan)
            # stop signals and grow requests: under BSP the workers are in step anyway and
            # agree with one Allreduce per step; under SSP/async that would tie them together,
            # so they vote without waiting (continue mode: Open MPI's non-blocking collectives
            # do not survive a lost rank, so the workers agree with a blocking Allreduce per
            # step under every policy)
            self.vote = self._make_vote()
        if checkpointer is not None and self.guard.agree is not None:
            checkpointer.extra = lambda: {"nonfinite_rejected": self.guard.rejected}
        self.epochs_done = start_epoch
        total_steps = steps_full * t.epochs
        examples_per_step = n_train / max(1, math.ceil(n_train / (t.batch_size * self.n_workers)))
        t0 = last = time.perf_counter()
        clock0 = self.client.clock_value
        local_examples = 0
        steps = steps_full
        for epoch in range(start_epoch, t.epochs):
            if seg is not None:
                # added to the running job: the rest of this epoch, re-planned at the join
                Xe, ye, order, steps, plan, seg = seg.Xe, seg.ye, seg.order, seg.steps, seg.plan, None
            elif epoch == start_epoch and plan:
                # resumed mid-epoch on another number of workers: the epoch's remaining rows
                X_all, y_all = self.model.load("train", 0, 1)
                sizes = self._part_sizes(X_all.shape[0], plan[0][0])
                order = epoch_rows(sizes, plan, self.n_workers, cfg.seed, epoch, t.shuffle,
                                   t.batch_size)[self.index]
                Xe, ye = X_all, y_all
                steps = self._max_steps(order.size)
                if t.max_steps:
                    steps = min(steps, max(0, t.max_steps - sum(_done_max(n) for _, n in plan)))
            else:
                plan = []
                order = epoch_order(X.shape[0], cfg.seed, self.index, epoch, t.shuffle)
                Xe, ye, steps = X, y, steps_full
            loss_sum, n_ex, rec = 0.0, 0, None
            first = start_step if epoch == start_epoch else 0
            seg_clock0 = self.client.clock_value - first      # clock at this segment's start
            while True:
                new_seg = None
                try:
                    if checkpointer is not None:
                        checkpointer.steps_per_epoch = steps
                    self.steps.begin_epoch(Xe, ye, order, steps, t.batch_size)
                    for step in range(first, steps):
                        rows = order[step * t.batch_size:(step + 1) * t.batch_size]
                        # after a recovery, a worker behind the others runs the steps they
                        # finished without the per-step votes (they voted on them already)
                        solo = self._catch_up_to is not None and self.client.clock_value < self._catch_up_to
                        agree, self.guard.agree = self.guard.agree, (None if solo else self.guard.agree)
                        try:
                            loss_sum += self.steps.step(step, rows, final=epoch == t.epochs - 1 and step == steps - 1)
                        finally:
                            self.guard.agree = agree
                        used = 0 if self.steps.last_rejected else int(rows.size)  # rejected step
                        self.client.clock(used, epoch)
                        n_ex += used
                        self._t_clock = time.time()
                        if self._gap_event is not None:      # first step after a recovery
                            ev, self._gap_event = self._gap_event, None
                            ev["gap_seconds"] = round(self._t_clock - ev["last_step_time"], 3)
                        if checkpointer is not None:
                            checkpointer.after_step(self.client.clock_value, epoch, step + 1, plan,
                                                    self.history, collective=not solo)
                        if solo:
                            continue
                        stop, grow, oversubscribe = self._decide(
                            final=epoch == t.epochs - 1 and step == steps - 1)
                        if stop:
                            # a stop signal reached some worker: all checkpoint here and leave
                            if self.is_chief:
                                self._say(f"stop requested by signal at clock {self.client.clock_value}: "
                                          "checkpointing, then exiting for a requeue")
                                if self.elastic is not None:
                                    self.elastic.cancel_request("the job is stopping (signal)")
                            if checkpointer is not None:
                                checkpointer.write(self.client.clock_value, epoch, step + 1, plan, self.history)
                            self.stopped_by_signal = True
                            break
                        if grow:
                            new_seg = self._grow(epoch, seg_clock0, steps, plan, checkpointer, grow,
                                                 oversubscribe)
                            if new_seg is not None:
                                break
                        if self.is_chief and time.perf_counter() - last >= t.progress_seconds:
                            last = time.perf_counter()
                            done = max(1, self.client.clock_value - clock0)
                            rate = done * examples_per_step / (last - t0)
                            eta = (last - t0) / done * max(0, total_steps - self.client.clock_value)
                            self._say(f"epoch {epoch + 1}/{t.epochs}  step {step + 1}/{steps}  "
                                      f"clock {self.client.clock_value} (workers "
                                      f"{','.join(str(c) for c in self.client.worker_clocks())})  {rate:,.0f} ex/s  "
                                      f"loss(w0) {loss_sum / max(1, n_ex):.4f}  ETA {_fmt_eta(eta)}")
                    if new_seg is None:
                        if not self.stopped_by_signal:
                            rec = self._evaluate(epoch, Xt, yt, loss_sum, n_ex, time.perf_counter() - t0)
                            if self.ft is not None:
                                barrier(self.comm)     # every worker finished the epoch
                                self.epochs_done = epoch + 1
                            self._record(rec)
                        break
                except Exception as e:      # noqa: BLE001 - only a lost peer is recovered
                    if self.ft is None or not _peer_failure(e):
                        raise
                    new_seg, first_after, done_ex = self._recover(epoch, seg_clock0, steps, plan,
                                                                  checkpointer)
                    n_ex += done_ex
                    if self._epochs_agreed > epoch:
                        # the closing barrier completed on other workers, not here: the epoch is
                        # over (the chief had its record then: the others waited for it)
                        self.epochs_done = epoch + 1
                        self._record(rec)
                        break
                    if new_seg is None:       # the same workers: each goes on from its own step
                        first = first_after
                        continue
                # the layout changed (a worker lost, workers added): the rest of the epoch
                Xe, ye, order, steps, plan = new_seg.Xe, new_seg.ye, new_seg.order, new_seg.steps, new_seg.plan
                X, y, Xt, yt, steps_full = new_seg.X, new_seg.y, new_seg.Xt, new_seg.yt, new_seg.steps_full
                first, seg_clock0 = 0, self.client.clock_value
                examples_per_step = n_train / max(1, math.ceil(n_train / (t.batch_size * self.n_workers)))
            local_examples += n_ex
            if self.stopped_by_signal:
                break
        if self.vote is not None:
            self.vote.finish()
        if checkpointer is not None and not self.stopped_by_signal:
            checkpointer.at_end(self.client.clock_value, t.epochs - 1, steps, plan, self.history)
        elapsed = time.perf_counter() - t0
        total_examples = int(allreduce_sum(self.comm, np.array([local_examples], dtype=np.int64))[0])
        return {"seconds": elapsed, "examples": total_examples,
                "steps": self.client.clock_value - clock0, "epochs": t.epochs,
                "examples_per_second": total_examples / elapsed if elapsed else 0.0,
                "clock": self.client.clock_value, "stopped_by_signal": self.stopped_by_signal}

    def _banner(self, restore, n_train, n_test, steps_full, start_epoch, start_step, plan) -> None:
        """The chief's start-up lines: layout, data, model, policy; the checkpoint resumed;
        the growth the job file plans."""
        cfg, t = self.cfg, self.cfg.train
        self._say(f"hpcps: {self.n_workers} worker(s), {self.client.n_servers} server(s); "
                  f"{n_train} train / {n_test} test rows; model {self.model.name} "
                  f"({self._n_params():,} parameters); "
                  f"{steps_full} steps/epoch of {t.batch_size} rows per worker; "
                  + ("AllReduce of the gradients (BSP by construction), "  # [cluster] mode
                     if self.client.pull_mode == "allreduce" else
                     f"{self.policy.describe()} ({self.client.pull_mode} pulls), ")
                  + f"{cfg.optimizer.name} lr={cfg.optimizer.learning_rate}")
        if restore is not None:
            self._say(f"resumed from checkpoint step {restore['step']} (epoch {start_epoch + 1}, "
                      f"step {int(restore['step_in_epoch'])} of the epoch, written by "
                      f"{restore['n_workers']} worker(s) and {restore['n_servers']} server(s))")
            if restore.get("config", cfg.text) != cfg.text:
                self._say("hpcps: warning: the job file differs from the one the checkpoint was "
                          "written with; training continues with the new settings")
            if (start_epoch == t.epochs - 1 and start_step >= steps_full and not plan):
                self._say(f"hpcps: note: this job already finished (checkpoint at its last "
                          f"step, in {cfg.output.dir}); nothing is trained, the model is "
                          "re-evaluated. To train again: --resume never, or another "
                          "[output] dir or job name")
        e = cfg.elastic
        if e.add_workers:
            clock = self.client.clock_value
            if self.elastic is not None and self.elastic.unavailable:
                self._say(f"hpcps: warning: [elastic] add_workers = {e.add_workers}: cannot add "
                          f"workers to this job: {self.elastic.unavailable}")
            elif clock >= e.at_step:
                self._say(f"hpcps: note: [elastic] at_step = {e.at_step} is not ahead of the "
                          f"clock resumed ({clock}): no workers are added (launch with the "
                          "number of workers you want)")
            elif e.at_step >= steps_full * t.epochs:
                self._say(f"hpcps: note: [elastic] at_step = {e.at_step} is not before the "
                          f"job's last step ({steps_full * t.epochs}): no workers are added")
            else:
                self._say(f"hpcps: {e.add_workers} worker(s) will be added at clock {e.at_step}")

    def _blocks(self) -> bool:
        """True when training partition ``p`` of ``P`` is block ``p`` of the split's rows."""
        from hpcps.data.source import block_partitioned

        return block_partitioned(self.cfg.data) and getattr(self.model, "block_partitioned", True)

    def _part_sizes(self, n_rows: int, n_parts: int) -> list:
        """Rows of each of ``n_parts`` training partitions (their concatenation is the split)."""
        from hpcps.data.partition_rows import block_bounds

        if self._blocks():
            return [b - a for a, b in (block_bounds(n_rows, p, n_parts) for p in range(n_parts))]
        return [self.model.load("train", p, n_parts)[0].shape[0] for p in range(n_parts)]

    def _record(self, rec) -> None:
        """Keep an epoch's metrics record (the chief's; None elsewhere) and report it."""
        if rec is not None:
            self.history.append(rec)
            if self.on_epoch:
                self.on_epoch(rec)

    def _recover(self, epoch, seg_clock0, steps, plan, checkpointer):
        """Recover from the loss of workers or servers in the middle of ``epoch`` (see
        :mod:`hpcps.resilience.recovery`). Collective over every survivor (servers included).

        The client re-routes each key range to its primary now and sends the kept pushes the
        ranges ask for. When no worker died every worker goes on with its own rows from its
        own step (the run is the same as without the failure); otherwise the survivors
        re-plan the rows nobody reached (:meth:`_regroup`).

        Returns
        -------
        (Segment or None, int, int)
            The rest of the epoch when workers died (None: the segment goes on), the step of
            the segment to go on from (when it goes on), and the examples of steps found
            finished (their CLOCK reached the servers before the failure interrupted this
            worker).
        """
        from hpcps.resilience.recovery import WorkerReport, recover

        t_fail = time.time()
        n_old, old_me = self.n_workers, self.index
        rec = recover(self.ft, WorkerReport(self.client.clock_value, self.client.kept_from(),
                                            self.epochs_done))
        self._epochs_agreed = rec.plan.epochs
        self._rebind(rec.roles, checkpointer, server_ranks=rec.owner_ranks)
        mine = int(rec.clocks[old_me])
        done_ex = 0
        if self.client.kept is not None:
            for c in range(self.client.clock_value, mine):
                done_ex += int(self.client.kept.get(c, [0])[0] or 0)
        self.client.rollback(mine)
        self.client.pushes_sent[:] = 0
        resent = self.client.resend(rec.base) if rec.resend else 0
        t = self.cfg.train
        event = {"time": t_fail, "epoch": epoch + 1,
                 "failed_ranks": rec.failed_world_ranks, "failed_hosts": rec.failed_hosts,
                 "dead_workers": rec.dead_workers, "dead_servers": rec.dead_servers,
                 "messages_resent": resent, "last_step_time": self._t_clock}
        if rec.dead_servers or rec.plan.lost_ranges:
            event.update(self._range_event(rec))
        seg, first = None, 0
        if rec.dead_workers:
            # what each old worker finished of this segment; the survivors re-plan the rest
            done = [int(min(max(0, c - seg_clock0), steps)) for c in rec.clocks]
            seg = self._regroup_or_recover(epoch, plan + [[n_old, done]], checkpointer)
            prev = epoch_rows(seg.sizes, plan, n_old, self.cfg.seed, epoch, t.shuffle, t.batch_size)
            reassigned = int(sum(max(0, prev[w].size - done[w] * t.batch_size)
                                 for w in rec.dead_workers))
            target = self.client.clock_value
            event.update(worker_steps_done=done, examples_reassigned=reassigned)
        else:                       # same workers, same rows: each goes on from its own step
            target = int(allreduce_max(self.comm, np.array([self.client.clock_value], dtype=np.int64))[0])
            first = self.client.clock_value - seg_clock0
            self._catch_up_to = target
            event["examples_reassigned"] = 0
        event.update(survivors=self.n_workers, clock=target,
                     recovery_seconds=round(time.time() - t_fail, 3))
        self._gap_event = event       # gap_seconds: last step before -> first step after
        self.ft.events.append(event)
        if self.is_chief:
            self._say_recovery(rec, event)
        return seg, first, done_ex

    def _range_event(self, rec) -> dict:
        """The event fields of a server loss: where each range went, what was reloaded."""
        plan = rec.plan
        moved = {}
        for r, chain in enumerate(plan.chains):
            if chain and r not in plan.lost_ranges and chain[0] != r:
                moved[str(r)] = chain[0]
        lost = {str(r): int(rec.lost_steps[r]) for r in plan.lost_ranges}
        return {"ranges_moved": moved, "ranges_reloaded": [int(r) for r in plan.lost_ranges],
                "reload_step": rec.reload_step, "lost_steps": lost,
                "resumed_at": {str(r): int(rec.base[r]) for r in plan.lost_ranges},
                "backups": {str(r): (c[1] if len(c) > 1 else None)
                            for r, c in enumerate(plan.chains) if c}}

    def _say_recovery(self, rec, ev) -> None:
        """The chief's lines about a recovery (log; the same facts are in the metrics)."""
        where = f"at clock ~{ev['clock']} (epoch {ev['epoch']})"
        ranks = ", ".join(map(str, rec.failed_world_ranks))
        if rec.dead_workers:
            self._say(f"hpcps: worker(s) {', '.join(map(str, rec.dead_workers))} (rank(s) "
                      f"{ranks}) lost {where}; {self.n_workers} worker(s) continue, "
                      f"{ev['examples_reassigned']} example(s) of the epoch reassigned")
        if rec.dead_servers:
            self._say(f"hpcps: server(s) {', '.join(map(str, rec.dead_servers))} (rank(s) "
                      f"{ranks}) lost {where}")
        for r, s in ev.get("ranges_moved", {}).items():
            self._say(f"hpcps: key range {r} taken over by server {s} from its backup copy "
                      "(nothing lost)")
        for r in ev.get("ranges_reloaded", []):
            k, lost, base = ev["reload_step"], ev["lost_steps"][str(r)], ev["resumed_at"][str(r)]
            src = f"checkpoint step {k}" if k else "its initial values (no checkpoint yet)"
            self._say(f"hpcps: key range {r} had no copy left: reloaded from {src} onto server "
                      f"{rec.plan.chains[r][0]}; {lost} step(s) of updates to that range lost "
                      f"(steps {k}..{base - 1}), it resumes at clock {base}"
                      if lost else
                      f"hpcps: key range {r} had no copy left: reloaded from {src} onto server "
                      f"{rec.plan.chains[r][0]}; 0 steps lost (every later step was resent)")
        no_backup = [r for r, b in ev.get("backups", {}).items() if b is None]
        if no_backup and self.ft.replicas > 1:
            self._say(f"hpcps: warning: key range(s) {', '.join(no_backup)} have no backup "
                      "(too few servers left)")
        self._say(f"hpcps: recovered in {ev['recovery_seconds']:.2f} s (agreement and re-routing; "
                  "metrics.json's gap_seconds: last step before the failure -> first after)")

    def _rebind(self, roles, checkpointer, windows=None, server_ranks=None) -> None:
        """Work in the layout ``roles`` (after a recovery or a growth): the client's
        endpoint, this worker's index and communicator, the checkpointer's. Local; the
        steps runner drops what it held (flushed before a growth).

        ``server_ranks``: the ``roles.ps`` rank holding each key range (default: the routing
        the client has, continue mode — a growth keeps every old rank's number —, else
        ``roles.server_ranks``)."""
        if server_ranks is None:
            server_ranks = self.client.ep.server_ranks if self.ft is not None else roles.server_ranks
        self.client.rebind(roles.ps, server_ranks, roles.n_workers, windows)
        self.comm, self.index, self.n_workers = roles.role_comm, roles.index, roles.n_workers
        self.is_chief = roles.is_chief
        self.guard.index = self.index
        self.steps.begin_epoch(None, None, None, 0, 1)
        if hasattr(self.steps, "_reset"):
            self.steps._reset()
        if checkpointer is not None:
            checkpointer.comm, checkpointer.n_workers = self.comm, self.n_workers
            checkpointer.is_chief = self.is_chief

    def _regroup(self, epoch, plan) -> "Segment":
        """The rest of ``epoch`` for this worker after the layout changed: the rows no earlier
        segment of ``plan`` reached, split over the current workers (:func:`epoch_rows`), and
        this worker's partition for the later epochs. Collective over the workers — old and
        added ones alike, in this order: the catch-up to the largest clock (after a loss),
        the steps of the rest of the epoch, the steps of a whole epoch, the new vote."""
        t = self.cfg.train
        target = int(allreduce_max(self.comm, np.array([self.client.clock_value], dtype=np.int64))[0])
        while self.client.clock_value < target:       # survivors behind catch up, empty steps
            self.client.clock(0, epoch)
        X_all, y_all = self.model.load("train", 0, 1)
        sizes = self._part_sizes(X_all.shape[0], plan[0][0])
        lists = epoch_rows(sizes, plan, self.n_workers, self.cfg.seed, epoch, t.shuffle,
                           t.batch_size)
        order = lists[self.index]
        steps = self._max_steps(order.size)
        if t.max_steps:
            steps = min(steps, max(0, t.max_steps - sum(_done_max(n) for _, n in plan)))
        if self._blocks():                            # this worker's block: no second read
            from hpcps.data.partition_rows import block_bounds
            a, b = block_bounds(X_all.shape[0], self.index, self.n_workers)
            X, y = X_all[a:b], y_all[a:b]
        else:
            X, y = self.model.load("train", self.index, self.n_workers)
        Xt, yt = self.model.load("test", self.index, self.n_workers)
        steps_full = self._max_steps(X.shape[0])
        if t.max_steps:
            steps_full = min(steps_full, t.max_steps)
        self.vote = self._make_vote()
        return Segment(Xe=X_all, ye=y_all, order=order, steps=steps, plan=plan, X=X, y=y, Xt=Xt,
                       yt=yt, steps_full=steps_full, sizes=sizes,
                       remaining=[int(r.size) for r in lists])

    def _regroup_or_recover(self, epoch, plan, checkpointer) -> "Segment":
        """:meth:`_regroup` at the first clock of a segment (a growth); a worker lost meanwhile
        (continue mode) is recovered from as lost at that clock, before any step of the
        segment, so the rows are re-planned from ``plan``. Collective as :meth:`_regroup`."""
        try:
            return self._regroup(epoch, plan)
        except Exception as e:      # noqa: BLE001 - only a lost peer is recovered
            if self.ft is None or not _peer_failure(e):
                raise
            seg, _, _ = self._recover(epoch, self.client.clock_value, 0, plan, checkpointer)
            # a server only: the same workers regroup as planned
            return seg if seg is not None else self._regroup_or_recover(epoch, plan, checkpointer)

    def _grow(self, epoch, seg_clock0, steps, plan, checkpointer, n, oversubscribe):
        """Add ``n`` workers at this clock (:mod:`hpcps.resilience.elastic`); returns the
        :class:`Segment` of the rest of the epoch, or None when they could not be added (the
        job goes on as it was). Collective over every rank of the job."""
        from hpcps.resilience.elastic import JoinPlan

        t_start = time.time()
        clock = self.client.clock_value
        n_old = self.n_workers
        self.steps.flush()                            # Downpour: nothing held across the join
        if self.vote is not None:
            self.vote.finish()
            self.vote = None
        self.client.grow(n, oversubscribe)            # after this clock's last request
        plan_next = plan + [[n_old, int(min(clock - seg_clock0, steps))]]
        join = None
        if self.is_chief:
            cfg = self.cfg
            join = JoinPlan(clock=clock, epoch=epoch, n_old=n_old, plan=plan_next,
                            job_text=cfg.text, job_path=str(cfg.path),
                            output_dir=str(cfg.output.dir), pull=cfg.consistency.pull,
                            tables=JoinPlan.layout(self.client.specs),
                            nonfinite_rejected=self.guard.rejected,
                            range_ranks=list(self.client.ep.server_ranks) if self.ft else [])
        event = self.elastic.grow(n, clock, lambda roles, windows: self._rebind(roles, checkpointer, windows),
                                  oversubscribe=oversubscribe, join=join)
        if event is None:
            self.vote = self._make_vote()             # on the unchanged workers' communicator
            return None
        seg = self._regroup_or_recover(epoch, plan_next, checkpointer)
        if self.is_chief:
            event.update(epoch=epoch + 1, examples_replanned=int(sum(seg.remaining)),
                         examples_to_new_workers=int(sum(seg.remaining[n_old:])),
                         pause_seconds=round(time.time() - t_start, 3))
            lost = n_old + n - self.n_workers          # lost at once (continue mode)
            self._say(f"hpcps: {n} worker(s) added at clock {clock} (epoch {epoch + 1})"
                      f"{f', {lost} lost at once' if lost else ''}: "
                      f"{self.n_workers} workers; the epoch's {event['examples_replanned']} "
                      f"unread example(s) re-planned over them "
                      f"({event['examples_to_new_workers']} to the new ones); spawn "
                      f"{event['spawn_seconds']:.2f} s, pause {event['pause_seconds']:.2f} s")
        return seg

    def _make_vote(self):
        """The non-blocking vote on stop signals and grow requests (SSP/async, not in
        continue mode), or None (BSP and continue mode vote with a blocking Allreduce).
        Collective over the workers when it makes one (``Dup``)."""
        if ((self.stop is not None or self.elastic is not None) and self.policy.staleness != 0
                and self.ft is None):
            return Vote(self.comm, 3)
        return None

    def _decide(self, final: bool = False) -> tuple[bool, int, bool]:
        """After a step: whether every worker stops (a stop signal reached one of them) and
        how many workers are added now (the job file's ``[elastic]``, or a ``hpcps grow``
        request the chief found), with their oversubscribe flag — the same on every worker.

        Collective over the workers when stop signals or requests can arrive: under BSP one
        Allreduce per step; under SSP/async a non-blocking :class:`~hpcps.comm.collectives.Vote`,
        then one Allreduce of the clocks so that all act at the same clock (the largest; the
        others catch up to it). Nothing is added after the last step (``final``).
        """
        el = self.elastic
        clock = self.client.clock_value
        add, over = el.planned(clock) if el is not None and not final else (0, False)
        if self.stop is None and el is None:
            return False, add, over
        want = np.zeros(3, dtype=np.int64)
        want[0] = int(self.stop is not None and self.stop.requested)
        if el is not None and self.is_chief and not final:
            n, o = el.poll_request()
            want[1:] = (n, int(o))
        if self.vote is None:
            got = allreduce_max(self.comm, want)
        else:
            got = None
            if self._stop_target is None:
                res = self.vote.poll(want)
                if res is not None and res.any():
                    self._stop_target = int(allreduce_max(self.comm, np.array([clock], dtype=np.int64))[0])
                    self._pending = res
            if self._stop_target is not None and clock >= self._stop_target:
                got, self._stop_target = self._pending, None
        if got is None:
            return False, add, over
        if got[1] and not final:
            add, over = add + int(got[1]), over or bool(got[2])
        return bool(got[0]), add, over

    def _max_steps(self, n_rows: int) -> int:
        """Steps every worker runs so that the largest partition is covered. Collective."""
        b = self.cfg.train.batch_size
        return int(allreduce_max(self.comm, np.array([math.ceil(n_rows / b)], dtype=np.int64))[0])

    def _evaluate(self, epoch, Xt, yt, loss_sum, n_ex, elapsed):
        """Epoch metrics: progressive training loss and the model's test metrics. Collective
        over the workers' communicator; the rows are pulled fresh (not from a stale cache)."""
        tr = allreduce_sum(self.comm, np.array([loss_sum, n_ex], dtype=np.float64))
        preds = []
        for a in range(0, Xt.shape[0], EVAL_CHUNK):
            Xc = Xt[a:a + EVAL_CHUNK]
            keys = self.model.batch_keys(Xc)
            params = {t: self.client.pull(t, k, fresh=True) for t, k in keys.items()}
            preds.append(np.asarray(self.model.predict(Xc, keys, params), dtype=np.float64).reshape(-1))
        p = np.concatenate(preds) if preds else np.empty(0)
        all_p = gatherv(self.comm, p)
        all_y = gatherv(self.comm, np.asarray(yt, dtype=np.float64).reshape(-1))
        if not self.is_chief:
            return None
        if all_y.size and all_p.size != all_y.size:
            all_p = all_p.reshape(all_y.size, -1)       # (n, k) predictions, e.g. class probabilities
        m = self.model.metrics(all_y, all_p)
        ln = self.model.loss_name
        rec = {"epoch": epoch + 1, "clock": self.client.clock_value, "seconds": round(elapsed, 3),
               f"train_{ln}": float(tr[0] / tr[1]) if tr[1] else float("nan")}
        rec.update({f"test_{k}": float(v) for k, v in m.items() if k != "n"})
        rec["test_rows"] = int(m.get("n", all_y.size))
        self._say(f"epoch {epoch + 1}: train {self.model.loss_label} {rec[f'train_{ln}']:.4f}  "
                  f"{self.model.describe(m)}  ({elapsed:.1f} s)")
        return rec

    def _n_params(self) -> int:
        return sum(s.num_keys * s.dim for s in self.client.specs)

    def _say_guard(self, text: str) -> None:
        """A rejected step under a vote: every worker knows it, the chief says it."""
        if self.is_chief:
            self._say(text)

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
