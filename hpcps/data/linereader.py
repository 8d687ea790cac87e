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
            c, cut = newline_end(buf, count - have)      # memchr, without the GIL
            if cut >= 0:
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
        n_lines = count_newlines(chunk) + (1 if chunk and chunk[-1:] != b"\n" else 0)
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
