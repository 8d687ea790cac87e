"""How a key range's server follows a change of its workers: added workers (a growth,
:mod:`hpcps.resilience.elastic`) and lost ones (a recovery, :mod:`hpcps.resilience.recovery`).
A mixin of :class:`hpcps.server.server.ParameterServer` (kept apart to keep the request
handling short); every method is local except :meth:`ServerMembership._grow`.
"""

from __future__ import annotations

from hpcps.comm import transport as tp
from hpcps.core.consistency import H_CLOCK, H_FASTEST, H_NWORKERS, H_SLOWEST, header_len
from hpcps.server.loop import IDLE_SPIN, agreed_growth
from hpcps.server.clocks import WorkerClocks
from hpcps.server.shard import header_and_rows

__all__ = ["ServerMembership"]


class ServerMembership:
    """The growth and recovery methods of :class:`~hpcps.server.server.ParameterServer`."""

    # ------------------------------------------------------------------ failures
    def settle(self, rec, endpoint) -> None:
        """Settle every old worker's last steps after a failure, then re-index the survivors
        and continue on ``endpoint`` (the survivors' communicator). Local; the server loop
        (:class:`hpcps.resilience.replica.ServerGroup`) calls it on each range it still serves
        once the survivors agreed (:func:`hpcps.resilience.recovery.recover`).

        Dead workers: the pushes of a step whose CLOCK this range missed but another server
        received are applied with the examples that server received, pushes of unfinished
        steps are dropped (``rec.clocks``). Surviving workers, when they keep their pushes
        (``rec.resend``, BSP/SSP): every push and CLOCK of theirs not applied yet is dropped,
        and they send them again from this range's clock (so nothing lost in flight and
        nothing applied twice); otherwise (async) their steps are settled like a dead
        worker's.
        """
        n_old = self.n_workers
        agreed = [int(c) for c in rec.clocks]
        dead = set(rec.dead_workers)
        for w in range(n_old):
            key = self.order_key[w]
            if rec.resend and w not in dead:
                for c in list(self.step_examples):
                    self.step_examples[c].pop(key, None)
                self.worker_clock[w] = self.clock
                continue
            if self.worker_clock[w] < agreed[w]:          # its CLOCK reached another server only
                c, nex = agreed[w] - 1, int(rec.examples[w])
                if self.policy.aggregate:
                    self.step_examples.setdefault(c, {})[key] = (nex, int(rec.epochs[w]))
                else:
                    self._count(nex, int(rec.epochs[w]))
                    for shard, rows, grads, hp in self.held.get(w, ()):
                        self._apply_now(shard, rows, grads, hp)
            self.worker_clock[w] = max(self.worker_clock[w], agreed[w])
        self.held = {}
        keep = {self.order_key[w]: (self.clock if rec.resend and w not in dead else agreed[w])
                for w in range(n_old)}
        for c, tables in self.pending.items():          # drop pushes of unfinished steps
            for tid in tables:
                tables[tid] = [p for p in tables[tid] if c < keep[p[0]]]
        for c in [c for c, d in self.step_examples.items() if not d]:
            del self.step_examples[c]
        n_new = len(rec.roles.worker_ranks)
        old = [rec.old_index[i] for i in range(n_new)]
        self.order_key = [self.order_key[o] for o in old]
        self.worker_clock = WorkerClocks([self.worker_clock[o] for o in old])
        self.last_examples = [self.last_examples[o] for o in old]
        self.last_epoch = [self.last_epoch[o] for o in old]
        self.pushes_applied = [0] * n_new               # the workers reset their counts too
        self.waiting_pulls = []                          # the survivors repeat their requests
        self.growing = {}
        self._bind(rec.roles, endpoint=endpoint)
        if self.policy.aggregate:
            self._advance()
        else:
            self.clock = self.worker_clock.min()
            for shard in self.shards:
                shard.hdr[H_CLOCK] = self.clock

    def _bind(self, roles, windows=None, endpoint=None) -> None:
        """Serve the workers of ``roles`` (after a recovery or a growth) over ``roles.ps``
        (through ``endpoint`` when given: one shared by the ranges of a server rank);
        ``worker_clock`` already lists them in index order. Shard headers are resized for the
        new number of workers; with ``windows`` (a growth under RMA pulls) each shard's header
        and rows move into the new window. Traffic counts are kept. Local."""
        stats = self.ep.stats
        self.ep.flush()                 # replies in flight on the old communicator
        self.ep = endpoint or tp.ServerEndpoint(roles.ps, self.ep.max_bytes)
        self.ep.stats = stats
        self.worker_of_rank = {r: i for i, r in enumerate(roles.worker_ranks)}
        self.n_workers = len(roles.worker_ranks)
        self.stopped = set()
        nh = header_len(self.n_workers)
        for tid, shard in enumerate(self.shards):
            win = windows[tid] if windows else None
            if win is not None or shard.hdr.size != nh:
                hdr, shard.w = header_and_rows(shard.w, win, nh)
                hdr[:] = shard.hdr
                shard.hdr, shard.window = hdr, win if win is not None else shard.window
            shard.hdr[H_NWORKERS] = self.n_workers
            shard.hdr[H_SLOWEST] = self.worker_clock.min()
            shard.hdr[H_FASTEST] = self.worker_clock.max()

    # ------------------------------------------------------------------ growth
    def _grow(self) -> None:
        """Every worker sent GROW at the same clock: take part in adding the workers
        (:meth:`hpcps.resilience.elastic.Elastic.grow`). Collective over every rank of the job.

        The workers sent GROW after every other request of their clock, so nothing of theirs
        is pending here: under every policy the server clock equals every worker's clock.
        The added workers start at that clock; their pushes are summed after the old
        workers' (a new order key each).
        """
        asks, self.growing = set(self.growing.values()), {}
        n, oversubscribe, clock = agreed_growth(asks, f"server {self.index}")
        if self.elastic is None:
            raise RuntimeError(f"server {self.index}: GROW received but this job cannot grow")
        self.check_growth(clock)

        def adopt():        # the job's membership has the new layout (and RMA windows)
            m = self.elastic.membership
            self.add_workers(m.roles, clock, self.elastic.oversubscribed(), m.windows)

        self.elastic.grow(n, clock, adopt, oversubscribe=bool(oversubscribe))

    def state(self) -> list:
        """``(w, slots)`` of every table (the arrays themselves, not copies)."""
        return [(sh.w, sh.slots) for sh in self.shards]

    def check_growth(self, clock: int) -> None:
        """Raise unless every worker's requests up to ``clock`` are done here. Local."""
        if self.waiting_pulls or self.clock != clock or any(c != clock for c in self.worker_clock):
            raise RuntimeError(f"server {self.index}: GROW at clock {clock} while the server is at "
                               f"clock {self.clock} (workers {self.worker_clock}, "
                               f"{len(self.waiting_pulls)} request(s) waiting)")

    def add_workers(self, roles, clock: int, oversubscribed: bool, windows=None,
                    endpoint=None) -> None:
        """Serve the workers of ``roles``: the old ones, then those added at ``clock`` (a new
        order key each, after every old one). ``oversubscribed``: the node now has more ranks
        than cores (the loop then sleeps sooner). Local."""
        if oversubscribed:
            self.idle_spin = min(self.idle_spin, IDLE_SPIN)   # leave cores to the workers
        k = len(roles.worker_ranks) - self.n_workers
        top = max(self.order_key) + 1
        self.order_key += list(range(top, top + k))
        self.worker_clock.extend(k, clock)
        self.pushes_applied += [0] * k
        self.last_examples += [0] * k
        self.last_epoch += [0] * k
        self._bind(roles, windows, endpoint)
