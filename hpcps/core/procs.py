"""Processes of this host: whether one is a live hpcps process (run-directory records name
their writer's pid); a deadline after which this process ends itself. No MPI."""

from __future__ import annotations

import faulthandler
import os
import socket
import threading
from pathlib import Path

__all__ = ["Deadline", "exit_after", "hpcps_alive"]


def hpcps_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host and is an hpcps process (unknown: True)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return b"hpcps" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


#: Seconds after a deadline of :func:`exit_after` at which the backstop ends the process.
BACKSTOP_SECONDS = 2.0


class Deadline:
    """The timers of :func:`exit_after`; :meth:`cancel` stops both."""

    def __init__(self, timer: threading.Timer):
        self.timer = timer

    def cancel(self) -> None:
        """Stop the deadline (the process goes on). Local."""
        self.timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def exit_after(seconds: float, why: str, code: int = 1) -> Deadline:
    """End this process unless the returned :class:`Deadline` is cancelled within ``seconds``.
    Local; no MPI.

    At ``seconds`` a daemon thread writes ``hpcps: <host> pid <pid>: <why>`` to stderr and
    ends the process with status ``code`` (``os._exit``: no clean-up, no MPI call). That thread
    needs the GIL, which mpi4py holds during ``MPI_Init``; so ``BACKSTOP_SECONDS`` later
    :func:`faulthandler.dump_traceback_later` (a C thread, no GIL) writes every thread's stack
    to stderr and ends the process with status 1. One deadline per process (the backstop is
    faulthandler's only timer).

    For a process that may wait forever inside MPI where ``MPI_Abort`` is no help: an added
    worker (``hpcps join``) still in ``MPI_Init`` or in the handshake with a job that was
    aborted meanwhile (Open MPI 5 under ULFM: the abort of the job that spawned it does not end
    it, and its ``mpirun`` waits for it; issue 22.1).
    """
    def fire():
        try:
            os.write(2, f"hpcps: {socket.gethostname()} pid {os.getpid()}: {why}\n".encode())
        finally:
            os._exit(code)

    timer = threading.Timer(float(seconds), fire)
    timer.daemon = True
    faulthandler.dump_traceback_later(float(seconds) + BACKSTOP_SECONDS, exit=True)
    timer.start()
    return Deadline(timer)
