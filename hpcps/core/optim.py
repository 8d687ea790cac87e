"""Server-side update rules, injected into the server loop (no MPI).

An :class:`Optimizer` owns the rule's hyper-parameters and its per-row state ("slots");
the server calls :meth:`Optimizer.init_slots` once per shard and :meth:`Optimizer.apply`
for each aggregated update. Kernels: :mod:`hpcps.kernels.optim`.

Slots, by rule (each a named array with one entry per table row, checkpointed by name
and re-sharded like the rows; :meth:`Optimizer.slot_specs` gives their shapes)::

    sgd      (none)
    adagrad  accumulator  (rows, dim) table dtype   sum of squared gradients
    adam     m, v         (rows, dim) table dtype   first and second moment estimates
             step         (rows,)     int64         updates this row has received
    ftrl     z, n         (rows, dim) table dtype   McMahan et al.'s z_i and n_i

AdaGrad's slot is an array shaped like the table. Adam's and FTRL's slots live in one
packed record per row (:func:`hpcps.kernels.optim.state_dtype`), so an update touches the
row's weights and one state record; :meth:`Optimizer.slots_dict` hands out each slot as
a named view of it.
"""

from __future__ import annotations

import math

import numpy as np

from hpcps.kernels import optim as _k

RULES = ("sgd", "adagrad", "adam", "ftrl")


