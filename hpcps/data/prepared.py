"""Prepared data sets: one HDF5 file per data set, written by ``hpcps data prepare`` (no MPI).

Layout (``hpcps_format = "prepared-v1"``)::

    /              attrs: hpcps_format, dataset (name), task ("classification" or
                          "regression"), source (path read), source_sha256,
                          plus data-set attributes (n_features, n_classes, n_users, ...)
    /train/X       (n, ...) rows, shuffled at preparation time
    /train/y       (n,)
    /test/X, /test/y

Workers read contiguous blocks of rows (:func:`read_part`), the blocks of
``numpy.array_split`` (:func:`hpcps.data.partition_rows.block_bounds`), so every row belongs to exactly one worker and no worker reads the
others' rows. Files are plain HDF5 and open with ``h5py`` or ``h5dump``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from hpcps.data import DataError
from hpcps.data.partition_rows import block_bounds

FORMAT = "prepared-v1"
SPLITS = ("train", "test")
# numpy dtype kinds accepted for X and y: bool, signed and unsigned integer, float
_NUMERIC_KINDS = "biuf"


class PreparedError(DataError):
    """A prepared data file is missing, unreadable, or not laid out as documented."""


def sha256_file(path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (to record which source a prepared file came from)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def write_prepared(path, splits: dict, attrs: dict) -> Path:
    """Write a prepared data set atomically (temporary file, then ``os.replace``).

    Parameters
    ----------
    path : str or os.PathLike
        Output file; parent directories are created.
    splits : dict
        ``{"train": (X, y), "test": (X, y)}``; ``X`` (n, ...) and ``y`` (n,) numpy arrays of
        the same length n, any numeric dtype (kept as given).
    attrs : dict
        File attributes; must include ``dataset`` and ``task``. Values are str, int or float.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ValueError
        If a split is missing, or ``X`` and ``y`` differ in length.
    """
    import h5py

    path = Path(path)
    for s in SPLITS:
        if s not in splits:
            raise ValueError(f"prepared data set needs a {s!r} split")
        X, y = splits[s]
        if len(X) != len(y):
            raise ValueError(f"{s}: X has {len(X)} rows but y has {len(y)}")
    for k in ("dataset", "task"):
        if k not in attrs:
            raise ValueError(f"prepared data set needs the attribute {k!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["hpcps_format"] = FORMAT
            for k, v in attrs.items():
                f.attrs[k] = v
            for s in SPLITS:
                X, y = splits[s]
                g = f.create_group(s)
                g.create_dataset("X", data=np.asarray(X))
                g.create_dataset("y", data=np.asarray(y))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _open(path):
    import h5py

    path = Path(path)
    if not path.is_file():
        raise PreparedError(f"{path}: prepared data file not found (write it with "
                            "`hpcps data prepare`)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise PreparedError(f"{path}: not a readable HDF5 file ({e})") from None
    fmt = f.attrs.get("hpcps_format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt != FORMAT:
        f.close()
        raise PreparedError(f"{path}: not an hpcps prepared data file (attribute hpcps_format is "
                            f"{fmt!r}, expected {FORMAT!r}); write it with `hpcps data prepare`")
    return f


def file_attrs(path) -> dict:
    """The file attributes of a prepared data set (str values decoded).

    Raises
    ------
    PreparedError
        If the file is missing, not HDF5, or not a prepared data set.
    """
    with _open(path) as f:
        return {k: (v.decode() if isinstance(v, bytes) else
                    v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}


def split_rows(path, split: str) -> int:
    """Number of rows of ``split`` in a prepared file."""
    with _open(path) as f:
        return int(_dataset(f, path, split, "y").shape[0])


def _dataset(f, path, split, name):
    key = f"{split}/{name}"
    import h5py

    if key not in f:
        raise PreparedError(f"{path}: missing dataset /{key}")
    d = f[key]
    if not isinstance(d, h5py.Dataset):
        raise PreparedError(f"{path}: /{key} is a {type(d).__name__}, expected a dataset")
    return d


def _describe(dtype) -> str:
    """An HDF5 dataset's numpy dtype in words (strings are ``object`` to numpy)."""
    import h5py

    info = h5py.check_string_dtype(dtype)
    if info is not None:
        return f"{dtype} (strings, {info.encoding})"
    if dtype.kind == "V":
        return f"{dtype} (compound or opaque)"
    return str(dtype)


def read_part(path, split: str, part: int, n_parts: int, max_rows: int = 0):
    """Rows of ``split`` that belong to worker ``part`` of ``n_parts`` (a contiguous block).

    Parameters
    ----------
    path : str or os.PathLike
    split : {"train", "test"}
    part, n_parts : int
        ``0 <= part < n_parts``; the rows of block ``part`` of ``numpy.array_split``.
    max_rows : int
        Use only the first ``max_rows`` rows of the split (0 = all).

    Returns
    -------
    X : ndarray (m, ...), the stored dtype
    y : ndarray (m,), the stored dtype

    Raises
    ------
    PreparedError
        Naming the file and the dataset: a missing file or dataset, not an HDF5 file,
        ``X`` or ``y`` not a numeric array (strings, compound or object dtype; a scalar;
        ``y`` not 1-d), ``X`` and ``y`` of different lengths, or a NaN/inf in this part's
        rows (with the row index within the split).
    ValueError
        If ``part`` is out of range.
    """
    if not 0 <= part < n_parts:
        raise ValueError(f"part {part} out of range for {n_parts} parts")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    with _open(path) as f:
        X, y = _dataset(f, path, split, "X"), _dataset(f, path, split, "y")
        for d, want in ((X, "at least 1-d"), (y, "1-d")):
            if d.dtype.kind not in _NUMERIC_KINDS:
                raise PreparedError(f"{path}: dataset {d.name} has dtype {_describe(d.dtype)}, "
                                    "expected a numeric array (integer or float)")
            if d.ndim == 0 or (d is y and d.ndim != 1):
                raise PreparedError(f"{path}: dataset {d.name} has shape {d.shape}, expected "
                                    f"{want}")
        if X.shape[0] != y.shape[0]:
            raise PreparedError(f"{path}: /{split}/X has {X.shape[0]} rows but /{split}/y has "
                                f"{y.shape[0]}")
        n = X.shape[0] if not max_rows else min(max_rows, X.shape[0])
        lo, hi = block_bounds(n, part, n_parts)
        Xp, yp = X[lo:hi], y[lo:hi]
    for arr, name in ((Xp, "X"), (yp, "y")):
        if arr.dtype.kind == "f" and arr.size:
            bad = ~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)
            if bad.any():
                row = lo + int(np.flatnonzero(bad)[0])
                raise PreparedError(f"{path}: dataset /{split}/{name} row {row}: non-finite "
                                    "value (NaN or inf)")
    return Xp, yp
