"""Atomic file writes (a temporary name in the same directory, fsync, ``os.replace``) with a
clear error when the disk is full, and the JSON record files of a run directory. No MPI."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np

from hpcps.core.files import make_temp

__all__ = ["OutputError", "write_atomic", "write_metrics"]


class OutputError(OSError):
    """The model or metrics file could not be written (disk full, read-only, quota, ...).

    An :class:`OSError` with the errno of the failure; the message names the file, the bytes
    it needs and the bytes free. The job exits with status 74 (:mod:`hpcps.core.exitcodes`).
    """


def _failed(final: Path, errno: int | None, reason: str, need: int) -> OutputError:
    try:
        free = f"{_size(shutil.disk_usage(final.parent).free)} free"
    except OSError:
        free = "free space unknown"
    return OutputError(errno, f"cannot write {final}: {reason}; it needs about "
                              f"{_size(need)}, {free} in {final.parent}")


def _size(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 10_000 else f"{n:,} bytes"


def write_atomic(final: Path, data: bytes) -> Path:
    """Write ``data`` to ``final`` through a temporary file in the same directory, fsync it
    and ``os.replace`` it into place. When the directory has less free space than
    ``len(data)``, nothing is written; when writing fails anyway the temporary file is
    removed. Raises :class:`OutputError`."""
    need = len(data)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(final.parent).free
    except OSError as e:
        raise _failed(final, e.errno, e.strerror or str(e), need) from e
    if free < need:
        raise _failed(final, errno.ENOSPC, "not enough free space", need)
    tmp = None
    try:
        tmp = make_temp(final)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as e:
        raise _failed(final, e.errno, e.strerror or str(e), need) from e
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    return final


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
    OutputError
        As :func:`write_model`: naming the file, the bytes needed and free.
    """
    text = json.dumps(_jsonable(record), indent=1, allow_nan=False) + "\n"
    return write_atomic(Path(path), text.encode())
