"""What a worker does in one step, per consistency policy (no MPI of its own).

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

from ..model import BIAS, WEIGHTS, batch_keys, loss_and_gradient
from ..optim import check_finite


class SyncSteps:
    """Pull, compute, push every step (BSP and SSP).

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    index : int
        Worker index (for error messages).

    step_hook : callable(worker_index, clock) or None
        Called after each step's gradient is computed, before it is pushed (tests use it
        to make one worker's computation slow).
    """

    def __init__(self, client, index: int, step_hook=None):
        self.client = client
        self.index = index
        self.step_hook = step_hook

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size

    def step(self, i: int, rows, final: bool = False) -> float:
        """Run step ``i`` on ``rows`` (maybe empty); return the summed loss of its examples."""
        if not rows.size:
            return 0.0
        Xb, yb = self.X[rows], self.y[rows]
        keys, local = batch_keys(Xb)
        w = self.client.pull(WEIGHTS, keys)[:, 0]
        b = self.client.pull(BIAS, [0])[0, 0]
        loss, g, gb = loss_and_gradient(Xb, yb, local, w, b)
        check_finite(f"worker {self.index} at clock {self.client.clock_value}: loss/gradient",
                     loss, g, gb)
        if self.step_hook is not None:
            self.step_hook(self.index, self.client.clock_value)
        self.client.push(WEIGHTS, keys, g)
        self.client.push(BIAS, [0], [gb])
        return loss

    def report(self) -> dict:
        return {"filter_sent": 0, "filter_offered": 0}

    def flush(self) -> None:
        """Nothing is held locally between steps under BSP/SSP."""


class PushFilter:
    """The "significantly modified" filter of Li et al. (OSDI 2014, §3.3 and §5.1), with
    error feedback: a key's gradient is sent only once its accumulated magnitude exceeds
    ``threshold``; until then it stays in a local residual, so no gradient is dropped.

    Values are the per-example means (the worker divides by the examples it accumulated
    before filtering), so pushes through the filter carry ``n_examples = 1``.

    Parameters
    ----------
    num_keys : int
        Key space of the filtered table (a dense float64 residual of this size is kept).
    threshold : float
        > 0.
    """

    def __init__(self, num_keys: int, threshold: float):
        if not threshold > 0:
            raise ValueError(f"push filter threshold must be > 0, got {threshold}")
        self.residual = np.zeros(int(num_keys), dtype=np.float64)
        self.threshold = float(threshold)
        self.sent = 0       # entries sent
        self.offered = 0    # entries an unfiltered push would have sent

    def filter(self, keys: np.ndarray, values: np.ndarray, flush: bool = False):
        """Add ``values`` at ``keys`` (unique, int64) to the residual; return the keys and
        values to send now (all non-zero residuals when ``flush``), clearing them locally."""
        self.residual[keys] += values
        self.offered += int(keys.size)
        if flush:
            keys = np.flatnonzero(self.residual).astype(np.int64)
        r = self.residual[keys]
        send = np.abs(r) > self.threshold if not flush else np.ones(keys.size, dtype=bool)
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
    index : int
    policy : hpcps.consistency.Async
    num_features : int
        Size of the weights table (for the push filter's residual).
    step_hook : callable(worker_index, clock) or None
        See :class:`SyncSteps`.
    """

    def __init__(self, client, index: int, policy, num_features: int, step_hook=None):
        self.client = client
        self.index = index
        self.policy = policy
        self.step_hook = step_hook
        self.filter = PushFilter(num_features, policy.push_threshold) if policy.push_threshold > 0 else None
        self._reset()

    def _reset(self):
        self.acc_keys: list = []
        self.acc_grads: list = []
        self.acc_gb = 0.0
        self.acc_n = 0
        self.acc_versions = None

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self.cache_keys = None            # the first step of an epoch (or of a resume) fetches

    def _fetch(self, i: int) -> None:
        span = self.order[i * self.B:min(i + self.policy.n_fetch, self.steps) * self.B]
        keys = np.unique(self.X[span].indices).astype(np.int64) if span.size else np.empty(0, np.int64)
        self.cache_keys = keys
        self.cache_w = self.client.pull(WEIGHTS, keys)[:, 0]
        self.cache_b = self.client.pull(BIAS, [0])[0, 0]
        self.cache_versions = (self.client.read_version[self.client.ids[WEIGHTS]].copy(),
                               self.client.read_version[self.client.ids[BIAS]].copy())

    def step(self, i: int, rows, final: bool = False) -> float:
        """Step ``i`` on ``rows``; pushes when due, at the last step of an epoch, and (with the
        filter) flushes every residual when ``final``. Returns the summed loss."""
        if self.policy.fetch_due(i) or self.cache_keys is None:
            self._fetch(i)
        loss = 0.0
        if rows.size:
            Xb, yb = self.X[rows], self.y[rows]
            keys, local = batch_keys(Xb)
            w = self.cache_w[np.searchsorted(self.cache_keys, keys)]
            loss, g, gb = loss_and_gradient(Xb, yb, local, w, self.cache_b)
            check_finite(f"worker {self.index} at clock {self.client.clock_value}: loss/gradient",
                         loss, g, gb)
            if self.step_hook is not None:
                self.step_hook(self.index, self.client.clock_value)
            if self.acc_versions is None:
                self.acc_versions = self.cache_versions
            self.acc_keys.append(keys)
            self.acc_grads.append(g)
            self.acc_gb += gb
            self.acc_n += rows.size
        if self.policy.push_due(i) or i == self.steps - 1 or final:
            self._push(final)
        return loss

    def _push(self, final: bool) -> None:
        if self.acc_n == 0 and not (final and self.filter is not None):
            return
        dtype = self.client.specs[self.client.ids[WEIGHTS]].dtype
        if self.acc_n:
            k = np.concatenate(self.acc_keys)
            g = np.concatenate(self.acc_grads).astype(np.float64)
            keys, inv = np.unique(k, return_inverse=True)
            sums = np.bincount(inv.reshape(-1), weights=g, minlength=keys.size)
        else:
            keys, sums = np.empty(0, np.int64), np.empty(0)
        vw, vb = self.acc_versions if self.acc_versions is not None else self.cache_versions
        if self.filter is None:
            self.client.push(WEIGHTS, keys, sums.astype(dtype), n_examples=self.acc_n, versions=vw)
            self.client.push(BIAS, [0], [self.acc_gb], n_examples=self.acc_n, versions=vb)
        else:
            n = max(1, self.acc_n)
            k, v = self.filter.filter(keys.astype(np.int64), sums / n, flush=final)
            self.client.push(WEIGHTS, k, v.astype(dtype), n_examples=1, versions=vw)
            if self.acc_n:
                self.client.push(BIAS, [0], [self.acc_gb / n], n_examples=1, versions=vb)
        self._reset()

    def flush(self) -> None:
        """Push everything held locally — accumulated gradients and push-filter residuals —
        before a checkpoint cut, so that a restart loses nothing."""
        if self.acc_n or (self.filter is not None and hasattr(self, "cache_versions")):
            self._push(final=True)

    def report(self) -> dict:
        f = self.filter
        return {"filter_sent": f.sent if f else 0, "filter_offered": f.offered if f else 0}


def make_steps(policy, client, index: int, num_features: int, step_hook=None):
    """The step runner for ``policy`` (Downpour for aggregate-free policies)."""
    if policy.aggregate:
        return SyncSteps(client, index, step_hook)
    return DownpourSteps(client, index, policy, num_features, step_hook)
