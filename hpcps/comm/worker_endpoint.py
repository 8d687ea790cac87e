"""A worker's side of the parameter-server protocol (:class:`WorkerEndpoint`): requests sent
to servers, replies received; importable from :mod:`hpcps.comm.transport` too."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcps.comm import core as _core
from hpcps.comm.buffers import BufferPool
from hpcps.comm.compiled import _fast
from hpcps.comm.core import cores_dedicated, irecv_array, isend_array, pack_into, waitall
from hpcps.comm.protocol import (CLOCK, DEFER_MAX_BYTES, H_NKEYS, H_OP, HEADER_BYTES,
                                 INLINE_BYTES, KEY_FMT, PULL, PUSH, PUSH_CLOCK, PUSH_CLOCK_PULL,
                                 REQUEST_BYTES, TAG_KEYS, TAG_REPLY, TAG_REQ, TAG_VALS,
                                 TrafficStats, one_message, one_reply, one_request, reply_tag)

class WorkerEndpoint:
    """A worker's side of the protocol: send requests to servers, receive replies.

    Point-to-point only; no method is collective. Requests to several servers are started
    together (non-blocking) and completed by :meth:`complete`, so transfers to different
    servers overlap and no ordering between servers can deadlock. ``wait_spin`` (seconds,
    or None for ``MPI_Waitall``) is how :meth:`complete` waits; the default depends on
    whether the launcher gave each rank a core (:data:`WAIT_SPIN`).
    """

    def __init__(self, ps: MPI.Intracomm, server_ranks, max_message_bytes: int,
                 wait_spin: float | None = -1.0):
        self.comm = ps
        self.server_ranks = tuple(server_ranks)
        self.max_bytes = int(max_message_bytes)
        self.stats = TrafficStats()
        self._reqs: list = []
        self._keep: list = []
        self._unpack: list = []        # (stage, rows, header) of packed replies (expect_rows)
        #: the compiled path (:mod:`hpcps.comm.fastpath`) for requests and replies of one
        #: message, when it is built (in continue mode with waits that notice failed ranks)
        self.compiled = _fast is not None
        self._send_buf = np.empty(INLINE_BYTES // 8, dtype=np.int64).view(np.uint8)
        #: the reply of a pull done by :meth:`request` (one message, :func:`one_reply`)
        self._reply_limit = min(DEFER_MAX_BYTES, self.max_bytes)
        self._recv_buf = np.empty(-(-self._reply_limit // 8), dtype=np.int64).view(np.uint8)
        if wait_spin is not None and wait_spin < 0:      # default: as the server loop does
            wait_spin = None if cores_dedicated() else WAIT_SPIN
        #: None: :meth:`complete` waits in ``MPI_Waitall``; else it polls for this many
        #: seconds, then sleeps between polls (:func:`hpcps.comm.core.waitall`)
        self.wait_spin = wait_spin
        self._limit = min(INLINE_BYTES, self.max_bytes)      # one message (one_message)
        #: a pull's request of more than ``_limit`` bytes, sent by :meth:`request` (allocated
        #: at its first use): up to ``REQUEST_BYTES`` (:func:`one_request`)
        self._big_limit = min(REQUEST_BYTES, self.max_bytes)
        self._big_send: np.ndarray | None = None
        #: buffers of requests packed here (_send_one), reused once complete() sent them
        self._packs = BufferPool()
        self._packed: list = []
        #: per op code, messages, bytes out, bytes in and keys of a compiled clock_step
        self._step_counts = np.zeros((16, 4), dtype=np.int64)

    def send(self, server: int, header: np.ndarray, keys=None, values=None,
             more=()) -> None:
        """Start sending one request (header, then keys, then values, then the parts of
        ``more``: ``(keys, values, op)`` triples, each as :meth:`send_parts` would send and
        count them) to server index ``server``: one message when they all fit in
        ``REQUEST_BYTES`` (:func:`one_request`; the server's receives of the parts take them
        from it in this order), else the header with ``keys`` and ``values`` when those fit,
        and the rest as messages of their own."""
        op = int(header[H_OP])
        if keys is not None or values is not None:
            arrays = (keys, values) if not more else \
                (keys, values) + tuple(a for k, v, _ in more for a in (k, v))
            nbytes = header.nbytes + sum(a.nbytes for a in arrays if a is not None)
            if one_request(nbytes, self.max_bytes):
                sizes = [(0 if k is None else k.nbytes) + (0 if v is None else v.nbytes)
                         for k, v, _ in more]
                self._send_one(server, op, header, arrays, nbytes, nbytes - sum(sizes))
                for (_, _, op_part), n in zip(more, sizes):   # counted as send_parts counts them
                    self.stats.add(op_part, out=n)
                return
            if more:                 # the header with its first parts if they fit, then the rest
                self.send(server, header, keys, values)
                for k, v, op_part in more:
                    self.send_parts(server, k, v, op_part)
                return
        self._keep.append(isend_array(self.comm, header, self.server_ranks[server], TAG_REQ,
                                      self.max_bytes, self._reqs))
        self.stats.add(op, messages=1, out=header.nbytes, keys=int(header[H_NKEYS]))
        self.send_parts(server, keys, values, op)
        for k, v, op_part in more:
            self.send_parts(server, k, v, op_part)

    def _send_one(self, server: int, op: int, header, arrays, nbytes: int, out: int) -> None:
        """Send a request of one message (``nbytes``: ``header`` and the ``arrays``, None
        skipped): packed and sent by one blocking eager ``MPI_Send`` in a compiled call
        (:func:`hpcps.comm.fastpath.send_packed`) when it fits in ``INLINE_BYTES``, else
        packed into a pooled buffer and sent without waiting (by one compiled call,
        :func:`hpcps.comm.fastpath.isend_packed`, for C-contiguous native data; in continue
        mode every request this way). ``out``: the bytes counted for ``op`` (the caller counts
        the rest under the parts' ops)."""
        dest = self.server_ranks[server]
        if self.compiled and not _core.WATCH and one_message(nbytes, self.max_bytes) and all(
                a is None or a.dtype.isnative for a in arrays):
            try:
                _fast.send_packed(self.comm, dest, TAG_REQ, header, arrays, self._send_buf)
                self.stats.add(op, messages=1, out=out, keys=int(header[H_NKEYS]))
                return
            except BufferError:        # not C-contiguous: packed below
                pass
        buf = self._packs.take((nbytes,), np.uint8)     # back to the pool once sent
        self._packed.append(buf)
        if self.compiled and all(a is None or a.dtype.isnative for a in arrays):
            try:            # packed and started (MPI_Isend) in one compiled call
                self._reqs.append(_fast.isend_packed(self.comm, dest, TAG_REQ, header, arrays,
                                                     buf))
                self._keep.append(buf)          # alive while MPI may read it (a failed wait)
                self.stats.add(op, messages=1, out=out, keys=int(header[H_NKEYS]))
                return
            except BufferError:        # not C-contiguous: packed below
                pass
        pack_into(buf, (header,) + tuple(arrays))
        self._keep.append(isend_array(self.comm, buf, dest, TAG_REQ, self.max_bytes, self._reqs))
        self.stats.add(op, messages=1, out=out, keys=int(header[H_NKEYS]))

    def request(self, server: int, op: int, table: int, clock: int, n_examples: int, seq: int,
                dim: int, aux: int, keys: np.ndarray, num_keys: int, fmt: bytes, width: int,
                values: np.ndarray | None = None, rows: np.ndarray | None = None,
                header: np.ndarray | None = None) -> bool:
        """A ``PUSH`` (``values``) or a ``PULL`` (``rows``, ``header``) of one message to key
        range ``server``, done in one compiled call (:func:`hpcps.comm.fastpath.request`,
        the GIL released around MPI): the header ``[op, table, clock, keys.size,
        n_examples, seq, dim, aux, server]``, the int64 ``keys`` and the ``values`` packed
        and sent; for a PULL the one-message reply (:func:`one_reply`) received (waited for
        as :meth:`complete` waits) into ``rows`` and the shard clock ``header``. Nothing else
        may be pending (:attr:`pending`). Counted as :meth:`send`, :meth:`expect_rows` and
        :meth:`complete` count the same request.

        In continue mode the waits notice a failed rank (:func:`hpcps.comm.core.waitall`);
        MPI may then still use the buffers, which are abandoned (new ones made).

        Returns whether it did. False — nothing sent — without the compiled path, with
        requests pending, when the request is more than one eager
        message (:func:`one_message`; a PULL's: more than one message, :func:`one_request`)
        or the reply more than one message (:func:`one_reply`), for a key outside
        ``[0, num_keys)`` (``num_keys`` < 0: any key), for ``keys`` not C-contiguous int64,
        ``values`` not C-contiguous data of format ``fmt`` (the table dtype's buffer format)
        with ``keys.size * width`` items (``width``: the table's dim), or ``rows`` not a
        writeable C-contiguous ``(keys.size, width)`` array of format ``fmt``: the caller then takes the general path (which
        converts, or raises naming the problem)."""
        if not self.compiled or self._reqs:
            return False
        t0 = time.perf_counter()
        sendbuf, limit = self._send_buf, self._limit
        if rows is not None and HEADER_BYTES + keys.nbytes > limit:
            # a pull's request of one message above the eager limit: the blocking send
            # waits for the server to take it in, as the worker waits for the reply anyway
            if HEADER_BYTES + keys.nbytes > self._big_limit:
                return False
            if self._big_send is None:
                self._big_send = np.empty(-(-self._big_limit // 8), np.int64).view(np.uint8)
            sendbuf, limit = self._big_send, self._big_limit
        watch = _core.WATCH[0] if _core.WATCH else None
        try:
            nb = _fast.request(self.comm, self.server_ranks[server], TAG_REQ, op, table, clock,
                               n_examples, seq, dim, aux, server, keys, KEY_FMT, num_keys,
                               values, rows, fmt, width, limit, sendbuf, self._recv_buf, header,
                               TAG_REPLY + 2 * server,       # reply_tag(server)
                               -1.0 if self.wait_spin is None else self.wait_spin,
                               _core.POLL_SLEEP_MIN, _core.POLL_SLEEP_MAX, self._reply_limit,
                               watch, _core.WATCH_TAG)
        except MPI.Exception:
            if watch is not None:      # a failed peer: MPI may still use both buffers
                self._abandon_buffers(sendbuf)
            raise
        if nb < 0:
            return False
        self.stats.add(op, messages=1, out=nb,
                       inn=0 if rows is None else rows.nbytes + header.nbytes,
                       keys=keys.size, seconds=time.perf_counter() - t0)
        return True

    def clock_step(self, todo, clock: int, n_examples: int, seq: int, epoch: int, staged: dict,
                   pulls, pushes_sent: np.ndarray) -> bool:
        """Clock each key range of ``todo``, with the step's held pushes ``staged`` (range ->
        ``[(PUSH header, keys, values)]``) and the next step's ``pulls`` (per range
        ``[(table, keys, rows, header)]``, or None), in one compiled call
        (:func:`hpcps.comm.fastpath.send_step`: one message per range, sent without
        waiting; the replies' receives posted first and completed by :meth:`complete`).
        Counted as the Python path counts them; ``pushes_sent`` (per range) increased.

        Returns whether it did. False — nothing sent — without the compiled path, in
        continue mode (its waits are watched), or when a range's request is more than one
        message (:func:`one_request`), its reply more than one (:func:`one_reply`) or an
        array is not C-contiguous: the caller then sends them as before."""
        if not self.compiled or _core.WATCH:
            return False
        counts = self._step_counts
        got = _fast.send_step(self.comm, TAG_REQ, TAG_REPLY, self.server_ranks, todo, clock,
                              n_examples, seq, epoch, staged, pulls, self._packs.take,
                              min(REQUEST_BYTES, self.max_bytes), self._reply_limit,
                              pushes_sent, counts, CLOCK, PUSH_CLOCK, PUSH_CLOCK_PULL, PUSH,
                              PULL)
        if got is None:
            return False
        reqs, sendbuf, recvbuf, unpack = got
        self._reqs.extend(reqs)
        self._packed.append(sendbuf)          # back to the pool once sent
        self._keep.append(sendbuf)
        if recvbuf is not None:
            self._keep.append(recvbuf)
        self._unpack.extend(unpack)
        rows = counts.tolist()
        for op in _STEP_OPS:
            m, out, inn, keys = rows[op]
            if m or out or inn or keys:
                self.stats.add(op, messages=m, out=out, inn=inn, keys=keys)
        counts.fill(0)
        return True

    def _abandon_buffers(self, sendbuf) -> None:
        """After a failed watched :meth:`request`: keep its buffers alive for ever
        (:func:`hpcps.comm.core.abandon`) and use new ones. Local."""
        _core.abandon([], sendbuf, self._recv_buf)
        self._recv_buf = np.empty_like(self._recv_buf)
        if sendbuf is self._send_buf:
            self._send_buf = np.empty_like(sendbuf)
        else:
            self._big_send = None

    def send_parts(self, server: int, keys=None, values=None, op: int = PUSH) -> None:
        """Start sending ``keys`` (tag ``TAG_KEYS``) and ``values`` (tag ``TAG_VALS``) to
        server index ``server``: the parts of the request whose header was sent last (a
        ``PUSH_CLOCK`` sends one pair per push after its header)."""
        dest = self.server_ranks[server]
        nbytes = 0
        for a, tag in ((keys, TAG_KEYS), (values, TAG_VALS)):
            if a is not None:
                self._keep.append(isend_array(self.comm, a, dest, tag, self.max_bytes, self._reqs))
                nbytes += a.nbytes
        self.stats.add(op, out=nbytes)

    def expect(self, server: int, out: np.ndarray, op: int = PULL) -> None:
        """Post the receive of a reply for key range ``server`` into ``out``."""
        irecv_array(self.comm, out, self.server_ranks[server], reply_tag(server), self.max_bytes,
                    self._reqs)
        self._keep.append(out)
        self.stats.add(op, inn=out.nbytes)

    def expect_header(self, server: int, out: np.ndarray, op: int = PULL) -> None:
        """Post the receive of the shard clock header (int64) that follows a PULL reply."""
        irecv_array(self.comm, out, self.server_ranks[server], reply_tag(server) + 1,
                    self.max_bytes, self._reqs)
        self._keep.append(out)
        self.stats.add(op, inn=out.nbytes)

    def expect_rows(self, server: int, rows: np.ndarray, header: np.ndarray,
                    op: int = PULL) -> None:
        """Post the receives of a PULL reply for key range ``server``: the rows into ``rows``
        and the shard clock header into ``header`` (C-contiguous; one packed message when
        :func:`one_reply`, unpacked by :meth:`complete`)."""
        if not one_reply(rows.nbytes + header.nbytes, self.max_bytes):
            self.expect(server, rows, op)
            self.expect_header(server, header, op)
            return
        stage = np.empty(rows.nbytes + header.nbytes, dtype=np.uint8)
        self._post_stage(server, stage)
        self._unpack.append((stage, rows, header))
        self.stats.add(op, inn=stage.nbytes)

    def expect_replies(self, server: int, parts, op: int = PULL) -> None:
        """Post the receives of the replies to the pulls of a ``PULL_MANY`` or a
        ``PUSH_CLOCK_PULL`` for key range ``server``: ``parts``, ``(rows, header)`` pairs
        (C-contiguous) in the request's order. One message for all of them when
        :func:`one_reply` (unpacked by :meth:`complete`), else each as :meth:`expect_rows`."""
        nbytes = sum(rows.nbytes + header.nbytes for rows, header in parts)
        if not one_reply(nbytes, self.max_bytes):
            for rows, header in parts:
                self.expect_rows(server, rows, header, op)
            return
        stage = np.empty(nbytes, dtype=np.uint8)
        self._post_stage(server, stage)
        pos = 0
        for rows, header in parts:
            n = rows.nbytes + header.nbytes
            self._unpack.append((stage[pos:pos + n], rows, header))
            pos += n
        self.stats.add(op, inn=nbytes)

    def _post_stage(self, server: int, stage: np.ndarray) -> None:
        """Post the receive of one reply message for key range ``server`` into ``stage``
        (kept alive until :meth:`complete`)."""
        if self.compiled:
            self._reqs.append(_fast.irecv_bytes(self.comm, self.server_ranks[server],
                                                reply_tag(server), stage))
        else:
            irecv_array(self.comm, stage, self.server_ranks[server], reply_tag(server),
                        self.max_bytes, self._reqs)
        self._keep.append(stage)

    @property
    def pending(self) -> int:
        """Requests started and not waited for yet (a step's deferred ``PUSH_CLOCK``)."""
        return len(self._reqs)

    def complete(self, op: int) -> None:
        """Wait for every started send and receive; time it under ``op``."""
        t0 = time.perf_counter()
        try:
            waitall(self._reqs, *self._keep, spin=self.wait_spin)  # buffers kept if a peer failed
            self._packs.give(*self._packed)       # sent: reusable (not after a failed wait)
        finally:
            self._keep.clear()
            self._packed.clear()
            unpack, self._unpack = self._unpack, []
        for stage, rows, header in unpack:
            if self.compiled and rows.flags.c_contiguous:
                _fast.unpack(stage, rows, header)
                continue
            n = rows.nbytes
            rows.reshape(-1).view(np.uint8)[:] = stage[:n]
            header.view(np.uint8)[:] = stage[n:]
        self.stats.add(op, seconds=time.perf_counter() - t0)


#: The ops a compiled :meth:`WorkerEndpoint.clock_step` counts
_STEP_OPS = (CLOCK, PUSH_CLOCK, PUSH_CLOCK_PULL, PUSH, PULL)

#: Seconds a worker polls for its replies before it sleeps between polls, when its node's
#: cores are oversubscribed (or the launcher did not say); with a core per rank it waits in
#: ``MPI_Waitall``. Like the server's ``IDLE_SPIN``: a busy-polling worker takes CPU from the
#: server (and the other workers) that must produce the reply.
WAIT_SPIN = 5e-5
