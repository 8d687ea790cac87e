"""An in-process Sandblaster machine (no MPI): the same shards, programs and work units as the
MPI run, for tests and as a reference.
"""

from __future__ import annotations

import numpy as np

from hpcps.kernels.keys import permute_keys
from hpcps.core.tables import KeyPartition
from hpcps.sandblaster.lbfgs import Reply, X
from hpcps.sandblaster.program import EVAL, GATHER, Program
from hpcps.sandblaster.shard import ShardVectors, compact_bounds, shard_layouts
from hpcps.sandblaster.units import WorkUnits


def to_original_order(w_compact: np.ndarray, active: np.ndarray, num_features: int) -> np.ndarray:
    """Weights in original key order from weights in compact order.

    Parameters
    ----------
    w_compact : float64 (n_active,)
        Weight of each active key, in the order of ``active``.
    active : int64 (n_active,)
        The active permuted positions (:mod:`hpcps.sandblaster.shard`).
    num_features : int
        Size of the key space; the permutation depends on it only.

    Returns
    -------
    float64 (num_features,)
        Zero for the keys that are not active.
    """
    part = KeyPartition(num_features, 1, permute=True)
    keys = permute_keys(np.ascontiguousarray(active, dtype=np.int64), num_features, part.inverse)
    w = np.zeros(num_features, dtype=np.float64)
    w[keys] = w_compact
    return w


class LocalMachine:
    """Runs programs on ``n_servers`` :class:`ShardVectors` in this process; an ``EVAL``
    computes the data term over every work unit in order.

    Parameters
    ----------
    units : WorkUnits
        The training rows.
    n_servers : int
        Number of shards.
    l2 : float
        L2 penalty.
    slots : int
        Slots per shard (:func:`hpcps.sandblaster.lbfgs.n_slots`).

    Attributes
    ----------
    n_rows : int
    shards : list of ShardVectors
    """

    def __init__(self, units: WorkUnits, n_servers: int, l2: float, slots: int):
        self.units = units
        self.n_rows = units.n_rows
        self.num_features = units.num_features
        self.n_servers = n_servers
        self.layouts = shard_layouts(self.num_features, n_servers,
                                     compact_bounds(self.num_features, n_servers, units.active))
        self.shards = [ShardVectors(lay, slots, l2) for lay in self.layouts]

    def assemble(self, slot: int) -> tuple[np.ndarray, float]:
        """Slot ``slot`` of every shard as one vector: (weights in compact order, bias)."""
        w = np.zeros(self.units.n_active, dtype=np.float64)
        bias = 0.0
        for lay, sh in zip(self.layouts, self.shards):
            part, b = sh.parts(slot)
            w[lay.start:lay.stop] = part
            if b is not None:
                bias = float(b[0])
        return w, bias

    def weights(self, slot: int = X) -> tuple[np.ndarray, float]:
        """Slot ``slot`` in original key order: (weights (num_features,), bias)."""
        w, b = self.assemble(slot)
        return to_original_order(w, self.units.active, self.num_features), b

    def run(self, prog: Program) -> Reply:
        """Run ``prog`` on every shard; results summed / maximised over shards."""
        ops, scalars = prog.ops, prog.scalars
        parts = [sh.run_body(ops, scalars) for sh in self.shards]
        sums = list(np.sum(parts, axis=0)) if parts and parts[0] else []
        maxes: list = []
        loss = 0.0
        if prog.tail == EVAL:
            w, bias = self.assemble(int(ops[-1, 1]))
            acc = np.zeros_like(w)
            gb = 0.0
            for u in range(len(self.units)):
                lu, gu = self.units.accumulate(u, w, bias, acc)
                loss += lu
                gb += gu
            ev = [sh.finish_eval(ops[-1], scalars[-1], acc[lay.start:lay.stop],
                                 np.array([gb]) if lay.has_bias else None)
                  for lay, sh in zip(self.layouts, self.shards)]
            sums += list(np.sum([e[0] for e in ev], axis=0))
            maxes = list(np.max([e[1] for e in ev], axis=0))
        elif prog.tail == GATHER:
            pass                                     # nothing to send in one process
        return Reply(np.array(sums, dtype=np.float64), np.array(maxes, dtype=np.float64), loss)
