"""Telling every rank why the job stops when one rank finds an input error.

When one rank ends with an error of the input (a malformed data line, a bad key, a dynamic
table over its ``max_keys``, a checkpoint that cannot be written: an exit status other than
:data:`hpcps.core.exitcodes.EXIT_FAILED`, :data:`hpcps.core.exitcodes.INPUT_ERRORS`), it
prints the error and aborts the job (:func:`hpcps.comm.core.abort_on_error`); without more,
the other ranks are killed by ``MPI_Abort`` without a word, and a per-rank log (``srun
--output=%t``, a Slurm array of logs) does not say why they stopped. With a
:class:`Listener` running on every rank, each of them prints one line first::

    hpcps: rank 2 on node7: stopped: rank 1 on node8 found an input error: DataError: ...

Mechanism: a message, heard by a thread
    The failing rank (the *origin*) sends a short notice (its exit status, host and the
    first line of its message) with a reserved tag to every other rank, on a communicator of
    its own (a duplicate of the world: no other message can match it), and waits until each
    has acknowledged it or ``ACK_SECONDS`` passed; then it aborts as before. On every rank a
    daemon thread probes for a notice every ``POLL_SECONDS``; on one it prints the line,
    acknowledges it and, if the origin's ``MPI_Abort`` has not ended this rank
    ``FALLBACK_SECONDS`` later, aborts the job itself with the origin's status.

Why a thread, and not checks in the server loop and the workers' waits: a rank may be in
``MPI_Waitall`` (a worker with a core of its own waits there for a reply the server will
never send), in a blocking collective of the workers, in the RMA read loop, or in a long
kernel; a check in each of these would miss some and touch the hot path, while a thread hears
the notice wherever the main thread is (mpi4py releases the GIL inside every MPI call; the
MPI is initialised with ``MPI_THREAD_MULTIPLE``, mpi4py's default; without it no listener
starts and the other ranks end silently, as before). Why a message, and not a file in the run
directory: the run directory is shared across hosts on a cluster, where a network file
system's attribute cache can hide a new file from another host for tens of seconds, and
``hpcps train`` need not run in one; MPI reaches every rank of the launch wherever it runs.
The thread costs one ``MPI_Iprobe`` every ``POLL_SECONDS`` (10 a second): no measurable
change in ``bench/bench_pushpull.py --notices`` (see ``docs/design.md``).

Never a hang: the origin waits for acknowledgements at most ``ACK_SECONDS`` (a dead, hung
or finished rank does not answer), and a rank that heard a notice aborts by itself after
``FALLBACK_SECONDS``. In continue mode a failed peer makes the probe raise until the failure
is acknowledged (``MPI_Comm_ack_failed`` on this communicator only); sends to a failed rank
fail and are not waited for. After a growth every rank, old or added, listens and tells on
the merged communicator (:func:`follow`).
"""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

from hpcps.core.exitcodes import INPUT_ERRORS
from hpcps.core.procs import mark_abort

#: Tags on the listener's own communicator: a notice (origin -> every rank) and its
#: acknowledgement (rank -> origin).
NOTICE_TAG = 1
ACK_TAG = 2
#: Longest notice, bytes (the first line of the message is cut to fit).
NOTICE_BYTES = 1024
#: Seconds between two probes of a listener thread.
POLL_SECONDS = 0.1
#: Seconds the origin waits for every rank's acknowledgement before it aborts.
ACK_SECONDS = 5.0
#: Seconds after a notice at which a rank still alive aborts the job itself.
FALLBACK_SECONDS = 15.0

#: The listener of this process (at most one), used by :func:`tell_others`.
_ACTIVE: list = []


def _host() -> str:
    try:
        return MPI.Get_processor_name()
    except MPI.Exception:  # pragma: no cover - MPI not usable
        import socket

        return socket.gethostname()


def _first_line(text: str) -> str:
    lines = [s for s in str(text).splitlines() if s.strip()]
    return lines[0].strip() if lines else ""


