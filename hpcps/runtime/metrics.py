"""When the parameter-server and AllReduce modes write ``<run dir>/metrics.json``: after each
epoch (the epochs so far) and at the end (with the summary and the baseline). Rank 0 (the
chief) only. The writer (the one for every mode): :class:`hpcps.runtime.rundir.MetricsFile`.
"""

from __future__ import annotations

from hpcps.runtime.report import add_baseline
from hpcps.runtime.rundir import MetricsFile


def write_epochs(cfg, history: list):
    """Write the epochs so far (after each epoch). Returns the path."""
    return MetricsFile(cfg).epochs(history)


def write_final(cfg, summary: dict, history: list):
    """Add the scikit-learn baseline when the job asks for it
    (:func:`hpcps.runtime.report.add_baseline`) and write the final record. Returns the path."""
    add_baseline(cfg, summary, history)
    return MetricsFile(cfg).final(history, summary)
