"""What this machine can hold: the error a job that does not fit raises, and the node's
available memory. No MPI (the collective checks are :mod:`hpcps.runtime.job`'s)."""

from __future__ import annotations

__all__ = ["ResourceError", "available_memory"]


class ResourceError(RuntimeError):
    """The job cannot fit this machine (raised identically on every rank before training)."""


def available_memory() -> int | None:
    """Bytes of memory available for new allocations on this node (``MemAvailable`` of
    /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
