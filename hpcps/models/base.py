"""The model protocol: what hpcps needs from a model (no MPI).

A model is a class constructed with the job's :class:`hpcps.config.JobConfig`. The worker
loop (:mod:`hpcps.worker.steps`) calls it like this for every minibatch::

    keys = model.batch_keys(Xb)                       # {table: sorted unique int64 keys}
    params = {t: client.pull(t, k) for t, k in keys.items()}   # (len(k), dim) arrays
    loss_sum, grads = model.loss_grad(Xb, yb, keys, params)
    for t in grads: client.push(t, keys[t], grads[t])

Under BSP the worker also calls ``batch_keys`` of the *next* minibatch during a step (its
pulls go with this step's clock: :class:`hpcps.worker.steps.SyncSteps`): after this step's
``loss_grad``, so that ``batch_keys(Xb)`` is still followed by the ``loss_grad`` of that
``Xb`` with no other ``batch_keys`` between (a model may keep what ``batch_keys`` computed
for it) — or, when the model says it may (:attr:`Model.keys_ahead`), before this step's
rows arrive, where it costs the step nothing.

Gradients are **sums** over the minibatch's examples (not means): the servers divide the
aggregated update by the examples of the step, so that N workers under BSP are exactly one
large minibatch. Tables are declared once by :meth:`Model.tables`; dense tables are pulled
and pushed by row keys like sparse ones (``np.arange(rows)`` for a whole matrix).

Data: :meth:`Model.load` returns this worker's rows of a split as ``(X, y)`` where ``X``
supports ``X[rows]`` and ``X.shape[0]`` (a scipy CSR matrix, a numpy array, ...), and ``y``
is a numpy array of the same length.

User models are named in a job file as ``[model] type = "package.module:ClassName"``;
they are imported only then (:func:`hpcps.models.load_model_class`).
"""

from __future__ import annotations

import numpy as np


class Model:
    """Base class of hpcps models; subclasses override every method that raises.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
        The job; ``cfg.model``, ``cfg.data`` and ``cfg.optimizer`` are the usual inputs.

    Attributes
    ----------
    name : str
        Short name used in messages and in ``model.h5``.
    loss_name : str
        Name of the training loss, e.g. ``"logloss"`` or ``"mse"`` (metrics records use
        ``train_<loss_name>``).
    loss_label : str
        How the loss is named in progress lines, e.g. ``"log-loss"``.
    primary_metric : str
        Key of :meth:`metrics` that summarises quality (``"auc"``, ``"rmse"``, ``"accuracy"``).
    keys_ahead : bool
        Whether :meth:`batch_keys` of the next minibatch may be called between
        ``batch_keys(X)`` and ``loss_grad(X)`` of this one (True: the model keeps nothing
        from one for the other, or keeps it per ``X``). Default False: a model that keeps
        per-batch state without checking which batch it is for stays correct.
    """

    name = "model"
    loss_name = "loss"
    loss_label = "loss"
    primary_metric = "loss"
    keys_ahead = False

    def __init__(self, cfg):
        self.cfg = cfg

    def tables(self) -> list:
        """The parameter tables, in table-id order.

        Build each optimizer with ``hpcps.core.optim.Optimizer.from_config(self.cfg.optimizer,
        l2=..., regularize=...)`` so that the job's rule and every key of it (Adam's betas,
        FTRL's l1/l2, ...) apply.

        Returns
        -------
        list of (hpcps.core.tables.TableSpec, hpcps.core.optim.Optimizer)
        """
        raise NotImplementedError

    def load(self, split: str, part: int, n_parts: int):
        """Rows of ``split`` (``"train"`` or ``"test"``) belonging to worker ``part`` of
        ``n_parts``; every row belongs to exactly one part, a part may be empty.

        Returns
        -------
        X : indexable by an int64 row array, with ``X.shape[0]`` rows
        y : ndarray (n,)

        Raises
        ------
        hpcps.data.DataError
            Malformed input; the message names the file and line or key.
        """
        raise NotImplementedError

    def localize(self, X):
        """The rows a worker trains on, made ready for its steps; optional (default: ``X``).

        Called by the worker with the matrix its minibatches are sliced from, once per
        epoch (a model should keep the result for the same ``X`` rather than redo it); the
        minibatches of the epoch are sliced from what it returns, and :meth:`batch_keys` of
        each must give the same keys as for the same rows of ``X``. The logistic model
        renumbers the columns of the worker's partition into its distinct features
        (:class:`hpcps.models.logistic_math.LocalizedCSR`), so that a step's distinct keys
        are found in a scratch array the size of the partition's features (kept in cache)
        instead of one the size of the whole feature space (or a sort, for 64-bit ids).

        Returns
        -------
        indexable by an int64 row array, with ``X.shape[0]`` rows (or None for None)
        """
        return X

    def batch_keys(self, X) -> dict:
        """Keys each table needs for the examples ``X``.

        Returns
        -------
        dict of str -> int64 ndarray (m,), sorted and unique, each key in ``[0, rows)``.
        Tables left out are neither pulled nor pushed for this batch.
        """
        raise NotImplementedError

    def loss_grad(self, X, y, keys: dict, params: dict):
        """Summed loss and summed gradients of the examples ``X, y``.

        Parameters
        ----------
        keys : dict of str -> int64 (m,)
            As returned by :meth:`batch_keys` for ``X``.
        params : dict of str -> ndarray (m, dim)
            The pulled rows, in the order of ``keys[t]``, in the table's dtype.

        Returns
        -------
        loss_sum : float
            Sum over the examples of the loss (without regularisation the servers apply).
        grads : dict of str -> ndarray (m, dim)
            Gradient sums with respect to ``params[t]``, in the table's dtype.
        """
        raise NotImplementedError

    def predict(self, X, keys: dict, params: dict) -> np.ndarray:
        """Predictions for ``X`` (float64, (n,) or (n, k)), e.g. probabilities or ratings."""
        raise NotImplementedError

    def metrics(self, y, pred) -> dict:
        """Quality of ``pred`` against ``y`` over a whole split: ``{name: float}``, with at
        least ``"n"`` (the row count), :attr:`loss_name` and :attr:`primary_metric`."""
        raise NotImplementedError

    def prepare_metrics(self) -> None:
        """Load what :meth:`metrics` needs (a library import, say) so that the first epoch's
        evaluation does not pay it inside the training clock. Called once by the chief worker
        before its first step. Local. Default: nothing."""

    def describe(self, m: dict) -> str:
        """One line of test metrics ``m`` (from :meth:`metrics`) for the epoch report."""
        return "test " + "  ".join(f"{k} {v:.4f}" for k, v in m.items() if k != "n")
