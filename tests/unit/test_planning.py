"""Epoch planning (hpcps.core.planning): pure functions, no MPI."""

import json

import numpy as np
import pytest

from hpcps.core.planning import (capped_steps, done_max, epoch_order, epoch_rows,
                                 examples_per_step, resume_position, rows_reassigned,
                                 segment_done, segment_steps, steps_for)


def test_epoch_order_is_a_seeded_permutation():
    a = epoch_order(50, 3, 1, 2, True)
    assert a.dtype == np.int64 and sorted(a.tolist()) == list(range(50))
    assert np.array_equal(a, epoch_order(50, 3, 1, 2, True))
    assert not np.array_equal(a, epoch_order(50, 3, 1, 3, True))      # another epoch
    assert not np.array_equal(a, epoch_order(50, 3, 2, 2, True))      # another worker
    assert np.array_equal(epoch_order(7, 3, 1, 2, False), np.arange(7))


def test_epoch_rows_without_plan_is_each_partition_in_order():
    sizes = [5, 4, 4]
    lists = epoch_rows(sizes, [], 3, 1, 0, True, 2)
    offsets = [0, 5, 9]
    for w, n in enumerate(sizes):
        assert np.array_equal(lists[w], offsets[w] + epoch_order(n, 1, w, 0, True))


@pytest.mark.parametrize("plan,n_next", [([[3, 1]], 2), ([[3, [1, 2, 0]]], 4),
                                         ([[3, 1], [2, 1]], 5)])
def test_epoch_rows_reads_every_row_once(plan, n_next):
    sizes, batch = [9, 8, 8], 2
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    lists = [offsets[w] + epoch_order(n, 4, w, 1, True) for w, n in enumerate(sizes)]
    seen = []
    for k, (n_k, done) in enumerate(plan):
        if k:
            lists = epoch_rows(sizes, plan[:k], n_k, 4, 1, True, batch)
        per = done if isinstance(done, list) else [done] * n_k
        seen += [r[:d * batch] for r, d in zip(lists, per)]
    rest = epoch_rows(sizes, plan, n_next, 4, 1, True, batch)
    assert len(rest) == n_next
    everything = np.concatenate(seen + rest)
    assert sorted(everything.tolist()) == list(range(sum(sizes)))


def test_epoch_rows_rejects_a_plan_of_the_wrong_width():
    with pytest.raises(ValueError, match="segment 0 has 2 workers but 3 row lists"):
        epoch_rows([3, 3, 3], [[2, 1]], 2, 0, 0, False, 1)
    with pytest.raises(ValueError, match="3 workers but 2 step counts"):
        epoch_rows([3, 3, 3], [[3, [1, 1]]], 2, 0, 0, False, 1)


def test_step_counts():
    assert steps_for(10, 4) == 3 and steps_for(0, 4) == 0 and steps_for(8, 4) == 2
    assert done_max([1, 5, 2]) == 5 and done_max(3) == 3
    assert capped_steps(10, 0) == 10
    assert capped_steps(10, 4) == 4
    assert capped_steps(10, 7, [[2, 3], [3, [1, 2, 0]]]) == 2      # 7 - 3 - 2
    assert capped_steps(10, 3, [[2, 5]]) == 0
    assert examples_per_step(100, 10, 3) == 100 / 4
    assert examples_per_step(0, 10, 3) == 0
    # one worker holds every row (a compressed file read whole): 10 rows per clock, not 30
    assert examples_per_step(100, 10, 3, largest=100) == 10
    assert examples_per_step(100, 10, 3, largest=34) == 100 / 4


def test_resume_position():
    m = {"epoch": 2, "step_in_epoch": 5, "n_workers": 3, "epoch_plan": json.dumps([[4, 2]])}
    assert resume_position(m, 3) == (2, 5, [[4, 2]])          # same workers: same step
    assert resume_position(m, 2) == (2, 0, [[4, 2], [3, 5]])  # other count: a new segment
    assert resume_position({"epoch": 0, "step_in_epoch": 1, "n_workers": 1}, 1) == (0, 1, [])


def test_segment_done_and_rows_reassigned():
    done = segment_done([12, 9, 30], 10, 5)
    assert done == [2, 0, 5]
    prev = [np.arange(7), np.arange(4), np.arange(10)]
    assert rows_reassigned(prev, done, [1], 2) == 4
    assert rows_reassigned(prev, done, [0, 2], 2) == 3 + 0


def test_segment_steps_is_the_longest_lists_count_capped():
    # what every worker agreed on with an Allreduce(MAX) before: the same value locally
    lists = epoch_rows([3200, 3200, 3200], [[3, 40], [5, [6, 6, 6, 5, 6]], [4, [1, 0, 0, 0]]], 3,
                       0, 0, True, 32)
    assert [r.size for r in lists] == [1600, 1600, 1600]
    assert segment_steps(lists, 32, 0) == 50
    assert segment_steps([np.arange(65), np.arange(3)], 32, 0) == 3     # the last step short
    assert segment_steps([np.arange(65)], 32, 10, [[2, 4], [3, [5, 2, 1]]]) == 1   # 10 - 4 - 5
    assert segment_steps([], 32, 0) == 0
