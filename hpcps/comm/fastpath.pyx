"""The server's hot request path in C (issue 20): MPI calls made from here without the GIL
and without mpi4py's Python layer, for the cases :class:`hpcps.comm.transport.ServerEndpoint`
hands over (outside continue mode; everything else keeps the Python path).

* :func:`probe_recv`: ``MPI_Iprobe`` for the next request, ``MPI_Get_count`` and its
  ``MPI_Recv`` in one call (the poll).
* :func:`pull_inline`: a ready ``PULL`` whose keys came with the request and whose reply is
  one message — keys to local rows, the rows gathered into the reply buffer with the shard's
  clock header after them, and the blocking ``MPI_Send`` — in one call.

and the worker's side of small requests (:class:`hpcps.comm.transport.WorkerEndpoint`):

* :func:`send_packed`: a request of one message packed and sent (``MPI_Send``) in one call;
* :func:`irecv_bytes`: the receive of a packed reply posted (an ``MPI.Request``);
* :func:`unpack`: the packed reply copied into the rows and the header.

MPI errors raise :class:`mpi4py.MPI.Exception` with the error code, as mpi4py's own calls do
(:func:`hpcps.comm.ft.is_peer_failure` reads its class).
"""

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_GetBuffer)
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from mpi4py cimport MPI
from mpi4py.libmpi cimport (MPI_ANY_SOURCE, MPI_BYTE, MPI_Get_count, MPI_Iprobe, MPI_Irecv,
                            MPI_Recv, MPI_Send, MPI_Status, MPI_STATUS_IGNORE, MPI_SUCCESS)

from hpcps.kernels.keys cimport gather_local_ptr

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
from mpi4py.MPI import Exception as MPIException

from hpcps.kernels.keys import _raise_row

#: The MPI whose ``mpi.h`` this module was compiled against ("Open MPI", "MPICH" or
#: "unknown"); :mod:`hpcps.comm.transport` uses the module only under the same MPI.
BUILT_FOR = HPCPS_MPI_VENDOR.decode()

def probe_recv(MPI.Comm comm, int tag, buf, Py_ssize_t limit):
    """The next message of ``tag`` from any source on ``comm``: ``None`` if none waits, else
    ``(source, nbytes)``; received into ``buf`` (writeable, contiguous, at least ``limit``
    bytes) when ``nbytes <= limit`` (a larger one is left for the caller, which refuses it).
    One call, the GIL released around MPI. Point-to-point."""
    cdef Py_buffer b
    cdef int flag = 0, ierr, count = 0, src = -1
    cdef MPI_Status st
    PyObject_GetBuffer(buf, &b, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if b.len < limit:
            raise ValueError(f"probe_recv: buffer of {b.len} bytes, limit {limit}")
        with nogil:
            ierr = MPI_Iprobe(MPI_ANY_SOURCE, tag, comm.ob_mpi, &flag, &st)
            if ierr == MPI_SUCCESS and flag:
                src = st.MPI_SOURCE
                ierr = MPI_Get_count(&st, MPI_BYTE, &count)
                if ierr == MPI_SUCCESS and count <= limit:
                    ierr = MPI_Recv(b.buf, count, MPI_BYTE, src, tag, comm.ob_mpi,
                                    MPI_STATUS_IGNORE)
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
            with nogil:
                ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi)
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
    cdef Py_buffer hb, pb, sb
    cdef Py_ssize_t pos, total
    cdef int ierr = MPI_SUCCESS
    PyObject_GetBuffer(sendbuf, &sb, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
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
        total = pos
        with nogil:
            ierr = MPI_Send(sb.buf, <int>total, MPI_BYTE, dest, tag, comm.ob_mpi)
    finally:
        PyBuffer_Release(&sb)
    if ierr != MPI_SUCCESS:
        raise MPIException(ierr)
    return total


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
