"""Every write of ``<run dir>/metrics.json`` by the parameter-server and AllReduce modes:
after each epoch (the epochs so far) and at the end (with the summary). Rank 0 (the chief)
only. The file's format: :mod:`hpcps.runtime.output`.
"""

from __future__ import annotations

from hpcps import __version__
from hpcps.config import to_dict
from hpcps.runtime.output import write_metrics
from hpcps.runtime.report import add_baseline


def record(cfg, history: list, summary: dict | None = None) -> dict:
    """The metrics record: job name, version, config, epochs and (at the end) the summary."""
    rec = {"job": cfg.name, "hpcps_version": __version__, "config": to_dict(cfg),
           "epochs": history}
    if summary is not None:
        rec["summary"] = summary
    return rec


def write_epochs(cfg, history: list):
    """Write the epochs so far (after each epoch). Returns the path."""
    return write_metrics(cfg.output.dir / "metrics.json", record(cfg, history))


def write_final(cfg, summary: dict, history: list):
    """Add the scikit-learn baseline when the job asks for it
    (:func:`hpcps.runtime.report.add_baseline`) and write the final record. Returns the path."""
    add_baseline(cfg, summary, history)
    return write_metrics(cfg.output.dir / "metrics.json", record(cfg, history, summary))
