"""Sources of model parameters for the offline analysis: resolving a path, reading tables.

A *source* is a verified checkpoint directory, a run directory (its newest valid checkpoint,
else its ``model.h5``) or a final model file; see :mod:`hpcps.analysis.offline` for the rules.
Every table returned here is in **original key order** (row ``k`` is key ``k``). No MPI.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import h5py
import numpy as np

from hpcps import checkpoint as ckpt


MODEL_FILE = "model.h5"
METRICS_FILE = "metrics.json"
#: Separator between table and slot name in exported arrays (``weights__accumulator``).
SLOT_SEP = "__"
_BLOCK_ROWS = 1 << 20
_STEP_DIR_RE = re.compile(r"^step-\d{8,}$")


#: How metric names of :meth:`hpcps.models.base.Model.metrics` (and ``metrics.json``'s
#: ``train_<name>`` / ``test_<name>``) are written in reports and plots; others as they are.
METRIC_LABELS = {"logloss": "log-loss", "auc": "AUC", "accuracy": "accuracy", "mse": "MSE",
                 "rmse": "RMSE", "mae": "MAE", "hinge": "hinge loss"}


def metric_label(name: str) -> str:
    """The label of a metric name, e.g. ``"rmse"`` -> ``"RMSE"`` (unknown names unchanged).

    Parameters
    ----------
    name : str
        A key of a model's metrics (without ``train_`` / ``test_``).

    Returns
    -------
    str
    """
    return METRIC_LABELS.get(name, name)


class AnalysisError(RuntimeError):
    """A source cannot be analysed (the one-line message names the file and says why)."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# ---------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
    """A resolved model source (see the module docstring).

    Attributes
    ----------
    kind : {"checkpoint", "model"}
        A verified checkpoint directory or a final model file.
    path : pathlib.Path
        The checkpoint directory, or the model file.
    meta : dict
        For a checkpoint the manifest (:func:`hpcps.checkpoint.verify`); for a model file its
        root attributes (``job_name``, ``step``, ``epoch``, ``config``, ...).
    run_dir : pathlib.Path or None
        The run directory if one was given.
    checkpoints : tuple of dict
        For a run directory: every checkpoint, from :func:`checkpoint_status`.
    """

    kind: str
    path: Path
    meta: dict
    run_dir: Path | None = None
    checkpoints: tuple = ()

    @property
    def label(self) -> str:
        """str : Short description, e.g. ``checkpoint runs/x/ckpt/step-00000040 (step 40)``."""
        return f"{self.kind} {self.path} (step {self.meta.get('step', '?')})"

    @property
    def config_text(self) -> str:
        """str : The job file text stored with the parameters (``""`` if absent)."""
        return str(self.meta.get("config", ""))


def checkpoint_status(run_dir) -> list[dict]:
    """Every checkpoint directory of a run with its validity, oldest first.

    Parameters
    ----------
    run_dir : path-like
        The run directory (``runs/NAME``).

    Returns
    -------
    list of dict
        ``{"step": int, "path": Path, "valid": bool, "error": str or None}``; ``error`` is
        :func:`hpcps.checkpoint.verify`'s reason for an invalid checkpoint.
    """
    out = []
    for step in ckpt.list_steps(run_dir):
        d = ckpt.step_dir(run_dir, step)
        try:
            ckpt.verify(d)
            out.append({"step": step, "path": d, "valid": True, "error": None})
        except ckpt.CheckpointError as e:
            out.append({"step": step, "path": d, "valid": False, "error": _one_line(e)})
    return out


def _checkpoint(directory: Path, run_dir=None, statuses=()) -> Source:
    try:
        manifest = ckpt.verify(directory)
    except ckpt.CheckpointError as e:
        raise AnalysisError(_one_line(e)) from None
    return Source("checkpoint", directory, manifest, run_dir, tuple(statuses))


def _model(path: Path, run_dir=None, statuses=()) -> Source:
    try:
        with h5py.File(path, "r") as f:
            meta = {k: ckpt.attr_value(v) for k, v in f.attrs.items()}
            if "job_name" not in meta or "config" not in meta:
                raise AnalysisError(f"{path}: an HDF5 file, but neither an hpcps checkpoint "
                                    "manifest nor an hpcps model file (no job_name/config attributes)")
            tables = [k for k, v in f.items() if isinstance(v, h5py.Dataset)]
    except OSError as e:
        raise AnalysisError(f"{path}: not a readable HDF5 file ({_one_line(e)})") from None
    if not tables:
        raise AnalysisError(f"{path}: model file has no tables")
    return Source("model", path, meta, run_dir, tuple(statuses))


