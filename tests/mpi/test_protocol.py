# mpi-ranks: 3 4
"""Multi-rank tests of the wire protocol, the server loop and BSP (real MPI ranks).

Run: ``mpirun -n 3 python -m pytest --with-mpi tests/mpi/test_protocol.py``.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.comm import core
from hpcps.comm.membership import Membership
from hpcps.comm.transport import ServerEndpoint
from hpcps.core.consistency import BSP
from hpcps.core.optim import Optimizer
from hpcps.server.server import ParameterServer
from hpcps.core.tables import TableSpec
from hpcps.worker.client import PSClient


def _ps(comm, n_servers, tables, worker_fn, max_bytes=1 << 30, policy=None, server_fn=None):
    """Run a parameter server on ``comm``: servers serve (then ``server_fn(server)`` is
    returned), workers call ``worker_fn(client, roles)``."""
    roles = core.split_roles(comm, n_servers)
    policy = policy or BSP()
    result = None
    try:
        if roles.role == core.SERVER:
            ep = ServerEndpoint(roles.ps, max_bytes)
            server = ParameterServer.initial(ep, roles.index, roles.n_servers, roles.worker_ranks,
                                             tables, policy)
            server.serve()
            result = server_fn(server) if server_fn else None
        else:
            client = PSClient(Membership(roles, specs=[t[0] for t in tables]), policy, max_bytes)
            try:
                result = worker_fn(client, roles)
            finally:
                client.stop()          # a failing assertion must not leave the servers waiting
        comm.Barrier()
    finally:
        roles.free()
    return roles, result


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_duplicate_keys_summed_across_workers_and_servers(dtype):
    """Every worker pushes key 7 three times and key 1000 once; lr=1 SGD, scale 1/examples."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 5000, 2, dtype, sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]

    def work(client, roles):
        keys = np.array([7, 7, 1000, 7], dtype=np.int64)
        grads = np.ones((4, 2)) * (roles.index + 1)
        client.push("w", keys, grads)
        client.clock(1)
        return client.pull("w", np.array([7, 1000, 3, 7]))

    roles, got = _ps(comm, comm.size // 2, tables, work)
    if roles.role == core.WORKER:
        nw = roles.n_workers
        s = sum(range(1, nw + 1))            # sum of (index + 1) over workers
        scale = 1.0 / nw                     # one example per worker
        want = np.array([[-3 * s * scale] * 2, [-s * scale] * 2, [0, 0], [-3 * s * scale] * 2])
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert got.dtype == np.dtype(dtype)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_pooled_push_buffers_reused_across_clocks(mode):
    """Pushes large enough for the server's buffer pool, over several clocks (the buffers of
    one clock are reused by the next), one larger than every pooled buffer: every duplicate
    key is summed, across workers and clocks, and the pool did reuse buffers."""
    from hpcps.comm.transport import POOL_MIN_BYTES
    from hpcps.core.consistency import Async

    comm = MPI.COMM_WORLD
    num_keys, dim = 4000, 2
    spec = TableSpec("w", num_keys, dim, "float64", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]
    sizes = [20_000, 90_000, 5_000, 20_000, 20_000]   # keys per push; the 2nd outgrows the pool
    assert 5_000 * dim * 8 >= POOL_MIN_BYTES

    def push_of(step, worker):
        rng = np.random.default_rng(100 * step + worker)
        keys = rng.integers(0, num_keys // 10, sizes[step])            # ~50 copies of each key
        return keys, rng.standard_normal((sizes[step], dim))

    def work(client, roles):
        seen = []
        for step in range(len(sizes)):
            keys, grads = push_of(step, roles.index)
            client.push("w", keys, grads, n_examples=1)
            client.clock(1)
            seen.append(client.pull("w", np.arange(num_keys), fresh=True))
        return seen

    policy = BSP() if mode == "bsp" else Async()
    roles, got = _ps(comm, comm.size // 2, tables, work, policy=policy,
                     server_fn=lambda s: s.ep.pool.reused)
    if roles.role == core.WORKER:
        nw = roles.n_workers
        w = np.zeros((num_keys, dim))
        for step in range(len(sizes)):
            for worker in range(nw):
                keys, grads = push_of(step, worker)
                G = np.zeros((num_keys, dim))
                np.add.at(G, keys, grads)
                w -= G / (nw if mode == "bsp" else 1)   # BSP: 1/examples of the step; async: 1/1
            if mode == "bsp" or step == len(sizes) - 1:   # async: later pushes may show early
                np.testing.assert_allclose(got[step], w, rtol=1e-12, atol=1e-9)
    else:
        assert got > 0                                   # buffers were reused


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_deferred_pushes_go_with_the_clock_in_one_request_per_server(mode):
    """push(..., defer=True) then clock() sends one PUSH_CLOCK per server per step (the
    pushes of both tables and the CLOCK): the tables end bit-identical to immediate pushes,
    each server handled exactly one request per worker per step, and a deferred push that a
    pull overtakes before the clock is sent first (as a plain PUSH), not lost."""
    from hpcps.core.consistency import Async

    comm = MPI.COMM_WORLD
    steps = 4
    sparse = TableSpec("w", 3001, 2, "float64", sparse=True)
    dense = TableSpec("b", 1, 1, "float32", sparse=False)
    # BSP applies a clock's pushes in worker order: bit-identical even with AdaGrad; async
    # applies them on arrival, so SGD (order changes only the rounding)
    rule = "adagrad" if mode == "bsp" else "sgd"
    tables = [(sparse, Optimizer(rule, 0.5)), (dense, Optimizer("sgd", 1.0))]
    policy = BSP() if mode == "bsp" else Async()
    n_servers = comm.size // 2

    def run(defer):
        def work(client, roles):
            rng = np.random.default_rng(roles.index)
            for step in range(steps):
                keys = rng.integers(0, 3001, 500)            # duplicates, on every server
                client.push("w", keys, rng.standard_normal((500, 2)), n_examples=3, defer=defer)
                client.push("b", [0], rng.standard_normal((1, 1)), n_examples=3, defer=defer)
                if step == 2:       # a pull before the clock: the held pushes go first
                    client.pull("w", keys[:5])
                client.clock(3)
            # answered once every worker's clocks are in (BSP and async alike)
            return client.pull_table("w"), client.pull_table("b")

        def counted(server):
            m = server.ep.stats.messages
            return m.get("push", 0) + m.get("clock", 0)

        return _ps(comm, n_servers, tables, work, policy=policy, server_fn=counted)

    roles, now = run(defer=False)
    _, later = run(defer=True)
    if roles.role == core.WORKER:
        for a, b in zip(now, later):
            if mode == "bsp":
                np.testing.assert_array_equal(a, b)
            else:       # arrival order changes the rounding only (b is float32)
                tol = 1e-12 if a.dtype == np.float64 else 1e-5
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
        assert np.abs(later[0]).sum() > 0
    else:
        nw = roles.n_workers
        # immediate: every push and CLOCK is a request; deferred: one per worker and step,
        # plus the pushes the pull at step 2 overtook (sent alone, then a CLOCK)
        own_b = roles.index == 0                  # the dense 1-row table lives on server 0
        extra = nw * (1 + int(own_b))             # step 2: w (and b) pushed before the pull
        assert later == steps * nw + extra
        assert now == steps * nw * (2 + int(own_b))


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("overwrite", ["grads", "keys"])
def test_buffers_rewritten_after_clock_do_not_change_the_deferred_push(overwrite):
    """push(..., defer=True) then clock(): the caller may reuse its arrays as soon as clock()
    returns. A 1 M-key dense push of ones (float32 rows and int64 keys: sent from in place
    before, large enough to wait for the server), then ``g[:] = 999`` (or the keys set to 0):
    the server applies the ones it was given, to the keys it was given (issue 23.1: it
    applied -999)."""
    comm = MPI.COMM_WORLD
    n = 1 << 20
    spec = TableSpec("w", n, 1, "float32", sparse=False)
    tables = [(spec, Optimizer("sgd", 1.0))]

    def work(client, roles):
        for _ in range(2):
            keys = np.arange(n, dtype=np.int64)
            g = np.ones((n, 1), dtype=np.float32)
            client.push("w", keys, g, defer=True)
            client.clock(1)
            if overwrite == "grads":
                g[:] = 999
            else:
                keys[:] = 0
        return client.pull_table("w")

    n_servers = comm.size // 2
    roles, got = _ps(comm, n_servers, tables, work)
    if roles.role == core.WORKER:
        # every worker pushes ones, one example each: -1 per clock, two clocks
        np.testing.assert_array_equal(got, np.full((n, 1), -2.0, dtype=np.float32))


@pytest.mark.mpi(min_size=3)
def test_pull_many_equals_one_pull_per_table():
    """pull_many posts every table's requests before waiting: the rows are those of one pull
    per table (sparse and dense tables, an empty key set, keys on every server), and a bad
    key in any table raises before anything is sent (the next exchange is unaffected)."""
    comm = MPI.COMM_WORLD
    sparse = TableSpec("w", 3001, 2, "float64", sparse=True)
    dense = TableSpec("b", 17, 1, "float32", sparse=False)
    tables = [(sparse, Optimizer("sgd", 1.0)), (dense, Optimizer("sgd", 1.0))]

    def work(client, roles):
        rng = np.random.default_rng(roles.index)
        for step in range(3):
            client.push("w", rng.integers(0, 3001, 400), rng.standard_normal((400, 2)))
            client.push("b", np.arange(17), rng.standard_normal((17, 1)))
            client.clock(1)
            keys = {"w": rng.integers(0, 3001, 300), "b": np.array([16, 0, 3, 3])}
            both = client.pull_many(keys)
            assert set(both) == {"w", "b"}
            for t, k in keys.items():
                np.testing.assert_array_equal(both[t], client.pull(t, k))
            empty = client.pull_many({"w": np.empty(0, np.int64), "b": np.array([5])})
            assert empty["w"].shape == (0, 2) and empty["b"].shape == (1, 1)
            with pytest.raises(ValueError, match=r"key 17\b.*outside the key space"):
                client.pull_many({"w": np.array([1, 2]), "b": np.array([17])})
        return True

    roles, ok = _ps(comm, comm.size // 2, tables, work)
    assert roles.role == core.SERVER or ok


@pytest.mark.mpi(min_size=3)
def test_bsp_step_is_two_requests_per_server_whatever_the_tables():
    """A BSP step of ``hpcps train``'s shape (pull_many of a sparse and a dense table, both
    pushes deferred, clock) is two requests per worker at every server: one PULL or
    PULL_MANY (issue 20: the server holding the bias got a pull per table) and one
    PUSH_CLOCK. A slow worker makes the others' PULL_MANY wait at the server (deferred and
    answered later). The tables end bit-identical (float64, AdaGrad) to the same steps with
    one pull per table, and every pull saw exactly the previous clocks."""
    comm = MPI.COMM_WORLD
    steps = 4
    sparse = TableSpec("w", 3001, 2, "float64", sparse=True)
    dense = TableSpec("b", 1, 1, "float64", sparse=False)
    tables = [(sparse, Optimizer("adagrad", 0.5)), (dense, Optimizer("adagrad", 0.5))]

    def run(together):
        def work(client, roles):
            rng = np.random.default_rng(roles.index)
            seen = []
            for step in range(steps):
                keys = {"w": rng.integers(0, 3001, 300), "b": np.array([0])}
                if roles.index == 0 and step == 1:
                    time.sleep(0.3)           # the other workers' pulls wait at the servers
                if together:
                    got = client.pull_many(keys)
                else:
                    got = {t: client.pull(t, k) for t, k in keys.items()}
                seen.append(got)
                for t, k in keys.items():
                    client.push(t, k, rng.standard_normal((k.size, tables[client.ids[t]][0].dim)),
                                defer=True)
                client.clock(3)
            return seen, client.pull_table("w"), client.pull_table("b")

        def counted(server):
            return dict(server.ep.stats.messages)

        return _ps(comm, comm.size // 2, tables, work, server_fn=counted)

    roles, one = run(together=False)
    _, many = run(together=True)
    if roles.role == core.WORKER:
        for a, b in zip(one[0], many[0]):
            for t in a:
                np.testing.assert_array_equal(a[t], b[t])
        np.testing.assert_array_equal(one[1], many[1])
        np.testing.assert_array_equal(one[2], many[2])
        assert np.abs(many[2]).sum() > 0
    else:
        nw = roles.n_workers
        own_b = roles.index == 0            # the 1-row dense table lives on server 0
        # per worker: one pull (per table when apart) and one PUSH_CLOCK per step, the
        # pull_table of each table at the end (PULL_SHARD, counted apart) and the STOP
        assert many["pull"] == steps * nw
        assert one["pull"] == steps * nw * (1 + int(own_b))
        assert many["push"] == one["push"] == steps * nw
        assert many["pull"] + many["push"] == 2 * steps * nw


def _fused_run(comm, tables, steps, pulls, announce, hook=None, max_bytes=1 << 30):
    """BSP steps of ``hpcps train``'s shape on ``tables``: step ``t`` pulls ``pulls(index, t)``
    (pull_many), pushes a gradient on those keys (deferred) and clocks; with ``announce``,
    ``announce(index, t)`` (None: nothing) is handed to ``pull_next`` before the clock.
    ``hook(client, index, t)`` runs after the clock. Returns the roles and, on workers, (every
    pull's rows, the final tables); on servers the messages per op."""
    def work(client, roles):
        rng = np.random.default_rng(100 + roles.index)
        seen = []
        for t in range(steps):
            keys = pulls(roles.index, t)
            if roles.index == 0 and t == 1:
                time.sleep(0.3)           # the others' next pulls wait at the servers
            got = client.pull_many(keys)
            seen.append({k: v.copy() for k, v in got.items()})
            for name, k in keys.items():
                client.push(name, k, rng.standard_normal((k.size, tables[client.ids[name]][0].dim)),
                            defer=True)
            nxt = announce(roles.index, t) if announce else None
            if nxt is not None:
                assert client.pull_next(nxt)
            client.clock(3)
            if hook is not None:
                hook(client, roles.index, t)
        return seen, {s.name: client.pull_table(s.name) for s, _ in tables}

    def counted(server):
        return dict(server.ep.stats.messages), dict(server.ep.stats.keys)

    return _ps(comm, comm.size // 2, tables, work, max_bytes=max_bytes, server_fn=counted)


def _planned_keys(steps, n_keys=3001):
    """Per worker and step, the keys of a step (a sparse table's and the bias), fixed ahead."""
    plan = {}
    for w in range(8):
        rng = np.random.default_rng(w)
        plan[w] = [{"w": rng.integers(0, n_keys, 300), "b": np.array([0])} for _ in range(steps)]
    return plan


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("max_bytes", [1 << 30, 1024])
def test_bsp_step_is_one_request_per_server_with_the_next_pull(max_bytes):
    """Issue 20: with the next step's pulls sent with the clock (``pull_next``) a BSP step is
    one request per worker at every server in steady state — a PUSH_CLOCK_PULL — where it
    was two (PULL_MANY, PUSH_CLOCK): only each worker's first pull and last clock go alone.
    A slow worker makes the others' announced pulls wait at the server. Every pull's rows
    and the final tables (float64, AdaGrad) are bit-identical to the unfused steps, and the
    servers count the same keys pulled and pushed; also with messages split at 1 KiB."""
    comm = MPI.COMM_WORLD
    steps = 5
    sparse = TableSpec("w", 3001, 2, "float64", sparse=True)
    dense = TableSpec("b", 1, 1, "float64", sparse=False)
    tables = [(sparse, Optimizer("adagrad", 0.5)), (dense, Optimizer("adagrad", 0.5))]
    plan = _planned_keys(steps)

    def pulls(w, t):
        return plan[w][t]

    def announce(w, t):
        return plan[w][t + 1] if t + 1 < steps else None

    roles, apart = _fused_run(comm, tables, steps, pulls, None, max_bytes=max_bytes)
    _, fused = _fused_run(comm, tables, steps, pulls, announce, max_bytes=max_bytes)
    if roles.role == core.WORKER:
        for a, b in zip(apart[0], fused[0]):
            for t in a:
                np.testing.assert_array_equal(a[t], b[t])
        for t in apart[1]:
            np.testing.assert_array_equal(apart[1][t], fused[1][t])
        assert np.abs(fused[1]["b"]).sum() > 0
    else:
        nw = roles.n_workers
        (m_apart, k_apart), (m_fused, k_fused) = apart, fused
        assert m_apart["pull"] == m_apart["push"] == steps * nw       # two per step
        assert m_fused["pull"] == nw                  # the first step's pull of each worker
        assert m_fused["push"] == steps * nw          # PUSH_CLOCK_PULL, then the last PUSH_CLOCK
        assert m_fused["pull"] + m_fused["push"] == (steps + 1) * nw
        assert k_fused["pull"] == k_apart["pull"] > 0
        assert k_fused["push"] == k_apart["push"] > 0


@pytest.mark.mpi(min_size=3)
def test_announced_pulls_not_taken_are_dropped():
    """Pulls sent with a clock are used only by a pull_many of the same keys at the next clock:
    a step that pulls other keys than it announced, a fresh read (evaluation) and a
    pull_table between the clock and the next step, and an announcement of keys on one
    server only, all give the rows of the unfused steps bit for bit (no reply matched to the
    wrong receive), and every server ends with no pull waiting."""
    comm = MPI.COMM_WORLD
    steps = 6
    sparse = TableSpec("w", 3001, 2, "float64", sparse=True)
    dense = TableSpec("b", 1, 1, "float64", sparse=False)
    tables = [(sparse, Optimizer("adagrad", 0.5)), (dense, Optimizer("adagrad", 0.5))]
    plan = _planned_keys(steps)
    extra = {}

    def pulls(w, t):
        return plan[w][t]

    def announce(w, t):
        if t + 1 >= steps:
            return None
        if t == 0:                     # not what step 1 pulls: dropped
            return {"w": plan[w][t + 1]["w"][::-1].copy(), "b": np.array([0])}
        if t == 3:                     # the bias only (server 0): not the tables step 4 pulls
            return {"b": np.array([0])}
        return plan[w][t + 1]

    def hook(client, w, t):
        if t == 1:                     # an evaluation-like read between the clock and the step
            extra.setdefault(w, []).append(client.pull("w", np.arange(50), fresh=True).copy())
        if t == 2:
            extra.setdefault(w, []).append(client.pull_table("b").copy())

    roles, apart = _fused_run(comm, tables, steps, pulls, None, hook=hook)
    got_apart = dict(extra)
    extra.clear()
    _, fused = _fused_run(comm, tables, steps, pulls, announce, hook=hook)
    if roles.role == core.WORKER:
        for a, b in zip(apart[0], fused[0]):
            for t in a:
                np.testing.assert_array_equal(a[t], b[t])
        for t in apart[1]:
            np.testing.assert_array_equal(apart[1][t], fused[1][t])
        for a, b in zip(got_apart[roles.index], extra[roles.index]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.mpi(min_size=3)
def test_server_does_not_wait_for_a_worker_outside_mpi():
    """A PULL reply above the one-message limit is a rendezvous: it completes only once the
    worker is inside MPI. Worker 0 sends its step with the next step's pulls (32 KiB of rows)
    and then stays out of MPI for 1.5 s; the server answers it at the clock and, not
    waiting for that reply to complete (it used to: MPI_Waitall), serves the other
    workers' pulls meanwhile. Worker 0 still gets its rows, the same as a pull's."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 1 << 15, 1, "float64", sparse=False)
    tables = [(spec, Optimizer("sgd", 1.0))]
    keys = np.arange(0, 1 << 15, 8, dtype=np.int64)            # 4096 rows: 32 KiB
    away = 1.5

    def work(client, roles):
        client.push("w", keys, np.ones((keys.size, 1)), defer=True)
        if roles.index == 0:
            assert client.pull_next({"w": keys})
        client.clock(1)
        if roles.index == 0:
            time.sleep(away)                       # not inside MPI: the reply cannot complete
            got = client.pull_many({"w": keys})["w"]
            np.testing.assert_array_equal(got, client.pull("w", keys))
            return None
        t0 = time.perf_counter()
        for _ in range(20):
            client.pull("w", keys[:8])
        return time.perf_counter() - t0

    roles, took = _ps(comm, 1, tables, work)
    if roles.role == core.WORKER and roles.index > 0:
        assert took < away / 2, f"20 pulls took {took:.2f} s: the server waited for worker 0"


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("max_bytes", [1 << 30, 1024])
def test_requests_and_replies_at_the_one_message_limit(max_bytes):
    """Pushes and pulls whose request (header and keys, or header, keys and values) or reply
    (rows and shard clock header) is just under, at and just over ``INLINE_BYTES``, replies
    just under, at and just over ``DEFER_MAX_BYTES`` (one message, sent without waiting, up
    to it), requests just under, at and just over ``REQUEST_BYTES``, and a PUSH_CLOCK whose description rides
    with its header: every size gives the values of ``np.add.at`` (so both sides agree on
    which form each message takes), in one server and across servers, also when
    ``max_message_bytes`` splits messages below that limit."""
    from hpcps.comm.transport import DEFER_MAX_BYTES, HEADER_BYTES, INLINE_BYTES, REQUEST_BYTES

    comm = MPI.COMM_WORLD
    num_keys = 1 << 18
    spec = TableSpec("w", num_keys, 1, "float64", sparse=False)
    tables = [(spec, Optimizer("sgd", 1.0))]
    n_servers = comm.size // 2
    kmax = (INLINE_BYTES - HEADER_BYTES) // 8            # keys that fit with a pull header
    pmax = (INLINE_BYTES - HEADER_BYTES) // 16           # keys + float64 values with a push
    rmax = (INLINE_BYTES - 8 * 8) // 8                   # float64 rows with an 8-entry header
    dmax = (DEFER_MAX_BYTES - 8 * 8) // 8                # the same at the deferred limit
    qp = (REQUEST_BYTES - HEADER_BYTES) // 16            # keys + values in one request
    qk = (REQUEST_BYTES - HEADER_BYTES) // 8             # keys of a pull in one request
    sizes = sorted({1, pmax - 1, pmax, pmax + 1, kmax - 1, kmax, kmax + 1, rmax - 1, rmax,
                    rmax + 1, 3000, dmax - 1, dmax, dmax + 1, qp - 1, qp, qp + 1, qk - 1, qk,
                    qk + 1})

    def work(client, roles):
        got = []
        for i, n in enumerate(sizes):
            keys = np.arange(n, dtype=np.int64) * n_servers       # all on server 0 (dense)
            client.push("w", keys, np.full((n, 1), float(i + 1)), defer=(i % 2 == 1))
            client.clock(1)
            got.append(client.pull("w", keys).copy())
        return got

    roles, got = _ps(comm, n_servers, tables, work, max_bytes=max_bytes)
    if roles.role == core.WORKER:
        nw = roles.n_workers
        w = np.zeros(num_keys)
        for i, n in enumerate(sizes):
            keys = np.arange(n) * n_servers
            w[keys] -= (i + 1) * nw / nw                          # lr 1, scale 1/examples
            np.testing.assert_array_equal(got[i][:, 0], w[keys])


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("max_bytes", [1 << 30, 1024])
def test_replies_to_several_pulls_at_the_one_message_limit(max_bytes):
    """A PULL_MANY of two tables whose replies (rows and shard clock headers) total just
    under, at and just over ``DEFER_MAX_BYTES`` — one message for both, then one per part
    (``one_reply``; also when ``max_message_bytes`` splits messages) — gives the rows of
    single pulls of each table, on one server and across servers."""
    from hpcps.comm.transport import DEFER_MAX_BYTES

    comm = MPI.COMM_WORLD
    num_keys = 1 << 16
    w = TableSpec("w", num_keys, 1, "float64", sparse=False)
    b = TableSpec("b", 4, 1, "float64", sparse=False)
    tables = [(w, Optimizer("sgd", 1.0)), (b, Optimizer("sgd", 1.0))]
    n_servers = comm.size // 2

    def work(client, roles):
        at = (DEFER_MAX_BYTES - 2 * 8 * client.header_len - 8) // 8   # w rows: exactly the limit
        allk = np.arange(num_keys, dtype=np.int64)
        client.push("w", allk, (allk + 1.0).reshape(-1, 1) * (roles.index + 1))
        client.push("b", np.array([0]), np.array([[3.0]]))
        client.clock(1)
        got = []
        for n in (1, at - 1, at, at + 1):
            keys = np.arange(n, dtype=np.int64) * n_servers          # all on server 0 (dense)
            many = client.pull_many({"w": keys, "b": np.array([0])})
            got.append((many["w"].copy(), many["b"].copy(), client.pull("w", keys).copy(),
                        client.pull("b", np.array([0])).copy()))
        return got

    roles, got = _ps(comm, n_servers, tables, work, max_bytes=max_bytes)
    if roles.role == core.WORKER:
        for mw, mb, sw, sb in got:
            np.testing.assert_array_equal(mw, sw)
            np.testing.assert_array_equal(mb, sb)
            assert np.all(mw != 0) and mb[0, 0] != 0


@pytest.mark.mpi(min_size=3)
def test_bsp_pull_sees_exactly_previous_clock():
    """Under BSP the pull at clock t shows all workers' updates of clocks < t, none newer."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 64, 1, "float64", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]

    def work(client, roles):
        seen = []
        for t in range(5):
            seen.append(client.pull("w", np.arange(64))[:, 0].copy())
            client.push("w", np.arange(64), -np.ones((64, 1)))   # +1 per worker per clock (lr=1)
            client.clock(1)                                     # scale 1/n_workers
        return seen

    roles, seen = _ps(comm, 1, tables, work)
    if roles.role == core.WORKER:
        for t, row in enumerate(seen):
            np.testing.assert_array_equal(row, np.full(64, float(t)))


@pytest.mark.mpi(min_size=3)
def test_message_splitting_and_odd_layouts():
    """Tiny max_message_bytes forces chunking; byte-swapped and strided pushes arrive intact."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 100_000, 3, "float64", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]
    rng = np.random.default_rng(0)
    keys = rng.choice(100_000, size=5000, replace=False).astype(">i8")      # big-endian keys
    base = rng.standard_normal((5000, 6))
    grads = base[:, ::2].astype(">f8")                                     # strided + swapped

    def work(client, roles):
        if roles.index == 0:
            client.push("w", keys, grads)
            client.clock(1)
        else:
            client.clock(0)
        return client.pull("w", keys[::-1])

    roles, got = _ps(comm, 1, tables, work, max_bytes=1024)
    if roles.role == core.WORKER:
        np.testing.assert_array_equal(got, -np.asarray(grads[::-1], dtype=np.float64))


@pytest.mark.mpi(min_size=3)
def test_key_outside_key_space_is_an_error_on_the_worker():
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 10, 1, "float32", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]

    def work(client, roles):
        with pytest.raises(ValueError, match=r"key 10\b.*outside the key space"):
            client.pull("w", np.array([1, 10]))
        with pytest.raises(ValueError, match=r"key -1\b.*outside the key space"):
            client.push("w", np.array([-1]), np.ones((1, 1)))
        return True

    _ps(comm, 1, tables, work)


@pytest.mark.mpi(min_size=3)
def test_servers_start_tables_from_the_per_key_initial_rows():
    """Tables with init_std start as TableSpec.initial_rows(key, seed) on 1 server (3 ranks)
    and on 2 servers (4 ranks) alike; tables without it start at zero."""
    comm = MPI.COMM_WORLD
    sparse = TableSpec("emb", 1001, 3, "float64", sparse=True, init_std=0.2)
    dense = TableSpec("layer", 40, 5, "float32", sparse=False, init_std=1.5)
    zero = TableSpec("bias", 7, 1, "float32", sparse=True)
    tables = [(s, Optimizer("sgd", 1.0)) for s in (sparse, dense, zero)]

    def work(client, roles):
        return {s.name: client.pull(s.name, np.arange(s.num_keys)) for s in (sparse, dense, zero)}

    roles, got = _ps(comm, comm.size // 2, tables, work)
    if roles.role == core.WORKER:
        for s in (sparse, dense):
            np.testing.assert_array_equal(got[s.name], s.initial_rows(np.arange(s.num_keys), 0))
            assert np.abs(got[s.name]).max() > 0
        assert not got["bias"].any()


def test_block_pulls_into_a_buffer_and_grouped_or_scattered_keys_agree():
    """A dense block (served from a view of the shard), the same rows pulled into a caller's
    buffer, and keys in and out of server order: all the same rows; a bad buffer is refused."""
    comm = MPI.COMM_WORLD
    dense = TableSpec("d", 64, 3, "float64", sparse=False)
    sparse = TableSpec("s", 1000, 2, "float64", sparse=True)
    tables = [(dense, Optimizer("sgd", 1.0)), (sparse, Optimizer("sgd", 1.0))]

    def work(client, roles):
        k = np.arange(64, dtype=np.int64)
        client.push("d", k, np.tile(k[:, None], (1, 3)).astype(np.float64))
        ks = np.arange(0, 1000, 7, dtype=np.int64)
        client.push("s", ks, np.tile(ks[:, None], (1, 2)).astype(np.float64))
        client.clock(1)
        block = client.pull("d", np.arange(10, 50))                 # consecutive rows
        buf = np.full((40, 3), np.nan)
        same = client.pull("d", np.arange(10, 50), out=buf)
        scattered = client.pull("s", ks[::-1])                      # not in server order
        in_order = client.pull("s", np.sort(ks))
        with pytest.raises(ValueError, match="out must be"):
            client.pull("d", np.arange(4), out=np.zeros((4, 3), dtype=np.float32))
        return block, same, buf, scattered, in_order

    roles, got = _ps(comm, comm.size // 2, tables, work)
    if roles.role == core.WORKER:
        block, same, buf, scattered, in_order = got
        nw = roles.n_workers
        want = -np.tile(np.arange(10, 50, dtype=np.float64)[:, None], (1, 3))   # mean over workers
        np.testing.assert_allclose(block, want)
        assert same is buf and np.array_equal(buf, block)
        ks = np.arange(0, 1000, 7)
        np.testing.assert_allclose(in_order, -np.tile(ks[:, None], (1, 2)).astype(np.float64))
        np.testing.assert_array_equal(scattered, in_order[::-1])
        assert nw >= 2


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spin", [None, 0.0, 1e-4])
def test_waitall_polling_completes_late_messages(spin):
    """waitall with a spin time polls with Testall and sleeps between polls: a message that
    arrives 0.2 s late is still received whole (and the chunked receive completes)."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        data = np.arange(300_000, dtype=np.float64)
        if comm.rank == 1:
            time.sleep(0.2)
            core.send_array(comm, data, 0, 7, 1 << 20)
        elif comm.rank == 0:
            out = np.zeros_like(data)
            reqs: list = []
            core.irecv_array(comm, out, 1, 7, 1 << 20, reqs)
            assert len(reqs) == 3
            t0 = time.perf_counter()
            core.waitall(reqs, spin)
            assert reqs == [] and time.perf_counter() - t0 >= 0.15
            np.testing.assert_array_equal(out, data)
        comm.Barrier()
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=3)
def test_one_range_pull_and_push_in_one_call_match_the_general_path():
    """With one key range a small pull and push go in one compiled call
    (``WorkerEndpoint.request``, issue 20); the same steps through the general path
    (``ep.compiled`` off) give the same rows, shard header, versions and traffic counts, and
    what that call does not take (int32 keys, a list, an ``out`` of another dtype, a bad key,
    a request over one message) still converts or raises as before."""
    comm = MPI.COMM_WORLD
    spec = TableSpec("w", 1000, 2, "float32", sparse=True)
    tables = [(spec, Optimizer("sgd", 1.0))]
    keys = np.array([5, 999, 5, 0, 321], dtype=np.int64)

    def steps(client, roles):
        got = []
        out = np.zeros((keys.size, 2), np.float32)
        for t in range(3):
            got.append(client.pull("w", keys).copy())
            got.append(client.pull("w", keys, out=out).copy())
            if client.ep.compiled and client.n_servers == 1:   # the reply went through request()
                n = out.nbytes + 8 * client.header_len
                np.testing.assert_array_equal(client.ep._recv_buf[:out.nbytes].view(np.float32),
                                              out.reshape(-1))
                np.testing.assert_array_equal(client.ep._recv_buf[out.nbytes:n].view(np.int64),
                                              client.last_header)
            got.append(client.pull("w", keys.astype(np.int32)).copy())     # converted
            got.append(client.pull("w", keys.tolist()).copy())
            grads = np.full((keys.size, 2), roles.index + t + 1, np.float32)
            client.push("w", keys, grads)
            client.push("w", keys[:2], grads[:2].astype(np.float64))       # converted
            client.push("w", np.arange(600, dtype=np.int64),               # over one message
                        np.ones((600, 2), np.float32))
            client.clock(1)
            got.append(client.pull("w", np.arange(600), fresh=True).copy())
        with pytest.raises(ValueError, match=r"key 1000\b.*outside the key space"):
            client.pull("w", np.array([1, 1000]))
        with pytest.raises(ValueError, match=r"key -3\b.*outside the key space"):
            client.push("w", np.array([-3]), np.ones((1, 2), np.float32))
        with pytest.raises(ValueError, match="out must be"):
            client.pull("w", keys, out=np.zeros((keys.size, 2), np.float64))
        s = client.ep.stats
        return (got, client.read_version[0].copy(), client.last_header.copy(), client.seq,
                dict(s.messages), dict(s.bytes_out), dict(s.bytes_in), dict(s.keys),
                client.pushes_sent.copy())

    def work_fast(client, roles):
        return steps(client, roles)

    def work_general(client, roles):
        client.ep.compiled = False
        return steps(client, roles)

    n_servers = comm.size // 2
    roles, fast = _ps(comm, n_servers, tables, work_fast)
    _, general = _ps(comm, n_servers, tables, work_general)
    if roles.role == core.WORKER:
        for a, b in zip(fast[0], general[0]):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(fast[1:], general[1:]):
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b
