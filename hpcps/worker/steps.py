"""What a worker does in one step, per consistency policy (no MPI of its own).

The model (:class:`hpcps.models.base.Model`) says which keys of which tables a minibatch
needs and computes the loss and gradient sums; these runners move the rows.

:class:`SyncSteps` (BSP, SSP)
    pull the minibatch's rows, compute the gradient, push it — every step. The server side
    decides how fresh the pull is (the policy's read floor) and aggregates per clock.
:class:`DownpourSteps` (async; Dean et al., NIPS 2012, §4.1)
    every ``n_fetch`` steps fetch the rows the next ``n_fetch`` minibatches need (one pull),
    compute gradients on that local copy, accumulate them and push every ``n_push`` steps
    (and at the end of every epoch), with duplicate keys merged on the worker.
    With ``push_threshold > 0`` the push goes through :class:`PushFilter`.

Both check the loss and gradients for NaN/inf before anything is pushed
(:class:`hpcps.optim.NonFiniteError`).
"""

from __future__ import annotations

import numpy as np

from ..kernels.optim import merge_duplicates
from ..optim import check_finite


def _as_rows(grad, n: int) -> np.ndarray:
    return np.asarray(grad).reshape(n, -1)


class SyncSteps:
    """Pull, compute, push every step (BSP and SSP).

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    model : hpcps.models.base.Model
    index : int
        Worker index (for error messages).
    step_hook : callable(worker_index, clock) or None
        Called after each step's gradient is computed, before it is pushed (tests use it
        to make one worker's computation slow).
    """

    def __init__(self, client, model, index: int, step_hook=None):
        self.client = client
        self.model = model
        self.index = index
        self.step_hook = step_hook

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size

    def step(self, i: int, rows, final: bool = False) -> float:
        """Run step ``i`` on ``rows`` (maybe empty); return the summed loss of its examples."""
        if not rows.size:
            return 0.0
        Xb, yb = self.X[rows], self.y[rows]
        keys = self.model.batch_keys(Xb)
        params = {t: self.client.pull(t, k) for t, k in keys.items()}
        loss, grads = self.model.loss_grad(Xb, yb, keys, params)
        check_finite(f"worker {self.index} at clock {self.client.clock_value}: loss/gradient",
                     loss, *grads.values())
        if self.step_hook is not None:
            self.step_hook(self.index, self.client.clock_value)
        for t, k in keys.items():
            self.client.push(t, k, _as_rows(grads[t], k.size))
        return loss

    def report(self) -> dict:
        return {"filter_sent": 0, "filter_offered": 0}

    def flush(self) -> None:
        """Nothing is held locally between steps under BSP/SSP."""


class PushFilter:
    """The "significantly modified" filter of Li et al. (OSDI 2014, §3.3 and §5.1), with
    error feedback: a key's gradient is sent only once its accumulated magnitude (largest
    absolute value over the row) exceeds ``threshold``; until then it stays in a local
    residual, so no gradient is dropped.

    Values are the per-example means (the worker divides by the examples it accumulated
    before filtering), so pushes through the filter carry ``n_examples = 1``.

    Parameters
    ----------
    num_keys : int
        Key space of the filtered table (a dense float64 residual of ``num_keys × dim``).
    threshold : float
        > 0.
    dim : int
        Values per row.
    """

    def __init__(self, num_keys: int, threshold: float, dim: int = 1):
        if not threshold > 0:
            raise ValueError(f"push filter threshold must be > 0, got {threshold}")
        self.residual = np.zeros((int(num_keys), int(dim)), dtype=np.float64)
        self.threshold = float(threshold)
        self.sent = 0       # entries sent
        self.offered = 0    # entries an unfiltered push would have sent

    def filter(self, keys: np.ndarray, values: np.ndarray, flush: bool = False):
        """Add ``values`` (m, dim) at ``keys`` (unique, int64) to the residual; return the
        keys and (k, dim) values to send now (all non-zero residual rows when ``flush``),
        clearing them locally."""
        values = np.asarray(values).reshape(keys.size, -1)
        self.residual[keys] += values
        self.offered += int(keys.size)
        if flush:
            keys = np.flatnonzero(np.any(self.residual != 0, axis=1)).astype(np.int64)
        r = self.residual[keys]
        send = (np.abs(r).max(axis=1, initial=0.0) > self.threshold if not flush
                else np.ones(keys.size, dtype=bool))
        k = keys[send]
        v = r[send]
        self.residual[k] = 0.0
        self.sent += int(k.size)
        return k, v


