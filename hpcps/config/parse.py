"""From job-file text to a validated :class:`~hpcps.config.sections.JobConfig`: TOML, then
the keys (:mod:`hpcps.config.schema`), the rules between them (:mod:`hpcps.config.rules`) and
the files they name (:mod:`hpcps.config.files`); every problem found is reported at once, in
the order of the file. No MPI.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from hpcps.config import files, rules
from hpcps.config.errors import raise_all
from hpcps.config.schema import Checker, show, toml_error
from hpcps.config.sections import (SECTIONS, TOP, CheckpointConfig, ClusterConfig, CommConfig,
                                   ConsistencyConfig, DataConfig, ElasticConfig,
                                   EvaluateConfig, FaultToleranceConfig, JobConfig,
                                   LbfgsConfig, ModelConfig, OptimizerConfig, OutputConfig,
                                   TrainConfig)

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


def _data(ck: Checker, doc: dict, dynamic: bool | None = False) -> DataConfig:
    table = ck.section(doc, "data")
    fmt = ck.value(table, "format", SECTIONS["data"]["format"], "data.format")
    keys = rules.data_keys(ck, table, fmt if ck.good("data.format") else None, dynamic)
    vals = ck.values(table, "data", keys)
    if fmt in ("adult_csv", "criteo") and ck.good("data.hash_bits"):
        if dynamic and "hash_bits" not in table:
            vals["hash_bits"] = 0            # a dynamic table: every feature its own 63-bit id
        elif vals.get("hash_bits") == 0 and dynamic is False:
            ck.fail("data.hash_bits", "0 (unhashed 63-bit feature ids) needs a dynamic table: "
                                      "set [model] storage = 'hash' (or [tables.weights] "
                                      "storage = 'hash')")
    path = vals.pop("path", None)
    path = files.resolve(ck, path, "data.path") if ck.good("data.path") else None
    test_path = vals.pop("test_path", None)
    if fmt in ("svmlight", "criteo") and ck.good("data.test_path"):
        test_path = files.resolve(ck, test_path, "data.test_path")
    else:
        test_path = None
    if fmt in rules.FORMAT_ONLY:
        files.check_inputs(ck, fmt, table, path, test_path)
    return DataConfig(format=fmt, path=path, test_path=test_path, **vals)


def _weights_dynamic(ck: Checker, doc: dict, tables_: dict, model: dict) -> bool | None:
    """Whether the (logistic) weights are a dynamic table, which needs no svmlight
    n_features (and lets hash_bits = 0 keep raw ids); None when a problem already reported
    leaves it open: a bad storage, or a [tables.NAME] the model lacks whose storage is not
    'array' (a misspelt [tables.weights]), so no requirement that follows from it is
    reported."""
    given = doc.get("tables", {})
    unknown_hash = isinstance(given, dict) and any(
        name not in tables_ and isinstance(t, dict) and t.get("storage", "array") != "array"
        for name, t in given.items())
    if unknown_hash or not ck.good("model.storage", "tables.weights.storage"):
        return None
    return tables_.get("weights", {}).get("storage", model["storage"]) == "hash"


def _build(ck: Checker, doc: dict, text: str, path: Path) -> JobConfig:
    ck.unknown_keys(doc, {**TOP, **SECTIONS, "tables": None}, "")
    name = ck.value(doc, "name", TOP["name"], "name")
    if ck.good("name") and (not _NAME_RE.fullmatch(name) or name in (".", "..")):
        ck.fail("name", "must match [A-Za-z0-9_.-]+ (and not be '.' or '..'), "
                        f"got {show(name)}")
    seed = ck.value(doc, "seed", TOP["seed"], "seed")
    tables = {s: ck.section(doc, s) for s in SECTIONS if s != "data"}
    vals = {s: ck.values(tables[s], s) for s in tables}
    rules.model(ck, vals["model"])
    tables_ = rules.tables(ck, doc, vals["model"])
    data = _data(ck, doc, _weights_dynamic(ck, doc, tables_, vals["model"]))
    rules.optimizer(ck, tables["optimizer"], vals["optimizer"])
    rules.consistency(ck, tables["consistency"], vals["consistency"])
    rules.fault_tolerance(ck, tables["fault_tolerance"], vals["fault_tolerance"],
                          vals["cluster"], vals["consistency"])
    use_lbfgs = rules.lbfgs(ck, doc, tables["lbfgs"], vals["lbfgs"], vals["cluster"],
                            vals["model"])
    rules.elastic(ck, tables["elastic"], vals["elastic"], vals["cluster"])
    rules.aggregate(ck, tables["comm"], vals["comm"], vals["cluster"], vals["consistency"],
                    vals["fault_tolerance"], vals["elastic"])
    rules.storage(ck, doc, tables_, vals["model"], vals["cluster"], vals["consistency"],
                  vals["fault_tolerance"])
    out_dir = vals["output"]["dir"] or f"runs/{name if ck.good('name') else 'job'}"
    if "\x00" in out_dir:
        ck.fail("output.dir", f"path contains a NUL character: {out_dir!r}")
        out_dir = "."
    output = OutputConfig(dir=(Path.cwd() / Path(out_dir).expanduser()).resolve())
    v = vals
    return JobConfig(name=name, seed=seed, cluster=ClusterConfig(**v["cluster"]), data=data,
                     model=ModelConfig(**v["model"]), optimizer=OptimizerConfig(**v["optimizer"]),
                     train=TrainConfig(**v["train"]),
                     consistency=ConsistencyConfig(**v["consistency"]),
                     comm=CommConfig(**v["comm"]), output=output,
                     evaluate=EvaluateConfig(**v["evaluate"]),
                     checkpoint=CheckpointConfig(**v["checkpoint"]),
                     fault_tolerance=FaultToleranceConfig(**v["fault_tolerance"]),
                     lbfgs=LbfgsConfig(**v["lbfgs"]) if use_lbfgs else LbfgsConfig(),
                     elastic=ElasticConfig(**v["elastic"]), path=path.resolve(), text=text,
                     tables=tables_)


def parse_job(text: str, path: str | os.PathLike) -> JobConfig:
    """Parse and validate job-file text.

    Parameters
    ----------
    text : str
        TOML text of the job file.
    path : str or os.PathLike
        Path of the job file: used in error messages and as the base directory of
        relative data paths. It need not exist.

    Returns
    -------
    JobConfig
        The validated configuration; ``JobConfig.path`` is `path` made absolute.

    Raises
    ------
    ConfigError
        On a TOML syntax error (naming the line, and the key of a key set twice), an
        unknown / missing / mistyped / out-of-range key, or a missing input file. Several
        problems are raised together as :class:`~hpcps.config.errors.ConfigErrors` (a
        ``ConfigError``), in the order of the file.
    """
    path = Path(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise toml_error(path, text, e) from None
    ck = Checker(path, text)
    cfg = _build(ck, doc, text, path)
    raise_all(ck.found())
    return cfg


def load_job(path: str | os.PathLike) -> JobConfig:
    """Read, parse and validate a job file.

    Parameters
    ----------
    path : str or os.PathLike
        The job file (TOML, UTF-8).

    Returns
    -------
    JobConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        If the file cannot be read, or for any error :func:`parse_job` reports.
    """
    path = Path(path)
    return parse_job(files.read_job_text(path), path)


def changed_keys(old_text: str, new_text: str) -> list[str]:
    """The dotted keys (``cluster.servers``) whose values differ between two job texts, set in
    one and not the other included, sorted; comments and layout do not count. A text that is
    not valid TOML is compared whole (``["<the job text>"]`` when they differ). Local."""
    def flat(doc, pre=""):
        out = {}
        for k, v in doc.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{pre}{k}."))
            else:
                out[pre + k] = v
        return out

    try:
        a, b = flat(tomllib.loads(old_text)), flat(tomllib.loads(new_text))
    except tomllib.TOMLDecodeError:
        return [] if old_text == new_text else ["<the job text>"]
    absent = object()
    return sorted(k for k in a.keys() | b.keys() if a.get(k, absent) != b.get(k, absent))
