# mpi-ranks: 1 2
"""The compiled request path (:mod:`hpcps.comm.fastpath`, issue 20) against the Python path
it replaces, on each rank alone (worker and server endpoints on a duplicate of ``COMM_SELF``; at
1 and 2 ranks, the runner's two sizes): the
same rows, shard header and traffic counts for a small PULL answered in one call, a packed
request of several parts taken apart in order by the server, and a bad key named with the
server and nothing sent.

Run: ``mpirun -n 1 python -m pytest --with-mpi tests/mpi/test_fastpath.py``.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm import transport as tp
from hpcps.core.tables import KeyPartition, TableSpec
from hpcps.server.shard import Shard

pytestmark = pytest.mark.skipif(tp._fast is None, reason="hpcps.comm.fastpath not built")


@pytest.fixture
def comm():
    c = MPI.COMM_SELF.Dup()
    yield c
    c.Free()


def _shard(num_keys=1000, n_servers=3, s=1):
    part = KeyPartition(num_keys, n_servers, permute=True)
    lo, hi = part.shard_range(s)
    w = np.arange((hi - lo) * 2, dtype=np.float32).reshape(-1, 2)
    hdr = np.arange(12, dtype=np.int64) + 100
    spec = TableSpec("t", num_keys, 2, "float32", sparse=True)
    return Shard(spec, part, None, lo, hi, w, None, hdr), part


@pytest.mark.parametrize("compiled", [True, False])
def test_small_pull_one_call_matches_the_python_path(comm, compiled):
    shard, part = _shard()
    keys = part.shard_keys(1)[[3, 0, 7, 3]].copy()
    want = shard.w[part.local_rows(keys.copy(), 1)]
    wep = tp.WorkerEndpoint(comm, [0, 0], 1 << 30, wait_spin=None)   # range 1 on this rank
    sep = tp.ServerEndpoint(comm, 1 << 30)
    wep.compiled = sep.compiled = compiled
    rows, hdr = np.zeros((4, 2), np.float32), np.zeros(12, np.int64)
    wep.expect_rows(1, rows, hdr)
    wep.send(1, tp.make_header(tp.PULL, 0, 0, 4, rng=1), keys)
    src, h = sep.poll()
    assert src == 0 and int(h[tp.H_NKEYS]) == 4
    done = shard.pull_inline(sep, src, 4, 1)
    assert done is compiled
    if not done:
        k = sep.recv_keys(src, 4, tp.PULL, scratch=True)
        sep.reply(src, shard.pull_reply(k, 1), tp.PULL, shard.hdr, rng=1)
    wep.complete(tp.PULL)
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(hdr, shard.hdr)
    assert sep.stats.messages == {"pull": 1}
    assert sep.stats.bytes_in == {"pull": 72 + 32}
    assert sep.stats.bytes_out == {"pull": 32 + 96}
    assert sep.stats.keys == {"pull": 4}
    assert wep.stats.bytes_out == {"pull": 72 + 32}


def test_packed_parts_are_taken_apart_in_order(comm):
    """A PUSH_CLOCK_PULL-like request of one message: description, a push's keys and rows,
    then a pull's keys; counted per op as separate parts would be."""
    wep = tp.WorkerEndpoint(comm, [0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    desc = np.arange(10, dtype=np.int64)
    k1, g1 = np.array([5, 6], np.int64), np.array([[1.5], [2.5]], np.float32)
    k2 = np.array([7, 8, 9], np.int64)
    wep.send(0, tp.make_header(tp.PUSH_CLOCK_PULL, 1, 0, 2, dim=1), desc,
             more=[(k1, g1, tp.PUSH), (k2, None, tp.PULL)])
    wep.complete(tp.PUSH)
    src, h = sep.poll()
    np.testing.assert_array_equal(sep.recv_keys(src, 10, tp.PUSH_CLOCK_PULL), desc)
    keys, grads = sep.recv_push(src, 2, 1, np.float32)
    np.testing.assert_array_equal(keys, k1)
    np.testing.assert_array_equal(grads, g1)
    np.testing.assert_array_equal(sep.recv_keys(src, 3, tp.PULL), k2)
    assert wep.stats.messages == {"push": 1, "pull": 0}     # as send_parts counts
    assert wep.stats.bytes_out == {"push": 72 + 80 + 16 + 8, "pull": 24}
    assert sep.poll() is None


def test_bad_key_is_named_and_nothing_sent(comm):
    shard, part = _shard()
    other = part.shard_keys(0)[:1].copy()
    wep = tp.WorkerEndpoint(comm, [0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    wep.send(0, tp.make_header(tp.PULL, 0, 0, 1, rng=1), other)
    src, _ = sep.poll()
    with pytest.raises(ValueError, match=rf"key {other[0]} does not belong to server 1"):
        shard.pull_inline(sep, src, 1, 1)
    assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)


def test_used_only_under_the_mpi_it_was_built_for():
    """transport.load_fastpath gives the module under the MPI of its mpi.h (here Open MPI's
    build under Open MPI) and names the MPI otherwise; the same Open MPI build imported under
    MPICH raised ValueError at import and stopped every rank (full run 2026-12-03,
    tests/e2e/test_rma_progress.py checks that case)."""
    from hpcps.comm.info import request_path

    mod, reason = tp.load_fastpath()
    assert mod is not None and reason == "" and mod.BUILT_FOR == MPI.get_vendor()[0]
    assert request_path() == f"compiled (hpcps.comm.fastpath, for {mod.BUILT_FOR})"


def test_ready_pull_answered_by_the_poll_that_received_it(comm):
    """ServerEndpoint.poll with the server's shards (fastpath.poll_pull): a ready small PULL
    is answered by the poll itself — the rows, header and counts of pull_inline's answer,
    the busy list counted — while a pull not ready yet (clock above visible + lag, or fresh
    above visible), a key of another range and another op come back to the caller as
    before, nothing sent."""
    from hpcps.server.loop import pull_lag
    from hpcps.core.consistency import BSP, SSP, Async

    assert (pull_lag(BSP()), pull_lag(SSP(2)), pull_lag(Async())) == (0, 2, 1 << 62)
    shard, part = _shard()
    keys = part.shard_keys(1)[[3, 0, 7, 3]].copy()
    want = shard.w[part.local_rows(keys.copy(), 1)]
    wep = tp.WorkerEndpoint(comm, [0, 0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    busy = [0, 0.0, 0.0]
    gate = ([None, shard], Shard, 5, 1, 1, busy)        # table 1; visible clock 5, lag 1
    rows, hdr = np.zeros((4, 2), np.float32), np.zeros(12, np.int64)
    wep.expect_rows(1, rows, hdr)
    wep.send(1, tp.make_header(tp.PULL, 1, 6, 4, rng=1), keys)        # 6 <= 5 + 1: ready
    assert sep.poll(gate) == (0, None)
    wep.complete(tp.PULL)
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(hdr, shard.hdr)
    assert sep.stats.messages == {"pull": 1}
    assert sep.stats.bytes_in == {"pull": 72 + 32}
    assert sep.stats.bytes_out == {"pull": 32 + 96}
    assert sep.stats.keys == {"pull": 4}
    assert busy[0] == 1 and busy[1] >= 0 and busy[2] >= 0
    other = part.shard_keys(0)[:1].copy()
    for h, k in ((tp.make_header(tp.PULL, 1, 7, 4, rng=1), keys),          # 7 > 5 + 1
                 (tp.make_header(tp.PULL, 1, 6, 4, aux=1, rng=1), keys),   # fresh: 6 > 5
                 (tp.make_header(tp.PULL, 1, 0, 1, rng=1), other),         # another range's
                 (tp.make_header(tp.PULL, 0, 0, 4, rng=1), keys),          # table 0: no Shard
                 (tp.make_header(tp.PUSH, 1, 0, 4, dim=2, rng=1), keys)):
        wep.send(1, h, k)
        src, got = sep.poll(gate)
        np.testing.assert_array_equal(got, h)
        assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)     # nothing sent
    assert busy[0] == 1


def _step_request(wep, part, g_bad=False, pull_keys=None):
    """Send a PUSH_CLOCK_PULL of one message to range 1: a push of 3 keys (dim 2) to table 1
    and a pull of 4 keys of table 1. Returns its push keys, values and pull keys."""
    keys = part.shard_keys(1)[[4, 1, 4]].copy()                 # a duplicate: kept as sent
    vals = np.array([[1.0, 2.0], [3.0, -0.0], [5.0, 6.0]], np.float32)
    if g_bad:
        vals[1, 0] = np.inf
    pk = part.shard_keys(1)[[3, 0, 7, 3]].copy() if pull_keys is None else pull_keys
    desc = np.array([[1, 3, 9, 2, 17], [1, pk.size, 0, 2, 0]], np.int64)
    wep.send(1, tp.make_header(tp.PUSH_CLOCK_PULL, 1, 5, 3, 9, dim=1, aux=2, rng=1), desc,
             more=[(keys, vals, tp.PUSH), (pk, None, tp.PULL)])
    wep.complete(tp.PUSH)
    return keys, vals, pk


def test_step_parts_match_the_python_path(comm):
    """ServerEndpoint.step_parts (fastpath.step_parts): a PUSH_CLOCK_PULL of one message
    taken apart in one call gives the push's local rows, values and version and the pull's
    local rows that the Python path (recv_keys, recv_push, local_rows) gives, and the same
    traffic counts."""
    shard, part = _shard()
    shards = [None, shard]
    got = {}
    for compiled in (True, False):
        wep = tp.WorkerEndpoint(comm, [0, 0], 1 << 30, wait_spin=None)
        sep = tp.ServerEndpoint(comm, 1 << 30)
        keys, vals, pk = _step_request(wep, part)
        src, h = sep.poll()
        assert int(h[tp.H_OP]) == tp.PUSH_CLOCK_PULL
        if compiled:
            pushes, pulls = sep.step_parts(1, 1, shards, Shard)
            (tid, rows, g, version), = pushes
            (sh, prow), = pulls
            assert tid == 1 and version == 17 and sh is shard
        else:
            metas = sep.recv_keys(src, 10, tp.PUSH_CLOCK_PULL)
            k, g = sep.recv_push(src, 3, 2, np.float32)
            rows = part.local_rows(k.copy(), 1)
            sep.stats.add(tp.PULL, keys=4)
            prow = part.local_rows(sep.recv_keys(src, 4, tp.PULL), 1)
            assert metas[4] == 17
        got[compiled] = (rows, g, prow, sep.stats.bytes_in, sep.stats.keys)
        assert sep.poll() is None
    np.testing.assert_array_equal(got[True][0], part.local_rows(keys.copy(), 1))
    np.testing.assert_array_equal(got[True][1], vals)
    for a, b in zip(got[True], got[False]):
        if isinstance(a, dict):
            assert a == b
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["inf", "other range", "unknown table", "not all inline"])
def test_step_parts_leave_what_they_cannot_take(comm, case):
    """A non-finite value, a key of another range, an unknown table or parts that did not all
    come with the header: step_parts gives None and leaves the request whole for the Python
    path, which names the error."""
    shard, part = _shard()
    wep = tp.WorkerEndpoint(comm, [0, 0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    other = part.shard_keys(0)[:2].copy()
    _step_request(wep, part, g_bad=case == "inf",
                  pull_keys=other if case == "other range" else None)
    src, h = sep.poll()
    shards = [None] if case == "unknown table" else [None, shard]
    n_pull = 2 if case == "not all inline" else 1
    assert sep.step_parts(1, n_pull, shards, Shard) is None
    assert sep.stats.bytes_in == {"push": 72}                    # only the header counted
    assert sep.recv_keys(src, 10, tp.PUSH_CLOCK_PULL)[4] == 17   # the request is whole


def test_send_rows_is_the_reply_of_rows_of(comm):
    """ServerEndpoint.reply_rows (fastpath.send_rows): the reply a worker receives is the
    gathered rows and the shard header that reply() sends, counted the same; a row outside
    the shard raises and sends nothing; a reply of more than one message is left to the
    caller."""
    from hpcps.server.shard import rows_of

    shard, part = _shard()
    rows = np.array([5, 0, 5, 2], np.int64)
    wep = tp.WorkerEndpoint(comm, [0, 0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    out, hdr = np.zeros((4, 2), np.float32), np.zeros(12, np.int64)
    wep.expect_rows(1, out, hdr)
    assert sep.reply_rows(0, shard.w, rows, tp.PULL, shard.hdr, 1)
    wep.complete(tp.PULL)
    np.testing.assert_array_equal(out, rows_of(shard.w, rows))
    np.testing.assert_array_equal(hdr, shard.hdr)
    assert sep.stats.bytes_out == {"pull": 32 + 96}
    with pytest.raises(ValueError, match=f"row {shard.w.shape[0]} outside"):
        sep.reply_rows(0, shard.w, np.array([1, shard.w.shape[0]], np.int64), tp.PULL,
                       shard.hdr, 1)
    assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    big = np.zeros(tp.INLINE_BYTES // 8 + 1, np.int64)               # > one message
    assert not sep.reply_rows(0, shard.w, big, tp.PULL, shard.hdr, 1)
    assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)


@pytest.mark.parametrize("compiled", [True, False])
def test_lone_push_and_ready_pull_taken_by_the_bsp_loop_as_by_the_general_path(comm, compiled):
    """A BSP server's compiled loop (ServerEndpoint.take_steps) holds a lone PUSH for its step
    and answers a ready lone PULL, as its general path (handle) does: the same queued local
    rows, values and version, the same reply and traffic counts; a pull of a later clock and
    a push for a step already applied are left to the general path, which holds the one and
    names the other."""
    from hpcps.core.consistency import BSP
    from hpcps.core.optim import Optimizer
    from hpcps.server.server import ParameterServer

    spec = TableSpec("t", 1000, 2, "float32", sparse=True)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    sep.compiled = compiled
    ps = ParameterServer.initial(sep, 0, 1, [0], [(spec, Optimizer("sgd", 0.1))], BSP())
    shard = ps.shards[0]
    shard.w[...] = np.arange(shard.w.size, dtype=np.float32).reshape(shard.w.shape)
    wep = tp.WorkerEndpoint(comm, [0], 1 << 30, wait_spin=None)
    keys = np.array([17, 3, 17, 999], np.int64)
    vals = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32)
    wep.send(0, tp.make_header(tp.PUSH, 0, 0, 4, dim=2, aux=-1), keys, vals)
    wep.complete(tp.PUSH)
    rows, hdr = np.zeros((3, 2), np.float32), np.zeros(shard.hdr.size, np.int64)
    wep.expect_rows(0, rows, hdr)
    wep.send(0, tp.make_header(tp.PULL, 0, 0, 3), keys[1:])
    seen = []
    while len(seen) < 2 and (got := ps._poll()) is not None:
        src, h = got
        if h is not None:
            ps.handle(src, h)
        seen.append(src)
    wep.complete(tp.PULL)
    assert seen == ([-1] if compiled else [0, 0])   # compiled: both in one call, none handed on
    local = shard.part.local_rows(keys.copy(), 0)
    np.testing.assert_array_equal(rows, shard.w[local[1:]])
    np.testing.assert_array_equal(hdr, shard.hdr)
    [(key, q_rows, q_vals, version)] = ps.pending[0][0]
    np.testing.assert_array_equal(q_rows, local)
    np.testing.assert_array_equal(q_vals, vals)
    assert version == -1 and ps.pushes_applied[0] == 1
    assert sep.stats.messages == {"push": 1, "pull": 1}
    assert sep.stats.bytes_in == {"push": 72 + 32 + 32, "pull": 72 + 24}
    assert sep.stats.bytes_out == {"push": 0, "pull": 24 + 8 * shard.hdr.size}
    assert sep.stats.keys == {"push": 4, "pull": 3}
    assert ps.requests_compiled == 0                 # it counts fused steps only
    # a pull of clock 1 waits for the step (answered once it is applied); a push for step 0
    # once step 1 is applied is named
    rows2 = np.zeros((1, 2), np.float32)
    wep.expect_rows(0, rows2, hdr)
    wep.send(0, tp.make_header(tp.PULL, 0, 1, 1), keys[:1])
    src, h = ps._poll()
    assert h is not None and int(h[tp.H_CLOCK]) == 1
    ps.handle(src, h)
    assert len(ps.waiting_pulls) == 1 and not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    ps.clock = 1
    ps._answer_waiting()
    wep.complete(tp.PULL)
    np.testing.assert_array_equal(rows2, shard.w[local[:1]])
    wep.send(0, tp.make_header(tp.PUSH, 0, 0, 1, dim=2), keys[:1], vals[:1])
    wep.complete(tp.PUSH)
    src, h = ps._poll()
    with pytest.raises(RuntimeError, match="push for clock 0 from worker 0 after clock 1"):
        ps.handle(src, h)


def _clocker_class():
    from hpcps.worker.nextpull import NextPull

    class _Clocker(NextPull):
        """What NextPull._send_clock uses of a PSClient (its Python path of a clock)."""

        def __init__(self, ep, specs, clock, seq, n_ranges):
            self.ep, self.specs, self.clock_value, self.seq = ep, specs, clock, seq
            self.pushes_sent = np.zeros(n_ranges, dtype=np.int64)

    return _Clocker



def _requests(comm):
    """Every request waiting on ``comm`` (this rank), as bytes, in arrival order."""
    out = []
    st = MPI.Status()
    while comm.Iprobe(source=MPI.ANY_SOURCE, tag=tp.TAG_REQ, status=st):
        buf = np.empty(st.Get_count(MPI.BYTE), dtype=np.uint8)
        comm.Recv([buf, MPI.BYTE], source=st.Get_source(), tag=tp.TAG_REQ)
        out.append(buf.tobytes())
    return out


@pytest.mark.parametrize("big", [False, True])
def test_clock_step_sends_and_counts_what_the_python_path_does(comm, big):
    """A clock to 3 key ranges in one compiled call (issue 20: 106 -> 41 us of a worker's
    CPU per Adult step with 4 servers): range 0 gets pushes and pulls (PUSH_CLOCK_PULL), range
    1 pushes only (PUSH_CLOCK), range 2 nothing (CLOCK); the same bytes, traffic counts and
    push counts as the Python path, the replies unpacked into the rows and headers. A request
    above one message (``big``) is left to the Python path: nothing sent."""
    _Clocker = _clocker_class()
    specs = [TableSpec("w", 1 << 20, 1, "float32", sparse=True),
             TableSpec("b", 1, 2, "float64", sparse=False)]
    n = 40000 if big else 30
    rng = np.random.default_rng(0)

    def staged():
        out = {}
        for s, (tid, m) in ((0, (0, n)), (0, (1, 1)), (1, (0, 7))):
            k = rng.integers(0, 1 << 20, m).astype(np.int64)
            g = rng.standard_normal((m, specs[tid].dim)).astype(specs[tid].dtype)
            out.setdefault(s, []).append((tp.make_header(tp.PUSH, tid, 5, m, 3, 9, specs[tid].dim,
                                                         s + 40, s), k, g))
        return out

    def pulls():
        rows = [np.zeros((11, 1), np.float32), np.zeros((1, 2), np.float64)]
        hdrs = [np.zeros(12, np.int64), np.zeros(12, np.int64)]
        keys = [np.arange(11, dtype=np.int64) * 3, np.zeros(1, np.int64)]
        return [[(0, keys[0], rows[0], hdrs[0]), (1, keys[1], rows[1], hdrs[1])], [], []]

    if big:                 # more than one message: nothing sent, nothing counted
        ep = tp.WorkerEndpoint(comm, [0, 0, 0], 1 << 30, wait_spin=None)
        sent = np.zeros(3, dtype=np.int64)
        assert not ep.clock_step(range(3), 5, 17, 9, 2, staged(), pulls(), sent)
        assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        assert sent.tolist() == [0, 0, 0] and ep.stats.messages == {} and not ep.pending
        return
    got = {}
    for compiled in (True, False):
        rng = np.random.default_rng(1)
        st, pl = staged(), pulls()
        ep = tp.WorkerEndpoint(comm, [0, 0, 0], 1 << 30, wait_spin=None)
        ck = _Clocker(ep, specs, 5, 9, 3)
        done = ep.clock_step(range(3), 5, 17, 9, 2, st, pl, ck.pushes_sent) if compiled else False
        assert done is compiled
        if not done:
            ck._send_clock(range(3), st, pl, 17, 2)
        msgs = _requests(comm)
        # the replies: each pull's rows then its shard header, one message to range 0
        reply = b"".join(np.full(r.shape, 7.5, r.dtype).tobytes()
                         + (np.arange(12, dtype=np.int64) + 100).tobytes()
                         for _, _, r, _ in pl[0])
        comm.Send([np.frombuffer(reply, np.uint8), MPI.BYTE], dest=0, tag=tp.reply_tag(0))
        ep.complete(tp.PUSH)
        for _, _, r, h in pl[0]:
            assert (r == 7.5).all() and (h == np.arange(12) + 100).all()
        got[compiled] = (msgs, ck.pushes_sent.tolist(), ep.stats.messages, ep.stats.bytes_out,
                         ep.stats.bytes_in, ep.stats.keys)
    assert len(got[True][0]) == 3
    assert got[True] == got[False]
    head = np.frombuffer(got[True][0][0][:72], np.int64)
    assert head.tolist() == [tp.PUSH_CLOCK_PULL, 2, 5, n + 1, 17, 9, 2, 2, 0]
    assert np.frombuffer(got[True][0][2], np.int64).tolist() == [tp.CLOCK, 0, 5, 0, 17, 0, 0, 2, 2]
