"""Minimal reproducer (mpi4py only, no hpcps): in Open MPI 5.0.x with ULFM, revoking a
communicator while point-to-point messages are in flight on it aborts the sender.

    mpirun --with-ft ulfm -n 6 python tests/tools/ulfm_revoke_repro.py revoke     # aborts
    mpirun --with-ft ulfm -n 6 python tests/tools/ulfm_revoke_repro.py norevoke   # "done" x5

Ranks 0-2 ("workers") send 1.2 KB to ranks 3 and 5 and wait for a one-double reply from 3, 4
and 5; rank 4 is SIGKILLed first; ranks 3 and 5 ("servers") answer in an ``Iprobe`` loop,
which raises once rank 4 is dead. Then every survivor either revokes the communicator and
shrinks it (``revoke``) or only shrinks it (``norevoke``).

Measured here (Open MPI 5.0.11 wheel, mpi4py 4.1.2, 2 cores): ``revoke`` aborted in 3-4 of 4
runs (4 of 4 in the last check) with ``An error occurred in Send error after request freed ... on a NULL communicator
... MPI_ERRORS_ARE_FATAL`` (stack: ``MPIX_Comm_shrink`` -> ``mca_coll_ftagree_era_intra`` ->
``opal_progress`` -> ``mca_btl_sm_poll_handle_frag`` -> ob1 send completion ->
``ompi_mpi_errors_are_fatal_comm_handler``); with 8-byte messages (fast-box path) and with
``norevoke`` it never did (0 of 6 each; ``btl=self,tcp`` aborts too). A worker's eager send
completes, and its request is freed, before its fragment comes back; the revoke marks the
pending send with an error, and an error on a freed request is fatal. This is why hpcps's
continue mode never revokes (:mod:`hpcps.comm.ft`).
"""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    revoke = sys.argv[1:] == ["revoke"]
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank = comm.Get_rank()
    if rank == 4:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    pending = []
    try:
        if rank < 3:
            time.sleep(1.0)
            data = np.ones(150)                                   # 1.2 KB: eager, not fast-box
            replies = [np.zeros(1) for _ in range(3)]
            reqs = [comm.Isend(data, dest=s, tag=12) for s in (3, 5)]
            reqs += [comm.Irecv(b, source=s, tag=14) for s, b in zip((3, 4, 5), replies)]
            pending = [data, replies, reqs]
            MPI.Request.Waitall(reqs)                             # raises: rank 4 is dead
        else:
            status = MPI.Status()
            while True:
                if comm.Iprobe(source=MPI.ANY_SOURCE, tag=12, status=status):
                    src = status.Get_source()
                    buf = np.empty(status.Get_count(MPI.DOUBLE))
                    comm.Recv(buf, source=src, tag=12)
                    comm.Isend(np.ones(1), dest=src, tag=14).Wait()
    except MPI.Exception:
        pass
    if revoke:
        comm.Revoke()
    survivors = comm.Shrink()
    survivors.Barrier()
    print(rank, "done", flush=True)
    del pending
    os._exit(0)             # MPI_Finalize can wait for the dead rank (open-mpi/ompi#11404)


if __name__ == "__main__":
    main()
