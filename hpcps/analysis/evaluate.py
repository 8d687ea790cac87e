"""``hpcps eval``: test metrics of a checkpoint or model file on a data set (no MPI)."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.analysis.sources import AnalysisError, Source, _one_line, read_tables, resolve


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
