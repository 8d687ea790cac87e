"""Checks a job passes on every rank before any parameter-server traffic, and the per-rank
settings made before training: the model loads, the tables fit the servers' memory, RMA pulls
can make progress (else the run's :class:`~hpcps.core.runplan.RunPlan` says p2p), BLAS uses
the rank's share of the cores.

Every function here is collective over the job's world or local as its docstring says. What
lower layers need too lives below and is re-exported here: :class:`ResourceError` and
:func:`available_memory` (:mod:`hpcps.core.resources`), :func:`limit_threads`
(:mod:`hpcps.comm.core`), :func:`load_model` (:mod:`hpcps.models.load`).
"""

from __future__ import annotations

import os
import sys

from hpcps.comm import core
from hpcps.comm.collectives import bcast_int
from hpcps.comm.core import limit_threads
from hpcps.comm.progress import library_version, rma_progress_advice
from hpcps.core.resources import ResourceError, available_memory
from hpcps.core.runplan import RunPlan
from hpcps.models.load import load_model
from hpcps.runtime.prelaunch import memory_message, server_bytes, server_need

__all__ = ["ResourceError", "available_memory", "limit_threads", "load_model", "server_bytes",
           "server_need", "memory_message", "check_memory", "check_rma_progress"]


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


def check_rma_progress(cfg, world, out=None, environ=None, library=None) -> RunPlan:
    """With ``pull = "rma"``: warn once (rank 0) when this MPI is known to give one-sided
    reads no passive progress, and with ``[consistency] rma_fallback = true`` decide that the
    run pulls by messages (p2p). Collective over ``world`` (one broadcast) when
    ``pull = "rma"``.

    Rank 0's view decides (library version and environment,
    :func:`hpcps.comm.progress.rma_progress_advice`), so every rank takes the same path.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
        Not changed.
    world : MPI.Intracomm
    out : text stream, optional
        Where rank 0 writes the warning (default ``sys.stdout``).
    environ : mapping, optional
        The environment to judge (default ``os.environ``).
    library : str, optional
        The MPI library version string (default: asked from MPI).

    Returns
    -------
    hpcps.core.runplan.RunPlan
        The run's pull mode: ``cfg``'s, or p2p after a fallback (``rma_fallback`` True).
    """
    plan = RunPlan.of(cfg)
    if cfg.consistency.pull != "rma":
        return plan
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
        return plan.with_p2p_pulls()
    return plan
