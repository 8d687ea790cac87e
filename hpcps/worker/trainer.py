"""The worker role: read this worker's data partition, pull, compute gradients, push, clock.

Under BSP every worker runs the same number of steps per epoch (the largest partition's
``ceil(rows / batch_size)``); a worker whose partition is exhausted still clocks each step
with zero examples, so no server waits for it.

The trainer runs one planned segment of an epoch at a time (:meth:`Trainer.run_segment`) and
raises what ends it early (:mod:`hpcps.worker.events`); the epoch loop that handles them is
:mod:`hpcps.resilience.supervisor`; the rows are planned by :mod:`hpcps.core.planning`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from hpcps.comm.collectives import (Vote, allgather_rows, allreduce_max, allreduce_sum, barrier,
                                    bcast_json, gatherv)
from hpcps.comm.ft import is_peer_failure
from hpcps.core.consistency import BSP
from hpcps.core.planning import (capped_steps, epoch_order, epoch_rows, examples_per_step,
                                 resume_position, segment_steps, steps_for)
from hpcps.data import DataError
from hpcps.data.lines import in_chunks
from hpcps.data.partition_rows import block_bounds
from hpcps.data.source import block_partitioned, stream_index, streamed
from hpcps.models import make_model   # the model registry imports every model
from hpcps.worker import streaming
from hpcps.worker.banner import start_lines
from hpcps.worker.events import GrowthRequested, PeerLost, SegmentEvent, StopRequested
from hpcps.worker.groupsteps import GroupSteps
from hpcps.worker.progress import ProgressMeter, epoch_position
from hpcps.worker.steps import NonFiniteGuard, localized, make_steps

__all__ = ["Trainer", "Segment", "Cursor", "epoch_order", "epoch_rows", "EVAL_CHUNK"]

EVAL_CHUNK = 8192    #: test rows evaluated per pull (the evaluation at the end of an epoch)


@dataclass
class Segment:
    """What a worker reads from a change of layout (a lost worker, added workers) to the end
    of the epoch, and its data for the later epochs (:func:`hpcps.resilience.supervisor.regroup`).

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


