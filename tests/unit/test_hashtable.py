"""hpcps.kernels.hashtable: the dynamic (hash) table against a dict + fixed-array reference.

The reference keeps a Python dict key -> row of a fixed numpy table and applies
``hpcps.kernels.optim.apply_sparse`` (itself tested against numpy in test_kernels.py and
test_optim_rules.py) to the rows of the pushed keys, so the hash table must give bitwise
the same weights and optimizer state.
"""

import numpy as np
import pytest

from hpcps.core.optim import Optimizer
from hpcps.core.tables import TableSpec, _splitmix_mix
from hpcps.kernels.hashtable import HashTable, record_layout, server_of, table_hash
import hpcps.kernels.hashtable as H

I64 = np.iinfo(np.int64)
EXTREMES = np.array([0, 1, -1, I64.max, I64.min, I64.max - 1, I64.min + 1], dtype=np.int64)

HYPER = {"sgd": dict(lr=0.3, l2=0.01),
         "adagrad": dict(lr=0.2, l2=0.01, initial_accumulator=0.1),
         "adam": dict(lr=0.05, l2=0.01),
         "ftrl": dict(lr=0.5, l2=0.01, beta=1.0, lambda1=0.02, lambda2=0.1)}


class Reference:
    """A dict key -> row over a fixed table grown by hand, updated by optim.apply_sparse."""

    def __init__(self, rule, dim, dtype, init=None, **hp):
        self.rule, self.dim, self.dtype, self.init = rule, dim, np.dtype(dtype), init
        self.opt = Optimizer(rule, hp["lr"], l2=hp.get("l2", 0.0),
                             initial_accumulator=hp.get("initial_accumulator", 0.0),
                             beta=hp.get("beta", 1.0), lambda1=hp.get("lambda1", 0.0),
                             lambda2=hp.get("lambda2", 0.0))
        self.rows = {}
        self.w = np.zeros((0, dim), dtype=dtype)
        self.slots = self.opt.init_slots((0, dim), dtype)

    def initial(self, keys):
        if self.init is None:
            return np.zeros((len(keys), self.dim), dtype=self.dtype)
        return self.init(np.asarray(keys, dtype=np.int64))

    def push(self, keys, grads, scale):
        new = [int(k) for k in dict.fromkeys(keys.tolist()) if int(k) not in self.rows]
        if new:
            w_new = self.initial(new)
            s_new = self.opt.init_slots((len(new), self.dim), self.dtype, w=w_new)
            for k in new:
                self.rows[k] = len(self.rows)
            self.w = np.ascontiguousarray(np.concatenate([self.w, w_new]))
            if s_new is not None:
                self.slots = np.ascontiguousarray(np.concatenate([self.slots, s_new]))
        rows = np.array([self.rows[int(k)] for k in keys], dtype=np.int64)
        self.opt.apply(self.w, self.slots, rows, grads, scale)

    def weights_of(self, keys):
        return np.stack([self.w[self.rows[int(k)]] if int(k) in self.rows
                         else self.initial([k])[0] for k in keys])


def _table(rule, dim, dtype, init=None, **kw):
    return HashTable(dim, dtype, rule, init=init, **HYPER[rule], **kw)


