"""The job's membership and its key -> server map (hpcps.comm.membership, hpcps.core.routing),
without MPI: roles are plain objects with the fields of hpcps.comm.core.Roles."""

from types import SimpleNamespace

import numpy as np
import pytest

from hpcps.comm.membership import Membership
from hpcps.core.dyntables import HashPartition
from hpcps.core.routing import Routing, partition_of
from hpcps.core.tables import KeyPartition, TableSpec

SPECS = [TableSpec("w", 1000, 2), TableSpec("b", 1, 1, sparse=False),
         TableSpec("emb", 1 << 40, 4, storage="hash")]


def _roles(n_workers, server_ranks, role="worker", index=0):
    return SimpleNamespace(role=role, index=index, worker_ranks=tuple(range(n_workers)),
                           server_ranks=tuple(server_ranks), n_workers=n_workers,
                           n_servers=len(server_ranks), is_chief=role == "worker" and index == 0,
                           ps="ps", role_comm="comm")


def test_partition_of_picks_the_map_of_each_table_kind():
    assert isinstance(partition_of(SPECS[0], 3), KeyPartition)
    assert partition_of(SPECS[0], 3).multiplier != 1        # sparse: permuted key space
    assert partition_of(SPECS[1], 3).multiplier == 1        # dense: key order
    assert isinstance(partition_of(SPECS[2], 3), HashPartition)


def test_route_is_the_partitions_route_and_group_orders_by_range():
    r = Routing(SPECS, 3)
    keys = np.array([5, 999, 0, 17, 5, 400], dtype=np.int64)
    srv, counts, _ = r.route("w", keys)
    np.testing.assert_array_equal(srv, KeyPartition(1000, 3).server_of(keys))
    assert counts.sum() == keys.size
    order, bounds = r.group(0, keys)
    assert bounds[0] == 0 and bounds[-1] == keys.size
    for s in range(3):
        assert (srv[order[bounds[s]:bounds[s + 1]]] == s).all()
    # a dense table's ascending block is grouped already: no reordering
    assert r.group("b", np.zeros(3, dtype=np.int64))[0] is None
    with pytest.raises(KeyError, match="unknown table 'x'; tables: w, b, emb"):
        r.route("x", keys)
    with pytest.raises(ValueError, match="key 1000"):
        r.route("w", np.array([1000]))


def test_membership_routes_over_the_launchs_ranges_and_changes_in_one_place():
    m = Membership(_roles(2, (2, 3, 4)), specs=SPECS)
    assert m.range_ranks == [2, 3, 4] and m.n_ranges == 3 and m.generation == 0
    keys = np.arange(50, dtype=np.int64)
    before = m.route("w", keys)[0]
    # a server lost: range 1 moves to rank 2, the key -> range map stays
    m.change(_roles(2, (2, 3)), range_ranks=(2, 2, 3), server_ids=(0, 2))
    assert m.generation == 1 and m.n_ranges == 3 and m.n_servers == 2
    assert m.rank_of_range(1) == 2 and m.server_ids == [0, 2]
    np.testing.assert_array_equal(m.route("w", keys)[0], before)
    # a growth keeps the ranges' ranks (old ranks keep their numbers)
    m.change(_roles(4, (2, 3)), windows=[])
    assert m.range_ranks == [2, 2, 3] and m.n_workers == 4 and m.generation == 2


def test_an_added_worker_takes_the_ranges_ranks_from_its_first_roles_or_the_plan():
    m = Membership(None, specs=SPECS)
    assert not m.is_chief and m.range_ranks == []
    m.change(_roles(3, (3, 4), index=2))
    assert m.range_ranks == [3, 4]
    m = Membership(None, specs=SPECS, range_ranks=[3, 3])      # continue mode: the join plan
    m.change(_roles(3, (3,), index=2))
    assert m.range_ranks == [3, 3] and m.n_ranges == 2
