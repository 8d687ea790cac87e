"""Whether a process of this host is a live hpcps process (run-directory records name their
writer's pid). No MPI."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hpcps_alive"]


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
