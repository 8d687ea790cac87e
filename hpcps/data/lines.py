"""Streamed training data: a job's data files as one sequence of lines, read block by block.

No MPI. When ``[data]`` streams (``stream = true``, or automatically, :func:`streams`), a
worker never holds its partition: its rows are *line numbers* of the data set — every line of
every file the ``path`` names, in file order — and :class:`StreamedRows` reads the lines a
step asks for from the files, parsed, through a bounded prefetch queue filled by a reader
thread. Everything the in-memory path plans over row numbers (partitions, the epoch's order,
the re-plan after a lost or added worker, a resume mid-epoch, :mod:`hpcps.core.planning`)
therefore works unchanged on line numbers, and a checkpoint's ``(epoch, step, plan)`` *is*
each reader's position: it says which lines every worker has read.

:class:`~hpcps.data.lineindex.LineIndex` maps a line number to its file and (decompressed)
byte offset (:mod:`hpcps.data.lineindex`; built once per data set and cached).

Shuffling is by a bounded buffer: the epoch's order permutes the lines within consecutive
blocks of ``[data] shuffle_buffer`` lines (:func:`hpcps.core.planning.epoch_order` with
``block``), and the reader parses one such block at a time, so a worker holds at most
``prefetch + 2`` parsed blocks however large the data.

A line that holds no row (a blank or comment line of an svmlight file, a bad line with
``on_bad_line = "skip"``) is read and dropped: the step it falls in has one example fewer.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import numpy as np
import scipy.sparse as sp

from hpcps.data.lineindex import LineIndex, load_index
from hpcps.data.linereader import LineReader, Parser, _concat, _own, _take
from hpcps.data.textstream import compression, data_files
from hpcps.kernels.text import take_rows

__all__ = ["LineIndex", "load_index", "Parser", "StreamedRows", "streams", "row_hashes"]

_INT32_MAX = 2**31 - 1


def streams(data_cfg) -> bool:
    """Whether a job's ``[data]`` streams: ``stream`` when set; else (absent) when ``path`` or
    ``test_path`` names a directory or a glob (the in-memory readers take one file: a
    directory of small files failed with ``IsADirectoryError`` on every rank), when a data
    file is compressed, or when the files add up to more than ``stream_above_mb`` MB.

    Raises
    ------
    DataError
        ``path`` or ``test_path`` names no data file (auto mode reads their sizes).
    """
    if data_cfg.format not in ("svmlight", "criteo"):
        return False
    if data_cfg.stream is not None:
        return bool(data_cfg.stream)
    paths = [p for p in (data_cfg.path, data_cfg.test_path) if p]
    files = [f for p in paths for f in data_files(p)]      # raises for a missing one
    if any(not os.path.isfile(p) for p in paths):
        return True                       # a directory or a glob (of one file or more)
    if any(compression(f) is not None for f in files):
        return True
    return sum(os.path.getsize(f) for f in files) > data_cfg.stream_above_mb * 1e6


def row_hashes(y, indptr, indices, data=None) -> np.ndarray:
    """A 63-bit hash of each CSR row's label, feature ids and values (uint64): the identity
    of a row in the exactly-once tests (sum them over an epoch)."""
    m = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        h = (indices.astype(np.uint64) + np.uint64(1)) * m
        if data is not None:
            h ^= np.asarray(data, dtype=np.float64).view(np.uint64)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        n = np.diff(indptr)
        # the sums over the non-empty rows only (an empty last row starts at h.size, which
        # reduceat refuses; the next non-empty row's start ends each run)
        seg = np.zeros(y.size, np.uint64)
        if h.size:
            seg[n > 0] = np.add.reduceat(h, indptr[:-1][n > 0])
        return (seg + (np.asarray(y, dtype=np.float64) > 0).astype(np.uint64) * np.uint64(7919)) \
            & np.uint64((1 << 63) - 1)


# -- the lazy rows a worker trains on ---------------------------------------------------------

def in_chunks(X, y, chunk: int):
    """The rows of ``X`` and their labels ``y`` in consecutive chunks of ``chunk`` rows, in
    order: ``(X[a:a + chunk], y[a:a + chunk])``, or ``(X, y)`` themselves when ``X`` has from 1 to
    ``chunk`` rows. A :class:`StreamedRows` (``X.start``) is
    started once with every line in order and asked by line numbers; skipped bad lines make
    its chunks shorter. Local.

    Parameters
    ----------
    X : matrix of rows (CSR, a LocalizedCSR, an ndarray) or StreamedRows, shape (n, ...)
    y : array-like (n, ...), indexable like ``X`` (``X.labels`` for a StreamedRows)
    chunk : int
        Rows per chunk (>= 1).

    Yields
    ------
    (rows, labels)
    """
    n = X.shape[0]
    streamed = hasattr(X, "start")
    if streamed:
        X.start(np.arange(n, dtype=np.int64))
    if not streamed and 0 < n <= chunk:
        yield X, y           # one chunk: X itself, not a copy (the model may know it already)
        return
    for a in range(0, n, chunk):
        sel = np.arange(a, min(a + chunk, n), dtype=np.int64) if streamed else slice(a, a + chunk)
        yield X[sel], y[sel]


class _Unit:
    """Parsed rows of one read unit: the lines ``covered`` (sorted, local numbers), the rows
    of those that hold one (``good``, sorted) and where each is in the CSR arrays.

    The CSR rows are in the order's sequence: the unit holds the order's positions
    ``[start, stop)``, and ``count[i]`` is the number of rows of positions ``start ..
    start + i - 1`` (a blank or skipped line holds none), so the positions ``[a, b)`` are
    the rows ``count[a - start]:count[b - start]``: a step's batch is a slice."""

    __slots__ = ("k", "covered", "good", "slot", "y", "indptr", "indices", "data", "start",
                 "stop", "count", "log")


