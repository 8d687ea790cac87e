"""A worker's minibatches: key localization of its partition
(``hpcps.models.logistic_math.localize``: the minibatches of the localized rows give the same
keys, renumbering, loss and gradient as those of the original rows) and the rows of its steps
taken a chunk at a time (``hpcps.worker.batches.EpochBatches``: the same rows as ``X[rows]``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hpcps.models import logistic_math as lr
from hpcps.models.logistic import LogisticRegression


def _matrix(n_rows, n_features, per_row, seed, index_dtype=np.int32, ids=None):
    """CSR rows of ``per_row`` distinct columns each (of ``ids`` when given), values 1..3."""
    rng = np.random.default_rng(seed)
    space = n_features if ids is None else ids.size
    cols = np.concatenate([np.sort(rng.choice(space, per_row, replace=False)) for _ in range(n_rows)])
    if ids is not None:               # columns are 64-bit feature ids
        cols = ids[cols]
    indptr = np.arange(n_rows + 1, dtype=np.int64) * per_row
    data = rng.integers(1, 4, cols.size).astype(np.float64)
    return sp.csr_matrix((data, cols.astype(index_dtype if ids is None else np.int64), indptr),
                         shape=(n_rows, n_features))


def _same_batch(a, b):
    ka, la = lr.batch_keys(a, lr.new_marks(a.shape[1]))
    kb, lb = lr.batch_keys(b, None)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(ka[la], kb[lb])
    return kb, lb


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_minibatches_of_localized_rows_have_the_same_keys(index_dtype):
    X = _matrix(300, 1 << 20, 100, 1, index_dtype)
    L = lr.localize(X)
    assert isinstance(L, lr.LocalizedCSR)
    assert L.shape == (300, L.global_keys.size) and L.global_keys.size < 1 << 20
    np.testing.assert_array_equal(L.global_keys, np.unique(X.indices))
    assert np.shares_memory(L.data, X.data)          # shared, not copied
    rng = np.random.default_rng(2)
    for rows in (rng.permutation(300)[:64], np.arange(10, 50), np.array([7]), rng.integers(0, 300, 40)):
        b = L[rows]
        assert isinstance(b, lr.LocalizedCSR) and b.global_keys is L.global_keys
        kl, ll = lr.batch_keys(b, lr.new_marks(L.shape[1]))
        ko, lo = _same_batch(X[rows], X[rows])
        np.testing.assert_array_equal(kl, ko)
        np.testing.assert_array_equal(ll, lo)
    s = L[20:30]                                     # a row slice keeps the keys too
    assert s.global_keys is L.global_keys
    np.testing.assert_array_equal(lr.batch_keys(s)[0], lr.batch_keys(X[20:30])[0])


def test_64_bit_feature_ids_take_the_linear_path_once_localized():
    """Ids over MARKS_MAX_FEATURES are sorted per minibatch unless localized; after it the
    minibatch renumbering uses a scratch array of the partition's distinct ids."""
    ids = np.random.default_rng(5).choice(1 << 62, 4000, replace=False).astype(np.int64)
    X = _matrix(200, 1 << 62, 40, 6, ids=ids)
    assert lr.new_marks(X.shape[1]) is None
    L = lr.localize(X)
    assert isinstance(L, lr.LocalizedCSR) and L.global_keys.max() >= 1 << 31
    rows = np.random.default_rng(7).permutation(200)[:50]
    kl, ll = lr.batch_keys(L[rows], lr.new_marks(L.shape[1]))
    ko, lo = lr.batch_keys(X[rows])
    np.testing.assert_array_equal(kl, ko)
    np.testing.assert_array_equal(ll, lo)


def test_what_is_not_localized_comes_back_unchanged():
    full = sp.csr_matrix(np.ones((4, 6)))                 # every column occurs
    assert lr.localize(full) is full
    empty = sp.csr_matrix((0, 10))
    assert lr.localize(empty) is empty
    dense = np.ones((3, 3))
    assert lr.localize(dense) is dense
    assert lr.localize(None) is None
    L = lr.localize(_matrix(50, 1000, 10, 8))
    assert lr.localize(L) is L


