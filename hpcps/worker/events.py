"""What ends a planned segment of training early: the trainer raises these, the supervisor
(:mod:`hpcps.resilience.supervisor`) handles them — a stop checkpoints and leaves, a growth
adds workers and re-plans, a lost peer is recovered from and re-planned. The training loop
(:meth:`hpcps.worker.trainer.Trainer.run_segment`) never handles them itself.
"""

from __future__ import annotations

__all__ = ["SegmentEvent", "StopRequested", "GrowthRequested", "PeerLost"]


class SegmentEvent(Exception):
    """Base of the events that end a segment; ``step`` is the step of the segment the worker
    goes on from (its cursor's ``first``) if the supervisor resumes it."""


class StopRequested(SegmentEvent):
    """A stop signal reached some worker: every worker raises it after the same step."""

    def __init__(self, step: int):
        super().__init__(f"stop requested after step {step}")
        self.step = step


class GrowthRequested(SegmentEvent):
    """Every worker agreed to add ``n`` workers at this clock (``[elastic]`` or ``hpcps grow``)."""

    def __init__(self, n: int, oversubscribe: bool):
        super().__init__(f"{n} worker(s) requested")
        self.n = n
        self.oversubscribe = oversubscribe


class PeerLost(SegmentEvent):
    """A rank of the job failed (continue mode); the MPI error is the ``__cause__``."""
