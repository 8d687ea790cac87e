"""Data files as streams of whole lines: one file, a directory or a glob; plain, gzip or zstd.

No MPI. A job's ``[data] path`` may name

- a file;
- a directory: every regular file in it whose name does not start with ``.`` or ``_``,
  sorted by name;
- a glob pattern (``*``, ``?``, ``[``): the matching regular files, sorted.

Each file is read as a stream of chunks that end on a line end, so that a reader's memory is
set by the chunk size, not the file size. Compression is recognised by the file's first
bytes (gzip ``1f 8b``, zstd ``28 b5 2f fd``) and decoded while streaming with the standard
library's :mod:`gzip` and the ``zstandard`` package; a compressed file cannot be split into
byte ranges, so it is the unit of assignment across workers.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import zlib
from dataclasses import dataclass
from typing import Iterator

from hpcps.data import DataError
from hpcps.kernels.text import count_newlines

__all__ = ["Chunk", "Piece", "data_files", "compression", "iter_chunks", "plan_parts", "line_number",
           "CHUNK_BYTES"]

#: Default size of a chunk read from a file (decompressed bytes), before it is cut at its
#: last line end.
CHUNK_BYTES = 4 << 20

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one file.

    Attributes
    ----------
    data : bytes
        Whole lines; the last one may lack its ``\\n`` only at end of file.
    offset : int
        Offset of ``data[0]`` in the file's (decompressed) byte stream.
    line : int
        1-based line number of the first line of ``data``.
    """

    data: bytes
    offset: int
    line: int


