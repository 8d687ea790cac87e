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


def _as_rows(grad, n: int) -> np.ndarray:
    """``grad`` as ``(n, dim)`` rows; ``n = 0`` (a minibatch of rows without features touches
    no key of a table) gives ``(0, last axis or 1)``, which ``reshape(0, -1)`` cannot."""
    g = np.asarray(grad)
    if n == 0 and g.size == 0:
        return g.reshape(0, g.shape[-1] if g.ndim > 1 else 1)
    return g.reshape(n, -1)


#: Codes of a step's outcome in the vote: fine, non-finite loss, non-finite gradient.
OK, BAD_LOSS, BAD_GRADIENT = 0, 1, 2
_WHAT = {BAD_LOSS: "loss", BAD_GRADIENT: "gradient"}


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

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self._next = None

    def _batch(self, rows):
        """``(Xb, yb, keys)`` of ``rows``: those of the step before's :meth:`_announce` when
        they are the same rows, else sliced now."""
        nxt, self._next = self._next, None
        if nxt is not None and (nxt[0] is rows or np.array_equal(nxt[0], rows)):
            return nxt[1:]
        Xb, yb = self.X[rows], self.y[rows]
        return Xb, yb, self.model.batch_keys(Xb)

    def _slice_next(self, i: int):
        """Step ``i + 1``'s ``[rows, Xb, yb, keys]`` when its pulls can go with step ``i``'s
        clock (:meth:`~hpcps.worker.client.PSClient.pull_next`): there is such a step with
        rows in this segment; else None. Called before this step waits for its rows, so
        that the slicing (most of a step's own work on Adult) overlaps the servers' work on
        the step before instead of delaying this step's push; with a model whose
        ``keys_ahead`` allows it the keys are found and their pulls announced then too
        (``keys`` set), else after this step's ``loss_grad`` (:meth:`_announce`)."""
        if not self.fuse or i + 1 >= self.steps or not getattr(self.client, "fusable", False):
            return None
        rows = self.order[(i + 1) * self.B:(i + 2) * self.B]
        if not rows.size:
            return None
        Xb = self.X[rows]
        if not Xb.shape[0]:
            return None
        sliced = [rows, Xb, self.y[rows], None]
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
            Xb, yb, keys = self._batch(rows)
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


