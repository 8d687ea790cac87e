# mpi-ranks: 3 4
"""One-sided pulls from ``Win.Allocate`` shard windows (real MPI ranks, real windows).

* an RMA pull returns exactly what a p2p pull returns for the same keys at the same clock
  (keys on both servers, duplicates, empty key sets, float32 and float64);
* an RMA pull completes while the server is busy applying a large update;
* allocating and freeing windows repeatedly does not grow memory; use after free is an error.
"""

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm import core
from hpcps.comm.membership import Membership
from hpcps.comm.rma import ShardWindow, WindowFreedError, allocate_windows, free_windows
from hpcps.comm.transport import ServerEndpoint
from hpcps.core.consistency import BSP, H_SEQ, H_VERSION, SSP, Async, header_len
from hpcps.core.optim import Optimizer
from hpcps.server.server import ParameterServer, window_sizes
from hpcps.core.tables import TableSpec
from hpcps.worker.client import PSClient


def _ps(comm, n_servers, tables, policy, worker_fn):
    """Servers serve from RMA windows; workers call ``worker_fn(client, roles)``."""
    roles = core.split_roles(comm, n_servers)
    specs = [t[0] for t in tables]
    result = None
    try:
        sizes = (window_sizes(specs, roles.index, roles.n_servers, roles.n_workers)
                 if roles.role == core.SERVER else [0] * len(specs))
        windows = allocate_windows(roles.ps, sizes)
        if roles.role == core.SERVER:
            ep = ServerEndpoint(roles.ps, 1 << 30)
            server = ParameterServer.initial(ep, roles.index, roles.n_servers, roles.worker_ranks,
                                             tables, policy, windows=windows)
            roles.ps.Barrier()
            server.serve()
        else:
            client = PSClient(Membership(roles, windows, specs=specs), policy)
            roles.ps.Barrier()
            with core.abort_on_error(comm):   # a failed check must not leave ranks waiting
                result = worker_fn(client, roles)
            client.stop()
        comm.Barrier()
        free_windows(windows)
    finally:
        roles.free()
    return roles, result


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("dtype,policy", [("float64", BSP()), ("float32", BSP()),
                                          ("float64", SSP(1))])
def test_rma_pull_equals_p2p_pull(dtype, policy):
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 10_007, 3, dtype, sparse=True)
    dense = TableSpec("d", 50, 2, dtype, sparse=False)      # key order: ranges split 0-24/25-49
    tables = [(spec, Optimizer("adagrad", 0.3)), (dense, Optimizer("sgd", 0.5))]
    rng = np.random.default_rng(comm.rank)
    compared = [0]

    def pull(client, table, keys, fresh, rma):
        windows = client.windows
        client.windows = windows if rma else None
        try:
            out = client.pull(table, keys, fresh=fresh)
        finally:
            client.windows = windows
        return out, client.read_version[client.ids[table]].copy()

    def work(client, roles):
        seen = []
        for t in range(4):
            keys = rng.choice(10_007, size=500, replace=True).astype(np.int64)
            client.push("w", keys, rng.standard_normal((500, 3)))
            client.push("d", np.arange(20, 30), rng.standard_normal((10, 2)))
            client.clock(500)
            probes = [np.arange(10_007), keys[::-1], np.array([5, 5, 5, 10_006]),
                      np.empty(0, dtype=np.int64)]
            for k in probes:
                for fresh in (False, True):
                    a, va = pull(client, "w", k, fresh, rma=False)
                    b, vb = pull(client, "w", k, fresh, rma=True)
                    assert a.dtype == b.dtype == np.dtype(dtype) and a.shape == (k.size, 3)
                    if np.array_equal(va, vb):    # same shard versions read (always under BSP)
                        np.testing.assert_array_equal(a, b)
                        compared[0] += 1
            a, va = pull(client, "d", np.arange(20, 30), True, rma=False)   # spans both servers
            b, vb = pull(client, "d", np.arange(20, 30), True, rma=True)
            np.testing.assert_array_equal(va, vb)
            np.testing.assert_array_equal(a, b)
            # runs of adjacent rows are read as one block each: whole table, reversed, repeats
            for k in (np.arange(50), np.arange(49, -1, -1), np.array([3, 4, 5, 5, 6, 30, 31, 2])):
                a2, _ = pull(client, "d", k, True, rma=False)
                b2, _ = pull(client, "d", k, True, rma=True)
                np.testing.assert_array_equal(a2, b2)
            seen.append(float(np.abs(b).sum()))
        assert compared[0] >= 4 * 4
        return seen

    roles, seen = _ps(comm, 2, tables, policy, work)     # 2 servers, the other ranks work
    if roles.role == core.WORKER:
        assert seen[-1] > 0 and len(set(seen)) == len(seen)   # the table did change


