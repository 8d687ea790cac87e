"""The per-step NaN/inf guard of the workers (hpcps.worker.steps.NonFiniteGuard), without
MPI: what counts as non-finite, the count, the messages. The collective vote itself runs in
tests/e2e/test_nonfinite.py under mpirun."""

import numpy as np
import pytest

from hpcps.core.optim import NonFiniteError
from hpcps.worker.steps import BAD_GRADIENT, BAD_LOSS, OK, NonFiniteGuard

F32 = {"weights": "float32", "bias": "float32"}


def test_codes_check_after_the_cast_to_the_table_dtype():
    g = NonFiniteGuard(0)
    ok = {"weights": np.array([[1e30]]), "bias": np.zeros((1, 1))}
    assert g.code(0.5, ok, F32) == OK
    big = {"weights": np.array([[1e39]]), "bias": np.zeros((1, 1))}   # finite in float64
    assert g.code(0.5, big, F32) == BAD_GRADIENT
    assert g.code(0.5, big, {"weights": "float64", "bias": "float64"}) == OK
    assert g.code(np.nan, ok, F32) == BAD_LOSS
    assert g.code(0.5, {"weights": np.array([[np.inf]]), "bias": np.zeros((1, 1))}, F32) == BAD_GRADIENT
    assert g.code(0.5, {"weights": np.empty((0, 1))}, F32) == OK


def test_default_limit_stops_at_the_first():
    g = NonFiniteGuard(2)
    assert g.check(7, OK)
    with pytest.raises(NonFiniteError) as ei:
        g.check(8, BAD_GRADIENT)
    assert str(ei.value).startswith("non-finite values (NaN or inf) at clock 8 on worker 2 "
                                    "(gradient): rejected step 1, more than [train] "
                                    "max_nonfinite_steps = 0")


def test_limit_rejects_then_stops_with_the_voted_codes():
    said = []
    votes = iter([[0, 0, 2], [1, 0, 2], [0, 0, 0], [0, 2, 0]])
    g = NonFiniteGuard(0, 2, agree=lambda code: next(votes), say=said.append)
    assert not g.check(3, OK)                  # another worker's gradient: rejected here too
    assert not g.check(4, OK)
    assert g.check(5, OK)
    with pytest.raises(NonFiniteError, match=r"at clock 6 on worker 1 \(gradient\): rejected "
                                             r"step 3, more than \[train\] max_nonfinite_steps = 2"):
        g.check(6, OK)
    assert said == [
        "hpcps: warning: non-finite values (NaN or inf) at clock 3 on worker 2 (gradient): step "
        "rejected on every worker (1 of at most 2, [train] max_nonfinite_steps = 2)",
        "hpcps: warning: non-finite values (NaN or inf) at clock 4 on worker 0 (loss), worker 2 "
        "(gradient): step rejected on every worker (2 of at most 2, [train] "
        "max_nonfinite_steps = 2)"]
    assert g.rejected == 3


def test_without_a_vote_only_the_own_gradient_is_dropped():
    said = []
    g = NonFiniteGuard(1, 1, say=said.append)
    assert not g.check(9, BAD_LOSS)
    assert said[0].endswith("step worker 1's gradient dropped (1 of at most 1, [train] "
                            "max_nonfinite_steps = 1)")
    with pytest.raises(NonFiniteError):
        g.check(10, BAD_GRADIENT)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_sum_shortcut_and_overflowing_finite_values(dtype):
    from hpcps.core.optim import all_finite

    big = np.full(1000, np.finfo(dtype).max / 2, dtype=dtype)   # finite; the sum overflows
    assert all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(1000, dtype=dtype)
        x[617] = bad
        assert not all_finite(x)
        y = big.copy()
        y[3] = bad
        assert not all_finite(y)
    assert all_finite(np.arange(10)) and all_finite(np.empty(0, dtype))
