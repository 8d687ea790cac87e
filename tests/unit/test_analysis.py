"""Offline analysis (hpcps.analysis.offline, hpcps inspect/eval/export/plot/diff) on real files.

Checkpoints are written with the public hpcps.checkpoint.write_shard / write_manifest exactly as
servers and worker 0 write them (shards in permuted key order, from
hpcps.core.tables.KeyPartition); model and metrics files with hpcps.runtime.output.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.special import expit
from sklearn.datasets import dump_svmlight_file, load_svmlight_file
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from hpcps.analysis import offline as analysis
from hpcps import checkpoint as ckpt
from hpcps.cli.analysis import main as cli
from hpcps.config import parse_job
from hpcps.runtime.output import write_metrics, write_model
from hpcps.core.tables import KeyPartition

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "data" / "adult.csv.gz"
NF = 50  # features of the synthetic svmlight job (multiplier != 1, uneven server ranges)

SVM_JOB = """
name = "tiny"
seed = 3
[cluster]
servers = 3
[data]
format = "svmlight"
path = "train.svm"
test_path = "test.svm"
index_base = 1
n_features = 50
[model]
dtype = "float32"
[optimizer]
name = "adagrad"
"""


# ------------------------------------------------------------------------- helpers


def write_checkpoint(run_dir, step, tables, slots, *, cfg_text, n_servers=3, n_workers=2,
                     epoch=1, step_in_epoch=4, steps_per_epoch=10, history=()):
    """Write a complete checkpoint of ``tables`` (original key order) the way a job does.

    Sparse tables (all but ``bias``) are permuted with KeyPartition and each server's shard
    holds its permuted key range; ``slots[table]`` are the optimizer slot arrays.
    """
    d = ckpt.step_dir(run_dir, step)
    parts = {name: KeyPartition(a.shape[0], n_servers, permute=(name != "bias"))
             for name, a in tables.items()}
    shards = []
    for s in range(n_servers):
        entries = []
        for name, a in tables.items():
            part = parts[name]
            lo, hi = part.shard_range(s)
            keys = part.shard_keys(s)
            entries.append(dict(name=name, rows=a[keys], keys=keys,
                                slots={k: v[keys] for k, v in slots.get(name, {}).items()},
                                lo=lo, hi=hi, num_keys=part.num_keys, multiplier=part.multiplier,
                                sparse=name != "bias", optimizer="adagrad" if slots else "sgd"))
        shards.append(ckpt.write_shard(d, s, n_servers, step, entries))
    partitions = {name: dict(num_keys=p.num_keys, dim=tables[name].shape[1],
                             dtype=str(tables[name].dtype), multiplier=p.multiplier,
                             range_size=p.range_size, sparse=name != "bias",
                             slots=sorted(slots.get(name, {})),
                             ranges=np.array([p.shard_range(s) for s in range(n_servers)]))
                  for name, p in parts.items()}
    ckpt.write_manifest(d, cfg_text=cfg_text, job_name=tomllib.loads(cfg_text)["name"], step=step,
                        epoch=epoch, step_in_epoch=step_in_epoch, steps_per_epoch=steps_per_epoch,
                        n_workers=n_workers, worker_clocks=[step] * n_workers,
                        last_push_seq=[step] * n_workers, shards=shards, partitions=partitions,
                        history=list(history))
    return d


def logistic(seed=0, nf=NF, dtype=np.float32):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (nf, 1)).astype(dtype)
    w[rng.random(nf) < 0.3] = 0                    # some untouched (zero) rows
    b = np.array([[0.25]], dtype=dtype)
    tables = {"weights": w, "bias": b}
    slots = {"weights": {"accumulator": (0.1 + rng.random((nf, 1))).astype(dtype)},
             "bias": {"accumulator": np.array([[3.5]], dtype=dtype)}}
    return tables, slots


@pytest.fixture
def svm_run(tmp_path):
    """A job directory with svmlight data and a run with two checkpoints and a model file."""
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    rng = np.random.default_rng(7)
    truth = rng.normal(0, 1.5, NF)
    for name, n in (("train.svm", 300), ("test.svm", 200)):
        X = (rng.random((n, NF)) < 0.15) * rng.normal(1, 0.5, (n, NF))
        y = (rng.random(n) < expit(X @ truth - 0.2)).astype(int)
        dump_svmlight_file(X, y, str(jobdir / name), zero_based=False)
    (jobdir / "tiny.toml").write_text(SVM_JOB)
    run = tmp_path / "runs" / "tiny"
    t1, s1 = logistic(1)
    t2, s2 = logistic(2)
    hist = [{"epoch": 1, "clock": 10, "seconds": 0.5, "train_logloss": 0.7, "test_logloss": 0.6,
             "test_auc": 0.71, "test_accuracy": 0.66, "test_rows": 200}]
    c1 = write_checkpoint(run, 10, t1, s1, cfg_text=SVM_JOB, history=hist)
    c2 = write_checkpoint(run, 20, t2, s2, cfg_text=SVM_JOB, epoch=2, step_in_epoch=0, history=hist)
    cfg = parse_job(SVM_JOB, jobdir / "tiny.toml")
    write_model(run / "model.h5", t2, cfg, step=20, epoch=2)
    return {"job": jobdir / "tiny.toml", "test": jobdir / "test.svm", "run": run,
            "c1": c1, "c2": c2, "t1": t1, "s1": s1, "t2": t2, "s2": s2}


def run_cli(args, cwd=None):
    """``python -m hpcps.cli.analysis ARGS`` in a fresh process that cannot import mpi4py."""
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from hpcps.cli.analysis import main\n"
            "rc = main(sys.argv[1:])\n"
            "assert 'mpi4py' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
            "sys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def expected_metrics(X, y, w, b):
    p = np.clip(expit(X @ w[:, 0].astype(np.float64) + float(b[0, 0])), 1e-15, 1 - 1e-15)
    return {"logloss": log_loss(y, p, labels=[0, 1]), "auc": roc_auc_score(y, p),
            "accuracy": accuracy_score(y, p >= 0.5)}


# --------------------------------------------------------------------- the helper


def test_helper_checkpoint_really_is_permuted_and_valid(svm_run):
    m = ckpt.verify(svm_run["c2"])
    assert m["n_servers"] == 3 and m["partition"]["weights"]["multiplier"] != 1
    with h5py.File(svm_run["c2"] / "shard-0001.h5", "r") as f:
        keys = f["tables/weights/keys"][()]
        np.testing.assert_array_equal(f["tables/weights/rows"][()], svm_run["t2"]["weights"][keys])
    assert not np.array_equal(keys, np.sort(keys))  # not stored in key order
    with h5py.File(svm_run["c2"] / "shard-0002.h5", "r") as f:
        assert f["tables/bias/rows"].shape == (0, 1)  # 1-row dense table: only server 0 has it


# ------------------------------------------------------------------ sources, tables


def test_resolve_every_kind_of_source(svm_run):
    run, c1, c2 = svm_run["run"], svm_run["c1"], svm_run["c2"]
    for p in (c2, c2 / "manifest.h5", run, run / "ckpt"):
        src = analysis.resolve(p)
        assert (src.kind, src.path, src.meta["step"]) == ("checkpoint", c2, 20)
    assert analysis.resolve(run).run_dir == run
    assert [s["step"] for s in analysis.resolve(run).checkpoints] == [10, 20]
    assert analysis.resolve(c1).meta["step"] == 10
    m = analysis.resolve(run / "model.h5")
    assert m.kind == "model" and m.meta["job_name"] == "tiny" and m.meta["step"] == 20


def test_read_tables_unpermutes_rows_and_slots(svm_run):
    tables, slots = analysis.read_tables(svm_run["c1"])
    for name in ("weights", "bias"):
        np.testing.assert_array_equal(tables[name], svm_run["t1"][name])
        assert tables[name].dtype == np.float32
        np.testing.assert_array_equal(slots[name]["accumulator"], svm_run["s1"][name]["accumulator"])
    mt, ms = analysis.read_tables(svm_run["run"] / "model.h5")
    np.testing.assert_array_equal(mt["weights"], svm_run["t2"]["weights"])
    assert ms == {}


def test_read_tables_detects_keys_that_are_not_a_permutation(svm_run, tmp_path):
    # a shard missing behind the virtual dataset reads as fill value 0: caught, not garbage
    d = tmp_path / "copy"
    shutil.copytree(svm_run["c1"], d)
    src = analysis.resolve(d)
    (d / "shard-0001.h5").unlink()
    with pytest.raises(analysis.AnalysisError, match="not a permutation"):
        analysis.read_tables(src)


def test_array_stats_blocks_and_nonfinite():
    a = np.array([[0.0], [3.0], [-4.0], [np.nan], [np.inf], [0.0], [1.0]])
    for block in (1, 2, 100):
        st = analysis.array_stats(a, block_rows=block)
        assert st["shape"] == (7, 1) and st["size"] == 7 and st["nonfinite"] == 2
        assert st["nonzeros"] == 5  # NaN and inf count as non-zero
        assert st["min"] == -4.0 and st["max"] == 3.0 and st["mean"] == 0.0
        assert math.isclose(st["l2"], math.sqrt(26))
    with pytest.raises(ValueError, match="block_rows"):
        analysis.array_stats(a, block_rows=0)


# ------------------------------------------------------------------------- inspect


def test_inspect_checkpoint_statistics(svm_run):
    rep = analysis.inspect(svm_run["c2"])
    w, acc = svm_run["t2"]["weights"].astype(np.float64), svm_run["s2"]["weights"]["accumulator"]
    st = rep["tables"]["weights"]
    assert st["shape"] == (NF, 1) and st["dtype"] == "float32"
    assert st["nonzeros"] == np.count_nonzero(w) < NF
    assert math.isclose(st["l2"], np.linalg.norm(w), rel_tol=1e-12)
    assert (st["min"], st["max"]) == (w.min(), w.max())
    assert sum(st["server_rows"]) == NF and len(st["server_rows"]) == 3
    sl = st["slots"]["accumulator"]
    assert math.isclose(sl["mean"], acc.astype(np.float64).mean(), rel_tol=1e-12)
    assert (sl["min"], sl["max"]) == (float(acc.min()), float(acc.max()))
    assert rep["tables"]["bias"]["max"] == 0.25 and rep["tables"]["bias"]["server_rows"] == [1, 0, 0]
    text = analysis.format_inspect(rep)
    for want in ("step         20  (steps done by each worker)",
                 "epochs done  2  (epoch 3 not started)",
                 "history      1 epoch(s) evaluated; last: epoch 1: test log-loss 0.6, AUC 0.71, "
                 "accuracy 0.66",
                 "servers      3", "workers      2", "clocks       20 (all 2 workers)",
                 "integrity    OK: manifest and 3 shard(s)", f"weights: shape ({NF}, 1) float32",
                 "slot accumulator: min", "hpcps 0.1.0", "job          tiny", "created"):
        assert want in text, (want, text)
    # a BSP cut: no async push counts (read as "the workers never pushed", found by a trial)
    assert "last push" not in text and "pushes sent" not in text, text
    meta = rep["source"].meta
    meta["config"] = meta["config"] + '\n[consistency]\nmodel = "async"\n'    # an async cut
    assert "pushes sent  20 (all 2 workers)" in analysis.format_inspect(rep)


def test_inspect_run_lists_invalid_checkpoints_and_uses_newest_valid(svm_run):
    shard = svm_run["c2"] / "shard-0002.h5"
    shard.write_bytes(shard.read_bytes()[:-100])               # truncate the newest
    rep = analysis.inspect(svm_run["run"])
    assert rep["source"].path == svm_run["c1"]
    text = analysis.format_inspect(rep)
    assert "step-00000010  valid" in text
    assert "step-00000020  INVALID:" in text and "truncated" in text
    assert "newest valid: step-00000010" in text


def test_inspect_run_without_valid_checkpoint_falls_back_to_model(svm_run):
    for c in (svm_run["c1"], svm_run["c2"]):
        (c / "manifest.h5").unlink()
    rep = analysis.inspect(svm_run["run"])
    assert rep["source"].kind == "model"
    assert "no valid checkpoint; showing the final model file model.h5" in analysis.format_inspect(rep)
    (svm_run["run"] / "model.h5").unlink()
    with pytest.raises(analysis.AnalysisError, match="no valid checkpoint"):
        analysis.resolve(svm_run["run"])


def test_inspect_model_file(svm_run):
    text = analysis.format_inspect(analysis.inspect(svm_run["run"] / "model.h5"))
    assert "model file" in text and "features     50 (index_base 1)" in text
    assert "step         20  (steps done by each worker)" in text and "epochs done  2\n" in text
    assert "weights: shape (50, 1) float32" in text


def _truncate(d):
    p = d / "shard-0000.h5"
    p.write_bytes(p.read_bytes()[:200])


def _flip(d):
    p = d / "shard-0001.h5"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _garbage_manifest(d):
    (d / "manifest.h5").write_bytes(b"not hdf5 at all" * 10)


def _half_manifest(d):
    p = d / "manifest.h5"
    p.write_bytes(p.read_bytes()[:1000])


@pytest.mark.parametrize("damage, target, message", [
    (_truncate, ".", "truncated"),
    (_flip, ".", "xxh3_128 checksum does not match"),
    (lambda d: (d / "shard-0002.h5").unlink(), ".", "shard shard-0002.h5 is missing"),
    (lambda d: (d / "manifest.h5").unlink(), ".", "checkpoint incomplete"),
    (_garbage_manifest, ".", "unreadable manifest"),
    (_half_manifest, "manifest.h5", "unreadable manifest"),
    (lambda d: None, "nothing-here", "no such file or directory"),
    (lambda d: (d / "notes.h5").write_bytes(b"\x89HDF\r\n" + b"x" * 50), "notes.h5",
     "not a readable HDF5 file"),
    (lambda d: h5py.File(d / "other.h5", "w").close(), "other.h5",
     "neither an hpcps checkpoint manifest nor an hpcps model file"),
])
def test_cli_damaged_sources_give_one_line_and_status_1(svm_run, tmp_path, damage, target, message):
    d = tmp_path / "step-00000010"
    shutil.copytree(svm_run["c1"], d)
    damage(d)
    for cmd in (["inspect"], ["export", "-o", tmp_path / "x.npz"], ["diff", svm_run["c2"]]):
        proc = run_cli([cmd[0], d / target if target != "." else d, *cmd[1:]])
        assert proc.returncode == 1, (cmd, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hpcps {cmd[0]}: error: "), proc.stderr
        assert message in lines[0], lines[0]
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.npz").exists()


def test_cli_inspect_prints_report(svm_run):
    proc = run_cli(["inspect", svm_run["run"]])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"run {svm_run['run']}: 2 checkpoint(s)")
    assert "non-zeros" in proc.stdout and "slot accumulator" in proc.stdout


# ---------------------------------------------------------------------------- eval


def test_toml_text_round_trips():
    doc = {"name": "x", "seed": 3, "f": 1e-08, "g": -2.5, "big": 10**18, "t": True,
           "s": 'quote " back \\ tab\t nl\n del\x7f é 😀', "arr": [1, 2], "weird key": "v",
           "data": {"path": "/a b/c.svm", "n": 0, "sub": {"x": 1.0}}, "empty": {}}
    assert tomllib.loads(analysis.toml_text(doc)) == doc


def test_eval_svmlight_matches_independent_computation(svm_run):
    X, y = load_svmlight_file(str(svm_run["test"]), n_features=NF, zero_based=False)
    t = svm_run["t2"]
    want = expected_metrics(X, y, t["weights"], t["bias"])
    for src in (svm_run["c2"], svm_run["run"], svm_run["run"] / "model.h5"):
        res = analysis.evaluate(src, svm_run["test"])
        assert res["rows"] == 200 and res["positives"] == int(y.sum())
        assert res["model"] == "logistic" and res["primary"] == "auc"
        for k, v in want.items():
            assert math.isclose(res["metrics"][k], v, rel_tol=1e-9, abs_tol=1e-12), (src, k, res, v)
    other = analysis.evaluate(svm_run["c1"], svm_run["test"])
    assert not math.isclose(other["metrics"]["auc"], want["auc"])  # the other checkpoint's weights


def test_cli_eval_with_and_without_job(svm_run, tmp_path):
    # the stored config's data paths (train.svm, test.svm) do not exist next to the run:
    # --data replaces them
    proc = run_cli(["eval", svm_run["c2"], "--data", svm_run["test"]], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "200 rows" in proc.stdout and "AUC 0." in proc.stdout and "log-loss" in proc.stdout
    proc2 = run_cli(["eval", svm_run["c2"], "--data", svm_run["test"], "--job", svm_run["job"]])
    assert proc2.returncode == 0, proc2.stderr
    assert proc2.stdout.splitlines()[-1] == proc.stdout.splitlines()[-1]


def test_eval_rejects_job_with_other_feature_count(svm_run, tmp_path):
    job = svm_run["job"].parent / "wide.toml"
    job.write_text(SVM_JOB.replace("n_features = 50", "n_features = 64"))
    with pytest.raises(analysis.AnalysisError,
                       match=r"table 'weights' has shape \(50, 1\) but the job .* makes it "
                             r"\(64, 1\) \(n_features; wrong --job\?\)"):
        analysis.evaluate(svm_run["c2"], svm_run["test"], job=job)
    proc = run_cli(["eval", svm_run["c2"], "--data", tmp_path / "missing.svm"])
    assert proc.returncode == 1 and "missing.svm: no such file or directory" in proc.stderr


def test_model_records_index_base_and_eval_refuses_another(svm_run):
    """model.h5 keeps the svmlight index base; a job reading the test file with the other
    base is refused instead of scoring every feature shifted by one."""
    model = svm_run["run"] / "model.h5"
    with h5py.File(model, "r") as f:
        assert int(f.attrs["index_base"]) == 1
    job = svm_run["job"].parent / "zero.toml"
    job.write_text(SVM_JOB.replace("index_base = 1", "index_base = 0"))
    with pytest.raises(analysis.AnalysisError,
                       match="trained on 1-based svmlight indices but the job .* reads them 0-based"):
        analysis.evaluate(model, svm_run["test"], job=job)


@pytest.mark.parametrize("stream", ["false", "true"])
def test_eval_reads_compressed_or_many_file_data_whatever_the_jobs_stream(svm_run, tmp_path,
                                                                          stream):
    """Found by a trial: ``hpcps eval RUN/model.h5 --data test.svm.gz`` of a job trained in
    memory (``stream = false``) was refused as "model.h5:9: data.path: ... a compressed
    svmlight file cannot be split ... (remove data.stream = false)": a line of an HDF5 file,
    a key the user cannot edit. eval reads ``--data`` in order on one process, streamed,
    whatever the job's ``stream`` (and ``max_rows``: every row is scored); an unreadable
    ``--data`` is named as such."""
    import bz2
    import gzip

    text = SVM_JOB.replace("n_features = 50", f"n_features = 50\nstream = {stream}\nmax_rows = 7")
    run = tmp_path / "runs" / "mem"
    run.mkdir(parents=True)
    model = run / "model.h5"
    write_model(model, svm_run["t2"], parse_job(text, svm_run["job"]), step=20, epoch=2)
    X, y = load_svmlight_file(str(svm_run["test"]), n_features=NF, zero_based=False)
    want = expected_metrics(X, y, svm_run["t2"]["weights"], svm_run["t2"]["bias"])
    raw = svm_run["test"].read_bytes()
    gz = tmp_path / "test.svm.gz"
    gz.write_bytes(gzip.compress(raw))
    many = tmp_path / "many"
    many.mkdir()
    cut = raw.index(b"\n", len(raw) // 2) + 1
    (many / "a.svm").write_bytes(raw[:cut])
    (many / "b.svm.gz").write_bytes(gzip.compress(raw[cut:]))
    for data in (gz, svm_run["test"], many, str(many / "*.svm*")):
        res = analysis.evaluate(model, data)
        assert res["rows"] == 200 and res["positives"] == int(y.sum()), (data, res)
        for k, v in want.items():
            assert math.isclose(res["metrics"][k], v, rel_tol=1e-9, abs_tol=1e-12), (data, k, res)
    proc = run_cli(["eval", model, "--data", gz])
    assert proc.returncode == 0, proc.stderr
    assert "data " + str(gz) + " (svmlight, all rows): 200 rows" in proc.stdout, proc.stdout
    # a --data the readers refuse: named as the --data argument, not as a line of model.h5
    bad = tmp_path / "test.svm.bz2"
    bad.write_bytes(bz2.compress(raw))
    proc = run_cli(["eval", model, "--data", bad])
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"hpcps eval: error: --data {bad}: "), proc.stderr
    assert "bz2-compressed data is not read" in proc.stderr, proc.stderr
    assert "model.h5:" not in proc.stderr and "data.stream" not in proc.stderr, proc.stderr


def test_eval_reports_malformed_data(svm_run, tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5\n0 99:1\n")          # feature 99 >= n_features 50
    proc = run_cli(["eval", svm_run["c2"], "--data", bad])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "bad.svm" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


ADULT_JOB = f"""
name = "adult_small"
[data]
format = "adult_csv"
path = "../data/adult.csv.gz"
max_rows = 4000
hash_bits = 12
[model]
dtype = "float64"
"""


@pytest.mark.skipif(not ADULT.exists(), reason="data/adult.csv.gz not present")
def test_eval_adult_uses_the_jobs_test_split(tmp_path):
    from sklearn.linear_model import LogisticRegression

    from hpcps.data.adult import load_adult_partition

    kw = dict(hash_bits=12, numeric_bins=8, crosses=True, test_fraction=0.2, split_seed=0,
              max_rows=4000)
    Xtr, ytr = load_adult_partition(ADULT, "train", 0, 1, **kw)
    Xte, yte = load_adult_partition(ADULT, "test", 0, 1, **kw)
    lr = LogisticRegression(C=0.03, max_iter=3000).fit(Xtr, ytr)
    tables = {"weights": lr.coef_.reshape(-1, 1).astype(np.float64),
              "bias": np.array([[lr.intercept_[0]]])}
    d = write_checkpoint(tmp_path / "runs" / "adult_small", 7, tables, {}, cfg_text=ADULT_JOB, n_servers=2)
    res = analysis.evaluate(d, ADULT)
    want = expected_metrics(Xte, yte, tables["weights"], tables["bias"])
    assert res["rows"] == Xte.shape[0] == 800
    for k, v in want.items():
        assert math.isclose(res["metrics"][k], v, rel_tol=1e-9), (k, res, v)
    assert res["metrics"]["auc"] > 0.85           # a real model on real data


# -------------------------------------------------------------------------- export


def test_export_npz_original_order_without_pickle(svm_run, tmp_path):
    out = tmp_path / "c1.npz"
    assert analysis.export_npz(svm_run["c1"], out) == out
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == ["bias", "bias__accumulator", "weights", "weights__accumulator"]
        np.testing.assert_array_equal(z["weights"], svm_run["t1"]["weights"])
        np.testing.assert_array_equal(z["bias"], svm_run["t1"]["bias"])
        np.testing.assert_array_equal(z["weights__accumulator"], svm_run["s1"]["weights"]["accumulator"])
        assert z["weights"].dtype == np.float32
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_cli_export_default_name_and_model_file(svm_run, tmp_path):
    proc = run_cli(["export", svm_run["run"], "--format", "npz"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "tiny-step-00000020.npz"
    assert f"wrote {out}" in proc.stdout
    with np.load(out, allow_pickle=False) as z:
        np.testing.assert_array_equal(z["weights"], svm_run["t2"]["weights"])
    proc = run_cli(["export", svm_run["run"] / "model.h5", "-o", tmp_path / "m.npz"])
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["bias", "weights"]
    proc = run_cli(["export", svm_run["c1"], "--format", "csv"])
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


# ---------------------------------------------------------------------------- plot


def metrics_record(staleness=None, summary=True):
    epochs = [{"epoch": e, "clock": 10 * e, "seconds": 1.5 * e, "train_logloss": 0.6 / e,
               "test_logloss": 0.55 / e, "test_auc": 0.8 + 0.02 * e, "test_accuracy": 0.8,
               "test_rows": 200} for e in (1, 2, 3)]
    epochs[1]["test_auc"] = float("nan")                  # written as null
    rec = {"job": "tiny", "epochs": epochs}
    if summary:
        rec["summary"] = {"servers": [{"index": i, "rows": 17, "memory_bytes": 1000, "keys_pulled": 5,
                                       "keys_pushed": 5, "bytes_in": 1e6 * (i + 1),
                                       "bytes_out": 2e6 * (i + 1), "requests": 9} for i in range(3)]}
        if staleness is not None:
            rec["summary"]["staleness_histogram"] = staleness
    return rec


@pytest.mark.parametrize("staleness, panels", [
    (None, 5), ([120, 30, 4], 6), ({"0": 10, "2": 3}, 6)])
def test_plot_panels(tmp_path, staleness, panels):
    import matplotlib.image

    run = tmp_path / "runs" / "tiny"
    write_metrics(run / "metrics.json", metrics_record(staleness))
    assert json.loads((run / "metrics.json").read_text())["epochs"][1]["test_auc"] is None
    path, drawn = analysis.plot_run(run)
    assert path == run / "curves.png" and len(drawn) == panels
    assert ("staleness histogram" in drawn) == (staleness is not None)
    assert {"log-loss vs epoch", "test AUC, accuracy vs wall time (s)", "bytes per server"} <= set(drawn)
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 300 and img.shape[1] > 600 and img.std() > 0


def test_wall_time_of_a_run_of_several_launches_runs_forward(tmp_path):
    """Found by a trial (2026-12-05): each launch's epoch records count ``seconds`` from its
    own start (4 launches: 66.5, 127.3, 67.6, 50.7 s), and the wall-time panels ran back in
    time. Each launch is shifted by the last seconds of the launches before it (the first,
    killed before an epoch ended, wrote no record)."""
    from hpcps.analysis.plot import _run_seconds

    epochs = [{"epoch": e, "clock": 100 * e, "seconds": s}
              for e, s in ((1, 66.5), (2, 127.3), (3, 67.6), (4, 50.7))]
    launches = [{"launch": 1, "resumed_from_step": None}, {"launch": 2, "resumed_from_step": 25},
                {"launch": 3, "resumed_from_step": 200}, {"launch": 4, "resumed_from_step": 300}]
    sec, label = _run_seconds(epochs, launches)
    assert np.allclose(sec, [66.5, 127.3, 194.9, 245.6]) and "4 launches" in label
    sec, label = _run_seconds(epochs[:2], [launches[0]])
    assert np.allclose(sec, [66.5, 127.3]) and label == "wall time (s)"
    # with the launches' start times (a trial: two launches killed before an epoch ended, over
    # 100 s, were not on the axis): each record after its launch's start
    t = ["2026-12-05T10:00:00+00:00", "2026-12-05T10:01:40+00:00",
         "2026-12-05T10:04:00+00:00", "2026-12-05T10:05:20+00:00"]
    timed = [dict(r, started=s) for r, s in zip(launches, t)]
    sec, label = _run_seconds(epochs, timed)
    assert np.allclose(sec, [100 + 66.5, 100 + 127.3, 240 + 67.6, 320 + 50.7]), sec
    assert label == "time since launch 1 of 4 (s)"
    sec, _ = _run_seconds(epochs, timed[:1] + [launches[1]] + timed[2:])    # one without
    assert np.allclose(sec, [66.5, 127.3, 194.9, 245.6])
    rec = metrics_record()
    rec["summary"]["launches"] = [launches[0], {"launch": 2, "resumed_from_step": 20}]
    rec["epochs"][2]["seconds"] = 0.5               # epoch 3 (clock 30) in the second launch
    run = tmp_path / "run"
    write_metrics(run / "metrics.json", rec)
    _, drawn = analysis.plot_run(run)
    assert "log-loss vs training time (s), 2 launches joined" in drawn, drawn


def test_one_staleness_value_is_ticked_with_whole_numbers():
    """Found by a trial (2026-12-04): a BSP run's histogram has one bar (staleness 0), whose
    axis matplotlib's integer locator ticked -0.60 ... 0.60."""
    from matplotlib.figure import Figure

    from hpcps.analysis.plot import whole_ticks

    ax = Figure().add_subplot()
    ax.bar([0], [918], 0.8)
    ax.set_xlim(-0.7, 0.7)
    ax.xaxis.set_major_locator(whole_ticks())
    ticks = ax.get_xticks()
    assert 0 in ticks and np.array_equal(ticks, np.round(ticks)), ticks


