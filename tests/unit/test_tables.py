"""The key → server map (hpcps.tables.KeyPartition) and table declarations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcps.tables import KeyPartition, TableSpec


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
