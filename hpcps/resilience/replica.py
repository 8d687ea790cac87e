"""Server ranks of a continue-mode job: key ranges held as primary or backup, chain
replication, and the recovery of the server side (``[fault_tolerance] mode = "continue"``).

Layout. Range ``r`` of the key partition starts on server ``r``; with ``replicas = 2`` the
next server on the ring (:mod:`hpcps.core.placement`) holds a backup copy. A server rank runs one
:class:`ServerGroup`: a :class:`~hpcps.server.server.ParameterServer` per range it serves
(primary) and a :class:`Replica` per range it backs up. Workers name the range in every
request header (``H_RANGE``); the group hands the request to that range.

Chain replication after aggregation (Li et al., OSDI 2014, §4.3). When a primary has applied
a clock (BSP/SSP: the merged pushes of every worker, :meth:`ParameterServer._advance`) it
sends its backup, for every table, the local rows the update touched with their *new*
weights and optimizer state (``REPLICATE``), then the clock and its examples
(``REPL_CLOCK``); the backup copies them into its arrays and answers ``REPL_ACK``. Pulls of
the range see only acknowledged clocks (:attr:`ParameterServer.visible_clock`), so no
worker ever reads a state that the backup could not reproduce.

Why the resulting rows rather than the aggregated gradient: a copy is bit-identical by
construction — the backup runs no optimizer arithmetic, so its state equals the primary's
whatever the kernel (SIMD width, compiler, prefetch path on another node's CPU, a rule with
per-row step counts) and it needs no pending-push bookkeeping of its own. It costs
``rows x (8 + (1 + slots) x dim x itemsize)`` bytes per clock (AdaGrad float64, dim 1: 24 B
per touched row) instead of the gradient's ``8 + dim x itemsize``; the duplicate keys of
several workers are sent once.

Failures (:mod:`hpcps.resilience.recovery`). After the survivors agree on a plan, each group:

* keeps settling the ranges it still serves (:meth:`ParameterServer.settle`);
* takes over a range whose primary died and whose copy it holds: the backup becomes a
  ``ParameterServer`` at the backup's clock;
* reloads a range with no copy left from the newest checkpoint (``on_server_loss =
  "reload"``), at the clock the workers can resend from (the steps in between are lost);
* sends a full copy (snapshot) of each range it serves to a new backup, or to a backup that
  is behind (a ``REPLICATE`` lost in flight), and drops copies it is no longer assigned.

Exactly one rank, the range's primary, answers checkpoint requests for a range, so each
checkpoint still has one shard file per range of the original partition and restarts on any
number of servers as before. RMA windows are not used (continue mode pulls point-to-point).
"""

from __future__ import annotations

import time

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.comm import core
from hpcps.comm import transport as tp
from hpcps.comm.core import irecv_array, isend_array, send_array, waitall
from hpcps.comm.ft import is_peer_failure
from hpcps.comm.transport import ServerEndpoint
from hpcps.core.consistency import StalenessHistogram
from hpcps.core.tables import KeyPartition
from hpcps.resilience.recovery import ServerReport, recover
from hpcps.server.loop import IDLE_SPIN, agreed_growth, serve_requests
from hpcps.server.server import ParameterServer


def _bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as uint8 (a view), to send any dtype, records included."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


class Replica:
    """A backup copy of one key range: every table's rows and optimizer state at ``clock``.

    Parameters
    ----------
    rng : int
        The key range.
    state : list of (w, slots)
        One pair per table (used as given, not copied).
    clock : int
        Clocks applied.
    examples : int
        Examples of the clocks applied.
    examples_epoch : dict of int -> int, optional
        Examples applied per epoch (0-based) by this launch, as the primary's
        :attr:`~hpcps.server.server.ParameterServer.examples_epoch`.
    examples_before : dict of int -> int, optional
        Examples per epoch of the run's earlier launches (from the checkpoint resumed).

    A backup that takes its range over carries all three on, so the range's checkpoint shards
    keep the run's examples per epoch (a trial's gap: they restarted at the takeover).
    """

    def __init__(self, rng: int, state: list, clock: int, examples: int = 0,
                 examples_epoch: dict | None = None, examples_before: dict | None = None):
        self.rng = int(rng)
        self.state = state
        self.clock = int(clock)
        self.examples = int(examples)
        self.examples_epoch = dict(examples_epoch or {})
        self.examples_before = dict(examples_before or {})

    def copy_rows(self, tid: int, rows: np.ndarray, w: np.ndarray, slots) -> None:
        """Put the primary's new values of local ``rows`` (distinct) into table ``tid``."""
        dst_w, dst_s = self.state[tid]
        dst_w[rows] = w
        if dst_s is not None:
            dst_s[rows] = slots

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes + (0 if s is None else s.nbytes) for w, s in self.state)


