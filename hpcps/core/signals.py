"""Stop requests by signal (no MPI): SIGTERM and SIGUSR1 ask the job to checkpoint and exit.

Slurm sends SIGTERM before killing a job at its time limit or on preemption, and
``sbatch --signal=B:USR1@120`` sends SIGUSR1 a chosen time before. A handler only sets a flag;
the workers look at it after every step and agree (one Allreduce), so that a signal that
reached any worker is acted on by all of them within one step: one checkpoint is written and
the job exits with :data:`EXIT_REQUEUE`, which the batch script turns into a requeue.
"""

from __future__ import annotations

import signal

#: Exit status of a job stopped by a signal after writing its checkpoint (``EX_TEMPFAIL``).
EXIT_REQUEUE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records whether a stop signal arrived. Install once per process.

    Attributes
    ----------
    signum : int or None
        The first stop signal received, or None.
    """

    def __init__(self):
        self.signum = None
        self._old = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self, ignore_sigterm: bool = False) -> "StopRequest":
        """Set the handlers for :data:`STOP_SIGNALS` (main thread only).

        ``ignore_sigterm``: SIGTERM is ignored instead, and only SIGUSR1 asks for a stop. For
        an added worker (``hpcps join``): when one process of a spawned job dies, Open MPI 5's
        runtime (PRRTE) ends the job's other processes with SIGCONT, SIGTERM and then SIGKILL.
        Taken as a stop request, that SIGTERM would stop the whole job in continue mode, where
        it should go on without the lost workers. A user's or Slurm's SIGTERM reaches the
        launch's ranks too (``hpcps run`` sends them SIGUSR1), and they pass the stop on to
        the added workers after the step.
        """
        for s in STOP_SIGNALS:
            if s == signal.SIGTERM and ignore_sigterm:
                self._old[s] = signal.signal(s, signal.SIG_IGN)
            else:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def restore(self) -> None:
        """Put back the previous handlers."""
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def _handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
