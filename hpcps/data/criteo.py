"""Criteo display-advertising TSV files: read in parts, or streamed in minibatch-sized blocks.

No MPI. The row format and the feature ids are those of :mod:`hpcps.kernels.criteo` (label,
13 integer fields log-binned, 26 categorical hex fields; one feature id per field, a missing
field is its own value; ids are 63-bit hashes, or buckets of ``2**hash_bits``). The files are
those :func:`hpcps.data.textstream.data_files` finds (a file, a directory, a glob), plain,
gzip or zstd; :func:`hpcps.data.textstream.plan_parts` says which worker reads what.

Errors name the file and the line (or, in a damaged compressed stream, the decompressed byte
offset).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from hpcps.data import DataError
from hpcps.data.textstream import CHUNK_BYTES, Piece, data_files, iter_chunks, line_number, plan_parts
from hpcps.kernels.criteo import N_FIELDS, CriteoSyntaxError, parse_criteo

__all__ = ["n_features", "iter_part", "read_criteo_part", "Block"]


def n_features(hash_bits: int) -> int:
    """Columns of the feature matrix: ``2**hash_bits``, or ``2**63 - 1`` for raw ids (0)."""
    return (1 << 63) - 1 if hash_bits == 0 else 1 << hash_bits


class Block:
    """Parsed rows of one chunk of one file.

    Attributes
    ----------
    y : ndarray of float64, shape (n,)
    indptr : ndarray of int64, shape (n + 1,)
    indices : ndarray of int64, shape (39 n,)
    path : str
    offset : int
        Decompressed byte offset of the chunk's first line in ``path``.
    end : int
        Decompressed byte offset just after the chunk (where a resume starts).
    """

    __slots__ = ("y", "indptr", "indices", "path", "offset", "end")

    def __init__(self, y, indptr, indices, path, offset, end):
        self.y, self.indptr, self.indices = y, indptr, indices
        self.path, self.offset, self.end = path, offset, end

    def csr(self, hash_bits: int) -> sp.csr_matrix:
        """The rows as a CSR matrix of ones, ``(n, n_features(hash_bits))``."""
        return sp.csr_matrix((np.ones(self.indices.size), self.indices, self.indptr),
                             shape=(self.y.size, n_features(hash_bits)))


def iter_part(pieces: list[Piece], hash_bits: int = 0, seed: int = 0,
              chunk_bytes: int = CHUNK_BYTES) -> Iterator[Block]:
    """Parse the pieces one chunk at a time (memory bounded by ``chunk_bytes``).

    Parameters
    ----------
    pieces : list of Piece
        From :func:`hpcps.data.textstream.plan_parts`, or resume positions.
    hash_bits, seed : int
        As in :func:`hpcps.kernels.criteo.parse_criteo`.
    chunk_bytes : int

    Yields
    ------
    Block

    Raises
    ------
    DataError
        ``FILE:LINE: reason`` for a malformed row; a damaged compressed stream.
    """
    for pc in pieces:
        # the chunks are views of one reused buffer: parsed (into new arrays) before the next
        for ch in iter_chunks(pc.path, chunk_bytes, start=pc.start, stop=pc.stop, reuse=True):
            try:
                y, indptr, indices, _ = parse_criteo(ch.data, hash_bits, seed)
            except CriteoSyntaxError as e:
                if pc.start == 0:
                    line = ch.line + ch.data[:e.offset].tobytes().count(b"\n")
                else:
                    line = line_number(pc.path, ch.offset + e.offset)
                raise DataError(f"{pc.path}:{line}: {e.reason}") from None
            yield Block(y, indptr, indices, pc.path, ch.offset, ch.offset + len(ch.data))


def read_criteo_part(path: str | os.PathLike, part: int, n_parts: int, *, hash_bits: int = 0,
                     seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray]:
    """All rows worker ``part`` of ``n_parts`` reads, in memory (small data).

    Parameters
    ----------
    path : str or path-like
        A file, directory or glob of Criteo TSV files (plain, gzip, zstd).
    part, n_parts : int
    hash_bits, seed : int
        As in :func:`hpcps.kernels.criteo.parse_criteo`.

    Returns
    -------
    X : scipy.sparse.csr_matrix, shape (n, n_features(hash_bits)), ones
        39 entries per row (ids of different fields may coincide when bucketed: the
        matrix then holds a 2 where two fields share a bucket, after ``sum_duplicates``).
    y : ndarray of float64, shape (n,), in {0, 1}

    Raises
    ------
    DataError
        As :func:`iter_part`, and when ``path`` names no data file.
    """
    files = data_files(path)
    blocks = list(iter_part(plan_parts(files, part, n_parts), hash_bits, seed))
    if not blocks:
        return sp.csr_matrix((0, n_features(hash_bits))), np.zeros(0)
    y = np.concatenate([b.y for b in blocks])
    indices = np.concatenate([b.indices for b in blocks])
    indptr = np.arange(y.size + 1, dtype=np.int64) * N_FIELDS
    X = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(y.size, n_features(hash_bits)))
    X.sum_duplicates()
    return X, y