class ServerGroup:
    """The loop of one server rank in continue mode (module docstring).

    Parameters
    ----------
    endpoint : hpcps.comm.transport.ServerEndpoint
    ft_state : hpcps.resilience.recovery.FTState
        The job's communicators; ``n_ranges``, ``replicas``, ``on_server_loss``, ``run_dir``.
    server_id : int
        This server's original index (its place on the ring; range ``server_id`` is its own).
    worker_ranks : sequence of int
    tables : list of (TableSpec, Optimizer)
    policy : consistency policy
    seed : int
    restore : (directory, manifest) or None
        The checkpoint the job starts from (every range held here is read from it).
    idle_spin : float or None
        As :class:`~hpcps.server.server.ParameterServer`.
    elastic : hpcps.resilience.elastic.Elastic or None
        The job's membership, when workers may be added while it runs (GROW, :meth:`_grow`).

    Construction is local; the caller makes the ranks meet (a barrier is not needed: the
    first requests wait in MPI's queues).
    """

    def __init__(self, endpoint, ft_state, server_id, worker_ranks, tables, policy, seed=0,
                 restore=None, idle_spin=None, elastic=None):
        self.ep = endpoint
        self.elastic = elastic
        self.growing: dict = {}                      # worker rank -> (n, oversubscribe, clock)
        self.ft = ft_state
        self.server_id = int(server_id)
        self.n_ranges = int(ft_state.n_ranges)
        self.tables = tables
        self.policy = policy
        self.seed = seed
        self.restore = restore
        self.idle_spin = idle_spin
        self.worker_ranks = list(worker_ranks)
        self.order_key = list(range(len(worker_ranks)))
        self.primaries: dict[int, ParameterServer] = {}
        self.backups: dict[int, Replica] = {}
        self.backup_rank: dict[int, int] = {}       # range -> ps rank of its backup
        self.inflight: dict[int, list] = {}          # range -> [(clock, requests, arrays)]
        self.done_sent: set = set()                  # ranges whose backup got REPL_DONE
        self.done_from: set = set()                  # backed-up ranges whose primary finished
        self.replicated_bytes = 0
        self.snapshot_bytes = 0
        self.lost_steps = {}                         # range -> steps lost when reloaded
        self.recovery_seconds: list = []
        self.staleness = StalenessHistogram()
        ring = list(range(self.n_ranges))
        chains = [ring[r:] + ring[:r] for r in range(self.n_ranges)]
        replicas = min(ft_state.replicas, self.n_ranges)
        ps = self._new_range(self.server_id, restore=restore)
        self.primaries[self.server_id] = ps
        server_ranks = list(ft_state.roles.server_ranks)
        for r in range(self.n_ranges):
            ch = chains[r][:replicas]
            if r == self.server_id and len(ch) > 1:
                self._attach_backup(ps, server_ranks[ch[1]])
            elif self.server_id in ch[1:]:
                copy = self._new_range(r, restore=restore)
                self.backups[r] = Replica(r, copy.state(), copy.clock,
                                          examples_before=copy.examples_before)

    # ------------------------------------------------------------------ ranges
    def _new_range(self, rng, restore=None, state=None, clock=None, examples=0,
                   worker_ranks=None, order_key=None) -> ParameterServer:
        """Range ``rng`` served here: from ``state`` (the :class:`Replica` of a backup taking
        over: its rows, examples and examples per epoch), from the checkpoint ``restore`` (at
        ``clock``, when given), or at its initial values."""
        workers = self.worker_ranks if worker_ranks is None else worker_ranks
        keys = self.order_key if order_key is None else order_key
        common = dict(run_dir=self.ft.run_dir, ft_state=self.ft, idle_spin=self.idle_spin,
                      staleness=self.staleness)            # one histogram for the rank
        args = (self.ep, rng, self.n_ranges, workers, self.tables, self.policy)
        if state is not None:
            ps = ParameterServer.from_copy(*args, state=state.state, clock=clock,
                                           examples=state.examples, order_key=keys, **common)
            ps.examples_epoch = dict(state.examples_epoch)
            ps.examples_before = dict(state.examples_before)
            return ps
        if restore is not None:
            return ParameterServer.from_checkpoint(*args, restore=restore, clock=clock, seed=self.seed,
                                                   examples=examples, order_key=keys, **common)
        return ParameterServer.initial(*args, seed=self.seed, clock=clock, examples=examples,
                                       order_key=keys, **common)

    def _attach_backup(self, ps: ParameterServer, rank) -> None:
        """Replicate range ``ps`` to ps rank ``rank`` (None: no backup) from its clock on."""
        if rank is None:
            self.backup_rank.pop(ps.index, None)
            ps.stop_replication(republish=True)
            return
        self.backup_rank[ps.index] = rank
        ps.replicate(self._forward)

    # ------------------------------------------------------------------ replication
    def _forward(self, rng: int, clock: int, touched: dict, n_ex: int, epoch: int) -> None:
        """Send range ``rng``'s backup the rows clock ``clock`` changed (module docstring).
        Non-blocking; the buffers are kept until the backup acknowledges the clock."""
        dest = self.backup_rank.get(rng)
        if dest is None:
            return
        ps = self.primaries[rng]
        reqs, keep = [], []
        mb = self.ep.max_bytes
        nbytes = 0
        for tid, u in touched.items():          # distinct rows, ascending (touched_rows)
            sh = ps.shards[tid]
            parts = [u, np.take(sh.w, u, axis=0)]
            if sh.slots is not None:
                parts.append(_bytes(np.take(sh.slots, u, axis=0)))
            h = tp.make_header(tp.REPLICATE, tid, clock, u.size, rng=rng)
            keep.append(isend_array(self.ep.comm, h, dest, tp.TAG_REQ, mb, reqs))
            keep.append(isend_array(self.ep.comm, parts[0], dest, tp.TAG_KEYS, mb, reqs))
            for a in parts[1:]:
                keep.append(isend_array(self.ep.comm, a, dest, tp.TAG_VALS, mb, reqs))
            nbytes += sum(a.nbytes for a in parts) + h.nbytes
        h = tp.make_header(tp.REPL_CLOCK, 0, clock + 1, 0, n_ex, aux=epoch, rng=rng)
        keep.append(isend_array(self.ep.comm, h, dest, tp.TAG_REQ, mb, reqs))
        nbytes += h.nbytes
        self.replicated_bytes += nbytes
        self.ep.stats.add(tp.REPLICATE, messages=1, out=nbytes)
        self.inflight.setdefault(rng, []).append((clock + 1, reqs, keep))

    def _on_replicate(self, source: int, h: np.ndarray) -> None:
        rng, tid, n = int(h[tp.H_RANGE]), int(h[tp.H_TABLE]), int(h[tp.H_NKEYS])
        rep = self.backups.get(rng)
        if rep is None:
            raise RuntimeError(f"server {self.server_id}: REPLICATE for key range {rng}, which "
                               "it does not back up")
        w, slots = rep.state[tid]
        rows = self.ep.recv_keys(source, n, tp.REPLICATE)
        vals = np.empty((n,) + w.shape[1:], dtype=w.dtype)
        core.recv_array(self.ep.comm, vals, source, tp.TAG_VALS, self.ep.max_bytes)
        sl = None
        if slots is not None:
            sl = np.empty((n,) + slots.shape[1:], dtype=slots.dtype)
            core.recv_array(self.ep.comm, _bytes(sl), source, tp.TAG_VALS, self.ep.max_bytes)
        self.ep.stats.add(tp.REPLICATE, inn=vals.nbytes + (0 if sl is None else sl.nbytes))
        rep.copy_rows(tid, rows, vals, sl)

    def _on_repl_clock(self, source: int, h: np.ndarray) -> None:
        rng, c = int(h[tp.H_RANGE]), int(h[tp.H_CLOCK])
        rep = self.backups[rng]
        if c != rep.clock + 1:
            raise RuntimeError(f"server {self.server_id}: backup of key range {rng} at clock "
                               f"{rep.clock} received clock {c}")
        rep.clock = c
        n, epoch = int(h[tp.H_NEX]), int(h[tp.H_AUX])
        rep.examples += n
        if n:
            rep.examples_epoch[epoch] = rep.examples_epoch.get(epoch, 0) + n
        send_array(self.ep.comm, tp.make_header(tp.REPL_ACK, 0, c, rng=rng), source, tp.TAG_REQ,
                   self.ep.max_bytes)

    def _on_ack(self, h: np.ndarray) -> None:
        rng, c = int(h[tp.H_RANGE]), int(h[tp.H_CLOCK])
        still = []
        for entry in self.inflight.get(rng, []):
            if entry[0] <= c:
                waitall(entry[1])                # delivered: the backup has acknowledged them
            else:
                still.append(entry)
        self.inflight[rng] = still
        self.primaries[rng].acknowledge(c)

    # ------------------------------------------------------------------ loop
    def handle(self, source: int, h: np.ndarray) -> None:
        """One request or replication message. Local."""
        op = int(h[tp.H_OP])
        if op == tp.REPLICATE:
            self._on_replicate(source, h)
        elif op == tp.REPL_CLOCK:
            self._on_repl_clock(source, h)
        elif op == tp.REPL_ACK:
            self._on_ack(h)
        elif op == tp.REPL_DONE:
            self.done_from.add(int(h[tp.H_RANGE]))
        elif op == tp.GROW:
            self.growing[source] = (int(h[tp.H_AUX]), int(h[tp.H_NKEYS]), int(h[tp.H_CLOCK]))
            if len(self.growing) == len(self.worker_ranks):
                self._grow()
        else:
            rng = int(h[tp.H_RANGE])
            ps = self.primaries.get(rng)
            if ps is None:
                raise RuntimeError(f"server {self.server_id}: request (op {op}) for key range "
                                   f"{rng} from rank {source}, which this server does not serve")
            ps.handle(source, h)

    def _finished(self) -> bool:
        """Every worker stopped on every range served here, every backup acknowledged all and
        was told so, and every range backed up here was finished by its primary."""
        for rng, ps in self.primaries.items():
            if len(ps.stopped) < ps.n_workers:
                return False
            if self.inflight.get(rng):
                return False
            if rng in self.backup_rank and rng not in self.done_sent:
                send_array(self.ep.comm, tp.make_header(tp.REPL_DONE, rng=rng),
                           self.backup_rank[rng], tp.TAG_REQ, self.ep.max_bytes)
                self.done_sent.add(rng)
        return all(r in self.done_from for r in self.backups)

    def serve(self) -> None:
        """Answer requests and replicate until the job ends, surviving failures (module
        docstring). Not collective, except for the recoveries (collective over every
        survivor)."""
        # asked after each request: a growth that oversubscribes the node lowers the
        # ranges' idle_spin (ParameterServer.add_workers) while this loop runs
        while True:
            serve_requests(lambda: self.ep.poll(), self.handle, self._finished,
                           lambda: min(ps.idle_spin for ps in self.primaries.values()),
                           recover=self.recover, recoverable=is_peer_failure)
            try:
                self.ep.flush()              # the last replies, sent without waiting
                break
            except Exception as e:          # noqa: BLE001 - only a lost peer is recovered
                if not is_peer_failure(e):
                    raise
                self.recover()               # then serve the survivors until they stop again
        for ps in self.primaries.values():
            ps.check_done()

    # ------------------------------------------------------------------ growth
    def _grow(self) -> None:
        """Every worker sent GROW (once to each server rank) at the same clock: take part in
        adding the workers (:meth:`hpcps.resilience.elastic.Elastic.grow`); every range served here then
        serves them too. Backups are unaffected (the server ranks keep their ``ps`` ranks:
        the added ranks come after them). Collective over every rank of the job."""
        asks, self.growing = set(self.growing.values()), {}
        n, oversubscribe, clock = agreed_growth(asks, f"server {self.server_id}")
        if self.elastic is None:
            raise RuntimeError(f"server {self.server_id}: GROW received but this job cannot grow")
        for ps in self.primaries.values():
            ps.check_growth(clock)

        # replication of the last clock finishes on the old communicator: after the growth
        # every rank listens on the merged one only (an acknowledgement left behind would
        # hold every pull of the next clock for ever)
        def settled():
            return (all(ps.acked is None or ps.acked >= clock for ps in self.primaries.values())
                    and all(rep.clock >= clock for rep in self.backups.values()))

        serve_requests(lambda: self.ep.poll(), self.handle, settled, 0.0)

        def adopt():        # the job's membership has the new layout
            roles = self.elastic.membership.roles
            stats = self.ep.stats
            self.ep.flush()
            self.ep = tp.ServerEndpoint(roles.ps, self.ep.max_bytes)
            self.ep.stats = stats
            crowded = self.elastic.oversubscribed()
            for ps in self.primaries.values():
                ps.add_workers(roles, clock, crowded, endpoint=self.ep)
            k = len(roles.worker_ranks) - len(self.worker_ranks)
            top = max(self.order_key) + 1
            self.order_key += list(range(top, top + k))
            self.worker_ranks = list(roles.worker_ranks)
            if crowded and self.idle_spin is not None:
                self.idle_spin = min(self.idle_spin, IDLE_SPIN)

        self.elastic.grow(n, clock, adopt, oversubscribe=bool(oversubscribe))

    # ------------------------------------------------------------------ failures
    def _report(self) -> ServerReport:
        n_old = len(self.worker_ranks)
        copies = np.full(self.n_ranges, -1, dtype=np.int64)
        for r, rep in self.backups.items():
            copies[r] = rep.clock
        for r, ps in self.primaries.items():
            copies[r] = ps.clock
        clocks = np.zeros(n_old, dtype=np.int64)
        examples = np.zeros(n_old, dtype=np.int64)
        epochs = np.zeros(n_old, dtype=np.int64)
        for ps in self.primaries.values():
            for w in range(n_old):
                if ps.worker_clock[w] > clocks[w]:
                    clocks[w], examples[w] = ps.worker_clock[w], ps.last_examples[w]
                    epochs[w] = ps.last_epoch[w]
        steps = sorted({s for ps in self.primaries.values() for s in ps.checkpoint_steps})
        return ServerReport(self.server_id, copies, clocks, examples, steps, epochs=epochs)

    def _reload_step(self) -> int:
        """Newest valid checkpoint this run wrote or started from (0: none). Local."""
        steps = sorted({s for ps in self.primaries.values() for s in ps.checkpoint_steps},
                       reverse=True)
        for s in steps:
            try:
                ckpt.verify(ckpt.step_dir(self.ft.run_dir, s))
                return s
            except ckpt.CheckpointError:
                continue
        return 0

    def recover(self) -> None:
        """Survive lost ranks (module docstring). Collective over every survivor."""
        for entries in self.inflight.values():          # never freed while MPI may use them
            for _, reqs, keep in entries:
                core.abandon(reqs, *keep)
        self.inflight = {}
        self.ep.abandon()                                # replies in flight, likewise
        rec = recover(self.ft, self._report(), reload_step_of=self._reload_step)
        t0 = time.perf_counter()
        plan = rec.plan
        stats = self.ep.stats
        self.ep = ServerEndpoint(rec.roles.ps, self.ep.max_bytes)
        self.ep.stats = stats
        me = self.server_id
        old_workers, old_keys = self.worker_ranks, self.order_key
        new_primaries, new_backups = {}, {}
        for r in range(self.n_ranges):
            chain = plan.chains[r]
            if not chain:
                continue
            if chain[0] == me:
                fresh = r not in self.primaries
                if not fresh:
                    ps = self.primaries[r]
                elif r in self.backups:          # the backup takes the range over
                    rep = self.backups[r]
                    ps = self._new_range(r, state=rep, clock=max(rep.clock, int(rec.base[r])),
                                         worker_ranks=old_workers, order_key=old_keys)
                    if rec.base[r] > rep.clock:  # never expected: the backup acknowledges
                        self.lost_steps[r] = int(rec.base[r]) - rep.clock   # before any read
                else:                            # no copy left: reload from the checkpoint
                    ps = self._reload(r, int(rec.base[r]), old_workers, old_keys,
                                      rec.reload_step or 0)
                    self.lost_steps[r] = int(rec.lost_steps[r])
                ps.stop_replication()
                rec_r = rec if not fresh else _Fresh(rec)
                ps.settle(rec_r, self.ep)
                new_primaries[r] = ps
            elif me in chain[1:] and r in self.backups:
                new_backups[r] = self.backups[r]     # kept unless the primary sends a copy
        self.primaries = new_primaries
        self.worker_ranks = list(rec.roles.worker_ranks)
        self.order_key = [old_keys[rec.old_index[i]] for i in range(len(self.worker_ranks))]
        self._resync(rec, new_backups)
        self.done_sent, self.done_from = set(), set()
        self.recovery_seconds.append(round(time.perf_counter() - t0 + rec.seconds, 3))

    def _reload(self, r, base, old_workers, old_keys, step) -> ParameterServer:
        restore, examples = None, 0
        if step > 0:
            d = ckpt.step_dir(self.ft.run_dir, step)
            restore = (d, ckpt.read_manifest(d))
            examples = ckpt.shard_examples(d, r)
        return self._new_range(r, restore=restore, clock=base, examples=examples,
                               worker_ranks=old_workers, order_key=old_keys)

    def _resync(self, rec, kept_backups) -> None:
        """Send each range served here to its backup — the whole range when the backup is new
        or behind, a 'current' note otherwise — and receive the copies this server backs up.
        Point-to-point between the surviving servers (every one calls it after a recovery)."""
        plan, me = rec.plan, self.server_id
        ranks = rec.roles.server_ranks
        rank_of = {sid: ranks[i] for i, sid in enumerate(plan.alive_ids)}
        reqs, keep = [], []
        mb = self.ep.max_bytes
        self.backup_rank = {}
        for r in sorted(self.primaries):
            ps = self.primaries[r]
            chain = plan.chains[r]
            if len(chain) < 2:
                self._attach_backup(ps, None)
                continue
            dest = rank_of[chain[1]]
            current = plan.holders[r].get(chain[1], -1) == ps.clock
            counts = _epoch_counts(ps.examples_epoch, ps.examples_before)
            head = np.array([r, 0 if current else 1, ps.clock, ps.examples_total,
                             counts.shape[0]], dtype=np.int64)
            keep.append(isend_array(self.ep.comm, head, dest, tp.TAG_SNAP, mb, reqs))
            if not current:
                keep.append(isend_array(self.ep.comm, counts, dest, tp.TAG_SNAP, mb, reqs))
                for w, slots in ps.state():
                    keep.append(isend_array(self.ep.comm, w, dest, tp.TAG_SNAP, mb, reqs))
                    if slots is not None:
                        keep.append(isend_array(self.ep.comm, _bytes(slots), dest, tp.TAG_SNAP,
                                                mb, reqs))
                    self.snapshot_bytes += w.nbytes + (0 if slots is None else slots.nbytes)
            self._attach_backup(ps, dest)
        backups = {}
        for r in range(self.n_ranges):
            chain = plan.chains[r]
            if me not in chain[1:]:
                continue
            src = rank_of[chain[0]]
            head = np.empty(5, dtype=np.int64)
            core.recv_array(self.ep.comm, head, src, tp.TAG_SNAP, mb)
            if int(head[0]) != r:
                raise RuntimeError(f"server {me}: copy of key range {int(head[0])} received, "
                                   f"expected {r}")
            if head[1] == 0:
                rep = kept_backups[r]
            else:
                counts = np.empty((int(head[4]), 3), dtype=np.int64)
                core.recv_array(self.ep.comm, counts, src, tp.TAG_SNAP, mb)
                state = []
                for spec, opt in self.tables:
                    lo, hi = _range_bounds(spec, self.n_ranges, r)
                    w = np.empty((hi - lo, spec.dim), dtype=spec.dtype)
                    rq: list = []
                    irecv_array(self.ep.comm, w, src, tp.TAG_SNAP, mb, rq)
                    waitall(rq)
                    slots = opt.init_slots((hi - lo, spec.dim), spec.dtype)
                    if slots is not None:
                        core.recv_array(self.ep.comm, _bytes(slots), src, tp.TAG_SNAP, mb)
                    state.append((w, slots))
                rep = Replica(r, state, int(head[2]), int(head[3]), *_epoch_dicts(counts))
            backups[r] = rep
        waitall(reqs)
        del keep
        self.backups = backups


    # ------------------------------------------------------------------ reports
    def load(self) -> dict:
        """Keys and bytes this rank has served, as :meth:`ParameterServer.load` (rows and
        memory of the ranges it serves and backs up; examples: the largest count of its ranges,
        each range applies every example)."""
        s = self.ep.stats
        prim = list(self.primaries.values())
        return {
            "server": self.server_id,
            "rows": int(sum(sh.hi - sh.lo for ps in prim for sh in ps.shards)),
            "memory_bytes": int(sum(sh.nbytes for ps in prim for sh in ps.shards)
                                + sum(rep.nbytes for rep in self.backups.values())),
            "keys_pulled": int(s.keys.get("pull", 0)),
            "keys_pushed": int(s.keys.get("push", 0)),
            "bytes_in": int(s.training("bytes_in")),
            "bytes_out": int(s.training("bytes_out")),
            "export_bytes": int(s.export("bytes_out")),
            "requests": int(s.total("messages")),
            "requests_compiled": int(sum(ps.requests_compiled for ps in prim)),
            "clock": min(ps.clock for ps in prim),
            "examples": max(ps.examples_total for ps in prim),
            "examples_per_epoch": {e: max(ps.examples_epoch.get(e, 0) for ps in prim)
                                   for e in {e for ps in prim for e in ps.examples_epoch}},
            "staleness": self.staleness,
        }

    def range_rows(self) -> np.ndarray:
        """int64 ``(n_ranges, 5)``: per range served here ``[server id, clock, examples applied,
        steps lost, replicated bytes (this rank's, on its first range)]``, -1 rows elsewhere
        (to be combined over ranks with a maximum)."""
        out = np.full((self.n_ranges, 5), -1, dtype=np.int64)
        for i, (r, ps) in enumerate(sorted(self.primaries.items())):
            out[r] = [self.server_id, ps.clock, ps.examples_total, self.lost_steps.get(r, 0),
                      self.replicated_bytes + self.snapshot_bytes if i == 0 else 0]
        return out


