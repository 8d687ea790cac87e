"""One-sided access to server shards: MPI windows made with ``MPI.Win.Allocate``.

Each server exposes its shard of every table in one window per table: an int64 *header*
(the shard's clocks, written by the server; layout in :mod:`hpcps.core.consistency`) followed by
the shard's rows (``(rows, dim)``, table dtype, C order). The server's optimizer updates this
memory in place, so there is one copy of the parameters. Workers read it with passive-target
``Lock(SHARED)`` / ``Get`` / ``Unlock`` and send no message to the server.

Why ``Win.Allocate``
    With the Open MPI 5 wheel a ``Get`` from a window made by ``Win.Allocate`` (or
    ``Win.Allocate_shared``) completes while the target rank computes in Python without
    entering MPI; with ``Win.Create`` it waits for the target. MPICH needs
    ``MPIR_CVAR_ASYNC_PROGRESS=1`` for passive progress on every window kind. The server
    loop keeps polling (``Iprobe``) in any case, so reads also progress on MPIs without
    passive progress, just later.

Locks and the write sequence (no exclusive lock anywhere)
    Every lock on these windows is a *shared* lock taken with ``MPI.MODE_NOCHECK``: nobody
    ever takes an exclusive one, so no lock needs checking and no lock word is touched. A
    server publishes a write to its own window like a seqlock (:meth:`ShardWindow.writing`):
    it bumps an int64 *sequence word* in the header to an odd value, writes, and bumps it to
    the next even value (``Win.Sync`` between, inside a ``Lock(SHARED, NOCHECK)`` epoch on
    its own rank). A validated read (:meth:`ShardWindow.read` with ``seq_offset``) gets the
    header, then the rows, then the sequence word again, and keeps the result only if the
    word was even and unchanged — else it retries. So a reader sees a whole clock or none of
    it (BSP/SSP), and the server never waits for a reader.

    Why not ``Lock(EXCLUSIVE)`` on the server's own window, as hpcps did before: Open MPI
    5.0's ``osc/rdma`` over a BTL without hardware atomics (TCP between hosts) emulates the
    lock words' atomics with active messages, and a server's exclusive self-lock taken while
    workers poll with shared locks hung for ever across two test hosts (server, and workers,
    spinning in ``MPI_Win_lock``; also with readers 10 ms apart, so not reader starvation;
    fine with ``--mca btl_tcp_progress_thread 1`` and on one host, where ``osc/sm`` is used).
    That matches Open MPI's own report of an emulated compare-and-swap that, when queued,
    is never answered (open-mpi/ompi#14370, fixed after 5.0.x; the v5.0.x backport #14437
    is open). Under asynchronous training reads are not validated: a read may see a row
    set in which some rows already contain an update and others not (a torn read), which
    Downpour SGD tolerates by design.

Freeing
    :meth:`ShardWindow.free` is collective (``MPI_Win_free`` synchronises). On the normal exit
    path every window is freed; when a rank raises, hpcps aborts the job (``MPI_Abort``) and
    the MPI runtime reclaims the memory — calling a collective free from one failing rank
    would hang instead.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
from mpi4py import MPI

from hpcps.kernels.optim import take_rows
from hpcps.comm.core import chunk_slices, mpi_type

#: Back-off of a reader waiting for a fresh enough shard, seconds (doubles up to the max).
RETRY_SLEEP_MIN = 2e-6
RETRY_SLEEP_MAX = 5e-4
#: A read of scattered rows fetches the whole byte span from the first to the last row in one
#: ``Get`` (into a buffer kept by the window, then gathered locally) when the span is at most
#: ``SPAN_BYTES_PER_ROW`` bytes per row read and at most ``SPAN_MAX_BYTES``: Open MPI's
#: one-sided engine walks a derived datatype block by block, ~0.1-0.2 us per block here
#: (1 M dim-1 rows: ~0.2 s), while a contiguous ``Get`` moves 3-10 GB/s (0.1-0.3 ns per byte).
SPAN_BYTES_PER_ROW = 256
SPAN_MAX_BYTES = 64 << 20


class WindowFreedError(RuntimeError):
    """A :class:`ShardWindow` was used after :meth:`ShardWindow.free`."""


class ShardWindow:
    """An RMA window over one table: each server's header + rows, nothing on workers.

    Parameters
    ----------
    comm : MPI.Intracomm
        Communicator of all servers and workers (``Roles.ps``). **Collective** over it:
        every rank constructs the windows of all tables in the same order.
    nbytes : int
        Bytes this rank exposes (``header_bytes + rows * dim * itemsize`` on a server, 0 on a
        worker).

    Raises
    ------
    ValueError
        If ``nbytes`` is negative.
    """

    def __init__(self, comm: MPI.Intracomm, nbytes: int):
        if nbytes < 0:
            raise ValueError(f"window size must be >= 0 bytes, got {nbytes}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self._win = MPI.Win.Allocate(int(nbytes), 1, MPI.INFO_NULL, comm)
        mem = self._win.tomemory()
        self._mem = np.frombuffer(mem, dtype=np.uint8) if nbytes else np.empty(0, np.uint8)
        self.nbytes = int(nbytes)
        self._span = np.empty(0, np.uint8)   # kept buffer of span reads (see SPAN_MAX_BYTES)
        self.gets = 0          # completed read epochs
        self.retries = 0       # read epochs that found the shard too old
        self.torn = 0          # validated read epochs that overlapped a write (retried)
        self.read_seconds = 0.0          # in read(), retries and back-off included

    # ---------------------------------------------------------------- local side
    def _check(self) -> MPI.Win:
        if self._win is None:
            raise WindowFreedError("RMA window used after free()")
        return self._win

    def local_array(self, offset: int, dtype, shape) -> np.ndarray:
        """A numpy view of this rank's window memory (no copy). Local.

        Parameters
        ----------
        offset : int
            Byte offset, a multiple of ``dtype``'s size.
        dtype : numpy dtype
        shape : tuple of int

        Raises
        ------
        ValueError
            If the view does not fit in the window.
        """
        self._check()
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        if offset < 0 or offset + n > self.nbytes or offset % dtype.itemsize:
            raise ValueError(f"view of {n} bytes at offset {offset} does not fit a window of "
                             f"{self.nbytes} bytes (or is misaligned)")
        return self._mem[offset:offset + n].view(dtype).reshape(shape)

    @contextlib.contextmanager
    def writing(self, seq: np.ndarray):
        """Publish a write to this rank's own window (server side). Local, not collective.

        Bumps the sequence word ``seq`` (an int64 view of one entry of this window, from
        :meth:`local_array`) to an odd value before the body and to the next even value
        after it, with ``Win.Sync`` (a memory barrier between the window's copies) around
        the body, inside a ``Lock(SHARED, MODE_NOCHECK)`` epoch on this rank: no MPI message
        and no wait for readers. Validated reads (:meth:`read` with ``seq_offset``) retry
        while the word is odd or when it changed during their epoch. If the body raises,
        the word stays odd (readers never accept the half-written state; hpcps then aborts).
        Nothing inside may call a collective or wait for a message.

        Raises
        ------
        ValueError
            If ``seq`` is not a one-entry int64 view of this window's memory.
        """
        win = self._check()
        if seq.dtype != np.int64 or seq.size != 1 or not np.may_share_memory(seq, self._mem):
            raise ValueError("seq must be a one-entry int64 view of this window (local_array)")
        win.Lock(self.rank, MPI.LOCK_SHARED, MPI.MODE_NOCHECK)
        try:
            seq[...] += 1                    # odd: a write is under way
            win.Sync()
            yield
            win.Sync()
            seq[...] += 1                    # even: the write is whole
        finally:
            win.Unlock(self.rank)

    # ---------------------------------------------------------------- remote reads
    def read(self, target: int, header: np.ndarray, rows_out: np.ndarray | None = None,
             row_offsets: np.ndarray | None = None, header_offset: int = 0,
             fresh=None, max_bytes: int = 1 << 30, seq_offset: int | None = None) -> int:
        """Read a server's header and, once ``fresh(header)`` holds, some of its rows.

        Not collective: a passive-target read of ``target``'s window; the target takes no
        part. Each attempt is one ``Lock(SHARED, MODE_NOCHECK)`` … ``Unlock`` epoch: ``Get``
        the header, ``Flush``, and if ``fresh`` accepts it, ``Get`` the rows in the same
        epoch. With ``seq_offset`` the attempt is validated against the server's
        :meth:`writing`: the header's sequence word must be even, and after the rows
        (``Flush``) it is read again and must be unchanged, so header and rows belong to one
        whole write; else the attempt is retried (counted in :attr:`torn`). A stale header
        ends the epoch and the read is retried after a short back-off.

        Parameters
        ----------
        target : int
            Rank (in ``comm``) of the server.
        header : int64 ndarray (H,), C-contiguous
            Receives the header found at byte ``header_offset``.
        rows_out : ndarray (n, dim), C-contiguous, native byte order, or None
            Receives the rows; its dtype is the table dtype.
        row_offsets : int64 ndarray (n,)
            Byte offset of each row in the target's window.
        fresh : callable(header) -> bool, or None
            Freshness test (``None`` accepts any header).
        max_bytes : int
            Largest single ``Get``; more rows are read in several.
        seq_offset : int or None
            Byte offset of the int64 sequence word (inside the header read) in the target's
            window: validate the read as above. ``None``: no validation (a read may be torn).

        Returns
        -------
        int
            Number of stale attempts before the successful one.

        Raises
        ------
        WindowFreedError
            If the window has been freed.
        ValueError
            If the buffers are not C-contiguous, ``row_offsets`` does not match ``rows_out``
            or ``seq_offset`` is not an int64 entry of the header read.
        """
        win = self._check()
        if not header.flags.c_contiguous or header.dtype != np.int64:
            raise ValueError("header must be a C-contiguous int64 array")
        seq_at = None
        if seq_offset is not None:
            rel = int(seq_offset) - int(header_offset)
            if rel < 0 or rel % 8 or rel // 8 >= header.size:
                raise ValueError(f"seq_offset {seq_offset} is not an int64 entry of the header "
                                 f"read at byte {header_offset} ({header.size} entries)")
            seq_at = rel // 8
            seq_now = np.zeros(1, np.int64)
        gets, ttypes, gather = [], [], None     # (origin, target) of each row Get
        if rows_out is not None and rows_out.size:
            if not (rows_out.flags.c_contiguous and rows_out.dtype.isnative):
                raise ValueError("rows_out must be C-contiguous with native byte order")
            if row_offsets is None or row_offsets.shape[0] != rows_out.shape[0]:
                raise ValueError("row_offsets must give one byte offset per row of rows_out")
            gets, ttypes, gather = self._plan(rows_out, np.ascontiguousarray(row_offsets, dtype=np.int64),
                                              max_bytes)
        hdr_t = MPI.INT64_T
        t_start = time.perf_counter()
        tries = 0
        sleep = RETRY_SLEEP_MIN
        try:
            while True:
                win.Lock(target, MPI.LOCK_SHARED, MPI.MODE_NOCHECK)
                ok = whole = False
                try:
                    win.Get([header, header.size, hdr_t], target,
                            (header_offset, header.size, hdr_t))
                    win.Flush(target)
                    whole = seq_at is None or not header[seq_at] & 1
                    ok = whole and (fresh is None or fresh(header))
                    if ok:
                        for origin, tgt in gets:
                            win.Get(origin, target, tgt)
                        if seq_at is not None:     # the rows first, then the word again
                            win.Flush(target)
                            win.Get([seq_now, 1, hdr_t], target, (seq_offset, 1, hdr_t))
                finally:
                    win.Unlock(target)
                if ok and seq_at is not None and seq_now[0] != header[seq_at]:
                    ok = whole = False
                if ok:
                    if gather is not None:          # span read: pick the rows out of it
                        take_rows(gather[0], gather[1], rows_out.reshape(rows_out.shape[0], -1))
                    self.gets += 1
                    return tries
                if not whole:
                    self.torn += 1
                tries += 1
                self.retries += 1
                time.sleep(sleep)
                sleep = min(2 * sleep, RETRY_SLEEP_MAX)
        finally:
            for t in ttypes:
                t.Free()
            self.read_seconds += time.perf_counter() - t_start

    def _plan(self, rows_out: np.ndarray, offs: np.ndarray, max_bytes: int):
        """The ``Get`` calls that read rows at byte offsets ``offs`` into ``rows_out``: one
        contiguous ``Get`` per chunk when the rows are one run of adjacent rows; the covering
        byte span into :attr:`_span` when it is dense enough (see ``SPAN_BYTES_PER_ROW``),
        then gathered; else one derived datatype per chunk (:func:`target_rows_type`).

        Returns ``(gets, types, gather)``: ``gets`` a list of ``(origin, target)`` arguments
        of ``Win.Get``, ``types`` the committed datatypes to free after the epoch,
        ``gather`` None or ``(rows view of the span, row indices)``. Local.
        """
        base = mpi_type(rows_out.dtype)
        n = offs.size
        dim = rows_out.size // n
        row = dim * rows_out.itemsize
        first, last = int(offs[0]), int(offs[-1])
        if n == 1 or (last - first == (n - 1) * row and bool(np.all(np.diff(offs) == row))):
            flat = rows_out.reshape(-1)                 # one run: plain contiguous Gets
            gets = []
            for s in chunk_slices(flat.size, rows_out.itemsize, max_bytes):
                part = flat[s]
                gets.append(([part, part.size, base], (first + s.start * rows_out.itemsize, part.size, base)))
            return gets, [], None
        lo = int(offs.min())
        span = int(offs.max()) + row - lo
        if span <= SPAN_BYTES_PER_ROW * n and span <= SPAN_MAX_BYTES:
            rel = offs - lo
            if not np.any(rel % row):                  # rows on one grid (always, in hpcps)
                if self._span.size < span:
                    self._span = np.empty(span, np.uint8)
                buf = self._span[:span]
                gets = [([buf[s], s.stop - s.start, MPI.BYTE], (lo + s.start, s.stop - s.start, MPI.BYTE))
                        for s in chunk_slices(span, 1, max_bytes)]
                return gets, [], (buf.view(rows_out.dtype).reshape(span // row, dim), rel // row)
        gets, types = [], []
        for s in chunk_slices(n, row, max_bytes):
            t = target_rows_type(base, offs[s], dim, rows_out.itemsize).Commit()
            types.append(t)
            out = rows_out[s]
            gets.append(([out, out.size, base], (0, 1, t)))
        return gets, types, None

    # ---------------------------------------------------------------- teardown
    def free(self) -> None:
        """Free the window. **Collective** over ``comm``; idempotent on every rank.

        No lock may be held (hpcps holds locks only inside :meth:`read` and
        :meth:`writing`). Views from :meth:`local_array` must not be used afterwards.
        """
        if self._win is None:
            return
        self._mem = np.empty(0, np.uint8)
        win, self._win = self._win, None
        win.Free()

    @property
    def freed(self) -> bool:
        return self._win is None


def target_rows_type(base: MPI.Datatype, offsets: np.ndarray, dim: int, itemsize: int):
    """The target datatype of a read of rows at byte ``offsets`` (``dim`` elements of
    ``base`` each, ``itemsize`` bytes per element), in the order given. Local; not committed.

    Rows that follow each other in the window (a block of consecutive keys of a dense table)
    are merged into one block: ``MPI_Type_create_hindexed`` with one block per run, instead of
    one block per row (``hindexed_block``), which Open MPI's one-sided engine walks block by
    block (a 64 MiB dense pull read at half the speed of one contiguous ``Get``).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    row = dim * itemsize
    if offsets.size < 2:
        return base.Create_hindexed_block(dim, offsets.tolist())
    starts = np.flatnonzero(np.diff(offsets) != row) + 1
    if starts.size + 1 == offsets.size:            # no two rows adjacent: one block per row
        return base.Create_hindexed_block(dim, offsets.tolist())
    bounds = np.concatenate([[0], starts, [offsets.size]])
    lengths = (np.diff(bounds) * dim).tolist()
    return base.Create_hindexed(lengths, offsets[bounds[:-1]].tolist())


def allocate_windows(comm: MPI.Intracomm, sizes) -> list:
    """Allocate one :class:`ShardWindow` per entry of ``sizes`` (bytes on this rank).

    **Collective** over ``comm``: every rank passes a list of the same length. If an
    allocation fails, the windows made so far are freed before the error propagates (the
    failure of ``MPI_Win_allocate`` is itself collective).
    """
    made = []
    try:
        for n in sizes:
            made.append(ShardWindow(comm, n))
    except BaseException:
        for w in made:
            w.free()
        raise
    return made


def free_windows(windows) -> None:
    """Free every window of a list (see :meth:`ShardWindow.free`). **Collective**."""
    for w in windows:
        w.free()
