"""Minibatches streamed from files through a bounded prefetch queue, exactly once per epoch.

No MPI. A worker's share of an epoch is a list of :class:`Work` items (byte ranges of data
files). :class:`StreamReader` reads them in a background thread, window by window
(``window_bytes`` of text at a time), parses each window (the Cython parsers release the
GIL), shuffles the rows of a window when asked (a seeded permutation that depends only on the
window's file, bytes and the epoch, so any worker reproduces it), cuts minibatches and puts
them in a queue of ``depth`` batches. The worker's peak memory is therefore about one window
of text, its parsed rows, and ``depth`` batches — not the data set.

Every batch carries the reader's position *after* it as a list of :class:`Work`: the rest of
the window it ends in (``skip`` = rows of that window already delivered) and every byte range
not yet read. That list is what a checkpoint stores; :func:`split_work` re-plans it over any
number of workers (lost or added workers), so that each row is read once per epoch.

A shuffle here is a block shuffle: rows are permuted within a window, windows keep file
order. The in-memory readers (:mod:`hpcps.data.source`) keep the full shuffle for small data.
"""

from __future__ import annotations

import queue
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpcps.data.textstream import compression, iter_chunks

__all__ = ["Work", "Batch", "StreamReader", "split_work", "work_bytes"]


@dataclass(frozen=True)
class Work:
    """Unread rows: the lines of ``path`` starting in ``[start, stop)`` of its decompressed
    byte stream, less the first ``skip`` rows of the window ``[start, stop)`` in its shuffled
    order (``skip > 0`` only for the rest of a window a worker had begun; such an item is
    read as one window and never split).

    Attributes
    ----------
    path : str
    start : int
        A line start.
    stop : int or None
        A line start or end of file (None: to the end).
    skip : int
    """

    path: str
    start: int
    stop: int | None
    skip: int = 0

    def to_row(self) -> tuple:
        """``(path, start, stop or -1, skip)`` for an HDF5 compound dataset."""
        return (self.path, self.start, -1 if self.stop is None else self.stop, self.skip)

    @staticmethod
    def from_row(row) -> "Work":
        path, start, stop, skip = row
        path = path.decode() if isinstance(path, bytes) else str(path)
        return Work(path, int(start), None if int(stop) < 0 else int(stop), int(skip))


@dataclass
class Batch:
    """One minibatch and the reader's position after it.

    Attributes
    ----------
    y : ndarray of float64, shape (n,)
    indptr : ndarray of int64, shape (n + 1,)
    indices : ndarray of int64, shape (nnz,)
    data : ndarray of float64, shape (nnz,), or None (all ones)
    remaining : list of Work
        What is left to read after this batch (a checkpoint's reader state).
    """

    y: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray | None
    remaining: list


def work_bytes(work: list[Work], sizes: dict | None = None) -> int:
    """Bytes of text the items cover (``stop`` None counts to the file size; compressed files
    count their compressed size), for planning."""
    import os

    total = 0
    for w in work:
        stop = w.stop if w.stop is not None else os.path.getsize(w.path)
        total += max(stop - w.start, 0)
    return total


def _line_start_at_or_after(path: str, pos: int, stop: int | None) -> int:
    with open(path, "rb") as f:
        f.seek(pos - 1)
        f.readline()
        at = f.tell()
    return at if stop is None else min(at, stop)


def split_work(work: list[Work], n_parts: int) -> list[list[Work]]:
    """Re-plan unread work over ``n_parts`` workers: every unread row goes to one of them.

    Items of plain files are cut by bytes (at line starts) so that the parts get about the
    same number of bytes; items of compressed files and the rests of begun windows
    (``skip > 0``) are whole, handed out largest first to the part with the fewest bytes.

    Parameters
    ----------
    work : list of Work
        The union of every worker's ``remaining``.
    n_parts : int
        ``>= 1``.

    Returns
    -------
    list of list of Work
        ``n_parts`` lists (some may be empty).

    Raises
    ------
    ValueError
        If ``n_parts < 1``.
    """
    if n_parts < 1:
        raise ValueError(f"n_parts must be >= 1, got {n_parts}")
    import os

    whole, cuttable = [], []
    for w in work:
        (cuttable if w.skip == 0 and compression(w.path) is None else whole).append(w)
    parts: list[list[Work]] = [[] for _ in range(n_parts)]
    load = [0] * n_parts
    for w in sorted(whole, key=lambda w: -work_bytes([w])):
        k = load.index(min(load))
        parts[k].append(w)
        load[k] += work_bytes([w])
    total = sum(work_bytes([w]) for w in cuttable)
    target = [(total + sum(load)) // n_parts - load[k] for k in range(n_parts)]
    k = 0
    for w in cuttable:
        stop = w.stop if w.stop is not None else os.path.getsize(w.path)
        start = w.start
        while start < stop:
            while k < n_parts - 1 and target[k] <= 0:
                k += 1
            want = stop - start if k == n_parts - 1 else target[k]
            cut = stop if start + want >= stop else _line_start_at_or_after(w.path, start + want, stop)
            if cut > start:
                parts[k].append(Work(w.path, start, cut if cut < stop or w.stop is not None else w.stop))
                target[k] -= cut - start
            start = cut
    return parts


def _window_rng(path: str, start: int, stop: int, epoch: int, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, zlib.crc32(path.encode()), start, stop])