def test_a_partition_too_large_for_the_memory_left_is_not_localized(monkeypatch):
    X = _matrix(100, 1 << 20, 20, 30)
    need = lr.LOCALIZE_BYTES_PER_ENTRY * X.nnz
    monkeypatch.setattr(lr, "available_memory", lambda: int(need / lr.LOCALIZE_MEMORY_SHARE) - 1)
    assert lr.localize(X) is X
    monkeypatch.setattr(lr, "available_memory", lambda: int(need / lr.LOCALIZE_MEMORY_SHARE) + 8)
    assert isinstance(lr.localize(X), lr.LocalizedCSR)
    monkeypatch.setattr(lr, "available_memory", lambda: None)       # unknown: localized
    assert isinstance(lr.localize(X), lr.LocalizedCSR)


def test_model_keeps_one_localization_and_trains_the_same():
    """``LogisticRegression.localize`` returns the same localized rows for the same matrix;
    loss and gradient on its minibatches equal those on the original rows bit for bit, with
    test-row minibatches (the whole feature space) in between."""
    X = _matrix(400, 1 << 16, 130, 9)
    Xt = _matrix(100, 1 << 16, 130, 10)
    y = (np.random.default_rng(11).random(400) < 0.4).astype(np.float64)
    m = LogisticRegression.__new__(LogisticRegression)       # no job: the methods need none
    ref = LogisticRegression.__new__(LogisticRegression)
    L = m.localize(X)
    assert m.localize(X) is L and isinstance(L, lr.LocalizedCSR)
    w = np.random.default_rng(12).standard_normal((1 << 16, 1))
    for i, rows in enumerate(np.array_split(np.random.default_rng(13).permutation(400), 8)):
        got_keys = m.batch_keys(L[rows])
        want_keys = ref.batch_keys(X[rows])
        np.testing.assert_array_equal(got_keys["weights"], want_keys["weights"])
        params = {"weights": w[want_keys["weights"]], "bias": np.array([[0.1]])}
        got = m.loss_grad(L[rows], y[rows], got_keys, params)    # another object: searched
        want = ref.loss_grad(X[rows], y[rows], want_keys, params)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1]["weights"], want[1]["weights"])
        tk = m.batch_keys(Xt[i * 10:(i + 1) * 10])               # a test minibatch between
        np.testing.assert_array_equal(tk["weights"], np.unique(Xt[i * 10:(i + 1) * 10].indices))


# ------------------------------------------------ minibatches taken a chunk at a time

