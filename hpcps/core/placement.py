"""Where each key range lives: a primary and its backups on a ring of servers (no MPI).

The job's key partition (:class:`hpcps.core.tables.KeyPartition`) has one key range per server of
the launch, and range ``r`` starts on server ``r``. Servers keep their original index (their
place on the ring) for the whole job. With ``replicas = k`` the range is held by the first
``k`` live servers met going round the ring from ``r``: the first is its *primary* (it
answers the workers and aggregates their pushes), the others its *backups*, each the next
live server after the one before (Li et al., OSDI 2014, §4.3: "each server node also stores
replicas of the k key ranges counterclockwise of the one it owns").

After a failure the same rule, applied to the survivors, names the new holders. A range
whose primary died moves to the next live server, which was its backup; a range whose
backup died keeps its primary and gets the next live server as a new backup (which must be
sent a copy). When some survivors still hold a copy but the ring's first live server does
not (possible after two failures in a row), the primary is the first holder going round
the ring, so that no copy has to travel before the range can be served again.
"""

from __future__ import annotations


def ring_from(r: int, alive, n_ranges: int) -> list[int]:
    """Live servers in ring order starting at range ``r``'s home server ``r``.

    Parameters
    ----------
    r : int
        Key range in ``[0, n_ranges)``.
    alive : iterable of int
        Original indices of the live servers.
    n_ranges : int
        Servers of the launch (= key ranges).

    Returns
    -------
    list of int
    """
    live = set(int(s) for s in alive)
    return [(r + i) % n_ranges for i in range(n_ranges) if (r + i) % n_ranges in live]


def chain(r: int, alive, n_ranges: int, replicas: int, holders=()) -> list[int]:
    """The servers that hold range ``r``: ``[primary, backup, ...]`` (original indices).

    Parameters
    ----------
    r, alive, n_ranges
        As :func:`ring_from`.
    replicas : int
        Copies wanted (>= 1); fewer when fewer servers are alive.
    holders : iterable of int
        Live servers that hold a copy of the range now; the primary is the first of them in
        ring order (the ring's first live server when none does: the range is then reloaded).

    Returns
    -------
    list of int
        Empty when no server is alive.

    Raises
    ------
    ValueError
        If ``replicas < 1`` or ``r`` is outside ``[0, n_ranges)``.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not 0 <= r < n_ranges:
        raise ValueError(f"key range {r} outside [0, {n_ranges})")
    ring = ring_from(r, alive, n_ranges)
    if not ring:
        return []
    have = set(int(h) for h in holders)
    first = next((i for i, s in enumerate(ring) if s in have), 0)
    ordered = ring[first:] + ring[:first]
    return ordered[:replicas]


def chains(alive, n_ranges: int, replicas: int, holders=None) -> list[list[int]]:
    """:func:`chain` of every range; ``holders[r]`` the live servers holding range ``r``."""
    return [chain(r, alive, n_ranges, replicas, () if holders is None else holders[r])
            for r in range(n_ranges)]
