"""Adam and FTRL-Proximal kernels against straightforward numpy references, their packed
state, and the Optimizer's named slots through a real checkpoint round trip (no MPI)."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcps import checkpoint as ck
from hpcps.kernels import optim as kopt
from hpcps.kernels.optim import (
    apply_sparse,
    dense_adam,
    dense_ftrl,
    merge_duplicates,
    new_state,
    sparse_adam,
    sparse_ftrl,
    state_dtype,
)
from hpcps.core.optim import Optimizer
from hpcps.core.tables import KeyPartition, TableSpec

DTYPES = [np.float32, np.float64]
HYP = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
ADAM = dict(lr=0.05, l2=0.01, scale=0.25, beta1=0.9, beta2=0.999, eps=1e-7)
FTRL = dict(alpha=0.5, beta=1.0, lambda1=0.02, lambda2=0.1, l2=0.01, scale=0.25)


def tol(dtype):
    return dict(rtol=2e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------
# numpy references, written from the papers' pseudo-code, in the table's dtype
# --------------------------------------------------------------------------------------

def ref_adam(w, m, v, step, rows, G, lr, l2, scale, beta1, beta2, eps):
    """Kingma & Ba Algorithm 1 on unique ``rows``, lazily, step counts per row."""
    dt = w.dtype.type
    step[rows] += 1
    t = step[rows]
    g = dt(scale) * G + dt(l2) * w[rows]
    m[rows] = dt(beta1) * m[rows] + (dt(1) - dt(beta1)) * g
    v[rows] = dt(beta2) * v[rows] + (dt(1) - dt(beta2)) * (g * g)
    bc1 = np.array([1.0 - math.pow(beta1, int(x)) for x in t]).astype(dt)[:, None]
    bc2 = np.array([1.0 - math.pow(beta2, int(x)) for x in t]).astype(dt)[:, None]
    w[rows] = w[rows] - dt(lr) * (m[rows] / bc1) / (np.sqrt(v[rows] / bc2) + dt(eps))


def ref_ftrl(w, z, n, rows, G, alpha, beta, lambda1, lambda2, l2, scale):
    """McMahan et al. Algorithm 1, per coordinate, on unique ``rows``."""
    dt = w.dtype.type
    wr = w[rows]
    g = dt(scale) * G + dt(l2) * wr
    n_old = n[rows]
    n_new = n_old + g * g
    sigma = (np.sqrt(n_new) - np.sqrt(n_old)) / dt(alpha)
    z_new = z[rows] + g - sigma * wr
    z[rows], n[rows] = z_new, n_new
    closed = -(z_new - np.sign(z_new) * dt(lambda1)) / ((dt(beta) + np.sqrt(n_new)) / dt(alpha)
                                                         + dt(lambda2))
    w[rows] = np.where(np.abs(z_new) <= dt(lambda1), dt(0), closed)


def ref_apply(name, w, S, keys, grads, hp):
    """Sum duplicates with np.add.at, then the rule; ``S`` is a dict of separate slot arrays."""
    rows, inv = np.unique(np.asarray(keys, dtype=np.int64), return_inverse=True)
    G = np.zeros((rows.shape[0], w.shape[1]), dtype=w.dtype)
    np.add.at(G, inv.reshape(-1), grads)
    if name == "adam":
        ref_adam(w, S["m"], S["v"], S["step"], rows, G, **hp)
    else:
        ref_ftrl(w, S["z"], S["n"], rows, G, **hp)


def random_state(rng, name, R, dim, dtype):
    """A packed state with non-trivial values, and its slots as separate arrays."""
    st_ = new_state(name, R, dim, dtype)
    if name == "adam":
        st_["m"] = rng.standard_normal((R, dim)) * 0.1
        st_["v"] = rng.uniform(0.0, 0.05, (R, dim))
        st_["step"] = rng.integers(0, 40, R)
    else:
        st_["z"] = rng.standard_normal((R, dim)) * 0.2
        st_["n"] = rng.uniform(0.0, 2.0, (R, dim))
    return st_, {f: st_[f].copy() for f in st_.dtype.names}


def kernel_kwargs(name, hp):
    if name == "adam":
        return dict(lr=hp["lr"], l2=hp["l2"], scale=hp["scale"], eps=hp["eps"],
                    beta1=hp["beta1"], beta2=hp["beta2"])
    return dict(lr=hp["alpha"], l2=hp["l2"], scale=hp["scale"], beta=hp["beta"],
                lambda1=hp["lambda1"], lambda2=hp["lambda2"])


def ftrl_weights(z, n, alpha, beta, lambda1, lambda2):
    """The closed form of (z, n): what w must hold for the kernel's next step."""
    dt = z.dtype.type
    closed = -(z - np.sign(z) * dt(lambda1)) / ((dt(beta) + np.sqrt(n)) / dt(alpha) + dt(lambda2))
    return np.where(np.abs(z) <= dt(lambda1), dt(0), closed).astype(z.dtype)