@pytest.mark.parametrize("localized", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 256])
def test_epoch_batches_equal_fancy_row_slices(localized, batch_size, monkeypatch):
    """Every step's rows from :class:`EpochBatches` equal ``X[rows]``, ``y[rows]`` (values,
    columns, class and keys), across chunk boundaries and with both buffers in use, and a
    step's matrix stays whole while the next step's is taken."""
    from hpcps.worker import batches

    monkeypatch.setattr(batches, "CHUNK_ROWS", 3 * batch_size + 1)   # several chunks
    X = _matrix(1000, 1 << 14, 12, 21)
    X.indptr = X.indptr.astype(np.int32)
    X.indices = X.indices.astype(np.int32)
    if localized:
        X = lr.localize(X)
    y = np.random.default_rng(22).random(1000)
    order = np.random.default_rng(23).permutation(1000).astype(np.int64)[:950]
    eb = batches.EpochBatches(X, y, order, batch_size)
    steps = -(-order.size // batch_size)
    prev = None
    for i in range(steps):
        rows = order[i * batch_size:(i + 1) * batch_size]
        assert eb.same_rows(i, rows)
        Xb, yb = eb.batch(i)
        assert type(Xb) is type(X) and Xb.shape == (rows.size, X.shape[1])
        assert (Xb != X[rows]).nnz == 0
        np.testing.assert_array_equal(Xb.indices, X[rows].indices)
        np.testing.assert_array_equal(yb, y[rows])
        if localized:
            assert Xb.global_keys is X.global_keys
            buf = eb.slots[(i // eb.per_chunk) % 2][3]
            assert np.shares_memory(Xb.data, buf)       # a slice of the buffer, not a copy
        if prev is not None:                     # the step before's rows are still whole
            assert (prev[0] != X[prev[1]]).nnz == 0
        prev = (Xb, rows)
    assert not eb.same_rows(0, order[1:batch_size + 1])


def test_take_csr_rows_checks_rows_and_buffers():
    from hpcps.kernels.keys import take_csr_rows

    X = _matrix(10, 100, 3, 24)
    ip = X.indptr.astype(np.int64)
    out_ip = np.empty(4, dtype=np.int64)
    small = np.empty(2, X.indices.dtype), np.empty(2, X.data.dtype)
    assert take_csr_rows(np.array([1, 1, 9]), ip, X.indices, X.data, out_ip, *small) == 9
    np.testing.assert_array_equal(out_ip, [0, 3, 6, 9])                # sizes, nothing copied
    with pytest.raises(IndexError, match="row 10 at position 1"):
        take_csr_rows(np.array([0, 10]), ip, X.indices, X.data, out_ip, *small)
    with pytest.raises(ValueError, match="same dtypes"):
        take_csr_rows(np.array([0]), ip, X.indices, X.data, out_ip, np.empty(9, np.int64),
                      np.empty(9, X.data.dtype))
    with pytest.raises(ValueError, match="out_indptr holds 4"):
        take_csr_rows(np.arange(5), ip, X.indices, X.data, out_ip, *small)


def test_epoch_batches_keep_their_buffers_from_one_epoch_to_the_next():
    """A new epoch of the same rows starts the same EpochBatches on the new order: its
    buffers are kept, and its steps give the new order's rows."""
    from hpcps.worker import batches

    X = lr.localize(_matrix(600, 1 << 14, 9, 31))
    y = np.arange(600, dtype=np.float64)
    rng = np.random.default_rng(32)
    eb = batches.epoch_batches(None, X, y, rng.permutation(600), 64)
    eb.batch(0)
    buf = eb.slots[0][2]
    for epoch in range(2):
        order = rng.permutation(600)
        again = batches.epoch_batches(eb, X, y, order, 64)
        assert again is eb
        for i in range(-(-600 // 64)):
            rows = order[i * 64:(i + 1) * 64]
            Xb, yb = batches.step_rows(eb, X, y, i, rows)
            assert (Xb != X[rows]).nnz == 0
            np.testing.assert_array_equal(yb, y[rows])
        assert eb.slots[0][2] is buf                        # the same buffer, refilled
    assert batches.epoch_batches(eb, X, y.copy(), order, 64) is not eb   # other rows: new
    assert batches.epoch_batches(eb, X, y, order, 32) is not eb
    assert batches.epoch_batches(eb, X.toarray(), y, order, 64) is None  # not CSR


def test_the_test_rows_keys_are_found_once_and_not_copied(monkeypatch):
    """Each epoch's evaluation sliced the worker's test rows into a copy and found their keys
    again (Adult, 3,256 test rows per worker: ~1.4 ms of every evaluation on every worker):
    one chunk is the matrix itself (``in_chunks``) and the model keeps the keys of the last
    matrix of the whole feature space it was given; a minibatch of a localized partition, a
    new matrix or one whose indices were replaced are found afresh."""
    from hpcps.data.lines import in_chunks

    X = _matrix(40, 1000, 7, seed=3)
    y = np.arange(40.0)
    (got,) = list(in_chunks(X, y, 40))
    assert got[0] is X and got[1] is y
    assert [c[0].shape[0] for c in in_chunks(X, y, 16)] == [16, 16, 8]
    assert list(in_chunks(X[:0], y[:0], 16)) == []

    calls = []
    real = lr.batch_keys
    monkeypatch.setattr(lr, "batch_keys", lambda *a: calls.append(1) or real(*a))
    m = LogisticRegression.__new__(LogisticRegression)
    first = m.batch_keys(X)
    again = m.batch_keys(X)
    assert len(calls) == 1
    np.testing.assert_array_equal(first[lr.WEIGHTS], again[lr.WEIGHTS])
    np.testing.assert_array_equal(m._local(X, again), real(X, None)[1])
    m.batch_keys(X.copy())                 # another matrix of the same rows
    assert len(calls) == 2
    X2 = X.copy()
    m.batch_keys(X2)
    X2.indices = X2.indices.copy()         # its indices replaced: not trusted
    m.batch_keys(X2)
    assert len(calls) == 4
    L = lr.localize(X)                     # a localized partition's rows: never kept
    Lb = L[:10]
    n = len(calls)
    m.batch_keys(Lb)
    m.batch_keys(Lb)
    assert len(calls) == n + 2
