"""A worker's requests of several parts at a server, and the BSP/SSP steps they make up:
``PUSH_CLOCK`` (a step's pushes and its clock), ``PULL_MANY`` (the pulls of several tables)
and ``PUSH_CLOCK_PULL`` (a BSP step and the next step's pulls, issue 20), taken apart and
handed to the single-part handlers, or under BSP taken in by the compiled loop
(:meth:`StepRequests._take_steps`); a step every worker finished is applied by
:meth:`StepRequests._advance`. Mixed into :class:`hpcps.server.server.ParameterServer` (which
provides ``ep``, ``policy``, ``shards``, ``pending``, ``waiting_pulls``, the clocks and
``_on_push``, ``_queue``, ``_clocked``, ``_after_clock``, ``_shard``, ``_pull_ready``,
``_reply_rows``, ``_check_weights``, ``_count``, ``_publish``, ``_answer_waiting``)."""

from __future__ import annotations

import time

import numpy as np

from hpcps.comm import transport as tp
from hpcps.core.consistency import H_CLOCK, H_VERSION
from hpcps.server.shard import Shard


class StepRequests:
    """The handlers of the requests of several parts (:mod:`hpcps.comm.protocol`)."""

    def _on_push_clock(self, source: int, h: np.ndarray, metas) -> None:
        """The pushes (descriptions ``metas``, ``(P, PART_LEN)``) and the CLOCK of the
        ``PUSH_CLOCK`` or ``PUSH_CLOCK_PULL`` ``h`` from ``source``."""
        for meta in metas:
            self._on_push(source, tp.part_header(h, meta))
        self._on_clock(source, tp.make_header(tp.CLOCK, 0, int(h[tp.H_CLOCK]), 0,
                                              int(h[tp.H_NEX]), aux=int(h[tp.H_AUX]),
                                              rng=int(h[tp.H_RANGE])))

    def _on_push_clock_pull(self, source: int, h: np.ndarray) -> None:
        """A BSP or async worker's step ``c`` (pushes and CLOCK, as a ``PUSH_CLOCK``) and its
        step ``c + 1``'s pulls (a ``PULL_MANY`` at clock ``c + 1``; under BSP held in
        :attr:`waiting_pulls` until step ``c`` is applied, under async answered now, after
        the pushes): the rows its next ``PULL_MANY`` would have got. RuntimeError under SSP
        with staleness > 0 (its workers do not fuse)."""
        bsp = self.policy.bsp
        if self.policy.aggregate and not bsp:
            raise RuntimeError(f"server {self.index}: PUSH_CLOCK_PULL from rank {source} "
                               f"under {self.policy.describe()} (only BSP and async fuse)")
        n_push, n_pull = int(h[tp.H_TABLE]), int(h[tp.H_DIM])
        if self.ft is None:
            got = self.ep.step_parts(n_push, n_pull, self.shards, Shard, examples=not bsp)
            if got is not None:            # taken apart in one compiled call
                (self._on_step if bsp else self._on_step_async)(source, h, *got)
                return
        metas = self.ep.recv_keys(source, tp.PART_LEN * (n_push + n_pull),
                                  tp.PUSH_CLOCK_PULL).reshape(-1, tp.PART_LEN)
        self._on_push_clock(source, h, metas[:n_push])
        pulls = metas[n_push:]
        n_keys = int(pulls[:, 1].sum())
        self.ep.stats.add(tp.PULL, keys=n_keys)
        self._on_pull_many(source, tp.make_header(tp.PULL_MANY, n_pull, int(h[tp.H_CLOCK]) + 1,
                                                  n_keys, seq=int(h[tp.H_SEQ]),
                                                  rng=int(h[tp.H_RANGE])), pulls)

    def _on_step(self, source: int, h: np.ndarray, pushes, pulls) -> None:
        """A ``PUSH_CLOCK_PULL`` ``h`` from ``source`` whose parts came taken apart
        (:meth:`hpcps.comm.transport.ServerEndpoint.step_parts`: ``pushes`` as ``(table,
        local rows, values, version)``, ``pulls`` as ``(shard, local rows)``): taken in by
        the bookkeeping the compiled loop uses (:meth:`~hpcps.comm.transport.ServerEndpoint.record_step`:
        queued, clocked, its pulls held for the step), then the step applied if it completed.
        RuntimeError for a rank that is not one of its workers or a clock other than the one
        expected."""
        if not self.ep.record_step(self, source, h, pushes, pulls):
            w = self.worker_of_rank.get(source)
            raise RuntimeError(f"server {self.index}: step {int(h[tp.H_CLOCK])} from rank "
                               f"{source}: " + ("not one of its workers" if w is None else
                                                f"worker {w} expected at clock "
                                                f"{self.worker_clock[w]}"))
        self._after_clock()

    def _on_step_async(self, source: int, h: np.ndarray, pushes, pulls, examples) -> None:
        """An async ``PUSH_CLOCK_PULL`` ``h`` from ``source`` whose parts came taken apart
        (:meth:`~hpcps.comm.transport.ServerEndpoint.step_parts`; ``examples``: each push's):
        what the general path does with it — each push applied now, in order
        (:meth:`_apply_now`), the CLOCK, then the pulls of step ``c + 1`` answered — without
        a Python call per part to receive and check it. RuntimeError for a rank that is not
        one of its workers."""
        w = self.worker_of_rank.get(source)
        if w is None:
            raise RuntimeError(f"server {self.index}: step {int(h[tp.H_CLOCK])} from rank "
                               f"{source}: not one of its workers")
        c = int(h[tp.H_CLOCK])
        hp = h.copy()                      # the push header _apply_now reads
        for (tid, rows, vals, version), n_ex in zip(pushes, examples.tolist()):
            hp[tp.H_NEX], hp[tp.H_AUX] = n_ex, version
            self.pushes_applied[w] += 1
            self._apply_now(self.shards[tid], rows, vals, hp)
        self._clocked(w, c, int(h[tp.H_NEX]), int(h[tp.H_AUX]))
        hm = tp.make_header(tp.PULL_MANY, len(pulls), c + 1,
                            sum(int(r.shape[0]) for _, r in pulls), seq=int(h[tp.H_SEQ]),
                            rng=int(h[tp.H_RANGE]))
        if self._pull_ready(hm):
            self._reply_many(source, pulls)
        else:
            self.waiting_pulls.append((source, hm, pulls))

    def _on_pull_many(self, source: int, h: np.ndarray, metas=None) -> None:
        """A PULL_MANY (header ``h``) from ``source``: the pulls of several tables in one
        request, answered together (each table's rows and shard header, in the request's
        order) once the policy allows the read. ``metas``: the pulls' descriptions when
        received already (a ``PUSH_CLOCK_PULL``'s)."""
        if metas is None:
            metas = self.ep.recv_keys(source, tp.PART_LEN * int(h[tp.H_TABLE]), tp.PULL_MANY)
        parts = []
        for meta in metas.reshape(-1, tp.PART_LEN):
            hp = tp.part_header(h, meta)
            shard = self._shard(hp)
            keys = self.ep.recv_keys(source, int(hp[tp.H_NKEYS]), tp.PULL, pooled=True)
            parts.append((shard, shard.rows_for(keys, self.index)))
        if self._pull_ready(h):
            self._reply_many(source, parts)
        else:
            self.waiting_pulls.append((source, h, parts))

    def _reply_many(self, source: int, parts) -> None:
        """Answer a PULL_MANY: each part's rows and shard header, in order (one message for
        several when they fit: :meth:`hpcps.comm.transport.ServerEndpoint.reply_many`); the
        rows' pooled buffers go back to the pool."""
        if len(parts) > 1:
            vals = [(shard.gather(rows, self.ep.pool), shard.hdr) for shard, rows in parts]
            self.ep.reply_many(source, vals, tp.PULL, self.index)
            for (v, _), (_, rows) in zip(vals, parts):
                self.ep.pool.give(v, rows)
            return
        for shard, rows in parts:
            self._reply_rows(source, shard, rows, tp.PULL)
            self.ep.pool.give(rows)

    def _take_steps(self):
        """The loop's poll under BSP outside continue mode: the fused steps that wait taken
        in by one compiled call (:meth:`hpcps.comm.transport.ServerEndpoint.take_steps`), a
        step they complete applied; ``None`` (nothing waited), ``(source, header)`` of a
        request left to :meth:`handle`, or ``(-1, None)`` (nothing left to handle)."""
        got = self.ep.take_steps(self, self.shards, Shard, self.busy)
        if got is None:
            return None
        taken, completed, left = got
        self.requests_compiled += taken
        if completed:
            if self.busy is None:
                self._after_clock()
            else:
                t0, c0 = time.perf_counter(), time.thread_time()
                self._after_clock()
                self.busy[1] += time.perf_counter() - t0
                self.busy[2] += time.thread_time() - c0
        return left if left is not None else (-1, None)

    # ------------------------------------------------------------------ BSP/SSP
    def _advance(self) -> None:
        """Apply every clock all workers have finished; if the clock moved, answer the pulls
        now allowed (nothing else makes one ready under BSP/SSP; a look at every CLOCK cost
        O(W^2) per step)."""
        start = self.clock
        while self.worker_clock.min() > self.clock:
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
                        shard.apply(rows, grads, scale)
                        self._check_weights(shard, rows, c)
                        if self.forward is not None:
                            touched[tid] = shard.touched(rows)
                        self.ep.pool.give(rows, grads, *(a for p in pushes for a in p[1:3]))
                    shard.hdr[H_VERSION] = c + 1
                    shard.hdr[H_CLOCK] = c + 1
            self.clock = c + 1
            for n, epoch in per_worker.values():
                self._count(n, epoch)
            if self.forward is not None:
                # the clock's epoch (every worker's step c is in one epoch: clocks map to
                # (epoch, step) alike on every worker)
                epoch = max((e for n, e in per_worker.values() if n), default=0)
                self.forward(self.index, c, touched, n_ex, epoch)
        if self.clock != start:
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