def data_files(path: str | os.PathLike) -> list[str]:
    """The data files a ``[data] path`` names (see the module docstring).

    Parameters
    ----------
    path : str or path-like
        A file, a directory or a glob pattern.

    Returns
    -------
    list of str
        At least one path, sorted (a single file: itself).

    Raises
    ------
    DataError
        If nothing exists at ``path``, or a directory or pattern holds no data file.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        names = sorted(n for n in os.listdir(p) if not n.startswith((".", "_")))
        files = [os.path.join(p, n) for n in names if os.path.isfile(os.path.join(p, n))]
        if not files:
            raise DataError(f"{p}: the directory holds no data file")
        return files
    if any(c in p for c in "*?["):
        files = sorted(f for f in glob.glob(p) if os.path.isfile(f))
        if not files:
            raise DataError(f"{p}: no file matches this pattern")
        return files
    if not os.path.isfile(p):
        raise DataError(f"{p}: no such file or directory")
    return [p]


def compression(path: str | os.PathLike) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None``, from the file's first four bytes.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == _GZIP:
        return "gzip"
    if head == _ZSTD:
        return "zstd"
    return None


def _open(path: str, kind: str | None):
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "zstd":
        return ZstdFrames(path)
    return open(path, "rb")


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd file of one or more frames, read forward; a file that
    ends inside a frame raises ``zstandard.ZstdError`` (``zstandard.open`` and its
    ``stream_reader`` returned the decoded part and then end of file, so a truncated file lost
    its last rows without a word).

    Parameters
    ----------
    path : str or path-like
        The compressed file.
    """

    def __init__(self, path):
        import zstandard

        self._zstd = zstandard
        self._dctx = zstandard.ZstdDecompressor()
        self._raw = open(path, "rb")
        self._obj = None          # the decompressor of the frame being read, or None
        self._out = b""           # decoded bytes not yet returned, from self._at
        self._at = 0

    def readable(self) -> bool:
        return True

    def _feed(self, data: bytes) -> None:
        parts = []
        while data:
            if self._obj is None:
                self._obj = self._dctx.decompressobj()
            parts.append(self._obj.decompress(data))
            if not self._obj.eof:
                break
            data, self._obj = self._obj.unused_data, None
        self._out, self._at = b"".join(parts), 0

    def readinto(self, b) -> int:
        while self._at >= len(self._out):
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if self._obj is not None:
                    raise self._zstd.ZstdError("truncated: the file ends inside a zstd frame")
                return 0
            self._feed(chunk)
        n = min(len(b), len(self._out) - self._at)
        b[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _decode_errors():
    errors = [EOFError, gzip.BadGzipFile, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:                                       # pragma: no cover
        pass
    return tuple(errors)


def _read_into(f, buf: bytearray, at: int, want: int) -> int:
    """Read up to ``want`` bytes of ``f`` into ``buf[at:]`` (fewer only at end of stream)."""
    got = 0
    with memoryview(buf) as mv:
        while got < want:
            n = f.readinto(mv[at + got:at + want])
            if not n:
                break
            got += n
    return got


def _copy(buf: bytearray, lo: int, hi: int) -> bytes:
    """``bytes(buf[lo:hi])`` copied once (slicing a bytearray copies it, then ``bytes``)."""
    with memoryview(buf) as mv:
        return bytes(mv[lo:hi])


def iter_chunks(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES, start: int = 0,
                start_line: int = 1, stop: int | None = None, reuse: bool = False) -> Iterator[Chunk]:
    """Whole lines of ``path`` from byte ``start`` of its decompressed stream, in chunks.

    Parameters
    ----------
    path : str or path-like
        A plain, gzip or zstd file.
    chunk_bytes : int, default :data:`CHUNK_BYTES`
        Bytes read at a time; a chunk holds at most this plus one line.
    start : int, default 0
        A line start in the decompressed stream (a resume position). In a compressed file
        the bytes before it are decoded and dropped.
    start_line : int, default 1
        The line number of the line at ``start`` (for messages).
    stop : int or None
        Read only the lines that start before this offset (a byte range of a plain file).
    reuse : bool, default False
        Each chunk's ``data`` is a uint8 array viewing the reader's buffer, which the next
        chunk overwrites (valid until the next chunk is asked for; copy what is kept): no
        copy of the bytes and no fresh memory per chunk. Else ``bytes`` of its own.

    Yields
    ------
    Chunk

    Raises
    ------
    DataError
        If a compressed stream is damaged or truncated: the message names the file and the
        decompressed byte offset reached.
    """
    p = os.fspath(path)
    kind = compression(p)
    chunk_bytes = max(int(chunk_bytes), 1)
    offset, line = int(start), int(start_line)
    try:
        with _open(p, kind) as f:
            if start:
                if kind is None:
                    f.seek(start)
                else:
                    left = start
                    while left > 0:
                        got = f.read(min(left, 1 << 22))
                        if not got:
                            break
                        left -= len(got)
            # lines are read into one reused buffer; a chunk's bytes are copied out of it once
            # (reuse: handed out as a view of it)
            if reuse:
                yield from _iter_reused(f, chunk_bytes, stop, offset, line)
                return
            buf = bytearray(chunk_bytes)
            have = 0                                   # bytes of buf holding the next lines
            while True:
                # a chunk covers [offset, offset + chunk_bytes) cut at its last line end, so that
                # the chunks from a given offset do not depend on where reading started
                want = chunk_bytes - have if have < chunk_bytes else chunk_bytes
                if stop is not None:
                    want = min(want, max(stop - offset - have, 0))
                if len(buf) < have + want:
                    buf.extend(bytes(have + want - len(buf)))
                end = have + _read_into(f, buf, have, want)
                if end == have:
                    if have:
                        yield Chunk(_copy(buf, 0, have), offset, line)
                    return
                if stop is not None and offset + end >= stop:
                    # the line that starts before stop ends with the next newline
                    out = _copy(buf, 0, end)
                    if out[-1:] != b"\n":
                        out += f.readline()
                    yield Chunk(out, offset, line)
                    return
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:
                    have = end
                    continue
                out = _copy(buf, 0, cut)
                buf[:end - cut] = _copy(buf, cut, end)
                have = end - cut
                yield Chunk(out, offset, line)
                offset += cut
                line += count_newlines(out)
    except _decode_errors() as e:
        raise DataError(f"{p}: {kind} stream damaged or truncated after byte {offset} of its "
                        f"decompressed data (line {line}): {e}") from None


def _iter_reused(f, chunk_bytes: int, stop, offset: int, line: int) -> Iterator[Chunk]:
    """:func:`iter_chunks`'s chunks, from ``f`` at ``offset``, as views of one uint8 buffer."""
    import numpy as np

    store = np.empty(chunk_bytes, dtype=np.uint8)
    have = 0                                      # store[:have]: the next lines, read
    while True:
        want = chunk_bytes - have if have < chunk_bytes else chunk_bytes
        if stop is not None:
            want = min(want, max(stop - offset - have, 0))
        if store.size < have + want:              # a line longer than a chunk: a larger buffer
            grown = np.empty(have + want, dtype=np.uint8)
            grown[:have] = store[:have]
            store = grown
        with memoryview(store) as mv:
            end = have + _read_into(f, mv, have, want)
        if end == have:
            if have:
                yield Chunk(store[:have], offset, line)
            return
        if stop is not None and offset + end >= stop:
            out = store[:end]
            if out[-1] != 10:                     # the line that starts before stop, whole
                out = np.concatenate([out, np.frombuffer(f.readline(), dtype=np.uint8)])
            yield Chunk(out, offset, line)
            return
        cut = _last_line_end(store, end)
        if cut == 0:
            have = end
            continue
        yield Chunk(store[:cut], offset, line)
        offset += cut
        line += count_newlines(store[:cut])
        have = end - cut
        store[:have] = store[cut:end]             # the partial last line to the front


def _last_line_end(store, end: int) -> int:
    """Just after the last ``\\n`` of ``store[:end]`` (0: none): searched backwards in
    windows of 64 KiB, then wider ones."""
    hi, size = end, 1 << 16
    while hi > 0:
        lo = max(0, hi - size)
        k = store[lo:hi].tobytes().rfind(b"\n")
        if k >= 0:
            return lo + k + 1
        hi, size = lo, 4 * size
    return 0


@dataclass(frozen=True)
class Piece:
    """The lines of ``path`` that start in ``[start, stop)`` (``stop`` None: to the end)."""

    path: str
    start: int
    stop: int | None


def _line_start_at_or_after(path: str, pos: int) -> int:
    size = os.path.getsize(path)
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    with open(path, "rb") as f:
        f.seek(pos - 1)
        f.readline()
        return f.tell()


def plan_parts(files: list[str], part: int, n_parts: int) -> list[Piece]:
    """The pieces of ``files`` that worker ``part`` of ``n_parts`` reads.

    A compressed file goes whole to worker ``i % n_parts`` (``i``: its index among the
    compressed files); a plain file is cut into ``n_parts`` byte ranges, each moved to the
    next line start, and worker ``part`` reads range ``part`` of every plain file. Over all
    parts every line is read exactly once.

    Parameters
    ----------
    files : list of str
        From :func:`data_files`.
    part, n_parts : int
        ``0 <= part < n_parts``.

    Returns
    -------
    list of Piece
        In file order; empty ranges are left out.

    Raises
    ------
    ValueError
        If ``part`` is outside ``[0, n_parts)``.
    """
    if not 0 <= part < n_parts:
        raise ValueError(f"part {part} is outside [0, {n_parts})")
    pieces, n_comp = [], 0
    for f in files:
        if compression(f) is not None:
            if n_comp % n_parts == part:
                pieces.append(Piece(f, 0, None))
            n_comp += 1
            continue
        size = os.path.getsize(f)
        lo = _line_start_at_or_after(f, part * size // n_parts)
        hi = _line_start_at_or_after(f, (part + 1) * size // n_parts)
        if hi > lo:
            pieces.append(Piece(f, lo, hi))
    return pieces


def line_number(path: str | os.PathLike, pos: int) -> int:
    """1-based number of the line holding byte ``pos`` of a plain file (newlines counted
    before it, 1 MiB at a time), for error messages.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    count, left = 0, int(pos)
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count + 1
