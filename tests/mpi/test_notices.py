# mpi-ranks: 3 4
"""The notice of an input error (:mod:`hpcps.comm.notices`) between real MPI ranks: every other
rank prints one line naming itself and the origin and acknowledges it; two origins at once
each get every acknowledgement and print nothing of the other's; only input errors are told.
The abort that follows in a job is tested end to end in
``tests/e2e/test_input_error_every_rank.py``.

Run: ``mpirun -n 3 python -m pytest --with-mpi tests/mpi/test_notices.py`` (and ``-n 4``).
"""

import io
import time

import pytest
from mpi4py import MPI

from hpcps.comm import notices


def _wait_for(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.mark.mpi(min_size=2)
def test_every_other_rank_prints_one_line_and_acknowledges():
    comm = MPI.COMM_WORLD
    out = io.StringIO()
    listener = notices.listen(comm, out)
    assert listener is not None                       # mpi4py's default: THREAD_MULTIPLE
    try:
        comm.Barrier()
        if comm.rank == 1:
            got = notices.tell_others(65, "DataError: /d/part-1.tsv:7: 3 fields, expected 40\n"
                                          "a second line that is not sent")
            assert got == comm.size - 1
        else:
            assert _wait_for(lambda: out.getvalue().endswith("\n"))
        comm.Barrier()
        host = MPI.Get_processor_name()
        if comm.rank == 1:
            assert out.getvalue() == "" and listener.heard is None
        else:
            assert out.getvalue() == notices.notice_line(
                comm.rank, host, 1, host, "DataError: /d/part-1.tsv:7: 3 fields, expected 40") + "\n"
            assert out.getvalue() == (f"hpcps: rank {comm.rank} on {host}: stopped: rank 1 on "
                                      f"{host} found an input error: DataError: /d/part-1.tsv:7: "
                                      "3 fields, expected 40\n")
            assert listener.heard == ("1", 65)
    finally:
        notices.stop(listener)                          # also cancels the fallback abort
    assert not listener._thread.is_alive()


@pytest.mark.mpi(min_size=3)
def test_two_origins_at_once_each_get_every_acknowledgement():
    comm = MPI.COMM_WORLD
    out = io.StringIO()
    listener = notices.listen(comm, out)
    try:
        comm.Barrier()
        if comm.rank in (0, 1):
            assert notices.tell_others(74, f"CheckpointError: rank {comm.rank}") == comm.size - 1
        else:
            assert _wait_for(lambda: out.getvalue().endswith("\n"))
        comm.Barrier()
        time.sleep(3 * notices.POLL_SECONDS)            # a second notice is heard, not printed
        lines = out.getvalue().splitlines()
        if comm.rank in (0, 1):
            assert lines == []                          # an origin prints only its own error
        else:
            assert len(lines) == 1 and "found an input error: CheckpointError: rank " in lines[0]
    finally:
        notices.stop(listener)


@pytest.mark.mpi(min_size=2)
def test_only_input_errors_are_told():
    comm = MPI.COMM_WORLD
    out = io.StringIO()
    listener = notices.listen(comm, out)
    try:
        for status in (1, 75, 0):
            assert notices.tell_others(status, "RuntimeError: a bug") is None
        comm.Barrier()
        time.sleep(3 * notices.POLL_SECONDS)
        assert out.getvalue() == ""
    finally:
        notices.stop(listener)
    assert notices.tell_others(65, "DataError: x") is None     # no listener: nothing to tell


@pytest.mark.mpi(min_size=2)
def test_stop_frees_the_communicators_follow_made():
    """Found by a trial (2026-12-05): each growth's ``follow`` left a duplicate of the old and
    added ranks' communicator, and after two growths Open MPI's finalize, which disconnects
    what is left, crashed or hung. A notice after ``follow`` goes over the new one."""
    comm = MPI.COMM_WORLD
    out = io.StringIO()
    listener = notices.listen(comm, out)
    first = listener.comm
    notices.follow(comm)
    notices.follow(comm)
    old = list(listener.retired)
    assert len(old) == 2 and old[0] is first and listener.comm not in old
    comm.Barrier()
    if comm.rank == 0:
        assert notices.tell_others(65, "DataError: x:1: bad") == comm.size - 1
    else:
        assert _wait_for(lambda: out.getvalue().endswith("\n"))
    comm.Barrier()
    notices.stop(listener)
    assert listener.retired == [] and listener.comm == MPI.COMM_NULL
    assert all(c == MPI.COMM_NULL for c in old)
    notices.follow(comm)                  # not listening: its duplicate is freed at once


def test_a_notice_keeps_its_first_line_and_fits():
    raw = notices.encode_notice(65, 3, "node7", "DataError: " + "é" * 2000 + "\nmore")
    assert len(raw) <= notices.NOTICE_BYTES
    status, rank, host, first = notices.decode_notice(raw)
    assert (status, rank, host) == (65, "3", "node7")
    assert first.startswith("DataError: éé") and "\n" not in first
    assert notices.decode_notice(b"garbage") == (1, "?", "?", "")
