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
"""

from __future__ import annotations

import io
from pathlib import Path

import h5py

from hpcps import __version__
from hpcps.core.atomic import OutputError, write_atomic as _write_atomic, write_metrics

__all__ = ["OutputError", "write_model", "read_model", "write_metrics"]


def write_model(path, tables: dict, cfg, step: int, epoch: int) -> Path:
    """Write the final model file atomically.

    The HDF5 file is built in memory and then written with plain ``write`` calls, so that a
    full or read-only disk is an ordinary ``OSError`` (the HDF5 library can crash when its
    own writes fail half-way).

    Parameters
    ----------
    path : path-like
        Destination, e.g. ``runs/adult_lr/model.h5``.
    tables : dict of str -> ndarray (num_keys, dim), or (keys (n,), rows (n, dim)) for a
        dynamic table
    cfg : hpcps.config.JobConfig
    step, epoch : int

    Raises
    ------
    OutputError
        If the file cannot be written (disk full, read-only, ...): the message names the
        file, the bytes it needs and the bytes free; no partial file is left and an older
        ``model.h5`` is untouched.
    """
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.attrs["hpcps_version"] = __version__
        f.attrs["job_name"] = cfg.name
        f.attrs["step"] = int(step)
        f.attrs["epoch"] = int(epoch)
        f.attrs["config"] = cfg.text
        f.attrs["num_features"] = int(cfg.data.num_features)
        f.attrs["index_base"] = int(cfg.data.index_base) if cfg.data.index_base is not None else -1
        for name, arr in tables.items():
            if isinstance(arr, tuple):           # a dynamic table: (keys, rows) by key
                keys, arr = arr
                k = f.create_dataset(f"{name}_keys", data=keys, chunks=True if keys.size > 1
                                     else None, compression="gzip" if keys.size > 4096 else None)
                k.attrs["meaning"] = f"key of each row of {name!r}, ascending"
                d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                     compression="gzip" if arr.size > 4096 else None)
                d.attrs["dim"] = arr.shape[1]
                d.attrs["storage"] = "hash"
                d.attrs["meaning"] = (f"rows of dynamic table {name!r}: the keys stored, "
                                      f"row i is key {name}_keys[i]")
                continue
            d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                 compression="gzip" if arr.size > 4096 else None)
            d.attrs["dim"] = arr.shape[1]
            d.attrs["meaning"] = f"rows of table {name!r} in original key order"
    return _write_atomic(Path(path), buf.getbuffer())


def read_model(path) -> dict:
    """Read a model file back: ``{"tables": {name: ndarray}, "attrs": {...}}``."""
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        tables = {k: f[k][()] for k in f.keys()}
    return {"tables": tables, "attrs": attrs}
