"""Consistency models as objects that the server and worker loops consult (no MPI).

Clocks: a worker's clock ``c`` counts the steps it has finished; a server's clock counts the
steps whose updates it has applied from every worker.
"""

from __future__ import annotations

MODELS = ("bsp",)


class BSP:
    """Bulk Synchronous Parallel (Valiant 1990): the pull for clock ``t + 1`` sees exactly
    the updates of every worker's clock ``t`` and nothing newer.

    Servers hold each clock's pushes until every worker has clocked, then apply them as one
    aggregated step (so BSP equals minibatch SGD on the concatenated minibatches).
    """

    name = "bsp"
    staleness = 0
    aggregate = True

    def pull_ready(self, server_clock: int, pull_clock: int) -> bool:
        """True when a pull made at worker clock ``pull_clock`` may be answered."""
        return server_clock >= pull_clock


def make_policy(name: str):
    """Return the consistency policy object named in the job file."""
    if name == "bsp":
        return BSP()
    raise ValueError(f"unknown consistency model {name!r}; valid: {', '.join(MODELS)}")
