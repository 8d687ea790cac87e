"""The worker's client of the parameter server: ``pull``, ``push``, ``clock``.

Contract (as in ps-lite's KVWorker, stated here for hpcps):

* ``pull(table, keys)`` returns the rows of ``keys`` in the order given (duplicates allowed),
  as of the consistency policy: under BSP the pull at clock ``t`` sees exactly the updates of
  every worker's clocks ``< t``. It blocks until every server has answered.
* ``push(table, keys, grads)`` sends gradient *sums* for ``keys`` (duplicates allowed; the
  server sums them). It returns once the data has left this worker's buffers.
* ``clock(n_examples)`` ends this worker's step: it tells every server how many examples the
  step's pushes cover (servers divide by the total) and advances the worker clock.

Pulls go either as request/reply messages (``p2p``) or as one-sided reads of the servers'
shard windows (``rma``, :mod:`hpcps.comm.rma`): passive-target ``Lock(SHARED)``/``Get``/
``Unlock``, no message to the server. Either way the worker learns each shard's clock header,
waits (p2p: the server defers the reply; rma: the worker re-reads after a back-off) until the
shard is as fresh as the consistency policy requires, and remembers the shard version it read
so that its next push can carry it (the server computes the update's staleness from it).

No method is collective; each talks point-to-point to the servers that own the keys, or
reads their windows.

A step's pushes go with its clock (``push(..., defer=True)``: one ``PUSH_CLOCK`` per server),
and under BSP with p2p pulls the next step's pulls can go with them too
(:meth:`PSClient.pull_next`, :mod:`hpcps.worker.nextpull`: one ``PUSH_CLOCK_PULL`` per server
and step, the replies taken by the next :meth:`PSClient.pull_many` of the same keys).

Key ranges and routing: the client reads both from the job's
:class:`~hpcps.comm.membership.Membership` — key -> key range (:meth:`Membership.route`, one
range per server of the launch), range ``s`` -> ``ps`` rank ``membership.range_ranks[s]``.
After a continue-mode job lost a server another server holds its range (several ranges may
then share a rank); after a recovery or a growth :meth:`PSClient.follow` re-reads the
membership.

Kept pushes (continue mode, BSP/SSP, :meth:`PSClient.keep_pushes`): every push and CLOCK is
kept until the range has shown, in the clock header of a pull reply, that it (and its
backup) hold that step; after a failure the worker sends the kept steps a range asks for
again (:meth:`PSClient.resend`), as a worker of Li et al. (OSDI 2014, §4.3) re-sends the
requests a dead server had not acknowledged.
"""

from __future__ import annotations

import numpy as np

import time

from hpcps.comm import transport as tp
from hpcps.worker.kept import KeptPushes
from hpcps.worker.nextpull import NextPull
from hpcps.core.consistency import BSP, H_CLOCK, H_FASTEST, H_NWORKERS, H_SEQ, H_SLOWEST, H_VERSION, header_len


