"""A parameter server and its client inside one MPI launch, for the communication benchmarks.

Builds the real parts — :func:`hpcps.comm.core.split_roles`, a
:class:`hpcps.server.server.ParameterServer` with its :class:`ServerEndpoint`, a
:class:`hpcps.worker.client.PSClient` with its :class:`WorkerEndpoint`, optionally the RMA
windows of :mod:`hpcps.comm.rma` — over two tables:

* ``dense``: ``DENSE_DIM`` float32 values per row (1 KiB rows), key order kept, so a block of
  consecutive keys is one contiguous block of the server's memory;
* ``sparse``: dim 1 float32 rows, permuted key space (the Adult model's weight table).

The servers run under BSP and are never clocked, so pushes are received, validated and queued
(the optimizer's work happens at the clock and is measured by ``bench_kernels.py``); the
bench clears the queue between timed blocks. Blocks alternate between hpcps and the raw MPI
calls they are compared with; a separate control communicator separates the blocks.

Every function here is collective over the launch's world communicator unless it says
otherwise (the bench scripts run the same schedule on every rank).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import benchlib

benchlib.ensure_importable()

from hpcps.comm.core import DEFAULT_MAX_MESSAGE_BYTES, split_roles  # noqa: E402
from hpcps.comm.rma import allocate_windows, free_windows  # noqa: E402
from hpcps.comm.membership import Membership  # noqa: E402
from hpcps.comm.transport import ServerEndpoint  # noqa: E402
from hpcps.core.consistency import BSP, header_len  # noqa: E402
from hpcps.core.optim import Optimizer  # noqa: E402
from hpcps.server.server import ParameterServer, window_sizes  # noqa: E402
from hpcps.core.tables import TableSpec  # noqa: E402
from hpcps.worker.client import PSClient  # noqa: E402

DENSE_DIM = 256


class Bench:
    """The PS job of a benchmark: roles, server or client, and a control communicator.

    Parameters
    ----------
    comm : MPI.Intracomm
        The launch's world; the last ``n_servers`` ranks serve.
    dense_rows, sparse_keys : int
        Table sizes.
    rma : bool
        Also allocate the RMA windows (pulls of the client then go through them).
    """

    def __init__(self, comm, dense_rows: int, sparse_keys: int, rma: bool = False,
                 n_servers: int = 1):
        self.world = comm
        self.ctl = comm.Dup()
        self.roles = split_roles(comm, n_servers)
        self.specs = [TableSpec("dense", dense_rows, DENSE_DIM, "float32", sparse=False),
                      TableSpec("sparse", sparse_keys, 1, "float32", sparse=True)]
        tables = [(s, Optimizer("sgd", 0.1)) for s in self.specs]
        self.policy = BSP()
        r = self.roles
        self.windows = []
        if rma:
            sizes = (window_sizes(self.specs, r.index, r.n_servers, r.n_workers)
                     if r.role == "server" else [0] * len(self.specs))
            self.windows = allocate_windows(r.ps, sizes)
        self.server = self.client = None
        if r.role == "server":
            ep = ServerEndpoint(r.ps, DEFAULT_MAX_MESSAGE_BYTES)
            self.server = ParameterServer.initial(ep, r.index, r.n_servers, r.worker_ranks,
                                                  tables, self.policy, windows=self.windows)
            for sh in self.server.shards:   # non-zero rows (a pull of zeros proves nothing)
                sh.w[...] = np.arange(sh.w.size, dtype=np.float32).reshape(sh.w.shape) % 97
        else:
            self.client = PSClient(Membership(r, self.windows, specs=self.specs), self.policy,
                                   DEFAULT_MAX_MESSAGE_BYTES)
        self.header_len = header_len(r.n_workers)
        if self.windows:
            r.ps.Barrier()

    @property
    def is_server(self) -> bool:
        return self.roles.role == "server"

    def serve_block(self) -> None:
        """Server side of one hpcps block: serve until every worker sent STOP, then drop
        the queued (never clocked) pushes, their buffers back in the server's pool as after
        a clock's update."""
        self.server.stopped.clear()
        self.server.serve()
        self.server.discard_pending()

    def end_block(self) -> None:
        """Worker side: end an hpcps block (STOP to every server; not timed)."""
        self.client.stop()

    def close(self) -> None:
        free_windows(self.windows)
        self.roles.free()
        self.ctl.Free()


def inner_count(nbytes: int, quick: bool, target: float = 16e6, lo: int = 3, hi: int = 200) -> int:
    """Operations per timed block: enough to move about ``target`` bytes (at least ``lo``)."""
    if quick:
        return 2
    return int(max(lo, min(hi, target // max(1, nbytes))))


def fmt_bytes(n: float) -> str:
    """``8 KiB``, ``64 MiB``, ... (binary units)."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n:g} B"


MPI_INT64 = MPI.INT64_T
