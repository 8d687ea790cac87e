"""Biased matrix factorization for rating prediction (no MPI).

Model (Koren, Bell & Volinsky, "Matrix Factorization Techniques for Recommender Systems",
IEEE Computer 42(8), 2009, eq. 4)::

    r̂(u, i) = μ + b_u + b_i + p_u · q_i

with ``μ`` the mean train rating (attribute ``global_mean`` of the prepared file, a constant),
user/item biases ``b_u, b_i`` and ``k = [model] factors`` latent factors ``p_u, q_i``. Training
minimises their eq. 5 in the form their stochastic gradient descent (§"Learning algorithms")
uses, the penalty counted once per rating::

    Σ_(u,i,r) [ (r - r̂(u, i))²  +  λ (|p_u|² + |q_i|² + b_u² + b_i²) ],   λ = [model] l2

so each rating of a minibatch contributes ``2 e q_i + 2 λ p_u`` to ``p_u``'s gradient (and
alike for the others), ``e = r̂ - r``. The penalty is part of the gradient this model pushes,
not the servers' lazy L2 (their optimizer runs with ``l2 = 0`` for these tables): the servers'
L2 acts once per *step* on every touched row, which would make the penalty depend on the batch
size and the number of workers. The loss the workers report is the squared error alone
(``train_mse``).

Tables (:meth:`MatrixFactorization.tables`), all sparse and keyed by the prepared file's
indices: ``user_factors`` (n_users × k) and ``item_factors`` (n_items × k), drawn from
N(0, init_scale²) per key (:meth:`hpcps.core.tables.TableSpec.initial_rows`), ``user_bias`` and
``item_bias`` (dim 1) at zero.

Ids seen only in the test split (indices ``>= n_users`` / ``>= n_items``,
:mod:`hpcps.data.movielens`) have no rows: their terms are left out, so a test-only item is
predicted as ``μ + b_u`` and a test pair with both unknown as ``μ``. Predictions are clipped to
the rating range ``[rating_min, rating_max]`` of the file.
"""

from __future__ import annotations

import numpy as np

from hpcps.data.prepared import PreparedError, file_attrs, read_part
from hpcps.kernels.optim import merge_duplicates
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec
from hpcps.models.base import Model
from hpcps.models.names import ITEM_BIAS, ITEM_FACTORS, USER_BIAS, USER_FACTORS
from hpcps.core.arrays import distinct

REQUIRED_ATTRS = ("n_users", "n_items", "global_mean")


def _side_rows(ids: np.ndarray, keys: np.ndarray | None):
    """Positions of ``ids`` in ``keys`` and a mask of the ids found there.

    Returns
    -------
    rows : int64 (B,)
        Position in ``keys``; 0 where not found (masked out by ``known``).
    known : bool (B,)
    """
    if keys is None or keys.size == 0:
        return np.zeros(ids.size, dtype=np.int64), np.zeros(ids.size, dtype=bool)
    rows = np.searchsorted(keys, ids)
    rows[rows >= keys.size] = 0
    known = keys[rows] == ids
    return np.where(known, rows, 0).astype(np.int64, copy=False), known


def mf_forward(users, items, keys: dict, params: dict, mu: float):
    """Predictions of the biased MF model and the per-example terms the gradient needs.

    Parameters
    ----------
    users, items : int64 (B,)
        User and item indices.
    keys : dict of str -> int64 (m,) sorted unique
        Table keys as from :meth:`MatrixFactorization.batch_keys`; an id absent from its
        table's keys (or a table absent from ``keys``) counts as unknown: its terms are zero.
    params : dict of str -> ndarray (m, dim)
        The rows of ``keys``.
    mu : float
        Global mean rating.

    Returns
    -------
    pred : float64 (B,)
        ``μ + b_u + b_i + p_u · q_i`` with the unknown terms left out (not clipped).
    ctx : tuple
        ``(ru, ku, ri, ki, P, Q)``: rows into the pulled tables, known masks, and the float64
        factor rows of each example (zeros where unknown).
    """
    ru, ku = _side_rows(users, keys.get(USER_FACTORS))
    ri, ki = _side_rows(items, keys.get(ITEM_FACTORS))
    pred = np.full(users.size, mu, dtype=np.float64)
    if ku.any():
        P = params[USER_FACTORS][ru].astype(np.float64) * ku[:, None]
        pred += params[USER_BIAS][ru, 0] * ku
    else:
        P = None
    if ki.any():
        Q = params[ITEM_FACTORS][ri].astype(np.float64) * ki[:, None]
        pred += params[ITEM_BIAS][ri, 0] * ki
    else:
        Q = None
    if P is not None and Q is not None:
        pred += np.einsum("bk,bk->b", P, Q)
    return pred, (ru, ku, ri, ki, P, Q)