class DownpourSteps:
    """Downpour SGD steps: fetch every ``n_fetch``, push every ``n_push`` (see module doc).

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    model : hpcps.models.base.Model
    index : int
    policy : hpcps.consistency.Async
    step_hook : callable(worker_index, clock) or None
        See :class:`SyncSteps`.

    With ``push_threshold > 0`` every sparse table's pushes go through a :class:`PushFilter`;
    dense tables are pushed unfiltered.
    """

    def __init__(self, client, model, index: int, policy, step_hook=None):
        self.client = client
        self.model = model
        self.index = index
        self.policy = policy
        self.step_hook = step_hook
        self.filters = {}
        if policy.push_threshold > 0:
            self.filters = {s.name: PushFilter(s.num_keys, policy.push_threshold, s.dim)
                            for s in client.specs if s.sparse}
        self._reset()

    def _reset(self):
        self.acc_keys: dict = {}
        self.acc_grads: dict = {}
        self.acc_n = 0
        self.acc_versions = None

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self.cache_keys = None            # the first step of an epoch (or of a resume) fetches

    def _fetch(self, i: int) -> None:
        span = self.order[i * self.B:min(i + self.policy.n_fetch, self.steps) * self.B]
        keys = self.model.batch_keys(self.X[span]) if span.size else {}
        self.cache_keys = keys
        self.cache = {t: self.client.pull(t, k) for t, k in keys.items()}
        self.cache_versions = {t: self.client.read_version[self.client.ids[t]].copy() for t in keys}

    def step(self, i: int, rows, final: bool = False) -> float:
        """Step ``i`` on ``rows``; pushes when due, at the last step of an epoch, and (with the
        filter) flushes every residual when ``final``. Returns the summed loss."""
        if self.policy.fetch_due(i) or self.cache_keys is None:
            self._fetch(i)
        loss = 0.0
        if rows.size:
            Xb, yb = self.X[rows], self.y[rows]
            keys = self.model.batch_keys(Xb)
            params = {t: self.cache[t][np.searchsorted(self.cache_keys[t], k)]
                      for t, k in keys.items()}
            loss, grads = self.model.loss_grad(Xb, yb, keys, params)
            check_finite(f"worker {self.index} at clock {self.client.clock_value}: loss/gradient",
                         loss, *grads.values())
            if self.step_hook is not None:
                self.step_hook(self.index, self.client.clock_value)
            if self.acc_versions is None:
                self.acc_versions = self.cache_versions
            for t, k in keys.items():
                self.acc_keys.setdefault(t, []).append(k)
                self.acc_grads.setdefault(t, []).append(_as_rows(grads[t], k.size))
            self.acc_n += rows.size
        if self.policy.push_due(i) or i == self.steps - 1 or final:
            self._push(final)
        return loss

    def _push(self, final: bool) -> None:
        if self.acc_n == 0 and not (final and self.filters):
            return
        versions = self.acc_versions if self.acc_versions is not None else \
            getattr(self, "cache_versions", {})
        n = max(1, self.acc_n)
        tables = list(self.acc_keys) + [t for t in self.filters if t not in self.acc_keys]
        for t in tables:
            spec = self.client.specs[self.client.ids[t]]
            if t in self.acc_keys:
                keys, sums = merge_duplicates(np.concatenate(self.acc_keys[t]),
                                              np.concatenate(self.acc_grads[t]).astype(np.float64))
            else:
                keys, sums = np.empty(0, np.int64), np.empty((0, spec.dim))
            v = versions.get(t)
            f = self.filters.get(t)
            if f is None:
                if keys.size:
                    self.client.push(t, keys, sums.astype(spec.dtype), n_examples=self.acc_n,
                                     versions=v)
            else:
                k, vals = f.filter(keys, sums / n, flush=final)
                self.client.push(t, k, vals.astype(spec.dtype), n_examples=1, versions=v)
        self._reset()

    def flush(self) -> None:
        """Push everything held locally — accumulated gradients and push-filter residuals —
        before a checkpoint cut, so that a restart loses nothing."""
        if self.acc_n or (self.filters and hasattr(self, "cache_versions")):
            self._push(final=True)

    def report(self) -> dict:
        fs = self.filters.values()
        return {"filter_sent": sum(f.sent for f in fs), "filter_offered": sum(f.offered for f in fs)}


def make_steps(policy, client, model, index: int, step_hook=None):
    """The step runner for ``policy`` (Downpour for aggregate-free policies)."""
    if policy.aggregate:
        return SyncSteps(client, model, index, step_hook)
    return DownpourSteps(client, model, index, policy, step_hook)
