"""A user-defined hpcps model: a linear support-vector machine trained on the parameter server.

Worked example of the model protocol (:mod:`hpcps.models.base`). Name it in a job file as::

    [model]
    type = "hinge:LinearSVM"        # module "hinge" must be importable on every rank

and make the module importable, e.g. ``PYTHONPATH=examples/plugins hpcps run jobs/X.toml``
(add ``-x PYTHONPATH`` to a multi-node ``mpirun``; ``srun`` passes the environment on).

Loss: the hinge loss max(0, 1 - t·f(x)) with t = 2y - 1 in {-1, +1} and f(x) = w·x + b
(Cortes & Vapnik, Machine Learning 20, 1995); its subgradient is -t·x where t·f(x) < 1 and 0
elsewhere. The L2 penalty ``[model] l2`` is applied by the servers, as for logistic regression,
so minibatch SGD on it is Pegasos-like (Shalev-Shwartz et al., ICML 2007) with lazy L2.
"""

from __future__ import annotations

import numpy as np

from hpcps.data.source import load_split
from hpcps.models.base import Model
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec


class LinearSVM(Model):
    """Linear SVM on sparse features: tables ``w`` (one value per feature) and ``b``.

    Data: the job's ``[data]`` section as for ``type = "logistic"`` (``adult_csv`` or
    ``svmlight``); labels in {0, 1}.
    """

    name = "linear-svm"
    loss_name = "hinge"
    loss_label = "hinge loss"
    primary_metric = "accuracy"

    def tables(self):
        o, m = self.cfg.optimizer, self.cfg.model
        # the job's [optimizer] (any rule and its keys); the bias is not regularised
        return [(TableSpec("w", self.cfg.data.num_features, 1, m.dtype, sparse=True),
                 Optimizer.from_config(o, l2=m.l2)),
                (TableSpec("b", 1, 1, m.dtype, sparse=False),
                 Optimizer.from_config(o, l2=0.0, regularize=False))]

    def load(self, split, part, n_parts):
        return load_split(self.cfg.data, split, part, n_parts)

    def batch_keys(self, X):
        # X is a scipy CSR matrix: the minibatch needs the rows of the features it uses
        return {"w": np.unique(X.indices).astype(np.int64), "b": np.zeros(1, dtype=np.int64)}

    def _scores(self, X, keys, params):
        cols = np.searchsorted(keys["w"], X.indices)          # feature -> position in keys
        Xl = X.__class__((X.data, cols, X.indptr), shape=(X.shape[0], keys["w"].size))
        return Xl, Xl @ params["w"][:, 0].astype(np.float64) + float(params["b"][0, 0])

    def loss_grad(self, X, y, keys, params):
        Xl, f = self._scores(X, keys, params)
        t = 2.0 * np.asarray(y, dtype=np.float64) - 1.0
        margin = t * f
        active = margin < 1.0
        coef = np.where(active, -t, 0.0)                      # d loss / d f per example
        gw = Xl.T @ coef                                      # summed over the batch
        loss = float(np.maximum(0.0, 1.0 - margin).sum())
        dt = params["w"].dtype
        return loss, {"w": gw.reshape(-1, 1).astype(dt), "b": np.array([[coef.sum()]], dtype=dt)}

    def predict(self, X, keys, params):
        return self._scores(X, keys, params)[1]               # decision values f(x)

    def prepare_metrics(self):
        import sklearn.metrics  # noqa: F401  (imported before the training clock starts)

    def metrics(self, y, pred):
        from sklearn.metrics import accuracy_score, hinge_loss, roc_auc_score

        y = np.asarray(y, dtype=np.float64)
        if y.size == 0:
            return {"n": 0}
        t = 2.0 * y - 1.0
        return {"n": int(y.size), "hinge": float(hinge_loss(t, pred)),
                "accuracy": float(accuracy_score(y, pred >= 0)),
                "auc": float(roc_auc_score(y, pred)) if 0 < y.sum() < y.size else float("nan")}
