"""The survivors' agreement after a failure, as data (no MPI): what each survivor reports
(:class:`ServerReport`, :class:`WorkerReport`, one int64 row each, :func:`report_row`) and the
plan every survivor computes from the gathered rows (:func:`make_plan`): which ranks died, the
chain of servers of each key range now, the clocks to settle and to resend from. The
collective part (gather, retry, rebuild the communicators) is :mod:`hpcps.resilience.recovery`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpcps.core import placement

#: Row fields before the per-range and per-worker blocks (see :func:`report_row`).
_HEAD = 3


@dataclass
class ServerReport:
    """What a surviving server tells the others (:func:`report_row`).

    Attributes
    ----------
    server_id : int
        Its original index (place on the ring).
    copies : int64 ndarray (n_ranges,)
        Steps applied in its copy of each range (as primary or backup), -1 where it holds none.
    clocks : int64 ndarray (n_old_workers,)
        CLOCK messages received from each old worker (the largest over its ranges).
    examples : int64 ndarray (n_old_workers,)
        Examples of that worker's last CLOCK.
    epochs : int64 ndarray (n_old_workers,) or None
        Epoch (0-based) of that CLOCK (None: zeros).
    checkpoints : list of int
        Steps of the checkpoints its ranges wrote (or the job resumed from).
    """

    server_id: int
    copies: np.ndarray
    clocks: np.ndarray
    examples: np.ndarray
    checkpoints: list = field(default_factory=list)
    epochs: np.ndarray | None = None


@dataclass
class WorkerReport:
    """What a surviving worker tells the others.

    Attributes
    ----------
    clock : int
        Steps it finished (its CLOCKs completed).
    epochs : int
        Epochs it finished (their closing barrier completed).
    kept : int64 ndarray (n_ranges,) or None
        First step whose pushes and CLOCK it still keeps for each range; None when it keeps
        nothing (async), then its steps are settled from the servers' counts only.
    """

    clock: int
    kept: np.ndarray | None = None
    epochs: int = 0


@dataclass
class Plan:
    """What every survivor computes from the gathered rows (identical on every rank).

    Attributes
    ----------
    alive_ids : list of int
        Original indices of the surviving servers, ascending (new server index = position).
    dead_ids : list of int
        Original indices of the servers that died in this failure.
    chains : list of list of int
        ``[primary, backup, ...]`` of each range, original server indices.
    holders : list of dict
        Per range, ``{server id: clock}`` of the copies the survivors hold.
    source_clock : int64 ndarray (n_ranges,)
        ``S_r``: clock of the copy each range resumes from (-1: none survived).
    kept : int64 ndarray (n_ranges,)
        ``B_r``: the largest first step the surviving workers keep per range (-1: none).
    clocks, examples, last_epochs : int64 ndarray (n_old_workers,)
        ``C_w``, and the examples and epoch (0-based) of each old worker's last step.
    epochs : int
        The most epochs a surviving worker finished: the others finish theirs at once (a
        closing barrier can complete on some workers and be left by others).
    lost_ranges : list of int
        Ranges with no surviving copy.
    resend : bool
        Every surviving worker keeps its pushes (BSP/SSP): ranges drop their unapplied ones.
    """

    alive_ids: list
    dead_ids: list
    chains: list
    holders: list
    source_clock: np.ndarray
    kept: np.ndarray
    clocks: np.ndarray
    examples: np.ndarray
    lost_ranges: list
    resend: bool
    epochs: int = 0
    last_epochs: np.ndarray | None = None

    def base(self, reload_step: int = 0) -> np.ndarray:
        """``base_r`` of every range; a lost range's source is the checkpoint step."""
        src = self.source_clock.copy()
        for r in self.lost_ranges:
            src[r] = reload_step
        return np.maximum(src, self.kept)

    def lost_steps(self, reload_step: int = 0) -> np.ndarray:
        """Steps of updates each range lost (non-zero only for reloaded ranges)."""
        out = np.zeros(len(self.chains), dtype=np.int64)
        for r in self.lost_ranges:
            out[r] = max(0, int(self.kept[r]) - reload_step)
        return out


