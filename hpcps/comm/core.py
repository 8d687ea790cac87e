"""MPI essentials: launch checks, role split, abort-on-error and buffer transfers.

Everything that touches MPI lives in :mod:`hpcps.comm`; communicators are passed in, never
taken from a module-level ``COMM_WORLD``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from hpcps.comm import notices
from hpcps.comm.launcher import cores_dedicated, launcher_local_size, launcher_world_size
from hpcps.core.exitcodes import EXIT_FAILED, status_for
from hpcps.core.procs import mark_abort, set_timer_slack
from hpcps.core.threads import blas_threads_for, limit_blas_threads

#: Default largest single MPI message in bytes; larger arrays are sent in chunks so that no
#: element count reaches 2**31 (MPI's int counts), whatever the datatype.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30

SERVER = "server"
SHARED = MPI.COMM_TYPE_SHARED
WORKER = "worker"


class LaunchError(RuntimeError):
    """The MPI launch does not fit the job (world size, MPI build mismatch, roles)."""


def world() -> MPI.Intracomm:
    """Return ``MPI.COMM_WORLD``; called once, by the command-line entry point only."""
    return MPI.COMM_WORLD


def hostname() -> str:
    """Name of the node this rank runs on (``MPI.Get_processor_name``)."""
    try:
        return MPI.Get_processor_name()
    except MPI.Exception:  # pragma: no cover - MPI not usable
        return socket.gethostname()


def check_launch(comm: MPI.Intracomm, environ=None) -> None:
    """Refuse a world of size 1 when the launcher started more processes.

    That happens when mpi4py was built against a different MPI than the ``mpirun``/``srun``
    that started the job: every process then believes it is rank 0 of 1.
    Local (not collective); call it on every rank before any communication.

    Raises
    ------
    LaunchError
        With the sizes seen and the usual fix.
    """
    announced = launcher_world_size(environ)
    size = comm.Get_size()
    if size == 1 and announced is not None and announced > 1:
        raise LaunchError(
            f"MPI reports a world of 1 rank but the launcher started {announced}: mpi4py "
            f"({MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0]}) was "
            "built against a "
            "different MPI than the mpirun/srun in use. Use the mpirun of the same MPI "
            "(`python -c 'import mpi4py; print(mpi4py.get_config())'`), or reinstall mpi4py "
            "against the site MPI: `pip install --no-binary mpi4py --force mpi4py`."
        )


def any_rank_failed(comm: MPI.Intracomm, failed: bool) -> bool:
    """True on every rank if ``failed`` is true on any. Collective (one Allreduce)."""
    flag = np.array([1 if failed else 0], dtype=np.int32)
    out = np.zeros(1, dtype=np.int32)
    collective(lambda: comm.Iallreduce(flag, out, op=MPI.MAX),
               lambda: comm.Allreduce(flag, out, op=MPI.MAX), flag, out)
    return bool(out[0])


def node_sum(comm: MPI.Intracomm, value: int) -> int:
    """Sum of an int over ``comm`` (e.g. the ranks of one node). Collective."""
    a, out = np.array([value], dtype=np.int64), np.zeros(1, dtype=np.int64)
    collective(lambda: comm.Iallreduce(a, out, op=MPI.SUM),
               lambda: comm.Allreduce(a, out, op=MPI.SUM), a, out)
    return int(out[0])


#: Bytes of a host name in :func:`allgather_hostnames` (longer names are cut).
HOSTNAME_BYTES = 256


def allgather_hostnames(comm: MPI.Intracomm) -> list:
    """The host name of every rank of ``comm``, in rank order (for failure records).
    Collective (one Allgather of fixed-width bytes; watched in continue mode)."""
    mine = np.zeros(HOSTNAME_BYTES, dtype=np.uint8)
    name = hostname().encode()[:HOSTNAME_BYTES]
    mine[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    out = np.empty((comm.Get_size(), HOSTNAME_BYTES), dtype=np.uint8)
    collective(lambda: comm.Iallgather(mine, out), lambda: comm.Allgather(mine, out), mine, out)
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in out]


def node_size(comm: MPI.Intracomm) -> int:
    """Ranks of ``comm`` on this rank's node (shared memory). Collective (one ``Split_type``)."""
    node = comm.Split_type(SHARED, key=comm.Get_rank())
    try:
        return node.Get_size()
    finally:
        node.Free()


