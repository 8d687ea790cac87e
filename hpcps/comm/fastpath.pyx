"""The server's hot request path in C (issue 20): MPI calls made from here without the GIL
and without mpi4py's Python layer, for the cases :class:`hpcps.comm.transport.ServerEndpoint`
hands over (outside continue mode; everything else keeps the Python path).

* :func:`probe_recv`: ``MPI_Iprobe`` for the next request, ``MPI_Get_count`` and its
  ``MPI_Recv`` in one call (the poll).
* :func:`pull_inline`: a ready ``PULL`` whose keys came with the request and whose reply is
  one message — keys to local rows, the rows gathered into the reply buffer with the shard's
  clock header after them, and the blocking ``MPI_Send`` — in one call; :func:`pull_isend`
  the same for a reply of one message above the eager limit, started with ``MPI_Isend``.
* :func:`step_parts`: a BSP worker's fused step (``PUSH_CLOCK_PULL``) of one message taken
  apart — each push's keys turned into local rows and its values checked, each pull's keys
  turned into local rows — in one call.
* :func:`bsp_steps`: the BSP steps that wait taken in — each fused step queued, clocked and
  its pulls held, each lone push queued, each ready lone pull answered — until one completes
  the step, in one call for many requests;
  :func:`record_step` takes in one such step taken apart by :func:`step_parts` with the same
  bookkeeping (the server's one copy of it).
* :func:`send_rows`: a pull's reply of one message (rows gathered, shard clock header after
  them) built and sent in one call.

and the worker's side of small requests (:class:`hpcps.comm.transport.WorkerEndpoint`):

* :func:`send_packed`: a request of one message packed and sent (``MPI_Send``) in one call;
* :func:`irecv_bytes`: the receive of a packed reply posted (an ``MPI.Request``);
* :func:`unpack`: the packed reply copied into the rows and the header;
* :func:`send_step`: a step's clock to every key range — with its held pushes and the next
  step's pulls — packed and started in one call, the replies' receives posted first.

MPI errors raise :class:`mpi4py.MPI.Exception` with the error code, as mpi4py's own calls do
(:func:`hpcps.comm.ft.is_peer_failure` reads its class).
"""

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_GetBuffer)
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from mpi4py cimport MPI
from mpi4py.libmpi cimport (MPI_ANY_SOURCE, MPI_BYTE, MPI_Comm, MPI_Get_count, MPI_Iprobe, MPI_Irecv,
                            MPI_Isend,
                            MPI_Recv, MPI_Request, MPI_REQUEST_NULL, MPI_Send, MPI_Status,
                            MPI_COMM_NULL, MPI_Cancel, MPI_Request_free,
                            MPI_STATUS_IGNORE, MPI_SUCCESS, MPI_Test, MPI_Wait)
from posix.time cimport CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, clock_gettime, nanosleep, time_t, timespec

from hpcps.kernels.keys cimport finite_ptr, gather_local_ptr, local_rows_ptr, take_rows_ptr

cdef extern from *:
    """
    #if defined(OPEN_MPI)
    #define HPCPS_MPI_VENDOR "Open MPI"
    #elif defined(MPICH_VERSION)
    #define HPCPS_MPI_VENDOR "MPICH"
    #else
    #define HPCPS_MPI_VENDOR "unknown"
    #endif
    """
    const char *HPCPS_MPI_VENDOR

import numpy as np
cimport numpy as cnp
from mpi4py.MPI import Exception as MPIException

from hpcps.kernels.keys import _raise_row

#: The MPI whose ``mpi.h`` this module was compiled against ("Open MPI", "MPICH" or
#: "unknown"); :mod:`hpcps.comm.transport` uses the module only under the same MPI.
BUILT_FOR = HPCPS_MPI_VENDOR.decode()

cnp.import_array()

cdef inline int _probe_recv(MPI_Comm comm, int tag, void* buf, Py_ssize_t limit, int* flag,
                            int* src, int* count) noexcept nogil:
    """``MPI_Iprobe`` of ``tag`` from any source; if a message waits (``flag``), its source and
    byte count, and its receive into ``buf`` when it fits in ``limit`` bytes. Returns the MPI
    error code."""
    cdef MPI_Status st
    cdef int ierr = MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, flag, &st)
    if ierr == MPI_SUCCESS and flag[0]:
        src[0] = st.MPI_SOURCE
        ierr = MPI_Get_count(&st, MPI_BYTE, count)
        if ierr == MPI_SUCCESS and count[0] <= limit:
            ierr = MPI_Recv(buf, count[0], MPI_BYTE, src[0], tag, comm, MPI_STATUS_IGNORE)
    return ierr


def probe_recv(MPI.Comm comm, int tag, buf, Py_ssize_t limit):
    """The next message of ``tag`` from any source on ``comm``: ``None`` if none waits, else
    ``(source, nbytes)``; received into ``buf`` (writeable, contiguous, at least ``limit``
    bytes) when ``nbytes <= limit`` (a larger one is left for the caller, which refuses it).
    One call, the GIL released around MPI. Point-to-point."""
    cdef Py_buffer b
    cdef int flag = 0, ierr, count = 0, src = -1
    PyObject_GetBuffer(buf, &b, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if b.len < limit:
            raise ValueError(f"probe_recv: buffer of {b.len} bytes, limit {limit}")
        with nogil:
            ierr = _probe_recv(comm.ob_mpi, tag, b.buf, limit, &flag, &src, &count)
    finally:
        PyBuffer_Release(&b)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    if not flag:
        return None
    return src, count


cdef Py_ssize_t _gather(const int64_t* keys, Py_ssize_t n, int64_t num_keys,
                        int64_t multiplier, int64_t lo, int64_t hi, const char* w,
                        Py_ssize_t wlen, Py_ssize_t rowb, char* out, Py_ssize_t ahead,
                        int* outside) except -2:
    """Rows of ``n`` keys into ``out``: -1, or the index of the first key outside the key
    space (``outside`` = 1) or ``[lo, hi)`` (``outside`` = 0); ValueError for rows ``w``
    (``wlen`` bytes) that do not hold the range."""
    cdef Py_ssize_t bad = -1
    cdef uint64_t un = <uint64_t>num_keys, ua = <uint64_t>multiplier if num_keys > 1 else 1
    if n == 0 or rowb == 0:
        return -1
    if wlen < (hi - lo) * rowb or num_keys <= 0:
        raise ValueError(f"gather: rows of {wlen} bytes do not hold the range [{lo}, {hi}) "
                         f"of {rowb}-byte rows")
    if hi <= lo:                      # an empty shard: every key is someone else's
        outside[0] = <uint64_t>keys[0] >= un
        return 0
    with nogil:
        bad = gather_local_ptr(keys, n, un, ua, <uint64_t>lo, <uint64_t>hi, w, rowb, out,
                               outside, ahead)
    return bad


cdef inline Py_ssize_t _row_bytes(w) except -1:
    return (w.shape[1] if w.ndim == 2 else 1) * w.itemsize


cdef Py_ssize_t _pull_reply(int dest, int tag, request, Py_ssize_t offset, Py_ssize_t n,
                            int64_t num_keys, int64_t multiplier, int64_t lo, int64_t hi, w,
                            header, sendbuf, MPI_Comm comm, MPI_Request* req) except -1:
    """:func:`pull_inline`'s work: the reply built in ``sendbuf`` and sent, with a blocking
    ``MPI_Send`` (``req`` NULL) or started with ``MPI_Isend`` into ``req``. The bytes sent."""
    cdef Py_buffer rq, wb, hb, sb
    cdef Py_ssize_t nv, total = 0, bad = -1
    cdef int ierr = MPI_SUCCESS, outside = 0
    cdef Py_ssize_t rowb = _row_bytes(w)
    PyObject_GetBuffer(request, &rq, PyBUF_ANY_CONTIGUOUS)
    PyObject_GetBuffer(w, &wb, PyBUF_C_CONTIGUOUS)
    PyObject_GetBuffer(header, &hb, PyBUF_ANY_CONTIGUOUS)
    PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        nv = n * rowb
        total = nv + hb.len
        if offset < 0 or offset + 8 * n > rq.len or total > sb.len:
            raise ValueError(f"pull_inline: {n} keys from byte {offset} of a {rq.len}-byte "
                             f"request, a {total}-byte reply in a {sb.len}-byte buffer")
        bad = _gather(<const int64_t*>(<char*>rq.buf + offset), n, num_keys, multiplier, lo, hi,
                      <const char*>wb.buf, wb.len, rowb, <char*>sb.buf, 0, &outside)
        if bad < 0:
            memcpy(<char*>sb.buf + nv, hb.buf, hb.len)
            if req == NULL:
                with nogil:
                    ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm)
            else:
                ierr = MPI_Isend(sb.buf, <int>total, MPI_BYTE, dest, tag, comm, req)
    finally:
        PyBuffer_Release(&sb)
        PyBuffer_Release(&hb)
        PyBuffer_Release(&wb)
        PyBuffer_Release(&rq)
    if bad >= 0:
        keys = np.frombuffer(request, dtype=np.int64, count=n, offset=offset)
        _raise_row(keys, bad, outside, num_keys, lo, hi)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return total


