"""The chief worker's start-up lines (:func:`start_lines`; its progress lines' rate and ETA:
:mod:`hpcps.worker.progress`). Local; no MPI."""

from __future__ import annotations

from hpcps.config.parse import changed_keys


def start_lines(trainer, restore, n_train, n_test, start_epoch, start_step, plan) -> list[str]:
    """The chief's start-up lines: layout, data, model, policy; the checkpoint resumed;
    the growth the job file plans. Local (the caller is the chief).

    Parameters
    ----------
    trainer : hpcps.worker.trainer.Trainer
        The chief's trainer (its config, client, model, policy, elastic state).
    restore : dict or None
        The checkpoint resumed (its ``step``, ``step_in_epoch``, ``n_workers``, ``n_servers``,
        ``config``), or None.
    n_train, n_test : int
        Rows of the training and test splits.
    start_epoch, start_step : int
        Where training starts (0-based).
    plan : list
        The growth/re-plan segments still to run.

    Returns
    -------
    list of str
        The lines, without newlines.
    """
    tr = trainer
    steps_full = tr.steps_full
    lines = []
    cfg, t = tr.cfg, tr.cfg.train
    rows = list(getattr(tr, "part_rows", None) or [])
    idle = [w for w, n in enumerate(rows) if n == 0]
    per = (f"of {t.batch_size} rows on {len(rows) - len(idle)} of {len(rows)} workers"
           if idle else f"of {t.batch_size} rows per worker")
    lines.append(f"hpcps: {tr.n_workers} worker(s), {tr.client.n_servers} server(s); "
              f"{n_train:,} train / {n_test:,} test rows; model {tr.model.name} "
              f"({_plural(_n_params(tr.client.specs), 'parameter')}{_dynamic_note(tr.client.specs)}); "
              f"{_plural(steps_full, 'step')}/epoch {per}; "
              + ("AllReduce of the gradients (BSP by construction), "  # [cluster] mode
                 if tr.client.pull_mode == "allreduce" else
                 f"{tr.policy.describe()} ({tr.client.pull_mode} pulls), ")
              + f"{cfg.optimizer.name} lr={cfg.optimizer.learning_rate}")
    if idle:
        lines.append(_idle_note(tr.streaming, idle, rows))
    empty = _empty_servers(tr.client)
    if empty:
        where = str(empty[0]) if len(empty) == 1 else f"{empty[0]}-{empty[-1]}"   # the last ones
        lines.append(f"hpcps: note: server(s) {where} hold no row of any table (the "
                     f"tables have fewer keys than there are servers): they serve nothing; "
                     f"fewer [cluster] servers would do")
    g = getattr(tr.client, "group", None)
    if g is not None:
        lines.append(f"groups ([comm] aggregate = 'node'): {g.n_groups} group(s) of the "
                     f"{tr.n_workers} workers send their steps together; each server gets "
                     f"{g.n_groups} request(s) per step")
    if restore is not None:
        # the checkpoint's own steps per epoch: its step_in_epoch counts steps of the layout
        # that wrote it (found by a trial: "step 61 of 245" mixed two layouts' counts)
        per = int(restore.get("steps_per_epoch", 0)) or steps_full
        where = (f"epoch {start_epoch + 1}, after its step {int(restore['step_in_epoch'])} of "
                 f"{per}"
                 if start_epoch == int(restore["epoch"]) else
                 f"the end of epoch {start_epoch}; epoch {start_epoch + 1} starts")
        lines.append(f"resumed from checkpoint step {restore['step']} ({where}, written by "
                  f"{restore['n_workers']} worker(s) and {restore['n_servers']} server(s))")
        if restore.get("config", cfg.text) != cfg.text:
            keys = changed_keys(restore["config"], cfg.text)
            lines.append("hpcps: warning: the job file differs from the one the checkpoint was "
                         f"written with (keys: {', '.join(keys) or 'none, only comments'}); "
                         "training continues with the new settings")
        if (start_epoch == t.epochs - 1 and start_step >= steps_full and not plan):
            lines.append(f"hpcps: note: this job already finished (checkpoint at its last "
                      f"step, in {cfg.output.dir}); nothing is trained, the model is "
                      "re-evaluated. To train again: --resume never, or another "
                      "[output] dir or job name")
    e = cfg.elastic
    if e.add_workers:
        clock = tr.client.clock_value
        if tr.elastic is not None and tr.elastic.unavailable:
            lines.append(f"hpcps: warning: [elastic] add_workers = {e.add_workers}: cannot add "
                      f"workers to this job: {tr.elastic.unavailable}")
        elif clock >= e.at_step:
            lines.append(f"hpcps: note: [elastic] at_step = {e.at_step} is not ahead of the "
                      f"clock resumed ({clock}): no workers are added (launch with the "
                      "number of workers you want)")
        elif e.at_step >= steps_full * t.epochs:
            lines.append(f"hpcps: note: [elastic] at_step = {e.at_step} is not before the "
                      f"job's last step ({steps_full * t.epochs}): no workers are added")
        else:
            lines.append(f"hpcps: {e.add_workers} worker(s) will be added at clock {e.at_step}")
    return lines


def _idle_note(streaming, idle, rows) -> str:
    """The note on workers without training rows (a compressed file is read whole by one
    worker, :meth:`hpcps.data.lineindex.LineIndex.part_bounds`; or fewer rows than workers)."""
    why = ("a compressed file is read whole by one worker; split the data into at least "
           f"{len(rows)} files (one or more per worker) to use every worker"
           if streaming else "the split has too few rows for the workers")
    return (f"hpcps: note: worker(s) {', '.join(str(w) for w in idle)} have no training rows "
            f"(rows per worker: {', '.join(str(n) for n in rows)}): {why}; they run the "
            "epoch's clocks with empty batches")


def _empty_servers(client) -> list[int]:
    """Key ranges (servers) that hold no row of any table, ascending (the last ranges of a
    range partition: consecutive): every table fixed and smaller than the number of servers (a trial: 3 features on 8 servers, servers 3-7 idle in silence);
    none when a table is dynamic (its keys are spread by hash)."""
    specs, routing = getattr(client, "specs", None), getattr(client, "routing", None)
    if not specs or routing is None or any(s.dynamic for s in specs):
        return []
    return [r for r in range(client.n_servers)
            if all(hi <= lo for lo, hi in (routing.shard_range(s.name, r) for s in specs))]


def _n_params(specs) -> int:
    """Parameters of the fixed tables (a dynamic table's grow with its keys)."""
    return sum(s.num_keys * s.dim for s in specs if not s.dynamic)


def _dynamic_note(specs) -> str:
    dyn = [s.name for s in specs if s.dynamic]
    return f" + dynamic table(s) {', '.join(dyn)} (hash, grow with the keys)" if dyn else ""


def _plural(n: int, word: str) -> str:
    """``"1 parameter"``, ``"109,386 parameters"``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"