@pytest.mark.mpi(min_size=3)
def test_deferred_pushes_are_not_held_across_steps_with_rma_pulls():
    """With RMA pulls nothing of the endpoint waits between clocks: the deferred PUSH_CLOCK
    sends of a step must still be completed by the next clock, not kept (with their
    gradient buffers) until the end of the run; and every push arrives."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 2000, 1, "float64", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]

    def work(client, roles):
        held = []
        for t in range(30):
            client.pull("w", np.arange(0, 2000, 7))                # an RMA read
            client.push("w", np.arange(2000), np.ones((2000, 1)), defer=True)
            client.clock(1)
            held.append(client.ep.pending)
        w = client.pull("w", np.arange(2000), fresh=True)
        return held, w

    roles, res = _ps(comm, 1, tables, BSP(), work)
    if roles.role == core.WORKER:
        held, w = res
        # one step's sends at most (header, part description, keys, values per server)
        assert max(held) <= 4 * roles.n_servers, held
        np.testing.assert_allclose(w, -30.0)       # 30 steps of -1 (mean over the workers)


@pytest.mark.mpi(min_size=3)
def test_rma_pull_completes_while_server_applies_a_large_update():
    """Worker 0 pushes 8 M keys (async: applied on arrival); worker 1 waits until the server's
    write sequence word is odd (busy applying), then does an RMA pull and sees it still odd
    afterwards (async reads are not validated, so they do not wait for the write)."""
    comm = MPI.COMM_WORLD
    n = 1 << 23
    spec = TableSpec("w", n, 1, "float64", sparse=True)
    tables = [(spec, Optimizer("adagrad", 0.1))]

    def work(client, roles):
        if roles.index == 0:
            client.push("w", np.arange(n, dtype=np.int64), np.ones((n, 1)), n_examples=1,
                        versions=np.zeros(1, dtype=np.int64))
            return None
        if roles.index != 1:
            return None
        win = client.windows[0]
        hdr = np.zeros(header_len(roles.n_workers), dtype=np.int64)
        server = client.ep.server_ranks[0]
        deadline = time.monotonic() + 120
        while True:                       # the busy flag, or the update already finished
            win.read(server, hdr)
            if hdr[H_SEQ] or hdr[H_VERSION] or time.monotonic() > deadline:
                break
        assert hdr[H_SEQ] == 1, "never saw the server busy applying (RMA read did not progress)"
        got = client.pull("w", np.array([3, 1 << 22, n - 1]))
        after = np.zeros_like(hdr)
        win.read(server, after)
        assert after[H_SEQ] == 1 and after[H_VERSION] == 0, "pull waited for the apply to end"
        assert got.shape == (3, 1)
        return True

    roles, ok = _ps(comm, 1, tables, Async(), work)
    if roles.role == core.WORKER and roles.index == 1:
        assert ok


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _job_shm_prefixes() -> set:
    """Name prefixes of this job's files in /dev/shm: the ones this process maps, without
    their rank suffix (``sm_segment.HOST.0.JOBID``). Other jobs on the machine (other test
    runs) create and remove their own segments meanwhile; only this job's count."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if path.startswith("/dev/shm/"):
                names.add(path[len("/dev/shm/"):].rsplit(".", 1)[0])
    return names


def _shm_bytes(prefixes) -> int:
    import os
    total = 0
    for root, _, files in os.walk("/dev/shm"):
        for f in files:
            if not any(f.startswith(p) for p in prefixes):
                continue
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