def barrier_before_exit(comm: MPI.Intracomm) -> None:
    """Flush stdout/stderr and wait for every rank, so that all messages are out before the
    first rank exits (the launcher kills the rest then). Collective."""
    sys.stdout.flush()
    sys.stderr.flush()
    comm.Barrier()


def limit_threads(world, ranks_on_node: int | None = None) -> int | None:
    """Give each rank its share of its node's cores for BLAS (:mod:`hpcps.core.threads`), unless
    the user set ``OMP_NUM_THREADS`` or the like. Collective over ``world`` (one
    ``Split_type``) unless the caller counted the node's ranks (``ranks_on_node``). Returns the
    thread count set, or ``None``."""
    n = blas_threads_for(node_size(world) if ranks_on_node is None else ranks_on_node)
    if n is not None:
        limit_blas_threads(n)
    return n


#: Timer slack (ns) of a rank whose waits sleep between polls (its node's cores are shared)
#: under a policy whose replies come soon after the request (async, SSP): the kernel's
#: default, 50 us, made every short sleep of the waits (2 us at first, doubling) last
#: ~55 us. ``bench/bench_e2e.py --no-torch --reps 6``, 3 alternating launches per setting
#: (18 runs each; 3 workers + 1 server on 2 cores, 2026-12-05): async 473k examples/s with
#: 10 us against 424k with the default; BSP 482k against 516k (its replies wait for the
#: slowest worker's push, and the waiting ranks woke more often on the shared cores), so BSP
#: keeps the default.
WAIT_TIMER_SLACK_NS = 10_000


def shorten_timer_slack() -> bool:
    """Set the calling thread's timer slack to :data:`WAIT_TIMER_SLACK_NS` when the
    launcher shares this node's cores among more ranks than it has
    (:func:`~hpcps.comm.launcher.cores_dedicated` false: the waits sleep between polls;
    threads started later inherit it). Returns whether it was set. Local."""
    return not cores_dedicated() and set_timer_slack(WAIT_TIMER_SLACK_NS)


@dataclass(frozen=True)
class Roles:
    """This rank's place in the job after :func:`split_roles`.

    Attributes
    ----------
    world : MPI.Intracomm
        The job's world communicator (as passed in).
    ps : MPI.Intracomm
        A duplicate of ``world`` reserved for parameter-server traffic (worker <-> server),
        so that its messages never match collectives or other traffic.
    role_comm : MPI.Intracomm
        The communicator of this rank's role (all workers, or all servers).
    role : str
        ``"worker"`` or ``"server"``.
    index : int
        Rank within ``role_comm`` (worker index or server index).
    worker_ranks, server_ranks : tuple of int
        World (and ``ps``) ranks of the workers and of the servers, in index order.
    """

    world: MPI.Intracomm
    ps: MPI.Intracomm
    role_comm: MPI.Intracomm
    role: str
    index: int
    worker_ranks: tuple
    server_ranks: tuple

    @property
    def n_workers(self) -> int:
        return len(self.worker_ranks)

    @property
    def n_servers(self) -> int:
        return len(self.server_ranks)

    @property
    def is_chief(self) -> bool:
        """True on worker 0 (world rank 0), which reports progress and writes the model."""
        return self.role == WORKER and self.index == 0

    def free(self) -> None:
        """Free the communicators made by :func:`split_roles` (collective over world)."""
        for c in (self.role_comm, self.ps):
            if c != MPI.COMM_NULL:
                c.Free()


