"""On-disk cache of featurized splits (a CSR matrix and its labels), shared by processes.

Every rank of every launch of an ``adult_csv`` job used to parse the CSV and featurize its rows
(and import scikit-learn for that): about 2 s of CPU per rank on the shipped file. With this
cache the first process that needs a split featurizes the whole split once and keeps it as
``<cache dir>/<kind>/<key>.npz``; every later process (the other ranks, later launches) reads
that file and slices its own rows. The key is a digest of everything the result depends on (the
data file's bytes, the featurizer's settings and version), so a changed file or setting is a
different entry; nothing is ever invalidated in place.

Cache directory: ``$HPCPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/hpcps``, else ``~/.cache/hpcps``;
``HPCPS_CACHE_DIR=off`` (or empty) disables the cache. Writes are atomic (a temporary file in
the same directory, then :func:`os.replace`), so concurrent ranks and launches are safe; while one
process featurizes a split the others wait on a lock (``flock``; at most
:data:`LOCK_WAIT_SECONDS`, then they featurize it themselves). An unwritable directory means no
cache, silently. A file that is unreadable, truncated or inconsistent in any way is ignored (the
split is featurized and the file rewritten). Clear the cache by deleting the directory.

This module never imports ``mpi4py`` or scikit-learn.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import xxhash

__all__ = ["cache_root", "file_digest", "entry_key", "load_csr", "save_csr", "entry_lock"]

#: Longest wait, in seconds, for another process featurizing the same entry.
LOCK_WAIT_SECONDS = 300.0
_INT32_MAX = np.iinfo(np.int32).max
# what np.load of a damaged .npz can raise
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error)


def cache_root(environ=None) -> Path | None:
    """The cache directory (see the module docstring), or ``None`` when disabled
    (``HPCPS_CACHE_DIR`` set to ``off`` or empty). Not created here."""
    env = os.environ if environ is None else environ
    if "HPCPS_CACHE_DIR" in env:
        value = env["HPCPS_CACHE_DIR"].strip()
        if not value or value.lower() == "off":
            return None
        return Path(value)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpcps"


def file_digest(path) -> str:
    """XXH3-128 (hex) of the bytes of file ``path``, read in 4 MiB chunks.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def entry_key(**fields) -> str:
    """XXH3-128 (hex) of ``fields`` (JSON values), independent of their order."""
    return xxhash.xxh3_128(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _entry_dir(kind: str, environ=None) -> Path | None:
    root = cache_root(environ)
    if root is None:
        return None
    d = root / kind
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return d


def entry_path(kind: str, key: str, environ=None) -> Path | None:
    """``<cache dir>/<kind>/<key>.npz`` (the directory created), or ``None`` when the cache is
    disabled or its directory cannot be created."""
    d = _entry_dir(kind, environ)
    return None if d is None else d / f"{key}.npz"


@contextlib.contextmanager
def entry_lock(path: Path | None, wait: float = LOCK_WAIT_SECONDS):
    """Hold an exclusive ``flock`` on ``<path>.lock`` while featurizing the entry ``path``, so
    that the other processes wanting it wait and then read it rather than featurize it too.

    Yields ``True`` when the lock is held, ``False`` when there is none (no cache, the lock
    file cannot be opened, locks unsupported, or ``wait`` seconds passed): the caller then
    simply proceeds. The kernel drops the lock if the holder dies.
    """
    if path is None:
        yield False
        return
    try:
        import fcntl
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + wait
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    break
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        yield held
    finally:
        os.close(fd)                     # releases the lock


def _compact_data(data: np.ndarray) -> np.ndarray | None:
    """``None`` when every value is 1.0, ``uint8`` when every value is an integer in
    ``[1, 255]`` (token counts), else the float64 values."""
    if data.size == 0 or bool(np.all(data == 1.0)):
        return None
    if bool(np.all((data >= 1.0) & (data <= 255.0) & (data == np.floor(data)))):
        return data.astype(np.uint8)
    return np.asarray(data, dtype=np.float64)


def save_csr(path: Path | None, key: str, X, y: np.ndarray) -> bool:
    """Write CSR matrix ``X`` (float64, sorted indices) and labels ``y`` to ``path`` atomically.

    Indices and ``indptr`` are stored as int32 when they fit; ``data`` as described in
    :func:`_compact_data`; ``key`` is stored too and checked by :func:`load_csr`. Returns
    whether the file was written; any ``OSError`` (unwritable directory, full disk) only means
    no cache.
    """
    if path is None:
        return False
    n_rows, n_cols = X.shape
    fits32 = X.nnz <= _INT32_MAX and (X.indices.size == 0 or int(X.indices.max()) <= _INT32_MAX)
    idx_dtype = np.int32 if fits32 else np.int64
    arrays = {
        "key": np.frombuffer(key.encode(), dtype=np.uint8),
        "shape": np.array([n_rows, n_cols], dtype=np.int64),
        "indptr": X.indptr.astype(idx_dtype, copy=False),
        "indices": X.indices.astype(idx_dtype, copy=False),
        "y": np.asarray(y, dtype=np.float64),
    }
    data = _compact_data(X.data)
    if data is not None:
        arrays["data"] = data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.chmod(tmp, 0o644)                             # mkstemp makes it 0600
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def load_csr(path: Path | None, key: str, n_cols: int, row_sum: float | None = None):
    """Read an entry written by :func:`save_csr`, or ``None`` if it is missing or anything about
    it is wrong.

    Checked: the stored key equals ``key``; the column count is ``n_cols``; dtypes (indices and
    ``indptr`` int32/int64, ``data`` uint8/float64, ``y`` float64) and shapes; ``indptr`` starts
    at 0, never decreases and ends at the number of stored values; column indices are in
    ``[0, n_cols)`` and strictly increasing within each row; values are finite and positive;
    labels are 0 or 1; with ``row_sum``, every row's values sum to it.

    Returns
    -------
    (indptr, indices, data, y) or None
        ``indptr`` and ``indices`` as stored (int32 or int64), ``data`` float64, ``y`` float64.
    """
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if not {"key", "shape", "indptr", "indices", "y"} <= names or names - {
                    "key", "shape", "indptr", "indices", "y", "data"}:
                return None
            arrays = {name: z[name] for name in names}
    except _READ_ERRORS:
        return None
    try:
        return _checked(arrays, key, n_cols, row_sum)
    except (ValueError, TypeError, OverflowError):
        return None


def _checked(a: dict, key: str, n_cols: int, row_sum: float | None):
    stored_key, shape = a["key"], a["shape"]
    if stored_key.dtype != np.uint8 or stored_key.tobytes() != key.encode():
        return None
    if shape.dtype != np.int64 or shape.shape != (2,) or int(shape[1]) != n_cols or shape[0] < 0:
        return None
    n_rows = int(shape[0])
    indptr, indices, y = a["indptr"], a["indices"], a["y"]
    if indptr.dtype not in (np.int32, np.int64) or indices.dtype not in (np.int32, np.int64):
        return None
    if indptr.shape != (n_rows + 1,) or indices.ndim != 1 or y.dtype != np.float64 \
            or y.shape != (n_rows,):
        return None
    nnz = indices.size
    if indptr[0] != 0 or indptr[-1] != nnz or (n_rows and np.any(np.diff(indptr) < 0)):
        return None
    if nnz:
        if indices.min() < 0 or indices.max() >= n_cols:
            return None
        step = np.diff(indices) > 0                      # False at row starts is fine
        starts = indptr[1:-1]
        starts = starts[(starts > 0) & (starts < nnz)] - 1
        step[starts] = True
        if not step.all():
            return None
    if not np.all((y == 0.0) | (y == 1.0)):
        return None
    if "data" in a:
        data = a["data"]
        if data.dtype not in (np.uint8, np.float64) or data.shape != (nnz,):
            return None
        data = data.astype(np.float64)
        if not np.all(np.isfinite(data) & (data > 0)):
            return None
    else:
        data = np.ones(nnz, dtype=np.float64)
    if row_sum is not None and n_rows:
        cum = np.concatenate([[0.0], np.cumsum(data)])  # exact: integer counts, sums < 2**53
        if not np.all(cum[indptr[1:]] - cum[indptr[:-1]] == row_sum):
            return None
    return indptr, indices, data, y
