"""When and how the workers take checkpoints (layout: :mod:`hpcps.checkpoint`).

A checkpoint is taken right after a step's clock, at a consistent cut: worker 0 asks every
server to write its shard once it has applied every step before that clock (under BSP/SSP
no server can have applied more, since worker 0 has not clocked further), collects the
shards' sizes and checksums, and writes the manifest last. The other workers go on; their
next pull waits for the servers as usual.
"""

from __future__ import annotations

import json
import time

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.comm.collectives import allgather_rows, barrier, bcast_int


class Checkpointer:
    """Decide and write periodic checkpoints.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    client : hpcps.worker.client.PSClient
    comm : MPI.Intracomm
        Workers' communicator (used for the time-based decision).
    is_chief : bool
    n_workers : int
    slot_names : list of dict or of sequence of str
        Optimizer slots per table (table-id order): ``{name: (shape after the row axis,
        dtype)}`` (:meth:`hpcps.core.optim.Optimizer.slot_specs`), or names of slots shaped like
        the rows.
    out : text stream for the one-line reports (worker 0).
    """

    def __init__(self, cfg, client, comm, is_chief, n_workers, slot_names, out, async_cut=False,
                 flush=None):
        self.cfg = cfg
        self.c = cfg.checkpoint
        self.client = client
        self.comm = comm
        self.is_chief = is_chief
        self.n_workers = n_workers
        self.slot_names = slot_names
        self.out = out
        #: when the interval of ``every_seconds`` last started: at the first step (not here: a
        #: data index pass or a resume's loading can outlast it, and a checkpoint at the first
        #: step followed) and at the end of every checkpoint (not its start: a write that
        #: outlasted the interval was followed by another at the next step)
        self.last_time = None
        self.last_step = None
        self.seconds = 0.0
        self.bytes = 0
        self.count = 0
        self.steps_per_epoch = 0
        self.async_cut = async_cut      # servers apply pushes on arrival: cut by push counts
        self.flush = flush
        #: () -> dict of more manifest attributes, set by the trainer (the voted count of
        #: rejected non-finite steps)
        self.extra = dict
        #: () -> dict of more manifest attributes, set by the job (``launches``: JSON list of
        #: this run's launches, :func:`hpcps.runtime.rundir.launch_records`; ``growth``: JSON
        #: list of its growths so far)
        self.more = dict

    def follow(self, roles) -> None:
        """Work with the workers of a new layout ``roles`` (after a recovery or a growth,
        :class:`hpcps.comm.core.Roles`). Local."""
        self.comm, self.n_workers, self.is_chief = roles.role_comm, roles.n_workers, roles.is_chief

    def after_step(self, clock, epoch, step_in_epoch, plan, history, collective=True) -> None:
        """Called by every worker after each clock. Collective when ``every_seconds`` is set
        and ``collective`` (False: a worker catching up after a recovery, whose peers took
        this step's decision already; only ``every_steps`` applies)."""
        due = self._due(clock)
        if self.c.every_seconds and collective:
            flag = int(self.is_chief and self._interval_over())
            due = due or bool(bcast_int(self.comm, flag))
        if due:
            self.write(clock, epoch, step_in_epoch, plan, history)

    def _interval_over(self) -> bool:
        """Whether ``every_seconds`` have passed since the first step or the end of the last
        checkpoint (the first call starts the interval). Local."""
        now = time.perf_counter()
        if self.last_time is None:
            self.last_time = now
            return False
        return now - self.last_time >= self.c.every_seconds

    def collective_at(self, clock) -> bool:
        """Whether :meth:`after_step` at ``clock`` is collective over the workers (a time-based
        decision every step, or a due checkpoint under async). Local."""
        return bool(self.c.every_seconds) or (self.async_cut and self._due(clock))

    def _due(self, clock) -> bool:
        """Whether ``every_steps`` asks for a checkpoint at ``clock``."""
        return bool(self.c.every_steps) and clock % self.c.every_steps == 0

    def at_end(self, clock, epoch, step_in_epoch, plan, history) -> None:
        """Final checkpoint after the last step (if ``at_end`` and not already taken)."""
        if self.c.at_end and self.last_step != clock:
            self.write(clock, epoch, step_in_epoch, plan, history)

    def at_stop(self, clock, epoch, step_in_epoch, plan, history) -> None:
        """The checkpoint of a stop signal at ``clock``, unless this clock's is written already
        (a periodic one at the same step, or the one resumed from). Found at 60 workers: a
        stop at a clock with a due checkpoint wrote that checkpoint twice, inside the grace
        time a batch system gives a signalled job. Collective as :meth:`write`."""
        if self.last_step != clock:
            self.write(clock, epoch, step_in_epoch, plan, history)

    def write(self, clock, epoch, step_in_epoch, plan, history) -> None:
        """Worker 0 writes the checkpoint at ``clock``; the others only note it.

        Not collective under BSP/SSP. Under async (``async_cut``) it is collective over the
        workers: each pushes what it holds locally, the push counts are gathered so that
        every server waits for exactly the pushes sent before the cut, and all workers wait
        (a barrier) until the checkpoint is written, so that no push crosses the cut.
        """
        self.last_step = clock
        pushes = None
        if self.async_cut:
            if self.flush is not None:
                self.flush()
            pushes = allgather_rows(self.comm, self.client.pushes_sent)
        try:
            if self.is_chief:
                self._write(clock, epoch, step_in_epoch, plan, history, pushes)
        finally:
            if self.async_cut:
                barrier(self.comm)
            self.last_time = time.perf_counter()

    def _write(self, clock, epoch, step_in_epoch, plan, history, pushes) -> None:
        t0 = time.perf_counter()
        d = ckpt.step_dir(self.cfg.output.dir, clock)
        shards = self.client.checkpoint(clock, pushes)
        partitions = {}
        for spec, part, slots in zip(self.client.specs, self.client.routing.parts, self.slot_names):
            if spec.dynamic:
                partitions[spec.name] = dict(storage="hash", num_keys=spec.num_keys,
                                             dim=spec.dim, dtype=spec.dtype,
                                             slots=list(slots))
                continue
            partitions[spec.name] = dict(
                num_keys=spec.num_keys, dim=spec.dim, dtype=spec.dtype, multiplier=part.multiplier,
                range_size=part.range_size, sparse=spec.sparse,
                slots=dict(slots) if isinstance(slots, dict) else list(slots),
                ranges=np.array([part.shard_range(s) for s in range(part.n_servers)], dtype=np.int64))
        path = ckpt.write_manifest(
            d, cfg_text=self.cfg.text, job_name=self.cfg.name, step=clock, epoch=epoch,
            step_in_epoch=step_in_epoch, steps_per_epoch=self.steps_per_epoch, n_workers=self.n_workers,
            worker_clocks=[clock] * self.n_workers,
            last_push_seq=(pushes.sum(axis=1) if pushes is not None else [0] * self.n_workers),
            shards=shards, partitions=partitions, history=history,
            extra={"epoch_plan": json.dumps(plan), **self.extra(),
                   **self.more()})
        ckpt.prune(self.cfg.output.dir, self.c.keep, warn=self._say, current=clock)
        dt = time.perf_counter() - t0
        nbytes = sum(n for n, _ in shards) + path.stat().st_size
        self.seconds += dt
        self.bytes += nbytes
        self.count += 1
        self._say(f"checkpoint {d.name}: {nbytes / 1e6:,.1f} MB in {dt:.2f} s")

    def _say(self, text) -> None:
        self.out.write(text + "\n")
        self.out.flush()
