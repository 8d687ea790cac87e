"""Run a continue-mode job like ``hpcps train`` does, with one rank lost after the last step:
world rank ``RANK`` kills itself (``SIGKILL``) where it enters ``WHERE``. A test harness,
launched under ``mpirun --with-ft ulfm``:

    python tests/tools/end_loss_driver.py JOB WHERE RANK

``WHERE``: ``finish`` — a worker entering :meth:`hpcps.worker.trainer.Trainer.finish` (every
worker finished the last epoch: the survivors are writing the final checkpoint or adding up
the totals); ``report`` — any rank entering the gathering of the job's report
(:func:`hpcps.runtime.job._report`: the workers have sent STOP, the servers left their loop).
"""

import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpcps.comm.core import world  # noqa: E402
from hpcps.runtime import job as job_module  # noqa: E402
from hpcps.worker.trainer import Trainer  # noqa: E402
from tests.tools.train_driver import train  # noqa: E402


def main() -> None:
    job, where, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if where not in ("finish", "report"):
        raise SystemExit(f"end_loss_driver: WHERE is 'finish' or 'report', not {where!r}")
    if world().Get_rank() == rank:
        def die(original):
            def wrapped(*args, **kw):
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
                return original(*args, **kw)
            return wrapped

        if where == "finish":
            Trainer.finish = die(Trainer.finish)
        else:
            job_module._report = die(job_module._report)
    train(job, resume="never")


if __name__ == "__main__":
    main()
