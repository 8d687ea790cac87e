"""Dynamic (hash) tables: their key -> server map and a server's shard (no MPI).

A *dynamic* sparse table has no key space: its keys are any 64-bit ids, and each server
holds only the rows of the keys pushed to it, in a :class:`hpcps.kernels.hashtable.HashTable`
(memory proportional to the keys stored; bytes per key: :func:`bytes_per_key`).

Key -> server: ``server(k) = floor(splitmix64(k) * S / 2**64)``
(:func:`hpcps.kernels.hashtable.server_of`) — a hash of the key, not a modulo of a key
space, so consecutive, strided or hot low ids spread over the servers, and a key's server
depends on ``S`` alone: a checkpoint taken on S servers is re-distributed to S' servers by
the same formula (:func:`hpcps.checkpoint.dynamic`).

Semantics (as fixed tables): a pull of an absent key returns the table's initial value
(zeros, or :meth:`hpcps.core.tables.TableSpec.initial_rows` — the per-key draw of fixed
tables) without inserting it; a push inserts it at that value and then applies the update,
so a dynamic shard gives bitwise the weights a fixed shard gives for the same pushes.
"""

from __future__ import annotations

import numpy as np

from hpcps.core.optim import Optimizer
from hpcps.core.errors import DataError
from hpcps.core.tables import TableSpec
from hpcps.kernels.keys import group_order
from hpcps.kernels.hashtable import (INDEX_GROWTH, INDEX_SLOT_BYTES, MAX_LOAD_DEFAULT, HashTable,
                                     record_layout, server_of)

__all__ = ["HashPartition", "new_shard", "bytes_per_key", "merge_sorted"]


class HashPartition:
    """The key -> server map of a dynamic table over ``n_servers`` servers.

    Offers the part of :class:`hpcps.core.tables.KeyPartition`'s interface that routes
    keys (``n_servers``, :meth:`server_of`, :meth:`route`, :meth:`split`); there are no key
    ranges or local rows (a server finds a key's row in its hash table).

    Parameters
    ----------
    n_servers : int
        Number of servers (>= 1).
    num_keys : int or None
        The table's id bound: :meth:`route` refuses a key outside ``[0, num_keys)`` (None:
        any 64-bit key).
    name : str
        The table's name (in messages).

    Raises
    ------
    ValueError
        If ``n_servers`` < 1.
    """

    def __init__(self, n_servers: int, num_keys: int | None = None, name: str = "?"):
        if int(n_servers) < 1:
            raise ValueError(f"n_servers must be >= 1, got {n_servers}")
        self.n_servers = int(n_servers)
        self.num_keys = None if num_keys is None else int(num_keys)
        self.name = name

    def check(self, keys: np.ndarray) -> None:
        """Raise :class:`hpcps.core.errors.DataError` (a ``ValueError``) naming the table and the
        key when a key is outside ``[0, num_keys)`` (the declared id type: non-negative ids
        below the bound). A ``DataError`` ends the job with exit status 65, which ``hpcps
        run --max-restarts`` does not relaunch (the same keys would fail the same way)."""
        if self.num_keys is None or not keys.size:
            return
        lo, hi = keys.min(), keys.max()
        if lo < 0 or hi >= self.num_keys:
            bad = int(lo) if lo < 0 else int(hi)
            raise DataError(f"table {self.name!r}: key {bad} is outside its id space "
                             f"[0, {self.num_keys}) (dynamic table: non-negative int64 ids"
                             f"{' below n_features' if self.num_keys < (1 << 63) - 1 else ''})")

    def server_of(self, keys) -> np.ndarray:
        """Server of each key, int64 (n,); keys int64 or uint64 (reinterpreted bitwise)."""
        return server_of(keys, self.n_servers)

    def route(self, keys):
        """``(servers, counts, grouped)`` as :meth:`KeyPartition.route`: ``servers`` int64
        (n,) (None with one server), ``counts`` keys per server (int64 (n_servers,)),
        ``grouped`` True when ``servers`` is non-decreasing.

        Raises
        ------
        hpcps.core.errors.DataError
            For a key outside ``[0, num_keys)`` (:meth:`check`)."""
        keys = np.asarray(keys)
        self.check(keys)
        if self.n_servers == 1:
            return None, np.array([keys.size], dtype=np.int64), True
        srv = self.server_of(keys)
        counts = np.bincount(srv, minlength=self.n_servers).astype(np.int64)
        grouped = bool(srv.size < 2 or np.all(srv[1:] >= srv[:-1]))
        return srv, counts, grouped

    def split(self, keys):
        """Group ``keys`` by server: ``(order, bounds)`` — ``order[bounds[s]:bounds[s+1]]``
        are the positions of the keys of server s, in input order (stable)."""
        srv = self.server_of(keys)
        bounds = np.zeros(self.n_servers + 1, dtype=np.int64)
        np.cumsum(np.bincount(srv, minlength=self.n_servers), out=bounds[1:])
        return group_order(srv, bounds), bounds

    def owned(self, keys, server: int) -> np.ndarray:
        """Boolean mask (n,): the keys that belong to ``server``."""
        return self.server_of(keys) == int(server)


def new_shard(spec: TableSpec, optimizer: Optimizer, seed: int, capacity: int = 0) -> HashTable:
    """An empty dynamic shard of table ``spec`` updated by ``optimizer``.

    Parameters
    ----------
    spec : TableSpec
        ``dim``, ``dtype`` and ``init_std`` are used; ``num_keys`` is not (any 64-bit key).
    optimizer : Optimizer
        The rule and hyper-parameters (its ``l2``, AdaGrad's ``initial_accumulator``,
        FTRL's ``beta``/``lambda1``/``lambda2`` for the ``z`` of a randomly initialised row).
    seed : int
        The job seed of :meth:`TableSpec.initial_rows` (used when ``init_std`` > 0).
    capacity : int
        Keys to make room for up front.

    Returns
    -------
    HashTable
    """
    o = optimizer
    init = None
    if spec.init_std > 0:
        def init(keys, _spec=spec, _seed=int(seed)):
            return _spec.initial_rows(keys, _seed)
    return HashTable(spec.dim, spec.dtype, o.name, lr=o.learning_rate, l2=o.l2, eps=o.eps,
                     beta1=o.beta1, beta2=o.beta2, beta=o.beta, lambda1=o.lambda1,
                     lambda2=o.lambda2,
                     initial_accumulator=o.initial_accumulator if o.name == "adagrad" else 0.0,
                     init=init, capacity=capacity)


def bytes_per_key(rule: str, dim: int, dtype) -> dict:
    """Memory per stored key of a dynamic table.

    Returns
    -------
    dict
        ``minimum``: key + row + optimizer state (8 + dim*T + state bytes, the arithmetic
        minimum); ``record``: the arena record (row and state, padded); ``low``/``high``:
        record + the index's 12.8 B per slot (a 64-byte bucket of 5 keys and rows) at its
        highest (``MAX_LOAD_DEFAULT``, 0.75) and lowest (0.75 / ``INDEX_GROWTH`` = 0.6) load.
    """
    rec, minimum = record_layout(rule, dim, dtype)
    per_slot, top = INDEX_SLOT_BYTES, MAX_LOAD_DEFAULT
    return {"minimum": minimum, "record": rec.itemsize,
            "low": rec.itemsize + per_slot / top,
            "high": rec.itemsize + per_slot * INDEX_GROWTH / top}


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
