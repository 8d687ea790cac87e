"""Offline analysis of checkpoints, model files and runs: inspect, eval, export, plot, diff.

Everything here runs in a single process without MPI (h5py, numpy, matplotlib; never
``mpi4py``), so it works on a login node or a laptop with a copied run directory. The
``hpcps inspect|eval|export|plot|diff`` commands (:mod:`hpcps.cli.analysis`) are thin
wrappers around the public functions this module gathers from its parts:

* :mod:`hpcps.analysis.sources` — :class:`Source`, :func:`resolve`, :func:`read_tables`,
  :func:`array_stats`, :func:`checkpoint_status`, :class:`AnalysisError`;
* :mod:`hpcps.analysis.inspection` — :func:`inspect`, :func:`format_inspect`;
* :mod:`hpcps.analysis.evaluate` — :func:`evaluate`, :func:`format_evaluate`,
  :func:`job_config`, :func:`toml_text`;
* :mod:`hpcps.analysis.export` — :func:`export_npz`;
* :mod:`hpcps.analysis.plot` — :func:`load_metrics`, :func:`plot_run`;
* :mod:`hpcps.analysis.diff` — :func:`diff`, :func:`format_diff`.

``from hpcps.analysis import offline as analysis; analysis.inspect(...)`` is the usual import.

Sources
-------
A *source* names one set of model parameters (:func:`resolve`):

* a checkpoint directory ``runs/NAME/ckpt/step-XXXXXXXX/`` or its ``manifest.h5`` — checked
  with :func:`hpcps.checkpoint.verify` (every shard present, with the size and checksum the
  manifest records) before anything is read;
* a run directory ``runs/NAME/`` — its newest valid checkpoint (invalid newer ones are
  listed with the reason), or its final ``model.h5`` if no checkpoint is valid;
* a final model file ``runs/NAME/model.h5`` (:mod:`hpcps.runtime.output`).

Key order
---------
Checkpoint shards store sparse tables in *permuted* key order (:mod:`hpcps.core.tables`); the
manifest's virtual datasets ``tables/<name>`` and ``tables/<name>_keys`` give the rows and
each row's original key, so :func:`read_tables` un-permutes with ``out[keys] = rows``. Every
table this module returns or writes is in **original key order** (row ``k`` is key ``k``),
like the model file.

Errors
------
Every expected failure (missing or corrupt file, wrong kind of file, mismatched job) is an
:class:`AnalysisError`, :class:`hpcps.checkpoint.CheckpointError`,
:class:`hpcps.config.ConfigError` or :class:`hpcps.data.DataError` whose one-line message
names the file; h5py exceptions are never let through.
"""

from __future__ import annotations

from hpcps.analysis.diff import diff, format_diff
from hpcps.analysis.evaluate import evaluate, format_evaluate, job_config, toml_text
from hpcps.analysis.export import export_npz
from hpcps.analysis.inspection import format_inspect, inspect
from hpcps.analysis.plot import load_metrics, plot_run
from hpcps.analysis.sources import (METRICS_FILE, MODEL_FILE, SLOT_SEP, AnalysisError, Source,
                                    array_stats, checkpoint_status, read_tables, resolve)

__all__ = [
    "AnalysisError",
    "Source",
    "resolve",
    "checkpoint_status",
    "array_stats",
    "read_tables",
    "inspect",
    "format_inspect",
    "job_config",
    "toml_text",
    "evaluate",
    "format_evaluate",
    "export_npz",
    "load_metrics",
    "plot_run",
    "diff",
    "format_diff",
    "MODEL_FILE",
    "METRICS_FILE",
    "SLOT_SEP",
]
