"""What the test drivers in this folder share: run a job on the world communicator as
``hpcps train`` does (an error aborts every rank; ``skip_finalize`` ends the process without
``MPI_Finalize``, see :func:`hpcps.cli.main.cmd_train`)."""

import os
import sys

from hpcps.comm.core import abort_on_error, world
from hpcps.config import load_job
from hpcps.runtime.job import run_job


def train(job: str, **kw) -> None:
    """Run job file ``job`` (``kw``: :func:`hpcps.runtime.job.run_job`'s keywords). Collective
    over the world communicator."""
    comm = world()
    with abort_on_error(comm, notify=True):
        res = run_job(load_job(job), comm, **kw)
    sys.stdout.flush()
    sys.stderr.flush()
    if res and res.get("skip_finalize"):
        os._exit(0)
