"""Driver of tests/e2e/test_rma_progress.py: 1 server + 1 worker (``mpirun -n 2``), RMA pulls,
a dense table of N keys; each step the worker pushes ones for every key (deferred, sent with
the clock) and then reads the table through the window. Prints ``step T: V`` (the value read)
per step and ``done``. Usage: ``rma_push_driver.py N MAX_MESSAGE_BYTES``."""

import sys

import numpy as np
from mpi4py import MPI

from hpcps.comm import core
from hpcps.comm.membership import Membership
from hpcps.comm.rma import allocate_windows, free_windows
from hpcps.comm.transport import ServerEndpoint
from hpcps.core.consistency import BSP
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec
from hpcps.server.server import ParameterServer, window_sizes
from hpcps.worker.client import PSClient


def main(n: int, max_bytes: int) -> None:
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", n, 1, "float32", sparse=False)
    tables = [(spec, Optimizer("sgd", 1.0))]
    roles = core.split_roles(comm, 1)
    sizes = (window_sizes([spec], roles.index, 1, roles.n_workers)
             if roles.role == core.SERVER else [0])
    windows = allocate_windows(roles.ps, sizes)
    with core.abort_on_error(comm):
        if roles.role == core.SERVER:
            server = ParameterServer.initial(ServerEndpoint(roles.ps, max_bytes), roles.index, 1,
                                             roles.worker_ranks, tables, BSP(), windows=windows)
            roles.ps.Barrier()
            server.serve()
        else:
            client = PSClient(Membership(roles, windows, specs=[spec]), BSP(), max_bytes)
            roles.ps.Barrier()
            for t in range(3):
                client.push("w", np.arange(n), np.ones((n, 1), np.float32), defer=True)
                client.clock(1)
                w = client.pull("w", np.arange(0, n, 97))
                print(f"step {t}: {sorted(set(w.ravel().tolist()))}", flush=True)
            client.stop()
            print("done", flush=True)
    comm.Barrier()
    free_windows(windows)
    roles.free()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
