"""Run-directory outputs: the final model (HDF5) and the metrics file (JSON). No MPI.

Model file ``<run dir>/model.h5``
    one dataset per table, shape ``(num_keys, dim)``, rows in original key order, with
    attributes ``dim``, ``sparse``; a dynamic table (``storage = "hash"``) has the rows of
    the keys it stores, ascending by key, and ``<name>_keys`` (int64) beside them; file attributes ``hpcps_version``, ``job_name``,
    ``step`` (worker clock at the end), ``epoch``, ``config`` (the job file text, TOML),
    ``num_features``, ``index_base`` (svmlight jobs; -1 otherwise).
Metrics file ``<run dir>/metrics.json``
    ``{"job": ..., "config": {...}, "epochs": [{epoch, clock, seconds, train_logloss,
    test_logloss, test_auc, test_accuracy, test_rows}, ...], "summary": {...}}``.

Both are written to a temporary name in the same directory and moved into place with
``os.replace``, so a reader never sees half a file; their mode follows the umask
(:mod:`hpcps.core.files`).

The model file is written as it is produced (:func:`write_model`): each table's rows (and a
dynamic table's keys) come in blocks of about :data:`MODEL_CHUNK_BYTES` from a source
(an array here, or the servers: :mod:`hpcps.worker.export`) and go into datasets created
at their final shape, through a Python file object (:class:`hpcps.core.atomic.GuardedFile`),
so the writer's memory is bounded by the block size, not by the model.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hpcps import __version__
from hpcps.core.atomic import OutputError, write_metrics, write_streamed

__all__ = ["OutputError", "write_model", "read_model", "write_metrics", "ArrayTable",
           "MODEL_CHUNK_BYTES"]

#: Bytes of rows and keys per block read from a table's source while the model file is
#: written (the chief's memory for the model is a small multiple of it: the servers' chunks,
#: the merged block, HDF5's chunk cache).
MODEL_CHUNK_BYTES = 8 << 20

#: Datasets with more elements than this are gzip-compressed (and chunked when above 1).
_GZIP_ABOVE = 4096
#: Bytes of the file besides the data (superblock, object headers, attributes but the
#: job file text, chunk indexes), for the size estimate in messages.
_H5_OVERHEAD = 16 << 10
#: HDF5's raw-data chunk cache per dataset while the model is written
_CHUNK_CACHE = 1 << 20


class ArrayTable:
    """A table held in memory, as a source for :func:`write_model`.

    Parameters
    ----------
    rows : ndarray (n, dim)
    keys : int64 ndarray (n,), optional
        A dynamic table's keys, ascending (row i is key ``keys[i]``).
    """

    def __init__(self, rows, keys=None):
        self.rows = np.asarray(rows)
        if self.rows.ndim != 2:
            raise ValueError(f"a table's rows must be 2-D (keys, dim), got shape {self.rows.shape}")
        self.keys = None if keys is None else np.asarray(keys, dtype=np.int64)
        if self.keys is not None and self.keys.shape != (self.rows.shape[0],):
            raise ValueError(f"{self.keys.shape[0]} keys for {self.rows.shape[0]} rows")
        self.dynamic = self.keys is not None
        self.n_rows, self.dim = self.rows.shape
        self.dtype = self.rows.dtype

    def blocks(self, max_rows: int):
        """Yield ``(keys or None, rows)`` views of at most ``max_rows`` rows, in order."""
        for a in range(0, self.n_rows, max(1, int(max_rows))):
            b = min(self.n_rows, a + max_rows)
            yield (None if self.keys is None else self.keys[a:b]), self.rows[a:b]


class _Appender:
    """Writes rows to one dataset at increasing offsets, each HDF5 chunk in one write (a
    block's tail that ends inside a chunk waits for the next block in a buffer of at most
    one chunk), so the library never reads a chunk back to complete it."""

    def __init__(self, dset):
        self.dset = dset
        self.align = int(dset.chunks[0]) if dset.chunks else 1
        self.pos = 0
        self.tail = None
        self.n_tail = 0

    def add(self, a: np.ndarray) -> None:
        if a.shape[0] == 0:
            return
        if self.n_tail:
            take = min(self.align - self.n_tail, a.shape[0])
            self.tail[self.n_tail:self.n_tail + take] = a[:take]
            self.n_tail += take
            a = a[take:]
            if self.n_tail < self.align:
                return
            self._write(self.tail)
            self.n_tail = 0
        m = (a.shape[0] // self.align) * self.align
        if m:
            self._write(a[:m])
        if a.shape[0] > m:
            if self.tail is None:
                self.tail = np.empty((self.align,) + a.shape[1:], dtype=a.dtype)
            self.n_tail = a.shape[0] - m
            self.tail[:self.n_tail] = a[m:]

    def _write(self, a: np.ndarray) -> None:
        if self.pos + a.shape[0] > self.dset.shape[0]:
            raise ValueError(f"dataset {self.dset.name!r}: more than its {self.dset.shape[0]} "
                             "rows were sent")
        self.dset[self.pos:self.pos + a.shape[0]] = np.ascontiguousarray(a)
        self.pos += a.shape[0]

    def finish(self) -> int:
        if self.n_tail:
            self._write(self.tail[:self.n_tail])
            self.n_tail = 0
        self.tail = None
        return self.pos


def _dataset(f, name: str, shape, dtype):
    """A dataset created at its final shape, chunked by h5py's guess when it has more than
    one element, and above ``_GZIP_ABOVE`` elements compressed with HDF5's byte shuffle and
    gzip level 1 (both built into every HDF5, so any reader opens the file). gzip at h5py's
    default level 4 without the shuffle was most of the time of writing a 10 M-key model
    (19 s, against 13 s of training; 5 M sorted keys and rows: 6.4 s, with the shuffle and
    level 1 3.0 s, the file as small: 55.9 against 55.3 MB)."""
    size = int(np.prod(shape))
    big = size > _GZIP_ABOVE
    return f.create_dataset(name, shape=shape, dtype=dtype, chunks=True if size > 1 else None,
                            compression="gzip" if big else None,
                            compression_opts=1 if big else None, shuffle=big)


def _source(name: str, t):
    if isinstance(t, tuple):                 # a dynamic table: (keys, rows) by key
        return ArrayTable(t[1], keys=t[0])
    if isinstance(t, np.ndarray):
        return ArrayTable(t)
    if not all(hasattr(t, a) for a in ("blocks", "n_rows", "dim", "dtype", "dynamic")):
        raise TypeError(f"table {name!r}: an ndarray, (keys, rows) or a table source, got "
                        f"{type(t).__name__}")
    return t


def write_model(path, tables: dict, cfg, step: int, epoch: int,
                chunk_bytes: int = MODEL_CHUNK_BYTES) -> Path:
    """Write the final model file atomically, table by table in blocks.

    The file goes to a temporary name in the run directory through a Python file object
    that keeps the first failed write instead of passing it to the HDF5 library (which can
    crash when its own writes fail half-way), and is moved into place when complete.

    Parameters
    ----------
    path : path-like
        Destination, e.g. ``runs/adult_lr/model.h5``.
    tables : dict of str -> table
        In file order: an ndarray ``(num_keys, dim)``; ``(keys (n,), rows (n, dim))`` for a
        dynamic table; or a source with ``n_rows``, ``dim``, ``dtype``, ``dynamic`` and
        ``blocks(max_rows)`` yielding ``(keys or None, rows)`` in order (keys ascending):
        :class:`ArrayTable`, :mod:`hpcps.worker.export`'s streams.
    cfg : hpcps.config.JobConfig
    step, epoch : int
    chunk_bytes : int
        Bytes per block asked of a source: ``chunk_bytes // (dim * itemsize + 8)`` rows (at
        least one; 8 bytes for the row's key).

    Raises
    ------
    OutputError
        If the file cannot be written (disk full, read-only, ...): the message names the
        file, the bytes it needs (uncompressed) and the bytes free; no partial file is left
        and an older ``model.h5`` is untouched.
    ValueError
        If a source yields more or fewer rows than its ``n_rows`` (naming the table).
    """
    sources = {name: _source(name, t) for name, t in tables.items()}
    sizes = {name: t.n_rows * (t.dim * np.dtype(t.dtype).itemsize + (8 if t.dynamic else 0))
             for name, t in sources.items()}
    text = cfg.text.encode() if isinstance(cfg.text, str) else bytes(cfg.text)
    need = sum(sizes.values()) + _H5_OVERHEAD + len(text)
    small = sum(b for name, b in sizes.items()       # never compressed: a lower bound
                if sources[name].n_rows * sources[name].dim <= _GZIP_ABOVE)

    def fill(out) -> None:
        # every chunk is written whole and once (_Appender): HDF5's chunk cache needs only
        # hold the chunks of one write; its default (8 MiB per dataset in HDF5 2.0) would
        # hold that much of each dataset
        with h5py.File(out, "w", rdcc_nbytes=_CHUNK_CACHE) as f:
            f.attrs["hpcps_version"] = __version__
            f.attrs["job_name"] = cfg.name
            f.attrs["step"] = int(step)
            f.attrs["epoch"] = int(epoch)
            f.attrs["config"] = cfg.text
            f.attrs["num_features"] = int(cfg.data.num_features)
            f.attrs["index_base"] = (int(cfg.data.index_base) if cfg.data.index_base is not None
                                     else -1)
            for name, t in sources.items():
                if not _write_table(f, name, t, chunk_bytes, out):
                    return                    # a write failed: write_streamed raises it

    return write_streamed(Path(path), fill, need, refuse_below=small + _H5_OVERHEAD,
                          note=" uncompressed")


def _write_table(f, name: str, t, chunk_bytes: int, out) -> bool:
    """Create table ``name``'s datasets and write source ``t`` into them block by block;
    False when a write of ``out`` failed (the rest is not written)."""
    n, dim, dtype = int(t.n_rows), int(t.dim), np.dtype(t.dtype)
    appenders = []
    if t.dynamic:
        k = _dataset(f, f"{name}_keys", (n,), np.int64)
        k.attrs["meaning"] = f"key of each row of {name!r}, ascending"
        appenders.append(_Appender(k))
    d = _dataset(f, name, (n, dim), dtype)
    d.attrs["dim"] = dim
    if t.dynamic:
        d.attrs["storage"] = "hash"
        d.attrs["meaning"] = (f"rows of dynamic table {name!r}: the keys stored, "
                              f"row i is key {name}_keys[i]")
    else:
        d.attrs["meaning"] = f"rows of table {name!r} in original key order"
    appenders.append(_Appender(d))
    # + 8: a dynamic table's key; for a fixed table pulled from the servers, the int64 key
    # and server of each row of a block (hpcps.worker.export.FixedTableStream)
    row_bytes = dim * dtype.itemsize + 8
    for keys, rows in t.blocks(max(1, int(chunk_bytes) // row_bytes)):
        if t.dynamic:
            appenders[0].add(np.asarray(keys, dtype=np.int64))
        appenders[-1].add(np.asarray(rows, dtype=dtype).reshape(-1, dim))
        if out.error is not None:
            return False
    got = [a.finish() for a in appenders]
    if out.error is not None:
        return False
    if any(g != n for g in got):
        raise ValueError(f"table {name!r}: {min(got)} rows written of {n}")
    return True


def read_model(path) -> dict:
    """Read a model file back: ``{"tables": {name: ndarray}, "attrs": {...}}``."""
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        tables = {k: f[k][()] for k in f.keys()}
    return {"tables": tables, "attrs": attrs}
