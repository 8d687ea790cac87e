"""Tests for hpcps.config: job-file parsing and validation."""

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcps import config as C
from hpcps.config import (ConfigError, check_output_writable, check_world, load_job, parse_job,
                          to_dict)

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def jobdir(tmp_path):
    """tmp/jobs/ (job files) and tmp/data/ (data files) with an Adult CSV and svmlight files."""
    (tmp_path / "jobs").mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "adult.csv").write_text("39, State-gov, 77516\n")
    (data / "train.svm").write_text("1 1:1 3:0.5\n")
    (data / "test.svm").write_text("0 2:1\n")
    return tmp_path


ADULT = """\
name = "t"
[data]
format = "adult_csv"
path = "../data/adult.csv"
"""

SVM = """\
name = "s"
[data]
format = "svmlight"
path = "../data/train.svm"
test_path = "../data/test.svm"
index_base = 1
n_features = 123
"""


def job(jobdir, text=ADULT, name="x.toml"):
    """Write `text` to jobs/<name> and load it."""
    p = jobdir / "jobs" / name
    p.write_text(text)
    return load_job(p)


def with_key(text, dotted, value):
    """Append `dotted = value` (value is raw TOML) to the right section of `text`."""
    if "." not in dotted:
        return f"{dotted} = {value}\n" + text
    section, key = dotted.split(".", 1)
    if f"[{section}]\n" in text:
        return text.replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n", 1)
    return text + f"\n[{section}]\n{key} = {value}\n"


def error(jobdir, text, name="x.toml"):
    with pytest.raises(ConfigError) as ei:
        job(jobdir, text, name)
    return ei.value


# ------------------------------------------------------------------------ shipped jobs


def test_shipped_adult_lr_loads():
    cfg = load_job(REPO / "jobs" / "adult_lr.toml")
    assert cfg.name == "adult_lr"
    assert cfg.data.format == "adult_csv"
    assert cfg.data.path == (REPO / "data" / "adult.csv.gz").resolve()
    assert cfg.data.path.is_file()
    assert cfg.data.test_path is None
    assert (cfg.data.hash_bits, cfg.data.numeric_bins, cfg.data.crosses) == (20, 8, True)
    assert cfg.data.test_fraction == 0.2
    assert cfg.data.num_features == 2**20
    assert cfg.cluster.servers == 1
    assert cfg.optimizer.name == "adagrad" and cfg.optimizer.learning_rate == 0.1
    assert (cfg.train.epochs, cfg.train.batch_size) == (3, 256)
    assert cfg.evaluate.sklearn_baseline is True
    assert cfg.path == (REPO / "jobs" / "adult_lr.toml").resolve()
    assert cfg.text == (REPO / "jobs" / "adult_lr.toml").read_text()
    json.dumps(to_dict(cfg))
    check_world(cfg, 2)


def test_shipped_adult_lr_comments_every_key():
    for line in (REPO / "jobs" / "adult_lr.toml").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, f"uncommented key: {line!r}"


def shipped_jobs() -> list:
    """The job files the repository ships: those git tracks under jobs/ (a user's own copies
    there are not ours to check; found by a trial), every jobs/*.toml outside a git clone."""
    files = sorted((REPO / "jobs").glob("*.toml"))
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "jobs"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return files
    tracked = {REPO / line for line in out.stdout.splitlines() if line.endswith(".toml")}
    return [p for p in files if p in tracked] if out.returncode == 0 and tracked else files


def test_shipped_jobs_all_load():
    jobs = shipped_jobs()
    assert jobs
    for p in jobs:
        try:
            load_job(p)
        except C.ConfigError as e:     # prepared data sets are written by `hpcps data prepare`
            assert e.key == "data.path" and "hpcps data prepare" in e.message, e


# ---------------------------------------------------------------------------- defaults


def test_defaults_filled(jobdir, monkeypatch):
    monkeypatch.chdir(jobdir)
    cfg = job(jobdir)
    assert cfg.name == "t" and cfg.seed == 0
    assert cfg.cluster == C.ClusterConfig(servers=1)
    d = cfg.data
    assert (d.format, d.test_path, d.index_base, d.n_features) == ("adult_csv", None, None, None)
    assert (d.test_fraction, d.split_seed, d.max_rows) == (0.2, 0, 0)
    assert (d.hash_bits, d.numeric_bins, d.crosses) == (20, 8, True)
    assert d.num_features == 2**20
    assert cfg.model == C.ModelConfig(type="logistic", l2=0.0, dtype="float32")
    assert cfg.optimizer == C.OptimizerConfig(name="adagrad", learning_rate=0.1,
                                              initial_accumulator=0.1, eps=1e-8)
    assert cfg.train == C.TrainConfig(epochs=5, batch_size=256, shuffle=True, max_steps=0,
                                      progress_seconds=5.0)
    assert cfg.consistency.model == "bsp"
    assert cfg.comm.max_message_bytes == 1073741824
    assert cfg.output.dir == (jobdir / "runs" / "t").resolve()
    assert cfg.evaluate == C.EvaluateConfig(sklearn_baseline=False, max_auc_gap=0.005)


def test_dataclass_defaults_match_schema(jobdir):
    """The dataclass defaults and the job-file defaults must not drift apart."""
    cfg = job(jobdir)
    for section in ("cluster", "model", "optimizer", "train", "consistency", "comm",
                    "evaluate"):
        value = getattr(cfg, section)
        assert value == type(value)(), section
    for f in dataclasses.fields(C.DataConfig):
        if f.default is not dataclasses.MISSING:
            assert getattr(cfg.data, f.name) == f.default, f.name


def test_float_key_types_are_float(jobdir):
    cfg = job(jobdir, with_key(with_key(ADULT, "optimizer.learning_rate", "1"),
                               "train.progress_seconds", "2"))
    assert cfg.optimizer.learning_rate == 1.0 and type(cfg.optimizer.learning_rate) is float
    assert type(cfg.train.progress_seconds) is float
    for v in (cfg.model.l2, cfg.optimizer.eps, cfg.data.test_fraction,
              cfg.evaluate.max_auc_gap):
        assert type(v) is float


