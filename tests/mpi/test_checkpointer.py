# mpi-ranks: 1 2
"""Time-based checkpoints (``[checkpoint] every_seconds``) between real MPI ranks: worker 0
decides at every step and every worker follows (:meth:`Checkpointer.after_step`'s ``Bcast``).

Found by a trial (2026-12-05, Criteo, ``every_seconds = 5``): the interval started when the
checkpointer was made and restarted when a checkpoint began, so a fresh run checkpointed at its
first step (its data index pass had outlasted the interval), every resume one step after the
one it resumed from, and a write that outlasted the interval was followed by another at the
next step (5.08 s, then 15.65 s one step later): 27-36 % of those runs' time was checkpoints.
The interval now starts at the first step and again when a checkpoint ends.

Run: ``python tests/run.py --group mpi --file test_checkpointer.py`` (both sizes), or
``mpirun -n 2 python -m pytest --with-mpi tests/mpi/test_checkpointer.py`` (as root with the
variables of the README's "Tests").
"""

import time
from types import SimpleNamespace

import pytest
from mpi4py import MPI

from hpcps.config.sections import CheckpointConfig
from hpcps.worker.checkpointer import Checkpointer

INTERVAL = 0.2      # every_seconds
STEP = 0.01         # seconds per step


class Recorded(Checkpointer):
    """A checkpointer whose chief's write takes ``write_s`` and records the clock (no files)."""

    def __init__(self, comm, write_s, **config):
        cfg = SimpleNamespace(checkpoint=CheckpointConfig(**(config or {"every_seconds": INTERVAL})))
        super().__init__(cfg, None, comm, comm.rank == 0, comm.size, [], None)
        self.write_s = write_s
        self.written = []

    def _write(self, clock, epoch, step_in_epoch, plan, history, pushes):
        time.sleep(self.write_s)
        self.written.append(clock)


def run(ck, steps, before=0.0):
    """``before`` seconds of start-up (an index pass, a resume), then ``steps`` steps; the
    clocks at which every rank took a checkpoint."""
    time.sleep(before)
    got = []
    for clock in range(1, steps + 1):
        time.sleep(STEP)
        ck.after_step(clock, 0, clock, None, [])
        if ck.last_step == clock:
            got.append(clock)
    return got


@pytest.mark.mpi(min_size=1)
def test_no_checkpoint_at_the_first_step_after_a_long_start():
    comm = MPI.COMM_WORLD
    ck = Recorded(comm, write_s=0.0)
    got = run(ck, 5, before=2 * INTERVAL)        # 5 steps: 0.05 s, well inside the interval
    assert got == [], got
    assert comm.allgather(got) == [got] * comm.size


@pytest.mark.mpi(min_size=1)
def test_a_write_longer_than_the_interval_is_not_followed_by_another_at_once():
    comm = MPI.COMM_WORLD
    ck = Recorded(comm, write_s=1.5 * INTERVAL)
    got = run(ck, 120)                            # ~1.2 s of steps + the writes
    assert len(got) >= 2, got
    gaps = [b - a for a, b in zip(got, got[1:])]
    # the next checkpoint comes an interval (~INTERVAL / STEP steps) after the write ended
    assert min(gaps) >= (INTERVAL / STEP) // 2, got
    assert comm.allgather(got) == [got] * comm.size


@pytest.mark.mpi(min_size=1)
def test_a_stop_at_a_checkpointed_clock_writes_no_second_checkpoint():
    """Found at 60 workers (SSP, every_steps = 20): a stop signal decided at clock 20 wrote
    step-00000020 again right after the periodic one, inside a batch system's grace time."""
    comm = MPI.COMM_WORLD
    ck = Recorded(comm, write_s=0.0, every_steps=10)
    for clock in range(1, 11):
        ck.after_step(clock, 0, clock, None, [])
    ck.at_stop(10, 0, 10, None, [])                 # the stop at the checkpoint's clock
    ck.after_step(11, 0, 11, None, [])
    ck.at_stop(11, 0, 11, None, [])                 # a stop between checkpoints writes one
    assert ck.written == ([10, 11] if comm.rank == 0 else []), ck.written
    assert ck.last_step == 11
