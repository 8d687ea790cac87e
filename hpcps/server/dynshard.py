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

from hpcps.core.consistency import H_CLOCK
from hpcps.core.dyntables import HashPartition, new_shard
from hpcps.core.tables import PULL_SHARD_SORTED
from hpcps.core.errors import DataError
from hpcps.core.arrays import distinct

#: hot keys per dynamic table in the run summary
HOT_KEYS = 10
#: numbers per table in a server's summary row (:meth:`DynamicShard.report`)
REPORT_LEN = 4 + 3 * HOT_KEYS

#: the largest update count kept per row (``updates`` is uint32 and saturates there)
_UPDATES_MAX = np.iinfo(np.uint32).max


def _saturated(counts) -> np.ndarray:
    """Update counts read from a checkpoint (int64 before, uint32 now) as uint32, capped
    (uint32 counts: themselves, not a copy)."""
    if isinstance(counts, np.ndarray) and counts.dtype == np.uint32:
        return counts
    return np.minimum(np.asarray(counts, dtype=np.int64), _UPDATES_MAX).astype(np.uint32)


__all__ = ["DynamicShard", "Admission", "peak_rss", "HOT_KEYS", "REPORT_LEN", "PULL_SHARD_COUNT",
           "PULL_SHARD_KEYS", "PULL_SHARD_ROWS", "PULL_SHARD_SORTED"]

#: ``PULL_SHARD`` of a dynamic table, by its header's ``aux``: the number of keys stored
#: (int64 (1,)), then the first ``nkeys`` keys (int64), then their rows (``(nkeys, dim)``);
#: :data:`~hpcps.core.tables.PULL_SHARD_SORTED` (4): a chunk of the keys in ascending order
#: and their rows (:meth:`DynamicShard.whole`).
PULL_SHARD_COUNT, PULL_SHARD_KEYS, PULL_SHARD_ROWS = 1, 2, 3