def mf_loss_grad(users, items, y, keys: dict, params: dict, mu: float, l2: float):
    """Summed squared error and gradient sums of the per-rating objective (module docstring).

    Parameters
    ----------
    users, items : int64 (B,)
    y : array-like (B,)
        Ratings.
    keys, params : dict
        As in :func:`mf_forward`; every user and item of the batch must be in ``keys``.
    mu : float
    l2 : float
        λ, the penalty per rating (>= 0).

    Returns
    -------
    sse : float
        ``Σ (r - r̂)²`` (the penalty is not included).
    penalty : float
        ``λ Σ (|p_u|² + |q_i|² + b_u² + b_i²)`` over the batch's ratings.
    grads : dict of str -> ndarray (m, dim)
        Gradient sums of ``sse + penalty`` with respect to ``params[t]``, in the dtype of
        ``params[t]``.

    Raises
    ------
    ValueError
        If a user or item of the batch is not among ``keys`` (no row to update).
    """
    if users.size == 0:
        return 0.0, 0.0, {t: np.zeros_like(params[t]) for t in params}
    pred, (ru, ku, ri, ki, P, Q) = mf_forward(users, items, keys, params, mu)
    if not (ku.all() and ki.all()):
        bad = users[~ku][0] if not ku.all() else items[~ki][0]
        raise ValueError(f"{'user' if not ku.all() else 'item'} {bad} of the batch has no row "
                         "in the pulled tables (only ids seen in training can be trained)")
    e2 = 2.0 * (pred - np.asarray(y, dtype=np.float64))
    bu = params[USER_BIAS][ru, 0].astype(np.float64)
    bi = params[ITEM_BIAS][ri, 0].astype(np.float64)
    sse = float(0.25 * np.dot(e2, e2))
    penalty = float(l2 * (np.einsum("bk,bk->", P, P) + np.einsum("bk,bk->", Q, Q)
                          + bu @ bu + bi @ bi))
    lam2 = 2.0 * l2

    def summed(rows, per_example, like):
        # rows index the sorted unique keys, so merge_duplicates returns them in key order
        _, g = merge_duplicates(rows, per_example)
        return g.astype(like.dtype, copy=False)

    grads = {
        USER_FACTORS: summed(ru, e2[:, None] * Q + lam2 * P, params[USER_FACTORS]),
        ITEM_FACTORS: summed(ri, e2[:, None] * P + lam2 * Q, params[ITEM_FACTORS]),
        USER_BIAS: summed(ru, (e2 + lam2 * bu)[:, None], params[USER_BIAS]),
        ITEM_BIAS: summed(ri, (e2 + lam2 * bi)[:, None], params[ITEM_BIAS]),
    }
    return sse, penalty, grads


