"""The AllReduce baseline (``[cluster] mode = "allreduce"``): no servers; every rank holds the
whole model and the step's gradients are combined collectively (no MPI of its own: the
collectives are in :mod:`hpcps.comm.collectives`).

:class:`AllReduceClient` has the parts of :class:`hpcps.worker.client.PSClient` the worker loop
uses, so the same :class:`~hpcps.worker.trainer.Trainer`, models and job files run in both
architectures and can be compared side by side. Per step (:meth:`AllReduceClient.clock`):

* **dense tables**: one ``MPI.Allreduce`` (sum) of the whole ``(rows, dim)`` gradient, with one
  extra column counting the ranks that pushed each row, so that only rows some rank pushed are
  updated (as a parameter server would);
* **sparse tables**: ``MPI.Allgatherv`` of the pushed keys and gradient rows (the way
  collective frameworks treat sparse gradients: a dense Allreduce of a 2^20-row table would
  move the whole table every step), concatenated in rank order;
* the example count: one ``Allreduce``.

Then every rank applies the same update with the same :class:`hpcps.core.optim.Optimizer` kernel
(scale 1/examples), in rank order — the order in which a BSP server sums the workers' pushes —
so plain SGD in float64 matches BSP with servers (up to the Allreduce's summation order for
dense tables).
"""

from __future__ import annotations

import time

import numpy as np

from hpcps.comm.collectives import allgatherv, allreduce_sum
from hpcps.core.arrays import distinct


class AllReduceClient:
    """Local copy of every table, combined by collectives at each clock.

    Parameters
    ----------
    comm : MPI.Intracomm
        All ranks of the job (each is a worker).
    tables : list of (hpcps.core.tables.TableSpec, hpcps.core.optim.Optimizer)
    seed : int
        Job seed, for tables with ``init_std > 0`` (drawn per key, identically on every rank
        and as the servers draw them).

    Collective: :meth:`clock` must be called by every rank of ``comm`` the same number of
    times; the other methods are local.
    """

    pull_mode = "allreduce"
    n_servers = 0

    def __init__(self, comm, tables, seed: int = 0):
        self.comm = comm
        self.n_workers = comm.Get_size()
        self.specs = [s for s, _ in tables]
        self.opts = [o for _, o in tables]
        self.ids = {s.name: i for i, s in enumerate(self.specs)}
        self.w, self.slots = [], []
        for spec, opt in tables:
            shape = (spec.num_keys, spec.dim)
            # the rows the servers would start from (TableSpec.initial_rows: per key)
            w = spec.initial_rows(np.arange(spec.num_keys, dtype=np.int64), seed)
            self.w.append(w)
            self.slots.append(opt.init_slots(shape, spec.dtype, w=w))
        self.pending = [[] for _ in self.specs]
        self.clock_value = 0
        self.read_version = np.zeros((len(self.specs), 1), dtype=np.int64)
        self.pushes_sent = np.zeros(1, dtype=np.int64)
        self.bytes_out = 0        # bytes this rank contributed to collectives
        self.bytes_in = 0         # bytes it received from them
        self.comm_seconds = 0.0
        self.collectives = 0

    def _table(self, table):
        tid = self.ids[table] if isinstance(table, str) else int(table)
        return tid, self.specs[tid]

    def pull(self, table, keys, fresh: bool = False) -> np.ndarray:
        """Rows ``keys`` of the local copy, ``(n, dim)`` (always current under this mode)."""
        tid, spec = self._table(table)
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if keys.size and (keys.min() < 0 or keys.max() >= spec.num_keys):
            raise ValueError(f"pull from {spec.name!r}: key out of range [0, {spec.num_keys})")
        return self.w[tid][keys]

    def pull_many(self, requests: dict, fresh: bool = False) -> dict:
        """``{table: keys}`` -> ``{table: rows}``, as :meth:`pull` per table."""
        return {t: self.pull(t, k, fresh) for t, k in requests.items()}

    def push(self, table, keys, grads, n_examples: int = 0, versions=None,
             defer: bool = True) -> None:
        """Hold gradient sums for ``keys`` until this step's :meth:`clock` (every push here
        is deferred; ``defer`` is accepted as :meth:`PSClient.push` takes it)."""
        tid, spec = self._table(table)
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        grads = np.asarray(grads, dtype=spec.dtype).reshape(keys.size, spec.dim)
        if keys.size and (keys.min() < 0 or keys.max() >= spec.num_keys):
            raise ValueError(f"push to {spec.name!r}: key out of range [0, {spec.num_keys})")
        self.pending[tid].append((keys, grads))

    def clock(self, n_examples: int, epoch: int = 0) -> int:
        """Combine every rank's pushes of this step and apply them (``epoch``: as
        :meth:`PSClient.clock`, unused here). Collective."""
        t0 = time.perf_counter()
        total = int(allreduce_sum(self.comm, np.array([n_examples], dtype=np.int64))[0])
        self.collectives += 1
        updates = []
        for tid, spec in enumerate(self.specs):
            held = self.pending[tid]
            keys = np.concatenate([k for k, _ in held]) if held else np.empty(0, np.int64)
            grads = (np.concatenate([g for _, g in held]) if held
                     else np.empty((0, spec.dim), dtype=spec.dtype))
            if spec.sparse:
                all_k = allgatherv(self.comm, keys)
                all_g = allgatherv(self.comm, grads).reshape(-1, spec.dim)
                self.bytes_out += keys.nbytes + grads.nbytes
                self.bytes_in += all_k.nbytes + all_g.nbytes
                self.collectives += 4
                updates.append((tid, all_k, all_g))
            else:
                buf = np.zeros((spec.num_keys, spec.dim + 1), dtype=np.float64)
                np.add.at(buf[:, :spec.dim], keys, grads)
                buf[distinct(keys), spec.dim] = 1.0
                buf = allreduce_sum(self.comm, buf)
                self.bytes_out += buf.nbytes
                self.bytes_in += buf.nbytes
                self.collectives += 1
                rows = np.flatnonzero(buf[:, spec.dim] > 0).astype(np.int64)
                updates.append((tid, rows, buf[rows, :spec.dim].astype(spec.dtype)))
            self.pending[tid] = []
        self.comm_seconds += time.perf_counter() - t0
        scale = 1.0 / total if total else 0.0
        for tid, rows, g in updates:
            if rows.size:
                self.opts[tid].apply(self.w[tid], self.slots[tid], rows,
                                     np.ascontiguousarray(g), scale)
        self.clock_value += 1
        return self.clock_value

    def worker_clocks(self) -> tuple[int, int]:
        """The slowest and the fastest worker's clock: every rank is at the same clock (the
        collectives synchronise them)."""
        return self.clock_value, self.clock_value

    def pull_table(self, table) -> np.ndarray:
        """The whole table, ``(num_keys, dim)`` (a copy)."""
        tid, _ = self._table(table)
        return self.w[tid].copy()

    def stop(self) -> None:
        """Nothing to tell: there are no servers."""