class Admission:
    """Admission of new keys after ``min_count`` pushes, counted in a count-min sketch
    (Cormode & Muthukrishnan, "An improved data stream summary: the count-min sketch and
    its applications", J. Algorithms 2005).

    ``depth`` rows of ``width`` uint32 counters; a key's count is the minimum of its
    ``depth`` counters (row ``i``: SplitMix64's mix of ``key + (i+1)·golden``, low bits).
    The estimate never undercounts, so a key is admitted at its ``min_count``-th push at the
    latest; it may be admitted early: with ``N`` pushes of absent keys counted so far, the
    estimate exceeds the true count by more than ``e/width · N`` with probability at most
    ``exp(-depth)`` (width 2^18, depth 4: 1.04e-5 · N with probability >= 98.2 %; 4 MiB).

    Parameters
    ----------
    min_count : int
        Pushes (occurrences of the key in the pushes applied) at which a key is stored.
    width, depth : int
        Sketch size (width a power of two).
    """

    def __init__(self, min_count: int, width: int = 1 << 18, depth: int = 4):
        self.min_count = int(min_count)
        self.width, self.depth = int(width), int(depth)
        self.counts = np.zeros((self.depth, self.width), dtype=np.uint32)
        self.total = 0                 # increments so far (N of the error bound)

    def _slots(self, keys: np.ndarray) -> list:
        from hpcps.core.tables import _GOLDEN, _splitmix_mix

        k = keys.astype(np.int64).view(np.uint64)
        with np.errstate(over="ignore"):
            return [(_splitmix_mix(k + _GOLDEN * np.uint64(i + 1)) & np.uint64(self.width - 1))
                    .astype(np.int64) for i in range(self.depth)]

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Count one push of each occurrence in ``keys`` (int64 (n,)); returns each key's
        estimated count after all of them (uint32 (n,))."""
        slots = self._slots(keys)
        for row, idx in zip(self.counts, slots):
            np.add.at(row, idx, 1)
        self.total += int(keys.size)
        return np.min([row[idx] for row, idx in zip(self.counts, slots)], axis=0)

    def error_bound(self) -> float:
        """``e/width · N``: the overcount exceeded with probability <= exp(-depth)."""
        return float(np.e / self.width * self.total)


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

    def __init__(self, spec, optimizer, index: int, n_servers: int, table, hdr, seed: int = 0):
        self.spec = spec
        self.optimizer = optimizer
        self.index = int(index)
        self.part = HashPartition(n_servers)
        self.table = table
        self.hdr = hdr
        self.slots = None
        self.seed = int(seed)
        #: per arena row: updates applied (pushes that stepped it; hot keys, LFU eviction;
        #: uint32, saturating) and, with ``ttl_steps`` only, the clock of the last one (TTL
        #: eviction); both, the admission sketch and the counts below are checkpointed and
        #: restored. A trial at 32.7 M keys: two int64 arrays of 1.5x the keys were 16 B per
        #: key of server memory (and of every checkpoint) that the summary did not count
        self.updates = np.zeros(0, dtype=np.uint32)
        self.last_clock = np.zeros(0, dtype=np.int64) if spec.ttl_steps else None
        self.admission = Admission(spec.min_count) if spec.min_count > 1 else None
        self.admitted = 0          # keys inserted by pushes
        self.rejected = 0          # key occurrences of pushes dropped before admission
        self.evicted = 0           # rows evicted (TTL or LFU)
        #: the keys stored, ascending, while a PULL_SHARD_SORTED read is under way
        self._sorted = None

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
        if restore is None:
            table = new_shard(spec, optimizer, seed)
        else:
            from pathlib import Path

            from hpcps.checkpoint.dynamic import find_owned, restore_all
            from hpcps.checkpoint.layout import CheckpointError

            directory, manifest = restore[0], restore[1]
            files = [Path(directory) / f for f in manifest["shards"]["files"]]
            try:
                # sized for the keys it will hold: no growth (a copy of the arena) while
                # loading. The keys are hashed once (find_owned: a bit per old key kept), and
                # each block holding owned keys read once more for rows, slots and counts
                owned = find_owned(files, spec.name, index, n_servers)
                table = new_shard(spec, optimizer, seed, capacity=owned.count)
                state = restore_all(table, files, spec.name, owned)[1]
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        sh = cls(spec, optimizer, index, n_servers, table, np.zeros(nh, dtype=np.int64),
                 seed=seed)
        if restore is not None:
            sh._restore_state(state, int(restore[1].get("step", 0)))
        return sh

    def _restore_state(self, state: dict, clock: int) -> None:
        """Update counts, last-update clocks, the admission sketch and the counts read by
        :func:`hpcps.checkpoint.dynamic.restore_state` (older checkpoints: counts 0, last
        update at the checkpoint's ``clock``)."""
        n = len(self.table)
        up, last = state.get("updates"), state.get("last_clock")
        self.updates = (_saturated(up) if up is not None and len(up) == n
                        else np.zeros(n, dtype=np.uint32))
        if self.last_clock is not None:         # TTL on (a checkpoint without: its clock)
            self.last_clock = (np.asarray(last, dtype=np.int64) if last is not None
                               and len(last) == n else np.full(n, clock, dtype=np.int64))
        sk = state.get("sketch")
        if self.admission is not None and sk is not None \
                and sk.shape == self.admission.counts.shape:
            self.admission.counts[...] = sk
            self.admission.total = int(state.get("sketch_total", 0))
        self.admitted = int(state.get("admitted", 0))
        self.rejected = int(state.get("rejected", 0))
        self.evicted = int(state.get("evicted", 0))

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

    def push_rows(self, keys: np.ndarray, grads: np.ndarray, server: int) -> bool:
        """A received push: its ``keys`` checked (:meth:`rows_for`; a hash table's rows are
        its keys) and whether its ``grads`` are all finite (the same contract as
        :meth:`hpcps.server.shard.Shard.push_rows`). Local."""
        self.rows_for(keys, server)
        return bool(np.isfinite(grads).all())

    def pull_reply(self, keys: np.ndarray, server: int, pool=None) -> np.ndarray:
        """The rows of a pull's ``keys`` for its reply (absent: the initial value, not
        inserted), in a buffer of ``pool`` when given (give it back after the reply). Local."""
        return self.gather(self.rows_for(keys, server), pool)

    def apply(self, keys: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """One optimizer step: absent keys inserted at their initial value, gradients of
        equal keys summed in input order, scaled by ``scale``; then admission and eviction
        (``spec.min_count``, ``ttl_steps``, ``max_keys``; all off by default).

        With ``min_count`` > 1 the occurrences of absent keys are counted
        (:class:`Admission`) and those whose estimate is still below ``min_count`` are
        dropped from the push (:attr:`rejected`). The clock of an update is the shard
        header's (the clock being applied under BSP/SSP, the slowest worker's under async).

        Raises
        ------
        DataError
            When the table exceeds ``max_keys`` with ``evict = "none"`` (naming the table):
            the data holds more distinct keys than the job allows, an error of the input
            (exit status 65; a relaunch would fail the same way).
        """
        if self.admission is not None and keys.size:
            absent = self.table.lookup(keys) < 0
            if absent.any():
                est = self.admission.add(keys[absent])
                keep = np.ones(keys.size, dtype=bool)
                keep[np.flatnonzero(absent)[est < self.admission.min_count]] = False
                if not keep.all():
                    self.rejected += int(keys.size - np.count_nonzero(keep))
                    keys, grads = keys[keep], grads[keep]
        before = len(self.table)
        self.table.apply(keys, np.ascontiguousarray(grads), scale)
        n = len(self.table)
        self.admitted += n - before
        clock = int(self.hdr[H_CLOCK]) if self.hdr is not None else 0
        self._count(self.table.last_rows(), n, clock)
        self._evict(clock)

    def _count(self, rows: np.ndarray, n: int, clock: int) -> None:
        if self.updates.size < n:
            cap = max(n, self.updates.size * 3 // 2, 1024)
            up = np.zeros(cap, dtype=np.uint32)
            up[:self.updates.size] = self.updates
            self.updates = up
            if self.last_clock is not None:
                last = np.full(cap, clock, dtype=np.int64)
                last[:self.last_clock.size] = self.last_clock
                self.last_clock = last
        up = self.updates[rows]           # distinct rows; saturating at 2**32 - 1
        self.updates[rows] = up + (up < _UPDATES_MAX)
        if self.last_clock is not None:
            self.last_clock[rows] = clock

    def _evict(self, clock: int) -> None:
        spec, n = self.spec, len(self.table)
        drop = None
        if spec.ttl_steps:
            old = self.last_clock[:n] < clock - spec.ttl_steps
            if old.any():
                drop = old
        if spec.max_keys and n - (0 if drop is None else int(drop.sum())) > spec.max_keys:
            if spec.evict != "lfu":
                raise DataError(
                    f"server {self.index}: dynamic table {spec.name!r} holds "
                    f"{n - (0 if drop is None else int(drop.sum())):,} keys, more than its "
                    f"max_keys = {spec.max_keys:,} per server, and eviction is off; raise "
                    f"[tables.{spec.name}] max_keys, add servers, or set evict = 'lfu'")
            # least-frequently updated first (ties: the older row), down to 90 % of
            # max_keys so that a rebuild (O(keys)) is needed at most every 10 % of it
            drop = np.zeros(n, dtype=bool) if drop is None else drop
            target = max(1, spec.max_keys - spec.max_keys // 10)
            live = np.flatnonzero(~drop)
            extra = live.size - target
            order = np.argsort(self.updates[live], kind="stable")
            drop[live[order[:extra]]] = True
        if drop is not None and drop.any():
            self._rebuild(~drop)

    def _rebuild(self, keep: np.ndarray) -> None:
        """A new table holding the rows ``keep`` (bool (len,)), same order. O(keys)."""
        t = self.table
        keys, w, slots = t.keys(), t.weights(), t.slots()
        fresh = new_shard(self.spec, self.optimizer, self.seed, capacity=int(keep.sum()))
        fresh.load(keys[keep], w[keep], {s: a[keep] for s, a in slots.items()})
        n = len(t)
        self.evicted += int(n - keep.sum())
        self.updates = self.updates[:n][keep].copy()
        if self.last_clock is not None:
            self.last_clock = self.last_clock[:n][keep].copy()
        self.table = fresh

    def hot_keys(self, k: int = 10):
        """The ``k`` most-updated keys and their update counts, most first:
        ``(keys int64 (m,), counts int64 (m,))``, m <= k."""
        n = len(self.table)
        if n == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        up = np.zeros(n, dtype=np.int64)
        m = min(n, self.updates.size)
        up[:m] = self.updates[:m]
        top = np.argsort(-up, kind="stable")[:k]
        return self.table.keys()[top], up[top]

    def touched(self, keys: np.ndarray) -> np.ndarray:
        """Distinct keys of an update (ascending)."""
        return distinct(keys)

    def whole(self, aux: int, nkeys: int, start: int = 0):
        """The reply to a ``PULL_SHARD``: the count, keys or rows (``aux``, see
        :data:`PULL_SHARD_COUNT`) of the first ``nkeys`` keys stored (arena order: keys
        are only ever appended); or with ``aux`` :data:`~hpcps.core.tables.PULL_SHARD_SORTED`
        ``(rows, keys)`` of the keys at positions ``[start, start + nkeys)`` of the stored
        keys in ascending order.

        For the sorted read the shard sorts a copy of its keys when ``start`` is 0 (8 bytes
        per key stored, kept until the chunk that ends at the last key has been asked for)
        and gathers each chunk's rows from the table (``nkeys`` rows). Local.

        Raises
        ------
        ValueError
            For an unknown ``aux``, or a chunk past the keys stored (naming the table).
        """
        if aux == PULL_SHARD_COUNT:
            return np.array([len(self.table)], dtype=np.int64)
        if aux == PULL_SHARD_KEYS:
            return self.table.keys()[:nkeys]
        if aux == PULL_SHARD_ROWS:
            return np.ascontiguousarray(self.table.weights()[:nkeys])
        if aux == PULL_SHARD_SORTED:
            if start == 0 or self._sorted is None or self._sorted.size != len(self.table):
                self._sorted = None             # the old copy goes before the new one is made
                keys = self.table.keys()
                keys.sort()
                self._sorted = keys
            keys = self._sorted
            if start < 0 or nkeys < 1 or start + nkeys > keys.size:
                raise ValueError(f"table {self.spec.name!r}: sorted keys [{start}, "
                                 f"{start + nkeys}) asked, {keys.size} stored")
            chunk = keys[start:start + nkeys]
            if start + nkeys == keys.size:
                self._sorted = None             # the reply keeps its chunk alive
            return self.table.gather(chunk), chunk
        raise ValueError(f"table {self.spec.name!r}: PULL_SHARD of a dynamic table needs aux "
                         f"1, 2, 3 or {PULL_SHARD_SORTED}, got {aux}")

    # ---------------------------------------------------------------- reports
    @property
    def n_rows(self) -> int:
        """Keys stored."""
        return len(self.table)

    @property
    def nbytes(self) -> int:
        """Bytes of the table's index and arena and of the per-row update counts (and last
        clocks, with TTL), as allocated."""
        return int(self.table.nbytes + self.updates.nbytes
                   + (0 if self.last_clock is None else self.last_clock.nbytes))

    def checkpoint_entry(self, server: int) -> dict:
        """The table's entry for :func:`hpcps.checkpoint.write_shard` (a dynamic group;
        ``updates``: each stored row's update count, for ``hpcps inspect``'s hot keys)."""
        n = len(self.table)
        up = self.updates[:n]             # views, no copies (_count keeps them as long)
        last = None if self.last_clock is None else self.last_clock[:n]
        adm = self.admission
        return dict(name=self.spec.name, dynamic=self.table, num_keys=self.spec.num_keys,
                    sparse=True, optimizer=self.optimizer.name, updates=up, last_clock=last,
                    sketch=None if adm is None else adm.counts,
                    sketch_total=0 if adm is None else adm.total,
                    admitted=self.admitted, rejected=self.rejected, evicted=self.evicted)

    def report(self) -> list:
        """Counts for the run summary, float64-exact: keys stored, admitted, rejected,
        evicted, then the top-10 hot keys as (high 32 bits, low 32 bits, updates) triples
        (zeros when fewer)."""
        out = [len(self.table), self.admitted, self.rejected, self.evicted]
        keys, counts = self.hot_keys(HOT_KEYS)
        for i in range(HOT_KEYS):
            if i < keys.size:
                u = int(keys[i]) & ((1 << 64) - 1)
                out += [u >> 32, u & 0xFFFFFFFF, int(counts[i])]
            else:
                out += [0, 0, 0]
        return out


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``getrusage`` ``ru_maxrss``, KiB on
    Linux). Local."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
