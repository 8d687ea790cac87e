"""MPI layer of Sandblaster L-BFGS (Dean et al., NIPS 2012, §4.2): roles and message protocol.

The algorithm lives in :mod:`hpcps.sandblaster`; this module only moves buffers. Every call
is a buffer call (``Ibcast``, ``Ireduce``, ``Igather``, ``Isend``/``Irecv``) on numpy arrays
whose MPI datatype follows the numpy dtype; nothing is pickled.

Roles
-----
World rank 0 is the **coordinator**; the last ``n_servers`` ranks are the **servers**; the
ranks in between are the **workers** (at least one). This differs from the parameter-server
mode (:func:`hpcps.comm.core.role_map`, where rank 0 is worker 0) because Sandblaster's
coordinator is a process of its own: it holds the L-BFGS history as scalars, hands out work
units and is the only rank that writes outputs. Server ``s`` (0-based, in rank order) holds
the same key range of the weights as server ``s`` of the parameter-server mode
(:class:`hpcps.core.tables.KeyPartition`).

Communicators (:class:`SandblasterRoles`)
    ``p2p``  a duplicate of the world for point-to-point traffic (work units, parameters,
             gradients, the final model);
    ``cs``   coordinator + servers (coordinator = rank 0): programs (``Ibcast``) and their
             results (``Ireduce``);
    ``cw``   coordinator + workers (coordinator = rank 0): commands (``Ibcast``) and the
             workers' statistics after each evaluation (``Igather``).

Messages
--------
========================== ========================= ======================================
what                       from → to                 how
========================== ========================= ======================================
program                    coordinator → servers     ``Ibcast`` on ``cs``: int64
                                                     ``[n, op₀, a₀, b₀, c₀, op₁, ...]``
                                                     (``1 + 4 * MAX_OPS``) and float64
                                                     scalars (``MAX_OPS``)
program results            servers → coordinator     ``Ireduce(SUM)`` of float64 partial sums,
                                                     then ``Ireduce(MAX)`` of float64 maxima
                                                     (each only if the program has any)
worker command             coordinator → workers     ``Ibcast`` on ``cw``: int64 ``[cmd, id]``
parameters                 every server → worker     ``Isend`` of the weight slice
                                                     (``TAG_PARAMS``) and, from the bias
                                                     server, the bias (``TAG_PARAMS_BIAS``)
work-unit request          worker → coordinator      ``Isend`` int64 ``[eval id, done unit]``
                                                     (``TAG_UNIT_REQ``)
work unit                  coordinator → worker      ``Isend`` int64 ``[unit]``, -1 = none left
                                                     (``TAG_UNIT``)
gradient sums              worker → every server     ``Isend`` of the slice (``TAG_GRAD``) and
                                                     the bias gradient (``TAG_GRAD_BIAS``)
worker statistics          workers → coordinator     ``Igather`` on ``cw`` of a float64 row
final shard                server → coordinator      ``Isend`` (``TAG_SHARD``,
                                                     ``TAG_SHARD_BIAS``)
active keys (setup)        worker 0 → coordinator    ``Isend`` int64 size, then the sorted
                                                     positions (``TAG_ACTIVE*``)
shard bounds (setup)       coordinator → servers     ``Ibcast`` on ``cs``: int64 (K + 1,)
========================== ========================= ======================================

The three ends of the protocol (:class:`~hpcps.comm.sandblaster_links.CoordinatorLink`,
:class:`~hpcps.comm.sandblaster_links.ServerLink`, :class:`~hpcps.comm.sandblaster_links.WorkerLink`)
are in :mod:`hpcps.comm.sandblaster_links`.

Arrays over ``max_message_bytes`` are split (:func:`hpcps.comm.core.chunk_slices`).

Waiting
-------
Every exchange is made of non-blocking calls completed by :func:`wait_all`: ``Test`` in a
loop with short sleeps growing from 2 µs to 200 µs (as the parameter server's loop does),
because most ranks are idle most of the time (workers while the coordinator and the servers
run the two-loop recursion, servers while the workers compute) and an MPI's blocking wait
spins, which on an oversubscribed node takes the CPU from the ranks that have work. The
collectives are therefore the non-blocking ones (``Ibcast``, ``Ireduce``, ``Igather``) on every
rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcps.comm.core import LaunchError

COORDINATOR, WORKER, SERVER = "coordinator", "worker", "server"

#: Largest number of operations in one program (:mod:`hpcps.sandblaster.program`).
MAX_OPS = 16
#: int64 entries per operation: op code and three slot indices.
OP_WIDTH = 4

#: Worker commands.
CMD_EVAL, CMD_STOP = 1, 2

TAG_UNIT_REQ, TAG_UNIT, TAG_PARAMS, TAG_PARAMS_BIAS = 41, 42, 43, 44
TAG_GRAD, TAG_GRAD_BIAS, TAG_SHARD, TAG_SHARD_BIAS = 45, 46, 47, 48
TAG_ACTIVE_SIZE, TAG_ACTIVE = 49, 50


def sandblaster_role_map(world_size: int, n_servers: int) -> list[str]:
    """Role of every world rank: coordinator (rank 0), workers, then ``n_servers`` servers.

    Parameters
    ----------
    world_size : int
        Number of MPI ranks.
    n_servers : int
        Number of server ranks (the last ranks).

    Returns
    -------
    list of str
        ``COORDINATOR``, ``WORKER`` or ``SERVER`` per world rank.

    Raises
    ------
    LaunchError
        Unless ``n_servers >= 1`` and ``world_size >= n_servers + 2`` (coordinator, at least
        one worker, the servers).
    """
    if n_servers < 1 or world_size < n_servers + 2:
        raise LaunchError(
            f"{world_size} rank(s) cannot hold a coordinator, {n_servers} server(s) and at "
            f"least one worker: need world size >= servers + 2 = {n_servers + 2}")
    return [COORDINATOR] + [WORKER] * (world_size - n_servers - 1) + [SERVER] * n_servers


@dataclass(frozen=True)
class SandblasterRoles:
    """This rank's place in a Sandblaster job after :func:`split_sandblaster`.

    Attributes
    ----------
    world : MPI.Intracomm
        The job's communicator, as passed in.
    p2p : MPI.Intracomm
        Duplicate of ``world`` for point-to-point traffic (same rank numbers).
    cs : MPI.Intracomm
        Coordinator + servers (coordinator = rank 0, then servers in index order);
        ``MPI.COMM_NULL`` on workers.
    cw : MPI.Intracomm
        Coordinator + workers (coordinator = rank 0, then workers in index order);
        ``MPI.COMM_NULL`` on servers.
    role : str
        ``COORDINATOR``, ``WORKER`` or ``SERVER``.
    index : int
        Worker index or server index (0-based); 0 on the coordinator.
    worker_ranks, server_ranks : tuple of int
        ``p2p``/world ranks of the workers and of the servers, in index order.
    """

    world: MPI.Intracomm
    p2p: MPI.Intracomm
    cs: MPI.Intracomm
    cw: MPI.Intracomm
    role: str
    index: int
    worker_ranks: tuple
    server_ranks: tuple

    @property
    def n_workers(self) -> int:
        """int : Number of workers."""
        return len(self.worker_ranks)

    @property
    def n_servers(self) -> int:
        """int : Number of servers."""
        return len(self.server_ranks)

    def free(self) -> None:
        """Free the communicators made by :func:`split_sandblaster`. Collective over
        ``world`` (every rank must call it)."""
        for c in (self.cs, self.cw, self.p2p):
            if c != MPI.COMM_NULL:
                c.Free()


def split_sandblaster(comm: MPI.Intracomm, n_servers: int) -> SandblasterRoles:
    """Split ``comm`` into coordinator, workers and servers. Collective over ``comm``.

    Every rank computes the role map locally first (so a bad ``n_servers`` raises
    :class:`LaunchError` on every rank before any communication), then duplicates ``comm``
    and splits it twice (``cs`` and ``cw``).

    Parameters
    ----------
    comm : MPI.Intracomm
        The job's communicator.
    n_servers : int
        Number of servers (the last ranks).

    Returns
    -------
    SandblasterRoles
    """
    roles = sandblaster_role_map(comm.Get_size(), n_servers)
    me = comm.Get_rank()
    role = roles[me]
    p2p = comm.Dup()
    cs = comm.Split(0 if role in (COORDINATOR, SERVER) else MPI.UNDEFINED, me)
    cw = comm.Split(0 if role in (COORDINATOR, WORKER) else MPI.UNDEFINED, me)
    workers = tuple(r for r, x in enumerate(roles) if x == WORKER)
    servers = tuple(r for r, x in enumerate(roles) if x == SERVER)
    index = workers.index(me) if role == WORKER else servers.index(me) if role == SERVER else 0
    return SandblasterRoles(world=comm, p2p=p2p, cs=cs, cw=cw, role=role, index=index,
                            worker_ranks=workers, server_ranks=servers)


@dataclass
class LinkStats:
    """Messages, payload bytes and seconds spent in MPI calls, per kind of traffic.

    Kinds: ``"setup"``, ``"program"``, ``"results"``, ``"command"``, ``"params"``,
    ``"units"``, ``"grads"``, ``"stats"``, ``"shard"``.
    """

    messages: dict = field(default_factory=dict)
    bytes_out: dict = field(default_factory=dict)
    bytes_in: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def add(self, kind: str, t0: float, *, messages: int = 1, out: int = 0, inn: int = 0) -> None:
        """Count one exchange of ``kind`` that started at ``time.perf_counter() == t0``."""
        for d, v in ((self.messages, messages), (self.bytes_out, out), (self.bytes_in, inn),
                     (self.seconds, time.perf_counter() - t0)):
            d[kind] = d.get(kind, 0) + v

    def total(self, what: str) -> float:
        """Sum of ``what`` (``"messages"``, ``"bytes_out"``, ...) over all kinds."""
        return sum(getattr(self, what).values())


#: Sleeps between ``Test`` calls while waiting: from IDLE_SLEEP_MIN, doubling to IDLE_SLEEP_MAX.
IDLE_SLEEP_MIN, IDLE_SLEEP_MAX = 2e-6, 2e-4


def wait_all(requests: list, status=None) -> None:
    """Complete ``requests`` (MPI requests), polling with ``Test`` and sleeping between polls
    (2 µs doubling to 200 µs), so that a waiting rank leaves the CPU to busy ones. Local.

    Parameters
    ----------
    requests : list of MPI.Request
        Emptied when done.
    status : MPI.Status or None
        Filled from the request when there is exactly one.
    """
    sleep = IDLE_SLEEP_MIN
    if len(requests) == 1:
        req = requests[0]
        while not req.Test(status):
            time.sleep(sleep)
            sleep = min(2 * sleep, IDLE_SLEEP_MAX)
    else:
        while not MPI.Request.Testall(requests):
            time.sleep(sleep)
            sleep = min(2 * sleep, IDLE_SLEEP_MAX)
    requests.clear()


def node_total(comm: MPI.Intracomm, value: int) -> int:
    """Sum of ``value`` over the ranks of ``comm`` on this rank's node. Collective over
    ``comm`` (``Split_type(COMM_TYPE_SHARED)``, one ``Allreduce``, ``Free``)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        out = np.zeros(1, dtype=np.int64)
        node.Allreduce(np.array([int(value)], dtype=np.int64), out, op=MPI.SUM)
        return int(out[0])
    finally:
        node.Free()
