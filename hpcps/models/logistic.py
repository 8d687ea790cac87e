"""Sparse logistic regression as an hpcps model (no MPI).

Tables ``weights`` (sparse, one float per feature) and ``bias`` (dense, one row); loss and
gradient by the Cython kernels of :mod:`hpcps.kernels.logistic` via :mod:`hpcps.models.logistic_math`.
"""

from __future__ import annotations

import numpy as np

from hpcps.models import logistic_math as lr
from hpcps.data.source import load_split
from hpcps.models.base import Model


class LogisticRegression(Model):
    """Binary logistic regression on sparse features (``[model] type = "logistic"``).

    Data: any ``[data]`` format giving a CSR matrix and labels in {0, 1} (``adult_csv``,
    ``svmlight``). The L2 penalty ``[model] l2`` is applied by the servers to the rows a step
    touches.
    """

    name = "logistic"
    loss_name = "logloss"
    loss_label = "log-loss"
    primary_metric = "auc"
    keys_ahead = True       # the renumbering is kept per batch (the last two)

    def tables(self) -> list:
        return lr.logistic_tables(self.cfg)

    def load(self, split, part, n_parts):
        return load_split(self.cfg.data, split, part, n_parts,
                          cache_dir=self.cfg.output.dir / "line-index")

    def localize(self, X):
        # the worker's partition with its columns renumbered (kept for the next epochs)
        kept = getattr(self, "_localized", None)
        if kept is None or kept[0] is not X:
            kept = self._localized = (X, lr.localize(X))
        return kept[1]

    def batch_keys(self, X) -> dict:
        # scratch of one int32 per column: the test rows' (the whole feature space) and the
        # localized training rows' (their distinct features) are kept apart
        n = X.shape[1] if getattr(X, "global_keys", None) is None else X.global_keys.size
        marks = getattr(self, "_marks", None)
        if marks is None:
            marks = self._marks = {}
        if n not in marks:
            if len(marks) >= 4:
                marks.clear()
            marks[n] = lr.new_marks(n)
        same = getattr(self, "_same", None)
        if same is not None and same[0] is X and same[1] is X.indices and same[2] == X.nnz:
            keys, local = same[3], same[4]      # the test rows again: the next epoch's evaluation
        else:
            keys, local = lr.batch_keys(X, marks[n])
            if getattr(X, "global_keys", None) is None:
                # rows in the whole feature space (the test rows; a training minibatch of a
                # localized partition has global_keys): kept for the same matrix's next call
                self._same = (X, X.indices, X.nnz, keys, local)
        # loss_grad/predict of this batch reuse the renumbering; the one before's is kept
        # too (the worker asks for the next batch's keys before this one's loss_grad)
        self._last = [(X, local)] + getattr(self, "_last", [])[:1]
        return {lr.WEIGHTS: keys, lr.BIAS: np.zeros(1, dtype=np.int64)}

    def _local(self, X, keys):
        for x, local in getattr(self, "_last", ()):
            if x is X:
                return local
        cols = X.indices if getattr(X, "global_keys", None) is None else X.global_keys[X.indices]
        return np.searchsorted(keys[lr.WEIGHTS], cols).astype(np.int64, copy=False)

    def loss_grad(self, X, y, keys, params):
        w = params[lr.WEIGHTS][:, 0]
        loss, g, gb = lr.loss_and_gradient(X, y, self._local(X, keys), w, params[lr.BIAS][0, 0])
        return loss, {lr.WEIGHTS: g.reshape(-1, 1),
                      lr.BIAS: np.array([[gb]], dtype=params[lr.BIAS].dtype)}

    def predict(self, X, keys, params):
        return lr.predict(X, self._local(X, keys), params[lr.WEIGHTS][:, 0], params[lr.BIAS][0, 0])

    def prepare_metrics(self) -> None:
        lr.load_metrics()

    def metrics(self, y, pred) -> dict:
        return lr.binary_metrics(y, pred)

    def describe(self, m: dict) -> str:
        return (f"test log-loss {m.get('logloss', float('nan')):.4f}  AUC "
                f"{m.get('auc', float('nan')):.4f}  accuracy {m.get('accuracy', float('nan')):.4f}")
