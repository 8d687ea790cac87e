"""``binary_metrics``: scikit-learn's metrics with its per-call checks turned off (ours done
once instead) equal its checked ``log_loss``, ``accuracy_score`` and ``roc_auc_score``."""

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from hpcps.models.logistic_math import binary_metrics


@pytest.mark.parametrize("n,ties", [(9769, False), (500, True), (2, False)])
def test_equal_to_sklearn_checked_metrics(n, ties):
    rng = np.random.default_rng(n)
    y = (rng.random(n) < 0.3).astype(np.float64)
    y[:2] = [0.0, 1.0]
    p = rng.random(n)
    if ties:                        # many equal scores: the ROC curve's ties
        p = np.round(p, 1)
    p[0] = 0.0                      # clipped to 1e-15, as before
    m = binary_metrics(y, p)
    pc = np.clip(p, 1e-15, 1 - 1e-15)
    assert m["n"] == n
    assert m["logloss"] == pytest.approx(log_loss(y, pc, labels=[0, 1]), rel=1e-12)
    assert m["accuracy"] == accuracy_score(y, pc >= 0.5)
    assert m["auc"] == pytest.approx(roc_auc_score(y, pc), rel=1e-12)


def test_one_label_has_no_auc_and_empty_has_no_metrics():
    m = binary_metrics([1.0, 1.0, 1.0], [0.2, 0.9, 0.6])
    assert np.isnan(m["auc"]) and m["accuracy"] == pytest.approx(2 / 3)
    assert binary_metrics([], []) == {"n": 0}


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_predictions_raise(bad):
    with pytest.raises(ValueError, match="NaN or an infinity"):
        binary_metrics([0.0, 1.0, 1.0], [0.1, bad, 0.7])


def test_lengths_must_match():
    with pytest.raises(ValueError, match="3 labels but 2 predictions"):
        binary_metrics([0.0, 1.0, 1.0], [0.1, 0.7])
