"""A worker's minibatches of CSR rows, gathered in step order a chunk of steps at a time
(no MPI).

Slicing a minibatch out of the partition with ``X[rows]`` (scipy's fancy row index) makes
new arrays and runs scipy's index checks every step: on ``jobs/adult_lr.toml`` with 3
workers and 1 server on 2 cores it took 310-330 us of a 2.1 ms step (traced 2026-12-04),
more than the gradient. :class:`EpochBatches` copies the rows of the next ``chunk`` steps
with one compiled call (:func:`hpcps.kernels.keys.take_csr_rows`) into one of two buffers
kept from epoch to epoch, and hands out each step's rows as a matrix over a slice of them (no copy).
Two buffers: a step's rows stay whole while the next step's are taken (the fused BSP step
slices the next minibatch before this one's gradient).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from hpcps.kernels.keys import take_csr_rows

#: Rows gathered per chunk (its steps: this many rows over the batch size, at least one):
#: each of the two buffers holds about this many rows' entries.
CHUNK_ROWS = 16384


class EpochBatches:
    """Step ``i``'s rows ``order[i * batch_size:(i + 1) * batch_size]`` of a CSR matrix.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix (n, d), or a subclass (the minibatches are of its class;
        a ``global_keys`` attribute is carried over, :class:`hpcps.models.logistic_math.LocalizedCSR`)
    y : ndarray (n, ...)
    order : int64 ndarray
        The epoch's rows in step order.
    batch_size : int
        Rows per step (the last step may have fewer).
    """

    def __init__(self, X, y, order, batch_size: int):
        self.X, self.y, self.order, self.B = X, y, order, int(batch_size)
        self.indptr = np.ascontiguousarray(X.indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(X.indices)
        self.data = np.ascontiguousarray(X.data)
        self.per_chunk = max(1, CHUNK_ROWS // max(1, self.B))      # steps per chunk
        self.slots = [None, None]     # (chunk, indptr, indices, data, y) of chunks c % 2

    @staticmethod
    def fits(X, y, order) -> bool:
        """Whether the rows can be taken this way: a CSR matrix and an order."""
        return isinstance(X, csr_matrix) and order is not None and y is not None

    def start(self, order) -> None:
        """A new epoch's ``order`` of the same rows: the buffers (and ``X``'s int64 row
        pointers) are kept, their chunks taken again."""
        self.order = order
        self.slots = [None if s is None else (-1,) + s[1:] for s in self.slots]

    def same_rows(self, i: int, rows) -> bool:
        """Whether ``rows`` are step ``i``'s (the first and last of them, and their number)."""
        a = i * self.B
        n = min(self.B, self.order.size - a)
        return (rows.size == n and n > 0 and rows[0] == self.order[a]
                and rows[-1] == self.order[a + n - 1])

    def _chunk(self, c: int):
        slot = self.slots[c % 2]
        if slot is not None and slot[0] == c:
            return slot
        k = self.per_chunk * self.B
        rows = self.order[c * k:(c + 1) * k]
        old = slot if slot is not None else (None, np.empty(k + 1, dtype=np.int64),
                                             np.empty(1, self.indices.dtype),
                                             np.empty(1, self.data.dtype), None)
        ip, ind, dat = old[1], old[2], old[3]
        if ip.size < rows.size + 1:
            ip = np.empty(rows.size + 1, dtype=np.int64)
        m = take_csr_rows(rows, self.indptr, self.indices, self.data, ip, ind, dat)
        if m > ind.size or m > dat.size:         # grown once, with room for the next chunks
            ind = np.empty(m + m // 4, dtype=self.indices.dtype)
            dat = np.empty(m + m // 4, dtype=self.data.dtype)
            take_csr_rows(rows, self.indptr, self.indices, self.data, ip, ind, dat)
        slot = self.slots[c % 2] = (c, ip, ind, dat, self.y[rows])
        return slot

    def batch(self, i: int):
        """``(Xb, yb)``: step ``i``'s rows, ``Xb`` of ``X``'s class over the chunk's buffer
        (valid until the chunk two after its own is taken)."""
        c, j = divmod(i, self.per_chunk)
        _, ip, ind, dat, yc = self._chunk(c)
        a = j * self.B
        b = min(a + self.B, yc.shape[0])
        s, e = int(ip[a]), int(ip[b])
        X = self.X
        out = type(X)((dat[s:e], ind[s:e], ip[a:b + 1] - s), shape=(b - a, X.shape[1]),
                      copy=False)
        keys = getattr(X, "global_keys", None)
        if keys is not None:
            out.global_keys = keys
        return out, yc[a:b]


def step_rows(batches, X, y, i: int, rows):
    """``(Xb, yb)``: the examples of step ``i``, whose rows of ``X`` are ``rows``; from
    ``batches`` (an :class:`EpochBatches` of ``X`` and ``y``, or None) when they are its
    step ``i``'s, else ``X[rows], y[rows]``."""
    if batches is not None and batches.same_rows(i, rows):
        return batches.batch(i)
    return X[rows], y[rows]


def epoch_batches(prev, X, y, order, batch_size: int):
    """The :class:`EpochBatches` of an epoch: ``prev`` (the one of the epoch before, or
    None) started on ``order`` when it is of the same ``X``, ``y`` and batch size, else a
    new one; None when the rows cannot be taken this way (not a CSR matrix, no order)."""
    if not EpochBatches.fits(X, y, order):
        return None
    if prev is not None and prev.X is X and prev.y is y and prev.B == int(batch_size):
        prev.start(order)
        return prev
    return EpochBatches(X, y, order, batch_size)
