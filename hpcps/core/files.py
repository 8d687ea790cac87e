"""Files created the way the user's umask says (no MPI).

:func:`tempfile.mkstemp` always creates mode 0600, whatever the umask; a file written to a
temporary name and then renamed into place would keep that mode, so a group that should
read the run directory (umask 022 or 002) could not read its checkpoints, and a stricter
umask would be honoured only by accident. :func:`make_temp` creates the temporary file and
gives it ``0666 & ~umask`` — what ``open(path, "w")`` would have made.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["current_umask", "make_temp"]


def current_umask() -> int:
    """The process umask, read without changing it where possible.

    Linux (4.7+) shows it in ``/proc/self/status``; elsewhere it is read by setting and
    restoring it (``os.umask``), which is not atomic against other threads of the process.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp(final: Path) -> Path:
    """Create an empty temporary file next to ``final`` (same directory, so an
    ``os.replace`` onto ``final`` is atomic) with mode ``0o666 & ~umask``.

    Parameters
    ----------
    final : pathlib.Path
        The file the temporary one will replace; its directory must exist.

    Returns
    -------
    pathlib.Path
        The temporary file (``.<name>.XXXXXXXX.tmp``).

    Raises
    ------
    OSError
        If the file cannot be created.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return Path(tmp)
