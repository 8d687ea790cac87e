"""Byte-range sharded reading of svmlight / LibSVM files.

Every worker reads only its own contiguous share of a (possibly huge) text file: the
file size is cut into ``n_parts`` byte ranges (:func:`byte_ranges`), and part ``k``
owns the lines that *start* inside its range ``[b_k, b_{k+1})``.  The parsing itself
is :func:`sklearn.datasets.load_svmlight_file` with its ``offset``/``length``
arguments; :func:`read_svmlight_part` only moves the range ends to line boundaries, so
that the parts together hold every row of the file exactly once, in file order, for
any ``n_parts``.  (Passing the raw ranges to ``load_svmlight_file`` does not do that:
a range that holds no line start still yields the next line, and a range ending in a
blank or comment line runs on into the next part's first row; both rows are then read
twice.)

Format (as parsed by scikit-learn): ``<label> [qid:<int>] <index>:<value> ...`` per
line, indices strictly increasing, ``#`` starts a comment, blank lines and CRLF line
ends are fine, the last line need not end with a newline.  Lines are split on ``\\n``.
Compressed files (``.gz``, ``.bz2``) are rejected: byte ranges of the compressed file
do not match the decompressed stream that scikit-learn would read.

Sources
-------
- Joachims, T. SVMlight, http://svmlight.joachims.org/ (file format).
- scikit-learn ``sklearn.datasets.load_svmlight_file`` / ``dump_svmlight_file``.

This module never imports ``mpi4py``.
"""

from __future__ import annotations

import io
import operator
import os

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from . import DataError
from .partition_rows import check_part

__all__ = ["byte_ranges", "read_svmlight_part", "write_svmlight"]

_COMPRESSED = (".gz", ".bz2")


def _check_index_base(index_base) -> int:
    if isinstance(index_base, bool) or not isinstance(index_base, (int, np.integer)) or index_base not in (0, 1):
        raise ValueError(f"index_base must be 0 or 1 (explicit, never guessed), got {index_base!r}")
    return int(index_base)


