"""A worker's requests of several parts at a server: ``PUSH_CLOCK`` (a step's pushes and its
clock), ``PULL_MANY`` (the pulls of several tables) and ``PUSH_CLOCK_PULL`` (a BSP step and the
next step's pulls, issue 20), taken apart and handed to the single-part handlers. Mixed into
:class:`hpcps.server.server.ParameterServer` (which provides ``ep``, ``policy``, ``shards``,
``pending``, ``waiting_pulls``, the clocks and ``_on_push``, ``_queue``, ``_clocked``, ``_shard``,
``_pull_ready``, ``_reply_rows``)."""

from __future__ import annotations

import numpy as np

from hpcps.comm import transport as tp
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
        """A BSP worker's step ``c`` (pushes and CLOCK, as a ``PUSH_CLOCK``) and its step
        ``c + 1``'s pulls (a ``PULL_MANY`` at clock ``c + 1``, held in :attr:`waiting_pulls`
        until step ``c`` is applied): the rows its next ``PULL_MANY`` would have got.
        RuntimeError under a policy other than BSP (workers fuse only under BSP)."""
        if not self.policy.aggregate or self.policy.staleness != 0:
            raise RuntimeError(f"server {self.index}: PUSH_CLOCK_PULL from rank {source} "
                               f"under {self.policy.describe()} (only BSP fuses)")
        n_push, n_pull = int(h[tp.H_TABLE]), int(h[tp.H_DIM])
        if self.ft is None:
            got = self.ep.step_parts(n_push, n_pull, self.shards, Shard)
            if got is not None:            # taken apart in one compiled call
                self._on_step(source, h, *got)
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
        local rows, values, version)``, ``pulls`` as ``(shard, local rows)``): queued,
        clocked and answered as the general path (:meth:`_on_push`, :meth:`_on_clock`,
        :meth:`_on_pull_many`) does, with one Python call instead of one per part."""
        w = self.worker_of_rank[source]
        c = int(h[tp.H_CLOCK])
        if pushes:
            self._queue(w, c, pushes)
            self.pushes_applied[w] += len(pushes)
        self._clocked(w, c, int(h[tp.H_NEX]), int(h[tp.H_AUX]))
        if self.policy.pull_ready(self.visible_clock, c + 1):
            for shard, rows in pulls:           # new arrays: nothing to give back
                self._reply_rows(source, shard, rows, tp.PULL)
        else:
            self.waiting_pulls.append(
                (source, tp.make_header(tp.PULL_MANY, len(pulls), c + 1,
                                        sum(r.shape[0] for _, r in pulls),
                                        seq=int(h[tp.H_SEQ]), rng=int(h[tp.H_RANGE])), pulls))

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
        """Answer a PULL_MANY: each part's rows and shard header, in order; the rows' pooled
        buffers go back to the pool."""
        for shard, rows in parts:
            self._reply_rows(source, shard, rows, tp.PULL)
            self.ep.pool.give(rows)