class MatrixFactorization(Model):
    """Biased matrix factorization (``[model] type = "mf"``; see the module docstring).

    Job keys: ``[data] format = "prepared"`` with a file from ``hpcps data prepare
    movielens-100k`` (any prepared file with ``X`` int64 ``(n, 2)`` = [user, item], ``y`` =
    rating and the attributes ``n_users``, ``n_items``, ``global_mean``); ``[model] factors``
    (k), ``init_scale`` (std of the initial factors), ``l2`` (λ per rating), ``dtype``.

    Raises
    ------
    hpcps.data.prepared.PreparedError
        At construction, if the prepared file lacks one of the attributes above (the message
        names the file and the attribute).
    """

    name = "mf"
    loss_name = "mse"
    loss_label = "MSE"
    primary_metric = "rmse"
    keys_ahead = True       # batch_keys keeps nothing

    def __init__(self, cfg):
        super().__init__(cfg)
        self.path = cfg.data.path
        attrs = file_attrs(self.path)
        for k in REQUIRED_ATTRS:
            if k not in attrs:
                raise PreparedError(f"{self.path}: attribute {k!r} missing: not a rating data "
                                    "set for [model] type = \"mf\" (write one with `hpcps data "
                                    "prepare movielens-100k`)")
        self.n_users, self.n_items = int(attrs["n_users"]), int(attrs["n_items"])
        self.mu = float(attrs["global_mean"])
        self.rating_range = (float(attrs.get("rating_min", -np.inf)),
                             float(attrs.get("rating_max", np.inf)))

    def tables(self) -> list:
        c, o = self.cfg.model, self.cfg.optimizer

        def opt(factors):
            # λ is in the pushed gradient (per rating), never the servers' per-step L2;
            # FTRL's own l1/l2 (if set) apply to the factors, not to the biases
            return Optimizer.from_config(o, l2=0.0, regularize=factors)

        return [
            (TableSpec(USER_FACTORS, self.n_users, c.factors, c.dtype, init_std=c.init_scale), opt(True)),
            (TableSpec(ITEM_FACTORS, self.n_items, c.factors, c.dtype, init_std=c.init_scale), opt(True)),
            (TableSpec(USER_BIAS, self.n_users, 1, c.dtype), opt(False)),
            (TableSpec(ITEM_BIAS, self.n_items, 1, c.dtype), opt(False)),
        ]

    def load(self, split, part, n_parts):
        """This worker's ``(X int64 (n, 2), y float64 (n,))`` of ``split``.

        Test rows may hold indices ``>= n_users`` / ``>= n_items`` (ids seen only in the test
        split; the prepared file counts them in ``test_rows_unseen_user`` / ``_item``).

        Raises
        ------
        hpcps.data.prepared.PreparedError
            ``X`` not of shape (n, 2) or not integer, a negative index, or a train row with
            an index outside the tables (the message names the file, split and row).
        """
        X, y = read_part(self.path, split, part, n_parts, max_rows=self.cfg.data.max_rows)
        if X.ndim != 2 or X.shape[1] != 2 or X.dtype.kind not in "iu":
            raise PreparedError(f"{self.path}: /{split}/X must be integer (n, 2) [user, item] "
                                f"for [model] type = \"mf\", got {X.dtype} {X.shape}")
        X = X.astype(np.int64, copy=False)
        limit = np.array([self.n_users, self.n_items])
        bad = (X < 0).any(axis=1) | ((X >= limit).any(axis=1) if split == "train" else False)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise PreparedError(f"{self.path}: /{split}/X row {r} of part {part}/{n_parts} is "
                                f"{X[r].tolist()}: indices must be in [0, {self.n_users}) and "
                                f"[0, {self.n_items}){'' if split == 'train' else ' or above'}")
        return X, np.asarray(y, dtype=np.float64)

    def batch_keys(self, X) -> dict:
        """Sorted unique known users (both user tables) and items (both item tables); a side
        with no known id is left out."""
        keys = {}
        u, i = X[:, 0], X[:, 1]
        uk = distinct(u[u < self.n_users]).astype(np.int64, copy=False)
        ik = distinct(i[i < self.n_items]).astype(np.int64, copy=False)
        if uk.size:
            keys[USER_FACTORS] = keys[USER_BIAS] = uk
        if ik.size:
            keys[ITEM_FACTORS] = keys[ITEM_BIAS] = ik
        return keys

    def loss_grad(self, X, y, keys, params):
        sse, _, grads = mf_loss_grad(X[:, 0], X[:, 1], y, keys, params, self.mu,
                                     self.cfg.model.l2)
        return sse, grads

    def predict(self, X, keys, params):
        """Predicted ratings, float64 (n,), clipped to the file's rating range."""
        pred, _ = mf_forward(X[:, 0], X[:, 1], keys, params, self.mu)
        return np.clip(pred, *self.rating_range)

    def metrics(self, y, pred) -> dict:
        """``n``, ``mse``, ``rmse`` and ``mae`` of ``pred`` against ``y``."""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        pred = np.asarray(pred, dtype=np.float64).reshape(-1)
        if y.size == 0:
            return {"n": 0}
        err = pred - y
        mse = float(np.mean(err * err))
        return {"n": int(y.size), "mse": mse, "rmse": float(np.sqrt(mse)),
                "mae": float(np.mean(np.abs(err)))}

    def describe(self, m: dict) -> str:
        return (f"test RMSE {m.get('rmse', float('nan')):.4f}  MAE "
                f"{m.get('mae', float('nan')):.4f}")