def test_frozen(jobdir):
    cfg = job(jobdir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "y"


def test_svmlight(jobdir):
    cfg = job(jobdir, SVM)
    d = cfg.data
    assert d.format == "svmlight"
    assert d.path == (jobdir / "data" / "train.svm").resolve()
    assert d.test_path == (jobdir / "data" / "test.svm").resolve()
    assert (d.index_base, d.n_features, d.num_features) == (1, 123, 123)


@pytest.mark.parametrize("key, name", [("path", "train.svm.gz"), ("test_path", "test.svm.gz")])
def test_compressed_svmlight_without_streaming_is_a_job_file_error(jobdir, key, name):
    """In memory, workers read byte ranges of the file: caught at load (exit 2), not mid-read."""
    (jobdir / "data" / name).write_bytes(b"\x1f\x8b")
    text = SVM.replace(f'{key} = "../data/{name.split(".")[0]}.svm"', f'{key} = "../data/{name}"')
    e = error(jobdir, text.replace("[data]\n", "[data]\nstream = false\n"))
    assert e.key == f"data.{key}"
    assert "compressed svmlight file cannot be split into byte ranges" in str(e)
    assert f"gunzip -k {name}" in str(e) and "data.stream = false" in str(e)


def test_gzip_svmlight_streams_and_bz2_is_a_job_file_error(jobdir):
    """Streamed (the default for compressed files): gzip and zstd are read, bz2 is named."""
    (jobdir / "data" / "train.svm.gz").write_bytes(b"\x1f\x8b")
    (jobdir / "jobs" / "x.toml").write_text(SVM.replace('path = "../data/train.svm"',
                                                        'path = "../data/train.svm.gz"'))
    assert load_job(jobdir / "jobs" / "x.toml").data.path.name == "train.svm.gz"
    (jobdir / "data" / "test.svm.bz2").write_bytes(b"BZh")
    e = error(jobdir, SVM.replace('test_path = "../data/test.svm"',
                                  'test_path = "../data/test.svm.bz2"'))
    assert e.key == "data.test_path" and "bz2-compressed data is not read" in str(e)
    assert "bunzip2 -k test.svm.bz2" in str(e)


def test_text_kept_and_path_absolute(jobdir, monkeypatch):
    monkeypatch.chdir(jobdir)
    (jobdir / "jobs" / "x.toml").write_text(ADULT)
    cfg = load_job("jobs/x.toml")
    assert cfg.text == ADULT
    assert cfg.path.is_absolute() and cfg.path == (jobdir / "jobs" / "x.toml").resolve()


def test_to_dict(jobdir):
    cfg = job(jobdir, SVM)
    d = to_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    assert d["name"] == "s" and d["seed"] == 0
    assert d["data"]["path"] == str((jobdir / "data" / "train.svm").resolve())
    assert d["data"]["num_features"] == 123
    assert d["train"]["batch_size"] == 256
    assert d["output"]["dir"] == str(cfg.output.dir)
    assert d["path"] == str(cfg.path)
    assert "text" not in d
    assert set(d) == {f.name for f in dataclasses.fields(C.JobConfig)} - {"text"}


# ------------------------------------------------------------------------------ paths


def test_relative_data_path_is_relative_to_job_file(jobdir, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    cfg = job(jobdir)
    assert cfg.data.path == (jobdir / "data" / "adult.csv").resolve()


def test_job_file_in_subdirectory_relative_path(jobdir, monkeypatch):
    (jobdir / "jobs" / "sub").mkdir()
    text = ADULT.replace("../data/adult.csv", "../../data/adult.csv")
    cfg = job(jobdir, text, "sub/y.toml")
    assert cfg.data.path == (jobdir / "data" / "adult.csv").resolve()


def test_absolute_data_path(jobdir):
    p = (jobdir / "data" / "adult.csv").resolve()
    cfg = job(jobdir, ADULT.replace("../data/adult.csv", str(p)))
    assert cfg.data.path == p


def test_output_dir_relative_to_cwd(jobdir, monkeypatch, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    assert job(jobdir).output.dir == (cwd / "runs" / "t").resolve()
    cfg = job(jobdir, with_key(ADULT, "output.dir", '"out/a"'))
    assert cfg.output.dir == (cwd / "out" / "a").resolve()
    cfg = job(jobdir, with_key(ADULT, "output.dir", f'"{jobdir / "abs"}"'))
    assert cfg.output.dir == (jobdir / "abs").resolve()


def test_parse_job_uses_path_for_relative_paths(jobdir):
    cfg = parse_job(ADULT, jobdir / "jobs" / "not_written.toml")
    assert cfg.data.path == (jobdir / "data" / "adult.csv").resolve()
    assert cfg.text == ADULT


# ----------------------------------------------------------------------------- errors


def test_config_error_format_and_attributes(jobdir, monkeypatch):
    monkeypatch.chdir(jobdir)
    text = with_key(ADULT, "optimizer.learning_rate", "-0.1")
    (jobdir / "jobs" / "x.toml").write_text(text)
    line = 1 + [n for n, t in enumerate(text.splitlines()) if "-0.1" in t][0]
    with pytest.raises(ConfigError) as ei:
        load_job("jobs/x.toml")
    e = ei.value
    assert isinstance(e, ValueError)
    # path:line: key: message (the compilers' form: editors jump to the line)
    assert str(e) == f"jobs/x.toml:{line}: optimizer.learning_rate: must be > 0, got -0.1"
    assert e.path == Path("jobs/x.toml")
    assert e.key == "optimizer.learning_rate"
    assert e.message == "must be > 0, got -0.1"
    assert e.line == line
    e2 = pickle.loads(pickle.dumps(e))
    assert (str(e2), e2.path, e2.key, e2.message, e2.line) == (str(e), e.path, e.key, e.message,
                                                              e.line)


def test_config_error_line_found_in_the_file_or_left_out(jobdir, monkeypatch):
    """An error raised after the checker (here: the layout, ``check_world``) finds its key's
    line in the file itself; a key the file does not write, or a job given as text only,
    has none."""
    monkeypatch.chdir(jobdir)
    text = ADULT + "\n[cluster]\nservers = 4\n"
    (jobdir / "jobs" / "w.toml").write_text(text)
    e = ConfigError(Path("jobs/w.toml"), "cluster.servers", "too many")
    assert str(e) == f"jobs/w.toml:{len(text.splitlines())}: cluster.servers: too many"
    assert str(ConfigError(Path("jobs/w.toml"), "train.max_steps", "x")) == \
        "jobs/w.toml: train.max_steps: x"
    assert str(ConfigError(Path("jobs/none.toml"), "cluster.servers", "x")) == \
        "jobs/none.toml: cluster.servers: x"
    assert str(ConfigError(Path("jobs/w.toml"), None, "invalid")) == "jobs/w.toml: invalid"


def test_unknown_key_suggests_closest(jobdir, monkeypatch):
    monkeypatch.chdir(jobdir)
    (jobdir / "jobs" / "x.toml").write_text(with_key(ADULT, "train.batchsize", "3"))
    with pytest.raises(ConfigError) as ei:
        load_job("jobs/x.toml")
    assert str(ei.value) == (f"jobs/x.toml:{ei.value.line}: train.batchsize: unknown key "
                             "(did you mean 'batch_size'?)")
    assert ei.value.line > 0
    assert ei.value.key == "train.batchsize"


@pytest.mark.parametrize("dotted,value,hint", [
    ("optimizer.learningrate", "0.1", "did you mean 'learning_rate'?"),
    ("data.hashbits", "3", "did you mean 'hash_bits'?"),
    ("nmae", '"x"', "did you mean 'name'?"),
    ("trian.epochs", "3", None),  # unknown section → suggests 'train'
    ("train.zzz", "3", "valid keys: batch_size, epochs, max_nonfinite_steps, max_steps, progress_seconds, shuffle"),
    ("train.seed", "3", "'seed' is a top-level key"),
    ("epochs", "3", "'epochs' belongs in [train]"),
    ("optimizer.hash_bits", "3", "'hash_bits' belongs in [data]"),
])
def test_unknown_keys(jobdir, dotted, value, hint):
    e = error(jobdir, with_key(ADULT, dotted, value))
    if dotted.startswith("trian"):
        assert e.key == "trian" and "did you mean 'train'?" in e.message
    else:
        assert e.key == dotted
        assert e.message.startswith("unknown key") and hint in e.message


def test_nested_table_inside_section_is_unknown(jobdir):
    e = error(jobdir, ADULT + "\n[train.extra]\nx = 1\n")
    assert e.key == "train.extra" and "unknown key" in e.message


@pytest.mark.parametrize("before, after, key, line, hint", [
    # found by a trial: "tabels: unknown key" without the file's line (other keys had it)
    ("", '[tabels.weights]\nstorage = "hash"\n', "tabels", 6, "did you mean 'tables'?"),
    ("", "[trian.x]\ny = 1\n", "trian", 6, "did you mean 'train'?"),
    ("", "[train]\nextra.x = 1\n", "train.extra", 7, "valid keys:"),
    ('tabels.weights.storage = "hash"\n', "", "tabels", 1, "did you mean 'tables'?"),
])
def test_unknown_section_of_a_sub_table_header_names_its_line(jobdir, monkeypatch, before,
                                                              after, key, line, hint):
    """A section known only through ``[a.b]`` (or a dotted key ``a.b.c =``) has the line
    where it is opened, as every other unknown key."""
    monkeypatch.chdir(jobdir)
    (jobdir / "jobs" / "x.toml").write_text(before + ADULT + "\n" + after)
    with pytest.raises(ConfigError) as ei:
        load_job("jobs/x.toml")
    e = ei.value
    assert str(e).startswith(f"jobs/x.toml:{line}: {key}: unknown key ({hint}"), str(e)
    assert e.key == key and e.line == line


def test_key_lines_give_the_tables_a_header_or_dotted_key_opens():
    from hpcps.config.errors import key_lines

    lines = key_lines('a = 1\n[x.y.z]\nk = 2\n[s]\np.q = 3\n[x.y.w]\n')
    assert lines == {"a": 1, "x": 2, "x.y": 2, "x.y.z": 2, "x.y.z.k": 3, "s": 4, "s.p": 5,
                     "s.p.q": 5, "x.y.w": 6}


def test_section_not_a_table(jobdir):
    e = error(jobdir, "train = 3\n" + ADULT)
    assert e.key == "train" and "expected a table" in e.message and "integer" in e.message


@pytest.mark.parametrize("dotted,value,expected,got", [
    ("name", "3", "string", "integer"),
    ("seed", '"0"', "integer", "string"),
    ("seed", "1.5", "integer", "float"),
    ("cluster.servers", "2.0", "integer", "float"),
    ("data.hash_bits", '"20"', "integer", "string"),
    ("data.crosses", "1", "boolean", "integer"),
    ("data.crosses", '"yes"', "boolean", "string"),
    ("data.test_fraction", '"0.2"', "float", "string"),
    ("model.l2", "[0.1]", "float", "array"),
    ("model.dtype", "32", "string", "integer"),
    ("optimizer.learning_rate", "{ a = 1 }", "float", "table"),
    ("optimizer.name", "true", "string", "boolean"),
    ("train.epochs", "3.0", "integer", "float"),
    ("train.shuffle", "0", "boolean", "integer"),
    ("train.progress_seconds", "1979-05-27", "float", "date"),
    ("consistency.model", "1", "string", "integer"),
    ("comm.max_message_bytes", "1e9", "integer", "float"),
    ("output.dir", "1", "string", "integer"),
    ("evaluate.sklearn_baseline", '"true"', "boolean", "string"),
    ("evaluate.max_auc_gap", "false", "float", "boolean"),
])
def test_wrong_type(jobdir, dotted, value, expected, got):
    text = ADULT.replace('name = "t"\n', "") if dotted == "name" else ADULT
    e = error(jobdir, with_key(text, dotted, value))
    assert e.key == dotted
    assert e.message.startswith(f"expected {expected}, got {got}"), e.message


@pytest.mark.parametrize("dotted", [
    "seed", "cluster.servers", "data.max_rows", "data.hash_bits", "train.epochs",
    "train.batch_size", "train.max_steps", "comm.max_message_bytes",
])
def test_bool_is_not_int(jobdir, dotted):
    e = error(jobdir, with_key(ADULT, dotted, "true"))
    assert e.key == dotted and e.message == "expected integer, got boolean true"


@pytest.mark.parametrize("dotted", ["optimizer.learning_rate", "model.l2", "evaluate.max_auc_gap"])
def test_bool_is_not_float(jobdir, dotted):
    e = error(jobdir, with_key(ADULT, dotted, "true"))
    assert e.key == dotted and e.message == "expected float, got boolean true"


def test_duplicate_indices_key(jobdir):
    assert job(jobdir, SVM).data.duplicate_indices == "error"
    assert job(jobdir, SVM + 'duplicate_indices = "sum"\n').data.duplicate_indices == "sum"
    e = error(jobdir, SVM + 'duplicate_indices = "add"\n')
    assert e.key == "data.duplicate_indices"
    assert e.message == "must be one of 'error', 'sum', got 'add'"
    e = error(jobdir, ADULT + 'duplicate_indices = "sum"\n')
    assert e.key == "data.duplicate_indices" and "only with 'svmlight'" in e.message


def test_rma_fallback_only_with_rma_pulls(jobdir):
    assert job(jobdir, ADULT + '[consistency]\npull = "rma"\nrma_fallback = true\n'
               ).consistency.rma_fallback is True
    assert job(jobdir, ADULT).consistency.rma_fallback is False
    e = error(jobdir, ADULT + "[consistency]\nrma_fallback = true\n")
    assert e.key == "consistency.rma_fallback"
    assert e.message == "only used with pull = 'rma', not 'p2p'; remove it"


def test_bool_index_base_rejected(jobdir):
    e = error(jobdir, SVM.replace("index_base = 1", "index_base = true"))
    assert e.key == "data.index_base" and "expected integer, got boolean" in e.message


@pytest.mark.parametrize("dotted,value,message", [
    ("seed", "-1", "must be >= 0, got -1"),
    ("seed", str(2**63), f"must be <= {2**63 - 1}, got {2**63}"),
    ("cluster.servers", "0", "must be >= 1, got 0"),
    ("data.test_fraction", "0", "must be in (0, 1), got 0.0"),
    ("data.test_fraction", "1.0", "must be in (0, 1), got 1.0"),
    ("data.test_fraction", "-0.5", "must be in (0, 1), got -0.5"),
    ("data.split_seed", "-1", "must be >= 0, got -1"),
    ("data.max_rows", "-1", "must be >= 0, got -1"),
    ("data.hash_bits", "-1", "must be in [0, 40], got -1"),
    ("data.hash_bits", "0", "0 (unhashed 63-bit feature ids) needs a dynamic table"),
    ("data.hash_bits", "41", "must be in [0, 40], got 41"),
    ("data.numeric_bins", "1", "must be in [2, 256], got 1"),
    ("data.numeric_bins", "257", "must be in [2, 256], got 257"),
    ("data.format", '"csv"', "must be one of 'adult_csv', 'svmlight', 'prepared', 'criteo', got 'csv'"),
    ("data.format", '"svm_light"', "(did you mean 'svmlight'?)"),
    ("model.type", '"linear"', "must be one of 'logistic', 'mf', 'mlp' or a user model 'package.module:ClassName', got 'linear'"),
    ("model.l2", "-0.001", "must be >= 0, got -0.001"),
    ("model.l2", "inf", "must be a finite number, got inf"),
    ("model.dtype", '"float16"', "must be one of 'float32', 'float64', got 'float16'"),
    ("optimizer.name", '"rmsprop"', "must be one of 'sgd', 'adagrad', 'adam', 'ftrl', got 'rmsprop'"),
    ("optimizer.name", '"ftlr"', "(did you mean 'ftrl'?)"),
    ("optimizer.name", '"adagard"', "(did you mean 'adagrad'?)"),
    ("optimizer.learning_rate", "0", "must be > 0, got 0.0"),
    ("optimizer.learning_rate", "-0.1", "must be > 0, got -0.1"),
    ("optimizer.learning_rate", "nan", "must be a finite number, got nan"),
    ("optimizer.initial_accumulator", "-1", "must be >= 0, got -1.0"),
    ("optimizer.eps", "-1e-8", "must be > 0, got -1e-08"),
    ("optimizer.eps", "0", "must be > 0, got 0.0"),
    ("train.epochs", "0", "must be >= 1, got 0"),
    ("train.batch_size", "0", "must be >= 1, got 0"),
    ("train.batch_size", "-256", "must be >= 1, got -256"),
    ("train.max_steps", "-1", "must be >= 0, got -1"),
    ("train.progress_seconds", "0", "must be > 0, got 0.0"),
    ("train.progress_seconds", "-inf", "must be a finite number, got -inf"),
    ("consistency.model", '"sssp"', "must be one of 'bsp', 'ssp', 'async', got 'sssp'"),
    ("consistency.model", '"asynch"', "(did you mean 'async'?)"),
    ("consistency.pull", '"mpi"', "must be one of 'p2p', 'rma', got 'mpi'"),
    ("comm.max_message_bytes", "1023", "must be >= 1024, got 1023"),
    ("evaluate.max_auc_gap", "-0.1", "must be >= 0, got -0.1"),
])
def test_out_of_range(jobdir, dotted, value, message):
    text = ADULT.replace('format = "adult_csv"\n', "") if dotted == "data.format" else ADULT
    e = error(jobdir, with_key(text, dotted, value))
    assert e.key == dotted
    assert message in e.message, e.message


def test_boundary_values_accepted(jobdir):
    text = ADULT
    for dotted, value in [("seed", str(2**63 - 1)), ("cluster.servers", "1"),
                          ("data.hash_bits", "40"), ("data.numeric_bins", "2"),
                          ("data.test_fraction", "0.999"), ("model.l2", "0"),
                          ("optimizer.name", '"sgd"'), ("model.dtype", '"float64"'),
                          ("train.epochs", "1"), ("train.batch_size", "1"),
                          ("train.max_steps", "1"), ("comm.max_message_bytes", "1024"),
                          ("evaluate.max_auc_gap", "0"), ("data.max_rows", "100")]:
        text = with_key(text, dotted, value)
    cfg = job(jobdir, text)
    assert cfg.data.num_features == 2**40
    assert cfg.data.numeric_bins == 2 and cfg.optimizer.name == "sgd"
    assert cfg.model.dtype == "float64" and cfg.comm.max_message_bytes == 1024


@pytest.mark.parametrize("name", ["", "a b", "a/b", "ü", ".", "..", "x;y"])
def test_bad_name(jobdir, name):
    e = error(jobdir, ADULT.replace('name = "t"', f"name = {json.dumps(name)}"))
    assert e.key == "name" and "must match" in e.message


@pytest.mark.parametrize("name", ["a", "adult_lr", "A-1.2_b", "v1.0"])
def test_good_name(jobdir, name):
    assert job(jobdir, ADULT.replace('name = "t"', f'name = "{name}"')).name == name


@pytest.mark.parametrize("remove,key", [
    ('name = "t"\n', "name"),
    ('format = "adult_csv"\n', "data.format"),
    ('path = "../data/adult.csv"\n', "data.path"),
])
def test_missing_required_key(jobdir, remove, key):
    e = error(jobdir, ADULT.replace(remove, ""))
    assert e.key == key and e.message == "required key missing"


def test_missing_data_section(jobdir):
    e = error(jobdir, 'name = "t"\n')
    assert e.key == "data.format" and "required key missing" in e.message


def test_missing_data_file_names_key_and_resolved_path(jobdir):
    e = error(jobdir, ADULT.replace("adult.csv", "nope.csv"))
    assert e.key == "data.path"
    assert str((jobdir / "data" / "nope.csv").resolve()) in e.message
    assert "not found" in e.message
    assert str((jobdir / "jobs").resolve()) in e.message  # says where relative paths start


def test_data_path_is_directory(jobdir):
    e = error(jobdir, ADULT.replace("../data/adult.csv", "../data"))
    assert e.key == "data.path" and "not a regular file" in e.message


def test_empty_data_path(jobdir):
    e = error(jobdir, ADULT.replace("../data/adult.csv", ""))
    assert e.key == "data.path" and "must not be empty" in e.message


def test_svmlight_missing_test_file(jobdir):
    e = error(jobdir, SVM.replace("test.svm", "missing.svm"))
    assert e.key == "data.test_path"
    assert str((jobdir / "data" / "missing.svm").resolve()) in e.message


@pytest.mark.parametrize("key", ["index_base", "n_features", "test_path"])
def test_svmlight_required_keys(jobdir, key):
    text = "\n".join(l for l in SVM.splitlines() if not l.startswith(key + " ")) + "\n"
    e = error(jobdir, text)
    assert e.key == f"data.{key}"
    assert "required key missing" in e.message and "svmlight" in e.message


def test_svmlight_empty_test_path(jobdir):
    e = error(jobdir, SVM.replace('"../data/test.svm"', '""'))
    assert e.key == "data.test_path" and "must not be empty" in e.message


@pytest.mark.parametrize("value,message", [
    ("2", "must be one of 0, 1, got 2"),
    ("-1", "must be one of 0, 1, got -1"),
])
def test_svmlight_index_base_values(jobdir, value, message):
    e = error(jobdir, SVM.replace("index_base = 1", f"index_base = {value}"))
    assert e.key == "data.index_base" and message in e.message


def test_svmlight_index_base_zero(jobdir):
    assert job(jobdir, SVM.replace("index_base = 1", "index_base = 0")).data.index_base == 0


def test_svmlight_n_features_range(jobdir):
    e = error(jobdir, SVM.replace("n_features = 123", "n_features = 0"))
    assert e.key == "data.n_features" and "must be >= 1, got 0" in e.message


def test_adult_csv_test_path_must_be_empty(jobdir):
    assert job(jobdir, with_key(ADULT, "data.test_path", '""')).data.test_path is None
    e = error(jobdir, with_key(ADULT, "data.test_path", '"../data/adult.csv"'))
    assert e.key == "data.test_path" and "must be empty" in e.message


@pytest.mark.parametrize("dotted,value", [("data.index_base", "1"), ("data.n_features", "10")])
def test_adult_csv_rejects_svmlight_keys(jobdir, dotted, value):
    e = error(jobdir, with_key(ADULT, dotted, value))
    assert e.key == dotted and "not used with format 'adult_csv'" in e.message


@pytest.mark.parametrize("dotted,value", [("data.hash_bits", "10"), ("data.crosses", "false"),
                                          ("data.test_fraction", "0.1")])
def test_svmlight_rejects_adult_keys(jobdir, dotted, value):
    e = error(jobdir, with_key(SVM, dotted, value))
    assert e.key == dotted and "not used with format 'svmlight'" in e.message


def test_toml_syntax_error_names_file_and_line(jobdir, monkeypatch):
    monkeypatch.chdir(jobdir)
    (jobdir / "jobs" / "bad.toml").write_text('name = "t"\n[data\nformat = 1\n')
    with pytest.raises(ConfigError) as ei:
        load_job("jobs/bad.toml")
    e = ei.value
    assert e.path == Path("jobs/bad.toml") and e.key is None
    assert str(e).startswith("jobs/bad.toml: invalid TOML: ")
    assert "line 2" in str(e)


def test_toml_duplicate_key(jobdir):
    """A key set twice names the key and shows the line (issue 21, item 7: tomllib says only
    "Cannot overwrite a value (at line 8, column 11)")."""
    e = error(jobdir, ADULT + "\n[train]\nepochs = 1\nepochs = 2\n")
    assert "invalid TOML" in e.message and "line 8" in e.message
    assert e.key == "train.epochs", str(e)
    assert "epochs = 2" in e.message and "first set at line 7" in e.message
    assert e.line == 8 and str(e).split(": ")[0].endswith(".toml:8")     # where it is set again
    # a dotted key at the top level, and a key of an inline table set twice
    e = error(jobdir, ADULT + "\n[optimizer]\nname = 'sgd'\nlearning_rate = 0.1\n"
                              "learning_rate = 0.2\n")
    assert e.key == "optimizer.learning_rate" and "learning_rate = 0.2" in e.message


def test_toml_syntax_error_shows_the_line(jobdir):
    e = error(jobdir, ADULT + "[train]\nepochs == 2\n")
    assert e.key is None and "line 6" in e.message and e.message.endswith("epochs == 2")


def test_every_error_is_reported_in_file_order(jobdir):
    """Issue 21, item 10: all the problems of a job file in one run, in the order of the file
    (a missing key, whose line is unknown, last)."""
    text = """\
name = "t"
seed = -1
[data]
format = "adult_csv"
path = "../data/no_such.csv"
hash_bits = 99
[train]
epoch = 3
batch_size = "64"
[optimizer]
name = "sgd"
learning_rate = -0.1
beta1 = 0.5
[consistency]
model = "bsp"
staleness = 2
"""
    e = error(jobdir, text)
    assert isinstance(e, C.ConfigErrors)
    keys = [x.key for x in e.errors]
    assert keys == ["seed", "data.path", "data.hash_bits", "train.epoch", "train.batch_size",
                    "optimizer.learning_rate", "optimizer.beta1", "consistency.staleness"], keys
    lines = str(e).splitlines()
    assert len(lines) == len(keys) and all(l.startswith(str(e.path)) for l in lines)
    assert e.key == "seed" and e.message == "must be >= 0, got -1"    # the first one
    # a missing required key comes after those with a line
    e = error(jobdir, 'name = "t"\nseed = -1\n[data]\npath = "../data/adult.csv"\n')
    assert [x.key for x in e.errors] == ["seed", "data.format"]
    # one problem stays a plain ConfigError
    e = error(jobdir, ADULT + "[train]\nepochs = 0\n")
    assert type(e) is ConfigError and e.errors == [e]


def test_parse_job_syntax_error():
    with pytest.raises(ConfigError) as ei:
        parse_job("x = = 1", "some/job.toml")
    assert str(ei.value).startswith("some/job.toml: invalid TOML:")


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_job(tmp_path / "nope.toml")
    assert ei.value.key is None and "not found" in str(ei.value)
    assert str(tmp_path / "nope.toml") in str(ei.value)


def test_job_file_is_directory(tmp_path):
    with pytest.raises(ConfigError):
        load_job(tmp_path)


def test_job_file_not_utf8(jobdir):
    p = jobdir / "jobs" / "bin.toml"
    p.write_bytes(b'name = "\xff"\n')
    with pytest.raises(ConfigError) as ei:
        load_job(p)
    assert "UTF-8" in str(ei.value)


# ------------------------------------------------------------------------ check_world


@pytest.mark.parametrize("servers,world,ok", [
    (1, 2, True), (1, 4, True), (3, 4, True), (2, 3, True),
    (1, 1, False), (2, 2, False), (4, 4, False), (5, 4, False), (1, 0, False),
])
def test_check_world(jobdir, servers, world, ok):
    cfg = job(jobdir, with_key(ADULT, "cluster.servers", str(servers)))
    if ok:
        assert check_world(cfg, world) is None
    else:
        with pytest.raises(ConfigError) as ei:
            check_world(cfg, world)
        e = ei.value
        assert e.key == "cluster.servers"
        assert f"world size {world}" in e.message or f"world of {world}" in e.message


def test_check_world_message_arithmetic(jobdir):
    cfg = job(jobdir, with_key(ADULT, "cluster.servers", "4"))
    with pytest.raises(ConfigError) as ei:
        check_world(cfg, 4)
    msg = ei.value.message
    assert "4 - 4 = 0 workers" in msg and "world size - 1 = 3" in msg and "5 ranks" in msg


def test_check_world_type():
    cfg = load_job(REPO / "jobs" / "adult_lr.toml")
    with pytest.raises(TypeError):
        check_world(cfg, 2.0)
    with pytest.raises(TypeError):
        check_world(cfg, True)


# -------------------------------------------------------------- check_output_writable


def test_check_output_writable_creates_parents(jobdir, tmp_path):
    out = tmp_path / "a" / "b" / "c"
    cfg = job(jobdir, with_key(ADULT, "output.dir", f'"{out}"'))
    assert not out.exists()
    check_output_writable(cfg)
    assert out.is_dir()
    assert list(out.iterdir()) == []  # the write probe leaves nothing behind
    check_output_writable(cfg)  # idempotent


def test_check_output_writable_file_in_the_way(jobdir, tmp_path):
    (tmp_path / "f").write_text("")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        cfg = job(jobdir, with_key(ADULT, "output.dir", f'"{out}"'))
        with pytest.raises(ConfigError) as ei:
            check_output_writable(cfg)
        assert ei.value.key == "output.dir" and str(out) in ei.value.message


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions and a non-root user")
def test_check_output_writable_read_only(jobdir, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        for out in (ro, ro / "sub"):
            cfg = job(jobdir, with_key(ADULT, "output.dir", f'"{out}"'))
            with pytest.raises(ConfigError) as ei:
                check_output_writable(cfg)
            assert ei.value.key == "output.dir"
    finally:
        ro.chmod(0o700)


# ------------------------------------------------------------------------------ misc


def test_no_mpi_import():
    code = "import sys, hpcps.config; sys.exit('mpi4py' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


_toml_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
)


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(v), repr(v))
    if isinstance(v, str):  # TOML basic string, everything non-trivial escaped
        return '"' + "".join(c if c.isalnum() and c.isascii() or c in " _-./" else
                             f"\\U{ord(c):08X}" for c in v) + '"'
    return str(v) if not isinstance(v, list) else "[" + ", ".join(map(str, v)) + "]"


_ALL_KEYS = ["name", "seed"] + [f"{s}.{k}" for s, keys in C.SECTIONS.items() for k in keys]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(_ALL_KEYS), value=_toml_values)
def test_any_value_gives_config_or_config_error(jobdir, key, value):
    """Whatever value a key gets, the result is a JobConfig or a ConfigError on that key."""
    text = ADULT
    section, _, k = key.rpartition(".")
    if section == "data" and k in ("format", "path"):
        text = "\n".join(l for l in text.splitlines() if not l.startswith(k + " ")) + "\n"
    if key == "name":
        text = text.replace('name = "t"\n', "")
    text = with_key(text, key, _toml(value))
    try:
        cfg = parse_job(text, jobdir / "jobs" / "h.toml")
    except ConfigError as e:
        # the key itself, or a rule between keys that names it
        assert e.key == key or key.rpartition(".")[2] in e.message, str(e)
    else:
        json.dumps(to_dict(cfg))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_only_raises_config_error(text):
    try:
        parse_job(text, "fuzz.toml")
    except ConfigError:
        pass


# ------------------------------------------------------------------------ [consistency]


def _cons(**kv):
    lines = "".join(f"{k} = {v}\n" for k, v in kv.items())
    return ADULT + "[consistency]\n" + lines


def test_consistency_defaults(jobdir):
    c = job(jobdir).consistency
    assert (c.model, c.staleness, c.pull, c.n_fetch, c.n_push) == ("bsp", 0, "p2p", 1, 1)
    assert (c.staleness_aware_lr, c.push_threshold) == (False, 0.0)


@pytest.mark.parametrize("kv,want", [
    ({"model": '"ssp"', "staleness": "2"}, ("ssp", 2, "p2p", 1, 1)),
    ({"model": '"ssp"', "staleness": "0", "pull": '"rma"'}, ("ssp", 0, "rma", 1, 1)),
    ({"model": '"async"', "n_fetch": "3", "n_push": "5"}, ("async", 0, "p2p", 3, 5)),
    ({"model": '"async"', "pull": '"rma"'}, ("async", 0, "rma", 1, 1)),
    ({"model": '"bsp"', "pull": '"rma"'}, ("bsp", 0, "rma", 1, 1)),
])
def test_consistency_models_parse(jobdir, kv, want):
    c = job(jobdir, _cons(**kv)).consistency
    assert (c.model, c.staleness, c.pull, c.n_fetch, c.n_push) == want


def test_consistency_async_options(jobdir):
    c = job(jobdir, _cons(model='"async"', staleness_aware_lr="true",
                          push_threshold="1e-3")).consistency
    assert c.staleness_aware_lr is True and c.push_threshold == 1e-3


@pytest.mark.parametrize("kv,key,message", [
    ({"staleness": "2"}, "consistency.staleness", "only used with model = 'ssp', not 'bsp'"),
    ({"model": '"async"', "staleness": "2"}, "consistency.staleness",
     "only used with model = 'ssp', not 'async'"),
    ({"model": '"ssp"', "n_fetch": "2"}, "consistency.n_fetch", "only used with model = 'async'"),
    ({"n_push": "2"}, "consistency.n_push", "only used with model = 'async', not 'bsp'"),
    ({"model": '"ssp"', "push_threshold": "0.1"}, "consistency.push_threshold",
     "only used with model = 'async'"),
    ({"staleness_aware_lr": "true"}, "consistency.staleness_aware_lr",
     "only used with model = 'ssp' or 'async', not 'bsp'"),
    ({"model": '"ssp"', "staleness": "-1"}, "consistency.staleness", "must be in [0, 1000000]"),
    ({"model": '"async"', "n_fetch": "0"}, "consistency.n_fetch", "must be in [1, 1000000]"),
    ({"model": '"async"', "n_push": "0"}, "consistency.n_push", "must be in [1, 1000000]"),
    ({"model": '"async"', "push_threshold": "-1"}, "consistency.push_threshold",
     "must be >= 0"),
    ({"model": '"ssp"', "staleness": "2.0"}, "consistency.staleness", "expected integer"),
    ({"model": '"async"', "n_fetch": "true"}, "consistency.n_fetch", "expected integer"),
    ({"model": '"async"', "push_treshold": "1"}, "consistency.push_treshold",
     "did you mean 'push_threshold'?"),
])
def test_consistency_errors(jobdir, kv, key, message):
    e = error(jobdir, _cons(**kv))
    assert e.key == key
    assert message in e.message, e.message


# ------------------------------------------------------------------------- [optimizer]


def _opt(**kv):
    return ADULT + "\n[optimizer]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())


def test_optimizer_rules_parse_with_their_keys(jobdir):
    o = job(jobdir, _opt(name='"adam"', learning_rate="0.01", beta1="0", beta2="0.99",
                         eps="1e-6")).optimizer
    assert (o.name, o.learning_rate, o.beta1, o.beta2, o.eps) == ("adam", 0.01, 0.0, 0.99, 1e-6)
    o = job(jobdir, _opt(name='"ftrl"', learning_rate="0.5", beta="0", l1="0.01", l2="0.1")).optimizer
    assert (o.name, o.learning_rate, o.beta, o.l1, o.l2) == ("ftrl", 0.5, 0.0, 0.01, 0.1)
    o = job(jobdir, _opt(name='"adagrad"', initial_accumulator="0", eps="1e-10")).optimizer
    assert (o.initial_accumulator, o.eps) == (0.0, 1e-10)
    o = job(jobdir, _opt(name='"adam"')).optimizer        # defaults
    assert (o.beta1, o.beta2, o.eps, o.beta, o.l1, o.l2) == (0.9, 0.999, 1e-8, 1.0, 0.0, 0.0)


@pytest.mark.parametrize("kv,key,message", [
    ({"name": '"sgd"', "initial_accumulator": "0.1"}, "optimizer.initial_accumulator",
     "only used with name = 'adagrad', not 'sgd'; remove it"),
    ({"name": '"ftrl"', "eps": "1e-8"}, "optimizer.eps",
     "only used with name = 'adagrad' or 'adam', not 'ftrl'"),
    ({"name": '"adagrad"', "beta1": "0.9"}, "optimizer.beta1", "only used with name = 'adam', not 'adagrad'"),
    ({"name": '"ftrl"', "beta2": "0.9"}, "optimizer.beta2", "only used with name = 'adam', not 'ftrl'"),
    ({"name": '"adam"', "beta": "1.0"}, "optimizer.beta", "only used with name = 'ftrl', not 'adam'"),
    ({"name": '"adagrad"', "l1": "0.1"}, "optimizer.l1", "only used with name = 'ftrl', not 'adagrad'"),
    ({"name": '"sgd"', "l2": "0.1"}, "optimizer.l2",
     "only used with name = 'ftrl', not 'sgd'; remove it (the model's L2 penalty is [model] l2)"),
    ({"name": '"adam"', "beta1": "1.0"}, "optimizer.beta1", "must be in [0, 1), got 1.0"),
    ({"name": '"adam"', "beta2": "-0.1"}, "optimizer.beta2", "must be in [0, 1), got -0.1"),
    ({"name": '"ftrl"', "beta": "-1"}, "optimizer.beta", "must be >= 0, got -1.0"),
    ({"name": '"ftrl"', "l1": "-0.5"}, "optimizer.l1", "must be >= 0, got -0.5"),
    ({"name": '"ftrl"', "l2": "nan"}, "optimizer.l2", "must be a finite number, got nan"),
    ({"name": '"adam"', "beta_1": "0.9"}, "optimizer.beta_1", "did you mean 'beta1'?"),
])
def test_optimizer_errors_name_the_key(jobdir, kv, key, message):
    e = error(jobdir, _opt(**kv))
    assert e.key == key
    assert message in e.message, e.message


def test_optimizer_tables_get_the_rule_and_regularisation(jobdir):
    from hpcps.models.logistic_math import logistic_tables

    cfg = job(jobdir, with_key(_opt(name='"ftrl"', learning_rate="0.3", l1="0.01", l2="0.5"),
                               "model.l2", "0.001"))
    (_, ow), (_, ob) = logistic_tables(cfg)
    assert (ow.name, ow.learning_rate, ow.l2, ow.lambda1, ow.lambda2) == ("ftrl", 0.3, 0.001, 0.01, 0.5)
    assert (ob.l2, ob.lambda1, ob.lambda2) == (0.0, 0.0, 0.0)     # the bias is not regularised
    cfg = job(jobdir, _opt(name='"adam"', beta1="0.8", beta2="0.99", eps="1e-7"))
    (_, ow), _ = logistic_tables(cfg)
    assert (ow.beta1, ow.beta2, ow.eps) == (0.8, 0.99, 1e-7)


# ------------------------------------------------------------------------ streamed data

CRITEO = """\
name = "c"
[data]
format = "criteo"
path = "../data/crit"
test_path = "../data/crit/*.tsv"
hash_bits = 16
"""


def test_criteo_job_with_stream_keys(jobdir):
    (jobdir / "data" / "crit").mkdir()
    (jobdir / "data" / "crit" / "a.tsv").write_text("0" + "\t" * 39 + "\n")
    cfg = job(jobdir, CRITEO + 'prefetch = 2\nshuffle_buffer = 100\non_bad_line = "skip"\n')
    d = cfg.data
    assert (d.format, d.hash_bits, d.num_features) == ("criteo", 16, 1 << 16)
    assert (d.prefetch, d.shuffle_buffer, d.on_bad_line) == (2, 100, "skip")
    assert d.path == (jobdir / "data" / "crit").resolve()


@pytest.mark.parametrize("extra, key, message", [
    ('on_bad_line = "ignore"', "data.on_bad_line", "must be one of 'error', 'skip'"),
    ("prefetch = 0", "data.prefetch", "must be in [1, 64], got 0"),
    ('duplicate_indices = "sum"', "data.duplicate_indices", "only with 'svmlight'"),
    ("index_base = 1", "data.index_base", "only with 'svmlight'"),
])
def test_criteo_bad_keys_are_named(jobdir, extra, key, message):
    (jobdir / "data" / "crit").mkdir()
    (jobdir / "data" / "crit" / "a.tsv").write_text("0" + "\t" * 39 + "\n")
    e = error(jobdir, CRITEO + extra + "\n")
    assert e.key == key and message in e.message, e.message


def test_criteo_path_naming_no_file_is_a_job_file_error(jobdir):
    (jobdir / "data" / "crit").mkdir()
    e = error(jobdir, CRITEO)
    assert e.key == "data.path" and "holds no data file" in e.message, e.message


def test_stream_keys_not_for_adult(jobdir):
    e = error(jobdir, ADULT.replace("[data]\n", "[data]\nshuffle_buffer = 10\n"))
    assert e.key == "data.shuffle_buffer" and "only with 'svmlight' or 'criteo'" in e.message


# ------------------------------------------------------------------------ [comm] aggregate


def test_aggregate_node_loads_with_bsp(jobdir):
    cfg = job(jobdir, with_key(with_key(ADULT, "comm.aggregate", '"node"'), "comm.group_workers", 4))
    assert (cfg.comm.aggregate, cfg.comm.group_workers) == ("node", 4)
    assert job(jobdir).comm.aggregate == "off"


@pytest.mark.parametrize("key, value, says", [
    ("consistency.model", '"ssp"', "model = 'bsp'"),
    ("consistency.pull", '"rma"', "pull = 'p2p'"),
    ("fault_tolerance.mode", '"continue"', "mode = 'restart'"),
    ("elastic.add_workers", "1", "[elastic]"),
])
def test_aggregate_node_refused_where_a_group_cannot_step(jobdir, key, value, says):
    text = with_key(with_key(ADULT, "comm.aggregate", '"node"'), key, value)
    if key == "elastic.add_workers":
        text = with_key(text, "elastic.at_step", 3)
    e = error(jobdir, text)
    assert "comm.aggregate" in str(e) and says in str(e), str(e)


def test_group_workers_without_aggregate_is_an_error(jobdir):
    e = error(jobdir, with_key(ADULT, "comm.group_workers", 2))
    assert "comm.group_workers" in str(e) and "aggregate = 'node'" in str(e)

