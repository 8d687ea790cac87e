"""The line index of a streamed data set: every file's line count and the byte offset of
every :data:`INDEX_STEP`-th line, found by one pass that counts newlines (plain, gzip or
zstd files), cached as JSON under the run directory. No MPI. Used by :mod:`hpcps.data.lines`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from hpcps.data import DataError
from hpcps.data.textstream import compression, data_files

__all__ = ["INDEX_STEP", "LineIndex", "build_index", "load_index", "fingerprint", "open_text"]

#: Lines between two offsets kept by a :class:`LineIndex`.
INDEX_STEP = 1 << 14
_READ = 1 << 20


def open_text(path: str, kind):
    """``path`` opened for reading its decompressed bytes (``kind``: None, gzip, zstd)."""
    if kind == "gzip":
        import gzip

        return gzip.open(path, "rb")
    if kind == "zstd":
        from hpcps.data.textstream import ZstdFrames

        return ZstdFrames(path)
    return open(path, "rb", buffering=0)


def decode_errors():
    """The exceptions of a damaged compressed stream."""
    from hpcps.data.textstream import _decode_errors as de

    return de()


@dataclass
class LineIndex:
    """Line numbers of a list of data files.

    Attributes
    ----------
    files : list of str
    lines : int64 ndarray, shape (n_files,)
        Lines of each file (a last line without ``\\n`` counts).
    starts : int64 ndarray, shape (n_files + 1,)
        First global line number of each file; ``starts[-1]`` is the total.
    offsets : list of int64 ndarray
        ``offsets[f][k]``: byte offset (decompressed) of line ``k * INDEX_STEP`` of file ``f``.
    fingerprint : str
        Hash of the files' names, sizes and modification times (a checkpoint records it).
    """

    files: list
    lines: np.ndarray
    starts: np.ndarray
    offsets: list
    fingerprint: str

    @property
    def n_lines(self) -> int:
        return int(self.starts[-1])

    def locate(self, line: int) -> tuple[int, int]:
        """``(file index, line within the file)`` of global line ``line``."""
        f = int(np.searchsorted(self.starts, line, side="right")) - 1
        return f, int(line - self.starts[f])

    def part_bounds(self, n: int, part: int, n_parts: int) -> tuple[int, int]:
        """Lines ``[lo, hi)`` of worker ``part`` of ``n_parts`` among the first ``n`` lines:
        the blocks of :func:`hpcps.data.partition_rows.block_bounds`, with every cut that
        falls inside a compressed file moved to that file's nearer end, so that a compressed
        file (which cannot be entered without decoding what comes before) is read whole by
        one worker. Contiguous, in order, covering ``[0, n)``; a part may be empty."""
        from hpcps.data.partition_rows import block_bounds
        from hpcps.data.textstream import compression

        def cut(k: int) -> int:
            c = block_bounds(n, k, n_parts)[0] if k < n_parts else n
            if c <= 0 or c >= n:
                return c
            f, j = self.locate(c)
            if j == 0 or compression(self.files[f]) is None:
                return c
            a, b = int(self.starts[f]), int(self.starts[f + 1])
            return min(a if c - a <= b - c else b, n)

        return cut(part), max(cut(part), cut(part + 1))

    def position(self, line: int) -> dict:
        """Where global line ``line`` is: ``{"file", "line" (1-based), "index_byte",
        "lines_after_index_byte"}`` (a reader seeks to the decompressed byte offset of the
        nearest indexed line before it and skips the lines after that)."""
        if line >= self.n_lines:
            return {"file": None, "line": 0, "index_byte": 0, "lines_after_index_byte": 0}
        f, k = self.locate(line)
        return {"file": self.files[f], "line": k + 1,
                "index_byte": int(self.offsets[f][k // INDEX_STEP]),
                "lines_after_index_byte": k % INDEX_STEP}


def fingerprint(files: list) -> str:
    """Hash of the files' paths, sizes and modification times."""
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _count_file(path: str) -> tuple[int, np.ndarray]:
    """Lines of ``path`` and the offsets of every INDEX_STEP-th line (one streamed pass)."""
    kind = compression(path)
    offs = [0]
    n = 0           # lines fully ended so far
    pos = 0         # bytes read
    last = b"\n"
    next_mark = INDEX_STEP
    try:
        with open_text(path, kind) as fh:
            # read1: a compressed stream's decoded bytes as they come, so that a damaged or
            # truncated stream is named at the last byte decoded; read() of a 4 MiB block
            # dropped the block's decoded part and named the block's start (byte 0 for a
            # file under 4 MiB)
            read = getattr(fh, "read1", None) if kind else None
            read = read or fh.read
            while True:
                block = read(_READ * 4)
                if not block:
                    break
                c = block.count(b"\n")
                if n + c >= next_mark:
                    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                    while n + c >= next_mark:
                        # line next_mark starts after the (next_mark - n)-th newline of the block
                        offs.append(pos + int(nl[next_mark - n - 1]) + 1)
                        next_mark += INDEX_STEP
                n += c
                pos += len(block)
                last = block[-1:]
    except decode_errors() as e:
        raise DataError(f"{path}: {kind} stream damaged or truncated after byte {pos} of its "
                        f"decompressed data (line {n + 1}): {e}") from None
    if last != b"\n":
        n += 1
    if offs and offs[-1] >= pos and len(offs) > 1:
        offs.pop()          # the index entry of a line that does not exist (file ends in \n)
    return n, np.asarray(offs, dtype=np.int64)


def build_index(files: list) -> LineIndex:
    """Count the lines of ``files`` (:class:`LineIndex`); one streamed pass over each.

    Raises
    ------
    DataError
        A compressed file is damaged (file and decompressed byte offset named), or every
        file is empty.
    """
    counts, offsets = [], []
    for f in files:
        n, o = _count_file(f)
        counts.append(n)
        offsets.append(o)
    lines = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lines)]).astype(np.int64)
    return LineIndex(list(files), lines, starts, offsets, fingerprint(files))


def load_index(path, cache_dir=None) -> LineIndex:
    """The :class:`LineIndex` of the files ``path`` names, from ``cache_dir`` when it holds
    one for these files (same names, sizes, times), else built and (``cache_dir`` given)
    saved there (a JSON file, written atomically; not saved where it cannot be written).

    Raises
    ------
    DataError
        ``path`` names no data file (:func:`hpcps.data.textstream.data_files`), or as
        :func:`build_index`.
    """
    files = data_files(path)
    fp = fingerprint(files)
    cache = None
    if cache_dir is not None:
        cache = os.path.join(os.fspath(cache_dir), f"line-index-{fp}.json")
        try:
            with open(cache) as fh:
                d = json.load(fh)
            return LineIndex(d["files"], np.asarray(d["lines"], dtype=np.int64),
                             np.asarray(d["starts"], dtype=np.int64),
                             [np.asarray(o, dtype=np.int64) for o in d["offsets"]], fp)
        except (OSError, ValueError, KeyError):
            pass
    idx = build_index(files)
    if cache is not None:
        tmp = f"{cache}.tmp-{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump({"files": idx.files, "lines": idx.lines.tolist(),
                           "starts": idx.starts.tolist(),
                           "offsets": [o.tolist() for o in idx.offsets]}, fh)
            os.replace(tmp, cache)
        except OSError:             # a cache only (a read-only run directory under hpcps eval)
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return idx
