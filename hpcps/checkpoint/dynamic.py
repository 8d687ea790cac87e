"""Checkpoint groups of dynamic (hash) tables and their re-distribution (h5py, no MPI).

A dynamic table's shard is written in its shard file's ``tables/<name>`` group as::

    keys            (n,) int64              the stored keys, in arena (insertion) order
    rows            (n, dim) table dtype    their weights
    slots/<slot>    (n, dim) or (n,)        optimizer state of the same rows
                                            (accumulator; m, v, step; z, n)
    updates         (n,) uint32             per row: updates applied (hot keys, LFU;
                                            int64 in checkpoints before 2026-12-05)
    last_clock      (n,) int64              per row: clock of its last update (TTL; only
                                            with ttl_steps)
    sketch          (depth, width) uint32   admission's count-min sketch (min_count > 1)
    attrs           storage = "hash", dim, dtype, optimizer, n (rows stored),
                    admitted, rejected, evicted, sketch_total

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
#: rows of a dynamic table written per block in a checkpoint (:func:`write_group`)
WRITE_ROWS = 1 << 20
#: Keys of an old shard read at a time by a restore (its keys, rows and slots): a server's
#: restore read every shard's arrays whole and raised its peak memory by ~40 % over training
#: (a trial at 5.6 M keys per server, 2026-12-05)
READ_ROWS = 1 << 20

__all__ = ["STORAGE", "write_group", "is_dynamic", "read_owned", "owned_count", "restore",
           "write_state", "restore_state"]


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
    n, dim = len(table), int(table.dim)
    group.create_dataset("keys", data=table.keys())
    # the rows and the optimizer state straight from the arena in blocks of WRITE_ROWS: a
    # whole copy of each (the weights(), slots() arrays) added their size to a server's peak
    # memory at every checkpoint (a trial at 32.7 M keys: peak RSS 3.4 GB, steady 2.1-2.4)
    fields = {"rows": "w", **{f"slots/{s}": s for s in table.slot_names}}
    group.create_group("slots")
    out = {}
    for ds, field in fields.items():
        shape = (n,) if field == "step" else (n, dim)
        out[ds] = group.create_dataset(ds, shape=shape, dtype=table.record_dtype[field].base)
    for a in range(0, n, WRITE_ROWS):
        recs = table._records(a, min(n, a + WRITE_ROWS))
        for ds, field in fields.items():
            out[ds][a:a + recs.shape[0]] = np.ascontiguousarray(recs[field])


def write_state(group: h5py.Group, state: dict) -> None:
    """Write a shard's admission/eviction state beside its keys (layout above): ``updates``
    (uint32 (n,)) and ``last_clock`` (int64 (n,); TTL only), per stored row in arena order,
    the count-min sketch
    ``sketch`` (uint32 (depth, width), attribute ``sketch_total``) when admission is on,
    and the counts ``admitted``, ``rejected``, ``evicted`` as attributes. Missing entries
    are not written."""
    for k, dtype in (("updates", np.uint32), ("last_clock", np.int64)):
        if state.get(k) is not None:
            group.create_dataset(k, data=np.asarray(state[k], dtype=dtype))
    if state.get("sketch") is not None:
        group.create_dataset("sketch", data=np.asarray(state["sketch"], dtype=np.uint32))
        group.attrs["sketch_total"] = int(state["sketch_total"])
    for k in ("admitted", "rejected", "evicted"):
        if state.get(k) is not None:
            group.attrs[k] = int(state[k])


def restore_state(shard_files, name: str, server: int, n_servers: int) -> dict:
    """The admission/eviction state of ``server`` of ``n_servers`` from every old shard of
    a checkpoint, aligned with the rows :func:`restore` loads (same files, same order).

    ``updates`` and ``last_clock`` (int64 (m,)) follow the owned keys (absent in an older
    checkpoint: None). The sketch is the old server's own when the server count is
    unchanged (exact); re-sharded, it is the element-wise sum of every old server's sketch
    (each key was counted only on its owner, so the sum never undercounts it: the
    count-min guarantee holds with ``N`` the total). The counts ``admitted``, ``rejected``,
    ``evicted`` of old server ``i`` go to new server ``i mod n_servers`` (totals kept).

    Raises
    ------
    ValueError
        For a missing group (the message names the file and the table).
    """
    ups, lasts, have_up, have_last = [], [], True, True
    sketch, total = None, 0
    counts = dict(admitted=0, rejected=0, evicted=0)
    for _, f, g in _shard_groups(shard_files, name):
        old, old_n = int(f.attrs.get("server", -1)), int(f.attrs.get("n_servers", -1))
        have_up, have_last = have_up and "updates" in g, have_last and "last_clock" in g
        for a, mine in _owned_blocks(g, server, n_servers):
            b = a + mine.size
            if have_up:
                ups.append(g["updates"][a:b][mine])
            if have_last:
                lasts.append(g["last_clock"][a:b][mine])
        if "sketch" in g and (old_n != n_servers or old == server):
            sk = g["sketch"][()].astype(np.uint64)
            sketch = sk if sketch is None else sketch + sk
            total += int(g.attrs.get("sketch_total", 0))
        if old >= 0 and old % n_servers == server:
            for k in counts:
                counts[k] += int(g.attrs.get(k, 0))
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
    if sketch is not None:
        sketch = np.minimum(sketch, np.iinfo(np.uint32).max).astype(np.uint32)
    return dict(updates=cat(ups) if have_up else None,
                last_clock=cat(lasts) if have_last else None,
                sketch=sketch, sketch_total=total, **counts)


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


def _shard_groups(shard_files, name: str):
    """``(path, file, group)`` of table ``name`` in every shard file, in name order (each
    file open while its group is used). ValueError naming the file for a missing group."""
    for path in sorted(Path(p) for p in shard_files):
        with h5py.File(path, "r") as f:
            g = f.get(f"tables/{name}")
            if g is None:
                raise ValueError(f"{path}: no group tables/{name}")
            yield path, f, g


def _owned_blocks(group: h5py.Group, server: int, n_servers: int):
    """``(first row, mask)`` for each block of ``READ_ROWS`` keys of one old shard's group
    that holds a key ``server`` of ``n_servers`` owns (``mask``: those keys)."""
    d = group["keys"]
    part = HashPartition(n_servers)
    for a in range(0, d.shape[0], READ_ROWS):
        mine = part.owned(d[a:a + READ_ROWS], server)
        if mine.any():
            yield a, mine


def read_owned(group: h5py.Group, server: int, n_servers: int):
    """The entries of one old shard's group that ``server`` of ``n_servers`` owns, block by
    block (``READ_ROWS`` keys: never a whole shard's arrays, nor a foreign shard's rows).

    Yields
    ------
    keys : int64 (m,)
    rows : (m, dim)
    slots : dict of slot name -> (m, ...) arrays
    """
    for a, mine in _owned_blocks(group, server, n_servers):
        b = a + mine.size
        yield (group["keys"][a:b][mine], group["rows"][a:b][mine],
               {s: d[a:b][mine] for s, d in group["slots"].items()})


def owned_count(shard_files, name: str, server: int, n_servers: int) -> int:
    """How many keys ``server`` of ``n_servers`` owns among every old shard of a checkpoint
    (the capacity to give the table :func:`restore` fills, so that it never grows while
    loading). ValueError for a missing group (naming the file and the table)."""
    return sum(int(m.sum()) for _, _, g in _shard_groups(shard_files, name)
               for _, m in _owned_blocks(g, server, n_servers))


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
    for path, _, g in _shard_groups(shard_files, name):
        _check(g, table, str(path), name)
        for keys, rows, slots in read_owned(g, server, n_servers):
            try:
                table.load(keys, rows, slots)
            except ValueError as e:
                raise ValueError(f"{path}: table {name!r}: {e}") from None
            total += keys.size
    return total