# --------------------------------------------------------------------------------------
# state layout
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 8])
def test_state_records_are_packed_and_aligned(dtype, dim):
    isz = np.dtype(dtype).itemsize
    a = state_dtype("adam", dim, dtype)
    assert a.names == ("m", "v", "step")
    assert a.itemsize == 2 * dim * isz + 8 and a.fields["step"][1] == 2 * dim * isz
    assert a.fields["step"][1] % 8 == 0 and a.itemsize % 8 == 0       # step aligned in every row
    f = state_dtype("ftrl", dim, dtype)
    assert f.names == ("z", "n") and f.itemsize == 2 * dim * isz
    s = new_state("adam", 5, dim, dtype)
    assert s.shape == (5,) and s["m"].shape == (5, dim) and s["step"].dtype == np.int64
    assert not s["v"].any() and not s["step"].any()
    with pytest.raises(ValueError, match="no packed state"):
        state_dtype("adagrad", dim, dtype)
    with pytest.raises(TypeError, match="float32 or float64"):
        state_dtype("adam", dim, np.float16)


# --------------------------------------------------------------------------------------
# sparse and dense kernels vs the references
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 4])
@pytest.mark.parametrize("name", ["adam", "ftrl"])
def test_sparse_rules_match_reference_over_several_steps(dtype, dim, name):
    rng = np.random.default_rng(3)
    R, m = 200, 80
    state, S = random_state(rng, name, R, dim, dtype)
    hp = ADAM if name == "adam" else FTRL
    if name == "adam":
        w = rng.standard_normal((R, dim)).astype(dtype)
    else:
        w = ftrl_weights(S["z"], S["n"], FTRL["alpha"], FTRL["beta"], FTRL["lambda1"], FTRL["lambda2"])
    w_ref = w.copy()
    for _ in range(6):                      # rows overlap between steps: counts differ per row
        rows = np.sort(rng.choice(R, size=m, replace=False)).astype(np.int64)
        grads = rng.standard_normal((m, dim)).astype(dtype)
        if name == "adam":
            ref_adam(w_ref, S["m"], S["v"], S["step"], rows, grads, **hp)
            sparse_adam(w, state, rows, grads, **hp)
        else:
            ref_ftrl(w_ref, S["z"], S["n"], rows, grads, **hp)
            sparse_ftrl(w, state, rows, grads, **hp)
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    for f in state.dtype.names:
        np.testing.assert_allclose(state[f], S[f], **tol(dtype))
    if name == "adam":
        assert np.array_equal(state["step"], S["step"]) and len(set(S["step"].tolist())) > 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("name", ["adam", "ftrl"])