def role_map(world_size: int, n_servers: int) -> list[str]:
    """Role of every world rank: the last ``n_servers`` ranks serve, the others work.

    World rank 0 is therefore always worker 0 (the chief).

    Raises
    ------
    LaunchError
        Unless ``1 <= n_servers <= world_size - 1``.
    """
    if not 1 <= n_servers <= world_size - 1:
        raise LaunchError(
            f"{world_size} rank(s) cannot hold {n_servers} server(s) and at least one worker: "
            f"need world size >= servers + 1 = {n_servers + 1}"
        )
    return [WORKER] * (world_size - n_servers) + [SERVER] * n_servers


def split_roles(comm: MPI.Intracomm, n_servers: int) -> Roles:
    """Split ``comm`` into servers and workers.  Collective over ``comm``.

    Every rank computes the same role map locally (so a bad ``n_servers`` raises on every
    rank before any communication), then ``comm.Split`` makes the role communicators.
    """
    roles = role_map(comm.Get_size(), n_servers)
    me = comm.Get_rank()
    role = roles[me]
    ps = comm.Dup()
    role_comm = comm.Split(0 if role == WORKER else 1, me)
    return Roles(
        world=comm,
        ps=ps,
        role_comm=role_comm,
        role=role,
        index=role_comm.Get_rank(),
        worker_ranks=tuple(r for r, x in enumerate(roles) if x == WORKER),
        server_ranks=tuple(r for r, x in enumerate(roles) if x == SERVER),
    )


def rebuild_roles(ps: MPI.Intracomm, role: str, key: int, world=None) -> Roles:
    """Roles over a new communicator ``ps`` on which every rank keeps its role: after a
    ``Shrink`` (survivors, :func:`hpcps.comm.ft.shrink`, :mod:`hpcps.resilience.recovery`) or a
    ``Spawn`` + ``Merge`` (the job plus added workers, :mod:`hpcps.resilience.elastic`). Collective over
    ``ps`` (one Allgather, watched in continue mode, and one Split).

    Parameters
    ----------
    ps : MPI.Intracomm
        Every rank of the job; becomes ``Roles.ps`` as is (not duplicated).
    role : {"worker", "server"}
        This rank's role.
    key : int
        This rank's sort key within its role: its old index (added workers: after every old
        one), so that indices keep their relative order (ties: ``ps`` rank order).
    world : MPI.Intracomm, optional
        Recorded as ``Roles.world`` (default ``ps``).

    Returns
    -------
    Roles
        Indices ``0..n-1`` per role in ``key`` order; ``worker_ranks``/``server_ranks`` are
        ranks of ``ps``. The role communicator handles errors as ``ps`` does.
    """
    is_server = 1 if role == SERVER else 0
    mine = np.array([is_server, key], dtype=np.int64)
    layout = np.empty((ps.Get_size(), 2), dtype=np.int64)
    collective(lambda: ps.Iallgather(mine, layout), lambda: ps.Allgather(mine, layout),
               mine, layout)
    role_comm = ps.Split(is_server, key)
    handler = ps.Get_errhandler()
    role_comm.Set_errhandler(handler)
    handler.Free()

    def ranks(kind):
        return tuple(sorted((i for i in range(ps.Get_size()) if layout[i, 0] == kind),
                            key=lambda i: (int(layout[i, 1]), i)))

    return Roles(world=ps if world is None else world, ps=ps, role_comm=role_comm, role=role,
                 index=role_comm.Get_rank(), worker_ranks=ranks(0), server_ranks=ranks(1))


