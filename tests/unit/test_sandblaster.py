"""Sandblaster L-BFGS without MPI: programs and shards, the strong Wolfe line search, the
two-loop recursion against the explicit BFGS matrix, work units and their dispatcher, and the
whole L-BFGS on real data (UCI Adult) against scikit-learn, in one process."""

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize

from hpcps.config import DataConfig
from hpcps.data.source import load_split
from hpcps.models.logistic_math import batch_keys, loss_and_gradient
from hpcps.sandblaster import program as P
from hpcps.sandblaster.baseline import objective, sklearn_solution
from hpcps.sandblaster.lbfgs import D, G, LBFGS, n_slots, s_slot, y_slot
from hpcps.sandblaster.linesearch import cubic_min, strong_wolfe
from hpcps.sandblaster.local import LocalMachine, to_original_order
from hpcps.sandblaster.shard import (ShardVectors, bias_server, compact_bounds, shard_layouts,
                                     ShardLayout)
from hpcps.sandblaster.units import UnitScheduler, WorkUnits, unit_bounds
from hpcps.core.tables import KeyPartition

DATA = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"


def adult(rows=2000, bits=12):
    cfg = DataConfig(format="adult_csv", path=DATA, max_rows=rows, hash_bits=bits)
    return load_split(cfg, "train", 0, 1)


@pytest.fixture(scope="module")
def small():
    return adult(2000, 12)


# ----------------------------------------------------------------------------- programs


def test_program_encoding_and_result_sizes():
    p = P.Program().copy(1, 2).scale(-1.0, 2).dot(1, 2).axpy(0.5, 3, 2).dot(2, 2)
    assert p.ops.tolist() == [[P.COPY, 1, 2, 0], [P.SCALE, 2, 0, 0], [P.DOT, 1, 2, 0],
                              [P.AXPY, 3, 2, 0], [P.DOT, 2, 2, 0]]
    assert p.scalars.tolist() == [0.0, -1.0, 0.0, 0.5, 0.0]
    assert (p.n_sums, p.n_maxes, p.tail) == (2, 0, None)
    e = P.Program().dot(0, 0).eval(3, 4, 2, 0.25)
    assert (e.n_sums, e.n_maxes, e.tail) == (1 + P.EVAL_SUMS, P.EVAL_MAXES, P.EVAL)
    assert e.scalars[-1] == 0.25


def test_program_rejects_ops_after_tail_overflow_and_nan():
    with pytest.raises(ValueError, match="no operation may follow eval"):
        P.Program().eval(0, 1, 2, 1.0).dot(0, 0)
    with pytest.raises(ValueError, match="no operation may follow stop"):
        P.Program().stop().stop()
    p = P.Program()
    for _ in range(P.MAX_OPS):
        p.dot(0, 0)
    with pytest.raises(ValueError, match=f"at most {P.MAX_OPS}"):
        p.dot(0, 0)
    with pytest.raises(ValueError, match="finite"):
        P.Program().scale(math.nan, 0)


# ------------------------------------------------------------------------------ shards


def test_layouts_are_the_parameter_server_key_ranges():
    nf, k = 1 << 12, 3
    part = KeyPartition(nf, k, permute=True)
    lays = shard_layouts(nf, k)
    assert [(l.lo, l.hi) for l in lays] == [part.shard_range(s) for s in range(k)]
    assert [l.has_bias for l in lays] == [s == bias_server(k) for s in range(k)]
    assert bias_server(k) == 0          # the PS mode's dense 1-row bias table lives on server 0
    # compact indices: the active positions of each range, contiguous and in range order
    rng = np.random.default_rng(0)
    active = np.unique(rng.integers(0, nf, 300))
    b = compact_bounds(nf, k, active)
    for lay in shard_layouts(nf, k, b):
        held = active[lay.start:lay.stop]
        assert ((held >= lay.lo) & (held < lay.hi)).all()
        assert lay.n_weights == np.count_nonzero((active >= lay.lo) & (active < lay.hi))
    assert b[0] == 0 and b[-1] == active.size
    with pytest.raises(ValueError, match="non-decreasing"):
        shard_layouts(nf, k, [0, 5, 3, 9])