def resolve(path) -> Source:
    """Find the parameters a path names (see *Sources* in the module docstring).

    Parameters
    ----------
    path : path-like
        A checkpoint directory, a ``manifest.h5``, a run directory (or its ``ckpt/``), or a
        ``model.h5``.

    Returns
    -------
    Source

    Raises
    ------
    AnalysisError
        If the path does not exist, is not one of the above, or the checkpoint it names is
        incomplete or corrupt (the message gives :func:`hpcps.checkpoint.verify`'s reason);
        for a run directory, if it has neither a valid checkpoint nor a model file.
    """
    p = Path(path)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / ckpt.MANIFEST).exists() or _STEP_DIR_RE.match(p.name):
            return _checkpoint(p)
        if p.name == "ckpt" and ckpt.list_steps(p.parent):
            p = p.parent
        if ckpt.list_steps(p) or (p / MODEL_FILE).is_file():
            statuses = checkpoint_status(p)
            valid = [s for s in statuses if s["valid"]]
            if valid:
                return _checkpoint(valid[-1]["path"], p, statuses)
            if (p / MODEL_FILE).is_file():
                return _model(p / MODEL_FILE, p, statuses)
            raise AnalysisError(f"{p}: no valid checkpoint ({len(statuses)} found, all invalid; "
                                f"newest: {statuses[-1]['error']}) and no {MODEL_FILE}")
        raise AnalysisError(f"{p}: not a checkpoint directory (no {ckpt.MANIFEST}) nor a run "
                            f"directory (no ckpt/step-* nor {MODEL_FILE})")
    if p.name == ckpt.MANIFEST:
        return _checkpoint(p.parent)
    try:
        with h5py.File(p, "r") as f:
            is_manifest = ckpt.attr_value(f.attrs.get("format")) in ckpt.READ_FORMATS
    except OSError as e:
        raise AnalysisError(f"{p}: not a readable HDF5 file ({_one_line(e)})") from None
    return _checkpoint(p.parent) if is_manifest else _model(p)


# ----------------------------------------------------------------------------- tables


def array_stats(a, block_rows: int = _BLOCK_ROWS) -> dict:
    """Summary statistics of an array, read in blocks of rows.

    Parameters
    ----------
    a : ndarray or h5py.Dataset, or a list of them
        At least one-dimensional; blocks ``a[i:i + block_rows]`` are read one at a time,
        so a large HDF5 dataset is never loaded whole. A list: the parts of one array
        stacked along the first axis (a dynamic table's shards), read part by part.
    block_rows : int
        Rows per block (>= 1).

    Returns
    -------
    dict
        ``shape`` (tuple), ``dtype`` (str), ``size``, ``nonzeros``, ``nonfinite`` (NaN or
        ±inf count), and over the finite values ``l2`` (Euclidean norm), ``min``, ``max``,
        ``mean`` (``nan`` when there is no finite value).

    Raises
    ------
    ValueError
        If ``block_rows < 1`` or ``a`` is zero-dimensional.
    """
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    parts = list(a) if isinstance(a, (list, tuple)) else [a]
    if not parts or len(parts[0].shape) == 0:
        raise ValueError("array_stats needs an array with at least one dimension")
    shape = (sum(int(q.shape[0]) for q in parts),) + tuple(int(n) for n in parts[0].shape[1:])
    nnz = nonfinite = finite = 0
    sumsq = total = 0.0
    lo, hi = math.inf, -math.inf
    blocks = (q[i:i + block_rows] for q in parts for i in range(0, q.shape[0], block_rows))
    for block in blocks:
        x = np.asarray(block, dtype=np.float64)
        nnz += int(np.count_nonzero(x))
        ok = np.isfinite(x)
        nonfinite += int(x.size - np.count_nonzero(ok))
        v = x[ok] if nonfinite else x.reshape(-1)
        if v.size:
            finite += v.size
            sumsq += float(np.dot(v, v))
            total += float(v.sum())
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    nan = float("nan")
    return {"shape": shape, "dtype": str(parts[0].dtype),
            "size": int(np.prod(shape)), "nonzeros": nnz, "nonfinite": nonfinite,
            "l2": math.sqrt(sumsq) if finite else nan, "min": lo if finite else nan,
            "max": hi if finite else nan, "mean": total / finite if finite else nan}


def _permutation(keys, n: int, where: str) -> np.ndarray:
    """``keys`` (the key of each stored row, as a checkpoint's manifest gives a fixed table's
    ``NAME_keys``) as int64 (n,), checked to be a permutation of ``0..n-1``; AnalysisError
    naming ``where`` otherwise."""
    keys = np.asarray(keys, dtype=np.int64)
    if keys.shape != (n,) or (n and (keys.min() < 0 or keys.max() >= n)) or \
            not np.all(np.bincount(keys, minlength=n) == 1):
        raise AnalysisError(f"{where}: the row keys are not a permutation of 0..{n - 1} "
                            "(a shard file unreadable through the manifest's virtual dataset?)")
    return keys


