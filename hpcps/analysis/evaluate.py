"""``hpcps eval``: test metrics of a checkpoint or model file on a data set (no MPI)."""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.core.paths import CKPT
from hpcps.data import DataError
from hpcps.data.textstream import data_files
from hpcps.analysis.sources import (AnalysisError, Source, _one_line, metric_label,
                                    read_tables, resolve)


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


#: Formats whose ``[data] path`` may be a file, a directory or a glob of files, each row scored
STREAMED = ("svmlight", "criteo")


def _run_dir(src: Source) -> Path | None:
    """The run directory a source belongs to (``runs/<name>``: given, the parent of a
    checkpoint's ``ckpt``, or the directory of a ``model.h5``), or None."""
    if src.run_dir is not None:
        return Path(src.run_dir)
    if src.kind == "checkpoint":
        return src.path.parent.parent if src.path.parent.name == CKPT else None
    return src.path.parent


def job_config(source, data, job=None):
    """The job configuration of a source, with its data redirected to ``data``.

    The job text is the ``config`` stored in the manifest or model file, or the file ``job``.
    Its ``data.path`` (and for svmlight and criteo jobs ``data.test_path``) is replaced by the
    absolute path of ``data`` and the result validated with :func:`hpcps.config.parse_job`, whose
    ``path`` is the manifest (so other relative paths resolve against the checkpoint
    directory) or the job file. svmlight and criteo data is read streamed (``data.stream =
    true``, no ``max_rows``: every row, in order, plain or compressed, whatever the job's
    setting); a problem of ``data`` the job check finds is raised naming ``--data``.

    Parameters
    ----------
    source : Source or path-like
        Anything :func:`resolve` accepts.
    data : path-like
        Evaluation data: for svmlight and criteo jobs a file, directory or glob pattern of
        files in the job's format (:func:`hpcps.data.textstream.data_files`), every row
        scored; the Adult CSV for adult_csv jobs; a file written by ``hpcps data prepare``
        for prepared jobs.
    job : path-like, optional
        A job file to use instead of the stored configuration.

    Returns
    -------
    hpcps.config.JobConfig

    Raises
    ------
    AnalysisError
        If ``data`` or ``job`` cannot be read (``"--data DATA: ..."`` for a data file the
        job check refuses), or there is no stored configuration.
    hpcps.config.ConfigError
        If the configuration is invalid.
    """
    from hpcps.config import ConfigError, parse_job

    src = source if isinstance(source, Source) else resolve(source)
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
    run_dir = _run_dir(src)
    out = doc.setdefault("output", {})
    if run_dir is not None and isinstance(out, dict):
        # a streamed data set's line index is cached in the output directory: the source's
        # run, not a directory of that name under the current one (found 2026-12-05)
        out["dir"] = str(run_dir.resolve())
    if section.get("format") in STREAMED:     # a file, directory or glob, as in the job
        try:
            data_files(data)
        except DataError as e:
            raise AnalysisError(str(e)) from None
        section["path"] = section["test_path"] = os.path.abspath(data)
        # read in order on this one process: streamed (hpcps.data.lines.in_chunks), whatever
        # the job's stream setting, so that a compressed, large or many-file --data is read
        # as it is (a trial: an in-memory job's `stream = false` refused test.svm.gz, naming
        # a line of model.h5); every row scored, so no max_rows of the job's
        section["stream"] = True
        section.pop("max_rows", None)
    else:
        if not Path(data).is_file():
            raise AnalysisError(f"{data}: no such data file")
        section["path"] = str(Path(data).resolve())
    try:
        return parse_job(toml_text(doc), where)
    except ConfigError as e:
        # a problem of the --data file is the user's argument's, not a key of the stored job
        # (model.h5 or a manifest: not edited by hand)
        bad = [x for x in e.errors if x.key in _DATA_KEYS]
        if bad:
            raise AnalysisError(f"--data {data}: {bad[0].message}") from None
        raise


