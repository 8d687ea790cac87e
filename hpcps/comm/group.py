"""Groups of workers on one node whose BSP steps one of them sends for all (issue 20: a
server's requests per step grow with the number of workers; aggregated, with the number of
groups).

``[comm] aggregate = "node"`` splits the workers by node (``MPI_COMM_TYPE_SHARED``) and each
node's workers, in worker order, into groups of at most ``[comm] group_workers`` (0: one
group per node). In every step each group's members hand their keys, gradients and example
counts to the group's leader (its first worker) in one ``MPI_Gatherv``; the leader pushes the
group's gradients (concatenated in worker order, so that a server sums the same values in
the same order as it would have summed the members' own pushes), clocks the group's step
and pulls the union of the members' keys for the next step, and hands each member its rows
in one ``MPI_Scatterv``. Servers see the leaders as their workers: the pattern of MXNet's
local aggregation ("kvstore = dist_sync" with one push per machine) and of the hierarchical
parameter servers of Li et al. (OSDI 2014, section 5.3: a server group per data center,
aggregating before the wide-area link), here for the requests a server handles per step.

Everything a member sends or receives outside the step (evaluation pulls, the final
model) still goes to the servers directly. Only the communication layer uses MPI: the
worker's step runner (:class:`hpcps.worker.steps.GroupSteps`) calls :meth:`StepGroup.gather`
and :meth:`StepGroup.scatter`.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from hpcps.comm import core

__all__ = ["StepGroup", "form_groups"]


class StepGroup:
    """One group of workers (see the module docstring): its communicator and who leads it.

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
        The group's members, in worker order (rank 0: the leader).
    size, rank : int
        Members, and this worker's number among them.
    leader : bool
        Whether this worker sends the group's steps (rank 0).
    n_groups : int
        Groups of the job (set by :func:`form_groups`).
    step_examples : int
        The leader's: examples of the group's current step (the sum of the members'),
        which its client's clock sends (:meth:`hpcps.worker.client.PSClient.clock`).
    """

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.leader = self.rank == 0
        self.n_groups = 1
        self.step_examples = 0

    def gather(self, arrays: list) -> list | None:
        """Every member's ``arrays`` at the leader. Collective over the group.

        Parameters
        ----------
        arrays : list of ndarray
            C-contiguous arrays, as many and of the same dtypes on every member (their
            lengths may differ).

        Returns
        -------
        list of list of ndarray or None
            On the leader, ``out[m][i]``: member ``m``'s ``arrays[i]``, 1-D, of its dtype
            (views into one receive buffer); None on the other members.
        """
        lens = np.array([a.nbytes for a in arrays], dtype=np.int64)
        table = np.empty((self.size, lens.size), dtype=np.int64) if self.leader else None
        self.comm.Gather(lens, table, root=0)
        send = (np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                                for a in arrays]) if arrays else np.empty(0, dtype=np.uint8))
        if not self.leader:
            self.comm.Gatherv(send, None, root=0)
            return None
        counts = table.sum(axis=1)
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        self.comm.Gatherv(send, [recv, counts, _displs(counts), MPI.BYTE], root=0)
        out, pos = [], 0
        for m in range(self.size):
            mine = []
            for i, a in enumerate(arrays):
                n = int(table[m, i])
                mine.append(recv[pos:pos + n].view(a.dtype))
                pos += n
            out.append(mine)
        return out

    def scatter(self, parts: list | None, outs: list) -> None:
        """Member ``m`` gets ``parts[m]`` (the leader's) into its ``outs``. Collective over
        the group.

        Parameters
        ----------
        parts : list of list of ndarray or None
            The leader's: for each member, its arrays in the order of its ``outs``, of their
            dtypes and sizes (None on the other members).
        outs : list of ndarray
            This member's C-contiguous receive arrays (their sizes known to it).

        The parts must have the sizes of the members' ``outs`` (the leader built them from
        the keys the members gathered); MPI raises on a longer one.
        """
        recv = np.empty(sum(o.nbytes for o in outs), dtype=np.uint8)
        if self.leader:
            bufs = [np.concatenate([np.ascontiguousarray(p).reshape(-1).view(np.uint8)
                                    for p in ps]) if ps else np.empty(0, dtype=np.uint8)
                    for ps in parts]
            counts = np.array([b.size for b in bufs], dtype=np.int64)
            send = np.concatenate(bufs) if bufs else np.empty(0, dtype=np.uint8)
            self.comm.Scatterv([send, counts, _displs(counts), MPI.BYTE], recv, root=0)
        else:
            self.comm.Scatterv(None, recv, root=0)
        pos = 0
        for o in outs:
            o.reshape(-1).view(np.uint8)[:] = recv[pos:pos + o.nbytes]
            pos += o.nbytes

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
    0: a node's workers). Collective over every rank of ``roles.ps`` (servers take part to
    learn the leaders).

    Parameters
    ----------
    roles : hpcps.comm.core.Roles
    group_workers : int
        Largest group, >= 0 (0: no limit).

    Returns
    -------
    (StepGroup or None, list of int)
        This worker's group (None on a server) and the ``ps`` ranks of every group's leader,
        in worker order: the workers the servers serve.
    """
    ps = roles.ps
    leaders = np.zeros(ps.Get_size(), dtype=np.int64)
    group = None
    if roles.role != core.SERVER:
        wc = roles.role_comm
        node = wc.Split_type(MPI.COMM_TYPE_SHARED, key=wc.Get_rank())
        r = node.Get_rank()
        color = r // group_workers if group_workers > 0 else 0
        comm = node.Split(color, key=r)
        node.Free()
        group = StepGroup(comm)
        leaders[ps.Get_rank()] = int(group.leader)
    flags = np.empty_like(leaders)
    ps.Allreduce(leaders, flags, op=MPI.MAX)
    mine = set(np.flatnonzero(flags).tolist())
    leader_ranks = [r for r in roles.worker_ranks if r in mine]
    if group is not None:
        group.n_groups = len(leader_ranks)
    return group, leader_ranks