def encode_notice(status: int, rank: int, host: str, text: str) -> bytes:
    """The notice's bytes: ``status``, the origin's ``rank`` (as its own error line names it)
    and ``host``, and the first line of ``text``, one per line, UTF-8, at most
    ``NOTICE_BYTES`` (the text is cut on a character boundary). Local."""
    raw = f"{int(status)}\n{int(rank)}\n{host}\n{_first_line(text)}".encode()
    return raw[:NOTICE_BYTES].decode(errors="ignore").encode()


def decode_notice(raw: bytes) -> tuple[int, str, str, str]:
    """``(status, rank, host, first line)`` of a notice (a damaged one: status 1). Local."""
    parts = bytes(raw).decode(errors="replace").split("\n", 3)
    parts += [""] * (4 - len(parts))
    status = int(parts[0]) if parts[0].isdigit() else 1
    return status, parts[1] or "?", parts[2] or "?", parts[3]


def notice_line(rank, host: str, origin, origin_host: str, first: str) -> str:
    """The line a rank prints when it heard a notice of ``origin``."""
    return (f"hpcps: rank {rank} on {host}: stopped: rank {origin} on {origin_host} found an "
            f"input error: {first}")


class Listener:
    """A thread of this rank that prints why the job stops when another rank found an input
    error, and the sending side (:meth:`tell`) for this rank's own. Use :func:`listen`.

    Parameters
    ----------
    comm : MPI.Intracomm
        The ranks to tell and hear (the world); duplicated, so collective over it. This
        rank's number in it names the rank in the lines (as in its own error line,
        :func:`hpcps.comm.core.abort_on_error`), also after :func:`follow`.
    stream : text stream, optional
        Where the line goes (default: ``sys.stderr`` at the time).
    """

    def __init__(self, comm: MPI.Intracomm, stream=None):
        self.comm = comm.Dup()
        #: the communicators :func:`follow` replaced, freed by :meth:`stop` once the thread
        #: that may still hold one has ended
        self.retired: list = []
        self.rank = self.comm.Get_rank()
        self.host = _host()
        self.stream = stream
        #: True once this rank reports an error of its own (its notices are not printed)
        self.reporting = False
        self.heard = None                  # (origin, status) of the first notice
        self._sends: list = []             # acknowledgements in flight (kept alive)
        self._timer = None                 # the fallback abort, once a notice was heard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcps-notices", daemon=True)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread (before ``MPI_Finalize``) and free its communicator and those
        :func:`follow` replaced. Local.

        Found by a trial (2026-12-05): the duplicates of the old and added ranks'
        communicators that :func:`follow` made at each growth were never freed. At
        ``MPI_Finalize`` Open MPI disconnects every communicator still connecting processes
        of different launches (``ompi_dpm_dyn_finalize``); after two growths there were two,
        taken in different orders by different ranks, and the job crashed (signal 11) or hung
        there after training had finished."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._timer is not None:        # after the join: the thread may have just set it
            self._timer.cancel()
        if not self._thread.is_alive():
            for c in self.retired + [self.comm]:
                c.Free()
            self.retired = []
            self.comm = MPI.COMM_NULL

    # ------------------------------------------------------------------ listening
    def _run(self) -> None:
        status = MPI.Status()
        while not self._stop.wait(POLL_SECONDS):
            comm = self.comm                   # :func:`follow` may replace it meanwhile
            try:
                if not comm.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status):
                    continue
                src = status.Get_source()
                buf = bytearray(status.Get_count(MPI.BYTE))
                comm.Recv([buf, MPI.BYTE], source=src, tag=NOTICE_TAG)
            except MPI.Exception:
                if self._acknowledge_failures(comm):
                    continue
                return                         # an MPI that cannot go on: stop listening
            self._heard(comm, src, bytes(buf))

    @staticmethod
    def _acknowledge_failures(comm) -> bool:
        """After a peer failed (continue mode), let ``MPI.ANY_SOURCE`` probes go on."""
        ack = getattr(comm, "Ack_failed", None)
        if ack is None:
            return False
        try:
            ack()
        except (MPI.Exception, NotImplementedError):
            return False
        return True

    def _heard(self, comm, src: int, raw: bytes) -> None:
        status, origin, origin_host, first = decode_notice(raw)
        if not self.reporting and self.heard is None:
            self.heard = (origin, status)
            stream = self.stream or sys.stderr
            try:
                stream.write(notice_line(self.rank, self.host, origin, origin_host, first) + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
            self._timer = threading.Timer(FALLBACK_SECONDS, self._fallback, args=(status,))
            self._timer.daemon = True
            self._timer.start()
        try:
            one = bytearray(1)
            self._sends.append((comm.Isend([one, MPI.BYTE], dest=src, tag=ACK_TAG), one))
        except MPI.Exception:
            pass

    def _fallback(self, status: int) -> None:
        """The origin did not abort the job: do it, with its status."""
        mark_abort(status)
        self.comm.Abort(status)

    # ------------------------------------------------------------------ telling
    def tell(self, status: int, text: str, wait: float = ACK_SECONDS) -> int:
        """Send the notice of this rank's error to every other rank and wait until each has
        acknowledged it or ``wait`` seconds passed. Point-to-point; never blocks longer.

        Returns
        -------
        int
            The number of ranks that acknowledged it.
        """
        self.reporting = True
        comm = self.comm
        payload = bytearray(encode_notice(status, self.rank, self.host, text))
        others = [r for r in range(comm.Get_size()) if r != comm.Get_rank()]
        sends, acks, bufs = [], [], []
        for r in others:
            try:
                sends.append(comm.Isend([payload, MPI.BYTE], dest=r, tag=NOTICE_TAG))
                b = bytearray(1)
                bufs.append(b)
                acks.append(comm.Irecv([b, MPI.BYTE], source=r, tag=ACK_TAG))
            except MPI.Exception:
                continue                        # a failed rank (continue mode)
        got = 0
        pending = acks
        deadline = time.monotonic() + float(wait)
        while pending and time.monotonic() < deadline:
            left = []
            for req in pending:
                try:
                    if req.Test():
                        got += 1
                    else:
                        left.append(req)
                except MPI.Exception:
                    pass                        # a failed rank: no answer will come
            pending = left
            if pending:
                time.sleep(0.002)
        self._sends.append((sends, payload, pending, bufs))   # kept alive until the abort
        return got


def listen(comm: MPI.Intracomm, stream=None) -> Listener | None:
    """Start this rank's :class:`Listener` on ``comm`` (collective over it: a ``Dup``), or
    return None when the MPI does not give ``MPI_THREAD_MULTIPLE`` (every rank decides the
    same). :func:`stop` ends it."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return None
    listener = Listener(comm, stream).start()
    _ACTIVE[:] = [listener]
    return listener


def stop(listener: Listener | None) -> None:
    """End ``listener`` (from :func:`listen`; None: nothing). Local."""
    if listener is None:
        return
    listener.stop()
    if _ACTIVE and _ACTIVE[0] is listener:
        _ACTIVE.clear()


def follow(comm: MPI.Intracomm) -> None:
    """Listen and tell on (a duplicate of) ``comm`` from now on: the communicator of the old
    and the added ranks after a growth (:mod:`hpcps.resilience.elastic`), so that a notice
    reaches both. Collective over ``comm``: every rank duplicates it, listening or not (a rank
    that does not listen frees its duplicate at once; a listener frees the one it replaces
    when it stops, :meth:`Listener.stop`)."""
    new = comm.Dup()
    if _ACTIVE:
        listener = _ACTIVE[0]
        listener.retired.append(listener.comm)
        listener.comm = new
    else:
        new.Free()


def tell_others(status: int, text: str) -> int | None:
    """If ``status`` is an input error and this rank listens (:func:`listen`), send every
    other rank the notice of it and wait for their acknowledgements (at most
    ``ACK_SECONDS``); returns how many acknowledged, or None when nothing was sent. Local
    to this rank (point-to-point)."""
    if status not in INPUT_ERRORS or not _ACTIVE:
        return None
    return _ACTIVE[0].tell(status, text)