def _take_rows(y, indptr, indices, data, rows):
    """The CSR rows ``rows`` (in that order)."""
    lengths = indptr[1:] - indptr[:-1]
    n = lengths[rows]
    new_ptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(n, out=new_ptr[1:])
    src = np.repeat(indptr[:-1][rows] - new_ptr[:-1], n) + np.arange(new_ptr[-1], dtype=np.int64)
    return y[rows], new_ptr, indices[src], None if data is None else data[src]


class StreamReader:
    """Minibatches of a worker's work list, read and parsed in a background thread.

    Parameters
    ----------
    work : list of Work
        This worker's share (:func:`hpcps.data.textstream.plan_parts` as ``Work``, or a
        checkpoint's ``remaining``, or a part of :func:`split_work`).
    parse : callable(bytes) -> (y, indptr, indices, data or None, line_offsets)
        Parses whole lines; raises ``ValueError`` subclasses with an ``offset`` attribute
        (byte offset in the buffer), turned into ``DataError`` naming file and line by
        ``error``.
    batch_size : int
        Rows per minibatch (the last of the work list may be smaller).
    error : callable(path, chunk_offset, chunk, exc) -> Exception
        Builds the exception to raise for a parse error.
    depth : int, default 4
        Batches the queue holds ahead of the consumer.
    window_bytes : int, default 8 MiB
        Text read, parsed and (with ``shuffle``) permuted at a time.
    shuffle : bool, default False
    seed, epoch : int
        The permutation of a window depends on these and the window only.

    Notes
    -----
    The reader thread is a daemon; call :meth:`close` (or use ``with``) to stop it early.
    :attr:`wait_seconds` is the time :meth:`__next__` spent waiting for data; :attr:`rows`
    and :attr:`bytes` count what the thread read.
    """

    def __init__(self, work: list[Work], parse: Callable, batch_size: int, error: Callable, *,
                 depth: int = 4, window_bytes: int = 8 << 20, shuffle: bool = False,
                 seed: int = 0, epoch: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.work = list(work)
        self._parse, self._error = parse, error
        self.batch_size, self.window_bytes = int(batch_size), int(window_bytes)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), int(epoch)
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_seconds = 0.0
        self.rows = 0
        self.bytes = 0
        self._done = False
        self._thread = threading.Thread(target=self._run, name="hpcps-reader", daemon=True)
        self._thread.start()

    # -- consumer -------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        item = self._q.get()
        self.wait_seconds += time.perf_counter() - t0
        if item is None:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def close(self) -> None:
        """Stop the reader thread (batches not yet taken are dropped)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._done = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reader thread --------------------------------------------------------------------
    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _windows(self):
        """(work index, window start, window stop, skip, parsed arrays) in reading order."""
        for i, w in enumerate(self.work):
            size = None if w.skip == 0 else 1 << 62       # a begun window is read whole
            for ch in iter_chunks(w.path, size or self.window_bytes, start=w.start, stop=w.stop):
                if self._stop.is_set():
                    return
                try:
                    y, indptr, indices, data, _ = self._parse(ch.data)
                except ValueError as e:
                    raise self._error(w.path, ch.offset, ch.data, e) from None
                self.bytes += len(ch.data)
                yield i, ch.offset, ch.offset + len(ch.data), w.skip, (y, indptr, indices, data)

    def _run(self) -> None:
        try:
            pend: list = []          # row blocks waiting to fill a batch: (y, indptr, indices, data)
            n_pend = 0
            for i, a, b, skip, (y, indptr, indices, data) in self._windows():
                n = y.size
                order = np.arange(n)
                if self.shuffle:
                    order = _window_rng(self.work[i].path, a, b, self.epoch, self.seed).permutation(n)
                pos = skip
                self.rows += n - skip
                while pos < n:
                    take = min(self.batch_size - n_pend, n - pos)
                    pend.append(_take_rows(y, indptr, indices, data, order[pos:pos + take]))
                    n_pend += take
                    pos += take
                    if n_pend == self.batch_size:
                        rest = ([Work(self.work[i].path, a, b, pos)] if pos < n else []) + \
                               ([Work(self.work[i].path, b, self.work[i].stop)]
                                if self.work[i].stop is None or b < self.work[i].stop else [])
                        if not self._put(self._batch(pend, rest + self.work[i + 1:])):
                            return
                        pend, n_pend = [], 0
            if n_pend and not self._put(self._batch(pend, [])):
                return
            self._put(None)
        except BaseException as e:                    # noqa: BLE001  (handed to the consumer)
            self._put(e)

    @staticmethod
    def _batch(pend, remaining) -> Batch:
        y = np.concatenate([p[0] for p in pend])
        lens = [p[1][-1] for p in pend]
        indptr = np.concatenate([[0]] + [p[1][1:] + off for p, off in
                                         zip(pend, np.cumsum([0] + lens[:-1]))]).astype(np.int64)
        indices = np.concatenate([p[2] for p in pend])
        data = None if pend[0][3] is None else np.concatenate([p[3] for p in pend])
        return Batch(y, indptr, indices, data, remaining)
