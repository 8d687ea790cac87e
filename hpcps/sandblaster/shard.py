"""A server's shard of the L-BFGS vectors, and the layout of shards over servers (no MPI).

Layout
------
The model is ``x = (w, b)``: one weight per feature (``num_features``) and the bias ``b``.
Server ``s`` of ``K`` owns the weights of the same key range as in the parameter-server mode:
positions ``[lo_s, hi_s)`` of the permuted key space of :class:`hpcps.core.tables.KeyPartition`
(``permute=True``, as for the sparse ``weights`` table); the server that holds the dense
``bias`` table in that mode (server 0) also holds ``b``.

Of its key range a server stores only the *active* keys: those that occur in the training
rows. This is exact: a feature no training row has gets the gradient ``l2 · w_j``, which is 0 at
the start ``w = 0``, and every vector L-BFGS forms from gradients and earlier steps (``d``,
``s_i``, ``y_i``) is 0 there too, so ``w_j`` stays exactly 0 — the optimisation problem is the
same; the vectors merely skip entries that are always zero (with hashed features, most of them:
on UCI Adult 6,557 of 2^20). The active positions, sorted, define the *compact index* ``c``
(the rank of a position among them); server ``s`` holds compact indices ``[start_s, stop_s)``,
contiguous because its key range is. Each of its vectors is ``[w at start_s..stop_s-1, (b)]``.

Workers keep whole vectors in compact order, so server ``s``'s part is the slice
``w[start_s:stop_s]``: parameters are received and gradients sent without gathers by key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcps.core.tables import KeyPartition
from hpcps.sandblaster.program import (AXPY, COPY, DOT, EVAL, EVAL_MAXES, EVAL_SUMS, LINCOMB, OP_NAMES, SCALE,
                      SWAP, TAIL_OPS)


@dataclass(frozen=True)
class ShardLayout:
    """Where server ``server``'s part of a vector lies.

    Attributes
    ----------
    server : int
        Server index.
    lo, hi : int
        The permuted key positions ``[lo, hi)`` it owns (its key range).
    start, stop : int
        The compact indices ``[start, stop)`` of the active keys in that range.
    has_bias : bool
        Whether it also holds the bias (last element of its vectors).
    """

    server: int
    lo: int
    hi: int
    start: int
    stop: int
    has_bias: bool

    @property
    def n_weights(self) -> int:
        """int : Number of weights held (active keys of the range)."""
        return self.stop - self.start

    @property
    def size(self) -> int:
        """int : Length of each of its vectors (weights, then the bias if held)."""
        return self.n_weights + int(self.has_bias)


def bias_server(n_servers: int) -> int:
    """Index of the server holding the bias: the owner of key 0 of a dense 1-row table, as in
    the parameter-server mode (server 0)."""
    return int(KeyPartition(1, n_servers, permute=False).server_of(np.zeros(1, np.int64))[0])


def compact_bounds(num_features: int, n_servers: int, active=None) -> np.ndarray:
    """Compact index boundaries of the servers' ranges.

    Parameters
    ----------
    num_features : int
        Size of the key space, >= 1.
    n_servers : int
        Number of servers, >= 1.
    active : int64 ndarray (n_active,), sorted, or None
        Active permuted positions; None = every position is active.

    Returns
    -------
    int64 (n_servers + 1,)
        Server ``s`` holds compact indices ``[bounds[s], bounds[s + 1])``.
    """
    part = KeyPartition(num_features, n_servers, permute=True)
    los = np.array([part.shard_range(s)[0] for s in range(n_servers)] + [num_features],
                   dtype=np.int64)
    if active is None:
        return los
    return np.searchsorted(np.asarray(active, dtype=np.int64), los).astype(np.int64)


def shard_layouts(num_features: int, n_servers: int, bounds=None) -> list[ShardLayout]:
    """The layout of every server, in server order.

    Parameters
    ----------
    num_features : int
        Size of the key space, >= 1.
    n_servers : int
        Number of servers, >= 1.
    bounds : int64 (n_servers + 1,) or None
        From :func:`compact_bounds`; None = every key active.

    Returns
    -------
    list of ShardLayout

    Raises
    ------
    ValueError
        If ``bounds`` does not have ``n_servers + 1`` non-decreasing entries starting at 0.
    """
    part = KeyPartition(num_features, n_servers, permute=True)
    if bounds is None:
        bounds = compact_bounds(num_features, n_servers)
    bounds = np.asarray(bounds, dtype=np.int64)
    if bounds.shape != (n_servers + 1,) or bounds[0] != 0 or np.any(np.diff(bounds) < 0):
        raise ValueError(f"bounds must be {n_servers + 1} non-decreasing integers from 0, "
                         f"got {bounds.tolist()}")
    b = bias_server(n_servers)
    return [ShardLayout(s, *part.shard_range(s), int(bounds[s]), int(bounds[s + 1]),
                        has_bias=(s == b)) for s in range(n_servers)]


class ShardVectors:
    """One server's slots and the operations of :mod:`hpcps.sandblaster.program` on them.

    Parameters
    ----------
    layout : ShardLayout
        Which part of each vector this shard holds.
    n_slots : int
        Number of vectors (slots), each float64 ``(layout.size,)``, initially zero.
    l2 : float
        L2 penalty of the weights (the bias is not penalised).

    Attributes
    ----------
    v : list of float64 ndarray
        The slots.
    """

    def __init__(self, layout: ShardLayout, n_slots: int, l2: float):
        self.layout = layout
        self.l2 = float(l2)
        self.v = [np.zeros(layout.size, dtype=np.float64) for _ in range(int(n_slots))]

    @property
    def nbytes(self) -> int:
        """int : Bytes held in slots."""
        return sum(a.nbytes for a in self.v)

    def _slot(self, i: int, op: int) -> np.ndarray:
        if not 0 <= i < len(self.v):
            raise ValueError(f"{OP_NAMES.get(op, op)}: slot {i} out of range [0, {len(self.v)})")
        return self.v[i]

    def run_body(self, ops: np.ndarray, scalars: np.ndarray) -> list[float]:
        """Execute every operation before the program's tail (``EVAL``/``GATHER``/``STOP``).

        Parameters
        ----------
        ops : int64 (n, 4)
        scalars : float64 (n,)

        Returns
        -------
        list of float
            This shard's partial result of each ``DOT``, in program order.

        Raises
        ------
        ValueError
            For an unknown op code, a slot out of range, or a tail op that is not last.
        """
        out: list[float] = []
        n = len(ops)
        for i, (op, a, b, c) in enumerate(np.asarray(ops).tolist()):
            alpha = float(scalars[i])
            if op in TAIL_OPS:
                if i != n - 1:
                    raise ValueError(f"{OP_NAMES[op]} must be the last operation of a program")
                break
            if op == DOT:
                out.append(float(np.dot(self._slot(a, op), self._slot(b, op))))
            elif op == AXPY:
                y = self._slot(b, op)
                y += alpha * self._slot(a, op)
            elif op == SCALE:
                self._slot(a, op)[:] *= alpha
            elif op == COPY:
                np.copyto(self._slot(b, op), self._slot(a, op))
            elif op == LINCOMB:
                src, step, dst = self._slot(a, op), self._slot(b, op), self._slot(c, op)
                if c == a:
                    dst += alpha * step
                else:                            # also right when c == b
                    np.multiply(step, alpha, out=dst)
                    dst += src
            elif op == SWAP:
                self._slot(a, op)
                self._slot(b, op)
                self.v[a], self.v[b] = self.v[b], self.v[a]
            else:
                raise ValueError(f"unknown op code {op}")
        return out

    def parts(self, slot: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Views of slot ``slot``: the weights (n_weights,) and the bias (1,) or None."""
        a = self._slot(slot, EVAL)
        n = self.layout.n_weights
        return a[:n], (a[n:] if self.layout.has_bias else None)

    def finish_eval(self, op_row, inv_n: float, grad_w: np.ndarray, grad_b: np.ndarray | None,
                    stop_flag: bool = False) -> tuple[list[float], list[float]]:
        """Complete an ``EVAL``: form this shard's gradient of the objective from the summed
        data-term gradient and return the shard's partial results.

        Parameters
        ----------
        op_row : sequence of 4 ints
            The ``[EVAL, x, g, d]`` operation.
        inv_n : float
            ``1 / n_rows``: the data term is the mean log-loss.
        grad_w : float64 (n_weights,)
            Sum over all training rows of the log-loss gradient, this shard's weights.
        grad_b : float64 (1,) or None
            The same for the bias (bias server only).
        stop_flag : bool
            This rank's stop request, reported to the coordinator with the maxima.

        Returns
        -------
        sums : list of 3 floats
            ``(l2/2) * ||w||²`` of this shard, ``g · d`` and ``g · g`` over this shard.
        maxes : list of 2 floats
            ``max |g|`` over this shard (0 if empty) and the stop flag (0 or 1).
        """
        op, xs, gs, ds = (int(t) for t in op_row)
        if op != EVAL:
            raise ValueError(f"finish_eval needs an eval operation, got {OP_NAMES.get(op, op)}")
        xw, _ = self.parts(xs)
        g = self._slot(gs, op)
        d = self._slot(ds, op)
        n = self.layout.n_weights
        np.multiply(grad_w, inv_n, out=g[:n])
        if self.l2:
            g[:n] += self.l2 * xw
        if self.layout.has_bias:
            g[n] = inv_n * float(grad_b[0])
        penalty = 0.5 * self.l2 * float(np.dot(xw, xw))
        gmax = float(np.abs(g).max()) if g.size else 0.0
        sums = [penalty, float(np.dot(g, d)), float(np.dot(g, g))]
        return sums[:EVAL_SUMS], [gmax, 1.0 if stop_flag else 0.0][:EVAL_MAXES]