@pytest.mark.parametrize("keys_kind", ["zipf", "all_same", "unique", "empty"])
@pytest.mark.parametrize("R", [500, 3_000_000])     # dense-buffer path / merge (sort) path
def test_apply_sparse_sums_duplicates_then_matches_reference(dtype, dim, name, keys_kind, R):
    rng = np.random.default_rng(5)
    n = 3000
    state, S = random_state(rng, name, min(R, 500), dim, dtype)
    if R > 500:                                     # large table: state only where we look
        big = new_state(name, R, dim, dtype)
        big[:500] = state
        state = big
        S = {f: big[f].copy() for f in big.dtype.names}
    w = (rng.standard_normal((R, dim)) * 0.1).astype(dtype)
    if name == "ftrl":
        w = ftrl_weights(S["z"], S["n"], FTRL["alpha"], FTRL["beta"], FTRL["lambda1"], FTRL["lambda2"])
    ranks = (rng.zipf(1.3, size=n) - 1) % 500
    keys = {"zipf": lambda: rng.permutation(500)[ranks].astype(np.int64),
            "all_same": lambda: np.full(n, 17, dtype=np.int64),
            "unique": lambda: rng.permutation(500).astype(np.int64),
            "empty": lambda: np.empty(0, dtype=np.int64)}[keys_kind]()
    grads = rng.standard_normal((keys.shape[0], dim)).astype(dtype)
    hp = ADAM if name == "adam" else FTRL
    w0, w_ref = w.copy(), w.copy()
    ref_apply(name, w_ref, S, keys, grads, hp)
    apply_sparse(name, w, state, keys, grads, **kernel_kwargs(name, hp))
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    for f in state.dtype.names:
        np.testing.assert_allclose(state[f], S[f], **tol(dtype))
    untouched = np.setdiff1d(np.arange(min(R, 500)), keys)
    np.testing.assert_array_equal(w[untouched], w0[untouched])     # bitwise untouched
    if name == "adam" and keys_kind == "all_same":
        assert state["step"][17] == S["step"][17] and state["step"][17] >= 1   # one step, not n


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["adam", "ftrl"])
@pytest.mark.parametrize("R", [300, 3_000_000])
def test_apply_sparse_equals_merge_then_rule_bitwise(dtype, name, R):
    rng = np.random.default_rng(14)
    n, dim = 2000, 2
    keys = rng.choice(rng.integers(0, R, 400), size=n)
    grads = rng.standard_normal((n, dim)).astype(dtype)
    w1 = (rng.standard_normal((R, dim)) * 0.1).astype(dtype) if name == "adam" else np.zeros((R, dim), dtype)
    s1 = new_state(name, R, dim, dtype)
    w2, s2 = w1.copy(), s1.copy()
    hp = ADAM if name == "adam" else FTRL
    for _ in range(3):
        apply_sparse(name, w1, s1, keys, grads, **kernel_kwargs(name, hp))
        rows, summed = merge_duplicates(keys, grads)
        (sparse_adam if name == "adam" else sparse_ftrl)(w2, s2, rows, summed, **hp)
    np.testing.assert_array_equal(w1, w2)
    assert s1.tobytes() == s2.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["adam", "ftrl"])
def test_dense_rules_match_reference_and_equal_sparse_with_every_row(dtype, name):
    rng = np.random.default_rng(4)
    N = 150
    hp = ADAM if name == "adam" else FTRL
    w = (rng.standard_normal(N) * 0.1).astype(dtype) if name == "adam" else np.zeros(N, dtype)
    s1, s2 = np.zeros(N, dtype), np.zeros(N, dtype)        # m, v or z, n
    w_ref, S = w.copy(), {"m": np.zeros((N, 1), dtype), "v": np.zeros((N, 1), dtype),
                          "step": np.zeros(N, np.int64), "z": np.zeros((N, 1), dtype),
                          "n": np.zeros((N, 1), dtype)}
    ws, st_ = w.reshape(N, 1).copy(), new_state(name, N, 1, dtype)
    rows = np.arange(N, dtype=np.int64)
    for t in range(1, 6):
        grads = rng.standard_normal(N).astype(dtype)
        if name == "adam":
            dense_adam(w, s1, s2, grads, t, **hp)
            ref_adam(w_ref.reshape(N, 1), S["m"], S["v"], S["step"], rows, grads[:, None], **hp)
            sparse_adam(ws, st_, rows, grads[:, None], **hp)
        else:
            dense_ftrl(w, s1, s2, grads, **hp)
            ref_ftrl(w_ref.reshape(N, 1), S["z"], S["n"], rows, grads[:, None], **hp)
            sparse_ftrl(ws, st_, rows, grads[:, None], **hp)
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    np.testing.assert_array_equal(w, ws[:, 0])        # same arithmetic, same bits
    first, second = ("m", "v") if name == "adam" else ("z", "n")
    np.testing.assert_array_equal(s1, st_[first][:, 0])
    np.testing.assert_array_equal(s2, st_[second][:, 0])


@HYP
@given(seed=st.integers(0, 2**32 - 1), R=st.integers(1, 400), n=st.integers(0, 600),
       dim=st.integers(1, 3), f32=st.booleans(), name=st.sampled_from(["adam", "ftrl"]))
