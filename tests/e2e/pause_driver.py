"""Run a job like ``hpcps train`` does, but make every worker wait at one clock until a file
appears (a test harness, launched under ``mpirun --with-ft ulfm``).

    python tests/e2e/pause_driver.py JOB CLOCK FLAG

Each worker, at clock ``CLOCK`` (after computing that step's gradient, before pushing it:
:func:`hpcps.job.run_job`'s ``step_hook``), creates ``FLAG.<worker>`` and waits until ``FLAG``
exists. Under BSP every range has then applied exactly ``CLOCK`` steps, so a test that kills a
server while the workers wait knows the step of the kill exactly.
"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpcps.comm.core import abort_on_error, world  # noqa: E402
from hpcps.config import load_job  # noqa: E402
from hpcps.job import run_job  # noqa: E402


def main() -> None:
    job, clock, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    paused = set()

    def hook(worker, c):
        if c == clock and worker not in paused:
            paused.add(worker)
            Path(f"{flag}.{worker}").touch()
            while not os.path.exists(flag):
                time.sleep(0.02)

    comm = world()
    with abort_on_error(comm):
        res = run_job(load_job(job), comm, resume="never", step_hook=hook)
    sys.stdout.flush()
    sys.stderr.flush()
    if res and res.get("skip_finalize"):   # as hpcps train: see hpcps.cli.cmd_train
        os._exit(0)


if __name__ == "__main__":
    main()
