# mpi-ranks: 2 3
"""The small collectives of :mod:`hpcps.comm.collectives` between real MPI ranks: the per-step
vote's ``allreduce_max`` waited for by polling and sleeping (``spin``), as workers do on
oversubscribed cores, gives what the blocking ``MPI_Allreduce`` gives, also when one rank
comes late; the non-blocking :class:`~hpcps.comm.collectives.Vote` shows a value offered by one
rank to every rank.

Run: ``mpirun -n 2 python -m pytest --with-mpi tests/mpi/test_collectives.py`` (and ``-n 3``).
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm.collectives import Vote, allreduce_max


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spin", [None, 0.0, 5e-5])
def test_allreduce_max_with_a_sleeping_wait_equals_the_blocking_one(spin):
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    for late in range(n):                      # each rank in turn arrives 0.1 s late
        mine = np.array([r, -r, 7 * (r == late)], dtype=np.int64)
        if r == late:
            time.sleep(0.1)
        got = allreduce_max(comm, mine, spin=spin)
        assert got.tolist() == [n - 1, 0, 7]
        assert mine.tolist() == [r, -r, 7 * (r == late)]      # the input is left as it was


@pytest.mark.mpi(min_size=2)
def test_vote_shows_one_ranks_value_on_every_rank():
    comm = MPI.COMM_WORLD
    vote = Vote(comm, 2)
    want = np.array([0, 5 if comm.Get_rank() == comm.Get_size() - 1 else 0], dtype=np.int64)
    seen, deadline = None, time.monotonic() + 20
    while time.monotonic() < deadline:
        res = vote.poll(want)
        if res is not None and res.any():
            seen = res.tolist()
            break
        time.sleep(0.001)
    vote.finish()
    assert seen == [0, 5]
