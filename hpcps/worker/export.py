"""The final model streamed out of the servers chunk by chunk, for
:func:`hpcps.runtime.output.write_model` (the chief, after training). Point-to-point.

The chief never holds a whole table: it asks each server for bounded chunks and hands them
on in the order of the model file, so its memory is bounded by the chunk size, not by the
table (a dynamic table of 10^8 keys was assembled whole before, and the chief was
OOM-killed at a 1.25 GiB limit while every server stayed bounded).

* A fixed table (:class:`FixedTableStream`) goes in key ranges ``[a, a + rows)``: each server
  answers ``PULL_SHARD`` with ``aux`` :data:`~hpcps.core.tables.PULL_SHARD_KEY_RANGE` with
  the rows of those keys it holds, ascending by key; the chief interleaves them by the same
  key -> range map (one request per server and range; a dense table's range lies on one or
  two servers).
* A dynamic table (:class:`DynamicTableStream`): each server reports its number of keys
  (``aux`` :data:`~hpcps.server.dynshard.PULL_SHARD_COUNT`), then serves its keys in
  ascending order in chunks (``aux`` :data:`~hpcps.core.tables.PULL_SHARD_SORTED`, ``seq`` the
  position of the chunk's first key), and :func:`hpcps.core.dyntables.merge_sorted` merges the servers' chunks
  (a k-way merge: every key a server holds is on that server only).

Every request carries the chief's clock, so a server answers once it has applied every step
before it (as :meth:`hpcps.worker.client.PSClient.pull_table` did): the rows are the final
model's. The traffic is counted as ``pull_shard``, apart from the training's pulls.
"""

from __future__ import annotations

import numpy as np

from hpcps.comm import transport as tp
from hpcps.core.dyntables import merge_sorted
from hpcps.core.tables import PULL_SHARD_KEY_RANGE, PULL_SHARD_SORTED

__all__ = ["FixedTableStream", "DynamicTableStream", "model_tables"]

#: ``PULL_SHARD`` aux of a dynamic table's key count (hpcps.server.dynshard.PULL_SHARD_COUNT)
_COUNT = 1


def model_tables(client) -> dict:
    """``{name: stream}`` of every table of ``client`` in table order, for
    :func:`hpcps.runtime.output.write_model`. Local (nothing is sent before the writer
    reads the streams)."""
    return {spec.name: (DynamicTableStream if spec.dynamic else FixedTableStream)(client, spec.name)
            for spec in client.specs}


class _Stream:
    """What :func:`hpcps.runtime.output.write_model` reads of a table: ``n_rows``, ``dim``,
    ``dtype``, ``dynamic`` and :meth:`blocks`; and the most bytes of rows and keys it held
    at once (:attr:`held_max`)."""

    dynamic = False

    def __init__(self, client, table):
        self.client = client
        self.tid, self.spec, self.part = client._table(table)
        self.name = self.spec.name
        self.dim = int(self.spec.dim)
        self.dtype = np.dtype(self.spec.dtype)
        self.held_max = 0          # bytes of received rows and keys held at once, at most
        self.received = 0          # bytes of rows and keys received

    def _held(self, *arrays) -> None:
        self.held_max = max(self.held_max, sum(a.nbytes for a in arrays))