class PSClient(NextPull, KeptPushes):
    """Worker-side access to the sharded tables.

    Parameters
    ----------
    membership : hpcps.comm.membership.Membership
        The job's layout on this rank: the tables and their key -> range map, the rank of
        each range, the number of workers (the shard header length), the RMA windows (one
        per table, in table-id order: pull through RMA instead of p2p messages; none: p2p).
    policy : hpcps.core.consistency.Policy, optional
        Freshness required of reads (default BSP).
    max_bytes : int
        Largest message (``[comm] max_message_bytes``); bigger ones are split.
    group : hpcps.comm.group.StepGroup or None
        ``[comm] aggregate = "node"`` (:class:`hpcps.worker.groupsteps.GroupSteps`):
        :meth:`clock` and :meth:`stop` go to the servers in ``group.owned`` only.
    """

    def __init__(self, membership, policy=None, max_bytes: int = 1 << 30, group=None):
        self.membership = membership
        self.group = group
        self.routing = membership.routing
        self.specs = self.routing.specs
        self.ids = self.routing.ids
        n_servers = membership.n_ranges
        self.ep = tp.WorkerEndpoint(membership.roles.ps, membership.range_ranks, max_bytes)
        self.n_servers = n_servers
        self.pushes_sent = np.zeros(n_servers, dtype=np.int64)   # PUSH messages per server
        self.clock_value = 0
        self.seq = 0
        self.policy = policy or BSP()
        self.windows = list(membership.windows) or None
        self.pull_mode = "rma" if self.windows else "p2p"
        self.header_len = header_len(membership.n_workers)
        #: shard version last read, per table and server (-1 = never): sent with pushes
        self.read_version = [np.full(n_servers, -1, dtype=np.int64) for _ in self.specs]
        #: the most recent shard header seen (server clock, worker clocks)
        self.last_header = np.zeros(self.header_len, dtype=np.int64)
        self.header_clock = -1         # this worker's clock when last_header was read (-1: never)
        self.read_age_max = 0          # max over reads of (my clock - shard clock)
        self.read_age_sum = 0
        self.reads = 0
        self.lead_max = 0              # max over reads of (my clock - slowest worker's clock)
        #: kept pushes (keep_pushes): step -> [examples or None, [(range, header, keys, grads)], epoch]
        self.kept = None
        #: per range, the largest clock a pull reply showed (every step below it is held)
        self.acked_seen = None
        self.kept_bytes_max = 0
        #: pushes held for this step's PUSH_CLOCK (push(..., defer=True)): range -> [(header,
        #: keys, grads)]
        self.staged: dict = {}
        #: the next step's pulls held for this step's clock (:meth:`pull_next`): (requests
        #: as given, keys as int64, prepared pulls), or None
        self.next_pull = None
        #: pulls sent with the last clock and not taken yet: (clock they are for, requests
        #: as given, keys as int64, prepared pulls), or None
        self.prefetch = None
        #: per table (by name and by id), what a pull or push of one request to the one key
        #: range takes in one compiled call (:meth:`_pull_one`): (table id, dim, dtype,
        #: buffer format, key bound or -1); empty when the job has several ranges
        self._one = {}
        if n_servers == 1:
            for tid, spec in enumerate(self.specs):
                bound = self.routing.parts[tid].num_keys
                info = (tid, spec.dim, np.dtype(spec.dtype), tp.buffer_format(spec.dtype),
                        -1 if bound is None else int(bound))
                self._one[tid] = self._one[spec.name] = info

    def _table(self, table):
        """``(table id, spec, key -> range map)``; ``KeyError`` for an unknown table."""
        return self.routing.table(table)

    def pull(self, table, keys, fresh: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``keys``.

        Parameters
        ----------
        table : str or int
        keys : int64 array-like (n,)
            Keys in ``[0, num_keys)``; duplicates allowed.
        fresh : bool
            Wait until the rows include every worker's updates of clocks below this worker's
            clock, whatever the consistency model (for evaluation and the final model).
        out : ndarray (n, dim) of the table dtype, C-contiguous, optional
            Where to put the rows (a buffer the caller reuses: a new array of many MiB costs
            first-touch page faults on every pull). Default: a new array.

        Returns
        -------
        ndarray (n, dim) of the table dtype (``out`` when given).

        Raises
        ------
        ValueError
            For a key outside the table's key space, or an ``out`` of the wrong shape, dtype
            or layout.
        """
        if self.prefetch is None and not self.windows and type(keys) is np.ndarray:
            rows = self._pull_one(table, keys, fresh, out)
            if rows is not None:
                return rows
        return self.pull_many({table: keys}, fresh, {table: out} if out is not None else None)[table]

    def _pull_one(self, table, keys: np.ndarray, fresh: bool, out):
        """A pull from the job's one key range in one compiled call (issue 20: the small
        request's Python work; :meth:`hpcps.comm.transport.WorkerEndpoint.request`): the
        rows (``out``, or a new array), or None when that path does not take it (several
        ranges, no key, not one message each way, a key to convert or refuse, an ``out``
        to check: :meth:`pull_many` then does it, and raises what it raises). The same
        request, reply, header bookkeeping (:meth:`_saw`) and counts as :meth:`pull_many`'s."""
        info = self._one.get(table)
        if info is None or not keys.size:
            return None
        tid, dim, dtype, fmt, bound = info
        if self.staged:
            self.send_staged()
        if self.ep.pending:
            self.ep.complete(tp.PULL)        # the last clock's sends, as pull_many waits for them
        if out is None:
            out = np.empty((keys.size, dim), dtype=dtype)
        elif not isinstance(out, np.ndarray):
            return None
        hdr = np.empty(self.header_len, dtype=np.int64)
        if not self.ep.request(0, tp.PULL, tid, self.clock_value, 0, self.seq, 0, int(fresh),
                               keys, bound, fmt, dim, rows=out, header=hdr):
            return None
        self.seq += 1
        self._saw(tid, 0, hdr)
        return out

    def pull_many(self, requests: dict, fresh: bool = False, outs: dict | None = None) -> dict:
        """Rows of several tables in one exchange: ``{table: keys}`` -> ``{table: rows}``.

        Every table's requests to every server are posted before any reply is awaited, so a
        step that reads several tables (weights and bias) waits for one round trip, not one
        per table; with p2p pulls, a server holding keys of several tables gets them in one
        ``PULL_MANY`` request (one trip through its loop). Arguments and errors as :meth:`pull` (``outs``: ``{table: out}``).
        Point-to-point; not collective.

        When the last :meth:`clock` sent these very pulls already (:meth:`pull_next`: the
        same tables and keys, for this clock, not ``fresh``, no ``outs``), their replies are
        the rows: only their wait remains. Any other pull first waits for those replies and
        drops them.
        """
        todo = self._take_prefetch(requests, fresh, outs)
        if todo is not None:
            return self._pulled(todo)
        self.send_staged()
        # check and group every request first: a bad key raises before anything is sent
        todo = [self._pull_prepare(table, keys, outs.get(table) if outs else None)
                for table, keys in requests.items()]
        posted = [t for t in todo if t[2] is not None]
        if self.windows:
            for t in posted:
                self._pull_post(*t[1:], fresh)
        elif posted:
            self._pull_post_p2p(posted, fresh)
            self.ep.complete(tp.PULL)
        return self._pulled(todo)

    def _pulled(self, todo) -> dict:
        """The rows of completed pulls (``_pull_prepare``'s tuples) by table, in the order
        asked; their shard headers recorded (:meth:`_saw`)."""
        result = {}
        for table, tid, sorted_keys, order, bounds, buf, out, hdrs in todo:
            if sorted_keys is not None:
                for s in range(self.n_servers):
                    if bounds[s] < bounds[s + 1]:
                        self._saw(tid, s, hdrs[s])
                if order is not None:
                    out[order] = buf
            result[table] = out
        return result

    def _pull_prepare(self, table, keys, out):
        """Check a pull and group its keys by server; allocate what it needs."""
        tid, spec, _ = self._table(table)
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if out is None:
            out = np.empty((keys.size, spec.dim), dtype=spec.dtype)
        elif (not isinstance(out, np.ndarray) or out.shape != (keys.size, spec.dim)
              or out.dtype != np.dtype(spec.dtype) or not out.flags.c_contiguous
              or not out.flags.writeable or not out.dtype.isnative):
            raise ValueError(f"pull from {spec.name!r}: out must be a writeable C-contiguous "
                             f"{spec.dtype} array of shape ({keys.size}, {spec.dim}), got "
                             f"{getattr(out, 'dtype', type(out).__name__)} "
                             f"{getattr(out, 'shape', '')}")
        if keys.size == 0:
            return table, tid, None, None, None, out, out, None
        sorted_keys, _, bounds, order = self.routing.split(tid, keys)
        buf = out if order is None else np.empty_like(out)   # in order already: no reordering
        hdrs = np.zeros((self.n_servers, self.header_len), dtype=np.int64)
        return table, tid, sorted_keys, order, bounds, buf, out, hdrs

    def _pull_post(self, tid, sorted_keys, order, bounds, buf, out, hdrs, fresh) -> None:
        """Start a prepared pull through the windows (RMA, complete on return)."""
        _, spec, part = self._table(tid)
        self._pull_rma(tid, spec, part, sorted_keys, bounds, buf, hdrs, fresh)
        self.seq += 1

    def _pull_post_p2p(self, todo, fresh) -> None:
        """Start prepared pulls of one or more tables (``_pull_prepare``'s tuples) as
        messages: one request per server whatever the number of tables — a ``PULL`` for
        one table's keys, a ``PULL_MANY`` for several (the server loop handles it in one
        trip and answers each table in the request's order) — receives posted first.
        Completed by the caller (``ep.complete``)."""
        by_server = self._pulls_by_server(todo)
        c = self.clock_value
        for s, parts in enumerate(by_server):
            if not parts:
                continue
            # replies come in the request's order (one message for several when they fit)
            self.ep.expect_replies(s, [(rows, hdr) for _, _, rows, hdr in parts], tp.PULL)
            if len(parts) == 1:
                tid, k, _, _ = parts[0]
                self.ep.send(s, tp.make_header(tp.PULL, tid, c, k.size, seq=self.seq,
                                               aux=int(fresh), rng=s), k)
                continue
            desc = np.array([[tid, k.size, 0, self.specs[tid].dim, 0] for tid, k, _, _ in parts],
                            dtype=np.int64)
            self.ep.send(s, tp.make_header(tp.PULL_MANY, len(parts), c,
                                           sum(k.size for _, k, _, _ in parts), seq=self.seq,
                                           aux=int(fresh), rng=s), desc,
                         more=[(k, None, tp.PULL) for _, k, _, _ in parts])
        self.seq += 1

    def _pull_rma(self, tid, spec, part, sorted_keys, bounds, buf, hdrs, fresh) -> None:
        """One-sided reads of each server's window (see :meth:`ShardWindow.read`).

        Sends still pending (the last clock's ``PUSH_CLOCK``) are completed first: a read
        that waits for a fresh shard polls the window and nothing else, so a send that needs
        this rank's progress to finish (a rendezvous without single-copy shared memory, a
        chunked message) would never reach the server, which would wait for it for ever."""
        if self.ep.pending:
            self.ep.complete(tp.PUSH)
        t0 = time.perf_counter()
        win = self.windows[tid]
        c = self.clock_value
        if fresh:
            def ok(h):
                return int(h[H_CLOCK]) >= c
        else:
            def ok(h):
                return self.policy.fresh(h, c)
        row_bytes = spec.dim * np.dtype(spec.dtype).itemsize
        # BSP/SSP: validate against the server's write sequence (a whole clock or retry);
        # async: torn reads are allowed
        seq = H_SEQ * 8 if self.policy.aggregate else None
        pos = part.positions(sorted_keys)
        nbytes = 0
        for s in range(self.n_servers):
            a, b = bounds[s], bounds[s + 1]
            if a == b:
                continue
            lo, _ = part.shard_range(s)
            offs = self.header_len * 8 + (pos[a:b] - lo) * row_bytes
            win.read(self.ep.server_ranks[s], hdrs[s], buf[a:b], offs, fresh=ok,
                     max_bytes=self.ep.max_bytes, seq_offset=seq)
            nbytes += buf[a:b].nbytes + hdrs[s].nbytes
        self.ep.stats.add(tp.PULL, messages=1, inn=nbytes, keys=int(sorted_keys.size),
                          seconds=time.perf_counter() - t0)

    def _saw(self, tid: int, server: int, hdr: np.ndarray) -> None:
        """Record the shard header a read returned (version for pushes; ages for reports)."""
        h = hdr.tolist()       # Python ints: numpy's scalar indexing cost more than the rest
        self.read_version[tid][server] = h[H_VERSION]
        self.last_header = hdr
        c = self.header_clock = self.clock_value
        clk = h[H_CLOCK]
        if self.acked_seen is not None and clk > self.acked_seen[server]:
            self.acked_seen[server] = clk
        age = c - clk
        if age > self.read_age_max:
            self.read_age_max = age
        self.read_age_sum += age
        self.reads += 1
        if h[H_NWORKERS]:
            lead = c - h[H_SLOWEST]
            if lead > self.lead_max:
                self.lead_max = lead

    def worker_clocks(self) -> tuple[int, int] | None:
        """The slowest and the fastest worker's clock as of the most recent shard header read
        (None before the first read). That read was at this worker's clock
        :attr:`header_clock`: a worker that pulls nothing (no rows) reads no header, so the
        values can be old."""
        h = self.last_header
        if not h[H_NWORKERS]:
            return None
        return int(h[H_SLOWEST]), int(h[H_FASTEST])

    def push(self, table, keys, grads, n_examples: int = 0, versions=None,
             defer: bool = False) -> None:
        """Send gradient sums ``grads`` for ``keys`` to the servers owning them.

        Parameters
        ----------
        table : str or int
        keys : int64 array-like (n,)
        grads : array-like (n, dim) (or (n,) when dim == 1), cast to the table dtype.
        n_examples : int
            Examples the sums cover, for servers that apply pushes on arrival (async); under
            BSP/SSP the count goes with :meth:`clock` instead.
        versions : int64 array (n_servers,), optional
            Shard versions the gradients were computed on (default: the last ones read).
        defer : bool
            Hold the push and send it with this step's :meth:`clock`: one request per server
            for the pushes of every table and the CLOCK (``PUSH_CLOCK``), which the server
            loop handles in one trip. The push holds its own copy of ``keys`` and ``grads``
            where it would otherwise send from the caller's memory (a conversion or a
            reordering by server makes one already), so the caller may change them as soon
            as this returns, although the sends complete only later. Any other request sends
            held pushes first, as plain PUSHes.

        Raises
        ------
        ValueError
            On a shape mismatch or a key outside the key space.
        """
        if (not defer and self.kept is None and type(keys) is np.ndarray
                and type(grads) is np.ndarray and keys.size):
            info = self._one.get(table)
            if info is not None:          # one key range: one compiled call (see _pull_one)
                tid = info[0]
                if self.ep.pending:
                    self.ep.complete(tp.PUSH)
                v = self.read_version[tid][0] if versions is None else versions[0]
                if self.ep.request(0, tp.PUSH, tid, self.clock_value, int(n_examples), self.seq,
                                   info[1], int(v), keys, info[4], info[3], info[1],
                                   values=grads):
                    self.pushes_sent[0] += 1
                    self.seq += 1
                    return
        tid, spec, _ = self._table(table)
        given_keys, given_grads = keys, grads
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        grads = np.ascontiguousarray(grads, dtype=spec.dtype).reshape(keys.size, -1) \
            if keys.size else np.empty((0, spec.dim), dtype=spec.dtype)
        if grads.shape != (keys.size, spec.dim):
            raise ValueError(f"push to {spec.name!r}: grads shape {grads.shape} does not match "
                             f"({keys.size}, {spec.dim})")
        if keys.size == 0:
            return
        k, g, bounds, order = self.routing.split(tid, keys, grads)     # new arrays if reordered
        if order is None and defer:       # sent after clock() returns: never the caller's memory
            k, g = _private(k, given_keys), _private(g, given_grads)
        versions = self.read_version[tid] if versions is None else versions
        for s in range(self.n_servers):
            a, b = bounds[s], bounds[s + 1]
            if a == b:
                continue
            h = tp.make_header(tp.PUSH, tid, self.clock_value, b - a, n_examples, seq=self.seq,
                               dim=spec.dim, aux=int(versions[s]), rng=s)
            if defer:
                self.staged.setdefault(s, []).append((h, k[a:b], g[a:b]))
            else:
                self.ep.send(s, h, k[a:b], g[a:b])
                self.pushes_sent[s] += 1
            if self.kept is not None:
                self.kept.setdefault(self.clock_value, [None, [], 0])[1].append(
                    (s, h, k[a:b].copy(), g[a:b].copy()))
        if not defer:
            self.ep.complete(tp.PUSH)
        self.seq += 1

    def send_staged(self) -> None:
        """Send the pushes held by ``push(..., defer=True)`` now, as plain PUSHes (before any
        request other than the step's clock). Point-to-point."""
        if not self.staged:
            return
        for s, parts in self.staged.items():
            for h, k, g in parts:
                self.ep.send(s, h, k, g)
                self.pushes_sent[s] += 1
        self.staged = {}
        self.ep.complete(tp.PUSH)

    def clock(self, n_examples: int, epoch: int = 0) -> int:
        """Finish this worker's step (``n_examples`` examples pushed in it, in ``epoch``,
        0-based); return the new clock. Point-to-point, one request per key range.

        A range with pushes held by ``push(..., defer=True)`` gets them and the CLOCK in one
        ``PUSH_CLOCK`` request. The sends are not waited for here: the next request's wait
        (or the next RMA pull, which completes them before it reads a window) completes
        them, so the worker goes on to its next minibatch while the servers receive. They
        go from buffers the client owns (see ``push``'s ``defer``): the caller's arrays are
        free again when this returns. Sends still pending from the previous clock are
        waited for first, so at most one step's buffers are held.

        In a group (:attr:`group`): to its servers, with the group's examples.
        """
        g = self.group
        ranges = range(self.n_servers) if g is None else g.owned
        n_examples = n_examples if g is None else g.step_examples
        if self.ep.pending:
            self.ep.complete(tp.PUSH)
        if self.kept is not None:
            entry = self.kept.setdefault(self.clock_value, [None, [], 0])
            entry[0], entry[2] = int(n_examples), int(epoch)
        staged, self.staged = self.staged, {}
        nxt, self.next_pull = self.next_pull, None
        pulls = self._pulls_by_server(nxt[2]) if nxt is not None else None
        if not self.ep.clock_step(ranges, self.clock_value, n_examples, self.seq, epoch, staged,
                                  pulls, self.pushes_sent):        # one compiled call
            self._send_clock(ranges, staged, pulls, n_examples, epoch)
        self.clock_value += 1
        if nxt is not None:
            self.seq += 1
            self.prefetch = (self.clock_value, nxt[0], nxt[1], nxt[2])
        if self.kept is not None:
            self._trim()
        return self.clock_value

    def grow(self, n_workers: int, oversubscribe: bool = False) -> None:
        """Tell every server that the workers add ``n_workers`` workers at this clock
        (:mod:`hpcps.resilience.elastic`); every worker sends it, after its last request of the clock, so
        a server that has it from all workers holds no request of theirs. One message per
        server rank (after a server loss one rank may hold several key ranges). Point-to-point."""
        self._settle()
        self.send_staged()
        first_range = {}
        for s, rank in enumerate(self.ep.server_ranks):
            first_range.setdefault(rank, s)
        for s in first_range.values():
            self.ep.send(s, tp.make_header(tp.GROW, 0, self.clock_value, int(oversubscribe),
                                           aux=n_workers, rng=s))
        self.ep.complete(tp.GROW)

    def follow(self) -> None:
        """Take the membership's new layout (after a recovery or a growth): the ``ps``
        communicator and the rank of each key range, the shard header sized for the number of
        workers, the RMA windows. Traffic counts are kept. Local."""
        m = self.membership
        stats = self.ep.stats
        self.next_pull = self.prefetch = None       # replies of the old layout, if any
        self.ep = tp.WorkerEndpoint(m.roles.ps, m.range_ranks, self.ep.max_bytes)
        self.ep.stats = stats
        self.header_len = header_len(m.n_workers)
        self.last_header = np.zeros(self.header_len, dtype=np.int64)
        self.header_clock = -1
        self.windows = list(m.windows) or None

    def pull_table(self, table) -> np.ndarray:
        """The whole table in original key order, ``(num_keys, dim)``; for model output.

        Sends one ``PULL_SHARD`` to each server (answered once the server's clock has reached
        this worker's clock) and un-permutes the shards.
        """
        self._settle()
        self.send_staged()
        tid, spec, part = self._table(table)
        if spec.dynamic:
            raise ValueError(f"table {spec.name!r} is dynamic (storage 'hash'): it has no "
                             "dense form; use pull_keys_rows")
        shards = []
        for s in range(self.n_servers):
            lo, hi = part.shard_range(s)
            buf = np.empty((hi - lo, spec.dim), dtype=spec.dtype)
            shards.append(buf)
            if hi > lo:
                self.ep.expect(s, buf, tp.PULL_SHARD)
                self.ep.send(s, tp.make_header(tp.PULL_SHARD, tid, self.clock_value, rng=s))
        self.ep.complete(tp.PULL_SHARD)
        out = np.empty((spec.num_keys, spec.dim), dtype=spec.dtype)
        for s, buf in enumerate(shards):
            out[part.shard_keys(s)] = buf
        return out

    def pull_keys_rows(self, table):
        """Every key a dynamic table stores and its row, ``(keys int64 (n,), rows (n, dim))``,
        ascending by key; for model output. Point-to-point, three round trips (count, keys,
        rows: :data:`hpcps.server.dynshard.PULL_SHARD_COUNT`), each answered once the
        server's clock has reached this worker's clock."""
        self._settle()
        self.send_staged()
        tid, spec, _ = self._table(table)
        counts = [np.zeros(1, dtype=np.int64) for _ in range(self.n_servers)]
        self._pull_shards(tid, counts, aux=1)
        n = [int(c[0]) for c in counts]
        keys = [np.empty(k, dtype=np.int64) for k in n]
        self._pull_shards(tid, keys, aux=2)
        rows = [np.empty((k, spec.dim), dtype=spec.dtype) for k in n]
        self._pull_shards(tid, rows, aux=3)
        k = np.concatenate(keys) if keys else np.empty(0, dtype=np.int64)
        r = np.concatenate(rows) if rows else np.empty((0, spec.dim), dtype=spec.dtype)
        order = np.argsort(k, kind="stable")
        return k[order], r[order]

    def _pull_shards(self, tid: int, bufs: list, aux: int) -> None:
        for s, buf in enumerate(bufs):
            if buf.size or aux == 1:
                self.ep.expect(s, buf, tp.PULL_SHARD)
                self.ep.send(s, tp.make_header(tp.PULL_SHARD, tid, self.clock_value,
                                               len(buf), aux=aux, rng=s))
        self.ep.complete(tp.PULL_SHARD)

    def checkpoint(self, step: int, pushes=None) -> list:
        """Ask every server to write its shard for the checkpoint at ``step``.

        Each server writes once it has applied every step ``< step`` (a consistent cut:
        it cannot have applied more, as this worker has not clocked ``step`` yet) and, when
        ``pushes`` is given, once it has applied ``pushes[w, s]`` push messages from each
        worker ``w`` (the asynchronous cut: pushes are applied on arrival, so the server
        waits for exactly the ones sent before the cut). Point-to-point; worker 0 only.

        Parameters
        ----------
        step : int
        pushes : int64 ndarray (n_workers, n_servers) or None
            Push messages each worker has sent to each server (``pushes_sent``).

        Returns
        -------
        list of (nbytes, digest field hex) per server, in server order, as
        :func:`hpcps.checkpoint.write_shard` returned them on each server.
        """
        self._settle()
        self.send_staged()
        replies = [np.empty(40, dtype=np.uint8) for _ in range(self.n_servers)]
        for s in range(self.n_servers):
            self.ep.expect(s, replies[s], tp.CHECKPOINT)
            if pushes is None:
                self.ep.send(s, tp.make_header(tp.CHECKPOINT, 0, step, rng=s))
            else:
                col = np.ascontiguousarray(pushes[:, s], dtype=np.int64)
                self.ep.send(s, tp.make_header(tp.CHECKPOINT, 0, step, col.size, rng=s), col)
        self.ep.complete(tp.CHECKPOINT)
        return [(int(np.frombuffer(r[:8].tobytes(), dtype="<i8")[0]), r[8:].tobytes().hex())
                for r in replies]

    def stop(self) -> None:
        """Tell every server this worker is done (after its last pull); in a group
        (:attr:`group`) the servers it owns for the group (their workers)."""
        self._settle()
        self.send_staged()
        for s in (range(self.n_servers) if self.group is None else self.group.owned):
            self.ep.send(s, tp.make_header(tp.STOP, rng=s))
        self.ep.complete(tp.STOP)


def _private(a: np.ndarray, given) -> np.ndarray:
    """``a`` (the conversion of the caller's ``given`` to the dtype and layout sent), or a copy
    of it when it may be the caller's memory: ``given`` itself, a view of it, or a buffer
    shared with some other object (``np.asarray`` of a list or tuple always makes a new
    array). Local."""
    if isinstance(given, (list, tuple)):
        return a
    if isinstance(given, np.ndarray) and not np.may_share_memory(a, given):
        return a
    return a.copy()