@contextlib.contextmanager
def watchdog(comm: MPI.Comm, seconds: float, what: str, stream=None):
    """Abort the whole job (``comm.Abort``) if the body has not finished after ``seconds``.

    For MPI calls that can wait forever on a process that died before it could answer (Open
    MPI 5: a process started by ``MPI_Comm_spawn`` and killed before ``MPI_Init`` leaves every
    parent in ``MPI_Comm_spawn``, also without ULFM). A timer thread calls ``Abort``, which
    needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default). Local; not collective.
    """
    def fire():
        _report_and_abort(comm, stream, f"{what} did not finish within {seconds:g} s (a process "
                                         "died or hangs); aborting the job", code=1)

    timer = threading.Timer(float(seconds), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def abort_on_error(comm: MPI.Comm, stream=None, notify: bool = False):
    """Turn an exception on any rank into an abort of the whole job.

    Prints ``hpcps: rank R on HOST: <traceback>`` to ``stream`` (stderr) and calls
    ``comm.Abort(code)``, so that no other rank is left waiting in a collective or a receive;
    ``code`` is :func:`hpcps.core.exitcodes.status_for` of the exception (65 for bad data, 74 for a
    failed write, 1 for the unexpected), which mpirun returns and launchers use to decide
    whether a relaunch can help.
    Not collective: only the raising rank calls ``Abort``. ``SystemExit`` with code 0 passes.

    With ``notify`` (``hpcps train``, ``hpcps join``) every rank of ``comm`` also listens for
    the notice of another rank's input error and prints why it stops, and this rank, on an
    input error (:data:`hpcps.core.exitcodes.INPUT_ERRORS`), sends that notice to every other
    rank and waits for their acknowledgements (at most
    :data:`hpcps.comm.notices.ACK_SECONDS`) before it aborts (:mod:`hpcps.comm.notices`).
    Entering is then collective over ``comm`` (one ``Dup``); the listener's thread ends when
    the body ends without an error.
    """
    listener = notices.listen(comm, stream) if notify else None
    try:
        yield
    except SystemExit as e:
        if e.code in (0, None):
            raise
        _report_and_abort(comm, stream, f"exit status {e.code}", code=e.code if isinstance(e.code, int) else 1)
    except BaseException as e:  # noqa: BLE001 - every failure must end the job
        code = status_for(e)
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        if code != EXIT_FAILED or type(e).__name__ in ("ServerLost", "GrowthFailed"):
            text = f"{type(e).__name__}: {e}\n"      # an error of the input: no traceback
        _report_and_abort(comm, stream, text.rstrip(), code=code)
    finally:
        notices.stop(listener)


#: Seconds between a rank's error line and its ``Abort``: mpirun forwards the line before it
#: prints its own ``MPI_ABORT was invoked`` banner (issue 21.8: the banner came first). After
#: an input error this follows the other ranks' acknowledgements of the notice
#: (:func:`hpcps.comm.notices.tell_others`), so that their lines come before the banner too.
ABORT_GRACE = 1.0


def _report_and_abort(comm, stream, text, code):
    stream = stream or sys.stderr
    try:
        stream.write(f"hpcps: rank {comm.Get_rank()} on {hostname()}: {text}\n")
        stream.flush()
        mark_abort(code)                 # hpcps run ends mpirun if it does not exit after it
        try:
            notices.tell_others(code, text)  # input errors: every rank says why it stops
        except Exception:                # noqa: BLE001 - the abort below must happen
            pass
        time.sleep(ABORT_GRACE)
    finally:
        comm.Abort(code)


# --------------------------------------------------------------------------- buffers


def native_contiguous(a: np.ndarray) -> np.ndarray:
    """Return ``a`` as a C-contiguous array of native byte order (a copy only when needed).

    Non-contiguous, transposed or byte-swapped arrays would otherwise be sent scrambled.
    """
    a = np.asarray(a)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))


def pack_into(buf: np.ndarray, arrays) -> int:
    """Copy each array of ``arrays`` (``None`` skipped; byte-swapped or strided ones as
    :func:`native_contiguous` makes them) back to back into the uint8 ``buf``; the bytes
    written. Local (the Python form of :func:`hpcps.comm.fastpath.send_packed`'s packing)."""
    pos = 0
    for a in arrays:
        if a is not None:
            a = native_contiguous(a)
            buf[pos:pos + a.nbytes] = a.reshape(-1).view(np.uint8)
            pos += a.nbytes
    return pos


_MPI_TYPES: dict = {}


