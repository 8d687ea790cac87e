"""Run a job like ``hpcps train`` does, but make every worker wait at one clock until a file
appears (a test harness, launched under ``mpirun --with-ft ulfm``).

    python tests/tools/pause_driver.py JOB CLOCK[,CLOCK...] FLAG

Each worker, at each clock ``CLOCK`` (after computing that step's gradient, before pushing it:
:func:`hpcps.runtime.job.run_job`'s ``step_hook``), creates ``FLAG.<worker>`` and waits until ``FLAG``
exists (for the second and later clocks ``FLAG-<clock>.<worker>`` and ``FLAG-<clock>``). Under BSP every range has then applied exactly ``CLOCK`` steps, so a test that kills a
server while the workers wait knows the step of the kill exactly.
"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.tools.train_driver import train  # noqa: E402


def main() -> None:
    job, flag = sys.argv[1], sys.argv[3]
    clocks = [int(c) for c in sys.argv[2].split(",")]
    paused = set()

    def hook(worker, c):
        if c in clocks and c not in paused:
            paused.add(c)
            name = flag if c == clocks[0] else f"{flag}-{c}"
            Path(f"{name}.{worker}").touch()
            while not os.path.exists(name):
                time.sleep(0.02)

    train(job, resume="never", step_hook=hook)


if __name__ == "__main__":
    main()
