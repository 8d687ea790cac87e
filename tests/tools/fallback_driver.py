"""Run a job as ``hpcps train`` does, but judge RMA progress as if the library were MPICH
without ``MPIR_CVAR_ASYNC_PROGRESS`` (a test harness for the RMA fallback on Open MPI).

    mpirun -n N python tests/tools/fallback_driver.py JOB

With ``[consistency] pull = "rma"`` and ``rma_fallback = true`` the job then pulls by messages
(p2p): :func:`hpcps.runtime.preflight.check_rma_progress` returns that run-time decision. Workers
the job adds (``[elastic] add_workers``) run the real ``hpcps join``, which must take the
running job's pull mode from the join plan, not from the job file.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpcps.runtime import preflight  # noqa: E402
from tests.tools.train_driver import train  # noqa: E402

MPICH = "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\n"


def main() -> None:
    preflight.library_version = lambda: MPICH
    os.environ.pop("MPIR_CVAR_ASYNC_PROGRESS", None)
    train(sys.argv[1], resume="never")


if __name__ == "__main__":
    main()