def _store(n=7, slots=6, l2=0.0, bias=True):
    lay = ShardLayout(0, 0, 100, 0, n, has_bias=bias)
    st = ShardVectors(lay, slots, l2)
    rng = np.random.default_rng(1)
    for v in st.v:
        v[:] = rng.normal(size=v.size)
    return st


def test_shard_operations_match_numpy():
    st = _store()
    ref = [v.copy() for v in st.v]
    prog = (P.Program().dot(0, 1).axpy(0.5, 0, 1).scale(-2.0, 2).copy(3, 4)
            .lincomb(0, 0.25, 1, 5).dot(5, 5).swap(0, 3))
    out = st.run_body(prog.ops, prog.scalars)
    r1 = ref[1] + 0.5 * ref[0]
    r5 = ref[0] + 0.25 * r1
    assert out[0] == pytest.approx(float(ref[0] @ ref[1]), rel=1e-15)
    assert out[1] == pytest.approx(float(r5 @ r5), rel=1e-14)
    np.testing.assert_allclose(st.v[1], r1, rtol=1e-15)
    np.testing.assert_array_equal(st.v[2], -2.0 * ref[2])
    np.testing.assert_array_equal(st.v[4], ref[3])
    np.testing.assert_allclose(st.v[5], r5, rtol=1e-15)
    np.testing.assert_array_equal(st.v[0], ref[3])         # swapped
    np.testing.assert_array_equal(st.v[3], ref[0])


@pytest.mark.parametrize("a,b,c", [(0, 1, 0), (0, 1, 1), (0, 0, 0)])
def test_lincomb_with_aliased_slots(a, b, c):
    st = _store()
    va, vb = st.v[a].copy(), st.v[b].copy()
    prog = P.Program().lincomb(a, -3.0, b, c)
    st.run_body(prog.ops, prog.scalars)
    np.testing.assert_allclose(st.v[c], va - 3.0 * vb, rtol=1e-15)


def test_shard_rejects_bad_slots_and_misplaced_tail():
    st = _store(slots=3)
    with pytest.raises(ValueError, match="slot 3 out of range"):
        st.run_body(np.array([[P.DOT, 0, 3, 0]]), np.zeros(1))
    with pytest.raises(ValueError, match="unknown op code 99"):
        st.run_body(np.array([[99, 0, 0, 0]]), np.zeros(1))
    with pytest.raises(ValueError, match="must be the last"):
        st.run_body(np.array([[P.EVAL, 0, 1, 2], [P.DOT, 0, 0, 0]]), np.zeros(2))


def test_finish_eval_penalises_weights_not_bias():
    st = _store(n=4, slots=3, l2=0.5)
    x = st.v[0].copy()
    gw, gb = np.arange(4.0), np.array([10.0])
    sums, maxes = st.finish_eval([P.EVAL, 0, 1, 2], 0.5, gw, gb, stop_flag=True)
    g = np.r_[0.5 * gw + 0.5 * x[:4], 5.0]
    np.testing.assert_allclose(st.v[1], g, rtol=1e-15)
    assert sums[0] == pytest.approx(0.25 * float(x[:4] @ x[:4]), rel=1e-15)
    assert sums[1] == pytest.approx(float(g @ st.v[2]), rel=1e-14)
    assert sums[2] == pytest.approx(float(g @ g), rel=1e-14)
    assert maxes == [pytest.approx(np.abs(g).max()), 1.0]


# ------------------------------------------------------------------------- line search


def _phi(f, df):
    calls = []

    def phi(t):
        calls.append(t)
        return f(t), df(t)
    return phi, calls