def test_apply_sparse_property(seed, R, n, dim, f32, name):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    state, S = random_state(rng, name, R, dim, dtype)
    hp = ADAM if name == "adam" else FTRL
    w = (rng.standard_normal((R, dim)).astype(dtype) if name == "adam" else
         ftrl_weights(S["z"], S["n"], FTRL["alpha"], FTRL["beta"], FTRL["lambda1"], FTRL["lambda2"]))
    keys = rng.integers(0, R, n)
    grads = rng.standard_normal((n, dim)).astype(dtype)
    w_ref = w.copy()
    ref_apply(name, w_ref, S, keys, grads, hp)
    apply_sparse(name, w, [state], keys, grads, **kernel_kwargs(name, hp))
    np.testing.assert_allclose(w, w_ref, rtol=1e-4 if f32 else 1e-10, atol=1e-5 if f32 else 1e-12)


# --------------------------------------------------------------------------------------
# Adam: bias correction by the row's own step count
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_bias_correction_uses_each_rows_own_count(dtype):
    """Row 0 is updated in every step, row 1 first in step 50: row 1's first update must be
    Adam's first step (|dw| = lr for l2 = 0, eps small), whatever the other rows' counts."""
    lr, R = 0.01, 2
    w = np.zeros((R, 1), dtype)
    state = new_state("adam", R, 1, dtype)
    g = np.array([[0.3]], dtype)
    for _ in range(49):
        sparse_adam(w, state, np.array([0]), g, lr)
    sparse_adam(w, state, np.array([0, 1]), np.array([[0.3], [-0.02]], dtype), lr)
    assert state["step"].tolist() == [50, 1]
    assert float(w[1, 0]) == pytest.approx(lr, rel=1e-5)          # + lr (gradient < 0)
    # a constant gradient: every bias-corrected step of row 0 is exactly lr
    assert float(w[0, 0]) == pytest.approx(-50 * lr, rel=1e-4)
    # a row first touched after 10,000 updates of a hot row still takes a step of lr ...
    state["step"][0] = 9_999
    sparse_adam(w, state, np.array([0]), g, lr)
    w2 = np.zeros((1, 1), dtype)
    s2 = new_state("adam", 1, 1, dtype)
    sparse_adam(w2, s2, np.array([0]), np.array([[0.5]], dtype), lr)
    assert float(w2[0, 0]) == pytest.approx(-lr, rel=1e-5)
    # ... where bias correction by a global count T = 10,000 would give a 3.2 x larger step
    T = 10_000
    global_count = lr * ((1 - 0.9) / (1 - 0.9**T)) / math.sqrt((1 - 0.999) / (1 - 0.999**T))
    assert global_count == pytest.approx(3.16 * lr, rel=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_bias_correction_beyond_the_table_and_saturated(dtype):
    """Step counts past the precomputed table (pow) and past saturation (exactly 1.0) give the
    formula's values: compare with the reference from counts just below each boundary."""
    rng = np.random.default_rng(9)
    R = 4
    beta2 = 0.99999                                   # saturates only after ~3.7 M steps
    sat1, sat2 = kopt._saturation(0.9), kopt._saturation(beta2)
    assert 1.0 - math.pow(0.9, sat1) == 1.0 and 1.0 - math.pow(0.9, sat1 - 1) != 1.0
    assert sat2 > kopt._BC_TABLE_MAX
    state = new_state("adam", R, 2, dtype)
    state["step"] = [kopt._BC_TABLE_MAX - 2, sat1 - 2, sat2 - 2, 0]
    state["m"] = rng.standard_normal((R, 2)) * 0.1
    state["v"] = rng.uniform(0.01, 0.1, (R, 2))
    S = {f: state[f].copy() for f in state.dtype.names}
    w = rng.standard_normal((R, 2)).astype(dtype)
    w_ref = w.copy()
    hp = dict(ADAM, beta2=beta2)
    rows = np.arange(R)
    for _ in range(4):
        g = rng.standard_normal((R, 2)).astype(dtype)
        sparse_adam(w, state, rows, g, **hp)
        ref_adam(w_ref, S["m"], S["v"], S["step"], rows, g, **hp)
    np.testing.assert_allclose(w, w_ref, **tol(dtype))
    assert state["step"].tolist() == [kopt._BC_TABLE_MAX + 2, sat1 + 2, sat2 + 2, 4]


def test_adam_steps_are_invariant_to_gradient_scale_up_to_eps():
    """Adam's step does not depend on the gradient's scale (Kingma & Ba §2): `scale` (1 /
    examples) changes nothing when l2 = 0 and eps is negligible."""
    rng = np.random.default_rng(2)
    g = rng.standard_normal((50, 1))
    a, b = np.zeros((50, 1)), np.zeros((50, 1))
    sa, sb = new_state("adam", 50, 1, np.float64), new_state("adam", 50, 1, np.float64)
    for _ in range(3):
        sparse_adam(a, sa, np.arange(50), g, 0.1, scale=1.0, eps=1e-12)
        sparse_adam(b, sb, np.arange(50), g, 0.1, scale=1e-3, eps=1e-12)
    np.testing.assert_allclose(a, b, rtol=1e-6)


# --------------------------------------------------------------------------------------
# FTRL: exact zeros
# --------------------------------------------------------------------------------------

def _sparse_problem(seed=0, n=3000, d=400, informative=20):
    """Logistic data on binary sparse features, only ``informative`` features matter."""
    rng = np.random.default_rng(seed)
    X = (rng.random((n, d)) < 0.05).astype(np.float64)
    coef = np.zeros(d)
    coef[:informative] = rng.choice([-2.0, 2.0], informative)
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ coef)))).astype(np.float64)
    return X, y


