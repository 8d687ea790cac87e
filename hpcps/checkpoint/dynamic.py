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
#: the largest update count restored per row (``updates`` is uint32 and saturates there)
_UPDATES_MAX = np.iinfo(np.uint32).max

__all__ = ["STORAGE", "write_group", "is_dynamic", "owned_count", "restore",
           "write_state", "restore_state", "Owned", "find_owned", "restore_all"]


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


class Owned:
    """The keys one server owns in every old shard of a checkpoint, found by one pass that
    reads and hashes their keys (:func:`find_owned`).

    Attributes
    ----------
    server, n_servers : int
        The server and the new number of servers.
    rows : int
        Keys per block (:data:`READ_ROWS` when found).
    count : int
        Keys owned: the capacity of the table :func:`restore_all` fills.
    blocks : dict
        Shard file path -> ``(keys in its group, [(first row, keys in the block, mask)])``
        for each block holding an owned key; ``mask`` is a bit per key of the block
        (``np.packbits``, uint8 (ceil(size / 8),)), or None when every key is owned: an
        eighth of a byte per old key, so that the restore reads the keys once more but
        hashes them no more.
    """

    def __init__(self, server: int, n_servers: int, rows: int):
        self.server, self.n_servers, self.rows = int(server), int(n_servers), int(rows)
        self.count = 0
        self.blocks = {}


def find_owned(shard_files, name: str, server: int, n_servers: int) -> Owned:
    """The keys ``server`` of ``n_servers`` owns among every old shard of a checkpoint: each
    shard's keys read and hashed (:class:`~hpcps.core.dyntables.HashPartition`) once, in
    blocks of :data:`READ_ROWS` keys. ValueError for a missing group (naming the file and
    the table)."""
    own = Owned(server, n_servers, READ_ROWS)
    part = HashPartition(n_servers)
    for path, _, g in _shard_groups(shard_files, name):
        d, blocks = g["keys"], []
        for a in range(0, d.shape[0], own.rows):
            mine = part.owned(d[a:a + own.rows], server)
            m = int(np.count_nonzero(mine))
            if m:
                blocks.append((a, mine.size, None if m == mine.size else np.packbits(mine)))
                own.count += m
        own.blocks[path] = (int(d.shape[0]), blocks)
    return own


def _owned_blocks(group: h5py.Group, path, owned: Owned):
    """``(first row, end row, mask)`` for each block of one old shard's group (file
    ``path``) that :func:`find_owned` found holding a key ``owned.server`` owns (``mask``:
    bool (end - first,), those keys; None: all of them); no key read or hashed again.
    ValueError if the group's keys are not those it read."""
    d = group["keys"]
    n, blocks = owned.blocks.get(path, (-1, ()))
    if n != d.shape[0]:
        raise ValueError(f"{path}: its keys ({d.shape[0]}) are not those found owned "
                         f"by server {owned.server} of {owned.n_servers} (file replaced since?)")
    for a, size, bits in blocks:
        yield a, a + size, (None if bits is None else np.unpackbits(bits, count=size).view(bool))


def _take(ds, a: int, b: int, mask):
    """Rows ``a:b`` of dataset ``ds``, those of ``mask`` (None: all)."""
    x = ds[a:b]
    return x if mask is None else x[mask]


def owned_count(shard_files, name: str, server: int, n_servers: int) -> int:
    """How many keys ``server`` of ``n_servers`` owns among every old shard of a checkpoint
    (the capacity to give the table :func:`restore` fills, so that it never grows while
    loading). ValueError for a missing group (naming the file and the table)."""
    return find_owned(shard_files, name, server, n_servers).count


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
    return restore_all(table, shard_files, name,
                       find_owned(shard_files, name, server, n_servers))[0]


def restore_state(shard_files, name: str, server: int, n_servers: int) -> dict:
    """The admission/eviction state of ``server`` of ``n_servers`` from every old shard of
    a checkpoint, aligned with the rows :func:`restore` loads (same files, same order).

    ``updates`` (uint32 (m,); int64 counts of older checkpoints above 2^32 - 1 capped
    there) and ``last_clock`` (int64 (m,)) follow the owned keys (absent in an older
    checkpoint: None). The sketch is the old server's own when
    the server count is unchanged (exact); re-sharded, it is the element-wise sum of every
    old server's sketch (each key was counted only on its owner, so the sum never
    undercounts it: the count-min guarantee holds with ``N`` the total). The counts
    ``admitted``, ``rejected``, ``evicted`` of old server ``i`` go to new server ``i mod
    n_servers`` (totals kept).

    Raises
    ------
    ValueError
        For a missing group (the message names the file and the table).
    """
    return _restore(None, shard_files, name, find_owned(shard_files, name, server, n_servers),
                    True)[1]