#: The job keys ``--data`` replaces (:func:`job_config`)
_DATA_KEYS = ("data.path", "data.test_path")


def _model_for(cfg, where):
    """The job's model (:func:`hpcps.models.make_model`); load errors become AnalysisError."""
    from hpcps.models import ModelLoadError, make_model

    from hpcps.models.load import apply_storage

    try:
        model = make_model(cfg)
    except ModelLoadError as e:
        raise AnalysisError(f"{where}: {_one_line(e)} (hpcps eval imports a user model as "
                            "hpcps run does: set PYTHONPATH as for the run)") from None
    declared = model.tables

    def tables():                       # with the job's storage (dynamic tables)
        return apply_storage(cfg, declared())

    model.tables = tables
    return model


def _check_tables(model, tables: dict, src, cfg) -> None:
    """Every table the job's model declares is in ``tables`` with the declared shape."""
    from hpcps.config import ConfigError

    try:
        specs = [spec for spec, _ in model.tables()]
    except (ValueError, TypeError, ConfigError) as e:
        raise AnalysisError(f"{cfg.path}: the model's tables cannot be built ({_one_line(e)})") from None
    missing = [s.name for s in specs if s.name not in tables]
    if missing:
        raise AnalysisError(f"{src.path}: no table(s) {missing} (has {sorted(tables)}); not "
                            f"the tables of a {model.name!r} model as the job {cfg.path} defines it")
    for s in specs:
        if s.dynamic:                   # the keys stored beside the rows
            keys = tables.get(f"{s.name}_keys")
            if keys is None or keys.shape[0] != tables[s.name].shape[0] or \
                    tables[s.name].shape[1:] != (s.dim,):
                raise AnalysisError(f"{src.path}: table {s.name!r} is dynamic in the job "
                                    f"{cfg.path} but the source has no {s.name}_keys of its "
                                    f"rows (a fixed table's model or checkpoint?)")
            continue
        if f"{s.name}_keys" in tables and src.kind == "model":
            raise AnalysisError(f"{src.path}: table {s.name!r} was trained as a dynamic table "
                                f"(storage 'hash') but the job {cfg.path} declares it fixed")
        have, want = tuple(tables[s.name].shape), (int(s.num_keys), int(s.dim))
        if have != want:
            raise AnalysisError(f"{src.path}: table {s.name!r} has shape {have} but the job "
                                f"{cfg.path} makes it {want} "
                                f"({_SIZE_HINT.get(cfg.data.format, 'other data or job?')})")


_SIZE_HINT = {"svmlight": "n_features; wrong --job?", "adult_csv": "hash_bits; wrong --job?",
              "prepared": "sizes of the data file; other --data or --job?"}


class _Rows:
    """Rows of the tables by key, as a parameter server's pull returns them; a dynamic
    table's absent key gets its initial value (``dynamic``: name -> (TableSpec, seed))."""

    def __init__(self, tables: dict, dynamic: dict | None = None):
        self.tables = tables
        self.dynamic = dynamic or {}

    def pull(self, keys: dict) -> dict:
        return {t: self._rows(t, np.asarray(k)) for t, k in keys.items()}

    def _rows(self, t, k):
        if t not in self.dynamic:
            return self.tables[t][k]
        spec, seed = self.dynamic[t]
        stored, rows = self.tables[f"{t}_keys"], self.tables[t]
        pos = np.searchsorted(stored, k)
        pos = np.minimum(pos, max(stored.size - 1, 0))
        hit = (stored[pos] == k) if stored.size else np.zeros(k.shape, dtype=bool)
        out = spec.initial_rows(k, seed).astype(rows.dtype, copy=False)
        out[hit] = rows[pos[hit]]
        return out


