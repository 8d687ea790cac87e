"""The compiled request path (:mod:`hpcps.comm.fastpath`, issue 20) as this process may use
it: the module, or None and why (:func:`load_fastpath`), loaded once for both endpoints."""

from __future__ import annotations

from mpi4py import MPI


def load_fastpath():
    """The compiled request path :mod:`hpcps.comm.fastpath` if this process can use it, and
    why not otherwise: ``(module or None, reason)``. Not built (no MPI compiler wrapper at
    build time), built for another MPI than the one mpi4py runs on (an Open MPI build imported
    under MPICH: mpi4py's types differ in size, ValueError at import; or the vendors differ)
    -> the Python path. Does not initialise MPI. Local."""
    try:
        from hpcps.comm import fastpath
    except ImportError as e:
        return None, f"not built ({e})"
    except ValueError as e:                 # mpi4py's C types differ: another MPI's mpi4py
        return None, f"built for another MPI ({e})"
    vendor = MPI.get_vendor()[0]
    if fastpath.BUILT_FOR != vendor:
        return None, f"built for {fastpath.BUILT_FOR}, running on {vendor}"
    return fastpath, ""


_fast, _FAST_REASON = load_fastpath()
