"""Work units: the worker side (data cut into units, gradient of one unit) and the
coordinator's on-demand dispatcher (no MPI).

Sandblaster's load balancing (Dean et al., NIPS 2012, §4.2): "the coordinator assigns each of
the N model replicas a small portion of work, much smaller than 1/Nth of the total size of a
batch, and assigns replicas new portions whenever they are free. With this approach, faster
model replicas do more work than slower replicas." A unit here is a contiguous block of
training rows; every worker holds all rows (as every DistBelief replica could read any portion
of the data), so any unit can go to any worker.

Backup copies of the last units (the paper's other measure) are not scheduled: a worker sums
the gradients of all its units and sends the sum once per evaluation, so a backup copy could not
free the evaluation from waiting for the slow worker's sum anyway; on-demand units already bound
the wait to one unit of the slowest worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hpcps.models.logistic_math import batch_keys, loss_and_gradient


@dataclass(frozen=True)
class Unit:
    """One work unit, ready for :func:`hpcps.models.logistic_math.loss_and_gradient`.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix (rows, n_active), float64
        The unit's rows; columns are compact indices (:mod:`hpcps.sandblaster.shard`).
    y : float64 (rows,)
        Labels in {0, 1}.
    keys : int64 (m,)
        Distinct compact indices of the unit's features, sorted.
    local : int64 (nnz,)
        Position in ``keys`` of each stored entry of ``X``.
    """

    X: sp.csr_matrix
    y: np.ndarray
    keys: np.ndarray
    local: np.ndarray


def unit_bounds(n_rows: int, n_units: int) -> np.ndarray:
    """Row boundaries of ``min(n_units, n_rows)`` (at least 1) near-equal contiguous units.

    Returns
    -------
    int64 (U + 1,)
        Unit ``u`` is rows ``[bounds[u], bounds[u + 1])``.
    """
    u = max(1, min(int(n_units), int(n_rows)))
    return np.linspace(0, n_rows, u + 1).round().astype(np.int64)


class WorkUnits:
    """A worker's copy of the training rows, cut into units, in compact column indices.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix (n, num_features)
        Training rows (original feature keys as columns).
    y : float64 (n,)
        Labels in {0, 1}.
    positions : callable(int64 ndarray) -> int64 ndarray
        Key → permuted position map (``KeyPartition.positions``).
    n_units : int
        Requested number of units (capped at ``n``).

    Attributes
    ----------
    active : int64 (n_active,)
        Sorted permuted positions of the features that occur in ``X`` (see
        :mod:`hpcps.sandblaster.shard`).
    units : list of Unit
    n_rows, num_features, n_active : int
    """

    def __init__(self, X, y, positions, n_units: int):
        X = sp.csr_matrix(X, dtype=np.float64)
        self.n_rows = X.shape[0]
        self.num_features = X.shape[1]
        self.bounds = unit_bounds(self.n_rows, n_units)
        y = np.ascontiguousarray(y, dtype=np.float64)
        pos = positions(X.indices.astype(np.int64))
        self.active, compact = np.unique(pos, return_inverse=True)
        self.active = self.active.astype(np.int64, copy=False)
        self.n_active = int(self.active.size)
        Xc = sp.csr_matrix((X.data, compact.reshape(-1), X.indptr),
                           shape=(self.n_rows, self.n_active))
        self.units = []
        for a, b in zip(self.bounds[:-1], self.bounds[1:]):
            Xu = Xc[int(a):int(b)]
            keys, local = batch_keys(Xu)
            self.units.append(Unit(Xu, y[a:b], keys, local))

    def __len__(self) -> int:
        return len(self.units)

    def fingerprint(self) -> list[float]:
        """``[n_rows, n_units, n_active, nnz, Σ y, Σ active]`` — equal on workers that read the
        same data."""
        return [float(self.n_rows), float(len(self.units)), float(self.n_active),
                float(sum(u.X.nnz for u in self.units)), float(sum(u.y.sum() for u in self.units)),
                float(self.active.sum())]

    def accumulate(self, u: int, w: np.ndarray, bias: float,
                   acc: np.ndarray) -> tuple[float, float]:
        """Add unit ``u``'s log-loss gradient sum at ``(w, bias)`` into ``acc``.

        Parameters
        ----------
        u : int
            Unit index.
        w : float64 (n_active,)
            Weights in compact order.
        bias : float
        acc : float64 (n_active,)
            Gradient accumulator in compact order; updated in place.

        Returns
        -------
        loss_sum : float
            Summed log-loss of the unit's rows (nats).
        grad_bias : float
            Summed bias gradient of the unit's rows.

        Notes
        -----
        ``keys`` are distinct, so ``acc[keys] += grad`` adds each entry exactly once.
        """
        unit = self.units[u]
        loss, grad, gb = loss_and_gradient(unit.X, unit.y, unit.local, w[unit.keys], bias)
        acc[unit.keys] += grad
        return float(loss), float(gb)


class UnitScheduler:
    """The coordinator's dispatcher of one evaluation's units, first come first served.

    Parameters
    ----------
    n_units : int
        Units per evaluation.
    n_workers : int
        Workers asking.

    Attributes
    ----------
    done_by : int64 (n_workers,)
        Units finished by each worker over all evaluations so far.
    """

    def __init__(self, n_units: int, n_workers: int):
        if n_units < 1 or n_workers < 1:
            raise ValueError(f"need n_units >= 1 and n_workers >= 1, got {n_units}, {n_workers}")
        self.n_units = int(n_units)
        self.n_workers = int(n_workers)
        self.done_by = np.zeros(self.n_workers, dtype=np.int64)
        self.start(0)

    def start(self, eval_id: int) -> None:
        """Begin evaluation ``eval_id``: every unit is pending, no worker released yet."""
        self.eval_id = int(eval_id)
        self.next_unit = 0
        self.holder = np.full(self.n_units, -1, dtype=np.int64)
        self.finished = np.zeros(self.n_units, dtype=bool)
        self.released = np.zeros(self.n_workers, dtype=bool)
        self.this_eval = np.zeros(self.n_workers, dtype=np.int64)

    @property
    def complete(self) -> bool:
        """True once every worker was told that no unit is left (so every unit is done)."""
        return bool(self.released.all())

    def answer(self, worker: int, eval_id: int, done: int) -> int:
        """Record that ``worker`` finished unit ``done`` (-1: none) and pick its next unit.

        Returns
        -------
        int
            The next unit, or -1 if none is left (the worker is then released).

        Raises
        ------
        RuntimeError
            For a request of another evaluation, a unit the worker was not given, or a
            request from a released worker (protocol errors).
        """
        if eval_id != self.eval_id:
            raise RuntimeError(f"worker {worker} asked for evaluation {eval_id} during "
                               f"evaluation {self.eval_id}")
        if self.released[worker]:
            raise RuntimeError(f"worker {worker} asked again after being released")
        if done >= 0:
            if not (0 <= done < self.n_units) or self.holder[done] != worker or self.finished[done]:
                raise RuntimeError(f"worker {worker} reported unit {done}, which it does not hold")
            self.finished[done] = True
            self.done_by[worker] += 1
            self.this_eval[worker] += 1
        if self.next_unit < self.n_units:
            u = self.next_unit
            self.next_unit += 1
            self.holder[u] = worker
            return u
        self.released[worker] = True
        return -1
