"""Reading and parsing ranges of a data set's lines (the reader thread's side of
:mod:`hpcps.data.lines`; no MPI).

:class:`LineReader` reads global line ranges from the files a
:class:`~hpcps.data.lineindex.LineIndex` maps, through one :class:`_FileCursor` per file
(plain, gzip or zstd), and parses them with a :class:`Parser` (the Cython Criteo and
svmlight kernels) into CSR rows.
"""

from __future__ import annotations

import numpy as np

from hpcps.data import DataError
from hpcps.data.lineindex import INDEX_STEP, LineIndex, decode_errors, open_text
from hpcps.data.textstream import compression
from hpcps.kernels.text import count_newlines, newline_end

__all__ = ["LineReader", "Parser"]

_READ = 1 << 20
_INT32_MAX = 2**31 - 1


class _FileCursor:
    """An open file positioned at a line start: ``line`` is the line number (0-based) and
    ``byte`` the decompressed offset of the next byte :meth:`take` returns.

    The bytes read wait in a buffer the reader lends to the cursor it reads from
    (:meth:`lend`) and takes back after the read (:meth:`keep_rest`), so reading a data set
    touches fresh memory once, not once per read, and a reader holds one such buffer (a
    unit's bytes, ~16-32 MiB for Criteo), not one per file it has opened: a worker whose share
    spans 10 files kept 10 of them until the end of the epoch (a new user's 7.5 GB run: worker
    peaks 80-170 MiB higher).
    """

    def __init__(self, path: str, kind):
        self.path, self.kind = path, kind
        self.fh = open_text(path, kind)
        self.line, self.byte, self.eof = 0, 0, False
        self.store = np.empty(0, dtype=np.uint8)
        self.lo = self.hi = 0                           # store[lo:hi]: read, not yet taken

    def lend(self, store: np.ndarray) -> None:
        """Read into ``store`` (uint8) from now on; the unread rest moves to its front."""
        have = self.hi - self.lo
        if store.size < have + _READ:
            store = np.empty(have + _READ, dtype=np.uint8)
        store[:have] = self.store[self.lo:self.hi]
        self.store, self.lo, self.hi = store, 0, have

    def keep_rest(self) -> np.ndarray:
        """The lent buffer back (maybe grown); the cursor keeps a copy of its unread rest (at
        most about one read, ``_READ`` bytes). Views of the last :meth:`take` stay valid until
        the buffer is lent again."""
        store = self.store
        self.store = store[self.lo:self.hi].copy()
        self.lo, self.hi = 0, self.store.size
        return store

    def seek(self, line: int, byte: int) -> None:
        """Go to line ``line``, which starts at decompressed byte ``byte``."""
        have = self.hi - self.lo
        if self.kind is None:
            self.fh.seek(byte)
        elif self.byte <= byte < self.byte + have:
            self.lo += byte - self.byte
            self.line, self.byte = line, byte
            return
        elif byte >= self.byte + have:                   # compressed: decode forward
            self._skip_bytes(byte - self.byte - have)
        else:                                            # compressed, backwards: from the start
            self.fh.close()
            self.fh = open_text(self.path, self.kind)
            self._skip_bytes(byte)
        self.line, self.byte, self.eof = line, byte, False
        self.lo = self.hi = 0

    def _skip_bytes(self, n: int) -> None:
        while n > 0:
            got = self.fh.read(min(n, 4 * _READ))
            if not got:
                break
            n -= len(got)

    def _fill(self) -> int:
        """Read up to ``_READ`` more bytes after ``store[hi]``; returns how many (0: end)."""
        if self.store.size < self.hi + _READ:
            grown = np.empty(max(2 * self.store.size, self.hi + _READ), dtype=np.uint8)
            grown[:self.hi] = self.store[:self.hi]
            self.store = grown
        with memoryview(self.store) as mv:
            got = self.fh.readinto(mv[self.hi:self.hi + _READ])
        self.hi += got or 0
        return got or 0

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` lines (fewer at end of file), as a uint8 view of the cursor's
        buffer: valid until the next :meth:`take` or :meth:`seek` (copy what is kept). The
        cursor moves past them."""
        have = self.hi - self.lo
        if self.lo:                                      # the unread rest to the front
            self.store[:have] = self.store[self.lo:self.hi]
            self.lo, self.hi = 0, have
        found, scan = 0, 0
        while True:
            c, cut = newline_end(self.store[scan:self.hi], count - found)   # memchr, no GIL
            if cut >= 0:
                cut += scan
                break
            found += c
            scan = self.hi
            if self.eof or not self._fill():
                self.eof = True
                cut = self.hi
                break
        self.lo = cut
        self.line += count
        self.byte += cut
        return self.store[:cut]

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
            self._parse = lambda b, out=None: (lambda y, p, i, o: (y, p, i, None, o))(
                *parse_criteo(b, bits, 0, out=out))
        else:
            from hpcps.kernels.svmlight import SvmlightSyntaxError, parse_svmlight

            # num_features, not n_features: None for a dynamic table (found by a trial: every
            # streamed svmlight job without n_features stopped here with a TypeError)
            base, nf = int(data_cfg.index_base), self.n_features
            dup = data_cfg.duplicate_indices == "sum"
            self._errors = SvmlightSyntaxError
            # int32 indices when they fit (half the bytes; the reader's row gather reads them
            # as they are)
            ind = np.int32 if nf <= _INT32_MAX else np.int64
            self._parse = lambda b, out=None: parse_svmlight(b, base, nf, sum_duplicates=dup,
                                                             index_dtype=ind, out=out)

    def __call__(self, buf, path: str, first_line: int, out: dict | None = None):
        """Rows of ``buf`` (whole lines of ``path`` from its line ``first_line``, 0-based):
        ``(y, indptr, indices, data or None, line)`` with ``line`` (int64) each row's line
        within ``buf`` (0-based).

        ``buf`` is bytes-like (bytes, or a uint8 array). ``out``: the caller's reused
        output buffers (:func:`hpcps.kernels.text.pooled`); the arrays returned may then
        be views of them, valid until the next call with the same ``out``. ``indices`` are
        int32 for svmlight data of up to ``2**31 - 1`` features, else int64.

        Raises
        ------
        DataError
            ``FILE:LINE: reason`` for the first bad line (``on_bad_line = "error"``).
        """
        try:
            y, indptr, indices, data, offs = self._parse(buf, out)
        except self._errors:
            # a bad line: found (and, skipping, cut out) on a copy, with fresh arrays
            return self._bad(bytes(buf), path, first_line)
        return self._finish(y, indptr, indices, data, offs, buf, 0, path, first_line)

    def _bad(self, buf: bytes, path: str, first_line: int):
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
        n_lines = count_newlines(chunk) + (1 if len(chunk) and chunk[-1] != 10 else 0)
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


def _own(piece):
    """``piece`` (y, indptr, indices, data, line) with arrays of its own (copies)."""
    return tuple(None if a is None else np.array(a) for a in piece)


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
        self.out: dict = {}                  # the parser's output buffers, reused
        self.store = np.empty(4 * _READ, dtype=np.uint8)     # lent to the cursor read from

    def read(self, a: int, b: int):
        """Rows of global lines ``[a, b)``: ``(y, indptr, indices, data, line)`` with ``line``
        the global line number of each row.

        The arrays may be views of this reader's reused buffers: valid until the next
        :meth:`read` (copy what is kept)."""
        out = []
        ix = self.index
        while a < b:
            f, k = ix.locate(a)
            n = min(b - a, int(ix.lines[f]) - k)
            cur = self.cursors.get(f)
            if cur is None:
                cur = self.cursors[f] = _FileCursor(ix.files[f], compression(ix.files[f]))
            cur.lend(self.store)
            try:
                if not (cur.line <= k < cur.line + 4 * INDEX_STEP):
                    j = k // INDEX_STEP
                    cur.seek(j * INDEX_STEP, int(ix.offsets[f][j]))
                if k > cur.line:
                    cur.take(k - cur.line)               # forward to line k
                try:
                    buf = cur.take(n)
                except decode_errors() as e:
                    raise DataError(f"{ix.files[f]}: {cur.kind} stream damaged or truncated "
                                    f"near line {cur.line + 1}: {e}") from None
                self.bytes += len(buf)
                piece = self.parser(buf, ix.files[f], k, self.out)
            finally:
                self.store = cur.keep_rest()
            piece = piece[:4] + (piece[4] + a,)
            a += n
            # another file follows: this one's rows out of the buffers the next parse reuses
            out.append(_own(piece) if a < b else piece)
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
