"""Run-directory outputs: the final model (HDF5) and the metrics file (JSON). No MPI.

Model file ``<run dir>/model.h5``
    one dataset per table, shape ``(num_keys, dim)``, rows in original key order, with
    attributes ``dim``, ``sparse``; file attributes ``hpcps_version``, ``job_name``,
    ``step`` (worker clock at the end), ``epoch``, ``config`` (the job file text, TOML),
    ``num_features``, ``index_base`` (svmlight jobs; -1 otherwise).
Metrics file ``<run dir>/metrics.json``
    ``{"job": ..., "config": {...}, "epochs": [{epoch, clock, seconds, train_logloss,
    test_logloss, test_auc, test_accuracy, test_rows}, ...], "summary": {...}}``.

Both are written to a temporary name in the same directory and moved into place with
``os.replace``, so a reader never sees half a file; their mode follows the umask
(:mod:`hpcps.files`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from . import __version__
from .files import make_temp


def _atomic_path(final: Path):
    return make_temp(final)


def _commit(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


def _failed(final: Path, e: OSError, need: int) -> OSError:
    """An OSError (same errno) naming the file, the bytes it needs and the bytes free."""
    try:
        free = f"{shutil.disk_usage(final.parent).free / 1e6:,.2f} MB free"
    except OSError:
        free = "free space unknown"
    reason = e.strerror or str(e)
    return OSError(e.errno, f"cannot write {final}: {reason}; it needs about "
                            f"{need / 1e6:,.2f} MB, {free} in {final.parent}")


def write_model(path, tables: dict, cfg, step: int, epoch: int) -> Path:
    """Write the final model file atomically.

    Parameters
    ----------
    path : path-like
        Destination, e.g. ``runs/adult_lr/model.h5``.
    tables : dict of str -> ndarray (num_keys, dim)
    cfg : hpcps.config.JobConfig
    step, epoch : int

    Raises
    ------
    OSError
        If the file cannot be written (disk full, read-only, ...): the message names the
        file, the bytes it needs and the bytes free; no partial file is left.
    """
    final = Path(path)
    need = 64 * 1024 + sum(np.asarray(a).nbytes for a in tables.values())
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _atomic_path(final)
    except OSError as e:
        raise _failed(final, e, need) from e
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["hpcps_version"] = __version__
            f.attrs["job_name"] = cfg.name
            f.attrs["step"] = int(step)
            f.attrs["epoch"] = int(epoch)
            f.attrs["config"] = cfg.text
            f.attrs["num_features"] = int(cfg.data.num_features)
            f.attrs["index_base"] = int(cfg.data.index_base) if cfg.data.index_base is not None else -1
            for name, arr in tables.items():
                d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                     compression="gzip" if arr.size > 4096 else None)
                d.attrs["dim"] = arr.shape[1]
                d.attrs["meaning"] = f"rows of table {name!r} in original key order"
        _commit(tmp, final)
    except OSError as e:
        raise _failed(final, e, need) from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return final


def read_model(path) -> dict:
    """Read a model file back: ``{"tables": {name: ndarray}, "attrs": {...}}``."""
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        tables = {k: f[k][()] for k in f.keys()}
    return {"tables": tables, "attrs": attrs}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def write_metrics(path, record: dict) -> Path:
    """Write the metrics JSON atomically (non-finite floats become ``null``).

    Raises
    ------
    OSError
        As :func:`write_model`: naming the file, the bytes needed and free.
    """
    final = Path(path)
    text = json.dumps(_jsonable(record), indent=1, allow_nan=False) + "\n"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _atomic_path(final)
    except OSError as e:
        raise _failed(final, e, len(text.encode())) from e
    try:
        tmp.write_text(text)
        _commit(tmp, final)
    except OSError as e:
        raise _failed(final, e, len(text.encode())) from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return final