class Optimizer:
    """A sparse update rule with duplicate keys summed before the update.

    Parameters
    ----------
    name : {"sgd", "adagrad", "adam", "ftrl"}
        Plain SGD (Robbins & Monro 1951); AdaGrad (Duchi, Hazan & Singer, JMLR 2011, as used
        by Downpour SGD, Dean et al. NIPS 2012 §4.1); lazy Adam (Kingma & Ba, ICLR 2015,
        Algorithm 1, with a step count per row); FTRL-Proximal (McMahan et al., KDD 2013,
        Algorithm 1, per coordinate).
    learning_rate : float
        Step size (> 0); FTRL's alpha.
    l2 : float
        The model's L2 penalty, added to the gradient of the rows an update touches ("lazy"
        regularisation), for every rule.
    initial_accumulator : float
        AdaGrad's starting sum of squared gradients (>= 0).
    eps : float
        AdaGrad's and Adam's denominator guard (> 0).
    beta1, beta2 : float
        Adam's moment decay rates, in [0, 1).
    beta : float
        FTRL's learning-rate offset (>= 0): per-coordinate rate ``alpha / (beta + sqrt(n))``.
    lambda1, lambda2 : float
        FTRL's L1 and L2 strengths (>= 0, job file ``[optimizer] l1`` and ``l2``), applied in
        its closed form to the sum of all steps' losses; ``lambda1`` makes exact zeros.

    Raises
    ------
    ValueError
        For an unknown rule or a hyper-parameter out of range (the message names it).
    """

    def __init__(self, name: str, learning_rate: float, l2: float = 0.0,
                 initial_accumulator: float = 0.1, eps: float = 1e-8, beta1: float = 0.9,
                 beta2: float = 0.999, beta: float = 1.0, lambda1: float = 0.0,
                 lambda2: float = 0.0):
        if name not in RULES:
            raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(RULES)}")
        self.name = name
        self.learning_rate = float(learning_rate)
        self.l2 = float(l2)
        self.initial_accumulator = float(initial_accumulator)
        self.eps = float(eps)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.beta = float(beta)
        self.lambda1 = float(lambda1)
        self.lambda2 = float(lambda2)
        for key, v, ok, what in [
                ("learning_rate", self.learning_rate, self.learning_rate > 0, "> 0"),
                ("l2", self.l2, self.l2 >= 0, ">= 0"),
                ("initial_accumulator", self.initial_accumulator, self.initial_accumulator >= 0, ">= 0"),
                ("eps", self.eps, self.eps > 0, "> 0"),
                ("beta1", self.beta1, 0 <= self.beta1 < 1, "in [0, 1)"),
                ("beta2", self.beta2, 0 <= self.beta2 < 1, "in [0, 1)"),
                ("beta", self.beta, self.beta >= 0, ">= 0"),
                ("lambda1", self.lambda1, self.lambda1 >= 0, ">= 0"),
                ("lambda2", self.lambda2, self.lambda2 >= 0, ">= 0")]:
            if not (math.isfinite(v) and ok):
                raise ValueError(f"optimizer {name}: {key} must be finite and {what}, got {v}")

    @classmethod
    def from_config(cls, o, l2: float = 0.0, regularize: bool = True) -> "Optimizer":
        """The optimizer of a job's ``[optimizer]`` section for one table.

        Parameters
        ----------
        o : hpcps.config.OptimizerConfig
        l2 : float
            The table's L2 penalty on the gradient (``[model] l2`` for weights, 0 for biases).
        regularize : bool
            Apply FTRL's ``l1``/``l2`` to this table (``False`` e.g. for a bias, which an L1
            penalty should not zero).
        """
        return cls(o.name, o.learning_rate, l2=l2, initial_accumulator=o.initial_accumulator,
                   eps=o.eps, beta1=o.beta1, beta2=o.beta2, beta=o.beta,
                   lambda1=o.l1 if regularize else 0.0, lambda2=o.l2 if regularize else 0.0)

    @property
    def slot_names(self) -> tuple:
        """Names of the per-row state arrays (checkpointed with the table), in order."""
        return {"sgd": (), "adagrad": ("accumulator",), "adam": ("m", "v", "step"),
                "ftrl": ("z", "n")}[self.name]

    def slot_specs(self, dim: int, dtype) -> dict:
        """``{slot name: (shape after the row axis, dtype name)}`` for a table of ``dim``
        columns and ``dtype`` — e.g. adam: ``{"m": ((dim,), "float32"), ...,
        "step": ((), "int64")}``."""
        dt = np.dtype(dtype).name
        return {s: (((), "int64") if s == "step" else ((int(dim),), dt)) for s in self.slot_names}

    def slot_bytes_per_row(self, dim: int, dtype) -> int:
        """Bytes of optimizer state per table row."""
        return sum(int(np.prod(tail, dtype=np.int64)) * np.dtype(dt).itemsize
                   for tail, dt in self.slot_specs(dim, dtype).values())

    def init_slots(self, shape, dtype, w=None):
        """Per-row optimizer state for a shard of ``shape`` = (rows, dim).

        Parameters
        ----------
        shape : (int, int)
        dtype : float32 or float64
            The table's dtype.
        w : ndarray (rows, dim), optional
            The shard's initial weights. FTRL starts from ``n = 0`` and the ``z`` whose closed
            form is ``w``, ``z = -(beta / alpha + lambda2) w - sign(w) lambda1`` (``z = 0`` for
            zero weights), so that a randomly initialised table keeps its values until its
            rows are updated (with ``beta = lambda2 = 0`` no non-zero ``w`` can be represented
            and the rows start at 0 on their first update). Ignored by the other rules.

        Returns
        -------
        None (sgd), ndarray ``shape`` (adagrad: filled with ``initial_accumulator``), or the
        packed records (adam, ftrl: :func:`hpcps.kernels.optim.new_state`, zero moments and
        step counts).
        """
        rows, dim = (int(x) for x in shape)
        if self.name == "sgd":
            return None
        if self.name == "adagrad":
            return np.full((rows, dim), self.initial_accumulator, dtype=dtype)
        state = _k.new_state(self.name, rows, dim, dtype)
        if self.name == "ftrl" and w is not None and np.any(w):
            w = np.asarray(w).reshape(rows, dim)
            dt = np.dtype(dtype).type
            c = dt(self.beta / self.learning_rate + self.lambda2)
            state["z"] = -c * w - np.sign(w).astype(dtype) * dt(self.lambda1)
        return state

    def slots_dict(self, slots) -> dict:
        """``{slot name: array}`` for a shard's ``slots`` (as made by :meth:`init_slots`):
        (rows, dim) or (rows,) views, in :attr:`slot_names` order."""
        if self.name == "sgd":
            return {}
        if self.name == "adagrad":
            return {"accumulator": slots}
        return {s: slots[s] for s in self.slot_names}

    def slots_from_dict(self, d: dict):
        """Inverse of :meth:`slots_dict`: the state object from named slot arrays (copied).

        Raises
        ------
        ValueError
            If a slot is missing or the slots' shapes or dtypes do not fit together (the
            message names the slot).
        """
        if self.name == "sgd":
            return None
        missing = [s for s in self.slot_names if s not in d]
        if missing:
            raise ValueError(f"optimizer {self.name}: slot(s) {missing} missing (got {sorted(d)})")
        first = np.asarray(d[self.slot_names[0]])
        if first.ndim != 2:
            raise ValueError(f"optimizer {self.name}: slot {self.slot_names[0]!r} must be "
                             f"(rows, dim), got shape {first.shape}")
        if self.name == "adagrad":
            return np.ascontiguousarray(first)
        rows, dim = first.shape
        specs = self.slot_specs(dim, first.dtype)
        state = _k.new_state(self.name, rows, dim, first.dtype)
        for s, (tail, dt) in specs.items():
            a = np.asarray(d[s])
            if a.shape != (rows, *tail) or a.dtype != np.dtype(dt):
                raise ValueError(f"optimizer {self.name}: slot {s!r} has shape {a.shape} and "
                                 f"dtype {a.dtype}, expected {(rows, *tail)} {dt}")
            state[s] = a
        return state

    def apply(self, w: np.ndarray, slots, rows: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """Apply ``scale * grads`` at local ``rows`` of ``w`` (in place); duplicates summed.

        Parameters
        ----------
        w : ndarray (R, dim), float32 or float64
        slots : the state made by :meth:`init_slots` (None for SGD)
        rows : int64 ndarray (n,), local rows, duplicates allowed
        grads : ndarray (n, dim), ``w``'s dtype
        scale : float
            Multiplies the summed gradients (1 / examples in the step under BSP).

        Raises
        ------
        ValueError, TypeError
            As :func:`hpcps.kernels.optim.apply_sparse` (nothing is modified then).
        """
        _k.apply_sparse(self.name, w, slots, rows, grads, self.learning_rate, self.l2,
                        scale, self.eps, beta1=self.beta1, beta2=self.beta2, beta=self.beta,
                        lambda1=self.lambda1, lambda2=self.lambda2)


class NonFiniteError(FloatingPointError):
    """A gradient, loss or parameter became NaN or infinite: the run diverged.

    Raised by a worker before it pushes (so no NaN reaches the servers) and by a server before
    it applies a push (so a NaN from one rank cannot poison the model). The usual cause is a
    learning rate that is too large for the model; lower ``[optimizer] learning_rate``.
    """


#: Arrays of at most this many elements take the exact test at once (``errstate`` and the
#: reduction wrappers cost ~3 us, most of a small push's check).
_SMALL_FINITE = 4096


def all_finite(a: np.ndarray) -> bool:
    """True when no element of ``a`` is NaN or infinite.

    One reduction, no temporary: a sum is finite only if every term is (NaN and infinities
    propagate), so a finite sum settles it; only a non-finite sum (a NaN/inf, or finite
    values whose sum overflows) takes the exact test, ``np.isfinite(a).all()``, which
    allocates a boolean array as large as ``a`` (2-4x slower on a 64 MiB push here).
    """
    a = np.asarray(a)
    if a.size == 0 or a.dtype.kind not in "fc":
        return True
    if a.size <= _SMALL_FINITE:     # a small push: the exact test, without errstate's cost
        return bool(np.logical_and.reduce(np.isfinite(a), axis=None))
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(a)):
            return True
    return bool(np.isfinite(a).all())


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
        if not all_finite(a):
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise NonFiniteError(f"{what}: {bad} non-finite value(s) of {a.size} (NaN or inf); "
                                 "the run diverged and was stopped before they were pushed or a model "
                                 "file was written; lower [optimizer] learning_rate")
