# mpi-ranks: 2 3
"""The non-blocking stop/grow vote of SSP and async workers (:class:`hpcps.comm.collectives.Vote`)
between real MPI ranks that step at different speeds: whatever a round shows, every rank acts
on it at one clock, and a collective that all ranks make at the same clock (an epoch's
evaluation, a checkpoint) never meets a rank that is agreeing on that clock.

Found in CI (900446a): under async a worker that saw a stop round mid-epoch waited in the clock
``Allreduce`` while a faster worker, whose own round carried the stop, had gone on to the
epoch's evaluation (``MPI_ERR_TRUNCATE``, a mismatched collective).

Run: ``python tests/run.py --group mpi --file test_vote.py`` (both sizes), or ``mpirun -n 2
python -m pytest --with-mpi tests/mpi/test_vote.py`` (and ``-n 3``; with more ranks than cores
``--map-by :OVERSUBSCRIBE``, as root the variables of the README's "Tests").
"""

import time
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm.collectives import Vote, allgather_rows, allreduce_sum
from hpcps.config.sections import CheckpointConfig
from hpcps.worker.checkpointer import Checkpointer

STEPS = 12          # steps per epoch


def run_epochs(vote, comm, epochs, want_at, delay, sync_every=STEPS):
    """Step ``epochs`` epochs of ``STEPS``; ``want_at(clock)`` is this rank's offer after the
    step that ended at ``clock``; a sync point (an Allreduce of two float64, the shape of an
    epoch's evaluation) every ``sync_every`` clocks. Returns (clock, values) of the agreed
    result, or (clock, None) after the last epoch."""
    clock = 0
    for _ in range(epochs):
        for step in range(STEPS):
            time.sleep(delay)
            clock += 1
            sync = clock % sync_every == 0
            got = vote.decide(want_at(clock), clock, sync=sync)
            if got is not None:
                return clock, got
            if sync:
                allreduce_sum(comm, np.array([1.0, float(clock)]))
    return clock, None


def _finish(vote, comm, clock, got):
    vote.finish()
    agreed = allgather_rows(comm, [clock, -1 if got is None else int(got[0])])
    return agreed


@pytest.mark.mpi(min_size=2)
def test_a_stop_offered_by_the_fast_rank_at_its_epoch_end_stops_everyone_there():
    """The fastest rank asks to stop at its epoch's last step and reaches the sync point long
    before the others see the round: all stop at that clock, no rank runs the evaluation."""
    comm = MPI.COMM_WORLD
    fast = comm.rank == comm.size - 1
    vote = Vote(comm, 3)
    clock, got = run_epochs(vote, comm, 2, lambda c: [int(fast and c >= STEPS), 0, 0],
                            0.0 if fast else 0.01)
    agreed = _finish(vote, comm, clock, got)
    assert agreed.tolist() == [[STEPS, 1]] * comm.size


@pytest.mark.mpi(min_size=2)
def test_a_stop_offered_mid_epoch_by_a_slow_rank_stops_everyone_at_one_clock():
    """The slowest rank asks mid-epoch while the others may already be waiting at the epoch's
    end: all act at one clock, the largest any rank had when it saw the round."""
    comm = MPI.COMM_WORLD
    slow = comm.rank == 0
    vote = Vote(comm, 3)
    clock, got = run_epochs(vote, comm, 3, lambda c: [int(slow and c >= STEPS + 4), 0, 0],
                            0.01 if slow else 0.0)
    agreed = _finish(vote, comm, clock, got)
    assert agreed[:, 1].tolist() == [1] * comm.size
    assert len(set(agreed[:, 0].tolist())) == 1
    assert STEPS + 4 <= agreed[0, 0] <= 2 * STEPS      # not later than that epoch's end


@pytest.mark.mpi(min_size=2)
def test_a_grow_value_offered_under_sync_points_every_step_is_seen_at_one_clock():
    """Sync points every step (a time-based checkpoint decision): the value reaches every
    rank at the same clock, the rank that offered it included."""
    comm = MPI.COMM_WORLD
    vote = Vote(comm, 3)
    asks = comm.rank == 1
    clock, got = run_epochs(vote, comm, 2, lambda c: [0, 2, 1] if asks and c >= 5 else [0, 0, 0],
                            0.002 * comm.rank, sync_every=1)
    agreed = allgather_rows(comm, [clock, int(got[1]), int(got[2])])
    vote.finish()
    assert agreed.tolist() == [[5, 2, 1]] * comm.size


@pytest.mark.mpi(min_size=2)
def test_no_value_offered_every_epoch_ends_in_its_collective():
    """Nothing asked: the sync points pass (their Allreduce matches on every rank) and the
    vote finishes with its rounds evened out."""
    comm = MPI.COMM_WORLD
    vote = Vote(comm, 3)
    clock, got = run_epochs(vote, comm, 3, lambda c: [0, 0, 0], 0.003 * comm.rank)
    agreed = _finish(vote, comm, clock, got)
    assert agreed.tolist() == [[3 * STEPS, -1]] * comm.size


# When a worker's checkpoint decision is a collective of the workers (Checkpointer.collective_at):
# the trainer settles the vote before each such clock (local; no MPI traffic)


def _ck(async_cut, **kw):
    cfg = SimpleNamespace(checkpoint=CheckpointConfig(**kw))
    return Checkpointer(cfg, None, None, True, 2, [], None, async_cut=async_cut)


def test_a_time_based_decision_is_collective_at_every_clock():
    for async_cut in (False, True):
        ck = _ck(async_cut, every_seconds=30.0)
        assert all(ck.collective_at(c) for c in range(1, 8))


def test_step_count_checkpoints_are_collective_under_async_only_when_due():
    ck = _ck(True, every_steps=5)
    assert [c for c in range(1, 16) if ck.collective_at(c)] == [5, 10, 15]
    assert not any(_ck(False, every_steps=5).collective_at(c) for c in range(1, 16))


def test_without_periodic_checkpoints_no_clock_between_epochs_is_collective():
    assert not any(_ck(True).collective_at(c) for c in range(1, 16))
