"""The key → server map (hpcps.core.tables.KeyPartition) and table declarations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcps.core.tables import KeyPartition, TableSpec


@settings(max_examples=150, deadline=None)
@given(num_keys=st.integers(1, 3000), n_servers=st.integers(1, 9), permute=st.booleans())
def test_every_key_has_exactly_one_home_and_round_trips(num_keys, n_servers, permute):
    part = KeyPartition(num_keys, n_servers, permute=permute)
    keys = np.arange(num_keys, dtype=np.int64)
    owner = part.server_of(keys)
    assert owner.min() >= 0 and owner.max() < n_servers
    seen = np.zeros(num_keys, dtype=int)
    for s in range(n_servers):
        mine = keys[owner == s]
        lo, hi = part.shard_range(s)
        assert mine.size == hi - lo                       # ranges sized as documented
        rows = part.local_rows(mine, s)
        assert sorted(rows.tolist()) == list(range(hi - lo))
        # the shard's rows map back to the keys that live there, in local row order
        back = part.shard_keys(s)
        np.testing.assert_array_equal(back[rows], mine)
        seen[back] += 1
    assert (seen == 1).all()


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 999), max_size=200), n_servers=st.integers(1, 5))
def test_split_groups_a_request_by_server(keys, n_servers):
    part = KeyPartition(1000, n_servers)
    keys = np.array(keys, dtype=np.int64)
    order, bounds = part.split(keys)
    assert sorted(order.tolist()) == list(range(keys.size))
    assert bounds[0] == 0 and bounds[-1] == keys.size
    for s in range(n_servers):
        assert (part.server_of(keys[order[bounds[s]:bounds[s + 1]]]) == s).all()


def test_neighbouring_keys_spread_over_servers():
    """One-hot style keys 0..127 must not all land on server 0 (the hashed key space)."""
    part = KeyPartition(1 << 20, 4)
    counts = np.bincount(part.server_of(np.arange(128)), minlength=4)
    assert counts.min() >= 24, counts                    # ~32 each
    dense = KeyPartition(1 << 20, 4, permute=False)
    assert (dense.server_of(np.arange(128)) == 0).all()   # dense keeps blocks


def test_keys_outside_the_key_space_are_errors():
    part = KeyPartition(100, 3)
    for bad in (-1, 100, 2**40):
        with pytest.raises(ValueError, match=rf"key {bad}\b.*outside the key space"):
            part.server_of(np.array([5, bad]))
    with pytest.raises(ValueError, match=r"key -1\b.*outside the key space"):
        KeyPartition(100, 3, permute=False).server_of(np.array([-1]))


def test_local_rows_refuses_a_key_of_another_server():
    part = KeyPartition(1000, 4)
    k = np.array([3])
    other = (int(part.server_of(k)[0]) + 1) % 4
    with pytest.raises(ValueError, match="does not belong to server"):
        part.local_rows(k, other)


def test_huge_int64_key_space():
    n = (1 << 62) + 11
    part = KeyPartition(n, 3)
    keys = np.array([0, 1, n - 1, 1 << 61], dtype=np.int64)
    pos = part.positions(keys)
    assert all(int(p) == (int(k) * part.multiplier) % n for p, k in zip(pos, keys))
    assert set(part.server_of(keys).tolist()) <= {0, 1, 2}


def test_more_servers_than_keys_leaves_empty_ranges():
    part = KeyPartition(2, 4)
    sizes = [part.shard_range(s)[1] - part.shard_range(s)[0] for s in range(4)]
    assert sum(sizes) == 2 and min(sizes) == 0


def test_table_spec_validation():
    with pytest.raises(ValueError, match="num_keys and dim"):
        TableSpec("w", 0)
    with pytest.raises(ValueError, match="dtype"):
        TableSpec("w", 10, dtype="int8")
    with pytest.raises(ValueError, match="init_std"):
        TableSpec("w", 10, init_std=-0.1)
    with pytest.raises(ValueError, match="init_std"):
        TableSpec("w", 10, init_std=float("nan"))


def test_initial_rows_zero_without_init_std():
    rows = TableSpec("w", 100, 3, "float64").initial_rows([0, 5, 99], seed=1)
    assert rows.shape == (3, 3) and rows.dtype == np.float64 and not rows.any()


@settings(max_examples=40, deadline=None)
@given(num_keys=st.integers(1, 500), dim=st.integers(1, 5), sparse=st.booleans(),
       n_servers=st.integers(1, 7), seed=st.integers(0, 2**40))
def test_initial_rows_do_not_depend_on_the_number_of_servers(num_keys, dim, sparse, n_servers, seed):
    """Shards built the way the server builds them (its shard's keys) assemble into the same
    table for any server count: each row depends only on (seed, table, key)."""
    spec = TableSpec("emb", num_keys, dim, "float32", sparse=sparse, init_std=0.5)
    whole = spec.initial_rows(np.arange(num_keys), seed)
    part = KeyPartition(num_keys, n_servers, permute=sparse)
    got = np.full((num_keys, dim), np.nan, dtype=np.float32)
    for s in range(n_servers):
        keys = part.shard_keys(s)
        got[keys] = spec.initial_rows(keys, seed)
    np.testing.assert_array_equal(got, whole)
    # and any subset, order or duplication of keys gives the same rows
    pick = np.array([num_keys - 1, 0, num_keys - 1, num_keys // 2])
    np.testing.assert_array_equal(spec.initial_rows(pick, seed), whole[pick])


def test_initial_rows_are_normal_with_init_std():
    from scipy import stats

    spec = TableSpec("user_factors", 20_000, 8, "float64", init_std=0.1)
    x = spec.initial_rows(np.arange(20_000), seed=0)
    assert x.dtype == np.float64 and x.shape == (20_000, 8)
    assert abs(x.mean()) < 0.1 * 4 / np.sqrt(x.size)            # 4 standard errors
    assert abs(x.std() - 0.1) < 0.002
    assert stats.kstest(x.ravel() / 0.1, "norm").pvalue > 1e-3
    # neighbouring keys and the columns of a row are uncorrelated
    assert abs(np.corrcoef(x[:-1, 0], x[1:, 0])[0, 1]) < 0.04
    assert np.abs(np.corrcoef(x.T) - np.eye(8)).max() < 0.04


def test_initial_rows_differ_by_seed_and_table_and_follow_dtype():
    keys = np.arange(50)
    a = TableSpec("user_factors", 50, 4, "float32", init_std=1.0)
    b = TableSpec("item_factors", 50, 4, "float32", init_std=1.0)
    ra = a.initial_rows(keys, 0)
    assert ra.dtype == np.float32 and np.isfinite(ra).all()
    assert not np.allclose(ra, a.initial_rows(keys, 1))
    assert not np.allclose(ra, b.initial_rows(keys, 0))
    np.testing.assert_array_equal(ra, a.initial_rows(keys, 0))
    # float64 holds the same draws at full precision
    r64 = TableSpec("user_factors", 50, 4, "float64", init_std=1.0).initial_rows(keys, 0)
    np.testing.assert_allclose(r64, ra, rtol=1e-6)


@settings(max_examples=150, deadline=None)
@given(num_keys=st.one_of(st.integers(2**31 - 5, 2**31 + 5), st.integers(2**32 - 5, 2**32 + 5),
                          st.integers(2**32, 2**62)),
       n_servers=st.integers(1, 64), data=st.data())
def test_int64_key_spaces_beyond_2_32_keep_one_home_per_key(num_keys, n_servers, data):
    """Key spaces of 2^31, 2^32 and up to 2^62 (svmlight indices are int64): random keys map
    to one server, into its range, and back to themselves; distinct keys never collide."""
    part = KeyPartition(num_keys, n_servers)
    keys = np.unique(np.array(data.draw(st.lists(st.integers(0, num_keys - 1), min_size=1,
                                                  max_size=50)), dtype=np.int64))
    pos = part.positions(keys)
    assert np.unique(pos).size == keys.size                     # a bijection: no collisions
    assert all(int(p) == int(k) * part.multiplier % num_keys for p, k in zip(pos, keys))
    assert all(int(p) * part.inverse % num_keys == int(k) for p, k in zip(pos, keys))
    owner = part.server_of(keys)
    for s in np.unique(owner):
        lo, hi = part.shard_range(int(s))
        mine = keys[owner == s]
        rows = part.local_rows(mine, int(s))
        assert ((rows >= 0) & (rows < hi - lo)).all()
        np.testing.assert_array_equal(rows + lo, part.positions(mine))


@pytest.mark.parametrize("n_servers", [1, 3, 4])
@pytest.mark.parametrize("num_keys, permute", [(1000, True), (1000, False), ((1 << 40) + 15, True)])
def test_route_matches_server_of_and_counts(n_servers, num_keys, permute):
    part = KeyPartition(num_keys, n_servers, permute=permute)
    rng = np.random.default_rng(3)
    keys = rng.integers(0, num_keys, 5000, dtype=np.int64)
    srv, counts, grouped = part.route(keys)
    owner = part.server_of(keys)
    if n_servers == 1:
        assert srv is None and grouped
    else:
        np.testing.assert_array_equal(srv, owner)
        assert not grouped                       # random keys are not grouped by server
    np.testing.assert_array_equal(counts, np.bincount(owner, minlength=n_servers))
    srt = keys[np.argsort(owner, kind="stable")]
    assert part.route(srt)[2]                    # grouped by server: no reordering needed


@pytest.mark.parametrize("n_servers", [1, 3, 4])
@pytest.mark.parametrize("dim, dtype", [(1, np.float32), (3, np.float64), (2, np.float32)])
def test_route_split_is_group_then_take(n_servers, dim, dtype):
    """Issue 20: a push's keys and values grouped by server in one compiled pass
    (Routing.split -> kernels.keys.route_split) equal Routing.group's order applied to both;
    grouped input comes back as itself (no copy), a dynamic table takes the general path,
    a bad key is named."""
    from hpcps.core.routing import Routing

    rng = np.random.default_rng(7)
    specs = [TableSpec("w", 1 << 20, dim, np.dtype(dtype).name, sparse=True),
             TableSpec("h", (1 << 63) - 1, dim, np.dtype(dtype).name, sparse=True, storage="hash")]
    routing = Routing(specs, n_servers)
    for tid, space in ((0, 1 << 20), (1, 1 << 62)):
        keys = rng.integers(0, space, 3001, dtype=np.int64)
        vals = rng.standard_normal((keys.size, dim)).astype(dtype)
        kg, vg, bounds, order = routing.split(tid, keys, vals)
        want_order, want_bounds = routing.group(tid, keys)
        np.testing.assert_array_equal(bounds, want_bounds)
        if want_order is None:
            assert order is None and kg is keys and vg is vals
        else:
            np.testing.assert_array_equal(order, want_order)
            np.testing.assert_array_equal(kg, keys[want_order])
            np.testing.assert_array_equal(vg, vals[want_order])
        k2, v2, b2, o2 = routing.split(tid, kg)            # grouped now; no values
        assert o2 is None and k2 is kg and v2 is None
        np.testing.assert_array_equal(b2, bounds)
    with pytest.raises(ValueError, match=r"key 1048576\b.*outside the key space"):
        routing.split(0, np.array([5, 1 << 20], dtype=np.int64), np.zeros((2, dim), dtype))


def test_route_and_local_rows_name_the_bad_key():
    part = KeyPartition(100, 3)
    for bad in (-1, 100, 2**40):
        with pytest.raises(ValueError, match=rf"key {bad}\b.*outside the key space"):
            part.route(np.array([5, bad]))
        with pytest.raises(ValueError, match=rf"key {bad}\b.*outside the key space"):
            part.local_rows(np.array([5, bad]), 0)


def test_local_rows_in_place():
    part = KeyPartition(1 << 20, 2)
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 1 << 20, 4000, dtype=np.int64)
    mine = keys[part.server_of(keys) == 1]
    expect = part.positions(mine) - part.shard_range(1)[0]
    buf = mine.copy()
    out = part.local_rows(buf, 1, out=buf)
    assert out is buf
    np.testing.assert_array_equal(buf, expect)
