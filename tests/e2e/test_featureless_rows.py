"""Rows without features (label-only svmlight lines, which are valid) train, end to end
(issue 21.1: a minibatch, or a worker's whole share, of such rows crashed in
``worker/steps.py`` with ``cannot reshape array of size 0 into shape (0,newaxis)``).
A row with no features is a row: its gradient touches only the bias."""

import h5py
import numpy as np

from tests.helpers import launch, write_job

JOB = """
name = "featureless"
[data]
format = "svmlight"
path = "{train}"
test_path = "{test}"
index_base = 1
n_features = 8
[model]
l2 = 0.0
[optimizer]
name = "sgd"
learning_rate = 0.5
[train]
epochs = 1
batch_size = {batch}
shuffle = false
[output]
dir = "out"
"""


def _model(tmp_path):
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        return f["weights"][()].ravel(), float(f["bias"][()].ravel()[0])


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def test_minibatches_of_rows_without_features_batch_size_1(tmp_path):
    """1 worker, batch size 1, rows in file order: the label-only rows move the bias alone;
    the bias and the one weight are those of plain SGD by hand."""
    (tmp_path / "train.svm").write_text("1\n1\n0\n1 2:1\n0\n")
    (tmp_path / "test.svm").write_text("1 1:1\n0 2:1\n")
    job = write_job(tmp_path / "j.toml", JOB.format(train=tmp_path / "train.svm",
                                                    test=tmp_path / "test.svm", batch=1))
    proc, _ = launch(2, ["train", job], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "5 steps, 5 examples" in proc.stdout, proc.stdout
    b, w2 = 0.0, 0.0
    for y, x2 in [(1, 0), (1, 0), (0, 0), (1, 1), (0, 0)]:
        g = _sigmoid(b + w2 * x2) - y
        b, w2 = b - 0.5 * g, w2 - 0.5 * g * x2
    w, bias = _model(tmp_path)
    np.testing.assert_allclose(bias, b, rtol=1e-5)
    np.testing.assert_allclose(w, [0, w2, 0, 0, 0, 0, 0, 0], rtol=1e-5, atol=1e-7)


def test_a_workers_whole_share_without_features(tmp_path):
    """5 workers over a 5-row file, batch 256: each worker holds one row, two of them hold
    only a label-only row. Every row counts once (BSP: the step's mean over the 5 rows)."""
    (tmp_path / "train.svm").write_text("1 1:1 3:0.5\n0\n1 2:1\n0 4:1\n1\n")
    (tmp_path / "test.svm").write_text("1 1:1\n0 2:1\n")
    job = write_job(tmp_path / "j.toml", JOB.format(train=tmp_path / "train.svm",
                                                    test=tmp_path / "test.svm", batch=256))
    proc, _ = launch(6, ["train", job], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "5 worker(s)" in proc.stdout and "5 examples" in proc.stdout, proc.stdout
    w, bias = _model(tmp_path)
    # one BSP step from zero: every prediction is 0.5; gradient means over the 5 rows
    labels = np.array([1, 0, 1, 0, 1.0])
    np.testing.assert_allclose(bias, -0.5 * np.mean(0.5 - labels), rtol=1e-5)
    np.testing.assert_allclose(w, -0.5 * np.array([-0.5, -0.5, -0.25, 0.5, 0, 0, 0, 0]) / 5,
                               rtol=1e-5, atol=1e-7)
