"""The server role: holds one shard of every table and applies the workers' updates.

The loop polls for requests without blocking (it keeps entering MPI, which one-sided pulls
need for progress on some MPIs) and backs off with short sleeps when idle. Update rules are
injected (:class:`hpcps.core.optim.Optimizer` per table); the consistency policy decides when a
pull may be answered and whether pushes are aggregated per clock (BSP/SSP) or applied on
arrival (asynchronous Downpour).

With RMA pulls (``windows`` given) each shard's rows and clock header live in the memory of
an MPI window (:mod:`hpcps.comm.rma`) and the optimizer updates that memory in place: one copy
of the parameters. Under BSP/SSP every write to a window happens inside the server's
exclusive lock epoch on it, so an RMA reader sees a clock's update whole or not at all.
Every applied push records its staleness (:mod:`hpcps.core.consistency`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.comm import transport as tp
from hpcps.core.consistency import (H_BUSY, H_CLOCK, H_NWORKERS, H_VERSION, H_WORKER0,
                           StalenessHistogram, header_len)
from hpcps.kernels.optim import take_rows
from hpcps.core.optim import NonFiniteError, all_finite, check_finite
from hpcps.core.tables import KeyPartition, TableSpec

#: Idle back-off of the server loop, seconds (doubles from MIN to MAX while no request waits).
IDLE_SLEEP_MIN = 2e-6
IDLE_SLEEP_MAX = 2e-4
#: Seconds the idle loop keeps polling without sleeping after a request, when the node's
#: cores are oversubscribed (or the launcher did not say) ...
IDLE_SPIN = 5e-5
#: ... and when each rank has a core of its own: poll like a blocking MPI receive does (a
#: sleeping server is woken late, ~60 us at best and milliseconds on a loaded node).
IDLE_SPIN_DEDICATED = 1.0


def serve_requests(poll, handle, finished, idle_spin, recover=None) -> None:
    """The polling loop of a server rank: ``handle(*poll())`` until ``finished()``. Local.

    When no request waits it keeps polling for ``idle_spin`` seconds after the last one, then
    sleeps with a back-off doubling from ``IDLE_SLEEP_MIN`` to ``IDLE_SLEEP_MAX``.
    ``idle_spin`` is a float, or a function returning it, asked again after each request (a
    growth that oversubscribes the node lowers it while the loop runs). With
    ``recover``, an MPI error from a failed or revoked peer
    (:func:`hpcps.comm.ft.is_peer_failure`) calls ``recover()`` (collective over the
    survivors) and the loop goes on; every other exception propagates.
    """
    sleep = IDLE_SLEEP_MIN
    last = time.perf_counter()
    spin_of = idle_spin if callable(idle_spin) else None
    spin = spin_of() if spin_of else float(idle_spin)
    while True:
        try:
            if finished():
                return
            msg = poll()
            if msg is None:
                if time.perf_counter() - last < spin:
                    continue
                time.sleep(sleep)
                sleep = min(sleep * 2, IDLE_SLEEP_MAX)
                continue
            sleep = IDLE_SLEEP_MIN
            handle(*msg)
            last = time.perf_counter()
            if spin_of is not None:
                spin = spin_of()
        except Exception as e:           # noqa: BLE001 - only a peer failure is recovered
            if recover is None:
                raise
            from hpcps.comm.ft import is_peer_failure

            if not is_peer_failure(e):
                raise
            recover()


def agreed_growth(asks: set, who: str) -> tuple[int, int, int]:
    """The one ``(workers to add, oversubscribe, clock)`` every worker's GROW asked for."""
    if len(asks) != 1:
        raise RuntimeError(f"{who}: workers disagree on the growth: {sorted(asks)}")
    return next(iter(asks))


