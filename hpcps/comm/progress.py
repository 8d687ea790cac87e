"""Does this MPI give one-sided reads passive progress, and what to set if not.

With ``[consistency] pull = "rma"`` a worker reads a server's shard with ``Lock`` / ``Get`` /
``Unlock`` while the server computes in Python. Whether that read completes at once or only
when the server next enters MPI (its ``Iprobe`` loop) depends on the MPI library, the window
kind and a few settings. Measured on our machines (``/work/shared/README.md``, "MPI"):

=====================================  ===========================  ===========================
MPI                                    passive progress of ``Get``  what to set otherwise
=====================================  ===========================  ===========================
Open MPI 5 (one node)                  ``Win.Allocate``: yes;       nothing (hpcps uses
                                       ``Win.Create``: no           ``Win.Allocate``)
Open MPI 4.1                           with ``OMPI_MCA_osc=sm``     ``OMPI_MCA_osc=sm``
MPICH 4/5                              no, on every window kind     ``MPIR_CVAR_ASYNC_PROGRESS=1``
=====================================  ===========================  ===========================

:func:`rma_progress_advice` turns that table into a decision from the library version
string and the environment; other MPIs are not judged (no advice). :func:`library_version`
asks MPI for the string. The job (:func:`hpcps.runtime.job.run_job`) warns once and, with
``[consistency] rma_fallback = true``, pulls by messages instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["ProgressAdvice", "library_version", "rma_progress_advice"]


@dataclass(frozen=True)
class ProgressAdvice:
    """An MPI that needs help for passive RMA progress.

    Attributes
    ----------
    mpi : str
        The library, e.g. ``"MPICH 4.2.0"``.
    reason : str
        Why reads would wait for the target.
    setting : str
        What to do, e.g. ``"set MPIR_CVAR_ASYNC_PROGRESS=1"``.
    cost : str
        What the setting costs ("" if nothing known).
    """

    mpi: str
    reason: str
    setting: str
    cost: str = ""

    def message(self) -> str:
        """The one warning line (without a ``hpcps: warning:`` prefix)."""
        cost = f" ({self.cost})" if self.cost else ""
        return (f'pull = "rma" on {self.mpi}: {self.reason}, so a worker\'s read completes '
                f"only when the server next enters MPI. To get it: {self.setting}{cost}; or "
                "[consistency] rma_fallback = true to pull by messages (p2p) instead")


_OPEN_MPI = re.compile(r"Open MPI v?(\d+)\.(\d+)(?:\.(\d+))?")
_MPICH = re.compile(r"MPICH Version:\s*(\d+(?:\.\d+)*)|MPICH (\d+(?:\.\d+)*)")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "yes", "true", "on", "enable", "enabled")


def _osc_selects_sm(value: str | None) -> bool:
    """Whether an ``OMPI_MCA_osc`` value selects the ``sm`` component (``"sm"``,
    ``"sm,pt2pt"``; not an exclusion list ``"^ucx"``)."""
    v = (value or "").strip()
    return bool(v) and not v.startswith("^") and "sm" in [c.strip() for c in v.split(",")]


def rma_progress_advice(library: str, environ: Mapping[str, str],
                        window_kind: str = "allocate") -> ProgressAdvice | None:
    """What an MPI needs for passive progress of one-sided reads, or None if nothing
    (or nothing known). Pure function; no MPI call.

    Parameters
    ----------
    library : str
        ``MPI.Get_library_version()`` (any lines; NUL bytes ignored).
    environ : mapping of str to str
        The environment of the ranks (``os.environ``).
    window_kind : {"allocate", "create"}
        How the windows are made: ``MPI.Win.Allocate`` (what hpcps does) or
        ``MPI.Win.Create`` over existing memory.

    Returns
    -------
    ProgressAdvice or None
        Advice for MPICH without ``MPIR_CVAR_ASYNC_PROGRESS`` set true, for Open MPI 4.x
        without ``OMPI_MCA_osc`` selecting ``sm``, and for Open MPI 5+ with
        ``window_kind="create"``; None otherwise, including for MPIs not in the table.

    Raises
    ------
    ValueError
        If ``window_kind`` is not "allocate" or "create".
    """
    if window_kind not in ("allocate", "create"):
        raise ValueError(f"window_kind must be 'allocate' or 'create', got {window_kind!r}")
    text = library.replace("\x00", " ")
    m = _OPEN_MPI.search(text)
    if m:
        major, minor = int(m.group(1)), int(m.group(2))
        name = f"Open MPI {major}.{minor}" + (f".{m.group(3)}" if m.group(3) else "")
        if major >= 5:
            if window_kind == "create":
                return ProgressAdvice(name, "windows made by Win.Create get no passive "
                                      "progress (only Win.Allocate windows do)",
                                      "make the windows with Win.Allocate")
            return None
        if major == 4 and not _osc_selects_sm(environ.get("OMPI_MCA_osc")):
            return ProgressAdvice(name, "its default one-sided component gives no passive "
                                  "progress (and crashed on an int64 atomic in our tests)",
                                  "set OMPI_MCA_osc=sm", "shared memory: one node only")
        return None
    m = _MPICH.search(text)
    if m and "Open MPI" not in text:
        version = m.group(1) or m.group(2)
        if not _truthy(environ.get("MPIR_CVAR_ASYNC_PROGRESS")):
            return ProgressAdvice(f"MPICH {version}", "MPICH gives one-sided reads no "
                                  "passive progress on any window kind",
                                  "set MPIR_CVAR_ASYNC_PROGRESS=1",
                                  "one progress thread per rank, which spins: on a 2-core "
                                  "machine Send/Recv bandwidth fell ~15x")
    return None


def library_version() -> str:
    """``MPI.Get_library_version()`` without NUL bytes. Local; callable before ``MPI_Init``."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\x00", "").strip()
