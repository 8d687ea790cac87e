"""hpcps's output through the standard :mod:`logging` module: one logger (``"hpcps"``), one
formatter, levels, and the ``-v``/``-q`` of the command line. No MPI.

Messages keep the texts users and scripts read (``hpcps: warning: ...``, the progress lines,
``done: ...``); what changes with the verbosity:

``-q``
    warnings and errors only (no progress, no summary);
default
    the messages as they are, progress lines included;
``-v``
    every line carries the rank and host it comes from (``[rank 0 on node7] ...``), and debug
    messages are shown.

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


class RankFormatter(logging.Formatter):
    """One formatter for every line: the message as written; with ``where`` (``-v``), the
    rank and host in front of it (``[rank 3 on node7] ...``; ``[node7]`` outside a launch).

    Parameters
    ----------
    where : bool
        Put the rank and host in front of every line.
    rank : str or None
        The rank (default: from the launcher's environment).
    host : str or None
        The host (default: :func:`socket.gethostname`).
    """

    def __init__(self, where: bool = False, rank: str | None = None, host: str | None = None):
        super().__init__("%(message)s")
        self.where = where
        r = rank if rank is not None else rank_from_env()
        h = host or socket.gethostname()
        self.prefix = f"[rank {r} on {h}] " if r is not None else f"[{h}] "

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.where:
            return text
        return "\n".join(self.prefix + line for line in text.split("\n"))


def configure(verbosity: int = 0, stream=None, rank: str | None = None) -> logging.Logger:
    """Set up the ``"hpcps"`` logger for this process (once per command; again replaces).

    Parameters
    ----------
    verbosity : int
        ``-1`` (``-q``), ``0`` or ``1`` (``-v``); out-of-range values are clipped.
    stream : text stream, optional
        Where the lines go (default ``sys.stdout`` at the time of each write).
    rank : str, optional
        The rank for ``-v`` (default: from the launcher's environment).

    Returns
    -------
    logging.Logger
    """
    v = max(-1, min(1, int(verbosity)))
    log = logging.getLogger(LOGGER)
    for h in list(log.handlers):
        log.removeHandler(h)
    handler = _StdoutHandler(stream)
    handler.setFormatter(RankFormatter(where=v > 0, rank=rank))
    log.addHandler(handler)
    log.setLevel(LEVELS[v])
    log.propagate = False
    return log


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