class StreamedRows:
    """Lines ``[lo, hi)`` of a streamed data set, indexable like a matrix of rows.

    ``X[rows]`` (``rows`` local line numbers, an int64 array or a slice) gives the CSR rows of
    those lines that hold a row, in the order asked; ``X.labels[rows]`` their labels (the
    same rows). The lines come from a reader thread started by :meth:`start` with the order
    the worker will ask in: it reads units of ``unit`` lines of that order, parses them and
    queues ``depth`` units ahead. Requests must follow the order (a unit is dropped once a
    request no longer needs it or anything before it).

    Parameters
    ----------
    index : LineIndex
    parser : Parser
    lo, hi : int
        Global line numbers of this partition.
    unit : int
        Lines per read unit (the shuffle buffer, ``[data] shuffle_buffer``).
    depth : int
        Units the queue holds (``[data] prefetch``).

    Attributes
    ----------
    shape : (int, int)
        ``(hi - lo, n_features)``.
    stats : dict
        ``bytes``, ``lines`` read, ``read_seconds`` (reader thread), ``wait_seconds`` (the
        trainer waiting for a unit), ``skipped`` bad lines (of this object's reads: a
        :meth:`view` shares the parser, not the count).
    again : dict
        The part of ``bytes``, ``lines``, ``read_seconds`` and ``wait_seconds`` that was read
        for nothing and is read again: the lines :meth:`release` gave up.
    """

    def __init__(self, index: LineIndex, parser: Parser, lo: int, hi: int, *, unit: int = 65536,
                 depth: int = 4):
        self.index, self.parser = index, parser
        self.lo, self.hi = int(lo), int(hi)
        self.shape = (self.hi - self.lo, parser.n_features)
        self.unit, self.depth = max(1, int(unit)), max(1, int(depth))
        self.labels = _Labels(self)
        self.stats = {"bytes": 0, "lines": 0, "read_seconds": 0.0, "wait_seconds": 0.0,
                      "skipped": 0}
        self.again = {"bytes": 0, "lines": 0, "read_seconds": 0.0, "wait_seconds": 0.0}
        self._log: list = []       # this start's units read: [start, stop, bytes, read s, wait s]
        self._thread = None
        self._stop = threading.Event()
        self._q = None
        self._loaded: list = []
        self._last = None
        self._gathered = None
        self._order = None
        self._next = self._first_read = 0
        self._views: dict = {}

    # -- reader thread ------------------------------------------------------------------------
    def start(self, order: np.ndarray, first: int = 0) -> None:
        """Read ``order[first:]`` (local line numbers) from now on; units are the slices
        ``order[k * unit:(k + 1) * unit]`` (the first one cut at ``first``)."""
        self.close()
        self._order = np.asarray(order, dtype=np.int64)
        self._stop = threading.Event()
        self._q = queue.Queue(maxsize=self.depth)
        self._loaded = []
        self._last = self._gathered = None
        self._next = self._first_read = int(first)    # where the next step's batch should start
        self._log = []
        self._thread = threading.Thread(target=self._run, args=(self._order, int(first), self._q,
                                                                self._stop),
                                        name="hpcps-reader", daemon=True)
        self._thread.start()

    def _run(self, order, first, q, stop) -> None:
        reader = LineReader(self.index, self.parser)
        base = self.stats["bytes"]                 # counters add up over the epochs
        try:
            k = first // self.unit
            while k * self.unit < order.size:
                a = max(k * self.unit, first)
                seq = order[a:(k + 1) * self.unit]
                want = _sorted_lines(seq)
                t0, b0, s0 = time.perf_counter(), reader.bytes, self.parser.skipped
                u = self._read_unit(reader, k, want, seq, a)
                dt = time.perf_counter() - t0
                # skipped: this object's count (a view and its parent share the parser)
                self.stats["skipped"] += self.parser.skipped - s0
                self.stats["read_seconds"] += dt
                self.stats["lines"] += int(want.size)
                self.stats["bytes"] = base + reader.bytes
                u.log = [u.start, u.stop, reader.bytes - b0, dt, 0.0]
                self._log.append(u.log)
                if not _put(q, u, stop) or stop.is_set():
                    return
                k += 1
            q.put(None)
        except BaseException as e:              # noqa: BLE001 (handed to the trainer)
            _put(q, e, stop)
        finally:
            reader.close()

    def _read_unit(self, reader, k, want, seq, start) -> _Unit:
        # contiguous runs of the wanted lines (a gap of more than a unit starts a new read)
        cuts = np.flatnonzero(np.diff(want) > self.unit) + 1
        parts = []
        runs = [r for r in np.split(want, cuts) if r.size]
        for run in runs:
            if parts:                   # the reader reuses its buffers: the last run's rows copied
                parts[-1] = _own(parts[-1])
            y, indptr, indices, data, line = reader.read(self.lo + int(run[0]), self.lo + int(run[-1]) + 1)
            line = line - self.lo
            if run[-1] - run[0] + 1 == run.size:            # every line read is wanted
                keep = None
            else:
                pos = np.searchsorted(run, line)
                keep = np.flatnonzero((pos < run.size) & (run[np.minimum(pos, run.size - 1)] == line))
            if keep is not None and keep.size != y.size:
                y, indptr, indices, data = _take(y, indptr, indices, data, keep)
                line = line[keep]
            parts.append((y, indptr, indices, data, line))
        u = _Unit()
        u.k, u.covered = k, want
        if parts:
            y, indptr, indices, data, line = parts[0] if len(parts) == 1 else _concat(parts)
        else:
            y, indptr, indices, data, line = (np.zeros(0), np.zeros(1, np.int64),
                                              np.zeros(0, np.int64), None, np.zeros(0, np.int64))
        # the rows in the order's sequence (here, once per unit, so that a step's batch is a
        # slice): row g[i] of the line-order arrays is position start + i's
        if line.size == want.size == seq.size and want.size and want[-1] - want[0] + 1 == want.size:
            # a row on every line of a run (line == want): the position of each line in it
            ok = np.ones(seq.size, bool)
            perm = seq - want[0]
        else:
            g = np.searchsorted(line, seq)
            ok = (g < line.size) & (line[np.minimum(g, max(line.size - 1, 0))] == seq) \
                if line.size else np.zeros(seq.size, bool)
            perm = g[ok]
        small = self.shape[1] <= _INT32_MAX and indices.size <= _INT32_MAX
        # int32 ids where they fit: what scipy makes of the batches' index arrays anyway
        # (the one copy of the rows out of the reader's reused buffers, into the unit's own)
        indptr, indices, data = take_rows(np.ascontiguousarray(indptr), np.ascontiguousarray(indices),
                                          data, perm, small)
        y = y[perm]
        u.start, u.stop = start, start + seq.size
        u.count = np.zeros(seq.size + 1, dtype=np.int64)
        np.cumsum(ok, out=u.count[1:])
        u.good = line                                   # sorted; u.slot: where each row is
        u.slot = np.empty(perm.size, dtype=np.int64)
        u.slot[perm] = np.arange(perm.size)
        # values of ones for Criteo; ids stay in field order, a repeated id (two fields in one
        # bucket) twice: the models sum over a row's entries, which is the same (a sort per
        # unit would cost as much as the parse)
        u.y, u.indptr, u.indices, u.data = y, indptr, indices, data   # data None: ones
        return u

    def close(self) -> None:
        """Stop the reader thread (units not yet used are dropped)."""
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._q.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._thread = None
        self._loaded = []

    def release(self, pos: int) -> None:
        """Stop the reader: the lines at positions ``pos`` and later of the order being read
        will be read again (a re-plan gave their rows out again, or :meth:`start` goes on from
        ``pos`` after a recovery), so what was read of them is counted in :attr:`again` —
        lines, bytes, reading and waiting seconds of each unit in proportion to its lines
        from ``pos`` on. Counted once per :meth:`start`."""
        self.close()
        pos = int(pos)
        for start, stop, nbytes, read_s, wait_s in self._log:
            if stop <= pos:
                continue
            n = stop - max(start, pos)
            share = n / (stop - start)
            self.again["lines"] += n
            self.again["bytes"] += round(nbytes * share)
            self.again["read_seconds"] += read_s * share
            self.again["wait_seconds"] += wait_s * share
        self._log = []

    # -- requests -----------------------------------------------------------------------------
    def _next_unit(self) -> _Unit:
        if self._q is None:
            raise RuntimeError("StreamedRows: start() was not called before reading rows")
        t0 = time.perf_counter()
        item = self._q.get()
        waited = time.perf_counter() - t0
        self.stats["wait_seconds"] += waited
        if isinstance(item, _Unit):
            item.log[4] += waited
        if item is None:
            self._q.put(None)
            raise RuntimeError("StreamedRows: asked for lines outside the order being read")
        if isinstance(item, BaseException):
            self._q.put(item)
            raise item
        return item

    def _select(self, rows):
        """Per unit, the positions of ``rows``' lines that hold a row: list of (unit, slots,
        positions in ``rows``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._last is not None and self._last[0] is rows:
            return self._last[1]
        found = np.zeros(rows.size, dtype=bool)
        hits = []
        used = []
        i = 0
        while not found.all():
            if i == len(self._loaded):
                self._loaded.append(self._next_unit())
            u = self._loaded[i]
            i += 1
            if u.covered.size == 0:
                continue
            p = np.searchsorted(u.covered, rows)
            inside = (~found) & (p < u.covered.size) & (u.covered[np.minimum(p, u.covered.size - 1)] == rows)
            if not inside.any():
                continue
            used.append(u.k)
            found |= inside
            where = np.flatnonzero(inside)
            g = np.searchsorted(u.good, rows[where])
            ok = (g < u.good.size) & (u.good[np.minimum(g, max(u.good.size - 1, 0))] == rows[where]) \
                if u.good.size else np.zeros(where.size, bool)
            hits.append((u, u.slot[g[ok]], where[ok]))
        if used:                                       # units before this request's first: done
            first = min(used)
            self._loaded = [u for u in self._loaded if u.k >= first]
        self._last = (rows, hits)
        return hits

    def _gather(self, rows):
        if self._gathered is not None and self._gathered[0] is rows:
            return self._gathered[1]                  # X[rows] then labels[rows]: one gather
        out = self._gather_new(rows)
        self._gathered = (rows, out)
        return out

    def _position(self, rows) -> int:
        """Where ``rows`` is a slice of the order being read: its first position, or -1.
        The steps ask for ``order[a:b]`` in turn: the slice after the last one is checked
        first (one comparison of ``b - a`` numbers), then a view of the order itself."""
        o = self._order
        m = rows.size
        if o is None or m == 0 or rows.ndim != 1:
            return -1
        p = self._next
        if p + m <= o.size and rows[0] == o[p] and np.array_equal(rows, o[p:p + m]):
            return p
        if rows.base is not None and rows.dtype == o.dtype and rows.strides == o.strides \
                and np.shares_memory(rows, o):
            p = (rows.__array_interface__["data"][0] - o.__array_interface__["data"][0]) // o.itemsize
            if 0 <= p and p + m <= o.size:
                return p
        return -1

    def _slices(self, a: int, b: int):
        """The CSR rows of the order's positions ``[a, b)`` from the units that hold them
        (units before them are dropped): ``(y, indptr, indices, data)``, copies."""
        k0, k1 = a // self.unit, (b - 1) // self.unit
        while not self._loaded or self._loaded[-1].k < k1:
            self._loaded.append(self._next_unit())
        self._loaded = [u for u in self._loaded if u.k >= k0]
        if not self._loaded or self._loaded[0].k > k0:
            raise RuntimeError("StreamedRows: asked for lines outside the order being read")
        parts = []
        for u in self._loaded:
            if u.k > k1:
                break
            lo, hi = max(a, u.start), min(b, u.stop)
            if hi <= lo:
                continue
            r0, r1 = int(u.count[lo - u.start]), int(u.count[hi - u.start])
            e0, e1 = int(u.indptr[r0]), int(u.indptr[r1])
            parts.append((u.y[r0:r1].copy(), u.indptr[r0:r1 + 1] - u.indptr[r0],
                          u.indices[e0:e1].copy(), None if u.data is None else u.data[e0:e1].copy()))
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), None
        y, indptr, indices, data, _ = _concat([p + (np.zeros(0),) for p in parts])
        return y, indptr, indices, data

    def _gather_new(self, rows):
        rows = np.asarray(rows)
        p = self._position(rows)
        if p >= self._first_read:
            self._next = p + rows.size
            return self._slices(p, p + rows.size)
        hits = self._select(rows)
        if not hits:
            return np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), None
        pos = np.concatenate([h[2] for h in hits])
        order = np.argsort(pos, kind="stable")      # the rows in the order asked
        parts = [_take(h[0].y, h[0].indptr, h[0].indices, h[0].data, h[1]) for h in hits]
        y, indptr, indices, data = (parts[0] if len(parts) == 1 else
                                    _concat([p + (np.zeros(0),) for p in parts])[:4])
        if not np.array_equal(order, np.arange(order.size)):
            y, indptr, indices, data = _take(y, indptr, indices, data, order)
        return y, indptr, indices, data

    def view(self, a: int, b: int) -> "StreamedRows":
        """The lines ``[a, b)`` of this partition as a partition of their own (not started;
        the same object for the same lines, so that ``X[a:b]`` and ``X.labels[a:b]`` read
        together)."""
        v = self._views.get((a, b))
        if v is None:
            v = self._views[(a, b)] = StreamedRows(self.index, self.parser, self.lo + a,
                                                   self.lo + b, unit=self.unit, depth=self.depth)
        return v

    def __getitem__(self, rows):
        """The CSR rows of the lines ``rows`` (an int64 array; ids in file order, a repeated
        id not added up: ``sum_duplicates`` makes them canonical); a slice gives a
        :meth:`view`."""
        if isinstance(rows, slice):
            a, b, step = rows.indices(self.shape[0])
            if step != 1:
                raise ValueError("StreamedRows: only contiguous slices")
            return self.view(a, max(a, b))
        y, indptr, indices, data = self._gather(rows)
        if data is None:                               # Criteo: every value is 1
            data = np.ones(indices.size)
        return sp.csr_matrix((data, indices, indptr), shape=(y.size, self.shape[1]))

    def identity(self, rows) -> tuple[int, int, int]:
        """``(rows, sum, sum of squares)`` of :func:`row_hashes` of the rows ``rows`` asked
        (of their canonical CSR form: indices sorted, duplicates added; mod 2**64), for the
        exactly-once tests."""
        X, y = self[rows], self.labels[rows]
        X.sum_duplicates()                  # canonical: sorted, duplicates added
        h = row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data)
        with np.errstate(over="ignore"):
            return int(y.size), int(h.sum(dtype=np.uint64)), int((h * h).sum(dtype=np.uint64))

    def report(self) -> dict:
        """The reader's counters: :attr:`stats`, and :attr:`again` as ``lines_again``,
        ``bytes_again``, ``read_seconds_again``, ``wait_seconds_again``."""
        return {**self.stats, **{f"{k}_again": v for k, v in self.again.items()}}


class _Labels:
    def __init__(self, rows: StreamedRows):
        self._rows = rows
        self.shape = (rows.shape[0],)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, slice):
            return self._rows[rows].labels
        return self._rows._gather(rows)[0]


def _sorted_lines(seq: np.ndarray) -> np.ndarray:
    """``np.sort(seq)`` of a unit's lines (distinct), without the sort when they are a run
    ``lo..hi`` in any order (a block-shuffled or unshuffled unit, the usual case)."""
    if seq.size == 0:
        return seq
    lo, hi = int(seq.min()), int(seq.max())
    if hi - lo + 1 == seq.size:
        seen = np.zeros(seq.size, dtype=bool)
        seen[seq - lo] = True
        if seen.all():
            return np.arange(lo, hi + 1, dtype=np.int64)
    return np.sort(seq)


def _put(q, item, stop) -> bool:
    """Put ``item`` on the bounded queue ``q``, waiting for room unless ``stop`` is set;
    returns whether it was put (False: stopped)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
