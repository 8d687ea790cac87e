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

    def install(self) -> "StopRequest":
        """Set the handlers for :data:`STOP_SIGNALS` (main thread only)."""
        for s in STOP_SIGNALS:
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
