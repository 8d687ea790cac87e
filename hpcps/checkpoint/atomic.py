"""Atomic HDF5 files and their checksums: write under a temporary name, hash while writing,
fsync, ``os.replace``; clear messages when the disk refuses. Local (no MPI)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import xxhash

from hpcps.checkpoint.layout import CHECKSUM, DIGEST_FIELD, CheckpointError, shard_name
from hpcps.core.files import make_temp

#: checksums :func:`verify` knows, by the name the manifest records
_HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
#: bytes hashed then written at a time, so the write copies them from cache
_PIECE = 1 << 20



def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_digest(path: Path, checksum: str = CHECKSUM) -> str:
    """Hex digest of the file at ``path`` with ``checksum`` (a key of ``_HASHES``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _HASHES[checksum]).hexdigest()


def _field(digest: str) -> str:
    """``digest`` (hex) zero-padded to :data:`DIGEST_FIELD` bytes."""
    return digest.ljust(2 * DIGEST_FIELD, "0")


def _unfield(field: str, server: int) -> str:
    """The :data:`CHECKSUM` digest (hex) inside a digest field from :func:`write_shard`.

    Raises
    ------
    CheckpointError
        If the field's size is not :data:`DIGEST_FIELD` bytes or its padding is not zero
        (a shard written by another hpcps version).
    """
    n = 2 * _HASHES[CHECKSUM]().digest_size
    if len(field) != 2 * DIGEST_FIELD or field[n:].strip("0"):
        raise CheckpointError(f"shard {shard_name(server)}: digest {field!r} is not a "
                              f"{CHECKSUM} digest field of {DIGEST_FIELD} bytes "
                              "(written by another hpcps version?)")
    return field[:n]


def _atomic_h5(final: Path, fill, need: int = 0) -> str | None:
    """Write an HDF5 file by calling ``fill(h5file)`` on a temp file, then commit it.

    Parameters
    ----------
    final : Path
        Where the file lands (``os.replace`` of the temporary file, then an fsync of the
        directory).
    fill : callable(h5py.File) -> list of (dataset path, ndarray) or None
        Writes the file's metadata and small datasets. Large datasets it only *creates*
        (with :func:`_create_raw`, storage allocated, nothing written) and returns with the
        arrays that belong in them: those are written by :func:`_write_raw` after the HDF5
        library closed the file.
    need : int
        Expected size in bytes (data plus HDF5 overhead). When the file system has less free
        space than that, nothing is written; when writing fails anyway (ENOSPC, EROFS, EDQUOT,
        EFBIG, EIO, ...) the temporary file is removed. Either way the previous checkpoints
        are untouched and the :class:`CheckpointError` names the file, the reason, the bytes
        needed and the bytes free.

    Returns
    -------
    str or None
        :data:`CHECKSUM` digest (hex) of the committed file when ``fill`` returned datasets
        to write, else None (the caller hashes the file itself).
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(_write_failure(final, e.strerror or str(e), need)) from e
    free = _free_bytes(final.parent)
    if need and free is not None and free < need:
        raise CheckpointError(_write_failure(final, "not enough free space", need))
    try:
        tmp = make_temp(final)            # mode 0666 & ~umask, like the directories
    except OSError as e:
        raise CheckpointError(_write_failure(final, e.strerror or str(e), need)) from e
    digest = None
    try:
        # file format of HDF5 1.8-1.10: several times faster to write than the default
        # "earliest", and still readable by HDF5 1.10 tools (h5dump/h5ls of Debian 12);
        # "latest" (HDF5 2.x) is not
        with h5py.File(tmp, "w", libver=("v108", "v110")) as f:
            raw = fill(f) or []
            regions = [(int(f[name].id.get_offset()), arr) for name, arr in raw if arr.nbytes]
        if regions:
            digest = _write_raw(tmp, regions)
        else:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except OSError as e:
        raise CheckpointError(_write_failure(final, _reason(e), need)) from e
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return digest


def _create_raw(group, name: str, arr: np.ndarray) -> tuple[str, np.ndarray]:
    """Create dataset ``name`` in ``group`` shaped and typed like ``arr``, contiguous, its
    storage allocated at creation and never filled, and return ``(path, arr)`` for
    :func:`_write_raw`. ``arr`` is made C-contiguous and native-endian (the dataset's type)."""
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    ds = group.create_dataset(name, shape=arr.shape, dtype=arr.dtype, dcpl=dcpl,
                              fill_time="never")
    return ds.name, arr


def _write_raw(path: Path, regions) -> str:
    """Write each array at its byte offset of ``path`` (``os.pwrite``), fsync, and return the
    :data:`CHECKSUM` digest (hex) of the whole file, computed in the same pass from memory:
    each piece of :data:`_PIECE` bytes is hashed, then written (the file's other bytes, HDF5
    metadata, are read back: a few KB).

    Parameters
    ----------
    path : Path
        An HDF5 file closed by the library, whose contiguous datasets were allocated at the
        offsets given and not written.
    regions : list of (int, ndarray)
        Byte offset in the file and the C-contiguous array to place there.

    Raises
    ------
    CheckpointError
        If two regions overlap. OSError from the writes goes to the caller.

    Notes
    -----
    The digest is that of the file's bytes in order, so :func:`verify` (which re-reads the
    file) checks exactly the same thing. Hashing a piece just before writing it leaves it in
    the cache for the kernel's copy; XXH3 adds ~2 ms to a 67 MB shard on one core, where the
    SHA-256 of format 1 needed a second thread and a free core.
    """
    regions = sorted(regions, key=lambda r: r[0])
    h = _HASHES[CHECKSUM]()
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        pos = 0                    # the file in order: metadata bytes, arrays
        for off, a in regions:
            if off < pos:
                raise CheckpointError(f"{path}: datasets overlap at byte {off}")
            if off > pos:
                h.update(os.pread(fd, off - pos, pos))
            view = memoryview(a).cast("B")
            for start in range(0, len(view), _PIECE):
                piece = view[start:start + _PIECE]
                h.update(piece)
                done = 0
                while done < len(piece):
                    done += os.pwrite(fd, piece[done:], off + start + done)
            pos = off + a.nbytes
        if size > pos:
            h.update(os.pread(fd, size - pos, pos))
        os.fsync(fd)
        return h.hexdigest()
    finally:
        os.close(fd)


def _reason(e: OSError) -> str:
    """The OS reason of a failed write, on one line. h5py's OSError carries HDF5's report
    (several lines, with ``errno = N`` inside) instead of a plain ``strerror``."""
    text = " ".join(str(e.strerror or e).split())
    m = re.search(r"errno = (\d+)", text)
    if m:
        return f"{os.strerror(int(m.group(1)))} (HDF5: {text.split(' (', 1)[0]})"
    return text


def _free_bytes(d: Path) -> int | None:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return None


def _write_failure(final: Path, reason: str, need: int) -> str:
    free = _free_bytes(final.parent)
    have = f"{free / 1e6:,.2f} MB free" if free is not None else "free space unknown"
    want = f"the file needs about {need / 1e6:,.2f} MB, " if need else ""
    return (f"cannot write {final}: {reason}; {want}{have} in {final.parent}. "
            "Earlier checkpoints are untouched; free space (or make the directory "
            "writable) and run the job again to resume from the newest of them")


#: HDF5 bookkeeping added to the data bytes when estimating a file's size.
H5_OVERHEAD = 64 * 1024
