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
  position of the chunk's first key), and :func:`merge_sorted` merges the servers' chunks
  (a k-way merge: every key a server holds is on that server only).

Every request carries the chief's clock, so a server answers once it has applied every step
before it (as :meth:`hpcps.worker.client.PSClient.pull_table` did): the rows are the final
model's. The traffic is counted as ``pull_shard``, apart from the training's pulls.
"""

from __future__ import annotations

import numpy as np

from hpcps.comm import transport as tp
from hpcps.core.tables import PULL_SHARD_KEY_RANGE, PULL_SHARD_SORTED

__all__ = ["FixedTableStream", "DynamicTableStream", "merge_sorted", "model_tables"]

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
        servers' parts (twice the block) at a time. Point-to-point.

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
    chunks (:func:`merge_sorted`).

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
        and one merged block (see :func:`merge_sorted`). Point-to-point.

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


def merge_sorted(counts, fetch, per: int, name: str = "table", stats: dict | None = None):
    """Merge the servers' ascending keys into one ascending stream, chunk by chunk.

    Parameters
    ----------
    counts : sequence of int
        Keys held by each server.
    fetch : callable([(server, start, n)]) -> [(keys int64 (n,), rows (n, dim))]
        Returns chunks of each server's keys in ascending order (positions ``[start,
        start + n)``) and their rows; asked for the chunks of several servers at once.
    per : int
        Keys per chunk asked of a server (>= 1).
    name : str
        The table, for the messages.
    stats : dict, optional
        Filled with ``held_max``: the most bytes of keys and rows held at once (the
        servers' current chunks plus the block being yielded), and ``blocks``.

    Yields
    ------
    (keys, rows)
        Ascending keys and their rows. Each block holds every buffered key up to the
        smallest last key among the servers that have more to send, so each one empties at
        least one server's chunk and holds at most ``S * per`` rows.

    Raises
    ------
    RuntimeError
        If a chunk is not strictly ascending, does not continue its server's keys, or
        holds a key another server holds too (naming ``name``).
    """
    if per < 1:
        raise ValueError(f"per must be >= 1, got {per}")
    counts = [int(n) for n in counts]
    pos = [0] * len(counts)                 # next position to ask of each server
    bufs: dict = {}                         # server -> [keys, rows, first unused]
    tail: dict = {}                         # server -> its last key received
    last = None                             # the last key yielded
    held_max, n_blocks = 0, 0

    def refill(servers):
        asks = [(s, pos[s], min(per, counts[s] - pos[s])) for s in servers]
        for (s, start, n), (k, r) in zip(asks, fetch(asks)):
            if k.shape != (n,) or r.shape[0] != n:
                raise RuntimeError(f"table {name!r}: server {s} sent {k.shape[0]} keys for a "
                                   f"chunk of {n}")
            if n > 1 and not bool(np.all(k[1:] > k[:-1])):
                raise RuntimeError(f"table {name!r}: server {s}'s chunk at {start} is not "
                                   "strictly ascending")
            if s in tail and k[0] <= tail[s]:
                raise RuntimeError(f"table {name!r}: server {s}'s chunk at {start} does not "
                                   "continue its previous one")
            pos[s] = start + n
            tail[s] = int(k[-1])
            bufs[s] = [k, r, 0]

    refill([s for s, n in enumerate(counts) if n])
    while bufs:
        held = sum(b[0].nbytes + b[1].nbytes for b in bufs.values())
        more = [bufs[s][0][-1] for s in bufs if pos[s] < counts[s]]
        bound = min(more) if more else None
        ks, rs, done = [], [], []
        for s, b in bufs.items():
            k, r, i = b
            j = k.size if bound is None else int(np.searchsorted(k, bound, side="right"))
            if j > i:
                ks.append(k[i:j])
                rs.append(r[i:j])
            b[2] = j
            if j == k.size:
                done.append(s)
        if len(ks) == 1:
            keys, rows = ks[0], rs[0]
        else:
            keys = np.concatenate(ks)
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            rows = np.concatenate(rs)[order]
            if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
                k = int(keys[np.flatnonzero(keys[1:] <= keys[:-1])[0]])
                raise RuntimeError(f"table {name!r}: key {k} was sent by two servers")
        del ks, rs
        if last is not None and keys.size and keys[0] <= last:
            raise RuntimeError(f"table {name!r}: key {int(keys[0])} comes after key {last}")
        held_max = max(held_max, held + keys.nbytes + rows.nbytes)
        if keys.size:
            last = int(keys[-1])
            n_blocks += 1
            if stats is not None:
                stats["held_max"], stats["blocks"] = held_max, n_blocks
            yield keys, rows
        del keys, rows
        again = []
        for s in done:
            del bufs[s]
            if pos[s] < counts[s]:
                again.append(s)
        if again:
            refill(again)
    if stats is not None:
        stats["held_max"], stats["blocks"] = held_max, n_blocks
