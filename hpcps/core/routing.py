"""The key -> key range map of every table of a job (no MPI): the arithmetic that
:class:`hpcps.comm.membership.Membership` uses to route a request.

A job's tables are cut into ``n_ranges`` key ranges, one per server of the launch; the
number never changes while the job runs (added workers add no server, and after a server
loss another server holds the lost range: the range -> rank map changes, the key -> range
map does not). Per table:

* a fixed table (``storage = "array"``): :class:`hpcps.core.tables.KeyPartition` —
  ``range(k) = ((k * A) mod num_keys) // ceil(num_keys / n_ranges)`` (dense tables: A = 1);
* a dynamic table (``storage = "hash"``): :class:`hpcps.core.dyntables.HashPartition` —
  ``range(k) = floor(splitmix64(k) * n_ranges / 2**64)``.

Which rank holds range ``r`` is the membership's (``Membership.range_ranks[r]``).
"""

from __future__ import annotations

import numpy as np

from hpcps.core.dyntables import HashPartition
from hpcps.core.tables import KeyPartition, TableSpec
from hpcps.kernels.keys import group_order, route_split

__all__ = ["partition_of", "Routing"]


def partition_of(spec: TableSpec, n_ranges: int):
    """The key -> range map of table ``spec`` over ``n_ranges`` ranges: a
    :class:`~hpcps.core.tables.KeyPartition` (fixed tables) or a
    :class:`~hpcps.core.dyntables.HashPartition` (dynamic tables). Local.

    Raises
    ------
    ValueError
        If ``n_ranges`` < 1.
    """
    if spec.dynamic:
        return HashPartition(n_ranges, num_keys=spec.num_keys, name=spec.name)
    return KeyPartition(spec.num_keys, n_ranges, permute=spec.sparse)


class Routing:
    """The key -> range maps of a job's tables (module docstring).

    Parameters
    ----------
    specs : list of TableSpec
        In table-id order, identical on every rank.
    n_ranges : int
        Key ranges (the servers of the launch).
    """

    def __init__(self, specs, n_ranges: int):
        self.specs = list(specs)
        self.n_ranges = int(n_ranges)
        self.ids = {s.name: i for i, s in enumerate(self.specs)}
        self.parts = [partition_of(s, self.n_ranges) for s in self.specs]

    def table(self, table) -> tuple[int, TableSpec, object]:
        """``(table id, spec, partition)`` of ``table`` (name or id).

        Raises
        ------
        KeyError
            For an unknown table (the message lists the tables).
        """
        try:
            tid = self.ids[table] if isinstance(table, str) else int(table)
            return tid, self.specs[tid], self.parts[tid]
        except (KeyError, IndexError):
            raise KeyError(f"unknown table {table!r}; tables: {', '.join(self.ids)}") from None

    def route(self, table, keys):
        """Range of each key in one pass: ``(ranges, counts, grouped)`` — ``ranges`` int64
        ``(n,)`` (None with one range), ``counts`` keys per range (int64 ``(n_ranges,)``),
        ``grouped`` True when ``ranges`` is non-decreasing.

        Raises
        ------
        KeyError
            For an unknown table.
        ValueError
            For a key outside the table's key space (the message names the key).
        """
        return self.table(table)[2].route(keys)

    def group(self, table, keys):
        """Group ``keys`` (int64 ``(n,)``) by range: ``(order, bounds)`` —
        ``order[bounds[r]:bounds[r+1]]`` are the positions of range ``r``'s keys (stable), and
        ``order`` is None when the keys are grouped already (always with one range, and for
        ascending key blocks of a dense table), which spares the caller a reordering copy.
        One pass over the keys. Errors as :meth:`route`."""
        srv, counts, grouped = self.route(table, keys)
        bounds = np.zeros(self.n_ranges + 1, dtype=np.int64)
        counts.cumsum(out=bounds[1:])   # the method: np.cumsum's Python wrapper cost more
        if grouped:
            return None, bounds
        return group_order(srv, bounds), bounds

    def split(self, table, keys, values=None):
        """``keys`` (int64 ``(n,)``, C-contiguous) and the rows of ``values`` (``(n, ...)``
        or None) grouped by range: ``(keys_g, values_g, bounds, order)`` — ``keys`` and
        ``values`` themselves with ``order`` None when grouped already, else new arrays
        with ``keys_g == keys[order]`` (a fixed table's in one compiled pass,
        :func:`hpcps.kernels.keys.route_split`). Errors as :meth:`route`."""
        part = self.table(table)[2]
        if self.n_ranges == 1:
            part.route(keys)                  # the keys checked (a bad one named)
            return keys, values, np.array((0, keys.shape[0]), dtype=np.int64), None
        if isinstance(part, KeyPartition):
            return route_split(keys, values, part.num_keys, part.multiplier, part.range_size,
                               part.n_servers)
        order, bounds = self.group(table, keys)
        if order is None:
            return keys, values, bounds, None
        return keys[order], (None if values is None else values[order]), bounds, order

    def shard_range(self, table, r: int) -> tuple[int, int]:
        """Permuted positions ``[lo, hi)`` of range ``r`` of a fixed table."""
        return self.table(table)[2].shard_range(r)