def _unpermute(rows: np.ndarray, keys: np.ndarray, where: str, checked: bool = False) -> np.ndarray:
    """``rows`` (n, ...) in key order: row ``i`` goes to ``keys[i]``. ``keys`` is checked
    (:func:`_permutation`) unless ``checked`` (already returned by it for ``n`` rows)."""
    if not checked:
        keys = _permutation(keys, rows.shape[0], where)
    out = np.empty_like(rows)
    out[keys] = rows
    return out


def read_dynamic(directory, manifest: dict, name: str) -> dict:
    """A dynamic table of a checkpoint (issue 18), from every shard's group: ``keys`` int64
    (n,) ascending, ``rows`` (n, dim), ``slots`` {slot: (n, ...)} and ``updates`` (pushes
    that stepped each row since the server loaded it; zeros for checkpoints without them)
    in the same order, and ``per_server`` (keys stored by each shard). Local.

    Raises
    ------
    AnalysisError
        If a shard's group cannot be read or a key is stored by two shards.
    """
    keys, rows, per, slot_parts, updates = [], [], [], {}, []
    for fname in manifest["shards"]["files"]:
        path = Path(directory) / fname
        try:
            with h5py.File(path, "r") as f:
                g = f[f"tables/{name}"]
                keys.append(g["keys"][()])
                rows.append(g["rows"][()])
                for s, d in g["slots"].items():
                    slot_parts.setdefault(s, []).append(d[()])
                n = g["keys"].shape[0]
                updates.append(g["updates"][()] if "updates" in g else np.zeros(n, np.int64))
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{path}: cannot read dynamic table {name!r} ({_one_line(e)})") \
                from None
        per.append(int(keys[-1].size))
    k = np.concatenate(keys)
    order = np.argsort(k, kind="stable")
    k = k[order]
    if k.size > 1 and np.any(k[1:] == k[:-1]):
        dup = int(k[1:][k[1:] == k[:-1]][0])
        raise AnalysisError(f"{directory}: dynamic table {name!r}: key {dup} is stored by two "
                            "shards")
    return {"keys": k, "rows": np.concatenate(rows)[order],
            "slots": {s: np.concatenate(v)[order] for s, v in slot_parts.items()},
            "updates": np.concatenate(updates)[order], "per_server": per}


def read_tables(source, *, slots: bool = True) -> tuple[dict, dict]:
    """Every table (and optimizer slot) of a source, in original key order.

    Parameters
    ----------
    source : Source or path-like
        A :class:`Source` or anything :func:`resolve` accepts.
    slots : bool
        Also read the optimizer slots (checkpoints only; model files have none).

    Returns
    -------
    tables : dict of str -> ndarray (num_keys, dim)
        Row ``k`` holds key ``k``. A dynamic table ``NAME`` gives ``NAME`` (the rows of the
        keys stored) and ``NAME_keys`` (int64, ascending) beside it.
    slot_arrays : dict of str -> dict of str -> ndarray
        ``slot_arrays[table][slot]``, same order and shape as the table.

    Raises
    ------
    AnalysisError
        If a dataset cannot be read or a checkpoint's keys are not a permutation.
    """
    src = source if isinstance(source, Source) else resolve(source)
    tables, slot_arrays = {}, {}
    if src.kind == "model":
        try:
            with h5py.File(src.path, "r") as f:
                for name, d in f.items():
                    if isinstance(d, h5py.Dataset):
                        tables[name] = d[()]
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{src.path}: unreadable model file ({_one_line(e)})") from None
        return tables, slot_arrays
    mpath = src.path / ckpt.MANIFEST
    try:
        with h5py.File(mpath, "r") as f:
            for name, part in src.meta["partition"].items():
                if part.get("storage") == "hash":     # keys beside the rows, ascending
                    d = read_dynamic(src.path, src.meta, name)
                    tables[name], tables[f"{name}_keys"] = d["rows"], d["keys"]
                    if slots:
                        slot_arrays[name] = d["slots"]
                    continue
                keys = f[f"tables/{name}_keys"][()]
                tables[name] = _unpermute(f[f"tables/{name}"][()], keys, f"{mpath}: table {name!r}")
                if slots:
                    slot_arrays[name] = {
                        s: _unpermute(f[f"slots/{name}/{s}"][()], keys, f"{mpath}: slot {name}/{s}")
                        for s in part.get("slots", [])}
    except (OSError, KeyError, ValueError) as e:
        raise AnalysisError(f"{mpath}: cannot read the tables ({_one_line(e)})") from None
    return tables, slot_arrays
