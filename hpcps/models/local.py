"""A model's tables in one process, updated as the servers update them (no MPI).

The reference for distributed runs and the quick way to check a model's quality: one
worker under BSP, without the parameter server around it. Each step does what
:class:`hpcps.worker.steps.SyncSteps` and the servers do::

    keys = model.batch_keys(Xb)
    loss, grads = model.loss_grad(Xb, yb, keys, {t: w[t][keys[t]] for t in keys})
    optimizer[t].apply(w[t], slots[t], keys[t], grads[t], scale=1 / len(Xb))

with the tables started from :meth:`hpcps.core.tables.TableSpec.initial_rows` and the same
:class:`hpcps.core.optim.Optimizer` (Cython kernels) the servers run. Tables are indexed by key
directly (no key permutation: that only decides which server holds a row).
"""

from __future__ import annotations

import numpy as np

from hpcps.data.lines import in_chunks


class LocalTables:
    """Every table of a model, whole, in this process.

    Parameters
    ----------
    tables : list of (hpcps.core.tables.TableSpec, hpcps.core.optim.Optimizer)
        As returned by :meth:`hpcps.models.base.Model.tables`.
    seed : int
        The job seed (initial values).

    Attributes
    ----------
    w : dict of str -> ndarray (num_keys, dim)
        The tables, in the spec's dtype.
    """

    def __init__(self, tables, seed: int = 0):
        self.specs = {s.name: s for s, _ in tables}
        self.opts = {s.name: o for s, o in tables}
        self.w = {s.name: s.initial_rows(np.arange(s.num_keys), seed) for s, _ in tables}
        self.slots = {s.name: o.init_slots((s.num_keys, s.dim), s.dtype, w=self.w[s.name])
                      for s, o in tables}

    def pull(self, keys: dict) -> dict:
        """Copies of the rows ``keys[t]`` of each table ``t``: ``{t: (m, dim)}``."""
        return {t: self.w[t][k] for t, k in keys.items()}

    def push(self, keys: dict, grads: dict, scale: float) -> None:
        """Apply ``scale * grads[t]`` at rows ``keys[t]`` with each table's optimizer."""
        for t, g in grads.items():
            self.opts[t].apply(self.w[t], self.slots[t], np.asarray(keys[t], dtype=np.int64),
                               np.ascontiguousarray(g, dtype=self.specs[t].dtype), scale)


def evaluate(model, tables: LocalTables, X, y, chunk: int = 8192, labels: list | None = None) -> dict:
    """``model.metrics`` of the predictions for ``X`` against ``y`` (in chunks of rows; a
    streamed ``X`` is read once, in order: :func:`hpcps.data.lines.in_chunks`, so its labels
    can be read only here: ``labels``, a list, receives the array of the labels scored)."""
    preds, ys = [], []
    for Xc, yc in in_chunks(X, y, chunk):
        ys.append(np.asarray(yc, dtype=np.float64))
        if Xc.shape[0] == 0:
            continue
        keys = model.batch_keys(Xc)
        preds.append(np.asarray(model.predict(Xc, keys, tables.pull(keys)), dtype=np.float64))
    p = np.concatenate(preds) if preds else np.empty(0)
    yv = np.concatenate(ys) if ys else np.empty(0)
    if labels is not None:
        labels.append(yv)
    return model.metrics(yv, p)


def train_local(model, epochs: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                on_epoch=None):
    """Train ``model`` on its whole train split in this process (one worker, BSP).

    Parameters
    ----------
    model : hpcps.models.base.Model
    epochs, batch_size : int
    seed : int
        Initial values and the per-epoch shuffles (``default_rng([seed, 0, epoch])``, the
        order a single worker of a job reads its rows in), so that a job with one worker
        under BSP trains the same weights (bit-identical in float64).
    shuffle : bool
    on_epoch : callable(epoch, train_loss, test_metrics) or None
        Called after every epoch (1-based epoch, mean training loss per example, the
        model's test metrics).

    Returns
    -------
    tables : LocalTables
    history : list of dict
        ``{"epoch", "train_<loss_name>", "test_<metric>"...}`` per epoch.
    """
    X, y = model.load("train", 0, 1)
    Xt, yt = model.load("test", 0, 1)
    tables = LocalTables(model.tables(), seed)
    history = []
    for epoch in range(epochs):
        # the order hpcps.core.planning.epoch_order gives worker 0 of 1
        order = (np.random.default_rng([seed, 0, epoch]).permutation(X.shape[0]) if shuffle
                 else np.arange(X.shape[0]))
        loss = 0.0
        for a in range(0, order.size, batch_size):
            rows = order[a:a + batch_size]
            Xb, yb = X[rows], y[rows]
            keys = model.batch_keys(Xb)
            lsum, grads = model.loss_grad(Xb, yb, keys, tables.pull(keys))
            loss += lsum
            tables.push(keys, grads, 1.0 / rows.size)
        m = evaluate(model, tables, Xt, yt)
        rec = {"epoch": epoch + 1, f"train_{model.loss_name}": loss / max(X.shape[0], 1)}
        rec.update({f"test_{k}": v for k, v in m.items() if k != "n"})
        history.append(rec)
        if on_epoch is not None:
            on_epoch(epoch + 1, rec[f"train_{model.loss_name}"], m)
    return tables, history
