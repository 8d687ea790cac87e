"""Byte-range sharded reading of svmlight / LibSVM files.

Every worker reads only its own contiguous share of a (possibly huge) text file: the
file size is cut into ``n_parts`` byte ranges (:func:`byte_ranges`), and part ``k``
owns the lines that *start* inside its range ``[b_k, b_{k+1})``: :func:`read_svmlight_part`
moves both range ends to the next line start and parses exactly the bytes between them,
so that the parts together hold every row of the file exactly once, in file order, for
any ``n_parts``.  The parsing is :func:`hpcps.kernels.svmlight.parse_svmlight` (Cython,
``nogil``): scikit-learn's ``load_svmlight_file`` stores indices as C ``int`` (an
``OverflowError`` at 2**31) and cannot add duplicate indices, so it is not used to read.

Format: ``<label> [qid:<int>] <index>:<value> ...`` per line, indices strictly
increasing (or repeated, when duplicates are summed), ``#`` starts a comment, blank
lines and CRLF line ends are fine, the last line need not end with a newline.  Lines are
split on ``\\n``; a carriage return that does not end a line (old Mac files: CR line
ends) is an error at its line, never read as a space.  A UTF-8 byte-order mark at the
start of the file is skipped; UTF-16 text is refused at line 1.  Indices are int64 (up to 2**63 - 1).  Compressed files (``.gz``,
``.bz2``) are rejected: byte ranges of the compressed file do not match its
decompressed stream.

Sources
-------
- Joachims, T. SVMlight, http://svmlight.joachims.org/ (file format).
- Chang, C.-C. and Lin, C.-J. LIBSVM, README (the same format, ``qid`` aside).
- scikit-learn ``sklearn.datasets.dump_svmlight_file`` (writing).

This module never imports ``mpi4py``.
"""

from __future__ import annotations

import mmap
import operator
import os

import numpy as np
import scipy.sparse as sp

from hpcps.kernels.svmlight import DYNAMIC_IDS, SvmlightSyntaxError, parse_svmlight
from hpcps.data import DataError
from hpcps.data.partition_rows import check_part
from hpcps.data.textstream import line_number

__all__ = ["DUPLICATES", "DYNAMIC_IDS", "byte_ranges", "read_svmlight_part",
           "write_svmlight"]

#: Values of ``duplicates`` (``[data] duplicate_indices``): refuse or add repeated indices.
DUPLICATES = ("error", "sum")

#: Byte-order marks at the start of a file: UTF-8 (skipped), UTF-16 LE/BE (refused).
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

#: Largest index an int32 holds.
INT32_MAX = 2**31 - 1

#: Suffixes of compressed files, which cannot be split into byte ranges.
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")

#: :data:`DYNAMIC_IDS` (the kernel's): the id space of a dynamic table without ``n_features``,
#: ids (after removing ``index_base``) in ``[0, 2**63 - 1)`` (=
#: :data:`hpcps.config.sections.DYNAMIC_KEYS`); the parser names that bound for an id beyond.


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
    n_features: int | None,
    index_base: int,
    dtype=np.float64,
    duplicates: str = "error",
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows of byte-range part ``part`` of ``n_parts`` of an svmlight file.

    Part ``k`` holds the lines whose first byte lies in ``byte_ranges(path,
    n_parts)[k]``; these are parsed by :func:`hpcps.kernels.svmlight.parse_svmlight`
    (int64 indices).  Concatenating the parts ``0 .. n_parts - 1`` gives every row of
    the file exactly once, in file order; parts may be empty.  ``qid:`` fields are
    accepted and ignored.

    Parameters
    ----------
    path : str or path-like
        Uncompressed svmlight / LibSVM file.
    part, n_parts : int
        ``0 <= part < n_parts``.
    n_features : int or None
        Number of columns of ``X``, up to ``2**63 - 1``; every feature index (after
        subtracting ``index_base``) must be ``< n_features``.  None: the ids of a dynamic
        table without a declared size, ``[0, 2**63 - 1)`` (:data:`DYNAMIC_IDS` columns; an id
        beyond is refused naming that bound).
    index_base : {0, 1}
        Whether the file's feature indices start at 0 or 1.  Never guessed.
    dtype : numpy dtype, default=numpy.float64
        dtype of ``X.data``.
    duplicates : {"error", "sum"}, default "error"
        A feature index repeated within a row (``3:1 3:2``): a :class:`DataError` naming
        file and line, or the values added (``3:3``).  Indices must not decrease along a
        row in either case.

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
        If ``index_base`` is not 0 or 1, ``n_features < 1``, ``duplicates`` is not
        "error" or "sum", ``part`` is outside ``[0, n_parts)``, or the file is compressed.
    DataError
        ``FILE:LINE: reason`` for the first bad line of the part: a carriage return that
        does not end a line (CR line endings), UTF-16 text, a label or value that is
        not a number, a non-finite value, a feature index below ``index_base``, at or
        beyond ``n_features``, of 2**63 or more, smaller than its predecessor or repeated
        (``duplicates="error"``), or a label that is not -1, 0 or +1.
    OSError
        If the file cannot be read.
    """
    index_base = _check_index_base(index_base)
    n_features = DYNAMIC_IDS if n_features is None else operator.index(n_features)
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    if duplicates not in DUPLICATES:
        raise ValueError(f"duplicates must be one of {DUPLICATES}, got {duplicates!r}")
    part, n_parts = check_part(part, n_parts)
    path = os.fspath(path)
    if path.endswith(COMPRESSED):
        raise ValueError(f"{path}: compressed svmlight files cannot be read by byte range; decompress it first")
    size = os.path.getsize(path)
    offset, length = byte_ranges(path, n_parts)[part]
    with open(path, "rb") as f:
        p = _line_start_at_or_after(f, offset, size)
        q = _line_start_at_or_after(f, offset + length, size)
        # the part is parsed from a read-only map of the file: no copy of it in memory
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if q > p else None
    try:
        if p == 0 and mm is not None:
            if mm[:len(UTF8_BOM)] == UTF8_BOM:          # skipped: the rows read exactly
                p = len(UTF8_BOM)
            elif mm[:2] in UTF16_BOMS:
                raise DataError(f"{path}:1: the file starts with a UTF-16 byte-order mark; "
                                "svmlight files are ASCII (or UTF-8) text: convert it, e.g. "
                                "iconv -f UTF-16 -t UTF-8")
        with (memoryview(mm)[p:max(q, p)] if mm is not None else memoryview(b"")) as buf:
            try:
                # int32 indices where scipy keeps them (no cast of the parsed arrays)
                y, indptr, indices, data, line_at = parse_svmlight(
                    buf, index_base, n_features, sum_duplicates=(duplicates == "sum"),
                    index_dtype=np.int32 if n_features <= INT32_MAX else np.int64)
            except SvmlightSyntaxError as e:
                raise DataError(f"{path}:{line_number(path, p + e.offset)}: {e.reason}") \
                    from None
    finally:
        if mm is not None:
            mm.close()
    bad = ~np.isin(y, (-1.0, 0.0, 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}:{line_number(path, p + int(line_at[i]))}: label "
                        f"{float(y[i])!r} is not -1, 0 or +1")
    X = sp.csr_matrix((data.astype(dtype, copy=False), indices, indptr),
                      shape=(y.shape[0], n_features))
    return X, (y > 0).astype(np.float64)


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
    from sklearn.datasets import dump_svmlight_file   # only here: importing sklearn costs ~1 s

    dump_svmlight_file(X, y, os.fspath(path), zero_based=(index_base == 0))
