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

from hpcps.data import DataError
from hpcps.data.lineindex import INDEX_STEP, LineIndex, decode_errors, load_index, open_text
from hpcps.data.textstream import compression, data_files

__all__ = ["LineIndex", "load_index", "Parser", "StreamedRows", "streams", "row_hashes"]

_READ = 1 << 20


def streams(data_cfg) -> bool:
    """Whether a job's ``[data]`` streams: ``stream`` when set; else (absent) when a data file
    is compressed or the files of ``path`` and ``test_path`` add up to more than
    ``stream_above_mb`` MB.

    Raises
    ------
    DataError
        ``path`` or ``test_path`` names no data file (auto mode reads their sizes).
    """
    if data_cfg.format not in ("svmlight", "criteo"):
        return False
    if data_cfg.stream is not None:
        return bool(data_cfg.stream)
    files = data_files(data_cfg.path) + (data_files(data_cfg.test_path) if data_cfg.test_path else [])
    if any(compression(f) is not None for f in files):
        return True
    return sum(os.path.getsize(f) for f in files) > data_cfg.stream_above_mb * 1e6


# -- reading line ranges ---------------------------------------------------------------------

class _FileCursor:
    """An open file positioned at a line start: ``line`` is the line number of ``buf[0]``."""

    def __init__(self, path: str, kind):
        self.path, self.kind = path, kind
        self.fh = open_text(path, kind)
        self.line, self.byte, self.buf, self.eof = 0, 0, b"", False

    def seek(self, line: int, byte: int) -> None:
        """Go to line ``line``, which starts at decompressed byte ``byte``."""
        if self.kind is None:
            self.fh.seek(byte)
        elif self.byte <= byte < self.byte + len(self.buf):
            self.buf = self.buf[byte - self.byte:]
            self.line, self.byte = line, byte
            return
        elif byte >= self.byte + len(self.buf):          # compressed: decode forward
            self._skip_bytes(byte - self.byte - len(self.buf))
        else:                                            # compressed, backwards: from the start
            self.fh.close()
            self.fh = open_text(self.path, self.kind)
            self._skip_bytes(byte)
        self.line, self.byte, self.buf, self.eof = line, byte, b"", False

    def _skip_bytes(self, n: int) -> None:
        while n > 0:
            got = self.fh.read(min(n, 4 * _READ))
            if not got:
                break
            n -= len(got)

    def take(self, count: int) -> bytes:
        """The next ``count`` lines (fewer at end of file); the cursor moves past them."""
        parts, have = [], 0
        buf = self.buf
        while True:
            c = buf.count(b"\n")
            if have + c >= count:
                nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
                cut = int(nl[count - have - 1]) + 1
                parts.append(buf[:cut])
                self.buf = buf[cut:]
                break
            parts.append(buf)
            have += c
            buf = b"" if self.eof else self.fh.read(_READ)
            if not buf:
                self.eof = True
                self.buf = b""
                break
        out = b"".join(parts)
        self.line += count
        self.byte += len(out)
        return out

    def close(self) -> None:
        self.fh.close()


