"""BLAS threads per rank (no MPI).

numpy's BLAS (OpenBLAS in the wheels) starts one thread per core in *every* process. With
several MPI ranks on a node the threads of all ranks then compete for the same cores, and
busy-waiting BLAS threads slow every rank down: on this project's 2-core test machine, four
ranks training the Fashion-MNIST MLP ran 8× slower (one epoch on 20,000 rows: 48 s instead
of 6 s) than with one BLAS thread per rank. So each rank limits its BLAS pool to its share
of the node's cores — unless the user chose a thread count through the usual environment
variables, which are then left alone. Limits are set with ``threadpoolctl`` (a scikit-learn
dependency), which finds the BLAS libraries numpy and scipy loaded.
"""

from __future__ import annotations

import os

#: Environment variables by which a user chooses a thread count; any of them set = hands off.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def blas_threads_for(ranks_on_node: int, cores: int | None = None, environ=None) -> int | None:
    """BLAS threads one rank should use, or ``None`` to leave the library's choice alone.

    Parameters
    ----------
    ranks_on_node : int
        MPI ranks sharing this node (>= 1).
    cores : int, optional
        Cores available to this rank (default :func:`usable_cores`).
    environ : mapping, optional
        Environment to consult (default ``os.environ``).

    Returns
    -------
    int or None
        ``max(1, cores // ranks_on_node)``; ``None`` if any of :data:`THREAD_ENV` is set.
    """
    environ = os.environ if environ is None else environ
    if any(environ.get(v) for v in THREAD_ENV):
        return None
    cores = usable_cores() if cores is None else int(cores)
    return max(1, cores // max(1, int(ranks_on_node)))


def limit_blas_threads(n: int):
    """Limit the BLAS thread pools loaded in this process to ``n`` threads (for the rest of
    the process's life). Returns the ``threadpoolctl.ThreadpoolController`` limits object."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=int(n), user_api="blas")
