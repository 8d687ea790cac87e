"""A server's part of a dynamic (hash) table: :class:`DynamicShard`, the same row
operations as :class:`hpcps.server.shard.Shard` over a
:class:`hpcps.kernels.hashtable.HashTable` instead of a fixed array. Local; no MPI.

The server's request loop does not tell the two apart: it turns a request's keys into
"rows" (:meth:`DynamicShard.rows_for`: for a hash table, the keys themselves), answers
pulls with :meth:`gather` (an absent key gets the table's initial value and is not
inserted), applies pushes with :meth:`apply` (absent keys are inserted, duplicate keys
summed in input order) and checkpoints with :meth:`checkpoint_entry`.
"""

from __future__ import annotations

import numpy as np

from hpcps.core.dyntables import HashPartition, new_shard

__all__ = ["DynamicShard", "peak_rss", "PULL_SHARD_COUNT", "PULL_SHARD_KEYS", "PULL_SHARD_ROWS"]

#: ``PULL_SHARD`` of a dynamic table, by its header's ``aux``: the number of keys stored
#: (int64 (1,)), then the first ``nkeys`` keys (int64), then their rows (``(nkeys, dim)``).
PULL_SHARD_COUNT, PULL_SHARD_KEYS, PULL_SHARD_ROWS = 1, 2, 3


class DynamicShard:
    """One server's keys of a dynamic table.

    Parameters
    ----------
    spec : hpcps.core.tables.TableSpec
        ``spec.dynamic`` is True; ``spec.num_keys`` bounds the ids (``[0, num_keys)``).
    optimizer : hpcps.core.optim.Optimizer
    index, n_servers : int
        This server and the number of servers (keys are routed by
        :class:`hpcps.core.dyntables.HashPartition` ``(n_servers)``).
    table : hpcps.kernels.hashtable.HashTable
    hdr : int64 ndarray
        The shard's clock header (:mod:`hpcps.core.consistency`).
    """

    window = None          # never in an RMA window (refused at job-file check)
    lo = hi = 0            # no key range
    w = None               # no row array (header_and_rows(None, None, nh) resizes the header)

    def __init__(self, spec, optimizer, index: int, n_servers: int, table, hdr):
        self.spec = spec
        self.optimizer = optimizer
        self.index = int(index)
        self.part = HashPartition(n_servers)
        self.table = table
        self.hdr = hdr
        self.slots = None

    @classmethod
    def create(cls, spec, optimizer, index: int, n_servers: int, seed: int, nh: int,
               restore=None) -> "DynamicShard":
        """An empty shard, or the keys server ``index`` owns in checkpoint ``restore``
        (``(directory, manifest, ...)``, taken on any number of servers). Local (reads HDF5).

        Raises
        ------
        hpcps.checkpoint.CheckpointError
            If the checkpoint holds the table as a fixed table, with another rule, dim or
            dtype, or a key twice (the message names the table and the file).
        """
        table = new_shard(spec, optimizer, seed)
        if restore is not None:
            from pathlib import Path

            from hpcps.checkpoint.dynamic import restore as restore_keys
            from hpcps.checkpoint.layout import CheckpointError

            directory, manifest = restore[0], restore[1]
            files = [Path(directory) / f for f in manifest["shards"]["files"]]
            try:
                restore_keys(table, files, spec.name, index, n_servers)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        return cls(spec, optimizer, index, n_servers, table, np.zeros(nh, dtype=np.int64))

    def writing(self):
        import contextlib

        return contextlib.nullcontext()

    # ---------------------------------------------------------------- request rows
    def rows_for(self, keys: np.ndarray, server: int) -> np.ndarray:
        """The keys of a request, checked: each must be routed to ``server`` (int64 (n,)).

        Raises
        ------
        ValueError
            For a key another server owns (a worker routed it with another server count).
        """
        if self.part.n_servers > 1 and keys.size:
            bad = self.part.server_of(keys) != server
            if bad.any():
                k = int(keys[np.argmax(bad)])
                raise ValueError(f"table {self.spec.name!r}: key {k} belongs to server "
                                 f"{int(self.part.server_of(np.array([k]))[0])}, not {server}")
        return keys

    def gather(self, keys: np.ndarray, pool=None) -> np.ndarray:
        """Rows of ``keys`` (absent: the initial value, not inserted), ``(n, dim)``, in a
        buffer of ``pool`` when given (give it back after the reply)."""
        out = pool.take((keys.size, self.spec.dim), self.table.dtype) if pool is not None \
            else None
        return self.table.gather(keys, out=out)

    take = gather

    def apply(self, keys: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """One optimizer step: absent keys inserted at their initial value, gradients of
        equal keys summed in input order, scaled by ``scale``."""
        self.table.apply(keys, np.ascontiguousarray(grads), scale)

    def touched(self, keys: np.ndarray) -> np.ndarray:
        """Distinct keys of an update (ascending)."""
        return np.unique(keys)

    def whole(self, h, aux: int, nkeys: int) -> np.ndarray:
        """The reply to a ``PULL_SHARD``: the count, keys or rows (``aux``, see
        :data:`PULL_SHARD_COUNT`) of the first ``nkeys`` keys stored (arena order: keys
        are only ever appended)."""
        if aux == PULL_SHARD_COUNT:
            return np.array([len(self.table)], dtype=np.int64)
        if aux == PULL_SHARD_KEYS:
            return self.table.keys()[:nkeys]
        if aux == PULL_SHARD_ROWS:
            return np.ascontiguousarray(self.table.weights()[:nkeys])
        raise ValueError(f"table {self.spec.name!r}: PULL_SHARD of a dynamic table needs aux "
                         f"1, 2 or 3, got {aux}")

    # ---------------------------------------------------------------- reports
    @property
    def n_rows(self) -> int:
        """Keys stored."""
        return len(self.table)

    @property
    def nbytes(self) -> int:
        """Bytes of the table's index and arena."""
        return int(self.table.nbytes)

    def checkpoint_entry(self, server: int) -> dict:
        """The table's entry for :func:`hpcps.checkpoint.write_shard` (a dynamic group)."""
        return dict(name=self.spec.name, dynamic=self.table, num_keys=self.spec.num_keys,
                    sparse=True, optimizer=self.optimizer.name)


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``getrusage`` ``ru_maxrss``, KiB on
    Linux). Local."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
