"""Biased matrix factorization (hpcps.models.mf): gradients, unseen ids, input checks, and
quality on the real MovieLens-100K trained in one process with the servers' optimizer kernels."""

import numpy as np
import pytest

from hpcps.config import ConfigError, load_job
from hpcps.data import DataError
from hpcps.data.movielens import prepare_movielens_100k, recbole_copy
from hpcps.data.prepared import PreparedError, write_prepared
from hpcps.models.load import load_model
from hpcps.models.local import LocalTables, evaluate, train_local
from hpcps.models.mf import (ITEM_BIAS, ITEM_FACTORS, USER_BIAS, USER_FACTORS,
                             MatrixFactorization, mf_loss_grad)

JOB = """
name = "mf_test"
seed = {seed}
[data]
format = "prepared"
path = "{path}"
[model]
type = "mf"
factors = {factors}
init_scale = 0.1
l2 = {l2}
dtype = "{dtype}"
[optimizer]
name = "adagrad"
learning_rate = {lr}
initial_accumulator = 1e-6
[train]
epochs = {epochs}
batch_size = {batch}
"""


def job(tmp_path, path, seed=0, factors=32, l2=0.1, dtype="float32", lr=0.1, epochs=6, batch=768):
    f = tmp_path / "job.toml"
    f.write_text(JOB.format(path=path, seed=seed, factors=factors, l2=l2, dtype=dtype, lr=lr,
                            epochs=epochs, batch=batch))
    return load_job(f)


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
    try:
        recbole_copy()
    except DataError as e:
        pytest.skip(f"MovieLens-100K not available: {e}")
    return prepare_movielens_100k(None, tmp_path_factory.mktemp("ml") / "ml.h5")


def tiny_file(tmp_path, X_train, X_test, n_users, n_items, **extra):
    """A small prepared rating file (ratings 1..5)."""
    rng = np.random.default_rng(0)
    Xtr, Xte = np.asarray(X_train, dtype=np.int64), np.asarray(X_test, dtype=np.int64)
    ytr = rng.integers(1, 6, len(Xtr)).astype(np.float32)
    yte = rng.integers(1, 6, len(Xte)).astype(np.float32)
    attrs = {"dataset": "tiny", "task": "regression", "n_users": n_users, "n_items": n_items,
             "global_mean": float(ytr.mean()), "rating_min": 1.0, "rating_max": 5.0, **extra}
    return write_prepared(tmp_path / "tiny.h5", {"train": (Xtr, ytr), "test": (Xte, yte)}, attrs)


def test_gradient_matches_finite_differences():
    """Central differences of sse + penalty (float64) against the gradient sums, with repeated
    users and items in the batch (their contributions must add up)."""
    rng = np.random.default_rng(1)
    k, B = 4, 12
    users = rng.integers(0, 4, B)
    items = rng.integers(0, 5, B)
    y = rng.integers(1, 6, B).astype(np.float64)
    uk, ik = np.unique(users), np.unique(items)
    keys = {USER_FACTORS: uk, USER_BIAS: uk, ITEM_FACTORS: ik, ITEM_BIAS: ik}
    params = {USER_FACTORS: rng.normal(0, 0.5, (uk.size, k)), ITEM_FACTORS: rng.normal(0, 0.5, (ik.size, k)),
              USER_BIAS: rng.normal(0, 0.3, (uk.size, 1)), ITEM_BIAS: rng.normal(0, 0.3, (ik.size, 1))}
    mu, l2 = 3.5, 0.07

    def objective(p):
        sse, pen, _ = mf_loss_grad(users, items, y, keys, p, mu, l2)
        return sse + pen

    sse, pen, grads = mf_loss_grad(users, items, y, keys, params, mu, l2)
    assert sse > 0 and pen > 0
    h = 1e-6
    for t, w in params.items():
        assert grads[t].shape == w.shape and grads[t].dtype == np.float64
        num = np.zeros_like(w)
        for idx in np.ndindex(*w.shape):
            plus = {s: v.copy() for s, v in params.items()}
            minus = {s: v.copy() for s, v in params.items()}
            plus[t][idx] += h
            minus[t][idx] -= h
            num[idx] = (objective(plus) - objective(minus)) / (2 * h)
        np.testing.assert_allclose(grads[t], num, rtol=1e-6, atol=1e-7, err_msg=t)
    # sse is the plain squared error of r̂ = μ + b_u + b_i + p_u·q_i
    ru, ri = np.searchsorted(uk, users), np.searchsorted(ik, items)
    pred = (mu + params[USER_BIAS][ru, 0] + params[ITEM_BIAS][ri, 0]
            + (params[USER_FACTORS][ru] * params[ITEM_FACTORS][ri]).sum(1))
    assert sse == pytest.approx(((pred - y) ** 2).sum(), rel=1e-12)