def _random_keys(rng, n, pool):
    return pool[rng.integers(0, pool.size, size=n)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rule", ["sgd", "adagrad", "adam", "ftrl"])
def test_apply_matches_fixed_table_bitwise(rule, dtype):
    """Pushes with duplicate keys, int64 extremes and many rehashes: weights and state
    equal the dict + fixed-array reference bitwise (duplicates summed, none lost)."""
    rng = np.random.default_rng(7)
    dim = 3
    pool = np.concatenate([EXTREMES, rng.integers(I64.min, I64.max, size=3000, dtype=np.int64)])
    t = _table(rule, dim, dtype)
    ref = Reference(rule, dim, dtype, **HYPER[rule])
    rehashes = 0
    for step in range(12):
        keys = _random_keys(rng, 700, pool)
        keys[:5] = keys[5]                                   # a key 6 times in one push
        grads = rng.standard_normal((keys.size, dim)).astype(dtype)
        slots_before = t.index_slots
        t.apply(keys, grads, scale=1.0 / 64)
        ref.push(keys, grads, 1.0 / 64)
        rehashes += t.index_slots != slots_before
    assert rehashes >= 3
    assert len(t) == len(ref.rows)
    order = np.array([ref.rows[int(k)] for k in t.keys()])
    np.testing.assert_array_equal(t.weights(), ref.w[order])
    for name, a in t.slots().items():
        np.testing.assert_array_equal(a, ref.opt.slots_dict(ref.slots)[name][order])


def test_duplicates_are_summed_not_dropped():
    t = HashTable(1, "float64", "sgd", lr=1.0)
    t.apply(np.array([9, 9, 9, 4], dtype=np.int64), np.array([[1.0], [2.0], [4.0], [8.0]]))
    np.testing.assert_array_equal(t.gather([9, 4]), [[-7.0], [-8.0]])


@pytest.mark.parametrize("rule", ["adagrad", "ftrl"])
def test_random_initial_values_match_fixed_tables(rule):
    """init = TableSpec.initial_rows (the per-key draw of fixed tables): new rows start at
    the same draw, FTRL's z is set from it as Optimizer.init_slots does, and the pushes
    then agree bitwise with the reference."""
    spec = TableSpec("w", num_keys=1 << 40, dim=2, dtype="float64", init_std=0.1)

    def init(k):
        return spec.initial_rows(k, seed=11)

    rng = np.random.default_rng(3)
    t = _table(rule, 2, "float64", init=init)
    ref = Reference(rule, 2, "float64", init=init, **HYPER[rule])
    pool = rng.integers(0, 1 << 40, size=500)
    for _ in range(5):
        keys = _random_keys(rng, 300, pool)
        grads = rng.standard_normal((300, 2))
        t.apply(keys, grads, 0.5)
        ref.push(keys, grads, 0.5)
    probe = np.concatenate([pool, rng.integers(0, 1 << 40, size=50)])
    np.testing.assert_array_equal(t.gather(probe), ref.weights_of(probe))


def test_gather_absent_returns_initial_value_without_inserting():
    spec = TableSpec("emb", num_keys=1 << 62, dim=4, dtype="float32", init_std=0.5)
    t = HashTable(4, "float32", "adagrad", lr=0.1, init=lambda k: spec.initial_rows(k, 5))
    t.apply([3], np.ones((1, 4), dtype=np.float32))
    keys = np.array([3, 1 << 61, -5, 3], dtype=np.int64)
    out = t.gather(keys)
    assert len(t) == 1
    np.testing.assert_array_equal(out[1:3], spec.initial_rows(keys[1:3], 5))
    np.testing.assert_array_equal(out[0], out[3])
    assert not np.array_equal(out[0], spec.initial_rows([3], 5)[0])    # updated
    np.testing.assert_array_equal(t.lookup(keys), [0, -1, -1, 0])
    z = HashTable(2, "float64")
    np.testing.assert_array_equal(z.gather([1, 2]), np.zeros((2, 2)))
    assert len(z) == 0


def test_int64_extremes_and_uint64_reinterpreted():
    t = HashTable(1, "float64", "sgd", lr=1.0)
    rows = t.insert(EXTREMES)
    np.testing.assert_array_equal(rows, np.arange(EXTREMES.size))
    np.testing.assert_array_equal(t.keys(), EXTREMES)
    u = EXTREMES.view(np.uint64)                     # 2**64 - 1 is the key -1
    np.testing.assert_array_equal(t.lookup(u), rows)
    assert t.lookup(np.array([2, -2], dtype=np.int64)).tolist() == [-1, -1]
    with pytest.raises(TypeError, match="integer"):
        t.lookup(np.array([1.5]))


def test_rehash_keeps_every_row():
    """100k distinct keys inserted in batches: the index grows many times, every key keeps
    its arena row and the load stays below max_load."""
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(I64.min, I64.max, size=100_000, dtype=np.int64))
    rng.shuffle(keys)
    t = HashTable(1, "float32", "sgd", lr=1.0)
    sizes = set()
    for lo in range(0, keys.size, 7_919):
        t.insert(keys[lo:lo + 7_919])
        sizes.add(t.index_slots)
        assert len(t) / t.index_slots <= H.MAX_LOAD_DEFAULT
    assert len(sizes) >= 5
    np.testing.assert_array_equal(t.lookup(keys), np.arange(keys.size))
    np.testing.assert_array_equal(t.keys(), keys)
    assert len(t) / t.index_slots >= H.MAX_LOAD_DEFAULT / H.INDEX_GROWTH - 0.01


