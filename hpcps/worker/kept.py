"""Kept pushes (continue mode): :class:`KeptPushes`, the part of
:class:`hpcps.worker.client.PSClient` that keeps every push and CLOCK until its key range
acknowledged the step and sends the kept steps again after a failure (see the client's
module docstring)."""

from __future__ import annotations

import numpy as np

from hpcps.comm import transport as tp


class KeptPushes:
    """``PSClient.keep_pushes``, ``kept_from``, ``rollback`` and ``resend``; mixed into
    :class:`~hpcps.worker.client.PSClient` (uses its endpoint, clock, ``kept``,
    ``acked_seen``, ``staged``, ``next_pull`` and ``prefetch``)."""

    def keep_pushes(self) -> None:
        """Keep every push and CLOCK from now on until its range acknowledged the step (see
        the module docstring). Local."""
        self.kept = {}
        self.acked_seen = np.full(self.n_servers, self.clock_value, dtype=np.int64)

    def kept_from(self) -> np.ndarray | None:
        """First step kept per range (int64 ``(n_servers,)``), None when nothing is kept."""
        return None if self.kept is None else self.acked_seen.copy()

    def _trim(self) -> None:
        floor = int(self.acked_seen.min())
        for c in [c for c in self.kept if c < floor]:
            del self.kept[c]
        for c, entry in self.kept.items():
            if entry[1]:
                entry[1] = [p for p in entry[1] if c >= self.acked_seen[p[0]]]
        nbytes = sum(k.nbytes + g.nbytes for e in self.kept.values() for _, _, k, g in e[1])
        self.kept_bytes_max = max(self.kept_bytes_max, nbytes)

    def rollback(self, clock: int) -> None:
        """Forget kept steps ``>= clock`` (unfinished: they are computed again) and set the
        clock. Local."""
        self.clock_value = int(clock)
        self.staged = {}
        self.next_pull = self.prefetch = None
        if self.kept is not None:
            for c in [c for c in self.kept if c >= clock]:
                del self.kept[c]

    def resend(self, base) -> int:
        """Send the kept pushes and CLOCKs of steps ``base[s] .. clock - 1`` to each range
        ``s`` again, in step order (after a failure, :mod:`hpcps.resilience.recovery`). Point-to-point.

        Returns
        -------
        int
            Messages sent.

        Raises
        ------
        RuntimeError
            If a step a range asks for is no longer kept (a broken invariant).
        """
        base = np.asarray(base, dtype=np.int64)
        sent = 0
        for c in range(int(base.min()), self.clock_value):
            entry = self.kept.get(c)
            ranges = [s for s in range(self.n_servers) if base[s] <= c]
            if not ranges:
                continue
            if entry is None or entry[0] is None:
                raise RuntimeError(f"step {c} is asked for again by key range(s) {ranges} but "
                                   f"this worker no longer keeps it (kept from "
                                   f"{self.acked_seen.tolist()})")
            for s, h, k, g in entry[1]:
                if base[s] <= c:
                    self.ep.send(s, h, k, g)
                    sent += 1
            for s in ranges:
                self.ep.send(s, tp.make_header(tp.CLOCK, 0, c, 0, entry[0], aux=entry[2], rng=s))
                sent += 1
            self.ep.complete(tp.CLOCK)
        return sent