@pytest.mark.parametrize("c2", [0.9, 0.1])
@pytest.mark.parametrize("case", ["quadratic", "rosenbrock", "logistic", "steep"])
def test_strong_wolfe_conditions_hold(case, c2):
    if case == "quadratic":               # minimum at t = 3
        f, df, t1 = (lambda t: (t - 3) ** 2), (lambda t: 2 * (t - 3)), 1.0
    elif case == "logistic":              # log(1 + e^(2 - t)) + 0.01 t²
        f = lambda t: math.log1p(math.exp(2 - t)) + 0.01 * t * t
        df = lambda t: -1 / (1 + math.exp(t - 2)) + 0.02 * t
        t1 = 1.0
    elif case == "steep":                 # minimum at t = 1e-3: the first trial overshoots
        f, df, t1 = (lambda t: (t - 1e-3) ** 2), (lambda t: 2 * (t - 1e-3)), 1.0
    else:                                 # Rosenbrock along the steepest descent from (-1.2, 1)
        x0 = np.array([-1.2, 1.0])
        g0 = scipy.optimize.rosen_der(x0)
        f = lambda t: scipy.optimize.rosen(x0 - t * g0)
        df = lambda t: float(scipy.optimize.rosen_der(x0 - t * g0) @ -g0)
        t1 = 1.0 / np.linalg.norm(g0)
    phi, calls = _phi(f, df)
    f0, d0 = f(0.0), df(0.0)
    r = strong_wolfe(phi, f0, d0, t1, c1=1e-4, c2=c2, max_evals=30)
    assert r.status == "wolfe"
    assert r.f <= f0 + 1e-4 * r.t * d0
    assert abs(r.df) <= c2 * abs(d0)
    assert r.last and calls[-1] == r.t and r.evals == len(calls)
    assert r.f == f(r.t)
    # scipy's implementation of the same conditions finds an acceptable step too
    s = scipy.optimize.line_search(lambda x: f(x[0]), lambda x: np.array([df(x[0])]),
                                   np.zeros(1), np.ones(1), c1=1e-4, c2=c2, maxiter=30)
    assert s[0] is not None and abs(df(s[0])) <= c2 * abs(d0)


def test_strong_wolfe_accepts_unit_step_when_it_is_good():
    phi, calls = _phi(lambda t: (t - 1) ** 2, lambda t: 2 * (t - 1))
    r = strong_wolfe(phi, 1.0, -2.0, 1.0)
    assert (r.t, r.evals, r.status) == (1.0, 1, "wolfe")


def test_strong_wolfe_survives_non_finite_values():
    f = lambda t: (t - 0.2) ** 2 if t < 0.5 else math.inf
    df = lambda t: 2 * (t - 0.2) if t < 0.5 else math.nan
    r = strong_wolfe(_phi(f, df)[0], f(0), df(0), 1.0)
    assert r.status == "wolfe" and r.t < 0.5 and abs(r.df) <= 0.9 * abs(df(0))


def test_strong_wolfe_failure_and_armijo_only():
    # the derivative lies (says descent, the function only rises): no step decreases it
    r = strong_wolfe(_phi(lambda t: 1 + t, lambda t: -1.0)[0], 1.0, -1.0, 1.0, max_evals=8)
    assert r.status == "failed" and r.t == 0.0 and r.evals == 8
    # evaluations run out before the curvature condition: the best decreasing step comes back,
    # and `last` says whether the caller must evaluate it again
    f, df = (lambda t: (t - 50.0) ** 2), (lambda t: 2 * (t - 50.0))
    r = strong_wolfe(_phi(f, df)[0], f(0), df(0), 1.0, max_evals=3)
    assert r.status == "armijo" and r.t == 4.0 and r.last and r.f == f(4.0)


