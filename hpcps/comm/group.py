"""Groups of workers on one node that send their BSP steps together (issue 20: a server's
requests per step grew with the number of workers; grouped, with the number of groups).

``[comm] aggregate = "node"`` splits the workers by node (``MPI_COMM_TYPE_SHARED``) and each
node's workers, in worker order, into groups of at most ``[comm] group_workers`` (0: one
group per node). Each server gets one worker per group: member ``s mod g`` of a group of
``g`` sends the group's requests to server ``s`` (its *owner*), so a server handles one
request per group and step and a worker sends about ``S / g`` requests per step instead of
``S``. In every step the members exchange, with ``MPI_Alltoallv`` over the group, the keys
of each server for its owner; an owner pulls them (concatenated in member order) and sends
each member its rows back; then the gradients (and the next step's keys) go to the owners
the same way, and each owner pushes the group's gradients for its servers and clocks them
with the group's examples (:class:`hpcps.worker.groupsteps.GroupSteps`). A server thus sums the
same gradient rows in the same order as it would have summed the members' own pushes.
It is the reduce-scatter-by-server of MXNet's and ps-lite's local aggregation ("one push per
machine"), and of the hierarchical parameter servers of Li et al. (OSDI 2014, section 5.3),
here without summing on the workers (the servers sum, in a fixed order).

Everything a member sends or receives outside the step (evaluation pulls, checkpoints, the
final model) still goes to the servers directly. Only the communication layer uses MPI: the
worker's step runner calls :meth:`StepGroup.counts` and :meth:`StepGroup.alltoall`.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from hpcps.comm import core

__all__ = ["StepGroup", "form_groups"]


class StepGroup:
    """One group of workers (see the module docstring): its communicator and the servers
    this member owns for it.

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
        The group's members, in worker order.
    size, rank : int
        Members, and this worker's number among them.
    n_groups : int
        Groups of the job (set by :func:`form_groups`).
    owned : list of int
        The key ranges (servers) this member sends the group's requests to: ``s`` with
        ``s mod size == rank`` (set by :func:`form_groups`; maybe none).
    step_examples : int
        Examples of the group's current step (the sum of the members'), which an owner's
        client clocks its servers with (:meth:`hpcps.worker.client.PSClient.clock`).
    """

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.n_groups = 1
        self.owned: list = []
        self.step_examples = 0

    def counts(self, send: np.ndarray) -> np.ndarray:
        """``out[m]`` = member ``m``'s ``send[self.rank]``: every member tells every member
        its row (``MPI_Alltoall``). Collective over the group.

        Parameters
        ----------
        send : int64 ndarray (size, n)
            Row ``d`` for member ``d`` (``n`` the same on every member).

        Returns
        -------
        int64 ndarray (size, n)
        """
        send = np.ascontiguousarray(send, dtype=np.int64)
        out = np.empty_like(send)
        self.comm.Alltoall(send, out)
        return out

    def alltoall(self, parts: list, recv_bytes) -> list:
        """Member ``d`` gets ``parts[d]`` of every member (``MPI_Alltoallv`` of bytes).
        Collective over the group.

        Parameters
        ----------
        parts : list of list of ndarray
            For each member ``d``, the C-contiguous arrays for it, in order.
        recv_bytes : sequence of int
            For each member ``m``, the bytes it sends this member (from :meth:`counts` or
            known from an earlier exchange).

        Returns
        -------
        list of uint8 ndarray
            For each member ``m``, what it sent (views into one receive buffer), to be cut
            into its arrays by the caller.
        """
        bufs = [[np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in ps]
                for ps in parts]
        scounts = np.array([sum(x.size for x in b) for b in bufs], dtype=np.int64)
        send = (np.concatenate([x for b in bufs for x in b]) if scounts.sum()
                else np.empty(0, dtype=np.uint8))
        rcounts = np.asarray(recv_bytes, dtype=np.int64)
        recv = np.empty(int(rcounts.sum()), dtype=np.uint8)
        rdispl = _displs(rcounts)
        self.comm.Alltoallv([send, scounts, _displs(scounts), MPI.BYTE],
                            [recv, rcounts, rdispl, MPI.BYTE])
        return [recv[int(o):int(o) + int(n)] for o, n in zip(rdispl, rcounts)]

    def free(self) -> None:
        """Free the group's communicator. Collective over the group."""
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def _displs(counts: np.ndarray) -> np.ndarray:
    d = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=d[1:])
    return d


def form_groups(roles, group_workers: int = 0):
    """Split the workers into :class:`StepGroup` s by node (at most ``group_workers`` each;
    0: a node's workers) and give each server one worker per group: member ``s mod g`` of a
    group of ``g`` sends the group's requests to server ``s`` (:attr:`StepGroup.owned`).
    Collective over every rank of ``roles.ps`` (the servers learn their workers).

    Parameters
    ----------
    roles : hpcps.comm.core.Roles
    group_workers : int
        Largest group, >= 0 (0: no limit).

    Returns
    -------
    (StepGroup or None, list of int or None)
        This worker's group and None on a worker; None and the ``ps`` ranks of its workers
        (one per group, in worker order) on a server.
    """
    ps = roles.ps
    n_servers = roles.n_servers
    row = np.full(3, -1, dtype=np.int64)          # group id (its first rank), rank, size
    group = None
    if roles.role != core.SERVER:
        wc = roles.role_comm
        node = wc.Split_type(MPI.COMM_TYPE_SHARED, key=wc.Get_rank())
        r = node.Get_rank()
        color = r // group_workers if group_workers > 0 else 0
        comm = node.Split(color, key=r)
        node.Free()
        group = StepGroup(comm)
        first = np.array([ps.Get_rank()], dtype=np.int64)
        comm.Bcast(first, root=0)
        row[:] = (first[0], group.rank, group.size)
        group.owned = [s for s in range(n_servers) if s % group.size == group.rank]
    table = np.empty((ps.Get_size(), 3), dtype=np.int64)
    ps.Allgather(row, table)
    if group is not None:
        group.n_groups = len({int(t[0]) for t in table if t[0] >= 0})
        return group, None
    s = roles.index
    return None, [r for r in roles.worker_ranks if table[r, 1] == s % table[r, 2]]