def test_model_protocol_on_a_tiny_file(tmp_path):
    """Tables, keys and dtypes; loss_grad returns the squared error only, in the table dtype."""
    Xtr = [[0, 0], [1, 1], [2, 2], [0, 2], [1, 0]]
    path = tiny_file(tmp_path, Xtr, [[0, 1]], n_users=3, n_items=3)
    cfg = job(tmp_path, path, factors=5, l2=0.3)
    m = load_model(cfg)
    assert isinstance(m, MatrixFactorization) and m.primary_metric == "rmse"
    tabs = m.tables()
    specs = {s.name: s for s, _ in tabs}
    assert [s.name for s, _ in tabs] == [USER_FACTORS, ITEM_FACTORS, USER_BIAS, ITEM_BIAS]
    assert (specs[USER_FACTORS].num_keys, specs[USER_FACTORS].dim) == (3, 5)
    assert specs[USER_FACTORS].init_std == 0.1 and specs[USER_BIAS].init_std == 0.0
    assert all(s.sparse and s.dtype == "float32" for s in specs.values())
    assert all(o.l2 == 0.0 and o.name == "adagrad" for _, o in tabs)   # λ is in the gradient
    X, y = m.load("train", 0, 1)
    keys = m.batch_keys(X)
    np.testing.assert_array_equal(keys[USER_FACTORS], [0, 1, 2])
    tables = LocalTables(tabs, seed=0)
    loss, grads = m.loss_grad(X, y, keys, tables.pull(keys))
    pred = m.predict(X, keys, tables.pull(keys))
    assert loss == pytest.approx(((np.clip(pred, 1, 5) - y) ** 2).sum(), rel=1e-5)
    assert all(grads[t].dtype == np.float32 and grads[t].shape == (3, specs[t].dim) for t in grads)


def test_test_only_ids_are_predicted_from_the_biases(tmp_path):
    """Indices >= n_users / n_items (ids seen only in test) pull no rows, raise nothing, and are
    predicted as μ + the known side's bias, clipped to the rating range."""
    Xtr = [[0, 0], [1, 1], [0, 1]]
    Xte = [[0, 1], [1, 2], [2, 0], [2, 2]]          # item 2 and user 2 exist only in test
    path = tiny_file(tmp_path, Xtr, Xte, n_users=2, n_items=2)
    m = load_model(job(tmp_path, path, factors=3))
    tables = LocalTables(m.tables(), seed=4)
    rng = np.random.default_rng(2)
    for t in (USER_BIAS, ITEM_BIAS):
        tables.w[t][:] = rng.normal(0, 0.4, tables.w[t].shape)
    X, _ = m.load("test", 0, 1)
    keys = m.batch_keys(X)
    np.testing.assert_array_equal(keys[USER_FACTORS], [0, 1])
    np.testing.assert_array_equal(keys[ITEM_FACTORS], [0, 1])
    pred = m.predict(X, keys, tables.pull(keys))
    w, mu = tables.w, m.mu
    full = mu + w[USER_BIAS][0, 0] + w[ITEM_BIAS][1, 0] + w[USER_FACTORS][0] @ w[ITEM_FACTORS][1]
    want = [full, mu + w[USER_BIAS][1, 0], mu + w[ITEM_BIAS][0, 0], mu]
    np.testing.assert_allclose(pred, np.clip(want, 1, 5), rtol=1e-6)
    # a batch of unknown ids only: no table is pulled, the prediction is μ
    only = np.array([[2, 2]])
    assert m.batch_keys(only) == {}
    np.testing.assert_allclose(m.predict(only, {}, {}), [mu])
    # training on a row without a pulled row is refused with the id named, never an IndexError
    with pytest.raises(ValueError, match="item 2 of the batch has no row"):
        m.loss_grad(X[1:2], np.array([3.0]), keys, tables.pull(keys))