def byte_ranges(path: str | os.PathLike, n_parts: int) -> list[tuple[int, int]]:
    """Split the size of ``path`` into ``n_parts`` contiguous byte ranges.

    Range ``k`` is ``(offset, length)`` with ``offset = k * size // n_parts`` and
    ``length`` up to the next offset; the last range ends at end of file.  Ranges may
    have length 0 when ``n_parts > size``.

    Parameters
    ----------
    path : str or path-like
        An existing file.
    n_parts : int
        Number of ranges, ``>= 1``.

    Returns
    -------
    list of (int, int)
        ``n_parts`` pairs ``(offset, length)``; the lengths sum to the file size.

    Raises
    ------
    ValueError
        If ``n_parts < 1``.
    OSError
        If the file does not exist.
    """
    check_part(0, n_parts)
    size = os.path.getsize(path)
    bounds = [k * size // n_parts for k in range(n_parts + 1)]
    return [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(n_parts)]


def _line_start_at_or_after(f, pos: int, size: int) -> int:
    """Smallest line start ``>= pos`` (``size`` if none); ``f`` is a binary file."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    f.seek(pos - 1)
    f.readline()  # ends just after the first b"\n" at or after pos - 1
    return f.tell()


def read_svmlight_part(
    path: str | os.PathLike,
    part: int,
    n_parts: int,
    *,
    n_features: int,
    index_base: int,
    dtype=np.float64,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows of byte-range part ``part`` of ``n_parts`` of an svmlight file.

    Part ``k`` holds the lines whose first byte lies in ``byte_ranges(path,
    n_parts)[k]``; these are parsed by ``load_svmlight_file(path,
    n_features=n_features, zero_based=(index_base == 0), offset=..., length=...,
    dtype=dtype)``.  Concatenating the parts ``0 .. n_parts - 1`` gives every row of
    the file exactly once, in file order; parts may be empty.  ``qid:`` fields are
    accepted and ignored.

    Parameters
    ----------
    path : str or path-like
        Uncompressed svmlight / LibSVM file.
    part, n_parts : int
        ``0 <= part < n_parts``.
    n_features : int
        Number of columns of ``X``; every feature index (after subtracting
        ``index_base``) must be ``< n_features``.
    index_base : {0, 1}
        Whether the file's feature indices start at 0 or 1.  Never guessed.
    dtype : numpy dtype, default=numpy.float64
        dtype of ``X.data``.

    Returns
    -------
    X : scipy.sparse.csr_matrix, shape (n_rows, n_features)
        Sorted, unique column indices.  ``X.indices`` / ``X.indptr`` are int32 or
        int64 as scipy chooses (int32 when they fit); both are safe to cast to int64
        (``X.indices.astype(np.int64)``).
    y : numpy.ndarray of float64, shape (n_rows,)
        Labels mapped to ``{0.0, 1.0}``: ``-1`` and ``0`` -> 0, ``+1`` -> 1.

    Raises
    ------
    ValueError
        If ``index_base`` is not 0 or 1, ``n_features < 1``, ``part`` is outside
        ``[0, n_parts)``, or the file is compressed.
    DataError
        If a line does not parse, a feature index is out of range (the message names
        the file, the line and the index), or a label is not -1, 0 or +1 (file and
        line).
    OSError
        If the file cannot be read.
    """
    index_base = _check_index_base(index_base)
    n_features = operator.index(n_features)
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    part, n_parts = check_part(part, n_parts)
    path = os.fspath(path)
    if path.endswith(_COMPRESSED):
        raise ValueError(f"{path}: compressed svmlight files cannot be read by byte range; decompress it first")
    size = os.path.getsize(path)
    offset, length = byte_ranges(path, n_parts)[part]
    with open(path, "rb") as f:
        p = _line_start_at_or_after(f, offset, size)
        q = _line_start_at_or_after(f, offset + length, size)
        if p >= q:
            end = None  # no line starts in this range
        elif q >= size:
            end = size
        else:
            end = _last_data_line_end(f, p, q)
    if end is None:
        return sp.csr_matrix((0, n_features), dtype=dtype), np.empty(0, dtype=np.float64)
    # load_svmlight_file(offset=o, length=n) first drops the line holding byte o (when
    # o > 0), then reads lines, stopping after the first *data* line (comment and blank
    # lines are not checked) that ends past o + n; length <= 0 means to end of file.
    # With o = p - 1 (a b"\n") the first line read starts at p; with o + n = end - 1,
    # where end is the end of the last data line starting before q, it stops right
    # after that line.
    sk_offset = p - 1 if p > 0 else 0
    sk_length = -1 if end >= size else end - 1 - sk_offset
    try:
        X, y = load_svmlight_file(
            path,
            n_features=n_features,
            dtype=dtype,
            zero_based=(index_base == 0),
            offset=sk_offset,
            length=sk_length,
        )
    except (ValueError, OverflowError) as e:
        raise _locate_error(path, p, q, n_features, index_base, dtype, fallback=e) from e
    y = np.asarray(y, dtype=np.float64)
    bad = ~np.isin(y, (-1.0, 0.0, 1.0))
    if bad.any():
        raise _locate_error(path, p, q, n_features, index_base, dtype, fallback=None)
    if not np.isfinite(X.data).all():
        raise _locate_error(path, p, q, n_features, index_base, dtype, fallback="non-finite value")
    X = sp.csr_matrix(X)
    if not X.has_sorted_indices:
        X.sort_indices()
    return X, (y > 0).astype(np.float64)


def _is_data_line(line: bytes) -> bool:
    """Whether scikit-learn's parser makes a row of ``line`` (not blank, not a comment)."""
    # as _svmlight_format_fast: strchr(line, "#") on the C string, then split()
    head = line.split(b"\0", 1)[0]
    hash_at = head.find(b"#")
    if hash_at >= 0:
        line = line[:hash_at]
    return bool(line.split())


def _last_data_line_end(f, p: int, q: int) -> int | None:
    """End (exclusive, after its b"\n") of the last data line starting in ``[p, q)``.

    ``p`` and ``q`` are line starts.  Reads backwards from ``q`` in growing blocks;
    returns None if ``[p, q)`` holds only blank and comment lines.
    """
    end, block = q, 1 << 16
    while end > p:
        lo = max(p, end - block)
        f.seek(lo)
        buf = f.read(end - lo)
        if lo > p:
            nl = buf.find(b"\n")
            if nl < 0 or nl + 1 >= len(buf):  # no complete line in the block: grow it
                block *= 2
                continue
            first = nl + 1
        else:
            first = 0
        # buf[first:] is whole lines, each ending in b"\n" (end is a line start < size)
        lines = buf[first:].split(b"\n")[:-1]
        stop = end
        for line in reversed(lines):
            if _is_data_line(line):
                return stop
            stop -= len(line) + 1
        end = lo + first
    return None


def _line_number(f, pos: int) -> int:
    """1-based number of the line starting at byte ``pos``."""
    f.seek(0)
    count, left = 0, pos
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count + 1


def _locate_error(path, p, q, n_features, index_base, dtype, fallback) -> DataError:
    """Re-parse the lines of ``[p, q)`` one by one to name the first bad line."""
    with open(path, "rb") as f:
        lineno = _line_number(f, p)
        f.seek(p)
        pos = p
        while pos < q:
            line = f.readline()
            if not line:
                break
            pos += len(line)
            where = f"{path}:{lineno}"
            lineno += 1
            try:
                X, y = load_svmlight_file(io.BytesIO(line), zero_based=(index_base == 0), dtype=dtype)
            except (ValueError, OverflowError) as e:
                return DataError(f"{where}: {e}")
            if X.shape[0] == 0:
                continue
            too_big = X.indices[X.indices >= n_features]
            if too_big.size:
                i = int(too_big.min())
                return DataError(
                    f"{where}: feature index {i + index_base} (index_base={index_base}) is out of "
                    f"range for n_features={n_features}"
                )
            if y[0] not in (-1.0, 0.0, 1.0):
                return DataError(f"{where}: label {float(y[0])!r} is not -1, 0 or +1")
            if not np.isfinite(X.data).all():
                return DataError(f"{where}: non-finite feature value "
                                 f"{float(X.data[~np.isfinite(X.data)][0])!r}")
    detail = f": {fallback}" if fallback is not None else ""
    return DataError(f"{path}: bad data in bytes [{p}, {q}){detail}")


def write_svmlight(X, y, path: str | os.PathLike, index_base: int) -> None:
    """Write ``X``, ``y`` as an svmlight file (``sklearn.datasets.dump_svmlight_file``).

    Parameters
    ----------
    X : array-like or scipy.sparse matrix, shape (n_rows, n_features)
        Features; zeros are not written.
    y : array-like, shape (n_rows,)
        Labels, written as given (hpcps uses ``{0, 1}``).
    path : str or path-like
        Output file (overwritten).
    index_base : {0, 1}
        Index of the first column in the file.

    Raises
    ------
    ValueError
        If ``index_base`` is not 0 or 1, or shapes do not match (from scikit-learn).
    """
    index_base = _check_index_base(index_base)
    dump_svmlight_file(X, y, os.fspath(path), zero_based=(index_base == 0))
