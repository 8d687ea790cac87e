"""A multi-layer perceptron (softmax classifier) on the parameter server (no MPI).

The network of DistBelief's Downpour SGD experiments in its simplest form (Dean et al.,
"Large Scale Distributed Deep Networks", NIPS 2012, §4): fully connected layers of widths
``n_features → hidden[0] → … → hidden[-1] → n_classes``, ReLU after every hidden layer
(Nair & Hinton, ICML 2010) and a softmax with cross-entropy (log-loss) on the output.

Tables (all dense, pulled and pushed whole; layer ``i`` maps width ``a`` to width ``b``)::

    w{i}   a rows × dim b   weight matrix (row = input unit, column = output unit)
    b{i}   1 row  × dim b   bias

Inputs are scaled to ``[0, 1]`` (uint8 pixels divided by 255; other dtypes as given).
Weights start as N(0, σ²) with He et al.'s σ = √(2 / a) for the layers followed by a ReLU
("Delving deep into rectifiers", ICCV 2015, §2.2) and Glorot & Bengio's σ = √(2 / (a + b))
for the output layer (AISTATS 2010, eq. 12 in its normal form); biases start at 0. These
σ are the tables' ``init_std``; ``[model] init_scale`` is not used by this model.

The forward and backward passes are numpy matrix products in the table dtype (float32 by
default: BLAS ``sgemm``); the gradient of the summed cross-entropy with respect to the
logits is ``softmax(z) − onehot(y)`` (Bishop, *Pattern Recognition and Machine Learning*,
2006, §4.3.4), back-propagated through the layers (Rumelhart, Hinton & Williams, Nature
323, 1986).
"""

from __future__ import annotations

import math

import numpy as np

from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec
from hpcps.models.base import Model
from hpcps.models.names import layer_names

#: Rows per chunk in :meth:`MLP.predict` (bounds the activations' memory).
PREDICT_CHUNK = 8192


