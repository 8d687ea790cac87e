"""Epoch planning: which rows each worker reads, in which order, in how many steps (no MPI).

A job's epoch is read by ``n`` workers, each from its own partition in the order
:func:`epoch_order` draws. When the layout changes in the middle of an epoch (a worker lost in
continue mode, workers added by ``[elastic]``/``hpcps grow``, a resume on another number of
workers) the epoch is cut into *segments*: the rows no earlier segment reached are split over
the new workers (:func:`epoch_rows`), so every row is still read exactly once per epoch. The
*plan* of an epoch lists its earlier segments, oldest first, as ``[n_workers, steps_done]``
where ``steps_done`` is one count for every worker of the segment or a list of one count per
worker (a segment ended by the loss of a worker).

Everything here is a pure function of its arguments; the collectives that agree on the inputs
(the largest clock, the largest partition) are the caller's (:mod:`hpcps.worker.trainer`,
:mod:`hpcps.resilience.supervisor`).
"""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["epoch_order", "epoch_rows", "done_max", "steps_for", "capped_steps",
           "examples_per_step", "resume_position", "segment_done", "segment_steps",
           "rows_reassigned"]


def epoch_order(n_rows: int, seed: int, worker: int, epoch: int, shuffle: bool,
                block: int = 0) -> np.ndarray:
    """Order in which ``worker`` reads its ``n_rows`` rows in ``epoch``, int64.

    Drawn from numpy's PCG64 seeded with ``[seed, worker, epoch]``, so a position
    ``(epoch, step)`` fully restores a reader's random state after a restart.

    ``block > 0`` (streamed data, :mod:`hpcps.data.lines`): a *bounded* shuffle that permutes
    the rows within each run ``[k * block, (k + 1) * block)`` and keeps the runs in order, so
    a reader holds one run at a time.

    Returns
    -------
    int64 ndarray, shape (n_rows,)
        A permutation of ``0..n_rows-1`` (the identity when ``shuffle`` is False).
    """
    if not shuffle:
        return np.arange(n_rows, dtype=np.int64)
    rng = np.random.default_rng([seed, worker, epoch])
    if block and block < n_rows:
        out = np.empty(n_rows, dtype=np.int64)
        for a in range(0, n_rows, int(block)):
            b = min(a + int(block), n_rows)
            out[a:b] = a + rng.permutation(b - a)
        return out
    return rng.permutation(n_rows).astype(np.int64)


def epoch_rows(part_sizes, plan, n_workers, seed, epoch, shuffle, batch_size, block=0) -> list:
    """Rows (global indices into the split) each of ``n_workers`` workers reads in the rest
    of an epoch that was interrupted and resumed on different numbers of workers.

    Parameters
    ----------
    part_sizes : sequence of int
        Row counts of the partitions of the epoch's first segment (``plan[0][0]`` workers);
        the split is their concatenation in worker order.
    plan : list of [n_workers, steps_done]
        The epoch's earlier segments, oldest first; ``steps_done`` is one count for all the
        segment's workers or a list of one count per worker (a segment ended by the loss of a
        worker, :mod:`hpcps.resilience.recovery`).
    n_workers : int
        Workers of the segment about to run.
    block : int
        As :func:`epoch_order`'s (0: a full shuffle of each partition).

    Returns
    -------
    list of int64 ndarray, one per worker: contiguous blocks of the rows that no earlier
    segment reached (in the order the earlier readers would have read them), so that every
    row of the epoch is read exactly once over all segments.

    Raises
    ------
    ValueError
        A segment of ``plan`` names another number of workers than the segment before it
        split the rows over, or lists a step count per worker of the wrong length.
    """
    offsets = np.concatenate([[0], np.cumsum(part_sizes)]).astype(np.int64)
    lists = [offsets[w] + epoch_order(int(n), seed, w, epoch, shuffle, block)
             for w, n in enumerate(part_sizes)]
    for k, (n_k, done) in enumerate(plan):
        if len(lists) != n_k:
            raise ValueError(f"epoch plan segment {k} has {n_k} workers but {len(lists)} row lists")
        per = list(done) if isinstance(done, (list, tuple)) else [done] * n_k
        if len(per) != n_k:
            raise ValueError(f"epoch plan segment {k} has {n_k} workers but {len(per)} step counts")
        rest = (np.concatenate([r[int(d) * batch_size:] for r, d in zip(lists, per)]) if lists
                else np.empty(0, np.int64))
        nxt = plan[k + 1][0] if k + 1 < len(plan) else n_workers
        lists = np.array_split(rest, nxt)
    return lists


