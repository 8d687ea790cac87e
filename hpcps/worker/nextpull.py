"""The next step's pulls sent with a BSP or async step's clock (issue 20): :class:`NextPull`, the part
of :class:`hpcps.worker.client.PSClient` that makes a step one request per server."""

from __future__ import annotations

import numpy as np

from hpcps.comm import transport as tp


class NextPull:
    """``PSClient.pull_next`` and what it needs; mixed into
    :class:`~hpcps.worker.client.PSClient` (uses its endpoint, policy, windows, kept pushes,
    ``_pull_prepare`` and ``clock``).

    Attributes
    ----------
    next_pull : tuple or None
        The next step's pulls held for this step's clock: (requests as given, keys as
        int64, prepared pulls).
    prefetch : tuple or None
        Pulls sent with the last clock and not taken yet: (clock they are for, requests as
        given, keys as int64, prepared pulls).
    """

    @property
    def fusable(self) -> bool:
        """Whether :meth:`pull_next` may send the next step's pulls with the clock: p2p
        pulls under BSP (or SSP with staleness 0) or async, pushes not kept (continue mode)."""
        p = self.policy
        return (not self.windows and self.kept is None
                and (not p.aggregate or p.staleness == 0))

    def pull_next(self, requests: dict) -> bool:
        """Send the next step's pulls ``{table: keys}`` with this step's :meth:`clock` (issue
        20): each server then gets one ``PUSH_CLOCK_PULL`` request per step — the step's
        pushes, its CLOCK and the next step's pulls — and answers the pulls once the clock
        is applied. The next :meth:`pull_many` of the same tables and keys takes those
        replies instead of asking again.

        The rows are the same bit for bit as a separate pull's: under BSP a pull at clock
        ``c + 1`` is answered once every worker's step ``c`` is applied and before this
        worker's step ``c + 1`` can be (it has not clocked it), so at server clock exactly
        ``c + 1`` — whenever it is sent. Under async (Downpour fetching every step) a
        server answers them as soon as it has applied this step's pushes, as it would a
        pull sent right after the clock (one sender's messages arrive in order): what
        other workers pushed in between is in the rows either way. Hence only where
        :attr:`fusable` (not under SSP with staleness > 0, whose reads may be older when
        asked earlier; not with RMA pulls, which send no request; not in continue mode,
        whose kept pushes are resent after a failure and whose servers answer up to the
        clock their backups hold). Nothing else is held: a pull of other keys, another clock or ``fresh``
        (evaluation), a checkpoint, a growth, ``STOP`` or a new layout (:meth:`follow`)
        first waits for the replies (every worker clocks its step, so they come) and
        drops them.

        Checks the keys now (a bad key raises before anything is sent). Local.

        Returns
        -------
        bool
            Whether the pulls will go with the clock (False: not :attr:`fusable`, or no
            key: the next step pulls as usual).
        """
        self.next_pull = None
        if not self.fusable:
            return False
        todo = [self._pull_prepare(table, keys, None) for table, keys in requests.items()]
        if not any(t[2] is not None for t in todo):
            return False
        keys = {table: np.ascontiguousarray(k, dtype=np.int64).reshape(-1)
                for table, k in requests.items()}
        self.next_pull = (requests, keys, todo)
        return True

    def _take_prefetch(self, requests, fresh, outs):
        """The prepared pulls sent with the last clock when ``requests`` asks for exactly
        them (see :meth:`pull_next`), their replies received; else None, and any such
        replies received and dropped."""
        pf, self.prefetch = self.prefetch, None
        if pf is None:
            return None
        clock, given, keys, todo = pf
        if self.ep.pending:
            self.ep.complete(tp.PULL)        # the replies (and the clock's sends) are in
        if fresh or outs or clock != self.clock_value or len(requests) != len(keys):
            return None
        for table, k in requests.items():
            if table not in keys:
                return None
            if k is not given[table] and not np.array_equal(
                    np.asarray(k).reshape(-1), keys[table]):
                return None
        return todo

    def _settle(self) -> None:
        """Drop the pulls sent with the last clock and the ones held for the next (another
        request follows), after their replies are in. Point-to-point (waits)."""
        self.next_pull = None
        if self.prefetch is not None:
            self._take_prefetch({}, True, None)

    def _pulls_by_server(self, todo) -> list:
        """Prepared pulls (``_pull_prepare``'s tuples) as per-server lists of ``(table id,
        keys, rows buffer, header buffer)``, in table order."""
        by_server = [[] for _ in range(self.n_servers)]
        for _, tid, sorted_keys, _, bounds, buf, _, hdrs in todo:
            if sorted_keys is None:
                continue
            for s in range(self.n_servers):
                a, b = bounds[s], bounds[s + 1]
                if a < b:
                    by_server[s].append((tid, sorted_keys[a:b], buf[a:b], hdrs[s]))
        return by_server

    def _send_clock(self, ranges, staged: dict, pulls, n_examples: int, epoch: int) -> None:
        """:meth:`~hpcps.worker.client.PSClient.clock`'s requests, one per range of
        ``ranges``, through the endpoint's Python path (when its compiled
        :meth:`~hpcps.comm.transport.WorkerEndpoint.clock_step` does not take them): a
        ``PUSH_CLOCK_PULL`` with the range's held pushes ``staged[s]`` and pulls
        ``pulls[s]``, a ``PUSH_CLOCK`` (pushes, no pull) or a ``CLOCK``."""
        c = self.clock_value
        for s in ranges:
            parts = staged.get(s)
            if pulls is not None and pulls[s]:
                self._send_step(s, parts or [], pulls[s], n_examples, epoch)
                continue
            if not parts:
                self.ep.send(s, tp.make_header(tp.CLOCK, 0, c, 0, n_examples, aux=epoch, rng=s))
                continue
            desc = np.array([tp.part_of(h) for h, _, _ in parts], dtype=np.int64)
            self.ep.send(s, tp.make_header(tp.PUSH_CLOCK, len(parts), c,
                                           sum(int(h[tp.H_NKEYS]) for h, _, _ in parts),
                                           n_examples, self.seq, aux=epoch, rng=s), desc,
                         more=[(k, g, tp.PUSH) for _, k, g in parts])
            self.pushes_sent[s] += len(parts)

    def _send_step(self, s: int, parts: list, pulls: list, n_examples: int, epoch: int) -> None:
        """Start one ``PUSH_CLOCK_PULL`` to range ``s``: this step's held pushes ``parts``
        (maybe none), its CLOCK, and the next step's pulls ``pulls`` (see
        :meth:`pull_next`), whose replies' receives are posted first."""
        # replies come in the request's order (one message for several when they fit)
        self.ep.expect_replies(s, [(rows, hdr) for _, _, rows, hdr in pulls], tp.PULL)
        desc = np.array([tp.part_of(h) for h, _, _ in parts]
                        + [[tid, k.size, 0, self.specs[tid].dim, 0] for tid, k, _, _ in pulls],
                        dtype=np.int64).reshape(-1, tp.PART_LEN)
        self.ep.send(s, tp.make_header(tp.PUSH_CLOCK_PULL, len(parts), self.clock_value,
                                       sum(int(h[tp.H_NKEYS]) for h, _, _ in parts),
                                       n_examples, self.seq, dim=len(pulls), aux=epoch, rng=s),
                     desc, more=[(k, g, tp.PUSH) for _, k, g in parts]
                     + [(k, None, tp.PULL) for _, k, _, _ in pulls])
        self.ep.stats.add(tp.PULL, keys=sum(int(k.size) for _, k, _, _ in pulls))
        self.pushes_sent[s] += len(parts)