def pull_inline(MPI.Comm comm, int dest, int tag, request, Py_ssize_t offset, Py_ssize_t n,
                int64_t num_keys, int64_t multiplier, int64_t lo, int64_t hi, w, header,
                sendbuf):
    """Answer a ready PULL of ``n`` keys that came in ``request`` (bytes, int64 keys from
    ``offset``) with one message to ``dest`` on ``tag``: the rows ``w[p(key) - lo]`` (``w``:
    the shard's rows, C-contiguous, any dtype) followed by ``header`` (the shard's int64
    clock header), built in ``sendbuf`` and sent with a blocking ``MPI_Send`` (the worker
    has posted its receive; the caller sends this way only replies of one eager message).
    Returns the bytes sent.

    Raises
    ------
    ValueError
        For a key outside the key space or the range ``[lo, hi)`` (nothing sent; the
        message of :func:`hpcps.kernels.keys.local_rows_into`), or buffers too small.
    mpi4py.MPI.Exception
        If the send fails.
    """
    return _pull_reply(dest, tag, request, offset, n, num_keys, multiplier, lo, hi, w, header,
                       sendbuf, comm.ob_mpi, NULL)


def pull_isend(MPI.Comm comm, int dest, int tag, request, Py_ssize_t offset, Py_ssize_t n,
               int64_t num_keys, int64_t multiplier, int64_t lo, int64_t hi, w, header,
               sendbuf):
    """As :func:`pull_inline`, but the reply (one message larger than the eager limit,
    :func:`hpcps.comm.protocol.one_reply`) started with ``MPI_Isend``, so that the server
    does not wait for the worker's side of the rendezvous: ``(bytes, request)`` — the
    :class:`mpi4py.MPI.Request`; the caller keeps ``sendbuf`` alive and unchanged until it
    completes. Errors as :func:`pull_inline` (nothing sent). Point-to-point."""
    cdef MPI.Request req = MPI.Request.__new__(MPI.Request)
    total = _pull_reply(dest, tag, request, offset, n, num_keys, multiplier, lo, hi, w, header,
                        sendbuf, comm.ob_mpi, &req.ob_mpi)
    return total, req


cdef Py_ssize_t _pack(header, parts, Py_buffer* sb) except -1:
    """Copy ``header`` and each array of ``parts`` (``None`` skipped) back to back into
    ``sb``; the bytes written. BufferError for a part that is not C-contiguous, ValueError
    when they do not fit (nothing sent by the callers)."""
    cdef Py_buffer hb, pb
    cdef Py_ssize_t pos
    PyObject_GetBuffer(header, &hb, PyBUF_C_CONTIGUOUS)
    try:
        if hb.len > sb.len:
            raise ValueError(f"send_packed: a {hb.len}-byte header in a {sb.len}-byte "
                             "buffer")
        memcpy(sb.buf, hb.buf, hb.len)
        pos = hb.len
    finally:
        PyBuffer_Release(&hb)
    for a in parts:
        if a is None:
            continue
        PyObject_GetBuffer(a, &pb, PyBUF_C_CONTIGUOUS)
        try:
            if pos + pb.len > sb.len:
                raise ValueError(f"send_packed: more than {sb.len} bytes")
            memcpy(<char*>sb.buf + pos, pb.buf, pb.len)
            pos += pb.len
        finally:
            PyBuffer_Release(&pb)
    return pos


def send_packed(MPI.Comm comm, int dest, int tag, header, parts, sendbuf):
    """Send ``header``, then each array of ``parts`` (a sequence; each C-contiguous, native
    byte order; ``None`` entries skipped), back to back as one message of bytes to ``dest``
    on ``tag`` with a blocking ``MPI_Send``, built in ``sendbuf``. For a worker's request of
    one eager message (:func:`hpcps.comm.transport.one_message`): the send returns once the
    message is on its way. Returns the bytes sent. Point-to-point.

    Raises
    ------
    BufferError
        For a part that is not C-contiguous (nothing sent).
    ValueError
        When the message does not fit in ``sendbuf`` (nothing sent).
    """
    cdef Py_buffer sb
    cdef Py_ssize_t total
    cdef int ierr = MPI_SUCCESS
    PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        total = _pack(header, parts, &sb)
        with nogil:
            ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi)
    finally:
        PyBuffer_Release(&sb)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return total


def isend_packed(MPI.Comm comm, int dest, int tag, first, parts, sendbuf):
    """As :func:`send_packed` (``first`` in the place of ``header``), but started with
    ``MPI_Isend``: the :class:`mpi4py.MPI.Request` (the caller keeps ``sendbuf`` alive and
    unchanged until it completes). For a server's replies to several pulls of one request
    in one message (:func:`hpcps.comm.protocol.one_reply`), sent without waiting for the
    worker. The message is ``sendbuf``'s first bytes. Errors as :func:`send_packed`
    (nothing sent). Point-to-point."""
    cdef Py_buffer sb
    cdef Py_ssize_t total
    cdef int ierr = MPI_SUCCESS
    cdef MPI.Request req = MPI.Request.__new__(MPI.Request)
    PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        total = _pack(first, parts, &sb)
        ierr = MPI_Isend(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi, &req.ob_mpi)
    finally:
        PyBuffer_Release(&sb)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return req