def test_strong_wolfe_rejects_bad_input():
    phi = _phi(lambda t: t, lambda t: 1.0)[0]
    with pytest.raises(ValueError, match="descent direction"):
        strong_wolfe(phi, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="0 < c1 < c2 < 1"):
        strong_wolfe(phi, 0.0, -1.0, 1.0, c1=0.5, c2=0.4)
    with pytest.raises(ValueError, match="t1 > 0"):
        strong_wolfe(phi, 0.0, -1.0, 0.0)


def test_cubic_min_is_exact_for_cubics():
    f = lambda t: t ** 3 - 3 * t        # local minimum at t = 1
    df = lambda t: 3 * t * t - 3
    assert cubic_min(0.0, f(0), df(0), 2.0, f(2), df(2)) == pytest.approx(1.0, rel=1e-12)
    assert math.isnan(cubic_min(1.0, 0.0, 0.0, 1.0, 0.0, 0.0))


# -------------------------------------------------------------------------- work units


def test_units_cover_every_row_and_sum_to_the_batch_gradient(small):
    X, y = small
    part = KeyPartition(X.shape[1], 2)
    wu = WorkUnits(X, y, part.positions, 37)
    assert len(wu) == 37 and wu.n_rows == X.shape[0]
    assert np.array_equal(wu.active, np.unique(part.positions(X.indices.astype(np.int64))))
    rng = np.random.default_rng(2)
    w = rng.normal(scale=0.1, size=wu.n_active)
    acc = np.zeros_like(w)
    loss = gb = 0.0
    for u in range(len(wu)):
        lu, gu = wu.accumulate(u, w, 0.3, acc)
        loss += lu
        gb += gu
    # the same sums over the whole batch at once, in original key order
    w_full = to_original_order(w, wu.active, X.shape[1])
    keys, local = batch_keys(X)
    l_ref, g_ref, gb_ref = loss_and_gradient(X, y, local, w_full[keys], 0.3)
    assert loss == pytest.approx(l_ref, rel=1e-12) and gb == pytest.approx(gb_ref, rel=1e-12)
    np.testing.assert_allclose(to_original_order(acc, wu.active, X.shape[1])[keys], g_ref,
                               rtol=1e-10, atol=1e-12)


def test_unit_bounds():
    b = unit_bounds(10, 3)
    assert b.tolist() == [0, 3, 7, 10]
    assert unit_bounds(2, 64).tolist() == [0, 1, 2]       # capped at the number of rows
    assert unit_bounds(0, 4).tolist() == [0, 0]


