"""The parameter-server endpoints over MPI point-to-point buffer calls: a worker's
(:class:`WorkerEndpoint`, from :mod:`hpcps.comm.worker_endpoint`) and a server's
(:class:`ServerEndpoint`). The wire protocol
— ops, tags, the request header, the one-message rule, the traffic counts — is
:mod:`hpcps.comm.protocol`'s (its names are importable from here too).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcps.comm.buffers import POOL_MAX_FREE_BYTES, POOL_MIN_BYTES, BufferPool


from hpcps.comm.compiled import _FAST_REASON, _fast, load_fastpath  # noqa: F401
from hpcps.comm.protocol import (  # noqa: F401  (re-exported: the protocol's names)
    PULL, PUSH, CLOCK, PULL_SHARD, STOP, CHECKPOINT, GROW, PUSH_CLOCK, PULL_MANY,
    PUSH_CLOCK_PULL, REPLICATE, REPL_CLOCK, REPL_ACK, REPL_DONE, OP_NAMES, TAG_SNAP, TAG_REQ,
    TAG_KEYS, TAG_VALS, TAG_REPLY, TAG_RHDR, HEADER_LEN, HEADER_BYTES, INLINE_BYTES,
    REQUEST_BYTES, DEFER_MAX_BYTES, one_message, one_reply, one_request, H_OP, H_TABLE, H_CLOCK, H_NKEYS, H_NEX, H_SEQ, H_DIM, H_AUX,
    H_RANGE, KEY_FMT, buffer_format, make_header, PART_LEN, part_of, part_header, reply_tag,
    max_ranges, check_ranges, TrafficStats)

__all__ = [
    "PULL", "PUSH", "CLOCK", "PULL_SHARD", "STOP", "CHECKPOINT", "GROW", "PUSH_CLOCK",
    "PULL_MANY", "PUSH_CLOCK_PULL", "REPLICATE", "REPL_CLOCK", "REPL_ACK", "REPL_DONE",
    "OP_NAMES", "TAG_SNAP", "TAG_REQ", "TAG_KEYS", "TAG_VALS", "TAG_REPLY", "TAG_RHDR",
    "HEADER_LEN", "HEADER_BYTES", "INLINE_BYTES", "REQUEST_BYTES", "DEFER_MAX_BYTES",
    "one_message", "one_reply", "one_request", "H_OP",
    "H_TABLE", "H_CLOCK", "H_NKEYS", "H_NEX", "H_SEQ", "H_DIM", "H_AUX", "H_RANGE", "KEY_FMT",
    "buffer_format", "make_header", "PART_LEN", "part_of", "part_header", "reply_tag",
    "max_ranges", "check_ranges", "TrafficStats", "POOL_MAX_FREE_BYTES", "POOL_MIN_BYTES",
    "load_fastpath", "WorkerEndpoint", "ServerEndpoint", "WAIT_SPIN",
]

from hpcps.comm import core as _core
from hpcps.comm.core import isend_array, native_contiguous, pack_into, recv_array, waitall
from hpcps.comm.worker_endpoint import WAIT_SPIN, WorkerEndpoint  # noqa: F401  (re-exported)


class ServerEndpoint:
    """A server's side of the protocol: poll for requests, receive their parts, reply.

    :meth:`poll` never blocks, so the server loop keeps entering MPI (needed for progress of
    one-sided operations on MPIs without an asynchronous progress thread).
    """

    def __init__(self, ps: MPI.Intracomm, max_message_bytes: int):
        self.comm = ps
        self.max_bytes = int(max_message_bytes)
        self.stats = TrafficStats()
        self._status = MPI.Status()
        self._header = np.empty(HEADER_LEN, dtype=np.int64)
        #: a request of one message (one_request) lands here whole
        self._limit = min(REQUEST_BYTES, self.max_bytes)
        self._request = np.empty(-(-self._limit // 8), dtype=np.int64).view(np.uint8)
        self._request_header = self._request[:HEADER_BYTES].view(np.int64)
        self._inline = None       # the parts sent with the request just polled (bytes view)
        self._reply_buf = np.empty(INLINE_BYTES // 8, dtype=np.int64).view(np.uint8)
        #: the compiled request path (:mod:`hpcps.comm.fastpath`) when it is built; in
        #: continue mode only its parts that do not wait (whose waits must notice failed ranks)
        self.compiled = _fast is not None
        self._scratch = np.empty(0, dtype=np.int64)      # reused by recv_keys(scratch=True)
        self.pool = BufferPool()                         # recv_keys/recv_values(pooled=True)
        #: replies sent without waiting: (requests, rows copy, header copy)
        self._inflight: list = []
        self._step_counts = np.zeros(13, dtype=np.int64)   # take_steps' traffic counts

    def poll(self, pulls=None):
        """Return ``(source_rank, header_copy)`` of the next request, or ``None`` if none waits
        (after testing the replies still in flight).

        With ``pulls`` — ``(shards, shard type, visible clock, lag, range, busy)`` from the
        server loop — a ready small PULL is answered here, in the compiled call that
        received it (:func:`hpcps.comm.fastpath.poll_pull`: when the server's own
        :meth:`pull_inline` would have answered it; a pull made at clock ``c`` is ready when
        ``visible >= c``, or without the fresh flag ``visible >= c - lag``), and
        ``(source_rank, None)`` returned: nothing left to handle. Counted as
        :meth:`pull_inline` counts it; ``busy`` as ``serve_requests`` counts a handled
        request (None: not counted)."""
        if self._inflight:
            self.progress()
        if self.compiled and (pulls is None or not _core.WATCH):
            # Iprobe, and the receive of a request of one message, in one compiled call (also
            # in continue mode: MPI_Iprobe from any source reports a failed rank as the
            # Python path does; answering pulls here is not, its sends are not watched)
            if pulls is None:
                got = _fast.probe_recv(self.comm, TAG_REQ, self._request, self._limit)
            else:
                shards, shard_type, visible, lag, rng, busy = pulls
                got = _fast.poll_pull(self.comm, TAG_REQ, self._request, self._limit, shards,
                                      shard_type, visible, lag, TAG_REPLY + 2 * rng,
                                      self._reply_buf, busy)
            if got is None:
                return None
            if len(got) == 4:                       # a PULL answered
                src, nbytes, out, secs = got
                self.stats.add(PULL, messages=1, inn=nbytes, out=out,
                               keys=(nbytes - HEADER_BYTES) >> 3, seconds=secs)
                return src, None
            return self._received(*got)
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQ, status=self._status):
            return None
        src = self._status.Get_source()
        nbytes = self._status.Get_count(MPI.BYTE)
        if nbytes == HEADER_BYTES:
            recv_array(self.comm, self._header, src, TAG_REQ, self.max_bytes)
            h = self._header.copy()
            self._inline = None
        elif HEADER_BYTES < nbytes <= self._limit:                  # parts with it
            self.comm.Recv([self._request, nbytes, MPI.BYTE], source=src, tag=TAG_REQ)
            h = self._request[:HEADER_BYTES].view(np.int64).copy()
            self._inline = self._request[HEADER_BYTES:nbytes]
        else:
            raise RuntimeError(self._bad_size(nbytes, src))
        self.stats.add(int(h[H_OP]), messages=1, inn=h.nbytes, keys=int(h[H_NKEYS]))
        return src, h

    def _received(self, src: int, nbytes: int):
        """``(src, header copy)`` of the request of ``nbytes`` bytes the compiled poll left in
        the request buffer (its parts: :attr:`_inline`), counted. RuntimeError for a size
        that is neither a header nor a header with parts."""
        if not HEADER_BYTES <= nbytes <= self._limit:
            raise RuntimeError(self._bad_size(nbytes, src))
        h = self._request_header.copy()
        self._inline = self._request[HEADER_BYTES:nbytes] if nbytes > HEADER_BYTES else None
        self.stats.add(int(h[H_OP]), messages=1, inn=HEADER_BYTES, keys=int(h[H_NKEYS]))
        return src, h

    @property
    def steps_compiled(self) -> bool:
        """Whether :meth:`take_steps` may be used: the compiled path is built, outside
        continue mode."""
        return self.compiled and not _core.WATCH

    def take_steps(self, server, shards, shard_type, busy=None, max_n: int = 64):
        """The BSP steps that wait, taken in by one compiled call
        (:func:`hpcps.comm.fastpath.bsp_steps`: queued, clocked, their pulls held on
        ``server``; lone pushes queued; ready lone pulls answered on the reply tag of
        ``server.index``) and counted as :meth:`poll` and :meth:`step_parts` count them. Only for
        the BSP ``server`` outside continue mode (its caller checks the policy). Local.

        Returns
        -------
        None
            Nothing waited.
        (int, bool, tuple or None)
            ``(taken, completed, left)``: the fused steps taken (the lone pushes and pulls
            it took are not counted); whether the last of them
            completed the server's step (the caller applies it: every pull waits until
            then); ``left``, ``(source, header copy)`` of a request left to the general
            path (as :meth:`poll` returns it), or None.

        Raises
        ------
        RuntimeError
            For a request of a size that is neither a header nor a header with parts.
        """
        if self._inflight:
            self.progress()
        counts = self._step_counts
        counts[:] = 0
        taken, kind, src, nbytes = _fast.bsp_steps(self.comm, TAG_REQ, self._request,
                                                   self._limit, shards, shard_type, server,
                                                   max_n, counts, busy,
                                                   TAG_REPLY + 2 * server.index, self._reply_buf)
        m = 0
        if taken:
            (m, inn, keys, pull_inn, pull_keys, pm, pinn, pkeys,
             lm, linn, lout, lkeys, lns) = counts.tolist()
            if lm:
                self.stats.add(PULL, messages=lm, inn=linn, out=lout, keys=lkeys,
                               seconds=lns * 1e-9)
            if m:
                self.stats.add(PUSH_CLOCK_PULL, messages=m, inn=inn, keys=keys)
                self.stats.add(PULL, inn=pull_inn, keys=pull_keys)
            if pm:
                self.stats.add(PUSH, messages=pm, inn=pinn, keys=pkeys)
        if kind == 1:
            return m, False, self._received(src, nbytes)
        if not taken:
            return None
        return m, kind == 2, None

    def record_step(self, server, source: int, h: np.ndarray, pushes, pulls) -> bool:
        """Take in the fused step ``h`` from ``source`` whose parts :meth:`step_parts` gave,
        on the BSP ``server``, by the bookkeeping :meth:`take_steps` uses
        (:func:`hpcps.comm.fastpath.record_step`): False, nothing changed, when ``source``
        is not one of its workers or ``h``'s clock is not the one it expects. Local."""
        return _fast.record_step(server, source, h, pushes, pulls)

    def _bad_size(self, nbytes: int, src: int) -> str:
        return (f"request of {nbytes} bytes from rank {src}: neither a header "
                f"({HEADER_BYTES} B) nor a header with parts (at most "
                f"{self._limit} B): do all ranks use the "
                "same max_message_bytes?")

    def pull_inline(self, dest: int, n: int, num_keys: int, multiplier: int, lo: int, hi: int,
                    w: np.ndarray, header: np.ndarray, rng: int) -> bool:
        """Answer the PULL just polled from ``dest``, ready to be read, in one compiled call
        when its ``n`` keys came with it and its reply (rows of ``w``, then the shard clock
        ``header``) is one message (:func:`one_reply`), outside continue mode: keys to rows
        ``w[p(key) - lo]`` (the permutation ``num_keys``, ``multiplier`` of the range
        ``[lo, hi)``), the rows and header packed and sent to ``dest`` for key range ``rng``
        — at once (:func:`hpcps.comm.fastpath.pull_inline`) up to ``INLINE_BYTES``, else from
        a pooled buffer without waiting (:func:`hpcps.comm.fastpath.pull_isend`, as
        :meth:`reply` sends it). Returns whether it did; False leaves the request to
        :meth:`recv_keys` and :meth:`reply`. Counted as they would have counted it.

        Raises
        ------
        ValueError
            For a key outside the key space or ``[lo, hi)`` (naming it; nothing sent).
        """
        inl = self._inline
        if (not self.compiled or inl is None or inl.size != 8 * n or _core.WATCH
                or w.ndim != 2 or not w.flags.c_contiguous):
            return False
        nbytes = n * w.shape[1] * w.itemsize + header.nbytes
        if not one_reply(nbytes, self.max_bytes):
            return False
        t0 = time.perf_counter()
        self._inline = None
        if one_message(nbytes, self.max_bytes):
            nbytes = _fast.pull_inline(self.comm, dest, reply_tag(rng), self._request,
                                       HEADER_BYTES, n, num_keys, multiplier, lo, hi, w, header,
                                       self._reply_buf)
        else:
            buf = self.pool.take((nbytes,), np.uint8)
            try:
                nbytes, req = _fast.pull_isend(self.comm, dest, reply_tag(rng), self._request,
                                               HEADER_BYTES, n, num_keys, multiplier, lo, hi, w,
                                               header, buf)
            except BaseException:
                self.pool.give(buf)
                raise
            self._inflight.append(([req], buf, None))
        self.stats.add(PULL, inn=8 * n, out=nbytes, seconds=time.perf_counter() - t0)
        return True

    def step_parts(self, n_push: int, n_pull: int, shards, shard_type, examples: bool = False):
        """The parts of the ``PUSH_CLOCK_PULL`` just polled, taken apart in one compiled call
        (:func:`hpcps.comm.fastpath.step_parts`) when every part came with its header and is
        of the plain form: ``(pushes, pulls)`` (``pushes``: ``(table,
        local rows, values, version)``; ``pulls``: ``(shard, local rows)``), counted as
        :meth:`recv_keys` and :meth:`recv_push` would have counted them (no MPI: also in
        continue mode); with ``examples``
        also the pushes' examples (int64 ``(n_push,)``, each push description's). None
        leaves the request to them (the general path, which names any error). Local."""
        inl = self._inline
        if not self.compiled or inl is None:
            return None
        got = _fast.step_parts(inl, n_push, n_pull, shards, shard_type)
        if got is None:
            return None
        self._inline = None
        pushes, pulls, pull_keys = got
        self.stats.add(PUSH_CLOCK_PULL, inn=inl.size - 8 * pull_keys)
        self.stats.add(PULL, inn=8 * pull_keys, keys=pull_keys)
        if examples:      # the descriptions lead the parts (step_parts checked their size)
            metas = np.frombuffer(inl, dtype=np.int64, count=PART_LEN * n_push)
            return pushes, pulls, metas.reshape(n_push, PART_LEN)[:, 2].copy()
        return pushes, pulls

    def reply_rows(self, dest: int, w: np.ndarray, rows: np.ndarray, op: int,
                   header: np.ndarray, rng: int) -> bool:
        """Reply to a pull with ``w[rows]`` (int64 local rows) and the shard clock ``header``
        for key range ``rng``, as :meth:`reply` would send them, gathered into the reply and
        sent in one compiled call (:func:`hpcps.comm.fastpath.send_rows`), when the reply is
        one message (:func:`one_message`) outside continue mode. Returns whether it did
        (False: nothing sent; gather the rows and call :meth:`reply`). Point-to-point
        (``dest`` has posted the receive).

        Raises
        ------
        ValueError
            For a row outside ``w`` (nothing sent).
        """
        if (not self.compiled or _core.WATCH or w.ndim != 2 or not w.flags.c_contiguous
                or not w.dtype.isnative or rows.dtype != np.int64 or not rows.flags.c_contiguous
                or not one_message(rows.shape[0] * w.shape[1] * w.itemsize + header.nbytes,
                                   self.max_bytes)):
            return False
        t0 = time.perf_counter()
        nb = _fast.send_rows(self.comm, dest, reply_tag(rng), w, rows, header, self._reply_buf)
        self.stats.add(op, out=nb, seconds=time.perf_counter() - t0)
        return True

    def recv_keys(self, source: int, n: int, op: int, scratch: bool = False,
                  pooled: bool = False) -> np.ndarray:
        """Receive the int64 keys of the request just polled from ``source``.

        With ``scratch`` the keys land in a buffer this endpoint reuses (grown as needed), so
        a large request does not pay first-touch page faults on a new array; the result is
        then valid only until the next ``recv_keys(..., scratch=True)`` — the caller must not
        keep it (the server turns keys into local rows at once). With ``pooled`` they land in
        a buffer of :attr:`pool`, which the caller keeps until it gives it back.
        """
        if scratch:
            if self._scratch.size < n:
                self._scratch = np.empty(max(n, 2 * self._scratch.size), dtype=np.int64)
            keys = self._scratch[:n]
        elif pooled:
            keys = self.pool.take(n, np.int64)
        else:
            keys = np.empty(n, dtype=np.int64)
        if not self._take_inline(keys):
            recv_array(self.comm, keys, source, TAG_KEYS, self.max_bytes)
        self.stats.add(op, inn=keys.nbytes)
        return keys

    def _take_inline(self, out: np.ndarray) -> bool:
        """Fill ``out`` from the parts sent with the request just polled, if any are left."""
        inl = self._inline
        if inl is None or inl.size == 0:
            return False
        n = out.nbytes
        if n > inl.size:
            raise RuntimeError(f"a request's part of {n} bytes, but only {inl.size} bytes "
                               "were sent with its header")
        out.reshape(-1).view(np.uint8)[:] = inl[:n]
        self._inline = inl[n:]
        return True

    def recv_values(self, source: int, shape, dtype, op: int, pooled: bool = False) -> np.ndarray:
        """Receive the value rows of the PUSH just polled from ``source`` (into a buffer of
        :attr:`pool` with ``pooled``: give it back once the values are used)."""
        vals = self.pool.take(shape, dtype) if pooled else np.empty(shape, dtype=dtype)
        if not self._take_inline(vals):
            recv_array(self.comm, vals, source, TAG_VALS, self.max_bytes)
        self.stats.add(op, inn=vals.nbytes)
        return vals

    def recv_push(self, source: int, n: int, dim: int, dtype, op: int = PUSH):
        """Receive the keys (int64 ``(n,)``) and value rows (``(n, dim)`` of ``dtype``) of the
        PUSH just polled from ``source``, as :meth:`recv_keys` and :meth:`recv_values` with
        ``pooled`` do (give both back once used): when both came with the request, one copy
        of its bytes that the two arrays view (counted once)."""
        inl = self._inline
        dtype = np.dtype(dtype)
        kb = 8 * n
        if inl is not None and inl.size == kb + n * dim * dtype.itemsize and dtype.isnative:
            self._inline = None
            blob = inl.copy()
            self.stats.add(op, inn=blob.size)
            return blob[:kb].view(np.int64), blob[kb:].view(dtype).reshape(n, dim)
        keys = self.recv_keys(source, n, op, pooled=True)
        return keys, self.recv_values(source, (n, dim), dtype, op, pooled=True)

    def reply(self, dest: int, values: np.ndarray, op: int, header: np.ndarray | None = None,
              rng: int = 0) -> None:
        """Send reply rows for key range ``rng`` to ``dest`` (which has posted the receive with
        ``expect``), then, if given, the shard clock ``header`` (``expect_header``).

        The caller may change ``values`` and ``header`` once this returns. A reply with a
        ``header`` of one message (:func:`one_reply`) is sent at once (eager) up to
        ``INLINE_BYTES`` (:func:`one_message`), larger (and in continue mode every one) from
        a pooled copy and not waited for (:meth:`_send_deferred`); a PULL reply of two
        messages up to ``DEFER_MAX_BYTES`` of rows from copies, not waited for either (their
        sends complete while :meth:`poll` runs; :meth:`flush` waits for them; in continue
        mode, after a failed peer, :meth:`abandon` gives them up), so that the server does not
        wait for a worker that is not inside MPI yet (a rendezvous needs it); other replies
        are waited for (in continue mode by a wait that notices failed ranks). MPI keeps the
        messages of one tag to one rank in the order they were sent."""
        t0 = time.perf_counter()
        reqs: list = []
        tag = reply_tag(rng)
        if header is not None and (_core.WATCH or not one_message(values.nbytes + header.nbytes,
                                                                  self.max_bytes)) \
                and one_reply(values.nbytes + header.nbytes, self.max_bytes):
            # continue mode: every reply of one message so (a wait would have to notice failures)
            self._send_deferred(dest, tag, [values, header], op, t0)
            return
        if header is not None and one_message(values.nbytes + header.nbytes, self.max_bytes):
            if self.compiled and not _core.WATCH and values.dtype.isnative:
                try:          # packed and sent (eager MPI_Send) in one compiled call
                    nb = _fast.send_packed(self.comm, dest, tag, values, (header,),
                                           self._reply_buf)
                    self.stats.add(op, out=nb, seconds=time.perf_counter() - t0)
                    return
                except BufferError:                # rows not C-contiguous: packed below
                    pass
            values = native_contiguous(values)
            nv = values.nbytes
            buf = np.empty(nv + header.nbytes, dtype=np.uint8)
            buf[:nv] = values.reshape(-1).view(np.uint8)
            buf[nv:] = header.view(np.uint8)
            self.comm.Send([buf, buf.size, MPI.BYTE], dest=dest, tag=tag)   # receive posted
            self.stats.add(op, out=buf.nbytes, seconds=time.perf_counter() - t0)
            return
        nbytes = values.nbytes + (0 if header is None else header.nbytes)
        if op == PULL and header is not None and values.nbytes <= DEFER_MAX_BYTES:
            rows = self.pool.take(values.shape, values.dtype)
            np.copyto(rows, values)
            hdr = header.copy()
            isend_array(self.comm, rows, dest, tag, self.max_bytes, reqs)
            isend_array(self.comm, hdr, dest, tag + 1, self.max_bytes, reqs)
            self._inflight.append((reqs, rows, hdr))
            self.stats.add(op, out=nbytes, seconds=time.perf_counter() - t0)
            return
        keep = isend_array(self.comm, values, dest, tag, self.max_bytes, reqs)
        keep_h = None if header is None else isend_array(self.comm, header.copy(), dest, tag + 1,
                                                         self.max_bytes, reqs)
        waitall(reqs, keep, keep_h)
        del keep, keep_h
        self.stats.add(op, out=nbytes, seconds=time.perf_counter() - t0)

    def _send_deferred(self, dest: int, tag: int, flat: list, op: int, t0: float) -> None:
        """Send the arrays ``flat`` back to back as one message to ``dest`` on ``tag``, packed
        into a pooled buffer (by one compiled call when they are native C-contiguous data)
        and not waited for (:meth:`progress` gives the buffer back once sent; after a failed
        peer, :meth:`abandon`). Point-to-point."""
        nbytes = sum(a.nbytes for a in flat)
        buf = self.pool.take((nbytes,), np.uint8)
        reqs: list = []
        if self.compiled and all(a.dtype.isnative and a.flags.c_contiguous for a in flat):
            reqs.append(_fast.isend_packed(self.comm, dest, tag, flat[0], flat[1:], buf))
        else:
            pack_into(buf, flat)
            isend_array(self.comm, buf, dest, tag, self.max_bytes, reqs)
        self._inflight.append((reqs, buf, None))
        self.stats.add(op, out=nbytes, seconds=time.perf_counter() - t0)

    def reply_many(self, dest: int, parts, op: int, rng: int = 0) -> None:
        """Send the replies to the pulls of one ``PULL_MANY`` or ``PUSH_CLOCK_PULL`` for key
        range ``rng`` to ``dest``: ``parts``, ``(rows, shard clock header)`` pairs in the
        request's order. One message (each part's rows, then its header), packed into a
        pooled buffer and not waited for, when :func:`one_reply` (as the worker's
        :meth:`WorkerEndpoint.expect_replies` expects it); else each as :meth:`reply`. The
        caller may change the arrays once this returns. Point-to-point."""
        nbytes = sum(v.nbytes + h.nbytes for v, h in parts)
        if not one_reply(nbytes, self.max_bytes):
            for v, h in parts:
                self.reply(dest, v, op, h, rng)
            return
        if len(parts) == 1:               # one pull: as reply sends it (eager when it fits)
            self.reply(dest, parts[0][0], op, parts[0][1], rng)
            return
        self._send_deferred(dest, reply_tag(rng), [a for v, h in parts for a in (v, h)], op,
                            time.perf_counter())

    def progress(self) -> None:
        """Release the replies in flight (:meth:`reply`) whose sends have completed. Local."""
        still = []
        for reqs, rows, hdr in self._inflight:
            if MPI.Request.Testall(reqs):
                self.pool.give(rows)
            else:
                still.append((reqs, rows, hdr))
        self._inflight = still

    def abandon(self) -> None:
        """Give up the replies in flight after a peer failed (continue mode): their requests
        and buffers are kept alive, never reused (:func:`hpcps.comm.core.abandon`; the
        recovery cancels what it can). Local."""
        for reqs, rows, hdr in self._inflight:
            _core.abandon(reqs, rows, hdr)
        self._inflight = []

    def flush(self) -> None:
        """Wait for every reply in flight (before the server stops or replaces this endpoint).
        Point-to-point: the workers receive them."""
        inflight, self._inflight = self._inflight, []
        for reqs, rows, hdr in inflight:
            waitall(reqs, rows, hdr)
            self.pool.give(rows)
