"""Offline analysis of checkpoints, model files and runs: inspect, eval, export, plot, diff.

Everything here runs in a single process without MPI (h5py, numpy, matplotlib; never
``mpi4py``), so it works on a login node or a laptop with a copied run directory. The
``hpcps inspect|eval|export|plot|diff`` commands (:mod:`hpcps.cli.analysis`) are thin
wrappers around the public functions below.

Sources
-------
A *source* names one set of model parameters (:func:`resolve`):

* a checkpoint directory ``runs/NAME/ckpt/step-XXXXXXXX/`` or its ``manifest.h5`` — checked
  with :func:`hpcps.checkpoint.verify` (every shard present, with the size and checksum the
  manifest records) before anything is read;
* a run directory ``runs/NAME/`` — its newest valid checkpoint (invalid newer ones are
  listed with the reason), or its final ``model.h5`` if no checkpoint is valid;
* a final model file ``runs/NAME/model.h5`` (:mod:`hpcps.runtime.output`).

Key order
---------
Checkpoint shards store sparse tables in *permuted* key order (:mod:`hpcps.core.tables`); the
manifest's virtual datasets ``tables/<name>`` and ``tables/<name>_keys`` give the rows and
each row's original key, so :func:`read_tables` un-permutes with ``out[keys] = rows``. Every
table this module returns or writes is in **original key order** (row ``k`` is key ``k``),
like the model file.

Errors
------
Every expected failure (missing or corrupt file, wrong kind of file, mismatched job) is an
:class:`AnalysisError`, :class:`hpcps.checkpoint.CheckpointError`,
:class:`hpcps.config.ConfigError` or :class:`hpcps.data.DataError` whose one-line message
names the file; h5py exceptions are never let through.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from pathlib import Path

import h5py
import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.core.files import make_temp

__all__ = [
    "AnalysisError",
    "Source",
    "resolve",
    "checkpoint_status",
    "array_stats",
    "read_tables",
    "inspect",
    "format_inspect",
    "job_config",
    "toml_text",
    "evaluate",
    "format_evaluate",
    "export_npz",
    "load_metrics",
    "plot_run",
    "diff",
    "format_diff",
]

MODEL_FILE = "model.h5"
METRICS_FILE = "metrics.json"
#: Separator between table and slot name in exported arrays (``weights__accumulator``).
SLOT_SEP = "__"
_BLOCK_ROWS = 1 << 20
_STEP_DIR_RE = re.compile(r"^step-\d{8,}$")


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
    a : ndarray or h5py.Dataset
        At least one-dimensional; blocks ``a[i:i + block_rows]`` are read one at a time,
        so a large HDF5 dataset is never loaded whole.
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
    if len(a.shape) == 0:
        raise ValueError("array_stats needs an array with at least one dimension")
    nnz = nonfinite = finite = 0
    sumsq = total = 0.0
    lo, hi = math.inf, -math.inf
    for i in range(0, a.shape[0], block_rows):
        x = np.asarray(a[i:i + block_rows], dtype=np.float64)
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
    return {"shape": tuple(int(n) for n in a.shape), "dtype": str(a.dtype),
            "size": int(np.prod(a.shape)), "nonzeros": nnz, "nonfinite": nonfinite,
            "l2": math.sqrt(sumsq) if finite else nan, "min": lo if finite else nan,
            "max": hi if finite else nan, "mean": total / finite if finite else nan}


def _unpermute(rows: np.ndarray, keys: np.ndarray, where: str) -> np.ndarray:
    n = rows.shape[0]
    keys = np.asarray(keys, dtype=np.int64)
    if keys.shape != (n,) or (n and (keys.min() < 0 or keys.max() >= n)) or \
            not np.all(np.bincount(keys, minlength=n) == 1):
        raise AnalysisError(f"{where}: the row keys are not a permutation of 0..{n - 1} "
                            "(a shard file unreadable through the manifest's virtual dataset?)")
    out = np.empty_like(rows)
    out[keys] = rows
    return out


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
        Row ``k`` holds key ``k``.
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
                keys = f[f"tables/{name}_keys"][()]
                tables[name] = _unpermute(f[f"tables/{name}"][()], keys, f"{mpath}: table {name!r}")
                if slots:
                    slot_arrays[name] = {
                        s: _unpermute(f[f"slots/{name}/{s}"][()], keys, f"{mpath}: slot {name}/{s}")
                        for s in part.get("slots", [])}
    except (OSError, KeyError, ValueError) as e:
        raise AnalysisError(f"{mpath}: cannot read the tables ({_one_line(e)})") from None
    return tables, slot_arrays


# ---------------------------------------------------------------------------- inspect

_KNOWN_ATTRS = {"format", "hpcps_version", "job_name", "config", "step", "epoch", "step_in_epoch",
                "steps_per_epoch", "n_servers", "n_workers", "created", "rng", "shards", "workers",
                "history", "partition", "num_features", "index_base"}


def inspect(path) -> dict:
    """Describe a checkpoint, run or model file: position, layout, per-table statistics.

    Parameters
    ----------
    path : path-like
        Anything :func:`resolve` accepts.

    Returns
    -------
    dict
        ``source`` (:class:`Source`), ``integrity`` (str), ``tables`` (dict of name ->
        :func:`array_stats` plus ``sparse``, ``multiplier``, ``server_rows`` for checkpoints and
        ``slots``: dict of slot name -> :func:`array_stats`), ``extra`` (other manifest
        attributes, e.g. ``epoch_plan``).

    Raises
    ------
    AnalysisError
        As :func:`resolve`, or if a table cannot be read.
    """
    src = resolve(path)
    tables = {}
    if src.kind == "checkpoint":
        m = src.meta
        mpath = src.path / ckpt.MANIFEST
        try:
            with h5py.File(mpath, "r") as f:
                for name, part in m["partition"].items():
                    st = array_stats(f[f"tables/{name}"])
                    ranges = np.asarray(part["ranges"]).reshape(-1, 2)
                    st.update(sparse=bool(part.get("sparse")), multiplier=part.get("multiplier"),
                              server_rows=[int(b - a) for a, b in ranges],
                              slots={s: array_stats(f[f"slots/{name}/{s}"]) for s in part.get("slots", [])})
                    tables[name] = st
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{mpath}: cannot read the tables ({_one_line(e)})") from None
        nbytes = sum(int(b) for b in m["shards"]["bytes"])
        integrity = (f"OK: manifest and {len(m['shards']['files'])} shard(s), {nbytes / 1e6:,.2f} MB, "
                     f"sizes and {m['shards']['checksum']} checksums match the manifest")
    else:
        try:
            with h5py.File(src.path, "r") as f:
                for name, d in f.items():
                    if isinstance(d, h5py.Dataset):
                        tables[name] = dict(array_stats(d), slots={})
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{src.path}: unreadable model file ({_one_line(e)})") from None
        integrity = "readable: every table read in full (model files carry no checksums)"
    extra = {k: v for k, v in src.meta.items() if k not in _KNOWN_ATTRS}
    return {"source": src, "integrity": integrity, "tables": tables, "extra": extra}


def _g(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _clocks(values) -> str:
    v = [int(x) for x in np.asarray(values).reshape(-1)]
    if v and len(set(v)) == 1:
        return f"{v[0]} (all {len(v)} workers)"
    return str(v) if len(v) <= 16 else f"min {min(v)}, max {max(v)} over {len(v)} workers"


def format_inspect(report: dict) -> str:
    """Human-readable text of an :func:`inspect` report (several lines, no trailing newline).

    Parameters
    ----------
    report : dict
        As returned by :func:`inspect`.

    Returns
    -------
    str
    """
    src, m = report["source"], report["source"].meta
    lines = []
    if src.run_dir is not None:
        lines.append(f"run {src.run_dir}: {len(src.checkpoints)} checkpoint(s)")
        for s in src.checkpoints:
            lines.append(f"  {s['path'].name}  " + ("valid" if s["valid"] else f"INVALID: {s['error']}"))
        if src.kind == "model":
            lines.append(f"  no valid checkpoint; showing the final model file {src.path.name}")
        else:
            lines.append(f"  newest valid: {src.path.name}")
        lines.append("")
    if src.kind == "checkpoint":
        lines += [
            f"checkpoint   {src.path}",
            f"format       {m.get('format')} (written by hpcps {m.get('hpcps_version')})",
            f"job          {m.get('job_name')}",
            f"created      {m.get('created')}",
            f"step         {m.get('step')}  (epoch {m.get('epoch')}, step_in_epoch "
            f"{m.get('step_in_epoch')}, steps_per_epoch {m.get('steps_per_epoch')})",
            f"servers      {m.get('n_servers')}",
            f"workers      {m.get('n_workers')}",
            f"clocks       {_clocks(m['workers'].get('clock', []))}",
        ]
        if "last_push_seq" in m["workers"]:
            lines.append(f"last push    {_clocks(m['workers']['last_push_seq'])}")
        hist = m.get("history") or []
        if hist:
            h = hist[-1]
            lines.append(f"history      {len(hist)} epoch(s); last: epoch {h.get('epoch')} test AUC "
                         f"{_g(h.get('test_auc'))}, test log-loss {_g(h.get('test_logloss'))}")
        else:
            lines.append("history      no finished epoch yet")
    else:
        lines += [
            f"model file   {src.path}",
            f"written by   hpcps {m.get('hpcps_version')}",
            f"job          {m.get('job_name')}",
            f"step         {m.get('step')}  (epoch {m.get('epoch')})",
            f"features     {m.get('num_features')} (index_base {m.get('index_base')})",
        ]
    for k, v in report["extra"].items():
        lines.append(f"{k:<12} {v}")
    lines.append(f"integrity    {report['integrity']}")
    lines.append("tables")
    for name, st in report["tables"].items():
        layout = ""
        if "server_rows" in st:
            kind = f"sparse, permuted (multiplier {st['multiplier']})" if st["sparse"] else "dense"
            layout = f"; {kind}; rows per server {st['server_rows']}"
        lines.append(f"  {name}: shape {st['shape']} {st['dtype']}{layout}")
        lines.append(f"    non-zeros {st['nonzeros']:,} of {st['size']:,}  L2 {_g(st['l2'])}  "
                     f"min {_g(st['min'])}  max {_g(st['max'])}  mean {_g(st['mean'])}"
                     + (f"  NON-FINITE {st['nonfinite']:,}" if st["nonfinite"] else ""))
        for sname, ss in st["slots"].items():
            lines.append(f"    slot {sname}: min {_g(ss['min'])}  mean {_g(ss['mean'])}  "
                         f"max {_g(ss['max'])}" + (f"  NON-FINITE {ss['nonfinite']:,}" if ss["nonfinite"] else ""))
        if not st["slots"] and src.kind == "checkpoint":
            lines.append("    no optimizer slots (sgd)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- eval

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    raise AnalysisError(f"{where}: cannot write a TOML value of type {type(v).__name__}")


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _toml_str(k)


def toml_text(doc: dict) -> str:
    """Write a parsed job document back as TOML text (``tomllib.loads`` gives ``doc`` again).

    Parameters
    ----------
    doc : dict
        Tables (dicts, nested to any depth) of strings, integers, floats, booleans and
        arrays of those — what a job file contains.

    Returns
    -------
    str

    Raises
    ------
    AnalysisError
        For a value TOML cannot hold in this writer (e.g. a datetime).
    """
    lines: list[str] = []

    def table(d: dict, prefix: tuple) -> None:
        subs = []
        for k, v in d.items():
            if isinstance(v, dict):
                subs.append((k, v))
            else:
                lines.append(f"{_toml_key(k)} = {_toml_value(v, '.'.join(prefix + (k,)))}")
        for k, v in subs:
            lines.append("")
            lines.append("[" + ".".join(_toml_key(x) for x in prefix + (k,)) + "]")
            table(v, prefix + (k,))

    table(doc, ())
    return "\n".join(lines) + "\n"


def job_config(source, data, job=None):
    """The job configuration of a source, with its data redirected to ``data``.

    The job text is the ``config`` stored in the manifest or model file, or the file ``job``.
    Its ``data.path`` (and for svmlight jobs ``data.test_path``) is replaced by the absolute
    path of ``data`` and the result validated with :func:`hpcps.config.parse_job`, whose
    ``path`` is the manifest (so other relative paths resolve against the checkpoint
    directory) or the job file.

    Parameters
    ----------
    source : Source or path-like
        Anything :func:`resolve` accepts.
    data : path-like
        Evaluation data: an svmlight file for svmlight jobs, the Adult CSV for adult_csv jobs.
    job : path-like, optional
        A job file to use instead of the stored configuration.

    Returns
    -------
    hpcps.config.JobConfig

    Raises
    ------
    AnalysisError
        If ``data`` or ``job`` cannot be read, or there is no stored configuration.
    hpcps.config.ConfigError
        If the configuration is invalid.
    """
    from hpcps.config import parse_job

    src = source if isinstance(source, Source) else resolve(source)
    data = Path(data)
    if not data.is_file():
        raise AnalysisError(f"{data}: no such data file")
    if job is not None:
        where = Path(job)
        try:
            text = where.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            raise AnalysisError(f"{where}: cannot read job file ({_one_line(e)})") from None
    else:
        where = src.path / ckpt.MANIFEST if src.kind == "checkpoint" else src.path
        text = src.config_text
        if not text.strip():
            raise AnalysisError(f"{where}: no job configuration stored (attribute 'config'); "
                                "give one with --job")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AnalysisError(f"{where}: job configuration is not valid TOML ({_one_line(e)})") from None
    section = doc.setdefault("data", {})
    if not isinstance(section, dict):
        raise AnalysisError(f"{where}: [data] is not a table")
    section["path"] = str(data.resolve())
    if section.get("format") == "svmlight":
        section["test_path"] = str(data.resolve())
    return parse_job(toml_text(doc), where)


def evaluate(source, data, job=None) -> dict:
    """Test metrics of the logistic model of a source on a data set.

    For an svmlight job every row of ``data`` is scored (feature count and index base from
    the job); for an adult_csv job ``data`` is the Adult CSV and the job's own test split
    (``test_fraction``, ``split_seed``, ``max_rows``, featurizer settings) is scored.

    Parameters
    ----------
    source : Source or path-like
        Anything :func:`resolve` accepts.
    data : path-like
        The data file.
    job : path-like, optional
        Job file to use instead of the stored configuration (:func:`job_config`).

    Returns
    -------
    dict
        ``source`` (:class:`Source`), ``data`` (Path), ``format``, ``rows``, ``positives``,
        ``logloss``, ``auc``, ``accuracy`` (:func:`hpcps.models.logistic_math.binary_metrics`).

    Raises
    ------
    AnalysisError
        If the model is not logistic, its tables are missing or do not match the job's
        feature count, a model file's ``index_base`` differs from the job's, or the data
        set is empty.
    hpcps.config.ConfigError, hpcps.data.DataError
        For an invalid configuration or malformed data.
    """
    from hpcps.data.source import load_split
    from hpcps.models.logistic_math import BIAS, WEIGHTS, batch_keys, binary_metrics, predict

    src = source if isinstance(source, Source) else resolve(source)
    cfg = job_config(src, data, job)
    if cfg.model.type != "logistic":
        raise AnalysisError(f"{src.path}: model type {cfg.model.type!r}; eval supports 'logistic'")
    tables, _ = read_tables(src, slots=False)
    missing = [t for t in (WEIGHTS, BIAS) if t not in tables]
    if missing:
        raise AnalysisError(f"{src.path}: no table(s) {missing} (has {sorted(tables)}); "
                            "not a logistic model")
    w, b = tables[WEIGHTS], tables[BIAS]
    if w.ndim != 2 or w.shape[1] != 1 or b.shape != (1, 1):
        raise AnalysisError(f"{src.path}: weights {w.shape} / bias {b.shape}, expected "
                            "(num_features, 1) / (1, 1)")
    if w.shape[0] != cfg.data.num_features:
        raise AnalysisError(f"{src.path}: weights has {w.shape[0]} rows but the job {cfg.path} has "
                            f"{cfg.data.num_features} features (wrong --job?)")
    stored = src.meta.get("index_base", -1) if src.kind == "model" else -1
    if cfg.data.format == "svmlight" and stored in (0, 1) and cfg.data.index_base != stored:
        raise AnalysisError(f"{src.path}: the model was trained on {stored}-based svmlight "
                            f"indices but the job {cfg.path} reads them {cfg.data.index_base}-"
                            "based (data.index_base); the test file must be read as the "
                            "training file was")
    X, y = load_split(cfg.data, "test", 0, 1)
    if X.shape[0] == 0:
        raise AnalysisError(f"{data}: no rows to evaluate")
    keys, local = batch_keys(X)
    p = predict(X, local, np.ascontiguousarray(w[keys, 0]), float(b[0, 0]))
    res = binary_metrics(y, p)
    return {"source": src, "data": Path(data), "format": cfg.data.format, "rows": res["n"],
            "positives": int(np.sum(y)), "logloss": res["logloss"], "auc": res["auc"],
            "accuracy": res["accuracy"]}


def format_evaluate(res: dict) -> str:
    """One-paragraph text of an :func:`evaluate` result.

    Parameters
    ----------
    res : dict
        As returned by :func:`evaluate`.

    Returns
    -------
    str
    """
    split = "all rows" if res["format"] == "svmlight" else "the job's test split"
    return (f"{res['source'].label}\n"
            f"data {res['data']} ({res['format']}, {split}): {res['rows']:,} rows, "
            f"{res['positives']:,} positive\n"
            f"log-loss {res['logloss']:.6f}  AUC {res['auc']:.6f}  accuracy {res['accuracy']:.6f}")


# ----------------------------------------------------------------------------- export

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


# ------------------------------------------------------------------------------- plot


def load_metrics(run) -> tuple[Path, dict]:
    """Read a run's ``metrics.json``.

    Parameters
    ----------
    run : path-like
        The run directory or the metrics file itself.

    Returns
    -------
    path : pathlib.Path
        The metrics file.
    metrics : dict
        ``{"epochs": [...], "summary": {...}, ...}`` (see :mod:`hpcps.runtime.output`).

    Raises
    ------
    AnalysisError
        If the file is missing, not JSON, or not a metrics object.
    """
    p = Path(run)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if p.is_dir():
        p = p / METRICS_FILE
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise AnalysisError(f"{p}: no such file (not a run directory?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AnalysisError(f"{p}: cannot read ({_one_line(e)})") from None
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(m, dict) or not isinstance(m.get("epochs", []), list) \
            or not isinstance(m.get("summary", {}), dict):
        raise AnalysisError(f"{p}: not an hpcps metrics file (expected an object with 'epochs' "
                            "and 'summary')")
    return p, m


def _col(epochs, key) -> np.ndarray:
    return np.array([np.nan if e.get(key) is None else float(e[key]) for e in epochs], dtype=np.float64)


def _staleness(h, where) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(h, list):
        x = np.arange(len(h))
        c = h
    elif isinstance(h, dict):
        try:
            pairs = sorted((int(k), v) for k, v in h.items())
        except ValueError:
            raise AnalysisError(f"{where}: summary.staleness_histogram keys must be integers "
                                "(staleness in clocks)") from None
        x = np.array([k for k, _ in pairs])
        c = [v for _, v in pairs]
    else:
        raise AnalysisError(f"{where}: summary.staleness_histogram must be a list of counts or an "
                            f"object staleness -> count, got {type(h).__name__}")
    try:
        counts = np.array(c, dtype=np.float64)
    except (TypeError, ValueError):
        raise AnalysisError(f"{where}: summary.staleness_histogram counts must be numbers") from None
    if counts.ndim != 1:
        raise AnalysisError(f"{where}: summary.staleness_histogram counts must be numbers")
    return x, counts


def plot_run(run, out=None) -> tuple[Path, list[str]]:
    """Plot a run's learning curves and communication load to an image file.

    Panels: train/test log-loss and test AUC against the epoch and against wall time
    (``seconds``); bytes in/out per server (``summary.servers``); the staleness histogram
    (``summary.staleness_histogram``: a list of counts indexed by staleness, or an object
    ``{"staleness": count}``) when present. Panels without data are left out. Uses
    matplotlib's Agg canvas (no display needed).

    Parameters
    ----------
    run : path-like
        Run directory or ``metrics.json``.
    out : path-like, optional
        Image file; the format follows its suffix (default and no suffix: PNG). Default
        ``<run dir>/curves.png``.

    Returns
    -------
    path : pathlib.Path
        The file written.
    panels : list of str
        Titles of the panels drawn.

    Raises
    ------
    AnalysisError
        If the metrics cannot be read, hold nothing to plot, or the format is not supported.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    mpath, m = load_metrics(run)
    epochs = [e for e in m.get("epochs", []) if isinstance(e, dict)]
    summary = m.get("summary") or {}
    servers = [s for s in summary.get("servers") or [] if isinstance(s, dict)]
    hist = summary.get("staleness_histogram")
    out = Path(out) if out is not None else mpath.parent / "curves.png"

    panels = []
    if epochs:
        ep, sec = _col(epochs, "epoch"), _col(epochs, "seconds")
        tr, te, auc = _col(epochs, "train_logloss"), _col(epochs, "test_logloss"), _col(epochs, "test_auc")
        for xs, xl in ((ep, "epoch"), (sec, "wall time (s)")):
            panels.append((f"log-loss vs {xl}", "loss", xs, xl, tr, te))
            panels.append((f"test AUC vs {xl}", "auc", xs, xl, auc, None))
    if servers:
        panels.append(("bytes per server", "bytes", None, None, None, None))
    if hist is not None:
        sx, sc = _staleness(hist, mpath)
        panels.append(("staleness histogram", "stale", sx, None, sc, None))
    if not panels:
        raise AnalysisError(f"{mpath}: nothing to plot (no epochs, no per-server summary)")

    fig = Figure(figsize=(11, 3.6 * ((len(panels) + 1) // 2)), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    fmt = out.suffix[1:].lower() or "png"
    if fmt not in canvas.get_supported_filetypes():
        raise AnalysisError(f"{out}: unsupported image format {fmt!r} "
                            f"(supported: {', '.join(sorted(canvas.get_supported_filetypes()))})")
    job = m.get("job") or mpath.parent.name
    fig.suptitle(f"hpcps run {job}")
    axes = fig.subplots((len(panels) + 1) // 2, 2, squeeze=False).reshape(-1)
    for ax, (title, kind, x, xl, a, b) in zip(axes, panels):
        ax.set_title(title)
        if xl == "epoch":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if kind == "loss":
            ax.plot(x, a, "o-", label="train (progressive)")
            ax.plot(x, b, "s-", label="test")
            ax.set_xlabel(xl)
            ax.set_ylabel("log-loss")
            ax.legend()
        elif kind == "auc":
            ax.plot(x, a, "o-", color="C2")
            ax.set_xlabel(xl)
            ax.set_ylabel("test AUC")
        elif kind == "bytes":
            idx = np.array([int(s.get("index", i)) for i, s in enumerate(servers)])
            bin_ = np.array([float(s.get("bytes_in", 0)) for s in servers]) / 1e6
            bout = np.array([float(s.get("bytes_out", 0)) for s in servers]) / 1e6
            ax.bar(idx - 0.2, bin_, 0.4, label="in (pushed to the server)")
            ax.bar(idx + 0.2, bout, 0.4, label="out (pulled from the server)")
            ax.set_xticks(idx)
            ax.set_xlabel("server")
            ax.set_ylabel("MB")
            ax.margins(y=0.3)
            ax.legend(fontsize="small")
        else:
            ax.bar(x, a, 0.8, color="C3")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("staleness (clocks)")
            ax.set_ylabel("count")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    tmp = make_temp(out)                     # mode 0666 & ~umask
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format=fmt, dpi=100)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, [p[0] for p in panels]


# ------------------------------------------------------------------------------- diff


def diff(a, b) -> dict:
    """Per-table differences between two sources, in original key order.

    Tables and optimizer slots (``<table>__<slot>``) present in both sources are compared
    elementwise in float64; NaN equals NaN.

    Parameters
    ----------
    a, b : Source or path-like
        Anything :func:`resolve` accepts (a checkpoint can be compared with a model file).

    Returns
    -------
    dict
        ``a``, ``b`` (:class:`Source`) and ``rows``: list of dict with ``name``,
        ``shape_a``, ``shape_b`` (tuple or None when absent) and ``status``: ``"compared"``
        (then also ``max_abs``, ``mean_abs``, ``differing``, ``size``), ``"shape mismatch"``,
        ``"only in A"`` or ``"only in B"``.

    Raises
    ------
    AnalysisError
        If either source cannot be read.
    """
    sa = a if isinstance(a, Source) else resolve(a)
    sb = b if isinstance(b, Source) else resolve(b)

    def flat(src):
        tables, slots = read_tables(src)
        out = dict(tables)
        for t, d in slots.items():
            out.update({f"{t}{SLOT_SEP}{s}": v for s, v in d.items()})
        return out

    ta, tb = flat(sa), flat(sb)
    rows = []
    for name in list(ta) + [n for n in tb if n not in ta]:
        x, y = ta.get(name), tb.get(name)
        row = {"name": name, "shape_a": None if x is None else tuple(x.shape),
               "shape_b": None if y is None else tuple(y.shape)}
        if x is None or y is None:
            row["status"] = "only in A" if y is None else "only in B"
        elif x.shape != y.shape:
            row["status"] = "shape mismatch"
        else:
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            same = (x64 == y64) | (np.isnan(x64) & np.isnan(y64))
            d = np.where(same, 0.0, np.abs(x64 - y64))
            row.update(status="compared", size=int(d.size), differing=int(d.size - np.count_nonzero(same)),
                       max_abs=float(d.max()) if d.size else 0.0,
                       mean_abs=float(d.mean()) if d.size else 0.0)
        rows.append(row)
    return {"a": sa, "b": sb, "rows": rows}


def format_diff(res: dict) -> str:
    """Text table of a :func:`diff` result.

    Parameters
    ----------
    res : dict
        As returned by :func:`diff`.

    Returns
    -------
    str
    """
    lines = [f"A: {res['a'].label}", f"B: {res['b'].label}"]
    width = max([len(r["name"]) for r in res["rows"]] + [5])
    lines.append(f"{'table':<{width}}  {'shape':<16} {'max |A-B|':>12} {'mean |A-B|':>12}  differing")
    for r in res["rows"]:
        if r["status"] == "compared":
            lines.append(f"{r['name']:<{width}}  {str(r['shape_a']):<16} {r['max_abs']:>12.6g} "
                         f"{r['mean_abs']:>12.6g}  {r['differing']:,} of {r['size']:,}")
        elif r["status"] == "shape mismatch":
            lines.append(f"{r['name']:<{width}}  shapes differ: A {r['shape_a']} vs B {r['shape_b']}; "
                         "not compared")
        else:
            lines.append(f"{r['name']:<{width}}  {r['status']}")
    return "\n".join(lines)