class Parser:
    """Parse whole lines of one format into CSR rows, dropping or refusing bad lines.

    Parameters
    ----------
    data_cfg : hpcps.config.DataConfig
        ``format`` ``"criteo"`` (``hash_bits``) or ``"svmlight"`` (``index_base``,
        ``n_features``, ``duplicate_indices``), and ``on_bad_line``.

    Attributes
    ----------
    skipped : int
        Bad lines dropped so far (``on_bad_line = "skip"``).
    n_features : int
    """

    def __init__(self, data_cfg):
        self.format = data_cfg.format
        self.skip = data_cfg.on_bad_line == "skip"
        self.skipped = 0
        self.n_features = int(data_cfg.num_features)
        if self.format == "criteo":
            from hpcps.kernels.criteo import CriteoSyntaxError, parse_criteo

            bits = int(data_cfg.hash_bits)
            self._errors = CriteoSyntaxError
            self._parse = lambda b: (lambda y, p, i, o: (y, p, i, None, o))(*parse_criteo(b, bits, 0))
        else:
            from hpcps.kernels.svmlight import SvmlightSyntaxError, parse_svmlight

            base, nf = int(data_cfg.index_base), int(data_cfg.n_features)
            dup = data_cfg.duplicate_indices == "sum"
            self._errors = SvmlightSyntaxError
            self._parse = lambda b: parse_svmlight(b, base, nf, sum_duplicates=dup)

    def __call__(self, buf: bytes, path: str, first_line: int):
        """Rows of ``buf`` (whole lines of ``path`` from its line ``first_line``, 0-based):
        ``(y, indptr, indices, data or None, line)`` with ``line`` (int64) each row's line
        within ``buf`` (0-based).

        Raises
        ------
        DataError
            ``FILE:LINE: reason`` for the first bad line (``on_bad_line = "error"``).
        """
        pieces, at, line0 = [], 0, 0
        while True:
            chunk = buf[at:] if at else buf
            try:
                y, indptr, indices, data, offs = self._parse(chunk)
            except self._errors as e:
                bad_line = line0 + chunk.count(b"\n", 0, e.offset)
                if not self.skip:
                    raise DataError(f"{path}:{first_line + bad_line + 1}: {e.reason}") from None
                start = chunk.rfind(b"\n", 0, e.offset) + 1
                end = chunk.find(b"\n", e.offset)
                end = len(chunk) if end < 0 else end + 1
                if start:
                    pieces.append(self._rows(chunk[:start], line0))
                self.skipped += 1
                line0 = bad_line + 1
                at += end
                if at >= len(buf):
                    break
                continue
            pieces.append(self._finish(y, indptr, indices, data, offs, chunk, line0, path, first_line))
            break
        if len(pieces) == 1:
            return pieces[0]
        return _concat(pieces)

    def _rows(self, chunk, line0):
        y, indptr, indices, data, offs = self._parse(chunk)
        return self._finish(y, indptr, indices, data, offs, chunk, line0, None, 0)

    def _finish(self, y, indptr, indices, data, offs, chunk, line0, path, first_line):
        n_lines = chunk.count(b"\n") + (1 if chunk and chunk[-1:] != b"\n" else 0)
        if y.size == n_lines:                   # a row on every line (the usual case)
            line = np.arange(line0, line0 + n_lines, dtype=np.int64)
        else:
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            line = line0 + np.searchsorted(nl, np.asarray(offs, dtype=np.int64), side="left")
        if self.format == "svmlight":
            bad = ~np.isin(y, (-1.0, 0.0, 1.0))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                if not self.skip:
                    raise DataError(f"{path}:{first_line + int(line[i]) + 1}: label "
                                    f"{float(y[i])!r} is not -1, 0 or +1")
                keep = np.flatnonzero(~bad)
                self.skipped += int(bad.sum())
                y, indptr, indices, data = _take(y, indptr, indices, data, keep)
                line = line[keep]
            y = (y > 0).astype(np.float64)
        return y, np.asarray(indptr, dtype=np.int64), indices, data, line.astype(np.int64)


def _concat(pieces):
    y = np.concatenate([p[0] for p in pieces])
    sizes = [p[1][-1] for p in pieces]
    shift = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    indptr = np.concatenate([[0]] + [p[1][1:] + s for p, s in zip(pieces, shift)]).astype(np.int64)
    indices = np.concatenate([p[2] for p in pieces])
    data = None if pieces[0][3] is None else np.concatenate([p[3] for p in pieces])
    line = np.concatenate([p[4] for p in pieces])
    return y, indptr, indices, data, line


def _take(y, indptr, indices, data, rows):
    """The CSR rows ``rows`` (int64, in that order)."""
    lengths = indptr[1:] - indptr[:-1]
    n = lengths[rows]
    new_ptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(n, out=new_ptr[1:])
    src = np.repeat(indptr[:-1][rows] - new_ptr[:-1], n) + np.arange(new_ptr[-1], dtype=np.int64)
    return y[rows], new_ptr, indices[src], None if data is None else data[src]


