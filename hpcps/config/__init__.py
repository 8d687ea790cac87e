"""Job files: TOML → validated, frozen dataclasses.

A job file describes one training run (data, model, optimizer, cluster layout, ...).
It is parsed with :mod:`tomllib` and validated key by key against a fixed schema;
every problem is reported as a :class:`ConfigError` naming the job file and the dotted
key, e.g.::

    jobs/x.toml: optimizer.learning_rate: must be > 0, got -0.1
    jobs/x.toml: train.batchsize: unknown key (did you mean 'batch_size'?)

and all problems of one file together (:class:`ConfigErrors`), in the order of the file.

This package is imported before MPI is initialised and must never import ``mpi4py``.
It is a facade over private modules:

* :mod:`~hpcps.config.sections` — the dataclasses; each key's default and constraint,
  written once in its field; allowed values taken from the modules that own them;
* :mod:`~hpcps.config.schema` — the key checker (types, ranges, unknown keys);
* :mod:`~hpcps.config.rules` — the rules between keys and sections, in one place;
* :mod:`~hpcps.config.files` — the checks that touch the file system;
* :mod:`~hpcps.config.parse` — text → :class:`JobConfig`;
* :mod:`~hpcps.config.world` — the job against the launch's world size.

Path rules
----------
* Data paths (``data.path``, ``data.test_path``) are resolved relative to the directory
  of the job file, so a job file and its data can be moved together.
* ``output.dir`` is resolved relative to the current working directory at load time
  (default ``runs/<name>``).

Examples
--------
>>> cfg = load_job("jobs/adult_lr.toml")            # doctest: +SKIP
>>> check_world(cfg, world_size=4)                  # doctest: +SKIP
>>> cfg.train.batch_size, cfg.data.num_features     # doctest: +SKIP
(256, 1048576)
"""

from __future__ import annotations

from hpcps.config.errors import ConfigError, ConfigErrors
from hpcps.config.files import check_output_writable, output_note
from hpcps.config.parse import changed_keys, load_job, parse_job
from hpcps.config.sections import (CLUSTER_MODES, CONSISTENCY_MODELS, DATA_FORMATS, DTYPES,
                                   DUPLICATE_MODES, MODEL_TYPES, OPTIMIZERS, PULL_MODES,
                                   SECTIONS, CheckpointConfig, ClusterConfig, CommConfig,
                                   ConsistencyConfig, DataConfig, ElasticConfig,
                                   EvaluateConfig, FaultToleranceConfig, JobConfig,
                                   LbfgsConfig, ModelConfig, OptimizerConfig, OutputConfig,
                                   TrainConfig, to_dict)
from hpcps.config.world import check_world

__all__ = [
    "ConfigError",
    "ConfigErrors",
    "JobConfig",
    "ClusterConfig",
    "DataConfig",
    "ModelConfig",
    "OptimizerConfig",
    "TrainConfig",
    "ConsistencyConfig",
    "CommConfig",
    "OutputConfig",
    "EvaluateConfig",
    "CheckpointConfig",
    "changed_keys",
    "FaultToleranceConfig",
    "LbfgsConfig",
    "ElasticConfig",
    "DATA_FORMATS",
    "MODEL_TYPES",
    "CLUSTER_MODES",
    "DTYPES",
    "OPTIMIZERS",
    "CONSISTENCY_MODELS",
    "PULL_MODES",
    "DUPLICATE_MODES",
    "SECTIONS",
    "load_job",
    "parse_job",
    "check_world",
    "check_output_writable",
    "output_note",
    "to_dict",
]
