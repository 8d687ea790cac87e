"""The epoch loop around the trainer: it plans each segment, runs it, and handles what ends a
segment early — the training loop (:meth:`hpcps.worker.trainer.Trainer.run_segment`) never
sees recovery or growth.

- :class:`~hpcps.worker.events.StopRequested`: every worker checkpoints at this step and the
  run ends (the job exits for a requeue).
- :class:`~hpcps.worker.events.GrowthRequested`: workers are added at this clock
  (:mod:`hpcps.resilience.elastic`); the rows of the epoch nobody has read are re-planned over
  the old and the new workers (:func:`regroup`), and the run resumes.
- :class:`~hpcps.worker.events.PeerLost` (continue mode): the survivors recover with the
  servers (:mod:`hpcps.resilience.recovery`) — the *worker-loss re-plan*: when workers died,
  the rows they had not read are split over the survivors; when only servers died, every
  worker goes on from its own step.

The planning itself (which rows, how many steps) is :mod:`hpcps.core.planning`.
"""

from __future__ import annotations

import time

import numpy as np

from hpcps.comm.collectives import allreduce_max
from hpcps.comm.ft import is_peer_failure
from hpcps.core.planning import (capped_steps, epoch_rows, rows_reassigned, segment_done,
                                 segment_steps, steps_for)
from hpcps.resilience.elastic import JoinPlan
from hpcps.resilience.recovery import WorkerReport, recover
from hpcps.worker.events import GrowthRequested, PeerLost, StopRequested
from hpcps.worker import streaming
from hpcps.worker.trainer import Cursor, Segment

__all__ = ["supervise", "Supervisor", "regroup"]


def supervise(trainer, restore=None, checkpointer=None, join=None) -> dict:
    """Train for ``cfg.train.epochs`` epochs: :meth:`Supervisor.run`. Collective over the
    workers' communicator (and, for a recovery or a growth, every rank of the job)."""
    return Supervisor(trainer, checkpointer).run(restore=restore, join=join)


def regroup(tr, epoch, plan, clock0) -> Segment:
    """The rest of ``epoch`` for this worker after the layout changed: the rows no earlier
    segment of ``plan`` reached, split over the current workers (:func:`~hpcps.core.planning.epoch_rows`),
    and this worker's partition for the later epochs. ``clock0``: the clock the segment
    starts at, the same on every worker (the growth's clock, or the largest clock the
    survivors of a failure agreed on); a worker behind catches up to it with empty steps
    first. No collective (the catch-up's CLOCKs are point-to-point; outside continue mode an
    SSP/async job's new vote is a ``Dup`` over the workers, :meth:`make_vote`): the steps
    of the segment and of a whole epoch are computed from every worker's rows, the values an
    Allreduce(MAX) gave, so that a worker re-planning after a failure while the others
    already run the segment (:meth:`Supervisor.regroup_or_recover`) cannot meet their
    collectives with its own."""
    t = tr.cfg.train
    while tr.client.clock_value < clock0:       # survivors behind catch up, empty steps
        tr.client.clock(0, epoch)
    X_all, y_all, sizes, lists = tr.rest_of_epoch(epoch, plan)
    order = lists[tr.index]
    steps = segment_steps(lists, t.batch_size, t.max_steps, plan)
    if tr.blocks():                              # this worker's block: no second read
        a, b = tr.part_bounds(X_all.shape[0], tr.index, tr.n_workers)
        X, y = X_all[a:b], y_all[a:b]
    else:
        X, y = tr.model.load("train", tr.index, tr.n_workers)
    Xt, yt = tr.model.load("test", tr.index, tr.n_workers)
    # every worker's partition (the split's, when the epoch began on as many workers)
    parts = sizes if len(sizes) == tr.n_workers else tr.part_sizes(X_all.shape[0], tr.n_workers)
    steps_full = capped_steps(max((steps_for(n, t.batch_size) for n in parts), default=0),
                              t.max_steps)
    tr.vote = tr.make_vote()
    return Segment(Xe=X_all, ye=y_all, order=order, steps=steps, plan=plan, X=X, y=y, Xt=Xt,
                   yt=yt, steps_full=steps_full, sizes=sizes,
                   remaining=[int(r.size) for r in lists])


