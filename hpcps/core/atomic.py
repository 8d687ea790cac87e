"""Atomic file writes (a temporary name in the same directory, fsync, ``os.replace``) with a
clear error when the disk is full, and the JSON record files of a run directory. No MPI.

:func:`write_atomic` writes bytes held in memory; :func:`write_streamed` writes a file that is
produced piece by piece through a Python file object (:class:`GuardedFile`, for h5py's
file-object driver), so that its size is not bounded by memory."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np

from hpcps.core.files import make_temp

__all__ = ["OutputError", "GuardedFile", "write_atomic", "write_streamed", "write_metrics"]


class OutputError(OSError):
    """The model or metrics file could not be written (disk full, read-only, quota, ...).

    An :class:`OSError` with the errno of the failure; the message names the file, the bytes
    it needs and the bytes free. The job exits with status 74 (:mod:`hpcps.core.exitcodes`).
    """


def _failed(final: Path, errno: int | None, reason: str, need: int,
            note: str = "") -> OutputError:
    try:
        free = f"{_size(shutil.disk_usage(final.parent).free)} free"
    except OSError:
        free = "free space unknown"
    return OutputError(errno, f"cannot write {final}: {reason}; it needs about "
                              f"{_size(need)}{note}, {free} in {final.parent}")


def _size(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 10_000 else f"{n:,} bytes"


def write_atomic(final: Path, data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``final`` through a temporary file in the same directory, fsync it
    (unless not ``durable``) and ``os.replace`` it into place: a reader sees the old or the
    new content whole either way; ``durable`` also makes it survive a crash of the node.
    When the directory has less free space than ``len(data)``, nothing is written; when
    writing fails anyway the temporary file is removed. Raises :class:`OutputError`."""
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
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as e:
        raise _failed(final, e.errno, e.strerror or str(e), need) from e
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    return final


class GuardedFile:
    """A binary file for h5py's file-object driver (``h5py.File(GuardedFile(...), "w")``)
    that never lets a failed write reach the HDF5 library.

    HDF5 crashes (SIGSEGV, seen with HDF5 2.0 through h5py 3.16, and with its own ``sec2``
    driver on a full disk) when its writes fail half-way. Here the first ``OSError`` of a
    write (``ENOSPC``, ``EROFS``, ``EDQUOT``, ``EIO``, ...) is kept in :attr:`error` and that
    write and every later one are dropped as if they had succeeded, so the library finishes
    and closes the file normally; the writer checks :attr:`error` (to stop early) and
    :func:`write_streamed` raises it and removes the file. A read after a failure returns
    what the file holds, zero-filled past its end (the writer of the model file writes each
    HDF5 chunk once, so the library reads back only the metadata it keeps in its cache).

    Parameters
    ----------
    raw : io.FileIO
        The file, opened unbuffered (``open(path, "r+b", buffering=0)``): a buffered file
        could fail in ``seek`` (its flush) where this class does not look for it.
    """

    def __init__(self, raw):
        self.raw = raw
        self.error: OSError | None = None
        self.written = 0               # bytes written before the first failure

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < view.nbytes:
                    n = self.raw.write(view[done:])
                    if not n:
                        raise OSError(errno.EIO, f"write returned {n}")
                    done += n
                self.written += done
            except OSError as e:
                self.error = e
        return view.nbytes

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        try:
            n = self.raw.readinto(view) or 0
        except OSError:
            if self.error is None:
                raise
            n = 0
        if self.error is not None and n < view.nbytes:
            view[n:] = bytes(view.nbytes - n)
            n = view.nbytes
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.raw.read()
        buf = bytearray(size)
        return bytes(buf[:self.readinto(buf)])

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.raw.seek(pos, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self.raw.truncate(size)
            except OSError as e:
                self.error = e
        return self.raw.tell() if size is None else size

    def flush(self) -> None:
        if self.error is None:
            try:
                self.raw.flush()
            except OSError as e:
                self.error = e


def write_streamed(final: Path, fill, need: int, refuse_below: int | None = None,
                   note: str = "") -> Path:
    """Write ``final`` by calling ``fill(file)`` on a :class:`GuardedFile` over a temporary
    file in the same directory, then fsync it and ``os.replace`` it into place.

    Parameters
    ----------
    final : pathlib.Path
    fill : callable(GuardedFile) -> None
        Writes the contents. It should return early once ``file.error`` is set (nothing it
        writes after that is kept).
    need : int
        The size the file is expected to have, for the messages.
    refuse_below : int, optional
        When the directory has less free space than this (default ``need``), nothing is
        written. A file that is compressed as it is written passes a lower bound here.
    note : str
        Words after the size in the messages (``" uncompressed"``).

    Returns
    -------
    pathlib.Path
        ``final``.

    Raises
    ------
    OutputError
        When the file cannot be written (disk full, read-only, quota, I/O error): the message
        names the file, the reason, the bytes needed and the bytes free; the temporary file
        is removed and an older ``final`` is untouched.
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(final.parent).free
    except OSError as e:
        raise _failed(final, e.errno, e.strerror or str(e), need, note) from e
    if free < (need if refuse_below is None else refuse_below):
        raise _failed(final, errno.ENOSPC, "not enough free space", need, note)
    tmp = None
    failure = None
    try:
        tmp = make_temp(final)
        with open(tmp, "r+b", buffering=0) as raw:
            out = GuardedFile(raw)
            fill(out)
            if out.error is not None:
                e = out.error
                reason = e.strerror or str(e)
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    reason = f"not enough free space ({reason} after {_size(out.written)} written)"
                failure = (e, reason)
            else:
                os.fsync(raw.fileno())
        if failure is None:
            os.replace(tmp, final)
    except OSError as e:
        failure = (e, e.strerror or str(e))
    finally:
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
    if failure is not None:          # after the removal: the free space it reports is true
        raise _failed(final, failure[0].errno, failure[1], need, note) from failure[0]
    return final


def jsonable(x):
    """``x`` with what ``json`` cannot write made plain: numpy scalars, paths, non-finite
    floats (``None``), dict keys as strings; nested dicts and lists. Local."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def write_metrics(path, record: dict, durable: bool = True) -> Path:
    """Write the metrics JSON atomically (non-finite floats become ``null``); ``durable``:
    as :func:`write_atomic`.

    Raises
    ------
    OutputError
        As :func:`write_model`: naming the file, the bytes needed and free.
    """
    text = json.dumps(jsonable(record), indent=1, allow_nan=False) + "\n"
    return write_atomic(Path(path), text.encode(), durable)