def _train_ftrl(X, y, lambda1, dtype=np.float64, epochs=3, batch=50):
    d = X.shape[1]
    w = np.zeros((d, 1), dtype)
    state = new_state("ftrl", d, 1, dtype)
    for _ in range(epochs):
        for i in range(0, X.shape[0], batch):
            Xb, yb = X[i:i + batch], y[i:i + batch]
            p = 1 / (1 + np.exp(-(Xb @ w[:, 0].astype(np.float64))))
            rows, cols = np.nonzero(Xb)                  # sparse push: the batch's features
            grads = ((p - yb)[rows] * Xb[rows, cols]).astype(dtype)[:, None]
            apply_sparse("ftrl", w, state, cols, grads, 0.5, 0.0, 1.0 / len(yb), beta=1.0,
                         lambda1=lambda1, lambda2=0.01)
    return w[:, 0], state


@pytest.mark.parametrize("dtype", DTYPES)
def test_ftrl_l1_gives_exact_zeros_and_sparsity_grows_with_l1(dtype):
    X, y = _sparse_problem()
    nnz = []
    for l1 in (0.0, 0.02, 0.1, 0.5, 5.0):
        w, state = _train_ftrl(X, y, l1, dtype)
        z = state["z"][:, 0]
        assert np.all((w == 0) == (np.abs(z) <= dtype(l1)))         # zero exactly where |z| <= l1
        assert not np.any(np.signbit(w[w == 0]))                     # +0.0, not -0.0
        nnz.append(int(np.count_nonzero(w)))
    assert nnz[0] == X.shape[1]                       # no L1: every touched weight non-zero
    assert all(a >= b for a, b in zip(nnz, nnz[1:])), nnz
    assert nnz[1] < nnz[0] and nnz[-1] == 0, nnz      # strictly sparser; all zero at a huge l1
    w, _ = _train_ftrl(X, y, 0.1, dtype)              # the informative features survive
    assert np.count_nonzero(w[:20]) >= 15, np.count_nonzero(w[:20])