def done_max(done) -> int:
    """The most steps any worker of a plan segment finished (``done``: int or list of int)."""
    return max(done) if isinstance(done, (list, tuple)) else int(done)


def steps_for(n_rows: int, batch_size: int) -> int:
    """Steps that read ``n_rows`` rows in batches of ``batch_size`` (the last may be short).

    Under BSP every worker runs the largest partition's count: the caller takes the maximum
    over the workers (:meth:`hpcps.worker.trainer.Trainer.max_steps`).
    """
    return math.ceil(n_rows / batch_size)


def segment_steps(lists, batch_size: int, max_steps: int, plan=()) -> int:
    """Steps of a re-planned segment whose workers read ``lists`` (every worker's rows, as
    :func:`epoch_rows` gives them) after the epoch's earlier segments ``plan``: the longest
    list's count (under BSP every worker runs it), capped by ``[train] max_steps``. The same on
    every worker, with no collective: a worker that must know the segment's steps without
    having finished its re-plan (:meth:`hpcps.resilience.supervisor.Supervisor.regroup_or_recover`)
    gets what the others use."""
    longest = max((steps_for(int(r.size), batch_size) for r in lists), default=0)
    return capped_steps(longest, max_steps, plan)


def capped_steps(steps: int, max_steps: int, plan=()) -> int:
    """``steps`` of a segment capped by ``[train] max_steps`` (0: no cap), less the steps the
    epoch's earlier segments (``plan``) already ran."""
    if not max_steps:
        return steps
    return min(steps, max(0, max_steps - sum(done_max(n) for _, n in plan)))


def examples_per_step(n_train: int, batch_size: int, n_workers: int, largest: int = 0) -> float:
    """Average examples one clock of ``n_workers`` workers reads (progress lines' rate).

    ``largest``: rows of the largest partition when known (0: partitions of equal size).
    An epoch runs as many clocks as that partition needs, so unequal partitions (a compressed
    file read whole by one worker, :meth:`hpcps.data.lineindex.LineIndex.part_bounds`) read
    fewer rows per clock than ``batch_size * n_workers``.
    """
    rows = largest if largest else n_train / max(1, n_workers)
    return n_train / max(1, math.ceil(rows / batch_size))


def resume_position(restore: dict, n_workers: int) -> tuple[int, int, list]:
    """Where training continues from a checkpoint's manifest: ``(epoch, step, plan)``.

    Parameters
    ----------
    restore : dict
        The manifest (:func:`hpcps.checkpoint.read_manifest`): ``epoch``, ``step_in_epoch``,
        ``n_workers`` and ``epoch_plan`` (JSON text of the epoch's plan, may be absent).
    n_workers : int
        Workers of this launch. With another number than the checkpointed job, the
        interrupted epoch gains a segment ``[old_workers, step_in_epoch]`` and continues at
        step 0 of the re-planned rest (:func:`epoch_rows`).
    """
    epoch, step = int(restore["epoch"]), int(restore["step_in_epoch"])
    plan = json.loads(restore.get("epoch_plan", "[]"))
    if int(restore["n_workers"]) != n_workers:
        plan = plan + [[int(restore["n_workers"]), step]]
        step = 0
    return epoch, step, plan


def segment_done(clocks, seg_clock0: int, steps: int) -> list:
    """Steps of a segment each worker finished, from the clocks the workers had reached.

    ``clocks[w]`` is worker ``w``'s clock, ``seg_clock0`` the clock at the segment's start,
    ``steps`` the segment's step count (a clock past the segment counts as ``steps``).
    """
    return [int(min(max(0, c - seg_clock0), steps)) for c in clocks]


def rows_reassigned(prev_lists, done, lost, batch_size: int) -> int:
    """Rows of the segment that the workers in ``lost`` had not read yet (their share of the
    re-plan): ``prev_lists[w]`` is worker ``w``'s rows of the segment, ``done[w]`` its steps."""
    return int(sum(max(0, prev_lists[w].size - done[w] * batch_size) for w in lost))
