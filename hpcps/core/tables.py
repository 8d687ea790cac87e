"""Parameter tables and the key → server map (no MPI).

A table has ``num_keys`` rows of ``dim`` values. Its key space ``[0, num_keys)`` is first
permuted by a bijection, then cut into one contiguous *key range* per server:

    p(k)      = (k * A) mod num_keys        A = :func:`choose_multiplier`; A = 1 for dense tables
    R         = ceil(num_keys / n_servers)
    server(k) = p(k) // R                   local row = p(k) - server(k) * R

A sparse table's multiplier ``A`` is coprime with ``num_keys`` and near ``num_keys / φ``
(golden-ratio multiplicative hashing, Knuth TAOCP vol. 3 §6.4), so neighbouring keys —
one-hot features, low ids, which are often the frequent ones — land on different servers
instead of piling onto the first. The inverse map uses ``A⁻¹ mod num_keys``, so a shard's
rows can be written out in original key order. Dense tables (``permute=False``) keep key
order so that each server holds one contiguous block of rows.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from hpcps.kernels.keys import (choose_multiplier, group_order, inverse_multiplier, local_rows_into, permute_keys,
                          route_keys)


# ``PULL_SHARD`` requests (hpcps.comm.transport), by their header's ``aux``: the whole shard
# of a fixed table (0); for a dynamic table the number of keys stored (int64 (1,)), the first
# ``n_keys`` keys in arena order, their rows (1, 2, 3; hpcps.worker.client.PSClient.pull_keys_rows);
# and, for the final model written chunk by chunk (hpcps.worker.export):
#: dynamic table: ``n_keys`` keys from position ``seq`` of the shard's keys in ascending
#: order, and their rows (the reply: rows, then the keys where a pull sends its clock header)
PULL_SHARD_SORTED = 4
#: fixed table: the rows of the keys ``[seq, seq + n_keys)`` the shard holds, ascending by key
PULL_SHARD_KEY_RANGE = 5

@dataclass(frozen=True)
class TableSpec:
    """Declaration of one parameter table.

    Attributes
    ----------
    name : str
        Table name (the dataset name in model and checkpoint files).
    num_keys : int
        Number of rows; keys are int64 in ``[0, num_keys)``.
    dim : int
        Values per row.
    dtype : str
        ``"float32"`` or ``"float64"``.
    sparse : bool
        Sparse tables are pulled/pushed by keys and use a permuted key space; dense tables
        keep key order.
    init_std : float
        Rows start as N(0, init_std²) (``0`` = zeros), drawn per key by
        :meth:`initial_rows` — the same values on any number of servers.
    storage : str
        ``"array"`` (a fixed array over ``[0, num_keys)``, :class:`KeyPartition`) or
        ``"hash"`` (sparse only: a dynamic table holding only the keys pushed, spread by
        :class:`hpcps.core.dyntables.HashPartition`; ``num_keys`` is then the id bound).
    min_count : int
        Dynamic tables: a key is admitted (stored) at its ``min_count``-th push, counted in
        a count-min sketch (:class:`hpcps.server.dynshard.Admission`); 0 = every key.
    ttl_steps : int
        Dynamic tables: a row not updated for more than ``ttl_steps`` clocks is evicted
        (0 = never).
    max_keys : int
        Dynamic tables: keys per server at most (0 = no bound); beyond it, ``evict``.
    evict : str
        ``"none"`` (exceeding ``max_keys`` is an error naming the table) or ``"lfu"`` (the
        least-frequently updated rows are evicted down to ``max_keys``).
    """

    name: str
    num_keys: int
    dim: int = 1
    dtype: str = "float32"
    sparse: bool = True
    init_std: float = 0.0
    storage: str = "array"
    min_count: int = 0
    ttl_steps: int = 0
    max_keys: int = 0
    evict: str = "none"

    @property
    def dynamic(self) -> bool:
        """True for a dynamic (hash) table."""
        return self.storage == "hash"

    def __post_init__(self):
        if self.storage not in ("array", "hash"):
            raise ValueError(f"table {self.name!r}: storage must be 'array' or 'hash', got "
                             f"{self.storage!r}")
        if self.storage == "hash" and not self.sparse:
            raise ValueError(f"table {self.name!r} is dense (pulled whole, in key order): "
                             "it cannot be a dynamic table (storage 'hash')")
        if self.num_keys < 1 or self.dim < 1:
            raise ValueError(f"table {self.name!r}: num_keys and dim must be >= 1, "
                             f"got {self.num_keys} and {self.dim}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"table {self.name!r}: dtype must be float32 or float64, got {self.dtype!r}")
        if not (self.init_std >= 0 and np.isfinite(self.init_std)):
            raise ValueError(f"table {self.name!r}: init_std must be finite and >= 0, got "
                             f"{self.init_std}")

    def initial_rows(self, keys, seed: int) -> np.ndarray:
        """Initial values of the rows ``keys``: zeros, or N(0, init_std²) drawn per key.

        Row ``k`` depends only on ``(seed, name, k)`` — not on which server holds it, how many
        servers there are, or which other keys are asked for — so a job starts from the same
        weights on any number of servers. Each key seeds its own SplitMix64 stream (Steele,
        Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) from
        ``seed``, the CRC-32 of the table name and ``k``; its first ``2*dim`` outputs give
        ``dim`` normals by the Box–Muller transform (Box & Muller, Ann. Math. Stat. 1958).

        Parameters
        ----------
        keys : int array-like (n,)
            Keys in ``[0, num_keys)``, any order, duplicates allowed.
        seed : int
            The job seed (taken modulo 2**64).

        Returns
        -------
        ndarray (n, dim) of the table's dtype
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        out = np.zeros((keys.size, self.dim), dtype=self.dtype)
        if self.init_std == 0 or keys.size == 0:
            return out
        base = _splitmix_mix(np.array([int(seed) % (1 << 64)], dtype=np.uint64) * _GOLDEN
                             + np.uint64(zlib.crc32(self.name.encode())))
        chunk = max(1, (1 << 18) // self.dim)
        steps = np.arange(1, 2 * self.dim + 1, dtype=np.uint64) * _GOLDEN    # (2*dim,)
        for lo in range(0, keys.size, chunk):
            k = keys[lo:lo + chunk].astype(np.uint64)
            state = _splitmix_mix(base ^ _splitmix_mix(k + _GOLDEN))          # one stream per key
            bits = _splitmix_mix(state[:, None] + steps[None, :]) >> np.uint64(11)   # 53 bits
            u1 = (bits[:, 0::2] + np.uint64(1)) * 2.0**-53                   # (0, 1]
            u2 = bits[:, 1::2] * 2.0**-53                                    # [0, 1)
            z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
            out[lo:lo + chunk] = z * self.init_std
        return out


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix_mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (wrapping arithmetic, new array)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class KeyPartition:
    """The key → server map of one table over ``n_servers`` servers (see module docstring).

    Parameters
    ----------
    num_keys : int
        Size of the key space.
    n_servers : int
        Number of servers (≥ 1).
    permute : bool
        Permute the key space first (sparse tables) or not (dense tables).
    """

    def __init__(self, num_keys: int, n_servers: int, permute: bool = True):
        if n_servers < 1:
            raise ValueError(f"n_servers must be >= 1, got {n_servers}")
        self.num_keys = int(num_keys)
        self.n_servers = int(n_servers)
        self.multiplier = choose_multiplier(self.num_keys) if permute else 1
        self.inverse = inverse_multiplier(self.num_keys, self.multiplier)
        self.range_size = -(-self.num_keys // self.n_servers)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Permuted positions ``p(k)``, int64, same shape as ``keys``.

        Raises
        ------
        ValueError
            For a key outside ``[0, num_keys)`` (the message names the key).
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if self.multiplier == 1:
            if keys.size and (keys.min() < 0 or keys.max() >= self.num_keys):
                bad = keys[(keys < 0) | (keys >= self.num_keys)][0]
                raise ValueError(f"key {bad} is outside the key space [0, {self.num_keys})")
            return keys
        return permute_keys(keys, self.num_keys, self.multiplier)

    def shard_range(self, server: int) -> tuple[int, int]:
        """Permuted positions ``[lo, hi)`` owned by ``server`` (may be empty)."""
        lo = min(server * self.range_size, self.num_keys)
        hi = min(lo + self.range_size, self.num_keys)
        return lo, hi

    def server_of(self, keys: np.ndarray) -> np.ndarray:
        """Server index of each key, int64."""
        return self.positions(keys) // self.range_size

    def route(self, keys: np.ndarray):
        """Server of each key in one pass (no temporary positions): ``(servers, counts,
        grouped)`` — ``servers`` int64 (n,) or None with one server, ``counts`` keys per
        server (int64 (n_servers,)), ``grouped`` True when ``servers`` is non-decreasing.

        Raises
        ------
        ValueError
            For a key outside ``[0, num_keys)`` (the message names the key).
        """
        return route_keys(keys, self.num_keys, self.multiplier, self.range_size, self.n_servers)

    def split(self, keys: np.ndarray):
        """Group ``keys`` by server.

        Returns
        -------
        order : int64 ndarray (n,)
            Permutation of ``range(n)`` that sorts the request by server (stable).
        bounds : int64 ndarray (n_servers + 1,)
            ``order[bounds[s]:bounds[s+1]]`` are the positions in ``keys`` owned by server s.
        """
        srv = self.server_of(keys)
        bounds = np.zeros(self.n_servers + 1, dtype=np.int64)
        np.cumsum(np.bincount(srv, minlength=self.n_servers), out=bounds[1:])
        return group_order(srv, bounds), bounds

    def local_rows(self, keys: np.ndarray, server: int, out: np.ndarray | None = None) -> np.ndarray:
        """Local row index of each key on ``server``, int64 (one pass over the keys).

        Parameters
        ----------
        keys : int64 array (n,)
        server : int
        out : int64 ndarray (n,), C-contiguous, optional
            Where to write the rows; may be ``keys`` itself (in place). Default: a new array.

        Raises
        ------
        ValueError
            If a key is outside the key space or not in this server's key range.
        """
        lo, hi = self.shard_range(server)
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if out is None:
            out = np.empty(keys.size, dtype=np.int64)
        try:
            return local_rows_into(keys, self.num_keys, self.multiplier, lo, hi, out)
        except ValueError as e:
            if "does not belong" in str(e):
                raise ValueError(str(e).replace("this server", f"server {server}")) from None
            raise

    def shard_keys(self, server: int) -> np.ndarray:
        """Original keys of the rows of ``server``'s shard, in local row order, int64."""
        lo, hi = self.shard_range(server)
        pos = np.arange(lo, hi, dtype=np.int64)
        if self.multiplier == 1:
            return pos
        return permute_keys(pos, self.num_keys, self.inverse)
