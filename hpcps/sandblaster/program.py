"""Programs: the short lists of vector operations the coordinator sends to the servers (no MPI).

A Sandblaster server holds, for its key range, a fixed set of float64 vectors ("slots": the
parameters ``x``, the gradient ``g``, the search direction ``d``, the trial point and its
gradient, and the history pairs ``s_i``, ``y_i``). The coordinator never sees these vectors:
it sends *programs* — at most :data:`MAX_OPS` operations, each an op code, three slot
indices and one scalar — and gets back scalars: the sum over servers of each ``DOT``'s
partial dot product (and, after an evaluation, the objective's penalty term, two dot products
and the gradient's largest magnitude). This is Sandblaster's division of labour (Dean et al.,
"Large Scale Distributed Deep Networks", NIPS 2012, §4.2): "the coordinator ... issues
commands ... (e.g. dot product, scaling, coefficient-wise addition, multiplication) that can be
performed by each parameter server shard independently".

Operations (``v[i]`` is slot ``i`` of a shard, ``α`` the operation's scalar)
============  ==========  ===============================================================
op            slots       effect on every shard
============  ==========  ===============================================================
``DOT``       a, b        result ``Σ v[a] · v[b]`` (summed over shards)
``AXPY``      a, b        ``v[b] += α v[a]``
``SCALE``     a           ``v[a] *= α``
``COPY``      a, b        ``v[b] = v[a]``
``LINCOMB``   a, b, c     ``v[c] = v[a] + α v[b]``
``SWAP``      a, b        exchange ``v[a]`` and ``v[b]`` (no data moves)
``EVAL``      a, b, c     evaluate the objective at ``v[a]``: the workers compute the
                          data term's gradient; ``v[b] = α · (summed gradient) + l2 ·
                          v[a]`` (bias not penalised; ``α = 1 / n_rows``); results
                          ``(l2/2)||w||²``, ``v[b]·v[c]``, ``v[b]·v[b]`` (sums) and
                          ``max |v[b]|`` plus a stop flag (maxima)
``GATHER``    a           send ``v[a]`` to the coordinator
``STOP``                  leave the server loop
============  ==========  ===============================================================

``EVAL``, ``GATHER`` and ``STOP`` may only be the last operation of a program.
"""

from __future__ import annotations

import numpy as np

DOT, AXPY, SCALE, COPY, LINCOMB, SWAP, EVAL, GATHER, STOP = range(1, 10)
OP_NAMES = {DOT: "dot", AXPY: "axpy", SCALE: "scale", COPY: "copy", LINCOMB: "lincomb",
            SWAP: "swap", EVAL: "eval", GATHER: "gather", STOP: "stop"}
TAIL_OPS = (EVAL, GATHER, STOP)
#: Largest number of operations in one program (equal to
#: :data:`hpcps.comm.sandblaster.MAX_OPS`, checked by the tests).
MAX_OPS = 16
#: Summed / maximised results of an ``EVAL``.
EVAL_SUMS, EVAL_MAXES = 3, 2


class Program:
    """A program under construction; methods return ``self`` so that calls chain.

    Examples
    --------
    >>> p = Program().copy(1, 2).scale(-1.0, 2).dot(1, 2)
    >>> p.ops.shape, p.n_sums
    ((3, 4), 1)
    """

    def __init__(self):
        self._ops: list = []
        self._scalars: list = []

    def _add(self, op: int, a: int = 0, b: int = 0, c: int = 0, alpha: float = 0.0) -> "Program":
        if self._ops and self._ops[-1][0] in TAIL_OPS:
            raise ValueError(f"no operation may follow {OP_NAMES[self._ops[-1][0]]}")
        if len(self._ops) >= MAX_OPS:
            raise ValueError(f"a program holds at most {MAX_OPS} operations")
        alpha = float(alpha)
        if not np.isfinite(alpha):
            raise ValueError(f"{OP_NAMES[op]}: scalar must be finite, got {alpha}")
        self._ops.append((op, int(a), int(b), int(c)))
        self._scalars.append(alpha)
        return self

    def dot(self, a: int, b: int) -> "Program":
        """Append ``DOT``: one summed result ``v[a] · v[b]``."""
        return self._add(DOT, a, b)

    def axpy(self, alpha: float, a: int, b: int) -> "Program":
        """Append ``AXPY``: ``v[b] += alpha * v[a]``."""
        return self._add(AXPY, a, b, alpha=alpha)

    def scale(self, alpha: float, a: int) -> "Program":
        """Append ``SCALE``: ``v[a] *= alpha``."""
        return self._add(SCALE, a, alpha=alpha)

    def copy(self, a: int, b: int) -> "Program":
        """Append ``COPY``: ``v[b] = v[a]``."""
        return self._add(COPY, a, b)

    def lincomb(self, a: int, alpha: float, b: int, c: int) -> "Program":
        """Append ``LINCOMB``: ``v[c] = v[a] + alpha * v[b]``."""
        return self._add(LINCOMB, a, b, c, alpha=alpha)

    def swap(self, a: int, b: int) -> "Program":
        """Append ``SWAP``: exchange slots ``a`` and ``b``."""
        return self._add(SWAP, a, b)

    def eval(self, x: int, g: int, d: int, inv_n: float) -> "Program":
        """Append ``EVAL`` at ``v[x]``, gradient into ``v[g]``, directional derivative along
        ``v[d]``; ``inv_n`` = 1 / (number of training rows)."""
        return self._add(EVAL, x, g, d, alpha=inv_n)

    def gather(self, a: int) -> "Program":
        """Append ``GATHER`` of slot ``a``."""
        return self._add(GATHER, a)

    def stop(self) -> "Program":
        """Append ``STOP``."""
        return self._add(STOP)

    @property
    def ops(self) -> np.ndarray:
        """int64 (n, 4): ``[op, a, b, c]`` per operation."""
        return np.array(self._ops, dtype=np.int64).reshape(-1, 4)

    @property
    def scalars(self) -> np.ndarray:
        """float64 (n,): the scalar of each operation."""
        return np.array(self._scalars, dtype=np.float64)

    @property
    def tail(self) -> int | None:
        """The final ``EVAL``/``GATHER``/``STOP`` op code, or None."""
        return self._ops[-1][0] if self._ops and self._ops[-1][0] in TAIL_OPS else None

    @property
    def n_sums(self) -> int:
        """Length of the summed result vector."""
        return result_sizes(self.ops)[0]

    @property
    def n_maxes(self) -> int:
        """Length of the maximised result vector."""
        return result_sizes(self.ops)[1]

    def __len__(self) -> int:
        return len(self._ops)


def result_sizes(ops: np.ndarray) -> tuple[int, int]:
    """Lengths of a program's summed and maximised result vectors.

    Parameters
    ----------
    ops : int64 (n, 4)

    Returns
    -------
    (n_sums, n_maxes) : (int, int)
        One sum per ``DOT`` plus :data:`EVAL_SUMS` for an ``EVAL``; :data:`EVAL_MAXES`
        maxima for an ``EVAL``.
    """
    codes = np.asarray(ops).reshape(-1, 4)[:, 0]
    n_eval = int(np.count_nonzero(codes == EVAL))
    return int(np.count_nonzero(codes == DOT)) + EVAL_SUMS * n_eval, EVAL_MAXES * n_eval
