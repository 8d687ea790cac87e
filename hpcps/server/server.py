"""The server role: holds one shard of every table and applies the workers' updates.

The loop polls for requests without blocking (it keeps entering MPI, which one-sided pulls
need for progress on some MPIs) and backs off with short sleeps when idle. Update rules are
injected (:class:`hpcps.core.optim.Optimizer` per table); the consistency policy decides when a
pull may be answered and whether pushes are aggregated per clock (BSP/SSP) or applied on
arrival (asynchronous Downpour).

With RMA pulls (``windows`` given) each shard's rows and clock header live in the memory of
an MPI window (:mod:`hpcps.comm.rma`) and the optimizer updates that memory in place: one copy
of the parameters. Under BSP/SSP every write to a window is published like a seqlock (the
header's sequence word odd during the write, :meth:`hpcps.comm.rma.ShardWindow.writing`) and
workers validate their reads against it, so an RMA reader sees a clock's update whole or not
at all; the server never takes a lock a reader could hold up.
Every applied push records its staleness (:mod:`hpcps.core.consistency`).
"""

from __future__ import annotations

import time

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.comm import transport as tp
from hpcps.comm.core import cores_dedicated
from hpcps.core.consistency import (H_CLOCK, H_FASTEST, H_NWORKERS, H_SEQ, H_SLOWEST, H_VERSION,
                                    StalenessHistogram, header_len)
from hpcps.core.optim import NonFiniteError, all_finite, check_finite
from hpcps.core.routing import partition_of
from hpcps.kernels.optim import rows_finite
from hpcps.server.clocks import WorkerClocks
from hpcps.server.cut import CheckpointCut
from hpcps.server.steps import StepRequests
from hpcps.server.membership import ServerMembership
from hpcps.server.loop import (IDLE_SLEEP_MAX, IDLE_SLEEP_MIN, IDLE_SPIN, IDLE_SPIN_DEDICATED,
                               agreed_growth, pull_lag, serve_requests)
from hpcps.server.dynshard import DynamicShard, peak_rss
from hpcps.server.shard import Shard, header_and_rows, rows_of, touched_rows, window_sizes

__all__ = ["ParameterServer", "Shard", "window_sizes", "serve_requests", "agreed_growth",
           "touched_rows", "rows_of", "IDLE_SLEEP_MIN", "IDLE_SLEEP_MAX", "IDLE_SPIN",
           "IDLE_SPIN_DEDICATED"]

