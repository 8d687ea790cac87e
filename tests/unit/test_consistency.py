"""Consistency policies, the staleness histogram and the push filter (no MPI)."""

import numpy as np
import pytest

from hpcps.core.consistency import (BSP, H_CLOCK, SSP, Async, StalenessHistogram, header_len,
                               make_policy, policy_from_config)
from hpcps.worker.steps import PushFilter


def test_read_floors():
    assert [BSP().read_floor(c) for c in (0, 5)] == [0, 5]
    assert [SSP(2).read_floor(c) for c in (0, 5)] == [-2, 3]
    assert SSP(0).read_floor(7) == BSP().read_floor(7)
    h = np.zeros(8, dtype=np.int64)
    h[H_CLOCK] = 3
    assert SSP(2).fresh(h, 5) and not SSP(2).fresh(h, 6)
    assert BSP().fresh(h, 3) and not BSP().fresh(h, 4)
    assert Async().fresh(h, 10**6)
    assert not SSP(1).pull_ready(3, 5) and SSP(1).pull_ready(4, 5)


def test_bsp_means_lockstep_whatever_the_policy_is_called():
    assert BSP().bsp and SSP(0).bsp
    assert not SSP(2).bsp and not Async().bsp


def test_fetch_and_push_schedule():
    a = Async(n_fetch=3, n_push=2)
    assert [a.fetch_due(i) for i in range(7)] == [1, 0, 0, 1, 0, 0, 1]
    assert [a.push_due(i) for i in range(6)] == [0, 1, 0, 1, 0, 1]
    assert all(BSP().fetch_due(i) and BSP().push_due(i) for i in range(5))


def test_make_policy_and_errors():
    assert isinstance(make_policy("bsp"), BSP) and make_policy("bsp").aggregate
    p = make_policy("ssp", staleness=3, n_fetch=9)        # unused options ignored
    assert p.staleness == 3 and p.aggregate and p.n_fetch == 1
    a = make_policy("async", n_fetch=2, n_push=4, push_threshold=0.5)
    assert (a.n_fetch, a.n_push, a.push_threshold, a.aggregate) == (2, 4, 0.5, False)
    with pytest.raises(ValueError, match="unknown consistency model 'xsp'"):
        make_policy("xsp")
    with pytest.raises(ValueError, match=">= 0"):
        SSP(-1)
    with pytest.raises(ValueError, match=">= 1"):
        Async(n_fetch=0)
    from hpcps.config import ConsistencyConfig
    assert policy_from_config(ConsistencyConfig(model="ssp", staleness=2)).describe() == "SSP(s=2)"


def test_header_len_does_not_grow_with_the_workers():
    """The shard header sent with every pull reply carries the slowest and fastest worker's
    clock, not one per worker (it was 8 B per worker: 8 KiB per reply at 1,024 workers)."""
    assert {header_len(n) for n in (1, 4, 5, 64, 1024, 100_000)} == {8}


def test_histogram_merge_exact_mean_and_overflow():
    a, b = StalenessHistogram(), StalenessHistogram()
    for s in (0, 0, 1, 3):
        a.add(s)
    b.add(2, n=4)
    b.add(1000)
    m = StalenessHistogram.merge_rows(np.stack([a.row(), b.row(), StalenessHistogram().row()]))
    assert m["updates"] == 9 and m["max"] == 1000
    assert m["mean"] == pytest.approx((0 + 0 + 1 + 3 + 8 + 1000) / 9)
    assert m["histogram"] == {"0": 2, "1": 1, "2": 4, "3": 1, ">=255": 1}
    with pytest.raises(ValueError):
        a.add(-1)
    assert StalenessHistogram.merge_rows(np.zeros((0, 258)))["updates"] == 0


def test_push_filter_keeps_small_entries_until_they_add_up():
    f = PushFilter(10, threshold=1.0)
    k, v = f.filter(np.array([1, 2, 3]), np.array([0.6, 2.0, -0.5]))
    assert k.tolist() == [2] and v.tolist() == [[2.0]]
    k, v = f.filter(np.array([1, 3]), np.array([0.6, -0.4]))
    assert k.tolist() == [1] and v.ravel() == pytest.approx([1.2])
    k, v = f.filter(np.array([4]), np.array([0.1]), flush=True)   # everything left goes
    assert sorted(k.tolist()) == [3, 4] and v.ravel() == pytest.approx([-0.9, 0.1])
    assert not f.residual.any()
    assert (f.sent, f.offered) == (4, 6)
    with pytest.raises(ValueError):
        PushFilter(10, 0.0)


def test_push_filter_sends_total_of_gradients():
    """Error feedback: the sum of everything sent equals the sum of everything offered."""
    rng = np.random.default_rng(0)
    f = PushFilter(100, threshold=0.3)
    total = np.zeros(100)
    sent = np.zeros(100)
    for i in range(50):
        keys = np.unique(rng.integers(0, 100, 20))
        vals = rng.standard_normal(keys.size) * 0.1
        total[keys] += vals
        k, v = f.filter(keys, vals, flush=i == 49)
        np.add.at(sent, k, v[:, 0])
    np.testing.assert_allclose(sent, total, atol=1e-12)
    assert f.sent < f.offered


def test_push_filter_rows_of_several_values():
    """A row is sent when any of its values crosses the threshold; the whole row goes."""
    f = PushFilter(5, threshold=1.0, dim=3)
    k, v = f.filter(np.array([0, 4]), np.array([[0.1, -1.5, 0.0], [0.2, 0.3, 0.4]]))
    assert k.tolist() == [0] and v.tolist() == [[0.1, -1.5, 0.0]]
    k, v = f.filter(np.array([2]), np.zeros((1, 3)), flush=True)
    assert k.tolist() == [4] and v.tolist() == [[0.2, 0.3, 0.4]]
    assert not f.residual.any()


def test_a_wide_staleness_histogram_prints_in_power_of_two_ranges():
    """Async at 60 workers: 86 distinct staleness values printed 86 lines; more than 16
    values are printed per range 0, 1, 2-3, 4-7, ... with every update counted once."""
    from hpcps.core.consistency import format_histogram

    h = StalenessHistogram()
    for s in range(120):
        h.add(s, 1)
    h.add(300, 5)                              # beyond the exact bins
    summary = StalenessHistogram.merge_rows(h.row())
    lines = format_histogram(summary)
    labels = [line.split(":")[0].strip() for line in lines]
    assert labels == ["0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", ">=255"]
    counts = [int(line.split(":")[1].split()[0].replace(",", "")) for line in lines]
    assert counts == [1, 1, 2, 4, 8, 16, 32, 56, 5] and sum(counts) == summary["updates"]
    few = StalenessHistogram()
    few.add(0, 3)
    few.add(2, 1)
    assert [line.split(":")[0].strip() for line in
            format_histogram(StalenessHistogram.merge_rows(few.row()))] == ["0", "2"]
