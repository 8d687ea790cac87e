"""Exit statuses of an hpcps job, and which of them a restart can help. No MPI.

A batch script or ``hpcps run --max-restarts N`` relaunches a job that failed in a way a
relaunch can cure (a lost rank, a node failure, a stop signal) and must not relaunch one that
would fail again in the same way (bad job file, bad data, a diverged run, a full disk): each
relaunch would cost a queue wait and a start-up for nothing. The statuses follow the BSD
``sysexits.h`` meanings where one fits.

=====  ===================  ==================================================  ==========
code   name                 meaning                                             restart?
=====  ===================  ==================================================  ==========
0      ``EXIT_OK``          finished                                            no
1      ``EXIT_FAILED``      a rank died or an unexpected error                  yes
2      ``EXIT_USAGE``       job file, launch, resume or memory-fit error        no
65     ``EXIT_DATA``        bad training data or non-finite values (diverged)   no
74     ``EXIT_IO``          a checkpoint or output file could not be written    no
75     ``EXIT_REQUEUE``     stopped by a signal after a checkpoint              yes
=====  ===================  ==================================================  ==========

The same table is in ``docs/troubleshooting.md`` ("Exit status") and in ``slurm/common.sh``.
"""

from __future__ import annotations

from hpcps.core.signals import EXIT_REQUEUE

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATA = 65          # EX_DATAERR
EXIT_IO = 74            # EX_IOERR

#: Exception class names (anywhere in the class's MRO) -> exit status. By name, so that this
#: module imports nothing heavy; the first match in this order wins (ResumeError is a
#: CheckpointError but an error of usage, not of I/O).
_BY_NAME = (
    ("ConfigError", EXIT_USAGE), ("LaunchError", EXIT_USAGE), ("ResumeError", EXIT_USAGE),
    ("ResourceError", EXIT_USAGE), ("ModelLoadError", EXIT_USAGE),
    ("DataError", EXIT_DATA), ("NonFiniteError", EXIT_DATA),
    ("CheckpointError", EXIT_IO), ("OutputError", EXIT_IO),
)

#: Statuses after which relaunching cannot help.
FINAL = frozenset({EXIT_OK, EXIT_USAGE, EXIT_DATA, EXIT_IO})
#: Statuses of an error of the input (job file, resume, data, a file that cannot be written):
#: the rank that finds one tells every other rank before it aborts the job
#: (:mod:`hpcps.comm.notices`); not ``EXIT_FAILED`` (a bug, a lost peer) nor a stop signal.
INPUT_ERRORS = frozenset({EXIT_USAGE, EXIT_DATA, EXIT_IO})


def status_for(exc: BaseException) -> int:
    """The exit status a job ends with when ``exc`` escapes on some rank.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    int
        One of the codes in the module table; :data:`EXIT_FAILED` for anything unexpected
        (a bug, or an MPI error from a lost peer), which a restart may cure.
    """
    names = {c.__name__ for c in type(exc).__mro__}
    for name, code in _BY_NAME:
        if name in names:
            return code
    return EXIT_FAILED


def restartable(status: int) -> bool:
    """Whether relaunching a job that exited with ``status`` can help (1, 75, signals, ...)."""
    return status not in FINAL


def describe(status: int) -> str:
    """One line for a launcher's log: what ``status`` means."""
    return {
        EXIT_OK: "finished",
        EXIT_FAILED: "a rank died or failed unexpectedly",
        EXIT_USAGE: "job-file, launch or resume error",
        EXIT_DATA: "bad training data or non-finite values",
        EXIT_IO: "a checkpoint or output file could not be written",
        EXIT_REQUEUE: "stopped by a signal after a checkpoint",
    }.get(status, _signal_status(status))


def _signal_status(status: int) -> str:
    """``128 + N`` (a shell's way to report a process killed by signal N) named, else the
    bare number."""
    import signal

    if 128 < status < 128 + 65:
        try:
            return f"a process was killed by signal {status - 128} ({signal.Signals(status - 128).name})"
        except ValueError:
            pass
    return f"exit status {status}"
