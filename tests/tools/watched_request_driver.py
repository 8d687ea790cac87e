"""A worker waiting inside the compiled request path (:meth:`hpcps.comm.worker_endpoint.
WorkerEndpoint.request`) in continue mode when its server dies: the wait must notice the
failure and raise it as a peer failure within seconds, and the endpoint must not reuse the
buffers MPI may still hold. A test harness, launched on 2 ranks under
``mpirun --with-ft ulfm``:

    python tests/tools/watched_request_driver.py

Rank 0 (the "server") receives one PULL request and kills itself without replying; rank 1
(the worker) makes the request and prints one line:
``FAILED <peer failure> <seconds> <new buffers> <orphans>`` (or ``NO-FAILURE``).
"""

import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hpcps.comm import core, ft  # noqa: E402
from hpcps.comm.protocol import PULL, TAG_REQ  # noqa: E402
from hpcps.comm.worker_endpoint import WorkerEndpoint  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    ft.errors_return(comm)
    ft.watch(comm)
    if comm.Get_rank() == 0:
        st = MPI.Status()
        comm.Probe(source=1, tag=TAG_REQ, status=st)
        buf = np.empty(st.Get_count(MPI.BYTE), dtype=np.uint8)
        comm.Recv(buf, source=1, tag=TAG_REQ)
        os.kill(os.getpid(), signal.SIGKILL)
    ep = WorkerEndpoint(comm, [0], 1 << 30)
    keys = np.arange(8, dtype=np.int64)
    rows = np.empty((8, 4), dtype=np.float32)
    header = np.empty(4, dtype=np.int64)
    fmt = memoryview(rows).format.encode()
    recv_buf, send_buf = ep._recv_buf, ep._send_buf
    t0 = time.perf_counter()
    try:
        done = ep.request(0, PULL, 0, 0, 0, 0, 0, 0, keys, 100, fmt, 4, rows=rows, header=header)
        print(f"NO-FAILURE {done}", flush=True)
    except MPI.Exception as e:
        print(f"FAILED {ft.is_peer_failure(e)} {time.perf_counter() - t0:.3f} "
              f"{ep._recv_buf is not recv_buf and ep._send_buf is not send_buf} "
              f"{len(core.ORPHANS)}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
