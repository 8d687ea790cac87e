"""Checks a job passes on every rank before any parameter-server traffic, and the per-rank
settings made before training: the model loads, the tables fit the servers' memory, RMA pulls
can make progress, BLAS uses the rank's share of the cores.

Every function here is collective over the job's world or local as its docstring says; none
imports the training loop, so :mod:`hpcps.resilience.elastic` may use them without an import
cycle.
"""

from __future__ import annotations

import os
import sys

from hpcps.comm import core
from hpcps.comm.collectives import bcast_int
from hpcps.comm.progress import library_version, rma_progress_advice
from hpcps.config import ConfigError
from hpcps.runtime.prelaunch import (  # noqa: F401 - importable from here as before
    available_memory, memory_message, server_bytes, server_need)


class ResourceError(RuntimeError):
    """The job cannot fit this machine (raised identically on every rank before training)."""


def check_memory(cfg, tables, world) -> None:
    """Refuse a job whose tables do not fit the servers' memory, showing the arithmetic and
    naming the job file and the key that sizes the tables. Collective over ``world`` (one
    Allreduce): every rank raises :class:`ResourceError` when any server rank's node lacks
    the memory.

    The test is per node: the shards of all servers placed on one node (by hostname) must fit
    its ``MemAvailable``.
    """
    need, parts = server_need(cfg, tables)
    roles = core.role_map(world.Get_size(), cfg.cluster.servers)
    is_server = roles[world.Get_rank()] == core.SERVER
    have = available_memory()
    # servers sharing this node (ranks on one host): counted through the node's shared comm
    node = world.Split_type(core.SHARED, key=world.Get_rank())
    try:
        here = int(core.node_sum(node, 1 if is_server else 0))
    finally:
        node.Free()
    short = is_server and have is not None and need * here > have
    if core.any_rank_failed(world, short):
        raise ResourceError(memory_message(cfg, need, parts, here, have if short else None))


def limit_threads(world, ranks_on_node: int | None = None) -> int | None:
    """Give each rank its share of its node's cores for BLAS (:mod:`hpcps.core.threads`), unless
    the user set ``OMP_NUM_THREADS`` or the like. Collective over ``world`` (one
    ``Split_type``) unless the caller counted the node's ranks (``ranks_on_node``). Returns the
    thread count set, or ``None``."""
    from hpcps.core.threads import blas_threads_for, limit_blas_threads

    n = blas_threads_for(core.node_size(world) if ranks_on_node is None else ranks_on_node)
    if n is not None:
        limit_blas_threads(n)
    return n


def load_model(cfg):
    """The job's model (:func:`hpcps.models.make_model`); a model that cannot be loaded is a
    :class:`~hpcps.config.ConfigError` on key ``model.type``, a data file the model cannot
    use (e.g. a prepared file of another kind) one on ``data.path``. Local; every rank calls it."""
    from hpcps.data import DataError
    from hpcps.models import ModelLoadError, make_model

    try:
        return make_model(cfg)
    except ModelLoadError as e:
        raise ConfigError(cfg.path, "model.type", str(e).removeprefix("model.type: ")) from None
    except DataError as e:
        raise ConfigError(cfg.path, "data.path", str(e)) from None


def check_rma_progress(cfg, world, out=None, environ=None, library=None):
    """With ``pull = "rma"``: warn once (rank 0) when this MPI is known to give one-sided
    reads no passive progress, and with ``[consistency] rma_fallback = true`` switch the
    job to p2p pulls. Collective over ``world`` (one broadcast) when ``pull = "rma"``.

    Rank 0's view decides (library version and environment,
    :func:`hpcps.comm.progress.rma_progress_advice`), so every rank takes the same path.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    world : MPI.Intracomm
    out : text stream, optional
        Where rank 0 writes the warning (default ``sys.stdout``).
    environ : mapping, optional
        The environment to judge (default ``os.environ``).
    library : str, optional
        The MPI library version string (default: asked from MPI).

    Returns
    -------
    hpcps.config.JobConfig
        ``cfg`` itself, or a copy with ``consistency.pull = "p2p"`` after a fallback.
    """
    import dataclasses

    if cfg.consistency.pull != "rma":
        return cfg
    out = out or sys.stdout
    advice = None
    if world.Get_rank() == 0:
        advice = rma_progress_advice(library if library is not None else library_version(),
                                     os.environ if environ is None else environ)
        if advice is not None:
            what = ("falling back to p2p pulls ([consistency] rma_fallback = true)"
                    if cfg.consistency.rma_fallback else "continuing with RMA pulls")
            out.write(f"hpcps: warning: {advice.message()}; {what}\n")
            out.flush()
    if bcast_int(world, int(advice is not None)) and cfg.consistency.rma_fallback:
        return dataclasses.replace(cfg, consistency=dataclasses.replace(cfg.consistency,
                                                                        pull="p2p"))
    return cfg
