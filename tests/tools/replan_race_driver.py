"""Run a continue-mode job like ``hpcps train`` does, with two kills at known places, so that a
second failure reaches the survivors of a first one at *different* places: some inside the
steps of the re-planned segment, one still inside its re-plan
(:func:`hpcps.resilience.supervisor.regroup`). A test harness, launched under
``mpirun --with-ft ulfm``:

    python tests/tools/replan_race_driver.py JOB CLOCK WORKER FLAG

1. Every worker waits at clock ``CLOCK`` (after that step's gradient, before its push) until
   ``FLAG`` exists, having created ``FLAG.<worker>`` (the test kills a worker meanwhile).
2. After the survivors' re-plan, the survivor whose index is ``WORKER`` (in the new numbering)
   creates ``FLAG-regroup.<WORKER>`` and waits there until ``FLAG-regroup`` exists; the
   others go on and take the segment's first step. The test kills another worker meanwhile.
3. It then waits (watched, as every wait of a continue-mode rank) until MPI reports that
   failure to it, which raises inside the re-plan.

Step 3 is where that survivor notices the real failure; in a run without the pause it notices
it there by chance when its re-plan's last collective completed on the others but not on it
(the clean-clone CI failure of 5c893d3: 10 examples of an epoch applied twice).
"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mpi4py import MPI  # noqa: E402

from hpcps.comm import core  # noqa: E402
from hpcps.resilience import supervisor  # noqa: E402
from tests.tools.train_driver import train  # noqa: E402


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.02)


def main() -> None:
    job, clock, worker, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    paused = []

    def hook(w, c):
        if c == clock and not paused:
            paused.append(c)
            Path(f"{flag}.{w}").touch()
            wait_for(flag)

    regroup = supervisor.regroup

    def paused_regroup(tr, *args, **kw):
        seg = regroup(tr, *args, **kw)
        if paused and len(paused) == 1 and tr.index == worker:
            paused.append("regroup")
            Path(f"{flag}-regroup.{worker}").touch()
            wait_for(f"{flag}-regroup")
            deadline = time.time() + 60
            while time.time() < deadline:       # raises once MPI reports the failure here
                core.WATCH[0].Iprobe(source=MPI.ANY_SOURCE, tag=core.WATCH_TAG)
                time.sleep(0.01)
            raise RuntimeError("no failure reported within 60 s of the second kill")
        return seg

    supervisor.regroup = paused_regroup
    train(job, resume="never", step_hook=hook)


if __name__ == "__main__":
    main()
