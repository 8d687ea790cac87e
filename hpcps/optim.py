"""Server-side update rules, injected into the server loop (no MPI).

An :class:`Optimizer` owns the rule's hyper-parameters and its per-row state ("slots");
the server calls :meth:`Optimizer.init_slots` once per shard and :meth:`Optimizer.apply`
for each aggregated update. Kernels: :mod:`hpcps.kernels.optim`.
"""

from __future__ import annotations

import numpy as np

from .kernels import optim as _k

RULES = ("sgd", "adagrad")


class Optimizer:
    """A sparse update rule with duplicate keys summed before the update.

    Parameters
    ----------
    name : {"sgd", "adagrad"}
        Plain SGD (Robbins & Monro 1951) or AdaGrad (Duchi, Hazan & Singer, JMLR 2011,
        as used by Downpour SGD, Dean et al. NIPS 2012 §4.1).
    learning_rate : float
        Step size (> 0).
    l2 : float
        L2 penalty applied to the rows an update touches ("lazy" regularisation).
    initial_accumulator : float
        AdaGrad's starting sum of squared gradients.
    eps : float
        AdaGrad's denominator guard.
    """

    def __init__(self, name: str, learning_rate: float, l2: float = 0.0,
                 initial_accumulator: float = 0.1, eps: float = 1e-8):
        if name not in RULES:
            raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(RULES)}")
        self.name = name
        self.learning_rate = float(learning_rate)
        self.l2 = float(l2)
        self.initial_accumulator = float(initial_accumulator)
        self.eps = float(eps)

    @property
    def slot_names(self) -> tuple:
        """Names of the per-row state arrays (checkpointed with the table)."""
        return ("accumulator",) if self.name == "adagrad" else ()

    def slots_dict(self, slots) -> dict:
        """``{slot name: array}`` for a shard's ``slots`` (as made by :meth:`init_slots`)."""
        return {"accumulator": slots} if self.name == "adagrad" else {}

    def slots_from_dict(self, d: dict):
        """Inverse of :meth:`slots_dict`."""
        return d["accumulator"] if self.name == "adagrad" else None

    def init_slots(self, shape, dtype):
        """Per-row optimizer state for a shard of ``shape``; ``None`` for SGD."""
        if self.name == "adagrad":
            return np.full(shape, self.initial_accumulator, dtype=dtype)
        return None

    def apply(self, w: np.ndarray, slots, rows: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """Apply ``scale * grads`` at local ``rows`` of ``w`` (in place); duplicates summed.

        Parameters
        ----------
        w : ndarray (R, dim), float32 or float64
        slots : ndarray like ``w`` or None
        rows : int64 ndarray (n,), local rows, duplicates allowed
        grads : ndarray (n, dim), ``w``'s dtype
        scale : float
            Multiplies the summed gradients (1 / examples in the step under BSP).
        """
        _k.apply_sparse(self.name, w, slots, rows, grads, self.learning_rate, self.l2,
                        scale, self.eps)


class NonFiniteError(FloatingPointError):
    """A gradient, loss or parameter became NaN or infinite: the run diverged.

    Raised by a worker before it pushes (so no NaN reaches the servers) and by a server before
    it applies a push (so a NaN from one rank cannot poison the model). The usual cause is a
    learning rate that is too large for the model; lower ``[optimizer] learning_rate``.
    """


def check_finite(what: str, *arrays) -> None:
    """Raise :class:`NonFiniteError` naming ``what`` if any array holds a NaN or infinity.

    Parameters
    ----------
    what : str
        Where the values come from, e.g. ``"worker 2 gradient at clock 17"``.
    *arrays : array-like or float

    Raises
    ------
    NonFiniteError
    """
    for a in arrays:
        a = np.asarray(a)
        if a.size and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise NonFiniteError(f"{what}: {bad} non-finite value(s) of {a.size} (NaN or inf); "
                                 "the run diverged and was stopped before they were pushed or a model "
                                 "file was written; lower [optimizer] learning_rate")
