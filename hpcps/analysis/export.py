"""``hpcps export``: every table and optimizer slot of a source to ``.npz`` (no MPI)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hpcps.analysis.sources import SLOT_SEP, AnalysisError, Source, read_tables, resolve
from hpcps.core.files import make_temp


_SAVEZ_RESERVED = {"file", "args", "allow_pickle"}


def export_npz(source, out=None) -> Path:
    """Write every table of a source to an ``.npz`` file, in original key order.

    One array per table (``weights``, ``bias``) and one per optimizer slot
    (``<table>__<slot>``, e.g. ``weights__accumulator``); numeric arrays only, so
    ``numpy.load(out, allow_pickle=False)`` reads it. Written to a temporary file in the same
    directory and moved into place.

    Parameters
    ----------
    source : Source or path-like
        Anything :func:`resolve` accepts.
    out : path-like, optional
        Output file, used exactly as given; default ``<job>-step-XXXXXXXX.npz`` in the
        working directory.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    AnalysisError
        If the source cannot be read, or two arrays would get the same name.
    OSError
        If the output cannot be written.
    """
    src = source if isinstance(source, Source) else resolve(source)
    tables, slots = read_tables(src)
    arrays = dict(tables)
    for t, d in slots.items():
        for s, a in d.items():
            key = f"{t}{SLOT_SEP}{s}"
            if key in arrays:
                raise AnalysisError(f"{src.path}: table {key!r} clashes with slot {s!r} of table {t!r}")
            arrays[key] = a
    bad = sorted(set(arrays) & _SAVEZ_RESERVED)
    if bad:
        raise AnalysisError(f"{src.path}: table name(s) {bad} cannot be stored by numpy.savez")
    for k, a in arrays.items():
        if a.dtype.hasobject:
            raise AnalysisError(f"{src.path}: array {k!r} has dtype {a.dtype}, not numeric")
    if out is None:
        name = str(src.meta.get("job_name") or "model")
        out = Path.cwd() / f"{name}-step-{int(src.meta.get('step', 0)):08d}.npz"
    out = Path(out)
    tmp = make_temp(out)                     # mode 0666 & ~umask
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
