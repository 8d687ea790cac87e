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
    With ``push_threshold > 0`` the push goes through :class:`PushFilter`. Fetching and
    pushing every step (the defaults) with p2p pulls, a step's push, its clock and the next
    step's fetch go to each server as one request.

Both check the loss and gradients for NaN/inf — after the cast to the table dtype, so a
float64 gradient that overflows float32 counts too — before anything is pushed, through a
:class:`NonFiniteGuard`: a step with a non-finite value is *rejected* (its gradient is not
pushed) and, after more than ``[train] max_nonfinite_steps`` rejected steps, every worker
stops with :class:`hpcps.core.optim.NonFiniteError`. Under BSP with a positive limit the workers
vote every step (one ``Allgather`` of an int64), so a step is rejected on all of them and no
server applies any part of it; under SSP and async the worker that produced the value drops
its own gradient (the other workers' updates of that clock are kept) and counts its own
rejections, since a per-step vote would tie the workers together. With the default limit 0
no vote is needed: the producing worker raises before it clocks, so no server completes that
clock before the job stops.
"""

from __future__ import annotations

import numpy as np

from hpcps.kernels.optim import merge_duplicates
from hpcps.core.optim import NonFiniteError, check_finite
from hpcps.worker.batches import epoch_batches, step_rows


def _as_rows(grad, n: int) -> np.ndarray:
    """``grad`` as ``(n, dim)`` rows; ``n = 0`` (a minibatch of rows without features touches
    no key of a table) gives ``(0, last axis or 1)``, which ``reshape(0, -1)`` cannot."""
    g = np.asarray(grad)
    if n == 0 and g.size == 0:
        return g.reshape(0, g.shape[-1] if g.ndim > 1 else 1)
    return g.reshape(n, -1)


def localized(model, X):
    """``model.localize(X)`` (:meth:`hpcps.models.base.Model.localize`), or ``X`` for a model
    class that does not have the optional method."""
    f = getattr(model, "localize", None)
    return X if f is None else f(X)


#: Codes of a step's outcome in the vote: fine, non-finite loss, non-finite gradient.
OK, BAD_LOSS, BAD_GRADIENT = 0, 1, 2
_WHAT = {BAD_LOSS: "loss", BAD_GRADIENT: "gradient"}


def _rows_ahead(runner, j: int):
    """``(rows, Xb, yb)`` of step ``j`` of a step runner (:class:`SyncSteps`,
    :class:`DownpourSteps`: its ``fuse``, ``client``, ``order``, ``B``, ``steps`` and
    minibatch buffers) when its pulls can go with step ``j - 1``'s clock: fusing, a client
    that can (:attr:`~hpcps.worker.client.PSClient.fusable`), and such a step with rows in
    this segment; else None."""
    if not runner.fuse or j >= runner.steps or not getattr(runner.client, "fusable", False):
        return None
    rows = runner.order[j * runner.B:(j + 1) * runner.B]
    if not rows.size:
        return None
    Xb, yb = step_rows(runner._rows, runner.X, runner.y, j, rows)
    if not Xb.shape[0]:
        return None
    return rows, Xb, yb


class NonFiniteGuard:
    """Reject steps whose loss or gradient is NaN/inf; stop after too many (no MPI of its own).

    Parameters
    ----------
    index : int
        This worker's index.
    max_steps : int
        Rejected steps tolerated (``[train] max_nonfinite_steps``); the next one raises.
    agree : callable(int) -> sequence of int, or None
        Collective vote over the workers: given this worker's code (0 fine, 1 non-finite
        loss, 2 non-finite gradient) returns every worker's code in worker order. Every
        worker must call :meth:`check` at every step when it is set (BSP). None: each worker
        judges only its own steps (SSP, async, or ``max_steps == 0``).
    say : callable(str) or None
        Where this worker reports a rejected step (the chief's output under a vote; each
        worker's own otherwise).

    Attributes
    ----------
    rejected : int
        Steps rejected so far.
    """

    def __init__(self, index: int, max_steps: int = 0, agree=None, say=None):
        self.index = int(index)
        self.max_steps = int(max_steps)
        self.agree = agree
        self.say = say
        self.rejected = 0

    def code(self, loss, grads, dtypes) -> int:
        """0, or why the step is bad: ``grads`` (dict table -> array) are checked after the
        cast to ``dtypes[table]`` (the table dtype pushed)."""
        if not np.isfinite(np.asarray(loss, dtype=np.float64)).all():
            return BAD_LOSS
        with np.errstate(over="ignore", invalid="ignore"):      # the overflow is the finding
            for t, g in grads.items():
                g = np.asarray(g)
                if g.size and not np.isfinite(g.astype(dtypes[t], copy=False)).all():
                    return BAD_GRADIENT
        return OK

    def check(self, clock: int, code: int) -> bool:
        """Whether the step may be pushed. Collective over the workers when ``agree`` is set.

        Raises
        ------
        hpcps.core.optim.NonFiniteError
            On the rejected step number ``max_steps + 1`` — on every worker at once under a
            vote — naming the worker(s), the clock and what was non-finite.
        """
        codes = list(self.agree(int(code))) if self.agree is not None else [OK] * self.index + [int(code)]
        bad = [(w, c) for w, c in enumerate(codes) if c]
        if not bad:
            return True
        self.rejected += 1
        who = ", ".join(f"worker {w} ({_WHAT[c]})" for w, c in bad)
        where = ("rejected on every worker" if self.agree is not None
                 else f"worker {self.index}'s gradient dropped")
        limit = f"[train] max_nonfinite_steps = {self.max_steps}"
        if self.rejected > self.max_steps:
            raise NonFiniteError(
                f"non-finite values (NaN or inf) at clock {clock} on {who}: rejected step "
                f"{self.rejected}, more than {limit}; the run diverged and was stopped before they "
                "were pushed (checkpoints hold finite values only); lower [optimizer] "
                "learning_rate, or raise the limit to skip such steps")
        if self.say is not None:
            self.say(f"hpcps: warning: non-finite values (NaN or inf) at clock {clock} on {who}: "
                     f"step {where} ({self.rejected} of at most {self.max_steps}, {limit})")
        return False


class SyncSteps:
    """Pull, compute, push every step (BSP and SSP).

    With ``fuse`` (BSP with p2p pulls, :meth:`hpcps.worker.client.PSClient.pull_next`) a step
    also slices the next step's minibatch (while it waits for its own rows) and sends its
    pulls with this step's clock: one request per server and step, the next step's rows
    coming back once the clock is applied. Not at the last step of a segment (an epoch's
    end, with its evaluation pulls, or a re-plan), and only when the next step has rows;
    after a rejected step only with a model whose ``keys_ahead`` let it announce them
    before the vote; a step whose rows or keys differ from those announced (a growth
    re-planned them) pulls as usual. The rows, hence the model, are the same bit for bit.

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
    model : hpcps.models.base.Model
    index : int
        Worker index (for error messages).
    step_hook : callable(worker_index, clock) or None
        Called after each step's gradient is computed, before it is pushed (tests use it
        to make one worker's computation slow).
    fuse : bool
        Send the next step's pulls with the clock where the client can
        (:attr:`~hpcps.worker.client.PSClient.fusable`). The trainer turns it off for
        streamed data (the reader thread serves rows in step order, and the exactly-once
        row log reads a step's rows after its clock).
    """

    def __init__(self, client, model, index: int, step_hook=None, guard=None, fuse=False):
        self.client = client
        self.model = model
        self.index = index
        self.step_hook = step_hook
        self.guard = guard or NonFiniteGuard(index)
        self.dtypes = {s.name: s.dtype for s in client.specs}
        self.last_rejected = False
        self.fuse = bool(fuse)
        self._next = None            # (rows, Xb, yb, keys) of the next step, pulls sent
        self._rows = None            # hpcps.worker.batches.EpochBatches, kept from epoch to epoch

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        """Start an epoch of ``steps`` minibatches of ``batch_size`` rows ``order`` of ``X``
        (as the model's :meth:`~hpcps.models.base.Model.localize` returns it)."""
        X = localized(self.model, X)
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self._next = None
        # CSR rows: the minibatches are taken a chunk of steps at a time (hpcps.worker.batches)
        self._rows = epoch_batches(self._rows, X, y, order, batch_size)

    def _rows_of(self, i: int, rows):
        """``(Xb, yb)``: the examples of step ``i``, whose rows are ``rows``."""
        return step_rows(self._rows, self.X, self.y, i, rows)

    def _batch(self, i: int, rows):
        """``(Xb, yb, keys)`` of step ``i``'s ``rows``: those of the step before's
        :meth:`_announce` when they are the same rows, else sliced now."""
        nxt, self._next = self._next, None
        if nxt is not None and (nxt[0] is rows or np.array_equal(nxt[0], rows)):
            return nxt[1:]
        Xb, yb = self._rows_of(i, rows)
        return Xb, yb, self.model.batch_keys(Xb)

    def _slice_next(self, i: int):
        """Step ``i + 1``'s ``[rows, Xb, yb, keys]`` when its pulls can go with step ``i``'s
        clock (:meth:`~hpcps.worker.client.PSClient.pull_next`): there is such a step with
        rows in this segment; else None. Called before this step waits for its rows, so
        that the slicing (most of a step's own work on Adult) overlaps the servers' work on
        the step before instead of delaying this step's push; with a model whose
        ``keys_ahead`` allows it the keys are found and their pulls announced then too
        (``keys`` set), else after this step's ``loss_grad`` (:meth:`_announce`)."""
        got = _rows_ahead(self, i + 1)
        if got is None:
            return None
        sliced = [*got, None]
        if getattr(self.model, "keys_ahead", False):
            self._announce(sliced)
        return sliced

    def _announce(self, sliced) -> None:
        """The next step's keys (``sliced``: :meth:`_slice_next`'s) and their pulls held for
        this step's clock, unless done already. ``batch_keys`` of a model that does not allow
        ``keys_ahead`` is called after this step's ``loss_grad``, as the model protocol has it
        (:mod:`hpcps.models.base`: a model may keep what ``batch_keys`` computed for the
        ``loss_grad`` of the same minibatch)."""
        if sliced is None or sliced[3] is not None:
            return
        sliced[3] = self.model.batch_keys(sliced[1])
        self.client.pull_next(sliced[3])
        self._next = tuple(sliced)

    def step(self, i: int, rows, final: bool = False) -> float:
        """Run step ``i`` on ``rows`` (maybe empty); return the summed loss of its examples
        (0 for a rejected step, :attr:`last_rejected` then True). Collective over the workers
        when the guard votes."""
        self.last_rejected = False
        self.last_n = int(rows.size)      # examples of the step (streamed: lines with a row)
        keys, grads, code, loss = {}, {}, OK, 0.0
        sliced = None
        if rows.size:
            Xb, yb, keys = self._batch(i, rows)
            self.last_n = int(Xb.shape[0])
            sliced = self._slice_next(i)
            params = self.client.pull_many(keys)     # one round trip for every table
            loss, grads = self.model.loss_grad(Xb, yb, keys, params)
            code = self.guard.code(loss, grads, self.dtypes)
        if not self.guard.check(self.client.clock_value, code):
            self.last_rejected = True
            return 0.0
        if not rows.size:
            return 0.0
        if self.step_hook is not None:
            self.step_hook(self.index, self.client.clock_value)
        for t, k in keys.items():     # sent with the step's clock: one request per server
            self.client.push(t, k, _as_rows(grads[t], k.size), defer=True)
        self._announce(sliced)        # and the next step's pulls with them (BSP, p2p)
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
    policy : hpcps.core.consistency.Async
    step_hook : callable(worker_index, clock) or None
        See :class:`SyncSteps`.
    fuse : bool
        With ``n_fetch = n_push = 1``, send the next step's fetch with this step's push and
        clock (:meth:`hpcps.worker.client.PSClient.pull_next`) where the client can
        (:attr:`~hpcps.worker.client.PSClient.fusable`): one request per server and step
        instead of two; not at the last step of an epoch (its evaluation pulls come next),
        not after a rejected step. The server answers it once it has applied the push, as
        it would a fetch sent right after the clock.

    With ``push_threshold > 0`` every sparse table's pushes go through a :class:`PushFilter`;
    dense tables are pushed unfiltered.
    """

    def __init__(self, client, model, index: int, policy, step_hook=None, guard=None,
                 fuse=False):
        self.client = client
        self.model = model
        self.index = index
        self.policy = policy
        self.step_hook = step_hook
        self.guard = guard or NonFiniteGuard(index)
        self.dtypes = {s.name: s.dtype for s in client.specs}
        self.last_rejected = False
        self.filters = {}
        if policy.push_threshold > 0:
            self.filters = {s.name: PushFilter(s.num_keys, policy.push_threshold, s.dim)
                            for s in client.specs if s.sparse}
        self._rows = None                 # as SyncSteps
        self.fuse = bool(fuse) and policy.n_fetch == 1 and policy.n_push == 1
        self._reset()

    def _reset(self):
        self.acc_keys: dict = {}
        self.acc_grads: dict = {}
        self.acc_n = 0
        self.acc_versions = None

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        X = localized(self.model, X)        # as SyncSteps.begin_epoch
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self._rows = epoch_batches(self._rows, X, y, order, batch_size)
        self.cache_keys = None            # the first step of an epoch (or of a resume) fetches
        self._fetched = None              # (step, rows' matrix) of a fetch for one step
        self._ahead = None                # (step, rows' matrix, keys) whose pulls went ahead
        self._next = None                 # [step, rows' matrix, keys] sliced ahead (_slice)

    def _fetch(self, i: int) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == i:      # sliced, and its pulls sent, by _announce
            _, Xs, keys = ahead
            self._fetched = (i, Xs)
            self.cache_keys = keys
            self._next = self._slice(i + 1)     # while the server applies and gathers
            self.cache = self.client.pull_many(keys)      # the replies of those pulls
            self.cache_versions = {t: self.client.read_version[self.client.ids[t]].copy()
                                   for t in keys}
            return
        span = self.order[i * self.B:min(i + self.policy.n_fetch, self.steps) * self.B]
        if self.policy.n_fetch == 1 and span.size:
            Xs = step_rows(self._rows, self.X, self.y, i, span)[0]
        else:
            Xs = self.X[span] if span.size else None
        keys = self.model.batch_keys(Xs) if span.size else {}
        # n_fetch = 1: the fetch read exactly step i's rows; the step reuses them and their keys
        self._fetched = (i, Xs) if self.policy.n_fetch == 1 and span.size else None
        self.cache_keys = keys
        self.cache = self.client.pull_many(keys)
        self.cache_versions = {t: self.client.read_version[self.client.ids[t]].copy() for t in keys}

    def step(self, i: int, rows, final: bool = False) -> float:
        """Step ``i`` on ``rows``; pushes when due, at the last step of an epoch, and (with the
        filter) flushes every residual when ``final``. Returns the summed loss."""
        if self.policy.fetch_due(i) or self.cache_keys is None:
            self._fetch(i)
        loss = 0.0
        self.last_rejected = False
        self.last_n = int(rows.size)
        if rows.size:
            if self._fetched is not None and self._fetched[0] == i:
                Xb, keys, params = self._fetched[1], self.cache_keys, self.cache
                yb = self.y[rows]
            else:
                Xb, yb = step_rows(self._rows, self.X, self.y, i, rows)
                keys = self.model.batch_keys(Xb)
                params = {t: self.cache[t][np.searchsorted(self.cache_keys[t], k)]
                          for t, k in keys.items()}
            self.last_n = int(Xb.shape[0])
            loss, grads = self.model.loss_grad(Xb, yb, keys, params)
            if not self.guard.check(self.client.clock_value,
                                    self.guard.code(loss, grads, self.dtypes)):
                self.last_rejected = True         # not accumulated: never pushed
                rows, loss = rows[:0], 0.0
        if rows.size:
            if self.step_hook is not None:
                self.step_hook(self.index, self.client.clock_value)
            if self.acc_versions is None:
                self.acc_versions = self.cache_versions
            for t, k in keys.items():
                self.acc_keys.setdefault(t, []).append(k)
                self.acc_grads.setdefault(t, []).append(_as_rows(grads[t], k.size))
            self.acc_n += self.last_n
        if self.policy.push_due(i) or i == self.steps - 1 or final:
            self._push(final, defer=True)      # sent with the step's clock
        if not self.last_rejected:
            self._announce(i)
        return loss

    def _slice(self, i: int):
        """With :attr:`fuse`, ``[i, rows' matrix, keys or None]`` of step ``i`` when its fetch
        can go with step ``i - 1``'s clock (there is such a step with rows in this segment;
        the keys found now when the model's ``keys_ahead`` allows it); else None."""
        got = _rows_ahead(self, i)
        if got is None:
            return None
        Xs = got[1]
        return [i, Xs, self.model.batch_keys(Xs) if getattr(self.model, "keys_ahead", False)
                else None]

    def _announce(self, i: int) -> None:
        """With :attr:`fuse`: hold step ``i + 1``'s pulls for this step's clock (its rows
        sliced while this step waited for its own, or now; its keys found then when the
        model's ``keys_ahead`` allows, else now, after this step's ``loss_grad``, as the model
        protocol has it); its :meth:`_fetch` then takes the replies."""
        nxt, self._next = self._next, None
        if nxt is None or nxt[0] != i + 1:
            nxt = self._slice(i + 1)
        if nxt is None:
            return
        if nxt[2] is None:
            nxt[2] = self.model.batch_keys(nxt[1])
        if self.client.pull_next(nxt[2]):
            self._ahead = tuple(nxt)

    def _push(self, final: bool, defer: bool = False) -> None:
        if self.acc_n == 0 and not (final and self.filters):
            return
        versions = self.acc_versions if self.acc_versions is not None else \
            getattr(self, "cache_versions", {})
        n = max(1, self.acc_n)
        tables = list(self.acc_keys) + [t for t in self.filters if t not in self.acc_keys]
        for t in tables:
            spec = self.client.specs[self.client.ids[t]]
            if t in self.acc_keys and len(self.acc_keys[t]) == 1 and t not in self.filters:
                # one step's gradient: pushed as it is (a duplicate key would be summed by
                # the server); merging it would only round-trip it through float64
                keys, sums = self.acc_keys[t][0], self.acc_grads[t][0]
            elif t in self.acc_keys:
                keys, sums = merge_duplicates(np.concatenate(self.acc_keys[t]),
                                              np.concatenate(self.acc_grads[t]).astype(np.float64))
            else:
                keys, sums = np.empty(0, np.int64), np.empty((0, spec.dim))
            v = versions.get(t)
            f = self.filters.get(t)
            if f is None:
                if keys.size:
                    cast = sums.astype(spec.dtype, copy=False)
                    # each step's gradient was finite; their sum may still overflow the dtype
                    check_finite(f"worker {self.index} at clock {self.client.clock_value}: "
                                 f"accumulated gradient of table {t!r}", cast)
                    self.client.push(t, keys, cast, n_examples=self.acc_n, versions=v,
                                     defer=defer)
            else:
                k, vals = f.filter(keys, sums / n, flush=final)
                self.client.push(t, k, vals.astype(spec.dtype), n_examples=1, versions=v,
                                 defer=defer)
        self._reset()

    def flush(self) -> None:
        """Push everything held locally — accumulated gradients and push-filter residuals —
        before a checkpoint cut, so that a restart loses nothing."""
        if self.acc_n or (self.filters and hasattr(self, "cache_versions")):
            self._push(final=True)

    def report(self) -> dict:
        fs = self.filters.values()
        return {"filter_sent": sum(f.sent for f in fs), "filter_offered": sum(f.offered for f in fs)}


def make_steps(policy, client, model, index: int, step_hook=None, guard=None, fuse=False):
    """The step runner for ``policy`` (Downpour for aggregate-free policies); ``guard`` is
    the :class:`NonFiniteGuard` (default: stop at the first non-finite step); ``fuse``: see
    :class:`SyncSteps`."""
    if policy.aggregate:
        return SyncSteps(client, model, index, step_hook, guard, fuse)
    return DownpourSteps(client, model, index, policy, step_hook, guard, fuse)
