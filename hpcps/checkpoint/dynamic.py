"""Checkpoint groups of dynamic (hash) tables and their re-distribution (h5py, no MPI).

A dynamic table's shard is written in its shard file's ``tables/<name>`` group as::

    keys            (n,) int64              the stored keys, in arena (insertion) order
    rows            (n, dim) table dtype    their weights
    slots/<slot>    (n, dim) or (n,)        optimizer state of the same rows
                                            (accumulator; m, v, step; z, n)
    attrs           storage = "hash", dim, dtype, optimizer, n (rows stored)

Restoring on S' servers (any number, e.g. 3 -> 2 or 3 -> 4): server s' reads every old
shard's group and keeps the entries whose key it owns under
:class:`hpcps.core.dyntables.HashPartition` ``(S')`` — the same map the workers route by, so
each key lands on exactly one server with its weights and state bit-identical.

A fixed table's group (no ``storage`` attribute, or ``storage = "array"``) read as dynamic,
or the reverse, is refused with a ValueError naming the table and the file.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hpcps.core.dyntables import HashPartition
from hpcps.kernels.hashtable import HashTable

STORAGE = "hash"

__all__ = ["STORAGE", "write_group", "is_dynamic", "read_owned", "restore"]


def write_group(group: h5py.Group, table: HashTable) -> None:
    """Write the shard ``table`` into the (empty) HDF5 group ``group`` (layout above).

    Parameters
    ----------
    group : h5py.Group
        Writable; datasets ``keys``, ``rows`` and ``slots/*`` are created in it.
    table : HashTable
    """
    group.attrs["storage"] = STORAGE
    group.attrs["dim"] = table.dim
    group.attrs["dtype"] = table.dtype.name
    group.attrs["optimizer"] = table.rule
    group.attrs["n"] = len(table)
    group.create_dataset("keys", data=table.keys())
    group.create_dataset("rows", data=table.weights())
    sg = group.create_group("slots")
    for name, a in table.slots().items():
        sg.create_dataset(name, data=a)


def is_dynamic(group: h5py.Group) -> bool:
    """True when ``group`` holds a dynamic table's shard."""
    return group.attrs.get("storage", "array") == STORAGE


def _check(group: h5py.Group, table: HashTable, where: str, name: str) -> None:
    if not is_dynamic(group):
        raise ValueError(f"{where}: table {name!r} was checkpointed as a fixed table "
                         f"(storage 'array') but the job declares it dynamic "
                         f"(storage 'hash'); restore it with the storage it was trained with")
    dim, dtype, rule = int(group.attrs["dim"]), str(group.attrs["dtype"]), str(group.attrs["optimizer"])
    if (dim, dtype, rule) != (table.dim, table.dtype.name, table.rule):
        raise ValueError(f"{where}: table {name!r} has dim {dim}, dtype {dtype}, optimizer "
                         f"{rule} in the checkpoint but dim {table.dim}, dtype "
                         f"{table.dtype.name}, optimizer {table.rule} in the job")


def read_owned(group: h5py.Group, server: int, n_servers: int):
    """The entries of one old shard's group that ``server`` of ``n_servers`` owns.

    Returns
    -------
    keys : int64 (m,)
    rows : (m, dim)
    slots : dict of slot name -> (m, ...) arrays
    """
    keys = group["keys"][()]
    mine = HashPartition(n_servers).owned(keys, server)
    slots = {s: d[()][mine] for s, d in group["slots"].items()}
    return keys[mine], group["rows"][()][mine], slots


def restore(table: HashTable, shard_files, name: str, server: int, n_servers: int) -> int:
    """Load into the empty ``table`` the keys ``server`` owns among all old shards.

    Parameters
    ----------
    table : HashTable
        Empty; its rule, dim and dtype must match the checkpoint's.
    shard_files : sequence of path
        Every shard file of the checkpoint (``shard-SSSS.h5``), any number of servers.
    name : str
        Table name (group ``tables/<name>``).
    server, n_servers : int
        This server and the new number of servers.

    Returns
    -------
    int
        Keys loaded.

    Raises
    ------
    ValueError
        For a fixed table's group, another rule/dim/dtype, a missing group, or a key found
        in two shards (the message names the file and the table).
    """
    if len(table):
        raise ValueError(f"table {name!r}: restore needs an empty table, it holds {len(table)} keys")
    total = 0
    for path in sorted(Path(p) for p in shard_files):
        with h5py.File(path, "r") as f:
            g = f.get(f"tables/{name}")
            if g is None:
                raise ValueError(f"{path}: no group tables/{name}")
            _check(g, table, str(path), name)
            keys, rows, slots = read_owned(g, server, n_servers)
        try:
            table.load(keys, rows, slots)
        except ValueError as e:
            raise ValueError(f"{path}: table {name!r}: {e}") from None
        total += keys.size
    return total