def irecv_bytes(MPI.Comm comm, int source, int tag, buf):
    """Post the receive of one message of bytes from ``source`` on ``tag`` into ``buf``
    (contiguous, writeable; the caller keeps it alive until the request completes): the
    :class:`mpi4py.MPI.Request`. Point-to-point."""
    cdef Py_buffer b
    cdef int ierr
    cdef MPI.Request req = MPI.Request.__new__(MPI.Request)
    PyObject_GetBuffer(buf, &b, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        ierr = MPI_Irecv(b.buf, <int>b.len, MPI_BYTE, source, tag, comm.ob_mpi, &req.ob_mpi)
    finally:
        PyBuffer_Release(&b)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return req


def unpack(stage, rows, header):
    """Copy a packed PULL reply ``stage`` (bytes: the rows, then the shard clock header)
    into ``rows`` and ``header`` (C-contiguous, writeable). Local."""
    cdef Py_buffer sb, rb, hb
    PyObject_GetBuffer(stage, &sb, PyBUF_ANY_CONTIGUOUS)
    PyObject_GetBuffer(rows, &rb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    PyObject_GetBuffer(header, &hb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if sb.len != rb.len + hb.len:
            raise ValueError(f"unpack: a {sb.len}-byte reply for {rb.len} bytes of rows and "
                             f"a {hb.len}-byte header")
        memcpy(rb.buf, sb.buf, rb.len)
        memcpy(hb.buf, <char*>sb.buf + rb.len, hb.len)
    finally:
        PyBuffer_Release(&hb)
        PyBuffer_Release(&rb)
        PyBuffer_Release(&sb)


cdef inline double _clock(int which) noexcept nogil:
    cdef timespec t
    clock_gettime(which, &t)
    return t.tv_sec + 1e-9 * t.tv_nsec


cdef inline double _nap(double sleep, double sleep_max) noexcept nogil:
    """Sleep ``sleep`` seconds; returns the next sleep (doubled, at most ``sleep_max``)."""
    cdef timespec ts
    ts.tv_sec = <time_t>sleep
    ts.tv_nsec = <long>((sleep - ts.tv_sec) * 1e9)
    nanosleep(&ts, NULL)
    return sleep * 2 if sleep * 2 < sleep_max else sleep_max


cdef int _wait(MPI_Request *req, double spin, double sleep_min, double sleep_max) noexcept nogil:
    """``MPI_Wait`` (``spin`` < 0), or ``MPI_Test`` for ``spin`` seconds, then between tests
    sleeps doubling from ``sleep_min`` to ``sleep_max`` (as :func:`hpcps.comm.core.waitall`)."""
    cdef int flag = 0, ierr
    cdef double t0, sleep = sleep_min
    if spin < 0:
        return MPI_Wait(req, MPI_STATUS_IGNORE)
    t0 = _clock(CLOCK_MONOTONIC)
    while True:
        ierr = MPI_Test(req, &flag, MPI_STATUS_IGNORE)
        if ierr != MPI_SUCCESS or flag:
            return ierr
        if _clock(CLOCK_MONOTONIC) - t0 >= spin:
            sleep = _nap(sleep, sleep_max)


cdef int _wait_watched(MPI_Request* sreq, MPI_Request* rreq, MPI_Comm watch, int watch_tag,
                       double spin, double sleep_min, double sleep_max) noexcept nogil:
    """Complete ``sreq`` and ``rreq`` (either may be ``MPI_REQUEST_NULL``) by tests, probing
    ``watch`` from any source on ``watch_tag`` (a tag no message carries) between them: in
    continue mode MPI reports a failed rank of ``watch`` there (as
    :func:`hpcps.comm.core.waitall` does). Sleeps between tests after ``spin`` seconds
    (``spin`` < 0: never). Returns the MPI error code; on an error the requests left are
    cancelled (a receive) and freed, their buffers to be abandoned by the caller."""
    cdef int flag = 0, ierr = MPI_SUCCESS
    cdef double t0 = _clock(CLOCK_MONOTONIC), sleep = sleep_min
    cdef MPI_Status st
    while True:
        if sreq[0] != MPI_REQUEST_NULL:
            ierr = MPI_Test(sreq, &flag, MPI_STATUS_IGNORE)
        if ierr == MPI_SUCCESS and rreq[0] != MPI_REQUEST_NULL:
            ierr = MPI_Test(rreq, &flag, MPI_STATUS_IGNORE)
        if ierr == MPI_SUCCESS and sreq[0] == MPI_REQUEST_NULL and rreq[0] == MPI_REQUEST_NULL:
            return MPI_SUCCESS
        if ierr == MPI_SUCCESS:
            ierr = MPI_Iprobe(MPI_ANY_SOURCE, watch_tag, watch, &flag, &st)
        if ierr != MPI_SUCCESS:
            if rreq[0] != MPI_REQUEST_NULL:
                MPI_Cancel(rreq)
                MPI_Request_free(rreq)
            if sreq[0] != MPI_REQUEST_NULL:
                MPI_Request_free(sreq)
            return ierr
        if spin >= 0 and _clock(CLOCK_MONOTONIC) - t0 >= spin:
            sleep = _nap(sleep, sleep_max)


cdef inline bint _is_fmt(const char* got, const char* want) noexcept:
    """Whether buffer format ``got`` (NULL: unsigned bytes) is ``want`` (a one-character
    native format such as numpy gives, e.g. ``l`` for int64, ``f`` for float32)."""
    if got == NULL:
        return want[0] == b'B' and want[1] == 0
    if got[0] == b'@':
        got += 1
    return got[0] == want[0] and got[0] != 0 and got[1] == 0


def request(MPI.Comm comm, int dest, int tag, int64_t op, int64_t table, int64_t clock,
            int64_t n_examples, int64_t seq, int64_t dim, int64_t aux, int64_t rng,
            keys, const char* key_fmt, int64_t num_keys, values, rows, const char* fmt,
            int64_t width, Py_ssize_t limit, sendbuf, recvbuf=None, header=None, int reply_tag=0,
            double spin=-1.0, double sleep_min=2e-6, double sleep_max=2e-4,
            Py_ssize_t reply_limit=-1, MPI.Comm watch=None, int watch_tag=8):
    """A worker's PUSH or PULL of one message to one server, in one call with the GIL
    released around MPI (issue 20: the small request's Python work on the worker).

    The request — the 9-value header ``[op, table, clock, n, n_examples, seq, dim, aux,
    rng]`` (``n`` = the number of ``keys``), the keys, then ``values`` if given — is packed
    into ``sendbuf`` and sent with a blocking (eager) ``MPI_Send`` to ``dest`` on ``tag``.
    With ``rows`` (a PULL): the receive of the one-message reply (the rows, then the shard
    clock ``header``, int64) is posted into ``recvbuf`` first, waited for after the send
    (``MPI_Wait``, or with ``spin`` >= 0 tested for ``spin`` seconds and then between sleeps
    doubling from ``sleep_min`` to ``sleep_max``) and copied into ``rows`` and ``header``.
    With ``watch`` (continue mode) the request is started with ``MPI_Isend`` and both are
    completed by tests that probe ``watch`` on ``watch_tag`` for a failed rank; on an MPI
    error the requests are cancelled and freed, and the caller must never reuse
    ``sendbuf`` and ``recvbuf`` (MPI may still use them).

    The caller gives the arrays as they are; what this call does not take is left to the
    Python path (nothing sent, a code returned):

    Returns
    -------
    int
        The bytes sent (> 0); -1 when a key is outside ``[0, num_keys)`` (``num_keys`` < 0:
        not checked); -2 when the request (header, keys, values) is larger than ``limit``
        bytes or its buffer, or the reply (rows and header) larger than ``reply_limit``
        (< 0: ``limit``) or its buffer; -3 when ``keys`` is not a
        C-contiguous array of format ``key_fmt`` (int64), ``values`` not C-contiguous
        ``fmt`` data of ``n * width`` items (``width``: the table's dim), or ``rows`` not a
        writeable C-contiguous ``(n, width)`` array of format ``fmt``.

    Raises
    ------
    mpi4py.MPI.Exception
        If an MPI call fails.
    """
    cdef Py_buffer kb, vb, rb, sb, qb, hb
    cdef bint has_v = values is not None, has_r = rows is not None
    cdef bint got_k = False, got_v = False, got_r = False, got_s = False, got_q = False
    cdef bint got_h = False
    cdef Py_ssize_t n, i, pos, total = 0, nv = 0, reply = 0
    cdef const int64_t* k
    cdef uint64_t un = <uint64_t>num_keys
    cdef int64_t* hd
    cdef int ierr = MPI_SUCCESS, code = 0
    cdef MPI_Request req = MPI_REQUEST_NULL, sreq = MPI_REQUEST_NULL
    cdef MPI_Comm wc = MPI_COMM_NULL if watch is None else watch.ob_mpi
    try:
        try:
            PyObject_GetBuffer(keys, &kb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        except (BufferError, TypeError, ValueError):      # not a contiguous buffer
            return -3
        got_k = True
        if kb.itemsize != 8 or not _is_fmt(kb.format, key_fmt):
            return -3
        n = kb.len // 8
        k = <const int64_t*>kb.buf
        if num_keys >= 0:
            for i in range(n):
                if <uint64_t>k[i] >= un:
                    return -1
        if has_v:
            try:
                PyObject_GetBuffer(values, &vb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except (BufferError, TypeError, ValueError):
                return -3
            got_v = True
            if not _is_fmt(vb.format, fmt) or vb.len != n * width * vb.itemsize:
                return -3
            nv = vb.len
        if has_r:
            try:
                PyObject_GetBuffer(rows, &rb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)
            except (BufferError, TypeError, ValueError):
                return -3
            got_r = True
            if (not _is_fmt(rb.format, fmt) or rb.ndim != 2 or rb.shape[0] != n
                    or rb.shape[1] != width):
                return -3
            PyObject_GetBuffer(header, &hb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
            got_h = True
            PyObject_GetBuffer(recvbuf, &qb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
            got_q = True
            reply = rb.len + hb.len
            if reply > (reply_limit if reply_limit >= 0 else limit) or reply > qb.len:
                return -2
        PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        got_s = True
        total = 72 + 8 * n + nv
        if total > limit or total > sb.len:
            return -2
        hd = <int64_t*>sb.buf
        hd[0] = op
        hd[1] = table
        hd[2] = clock
        hd[3] = n
        hd[4] = n_examples
        hd[5] = seq
        hd[6] = dim
        hd[7] = aux
        hd[8] = rng
        memcpy(<char*>sb.buf + 72, kb.buf, 8 * n)
        if has_v:
            memcpy(<char*>sb.buf + 72 + 8 * n, vb.buf, nv)
        with nogil:
            if has_r:
                ierr = MPI_Irecv(qb.buf, <int>reply, MPI_BYTE, dest, reply_tag, comm.ob_mpi,
                                 &req)
            if ierr == MPI_SUCCESS and wc != MPI_COMM_NULL:
                ierr = MPI_Isend(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi, &sreq)
                if ierr == MPI_SUCCESS:
                    ierr = _wait_watched(&sreq, &req, wc, watch_tag, spin, sleep_min, sleep_max)
                elif req != MPI_REQUEST_NULL:
                    MPI_Cancel(&req)
                    MPI_Request_free(&req)
            elif ierr == MPI_SUCCESS:
                ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi)
                if ierr == MPI_SUCCESS and has_r:
                    ierr = _wait(&req, spin, sleep_min, sleep_max)
        if ierr != MPI_SUCCESS:
            raise MPIException(ierr)
        if has_r:
            memcpy(rb.buf, qb.buf, rb.len)
            memcpy(hb.buf, <char*>qb.buf + rb.len, hb.len)
        return total
    finally:
        if got_k:
            PyBuffer_Release(&kb)
        if got_v:
            PyBuffer_Release(&vb)
        if got_r:
            PyBuffer_Release(&rb)
        if got_h:
            PyBuffer_Release(&hb)
        if got_q:
            PyBuffer_Release(&qb)
        if got_s:
            PyBuffer_Release(&sb)


cdef Py_ssize_t _answer_pull(MPI_Comm comm, const char* req, int count, int src,
                             Py_ssize_t limit, list shards, shard_type, int64_t visible,
                             int64_t lag, int reply_tag, sendbuf) except -2:
    """Answer the request of ``count`` bytes at ``req`` from ``src`` when it is a ready
    ``PULL`` whose keys came with it, as :func:`poll_pull` describes: the bytes sent, or -1
    (nothing sent) when it is not of that form (the caller's path takes it and names any
    error). MPIException if the send fails."""
    cdef Py_buffer wb, hb, sb
    cdef const int64_t* hd = <const int64_t*>req
    cdef int64_t n = hd[3], table = hd[1], clk = hd[2]
    cdef int ierr = MPI_SUCCESS, outside = 0
    cdef Py_ssize_t rowb, nv, total = -1, bad = 0
    if (hd[0] != 1 or n < 1 or count != 72 + 8 * n or table < 0 or table >= len(shards)
            or not (visible >= clk if hd[7] else visible >= clk - lag)):
        return -1
    shard = shards[table]
    if type(shard) is not shard_type:
        return -1
    w, header, part = shard.w, shard.hdr, shard.part
    if w.ndim != 2:
        return -1
    rowb = _row_bytes(w)
    try:
        PyObject_GetBuffer(w, &wb, PyBUF_C_CONTIGUOUS)
    except BufferError:
        return -1
    try:
        PyObject_GetBuffer(header, &hb, PyBUF_ANY_CONTIGUOUS)
        try:
            PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
            try:
                nv = n * rowb
                if nv + hb.len > limit or nv + hb.len > sb.len:
                    return -1
                bad = _gather(<const int64_t*>(req + 72), n, part.num_keys, part.multiplier,
                              shard.lo, shard.hi, <const char*>wb.buf, wb.len, rowb,
                              <char*>sb.buf, 0, &outside)
                if bad >= 0:                  # the caller's path names the key
                    return -1
                total = nv + hb.len
                memcpy(<char*>sb.buf + nv, hb.buf, hb.len)
                with nogil:
                    ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, src, reply_tag, comm)
            finally:
                PyBuffer_Release(&sb)
        finally:
            PyBuffer_Release(&hb)
    finally:
        PyBuffer_Release(&wb)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return total


def poll_pull(MPI.Comm comm, int tag, buf, Py_ssize_t limit, list shards, shard_type,
              int64_t visible, int64_t lag, int reply_tag, sendbuf, busy=None):
    """:func:`probe_recv`, and a ready ``PULL`` it received answered at once, as the server
    loop would (issue 20: the server's Python work per small pull): when the request is a
    ``PULL`` (op 1) whose ``n`` keys came with it (``9 * 8 + 8 * n`` bytes) for a table
    ``shards[table]`` of exactly ``shard_type`` (a :class:`hpcps.server.shard.Shard`: its
    ``part.num_keys``, ``part.multiplier``, ``lo``, ``hi``, rows ``w`` (2-D, C-contiguous)
    and clock header ``hdr``), ready (``visible >= clock``, or without the fresh flag
    ``visible >= clock - lag``), every key in the shard's range and the reply (rows, then
    ``hdr``) at most ``limit`` bytes, the reply is built in ``sendbuf`` and sent (blocking,
    eager) on ``reply_tag`` as :func:`pull_inline` sends it.

    Returns
    -------
    None (no request), ``(source, nbytes)`` (a request left to the caller, as
    :func:`probe_recv`), or ``(source, nbytes, reply_bytes, seconds)`` for a PULL answered
    here (``seconds``: from the request's receipt to the reply's send).
    With ``busy`` (a list ``[requests, seconds, cpu seconds]``), an answered PULL adds 1
    and the wall-clock and CPU seconds of this thread from the request's receipt to the
    reply's send (as the server loop counts its handler).

    Raises
    ------
    mpi4py.MPI.Exception
        If an MPI call fails.
    """
    cdef Py_buffer b
    cdef int flag = 0, ierr, count = 0, src = -1
    cdef Py_ssize_t total = 0
    cdef double t0 = 0.0, c0 = 0.0, t1 = 0.0
    cdef bint timed = busy is not None
    PyObject_GetBuffer(buf, &b, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if b.len < limit or b.len < 72:
            raise ValueError(f"poll_pull: buffer of {b.len} bytes, limit {limit}")
        with nogil:
            ierr = _probe_recv(comm.ob_mpi, tag, b.buf, limit, &flag, &src, &count)
        if ierr != MPI_SUCCESS:
            raise MPIException(ierr)
        if not flag:
            return None
        if count < 72 or count > limit:
            return src, count
        t0 = _clock(CLOCK_MONOTONIC)
        if timed:
            c0 = _clock(CLOCK_THREAD_CPUTIME_ID)
        total = _answer_pull(comm.ob_mpi, <const char*>b.buf, count, src, limit, shards,
                             shard_type, visible, lag, reply_tag, sendbuf)
        if total < 0:
            return src, count
        t1 = _clock(CLOCK_MONOTONIC) - t0
        if timed:
            busy[0] += 1
            busy[1] += t1
            busy[2] += _clock(CLOCK_THREAD_CPUTIME_ID) - c0
        return src, count, total, t1
    finally:
        PyBuffer_Release(&b)


cdef object _part_rows(shard, const int64_t* keys, Py_ssize_t n):
    """The local rows (a new int64 array) of a part's ``n`` keys at ``keys`` on ``shard``
    (its ``part.num_keys``, ``part.multiplier``, ``lo``, ``hi``), or None when a key is
    outside the key space or the shard's range."""
    cdef int outside = 0
    cdef Py_ssize_t bad
    part = shard.part
    cdef uint64_t un = <uint64_t>part.num_keys, ua = <uint64_t>part.multiplier
    cdef uint64_t lo = <uint64_t>shard.lo, hi = <uint64_t>shard.hi
    if part.num_keys < 1:
        return None
    if un == 1:
        ua = 1
    rows = np.empty(n, dtype=np.int64)
    cdef int64_t* rp = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>rows)
    with nogil:
        bad = local_rows_ptr(keys, n, un, ua, lo, hi, rp, &outside)
    return None if bad >= 0 else rows


def step_parts(request, Py_ssize_t n_push, Py_ssize_t n_pull, list shards, shard_type):
    """Take apart the parts of a ``PUSH_CLOCK_PULL`` that all came with its header (issue 20:
    one compiled call for what took a Python call per part): ``request``, the bytes after
    the header (contiguous), holds the int64 ``(n_push + n_pull, 5)`` descriptions
    (:data:`hpcps.comm.protocol.PART_LEN`), then each push's int64 keys and value rows, then
    each pull's keys (:mod:`hpcps.comm.protocol`). Every part's table must be
    ``shards[table]`` of exactly ``shard_type`` (:class:`hpcps.server.shard.Shard`: its
    ``spec.dim``, ``w`` (2-D, C-contiguous, float32 or float64), ``part.num_keys``,
    ``part.multiplier``, ``lo``, ``hi``). ``request`` is not modified. Local.

    Returns
    -------
    None
        When anything is not of that form: the parts do not fill ``request`` exactly, a
        table id is unknown or of another shard type, a dim differs from its table's, a key
        is outside the key space or the shard's range, a push value is NaN or infinite. The
        caller then takes the general path, which names the error.
    tuple
        ``(pushes, pulls, pull_keys)``: ``pushes`` a list of ``(table, rows, values,
        version)`` (rows int64 ``(n,)`` local rows, values ``(n, dim)`` of the table's dtype,
        both new arrays), ``pulls`` a list of ``(shard, rows)`` (rows int64 ``(n,)``, new),
        ``pull_keys`` the pulls' keys in all.
    """
    cdef Py_buffer rb
    cdef Py_ssize_t pull_keys = 0
    PyObject_GetBuffer(request, &rb, PyBUF_ANY_CONTIGUOUS)
    try:
        got = _step_parts(<const char*>rb.buf, rb.len, n_push, n_pull, shards, shard_type,
                          &pull_keys)
    finally:
        PyBuffer_Release(&rb)
    return None if got is None else (got[0], got[1], pull_keys)


cdef object _push_part(shard, const char* base, Py_ssize_t length, Py_ssize_t n,
                       Py_ssize_t dim, Py_ssize_t* used):
    """A push's ``n`` int64 keys then ``(n, dim)`` value rows at ``base`` (at most ``length``
    bytes) for ``shard`` (a :class:`hpcps.server.shard.Shard`): ``(rows, values)``, both
    new arrays (local rows int64 ``(n,)``, values of the table's dtype), the bytes they took
    in ``used``; None when ``dim`` is not the table's, the bytes do not hold them, a key is
    outside the key space or the shard's range, or a value is NaN or infinite."""
    cdef Py_ssize_t isz, nv
    cdef char* vp
    cdef bint ok = True
    w = shard.w
    if n < 0 or w.ndim != 2 or dim != w.shape[1] or not w.flags.c_contiguous:
        return None
    isz = w.itemsize
    if isz != 4 and isz != 8 or w.dtype.kind != "f":
        return None
    nv = n * dim * isz
    if 8 * n + nv > length:
        return None
    rows = _part_rows(shard, <const int64_t*>base, n)
    if rows is None:
        return None
    vals = np.empty((n, dim), dtype=w.dtype)
    vp = <char*>cnp.PyArray_DATA(<cnp.ndarray>vals)
    with nogil:
        memcpy(vp, base + 8 * n, nv)
        ok = finite_ptr(vp, nv, <int>isz)
    if not ok:
        return None
    used[0] = 8 * n + nv
    return rows, vals


cdef object _step_parts(const char* base, Py_ssize_t length, Py_ssize_t n_push,
                        Py_ssize_t n_pull, list shards, shard_type, Py_ssize_t* pull_keys):
    """:func:`step_parts` of the ``length`` bytes at ``base``: ``(pushes, pulls)`` (the
    pulls' keys in all in ``pull_keys``) or None."""
    cdef const int64_t* meta = <const int64_t*>base
    cdef Py_ssize_t nparts = n_push + n_pull, i, pos, n, dim, nv = 0
    cdef int64_t table
    pull_keys[0] = 0
    if n_push < 0 or n_pull < 0 or nparts == 0 or length < 40 * nparts:
        return None
    pos = 40 * nparts
    pushes = []
    pulls = []
    for i in range(nparts):
        table, n, dim = meta[5 * i], meta[5 * i + 1], meta[5 * i + 3]
        if table < 0 or table >= len(shards) or n < 0:
            return None
        shard = shards[table]
        if type(shard) is not shard_type:
            return None
        if i < n_push:
            got = _push_part(shard, base + pos, length - pos, n, dim, &nv)
            if got is None:
                return None
            pushes.append((table, got[0], got[1], meta[5 * i + 4]))
            pos += nv
        else:
            if pos + 8 * n > length:
                return None
            rows = _part_rows(shard, <const int64_t*>(base + pos), n)
            if rows is None:
                return None
            pulls.append((shard, rows))
            pos += 8 * n
            pull_keys[0] += n
    if pos != length:
        return None
    return pushes, pulls


cdef class _StepBooks:
    """A BSP server's bookkeeping of one fused step (``PUSH_CLOCK_PULL``), written once for
    :func:`bsp_steps` and :func:`record_step`: the server's containers, read when made (make
    one per call: the server may rebind them between calls)."""
    cdef object wc, order_key, pending, step_examples, pushes_applied
    cdef object last_examples, last_epoch, waiting

    def __init__(self, server):
        self.wc = server.worker_clock
        self.order_key = server.order_key
        self.pending = server.pending
        self.step_examples = server.step_examples
        self.pushes_applied = server.pushes_applied
        self.last_examples, self.last_epoch = server.last_examples, server.last_epoch
        self.waiting = server.waiting_pulls

    cdef object queue(self, w, int64_t c, list pushes):
        """Worker ``w``'s pushes ``(table, rows, values, version)`` held for step ``c`` by its
        worker-order key (returned), as ``ParameterServer._queue`` holds them."""
        key = self.order_key[w]
        if pushes:
            queued = self.pending.get(c)
            if queued is None:
                queued = self.pending[c] = {}
            for tid, rows, vals, version in pushes:
                lst = queued.get(tid)
                if lst is None:
                    lst = queued[tid] = []
                lst.append((key, rows, vals, version))
            self.pushes_applied[w] += len(pushes)
        return key

    cdef int record(self, w, int src, const int64_t* hd, list pushes, list pulls) except -1:
        """Worker ``w`` (from ``ps`` rank ``src``) finished step ``hd[2]`` (its clock was
        checked): its pushes queued for the step by its worker-order key, its clock, examples
        and epoch kept, its pulls held as the ``PULL_MANY`` of step ``hd[2] + 1``."""
        cdef int64_t c = hd[2]
        cdef Py_ssize_t n_rows = 0
        cdef int64_t* hp
        key = self.queue(w, c, pushes)
        self.wc[w] = c + 1
        self.last_examples[w] = hd[4]
        self.last_epoch[w] = hd[7]
        per = self.step_examples.get(c)
        if per is None:
            per = self.step_examples[c] = {}
        per[key] = (hd[4], hd[7])
        for _, rows in pulls:
            n_rows += (<cnp.ndarray>rows).shape[0]
        h = np.zeros(9, dtype=np.int64)     # the PULL_MANY of the next step's pulls
        hp = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>h)
        hp[0], hp[1], hp[2], hp[3], hp[5], hp[8] = 13, len(pulls), c + 1, n_rows, hd[5], hd[8]
        self.waiting.append((src, h, pulls))
        return 0


def record_step(server, int source, const int64_t[::1] header, list pushes, list pulls):
    """Take in the BSP step of a ``PUSH_CLOCK_PULL`` whose parts :func:`step_parts` took
    apart (``header``: its int64 ``(9,)`` header; ``pushes``, ``pulls`` as
    :func:`step_parts` gives them) from ``ps`` rank ``source``, as :func:`bsp_steps` takes in
    each of its requests: pushes queued, clock, examples and epoch kept, pulls held in
    ``server.waiting_pulls`` (``server`` as for :func:`bsp_steps`). Local.

    Returns
    -------
    bool
        False, with nothing changed, when ``source`` is not a worker of ``server`` or the
        step is not the clock the server expects of it (the caller's general path names the
        error); else True.

    Raises
    ------
    ValueError
        For a header shorter than 9 values.
    """
    if header.shape[0] < 9:
        raise ValueError("record_step: the header has 9 values")
    w = server.worker_of_rank.get(source)
    if w is None or server.worker_clock[w] != header[2]:
        return False
    cdef _StepBooks books = _StepBooks(server)
    books.record(w, source, &header[0], pushes, pulls)
    return True


def bsp_steps(MPI.Comm comm, int tag, buf, Py_ssize_t limit, list shards, shard_type,
              server, Py_ssize_t max_n, int64_t[::1] counts, busy=None, int reply_tag=-1,
              sendbuf=None):
    """Receive and take in the BSP steps that wait, one after the other, without a return to
    Python per request (issue 20: the server's Python work per fused request): each
    ``PUSH_CLOCK_PULL`` of one message whose parts :func:`step_parts` takes apart, from a
    worker at the clock the server expects of it, is queued, clocked and its pulls held for
    the step, by the bookkeeping :func:`record_step` uses; each lone ``PUSH`` of one message
    for such a table, from a worker, for a step not yet applied, is held for its step as
    ``ParameterServer._on_push`` holds it; with ``sendbuf``, each lone ``PULL`` ready at the
    server's ``visible_clock`` is answered on ``reply_tag`` as :func:`poll_pull` answers it —
    until no request waits, ``max_n`` were taken, another request arrived, or one completed
    the step.

    ``server`` is the BSP :class:`~hpcps.server.server.ParameterServer` outside continue
    mode (its ``worker_of_rank``, ``worker_clock``, ``clock``, ``order_key``, ``pending``,
    ``step_examples``, ``pushes_applied``, ``last_examples``, ``last_epoch`` and
    ``waiting_pulls`` are read and updated); ``buf``, ``limit`` as for :func:`probe_recv`.
    ``counts`` (int64, 13) is increased by the traffic of the requests taken — messages,
    bytes in and keys of the ``PUSH_CLOCK_PULL`` s, bytes in and keys of their pulls;
    messages, bytes in and keys of the lone ``PUSH`` es; messages, bytes in, bytes out, keys
    and nanoseconds (receipt to reply) of the lone ``PULL`` s answered — as
    :meth:`hpcps.comm.transport.ServerEndpoint.poll` and ``step_parts`` count them; ``busy``
    (a list ``[requests, seconds, cpu seconds]``) by each request taken and the wall-clock
    and CPU seconds from its receipt to its end. Local.

    Returns
    -------
    tuple
        ``(taken, kind, source, nbytes)``: ``kind`` 0 — no request waits (or ``max_n`` were
        taken); 1 — the request of ``nbytes`` bytes from ``source`` is left to the caller
        (received into ``buf`` when ``nbytes <= limit``, as :func:`probe_recv` leaves it),
        nothing of it consumed; 2 — the last request taken, from ``source``, completed the
        step the server waits for (every worker's clock is past ``server.clock``): the
        caller applies it (its pulls wait in ``waiting_pulls`` with the others).

    Raises
    ------
    ValueError
        For ``buf`` shorter than ``limit`` or ``counts`` shorter than 13.
    mpi4py.MPI.Exception
        If an MPI call fails.
    """
    cdef Py_buffer b
    cdef int flag = 0, ierr, count = 0, src = -1
    cdef const int64_t* hd
    cdef int64_t c
    cdef Py_ssize_t taken = 0, pull_keys = 0, used = 0, sent = 0
    cdef double t0 = 0.0, c0 = 0.0, t1 = 0.0
    cdef bint timed = busy is not None
    if counts.shape[0] < 13:
        raise ValueError("bsp_steps: counts needs 13 values")
    cdef _StepBooks books = _StepBooks(server)
    worker_of_rank = server.worker_of_rank
    wc = books.wc
    cdef int64_t applied = server.clock, visible = server.visible_clock
    PyObject_GetBuffer(buf, &b, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if b.len < limit or b.len < 72:
            raise ValueError(f"bsp_steps: buffer of {b.len} bytes, limit {limit}")
        hd = <const int64_t*>b.buf
        while taken < max_n:
            with nogil:
                ierr = _probe_recv(comm.ob_mpi, tag, b.buf, limit, &flag, &src, &count)
            if ierr != MPI_SUCCESS:
                raise MPIException(ierr)
            if not flag:
                return taken, 0, -1, 0
            if count < 72 or count > limit or (hd[0] != 14 and hd[0] != 2 and hd[0] != 1):
                return taken, 1, src, count
            t0 = _clock(CLOCK_MONOTONIC)
            if timed:
                c0 = _clock(CLOCK_THREAD_CPUTIME_ID)
            if hd[0] == 1:                       # a lone PULL: answered when ready
                if sendbuf is None:
                    return taken, 1, src, count
                sent = _answer_pull(comm.ob_mpi, <const char*>b.buf, count, src, limit, shards,
                                    shard_type, visible, 0, reply_tag, sendbuf)
                if sent < 0:
                    return taken, 1, src, count
                t1 = _clock(CLOCK_MONOTONIC) - t0
                counts[8] += 1
                counts[9] += count
                counts[10] += sent
                counts[11] += hd[3]
                counts[12] += <int64_t>(t1 * 1e9)
                taken += 1
                if timed:
                    busy[0] += 1
                    busy[1] += t1
                    busy[2] += _clock(CLOCK_THREAD_CPUTIME_ID) - c0
                continue
            w = worker_of_rank.get(src)
            c = hd[2]
            if hd[0] == 2:                       # a lone PUSH: held for its step
                if w is None or c < applied or hd[1] < 0 or hd[1] >= len(shards):
                    return taken, 1, src, count
                shard = shards[hd[1]]
                if type(shard) is not shard_type:
                    return taken, 1, src, count
                got = _push_part(shard, <const char*>b.buf + 72, count - 72, hd[3], hd[6],
                                 &used)
                if got is None or used != count - 72:
                    return taken, 1, src, count
                books.queue(w, c, [(hd[1], got[0], got[1], hd[7])])
                counts[5] += 1
                counts[6] += count
                counts[7] += hd[3]
                taken += 1
                if timed:
                    busy[0] += 1
                    busy[1] += _clock(CLOCK_MONOTONIC) - t0
                    busy[2] += _clock(CLOCK_THREAD_CPUTIME_ID) - c0
                continue
            if w is None or wc[w] != c:          # the general path names the error
                return taken, 1, src, count
            got = _step_parts(<const char*>b.buf + 72, count - 72, hd[1], hd[6], shards,
                              shard_type, &pull_keys)
            if got is None:
                return taken, 1, src, count
            pushes, pulls = got
            counts[0] += 1
            counts[1] += count - 8 * pull_keys
            counts[2] += hd[3]
            counts[3] += 8 * pull_keys
            counts[4] += pull_keys
            books.record(w, src, hd, pushes, pulls)
            taken += 1
            if timed:
                busy[0] += 1
                busy[1] += _clock(CLOCK_MONOTONIC) - t0
                busy[2] += _clock(CLOCK_THREAD_CPUTIME_ID) - c0
            if wc.min() > applied:
                return taken, 2, src, count
        return taken, 0, -1, 0
    finally:
        PyBuffer_Release(&b)


def send_rows(MPI.Comm comm, int dest, int tag, w, rows, header, sendbuf):
    """A pull's reply of one message: ``w[rows]`` (``w`` 2-D C-contiguous, ``rows`` int64
    local rows) followed by ``header`` (the shard's int64 clock header), built in
    ``sendbuf`` and sent to ``dest`` on ``tag`` with a blocking ``MPI_Send`` (the worker has
    posted its receive; for replies of one eager message,
    :func:`hpcps.comm.protocol.one_message`). Returns the bytes sent. Point-to-point.

    Raises
    ------
    ValueError
        For a row outside ``[0, len(w))`` or a reply larger than ``sendbuf`` (nothing sent).
    mpi4py.MPI.Exception
        If the send fails.
    """
    cdef Py_buffer wb, rb, hb, sb
    cdef Py_ssize_t n, nv, total = 0, rowb = _row_bytes(w), bad = -1
    cdef uint64_t R
    cdef const int64_t* rp
    cdef char* out
    cdef const char* src
    cdef int ierr = MPI_SUCCESS
    R = <uint64_t>w.shape[0]
    PyObject_GetBuffer(w, &wb, PyBUF_C_CONTIGUOUS)
    try:
        PyObject_GetBuffer(rows, &rb, PyBUF_ANY_CONTIGUOUS)
        try:
            PyObject_GetBuffer(header, &hb, PyBUF_ANY_CONTIGUOUS)
            try:
                PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
                try:
                    n = rb.len // 8
                    nv = n * rowb
                    total = nv + hb.len
                    if total > sb.len:
                        raise ValueError(f"send_rows: a {total}-byte reply in a {sb.len}-byte "
                                         "buffer")
                    rp = <const int64_t*>rb.buf
                    out = <char*>sb.buf
                    src = <const char*>wb.buf
                    with nogil:
                        bad = take_rows_ptr(src, R, rowb, rp, n, out)
                        if bad < 0:
                            memcpy(out + nv, hb.buf, hb.len)
                            ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi)
                finally:
                    PyBuffer_Release(&sb)
            finally:
                PyBuffer_Release(&hb)
        finally:
            PyBuffer_Release(&rb)
    finally:
        PyBuffer_Release(&wb)
    if bad >= 0:
        raise ValueError(f"send_rows: row {rows[bad]} outside [0, {R})")
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return total


cdef inline cnp.ndarray _c_array(a):
    """``a`` as an ndarray when it is one and C-contiguous, else None (the caller falls back)."""
    if type(a) is not cnp.ndarray or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a):
        return None
    return <cnp.ndarray>a


def send_step(MPI.Comm comm, int tag, int reply_tag0, ranks, todo, int64_t clock,
              int64_t n_examples, int64_t seq, int64_t epoch, dict staged, pulls, take,
              Py_ssize_t max_request, Py_ssize_t max_reply, int64_t[::1] pushes_sent,
              int64_t[:, ::1] counts, int op_clock, int op_push_clock, int op_step,
              int op_push, int op_pull):
    """A worker's clock to each key range of ``todo`` — with the step's held pushes and the
    next step's pulls — packed and started in one call (issue 20: the per-range Python work
    of :meth:`hpcps.worker.client.PSClient.clock`). Point-to-point.

    Per range ``s`` one message on ``tag`` to ``ranks[s]``, as the Python path sends it: a
    ``CLOCK`` header (nothing held for ``s``); a ``PUSH_CLOCK`` (pushes, no pull); or a
    ``PUSH_CLOCK_PULL`` (pulls) — header ``[op, pushes, clock, keys pushed, n_examples,
    seq, pulls, epoch, s]``, the parts' descriptions (:data:`hpcps.comm.protocol.PART_LEN`
    int64 each: a push's ``[table, keys, examples, dim, version]`` from its PUSH header, a
    pull's ``[table, keys, 0, dim, 0]``), each push's keys and values, each pull's keys.
    The receive of the reply to a range's pulls (each pull's rows then its shard header, one
    message on ``reply_tag0 + 2 s``) is posted before its request is sent.

    Parameters
    ----------
    ranks : sequence of int
        The ``ps`` rank of each key range.
    todo : sequence of int
        The ranges to clock.
    staged : dict
        Range -> list of ``(PUSH header int64 (9,), keys int64 (n,), values)`` held pushes.
    pulls : list or None
        Per range, a list of ``(table, keys int64 (n,), rows (n, dim), header int64)``: the
        pulls and the C-contiguous buffers of their replies.
    take : callable((nbytes,), dtype) -> ndarray
        Gives the send buffer (kept by the caller until the sends complete).
    max_request, max_reply : int
        Largest message and largest reply taken here.
    pushes_sent : int64 (n_ranges,)
        Push messages per range: increased by each range's pushes.
    counts : int64 (ops, 4)
        Per op code, messages, bytes out, bytes in and keys, increased as
        :class:`~hpcps.comm.protocol.TrafficStats` counts the Python path.
    op_clock, op_push_clock, op_step, op_push, op_pull : int
        The op codes.

    Returns
    -------
    None (nothing sent: a message or a reply above its limit, an array not C-contiguous), or
    ``(requests, sendbuf, recvbuf, unpack)``: the started ``MPI.Request`` objects (receives
    first per range), the two buffers to keep until they complete, and the ``(stage, rows,
    header)`` copies that complete the replies (:func:`unpack`).

    Raises
    ------
    mpi4py.MPI.Exception
        If an ``MPI_Irecv`` or ``MPI_Isend`` fails.
    """
    cdef Py_ssize_t i, j, nt = len(todo), total = 0, rtotal = 0, nbytes, reply, pos, rpos
    cdef Py_ssize_t n_parts, n_pulls, nkeys
    cdef int64_t s, op
    cdef int64_t* p
    cdef int64_t* hp
    cdef char* base
    cdef char* rbase = NULL
    cdef cnp.ndarray a, b, h
    cdef int ierr
    cdef MPI.Request rq
    sizes = []
    for i in range(nt):                  # sizes and checks: nothing sent when one fails
        s = todo[i]
        parts = staged.get(s) or ()
        pl = pulls[s] if pulls is not None else ()
        nbytes = 72
        reply = 0
        if parts or pl:
            nbytes += 40 * (len(parts) + len(pl))
            for hh, k, g in parts:
                a = _c_array(k)
                b = _c_array(g)
                if a is None or b is None or _c_array(hh) is None:
                    return None
                nbytes += cnp.PyArray_NBYTES(a) + cnp.PyArray_NBYTES(b)
            for tid, k, rows, hdr in pl:
                a = _c_array(k)
                b = _c_array(rows)
                if a is None or b is None or _c_array(hdr) is None:
                    return None
                nbytes += cnp.PyArray_NBYTES(a)
                reply += cnp.PyArray_NBYTES(b) + cnp.PyArray_NBYTES(<cnp.ndarray>hdr)
        if nbytes > max_request or reply > max_reply:
            return None
        sizes.append((nbytes, reply))
        total += nbytes
        rtotal += reply
    sendbuf = take((total,), np.uint8)
    base = <char*>cnp.PyArray_DATA(<cnp.ndarray>sendbuf)
    recvbuf = None
    if rtotal:
        recvbuf = np.empty(rtotal, dtype=np.uint8)
        rbase = <char*>cnp.PyArray_DATA(<cnp.ndarray>recvbuf)
    reqs = []
    unpack = []
    pos = rpos = 0
    for i in range(nt):
        s = todo[i]
        nbytes, reply = sizes[i]
        parts = staged.get(s) or ()
        pl = pulls[s] if pulls is not None else ()
        n_parts = len(parts)
        n_pulls = len(pl)
        if reply:                         # the reply's receive first
            rq = MPI.Request.__new__(MPI.Request)
            ierr = MPI_Irecv(rbase + rpos, <int>reply, MPI_BYTE, <int>ranks[s],
                             reply_tag0 + 2 * <int>s, comm.ob_mpi, &rq.ob_mpi)
            if ierr != MPI_SUCCESS:
                raise MPIException(ierr)
            reqs.append(rq)
            counts[op_pull, 2] += reply
            for tid, k, rows, hdr in pl:
                j = cnp.PyArray_NBYTES(<cnp.ndarray>rows) + cnp.PyArray_NBYTES(<cnp.ndarray>hdr)
                unpack.append((recvbuf[rpos:rpos + j], rows, hdr))
                rpos += j
        p = <int64_t*>(base + pos)
        op = op_step if n_pulls else (op_push_clock if n_parts else op_clock)
        p[0] = op
        p[1] = n_parts
        p[2] = clock
        p[3] = 0
        p[4] = n_examples
        p[5] = seq if (n_parts or n_pulls) else 0
        p[6] = n_pulls
        p[7] = epoch
        p[8] = s
        j = 9
        nkeys = 0
        for hh, k, g in parts:
            hp = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>hh)
            p[j] = hp[1]
            p[j + 1] = hp[3]
            p[j + 2] = hp[4]
            p[j + 3] = hp[6]
            p[j + 4] = hp[7]
            nkeys += hp[3]
            j += 5
        p[3] = nkeys
        for tid, k, rows, hdr in pl:
            p[j] = tid
            p[j + 1] = (<cnp.ndarray>k).shape[0]
            p[j + 2] = 0
            p[j + 3] = (<cnp.ndarray>rows).shape[1] if (<cnp.ndarray>rows).ndim > 1 else 1
            p[j + 4] = 0
            j += 5
        counts[op, 0] += 1
        counts[op, 1] += 8 * j
        counts[op, 3] += nkeys
        j = pos + 8 * j
        for hh, k, g in parts:
            a = <cnp.ndarray>k
            b = <cnp.ndarray>g
            memcpy(base + j, cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
            j += cnp.PyArray_NBYTES(a)
            memcpy(base + j, cnp.PyArray_DATA(b), cnp.PyArray_NBYTES(b))
            j += cnp.PyArray_NBYTES(b)
            counts[op_push, 1] += cnp.PyArray_NBYTES(a) + cnp.PyArray_NBYTES(b)
        for tid, k, rows, hdr in pl:
            a = <cnp.ndarray>k
            memcpy(base + j, cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
            j += cnp.PyArray_NBYTES(a)
            counts[op_pull, 1] += cnp.PyArray_NBYTES(a)
            counts[op_pull, 3] += a.shape[0]
        rq = MPI.Request.__new__(MPI.Request)
        ierr = MPI_Isend(base + pos, <int>nbytes, MPI_BYTE, <int>ranks[s], tag, comm.ob_mpi,
                         &rq.ob_mpi)
        if ierr != MPI_SUCCESS:
            raise MPIException(ierr)
        reqs.append(rq)
        pushes_sent[s] += n_parts
        pos += nbytes
    return reqs, sendbuf, recvbuf, unpack
