"""Small collectives used by the roles, with buffer calls only (no pickle).

Every function here is collective over the communicator passed in: all its ranks must call it,
in the same order. In continue mode each runs as its non-blocking form completed by a wait
that notices failures (:func:`hpcps.comm.core.collective`).
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from hpcps.comm.core import collective, native_contiguous


def allreduce_sum(comm: MPI.Intracomm, values) -> np.ndarray:
    """Element-wise sum over ranks of a float64 or int64 array. Collective."""
    a = native_contiguous(values)
    out = np.empty_like(a)
    collective(lambda: comm.Iallreduce(a, out, op=MPI.SUM),
               lambda: comm.Allreduce(a, out, op=MPI.SUM), a, out)
    return out


def allreduce_max(comm: MPI.Intracomm, values) -> np.ndarray:
    """Element-wise maximum over ranks. Collective."""
    a = native_contiguous(values)
    out = np.empty_like(a)
    collective(lambda: comm.Iallreduce(a, out, op=MPI.MAX),
               lambda: comm.Allreduce(a, out, op=MPI.MAX), a, out)
    return out


def gatherv(comm: MPI.Intracomm, values: np.ndarray, root: int = 0):
    """Concatenate 1-D arrays of varying lengths on ``root`` (rank order). Collective.

    Returns the concatenation on ``root`` and ``None`` elsewhere.
    """
    a = native_contiguous(values).reshape(-1)
    counts = allgather_rows(comm, [a.size])[:, 0]
    out = np.empty(int(counts.sum()), dtype=a.dtype) if comm.Get_rank() == root else None
    recv = [out, counts.tolist()] if out is not None else None
    collective(lambda: comm.Igatherv(a, recv, root=root),
               lambda: comm.Gatherv(a, recv, root=root), a, out)
    return out


def allgatherv(comm: MPI.Intracomm, values: np.ndarray) -> np.ndarray:
    """Concatenate 1-D arrays of varying lengths on every rank, in rank order. Collective.

    Parameters
    ----------
    values : ndarray (n_r,), any fixed-size dtype; the same dtype on every rank

    Returns
    -------
    ndarray (sum of n_r,), same dtype
    """
    a = native_contiguous(values).reshape(-1)
    counts = allgather_rows(comm, [a.size])[:, 0]
    out = np.empty(int(counts.sum()), dtype=a.dtype)
    collective(lambda: comm.Iallgatherv(a, [out, counts.tolist()]),
               lambda: comm.Allgatherv(a, [out, counts.tolist()]), a, out)
    return out


def gather_rows(comm: MPI.Intracomm, row: np.ndarray, root: int = 0):
    """Stack one fixed-length float64 row per rank on ``root`` → ``(size, n)``. Collective."""
    a = native_contiguous(np.asarray(row, dtype=np.float64)).reshape(-1)
    out = np.empty((comm.Get_size(), a.size), dtype=np.float64) if comm.Get_rank() == root else None
    collective(lambda: comm.Igather(a, out, root=root), lambda: comm.Gather(a, out, root=root),
               a, out)
    return out


def allgather_rows(comm: MPI.Intracomm, row) -> np.ndarray:
    """Stack one fixed-length int64 row per rank on every rank → ``(size, n)``. Collective."""
    a = native_contiguous(np.asarray(row, dtype=np.int64)).reshape(-1)
    out = np.empty((comm.Get_size(), a.size), dtype=np.int64)
    collective(lambda: comm.Iallgather(a, out), lambda: comm.Allgather(a, out), a, out)
    return out


def bcast_int(comm: MPI.Intracomm, value: int, root: int = 0) -> int:
    """Broadcast one int64 from ``root``; returns it on every rank. Collective."""
    buf = np.array([value], dtype=np.int64)
    collective(lambda: comm.Ibcast(buf, root=root), lambda: comm.Bcast(buf, root=root), buf)
    return int(buf[0])


class Vote:
    """Non-blocking agreement on a few int64 values (their element-wise maximum over the
    ranks), for ranks that must not wait for each other every step (SSP, async): a stop
    request, a number of workers to add.

    Rounds of ``Iallreduce(MAX)`` run on a private duplicate of ``comm``; a new round starts on
    a rank when its previous one completed, so no rank ever blocks in :meth:`poll`, and ranks'
    numbers of started rounds differ by at most one. :meth:`finish` (collective over ``comm``)
    evens them out and completes the last round. Every rank of ``comm`` must create the vote,
    call :meth:`poll` and call :meth:`finish`.

    Parameters
    ----------
    comm : MPI.Intracomm
    width : int
        Values per round (>= 1).
    """

    def __init__(self, comm: MPI.Intracomm, width: int = 1):
        self.owner = comm
        self.comm = comm.Dup()
        self.req = None
        self.started = 0
        self.send = np.zeros(int(width), dtype=np.int64)
        self.recv = np.zeros(int(width), dtype=np.int64)

    def _start(self, values) -> None:
        self.send[:] = values
        self.req = self.comm.Iallreduce(self.send, self.recv, op=MPI.MAX)
        self.started += 1

    def poll(self, values) -> np.ndarray | None:
        """Offer this rank's values (a round started now carries them); return the maxima of
        the round that completed in this call, or ``None``. Local (never waits), but every rank
        must keep calling it: a value must be offered until a completed round shows it."""
        if self.req is None:
            self._start(values)
        if self.req.Test():
            self.req = None
            return self.recv.copy()
        return None

    def finish(self) -> None:
        """Even out the rounds and complete them; free the private communicator. Collective."""
        most = int(allreduce_max(self.owner, np.array([self.started], dtype=np.int64))[0])
        if self.started < most:
            if self.req is not None:       # cannot happen: a rank behind has no round open
                self.req.Wait()
            self._start(0)
        if self.req is not None:
            self.req.Wait()
            self.req = None
        self.comm.Free()


def bcast_array(comm: MPI.Intracomm, values, dtype, root: int = 0) -> np.ndarray:
    """Broadcast a 1-D array whose length only ``root`` knows (the length goes first).
    Collective; ``values`` is used at ``root`` only (``None`` elsewhere).

    Returns
    -------
    ndarray (n,) of ``dtype`` on every rank
    """
    a = native_contiguous(np.asarray(values, dtype=dtype)).reshape(-1) \
        if comm.Get_rank() == root else None
    n = bcast_int(comm, a.size if a is not None else 0, root)
    if a is None:
        a = np.empty(n, dtype=dtype)
    collective(lambda: comm.Ibcast(a, root=root), lambda: comm.Bcast(a, root=root), a)
    return a


def bcast_json(comm: MPI.Intracomm, obj, root: int = 0):
    """Broadcast ``obj`` (JSON-serialisable, given at ``root`` only) as UTF-8 JSON text, no
    pickle; returns it on every rank. Collective.

    Raises
    ------
    TypeError
        At ``root``, when ``obj`` is not JSON-serialisable.
    """
    text = json.dumps(obj).encode() if comm.Get_rank() == root else None
    buf = bcast_array(comm, np.frombuffer(text, dtype=np.uint8) if text is not None else None,
                      np.uint8, root)
    return json.loads(buf.tobytes().decode())


def barrier(comm: MPI.Intracomm) -> None:
    """``comm.Barrier()``. Collective."""
    collective(comm.Ibarrier, comm.Barrier)