def test_load_roundtrip_and_errors():
    rng = np.random.default_rng(2)
    a = _table("adam", 2, "float32")
    keys = rng.integers(-1000, 1000, size=400)
    for _ in range(3):
        a.apply(keys, rng.standard_normal((400, 2)).astype(np.float32))
    b = _table("adam", 2, "float32")
    b.load(a.keys(), a.weights(), a.slots())
    assert len(b) == len(a)
    for x, y in zip([a.keys(), a.weights(), *a.slots().values()],
                    [b.keys(), b.weights(), *b.slots().values()]):
        np.testing.assert_array_equal(x, y)
    g = rng.standard_normal((400, 2)).astype(np.float32)
    a.apply(keys, g)
    b.apply(keys, g)
    np.testing.assert_array_equal(a.weights(), b.weights())
    with pytest.raises(ValueError, match="already stored"):
        b.load(a.keys()[:1], a.weights()[:1])
    with pytest.raises(ValueError, match="not distinct"):
        _table("adam", 2, "float32").load([1, 1], np.zeros((2, 2)))
    t = _table("adam", 2, "float32")        # apart in the input, and at the int64 ends
    for dup in ([5, -3, 9, 5], [I64.max, 0, I64.min, I64.max], [I64.min, 1, I64.min]):
        with pytest.raises(ValueError, match="not distinct"):
            t.load(dup, np.zeros((len(dup), 2)))
        assert len(t) == 0
    t.load([I64.max, I64.min, 0], np.ones((3, 2)))
    assert sorted(t.keys().tolist()) == [I64.min, 0, I64.max]
    with pytest.raises(ValueError, match="slot 'z'"):
        _table("adam", 2, "float32").load([1], np.zeros((1, 2)), {"z": np.zeros((1, 2))})