def test_cli_plot(tmp_path):
    run = tmp_path / "run"
    write_metrics(run / "metrics.json", metrics_record(summary=False))   # mid-run: no summary yet
    proc = run_cli(["plot", run, "-o", tmp_path / "c.svg"])
    assert proc.returncode == 0, proc.stderr
    assert "4 panels" in proc.stdout and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
    proc = run_cli(["plot", run / "metrics.json", "-o", tmp_path / "c.png"])
    assert proc.returncode == 0 and (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for args, msg in (([tmp_path / "nowhere"], "nowhere: no such file or directory"),
                      ([run, "-o", tmp_path / "c.xyz"], "unsupported image format 'xyz'")):
        proc = run_cli(["plot", *args])
        assert proc.returncode == 1 and msg in proc.stderr and "Traceback" not in proc.stderr
    (run / "metrics.json").write_text('{"epochs": [')
    proc = run_cli(["plot", run])
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr
    write_metrics(run / "metrics.json", {"epochs": [], "summary": {"staleness_histogram": "x"}})
    proc = run_cli(["plot", run])
    assert proc.returncode == 1 and "staleness histogram" in proc.stderr and "must be" in proc.stderr


def test_plot_refuses_a_record_with_nothing_to_plot(tmp_path):
    """22.7: epoch records without any metric, no per-server load, no staleness: a clear
    refusal instead of a figure of empty panels; a panel is drawn only with data."""
    run = tmp_path / "run"
    write_metrics(run / "metrics.json", {"job": "x", "epochs": [{"epoch": 1, "clock": 3, "seconds": 0.1}],
                                         "summary": {"servers": [{"index": 0, "bytes_in": 0,
                                                                  "bytes_out": 0}]}})
    with pytest.raises(analysis.AnalysisError, match="nothing to plot"):
        analysis.plot_run(run)
    proc = run_cli(["plot", run])
    assert proc.returncode == 1 and "nothing to plot" in proc.stderr and proc.stdout == ""
    assert not (run / "curves.png").exists()
    # only the test log-loss recorded (train_ missing, AUC null): one curve, no AUC panel
    write_metrics(run / "metrics.json", {"epochs": [{"epoch": 1, "train_logloss": None,
                                                     "test_logloss": 0.5, "test_auc": None}]})
    assert analysis.plot_run(run)[1] == ["log-loss vs epoch"]


# ---------------------------------------------------------------------------- diff


def test_diff_values(svm_run):
    res = analysis.diff(svm_run["c1"], svm_run["c2"])
    rows = {r["name"]: r for r in res["rows"]}
    assert sorted(rows) == ["bias", "bias__accumulator", "weights", "weights__accumulator"]
    d = np.abs(svm_run["t1"]["weights"].astype(np.float64) - svm_run["t2"]["weights"])
    assert math.isclose(rows["weights"]["max_abs"], d.max(), rel_tol=1e-12)
    assert math.isclose(rows["weights"]["mean_abs"], d.mean(), rel_tol=1e-12)
    assert rows["weights"]["differing"] == np.count_nonzero(d)
    assert rows["bias"]["max_abs"] == 0.0 and rows["bias"]["differing"] == 0
    same = analysis.diff(svm_run["c2"], svm_run["run"] / "model.h5")["rows"]
    assert sorted((r["name"], r["status"]) for r in same) == [
        ("bias", "compared"), ("bias__accumulator", "only in A"),
        ("weights", "compared"), ("weights__accumulator", "only in A")]
    assert all(r["max_abs"] == 0.0 for r in same if r["status"] == "compared")


def test_diff_reads_each_key_permutation_once_per_table(svm_run, monkeypatch):
    """A checkpoint's fixed-table key permutation is read and checked once per table (for
    its rows and every slot), not once per array; each row equals the whole-array
    difference of the arrays written (tables and slots), bit for bit in its counts."""
    import hpcps.analysis.diff as diffmod

    seen = []
    real = diffmod._permutation

    def counting(keys, n, where):
        seen.append(where)
        return real(keys, n, where)

    monkeypatch.setattr(diffmod, "_permutation", counting)
    res = analysis.diff(svm_run["c1"], svm_run["c2"])
    assert len(seen) == 4                       # weights and bias, of each source
    assert sorted(w.split("'")[1] for w in seen) == ["bias", "bias", "weights", "weights"]
    want = {**{n: (svm_run["t1"][n], svm_run["t2"][n]) for n in svm_run["t1"]},
            **{f"{n}__accumulator": (svm_run["s1"][n]["accumulator"],
                                     svm_run["s2"][n]["accumulator"]) for n in svm_run["s1"]}}
    for r in res["rows"]:
        x, y = want[r["name"]]
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        assert r["status"] == "compared" and r["size"] == d.size
        assert r["differing"] == np.count_nonzero(d) and r["max_abs"] == d.max()
        assert math.isclose(r["mean_abs"], d.mean(), rel_tol=1e-12)
    seen.clear()
    res2 = analysis.diff(svm_run["c1"], svm_run["run"] / "model.h5")   # a model file: none
    assert len(seen) == 2 and {r["name"] for r in res2["rows"]} == set(want)


def test_cli_diff_shape_mismatch_is_reported_and_exits_0(svm_run, tmp_path):
    text = SVM_JOB.replace("n_features = 50", "n_features = 64")
    t, s = logistic(3, nf=64)
    other = write_checkpoint(tmp_path / "other", 5, t, s, cfg_text=text, n_servers=2)
    proc = run_cli(["diff", svm_run["c1"], other])
    assert proc.returncode == 0, proc.stderr
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines()[3:]}
    assert lines["weights"].endswith("shapes differ: A (50, 1) vs B (64, 1); not compared")
    assert lines["weights__accumulator"].endswith("shapes differ: A (50, 1) vs B (64, 1); not compared")
    assert proc.stdout.splitlines()[0] == f"A: checkpoint {svm_run['c1']} (step 10)"
    bias = [ln for ln in proc.stdout.splitlines() if ln.startswith("bias ")]
    assert len(bias) == 1 and "(1, 1)" in bias[0] and "of 1" in bias[0]