def mpi_type(dtype: np.dtype) -> MPI.Datatype:
    """The MPI datatype of a numpy dtype (``mpi4py.util.dtlib.from_numpy_dtype``, cached: it
    took ~2.5 % of a small request's time on each side). Local."""
    t = _MPI_TYPES.get(dtype)
    if t is None:
        t = _MPI_TYPES[dtype] = from_numpy_dtype(dtype)
    return t


def chunk_slices(n_elements: int, itemsize: int, max_bytes: int) -> list[slice]:
    """Split ``n_elements`` items into slices of at most ``max_bytes`` bytes (≥ 1 item each).

    Both the sender and the receiver derive the same chunks from the element count, so a
    message of any size goes through MPI's ``int`` counts. ``n_elements == 0`` gives ``[]``.
    """
    per = max(1, max_bytes // max(1, itemsize))
    per = min(per, (1 << 31) - 1)
    return [slice(i, min(i + per, n_elements)) for i in range(0, n_elements, per)]


def isend_array(comm: MPI.Comm, a: np.ndarray, dest: int, tag: int, max_bytes: int,
                requests: list) -> np.ndarray:
    """Start non-blocking sends of ``a`` to ``dest`` (chunked); append their requests.

    Point-to-point: ``dest`` must post the matching :func:`irecv_array`/:func:`recv_array`.
    Returns the (possibly converted) array actually sent, which the caller must keep alive
    until the requests complete.
    """
    a = native_contiguous(a)
    flat = a.reshape(-1)
    dt = mpi_type(a.dtype)
    for s in chunk_slices(flat.size, a.itemsize, max_bytes):
        part = flat[s]
        requests.append(comm.Isend([part, part.size, dt], dest=dest, tag=tag))
    return a


def irecv_array(comm: MPI.Comm, out: np.ndarray, source: int, tag: int, max_bytes: int,
                requests: list) -> None:
    """Post non-blocking receives into ``out`` (C-contiguous, native) from ``source``."""
    if not (out.flags.c_contiguous and out.dtype.isnative):
        raise ValueError("receive buffer must be C-contiguous with native byte order")
    flat = out.reshape(-1)
    dt = mpi_type(out.dtype)
    for s in chunk_slices(flat.size, out.itemsize, max_bytes):
        part = flat[s]
        requests.append(comm.Irecv([part, part.size, dt], source=source, tag=tag))


def send_array(comm: MPI.Comm, a: np.ndarray, dest: int, tag: int, max_bytes: int) -> None:
    """Blocking chunked send of ``a`` (see :func:`isend_array`). Point-to-point."""
    reqs: list = []
    keep = isend_array(comm, a, dest, tag, max_bytes, reqs)
    _waitall(reqs, keep)


def recv_array(comm: MPI.Comm, out: np.ndarray, source: int, tag: int, max_bytes: int) -> None:
    """Blocking chunked receive into ``out`` (see :func:`irecv_array`). Point-to-point.

    A message of one chunk, outside continue mode, is one blocking ``MPI_Recv`` (the
    ``Irecv`` + ``Waitall`` pair and their Python took ~25 % of a small request's time at
    the server)."""
    if not WATCH and out.nbytes <= max_bytes and out.flags.c_contiguous and out.dtype.isnative:
        if out.size:
            comm.Recv([out, mpi_type(out.dtype)], source=source, tag=tag)
        return
    reqs: list = []
    irecv_array(comm, out, source, tag, max_bytes, reqs)
    _waitall(reqs, out)


#: Back-off of a polling wait (:func:`waitall` with ``spin``), seconds: doubles from MIN to MAX.
POLL_SLEEP_MIN = 2e-6
POLL_SLEEP_MAX = 2e-4


def waitall(requests: list, *buffers, spin: float | None = None) -> None:
    """Complete a list of requests made by :func:`isend_array`/:func:`irecv_array`.

    In continue mode (:data:`WATCH` set, :func:`hpcps.comm.ft.watch`) the wait polls instead of
    blocking and raises as soon as any rank of the watched communicator has failed, even when
    none of these requests involves it; the requests and ``buffers`` (arrays they read or
    write) are then kept alive in :data:`ORPHANS`.

    Parameters
    ----------
    requests : list of MPI.Request
        Emptied on return.
    *buffers : ndarray
        The arrays the requests read or write (kept alive if a peer failed).
    spin : float or None
        None: ``MPI_Waitall`` (Open MPI busy-polls inside it). Else seconds to poll with
        ``MPI_Testall`` before sleeping between polls (doubling back-off up to
        ``POLL_SLEEP_MAX``), so that a rank waiting for a long reply leaves the CPU to the
        ranks doing the work when they share cores (the server's gather of a 1 M-row pull
        ran 3-4x slower beside one busy-polling process here).

    Raises
    ------
    MPI.Exception
        With the error class of the first failed request (not ``ERR_IN_STATUS``), or the
        failure the watch reported, so that a failed peer is recognised
        (:func:`hpcps.comm.ft.is_peer_failure`).
    """
    if requests:
        _waitall(requests, *buffers, spin=spin)
        requests.clear()


def collective(start, block, *buffers) -> None:
    """Run one collective: ``block()`` (the blocking call), or in continue mode ``start()`` (its
    non-blocking form, returning a request) completed by a watched :func:`waitall`, so that a
    rank waiting for peers that went into recovery notices the failure instead of waiting for
    ever. ``buffers``: the arrays the collective reads and writes (kept alive if it is
    abandoned). Collective over the communicator the callables use."""
    if WATCH:
        waitall([start()], *buffers)
    else:
        block()


#: Continue mode (``[fault_tolerance] mode = "continue"``): the parameter-server communicator
#: whose failures interrupt every wait (set by :func:`hpcps.comm.ft.watch`); empty otherwise.
WATCH: list = []
#: A tag no message carries: probing it with ``MPI.ANY_SOURCE`` only reports failures.
WATCH_TAG = 8

#: Requests left incomplete by a failed wait, with the buffers they use: kept alive, never
#: freed while MPI may still use them; :func:`hpcps.comm.ft.shrink` cancels what it can.
ORPHANS: list = []


def abandon(reqs, *buffers) -> None:
    """Keep ``reqs`` (those not complete) and ``buffers`` alive in :data:`ORPHANS`. Local."""
    ORPHANS.append(([r for r in reqs if r != MPI.REQUEST_NULL], buffers))


def _raise_failed(e: MPI.Exception, statuses) -> None:
    if e.Get_error_class() == MPI.ERR_IN_STATUS:
        for st in statuses:
            err = st.Get_error()
            if err not in (MPI.SUCCESS, MPI.ERR_PENDING):
                raise MPI.Exception(err) from None
    raise e


def _waitall(reqs, *buffers, spin: float | None = None) -> None:
    """Wait for ``reqs``: ``MPI_Waitall``; or, with ``spin`` or in continue mode, a
    ``MPI_Testall`` loop that sleeps between polls (after ``spin`` seconds; continue mode:
    at once, and it probes the watched communicator for a failed rank)."""
    statuses = [MPI.Status() for _ in reqs]
    watch = WATCH[0] if WATCH else None
    try:
        if watch is None and spin is None:
            MPI.Request.Waitall(reqs, statuses)
            return
        t0 = time.perf_counter()
        sleep = POLL_SLEEP_MIN
        while not MPI.Request.Testall(reqs, statuses):
            if watch is not None:
                watch.Iprobe(source=MPI.ANY_SOURCE, tag=WATCH_TAG)    # raises on a failure
                os.sched_yield()
            elif time.perf_counter() - t0 >= spin:
                time.sleep(sleep)
                sleep = min(2 * sleep, POLL_SLEEP_MAX)
    except MPI.Exception as e:
        abandon(reqs, *buffers)   # a peer failed: nothing may stay pending until MPI_Finalize
        _raise_failed(e, statuses)
