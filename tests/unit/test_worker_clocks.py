"""hpcps.server.clocks.WorkerClocks: the minimum and maximum of the workers' clocks kept in
O(1) per CLOCK, checked against min() and max() of a plain list under random updates."""

import random

import pytest

from hpcps.server.clocks import WorkerClocks


def test_bsp_steps_move_the_minimum_only_when_the_last_worker_clocks():
    wc = WorkerClocks([0] * 3)
    assert (wc.min(), wc.max(), len(wc)) == (0, 0, 3)
    wc[0] = 1
    wc[2] = 1
    assert (wc.min(), wc.max()) == (0, 1)
    wc[1] = 1
    assert (wc.min(), wc.max()) == (1, 1)
    assert wc.tolist() == [1, 1, 1] and list(wc) == [1, 1, 1]


@pytest.mark.parametrize("seed", range(5))
def test_random_updates_match_min_and_max_of_a_list(seed):
    rng = random.Random(seed)
    ref = [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
    wc = WorkerClocks(ref)
    for _ in range(3000):
        w = rng.randrange(len(ref))
        kind = rng.random()
        if kind < 0.7:
            v = ref[w] + 1                              # a CLOCK
        elif kind < 0.9:
            v = ref[w] + rng.randrange(-3, 6)           # a recovery's settlement, either way
        else:
            k, c = rng.randrange(3), rng.randrange(20)  # a growth
            wc.extend(k, c)
            ref += [c] * k
            continue
        wc[w] = v
        ref[w] = v
        assert (wc.min(), wc.max()) == (min(ref), max(ref))
        assert wc.tolist() == ref and wc[w] == ref[w]


def test_empty_then_extended():
    wc = WorkerClocks()
    assert (wc.min(), wc.max(), len(wc)) == (0, 0, 0)
    wc.extend(2, 7)
    assert (wc.min(), wc.max(), wc.tolist()) == (7, 7, [7, 7])
    wc.extend(0, 1)
    assert len(wc) == 2