def report_row(report, n_ranges: int, n_old: int) -> np.ndarray:
    """The int64 row a survivor contributes: ``[is_server, id, clock, per range (n_ranges),
    three blocks per old worker (n_old each)]``. Servers: id = ring index, clock -1, copy
    clocks, CLOCK counts, last examples, last epochs. Workers: epochs finished, own clock, kept
    first steps (-1 each when it keeps nothing), zeros."""
    row = np.zeros(_HEAD + n_ranges + 3 * n_old, dtype=np.int64)
    if isinstance(report, ServerReport):
        row[:_HEAD] = [1, report.server_id, -1]
        row[_HEAD:_HEAD + n_ranges] = report.copies
        w0 = _HEAD + n_ranges
        row[w0:w0 + n_old] = report.clocks
        row[w0 + n_old:w0 + 2 * n_old] = report.examples
        if report.epochs is not None:
            row[w0 + 2 * n_old:] = report.epochs
    else:
        row[:_HEAD] = [0, report.epochs, report.clock]
        row[_HEAD:_HEAD + n_ranges] = -1 if report.kept is None else report.kept
    return row


def make_plan(rows: np.ndarray, n_ranges: int, replicas: int, n_old: int, old_ids,
              worker_old_index) -> Plan:
    """The recovery plan from the gathered rows (module docstring). Local and deterministic:
    every survivor computes the same plan.

    Parameters
    ----------
    rows : int64 ndarray (n_survivors, 3 + n_ranges + 3 n_old)
        :func:`report_row` of every survivor.
    n_ranges, replicas, n_old : int
    old_ids : sequence of int
        Original indices of the servers of the old layout.
    worker_old_index : sequence of int
        For each row, the old worker index of a worker row (ignored for servers).
    """
    srv = rows[rows[:, 0] == 1]
    wrk_mask = rows[:, 0] == 0
    wrk = rows[wrk_mask]
    alive_ids = sorted(int(i) for i in srv[:, 1])
    dead_ids = sorted(set(int(i) for i in old_ids) - set(alive_ids))
    copies = srv[:, _HEAD:_HEAD + n_ranges]
    holders = [{int(srv[i, 1]): int(copies[i, r]) for i in range(len(srv)) if copies[i, r] >= 0}
               for r in range(n_ranges)]
    chains = placement.chains(alive_ids, n_ranges, replicas, [list(h) for h in holders])
    source = np.array([holders[r].get(chains[r][0], -1) if chains[r] else -1
                       for r in range(n_ranges)], dtype=np.int64)
    lost = [r for r in range(n_ranges) if not holders[r]]
    kept = wrk[:, _HEAD:_HEAD + n_ranges]
    resend = bool(len(wrk)) and bool((kept >= 0).all())
    kept_max = kept.max(axis=0) if len(wrk) else np.full(n_ranges, -1, dtype=np.int64)
    w0 = _HEAD + n_ranges
    counts = srv[:, w0:w0 + n_old]
    last = srv[:, w0 + n_old:w0 + 2 * n_old]
    last_epoch = srv[:, w0 + 2 * n_old:w0 + 3 * n_old]
    clocks = np.zeros(n_old, dtype=np.int64)
    examples = np.zeros(n_old, dtype=np.int64)
    last_epochs = np.zeros(n_old, dtype=np.int64)
    if len(srv):
        best = counts.argmax(axis=0)
        clocks[:] = counts.max(axis=0)
        examples[:] = last[best, np.arange(n_old)]
        last_epochs[:] = last_epoch[best, np.arange(n_old)]
    if resend:
        own = np.asarray(worker_old_index)[wrk_mask]
        for o, c in zip(own, wrk[:, 2]):
            clocks[int(o)] = max(int(clocks[int(o)]), int(c))
    return Plan(alive_ids=alive_ids, dead_ids=dead_ids, chains=chains, holders=holders,
                source_clock=source, kept=kept_max, clocks=clocks, examples=examples,
                lost_ranges=lost, resend=resend, epochs=int(wrk[:, 1].max()) if len(wrk) else 0,
                last_epochs=last_epochs)


def lost_message(on_server_loss: str, plan, failed_world) -> str:
    """The ``ServerLost`` message of a recovery that found key ranges with no surviving copy
    (``plan``: its ``dead_ids`` and ``lost_ranges``; ``failed_world``: the dead world ranks)."""
    where = ", ".join(f"server {s}" for s in plan.dead_ids) or "a server"
    ranks = ", ".join(map(str, failed_world))
    # under async 'restart' is the only choice whatever the job file says (a trial read the
    # job file's key named for a job that never set it)
    why = ("[fault_tolerance] on_server_loss = 'restart', the job file's or, under async, the "
           "only choice" if on_server_loss == "restart" else "no server survived")
    return (f"{where} (rank(s) {ranks}) died and key range(s) "
            f"{', '.join(map(str, plan.lost_ranges))} have no surviving copy ({why}); the job "
            "stops and resumes from its last checkpoint on a restart (hpcps run --max-restarts, "
            "or the Slurm script's requeue)")
