"""A server's rows of one table (:class:`Shard`), where they live (an RMA window or an
array), and the row arithmetic of replies and updates. Local; no MPI."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from hpcps.core.arrays import distinct
from hpcps.core.consistency import H_SEQ, header_len
from hpcps.core.tables import PULL_SHARD_KEY_RANGE, KeyPartition, TableSpec
from hpcps.kernels.keys import gather_local, push_rows_inplace
from hpcps.kernels.optim import take_rows

#: A p2p pull of a sparse table is answered by one pass from keys to reply rows
#: (:func:`hpcps.kernels.keys.gather_local`), which for more than this many keys prefetches
#: the row of the key ``GATHER_AHEAD`` entries on (1 M random keys of a 4 M-row float32 table:
#: 9.8-11.6 ms of CPU against 11.6-14.1 ms for local rows then the prefetching
#: :func:`hpcps.kernels.optim.take_rows`, 5 alternating runs on a loaded machine).
DIRECT_GATHER_MAX = 4096
GATHER_AHEAD = 63

def touched_rows(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Distinct local rows of an update, ascending int64. Local.

    A boolean mask when the update covers at least 1/8 of the shard (linear in the shard),
    else a sort of the update (:func:`hpcps.core.arrays.distinct`)."""
    if rows.size * 8 >= n_rows:
        mask = np.zeros(n_rows, dtype=bool)
        mask[rows] = True
        return np.flatnonzero(mask).astype(np.int64)
    return distinct(rows)


