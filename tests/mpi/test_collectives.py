# mpi-ranks: 3
"""The epoch evaluation's gather (:class:`hpcps.worker.evaluation.EpochGather`) and
:func:`hpcps.comm.collectives.gatherv` with known counts, between real MPI ranks: every rank's
loss sums, predictions and labels on rank 0 in rank order; the labels and counts gathered once
per communicator; a rank whose predictions change size is told (ValueError naming its rank).

Run: ``mpirun -n 3 python -m pytest --with-mpi tests/mpi/test_collectives.py``.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm.collectives import gatherv
from hpcps.worker.evaluation import EpochGather


@pytest.mark.mpi(min_size=2)
def test_gatherv_with_known_counts_concatenates_in_rank_order():
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    counts = [k + 1 for k in range(n)]
    got = gatherv(comm, np.full(r + 1, float(r)), counts=counts)
    if r == 0:
        assert got.tolist() == [float(k) for k in range(n) for _ in range(k + 1)]
    else:
        assert got is None
    with pytest.raises(ValueError, match=f"rank {r}"):      # local: nothing sent
        gatherv(comm, np.zeros(r + 2), counts=counts)


@pytest.mark.mpi(min_size=2)
def test_epoch_gather_sums_losses_and_keeps_labels_of_its_communicator():
    world = MPI.COMM_WORLD
    comm = world.Dup()
    r, n = comm.Get_rank(), comm.Get_size()
    g = EpochGather()
    preds = np.arange(r + 1, dtype=np.float64) / 10 + r       # worker r: r + 1 test rows
    labels = np.full(r + 1, float(r % 2))
    calls = []

    def gather(epoch, labels_given):
        calls.append(epoch)
        return g.gather(comm, loss_sum=1.5 * (r + 1) + epoch, n_ex=10 * (r + 1), preds=preds,
                        labels=labels_given)

    first = gather(0, labels)
    # the labels are gathered once: the second epoch's are not read (garbage here)
    second = gather(1, np.full(r + 1, 99.0))
    want_p = [float(k) + j / 10 for k in range(n) for j in range(k + 1)]
    want_y = [float(k % 2) for k in range(n) for _ in range(k + 1)]
    if r == 0:
        for epoch, got in enumerate((first, second)):
            loss, ex, p, y = got
            assert loss == pytest.approx(sum(1.5 * (k + 1) + epoch for k in range(n)))
            assert ex == sum(10 * (k + 1) for k in range(n))
            assert p.tolist() == pytest.approx(want_p) and y.tolist() == want_y
    else:
        assert first is None and second is None
    # another size on one rank is an error there, before anything is sent
    if r == n - 1:
        with pytest.raises(ValueError, match=f"rank {r}"):
            g.gather(comm, 0.0, 1, np.zeros(r + 5), labels)
    # a new communicator (a recovery or growth): labels and counts gathered again
    other = world.Dup()
    got = g.gather(other, 0.0, 1, np.zeros(2 * (r + 1)), np.full(r + 1, 7.0))
    if r == 0:
        assert got[2].size == sum(2 * (k + 1) for k in range(n))
        assert got[3].tolist() == [7.0] * sum(k + 1 for k in range(n))
    comm.Free()
    other.Free()
