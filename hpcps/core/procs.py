"""Processes of this host: whether one is a live hpcps process (run-directory records name
their writer's pid); a deadline after which this process ends itself; the mark a rank leaves
for ``hpcps run`` when it aborts the job, and the processes of a session. No MPI."""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
from pathlib import Path

__all__ = ["ABORT_MARK_ENV", "Deadline", "exit_after", "hpcps_alive", "kill_session",
           "libc_prctl", "mark_abort", "read_abort_mark", "session_pids", "set_timer_slack"]

#: Environment variable naming the file a rank writes when it aborts the job (``hpcps run``
#: sets it for its mpirun, :func:`hpcps.runtime.launch.run`).
ABORT_MARK_ENV = "HPCPS_ABORT_MARK"


PR_SET_TIMERSLACK = 29


def libc_prctl():
    """``prctl`` of the C library (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def set_timer_slack(ns: int) -> bool:
    """Set the timer slack of the calling thread to ``ns`` nanoseconds (Linux
    ``PR_SET_TIMERSLACK``; threads it starts afterwards inherit it): how much later than asked
    the kernel may end its sleeps (default 50,000 ns, so a 2 us ``nanosleep`` lasts ~55 us).
    Returns whether it was set (False elsewhere than Linux). Local."""
    prctl = libc_prctl()
    return prctl is not None and prctl(PR_SET_TIMERSLACK, int(ns), 0, 0, 0) == 0


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


def mark_abort(code: int, environ=None) -> None:
    """Write ``code`` to the file named by :data:`ABORT_MARK_ENV`, if set: this rank is about
    to abort the job with that status. Local; best effort (never raises)."""
    env = os.environ if environ is None else environ
    path = env.get(ABORT_MARK_ENV)
    if not path:
        return
    try:
        Path(path).write_text(f"{int(code)}\n")
    except (OSError, ValueError, TypeError):
        pass


def read_abort_mark(path) -> int | None:
    """The status a rank wrote with :func:`mark_abort` to ``path`` (1 if unreadable), or None
    when no rank aborted. Local."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    except OSError:
        return 1
    return int(text) if text.isdigit() else 1


def session_pids(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` on this host (Linux ``/proc``; empty
    elsewhere). Local."""
    pids = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return pids
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                       # gone meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def kill_session(sid: int) -> list[int]:
    """SIGKILL every process of session ``sid`` on this host (mpirun started in a session of
    its own, its ranks and the processes they spawned); returns their pids. Local."""
    pids = session_pids(sid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids
