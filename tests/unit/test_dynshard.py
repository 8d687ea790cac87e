"""DynamicShard (hpcps.server.dynshard): the server's rows of a dynamic table — pulls of
absent keys, update counts and hot keys, admission after min_count pushes (count-min
sketch), TTL and least-frequently-updated eviction, max_keys without eviction refused."""

import numpy as np
import pytest

from hpcps.core.consistency import H_CLOCK
from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec
from hpcps.server.dynshard import HOT_KEYS, REPORT_LEN, Admission, DynamicShard


def shard(**kw):
    spec = TableSpec("w", (1 << 63) - 1, 1, "float64", storage="hash", **kw)
    return DynamicShard.create(spec, Optimizer("sgd", 0.5), 0, 1, seed=1, nh=8)


def push(sh, keys, clock=0, g=1.0):
    sh.hdr[H_CLOCK] = clock
    keys = np.asarray(keys, dtype=np.int64)
    sh.apply(keys, np.full((keys.size, 1), g), 1.0)


def test_pull_of_an_absent_key_is_the_initial_value_and_inserts_nothing():
    sh = shard()
    assert np.all(sh.gather(np.array([5, 2**62], dtype=np.int64)) == 0) and sh.n_rows == 0
    push(sh, [5, 5, 7])
    assert sh.n_rows == 2 and sh.admitted == 2
    np.testing.assert_array_equal(sh.gather(np.array([5, 7, 9]))[:, 0], [-1.0, -0.5, 0.0])


def test_update_counts_give_the_hot_keys_in_the_report():
    sh = shard()
    for c in range(5):
        push(sh, [1, 2 ** 40 + 3] + ([-7] if c < 3 else []), clock=c)
    keys, counts = sh.hot_keys(3)
    assert keys.tolist()[:2] == [1, 2 ** 40 + 3] and counts.tolist() == [5, 5, 3]
    rep = sh.report()
    assert len(rep) == REPORT_LEN and rep[:4] == [3, 3, 0, 0]
    # keys travel as exact 32-bit halves (float64 rows): -7 as uint64
    hot = [((rep[4 + 3 * i] << 32) | rep[5 + 3 * i], rep[6 + 3 * i]) for i in range(HOT_KEYS)]
    assert hot[2] == ((-7) & ((1 << 64) - 1), 3) and hot[3] == (0, 0)


def test_admission_after_min_count_pushes():
    sh = shard(min_count=3)
    push(sh, [10, 11])
    push(sh, [10])
    assert sh.n_rows == 0 and sh.rejected == 3            # not stored, pushes dropped
    push(sh, [10, 11])                                    # 10's 3rd push: admitted
    assert sh.table.lookup(np.array([10, 11])).tolist()[0] >= 0 and sh.n_rows == 1
    assert sh.gather(np.array([10]))[0, 0] == -0.5        # only the admitting push applied
    push(sh, [11])
    assert sh.n_rows == 2 and sh.admitted == 2


def test_count_min_sketch_never_undercounts_and_its_bound_holds():
    rng = np.random.default_rng(0)
    a = Admission(10, width=1 << 10, depth=4)
    keys = rng.zipf(1.3, 20000).astype(np.int64)
    est = a.add(keys)
    true = dict(zip(*np.unique(keys, return_counts=True)))
    t = np.array([true[k] for k in keys])
    assert np.all(est >= t)
    over = est - t
    assert np.mean(over > a.error_bound()) <= np.exp(-4) + 0.01


def test_ttl_evicts_rows_not_updated_for_ttl_steps_clocks():
    sh = shard(ttl_steps=2)
    push(sh, [1, 2], clock=0)
    push(sh, [1], clock=1)
    push(sh, [1], clock=2)
    assert sh.n_rows == 2                                 # 2 last updated at 0: 2 - 0 = 2
    push(sh, [1], clock=3)                                # 3 - 0 > 2: evicted
    assert sh.n_rows == 1 and sh.evicted == 1
    assert sh.gather(np.array([2]))[0, 0] == 0.0          # back to its initial value
    np.testing.assert_array_equal(sh.gather(np.array([1]))[:, 0], [-2.0])   # kept, bitwise


def test_lfu_eviction_at_max_keys_keeps_the_most_updated():
    sh = shard(max_keys=10, evict="lfu")
    for c in range(3):
        push(sh, np.arange(5), clock=c)                   # 0..4 updated 3 times
    push(sh, np.arange(5, 11), clock=3)                   # 11 keys > 10: down to 9
    assert sh.n_rows == 9 and sh.evicted == 2
    stored = set(sh.table.keys().tolist())
    assert set(range(5)) <= stored and {5, 6} & stored == set()   # oldest of the least-updated


def test_max_keys_without_eviction_is_an_error_naming_the_table():
    """An error of the input (DataError: exit status 65, not relaunched), naming the table."""
    from hpcps.core.errors import DataError
    from hpcps.core.exitcodes import EXIT_DATA, status_for

    sh = shard(max_keys=3)
    push(sh, [1, 2, 3])
    with pytest.raises(DataError, match=r"dynamic table 'w' holds 4 keys, more than its "
                                           r"max_keys = 3 .* evict = 'lfu'") as e:
        push(sh, [4])
    assert status_for(e.value) == EXIT_DATA


def test_scatter_and_merge_paths_give_the_same_weights(monkeypatch):
    """apply sums duplicates by a scatter into a row buffer (tables up to 64 rows per
    pushed key) or by merge_duplicates (larger tables): the same weights and state, rows
    stepped in ascending arena order either way (last_rows)."""
    from hpcps.kernels import hashtable as H

    rng = np.random.default_rng(3)
    keys = rng.integers(-2**62, 2**62, 5000)
    pushes = [keys[rng.zipf(1.2, 4000) % keys.size] for _ in range(4)]
    out = []
    for per_key, slack in ((64, 1 << 16), (0, 0)):
        monkeypatch.setattr(H, "_SCATTER_ROWS_PER_KEY", per_key)
        monkeypatch.setattr(H, "_SCATTER_SLACK", slack)
        t = H.HashTable(2, "float64", "ftrl", lr=0.1, lambda1=0.01)
        for p in pushes:
            t.apply(p, np.sin(p[:, None] * np.array([1.0, 2.0])), 0.5)
            rows = t.last_rows()
            assert np.array_equal(rows, np.sort(t.lookup(np.unique(p))))
        out.append((t.keys(), t.weights(), t.slots()))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
    assert all(np.array_equal(out[0][2][s], out[1][2][s]) for s in out[0][2])


def test_prefetch_distances_give_the_same_weights_and_are_checked():
    from hpcps.kernels import hashtable as H

    rng = np.random.default_rng(4)
    keys = rng.integers(-2**62, 2**62, 5000)
    pushes = [keys[rng.zipf(1.2, 4000) % keys.size] for _ in range(4)]
    out = []
    for ahead in ((64, 8), (1, 1), (127, 200)):
        old = H.set_prefetch(*ahead)
        try:
            t = H.HashTable(1, "float32", "adagrad", lr=0.1)
            for p in pushes:
                t.apply(p, np.cos(p[:, None] * 1.0).astype(np.float32), 0.5)
            out.append((t.keys(), t.weights(), t.slots()["accumulator"]))
        finally:
            H.set_prefetch(*old)
    assert H.set_prefetch() == (64, 8)
    for o in out[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(out[0], o))
    with pytest.raises(ValueError, match="prefetch distance"):
        H.set_prefetch(0)
    with pytest.raises(ValueError, match="prefetch distance"):
        H.set_prefetch(128)


def test_sorted_chunks_of_the_keys_for_the_model_file():
    """PULL_SHARD_SORTED: chunks of the keys in ascending order with their rows; the sorted
    copy is dropped with the last chunk; a chunk past the keys stored is refused."""
    from hpcps.core.tables import PULL_SHARD_SORTED

    sh = shard()
    rng = np.random.default_rng(4)
    keys = rng.choice(1 << 62, 1000, replace=False).astype(np.int64)
    push(sh, np.concatenate([keys, [-5, 3]]))
    want = np.sort(np.concatenate([keys, [-5, 3]]))
    got_k, got_r = [], []
    for start in range(0, want.size, 128):
        n = min(128, want.size - start)
        rows, k = sh.whole(PULL_SHARD_SORTED, n, start)
        got_k.append(k)
        got_r.append(rows)
        assert (sh._sorted is None) == (start + n == want.size)
    assert np.array_equal(np.concatenate(got_k), want)
    assert np.array_equal(np.concatenate(got_r), sh.gather(want))
    with pytest.raises(ValueError, match=r"table 'w': sorted keys \[1000, 1010\) asked, 1002 stored"):
        sh.whole(PULL_SHARD_SORTED, 10, 1000)


def test_per_row_counts_are_small_counted_in_the_memory_and_saturate():
    """A trial at 32.7 M keys: two int64 arrays per row (update counts and last clocks, grown
    1.5x) were 16 B per key the summary's memory left out, and half of each checkpoint shard.
    Counts are uint32 (saturating), last clocks exist only with ttl_steps, both are counted."""
    sh = shard()
    push(sh, np.arange(1000))
    assert sh.last_clock is None and sh.updates.dtype == np.uint32
    assert sh.nbytes == sh.table.nbytes + sh.updates.nbytes
    entry = sh.checkpoint_entry(0)
    assert entry["last_clock"] is None and entry["updates"].dtype == np.uint32
    assert np.shares_memory(entry["updates"], sh.updates)          # a view, no copy
    ttl = shard(ttl_steps=5)
    push(ttl, np.arange(10), clock=3)
    assert ttl.last_clock.dtype == np.int64 and ttl.last_clock[:10].tolist() == [3] * 10
    assert ttl.nbytes == ttl.table.nbytes + ttl.updates.nbytes + ttl.last_clock.nbytes
    sh.updates[:2] = np.iinfo(np.uint32).max - 1
    push(sh, [0, 1])
    push(sh, [0])
    assert sh.updates[:2].tolist() == [np.iinfo(np.uint32).max] * 2   # saturated, not wrapped