@pytest.mark.mpi(min_size=2)
def test_windows_freed_repeatedly_do_not_grow_memory():
    comm = MPI.COMM_WORLD.Dup()
    size = 8 << 20
    rounds = []
    try:
        for i in range(40):
            ws = allocate_windows(comm, [size if comm.rank == 1 else 0, 4096])
            mem = ws[0].local_array(0, np.float64, (size // 8,)) if comm.rank == 1 else None
            if mem is not None:
                mem[:] = i                       # touch every page
            comm.Barrier()
            if comm.rank == 0:
                out = np.zeros(4)
                hdr = np.zeros(1, dtype=np.int64)
                ws[0].read(1, hdr, out.reshape(4, 1), np.arange(4, dtype=np.int64) * 8 * 1000)
                assert (out == i).all()
            comm.Barrier()
            free_windows(ws)
            assert all(w.freed for w in ws)
            with pytest.raises(WindowFreedError):
                ws[0].read(1, np.zeros(1, dtype=np.int64))
            if i == 0:
                prefixes = _job_shm_prefixes()
            rounds.append((_rss_kb(), _shm_bytes(prefixes)))
    finally:
        comm.Free()
    rss = [r for r, _ in rounds]
    shm = [s for _, s in rounds]
    # after warm-up, 30 more rounds of 8 MB windows must not leave 30 x 8 MB behind
    assert rss[-1] - rss[9] < 16 * 1024, rss
    assert shm[-1] - shm[9] < 16 << 20, shm


@pytest.mark.mpi(min_size=2)
def test_window_arguments_checked():
    comm = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="must be >= 0"):
        ShardWindow(comm, -1)                  # raised before the collective call
    w = ShardWindow(comm, 64)
    try:
        with pytest.raises(ValueError, match="does not fit"):
            w.local_array(32, np.float64, (8,))
        with pytest.raises(ValueError, match="int64"):
            w.read(comm.rank, np.zeros(2, dtype=np.int32))
        with pytest.raises(ValueError, match="not an int64 entry of the header"):
            w.read(comm.rank, np.zeros(2, dtype=np.int64), seq_offset=16)
        with pytest.raises(ValueError, match="one-entry int64 view"):
            with w.writing(np.zeros(1, dtype=np.int64)):
                pass
    finally:
        w.free()
    w.free()                                    # idempotent


@pytest.mark.mpi(min_size=1)
def test_writing_marks_the_sequence_word_odd_during_a_write():
    """:meth:`ShardWindow.writing` (the server's publication, no exclusive lock): the word is
    odd inside, even after; a write that raises leaves it odd (never accepted)."""
    w = ShardWindow(MPI.COMM_SELF, 64)
    try:
        seq = w.local_array(16, np.int64, (1,))
        seq[0] = 4
        with w.writing(seq):
            assert seq[0] == 5
        assert seq[0] == 6
        with pytest.raises(RuntimeError, match="half-way"):
            with w.writing(seq):
                raise RuntimeError("half-way")
        assert seq[0] == 7
    finally:
        w.free()


@pytest.mark.mpi(min_size=1)
def test_validated_read_never_returns_a_half_written_shard():
    """A read that overlaps a write (the sequence word changed between the header and the
    rows, or odd) is retried and returns the write whole, never half of it. The reader is
    its own server here (a COMM_SELF window): the write starts inside the read's freshness
    check — after the header ``Get``, before the rows ``Get`` — gets half-way, and a thread
    finishes it 50 ms later. Before the write sequence (exclusive lock only) such a read
    returned half old, half new rows."""
    hl, n = 8, 64
    w = ShardWindow(MPI.COMM_SELF, hl * 8 + n * 8)
    finisher = None
    try:
        hdr = w.local_array(0, np.int64, (hl,))
        rows = w.local_array(hl * 8, np.float64, (n, 1))
        hdr[:] = 0
        rows[:] = 1.0

        def finish():
            time.sleep(0.05)
            rows[n // 2:] = 2.0
            hdr[H_VERSION] = 1
            hdr[H_SEQ] += 1                   # even: whole

        seen = []

        def fresh(h):
            nonlocal finisher
            if not seen:
                hdr[H_SEQ] += 1               # odd: the server starts a write ...
                rows[:n // 2] = 2.0           # ... and gets half-way
                finisher = threading.Thread(target=finish)
                finisher.start()
            seen.append(int(h[H_SEQ]))
            return True

        out = np.zeros((n, 1))
        got = np.zeros(hl, dtype=np.int64)
        tries = w.read(0, got, out, hl * 8 + np.arange(n, dtype=np.int64) * 8, fresh=fresh,
                       seq_offset=H_SEQ * 8)
        assert np.all(out == 2.0), out.ravel()
        assert got[H_SEQ] == 2 and got[H_VERSION] == 1, got
        assert tries >= 1 and w.torn >= 1 and seen[0] == 0 and seen[-1] == 2, (tries, w.torn, seen)
    finally:
        if finisher is not None:
            finisher.join()
        w.free()