def test_scheduler_hands_out_each_unit_once_and_balances():
    s = UnitScheduler(10, 2)
    s.start(1)
    got = {0: [], 1: []}
    done = {0: -1, 1: -1}
    # worker 0 is three times as fast: it asks three times for every request of worker 1
    order = [0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    for w in order:
        if s.released[w]:
            continue
        u = s.answer(w, 1, done[w])
        done[w] = u
        if u >= 0:
            got[w].append(u)
    assert sorted(got[0] + got[1]) == list(range(10))
    assert len(got[0]) > 2 * len(got[1])
    for w in (0, 1):
        while not s.released[w]:
            done[w] = s.answer(w, 1, done[w])
    assert s.complete and s.finished.all() and s.done_by.sum() == 10


def test_scheduler_refuses_protocol_errors():
    s = UnitScheduler(3, 2)
    s.start(7)
    with pytest.raises(RuntimeError, match="evaluation 6 during evaluation 7"):
        s.answer(0, 6, -1)
    u0 = s.answer(0, 7, -1)
    with pytest.raises(RuntimeError, match="does not hold"):
        s.answer(1, 7, u0)                 # worker 1 reports worker 0's unit
    u1 = s.answer(1, 7, -1)
    assert (u0, u1, s.answer(1, 7, u1)) == (0, 1, 2)
    assert s.answer(0, 7, u0) == -1        # nothing left for worker 0: released
    with pytest.raises(RuntimeError, match="after being released"):
        s.answer(0, 7, -1)


# ---------------------------------------------------------------- two-loop recursion


def test_two_loop_direction_equals_the_bfgs_matrix_product(small):
    X, y = small
    wu = WorkUnits(X[:200], y[:200], KeyPartition(X.shape[1], 3).positions, 4)
    m = 4
    mach = LocalMachine(wu, 3, 0.0, n_slots(m))
    opt = LBFGS(mach, history=m)
    n = wu.n_active + 1
    rng = np.random.default_rng(3)

    def put(slot, vec):                    # a whole vector (compact weights, bias) → shards
        for lay, sh in zip(mach.layouts, mach.shards):
            sh.v[slot][:lay.n_weights] = vec[lay.start:lay.stop]
            if lay.has_bias:
                sh.v[slot][-1] = vec[-1]

    def get(slot):
        w, b = mach.assemble(slot)
        return np.r_[w, b]

    pairs = []
    for i in range(m):
        s = rng.normal(size=n)
        yv = s + 0.3 * rng.normal(size=n)         # s·y > 0
        put(s_slot(i), s)
        put(y_slot(i), yv)
        pairs.append((s, yv))
    opt.pairs = [(i, 1.0 / float(pairs[i][0] @ pairs[i][1])) for i in range(m)]
    opt.free = []
    opt.gamma = float(pairs[-1][0] @ pairs[-1][1]) / float(pairs[-1][1] @ pairs[-1][1])
    g = rng.normal(size=n)
    put(G, g)
    df = opt.direction()
    # explicit H_k: H = V^T H V + rho s s^T from H0 = gamma I (N&W eq. 7.19)
    H = opt.gamma * np.eye(n)
    for s, yv in pairs:
        rho = 1.0 / (s @ yv)
        V = np.eye(n) - rho * np.outer(yv, s)
        H = V.T @ H @ V + rho * np.outer(s, s)
    d = get(D)
    np.testing.assert_allclose(d, -H @ g, rtol=1e-9, atol=1e-12)
    assert df == pytest.approx(float(g @ d), rel=1e-12)
    assert opt.round_trips == 2 * m + 1


# ------------------------------------------------------------------ whole optimisation


def test_objective_matches_sklearn_log_loss(small):
    from sklearn.metrics import log_loss

    X, y = small
    rng = np.random.default_rng(4)
    w = rng.normal(scale=0.05, size=X.shape[1])
    p = 1 / (1 + np.exp(-(X @ w + 0.2)))
    assert objective(X, y, w, 0.2, 0.01) == pytest.approx(
        log_loss(y, p) + 0.005 * float(w @ w), rel=1e-12)


@pytest.fixture(scope="module")
def reference(small):
    X, y = small
    return sklearn_solution(X, y, 1e-3, 1e-8)


@pytest.mark.parametrize("servers", [1, 3])
def test_lbfgs_reaches_sklearn_objective(small, reference, servers):
    X, y = small
    wu = WorkUnits(X, y, KeyPartition(X.shape[1], servers).positions, 16)
    mach = LocalMachine(wu, servers, 1e-3, n_slots(10))
    recs = []
    res = LBFGS(mach, history=10, tolerance=1e-6, on_iteration=recs.append).run()
    assert res.status == "gradient" and res.grad_max <= 1e-6
    w, b = mach.weights()
    f_central = objective(X, y, w, b, 1e-3)
    assert f_central == pytest.approx(res.objective, rel=1e-13)    # tracked F is the real F
    gap = (f_central - reference["objective"]) / reference["objective"]
    assert abs(gap) <= 1e-6, gap
    # the same minimiser: weights agree with scikit-learn's to the accuracy of both solvers;
    # the intercept is unpenalised and the objective nearly flat along it (objectives equal to
    # 1e-6 with intercepts 0.0055 apart against scikit-learn 1.9.1), so it gets 1e-2
    np.testing.assert_allclose(w, reference["w"], atol=5e-3)
    assert b == pytest.approx(reference["b"], abs=1e-2)
    # monotone decrease, and the history is complete
    fs = [r["objective"] for r in recs]
    assert all(b <= a for a, b in zip(fs, fs[1:])) and len(recs) == res.iterations
    assert res.evaluations >= res.iterations + 1
    # features that occur in no row keep weight exactly 0 (they are not even stored)
    unused = np.setdiff1d(np.arange(X.shape[1]), np.unique(X.indices))
    assert unused.size > 0 and not w[unused].any()


def test_lbfgs_stops_at_max_iterations_and_on_f_tolerance(small):
    X, y = small
    wu = WorkUnits(X, y, KeyPartition(X.shape[1], 1).positions, 4)
    r = LBFGS(LocalMachine(wu, 1, 1e-3, n_slots(3)), history=3, max_iterations=5).run()
    assert r.status == "max_iterations" and r.iterations == 5
    r = LBFGS(LocalMachine(wu, 1, 1e-3, n_slots(3)), history=3, tolerance=0.0,
              f_tolerance=1e-3).run()
    assert r.status == "f_tolerance"
    assert (r.history[-2]["objective"] - r.objective) <= 1e-3 * max(r.objective, 1.0)


def test_history_one_and_unregularised(small):
    X, y = small
    wu = WorkUnits(X[:300], y[:300], KeyPartition(X.shape[1], 2).positions, 8)
    r = LBFGS(LocalMachine(wu, 2, 1e-2, n_slots(1)), history=1, tolerance=1e-6,
              max_iterations=2000).run()
    ref = sklearn_solution(X[:300], y[:300], 1e-2, 1e-8)
    assert r.status == "gradient"
    assert abs(r.objective - ref["objective"]) / ref["objective"] <= 1e-6
    # l2 = 0: no penalty term; the log-loss falls well below log 2 (its value at w = 0)
    mach = LocalMachine(wu, 2, 0.0, n_slots(5))
    r0 = LBFGS(mach, history=5, max_iterations=20).run()
    w, b = mach.weights()
    assert r0.objective == pytest.approx(objective(X[:300], y[:300], w, b, 0.0), rel=1e-13)
    assert r0.objective < math.log(2) - 0.3


def test_steps_accepted_on_sufficient_decrease_only_are_evaluated_again(small, reference):
    """With 2 evaluations per line search and a strict curvature constant, many searches end
    with a step that only satisfies sufficient decrease and was not the last one tried: the
    driver evaluates it again so the pair (s, y) and the next gradient belong to that step."""
    X, y = small
    wu = WorkUnits(X, y, KeyPartition(X.shape[1], 2).positions, 8)
    mach = LocalMachine(wu, 2, 1e-3, n_slots(5))
    recs = []
    opt = LBFGS(mach, history=5, c2=1e-3, max_evals=2, max_iterations=3000,
                on_iteration=recs.append)
    r = opt.run()
    assert opt.reevaluations > 0
    assert any(rec["line_search"] == "armijo" for rec in recs)
    assert r.status == "gradient"
    w, b = mach.weights()
    assert r.objective == pytest.approx(objective(X, y, w, b, 1e-3), rel=1e-13)
    assert abs(r.objective - reference["objective"]) <= 1e-6 * reference["objective"]


def test_gradient_test_comes_before_f_tolerance():
    """On 2 hashed features the last iteration both lowers F by less than f_tolerance and
    brings max|g| under the tolerance: the run reports the gradient criterion (it once
    reported f_tolerance)."""
    X, y = adult(500, 1)
    wu = WorkUnits(X, y, KeyPartition(2, 3).positions, 5)
    r = LBFGS(LocalMachine(wu, 3, 1e-3, n_slots(10)), tolerance=1e-6, f_tolerance=1e-12).run()
    assert r.status == "gradient" and r.grad_max <= 1e-6
    assert r.history[-2]["objective"] - r.objective <= 1e-12 * r.objective