class Supervisor:
    """Runs a :class:`~hpcps.worker.trainer.Trainer` segment by segment (see the module).

    Parameters
    ----------
    trainer : hpcps.worker.trainer.Trainer
    checkpointer : hpcps.worker.checkpointer.Checkpointer or None
        Consulted after every step (collective when ``every_seconds`` is set).
    """

    def __init__(self, trainer, checkpointer=None):
        self.tr = trainer
        self.ckpt = checkpointer
        self.last = None            # the last epoch's cursor, once its steps ran
        self._end = None            # (steps, plan, examples, wrap_up) of the end of the run

    def run(self, restore=None, join=None, wrap_up=None) -> dict:
        """Train for ``cfg.train.epochs`` epochs. Collective over the workers' communicator.

        Parameters
        ----------
        restore : dict or None
            Manifest of the checkpoint to resume from (:func:`hpcps.checkpoint.read_manifest`):
            training continues at its epoch and step; with another number of workers than the
            checkpointed job, the rows the interrupted epoch had not reached yet are split over
            the new workers (:func:`~hpcps.core.planning.epoch_rows`), so every row is still
            read once per epoch.
        join : hpcps.resilience.elastic.JoinPlan or None
            This worker was added to the running job (``hpcps join``): it starts at the plan's
            clock, in its epoch, on its share of the rows nobody has read yet — the same
            re-plan the other workers make at that clock (:meth:`grow`).
        wrap_up : callable(dict) or None
            Called with the totals after :meth:`~hpcps.worker.trainer.Trainer.finish`: the
            rest of this worker's part in the end of the run (the model's export, STOP to the
            servers), which :meth:`finish` runs again after a recovery.

        Returns
        -------
        dict : :meth:`hpcps.worker.trainer.Trainer.finish`'s totals.
        """
        tr, t = self.tr, self.tr.cfg.train
        seg = None
        if join is not None:
            start_epoch, start_step, plan = join.epoch, 0, join.plan
            if tr.guard.agree is not None:       # the voted count is the same on every worker
                tr.guard.rejected = join.nonfinite_rejected
            seg = self.regroup_or_recover(join.epoch, join.plan, join.clock)
            streaming.adopt(tr, seg)
        else:
            start_epoch, start_step, plan = tr.prepare(restore, self.ckpt)
        tr.begin_run(start_epoch, self.ckpt)
        local_examples = 0
        steps = tr.steps_full
        for epoch in range(start_epoch, t.epochs):
            if seg is not None:
                # added to the running job: the rest of this epoch, re-planned at the join
                cur = Cursor(epoch=epoch, Xe=seg.Xe, ye=seg.ye, order=seg.order, steps=seg.steps,
                             plan=seg.plan, first=0, seg_clock0=tr.client.clock_value)
                seg = None
            else:
                cur = tr.epoch_cursor(epoch, start_step if epoch == start_epoch else 0,
                                      plan if epoch == start_epoch else ())
            self._run_epoch(cur)
            self.last = cur
            steps, plan = cur.steps, cur.plan
            local_examples += cur.n_ex
            if tr.stopped_by_signal:
                break
        self._end = [steps, plan, local_examples, wrap_up]
        return self.finish()

    def finish(self, recover: bool = False) -> dict:
        """The end of the run after the last step: :meth:`~hpcps.worker.trainer.Trainer.finish`
        (the final checkpoint, the totals) and :meth:`run`'s ``wrap_up``. In continue mode a
        peer lost meanwhile is recovered (:meth:`recover_at_end`) and both run again on the
        survivors — also when the job's wiring caught the loss later (``recover``: recover
        first), while the survivors gathered the report. Collective over the workers (after a
        loss: every survivor)."""
        tr = self.tr
        while True:
            try:
                if recover:
                    self.recover_at_end()
                    recover = False
                steps, plan, examples, wrap_up = self._end
                result = tr.finish(steps, plan, examples, self.ckpt)
                if wrap_up is not None:
                    wrap_up(result)
                return result
            except Exception as e:      # noqa: BLE001 - only a lost peer is recovered
                if not (self.last is not None and self.lost_peer(e)):
                    raise
                recover = True

    def lost_peer(self, e: BaseException) -> bool:
        """Whether ``e`` reports a lost peer that continue mode recovers from. Local."""
        return isinstance(e, PeerLost) or (self.tr.ft is not None and is_peer_failure(e))

    def recover_at_end(self) -> None:
        """Recover from a peer lost after the last step (:meth:`_recover` in the last epoch,
        which every survivor had finished: nothing is re-planned). The totals count the
        examples of steps found finished; the final checkpoint is written again by the
        survivors' chief (the chief may be the worker lost). Collective over every survivor."""
        cur = self.last
        _, _, done_ex = self.recover(cur)
        self._end[2] += done_ex
        if self.ckpt is not None:
            self.ckpt.last_step = None

    def _run_epoch(self, cur) -> None:
        """Run ``cur``'s epoch to its end (or to a stop), handling every event on the way."""
        tr = self.tr
        resume = False
        while True:
            try:
                try:
                    tr.run_segment(cur, self.ckpt, resume=resume)
                except GrowthRequested as g:
                    seg = self.grow(cur, g.n, g.oversubscribe)
                    resume = seg is None               # nobody added: the segment goes on
                    if seg is not None:
                        cur.resegment(seg, tr.client.clock_value)
                        streaming.adopt(tr, seg)
                    continue
                except StopRequested:
                    tr.stop_here(cur, self.ckpt)
                return
            except Exception as e:      # noqa: BLE001 - only a lost peer is recovered
                if not self.lost_peer(e):
                    raise
                resume = False
                seg, first_after, done_ex = self.recover(cur)
                cur.n_ex += done_ex
                if tr.epochs_agreed > cur.epoch:
                    # the closing barrier completed on other workers, not here: the epoch is
                    # over (the chief had its record then: the others waited for it)
                    tr.epochs_done = cur.epoch + 1
                    tr.record(cur.rec)
                    return
                if seg is None:       # the same workers: each goes on from its own step
                    cur.first = first_after
                    continue
                # a worker lost: the rest of the epoch, re-planned over the survivors
                cur.resegment(seg, tr.client.clock_value)
                streaming.adopt(tr, seg)

    def regroup_or_recover(self, epoch, plan, clock0) -> Segment:
        """:func:`regroup` at the first clock of a segment, ``clock0`` (a growth, a recovery
        from a lost worker); a peer lost meanwhile (continue mode) is recovered from here.

        A failure is noticed where each rank waits: the others may have finished their
        re-plan (its last collective completed for them) and taken steps of the segment
        while this worker was still in it. So this worker recovers as one of the segment
        that had taken no step yet — the segment as the others run it (its first clock
        ``clock0``, its steps computed from ``plan`` as :func:`regroup` does) — and every
        survivor re-plans from the same steps done. As :func:`regroup`; after a lost peer,
        collective over every survivor (the recovery)."""
        tr = self.tr
        try:
            return regroup(tr, epoch, plan, clock0)
        except Exception as e:      # noqa: BLE001 - only a lost peer is recovered
            if tr.ft is None or not is_peer_failure(e):
                raise
            t = tr.cfg.train
            steps = segment_steps(tr.rest_of_epoch(epoch, plan)[3], t.batch_size, t.max_steps,
                                  plan)
            seg, _, _ = self._recover(epoch, clock0, steps, plan)
            # a server only: this worker regroups as planned and then catches up with the
            # others' steps (tr.catch_up_to), having taken none of the segment's
            return seg if seg is not None else self.regroup_or_recover(epoch, plan, clock0)

    def recover(self, cur):
        """:meth:`_recover` in the middle of ``cur``'s segment. Streamed data: what the
        reader read ahead of the steps this worker goes on from (or, re-planned, finished)
        is counted as read again (:func:`hpcps.worker.streaming.release`)."""
        me = self.tr.index
        seg, first, done_ex = self._recover(cur.epoch, cur.seg_clock0, cur.steps, cur.plan)
        if seg is not None:       # the re-plan's entry for cur's segment: [workers, done]
            done = seg.plan[len(cur.plan)][1]
            streaming.release(cur, done[me] if isinstance(done, list) else done,
                              self.tr.cfg.train.batch_size)
        elif self.tr.epochs_agreed <= cur.epoch:
            streaming.release(cur, first, self.tr.cfg.train.batch_size)
        return seg, first, done_ex

    def _recover(self, epoch, seg_clock0, steps, plan):
        """Recover from the loss of workers or servers in the middle of ``epoch`` (see
        :mod:`hpcps.resilience.recovery`). Collective over every survivor (servers included).

        The client re-routes each key range to its primary now and sends the kept pushes the
        ranges ask for. When no worker died every worker goes on with its own rows from its
        own step (the run is the same as without the failure); otherwise the survivors
        re-plan the rows nobody reached (:func:`regroup`).

        Returns
        -------
        (Segment or None, int, int)
            The rest of the epoch when workers died (None: the segment goes on), the step of
            the segment to go on from (when it goes on), and the examples of steps found
            finished (their CLOCK reached the servers before the failure interrupted this
            worker).
        """
        tr = self.tr
        t_fail = time.time()
        n_old, old_me = tr.n_workers, tr.index
        rec = recover(tr.ft, WorkerReport(tr.client.clock_value, tr.client.kept_from(),
                                          tr.epochs_done))
        tr.epochs_agreed = rec.plan.epochs
        tr.follow(self.ckpt)                 # the membership recover() changed
        mine = int(rec.clocks[old_me])
        done_ex = 0
        if tr.client.kept is not None:
            for c in range(tr.client.clock_value, mine):
                done_ex += int(tr.client.kept.get(c, [0])[0] or 0)
        tr.client.rollback(mine)
        tr.client.pushes_sent[:] = 0
        resent = tr.client.resend(rec.base) if rec.resend else 0
        t = tr.cfg.train
        event = {"time": t_fail, "epoch": epoch + 1,
                 "failed_ranks": rec.failed_world_ranks, "failed_hosts": rec.failed_hosts,
                 "dead_workers": rec.dead_workers, "dead_servers": rec.dead_servers,
                 "messages_resent": resent, "last_step_time": tr.last_step_time}
        if rec.dead_servers or rec.plan.lost_ranges:
            event.update(_range_event(rec))
        seg, first = None, 0
        if rec.dead_workers and rec.plan.epochs <= epoch:
            # what each old worker finished of this segment; the survivors re-plan the rest
            done = segment_done(rec.clocks, seg_clock0, steps)
            # the survivors' largest clock: where the re-planned segment starts
            clock0 = max(int(rec.clocks[rec.old_index[i]]) for i in range(tr.n_workers))
            seg = self.regroup_or_recover(epoch, plan + [[n_old, done]], clock0)
            prev = epoch_rows(seg.sizes, plan, n_old, tr.cfg.seed, epoch, t.shuffle, t.batch_size,
                              tr.shuffle_block)
            reassigned = rows_reassigned(prev, done, rec.dead_workers, t.batch_size)
            target = tr.client.clock_value
            event.update(worker_steps_done=done, examples_reassigned=reassigned)
        else:                       # same workers, same rows: each goes on from its own step
            target = int(allreduce_max(tr.comm, np.array([tr.client.clock_value], dtype=np.int64))[0])
            first = tr.client.clock_value - seg_clock0
            tr.catch_up_to = target
            event["examples_reassigned"] = 0
        event.update(survivors=tr.n_workers, clock=target,
                     recovery_seconds=round(time.time() - t_fail, 3))
        tr.gap_event = event       # gap_seconds: last step before -> first step after
        tr.ft.events.append(event)
        if tr.is_chief:
            self._say_recovery(rec, event)
        return seg, first, done_ex

    def _say_recovery(self, rec, ev) -> None:
        """The chief's lines about a recovery (log; the same facts are in the metrics)."""
        say = self.tr.say
        where = f"at clock ~{ev['clock']} (epoch {ev['epoch']})"
        ranks = ", ".join(map(str, rec.failed_world_ranks))
        if rec.dead_workers:
            say(f"hpcps: worker(s) {', '.join(map(str, rec.dead_workers))} (rank(s) "
                f"{ranks}) lost {where}; {self.tr.n_workers} worker(s) continue, "
                f"{ev['examples_reassigned']} example(s) of the epoch reassigned")
        if rec.dead_servers:
            say(f"hpcps: server(s) {', '.join(map(str, rec.dead_servers))} (rank(s) "
                f"{ranks}) lost {where}")
        for r, s in ev.get("ranges_moved", {}).items():
            say(f"hpcps: key range {r} taken over by server {s} from its backup copy "
                "(nothing lost)")
        for r in ev.get("ranges_reloaded", []):
            k, lost, base = ev["reload_step"], ev["lost_steps"][str(r)], ev["resumed_at"][str(r)]
            src = f"checkpoint step {k}" if k else "its initial values (no checkpoint yet)"
            say(f"hpcps: key range {r} had no copy left: reloaded from {src} onto server "
                f"{rec.plan.chains[r][0]}; {lost} step(s) of updates to that range lost "
                f"(steps {k}..{base - 1}), it resumes at clock {base}"
                if lost else
                f"hpcps: key range {r} had no copy left: reloaded from {src} onto server "
                f"{rec.plan.chains[r][0]}; 0 steps lost (every later step was resent)")
        no_backup = [r for r, b in ev.get("backups", {}).items() if b is None]
        if no_backup and self.tr.ft.replicas > 1:
            say(f"hpcps: warning: key range(s) {', '.join(no_backup)} have no backup "
                "(too few servers left)")
        say(f"hpcps: recovered in {ev['recovery_seconds']:.2f} s (agreement and re-routing; "
            "metrics.json's gap_seconds: last step before the failure -> first after)")

    def grow(self, cur, n, oversubscribe):
        """Add ``n`` workers at this clock (:mod:`hpcps.resilience.elastic`); returns the
        :class:`~hpcps.worker.trainer.Segment` of the rest of the epoch, or None when they
        could not be added (the job goes on as it was). Collective over every rank of the job."""
        tr = self.tr
        epoch, seg_clock0, steps, plan = cur.epoch, cur.seg_clock0, cur.steps, cur.plan
        t_start = time.time()
        clock = tr.client.clock_value
        n_old = tr.n_workers
        tr.steps.flush()                            # Downpour: nothing held across the join
        if tr.vote is not None:
            tr.vote.finish()
            tr.vote = None
        tr.client.grow(n, oversubscribe)            # after this clock's last request
        plan_next = plan + [[n_old, int(min(clock - seg_clock0, steps))]]
        join = None
        if tr.is_chief:
            cfg = tr.cfg
            join = JoinPlan(clock=clock, epoch=epoch, n_old=n_old, plan=plan_next,
                            job_text=cfg.text, job_path=str(cfg.path),
                            output_dir=str(cfg.output.dir), pull=tr.elastic.run.pull,
                            tables=JoinPlan.layout(tr.client.specs),
                            nonfinite_rejected=tr.guard.rejected,
                            range_ranks=list(tr.client.membership.range_ranks) if tr.ft else [])
        event = tr.elastic.grow(n, clock, oversubscribe=oversubscribe, join=join)
        if event is None:
            tr.vote = tr.make_vote()                # on the unchanged workers' communicator
            return None
        tr.follow(self.ckpt)                        # the membership the growth changed
        # the rows this worker's reader read ahead are re-planned: read again
        streaming.release(cur, plan_next[-1][1], tr.cfg.train.batch_size)
        seg = self.regroup_or_recover(epoch, plan_next, clock)
        if tr.is_chief:
            event.update(epoch=epoch + 1, workers_before=n_old,
                         examples_replanned=int(sum(seg.remaining)),
                         examples_to_new_workers=int(sum(seg.remaining[n_old:])),
                         pause_seconds=round(time.time() - t_start, 3))
            lost = n_old + n - tr.n_workers          # lost at once (continue mode)
            tr.say(f"hpcps: {n} worker(s) added at clock {clock} (epoch {epoch + 1})"
                    f"{f', {lost} lost at once' if lost else ''}: "
                    f"{tr.n_workers} workers; the epoch's {event['examples_replanned']} "
                    f"unread example(s) re-planned over them "
                    f"({event['examples_to_new_workers']} to the new ones); spawn "
                    f"{event['spawn_seconds']:.2f} s, pause {event['pause_seconds']:.2f} s")
        return seg


def _range_event(rec) -> dict:
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
