"""hpcps's output through the standard :mod:`logging` module: one logger (``"hpcps"``), one
formatter, levels, and the ``-v``/``-q`` of the command line. No MPI.

Every line a rank writes starts with where it comes from — its rank and host, in brackets —
then the text users and scripts read (``hpcps: warning: ...``, the progress lines,
``done: ...``)::

    [rank 0@node7] epoch 1/2  step 40/120  clock 40 (workers 39..40)  ...
    [rank 3@node8] hpcps: warning: ...

The rank is the job's world rank (:func:`set_rank`, once MPI is up; before that, the
launcher's ``OMPI_COMM_WORLD_RANK``/``PMI_RANK``/``PMIX_RANK``/``SLURM_PROCID``); a worker
added while the job runs takes the number the job gave it (after every rank of the launch).
Outside a launch the prefix is the host alone (``[node7]``). The verbosity picks the levels:

``-q``
    warnings and errors only (no progress, no summary);
default
    the messages, progress lines included;
``-v``
    debug messages too.

Code that writes to a text stream (``out.write(...)``, as the trainer and the job do) is
routed through the logger by :class:`LineStream`, which gives each line the level its
hand-typed prefix says (``hpcps: warning:`` → WARNING, ``hpcps: error`` → ERROR, else INFO).
"""

from __future__ import annotations

import io
import logging
import os
import socket
import sys

LOGGER = "hpcps"

#: ``-q``, default, ``-v`` → logging level.
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


def rank_from_env(environ=None) -> str | None:
    """This process's rank as the launcher announced it (Open MPI, MPICH/Hydra, Slurm), or
    None outside a launch. Local; MPI need not be initialised."""
    env = os.environ if environ is None else environ
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if env.get(var, "").isdigit():
            return env[var]
    return None


def origin(rank, host: str) -> str:
    """The prefix of a line of ``rank`` on ``host``: ``[rank 3@node7] ``, or ``[node7] ``
    when the rank is not known (None)."""
    return f"[rank {rank}@{host}] " if rank is not None else f"[{host}] "


class RankFormatter(logging.Formatter):
    """One formatter for every line: the rank and host in front of the message as written
    (:func:`origin`), on each line of a multi-line message.

    Parameters
    ----------
    rank : str, int or None
        The rank (default: from the launcher's environment).
    host : str or None
        The host (default: :func:`socket.gethostname`).
    """

    def __init__(self, rank=None, host: str | None = None):
        super().__init__("%(message)s")
        self.host = host or socket.gethostname()
        self.set_rank(rank if rank is not None else rank_from_env())

    def set_rank(self, rank) -> None:
        """Name ``rank`` in the lines from now on."""
        self.rank = rank
        self.prefix = origin(rank, self.host)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return "\n".join(self.prefix + line for line in text.split("\n"))


def configure(verbosity: int = 0, stream=None, rank=None) -> logging.Logger:
    """Set up the ``"hpcps"`` logger for this process (once per command; again replaces).

    Parameters
    ----------
    verbosity : int
        ``-1`` (``-q``), ``0`` or ``1`` (``-v``); out-of-range values are clipped.
    stream : text stream, optional
        Where the lines go (default ``sys.stdout`` at the time of each write).
    rank : str or int, optional
        The rank in the lines (default: from the launcher's environment; :func:`set_rank`
        changes it).

    Returns
    -------
    logging.Logger
    """
    v = max(-1, min(1, int(verbosity)))
    log = logging.getLogger(LOGGER)
    for h in list(log.handlers):
        log.removeHandler(h)
    handler = _StdoutHandler(stream)
    handler.setFormatter(RankFormatter(rank=rank))
    log.addHandler(handler)
    log.setLevel(LEVELS[v])
    log.propagate = False
    return log


def set_rank(rank) -> None:
    """Name ``rank`` (the job's world rank, an int) in every line from now on (after
    :func:`configure`; once MPI knows it). Local."""
    for h in logging.getLogger(LOGGER).handlers:
        if isinstance(h.formatter, RankFormatter):
            h.formatter.set_rank(rank)


class _StdoutHandler(logging.StreamHandler):
    """A StreamHandler that looks ``sys.stdout`` up at each write (tests replace it)."""

    def __init__(self, stream=None):
        super().__init__(stream or sys.stdout)
        self._fixed = stream is not None

    def emit(self, record):
        if not self._fixed:
            self.stream = sys.stdout
        super().emit(record)
        self.flush()


def level_of(line: str) -> int:
    """The level a line's hand-typed prefix gives it."""
    s = line.lstrip()
    if s.startswith("hpcps: warning") or " warning: " in s[:40]:
        return logging.WARNING
    if s.startswith("hpcps: error") or " error: " in s[:40]:
        return logging.ERROR
    return logging.INFO


class LineStream(io.TextIOBase):
    """A text stream whose complete lines go to the ``"hpcps"`` logger, each at the level
    :func:`level_of` gives it. Pass it where code takes an ``out`` stream. Local.

    Parameters
    ----------
    logger : logging.Logger, optional
        Default: ``logging.getLogger("hpcps")``.
    """

    def __init__(self, logger: logging.Logger | None = None):
        super().__init__()
        self.log = logger or logging.getLogger(LOGGER)
        self._buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self._buf += s
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.log.log(level_of(line), line)
        return len(s)

    def flush(self) -> None:
        if self._buf:
            line, self._buf = self._buf, ""
            self.log.log(level_of(line), line)
