"""The membership of a running job: one object per rank, built once at start-up
(:func:`hpcps.runtime.job.run_job`, or :meth:`hpcps.resilience.elastic.Elastic.join` in an
added worker), read by the worker's client and trainer, the server loop, the recovery
(:mod:`hpcps.resilience.recovery`) and the growth (:mod:`hpcps.resilience.elastic`).

It answers "who is in the job now" and "where does key ``k`` of table ``t`` go":

* **roles** — this rank's role and index, the communicators, the ``ps`` ranks of the workers
  and the servers (:class:`hpcps.comm.core.Roles`);
* **key -> server map** — key -> key range by :meth:`route` (the arithmetic is
  :mod:`hpcps.core.routing`, MPI-free: a permuted key space cut into ``n_ranges`` ranges,
  or a hash for dynamic tables), then key range -> ``ps`` rank by :attr:`range_ranks`
  (``roles.server_ranks`` at the start; after a continue-mode job lost a server, the rank
  of the range's new primary — one rank may then hold several ranges);
* RMA windows, hosts, original ranks and server ids (continue mode's failure records).

The layout changes only through :meth:`change` (a recovery, a growth); readers that cache
what they derived from it (the client's endpoint, the trainer's communicator) re-read it
with their ``follow`` method and may compare :attr:`generation`.
"""

from __future__ import annotations

from hpcps.core.routing import Routing

__all__ = ["Membership"]


class Membership:
    """Who is in the job now, and which rank holds each key range.

    Parameters / attributes
    -----------------------
    roles : hpcps.comm.core.Roles or None
        This rank's role, index and communicators, and the ``ps`` ranks of the workers and
        the servers (None in an added worker before it joined).
    specs : list of hpcps.core.tables.TableSpec
        The job's tables, in table-id order (the key -> range map, :attr:`routing`).
    windows : list of hpcps.comm.rma.ShardWindow
        The RMA windows of the current ``roles.ps`` (empty for p2p pulls).
    range_ranks : list of int
        ``ps`` rank holding each key range (default: ``roles.server_ranks``, set when the
        roles are first known). Its length is the number of key ranges, which never changes.
    hosts : list of str
        Host of every rank of the original layout and of every added one (``ps`` rank order
        at the time it joined); continue mode only, for the failure records.
    world_ranks : list of int
        Original ``ps`` rank of every rank of the current ``roles.ps`` (continue mode).
    server_ids : list of int
        Original index of each live server, in server index order (continue mode).
    generation : int
        Layout changes so far (:meth:`change`).
    """

    def __init__(self, roles=None, windows=(), hosts=(), world_ranks=(), server_ids=(),
                 specs=(), range_ranks=None):
        self.roles = roles
        self.specs = list(specs)
        self.windows = list(windows)
        self.hosts = list(hosts)
        self.world_ranks = list(world_ranks)
        self.server_ids = list(server_ids)
        self.range_ranks = list(range_ranks) if range_ranks else (
            list(roles.server_ranks) if roles is not None else [])
        self.generation = 0
        self._routing = None

    # ------------------------------------------------------------------ the layout
    @property
    def n_workers(self) -> int:
        return self.roles.n_workers

    @property
    def n_servers(self) -> int:
        """Server ranks alive (after a server loss, fewer than :attr:`n_ranges`)."""
        return self.roles.n_servers

    @property
    def n_ranges(self) -> int:
        """Key ranges of the tables (the servers of the launch)."""
        return len(self.range_ranks)

    @property
    def is_chief(self) -> bool:
        return self.roles is not None and self.roles.is_chief

    def change(self, roles, windows=None, range_ranks=None, world_ranks=None, server_ids=None,
               hosts=None) -> None:
        """Take a new layout (after a recovery or a growth): ``roles``, and each of the other
        attributes given (the others stay: a growth keeps every old rank's ``ps`` number, so
        every range keeps its rank). The first roles of an added worker give the default
        :attr:`range_ranks`. Local."""
        self.roles = roles
        if windows is not None:
            self.windows = list(windows)
        if range_ranks is not None:
            self.range_ranks = list(range_ranks)
        elif not self.range_ranks:
            self.range_ranks = list(roles.server_ranks)
        if world_ranks is not None:
            self.world_ranks = list(world_ranks)
        if server_ids is not None:
            self.server_ids = list(server_ids)
        if hosts is not None:
            self.hosts = list(hosts)
        self.generation += 1

    # ------------------------------------------------------------------ key -> server map
    @property
    def routing(self) -> Routing:
        """The key -> range maps of the tables over :attr:`n_ranges` ranges (built once)."""
        if self._routing is None or self._routing.n_ranges != self.n_ranges:
            self._routing = Routing(self.specs, self.n_ranges)
        return self._routing

    def route(self, table, keys):
        """Key range of each key of ``table`` (name or id): ``(ranges, counts, grouped)`` as
        :meth:`hpcps.core.routing.Routing.route`; range ``r`` is served by ``ps`` rank
        ``range_ranks[r]``. Local.

        Raises
        ------
        KeyError
            For an unknown table.
        ValueError
            For a key outside the table's key space.
        """
        return self.routing.route(table, keys)

    def rank_of_range(self, r: int) -> int:
        """``ps`` rank holding key range ``r``."""
        return self.range_ranks[r]

    def __repr__(self) -> str:
        r = self.roles
        what = "not joined" if r is None else f"{r.role} {r.index} of {r.n_workers}w/{r.n_servers}s"
        return (f"Membership({what}, {self.n_ranges} key range(s), "
                f"{len(self.windows)} window(s), generation {self.generation})")