class LineReader:
    """Reads and parses ranges of global line numbers (one thread; keeps files open)."""

    def __init__(self, index: LineIndex, parser: Parser):
        self.index, self.parser = index, parser
        self.cursors: dict = {}
        self.bytes = 0

    def read(self, a: int, b: int):
        """Rows of global lines ``[a, b)``: ``(y, indptr, indices, data, line)`` with ``line``
        the global line number of each row."""
        out = []
        ix = self.index
        while a < b:
            f, k = ix.locate(a)
            n = min(b - a, int(ix.lines[f]) - k)
            cur = self.cursors.get(f)
            if cur is None:
                cur = self.cursors[f] = _FileCursor(ix.files[f], compression(ix.files[f]))
            if not (cur.line <= k < cur.line + 4 * INDEX_STEP):
                j = k // INDEX_STEP
                cur.seek(j * INDEX_STEP, int(ix.offsets[f][j]))
            if k > cur.line:
                cur.take(k - cur.line)                   # forward to line k
            try:
                buf = cur.take(n)
            except decode_errors() as e:
                raise DataError(f"{ix.files[f]}: {cur.kind} stream damaged or truncated near "
                                f"line {cur.line + 1}: {e}") from None
            self.bytes += len(buf)
            y, indptr, indices, data, line = self.parser(buf, ix.files[f], k)
            out.append((y, indptr, indices, data, line + a))
            a += n
        if len(out) == 1:
            return out[0]
        if not out:
            return (np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), None,
                    np.zeros(0, np.int64))
        return _concat(out)

    def close(self):
        for c in self.cursors.values():
            c.close()
        self.cursors.clear()


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
        seg = np.add.reduceat(h, indptr[:-1]) if h.size else np.zeros(y.size, np.uint64)
        seg = np.where(n > 0, seg, np.uint64(0))
        return (seg + (np.asarray(y, dtype=np.float64) > 0).astype(np.uint64) * np.uint64(7919)) \
            & np.uint64((1 << 63) - 1)


# -- the lazy rows a worker trains on ---------------------------------------------------------

class _Unit:
    """Parsed rows of one read unit: the lines ``covered`` (sorted, local numbers), the rows
    of those that hold one (``good``, sorted) and where each is in the CSR arrays."""

    __slots__ = ("k", "covered", "good", "slot", "y", "indptr", "indices", "data")


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
        trainer waiting for a unit), ``skipped`` bad lines.
    """

    def __init__(self, index: LineIndex, parser: Parser, lo: int, hi: int, *, unit: int = 65536,
                 depth: int = 4):
        self.index, self.parser = index, parser
        self.lo, self.hi = int(lo), int(hi)
        self.shape = (self.hi - self.lo, parser.n_features)
        self.unit, self.depth = max(1, int(unit)), max(1, int(depth))
        self.labels = _Labels(self)
        self.stats = {"bytes": 0, "lines": 0, "read_seconds": 0.0, "wait_seconds": 0.0}
        self._thread = None
        self._stop = threading.Event()
        self._q = None
        self._loaded: list = []
        self._last = None
        self._gathered = None
        self._order = None
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
                want = np.sort(order[a:(k + 1) * self.unit])
                t0 = time.perf_counter()
                u = self._read_unit(reader, k, want)
                self.stats["read_seconds"] += time.perf_counter() - t0
                self.stats["lines"] += int(want.size)
                self.stats["bytes"] = base + reader.bytes
                if not _put(q, u, stop) or stop.is_set():
                    return
                k += 1
            q.put(None)
        except BaseException as e:              # noqa: BLE001 (handed to the trainer)
            _put(q, e, stop)
        finally:
            reader.close()

    def _read_unit(self, reader, k, want) -> _Unit:
        # contiguous runs of the wanted lines (a gap of more than a unit starts a new read)
        cuts = np.flatnonzero(np.diff(want) > self.unit) + 1
        parts = []
        for run in np.split(want, cuts):
            if run.size == 0:
                continue
            y, indptr, indices, data, line = reader.read(self.lo + int(run[0]), self.lo + int(run[-1]) + 1)
            line = line - self.lo
            pos = np.searchsorted(run, line)
            keep = np.flatnonzero((pos < run.size) & (run[np.minimum(pos, run.size - 1)] == line))
            if keep.size != y.size:
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
        u.good, u.slot = line, np.arange(line.size)      # read in line order
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

    # -- requests -----------------------------------------------------------------------------
    def _next_unit(self) -> _Unit:
        if self._q is None:
            raise RuntimeError("StreamedRows: start() was not called before reading rows")
        t0 = time.perf_counter()
        item = self._q.get()
        self.stats["wait_seconds"] += time.perf_counter() - t0
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

    def _gather_new(self, rows):
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
        """The reader's counters (:attr:`stats` and ``skipped``)."""
        return {**self.stats, "skipped": int(self.parser.skipped)}


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
