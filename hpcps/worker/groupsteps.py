"""BSP steps of a group of workers that send their requests together (``[comm] aggregate =
"node"``): :class:`GroupSteps`, the step runner :func:`hpcps.worker.steps.make_steps` picks
for a client with a group (:mod:`hpcps.comm.group`). No MPI of its own."""

from __future__ import annotations

import numpy as np

from hpcps.kernels.keys import group_order
from hpcps.worker.steps import OK, SyncSteps, _as_rows


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
            counts[:, t] = np.bincount(owner, minlength=G)
            ends = np.zeros(G + 1, dtype=np.int64)
            np.cumsum(counts[:, t], out=ends[1:])
            idx.append(pos[group_order(owner, ends)])
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

    @staticmethod
    def _per_table(bufs: list, counts: np.ndarray, row_bytes, start=None) -> list:
        """Each member's bytes ``bufs[m]`` (from ``start[m]``) cut into its tables' parts,
        ``counts[m, t]`` rows of ``row_bytes[t]`` bytes each: ``out[t]``, the non-empty parts
        of table ``t`` in member order."""
        out = [[] for _ in range(counts.shape[1])]
        for m, buf in enumerate(bufs):
            pos = 0 if start is None else int(start[m])
            for t, part in enumerate(out):
                nb = int(counts[m, t]) * int(row_bytes[t])
                if nb:
                    part.append(buf[pos:pos + nb])
                pos += nb
        return out

    def _take_keys(self, got: list, incoming: np.ndarray, skip=None) -> None:
        """As owner: the keys each member sent (``got[m]``, after ``skip[m]`` bytes), per
        table in member order, and the pulls of them."""
        per = self._per_table(got, incoming, [8] * len(self.specs), skip)
        self._in = (incoming, {spec.name: np.concatenate(parts).view(np.int64)
                               for spec, parts in zip(self.specs, per) if parts})

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
            Xb, yb, keys = self._batch(i, rows)
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
        cut = self._per_table(g.alltoall(back, counts @ self.row_bytes), counts, self.row_bytes)
        params = {}
        for t, spec in enumerate(self.specs):
            out = np.empty((mine[t].size, spec.dim), dtype=spec.dtype)
            if cut[t]:
                out[idx[t]] = np.concatenate(cut[t]).view(spec.dtype).reshape(-1, spec.dim)
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
                nX, ny = self._rows_of(i + 1, nrows)
                nkeys = self.model.batch_keys(nX)
                self._next = (nrows, nX, ny, nkeys)
        # 4. gradients, next keys and examples to the owners
        vals = [np.empty((0, spec.dim), dtype=spec.dtype) if spec.name not in grads else
                np.ascontiguousarray(_as_rows(grads[spec.name], k.size), dtype=spec.dtype)
                for spec, k in zip(self.specs, mine)]
        parts = self._send_parts(vals, idx, counts)
        head = np.zeros((G, T + 1), dtype=np.int64)
        head[:, T] = self.last_n                       # 0 without rows
        if announce:
            nmine = self._key_arrays(nkeys)
            nidx, ncounts = self._route(nmine)
            head[:, :T] = ncounts
            for d, extra in enumerate(self._send_parts(nmine, nidx, ncounts)):
                parts[d].extend(extra)
        told = g.counts(head)
        grad_bytes = incoming @ self.row_bytes
        got = g.alltoall(parts, grad_bytes + 8 * told[:, :T].sum(axis=1))
        for spec, chunks in zip(self.specs, self._per_table(got, incoming, self.row_bytes)):
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