def restore_all(table: HashTable, shard_files, name: str, owned: Owned) -> tuple:
    """:func:`restore` and :func:`restore_state` in one pass over the old shards: each block
    of keys that holds an owned key read once for the rows, the optimizer state and the
    update counts (a restore read and hashed every shard's keys three times: to size the
    table, for the rows and for the counts).

    Parameters
    ----------
    table : HashTable
        Empty, made with capacity ``owned.count``; rule, dim and dtype as the checkpoint's.
    shard_files : sequence of path
        The files given to :func:`find_owned`.
    name : str
        Table name.
    owned : Owned
        :func:`find_owned` of these files for the server and server count to restore.

    Returns
    -------
    loaded : int
        Keys loaded (``owned.count``).
    state : dict
        As :func:`restore_state`.

    Raises
    ------
    ValueError
        As :func:`restore`, or for a shard file whose keys differ from those ``owned``
        found.
    """
    return _restore(table, shard_files, name, owned, True)


def _restore(table, shard_files, name: str, owned: Owned, state: bool):
    """``(keys loaded, state dict or None)``: the rows into ``table`` (None: none read) and
    the state when ``state``, its per-key arrays of ``owned.count`` (``updates`` saturated
    to uint32)."""
    server, n_servers = owned.server, owned.n_servers
    if table is not None and len(table):
        raise ValueError(f"table {name!r}: restore needs an empty table, it holds {len(table)} keys")
    total, at = 0, 0
    have = dict(updates=state, last_clock=state)
    dtypes = dict(updates=np.uint32, last_clock=np.int64)
    cols = {k: None for k in have}           # None: not allocated yet
    sketch, sk_total = None, 0
    counts = dict(admitted=0, rejected=0, evicted=0)
    for path, f, g in _shard_groups(shard_files, name):
        if table is not None:
            _check(g, table, str(path), name)
        for k in have:
            have[k] = have[k] and k in g
            if not have[k]:
                cols[k] = None                  # a shard without it: None for all
            elif cols[k] is None:
                cols[k] = np.empty(owned.count, dtype=dtypes[k])
        for a, b, mine in _owned_blocks(g, path, owned):
            if table is not None:
                keys = _take(g["keys"], a, b, mine)
                try:
                    table.load(keys, _take(g["rows"], a, b, mine),
                               {s: _take(d, a, b, mine) for s, d in g["slots"].items()})
                except ValueError as e:
                    raise ValueError(f"{path}: table {name!r}: {e}") from None
                total += keys.size
            m = b - a if mine is None else int(np.count_nonzero(mine))
            for k in (k for k in have if have[k]):
                x = _take(g[k], a, b, mine)
                if k == "updates" and x.dtype != np.uint32:     # int64 before 2026-12-05
                    cols[k][at:at + m] = np.minimum(x.astype(np.int64), _UPDATES_MAX)
                else:
                    cols[k][at:at + m] = x
            at += m
        if not state:
            continue
        old, old_n = int(f.attrs.get("server", -1)), int(f.attrs.get("n_servers", -1))
        if "sketch" in g and (old_n != n_servers or old == server):
            sk = g["sketch"][()].astype(np.uint64)
            sketch = sk if sketch is None else sketch + sk
            sk_total += int(g.attrs.get("sketch_total", 0))
        if old >= 0 and old % n_servers == server:
            for k in counts:
                counts[k] += int(g.attrs.get(k, 0))
    if not state:
        return total, None
    out = {}
    for k, c in cols.items():
        if not have[k]:
            out[k] = None
        else:
            out[k] = c if at == c.size else c[:at].copy()
    if sketch is not None:
        sketch = np.minimum(sketch, np.iinfo(np.uint32).max).astype(np.uint32)
    return total, dict(out, sketch=sketch, sketch_total=sk_total, **counts)
