"""The worker's client of the parameter server: ``pull``, ``push``, ``clock``.

Contract (as in ps-lite's KVWorker, stated here for hpcps):

* ``pull(table, keys)`` returns the rows of ``keys`` in the order given (duplicates allowed),
  as of the consistency policy: under BSP the pull at clock ``t`` sees exactly the updates of
  every worker's clocks ``< t``. It blocks until every server has answered.
* ``push(table, keys, grads)`` sends gradient *sums* for ``keys`` (duplicates allowed; the
  server sums them). It returns once the data has left this worker's buffers.
* ``clock(n_examples)`` ends this worker's step: it tells every server how many examples the
  step's pushes cover (servers divide by the total) and advances the worker clock.

No method is collective; each talks point-to-point to the servers that own the keys.
"""

from __future__ import annotations

import numpy as np

from ..comm import transport as tp
from ..tables import KeyPartition, TableSpec


class PSClient:
    """Worker-side access to the sharded tables.

    Parameters
    ----------
    endpoint : hpcps.comm.transport.WorkerEndpoint
    tables : list of TableSpec
        In table-id order, identical on every rank.
    n_servers : int
    """

    def __init__(self, endpoint, tables, n_servers):
        self.ep = endpoint
        self.specs = list(tables)
        self.ids = {s.name: i for i, s in enumerate(self.specs)}
        self.parts = [KeyPartition(s.num_keys, n_servers, permute=s.sparse) for s in self.specs]
        self.n_servers = n_servers
        self.clock_value = 0
        self.seq = 0

    def _table(self, table) -> tuple[int, TableSpec, KeyPartition]:
        try:
            tid = self.ids[table] if isinstance(table, str) else int(table)
            return tid, self.specs[tid], self.parts[tid]
        except (KeyError, IndexError):
            raise KeyError(f"unknown table {table!r}; tables: {', '.join(self.ids)}") from None

    def pull(self, table, keys) -> np.ndarray:
        """Rows of ``keys``.

        Parameters
        ----------
        table : str or int
        keys : int64 array-like (n,)
            Keys in ``[0, num_keys)``; duplicates allowed.

        Returns
        -------
        ndarray (n, dim) of the table dtype.

        Raises
        ------
        ValueError
            For a key outside the table's key space.
        """
        tid, spec, part = self._table(table)
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        out = np.empty((keys.size, spec.dim), dtype=spec.dtype)
        if keys.size == 0:
            return out
        order, bounds = part.split(keys)
        sorted_keys = keys[order]
        buf = np.empty_like(out)
        for s in range(self.n_servers):
            a, b = bounds[s], bounds[s + 1]
            if a == b:
                continue
            self.ep.expect(s, buf[a:b], tp.PULL)
            self.ep.send(s, tp.make_header(tp.PULL, tid, self.clock_value, b - a, seq=self.seq),
                         sorted_keys[a:b])
        self.ep.complete(tp.PULL)
        out[order] = buf
        self.seq += 1
        return out

    def push(self, table, keys, grads) -> None:
        """Send gradient sums ``grads`` for ``keys`` to the servers owning them.

        Parameters
        ----------
        table : str or int
        keys : int64 array-like (n,)
        grads : array-like (n, dim) (or (n,) when dim == 1), cast to the table dtype.

        Raises
        ------
        ValueError
            On a shape mismatch or a key outside the key space.
        """
        tid, spec, part = self._table(table)
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        grads = np.asarray(grads, dtype=spec.dtype).reshape(keys.size, -1) if keys.size else \
            np.empty((0, spec.dim), dtype=spec.dtype)
        if grads.shape != (keys.size, spec.dim):
            raise ValueError(f"push to {spec.name!r}: grads shape {grads.shape} does not match "
                             f"({keys.size}, {spec.dim})")
        if keys.size == 0:
            return
        order, bounds = part.split(keys)
        k = keys[order]
        g = grads[order]
        for s in range(self.n_servers):
            a, b = bounds[s], bounds[s + 1]
            if a == b:
                continue
            self.ep.send(s, tp.make_header(tp.PUSH, tid, self.clock_value, b - a, seq=self.seq,
                                           dim=spec.dim), k[a:b], g[a:b])
        self.ep.complete(tp.PUSH)
        self.seq += 1

    def clock(self, n_examples: int) -> int:
        """Finish this worker's step (``n_examples`` examples pushed in it); return the new clock."""
        for s in range(self.n_servers):
            self.ep.send(s, tp.make_header(tp.CLOCK, 0, self.clock_value, 0, n_examples))
        self.ep.complete(tp.CLOCK)
        self.clock_value += 1
        return self.clock_value

    def pull_table(self, table) -> np.ndarray:
        """The whole table in original key order, ``(num_keys, dim)``; for model output.

        Sends one ``PULL_SHARD`` to each server (answered once the server's clock has reached
        this worker's clock) and un-permutes the shards.
        """
        tid, spec, part = self._table(table)
        shards = []
        for s in range(self.n_servers):
            lo, hi = part.shard_range(s)
            buf = np.empty((hi - lo, spec.dim), dtype=spec.dtype)
            shards.append(buf)
            if hi > lo:
                self.ep.expect(s, buf, tp.PULL_SHARD)
                self.ep.send(s, tp.make_header(tp.PULL_SHARD, tid, self.clock_value))
        self.ep.complete(tp.PULL_SHARD)
        out = np.empty((spec.num_keys, spec.dim), dtype=spec.dtype)
        for s, buf in enumerate(shards):
            out[part.shard_keys(s)] = buf
        return out

    def checkpoint(self, step: int) -> list:
        """Ask every server to write its shard for the checkpoint at ``step``.

        Each server writes once it has applied every step ``< step`` (a consistent cut:
        it cannot have applied more, as this worker has not clocked ``step`` yet).
        Point-to-point; called by worker 0 only.

        Returns
        -------
        list of (nbytes, sha256 hex) per server, in server order.
        """
        replies = [np.empty(40, dtype=np.uint8) for _ in range(self.n_servers)]
        for s in range(self.n_servers):
            self.ep.expect(s, replies[s], tp.CHECKPOINT)
            self.ep.send(s, tp.make_header(tp.CHECKPOINT, 0, step))
        self.ep.complete(tp.CHECKPOINT)
        return [(int(np.frombuffer(r[:8].tobytes(), dtype="<i8")[0]), r[8:].tobytes().hex())
                for r in replies]

    def stop(self) -> None:
        """Tell every server this worker is done (after its last pull)."""
        for s in range(self.n_servers):
            self.ep.send(s, tp.make_header(tp.STOP))
        self.ep.complete(tp.STOP)