class _Fresh:
    """A :class:`~hpcps.resilience.recovery.Recovery` seen by a range that was just taken over or
    reloaded: the dead workers' unfinished steps are not settled there (their pushes were
    on the dead server), the surviving workers send theirs again."""

    def __init__(self, rec):
        self.__dict__.update(rec.__dict__)
        self.dead_workers = list(rec.dead_workers)
        n = len(rec.clocks)
        self.clocks = np.zeros(n, dtype=np.int64)
        self.examples = np.zeros(n, dtype=np.int64)


def _range_bounds(spec, n_ranges: int, r: int) -> tuple[int, int]:
    return KeyPartition(spec.num_keys, n_ranges, permute=spec.sparse).shard_range(r)


def _epoch_counts(examples_epoch: dict, examples_before: dict) -> np.ndarray:
    """int64 ``(k, 3)``: per epoch ``[epoch, this launch's examples, the earlier launches']``
    of a range, sent with a full copy to a new backup (:func:`_epoch_dicts` reads it)."""
    epochs = sorted(set(examples_epoch) | set(examples_before))
    return np.array([[e, examples_epoch.get(e, 0), examples_before.get(e, 0)] for e in epochs],
                    dtype=np.int64).reshape(-1, 3)


def _epoch_dicts(counts: np.ndarray) -> tuple[dict, dict]:
    """The two dicts of :func:`_epoch_counts` (zero counts left out)."""
    return ({int(e): int(n) for e, n, _ in counts if n},
            {int(e): int(m) for e, _, m in counts if m})