class ParameterServer(StepRequests, CheckpointCut, ServerMembership):
    """One key range's server: its shards, clocks and pending pushes, and the loop of a
    server rank that holds only this range.

    In continue mode (:class:`hpcps.resilience.replica.ServerGroup`) a server rank may hold
    several ranges, one ``ParameterServer`` each, and the group's loop hands each request to
    the range named in its header (:meth:`handle`).

    Start one with :meth:`initial`, :meth:`from_checkpoint` or :meth:`from_copy`; the
    constructor only sets up the state common to all three from the range's rows.

    Parameters
    ----------
    endpoint : hpcps.comm.transport.ServerEndpoint
        This server's side of the protocol.
    index : int
        Key range (server index of the job's key partition) in ``[0, n_servers)``.
    n_servers : int
        Number of key ranges of the partition.
    worker_ranks : sequence of int
        ``ps`` ranks of the workers, in worker-index order.
    tables : list of (TableSpec, Optimizer)
        Tables in table-id order.
    policy : consistency policy (e.g. :class:`hpcps.core.consistency.BSP`)
    rows : list of (w, slots)
        Per table, the range's rows (``(hi - lo, dim)``, used as they are, not copied) and
        its optimizer state (None: the optimizer's initial state for ``w``).
    clock : int
        Start clock (every worker's clock in the headers).
    checkpointed : bool
        Whether the range starts from a checkpoint written at ``clock``.
    windows : list of hpcps.comm.rma.ShardWindow, optional
        One window per table (RMA pulls); the shard's header and rows are placed in it at
        ``window_layout(...)``. The caller makes every rank wait (a barrier) after this
        constructor so that no reader sees the window before it is initialised.
    run_dir : path-like or None
        Run directory; checkpoints go to ``<run_dir>/ckpt/step-XXXXXXXX/shard-SSSS.h5``.
    ft_state : hpcps.resilience.recovery.FTState or None
        With ``[fault_tolerance] mode = "continue"``: asynchronous pushes are held until the
        worker's CLOCK of the same step arrives, so that a dead worker's last step is applied
        entirely or not at all (:meth:`settle`).
    idle_spin : float or None
        Seconds the loop polls without sleeping after a request (see :meth:`serve`);
        default from :func:`hpcps.comm.core.cores_dedicated`.
    elastic : hpcps.resilience.elastic.Elastic or None
        The job's membership: workers may be added while it runs (a GROW from every worker,
        :meth:`_grow`).
    order_key : list of int or None
        Original index of each worker (the order of the deterministic sums; default
        ``range(n_workers)``).
    examples : int
        Examples already applied to this range (for the run's counts).
    """

    def __init__(self, endpoint, index, n_servers, worker_ranks, tables, policy, rows, *,
                 clock=0, checkpointed=False, windows=None, run_dir=None, ft_state=None,
                 idle_spin=None, elastic=None, order_key=None, examples=0, staleness=None):
        self.ep = endpoint
        self.ft = ft_state
        self.elastic = elastic
        # original worker index of each worker (the order of the deterministic sums)
        self.order_key = list(order_key) if order_key is not None else list(range(len(worker_ranks)))
        self.index = index
        if idle_spin is None:
            idle_spin = IDLE_SPIN_DEDICATED if cores_dedicated() else IDLE_SPIN
        self.idle_spin = float(idle_spin)
        self.worker_of_rank = {r: i for i, r in enumerate(worker_ranks)}
        self.n_workers = len(worker_ranks)
        self.policy = policy
        self.shards: list[Shard] = []
        start = int(clock)
        # examples of the steps applied (BSP/SSP) or of the CLOCKs received (async)
        self.examples_total = int(examples)
        #: examples per epoch applied before this server's start by the run's earlier launches
        #: (from the checkpoint resumed; its shards keep them with this launch's added)
        self.examples_before: dict = {}
        for tid, (spec, opt) in enumerate(tables):
            if spec.dynamic:                 # a hash table: the keys pushed, any 64-bit id
                sh = rows[tid]               # a DynamicShard, built by the named constructor
                sh.hdr[H_VERSION] = sh.hdr[H_CLOCK] = start
                sh.hdr[H_NWORKERS] = self.n_workers
                sh.hdr[H_SLOWEST] = sh.hdr[H_FASTEST] = start
                self.shards.append(sh)
                continue
            part = partition_of(spec, n_servers)
            lo, hi = part.shard_range(index)
            shape = (hi - lo, spec.dim)
            w, slots = rows[tid]
            if slots is None:
                slots = opt.init_slots(shape, spec.dtype, w=w)
            win = windows[tid] if windows else None
            hdr, w = header_and_rows(w, win, header_len(self.n_workers))
            hdr[H_VERSION] = hdr[H_CLOCK] = start       # restored: start at the checkpoint
            hdr[H_NWORKERS] = self.n_workers
            hdr[H_SLOWEST] = hdr[H_FASTEST] = start
            self.shards.append(Shard(spec, part, opt, lo, hi, w, slots, hdr, win))
        self.n_servers = n_servers
        self.run_dir = run_dir
        self.clock = start                   # steps applied from every worker
        self.worker_clock = WorkerClocks([start] * self.n_workers)
        self.step_examples = {}              # clock -> {order key: (examples, epoch) of that step}
        self.pending = {}                    # clock -> {table: [(worker, rows, grads)]}
        self.waiting_pulls = []              # (source, header, rows) deferred by the policy
        self.pushes_applied = [0] * self.n_workers    # PUSH messages per worker
        self.last_examples = [0] * self.n_workers      # examples of each worker's last CLOCK
        self.last_epoch = [0] * self.n_workers         # ... and its epoch
        self.examples_epoch: dict = {}                 # epoch (0-based) -> examples applied
        self.growing: dict = {}                        # worker -> (n, oversubscribe, clock)
        self.held = {}                                 # worker -> async pushes awaiting CLOCK
        self.stopped = set()
        # of every applied push (one histogram shared by the ranges of a continue-mode rank)
        self.staleness = staleness if staleness is not None else StalenessHistogram()
        self.checkpoint_steps = [start] if checkpointed else []   # shards written
        # chain replication (hpcps.resilience.replica, :meth:`replicate`): forward(range,
        # clock, rows per table, examples, epoch) after each applied clock; pulls see only the
        # clocks the backup has acknowledged (``acked``; None = no backup)
        self.forward = None
        self.acked = None
        #: None, or [requests handled, seconds and CPU seconds in handle] (serve_requests'
        #: ``busy``; benchmarks set it)
        self.busy = None
        #: None, or [steps applied, CPU seconds in :meth:`_advance`] (benchmarks set it: the
        #: part of ``busy`` a step costs once, whatever the number of workers)
        self.step_busy = None
        self._lag = pull_lag(policy)
        #: BSP: fused steps taken in by the compiled loop (ServerEndpoint.take_steps)
        self._bsp = policy.bsp
        self.requests_compiled = 0           # of them (the run summary's servers' lines)

    # ------------------------------------------------------------------ ways to start
    @classmethod
    def initial(cls, endpoint, index, n_servers, worker_ranks, tables, policy, *, seed=0,
                clock=None, **kw) -> "ParameterServer":
        """Range ``index`` at its initial values (zeros, or per-key draws from ``seed``, the
        job seed: the same on any server count), at clock 0 (or ``clock``: a range reloaded
        with no checkpoint yet). ``kw``: the constructor's other keywords (``windows``,
        ``run_dir``, ``ft_state``, ``idle_spin``, ``elastic``, ``order_key``, ``examples``,
        ``staleness``). Local."""
        rows = []
        for spec, opt in tables:
            if spec.dynamic:             # empty: keys are inserted by pushes
                rows.append(DynamicShard.create(spec, opt, index, n_servers, seed,
                                                header_len(len(worker_ranks))))
                continue
            part = partition_of(spec, n_servers)
            rows.append((spec.initial_rows(part.shard_keys(index), seed), None))
        return cls(endpoint, index, n_servers, worker_ranks, tables, policy, rows,
                   clock=clock or 0, **kw)

    @classmethod
    def from_checkpoint(cls, endpoint, index, n_servers, worker_ranks, tables, policy, *,
                        restore, clock=None, seed=0, **kw) -> "ParameterServer":
        """Range ``index`` read from the checkpoint ``restore`` (``(directory, manifest)``,
        :func:`hpcps.checkpoint.latest_valid`): the rows of the range and every slot the
        optimizer has, by name, from whichever old shards hold them, so the number of servers
        may differ from the checkpointed job's. At the checkpoint's step (or ``clock``: a
        continue-mode range reloaded at the clock the workers resend from). Local (reads
        HDF5). ``seed``: the job seed, the initial value of a dynamic table's keys pushed
        after the checkpoint."""
        rows = []
        for spec, opt in tables:
            if spec.dynamic:             # the keys this server owns now, from any old shard
                rows.append(DynamicShard.create(spec, opt, index, n_servers, seed,
                                                header_len(len(worker_ranks)), restore=restore))
                continue
            part = partition_of(spec, n_servers)
            lo, hi = part.shard_range(index)
            w, saved = ckpt.read_range(restore[0], restore[1], spec.name, lo, hi,
                                       num_keys=spec.num_keys, dim=spec.dim, dtype=spec.dtype,
                                       multiplier=part.multiplier, slots=opt.slot_names)
            rows.append((w, opt.slots_from_dict(saved) if saved else None))
        step = int(restore[1]["step"]) if clock is None else int(clock)
        srv = cls(endpoint, index, n_servers, worker_ranks, tables, policy, rows, clock=step,
                  checkpointed=True, **kw)
        srv.examples_before = ckpt.shard_examples_per_epoch(restore[0])
        return srv

    @classmethod
    def from_copy(cls, endpoint, index, n_servers, worker_ranks, tables, policy, *, state,
                  clock, **kw) -> "ParameterServer":
        """Range ``index`` from a copy held by this rank (``state``: ``(w, slots)`` per table,
        used as they are) at ``clock``: a backup taking the range over. Local."""
        return cls(endpoint, index, n_servers, worker_ranks, tables, policy, state, clock=clock,
                   **kw)

    # ------------------------------------------------------------------ replication hook
    def replicate(self, forward) -> None:
        """Send every clock applied from now on to a backup: ``forward(range, clock, touched
        rows per table, examples, epoch)`` (:class:`hpcps.resilience.replica.ServerGroup`); pulls
        then see only the clocks the backup acknowledged (:meth:`acknowledge`). Local."""
        self.forward = forward
        self.acked = self.clock
        self._publish()

    def stop_replication(self, republish: bool = False) -> None:
        """No backup any more: pulls see every applied clock (``republish``: at once, in the
        shards' headers). Local."""
        self.forward, self.acked = None, None
        if republish:
            for sh in self.shards:
                sh.hdr[H_VERSION] = sh.hdr[H_CLOCK] = self.clock

    # ------------------------------------------------------------------ loop
    def serve(self) -> None:
        """Answer requests until every worker has sent STOP. Not collective.

        When no request waits, the loop keeps polling for ``idle_spin`` seconds after the
        last one (a worker's next request usually follows within microseconds, and the
        shortest ``time.sleep`` lasts ~60 us on Linux), then sleeps with a doubling back-off.
        ``idle_spin`` defaults to ``IDLE_SPIN_DEDICATED`` (1 s) when the launcher placed at
        most one rank per core on this node, else ``IDLE_SPIN`` (50 us), so that an
        oversubscribed server leaves the cores to the workers.
        """
        serve_requests(self._poll, self.handle,   # self.ep: replaced by a growth
                       lambda: len(self.stopped) >= self.n_workers, lambda: self.idle_spin,
                       busy=self.busy)
        self.ep.flush()                 # replies still in flight (ServerEndpoint.reply)
        self.check_done()

    def _poll(self):
        """The loop's poll: :meth:`ServerEndpoint.poll`, which answers a ready small PULL
        of a fixed table itself when the policy's readiness is a clock lag
        (:func:`pull_lag`; as :meth:`handle` would, through :meth:`Shard.pull_inline`).
        Under BSP outside continue mode, :meth:`ServerEndpoint.take_steps` instead: the
        fused steps that wait are taken in by one compiled call, and a step they complete
        is applied here."""
        if self._bsp and self.ft is None and self.ep.steps_compiled:
            return self._take_steps()
        lag = self._lag
        if lag is None:
            return self.ep.poll()
        return self.ep.poll((self.shards, Shard, self.visible_clock, lag, self.index,
                             self.busy))

    def check_done(self) -> None:
        """Raise if a pull is still deferred when every worker has stopped. Local."""
        if self.waiting_pulls:
            raise RuntimeError(f"server {self.index}: {len(self.waiting_pulls)} pull(s) still "
                               "waiting at shutdown")

    def handle(self, source: int, h: np.ndarray) -> None:
        op = int(h[tp.H_OP])
        if op == tp.PULL:
            shard = self._shard(h)
            if (type(shard) is Shard and self._pull_ready(h)
                    and shard.pull_inline(self.ep, source, int(h[tp.H_NKEYS]), self.index)):
                return                       # answered in one compiled call
            keys = self.ep.recv_keys(source, int(h[tp.H_NKEYS]), op, scratch=True)   # not kept
            if self._pull_ready(h):
                vals = shard.pull_reply(keys, self.index, self.ep.pool)
                self.ep.reply(source, vals, op, shard.hdr, rng=self.index)
                self.ep.pool.give(vals)
            else:
                self.waiting_pulls.append((source, h, shard.rows_for(keys, self.index).copy()))
        elif op == tp.PULL_MANY:
            self._on_pull_many(source, h)
        elif op == tp.PUSH:
            self._on_push(source, h)
        elif op == tp.CLOCK:
            self._on_clock(source, h)
        elif op == tp.PUSH_CLOCK:
            # a step's pushes of every table and its CLOCK in one request (PSClient.clock)
            parts = self.ep.recv_keys(source, tp.PART_LEN * int(h[tp.H_TABLE]), op)
            self._on_push_clock(source, h, parts.reshape(-1, tp.PART_LEN))
        elif op == tp.PUSH_CLOCK_PULL:
            self._on_push_clock_pull(source, h)
        elif op == tp.PULL_SHARD:
            shard = self._shard(h)
            if self.visible_clock >= int(h[tp.H_CLOCK]):
                self._reply_whole(source, shard, h)
            else:
                self.waiting_pulls.append((source, h, None))
        elif op == tp.CHECKPOINT:
            n = int(h[tp.H_NKEYS])
            expected = self.ep.recv_keys(source, n, op) if n else None
            if self._cut_ready(h, expected):
                self._checkpoint(source, h)
            else:
                self.waiting_pulls.append((source, h, expected))
        elif op == tp.STOP:
            self.stopped.add(source)
        elif op == tp.GROW:
            self.growing[self.worker_of_rank[source]] = (int(h[tp.H_AUX]), int(h[tp.H_NKEYS]),
                                                         int(h[tp.H_CLOCK]))
            if len(self.growing) == self.n_workers:
                self._grow()
        else:
            raise RuntimeError(f"server {self.index}: unknown op {op} from rank {source}")


    def _on_push(self, source: int, h: np.ndarray) -> None:
        """A PUSH (header ``h``) from ``source``: receive its keys and rows; queue them for
        their clock (BSP/SSP) or apply them (async)."""
        shard = self._shard(h)
        _, tid, c, n, _, _, _, version, _ = h.tolist()    # one conversion: ints
        # keys and values land in pooled buffers (kept until the push is applied, then
        # given back): a new array of many MiB would page-fault on every push
        keys, grads = self.ep.recv_push(source, n, shard.spec.dim, shard.spec.dtype)
        rows = keys                 # turned into local rows in place by push_rows (hash: the keys)
        if not shard.push_rows(keys, grads, self.index):   # the message only when needed
            check_finite(f"server {self.index}: push to table {shard.spec.name!r} from worker "
                         f"{self.worker_of_rank[source]} at clock {c}", grads)
        w = self.worker_of_rank[source]
        self.pushes_applied[w] += 1
        if not self.policy.aggregate and self.ft is not None:
            self.held.setdefault(self.worker_of_rank[source], []).append((shard, rows, grads, h))
            return
        if not self.policy.aggregate:
            self._apply_now(shard, rows, grads, h)
            self.ep.pool.give(rows, grads)
            if self.waiting_pulls:
                self._answer_waiting()           # a checkpoint may wait for this push
            return
        self._queue(w, c, ((tid, rows, grads, version),))

    def _queue(self, w: int, c: int, pushes) -> None:
        """Hold worker ``w``'s pushes ``(table, local rows, values, version)`` for clock ``c``
        until every worker has finished it (BSP/SSP; :meth:`_advance` applies them in worker
        order). RuntimeError for a clock already applied."""
        if c < self.clock:
            raise RuntimeError(f"server {self.index}: push for clock {c} from worker "
                               f"{w} after clock {self.clock} was applied")
        queued = self.pending.setdefault(c, {})
        key = self.order_key[w]
        for tid, rows, grads, version in pushes:
            queued.setdefault(tid, []).append((key, rows, grads, version))

    def _on_clock(self, source: int, h: np.ndarray) -> None:
        """A CLOCK (header ``h``) from ``source``: the worker finished step ``h[clock]``."""
        self._clocked(self.worker_of_rank[source], int(h[tp.H_CLOCK]), int(h[tp.H_NEX]),
                      int(h[tp.H_AUX]))

    def _clocked(self, w: int, c: int, n_ex: int, epoch: int) -> None:
        """Worker ``w`` finished step ``c`` with ``n_ex`` examples of ``epoch`` (0-based)."""
        wc = self.worker_clock
        if c != wc[w]:
            raise RuntimeError(f"server {self.index}: worker {w} clocked {c}, expected {wc[w]}")
        wc[w] = c + 1
        self.last_examples[w], self.last_epoch[w] = n_ex, epoch
        if not self.policy.aggregate:
            self._count(n_ex, epoch)
        for shard, rows, grads, hp in self.held.pop(w, ()):
            self._apply_now(shard, rows, grads, hp)   # held async pushes of this step
            self.ep.pool.give(rows, grads)
        if self.policy.aggregate:
            self.step_examples.setdefault(c, {})[self.order_key[w]] = (n_ex, epoch)
        self._after_clock()

    def _after_clock(self) -> None:
        """After a worker's clock (:meth:`_clocked`, or a step taken in by
        :meth:`ServerEndpoint.take_steps`): the workers' slowest and fastest clocks into the
        shard headers; under BSP/SSP every step all workers finished applied, else the
        server clock moved to the slowest worker's and the pulls it allows answered."""
        wc = self.worker_clock
        slowest, fastest = wc.min(), wc.max()
        for shard in self.shards:                # advisory (progress line), no lock
            hdr = shard.hdr
            hdr[H_SLOWEST] = slowest
            hdr[H_FASTEST] = fastest
        if self.policy.aggregate:
            if self.step_busy is None:
                self._advance()
            else:
                c0, start = time.thread_time(), self.clock
                self._advance()
                self.step_busy[0] += self.clock - start
                self.step_busy[1] += time.thread_time() - c0
        else:
            self.clock = self.worker_clock.min()
            for shard in self.shards:
                shard.hdr[H_CLOCK] = self.clock
            self._answer_waiting()

    def _reply_whole(self, source: int, shard, h) -> None:
        """Answer a ``PULL_SHARD`` (header ``h``): the shard's reply
        (:meth:`hpcps.server.shard.Shard.whole`), or for a chunk of sorted keys its rows
        and then its keys (in the place of a pull's clock header)."""
        got = shard.whole(int(h[tp.H_AUX]), int(h[tp.H_NKEYS]), int(h[tp.H_SEQ]))
        if isinstance(got, tuple):
            rows, keys = got
            self.ep.reply(source, rows, tp.PULL_SHARD, keys, rng=self.index)
        else:
            self.ep.reply(source, got, tp.PULL_SHARD, rng=self.index)

    def _reply_rows(self, source: int, shard: Shard, rows, op: int) -> None:
        """Reply to a pull with the rows (gathered into a pooled buffer, or into the reply by
        one compiled call) and the shard header."""
        if type(shard) is Shard and self.ep.reply_rows(source, shard.w, rows, op, shard.hdr,
                                                       self.index):
            return
        vals = shard.gather(rows, self.ep.pool)
        self.ep.reply(source, vals, op, shard.hdr, rng=self.index)
        self.ep.pool.give(vals)

    @property
    def visible_clock(self) -> int:
        """The clock pulls may see: the applied clock, or with a backup the clock it has
        acknowledged (a worker never reads a state its backup could not reproduce)."""
        return self.clock if self.acked is None else min(self.clock, self.acked)

    def _publish(self) -> None:
        """Put the visible clock into the shard headers sent with pull replies."""
        if self.acked is None:
            return
        v = self.visible_clock
        for shard in self.shards:
            shard.hdr[H_VERSION] = shard.hdr[H_CLOCK] = v

    def acknowledge(self, clock: int) -> None:
        """The backup holds every clock below ``clock``: publish it and answer the pulls it
        allows. Local (called by the server loop on a ``REPL_ACK``)."""
        if self.acked is not None and clock > self.acked:
            self.acked = clock
            self._publish()
            self._answer_waiting()

    def _apply_now(self, shard: Shard, rows, grads, h) -> None:
        """Asynchronous push: apply on arrival, scaled by 1/examples (and 1/(staleness+1))."""
        version = int(shard.hdr[H_VERSION])
        read = int(h[tp.H_AUX])
        n_ex = int(h[tp.H_NEX])
        scale = 1.0 / n_ex if n_ex else 1.0
        if read >= 0:
            st = max(0, version - read)
            self.staleness.add(st)
            if self.policy.staleness_aware_lr:
                scale /= st + 1
        shard.hdr[H_SEQ] += 1            # odd: writing (reads are not validated under async)
        shard.apply(rows, grads, scale)
        self._check_weights(shard, rows, int(h[tp.H_CLOCK]))
        shard.hdr[H_VERSION] = version + 1
        shard.hdr[H_SEQ] += 1

    def _check_weights(self, shard: Shard, rows, clock: int) -> None:
        """Stop (:class:`~hpcps.core.optim.NonFiniteError`) when an update made weights NaN/inf.

        The pushes were finite (checked on arrival), so the optimizer's arithmetic overflowed
        the table dtype. The rows are already written and the other servers may have applied
        their part of the step, so it cannot be rejected: the job stops before this state is
        read by a worker or written to a checkpoint.
        """
        if type(shard) is Shard and rows_finite(shard.w, rows):   # read in place, compiled
            return
        w = shard.take(rows, self.ep.pool)
        finite = all_finite(w)
        if not finite:
            w = w.copy()
        self.ep.pool.give(w)
        if not finite:
            bad = int(w.size - np.count_nonzero(np.isfinite(w)))
            raise NonFiniteError(
                f"server {self.index}: the update of table {shard.spec.name!r} at clock {clock} "
                f"made {bad} weight(s) non-finite (NaN or inf; finite gradients overflowed "
                f"{shard.spec.dtype}); the job stopped before they were pulled or checkpointed: "
                "lower [optimizer] learning_rate or use model dtype float64")

    def _count(self, n_examples: int, epoch: int) -> None:
        """Count ``n_examples`` applied examples of ``epoch`` (0-based): at a CLOCK (async) or
        when its step is applied (BSP/SSP)."""
        self.examples_total += n_examples
        self.examples_epoch[epoch] = self.examples_epoch.get(epoch, 0) + n_examples

    def examples_run(self) -> dict:
        """Examples applied per epoch (0-based) over the run's launches: the earlier launches'
        (:attr:`examples_before`) and this server's. Local."""
        out = dict(self.examples_before)
        for e, n in self.examples_epoch.items():
            out[e] = out.get(e, 0) + n
        return out

    def _pull_ready(self, h) -> bool:
        c = int(h[tp.H_CLOCK])
        if int(h[tp.H_AUX]):              # a read that must see every update below its clock
            return self.visible_clock >= c
        return self.policy.pull_ready(self.visible_clock, c)

    def _answer_waiting(self) -> None:
        """Answer the deferred pulls that the server clock now allows."""
        still = []
        for source, h, rows in self.waiting_pulls:
            op = int(h[tp.H_OP])
            if op == tp.CHECKPOINT:
                ready = self._cut_ready(h, rows)       # rows holds the expected push counts
            elif op == tp.PULL_SHARD:
                ready = self.visible_clock >= int(h[tp.H_CLOCK])
            else:
                ready = self._pull_ready(h)
            if ready and op == tp.CHECKPOINT:
                self._checkpoint(source, h)
            elif ready and op == tp.PULL_MANY:
                self._reply_many(source, rows)           # rows: the parts of the request
            elif ready:
                shard = self._shard(h)
                if rows is None:
                    self._reply_whole(source, shard, h)
                else:
                    self._reply_rows(source, shard, rows, op)
            else:
                still.append((source, h, rows))
        self.waiting_pulls = still

    def _shard(self, h) -> Shard:
        tid = int(h[tp.H_TABLE])
        if not 0 <= tid < len(self.shards):
            raise RuntimeError(f"server {self.index}: unknown table id {tid}")
        return self.shards[tid]

    def load(self) -> dict:
        """Keys and bytes this server has served, for the run summary."""
        s = self.ep.stats
        return {
            "server": self.index,
            "rows": int(sum(sh.n_rows for sh in self.shards)),
            # per dynamic table: keys stored, admitted, rejected, evicted, hot keys
            # (DynamicShard.report; None: a fixed table); peak resident memory (issue 18)
            "tables": [sh.report() if isinstance(sh, DynamicShard) else None
                       for sh in self.shards],
            "rss_peak_bytes": peak_rss(),
            "memory_bytes": int(sum(sh.nbytes for sh in self.shards)),
            "keys_pulled": int(s.keys.get("pull", 0)),
            "keys_pushed": int(s.keys.get("push", 0)),
            "bytes_in": int(s.training("bytes_in")),
            "bytes_out": int(s.training("bytes_out")),
            "export_bytes": int(s.export("bytes_out")),
            "requests": int(s.total("messages")),
            "requests_compiled": self.requests_compiled,
            "clock": self.clock,
            "examples": self.examples_total,
            "examples_per_epoch": dict(self.examples_epoch),
            "staleness": self.staleness,
        }
