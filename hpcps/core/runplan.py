"""Decisions a job takes at run time, beside its configuration (which stays what the job file
said). No MPI.

Today one: the pull mode in use. ``[consistency] pull = "rma"`` with ``rma_fallback = true``
becomes p2p pulls when this MPI gives one-sided reads no passive progress
(:func:`hpcps.runtime.preflight.check_rma_progress`, rank 0's view, the same on every rank);
an added worker takes the running job's mode from its join plan
(:class:`hpcps.resilience.elastic.JoinPlan`). :mod:`hpcps.runtime.job`,
:mod:`hpcps.resilience.elastic` and :mod:`hpcps.resilience.supervisor` read it here, never
from ``cfg.consistency.pull``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """What this run does where the job file leaves the choice to the run.

    Attributes
    ----------
    pull : {"p2p", "rma"}
        The pull mode in use.
    rma_fallback : bool
        True when the job file asked for ``pull = "rma"`` and the run pulls by messages
        (p2p) instead (``[consistency] rma_fallback``).
    """

    pull: str
    rma_fallback: bool = False

    @classmethod
    def of(cls, cfg) -> "RunPlan":
        """The plan of ``cfg`` (a :class:`hpcps.config.JobConfig`) as its job file says. Local."""
        return cls(pull=cfg.consistency.pull)

    def with_p2p_pulls(self) -> "RunPlan":
        """This plan with p2p pulls instead of RMA (the RMA fallback). Local."""
        return replace(self, pull="p2p", rma_fallback=self.pull == "rma")