def evaluate(source, data, job=None) -> dict:
    """Test metrics of the model of a source on a data set, as training evaluates an epoch.

    The job's model (``[model] type``: a built-in model or a user model, imported as
    ``hpcps run`` imports it) is built from the job configuration (:func:`job_config`), and
    its ``load("test", 0, 1)``, ``batch_keys``, ``predict`` and ``metrics``
    (:mod:`hpcps.models.base`) score the test rows with the source's tables
    (:func:`hpcps.models.local.evaluate`). Which rows are test rows follows the data format:
    an svmlight job scores every row of ``data`` (feature count and index base from the job);
    an adult_csv job reads ``data`` as the Adult CSV and scores the job's own test split
    (``test_fraction``, ``split_seed``, ``max_rows``, featurizer settings); a prepared job
    (``hpcps data prepare``: MovieLens for ``mf``, Fashion-MNIST for ``mlp``) scores the
    file's ``test`` split (``max_rows`` applies as in training).

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
        ``source`` (:class:`Source`), ``data`` (Path), ``format`` (the job's data format),
        ``model`` (the model's name), ``primary`` (its primary metric), ``rows`` (test rows
        scored), ``positives`` (rows labelled 1 when every label is 0 or 1, else None) and
        ``metrics``: the model's ``metrics`` without ``n`` (dict of str -> float, e.g.
        ``logloss``, ``auc``, ``accuracy`` for logistic; ``mse``, ``rmse``, ``mae`` for mf).

    Raises
    ------
    AnalysisError
        If the model cannot be imported, the source's tables are not those of the job's
        model (missing, or another shape), a model file's svmlight ``index_base`` differs
        from the job's, or the data set has no test row.
    hpcps.config.ConfigError, hpcps.data.DataError
        For an invalid configuration or malformed data.
    """
    from hpcps.models.local import evaluate as score

    src = source if isinstance(source, Source) else resolve(source)
    cfg = job_config(src, data, job)
    model = _model_for(cfg, cfg.path)
    tables, _ = read_tables(src, slots=False)
    _check_tables(model, tables, src, cfg)
    stored = src.meta.get("index_base", -1) if src.kind == "model" else -1
    if cfg.data.format == "svmlight" and stored in (0, 1) and cfg.data.index_base != stored:
        raise AnalysisError(f"{src.path}: the model was trained on {stored}-based svmlight "
                            f"indices but the job {cfg.path} reads them {cfg.data.index_base}-"
                            "based (data.index_base); the test file must be read as the "
                            "training file was")
    X, y = model.load("test", 0, 1)
    if X.shape[0] == 0:
        raise AnalysisError(f"{data}: no test rows to evaluate")
    dyn = {s.name: (s, cfg.seed) for s, _ in model.tables() if s.dynamic}
    scored = []
    m = dict(score(model, _Rows(tables, dyn), X, y, labels=scored))
    yv = scored[0]
    n = int(m.pop("n", yv.shape[0]))
    binary = yv.ndim == 1 and bool(np.all((yv == 0) | (yv == 1)))
    return {"source": src, "data": Path(data), "format": cfg.data.format, "model": model.name,
            "primary": model.primary_metric, "rows": n,
            "positives": int(np.count_nonzero(yv)) if binary else None,
            "metrics": {k: float(v) for k, v in m.items()}}


_SPLIT = {"svmlight": "all rows", "criteo": "all rows", "adult_csv": "the job's test split",
          "prepared": "the file's test split"}


def format_evaluate(res: dict) -> str:
    """One-paragraph text of an :func:`evaluate` result.

    Parameters
    ----------
    res : dict
        As returned by :func:`evaluate`.

    Returns
    -------
    str
        Three lines: the source; the data, its rows (and positives for 0/1 labels); every
        metric of the model (labels of :func:`hpcps.analysis.sources.metric_label`).
    """
    split = _SPLIT.get(res["format"], "its test split")
    pos = "" if res.get("positives") is None else f", {res['positives']:,} positive"
    values = "  ".join(f"{metric_label(k)} {v:.6f}" for k, v in res["metrics"].items())
    return (f"{res['source'].label}\n"
            f"data {res['data']} ({res['format']}, {split}): {res['rows']:,} rows{pos}\n"
            f"model {res['model']}: {values}")
