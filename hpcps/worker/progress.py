"""The figures of the chief's progress line (``epoch E/N  step s/S  clock c ... examples/s ...
ETA``) across the run's re-plans: a growth or a recovery from a lost worker changes the
examples one clock reads and the steps of an epoch in the middle of it.

Found by a trial (continue mode, elastic growth): after workers were added the line's step
restarted at 1 of the rest of the epoch's steps, the examples/s counted every earlier clock
at the grown layout's examples per clock (2 -> 4 workers: twice the examples read), and the
ETA took the grown layout's steps per epoch for the whole run (fewer than the clocks already
run: ``ETA 0:00:00`` for the rest of it). Local; no MPI.
"""

from __future__ import annotations

from hpcps.core.planning import done_max

__all__ = ["ProgressMeter", "epoch_position"]


def epoch_position(cur, step: int, steps_full: int, epochs: int) -> tuple[int, int, int]:
    """Where step ``step`` (0-based, of the segment ``cur`` runs) is in its epoch and the run:
    ``(step of the epoch, 1-based; steps of the epoch; steps left in the run)``. The epoch's
    steps count the segments it ran before a re-plan (``cur.plan``: ``[n_workers, steps
    done]`` each) and the segment of now; the later epochs run ``steps_full`` steps each.

    Parameters
    ----------
    cur : hpcps.worker.trainer.Cursor
        Its ``epoch`` (0-based), ``plan`` and ``steps``.
    step : int
    steps_full : int
        Steps of a whole epoch on the current layout.
    epochs : int
        Epochs of the run (``[train] epochs``).
    """
    before = sum(done_max(n) for _, n in cur.plan)
    left = max(0, cur.steps - step - 1) + steps_full * max(0, epochs - cur.epoch - 1)
    return before + step + 1, before + cur.steps, left


class ProgressMeter:
    """The rate and the ETA of the progress lines, from the end of the launch's first step
    (the first step waits for the servers' start-up: a resume at 32 M keys spent 20-40 s
    restoring, and a rate since the launch's start read 177 examples/s, ETA 1:48:41).

    The examples are counted per layout (:meth:`replan`): the clocks before a re-plan at the
    examples per clock of then. The rate is the run's average since the first step (pauses
    included); after a re-plan the line adds the rate since it, and the ETA takes the pace of
    the steps since it (the time of a step changes with the workers). Times in seconds
    (``time.perf_counter``).

    Parameters
    ----------
    per_step : float
        Examples one clock of the job's workers reads
        (:func:`hpcps.core.planning.examples_per_step`).
    """

    def __init__(self, per_step: float = 0.0):
        self.per_step = float(per_step)
        #: (time, clock) at the end of the launch's first step; None before
        self.first = None
        #: (time, clock) at the end of the first step after the last re-plan; None before
        self.since = None
        self.replanned_at = None        # the clock of the last re-plan (None: none yet)
        self._examples = 0.0            # examples from the first step's clock to _base
        self._base = 0

    def stepped(self, now: float, clock: int) -> None:
        """A step ended at ``now`` with the worker's clock at ``clock``. Local."""
        if self.first is None:
            self.first = (now, clock)
            self._base, self._examples = clock, 0.0
        if self.since is None:
            self.since = (now, clock)

    def replan(self, clock: int, per_step: float) -> None:
        """The layout changed at ``clock``: from now on one clock reads ``per_step`` examples.
        Local."""
        if self.first is not None:
            self._examples += max(0, clock - self._base) * self.per_step
            self._base = clock
            self.since = None
            self.replanned_at = clock
        self.per_step = float(per_step)

    def examples(self, clock: int) -> float:
        """Examples the job's workers read from the end of the first step to ``clock``."""
        return self._examples + max(0, clock - self._base) * self.per_step

    def speed(self, now: float, t_start: float, clock: int, steps_left: int) -> tuple[str, str]:
        """``("N examples/s", "  ETA h:mm:ss")`` at ``now`` with the clock at ``clock`` and
        ``steps_left`` steps to run (:func:`epoch_position`); after a re-plan the rate adds
        ``" (M since the re-plan at clock C)"``. ``("first step S s (start-up included)",
        "")`` while no later step has ended (``t_start``: the launch's start)."""
        if self.first is None or clock <= self.first[1]:
            return f"first step {now - t_start:.1f} s (start-up included)", ""
        t1, c1 = self.first
        head = f"{self.examples(clock) / max(now - t1, 1e-9):,.0f} examples/s"
        pace = (now - t1) / (clock - c1)
        if self.replanned_at is not None and self.since is not None and clock > self.since[1]:
            ts, cs = self.since
            pace = (now - ts) / (clock - cs)
            head += (f" ({(clock - cs) * self.per_step / max(now - ts, 1e-9):,.0f} since the "
                     f"re-plan at clock {self.replanned_at:,})")
        eta = int(pace * steps_left)
        return head, f"  ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
