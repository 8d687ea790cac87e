"""End-to-end: ``hpcps inspect|eval|export|plot`` on the run directories of real short runs of
every kind of model — MovieLens-100K matrix factorization (BSP, 2 servers), the Fashion-MNIST
MLP under async (Downpour), and the user model of examples/plugins (a linear SVM on Adult).

Each run is a real ``hpcps run`` (mpirun, servers and workers) of a few seconds; the analysis
commands run in fresh processes as a user types them. Expected values are computed here
independently of hpcps.analysis: from ``metrics.json`` (the workers' own evaluation of the
final model under BSP), or from the tables of ``model.h5`` with numpy / scikit-learn.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcps.analysis import offline as analysis
from hpcps.data import DataError
from tests.helpers import ROOT, hpcps

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

ADULT = ROOT / "data" / "adult.csv.gz"
PLUGINS = ROOT / "examples" / "plugins"

MF_JOB = """
name = "ml"
seed = 0
[cluster]
servers = 2
[data]
format = "prepared"
path = "{data}"
max_rows = 8000
[model]
type = "mf"
factors = 8
dtype = "float32"
[optimizer]
name = "adagrad"
learning_rate = 0.1
[train]
epochs = 2
batch_size = 512
[consistency]
model = "bsp"
[checkpoint]
at_end = true
"""

MLP_JOB = """
name = "fm"
seed = 0
[cluster]
servers = 1
[data]
format = "prepared"
path = "{data}"
max_rows = 3000
[model]
type = "mlp"
hidden = [32]
dtype = "float32"
[optimizer]
name = "adagrad"
learning_rate = 0.05
[train]
epochs = 2
batch_size = 64
[consistency]
model = "async"
n_fetch = 1
n_push = 1
[checkpoint]
at_end = true
"""

SVM_JOB = """
name = "svm"
seed = 0
[cluster]
servers = 1
[data]
format = "adult_csv"
path = "{data}"
max_rows = 6000
hash_bits = 14
[model]
type = "hinge:LinearSVM"
l2 = 1e-5
dtype = "float32"
[optimizer]
name = "adagrad"
learning_rate = 0.05
[train]
epochs = 2
batch_size = 128
[checkpoint]
at_end = true
"""


def _run(tmp, name, text, n, env=None):
    """``hpcps run -n N`` of a job in ``tmp``; its run directory ``tmp/runs/NAME``."""
    job = tmp / f"{name}.toml"
    job.write_text(text)
    proc, _ = hpcps(["run", "-n", n, job], cwd=tmp, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp / "runs" / name
    assert (run / "model.h5").is_file() and (run / "metrics.json").is_file()
    return run


def _env(**extra):
    from tests.helpers import mpi_env

    return mpi_env(**extra)


@pytest.fixture(scope="module")
def mf(tmp_path_factory):
    from hpcps.data.movielens import prepare_movielens_100k

    tmp = tmp_path_factory.mktemp("mf")
    data = tmp / "ml.h5"
    try:
        prepare_movielens_100k(None, data)
    except DataError as e:
        pytest.skip(f"MovieLens-100K not available: {e}")
    return {"run": _run(tmp, "ml", MF_JOB.format(data=data), 4), "data": data, "dir": tmp}


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    from hpcps.data.fashion_mnist import DEFAULT_SOURCE, FILES, prepare_fashion_mnist

    if not (DEFAULT_SOURCE / FILES["train"][0]).exists():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    tmp = tmp_path_factory.mktemp("fm")
    data = tmp / "fm.h5"
    prepare_fashion_mnist(DEFAULT_SOURCE, data)
    return {"run": _run(tmp, "fm", MLP_JOB.format(data=data), 3), "data": data, "dir": tmp}


@pytest.fixture(scope="module")
def svm(tmp_path_factory):
    if not ADULT.exists():
        pytest.skip("data/adult.csv.gz not present")
    tmp = tmp_path_factory.mktemp("svm")
    env = _env(PYTHONPATH=os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
    return {"run": _run(tmp, "svm", SVM_JOB.format(data=ADULT), 3, env=env), "dir": tmp,
            "env": env}


def _last_epoch(run):
    return json.loads((run / "metrics.json").read_text())["epochs"][-1]


def _checkpoint(run):
    steps = sorted((run / "ckpt").iterdir())
    assert steps, run
    return steps[-1]


# ------------------------------------------------------------------------------ plot


def test_plot_mf_run_draws_rmse_mae_and_no_empty_panel(mf, tmp_path):
    """22.7: the MF run's metrics are MSE, RMSE and MAE; no AUC or log-loss panel (they were
    drawn empty, and counted)."""
    out = tmp_path / "mf.png"
    path, panels = analysis.plot_run(mf["run"], out)
    assert path == out
    assert panels == ["MSE vs epoch", "MSE vs wall time (s)", "test RMSE, MAE vs epoch",
                      "test RMSE, MAE vs wall time (s)", "bytes per server",
                      "staleness histogram (BSP)"], panels
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[0] > 600 and img.std() > 0


def test_plot_async_mlp_run_draws_accuracy_and_the_staleness_histogram(mlp):
    """22.7: Fashion-MNIST's accuracy curve and the async staleness histogram metrics.json
    holds (summary.consistency.staleness) are drawn; no AUC panel."""
    m = json.loads((mlp["run"] / "metrics.json").read_text())
    hist = m["summary"]["consistency"]["staleness"]["histogram"]
    assert sum(hist.values()) > 0
    path, panels = analysis.plot_run(mlp["run"])
    assert path == mlp["run"] / "curves.png"
    assert panels[:4] == ["log-loss vs epoch", "log-loss vs wall time (s)",
                          "test accuracy vs epoch", "test accuracy vs wall time (s)"], panels
    assert panels[4] == "bytes per server"
    assert panels[5].startswith("staleness histogram (ASYNC(n_fetch=1, n_push=1))"), panels
    assert not any("AUC" in p for p in panels)


def test_plot_user_model_run_draws_its_own_metrics(svm):
    path, panels = analysis.plot_run(svm["run"])
    assert panels[:4] == ["hinge loss vs epoch", "hinge loss vs wall time (s)",
                          "test accuracy, AUC vs epoch", "test accuracy, AUC vs wall time (s)"], panels


# ------------------------------------------------------------------------------ eval


def test_eval_mf_checkpoint_and_model_equal_the_runs_own_test_metrics(mf):
    """22.8: ``hpcps eval`` of the MF model (was: "eval supports 'logistic'"); under BSP the
    workers' evaluation of the last epoch used the final weights, so the figures agree."""
    last = _last_epoch(mf["run"])
    for src in (mf["run"], _checkpoint(mf["run"]), mf["run"] / "model.h5"):
        res = analysis.evaluate(src, mf["data"])
        assert res["model"] == "mf" and res["rows"] == last["test_rows"] == 8000
        for k in ("mse", "rmse", "mae"):
            assert res["metrics"][k] == pytest.approx(last[f"test_{k}"], rel=1e-9), (src, k)
    proc, _ = hpcps(["eval", mf["run"], "--data", mf["data"]], cwd=mf["dir"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"model mf: MSE [\d.]+  RMSE [\d.]+  MAE [\d.]+", proc.stdout), proc.stdout
    assert "8,000 rows" in proc.stdout and "positive" not in proc.stdout


def _mlp_reference(model_h5, data):
    """Test log-loss and accuracy of model.h5's MLP, computed here with numpy."""
    with h5py.File(data, "r") as f:
        X = f["test/X"][:3000].astype(np.float64) / 255.0
        y = f["test/y"][:3000].astype(np.int64)
    with h5py.File(model_h5, "r") as f:
        w0, b0, w1, b1 = (f[k][()].astype(np.float64) for k in ("w0", "b0", "w1", "b1"))
    z = np.maximum(X @ w0 + b0, 0) @ w1 + b1
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return {"logloss": float(-logp[np.arange(y.size), y].mean()),
            "accuracy": float((logp.argmax(axis=1) == y).mean())}


def test_eval_mlp_matches_a_numpy_forward_pass(mlp):
    want = _mlp_reference(mlp["run"] / "model.h5", mlp["data"])
    res = analysis.evaluate(mlp["run"] / "model.h5", mlp["data"])
    assert res["model"] == "mlp" and res["rows"] == 3000 and res["positives"] is None
    assert res["metrics"]["accuracy"] == pytest.approx(want["accuracy"], abs=1 / 3000)
    assert res["metrics"]["logloss"] == pytest.approx(want["logloss"], rel=1e-4)
    assert res["metrics"]["accuracy"] > 0.3                      # chance: 0.1


def test_eval_user_model_through_its_metrics(svm, tmp_path):
    """22.8: a user model (examples/plugins/hinge.py) is scored by its own ``metrics``, with
    the PYTHONPATH of the run; without it the error says what to set."""
    from sklearn.metrics import accuracy_score, hinge_loss, roc_auc_score

    from hpcps.data.adult import load_adult_partition

    X, y = load_adult_partition(ADULT, "test", 0, 1, hash_bits=14, numeric_bins=8, crosses=True,
                                test_fraction=0.2, split_seed=0, max_rows=6000)
    with h5py.File(svm["run"] / "model.h5", "r") as f:
        w, b = f["w"][()].astype(np.float64), float(f["b"][0, 0])
    f_x = X @ w[:, 0] + b
    want = {"hinge": hinge_loss(2 * y - 1, f_x), "accuracy": accuracy_score(y, f_x >= 0),
            "auc": roc_auc_score(y, f_x)}
    proc, _ = hpcps(["eval", _checkpoint(svm["run"]), "--data", ADULT], cwd=tmp_path,
                    env=svm["env"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("model linear-svm: hinge loss "), line
    got = dict(re.findall(r"(hinge loss|accuracy|AUC) ([\d.]+)", line))
    assert float(got["hinge loss"]) == pytest.approx(want["hinge"], rel=1e-4)
    assert float(got["accuracy"]) == pytest.approx(want["accuracy"], abs=1 / X.shape[0])
    assert float(got["AUC"]) == pytest.approx(want["auc"], rel=1e-4)
    assert "1,200 rows" in proc.stdout and "positive" in proc.stdout
    env = dict(svm["env"], PYTHONPATH="")
    proc, _ = hpcps(["eval", svm["run"], "--data", ADULT], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import module 'hinge'" in lines[0] and "PYTHONPATH" in lines[0]


# --------------------------------------------------------------------- inspect, paths


def test_inspect_counts_epochs_alike_on_checkpoint_and_model_file(mf):
    """22.10: the end-of-run checkpoint and model.h5 of a 2-epoch run both say 2 epochs done
    (the checkpoint said "epoch 1" — the 0-based index — next to "last: epoch 2")."""
    ck = analysis.format_inspect(analysis.inspect(_checkpoint(mf["run"])))
    mo = analysis.format_inspect(analysis.inspect(mf["run"] / "model.h5"))
    assert re.search(r"^epochs done  2  \(end of epoch 2: \d+ of \d+ steps\)$", ck, re.M), ck
    assert re.search(r"^epochs done  2$", mo, re.M), mo
    assert "last: epoch 2: test MSE" in ck and "RMSE" in ck and "AUC" not in ck
    step = re.search(r"^step +(\d+)", ck, re.M).group(1)
    assert re.search(rf"^step +{step} ", mo, re.M)


def test_export_and_plot_print_the_absolute_path_they_wrote(mf, tmp_path):
    """22.10: relative arguments, default outputs: the message names the file in full."""
    work = tmp_path / "here"
    work.mkdir()
    rel = Path(os.path.relpath(mf["run"], work))
    proc, _ = hpcps(["export", rel], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    npz = sorted(work.glob("ml-step-*.npz"))
    assert len(npz) == 1 and proc.stdout.startswith(f"wrote {npz[0]} from "), proc.stdout
    proc, _ = hpcps(["plot", rel, "-o", "c.svg"], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {work / 'c.svg'} (6 panels: "), proc.stdout
    proc, _ = hpcps(["plot", rel], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {mf['run'].resolve() / 'curves.png'} ("), proc.stdout


# -------------------------------------------------------- a missing shard (23.4)


def _recipe_section() -> str:
    """The documentation text around the plain-h5py recipe for a checkpoint's tables."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        at = text.find('f["tables/weights_keys"]')
        if at >= 0:                   # from the recipe to the next heading
            return re.split(r"\n#+ ", text[at:])[0]
    pytest.fail("no documentation page holds the h5py recipe (f[\"tables/weights_keys\"])")


def test_plain_h5py_reads_zeros_for_a_missing_shard_and_inspect_refuses(mf, tmp_path):
    """23.4: the documented h5py recipe on a checkpoint whose shard file is gone returns the
    virtual dataset's fill value 0 for that server's rows, without an error; the docs say so
    next to the recipe and send the reader to ``hpcps inspect``, which refuses it."""
    d = tmp_path / _checkpoint(mf["run"]).name
    shutil.copytree(_checkpoint(mf["run"]), d)
    with h5py.File(d / "manifest.h5", "r") as f:
        lo, hi = (int(v) for v in f["partition/user_factors/ranges"][1])
    (d / "shard-0001.h5").unlink()
    with h5py.File(d / "manifest.h5", "r") as f:                  # the recipe, verbatim
        rows, keys = f["tables/user_factors"][()], f["tables/user_factors_keys"][()]
    assert hi > lo and not rows[lo:hi].any() and not keys[lo:hi].any()   # silently zeros
    assert rows[:lo].any()
    proc, _ = hpcps(["inspect", d], timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "shard shard-0001.h5 is missing" in proc.stderr, proc.stderr
    text = " ".join(_recipe_section().split())
    assert "missing shard" in text and "zeros" in text and "hpcps inspect" in text, text