def init_stds(sizes) -> list:
    """Initial standard deviation of each layer's weights.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths, input to output (length L + 1 for L layers).

    Returns
    -------
    list of float (L,)
        He (√(2/fan_in)) for the layers followed by a ReLU, Glorot (√(2/(fan_in+fan_out)))
        for the output layer.
    """
    n = len(sizes) - 1
    return [math.sqrt(2.0 / a) if i < n - 1 else math.sqrt(2.0 / (a + b))
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of logits ``z`` (B, C), stable for large logits (max shifted out)."""
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


class MLP(Model):
    """Multi-layer perceptron with ReLU hidden layers and a softmax output (see module doc).

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
        Uses ``cfg.model.hidden`` (hidden widths), ``cfg.model.dtype``, ``cfg.model.l2``
        (L2 penalty on the weight matrices, applied by the servers; biases have none),
        ``cfg.optimizer`` and ``cfg.data``: a prepared data set (``format = "prepared"``)
        whose attributes give ``n_features`` and ``n_classes``.
    sizes : sequence of int, optional
        Layer widths input to output; overrides what ``cfg`` gives (then ``cfg.data`` is
        not read, for tests that have no data file).

    Raises
    ------
    hpcps.config.ConfigError
        The data set is not prepared, or lacks ``n_features`` / ``n_classes`` ≥ 2 (names
        the job file and the key ``data.path`` / ``data.format``).
    """

    name = "mlp"
    loss_name = "logloss"
    loss_label = "log-loss"
    primary_metric = "accuracy"
    keys_ahead = True       # batch_keys keeps nothing

    def __init__(self, cfg, sizes=None):
        super().__init__(cfg)
        if sizes is None:
            nf, nc = self._data_sizes(cfg)
            sizes = (nf, *cfg.model.hidden, nc)
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"MLP layer widths must be >= 1, at least input and output; "
                             f"got {self.sizes}")
        self.dtype = np.dtype(cfg.model.dtype)
        self.n_layers = len(self.sizes) - 1

    @staticmethod
    def _data_sizes(cfg):
        from hpcps.config import ConfigError

        if cfg.data.format != "prepared":
            raise ConfigError(cfg.path, "data.format", f"model type 'mlp' needs a prepared data "
                              f"set ('prepared', written by `hpcps data prepare`), got "
                              f"{cfg.data.format!r}")
        from hpcps.data.prepared import file_attrs

        attrs = file_attrs(cfg.data.path)
        nf, nc = int(attrs.get("n_features", 0)), int(attrs.get("n_classes", 0))
        if nf < 1 or nc < 2 or attrs.get("task") != "classification":
            raise ConfigError(cfg.path, "data.path", f"{cfg.data.path}: model type 'mlp' needs a "
                              f"classification data set with attributes n_features >= 1 and "
                              f"n_classes >= 2; got task={attrs.get('task')!r}, "
                              f"n_features={nf}, n_classes={nc}")
        return nf, nc

    @property
    def n_features(self) -> int:
        """Width of the input layer."""
        return self.sizes[0]

    @property
    def n_classes(self) -> int:
        """Width of the output layer."""
        return self.sizes[-1]

    # ------------------------------------------------------------------ protocol

    def tables(self) -> list:
        """``w0, b0, w1, b1, …``: dense tables, weights with their initial σ (module doc).

        Returns
        -------
        list of (hpcps.core.tables.TableSpec, hpcps.core.optim.Optimizer)
        """
        o = self.cfg.optimizer
        dt = self.cfg.model.dtype

        def opt(l2, weights):
            # the job's rule with every key of it; FTRL's l1/l2 on the weights, not the biases
            return Optimizer.from_config(o, l2=l2, regularize=weights)

        out = []
        for i, ((a, b), std) in enumerate(zip(zip(self.sizes[:-1], self.sizes[1:]),
                                              init_stds(self.sizes))):
            wn, bn = layer_names(i)
            out.append((TableSpec(wn, a, b, dt, sparse=False, init_std=std),
                        opt(self.cfg.model.l2, True)))
            out.append((TableSpec(bn, 1, b, dt, sparse=False), opt(0.0, False)))
        return out

    def load(self, split: str, part: int, n_parts: int):
        """Rows of ``split`` for worker ``part`` of ``n_parts`` (contiguous blocks).

        Returns
        -------
        X : ndarray (m, n_features), the stored dtype (uint8 for images)
        y : ndarray int64 (m,), class indices

        Raises
        ------
        hpcps.data.DataError
            The file's rows are not ``n_features`` wide, or a label is not an integer in
            ``[0, n_classes)`` (names the file, split and row).
        """
        from hpcps.data import DataError
        from hpcps.data.source import load_split

        X, y = load_split(self.cfg.data, split, part, n_parts)
        path = self.cfg.data.path
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise DataError(f"{path}: /{split}/X has shape {X.shape}, expected (n, "
                            f"{self.n_features})")
        yi = np.asarray(y).astype(np.int64)
        bad = np.flatnonzero((yi != y) | (yi < 0) | (yi >= self.n_classes))
        if bad.size:
            raise DataError(f"{path}: /{split}/y row {bad[0]} (of worker {part}'s block) is "
                            f"{np.asarray(y)[bad[0]].item()!r}, expected a class index in [0, {self.n_classes})")
        return X, yi

    def batch_keys(self, X) -> dict:
        """Every row of every table: ``{"w0": arange(n_features), "b0": [0], …}``."""
        keys = {}
        for i, a in enumerate(self.sizes[:-1]):
            wn, bn = layer_names(i)
            keys[wn] = np.arange(a, dtype=np.int64)
            keys[bn] = np.zeros(1, dtype=np.int64)
        return keys

    def _inputs(self, X) -> np.ndarray:
        X = np.asarray(X)
        if X.dtype == np.uint8:
            return X.astype(self.dtype) * self.dtype.type(1.0 / 255.0)
        return X.astype(self.dtype, copy=False)

    def _weights(self, params: dict) -> list:
        out = []
        for i, (a, b) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
            wn, bn = layer_names(i)
            W, B = params[wn], params[bn]
            if W.shape != (a, b) or B.shape != (1, b):
                raise ValueError(f"layer {i}: pulled {wn} has shape {W.shape} and {bn} "
                                 f"{B.shape}; expected ({a}, {b}) and (1, {b}) (pull every row)")
            out.append((W, B))
        return out

    def _forward(self, x, layers):
        """Activations ``[x, h1, …, h_{L-1}]`` and the logits."""
        acts = [x]
        h = x
        for i, (W, B) in enumerate(layers):
            z = h @ W
            z += B
            if i < len(layers) - 1:
                np.maximum(z, 0, out=z)
                acts.append(z)
            h = z
        return acts, h

    def loss_grad(self, X, y, keys: dict, params: dict):
        """Summed cross-entropy and gradient sums of every table (module doc).

        Parameters
        ----------
        X : ndarray (B, n_features); uint8 is scaled by 1/255
        y : int ndarray (B,), class indices in ``[0, n_classes)``
        keys : dict
            As :meth:`batch_keys` (every row).
        params : dict of str -> ndarray
            ``w{i}`` (a, b) and ``b{i}`` (1, b) in the table dtype.

        Returns
        -------
        loss_sum : float
            Sum over the B examples of ``−log softmax(z)[y]`` (float64).
        grads : dict of str -> ndarray
            Same shapes and dtype as ``params``: sums over the batch.

        Raises
        ------
        ValueError
            A pulled table has the wrong shape.
        """
        layers = self._weights(params)
        x = self._inputs(X)
        y = np.asarray(y, dtype=np.int64)
        acts, z = self._forward(x, layers)
        logp = log_softmax(z)
        rows = np.arange(z.shape[0])
        loss = -float(logp[rows, y].sum(dtype=np.float64))
        delta = np.exp(logp)              # softmax(z) − onehot(y): dLoss/dz, (B, C)
        delta[rows, y] -= 1
        grads = {}
        for i in range(len(layers) - 1, -1, -1):
            wn, bn = layer_names(i)
            grads[wn] = acts[i].T @ delta
            grads[bn] = delta.sum(axis=0, keepdims=True)
            if i:
                delta = delta @ layers[i][0].T
                delta *= acts[i] > 0      # ReLU'(z) = 1 where the activation is positive
        return loss, {k: np.ascontiguousarray(grads[k], dtype=self.dtype) for k in keys}

    def predict(self, X, keys: dict, params: dict) -> np.ndarray:
        """Class probabilities, float64 (n, n_classes) (computed in chunks of rows)."""
        layers = self._weights(params)
        n = X.shape[0]
        out = np.empty((n, self.n_classes), dtype=np.float64)
        for lo in range(0, n, PREDICT_CHUNK):
            _, z = self._forward(self._inputs(X[lo:lo + PREDICT_CHUNK]), layers)
            out[lo:lo + PREDICT_CHUNK] = np.exp(log_softmax(z.astype(np.float64)))
        return out

    def metrics(self, y, pred) -> dict:
        """``{"n", "logloss", "accuracy"}`` of probabilities ``pred`` (n, C) against labels
        ``y`` (n,): mean cross-entropy (probabilities clipped at 1e-15) and the fraction of
        rows whose most probable class is ``y``. An empty split gives ``{"n": 0}``."""
        y = np.asarray(y, dtype=np.int64)
        res = {"n": int(y.size)}
        if y.size == 0:
            return res
        p = np.asarray(pred, dtype=np.float64)
        res["logloss"] = float(-np.log(np.clip(p[np.arange(y.size), y], 1e-15, 1.0)).mean())
        res["accuracy"] = float((p.argmax(axis=1) == y).mean())
        return res

    def describe(self, m: dict) -> str:
        """``test log-loss … accuracy …`` for the epoch report."""
        return (f"test log-loss {m.get('logloss', float('nan')):.4f}  "
                f"accuracy {m.get('accuracy', float('nan')):.4f}")