# --------------------------------------------------------------- tools and the CLI


@pytest.mark.skipif(shutil.which("h5ls") is None or shutil.which("h5dump") is None,
                    reason="HDF5 command-line tools not installed (Debian: hdf5-tools)")
def test_hdf5_tools_read_manifest_and_shards(svm_run, tmp_path):
    man = svm_run["c2"] / "manifest.h5"
    out = subprocess.run(["h5ls", "-r", man], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert "/tables/weights          Dataset {50, 1}" in out
    assert "/tables/weights_keys     Dataset {50}" in out and "/slots/weights/accumulator" in out
    out = subprocess.run(["h5dump", "-H", man], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert 'DATASET "weights"' in out and "( 50, 1 )" in out and 'ATTRIBUTE "format"' in out
    out = subprocess.run(["h5dump", "-a", "/format", man], capture_output=True, text=True, check=True).stdout
    assert f'"{ckpt.FORMAT}"' in out
    # the virtual dataset's data really comes from the shards, run from another directory
    out = subprocess.run(["h5dump", "-d", "/tables/weights_keys", "-y", "-w", "0", man],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    data = out.split("DATA {")[1].split("}")[0]
    keys = [int(x) for x in data.replace(",", " ").split()]
    with h5py.File(man, "r") as f:
        assert keys == f["tables/weights_keys"][()].tolist()
    assert sorted(keys) == list(range(NF))
    for s in range(3):
        shard = svm_run["c2"] / f"shard-{s:04d}.h5"
        out = subprocess.run(["h5ls", "-r", shard], capture_output=True, text=True, check=True).stdout
        assert "/tables/weights/rows" in out and "/tables/weights/slots/accumulator" in out
        subprocess.run(["h5dump", "-H", shard], capture_output=True, check=True)


def test_hpcps_command_has_the_analysis_subcommands(svm_run):
    from hpcps.cli import main as cli

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    if "inspect" not in sub.choices:
        pytest.skip("hpcps.cli.main.build_parser does not call hpcps.cli.analysis.register yet")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from hpcps.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "inspect", svm_run["c2"]], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "step         20" in proc.stdout


def _dyn_model(path, keys, rows):
    """A model file with a dynamic table: ``weights`` rows beside ``weights_keys``."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["job_name"], f.attrs["config"] = "dyn", ""
        f["weights_keys"] = np.asarray(keys, dtype=np.int64)
        f["weights"] = np.asarray(rows, dtype=np.float64).reshape(-1, 1)
        f["bias"] = np.zeros((1, 1))
    return path


def test_diff_of_dynamic_tables_compares_by_key(tmp_path):
    """Two dynamic tables storing different key sets: the rows of the common keys are
    compared key to key (not by position), keys stored by one side only are counted."""
    big = 1 << 61
    a = _dyn_model(tmp_path / "a.h5", [3, 7, big], [1.0, 2.0, 3.0])
    b = _dyn_model(tmp_path / "b.h5", [0, 3, big, big + 5], [9.0, 1.0, 3.5, 4.0])
    rows = {r["name"]: r for r in analysis.diff(a, b)["rows"]}
    assert sorted(rows) == ["bias", "weights"]            # weights_keys is not a row
    w = rows["weights"]
    assert w["status"] == "compared" and w["size"] == 2, w   # keys 3 and 2^61
    assert w["differing"] == 1 and w["max_abs"] == 0.5
    assert (w["keys_common"], w["only_a"], w["only_b"]) == (2, 1, 2)
    text = analysis.format_diff(analysis.diff(a, b))
    assert "(by key: 2 keys in both, 1 only in A, 2 only in B)" in text, text
    # the same keys, stored in another order: identical
    c = _dyn_model(tmp_path / "c.h5", [big, 7, 3], [3.0, 2.0, 1.0])
    w = {r["name"]: r for r in analysis.diff(a, c)["rows"]}["weights"]
    assert w["differing"] == 0 and w["size"] == 3, w


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``hpcps inspect ... | head``: the closed pipe ends the command with status 0 and nothing
    on stderr (found by a trial: "hpcps inspect: error: [Errno 32] Broken pipe")."""
    import subprocess
    import sys

    code = ("import sys\nfrom hpcps.cli.analysis import _guard\n"
            "@_guard\ndef f(args):\n    for i in range(200000):\n        print('x' * 80)\n"
            "    return 0\nclass A:\n    command = 'inspect'\nsys.exit(f(A()))\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0, err
    assert err == ""