def test_bad_arguments():
    t = HashTable(2, "float32", "adagrad", lr=0.1)
    with pytest.raises(TypeError, match="dtype"):
        t.apply([1], np.ones((1, 2)))                      # float64 into float32
    with pytest.raises(ValueError, match="shape"):
        t.apply([1, 2], np.ones((1, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="scale"):
        t.apply([1], np.ones((1, 2), dtype=np.float32), scale=float("nan"))
    assert len(t) == 0
    with pytest.raises(ValueError, match="unknown optimizer"):
        HashTable(1, "float32", "momentum")
    with pytest.raises(ValueError, match="alpha"):
        HashTable(1, "float32", "ftrl", lr=0.0)
    with pytest.raises(TypeError, match="float32 or float64"):
        HashTable(1, "int32")
    with pytest.raises(ValueError, match="out must be"):
        t.gather([1], out=np.zeros((1, 2)))


def test_record_layout_sizes():
    """The record sizes and minima of the module docstring's table (dim 1): the record
    holds the row and its state (the key is in the index slot); the minimum counts the key."""
    want = {("sgd", "float32"): (4, 12), ("sgd", "float64"): (8, 16),
            ("adagrad", "float32"): (8, 16), ("adagrad", "float64"): (16, 24),
            ("ftrl", "float32"): (12, 20), ("ftrl", "float64"): (24, 32),
            ("adam", "float32"): (24, 28), ("adam", "float64"): (32, 40)}
    for (rule, dt), (rec, minimum) in want.items():
        r, m = record_layout(rule, 1, dt)
        assert (r.itemsize, m) == (rec, minimum), (rule, dt)
        assert "key" not in r.names
    r, _ = record_layout("adam", 3, "float32")          # step 8-aligned after 9 floats
    assert r.fields["step"][1] % 8 == 0


def test_server_of_is_documented_splitmix_spread():
    """server(k) = floor(splitmix64(k) * S / 2**64), with the mix of core.tables; sequential
    and strided ids spread evenly over servers."""
    keys = np.concatenate([np.arange(30_000), np.arange(30_000) * 1024, EXTREMES])
    for S in (1, 2, 3, 7):
        got = server_of(keys, S)
        h = _splitmix_mix(keys.view(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        want = [(int(x) * S) >> 64 for x in h]
        np.testing.assert_array_equal(got, want)
        counts = np.bincount(got[:60_000], minlength=S)
        assert counts.max() - counts.min() < 0.05 * 60_000 / S + 50
    with pytest.raises(ValueError, match="n_servers"):
        server_of([1], 0)
    # the index hash is another mix: a server's keys are not confined to part of its index
    mine = keys[server_of(keys, 4) == 0]
    pos = (table_hash(mine) >> np.uint64(62)).astype(np.int64)
    assert np.bincount(pos, minlength=4).min() > 0.2 * mine.size


def test_bytes_per_key_within_twice_the_minimum():
    """The data of a table of 200k keys (index + records) is at most 2x the arithmetic
    minimum for adagrad/ftrl in float64 (the benchmark measures RSS)."""
    rng = np.random.default_rng(4)
    keys = rng.integers(I64.min, I64.max, size=200_000, dtype=np.int64)
    for rule in ("adagrad", "ftrl"):
        t = _table(rule, 1, "float64")
        t.insert(keys)
        assert t.nbytes / len(t) <= 2 * t.min_record_bytes, (rule, t.nbytes / len(t))


def test_push_that_grows_the_index_midway_still_sums_repeats():
    """A push of 5,000 new keys, each twice (second half repeats the first), into an empty
    table: the index grows several times during the pass (slots re-marked each time), and
    each key receives both of its gradient rows."""
    t = HashTable(1, "float64", "sgd", lr=1.0)
    keys = np.arange(5_000, dtype=np.int64) * 7919 - 10**15
    g = np.arange(1, 10_001, dtype=np.float64).reshape(-1, 1)
    t.apply(np.concatenate([keys, keys]), g)
    assert len(t) == 5_000 and t.index_slots > 5_000
    np.testing.assert_array_equal(t.gather(keys)[:, 0], -(g[:5_000, 0] + g[5_000:, 0]))
    t.apply(keys, np.ones((5_000, 1)))            # the tags were restored: found, not re-added
    assert len(t) == 5_000


def test_failing_init_leaves_a_consistent_table():
    """An init that raises during a push: the error propagates, no update is applied, and
    the index is usable: every key is found, later pushes work."""
    calls = []

    def init(keys):
        calls.append(keys.size)
        if len(calls) == 1:
            raise RuntimeError("init failed")
        return np.full((keys.size, 1), 0.5)

    t = HashTable(1, "float64", "sgd", lr=1.0, init=init)
    keys = np.array([3, 4, 3, 5], dtype=np.int64)
    with pytest.raises(RuntimeError, match="init failed"):
        t.apply(keys, np.ones((4, 1)))
    np.testing.assert_array_equal(t.lookup([3, 4, 5, 6]), [0, 1, 2, -1])
    t.apply([6, 3], np.ones((2, 1)))
    np.testing.assert_array_equal(t.lookup([3, 4, 5, 6]), [0, 1, 2, 3])
    np.testing.assert_array_equal(t.gather([6]), [[-0.5]])


def _inverse_fmix64(h):
    """The key whose fmix64 (MurmurHash3's finaliser) is ``h``."""
    M = (1 << 64) - 1

    def unxorshift33(x):
        return x ^ (x >> 33)                      # 33 >= 64 / 2: one step inverts it

    h = unxorshift33(h)
    h = (h * pow(0xC4CEB9FE1A85EC53, -1, 1 << 64)) & M
    h = unxorshift33(h)
    h = (h * pow(0xFF51AFD7ED558CCD, -1, 1 << 64)) & M
    return unxorshift33(h)


@pytest.mark.parametrize("order", ["b_alone", "abab", "b_then_a"])
def test_keys_with_equal_tags_are_told_apart(order):
    """Keys whose hashes share their low 32 bits and the probe run (a 32-bit tag scheme
    would confuse them; the index compares full keys). Weights as a dict reference."""
    ha = 0x1234_5678_9ABC_DEF0
    hb = (ha + (1 << 33)) % (1 << 64)             # same low 32 bits, neighbouring home slot
    a, b = (np.uint64(_inverse_fmix64(h)).view(np.int64) for h in (ha, hb))
    assert table_hash(np.array([a, b])).tolist() == [ha, hb]
    t = HashTable(1, "float64", "sgd", lr=1.0)
    t.apply([a], np.array([[1.0]]))
    ref = {int(a): -1.0}
    keys = {"b_alone": [b], "abab": [a, b, a, b], "b_then_a": [b, a]}[order]
    g = np.arange(1.0, len(keys) + 1).reshape(-1, 1)
    t.apply(np.array(keys, dtype=np.int64), g)
    for k, x in zip(keys, g[:, 0]):
        ref[int(k)] = ref.get(int(k), 0.0) - x
    assert len(t) == 2
    np.testing.assert_array_equal(t.gather([a, b])[:, 0], [ref[int(a)], ref[int(b)]])
    np.testing.assert_array_equal(t.lookup([a, b]), [0, 1])


def test_crowded_buckets_overflow_and_wrap():
    """Keys built to share a home bucket (inverse fmix64): 12 homed in the last bucket
    overflow into the first buckets (wrapping), 7 homed in bucket 0 overflow further; all
    are found at their rows, and absent keys homed in those full buckets are reported
    absent (gather: initial value, nothing inserted), also after a rehash."""
    top = (1 << 64) - 1
    last = [np.uint64(_inverse_fmix64(top - i)).view(np.int64) for i in range(12)]
    first = [np.uint64(_inverse_fmix64(i)).view(np.int64) for i in range(7)]
    absent = [np.uint64(_inverse_fmix64(h)).view(np.int64)
              for h in (top - 100, 100, 1 << 40, top - (1 << 40))]
    keys = np.array(last + first, dtype=np.int64)
    t = HashTable(1, "float64", "sgd", lr=1.0, capacity=100)
    slots = t.index_slots
    t.apply(keys, np.arange(1.0, keys.size + 1).reshape(-1, 1))
    assert t.index_slots == slots and len(t) == keys.size        # no growth: crowded
    np.testing.assert_array_equal(t.lookup(keys), np.arange(keys.size))
    np.testing.assert_array_equal(t.lookup(absent), [-1] * 4)
    np.testing.assert_array_equal(t.gather(absent)[:, 0], 0.0)
    assert len(t) == keys.size
    np.testing.assert_array_equal(t.gather(keys)[:, 0], -np.arange(1.0, keys.size + 1))
    t.insert(np.arange(200, dtype=np.int64))                      # grows: all re-inserted
    assert t.index_slots > slots
    np.testing.assert_array_equal(t.lookup(keys), np.arange(keys.size))
    np.testing.assert_array_equal(t.lookup(absent), [-1] * 4)