def rows_of(w: np.ndarray, rows: np.ndarray, pool=None) -> np.ndarray:
    """``w[rows]`` for a reply: a view (no copy) when ``rows`` is one ascending run of
    consecutive rows (a dense block), else the rows gathered into a buffer of ``pool``
    (:class:`hpcps.comm.buffers.BufferPool`; give it back after the reply) or a new array.
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

    def push_rows(self, keys: np.ndarray, grads: np.ndarray, server: int) -> bool:
        """A received push: its ``keys`` (int64 (n,)) turned into local rows in place, and
        whether its ``grads`` are all finite, in one compiled call. Raises ``ValueError``
        for a key this shard does not hold (named, with ``server``). Local."""
        try:
            return push_rows_inplace(keys, self.part.num_keys, self.part.multiplier, self.lo,
                                     self.hi, grads)
        except ValueError as e:
            raise ValueError(str(e).replace("this server", f"server {server}")) from None

    def pull_reply(self, keys: np.ndarray, server: int, pool=None) -> np.ndarray:
        """The rows of a pull's ``keys`` (int64 (n,); overwritten for a dense table) for its
        reply: one compiled pass from keys to rows for a sparse table, else local rows then
        :func:`rows_of` (a view for a block of consecutive rows). A buffer of ``pool``
        (give it back after the reply) or a view of ``w``. Local."""
        n = keys.shape[0]
        if self.part.multiplier != 1 and n > 0:
            out = pool.take((n, self.w.shape[1]), self.w.dtype) if pool is not None else \
                np.empty((n, self.w.shape[1]), dtype=self.w.dtype)
            try:
                return gather_local(keys, self.part.num_keys, self.part.multiplier, self.lo,
                                    self.hi, self.w, out,
                                    0 if n <= DIRECT_GATHER_MAX else GATHER_AHEAD)
            except ValueError as e:
                raise ValueError(str(e).replace("this server", f"server {server}")) from None
        return rows_of(self.w, self.rows_for(keys, server), pool)

    def pull_inline(self, ep, source: int, n: int, server: int) -> bool:
        """Answer a ready PULL of ``n`` keys whose keys came with the request just polled by
        ``ep`` in one compiled call (:meth:`hpcps.comm.transport.ServerEndpoint.pull_inline`):
        whether it did (else the caller takes the general path). Errors as
        :meth:`pull_reply`."""
        try:
            return ep.pull_inline(source, n, self.part.num_keys, self.part.multiplier,
                                  self.lo, self.hi, self.w, self.hdr, server)
        except ValueError as e:
            raise ValueError(str(e).replace("this server", f"server {server}")) from None

    def writing(self):
        """Context of a write that RMA readers must see whole: the window's seqlock
        publication (:meth:`hpcps.comm.rma.ShardWindow.writing`, the header's ``H_SEQ``
        word odd during the write); nothing without a window. Local."""
        if self.window is not None:
            return self.window.writing(self.hdr[H_SEQ:H_SEQ + 1])
        return contextlib.nullcontext()

    @property
    def nbytes(self) -> int:
        return self.w.nbytes + (self.slots.nbytes if self.slots is not None else 0)

    # The row operations of the request loop; :class:`hpcps.server.dynshard.DynamicShard`
    # has the same ones over a hash table, so the loop does not tell the storages apart.
    def rows_for(self, keys: np.ndarray, server: int) -> np.ndarray:
        """Local rows of a request's keys, computed in place (``keys`` is overwritten).

        Raises
        ------
        ValueError
            For a key outside the key space or another server's key range.
        """
        return self.part.local_rows(keys, server, out=keys)

    def gather(self, rows: np.ndarray, pool=None) -> np.ndarray:
        """``w[rows]`` for a reply (:func:`rows_of`: a view, or a buffer of ``pool``)."""
        return rows_of(self.w, rows, pool)

    def take(self, rows: np.ndarray, pool) -> np.ndarray:
        """``w[rows]`` gathered into a buffer of ``pool`` (give it back)."""
        return take_rows(self.w, rows, pool.take((rows.size, self.w.shape[1]), self.w.dtype))

    def apply(self, rows: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """One optimizer step on ``rows`` (duplicates summed)."""
        self.optimizer.apply(self.w, self.slots, rows, grads, scale)

    def touched(self, rows: np.ndarray) -> np.ndarray:
        """Distinct rows of an update, ascending (:func:`touched_rows`)."""
        return touched_rows(rows, self.w.shape[0])

    def whole(self, aux: int, nkeys: int, start: int) -> np.ndarray:
        """The reply to a ``PULL_SHARD``: every row of the range (``aux`` 0), or with ``aux``
        :data:`~hpcps.core.tables.PULL_SHARD_KEY_RANGE` the rows of the keys
        ``[start, start + nkeys)`` this shard holds, ascending by key (a view of ``w`` for a
        dense table, else a new array of those rows). Local.

        Raises
        ------
        ValueError
            For another ``aux``, or keys outside the table's key space (naming the table).
        """
        if aux == 0:
            return self.w
        if aux != PULL_SHARD_KEY_RANGE:
            raise ValueError(f"table {self.spec.name!r}: PULL_SHARD of a fixed table needs aux "
                             f"0 or {PULL_SHARD_KEY_RANGE}, got {aux}")
        if start < 0 or nkeys < 0 or start + nkeys > self.part.num_keys:
            raise ValueError(f"table {self.spec.name!r}: keys [{start}, {start + nkeys}) asked, "
                             f"the key space is [0, {self.part.num_keys})")
        pos = self.part.positions(np.arange(start, start + nkeys, dtype=np.int64))
        mine = pos[(pos >= self.lo) & (pos < self.hi)]
        mine -= self.lo
        return rows_of(self.w, mine)

    @property
    def n_rows(self) -> int:
        """Rows held (the key range's size)."""
        return self.hi - self.lo

    def checkpoint_entry(self, server: int) -> dict:
        """The table's entry for :func:`hpcps.checkpoint.write_shard`."""
        return dict(name=self.spec.name, rows=self.w, keys=self.part.shard_keys(server),
                    slots=self.optimizer.slots_dict(self.slots), lo=self.lo, hi=self.hi,
                    num_keys=self.spec.num_keys, multiplier=self.part.multiplier,
                    sparse=self.spec.sparse, optimizer=self.optimizer.name)


def header_and_rows(w: np.ndarray, win, nh: int):
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
        if getattr(spec, "dynamic", False):   # never in a window (refused at job check)
            out.append(header_len(n_workers) * 8)
            continue
        lo, hi = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse).shard_range(server)
        out.append(header_len(n_workers) * 8 + (hi - lo) * spec.dim * np.dtype(spec.dtype).itemsize)
    return out
