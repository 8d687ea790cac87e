"""The clocks of a server's workers, with their minimum and maximum in O(1) (no MPI).

A server learns a worker's clock from each of its CLOCKs (one per worker and step) and needs
the slowest worker's clock after every one of them: BSP/SSP apply a step once every worker has
finished it, async servers publish it as their clock. ``min()`` over a list of ``W`` clocks on
every CLOCK costs ``O(W)`` per request and ``O(W^2)`` per step and server: at 1,024 workers
11 ms of a server's time per step on this project's test machine (10.7 us per ``min`` of
1,024 ints; 0.4 us per CLOCK here, whatever W; docs/cost_model.md section 9).
:class:`WorkerClocks` keeps how many workers are at each clock, so that a CLOCK costs
``O(1)``: the minimum moves only when the last worker at it moves on, and then to the next
clock that has a worker (clocks advance one at a time, so that is the next one in the normal
case).
"""

from __future__ import annotations


class WorkerClocks:
    """Clocks (int) of workers ``0 .. n - 1``, list-like, with :meth:`min` and :meth:`max`.

    Parameters
    ----------
    clocks : iterable of int
        Each worker's clock, by worker index.

    Notes
    -----
    ``c[w] = v`` costs O(1), plus, when ``w`` was the last worker at the minimum (or the
    maximum) and moved away from it, a search over the distinct clocks held (at most
    ``staleness + 2`` of them under SSP; one or two under BSP).
    """

    __slots__ = ("_c", "_count", "_min", "_max")

    def __init__(self, clocks=()):
        self._c = [int(v) for v in clocks]
        self._count: dict[int, int] = {}
        for v in self._c:
            self._count[v] = self._count.get(v, 0) + 1
        self._min = min(self._count) if self._count else 0
        self._max = max(self._count) if self._count else 0

    def __len__(self) -> int:
        return len(self._c)

    def __iter__(self):
        return iter(self._c)

    def __getitem__(self, w: int) -> int:
        return self._c[w]

    def __setitem__(self, w: int, value: int) -> None:
        value = int(value)
        old = self._c[w]
        if value == old:
            return
        self._c[w] = value
        count = self._count
        left = count[old] - 1
        if left:
            count[old] = left
        else:
            del count[old]
        count[value] = count.get(value, 0) + 1
        if value < self._min:
            self._min = value
        elif old == self._min and not left:
            nxt = old + 1          # the usual case: one step on
            self._min = nxt if nxt in count else min(count)
        if value > self._max:
            self._max = value
        elif old == self._max and not left:
            self._max = max(count)

    def min(self) -> int:
        """The slowest worker's clock (0 without workers)."""
        return self._min

    def max(self) -> int:
        """The fastest worker's clock (0 without workers)."""
        return self._max

    def extend(self, k: int, clock: int) -> None:
        """Add ``k`` workers at ``clock`` (indices ``n .. n + k - 1``)."""
        if k <= 0:
            return
        empty = not self._c
        self._c += [int(clock)] * k
        self._count[int(clock)] = self._count.get(int(clock), 0) + k
        self._min = int(clock) if empty else min(self._min, int(clock))
        self._max = int(clock) if empty else max(self._max, int(clock))

    def tolist(self) -> list[int]:
        return list(self._c)

    def __repr__(self) -> str:
        return repr(self._c)