@dataclass
class Cursor:
    """Where this worker is in an epoch: the segment it reads (rows ``order`` of ``Xe``, in
    ``steps`` steps, after the epoch's earlier segments ``plan``), the step it goes on from
    (``first``), the clock at the segment's start, and the epoch's sums so far."""

    epoch: int
    Xe: object
    ye: object
    order: np.ndarray
    steps: int
    plan: list
    first: int
    seg_clock0: int
    loss_sum: float = 0.0
    n_ex: int = 0
    rec: dict | None = None

    def resegment(self, seg: Segment, clock: int) -> None:
        """Go on with ``seg``, the re-planned rest of the epoch, from its first step at ``clock``."""
        self.Xe, self.ye, self.order, self.steps, self.plan = seg.Xe, seg.ye, seg.order, seg.steps, seg.plan
        self.first, self.seg_clock0 = 0, clock


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
        Continue mode: a lost peer ends the segment with :class:`~hpcps.worker.events.PeerLost`
        (the supervisor recovers with the servers).
    elastic : hpcps.resilience.elastic.Elastic or None
        Workers may be added while the job runs (``[elastic]``, ``hpcps grow``): an agreed
        request ends the segment with :class:`~hpcps.worker.events.GrowthRequested`.

    Attributes
    ----------
    Set by the supervisor after a recovery (:mod:`hpcps.resilience.supervisor`):
    catch_up_to : int or None
        The clock the other workers had reached: a worker behind runs its steps up to it
        without the per-step votes.
    gap_event : dict or None
        The failure record whose ``gap_seconds`` the next step fills in.
    epochs_agreed : int
        The most epochs any worker had finished when the survivors agreed.
    last_step_time : float
        ``time.time()`` when this worker last finished a step.
    """

    def __init__(self, cfg, index, n_workers, client, comm, is_chief, on_epoch=None, out=None,
                 stop=None, policy=None, step_hook=None, model=None, ft_state=None,
                 elastic=None):
        self.ft = ft_state
        self.elastic = elastic
        self.vote = None                  # non-blocking vote on stops and growth (SSP/async)
        if model is None:
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
        vote = limit > 0 and self.policy.bsp
        agree = (lambda code: allgather_rows(self.comm, [code])[:, 0]) if vote else None
        self.guard = NonFiniteGuard(index, limit, agree, say=self._say_guard if vote else self.say)
        # BSP with p2p pulls: the next step's pulls ride with the clock (issue 20), where
        # the client can (PSClient.fusable); not in continue mode (kept pushes, resends,
        # catch-up steps), not for streamed data (its reader serves rows in step order)
        self.streaming = streamed(cfg.data) if cfg.data.format in ("svmlight", "criteo") else False
        fuse = cfg.comm.fuse_steps and ft_state is None and not self.streaming
        if getattr(client, "group", None) is not None:     # [comm] aggregate = "node" (BSP)
            self.steps = GroupSteps(client, model, index, step_hook, self.guard, fuse)
        else:
            self.steps = make_steps(self.policy, client, model, index, step_hook, self.guard,
                                    fuse=fuse)
        self.last_step_time = time.time()       # when this worker last finished a step
        self.gap_event = None            # failure record waiting for the next step's time
        self.catch_up_to = None          # clock the others had reached at the last recovery
        self.epochs_done = 0              # epochs whose closing barrier completed here
        self.epochs_agreed = 0           # the most any worker had finished, at the last recovery
        # this worker's partitions for whole epochs (replaced by a re-plan, :meth:`adopt`)
        self.X = self.y = self.Xt = self.yt = None
        self.steps_full = 0
        self.n_train = 0
        self.restored: dict = {}          # a resumed checkpoint's epoch records, by epoch
        self.part_rows: list = []         # every worker's training rows (prepare)
        self._t0 = self._last = 0.0       # progress lines: start of the run, last line
        self._clock0 = 0
        self.meter = ProgressMeter()      # their rate and ETA, across re-plans (adopt)
        # streamed data (hpcps.data.lines, self.streaming): lines are the rows; the epoch's
        # order shuffles within runs of [data] shuffle_buffer lines; the readers' counters
        self.shuffle_block = cfg.data.shuffle_buffer if self.streaming else 0
        self._readers: dict = {}
        self._row_log = None
        self.cursor = None                 # the segment being run (streamed: reader positions)

    # -- start of a run ----------------------------------------------------------------------

    def prepare(self, restore=None, checkpointer=None) -> tuple[int, int, list]:
        """Load this worker's partitions, count the rows, and find where training starts:
        ``(epoch, step, plan)`` — at 0 or at the checkpoint ``restore`` (a manifest,
        :func:`hpcps.checkpoint.read_manifest`; with another number of workers than the
        checkpointed job, the interrupted epoch is re-planned, :func:`~hpcps.core.planning.resume_position`).
        The chief prints the start-up lines. Collective over the workers.

        Raises
        ------
        hpcps.data.DataError
            The training or the test split has no rows (on every worker).
        """
        cfg, t = self.cfg, self.cfg.train
        if self.streaming:
            streaming.check_stream_settings(self, restore)     # before every line is counted
            streaming.index_files(self)
        self.X, self.y = self.model.load("train", self.index, self.n_workers)
        self.Xt, self.yt = self.model.load("test", self.index, self.n_workers)
        n_train, n_test = (int(v) for v in allreduce_sum(self.comm, np.array([self.X.shape[0], self.Xt.shape[0]], dtype=np.int64)))
        if n_train == 0:
            raise DataError(f"{cfg.data.path}: no training rows (empty file, or only comments "
                            "and blank lines)")
        if n_test == 0:       # every epoch is evaluated on the test rows: none is a mistake
            where = cfg.data.test_path or f"{cfg.data.path} (its test split)"
            raise DataError(f"{where}: no test rows (empty file, or only comments and blank "
                            "lines)")
        self.n_train = n_train
        self.steps_full = capped_steps(self.max_steps(self.X.shape[0]), t.max_steps)
        prepare = getattr(self.model, "prepare_metrics", None)
        if self.is_chief and prepare is not None:   # not in the first epoch's time (sklearn:
            prepare()                               # ~1 s); the others wait in the allgather
        localized(self.model, self.X)     # kept by the model for the epochs (Adult: 5 ms)
        # every worker's training rows (banner, progress rate): a compressed file is read
        # whole by one worker, so partitions can be unequal or empty
        self.part_rows = [int(r[0]) for r in allgather_rows(self.comm, [self.X.shape[0]])]
        start_epoch, start_step, plan = 0, 0, []
        if restore is not None:
            streaming.check_stream_restore(self, restore)
            start_epoch, start_step, plan = resume_position(restore, self.n_workers)
            self.restored = {int(r["epoch"]): r for r in restore["history"]}
            if start_epoch + 1 in self.restored and start_epoch + 1 < t.epochs:
                # written after its epoch closed (at_end), resumed with more epochs: go on
                # with the next one, the closed epoch's record kept (it was evaluated again,
                # its train loss lost: no step of it is left to run)
                start_epoch, start_step, plan = start_epoch + 1, 0, []
            # records of the epoch being resumed (and later) are recomputed
            self.history = [r for r in restore["history"] if r["epoch"] <= start_epoch]
            if checkpointer is not None:     # its checkpoint exists: at_end need not rewrite it
                checkpointer.last_step = int(restore["step"])
            if self.guard.agree is not None:  # the voted count is the same on every worker
                self.guard.rejected = int(restore.get("nonfinite_rejected", 0))
        if self.is_chief:
            for line in start_lines(self, restore, n_train, n_test, start_epoch, start_step, plan):
                self.say(line)
        # stop signals and grow requests: under BSP the workers are in step anyway and
        # agree with one Allreduce per step; under SSP/async that would tie them together,
        # so they vote without waiting (continue mode: Open MPI's non-blocking collectives
        # do not survive a lost rank, so the workers agree with a blocking Allreduce per
        # step under every policy)
        self.vote = self.make_vote()
        return start_epoch, start_step, plan

    def begin_run(self, start_epoch: int, checkpointer=None) -> None:
        """Start the run's counters (progress lines, epochs done) at ``start_epoch``. Local."""
        if checkpointer is not None:
            guard = self.guard

            def extra():
                d = {"nonfinite_rejected": guard.rejected} if guard.agree is not None else {}
                return {**d, **streaming.stream_extra(self)}
            checkpointer.extra = extra
        self.epochs_done = start_epoch
        self.meter = ProgressMeter(examples_per_step(self.n_train, self.cfg.train.batch_size,
                                                     self.n_workers, max(self.part_rows, default=0)))
        self._t0 = self._last = time.perf_counter()
        self._clock0 = self.client.clock_value

    def adopt(self, seg: Segment) -> None:
        """Take ``seg``'s partitions for the later epochs (after a re-plan). Local."""
        self.X, self.y, self.Xt, self.yt = seg.X, seg.y, seg.Xt, seg.yt
        self.steps_full = seg.steps_full
        # block partitions: the new sizes are known locally (others: taken as equal)
        self.part_rows = self.part_sizes(self.n_train, self.n_workers) if self.blocks() else []
        self.meter.replan(self.client.clock_value, examples_per_step(  # the progress rate
            self.n_train, self.cfg.train.batch_size, self.n_workers, max(self.part_rows, default=0)))

    def epoch_cursor(self, epoch: int, first: int = 0, plan=()) -> Cursor:
        """The cursor of ``epoch`` from step ``first``: the whole epoch on this worker's
        partition, or (``plan`` not empty: resumed mid-epoch on another number of workers)
        the epoch's remaining rows. Collective over the workers when ``plan`` is not empty."""
        t = self.cfg.train
        if plan:
            plan = list(plan)
            Xe, ye, _, lists = self.rest_of_epoch(epoch, plan)
            order = lists[self.index]
            steps = segment_steps(lists, t.batch_size, t.max_steps, plan)
        else:
            plan = []
            order = epoch_order(self.X.shape[0], self.cfg.seed, self.index, epoch, t.shuffle,
                                self.shuffle_block)
            Xe, ye, steps = self.X, self.y, self.steps_full
        return Cursor(epoch=epoch, Xe=Xe, ye=ye, order=order, steps=steps, plan=plan, first=first,
                      seg_clock0=self.client.clock_value - first)

    def rest_of_epoch(self, epoch: int, plan: list):
        """The whole split and each current worker's rows of the rest of ``epoch`` after the
        segments ``plan``: ``(X_all, y_all, sizes, lists)`` (:func:`~hpcps.core.planning.epoch_rows`).
        Local (reads the split)."""
        t = self.cfg.train
        X_all, y_all = self.model.load("train", 0, 1)
        sizes = self.part_sizes(X_all.shape[0], plan[0][0])
        lists = epoch_rows(sizes, plan, self.n_workers, self.cfg.seed, epoch, t.shuffle,
                           t.batch_size, self.shuffle_block)
        return X_all, y_all, sizes, lists

    # -- one segment -------------------------------------------------------------------------

    def run_segment(self, cur: Cursor, checkpointer=None, resume: bool = False) -> None:
        """Run the steps ``cur.first .. cur.steps - 1`` of the segment, then close the epoch
        (evaluate, and in continue mode a barrier). Collective over the workers.

        ``cur`` advances with every step (``first``, ``loss_sum``, ``n_ex``, ``rec``).
        ``resume``: go on in the same segment after an event that left it as it was (a growth
        that added nobody): the step runner keeps what it fetched.

        Raises
        ------
        StopRequested
            A stop signal reached some worker: every worker raises it after the same step.
        GrowthRequested
            Every worker agreed to add workers at this clock.
        PeerLost
            A rank failed (continue mode only; otherwise the MPI error propagates).
        """
        try:
            self._steps(cur, checkpointer, resume)
            self._close_epoch(cur)
        except SegmentEvent:
            raise
        except Exception as e:      # noqa: BLE001 - only a lost peer becomes an event
            if self.ft is not None and is_peer_failure(e):
                raise PeerLost(str(e)) from e
            raise

    def _steps(self, cur: Cursor, checkpointer, resume: bool) -> None:
        t = self.cfg.train
        epoch, steps = cur.epoch, cur.steps
        if not resume:
            if checkpointer is not None:
                checkpointer.steps_per_epoch = steps
            self.cursor = cur                    # streamed: the readers' positions
            if hasattr(cur.Xe, "start"):         # streamed: the reader thread reads ahead
                self._readers[id(cur.Xe)] = cur.Xe
                cur.Xe.start(cur.order, cur.first * t.batch_size)
            self.steps.begin_epoch(cur.Xe, cur.ye, cur.order, steps, t.batch_size)
        for step in range(cur.first, steps):
            final = epoch == t.epochs - 1 and step == steps - 1
            rows = cur.order[step * t.batch_size:(step + 1) * t.batch_size]
            # after a recovery, a worker behind the others runs the steps they
            # finished without the per-step votes (they voted on them already)
            solo = self.catch_up_to is not None and self.client.clock_value < self.catch_up_to
            agree, self.guard.agree = self.guard.agree, (None if solo else self.guard.agree)
            try:
                cur.loss_sum += self.steps.step(step, rows, final=final)
            finally:
                self.guard.agree = agree
            used = 0 if self.steps.last_rejected else int(getattr(self.steps, "last_n", rows.size))
            self.client.clock(used, epoch)
            if used and self._row_log is not False and hasattr(cur.Xe, "identity"):
                streaming.log_rows(self, cur, rows, epoch)
            cur.n_ex += used
            cur.first = step + 1
            self.last_step_time = time.time()
            self.meter.stepped(time.perf_counter(), self.client.clock_value)
            if self.gap_event is not None:      # first step after a recovery
                ev, self.gap_event = self.gap_event, None
                ev["gap_seconds"] = round(self.last_step_time - ev["last_step_time"], 3)
            # decided before the checkpoint: a sync point (a collective of the workers at
            # this clock) settles the vote first (Vote.settle; no vote, nothing to settle)
            sync = self.vote is not None and (
                step == steps - 1 or (checkpointer is not None
                                      and checkpointer.collective_at(self.client.clock_value)))
            decision = None if solo else self._decide(final=final, sync=sync)
            if checkpointer is not None:
                checkpointer.after_step(self.client.clock_value, epoch, step + 1, cur.plan,
                                        self.history, collective=not solo)
            if decision is None:
                continue
            stop, grow, oversubscribe = decision
            if stop:
                raise StopRequested(step)
            if grow:
                raise GrowthRequested(grow, oversubscribe)
            if self.is_chief and time.perf_counter() - self._last >= t.progress_seconds:
                self._progress(cur, step)

    def _close_epoch(self, cur: Cursor) -> None:
        """Evaluate the epoch and keep its record; in continue mode every worker then passes a
        barrier (the epoch is done everywhere) and keeps the record too (any survivor may
        become the chief, who writes the metrics). Collective over the workers."""
        cur.rec = self._evaluate(cur.epoch, self.Xt, self.yt, cur.loss_sum, cur.n_ex,
                                 time.perf_counter() - self._t0)
        if self.ft is not None:
            barrier(self.comm)     # every worker finished the epoch
            self.epochs_done = cur.epoch + 1
            cur.rec = bcast_json(self.comm, cur.rec)
        self.record(cur.rec)

    def _progress(self, cur: Cursor, step: int) -> None:
        """The chief's progress line (every ``[train] progress_seconds``)."""
        t = self.cfg.train
        self._last = last = time.perf_counter()
        at, of, left = epoch_position(cur, step, self.steps_full, t.epochs)  # across re-plans
        head, tail = self.meter.speed(last, self._t0, self.client.clock_value, left)
        if cur.order.size == 0:     # the chief reads nothing this epoch: its 0 loss says nothing
            mine = "  w0 has no rows (loss and reads: see the epoch lines and summary)"
        else:
            mine = f"  loss(w0) {cur.loss_sum / max(1, cur.n_ex):.4f}"
            if hasattr(cur.Xe, "stats"):              # streamed: this worker's reader
                st = cur.Xe.stats
                mine += (f"  read(w0) {st['bytes'] / 1e6 / (last - self._t0):,.1f} MB/s, "
                         f"waited {st['wait_seconds']:.1f} s")
        self.say(f"epoch {cur.epoch + 1}/{t.epochs}  step {at}/{of}  "
                  f"clock {self.client.clock_value}{self._worker_clocks_note()}  "
                  f"{head}{mine}{tail}")

    def _worker_clocks_note(self) -> str:
        """`` (workers S..F)`` — the slowest and the fastest worker's clock, ``(workers C)``
        when equal — as the chief last read them in a shard header, with the clock of that
        read when it is older than this step's pull (a chief with no rows pulls nothing);
        empty before any read."""
        clocks = self.client.worker_clocks()
        if clocks is None:
            return ""
        slowest, fastest = clocks
        seen = getattr(self.client, "header_clock", None)     # None: AllReduce, always current
        old = f" as of clock {seen}" if seen is not None and seen < self.client.clock_value - 1 else ""
        span = f"{slowest}" if slowest == fastest else f"{slowest}..{fastest}"
        return f" (workers {span}{old})"

    def stop_here(self, cur: Cursor, checkpointer=None) -> None:
        """Act on a :class:`~hpcps.worker.events.StopRequested`: checkpoint at this step and
        leave (the job exits for a requeue). Collective over the workers."""
        if self.is_chief:
            self.say(f"stop requested by signal at clock {self.client.clock_value}: "
                      "checkpointing, then exiting for a requeue")
            if self.elastic is not None:
                self.elastic.cancel_request("the job is stopping (signal)")
        if checkpointer is not None:
            checkpointer.at_stop(self.client.clock_value, cur.epoch, cur.first, cur.plan, self.history)
        self.stopped_by_signal = True

    def finish(self, steps: int, plan: list, local_examples: int, checkpointer=None) -> dict:
        """End of the run: the last checkpoint, the run's totals. Collective over the workers.

        Returns
        -------
        dict
            ``seconds``, ``examples`` (all workers), ``steps``, ``epochs``,
            ``examples_per_second``, ``clock``, ``stopped_by_signal``.
        """
        t = self.cfg.train
        if self.vote is not None:
            self.vote.finish()
        # the training's time, not the final checkpoint's (a trial: 16.6 s of a 67 MB write
        # read as 49,240 ex/s for ~245,000; the checkpoints line gives it)
        elapsed = time.perf_counter() - self._t0
        if checkpointer is not None and not self.stopped_by_signal:
            checkpointer.at_end(self.client.clock_value, t.epochs - 1, steps, plan, self.history)
        total_examples = int(allreduce_sum(self.comm, np.array([local_examples], dtype=np.int64))[0])
        reader = streaming.reader_report(self, elapsed) if self.streaming else None
        return {"reader": reader, "seconds": elapsed, "examples": total_examples,
                "steps": self.client.clock_value - self._clock0, "epochs": t.epochs,
                "examples_per_second": total_examples / elapsed if elapsed else 0.0,
                "clock": self.client.clock_value, "stopped_by_signal": self.stopped_by_signal}

    def follow(self, checkpointer) -> None:
        """Work in the layout of the client's membership (after a recovery or a growth changed
        it, :meth:`hpcps.comm.membership.Membership.change`): the client's endpoint, this
        worker's index and communicator, the checkpointer's. Local; the steps runner drops
        what it held (flushed before a growth)."""
        roles = self.client.membership.roles
        self.client.follow()
        self.comm, self.index, self.n_workers = roles.role_comm, roles.index, roles.n_workers
        self.is_chief = roles.is_chief
        self.guard.index = self.index
        self.steps.begin_epoch(None, None, None, 0, 1)
        if hasattr(self.steps, "_reset"):
            self.steps._reset()
        if checkpointer is not None:
            checkpointer.follow(roles)

    def blocks(self) -> bool:
        """True when training partition ``p`` of ``P`` is block ``p`` of the split's rows."""
        return block_partitioned(self.cfg.data) and getattr(self.model, "block_partitioned", True)

    def part_bounds(self, n_rows: int, part: int, n_parts: int) -> tuple[int, int]:
        """Rows ``[a, b)`` of training partition ``part`` of ``n_parts`` (block partitions:
        :meth:`blocks`); streamed data keeps compressed files whole."""
        if self.streaming:
            return stream_index(self.cfg.data, "train").part_bounds(n_rows, part, n_parts)
        return block_bounds(n_rows, part, n_parts)

    def part_sizes(self, n_rows: int, n_parts: int) -> list:
        """Rows of each of ``n_parts`` training partitions (their concatenation is the split)."""
        if self.blocks():
            return [b - a for a, b in (self.part_bounds(n_rows, p, n_parts) for p in range(n_parts))]
        return [self.model.load("train", p, n_parts)[0].shape[0] for p in range(n_parts)]

    def record(self, rec) -> None:
        """Keep an epoch's metrics record (None: none here); the chief reports it."""
        if rec is not None:
            self.history.append(rec)
            if self.on_epoch and self.is_chief:
                self.on_epoch(rec)

    def make_vote(self):
        """The non-blocking vote on stop signals and grow requests (SSP/async, not in
        continue mode), or None (BSP and continue mode vote with a blocking Allreduce).
        Collective over the workers when it makes one (``Dup``)."""
        if (self.stop is not None or self.elastic is not None) and not self.policy.bsp and self.ft is None:
            return Vote(self.comm, 3)
        return None

    def _decide(self, final: bool = False, sync: bool = False) -> tuple[bool, int, bool]:
        """After a step: whether every worker stops (a stop signal reached one of them) and
        how many workers are added now (the job file's ``[elastic]``, or a ``hpcps grow``
        request the chief found), with their oversubscribe flag — the same on every worker.

        Collective over the workers when stop signals or requests can arrive: under BSP one
        Allreduce per step; under SSP/async a non-blocking :class:`~hpcps.comm.collectives.Vote`,
        then one Allreduce of the clocks so that all act at the same clock (the largest; the
        others catch up to it); ``sync``: a collective of the workers follows at this clock
        (the epoch's end, a checkpoint), the vote settles first. Nothing is added after the
        last step (``final``).
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
        # a growth the job file plans at this clock is a collective of the workers too
        got = (allreduce_max(self.comm, want) if self.vote is None
               else self.vote.decide(want, clock, sync=sync or add > 0))
        if got is None:
            return False, add, over
        if got[1] and not final:
            add, over = add + int(got[1]), over or bool(got[2])
        return bool(got[0]), add, over

    def max_steps(self, n_rows: int) -> int:
        """Steps every worker runs so that the largest partition is covered. Collective."""
        b = self.cfg.train.batch_size
        return int(allreduce_max(self.comm, np.array([steps_for(n_rows, b)], dtype=np.int64))[0])

    def _evaluate(self, epoch, Xt, yt, loss_sum, n_ex, elapsed):
        """Epoch metrics: progressive training loss and the model's test metrics. Collective
        over the workers' communicator; the rows are pulled fresh (not from a stale cache)."""
        tr = allreduce_sum(self.comm, np.array([loss_sum, n_ex], dtype=np.float64))
        preds, ys = [], []
        for Xc, yc in in_chunks(Xt, yt, EVAL_CHUNK):     # streamed test lines: read in order
            ys.append(np.asarray(yc, dtype=np.float64).reshape(-1))
            if Xc.shape[0] == 0:
                continue
            keys = self.model.batch_keys(Xc)
            params = self.client.pull_many(keys, fresh=True)    # every table: one round trip
            preds.append(np.asarray(self.model.predict(Xc, keys, params), dtype=np.float64).reshape(-1))
        p = np.concatenate(preds) if preds else np.empty(0)
        all_p = gatherv(self.comm, p)
        all_y = gatherv(self.comm, np.concatenate(ys) if ys else np.empty(0))
        if not self.is_chief:
            return None
        if all_y.size and all_p.size != all_y.size:
            all_p = all_p.reshape(all_y.size, -1)       # (n, k) predictions, e.g. class probabilities
        m = self.model.metrics(all_y, all_p)
        ln = self.model.loss_name
        train = float(tr[0] / tr[1]) if tr[1] else float("nan")
        if not tr[1]:                  # no step of the epoch ran here: the record resumed
            kept = self.restored.get(epoch + 1, {}).get(f"train_{ln}")
            train = float(kept) if kept is not None else train
        rec = {"epoch": epoch + 1, "clock": self.client.clock_value, "seconds": round(elapsed, 3),
               f"train_{ln}": train}
        rec.update({f"test_{k}": float(v) for k, v in m.items() if k != "n"})
        rec["test_rows"] = int(m.get("n", all_y.size))
        rec["evaluated_seconds"] = round(time.perf_counter() - self._t0, 3)   # metrics known
        self.say(f"epoch {epoch + 1}: train {self.model.loss_label} {rec[f'train_{ln}']:.4f}  "
                  f"{self.model.describe(m)}  (at {elapsed:.1f} s)")
        return rec

    def _say_guard(self, text: str) -> None:
        """A rejected step under a vote: every worker knows it, the chief says it."""
        if self.is_chief:
            self.say(text)

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
