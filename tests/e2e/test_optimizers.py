"""Adam and FTRL-Proximal end to end: the shipped Adult job (jobs/adult_lr.toml) under
mpirun with ``[optimizer] name`` switched, against the AdaGrad run of the same job."""

import json
import re

import h5py
import numpy as np
import pytest

from hpcps import checkpoint as ck
from tests.helpers import DATA, ROOT, launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

SHIPPED = (ROOT / "jobs" / "adult_lr.toml").read_text()


def shipped_job(tmp_path, tag, name, learning_rate, extra=""):
    """jobs/adult_lr.toml with another rule and learning rate (keys of the rule added after
    ``learning_rate``), no scikit-learn baseline, output under ``tmp_path``."""
    text = SHIPPED.replace('name = "adult_lr"', f'name = "{tag}"')
    text = re.sub(r'(?m)^name = "adagrad"', f'name = "{name}"', text)
    text = re.sub(r"(?m)^learning_rate = 0\.1\b", f"learning_rate = {learning_rate}\n{extra}", text)
    text = text.replace('path = "../data/adult.csv.gz"', f'path = "{DATA}"')
    text = text.replace("sklearn_baseline = true", "sklearn_baseline = false")
    text = text.replace('dir = ""', f'dir = "{tmp_path / tag}"')
    assert f'name = "{name}"' in text and f"learning_rate = {learning_rate}" in text
    return write_job(tmp_path / f"{tag}.toml", text)


def final(tmp_path, tag):
    m = json.loads((tmp_path / tag / "metrics.json").read_text())
    with h5py.File(tmp_path / tag / "model.h5", "r") as f:
        w = f["weights"][()]
    return m["epochs"][-1]["test_auc"], w, m["summary"]["steps"]


def test_adult_adam_and_ftrl_reach_the_adagrad_auc(tmp_path):
    """1 server + 3 workers, 3 epochs over the full Adult data, as the quick start."""
    results = {}
    for tag, name, lr, extra in [("ada", "adagrad", 0.1, ""),
                                 ("adam", "adam", 0.003, ""),
                                 ("ftrl", "ftrl", 0.3, "l1 = 0.01\n")]:
        proc, _ = launch(4, ["train", shipped_job(tmp_path, tag, name, lr, extra)], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"{name} lr={lr}" in proc.stdout
        results[tag] = final(tmp_path, tag)
    auc = {t: r[0] for t, r in results.items()}
    print("test AUC", auc)
    assert auc["ada"] > 0.90, auc
    assert auc["adam"] >= auc["ada"] - 0.01 and auc["ftrl"] >= auc["ada"] - 0.01, auc
    # FTRL's L1 leaves exact zeros: far fewer non-zero weights than the rows AdaGrad touched
    nnz = {t: int(np.count_nonzero(r[1])) for t, r in results.items()}
    assert nnz["ftrl"] < 0.6 * nnz["ada"], nnz
    # the final checkpoints hold every slot by name; Adam's step counts are per row: the
    # bias (dense, 1 row) is updated in every step, a weight at most that often
    steps = results["adam"][2]
    d = ck.step_dir(tmp_path / "adam", ck.list_steps(tmp_path / "adam")[-1])
    m = ck.verify(d)
    assert m["partition"]["weights"]["slots"] == ["m", "step", "v"]
    with h5py.File(d / ck.MANIFEST, "r") as f:
        step_w, step_b = f["slots/weights/step"][()], f["slots/bias/step"][()]
        assert step_w.dtype == np.int64 and step_w.shape == (2**20,)
        assert step_b.tolist() == [steps]
        assert 0 < step_w.max() <= steps and np.count_nonzero(step_w) == nnz["adam"]
    d = ck.step_dir(tmp_path / "ftrl", ck.list_steps(tmp_path / "ftrl")[-1])
    assert ck.verify(d)["partition"]["weights"]["slots"] == ["n", "z"]
