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
    numbers of started rounds differ by at most one. Every rank sees the same maxima for a
    round. :meth:`decide` turns a round that shows a value into one clock at which every rank
    acts on it; :meth:`settle` completes the rounds before a collective on ``comm`` that all
    ranks make at the same clock. :meth:`finish` (collective over ``comm``) evens the rounds
    out and completes the last one. Every rank of ``comm`` must create the vote, call
    :meth:`poll` or :meth:`decide` and call :meth:`finish`.

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
        self.width = int(width)
        # one more value per round: 1 while the rank is between sync points (see settle)
        self.send = np.zeros(self.width + 1, dtype=np.int64)
        self.recv = np.zeros(self.width + 1, dtype=np.int64)
        self.target = None          # the clock agreed for the values in self.pending
        self.pending = None

    def _start(self, values, away: int = 1) -> None:
        self.send[:-1] = values
        self.send[-1] = away
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
            return self.recv[:-1].copy()
        return None

    def settle(self, values) -> np.ndarray:
        """At a sync point (a collective on ``comm`` that every rank makes at the same clock):
        complete rounds, offering ``values``, until one shows a value or every rank started it
        at the sync point. Returns that round's maxima (all zero: nothing was asked).

        Blocking; every rank calls it at the same sync point, while the others still poll.
        Without it a rank could enter the collective while another, seeing a round's value,
        waits in :meth:`decide`'s clock agreement on ``comm`` (a mismatched collective)."""
        while True:
            if self.req is None:
                self._start(values, away=0)
            self.req.Wait()
            self.req = None
            if self.recv[:-1].any() or self.recv[-1] == 0:
                return self.recv[:-1].copy()

    def decide(self, values, clock: int, sync: bool = False) -> np.ndarray | None:
        """Offer ``values`` after the step that ended at ``clock``; return the maxima on every
        rank at one clock (the largest clock any rank had when it saw them, which the others
        catch up to), else ``None``.

        ``sync``: a collective on ``comm`` follows at this clock on every rank (:meth:`settle`).
        Collective over ``comm`` when a round shows a value (an ``Allreduce`` of the clocks);
        every rank makes it once for that round, before any later sync point."""
        if self.target is None:
            res = self.settle(values) if sync else self.poll(values)
            if res is not None and res.any():
                self.target = int(allreduce_max(self.owner, np.array([clock], dtype=np.int64))[0])
                self.pending = res
        if self.target is not None and clock >= self.target:
            got, self.target, self.pending = self.pending, None, None
            return got
        return None

    def finish(self) -> None:
        """Even out the rounds and complete them; free the private communicator. Collective."""
        most = int(allreduce_max(self.owner, np.array([self.started], dtype=np.int64))[0])
        if self.started < most:
            if self.req is not None:       # cannot happen: a rank behind has no round open
                self.req.Wait()
            self._start(np.zeros(self.width, dtype=np.int64))
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
