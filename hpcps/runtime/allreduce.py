"""The AllReduce mode (``[cluster] mode = "allreduce"``): the baseline without servers, every
rank a worker holding the whole model (:mod:`hpcps.worker.allreduce`), BSP by construction.
Called by :func:`hpcps.runtime.job.run_job`.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from hpcps.comm.collectives import gather_rows
from hpcps.comm.core import any_rank_failed
from hpcps.config import ConfigError
from hpcps.runtime import metrics
from hpcps.runtime.output import write_model
from hpcps.runtime.preflight import load_model
from hpcps.runtime.report import mb, print_summary
from hpcps.runtime.rundir import RunDir, fresh_start_note
from hpcps.worker.trainer import Trainer


def run_allreduce(cfg, world, out=None, stop=None, step_hook=None) -> dict:
    """Run job ``cfg`` as the AllReduce baseline (:mod:`hpcps.worker.allreduce`): every rank a
    worker holding the whole model, BSP by construction. Collective over ``world``.

    Checkpoints are not written in this mode (``[checkpoint]`` is ignored, with a note).

    Returns
    -------
    dict
        The summary on rank 0 (same keys as :func:`hpcps.runtime.job.run_job`'s, ``servers``
        empty), ``{"stopped_by_signal": bool}`` elsewhere.

    Raises
    ------
    hpcps.config.ConfigError
        If ``[consistency] model`` is not ``"bsp"`` (identically on every rank).
    """
    from hpcps.worker.allreduce import AllReduceClient

    out = out or sys.stdout
    if cfg.consistency.model != "bsp":
        raise ConfigError(cfg.path, "consistency.model",
                          f"mode = 'allreduce' is synchronous by construction; use 'bsp', got "
                          f"{cfg.consistency.model!r}")
    model = load_model(cfg)
    if world.Get_rank() == 0:                # no checkpoints in this mode: always afresh
        note = fresh_start_note(RunDir(cfg.output.dir))
        if note:
            out.write(f"hpcps: note: {note}\n")
    tables = model.tables()
    comm = world.Dup()
    t_start = time.perf_counter()
    rank = comm.Get_rank()
    history: list = []
    try:
        client = AllReduceClient(comm, tables, seed=cfg.seed)
        if rank == 0 and (cfg.checkpoint.every_steps or cfg.checkpoint.every_seconds):
            out.write("hpcps: note: mode = 'allreduce' writes no checkpoints; [checkpoint] is "
                      "ignored\n")

        def on_epoch(rec):
            history[:] = trainer.history
            metrics.write_epochs(cfg, history)

        trainer = Trainer(cfg, rank, comm.Get_size(), client, comm, rank == 0, on_epoch=on_epoch,
                          out=out, step_hook=step_hook, stop=stop, model=model)
        result = trainer.run()
        history[:] = trainer.history
        stats = np.array([client.bytes_in, client.bytes_out, client.comm_seconds,
                          client.collectives], dtype=np.float64)
        rows = gather_rows(comm, stats)
        stopped = bool(any_rank_failed(comm, result["stopped_by_signal"]))
        if rank == 0 and not stopped:
            path = write_model(RunDir(cfg.output.dir).model,
                               {s.name: client.pull_table(s.name) for s in client.specs}, cfg,
                               step=result["clock"], epoch=result["epochs"])
            result["model_path"] = str(path)
    finally:
        comm.Free()
    if rank != 0:
        return {"stopped_by_signal": stopped}
    if stopped:
        out.write(f"stopped by signal at clock {result['clock']} (mode 'allreduce' keeps no "
                  "checkpoint)\n")
        return {"stopped_by_signal": True}
    wall = time.perf_counter() - t_start
    summary = {
        "mode": "allreduce", "wall_seconds": wall, "train_seconds": result["seconds"],
        "examples": result["examples"], "examples_per_second": result["examples_per_second"],
        "steps": result["steps"], "epochs": result["epochs"],
        "model_path": result.get("model_path"),
        "checkpoints": {"count": 0, "seconds": 0.0, "bytes": 0, "share_of_run": 0.0},
        "servers": [],
        "workers": [{"index": i, "bytes_in": int(r[0]), "bytes_out": int(r[1]),
                     "allreduce_seconds": float(r[2]), "collectives": int(r[3])}
                    for i, r in enumerate(rows)],
    }
    metrics.write_final(cfg, summary, history)
    tot = sum(w["allreduce_seconds"] for w in summary["workers"])
    vol = sum(w["bytes_in"] for w in summary["workers"])
    out.write(f"  allreduce: {len(rows)} ranks, {mb(vol)} received by all ranks, collectives "
              f"{tot:.2f} s (summed over ranks)\n")
    print_summary(summary, history, out)
    return summary