def test_ftrl_zero_gradient_keeps_weights_and_beta0_first_touch_is_finite():
    w = np.zeros((3, 1))
    state = new_state("ftrl", 3, 1, np.float64)
    sparse_ftrl(w, state, np.arange(3), np.zeros((3, 1)), 0.1, beta=0.0)    # n stays 0, d = 0
    assert np.all(w == 0) and np.all(np.isfinite(w))
    sparse_ftrl(w, state, np.arange(3), np.array([[1.0], [0.0], [-2.0]]), 0.1, beta=0.0)
    assert np.all(np.isfinite(w)) and w[1, 0] == 0 and w[0, 0] < 0 < w[2, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ftrl_init_slots_represent_nonzero_initial_weights(dtype):
    """A randomly initialised table keeps its values when its rows receive zero gradients,
    and its first real step starts from them."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((40, 2)) * 0.3).astype(dtype)
    opt = Optimizer("ftrl", 0.2, beta=1.0, lambda1=0.05, lambda2=0.5)
    state = opt.init_slots(w.shape, dtype, w=w)
    w1 = w.copy()
    opt.apply(w1, state, np.arange(40), np.zeros((40, 2), dtype), 1.0)
    np.testing.assert_allclose(w1, w, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=0)
    assert not np.any(Optimizer("ftrl", 0.2).init_slots((3, 2), dtype, w=np.zeros((3, 2), dtype))["z"])


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------

def test_argument_errors_leave_everything_unchanged():
    w = np.zeros((4, 2), np.float32)
    g = np.ones((2, 2), np.float32)
    k = np.array([0, 1])
    adam = new_state("adam", 4, 2, np.float32)
    ftrl = new_state("ftrl", 4, 2, np.float32)
    with pytest.raises(ValueError, match="adam needs its state"):
        apply_sparse("adam", w, None, k, g, 0.1)
    with pytest.raises(TypeError, match=r"state has dtype .* needs .*\('m'"):
        apply_sparse("adam", w, ftrl, k, g, 0.1)
    with pytest.raises(TypeError, match="state has dtype float32"):
        sparse_ftrl(w, np.zeros((4, 2), np.float32), k, g, 0.1)     # an AdaGrad-like array
    with pytest.raises(TypeError, match="needs"):
        sparse_adam(w, new_state("adam", 4, 2, np.float64), k, g, 0.1)
    with pytest.raises(ValueError, match=r"state has shape \(3,\) but w has 4 rows"):
        sparse_adam(w, new_state("adam", 3, 2, np.float32), k, g, 0.1)
    with pytest.raises(ValueError, match=r"beta1 must be in \[0, 1\), got 1.0"):
        sparse_adam(w, adam, k, g, 0.1, beta1=1.0)
    with pytest.raises(ValueError, match=r"beta2 must be in \[0, 1\), got -0.5"):
        apply_sparse("adam", w, adam, k, g, 0.1, beta2=-0.5)
    with pytest.raises(ValueError, match="eps must be > 0"):
        sparse_adam(w, adam, k, g, 0.1, eps=0.0)
    with pytest.raises(ValueError, match="alpha .* must be > 0"):
        sparse_ftrl(w, ftrl, k, g, 0.0)
    with pytest.raises(ValueError, match="lambda1 must be >= 0"):
        apply_sparse("ftrl", w, ftrl, k, g, 0.1, lambda1=-1.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        sparse_ftrl(w, ftrl, k, g, 0.1, beta=float("inf"))
    with pytest.raises(ValueError, match=r"rows\[1\] = 4 is out of range \[0, 4\)"):
        sparse_adam(w, adam, np.array([0, 4]), g, 0.1)
    ro = new_state("ftrl", 4, 2, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        sparse_ftrl(w, ro, k, g, 0.1)
    with pytest.raises(ValueError, match="step must be >= 1"):
        dense_adam(w.reshape(-1), np.zeros(8, np.float32), np.zeros(8, np.float32),
                   np.ones(8, np.float32), 0, 0.1)
    with pytest.raises(TypeError, match="step must be an integer"):
        dense_adam(w.reshape(-1), np.zeros(8, np.float32), np.zeros(8, np.float32),
                   np.ones(8, np.float32), 1.5, 0.1)
    with pytest.raises(ValueError, match="z has shape"):
        dense_ftrl(w.reshape(-1), np.zeros(7, np.float32), np.zeros(8, np.float32),
                   np.ones(8, np.float32), 0.1)
    assert not w.any() and not adam["step"].any() and not adam["m"].any() and not ftrl["z"].any()


def test_optimizer_validates_hyper_parameters():
    for kw, msg in [(dict(beta1=1.0), "beta1"), (dict(beta2=-0.1), "beta2"), (dict(eps=0.0), "eps"),
                    (dict(beta=-1.0), "beta"), (dict(lambda1=float("nan")), "lambda1")]:
        with pytest.raises(ValueError, match=msg):
            Optimizer("adam", 0.1, **kw)
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        Optimizer("rmsprop", 0.1)


# --------------------------------------------------------------------------------------
# Optimizer slots: names, specs, and a checkpoint round trip re-sharded by name
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,slots,per_row", [
    ("sgd", (), 0), ("adagrad", ("accumulator",), 12), ("adam", ("m", "v", "step"), 32),
    ("ftrl", ("z", "n"), 24)])
def test_slot_names_specs_and_bytes(name, slots, per_row):
    opt = Optimizer(name, 0.1)
    assert opt.slot_names == slots
    specs = opt.slot_specs(3, "float32")
    assert tuple(specs) == slots
    if name == "adam":
        assert specs["step"] == ((), "int64") and specs["m"] == ((3,), "float32")
    assert opt.slot_bytes_per_row(3, "float32") == per_row
    s = opt.init_slots((5, 3), np.float32)
    d = opt.slots_dict(s)
    assert tuple(d) == slots
    for k, (tail, dt) in specs.items():
        assert d[k].shape == (5, *tail) and d[k].dtype == np.dtype(dt)
    back = opt.slots_from_dict({k: v.copy() for k, v in d.items()})
    assert (back is None) if name == "sgd" else (back.tobytes() == s.tobytes())
    if name in ("adam", "ftrl"):
        with pytest.raises(ValueError, match="missing"):
            opt.slots_from_dict({slots[0]: d[slots[0]]})


@pytest.mark.parametrize("name", ["adam", "ftrl", "adagrad"])
@pytest.mark.parametrize("new_servers", [1, 2, 4])
def test_checkpoint_round_trip_of_every_slot_resharded(tmp_path, name, new_servers):
    """Real shard files and manifest written from three servers' Optimizer slots, read back
    on another number of servers: every slot, by name, bit-identical (step counts too)."""
    num_keys, dim, dtype = 1000, 2, "float64"
    opt = Optimizer(name, 0.05)
    spec = TableSpec("w", num_keys, dim, dtype, sparse=True)
    rng = np.random.default_rng(0)
    full_w = rng.standard_normal((num_keys, dim))
    full = opt.init_slots((num_keys, dim), dtype)       # whole table, permuted order
    keys = rng.integers(0, num_keys, 5000)
    for _ in range(3):                                  # non-trivial state: a few real steps
        opt.apply(full_w, full, keys, rng.standard_normal((5000, dim)), 0.01)
    full_d = opt.slots_dict(full)
    if name == "adam":
        assert full_d["step"].max() >= 3 and full_d["step"].min() == 0
    part = KeyPartition(num_keys, 3)
    d = ck.step_dir(tmp_path, 7)
    shards = []
    for s in range(3):
        lo, hi = part.shard_range(s)
        shards.append(ck.write_shard(d, s, 3, 7, [dict(
            name="w", rows=full_w[lo:hi], keys=part.shard_keys(s),
            slots={k: v[lo:hi] for k, v in full_d.items()}, lo=lo, hi=hi, num_keys=num_keys,
            multiplier=part.multiplier, sparse=True, optimizer=name)]))
    ck.write_manifest(d, cfg_text="", job_name="t", step=7, epoch=0, step_in_epoch=7,
                      steps_per_epoch=9, n_workers=1, worker_clocks=[7], last_push_seq=[0],
                      shards=shards, history=[],
                      partitions={"w": dict(num_keys=num_keys, dim=dim, dtype=dtype,
                                            multiplier=part.multiplier, range_size=part.range_size,
                                            sparse=True, slots=opt.slot_specs(dim, dtype),
                                            ranges=np.array([part.shard_range(s) for s in range(3)]))})
    m = ck.verify(d)
    assert m["partition"]["w"]["slots"] == sorted(opt.slot_names)
    ck.check_compatible(d, m, [spec], slots={"w": opt.slot_names})
    other = Optimizer("adagrad" if name != "adagrad" else "adam", 0.1)
    with pytest.raises(ck.ResumeError, match="was another optimizer used"):
        ck.check_compatible(d, m, [spec], slots={"w": other.slot_names})
    import h5py
    with h5py.File(d / ck.MANIFEST, "r") as f:                     # stitched virtual datasets
        for k, v in full_d.items():
            assert f[f"slots/w/{k}"].dtype == v.dtype
            np.testing.assert_array_equal(f[f"slots/w/{k}"][()], v)
    new = KeyPartition(num_keys, new_servers)
    got_w, got = [], []
    for s in range(new_servers):
        lo, hi = new.shard_range(s)
        rows, saved = ck.read_range(d, m, "w", lo, hi, num_keys=num_keys, dim=dim, dtype=dtype,
                                    multiplier=new.multiplier, slots=opt.slot_names)
        got_w.append(rows)
        got.append(opt.slots_from_dict(saved))
    np.testing.assert_array_equal(np.concatenate(got_w), full_w)
    assert np.concatenate(got).tobytes() == full.tobytes()