class FixedTableStream(_Stream):
    """A fixed table in original key order, in blocks of at most ``max_rows`` keys.

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    table : str or int
    """

    @property
    def n_rows(self) -> int:
        return int(self.spec.num_keys)

    def blocks(self, max_rows: int):
        """Yield ``(None, rows)`` for the keys ``[0, rows)``, ``[rows, 2 rows)``, ... in
        order, each ``rows`` at most ``max_rows``. The chief holds one block and its
        servers' parts (twice the block) and the block's keys and servers (int64) at a
        time. Point-to-point.

        Raises
        ------
        ValueError
            If ``max_rows`` < 1.
        """
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        c = self.client
        c.send_staged()
        n, dim, dtype, part = self.n_rows, self.dim, self.dtype, self.part
        for a in range(0, n, max_rows):
            b = min(n, a + max_rows)
            owner = part.server_of(np.arange(a, b, dtype=np.int64))
            counts = np.bincount(owner, minlength=c.n_servers)
            parts = {}
            for s in np.flatnonzero(counts):
                s = int(s)
                buf = np.empty((int(counts[s]), dim), dtype=dtype)
                parts[s] = buf
                c.ep.expect(s, buf, tp.PULL_SHARD)
                c.ep.send(s, tp.make_header(tp.PULL_SHARD, self.tid, c.clock_value, b - a,
                                            seq=a, aux=PULL_SHARD_KEY_RANGE, rng=s))
            c.ep.complete(tp.PULL_SHARD)
            if len(parts) == 1:
                (out,) = parts.values()
            else:
                out = np.empty((b - a, dim), dtype=dtype)
                for s, buf in parts.items():
                    out[owner == s] = buf
            self._held(out, *parts.values())
            self.received += out.nbytes
            del parts
            yield None, out


class DynamicTableStream(_Stream):
    """A dynamic table's keys and rows ascending by key, merged from every server's sorted
    chunks (:func:`hpcps.core.dyntables.merge_sorted`).

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    table : str or int
    """

    dynamic = True

    def __init__(self, client, table):
        super().__init__(client, table)
        self._counts = None

    def counts(self) -> list:
        """Keys stored on each server (one ``PULL_SHARD`` round trip, the first time).
        Point-to-point."""
        if self._counts is None:
            c = self.client
            c.send_staged()
            bufs = [np.zeros(1, dtype=np.int64) for _ in range(c.n_servers)]
            for s, buf in enumerate(bufs):
                c.ep.expect(s, buf, tp.PULL_SHARD)
                c.ep.send(s, tp.make_header(tp.PULL_SHARD, self.tid, c.clock_value, 1,
                                            aux=_COUNT, rng=s))
            c.ep.complete(tp.PULL_SHARD)
            self._counts = [int(b[0]) for b in bufs]
        return self._counts

    @property
    def n_rows(self) -> int:
        return sum(self.counts())

    def _fetch(self, asks):
        """Chunks ``[(server, start, n)]`` of the servers' sorted keys, requested together:
        ``[(keys, rows)]`` in the same order. Point-to-point."""
        c = self.client
        got = []
        for s, start, n in asks:
            keys = np.empty(n, dtype=np.int64)
            rows = np.empty((n, self.dim), dtype=self.dtype)
            c.ep.expect_rows(s, rows, keys, tp.PULL_SHARD)
            c.ep.send(s, tp.make_header(tp.PULL_SHARD, self.tid, c.clock_value, n, seq=start,
                                        aux=PULL_SHARD_SORTED, rng=s))
            got.append((keys, rows))
        c.ep.complete(tp.PULL_SHARD)
        for keys, rows in got:
            self.received += keys.nbytes + rows.nbytes
        return got

    def blocks(self, max_rows: int):
        """Yield ``(keys, rows)`` ascending by key, every key once, each block at most
        ``max_rows`` rows; the servers are asked for chunks of ``max(1, max_rows // S)``
        keys (S servers holding keys), so the chief holds at most ``max_rows`` received rows
        and one merged block (see :func:`hpcps.core.dyntables.merge_sorted`). Point-to-point.

        Raises
        ------
        ValueError
            If ``max_rows`` < 1.
        RuntimeError
            If a server's chunk is not ascending or repeats another server's key (naming
            the table).
        """
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        counts = self.counts()
        per = max(1, max_rows // max(1, sum(1 for n in counts if n)))
        stats: dict = {}
        try:
            yield from merge_sorted(counts, self._fetch, per, name=self.name, stats=stats)
        finally:
            self.held_max = max(self.held_max, stats.get("held_max", 0))