@pytest.mark.parametrize("X_train, X_test, match", [
    ([[0, 0, 0]], [[0, 0]], r"/train/X must be integer \(n, 2\)"),
    ([[0, 0], [-1, 0]], [[0, 0]], r"/train/X row 1 of part 0/1 is \[-1, 0\]"),
    ([[0, 0], [0, 2]], [[0, 0]], r"/train/X row 1 of part 0/1 is \[0, 2\]"),
    ([[0, 0]], [[0, -3]], r"/test/X row 0 of part 0/1 is \[0, -3\]"),
])
def test_bad_prepared_rows_name_file_and_row(tmp_path, X_train, X_test, match):
    path = tiny_file(tmp_path, X_train, X_test, n_users=1, n_items=2)
    m = load_model(job(tmp_path, path))
    split = "train" if "train" in match else "test"
    with pytest.raises(PreparedError, match=f"tiny.h5: {match}"):
        m.load(split, 0, 1)


def test_prepared_file_of_another_kind_is_a_job_error(tmp_path):
    path = write_prepared(tmp_path / "img.h5", {"train": (np.zeros((2, 4)), np.zeros(2)),
                                                "test": (np.zeros((1, 4)), np.zeros(1))},
                          {"dataset": "images", "task": "classification", "n_features": 4})
    with pytest.raises(ConfigError, match=r"job.toml:\d+: data.path: .*img.h5: attribute 'n_users' missing"):
        load_model(job(tmp_path, path))


def test_metrics():
    m = MatrixFactorization.metrics(None, [1, 2, 3, 4], [1.5, 2, 2, 4])
    assert m == {"n": 4, "mse": pytest.approx(1.25 / 4), "rmse": pytest.approx(np.sqrt(1.25 / 4)),
                 "mae": pytest.approx(0.375)}
    assert MatrixFactorization.metrics(None, [], []) == {"n": 0}


def test_movielens_quality_single_process(movielens, tmp_path):
    """The real MovieLens-100K split, one process, the servers' AdaGrad kernel, 768 rows a
    step (what 3 workers × 256 apply under BSP): test RMSE <= 0.93 (predicting the train mean
    gives 1.12; the biases alone 0.94)."""
    cfg = job(tmp_path, movielens["path"], epochs=6, batch=768)
    m = load_model(cfg)
    tables, hist = train_local(m, cfg.train.epochs, cfg.train.batch_size, seed=cfg.seed)
    rmse = [h["test_rmse"] for h in hist]
    print("test RMSE per epoch:", [round(r, 4) for r in rmse])
    assert rmse[-1] <= 0.93
    assert rmse[-1] < rmse[0]
    assert hist[-1]["train_mse"] < hist[0]["train_mse"]
    # the global mean alone is far worse: the factors and biases did the work
    Xt, yt = m.load("test", 0, 1)
    assert np.sqrt(np.mean((yt - m.mu) ** 2)) > 1.1
    # every test row is scored, those with an item seen only in test too
    assert movielens["test_rows_unseen_item"] > 0
    final = evaluate(m, tables, Xt, yt)
    assert final["n"] == 20_000 and final["rmse"] == pytest.approx(rmse[-1], rel=1e-12)
