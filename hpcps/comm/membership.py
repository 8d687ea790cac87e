"""The membership of a running job: one object per rank, built once at start-up, shared by the
server and worker loops, the recovery (:mod:`hpcps.resilience.recovery`) and the growth
(:mod:`hpcps.resilience.elastic`), which change it in place when the layout changes."""

from __future__ import annotations

__all__ = ["Membership"]


class Membership:
    """Who is in the job now.

    Parameters / attributes
    -----------------------
    roles : hpcps.comm.core.Roles or None
        This rank's role, index and communicators, and the ``ps`` ranks of the workers and
        the servers (None in an added worker before it joined).
    windows : list of hpcps.comm.rma.ShardWindow
        The RMA windows of the current ``roles.ps`` (empty for p2p pulls).
    hosts : list of str
        Host of every rank of the original layout and of every added one (``ps`` rank order
        at the time it joined); continue mode only, for the failure records.
    world_ranks : list of int
        Original ``ps`` rank of every rank of the current ``roles.ps`` (continue mode).
    server_ids : list of int
        Original index of each live server, in server index order (continue mode).
    """

    def __init__(self, roles=None, windows=(), hosts=(), world_ranks=(), server_ids=()):
        self.roles = roles
        self.windows = list(windows)
        self.hosts = list(hosts)
        self.world_ranks = list(world_ranks)
        self.server_ids = list(server_ids)

    @property
    def n_workers(self) -> int:
        return self.roles.n_workers

    @property
    def n_servers(self) -> int:
        return self.roles.n_servers

    @property
    def is_chief(self) -> bool:
        return self.roles is not None and self.roles.is_chief

    def __repr__(self) -> str:
        r = self.roles
        what = "not joined" if r is None else f"{r.role} {r.index} of {r.n_workers}w/{r.n_servers}s"
        return f"Membership({what}, {len(self.windows)} window(s))"
