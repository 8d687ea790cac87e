"""Unit tests of the Cython kernels against pure-numpy references (no MPI)."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcps.kernels import keys as kkeys
from hpcps.kernels import logistic as klog
from hpcps.core.optim import Optimizer
from hpcps.kernels import optim as kopt
from hpcps.kernels.keys import choose_multiplier, inverse_multiplier, permute_keys, permute_keys_into
from hpcps.kernels.logistic import logistic_loss_grad, logistic_predict
from hpcps.kernels.optim import (
    apply_sparse,
    dense_adagrad,
    dense_sgd,
    merge_duplicates,
    sparse_adagrad,
    sparse_sgd,
)

DTYPES = [np.float32, np.float64]
HYP = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def tol(dtype):
    return dict(rtol=2e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------------------

def ref_merge(keys, values):
    """np.add.at based duplicate merge (sums in input order)."""
    keys = np.asarray(keys, dtype=np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)
    out = np.zeros((uniq.shape[0], values.shape[1]), dtype=values.dtype)
    np.add.at(out, inv.reshape(-1), values)
    return uniq, out


def ref_step(name, w, acc, rows, G, lr, l2, scale, eps):
    """One update on unique ``rows`` with gradient rows ``G``, numpy arithmetic in w.dtype."""
    dt = w.dtype.type
    lr, l2, scale, eps = dt(lr), dt(l2), dt(scale), dt(eps)
    g = scale * G + l2 * w[rows]
    if name == "sgd":
        w[rows] = w[rows] - lr * g
    else:
        acc[rows] = acc[rows] + g * g
        w[rows] = w[rows] - lr * g / (np.sqrt(acc[rows]) + eps)


def ref_apply(name, w, acc, keys, grads, lr, l2, scale, eps):
    rows, G = ref_merge(keys, grads)
    ref_step(name, w, acc, rows, G, lr, l2, scale, eps)


def zipf_keys(rng, n, num_rows, a=1.3):
    """Skewed keys with many duplicates, hot keys scattered over the table."""
    ranks = (rng.zipf(a, size=n) - 1) % num_rows
    return rng.permutation(num_rows)[ranks].astype(np.int64)


# --------------------------------------------------------------------------------------
# merge_duplicates
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 4])
@pytest.mark.parametrize("span", ["dense", "wide", "negative"])
def test_merge_matches_add_at_bitwise(dtype, dim, span):
    rng = np.random.default_rng(1)
    n = 5000
    if span == "dense":  # counting path
        keys = zipf_keys(rng, n, 300)
    elif span == "wide":  # sort path (span >> n)
        keys = rng.choice(rng.integers(0, 2**62, size=400), size=n)
    else:  # negative keys, both signs, sort path
        keys = rng.choice(rng.integers(-2**62, 2**62, size=400), size=n)
    values = rng.standard_normal((n, dim)).astype(dtype)
    uk, s = merge_duplicates(keys, values)
    ruk, rs = ref_merge(keys, values)
    assert uk.dtype == np.int64 and s.dtype == dtype and s.shape == (uk.shape[0], dim)
    np.testing.assert_array_equal(uk, ruk)
    np.testing.assert_array_equal(s, rs)  # same order of additions: bitwise equal


def test_merge_extreme_key_span():
    keys = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max])
    uk, s = merge_duplicates(keys, np.arange(4.0).reshape(4, 1))
    np.testing.assert_array_equal(uk, [np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max])
    np.testing.assert_array_equal(s[:, 0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("keys", [np.full(7, 3), np.full(7, 2**60)])
def test_merge_sums_in_input_order(keys):
    # float32: (1e8 + 1) + -1e8 == 0 in input order, but 1 in other orders.
    vals = np.array([1e8, 1.0, -1e8, 1.0, 1.0, 1.0, 1.0], dtype=np.float32).reshape(-1, 1)
    uk, s = merge_duplicates(keys, vals)
    expect = np.float32(0)
    for v in vals[:, 0]:
        expect = np.float32(expect + v)
    assert uk.tolist() == [keys[0]]
    assert s[0, 0] == expect == np.float32(4.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3])
def test_merge_all_same_key(dtype, dim):
    vals = np.ones((1000, dim), dtype=dtype)
    uk, s = merge_duplicates(np.full(1000, 42), vals)
    assert uk.tolist() == [42]
    np.testing.assert_array_equal(s, np.full((1, dim), 1000, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 5])
def test_merge_empty(dtype, dim):
    uk, s = merge_duplicates(np.empty(0, np.int64), np.empty((0, dim), dtype))
    assert uk.shape == (0,) and uk.dtype == np.int64
    assert s.shape == (0, dim) and s.dtype == dtype


def test_merge_non_contiguous_and_int32_keys():
    rng = np.random.default_rng(2)
    vals = rng.standard_normal((50, 6))[:, ::2]  # not C-contiguous
    keys = rng.integers(0, 10, 50).astype(np.int32)
    uk, s = merge_duplicates(keys, vals)
    ruk, rs = ref_merge(keys, np.ascontiguousarray(vals))
    np.testing.assert_array_equal(uk, ruk)
    np.testing.assert_array_equal(s, rs)


def test_merge_errors():
    with pytest.raises(ValueError, match="3 rows but keys has 2"):
        merge_duplicates(np.array([1, 2]), np.ones((3, 1)))
    with pytest.raises(ValueError, match="2-D"):
        merge_duplicates(np.array([1, 2]), np.ones(2))
    with pytest.raises(TypeError, match="integer"):
        merge_duplicates(np.array([1.0, 2.0]), np.ones((2, 1)))
    with pytest.raises(TypeError, match="float32 or float64"):
        merge_duplicates(np.array([1, 2]), np.ones((2, 1), dtype=np.int64))


@HYP
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), span=st.integers(1, 10**6),
       dim=st.integers(1, 3), f32=st.booleans())
def test_merge_property(seed, n, span, dim, f32):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    keys = rng.integers(-span, span, size=n)
    vals = rng.standard_normal((n, dim)).astype(dtype)
    uk, s = merge_duplicates(keys, vals)
    ruk, rs = ref_merge(keys, vals)
    np.testing.assert_array_equal(uk, ruk)
    np.testing.assert_array_equal(s, rs)


# --------------------------------------------------------------------------------------
# sparse / dense update rules
# --------------------------------------------------------------------------------------

HP = dict(lr=0.3, l2=0.01, scale=0.25, eps=1e-6)


def _table(rng, R, dim, dtype):
    w = rng.standard_normal((R, dim)).astype(dtype)
    acc = rng.uniform(0.1, 1.0, (R, dim)).astype(dtype)
    return w, acc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 4])
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sparse_rules_match_reference(dtype, dim, name):
    rng = np.random.default_rng(3)
    R, m = 200, 80
    w, acc = _table(rng, R, dim, dtype)
    rows = rng.choice(R, size=m, replace=False).astype(np.int64)
    grads = rng.standard_normal((m, dim)).astype(dtype)
    w_ref, acc_ref = w.copy(), acc.copy()
    ref_step(name, w_ref, acc_ref, rows, grads, **HP)
    if name == "sgd":
        sparse_sgd(w, rows, grads, HP["lr"], HP["l2"], HP["scale"])
    else:
        sparse_adagrad(w, acc, rows, grads, **HP)
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    np.testing.assert_allclose(acc, acc_ref, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_dense_rules_match_reference(dtype, name):
    rng = np.random.default_rng(4)
    w2, acc2 = _table(rng, 50, 3, dtype)
    w, acc = w2.reshape(-1), acc2.reshape(-1)  # views, as callers pass them
    grads = rng.standard_normal(w.shape[0]).astype(dtype)
    w_ref, acc_ref = w.copy(), acc.copy()
    ref_step(name, w_ref, acc_ref, np.arange(w.shape[0]), grads, **HP)
    if name == "sgd":
        dense_sgd(w, grads, HP["lr"], HP["l2"], HP["scale"])
    else:
        dense_adagrad(w, acc, grads, **HP)
    np.testing.assert_allclose(w2.reshape(-1), w_ref, **tol(dtype))
    np.testing.assert_allclose(acc2.reshape(-1), acc_ref, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("keys_kind", ["zipf", "all_same", "unique", "empty"])
def test_apply_sparse_matches_reference(dtype, dim, name, keys_kind):
    rng = np.random.default_rng(5)
    R = 500
    w, acc = _table(rng, R, dim, dtype)
    n = 3000
    keys = {"zipf": lambda: zipf_keys(rng, n, R),
            "all_same": lambda: np.full(n, 17, dtype=np.int64),
            "unique": lambda: rng.permutation(R).astype(np.int64),
            "empty": lambda: np.empty(0, dtype=np.int64)}[keys_kind]()
    grads = rng.standard_normal((keys.shape[0], dim)).astype(dtype)
    w_ref, acc_ref = w.copy(), acc.copy()
    w0 = w.copy()
    ref_apply(name, w_ref, acc_ref, keys, grads, **HP)
    apply_sparse(name, w, acc if name == "adagrad" else None, keys, grads,
                 HP["lr"], HP["l2"], HP["scale"], HP["eps"])
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    np.testing.assert_allclose(acc, acc_ref, **tol(dtype))
    if keys_kind == "empty":
        np.testing.assert_array_equal(w, w0)
    else:  # untouched rows stay bitwise the same
        untouched = np.setdiff1d(np.arange(R), keys)
        np.testing.assert_array_equal(w[untouched], w0[untouched])


def test_apply_sparse_wide_table_sort_path():
    # Table much larger than the push: the merge takes its sort path.
    rng = np.random.default_rng(6)
    R, n = 2_000_000, 1000
    w = np.zeros((R, 1), np.float64)
    keys = rng.choice(rng.integers(0, R, 50), size=n)
    grads = rng.standard_normal((n, 1))
    w_ref = w.copy()
    ref_apply("sgd", w_ref, None, keys, grads, **HP)
    apply_sparse("sgd", w, None, keys, grads, HP["lr"], HP["l2"], HP["scale"], HP["eps"])
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("R", [300, 3_000_000])  # dense-buffer path / merge (sort) path
def test_apply_sparse_equals_merge_then_rule_bitwise(dtype, name, R):
    rng = np.random.default_rng(14)
    n, dim = 2000, 2
    keys = rng.choice(rng.integers(0, R, 400), size=n)
    grads = rng.standard_normal((n, dim)).astype(dtype)
    w1 = rng.standard_normal((R, dim)).astype(dtype)
    acc1 = np.full((R, dim), 0.5, dtype)
    w2, acc2 = w1.copy(), acc1.copy()
    apply_sparse(name, w1, acc1, keys, grads, **HP)
    rows, summed = merge_duplicates(keys, grads)
    if name == "sgd":
        sparse_sgd(w2, rows, summed, HP["lr"], HP["l2"], HP["scale"])
    else:
        sparse_adagrad(w2, acc2, rows, summed, **HP)
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(acc1, acc2)


def _merge_then_rule(name, w, acc, keys, grads):
    rows, summed = merge_duplicates(keys, grads)
    if name == "sgd":
        sparse_sgd(w, rows, summed, HP["lr"], HP["l2"], HP["scale"])
    else:
        sparse_adagrad(w, acc, rows, summed, **HP)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_apply_sparse_scatter_path_reuses_its_buffers_correctly(name):
    """The scatter path keeps its zeroed sum buffer and touched-row bitmap between calls:
    pushes of other tables (larger, smaller, other dim and dtype) and a failed push in
    between must each give bitwise the merge-then-rule result (no sum left behind, no
    duplicate lost)."""
    rng = np.random.default_rng(31)
    cases = [(100_000, 1, np.float32, 5000), (700, 3, np.float64, 9000), (200_001, 1, np.float32, 4000),
             (100_000, 1, np.float32, 5000), (64, 2, np.float32, 300), (130_000, 1, np.float64, 3000)]
    assert all(R <= kopt._SCATTER_ROWS_PER_KEY * n + kopt._DENSE_SPAN_SLACK for R, _, _, n in cases)
    for i, (R, dim, dtype, n) in enumerate(cases):
        keys = rng.choice(rng.integers(0, R, max(2, n // 10)), size=n)   # many duplicates
        keys[:3] = [R - 1, 0, R - 1]                                    # ends of the bitmap
        grads = rng.standard_normal((n, dim)).astype(dtype)
        w1 = rng.standard_normal((R, dim)).astype(dtype)
        acc1 = np.full((R, dim), 0.5, dtype)
        w2, acc2 = w1.copy(), acc1.copy()
        apply_sparse(name, w1, acc1, keys, grads, **HP)
        _merge_then_rule(name, w2, acc2, keys, grads)
        np.testing.assert_array_equal(w1, w2, err_msg=f"case {i}")
        np.testing.assert_array_equal(acc1, acc2, err_msg=f"case {i}")
        if i == 2:                       # a push with a bad key between two good ones
            bad = keys.copy()
            bad[n // 2] = R
            w3 = w1.copy()
            with pytest.raises(ValueError, match=rf"keys\[{n // 2}\] = {R} is out of range"):
                apply_sparse(name, w3, acc1.copy(), bad, grads, **HP)
            np.testing.assert_array_equal(w3, w1)


def test_apply_sparse_scatter_path_from_two_threads():
    """Two threads applying at once: one uses the kept buffers, the other fresh ones; both
    results are right."""
    import threading

    rng = np.random.default_rng(32)
    R, n = 50_000, 200_000
    jobs = []
    for _ in range(4):
        keys = rng.integers(0, R, n)
        grads = rng.standard_normal((n, 1)).astype(np.float32)
        w = rng.standard_normal((R, 1)).astype(np.float32)
        ref, acc_ref = w.copy(), np.full((R, 1), 0.5, np.float32)
        _merge_then_rule("adagrad", ref, acc_ref, keys, grads)
        jobs.append((w, np.full((R, 1), 0.5, np.float32), keys, grads, ref))

    def run(job):
        for _ in range(1):
            apply_sparse("adagrad", job[0], job[1], job[2], job[3], **HP)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w, _, _, _, ref in jobs:
        np.testing.assert_array_equal(w, ref)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_apply_sparse_out_of_range_on_merge_path(name):
    R = 3_000_000  # push much smaller than the table: merge path, not the dense buffer
    w = np.ones((R, 1), np.float32)
    acc = np.ones((R, 1), np.float32)
    keys = np.array([5, 9, R, 5], np.int64)
    with pytest.raises(ValueError, match=rf"keys\[2\] = {R} is out of range \[0, {R}\)"):
        apply_sparse(name, w, acc, keys, np.ones((4, 1), np.float32), 0.1, 0.0, 1.0, 1e-8)
    assert np.all(w == 1) and np.all(acc == 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fancy_index_counterexample(dtype):
    """``w[idx] -= g`` applies one of several duplicates; apply_sparse sums them."""
    w = np.zeros((3, 1), dtype=dtype)
    keys = np.array([1, 1, 1, 2], dtype=np.int64)
    grads = np.ones((4, 1), dtype=dtype)
    lr = 0.5
    fancy = w.copy()
    fancy[keys] -= lr * grads  # buffered: row 1 gets -0.5 once
    assert fancy[1, 0] == dtype(-0.5)
    correct = w.copy()
    np.subtract.at(correct, keys, lr * grads)  # unbuffered: -1.5
    assert correct[1, 0] == dtype(-1.5)
    apply_sparse("sgd", w, None, keys, grads, lr, 0.0, 1.0, 1e-8)
    np.testing.assert_array_equal(w, correct)
    assert not np.array_equal(w, fancy)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_out_of_range_rows_raise_and_leave_state_unchanged(name, bad):
    rng = np.random.default_rng(7)
    w, acc = _table(rng, 10, 2, np.float32)
    w0, acc0 = w.copy(), acc.copy()
    keys = np.array([0, 3, 3, bad, 4], dtype=np.int64)
    grads = np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match=rf"keys\[3\] = {bad} is out of range \[0, 10\)"):
        apply_sparse(name, w, acc, keys, grads, 0.1, 0.0, 1.0, 1e-8)
    with pytest.raises(ValueError, match=rf"rows\[3\] = {bad} is out of range \[0, 10\)"):
        if name == "sgd":
            sparse_sgd(w, keys, grads, 0.1)
        else:
            sparse_adagrad(w, acc, keys, grads, 0.1)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(acc, acc0)


def test_update_rule_argument_errors():
    w = np.zeros((4, 2), np.float32)
    acc = np.zeros((4, 2), np.float32)
    g = np.ones((2, 2), np.float32)
    k = np.array([0, 1])
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'; valid: 'sgd', 'adagrad', 'adam', 'ftrl'"):
        apply_sparse("rmsprop", w, None, k, g, 0.1, 0.0, 1.0, 1e-8)
    with pytest.raises(TypeError, match="dtype float64 but must have dtype float32"):
        apply_sparse("sgd", w, None, k, g.astype(np.float64), 0.1, 0.0, 1.0, 1e-8)
    with pytest.raises(TypeError, match="float32 or float64"):
        sparse_sgd(w.astype(np.int32), k, g, 0.1)
    with pytest.raises(ValueError, match="grads has 2 rows but rows has 3"):
        sparse_sgd(w, np.array([0, 1, 2]), g, 0.1)
    with pytest.raises(ValueError, match="grads has 3 columns but w has dim 2"):
        sparse_sgd(w, k, np.ones((2, 3), np.float32), 0.1)
    with pytest.raises(ValueError, match="C-contiguous"):
        sparse_sgd(np.zeros((4, 4), np.float32)[:, ::2], k, g, 0.1)
    with pytest.raises(ValueError, match="needs its accumulator"):
        apply_sparse("adagrad", w, None, k, g, 0.1, 0.0, 1.0, 1e-8)
    with pytest.raises(ValueError, match="shape"):
        sparse_adagrad(w, np.zeros((4, 1), np.float32), k, g, 0.1)
    with pytest.raises(TypeError, match="acc has dtype float64"):
        sparse_adagrad(w, np.zeros((4, 2)), k, g, 0.1)
    with pytest.raises(ValueError, match="eps must be > 0"):
        sparse_adagrad(w, acc, k, g, 0.1, eps=0.0)
    with pytest.raises(ValueError, match="lr must be finite"):
        sparse_sgd(w, k, g, float("nan"))
    with pytest.raises(ValueError, match="length 3 but w has length 8"):
        dense_sgd(w.reshape(-1), np.ones(3, np.float32), 0.1)
    with pytest.raises(ValueError, match="1-D"):
        dense_sgd(w, g, 0.1)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dense_sgd(ro, np.ones(4, np.float32), 0.1)
    np.testing.assert_array_equal(w, 0)


def test_apply_sparse_adagrad_slot_in_list_and_readonly_inputs():
    rng = np.random.default_rng(8)
    w, acc = _table(rng, 20, 2, np.float64)
    keys = rng.integers(0, 20, 50)
    grads = rng.standard_normal((50, 2))
    keys.flags.writeable = False
    grads.flags.writeable = False  # e.g. buffers received from MPI
    w_ref, acc_ref = w.copy(), acc.copy()
    ref_apply("adagrad", w_ref, acc_ref, keys, grads, **HP)
    apply_sparse("adagrad", w, [acc], keys, grads, **HP)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    np.testing.assert_allclose(acc, acc_ref, rtol=1e-12)


@HYP
@given(seed=st.integers(0, 2**32 - 1), R=st.integers(1, 400), n=st.integers(0, 600),
       dim=st.integers(1, 3), f32=st.booleans(), name=st.sampled_from(["sgd", "adagrad"]))
def test_apply_sparse_property(seed, R, n, dim, f32, name):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    w, acc = _table(rng, R, dim, dtype)
    keys = rng.integers(0, R, size=n)
    grads = rng.standard_normal((n, dim)).astype(dtype)
    w_ref, acc_ref = w.copy(), acc.copy()
    ref_apply(name, w_ref, acc_ref, keys, grads, **HP)
    apply_sparse(name, w, acc, keys, grads, **HP)
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    np.testing.assert_allclose(acc, acc_ref, **tol(dtype))


def test_apply_sparse_equals_sequential_minibatch_sgd_without_l2():
    # Without L2, SGD on summed duplicates equals np.subtract.at of every update.
    rng = np.random.default_rng(9)
    w = rng.standard_normal((100, 1))
    keys = zipf_keys(rng, 5000, 100)
    grads = rng.standard_normal((5000, 1))
    ref = w.copy()
    np.subtract.at(ref, keys, 0.1 * 0.5 * grads)
    apply_sparse("sgd", w, None, keys, grads, 0.1, 0.0, 0.5, 1e-8)
    np.testing.assert_allclose(w, ref, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------------------

@settings(deadline=None, max_examples=200)
@given(n=st.integers(1, 5000))
def test_permute_is_bijection(n):
    a = choose_multiplier(n)
    assert 1 <= a <= max(n - 1, 1) and math.gcd(a, n) == 1 and a % 2 == 1
    p = permute_keys(np.arange(n, dtype=np.int64), n, a)
    assert p.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p), np.arange(n))
    b = inverse_multiplier(n, a)
    np.testing.assert_array_equal(permute_keys(p, n, b), np.arange(n))


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 3000), a=st.integers(0, 2**63 - 1))
def test_permute_bijection_any_coprime_multiplier(n, a):
    if math.gcd(a, n) != 1:
        with pytest.raises(ValueError, match="not coprime"):
            permute_keys(np.arange(n), n, a)
        return
    p = permute_keys(np.arange(n), n, a)
    np.testing.assert_array_equal(np.sort(p), np.arange(n))
    np.testing.assert_array_equal(p, [(k * a) % n for k in range(n)])


@pytest.mark.parametrize("n", [2**63 - 1, 2**63 - 25, 2**62 + 1, 2**32 + 1, 2**32, 2**32 - 1,
                               10**18 + 9])
def test_permute_exact_for_huge_key_spaces(n):
    a = choose_multiplier(n)
    rng = np.random.default_rng(n % 2**32)
    keys = np.concatenate([
        np.arange(0, 20), n - 1 - np.arange(0, 20),
        (2**62 - 50 + np.arange(100)) % n,
        rng.integers(0, n, 500, dtype=np.int64) if n < 2**63 else rng.integers(0, 2**63 - 1, 500),
    ]).astype(np.int64)
    keys = keys[keys < n]
    for mult in (a, n - 1, inverse_multiplier(n, a)):
        got = permute_keys(keys, n, mult)
        expect = [(int(k) * mult) % n for k in keys]
        assert got.tolist() == expect


def test_choose_multiplier_properties():
    assert choose_multiplier(1) == 1
    assert choose_multiplier(2) == 1
    for n in [3, 10, 1000, 1 << 20, 10**9 + 7, 2**63 - 1, 2**40 * 3 * 5 * 7]:
        a = choose_multiplier(n)
        assert 1 <= a < n and a % 2 == 1 and math.gcd(a, n) == 1
        assert abs(a - n * 0.6180339887498949) <= max(0.001 * n, 8)
    assert isinstance(choose_multiplier(np.int64(1000)), int)
    with pytest.raises(ValueError):
        choose_multiplier(0)
    with pytest.raises(ValueError):
        choose_multiplier(2**63)
    with pytest.raises(TypeError):
        choose_multiplier(10.0)


@pytest.mark.parametrize("n", [10**6, 2**20, 999_983, 10**12])
@pytest.mark.parametrize("servers", [3, 8, 64])
def test_consecutive_keys_spread_over_ranges(n, servers):
    # The point of the golden-ratio multiplier: a run of 1000 consecutive keys (one-hot
    # features) is split almost evenly over the servers' contiguous ranges.
    p = permute_keys(np.arange(1000, 2000), n, choose_multiplier(n))
    counts = np.bincount(p // -(-n // servers), minlength=servers)
    assert counts.max() - counts.min() <= 4


@pytest.mark.parametrize("bad", [-1, 100, 2**62])
def test_permute_out_of_range_names_first_offending_key(bad):
    keys = np.array([5, 7, bad, -3, 1000], dtype=np.int64)
    with pytest.raises(ValueError, match=rf"key {bad} \(at position 2\) is outside the key "
                                         rf"space \[0, 100\) \(num_keys = 100\)"):
        permute_keys(keys, 100, 61)


def test_permute_keys_into_and_edge_cases():
    n, a = 1000, choose_multiplier(1000)
    keys = np.arange(n, dtype=np.int64)
    out = np.empty(n, np.int64)
    assert permute_keys_into(keys, n, a, out) is out
    np.testing.assert_array_equal(out, (keys * a) % n)
    inplace = keys.copy()
    permute_keys_into(inplace, n, a, inplace)
    np.testing.assert_array_equal(inplace, out)
    assert permute_keys(np.empty(0, np.int64), n, a).shape == (0,)
    assert permute_keys([], n, a).dtype == np.int64
    np.testing.assert_array_equal(permute_keys(np.array([3, 0], np.int32), 5, 2), [1, 0])
    np.testing.assert_array_equal(permute_keys(np.zeros(3, np.int64), 1, 0), [0, 0, 0])
    with pytest.raises(ValueError, match="num_keys must be in"):
        permute_keys(keys, 0, 1)
    with pytest.raises(ValueError, match="not coprime"):
        permute_keys(keys, n, 10)
    with pytest.raises(ValueError, match="shape"):
        permute_keys_into(keys, n, a, np.empty(3, np.int64))
    with pytest.raises(TypeError, match="int64"):
        permute_keys_into(keys, n, a, np.empty(n, np.int32))
    with pytest.raises(TypeError, match="integer"):
        permute_keys(np.array([1.0]), n, a)


# --------------------------------------------------------------------------------------
# logistic
# --------------------------------------------------------------------------------------

def random_csr(rng, B, n, max_row=8):
    lens = rng.integers(0, max_row + 1, size=B)
    indptr = np.zeros(B + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    indices = rng.integers(0, n, size=indptr[-1]).astype(np.int64)  # may repeat in a row
    data = rng.standard_normal(indptr[-1])
    return indptr, indices, data


def ref_logistic(indptr, indices, data, y, w, bias):
    B = indptr.shape[0] - 1
    w = w.astype(np.float64)
    row = np.repeat(np.arange(B), np.diff(indptr))
    m = bias + np.bincount(row, weights=data * w[indices], minlength=B)
    p = 1.0 / (1.0 + np.exp(-m))
    loss = np.sum(np.logaddexp(0.0, m) - y * m)
    grad = np.bincount(indices, weights=(p - y)[row] * data, minlength=w.shape[0])
    return loss, grad, np.sum(p - y), p


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx", [np.int64, np.int32])
def test_logistic_matches_reference(dtype, idx):
    rng = np.random.default_rng(10)
    B, n = 300, 120
    indptr, indices, data = random_csr(rng, B, n)
    y = rng.integers(0, 2, B).astype(np.float64)
    w = (0.5 * rng.standard_normal(n)).astype(dtype)
    bias = 0.3
    grad = np.full(n, np.nan, dtype=dtype)  # must be zero-filled by the kernel
    loss, gb = logistic_loss_grad(indptr.astype(idx), indices.astype(idx), data, y, w, bias, grad)
    rloss, rgrad, rgb, rp = ref_logistic(indptr, indices, data, y, w, bias)
    assert isinstance(loss, float) and isinstance(gb, float)
    t = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, rloss, rtol=1e-12)
    np.testing.assert_allclose(gb, rgb, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, rgrad, **t)
    out = np.empty(B)
    logistic_predict(indptr.astype(idx), indices.astype(idx), data, w, bias, out)
    np.testing.assert_allclose(out, rp, rtol=1e-13, atol=1e-15)


def test_logistic_mixed_index_dtypes_and_readonly():
    rng = np.random.default_rng(11)
    indptr, indices, data = random_csr(rng, 20, 10)
    y = rng.integers(0, 2, 20).astype(np.float64)
    w = rng.standard_normal(10)
    for a in (indptr, indices, data, y, w):
        a.flags.writeable = False
    g1, g2 = np.empty(10), np.empty(10)
    r1 = logistic_loss_grad(indptr, indices, data, y, w, 0.0, g1)
    r2 = logistic_loss_grad(indptr.astype(np.int32), indices, data, y, w, 0.0, g2)
    assert r1 == r2
    np.testing.assert_array_equal(g1, g2)


def test_logistic_gradient_is_derivative_of_loss():
    rng = np.random.default_rng(12)
    indptr, indices, data = random_csr(rng, 40, 15)
    y = rng.integers(0, 2, 40).astype(np.float64)
    w = rng.standard_normal(15)
    grad = np.empty(15)
    _, gb = logistic_loss_grad(indptr, indices, data, y, w, 0.2, grad)
    h = 1e-6
    g = np.empty(15)
    for c in range(15):
        e = np.zeros(15)
        e[c] = h
        lp, _ = logistic_loss_grad(indptr, indices, data, y, w + e, 0.2, g)
        lm, _ = logistic_loss_grad(indptr, indices, data, y, w - e, 0.2, g)
        assert abs((lp - lm) / (2 * h) - grad[c]) < 1e-6
    lp, _ = logistic_loss_grad(indptr, indices, data, y, w, 0.2 + h, g)
    lm, _ = logistic_loss_grad(indptr, indices, data, y, w, 0.2 - h, g)
    assert abs((lp - lm) / (2 * h) - gb) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, y, loss, p", [
    (1000.0, 0.0, 1000.0, 1.0),
    (-1000.0, 0.0, 0.0, 0.0),
    (1000.0, 1.0, 0.0, 1.0),
    (-1000.0, 1.0, 1000.0, 0.0),
])
def test_logistic_extreme_margins(dtype, m, y, loss, p):
    # One example, one feature x = 2 with weight m / 4 plus bias m / 2: margin m.
    indptr = np.array([0, 1], np.int64)
    indices = np.array([0], np.int64)
    data = np.array([2.0])
    w = np.array([m / 4], dtype=dtype)
    grad = np.empty(1, dtype=dtype)
    got, gb = logistic_loss_grad(indptr, indices, data, np.array([y]), w, m / 2, grad)
    assert np.isfinite(got) and np.isfinite(gb) and np.all(np.isfinite(grad))
    assert got == pytest.approx(loss, abs=1e-12)
    assert gb == pytest.approx(p - y, abs=1e-12)
    assert grad[0] == pytest.approx(2 * (p - y), abs=1e-12)
    out = np.empty(1)
    logistic_predict(indptr, indices, data, w, m / 2, out)
    assert out[0] == p


def test_logistic_small_losses_keep_relative_precision():
    indptr = np.arange(4, dtype=np.int64)
    indices = np.zeros(3, np.int64)
    margins = np.array([40.0, 25.0, -30.0])
    y = np.array([1.0, 1.0, 0.0])
    grad = np.empty(1)
    loss, gb = logistic_loss_grad(indptr, indices, margins, y, np.array([1.0]), 0.0, grad)
    expect = math.log1p(math.exp(-40)) + math.log1p(math.exp(-25)) + math.log1p(math.exp(-30))
    assert loss == pytest.approx(expect, rel=1e-14)


def test_predict_agrees_with_sigmoid():
    rng = np.random.default_rng(13)
    B, n = 500, 30
    indptr, indices, data = random_csr(rng, B, n)
    w = 3 * rng.standard_normal(n)
    out = np.empty(B)
    logistic_predict(indptr, indices, data, w, -0.7, out)
    row = np.repeat(np.arange(B), np.diff(indptr))
    m = -0.7 + np.bincount(row, weights=data * w[indices], minlength=B)
    np.testing.assert_allclose(out, 1.0 / (1.0 + np.exp(-m)), rtol=1e-13, atol=1e-300)
    assert np.all((out >= 0) & (out <= 1))


def test_logistic_empty_batch():
    grad = np.full(4, 7.0, np.float32)
    loss, gb = logistic_loss_grad(np.array([0]), np.empty(0, np.int64), np.empty(0), np.empty(0),
                                  np.ones(4, np.float32), 0.5, grad)
    assert loss == 0.0 and gb == 0.0
    np.testing.assert_array_equal(grad, 0)
    out = np.empty(0)
    logistic_predict(np.array([0]), np.empty(0, np.int64), np.empty(0), np.ones(4), 0.0, out)


@pytest.mark.parametrize("bad", [-1, 5, 2**40])
@pytest.mark.parametrize("idx", [np.int64, np.int32])
def test_logistic_column_out_of_range(bad, idx):
    if idx == np.int32 and bad > 2**31:
        pytest.skip("does not fit int32")
    indptr = np.array([0, 2, 4], idx)
    indices = np.array([0, 1, bad, 2], idx)
    data = np.ones(4)
    w = np.ones(5)
    msg = rf"indices\[2\] = {bad} is out of range \[0, 5\)"
    with pytest.raises(ValueError, match=msg):
        logistic_loss_grad(indptr, indices, data, np.array([0.0, 1.0]), w, 0.0, np.empty(5))
    with pytest.raises(ValueError, match=msg):
        logistic_predict(indptr, indices, data, w, 0.0, np.empty(2))


def test_logistic_argument_errors():
    indptr = np.array([0, 1, 2])
    indices = np.array([0, 1])
    data = np.ones(2)
    y = np.zeros(2)
    w = np.ones(3)
    with pytest.raises(ValueError, match="y has 3 labels but indptr describes 2 rows"):
        logistic_loss_grad(indptr, indices, data, np.zeros(3), w, 0.0, np.empty(3))
    with pytest.raises(ValueError, match="indices has 2 entries but data has 3"):
        logistic_loss_grad(indptr, indices, np.ones(3), y, w, 0.0, np.empty(3))
    with pytest.raises(ValueError, match=r"indptr\[1\] = 3 is invalid"):
        logistic_loss_grad(np.array([0, 3, 2]), indices, data, y, w, 0.0, np.empty(3))
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1 is invalid"):
        logistic_predict(np.array([0, 2, 1]), indices, data, w, 0.0, np.empty(2))
    with pytest.raises(TypeError, match="grad must have dtype float64"):
        logistic_loss_grad(indptr, indices, data, y, w, 0.0, np.empty(3, np.float32))
    with pytest.raises(ValueError, match=r"grad must have shape \(3,\)"):
        logistic_loss_grad(indptr, indices, data, y, w, 0.0, np.empty(4))
    with pytest.raises(ValueError, match=r"out must have shape \(2,\)"):
        logistic_predict(indptr, indices, data, w, 0.0, np.empty(3))
    with pytest.raises(TypeError, match="float32 or float64"):
        logistic_predict(indptr, indices, data, np.ones(3, np.int64), 0.0, np.empty(2))


def test_modules_export_documented_api():
    for mod, names in [(kopt, ["merge_duplicates", "sparse_sgd", "sparse_adagrad", "dense_sgd",
                               "dense_adagrad", "apply_sparse", "sparse_adam", "sparse_ftrl",
                               "dense_adam", "dense_ftrl", "state_dtype", "new_state"]),
                       (klog, ["logistic_loss_grad", "logistic_predict"]),
                       (kkeys, ["permute_keys", "permute_keys_into", "choose_multiplier"])]:
        for name in names:
            f = getattr(mod, name)
            doc = f.__doc__ or ""
            assert "Parameters" in doc and "Raises" in doc and "Notes" in doc, name


# ------------------------------------------------------------------ unique_inverse
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 999), max_size=400), st.booleans())
def test_unique_inverse_equals_numpy_unique(cols, i32):
    marks = np.zeros(1000, dtype=np.int32)
    cols = np.array(cols, dtype=np.int32 if i32 else np.int64)
    keys, local = kkeys.unique_inverse(cols, marks)
    want_keys, want_local = np.unique(cols, return_inverse=True)
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(local, want_local.reshape(-1))
    assert keys.dtype == np.int64 and local.dtype == np.int64
    assert not marks.any()                      # scratch is clean for the next batch


@pytest.mark.parametrize("n", [0, 1, 2, 31, 33, 639, 640, 641, 5000, 70_000])
@pytest.mark.parametrize("bits", [1, 11, 12, 33, 63, 64])
def test_sort_u64_equals_numpy_sort(n, bits):
    """The radix sort (from 640 values on; numpy's below) sorts as numpy does, also with
    repeated values, one digit value shared by all (skipped passes) and all 64 bits."""
    rng = np.random.default_rng(n * 100 + bits)
    hi = np.iinfo(np.uint64).max if bits == 64 else (1 << bits) - 1
    a = rng.integers(0, hi, n, dtype=np.uint64, endpoint=True)
    if n > 4:
        a[: n // 4] = a[-1]                              # repeats
    got = a.copy()
    assert kkeys.sort_u64(got, bits) is got
    np.testing.assert_array_equal(got, np.sort(a))
    same_top = (a & np.uint64(0x7FF)) | np.uint64(0x5 << 11) if bits >= 14 else a
    got = same_top.copy()
    np.testing.assert_array_equal(kkeys.sort_u64(got, bits), np.sort(same_top))
    with pytest.raises(ValueError, match="uint64"):
        kkeys.sort_u64(a.astype(np.int64), bits)
    with pytest.raises(ValueError, match="bits"):
        kkeys.sort_u64(a, 65)


def test_unique_inverse_and_merge_of_many_distinct_keys_equal_numpy():
    """Past 640 distinct keys the sorts are radix passes: the same results as numpy."""
    rng = np.random.default_rng(5)
    cols = rng.integers(0, 1 << 20, 30_000).astype(np.int32)
    cols[:10_000] = cols[20_000:]                        # repeats
    marks = np.zeros(1 << 20, dtype=np.int32)
    keys, local = kkeys.unique_inverse(cols, marks)
    want_keys, want_local = np.unique(cols, return_inverse=True)
    assert keys.size > 640
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(local, want_local.reshape(-1))
    assert not marks.any()
    k64 = rng.integers(0, 1 << 40, 9000).astype(np.int64)
    k64[:3000] = k64[6000:]
    vals = rng.random((9000, 3))
    uk, summed = kopt.merge_duplicates(k64, vals)
    want_uk, inv = np.unique(k64, return_inverse=True)
    want = np.zeros((want_uk.size, 3))
    for i, j in enumerate(inv.reshape(-1)):              # in input order, as documented
        want[j] += vals[i]
    np.testing.assert_array_equal(uk, want_uk)
    np.testing.assert_array_equal(summed, want)


@pytest.mark.parametrize("n, g", [(0, 1), (1, 1), (10, 3), (2700, 8), (8100, 128)])
def test_group_order_is_the_stable_argsort(n, g):
    """Routing groups a request's keys by server with a counting pass: the same order as
    numpy's stable argsort (34 ns per value here), positions of a server ascending."""
    srv = np.random.default_rng(n + g).integers(0, g, n).astype(np.int64)
    bounds = np.zeros(g + 1, dtype=np.int64)
    np.cumsum(np.bincount(srv, minlength=g), out=bounds[1:])
    np.testing.assert_array_equal(kkeys.group_order(srv, bounds), np.argsort(srv, kind="stable"))


def test_group_order_refuses_groups_that_do_not_fit_the_bounds():
    for groups, bounds, what in (([0, 5], [0, 1, 2], "group 5 at position 1 is outside"),
                                 ([0, -1], [0, 1, 2], "group -1 at position 1"),
                                 ([0, 0], [0, 1, 2], "group 0 at position 1"),
                                 ([0, 1], [0, 1, 3], "do not fit 2 positions")):
        with pytest.raises(ValueError, match=what):
            kkeys.group_order(np.array(groups), np.array(bounds))


def test_unique_inverse_errors_leave_marks_clean():
    marks = np.zeros(100, dtype=np.int32)
    for bad, pos in (([3, 5, 100, 3], 2), ([1, -1], 1)):
        with pytest.raises(ValueError, match=rf"column {bad[pos]} at position {pos} is outside \[0, 100\)"):
            kkeys.unique_inverse(np.array(bad), marks)
        assert not marks.any()
    with pytest.raises(TypeError, match="int32 or int64"):
        kkeys.unique_inverse(np.array([1.0]), marks)
    with pytest.raises(ValueError, match="marks must be"):
        kkeys.unique_inverse(np.array([1]), np.zeros(100, dtype=np.int64))


def test_logistic_model_renumbering_cache_matches_search():
    """The logistic model reuses batch_keys' renumbering in loss_grad for the same batch and
    searches the keys for any other matrix: both give the same loss and gradient."""
    import scipy.sparse as sp

    from hpcps.models.logistic import LogisticRegression

    rng = np.random.default_rng(3)
    X = sp.random(64, 5000, density=0.01, format="csr", random_state=4, dtype=np.float64)
    y = (rng.random(64) < 0.5).astype(np.float64)
    m = LogisticRegression.__new__(LogisticRegression)      # no job: the methods need none
    keys = m.batch_keys(X)
    params = {"weights": rng.standard_normal((keys["weights"].size, 1)),
              "bias": np.array([[0.3]])}
    cached = m.loss_grad(X, y, keys, params)
    assert m._last[0][0] is X                    # the newest renumbering kept (keys_ahead keeps two)
    X2 = X.copy()                                # another object: searched, not cached
    searched = m.loss_grad(X2, y, keys, params)
    assert cached[0] == searched[0]
    for t in ("weights", "bias"):
        np.testing.assert_array_equal(cached[1][t], searched[1][t])


# ------------------------------------------------- a server's work on one request (issue 20)

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("num_keys,n_servers", [(1 << 22, 3), (1, 1), (10, 4)])
def test_push_rows_and_gather_local_match_the_two_step_path(dtype, num_keys, n_servers):
    """push_rows_inplace = local_rows_into(out=keys) plus the finite test; gather_local =
    w[local rows]: on every server of a permuted partition, duplicates included."""
    from hpcps.core.tables import KeyPartition

    part = KeyPartition(num_keys, n_servers, permute=True)
    rng = np.random.default_rng(num_keys)
    for s in range(n_servers):
        lo, hi = part.shard_range(s)
        own = part.shard_keys(s)
        if own.size == 0:
            continue
        keys = own[rng.integers(0, own.size, 300)]
        w = rng.standard_normal((hi - lo, 3)).astype(dtype)
        got = kkeys.gather_local(keys, num_keys, part.multiplier, lo, hi, w,
                                 np.empty((keys.size, 3), dtype))
        rows = part.local_rows(keys, s)
        np.testing.assert_array_equal(got, w[rows])
        for ahead in (1, 32, 63, 500):        # the prefetching pass of large pulls
            got = kkeys.gather_local(keys, num_keys, part.multiplier, lo, hi, w,
                                     np.empty((keys.size, 3), dtype), ahead)
            np.testing.assert_array_equal(got, w[rows])
        k = keys.copy()
        assert kkeys.push_rows_inplace(k, num_keys, part.multiplier, lo, hi,
                                       np.ones((keys.size, 2), dtype)) is True
        np.testing.assert_array_equal(k, rows)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_push_rows_finite_test_is_exact(dtype):
    """Every NaN and infinity anywhere is found (the largest finite values, subnormals and
    -0.0 are finite); sizes around the 4-way unrolling."""
    empty = np.empty(0, np.int64)
    fi = np.finfo(dtype)
    for n in (1, 3, 4, 5, 1000, 1 << 16):
        v = np.full(n, fi.max, dtype)
        v[::2] = -fi.max
        v[0] = fi.tiny / 4
        if n > 2:
            v[1] = -0.0
        assert kkeys.push_rows_inplace(empty, 7, 3, 0, 7, v) is True
        for bad in (np.nan, np.inf, -np.inf):
            for pos in {0, n // 2, n - 1}:
                b = v.copy()
                b[pos] = bad
                assert kkeys.push_rows_inplace(empty, 7, 3, 0, 7, b) is False
    with pytest.raises(TypeError, match="float32 or float64"):
        kkeys.push_rows_inplace(empty, 7, 3, 0, 7, np.ones(3, np.int32))


def test_request_kernels_name_the_bad_key():
    """A key outside the key space or the server's range is named, as local_rows_into does;
    an empty shard holds no key."""
    from hpcps.core.tables import KeyPartition

    part = KeyPartition(1000, 3, permute=True)
    lo, hi = part.shard_range(1)
    other = part.shard_keys(0)[:1]
    w = np.zeros((hi - lo, 1))
    with pytest.raises(ValueError, match=rf"key {other[0]} does not belong"):
        kkeys.push_rows_inplace(other.copy(), 1000, part.multiplier, lo, hi, np.ones(1))
    with pytest.raises(ValueError, match=r"key 1000 is outside the key space"):
        kkeys.gather_local(np.array([1000]), 1000, part.multiplier, lo, hi, w, np.empty((1, 1)))
    with pytest.raises(ValueError, match="does not belong"):
        kkeys.gather_local(other, 1000, part.multiplier, 5, 5, np.zeros((0, 1)), np.empty((1, 1)))
    with pytest.raises(ValueError, match="do not fit"):
        kkeys.gather_local(other, 1000, part.multiplier, lo, hi, w, np.empty((1, 1), np.float32))
    mine = part.shard_keys(1)
    for ahead in (0, 32):                     # the bad key found ahead of the gather too
        for at in (0, 5, 99):
            keys = mine[np.arange(100) % mine.size].copy()
            keys[at] = other[0]
            with pytest.raises(ValueError, match=rf"key {other[0]} does not belong"):
                kkeys.gather_local(keys, 1000, part.multiplier, lo, hi, w,
                                   np.empty((100, 1)), ahead)


# --------------------------------------------------------------------------------------
# rows_finite (the server's check of the rows an update wrote, read in place)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rows_finite_sees_only_the_rows_asked(dtype, bad):
    w = np.arange(40, dtype=dtype).reshape(10, 4)
    rows = np.array([7, 1, 7, 3], np.int64)
    assert kopt.rows_finite(w, rows) is True
    w[5, 2] = bad                                   # not among the rows: not seen
    assert kopt.rows_finite(w, rows) is True
    w[3, 3] = bad
    assert kopt.rows_finite(w, rows) is False
    assert kopt.rows_finite(w, rows[:2]) is True
    assert kopt.rows_finite(w, np.empty(0, np.int64)) is True
    w[1, 0] = np.finfo(dtype).max                   # the largest finite value is finite
    assert kopt.rows_finite(w, rows[:2]) is True


def test_rows_finite_errors():
    w = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"rows\[1\] = 3 is out of range \[0, 3\)"):
        kopt.rows_finite(w, np.array([0, 3], np.int64))
    with pytest.raises(ValueError, match="rows\\[0\\] = -1 is out of range"):
        kopt.rows_finite(w, np.array([-1], np.int64))
    with pytest.raises(TypeError, match="rows must be int64"):
        kopt.rows_finite(w, np.array([0], np.int32))
    with pytest.raises(TypeError, match="float32 or float64"):
        kopt.rows_finite(np.zeros((3, 2), np.int32), np.array([0], np.int64))
    with pytest.raises(ValueError, match="2-D"):
        kopt.rows_finite(np.zeros(3, np.float32), np.array([0], np.int64))


def _rule_after_merge(name, w, state, keys, grads, hp):
    """The reference of apply_sparse: merge_duplicates, then rule ``name`` (lr 0.3, eps 1e-6,
    ``hp``) on the distinct rows, ascending."""
    rows, summed = merge_duplicates(keys, grads)
    if name == "sgd":
        sparse_sgd(w, rows, summed, 0.3, **hp)
    elif name == "adagrad":
        sparse_adagrad(w, state, rows, summed, 0.3, eps=1e-6, **hp)
    elif name == "adam":
        kopt.sparse_adam(w, state, rows, summed, 0.3, eps=1e-6, **hp)
    else:
        kopt.sparse_ftrl(w, state, rows, summed, 0.3, **hp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("n", [1, 2, 20, kopt._DISTINCT_MAX, kopt._DISTINCT_MAX + 1])
@pytest.mark.parametrize("dup", [False, True])
def test_small_push_of_distinct_rows_equals_merge_then_rule_bitwise(dtype, name, n, dup):
    """apply_sparse steps a small push of distinct rows without merging it (issue 20): the
    same bits as merge_duplicates then the rule in ascending order, signed zeros included
    (the merge's sums are 0.0 + g: a -0.0 gradient becomes +0.0), in input order; a push
    with a duplicate still merges."""
    rng = np.random.default_rng(n)
    R, dim = 3_000_000, 2                                # the sort path's side of the table
    keys = rng.choice(R, size=n, replace=False).astype(np.int64)
    if dup and n > 1:
        keys[-1] = keys[0]
    grads = rng.standard_normal((n, dim)).astype(dtype)
    grads[0, 0] = -0.0
    w1 = np.zeros((R, dim), dtype)
    w1[keys] = rng.standard_normal((n, dim)).astype(dtype)
    w1[keys[0], 0] = -0.0
    s1 = kopt.new_state(name, R, dim, dtype) if name in ("adam", "ftrl") else \
        (np.full((R, dim), 0.5, dtype) if name == "adagrad" else None)
    w2 = w1.copy()
    s2 = None if s1 is None else s1.copy()
    hp = dict(l2=0.0, scale=0.25)
    apply_sparse(name, w1, s1, keys, grads, 0.3, eps=1e-6, **hp)
    _rule_after_merge(name, w2, s2, keys, grads, hp)
    assert w1.tobytes() == w2.tobytes()
    if s1 is not None:
        assert s1.tobytes() == s2.tobytes()


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("R", [1 << 14, 1 << 20, 3_000_000])
def test_large_push_of_distinct_rows_equals_merge_then_rule_bitwise(name, R):
    """apply_sparse finds a large push's rows distinct by one pass with the kept bitmap and
    steps them in input order (issue 20): bitwise the merge-then-rule result, on each side of
    the scatter path's regime. A push whose duplicate or out-of-range key comes last must
    leave that bitmap all clear: the scatter path, which shares it, then still sums right."""
    rng = np.random.default_rng(R)
    dim, dtype = 2, np.float32
    n = min(5000, R // 2)
    w1 = rng.standard_normal((R, dim)).astype(dtype)
    s1 = kopt.new_state(name, R, dim, dtype) if name in ("adam", "ftrl") else \
        (np.full((R, dim), 0.5, dtype) if name == "adagrad" else None)
    w2 = w1.copy()
    s2 = None if s1 is None else s1.copy()
    hp = dict(l2=0.01, scale=0.25)

    for case in ("distinct", "duplicate last", "bad key last", "distinct", "many duplicates"):
        keys = rng.choice(R, size=n, replace=False).astype(np.int64)
        if case == "duplicate last":
            keys[-1] = keys[0]
        elif case == "many duplicates":
            keys = rng.choice(keys[: n // 10], size=n)
        grads = rng.standard_normal((n, dim)).astype(dtype)
        grads[0, 0] = -0.0
        if case == "bad key last":
            keys[-1] = R
            before = w1.copy()
            with pytest.raises(ValueError, match=rf"keys\[{n - 1}\] = {R} is out of range"):
                apply_sparse(name, w1, s1, keys, grads, 0.3, eps=1e-6, **hp)
            assert w1.tobytes() == before.tobytes()
            continue
        apply_sparse(name, w1, s1, keys, grads, 0.3, eps=1e-6, **hp)
        _rule_after_merge(name, w2, s2, keys, grads, hp)
        assert w1.tobytes() == w2.tobytes(), case
        if s1 is not None:
            assert s1.tobytes() == s2.tobytes(), case
    assert not kopt._SCRATCH.bits.any()


def test_small_push_out_of_range_is_named_and_nothing_modified():
    w = np.zeros((3_000_000, 1), np.float32)
    with pytest.raises(ValueError, match=r"keys\[1\] = 3000000 is out of range"):
        apply_sparse("sgd", w, None, np.array([5, 3_000_000], np.int64),
                     np.ones((2, 1), np.float32), 0.1)
    assert not w.any()


@pytest.mark.parametrize("name", ["adagrad", "ftrl"])
def test_apply_sparse_cached_scatter_regime_equals_the_merge(name, monkeypatch):
    """A table 64-256 rows per pushed key whose sum buffer fits in 8 MiB (3 Adult workers'
    pushes into 2^20 rows) takes the scatter path since 2026-12-04; the weights and slots
    equal the merge path's bit for bit."""
    R = 1 << 20
    assert R * 4 <= kopt._SCATTER_CACHED_BYTES
    rng = np.random.default_rng(41)
    pool = rng.choice(R, 9000, replace=False)
    keys = np.concatenate([np.sort(rng.choice(pool, 2700, replace=False)) for _ in range(3)])
    n = keys.size
    assert kopt._SCATTER_ROWS_PER_KEY * n + kopt._DENSE_SPAN_SLACK < R
    assert R <= kopt._SCATTER_ROWS_PER_KEY_CACHED * n + kopt._DENSE_SPAN_SLACK
    grads = rng.standard_normal((n, 1)).astype(np.float32)
    out = []
    for cached in (kopt._SCATTER_ROWS_PER_KEY_CACHED, 0):
        monkeypatch.setattr(kopt, "_SCATTER_ROWS_PER_KEY_CACHED", cached)
        w = np.full((R, 1), 0.01, np.float32)
        opt = Optimizer(name, 0.1, l2=0.001)
        slots = opt.init_slots((R, 1), np.float32, w)
        for _ in range(2):
            opt.apply(w, slots, keys, grads, 1.0 / 768)
        out.append((w, slots))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    slots = [s if isinstance(s, dict) else {"acc": s} for _, s in out]
    assert slots[0].keys() == slots[1].keys()
    for k in slots[0]:
        np.testing.assert_array_equal(slots[0][k], slots[1][k])
