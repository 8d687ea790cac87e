"""End-to-end: ``hpcps data prepare movielens-100k`` then the shipped MF job under mpirun on
the real MovieLens-100K split (2 servers + 2 workers, sized for CI)."""

import json
import re
import shutil

import h5py
import pytest

from hpcps.config import load_job
from hpcps.data import DataError
from hpcps.data.movielens import recbole_copy
from tests.helpers import ROOT, hpcps

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

SHIPPED = ROOT / "jobs" / "movielens_mf.toml"
# CI sizing: 2 workers × 1024 rows per step (40 steps an epoch), 4 epochs, a larger step
CI = {"servers": "2", "batch_size": "1024", "epochs": "4", "learning_rate": "0.2"}


def _ci_job(text: str) -> str:
    for key, value in CI.items():
        text, n = re.subn(rf"(?m)^{key} = \S+", f"{key} = {value}", text)
        assert n == 1, f"{SHIPPED}: no single '{key} = ...' line"
    return text + '\n[output]\ndir = "out"\n'


def test_prepare_then_train_the_shipped_job_reaches_rmse_093(tmp_path):
    try:
        recbole_copy()
    except DataError as e:
        pytest.skip(f"MovieLens-100K not available: {e}")
    (tmp_path / "jobs").mkdir()
    proc, _ = hpcps(["data", "prepare", "movielens-100k"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "movielens-100k.h5").is_file()
    # the shipped job file is valid where its data is (jobs/ next to data/)
    shutil.copy(SHIPPED, tmp_path / "jobs" / SHIPPED.name)
    assert load_job(tmp_path / "jobs" / SHIPPED.name).model.type == "mf"
    job = tmp_path / "jobs" / "ci.toml"
    job.write_text(_ci_job(SHIPPED.read_text()))

    proc, secs = hpcps(["run", "-n", "4", job], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    assert "2 worker(s), 2 server(s)" in proc.stdout and "model mf" in proc.stdout
    assert re.search(r"epoch 4: train MSE [\d.]+ +test RMSE 0\.9[0-2]\d\d", proc.stdout)
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    last = m["epochs"][-1]
    assert last["test_rows"] == 20_000                 # rows of test-only items scored too
    assert last["test_rmse"] <= 0.93, last
    assert last["test_rmse"] < m["epochs"][0]["test_rmse"]
    assert last["test_mae"] < last["test_rmse"]
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        assert f["user_factors"].shape == (943, 32) and f["item_bias"].shape[1] == 1
        n_items = f["item_factors"].shape[0]
    with h5py.File(tmp_path / "data" / "movielens-100k.h5", "r") as f:
        assert n_items == f.attrs["n_items"] and f.attrs["test_rows_unseen_item"] > 0


def test_one_worker_on_two_servers_equals_the_single_process_reference(tmp_path):
    """1 worker + 2 servers under BSP, float64: the trained tables are bit-identical to
    hpcps.models.local.train_local (same initial rows on any server count, same kernels);
    allreduce mode on one rank trains the same tables too."""
    import numpy as np

    from hpcps.data.movielens import prepare_movielens_100k
    from hpcps.runtime.job import load_model
    from hpcps.models.local import train_local

    try:
        prepare_movielens_100k(None, tmp_path / "ml.h5")
    except DataError as e:
        pytest.skip(f"MovieLens-100K not available: {e}")
    job = tmp_path / "ref.toml"
    job.write_text(_ci_job(SHIPPED.read_text()).replace('"../data/movielens-100k.h5"', '"ml.h5"')
                   .replace('dtype = "float32"', 'dtype = "float64"')
                   .replace("epochs = 4", "epochs = 2").replace("batch_size = 1024", "batch_size = 200")
                   .replace("[data]", "[data]\nmax_rows = 4000"))
    proc, _ = hpcps(["run", "-n", "3", job], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 worker(s), 2 server(s)" in proc.stdout
    cfg = load_job(job)
    model = load_model(cfg)
    tables, hist = train_local(model, cfg.train.epochs, cfg.train.batch_size, seed=cfg.seed)
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        for name, w in tables.w.items():
            np.testing.assert_array_equal(f[name][()], w, err_msg=name)
            assert f[name].dtype == np.float64
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["epochs"][-1]["test_rmse"] == pytest.approx(hist[-1]["test_rmse"], rel=1e-12)
    # [cluster] mode = "allreduce" on 1 rank starts from the same rows and trains the same
    ar = tmp_path / "ar.toml"
    ar.write_text(job.read_text().replace("servers = 2", 'mode = "allreduce"')
                  .replace('dir = "out"', 'dir = "out_ar"'))
    proc, _ = hpcps(["run", "-n", "1", ar], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with h5py.File(tmp_path / "out_ar" / "model.h5", "r") as f:
        for name, w in tables.w.items():
            np.testing.assert_allclose(f[name][()], w, rtol=1e-12, atol=1e-15, err_msg=name)