class GroupSteps(SyncSteps):
    """BSP steps of a group of workers on one node that send their requests together
    (``[comm] aggregate = "node"``; :mod:`hpcps.comm.group`): each server gets one request
    per group and step, from the member that owns it for the group (``group.owned``).

    Every member, every step (the same collectives in the same order on all of them, with
    empty arrays where a member has no rows):

    1. its keys, grouped by server, to each server's owner (``MPI_Alltoall`` of the counts,
       ``MPI_Alltoallv`` of the keys), unless they went with the step before's gradients;
    2. each owner pulls the keys it got for its servers, concatenated in member order, in
       one ``pull_many`` (taking the replies its last clock asked for,
       :meth:`PSClient.pull_next`), and sends each member its rows back (``MPI_Alltoallv``);
    3. each computes its gradient; the non-finite guard votes as without groups;
    4. its gradient rows, the next step's keys and its example count to the owners (as in
       1.); each owner pushes the group's gradients for its servers with ``defer`` and holds
       the next step's pulls for its clock, which the trainer's :meth:`PSClient.clock` sends
       to its servers with the group's examples (:attr:`StepGroup.step_examples`).

    A server thus sums the same gradient rows in the same order as the members' own pushes
    would have given it (members are consecutive workers; each member's keys of a server
    keep their order), and each member's rows are those its own pull would have read: the
    model is the same bit for bit as without groups.

    Parameters
    ----------
    client : hpcps.worker.client.PSClient
        This worker's client, whose ``group`` is its :class:`hpcps.comm.group.StepGroup`.
    model, index, step_hook, guard, fuse
        As :class:`SyncSteps` (``fuse``: the next step's keys go with the gradients and the
        owners' pulls with their clocks).
    """

    def __init__(self, client, model, index: int, step_hook=None, guard=None, fuse=False):
        super().__init__(client, model, index, step_hook, guard, fuse)
        self.group = client.group
        self.specs = list(client.specs)
        self.row_bytes = np.array([s.dim * np.dtype(s.dtype).itemsize for s in self.specs],
                                  dtype=np.int64)
        self._known = False   # this step's keys went to the owners with the step before's
        self._in = None       # as owner: (keys per table from each member (G, T), {table: keys})

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        super().begin_epoch(X, y, order, steps, batch_size)
        self._known, self._in = False, None

    def _key_arrays(self, keys: dict) -> list:
        """``keys`` (``{table: keys}``, maybe without some tables) as one int64 array per
        table of the job, in table order (empty where absent)."""
        return [np.ascontiguousarray(keys[s.name], dtype=np.int64).reshape(-1)
                if s.name in keys else np.empty(0, dtype=np.int64) for s in self.specs]

    def _route(self, arrays: list) -> tuple:
        """Per table, the positions of ``arrays``' keys in the order they go to the owners
        (by owner, then by server, each server's keys in their order), and the keys per
        owner and table, int64 ``(G, T)``."""
        G = self.group.size
        idx, counts = [], np.zeros((G, len(arrays)), dtype=np.int64)
        for t, k in enumerate(arrays):
            if not k.size:
                idx.append(np.empty(0, dtype=np.int64))
                continue
            order, bounds = self.client.routing.group(t, k)
            pos = np.arange(k.size, dtype=np.int64) if order is None else order
            owner = np.repeat(np.arange(bounds.size - 1, dtype=np.int64) % G, np.diff(bounds))
            by = np.argsort(owner, kind="stable")
            idx.append(pos[by])
            counts[:, t] = np.bincount(owner, minlength=G)
        return idx, counts

    def _send_parts(self, arrays: list, idx: list, counts: np.ndarray) -> list:
        """For each owner, each table's rows of ``arrays`` (positions ``idx``) for it."""
        G = self.group.size
        parts = [[] for _ in range(G)]
        for t, a in enumerate(arrays):
            sent = a[idx[t]]
            off = 0
            for d in range(G):
                n = int(counts[d, t])
                if n:
                    parts[d].append(sent[off:off + n])
                off += n
        return parts

    def _take_keys(self, got: list, incoming: np.ndarray, skip: np.ndarray = None) -> None:
        """As owner: the keys each member sent (``got[m]``, after ``skip[m]`` bytes), per
        table in member order, and the pulls of them."""
        T = len(self.specs)
        per = [[] for _ in range(T)]
        for m, buf in enumerate(got):
            pos = 0 if skip is None else int(skip[m])
            for t in range(T):
                n = int(incoming[m, t])
                if n:
                    per[t].append(buf[pos:pos + 8 * n].view(np.int64))
                pos += 8 * n
        req = {self.specs[t].name: np.concatenate(per[t]) for t in range(T) if per[t]}
        self._in = (incoming, req)

    def step(self, i: int, rows, final: bool = False) -> float:
        """Run step ``i`` on ``rows`` (maybe empty) with the group; return the summed loss of
        this worker's examples (0 for a rejected step, :attr:`last_rejected` then True).
        Collective over the group (and over the workers when the guard votes).

        Raises
        ------
        RuntimeError
            If this step's rows are not those announced with the step before (the owners
            pulled for those).
        """
        g = self.group
        G, T = g.size, len(self.specs)
        self.last_rejected = False
        self.last_n = int(rows.size)
        g.step_examples = 0
        known, self._known = self._known, False
        keys, grads, code, loss = {}, {}, OK, 0.0
        nxt = self._next
        if known and rows.size and (nxt is None or not (nxt[0] is rows
                                                        or np.array_equal(nxt[0], rows))):
            raise RuntimeError(f"worker {self.index}: step {i}'s rows are not those it "
                               "announced to its group")
        if rows.size:
            Xb, yb, keys = self._batch(rows)
            self.last_n = int(Xb.shape[0])
        mine = self._key_arrays(keys)
        idx, counts = self._route(mine)
        if not known:                                   # 1. keys to the owners
            incoming = g.counts(counts)
            got = g.alltoall(self._send_parts(mine, idx, counts), 8 * incoming.sum(axis=1))
            self._take_keys(got, incoming)
        incoming, req = self._in
        # 2. the owners pull, and send each member its rows
        pulled = self.client.pull_many(req) if req else {}
        back = [[] for _ in range(G)]
        for t, spec in enumerate(self.specs):
            got_t, off = pulled.get(spec.name), 0
            for m in range(G):
                n = int(incoming[m, t])
                if n:
                    back[m].append(got_t[off:off + n])
                    off += n
        mine_rows = g.alltoall(back, counts @ self.row_bytes)
        params = {}
        pos = np.zeros(G, dtype=np.int64)
        for t, spec in enumerate(self.specs):
            out = np.empty((mine[t].size, spec.dim), dtype=spec.dtype)
            sent = np.concatenate([mine_rows[d][pos[d]:pos[d] + counts[d, t] * self.row_bytes[t]]
                                   for d in range(G)]) if mine[t].size else None
            pos += counts[:, t] * self.row_bytes[t]
            if sent is not None:
                out[idx[t]] = sent.view(spec.dtype).reshape(-1, spec.dim)
            if spec.name in keys:
                params[spec.name] = out
        if rows.size:                                   # 3. the gradient
            loss, grads = self.model.loss_grad(Xb, yb, keys, params)
            code = self.guard.code(loss, grads, self.dtypes)
        if not self.guard.check(self.client.clock_value, code):
            self.last_rejected = True
            self._next = None
            return 0.0
        if rows.size and self.step_hook is not None:
            self.step_hook(self.index, self.client.clock_value)
        announce = self.fuse and i + 1 < self.steps
        nkeys = {}
        if announce:
            nrows = self.order[(i + 1) * self.B:(i + 2) * self.B]
            if nrows.size:
                nX = self.X[nrows]
                nkeys = self.model.batch_keys(nX)
                self._next = (nrows, nX, self.y[nrows], nkeys)
        # 4. gradients, next keys and examples to the owners
        vals = [np.empty((0, spec.dim), dtype=spec.dtype) if spec.name not in grads else
                np.ascontiguousarray(_as_rows(grads[spec.name], k.size), dtype=spec.dtype)
                for spec, k in zip(self.specs, mine)]
        parts = self._send_parts(vals, idx, counts)
        head = np.zeros((G, T + 1), dtype=np.int64)
        head[:, T] = self.last_n if rows.size else 0
        if announce:
            nmine = self._key_arrays(nkeys)
            nidx, ncounts = self._route(nmine)
            head[:, :T] = ncounts
            for d, extra in enumerate(self._send_parts(nmine, nidx, ncounts)):
                parts[d].extend(extra)
        told = g.counts(head)
        grad_bytes = incoming @ self.row_bytes
        got = g.alltoall(parts, grad_bytes + 8 * told[:, :T].sum(axis=1))
        offs = np.zeros(G, dtype=np.int64)
        for t, spec in enumerate(self.specs):
            chunks = []
            for m in range(G):
                nb = int(incoming[m, t] * self.row_bytes[t])
                if nb:
                    chunks.append(got[m][offs[m]:offs[m] + nb])
                offs[m] += nb
            if chunks:
                gr = np.concatenate(chunks).view(spec.dtype).reshape(-1, spec.dim)
                self.client.push(spec.name, req[spec.name], gr, defer=True)
        g.step_examples = int(told[:, T].sum())
        if announce:
            self._take_keys(got, told[:, :T], skip=grad_bytes)
            if self._in[1]:
                self.client.pull_next(self._in[1])
        self._known = announce
        return loss


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

    With ``push_threshold > 0`` every sparse table's pushes go through a :class:`PushFilter`;
    dense tables are pushed unfiltered.
    """

    def __init__(self, client, model, index: int, policy, step_hook=None, guard=None):
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
        self._reset()

    def _reset(self):
        self.acc_keys: dict = {}
        self.acc_grads: dict = {}
        self.acc_n = 0
        self.acc_versions = None

    def begin_epoch(self, X, y, order, steps: int, batch_size: int) -> None:
        self.X, self.y, self.order, self.steps, self.B = X, y, order, steps, batch_size
        self.cache_keys = None            # the first step of an epoch (or of a resume) fetches
        self._fetched = None              # (step, rows' matrix) of a fetch for one step

    def _fetch(self, i: int) -> None:
        span = self.order[i * self.B:min(i + self.policy.n_fetch, self.steps) * self.B]
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
            yb = self.y[rows]
            if self._fetched is not None and self._fetched[0] == i:
                Xb, keys, params = self._fetched[1], self.cache_keys, self.cache
            else:
                Xb = self.X[rows]
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
        return loss

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
        if getattr(client, "group", None) is not None:
            return GroupSteps(client, model, index, step_hook, guard, fuse)
        return SyncSteps(client, model, index, step_hook, guard, fuse)
    return DownpourSteps(client, model, index, policy, step_hook, guard)