def touched_rows(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Distinct local rows of an update, ascending int64. Local.

    A boolean mask when the update covers at least 1/8 of the shard (linear in the shard),
    else ``np.unique`` (sorts the update)."""
    if rows.size * 8 >= n_rows:
        mask = np.zeros(n_rows, dtype=bool)
        mask[rows] = True
        return np.flatnonzero(mask).astype(np.int64)
    return np.unique(rows)


def rows_of(w: np.ndarray, rows: np.ndarray, pool=None) -> np.ndarray:
    """``w[rows]`` for a reply: a view (no copy) when ``rows`` is one ascending run of
    consecutive rows (a dense block), else the rows gathered into a buffer of ``pool``
    (:class:`hpcps.comm.transport.BufferPool`; give it back after the reply) or a new array.
    Local."""
    n = rows.size
    if n and rows[-1] - rows[0] == n - 1 and (n < 2 or bool(np.all(np.diff(rows) == 1))):
        return w[int(rows[0]):int(rows[0]) + n]
    out = pool.take((n, w.shape[1]), w.dtype) if pool is not None else \
        np.empty((n, w.shape[1]), dtype=w.dtype)
    return take_rows(w, rows, out)      # prefetching gather: 2-3x np.take for random rows


@dataclass
class Shard:
    """One server's rows of one table."""

    spec: TableSpec
    part: KeyPartition
    optimizer: object
    lo: int
    hi: int
    w: np.ndarray
    slots: object
    hdr: np.ndarray = None      # int64 clock header (see hpcps.core.consistency)
    window: object = None       # hpcps.comm.rma.ShardWindow holding hdr and w, or None

    def writing(self):
        """Context of a write that RMA readers must see whole (exclusive window lock)."""
        return self.window.exclusive() if self.window is not None else contextlib.nullcontext()

    @property
    def nbytes(self) -> int:
        return self.w.nbytes + (self.slots.nbytes if self.slots is not None else 0)


class ParameterServer:
    """One key range's server: its shards, clocks and pending pushes, and the loop of a
    server rank that holds only this range.

    In continue mode (:class:`hpcps.server.replica.ServerGroup`) a server rank may hold
    several ranges, one ``ParameterServer`` each, and the group's loop hands each request to
    the range named in its header (:meth:`handle`).

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
    seed : int
        Job seed (initial values of tables with ``init_std > 0``).
    windows : list of hpcps.comm.rma.ShardWindow, optional
        One window per table (RMA pulls); the shard's header and rows are placed in it at
        ``window_layout(...)``. The caller makes every rank wait (a barrier) after this
        constructor so that no reader sees the window before it is initialised.
    run_dir : path-like or None
        Run directory; checkpoints go to ``<run_dir>/ckpt/step-XXXXXXXX/shard-SSSS.h5``.
    restore : (directory, manifest) or None
        Checkpoint to start from (:func:`hpcps.checkpoint.latest_valid`); this server reads
        the rows of its key range from whichever old shards hold them, so the number of
        servers may differ from the checkpointed job's.
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
    state : list of (w, slots) or None
        Start from these arrays (one pair per table: the range's rows and optimizer state,
        used as they are, not copied) instead of initial values or ``restore``: a backup
        taking the range over.
    clock : int or None
        Start clock (default: ``restore``'s step, else 0).
    order_key : list of int or None
        Original index of each worker (the order of the deterministic sums; default
        ``range(n_workers)``).
    examples : int
        Examples already applied to this range (for the run's counts).
    """

    def __init__(self, endpoint, index, n_servers, worker_ranks, tables, policy, seed=0,
                 windows=None, run_dir=None, restore=None, ft_state=None, idle_spin=None,
                 elastic=None, state=None, clock=None, order_key=None, examples=0):
        self.ep = endpoint
        self.ft = ft_state
        self.elastic = elastic
        # original worker index of each worker (the order of the deterministic sums)
        self.order_key = list(order_key) if order_key is not None else list(range(len(worker_ranks)))
        self.index = index
        if idle_spin is None:
            from hpcps.comm.core import cores_dedicated
            idle_spin = IDLE_SPIN_DEDICATED if cores_dedicated() else IDLE_SPIN
        self.idle_spin = float(idle_spin)
        self.worker_of_rank = {r: i for i, r in enumerate(worker_ranks)}
        self.n_workers = len(worker_ranks)
        self.policy = policy
        self.shards: list[Shard] = []
        start = int(restore[1]["step"]) if restore is not None else 0
        if clock is not None:
            start = int(clock)
        # examples of the steps applied (BSP/SSP) or of the CLOCKs received (async)
        self.examples_total = int(examples)
        for tid, (spec, opt) in enumerate(tables):
            part = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse)
            lo, hi = part.shard_range(index)
            shape = (hi - lo, spec.dim)
            slots = None
            if state is not None:                      # a copy held by this rank (a backup)
                w, slots = state[tid]
            elif restore is not None:
                # every slot the optimizer has, by name, from whichever old shards hold it
                w, saved = ckpt.read_range(restore[0], restore[1], spec.name, lo, hi,
                                           num_keys=spec.num_keys, dim=spec.dim, dtype=spec.dtype,
                                           multiplier=part.multiplier, slots=opt.slot_names)
                if saved:
                    slots = opt.slots_from_dict(saved)
            else:                       # zeros, or per-key draws (same on any server count)
                w = spec.initial_rows(part.shard_keys(index), seed)
            if slots is None:
                slots = opt.init_slots(shape, spec.dtype, w=w)
            win = windows[tid] if windows else None
            hdr, w = _header_and_rows(w, win, header_len(self.n_workers))
            hdr[H_VERSION] = hdr[H_CLOCK] = start       # restored: start at the checkpoint
            hdr[H_NWORKERS] = self.n_workers
            hdr[H_WORKER0:H_WORKER0 + self.n_workers] = start
            self.shards.append(Shard(spec, part, opt, lo, hi, w, slots, hdr, win))
        self.n_servers = n_servers
        self.run_dir = run_dir
        self.clock = start                   # steps applied from every worker
        self.worker_clock = [start] * self.n_workers
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
        self.staleness = StalenessHistogram()  # of every applied push
        self.checkpoint_steps = [start] if restore is not None else []   # shards written
        # chain replication (hpcps.server.replica): forward(range, clock, rows per table,
        # examples) after each applied clock; pulls see only the clocks the backup has
        # acknowledged (``acked``; None = no backup)
        self.forward = None
        self.acked = None

    # ------------------------------------------------------------------ loop
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
        serve_requests(lambda: self.ep.poll(), self.handle,
                       lambda: len(self.stopped) >= self.n_workers, lambda: self.idle_spin)
        self.check_done()

    def check_done(self) -> None:
        """Raise if a pull is still deferred when every worker has stopped. Local."""
        if self.waiting_pulls:
            raise RuntimeError(f"server {self.index}: {len(self.waiting_pulls)} pull(s) still "
                               "waiting at shutdown")

    def handle(self, source: int, h: np.ndarray) -> None:
        op = int(h[tp.H_OP])
        if op == tp.PULL:
            shard = self._shard(h)
            keys = self.ep.recv_keys(source, int(h[tp.H_NKEYS]), op, scratch=True)   # not kept
            rows = shard.part.local_rows(keys, self.index, out=keys)     # in place
            if self._pull_ready(h):
                self._reply_rows(source, shard, rows, op)
            else:
                self.waiting_pulls.append((source, h, rows.copy()))
        elif op == tp.PUSH:
            self._on_push(source, h)
        elif op == tp.CLOCK:
            self._on_clock(source, h)
        elif op == tp.PUSH_CLOCK:
            # a step's pushes of every table and its CLOCK in one request (PSClient.clock)
            parts = self.ep.recv_keys(source, tp.PART_LEN * int(h[tp.H_TABLE]), op)
            for meta in parts.reshape(-1, tp.PART_LEN):
                self._on_push(source, tp.part_header(h, meta))
            self._on_clock(source, tp.make_header(tp.CLOCK, 0, int(h[tp.H_CLOCK]), 0,
                                                  int(h[tp.H_NEX]), aux=int(h[tp.H_AUX]),
                                                  rng=int(h[tp.H_RANGE])))
        elif op == tp.PULL_SHARD:
            shard = self._shard(h)
            if self.visible_clock >= int(h[tp.H_CLOCK]):
                self.ep.reply(source, shard.w, op, rng=self.index)
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
        n = int(h[tp.H_NKEYS])
        # keys and values land in pooled buffers (kept until the push is applied, then
        # given back): a new array of many MiB would page-fault on every push
        keys = self.ep.recv_keys(source, n, tp.PUSH, pooled=True)
        grads = self.ep.recv_values(source, (n, shard.spec.dim), shard.spec.dtype, tp.PUSH,
                                    pooled=True)
        rows = shard.part.local_rows(keys, self.index, out=keys)     # in place
        c = int(h[tp.H_CLOCK])
        check_finite(f"server {self.index}: push to table {shard.spec.name!r} from worker "
                     f"{self.worker_of_rank[source]} at clock {c}", grads)
        self.pushes_applied[self.worker_of_rank[source]] += 1
        if not self.policy.aggregate and self.ft is not None:
            self.held.setdefault(self.worker_of_rank[source], []).append((shard, rows, grads, h))
            return
        if not self.policy.aggregate:
            self._apply_now(shard, rows, grads, h)
            self.ep.pool.give(rows, grads)
            if self.waiting_pulls:
                self._answer_waiting()           # a checkpoint may wait for this push
            return
        if c < self.clock:
            raise RuntimeError(f"server {self.index}: push for clock {c} from worker "
                               f"{self.worker_of_rank[source]} after clock {self.clock} was applied")
        self.pending.setdefault(c, {}).setdefault(int(h[tp.H_TABLE]), []).append(
            (self.order_key[self.worker_of_rank[source]], rows, grads, int(h[tp.H_AUX])))

    def _on_clock(self, source: int, h: np.ndarray) -> None:
        """A CLOCK (header ``h``) from ``source``: the worker finished step ``h[clock]``."""
        w = self.worker_of_rank[source]
        c = int(h[tp.H_CLOCK])
        if c != self.worker_clock[w]:
            raise RuntimeError(f"server {self.index}: worker {w} clocked {c}, expected "
                               f"{self.worker_clock[w]}")
        self.worker_clock[w] = c + 1
        self.last_examples[w], self.last_epoch[w] = int(h[tp.H_NEX]), int(h[tp.H_AUX])
        if not self.policy.aggregate:
            self._count(int(h[tp.H_NEX]), int(h[tp.H_AUX]))
        for shard, rows, grads, hp in self.held.pop(w, ()):
            self._apply_now(shard, rows, grads, hp)   # held async pushes of this step
            self.ep.pool.give(rows, grads)
        for shard in self.shards:
            shard.hdr[H_WORKER0 + w] = c + 1     # advisory (progress line), no lock
        if self.policy.aggregate:
            self.step_examples.setdefault(c, {})[self.order_key[w]] = (int(h[tp.H_NEX]),
                                                                       int(h[tp.H_AUX]))
            self._advance()
        else:
            self.clock = min(self.worker_clock)
            for shard in self.shards:
                shard.hdr[H_CLOCK] = self.clock
            self._answer_waiting()

    # ------------------------------------------------------------------ BSP/SSP
    def _advance(self) -> None:
        """Apply every clock all workers have finished, then answer pulls now allowed."""
        while min(self.worker_clock) > self.clock:
            c = self.clock
            per_worker = self.step_examples.pop(c, {})
            n_ex = sum(n for n, _ in per_worker.values())
            scale = 1.0 / n_ex if n_ex else 0.0
            pending = self.pending.pop(c, {})
            touched = {}
            for tid, shard in enumerate(self.shards):   # table order, as before
                pushes = pending.get(tid)
                with shard.writing():
                    if pushes:
                        pushes.sort(key=lambda p: p[0])  # worker order: deterministic sums
                        for p in pushes:
                            if p[3] >= 0:
                                self.staleness.add(c - p[3])
                        parts = [p[2] / (c - p[3] + 1) if p[3] >= 0 else p[2] for p in pushes] \
                            if self.policy.staleness_aware_lr else [p[2] for p in pushes]
                        rows = self._joined([p[1] for p in pushes])
                        grads = self._joined(parts)
                        shard.optimizer.apply(shard.w, shard.slots, rows, grads, scale)
                        self._check_weights(shard, rows, c)
                        if self.forward is not None:
                            touched[tid] = touched_rows(rows, shard.w.shape[0])
                        self.ep.pool.give(rows, grads, *(a for p in pushes for a in p[1:3]))
                    shard.hdr[H_VERSION] = c + 1
                    shard.hdr[H_CLOCK] = c + 1
            self.clock = c + 1
            for n, epoch in per_worker.values():
                self._count(n, epoch)
            if self.forward is not None:
                self.forward(self.index, c, touched, n_ex)
        self._publish()
        self._answer_waiting()

    def _joined(self, arrays):
        """The arrays one after the other (the first itself if alone; else in a pooled buffer)."""
        if len(arrays) == 1:
            return arrays[0]
        n = sum(a.shape[0] for a in arrays)
        return np.concatenate(arrays, out=self.ep.pool.take((n,) + arrays[0].shape[1:],
                                                            arrays[0].dtype))

    def discard_pending(self) -> None:
        """Drop the pushes queued for clocks not applied yet, giving their buffers back (for
        benchmarks that time the receive path alone). Local."""
        for tables in self.pending.values():
            for pushes in tables.values():
                self.ep.pool.give(*(a for p in pushes for a in p[1:3]))
        self.pending.clear()
        self.step_examples.clear()

    def _reply_rows(self, source: int, shard: Shard, rows, op: int) -> None:
        """Reply to a pull with the rows (gathered into a pooled buffer) and the shard header."""
        vals = rows_of(shard.w, rows, self.ep.pool)
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
        shard.hdr[H_BUSY] = 1
        shard.optimizer.apply(shard.w, shard.slots, rows, grads, scale)
        self._check_weights(shard, rows, int(h[tp.H_CLOCK]))
        shard.hdr[H_VERSION] = version + 1
        shard.hdr[H_BUSY] = 0

    def _check_weights(self, shard: Shard, rows, clock: int) -> None:
        """Stop (:class:`~hpcps.core.optim.NonFiniteError`) when an update made weights NaN/inf.

        The pushes were finite (checked on arrival), so the optimizer's arithmetic overflowed
        the table dtype. The rows are already written and the other servers may have applied
        their part of the step, so it cannot be rejected: the job stops before this state is
        read by a worker or written to a checkpoint.
        """
        w = take_rows(shard.w, rows, self.ep.pool.take((rows.size, shard.w.shape[1]), shard.w.dtype))
        finite = all_finite(w)
        self.ep.pool.give(w)
        if not finite:
            w = shard.w[rows]
            bad = int(w.size - np.count_nonzero(np.isfinite(w)))
            raise NonFiniteError(
                f"server {self.index}: the update of table {shard.spec.name!r} at clock {clock} "
                f"made {bad} weight(s) non-finite (NaN or inf; finite gradients overflowed "
                f"{shard.spec.dtype}); the job stopped before they were pulled or checkpointed: "
                "lower [optimizer] learning_rate or use model dtype float64")

    # ------------------------------------------------------------------ failures
    def settle(self, rec, endpoint) -> None:
        """Settle every old worker's last steps after a failure, then re-index the survivors
        and continue on ``endpoint`` (the survivors' communicator). Local; the server loop
        (:class:`hpcps.server.replica.ServerGroup`) calls it on each range it still serves
        once the survivors agreed (:func:`hpcps.resilience.recovery.recover`).

        Dead workers: the pushes of a step whose CLOCK this range missed but another server
        received are applied with the examples that server received, pushes of unfinished
        steps are dropped (``rec.clocks``). Surviving workers, when they keep their pushes
        (``rec.resend``, BSP/SSP): every push and CLOCK of theirs not applied yet is dropped,
        and they send them again from this range's clock (so nothing lost in flight and
        nothing applied twice); otherwise (async) their steps are settled like a dead
        worker's.
        """
        n_old = self.n_workers
        agreed = [int(c) for c in rec.clocks]
        dead = set(rec.dead_workers)
        for w in range(n_old):
            key = self.order_key[w]
            if rec.resend and w not in dead:
                for c in list(self.step_examples):
                    self.step_examples[c].pop(key, None)
                self.worker_clock[w] = self.clock
                continue
            if self.worker_clock[w] < agreed[w]:          # its CLOCK reached another server only
                c, nex = agreed[w] - 1, int(rec.examples[w])
                if self.policy.aggregate:
                    self.step_examples.setdefault(c, {})[key] = (nex, int(rec.epochs[w]))
                else:
                    self._count(nex, int(rec.epochs[w]))
                    for shard, rows, grads, hp in self.held.get(w, ()):
                        self._apply_now(shard, rows, grads, hp)
            self.worker_clock[w] = max(self.worker_clock[w], agreed[w])
        self.held = {}
        keep = {self.order_key[w]: (self.clock if rec.resend and w not in dead else agreed[w])
                for w in range(n_old)}
        for c, tables in self.pending.items():          # drop pushes of unfinished steps
            for tid in tables:
                tables[tid] = [p for p in tables[tid] if c < keep[p[0]]]
        for c in [c for c, d in self.step_examples.items() if not d]:
            del self.step_examples[c]
        n_new = len(rec.roles.worker_ranks)
        old = [rec.old_index[i] for i in range(n_new)]
        self.order_key = [self.order_key[o] for o in old]
        self.worker_clock = [self.worker_clock[o] for o in old]
        self.last_examples = [self.last_examples[o] for o in old]
        self.last_epoch = [self.last_epoch[o] for o in old]
        self.pushes_applied = [0] * n_new               # the workers reset their counts too
        self.waiting_pulls = []                          # the survivors repeat their requests
        self.growing = {}
        self._bind(rec.roles, endpoint=endpoint)
        if self.policy.aggregate:
            self._advance()
        else:
            self.clock = min(self.worker_clock)
            for shard in self.shards:
                shard.hdr[H_CLOCK] = self.clock

    def _count(self, n_examples: int, epoch: int) -> None:
        """Count ``n_examples`` applied examples of ``epoch`` (0-based): at a CLOCK (async) or
        when its step is applied (BSP/SSP)."""
        self.examples_total += n_examples
        self.examples_epoch[epoch] = self.examples_epoch.get(epoch, 0) + n_examples

    def _bind(self, roles, windows=None, endpoint=None) -> None:
        """Serve the workers of ``roles`` (after a recovery or a growth) over ``roles.ps``
        (through ``endpoint`` when given: one shared by the ranges of a server rank);
        ``worker_clock`` already lists them in index order. Shard headers are resized for the
        new number of workers; with ``windows`` (a growth under RMA pulls) each shard's header
        and rows move into the new window. Traffic counts are kept. Local."""
        stats = self.ep.stats
        self.ep = endpoint or tp.ServerEndpoint(roles.ps, self.ep.max_bytes)
        self.ep.stats = stats
        self.worker_of_rank = {r: i for i, r in enumerate(roles.worker_ranks)}
        self.n_workers = len(roles.worker_ranks)
        self.stopped = set()
        nh = header_len(self.n_workers)
        for tid, shard in enumerate(self.shards):
            win = windows[tid] if windows else None
            if win is not None or shard.hdr.size != nh:
                hdr, shard.w = _header_and_rows(shard.w, win, nh)
                hdr[:H_WORKER0] = shard.hdr[:H_WORKER0]
                shard.hdr, shard.window = hdr, win if win is not None else shard.window
            shard.hdr[H_NWORKERS] = self.n_workers
            shard.hdr[H_WORKER0:] = 0
            shard.hdr[H_WORKER0:H_WORKER0 + self.n_workers] = self.worker_clock

    # ------------------------------------------------------------------ growth
    def _grow(self) -> None:
        """Every worker sent GROW at the same clock: take part in adding the workers
        (:meth:`hpcps.resilience.elastic.Elastic.grow`). Collective over every rank of the job.

        The workers sent GROW after every other request of their clock, so nothing of theirs
        is pending here: under every policy the server clock equals every worker's clock.
        The added workers start at that clock; their pushes are summed after the old
        workers' (a new order key each).
        """
        asks, self.growing = set(self.growing.values()), {}
        n, oversubscribe, clock = agreed_growth(asks, f"server {self.index}")
        if self.elastic is None:
            raise RuntimeError(f"server {self.index}: GROW received but this job cannot grow")
        self.check_growth(clock)

        def rebind(roles, windows):
            self.add_workers(roles, clock, self.elastic.oversubscribed(), windows)

        self.elastic.grow(n, clock, rebind, oversubscribe=bool(oversubscribe))

    def state(self) -> list:
        """``(w, slots)`` of every table (the arrays themselves, not copies)."""
        return [(sh.w, sh.slots) for sh in self.shards]

    def check_growth(self, clock: int) -> None:
        """Raise unless every worker's requests up to ``clock`` are done here. Local."""
        if self.waiting_pulls or self.clock != clock or any(c != clock for c in self.worker_clock):
            raise RuntimeError(f"server {self.index}: GROW at clock {clock} while the server is at "
                               f"clock {self.clock} (workers {self.worker_clock}, "
                               f"{len(self.waiting_pulls)} request(s) waiting)")

    def add_workers(self, roles, clock: int, oversubscribed: bool, windows=None,
                    endpoint=None) -> None:
        """Serve the workers of ``roles``: the old ones, then those added at ``clock`` (a new
        order key each, after every old one). ``oversubscribed``: the node now has more ranks
        than cores (the loop then sleeps sooner). Local."""
        if oversubscribed:
            self.idle_spin = min(self.idle_spin, IDLE_SPIN)   # leave cores to the workers
        k = len(roles.worker_ranks) - self.n_workers
        top = max(self.order_key) + 1
        self.order_key += list(range(top, top + k))
        self.worker_clock += [clock] * k
        self.pushes_applied += [0] * k
        self.last_examples += [0] * k
        self.last_epoch += [0] * k
        self._bind(roles, windows, endpoint)

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
            elif ready:
                shard = self._shard(h)
                if rows is None:
                    self.ep.reply(source, shard.w, op, rng=self.index)
                else:
                    self._reply_rows(source, shard, rows, op)
            else:
                still.append((source, h, rows))
        self.waiting_pulls = still

    def _cut_ready(self, h, expected) -> bool:
        """A checkpoint may be written: every step before it applied and, under async, every
        push each worker sent before the cut (``expected[w]`` messages) applied."""
        if self.clock < int(h[tp.H_CLOCK]):
            return False
        return expected is None or all(a >= e for a, e in zip(self.pushes_applied, expected))

    def _checkpoint(self, source, h) -> None:
        """Write this server's shard for the checkpoint at step ``h[clock]``; reply with the
        file's size and checksum (uint8 (40,): little-endian int64 size, then the digest
        zero-padded to :data:`hpcps.checkpoint.DIGEST_FIELD` bytes)."""
        step = int(h[tp.H_CLOCK])
        if self.clock != step:
            raise RuntimeError(f"server {self.index}: checkpoint for step {step} requested at "
                               f"clock {self.clock}: not a consistent cut")
        tables = [dict(name=sh.spec.name, rows=sh.w, keys=sh.part.shard_keys(self.index),
                       slots=sh.optimizer.slots_dict(sh.slots), lo=sh.lo, hi=sh.hi,
                       num_keys=sh.spec.num_keys, multiplier=sh.part.multiplier,
                       sparse=sh.spec.sparse, optimizer=sh.optimizer.name)
                  for sh in self.shards]
        nbytes, digest = ckpt.write_shard(ckpt.step_dir(self.run_dir, step), self.index,
                                          self.n_servers, self.clock, tables,
                                          examples=self.examples_total)
        self.checkpoint_steps.append(step)
        reply = np.zeros(40, dtype=np.uint8)
        reply[:8] = np.frombuffer(np.array([nbytes], dtype="<i8").tobytes(), dtype=np.uint8)
        reply[8:] = np.frombuffer(bytes.fromhex(digest), dtype=np.uint8)
        self.ep.reply(source, reply, tp.CHECKPOINT, rng=self.index)

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
            "rows": int(sum(sh.hi - sh.lo for sh in self.shards)),
            "memory_bytes": int(sum(sh.nbytes for sh in self.shards)),
            "keys_pulled": int(s.keys.get("pull", 0)),
            "keys_pushed": int(s.keys.get("push", 0)),
            "bytes_in": int(s.total("bytes_in")),
            "bytes_out": int(s.total("bytes_out")),
            "requests": int(s.total("messages")),
            "clock": self.clock,
            "examples": self.examples_total,
            "examples_per_epoch": dict(self.examples_epoch),
            "staleness": self.staleness,
        }


def _header_and_rows(w: np.ndarray, win, nh: int):
    """A shard's clock header (int64 ``(nh,)``, zeros) and rows: placed in the memory of
    window ``win`` (header first, then the rows, copied from ``w``) when given, else a new
    header array and ``w`` itself. Local."""
    if win is None:
        return np.zeros(nh, dtype=np.int64), w
    hdr = win.local_array(0, np.int64, (nh,))
    rows = win.local_array(nh * 8, w.dtype, w.shape)
    rows[...] = w
    hdr[:] = 0
    return hdr, rows


def window_sizes(specs, server: int, n_servers: int, n_workers: int) -> list[int]:
    """Bytes of each table's RMA window on server ``server``: the int64 clock header
    (:func:`hpcps.core.consistency.header_len`) followed by the shard's rows, C order. Local."""
    out = []
    for spec in specs:
        lo, hi = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse).shard_range(server)
        out.append(header_len(n_workers) * 8 + (hi - lo) * spec.dim * np.dtype(spec.dtype).itemsize)
    return out
