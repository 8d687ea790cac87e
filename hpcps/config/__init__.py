"""Job files: TOML → validated, frozen dataclasses.

A job file describes one training run (data, model, optimizer, cluster layout, ...).
It is parsed with :mod:`tomllib` and validated key by key against a fixed schema;
every problem is reported as a :class:`ConfigError` naming the job file and the dotted
key, e.g.::

    jobs/x.toml: optimizer.learning_rate: must be > 0, got -0.1
    jobs/x.toml: train.batchsize: unknown key (did you mean 'batch_size'?)

This module is imported before MPI is initialised and must never import ``mpi4py``.

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

import dataclasses
import difflib
import math
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
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
    "load_job",
    "parse_job",
    "check_world",
    "check_output_writable",
    "output_note",
    "to_dict",
]

#: Supported ``data.format`` values.
DATA_FORMATS = ("adult_csv", "svmlight", "prepared")
#: Built-in ``model.type`` values (a user model is named ``"package.module:ClassName"``).
MODEL_TYPES = ("logistic", "mf", "mlp")
#: Supported ``cluster.mode`` values.
CLUSTER_MODES = ("ps", "allreduce", "sandblaster")
#: Supported ``model.dtype`` values.
DTYPES = ("float32", "float64")
#: Supported ``optimizer.name`` values.
OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
#: Supported ``consistency.model`` values.
CONSISTENCY_MODELS = ("bsp", "ssp", "async")
#: Supported ``consistency.pull`` values.
PULL_MODES = ("p2p", "rma")
#: Supported ``data.duplicate_indices`` values (svmlight).
DUPLICATE_MODES = ("error", "sum")

_INT64_MAX = 2**63 - 1
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


# --------------------------------------------------------------------------- errors


class ConfigError(ValueError):
    """An invalid job file or job configuration.

    Parameters
    ----------
    path : str or os.PathLike or None
        The job file the error refers to (``None`` if unknown).
    key : str or None
        Dotted key, e.g. ``"optimizer.learning_rate"``; ``None`` for errors about the
        file as a whole (not found, TOML syntax error).
    message : str
        What is wrong, e.g. ``"must be > 0, got -0.1"``.

    Attributes
    ----------
    path : pathlib.Path or None
        The job file, as given by the caller.
    key : str or None
        The dotted key.
    message : str
        The bare message, without file and key.

    Notes
    -----
    ``str(err)`` is ``"<path>: <key>: <message>"`` (parts that are ``None`` are left out).
    """

    def __init__(self, path: str | os.PathLike | None, key: str | None, message: str):
        self.path = Path(path) if path is not None else None
        self.key = key
        self.message = message
        parts = [str(p) for p in (self.path, key) if p is not None]
        super().__init__(": ".join(parts + [message]))

    def __reduce__(self):
        return (type(self), (self.path, self.key, self.message))


# ----------------------------------------------------------------------- dataclasses


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """``[cluster]``: process layout.

    Attributes
    ----------
    mode : str
        ``"ps"`` (parameter servers and workers), ``"allreduce"`` (no servers: every rank
        holds the whole model and gradients are summed with ``MPI.Allreduce`` each step) or
        ``"sandblaster"`` (batch L-BFGS with a coordinator, Dean et al. NIPS 2012 §4.2).
    servers : int
        Number of server ranks K (the last K world ranks); the other ranks are workers.
        Not used with ``mode = "allreduce"``.
    """

    mode: str = "ps"
    servers: int = 1


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """``[data]``: training / test data.

    Attributes
    ----------
    format : str
        ``"adult_csv"`` (UCI Adult CSV, featurized by hashing), ``"svmlight"`` or
        ``"prepared"`` (an HDF5 file written by ``hpcps data prepare``,
        :mod:`hpcps.data.prepared`).
    path : pathlib.Path
        Absolute path of the training data (for ``adult_csv``: the whole data set, the
        test set is split off with `test_fraction`).
    test_path : pathlib.Path or None
        Absolute path of the svmlight test file; ``None`` for ``adult_csv``.
    index_base : int or None
        svmlight feature indices start at 0 or 1 (never guessed); ``None`` for
        ``adult_csv``.
    n_features : int or None
        svmlight feature count (indices must be ``< n_features`` after removing the base),
        up to ``2**63 - 1`` (indices are int64); ``None`` for ``adult_csv`` (use
        :attr:`num_features`).
    duplicate_indices : str
        svmlight: a feature index repeated within a row (``3:1 3:2``) is an error naming
        the file and line (``"error"``, the default) or its values are added (``"sum"``).
        Indices must not decrease along a row either way.
    test_fraction : float
        ``adult_csv``: fraction of rows held out as test set, in (0, 1).
    split_seed : int
        ``adult_csv``: seed of the train/test split.
    max_rows : int
        Read at most this many rows (0 = all); for quick tests.
    hash_bits : int
        ``adult_csv``: the hashed feature space has ``2**hash_bits`` features.
    numeric_bins : int
        ``adult_csv``: number of quantile bins for numeric columns.
    crosses : bool
        ``adult_csv``: add pairwise feature crosses.
    """

    format: str
    path: Path
    test_path: Path | None = None
    index_base: int | None = None
    n_features: int | None = None
    duplicate_indices: str = "error"
    test_fraction: float = 0.2
    split_seed: int = 0
    max_rows: int = 0
    hash_bits: int = 20
    numeric_bins: int = 8
    crosses: bool = True

    @property
    def num_features(self) -> int:
        """int : Number of model features (``n_features`` or ``2**hash_bits``)."""
        if self.format == "svmlight":
            return int(self.n_features)
        if self.format == "prepared":
            from hpcps.data.prepared import file_attrs

            return int(file_attrs(self.path).get("n_features", 0))
        return 2**self.hash_bits


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """``[model]``: the model.

    Attributes
    ----------
    type : str
        ``"logistic"`` (sparse logistic regression), ``"mf"`` (biased matrix factorization),
        ``"mlp"`` (multi-layer perceptron) or a user model ``"package.module:ClassName"``
        (:mod:`hpcps.models.base`).
    l2 : float
        L2 regularisation strength (>= 0).
    dtype : str
        Parameter dtype, ``"float32"`` or ``"float64"``.
    factors : int
        ``mf``: number of latent factors per user and item.
    hidden : tuple of int
        ``mlp``: hidden layer widths, input to output.
    init_scale : float
        Standard deviation of the random initial values of factor / weight tables.
    options : dict
        Free-form ``[model.options]`` table handed to a user model.
    """

    type: str = "logistic"
    l2: float = 0.0
    dtype: str = "float32"
    factors: int = 32
    hidden: tuple = (256, 128)
    init_scale: float = 0.1
    options: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """``[optimizer]``: the server-side update rule.

    Attributes
    ----------
    name : str
        ``"sgd"``, ``"adagrad"``, ``"adam"`` or ``"ftrl"``.
    learning_rate : float
        Step size (> 0); FTRL's alpha.
    initial_accumulator : float
        AdaGrad initial squared-gradient accumulator (>= 0). AdaGrad only.
    eps : float
        AdaGrad's and Adam's denominator epsilon (> 0). AdaGrad and Adam only.
    beta1, beta2 : float
        Adam's moment decay rates, in [0, 1). Adam only.
    beta : float
        FTRL's learning-rate offset (>= 0). FTRL only.
    l1, l2 : float
        FTRL's L1 and L2 strengths (>= 0), applied in its closed form to the sum of the
        steps' losses (McMahan et al. 2013, Algorithm 1); ``l1`` gives exact zeros. FTRL
        only; ``[model] l2`` is the model's penalty, added to the gradient by every rule.
    """

    name: str = "adagrad"
    learning_rate: float = 0.1
    initial_accumulator: float = 0.1
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """``[train]``: the training loop.

    Attributes
    ----------
    epochs : int
        Passes over the training data (>= 1).
    batch_size : int
        Minibatch size per worker (>= 1).
    shuffle : bool
        Shuffle each worker's rows every epoch.
    max_steps : int
        Cap on steps per epoch (0 = no limit).
    progress_seconds : float
        Seconds between progress lines printed by the chief (> 0).
    max_nonfinite_steps : int
        Steps whose loss or gradient is NaN/inf that are rejected (not pushed; under BSP on
        every worker, by a vote) before the job stops with ``NonFiniteError`` (>= 0; 0 = stop
        at the first). See :mod:`hpcps.worker.steps`.
    """

    epochs: int = 5
    batch_size: int = 256
    shuffle: bool = True
    max_steps: int = 0
    progress_seconds: float = 5.0
    max_nonfinite_steps: int = 0


@dataclass(frozen=True, kw_only=True)
class ConsistencyConfig:
    """``[consistency]``: the consistency model.

    Attributes
    ----------
    model : str
        One of :data:`CONSISTENCY_MODELS`: ``"bsp"`` (bulk synchronous), ``"ssp"`` (stale
        synchronous, Ho et al. NIPS 2013) or ``"async"`` (Downpour SGD, Dean et al. NIPS 2012
        §4.1).
    staleness : int
        SSP bound ``s`` (>= 0): a worker at clock ``c`` reads parameters that include every
        worker's updates of clocks ``< c - s``. Only with ``model = "ssp"``; ``0`` equals BSP.
    pull : str
        One of :data:`PULL_MODES`: ``"p2p"`` (request/reply messages) or ``"rma"`` (one-sided
        ``MPI_Get`` from per-shard windows, no message to the server).
    n_fetch, n_push : int
        Downpour: fetch parameters every ``n_fetch`` steps, push accumulated gradients every
        ``n_push`` steps (>= 1). Only with ``model = "async"``.
    staleness_aware_lr : bool
        Servers divide each update's step by ``staleness + 1`` (Zhang et al., IJCAI 2016).
        Not with ``model = "bsp"``.
    push_threshold : float
        Push filter (Li et al., OSDI 2014 §3.3 "significantly modified" filter): a worker
        sends only gradient entries whose accumulated magnitude exceeds this value and keeps
        the rest locally until it does (0 = off). Only with ``model = "async"``.
    rma_fallback : bool
        With ``pull = "rma"`` on an MPI known to give one-sided reads no passive progress
        (MPICH without ``MPIR_CVAR_ASYNC_PROGRESS=1``, Open MPI 4 without
        ``OMPI_MCA_osc=sm``; :mod:`hpcps.comm.progress`) pull by messages (``"p2p"``)
        instead. Either way rank 0 warns once at start with what to set. Only with
        ``pull = "rma"``.
    """

    model: str = "bsp"
    staleness: int = 0
    pull: str = "p2p"
    n_fetch: int = 1
    n_push: int = 1
    staleness_aware_lr: bool = False
    push_threshold: float = 0.0
    rma_fallback: bool = False


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    """``[comm]``: communication.

    Attributes
    ----------
    max_message_bytes : int
        Messages larger than this are split into chunks (>= 1024).
    """

    max_message_bytes: int = 1073741824


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """``[output]``: where results go.

    Attributes
    ----------
    dir : pathlib.Path
        Absolute output directory (job file value resolved against the working
        directory; default ``runs/<name>``).
    """

    dir: Path


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    """``[evaluate]``: evaluation after training.

    Attributes
    ----------
    sklearn_baseline : bool
        Also train scikit-learn's ``LogisticRegression`` on the same features and compare.
    max_auc_gap : float
        Largest acceptable ``baseline AUC - hpcps AUC`` (>= 0).
    """

    sklearn_baseline: bool = False
    max_auc_gap: float = 0.005


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """``[checkpoint]``: periodic HDF5 checkpoints under ``<output.dir>/ckpt/``.

    Attributes
    ----------
    every_steps : int
        Checkpoint every this many steps (worker clocks); 0 = not by step count.
    every_seconds : float
        Checkpoint when this many seconds of wall time passed since the last one (decided
        by worker 0 and broadcast); 0 = not by time.
    keep : int
        Number of complete checkpoints kept (older ones are deleted), >= 1.
    at_end : bool
        Also checkpoint after the last step.
    """

    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    at_end: bool = True


@dataclass(frozen=True, kw_only=True)
class FaultToleranceConfig:
    """``[fault_tolerance]``: what happens when a rank dies.

    Attributes
    ----------
    mode : str
        ``"restart"`` (default): the job stops and is relaunched from its last checkpoint
        (``hpcps run --max-restarts``, or the Slurm script's requeue). ``"continue"``: with an
        MPI that has ULFM, the survivors shrink the job and keep training through the loss of
        workers and of servers (:mod:`hpcps.comm.ft`, :mod:`hpcps.resilience.recovery`).
    replicas : int
        Copies of every server's key range (1 or 2; continue mode only). With 2, each range is
        also held by the next server in ring order, kept exactly in step by chain replication
        after aggregation (Li et al., OSDI 2014, §4.3; :mod:`hpcps.server.replica`): when a
        server dies its backup takes the range over and nothing is lost. Needs at least 2
        servers and BSP or SSP.
    on_server_loss : str
        What a continue-mode job does when a key range has no surviving copy (``replicas = 1``,
        or both copies lost): ``"reload"`` (default under BSP/SSP) reloads the range from the
        newest valid checkpoint onto a survivor and goes on, reporting the steps of that range
        lost; ``"restart"`` (the default, and the only choice, under async) stops the job for a
        normal restart from the last checkpoint.
    """

    mode: str = "restart"
    replicas: int = 1
    on_server_loss: str = "reload"


@dataclass(frozen=True, kw_only=True)
class LbfgsConfig:
    """``[lbfgs]``: batch L-BFGS of ``[cluster] mode = "sandblaster"`` (:mod:`hpcps.sandblaster`).

    Only allowed with ``mode = "sandblaster"``. The objective is
    ``F(w, b) = mean log-loss + (l2 / 2) * ||w||²`` (``[model] l2``; the bias is not penalised).

    Attributes
    ----------
    history : int
        Number ``m`` of correction pairs ``(s_k, y_k)`` kept (Nocedal & Wright, *Numerical
        Optimization*, 2nd ed., §7.2), in ``[1, 1000]``.
    max_iterations : int
        Largest number of L-BFGS iterations (>= 1).
    tolerance : float
        Stop once ``max_i |∂F/∂x_i| <= tolerance`` (the gradient's infinity norm, as
        scikit-learn's ``tol`` for ``solver="lbfgs"``), >= 0.
    f_tolerance : float
        Also stop once an iteration lowers ``F`` by at most ``f_tolerance * max(|F|, 1)``
        (relative), >= 0; 0 = off.
    work_units : int
        Number of work units the training rows are cut into; the coordinator hands them out
        to the workers on demand at every function evaluation (>= 1; capped at the number of
        rows).
    wolfe_c1, wolfe_c2 : float
        Strong Wolfe constants of the line search, ``0 < c1 < c2 < 1`` (sufficient decrease
        and curvature; N&W §3.1).
    line_search_max_evals : int
        Function evaluations allowed per line search (>= 1).
    """

    history: int = 10
    max_iterations: int = 500
    tolerance: float = 1e-6
    f_tolerance: float = 1e-12
    work_units: int = 64
    wolfe_c1: float = 1e-4
    wolfe_c2: float = 0.9
    line_search_max_evals: int = 20


@dataclass(frozen=True, kw_only=True)
class ElasticConfig:
    """``[elastic]``: workers added to the running job (``[cluster] mode = "ps"`` only;
    :mod:`hpcps.resilience.elastic`). ``hpcps grow RUN_DIR --workers N`` adds workers to a running job
    without this section.

    Attributes
    ----------
    add_workers : int
        Workers to start (``MPI_Comm_spawn``) when the workers' clock reaches ``at_step``;
        0 = none.
    at_step : int
        The clock (steps since the job started, as ``[checkpoint] every_steps`` counts them)
        at which they join; required with ``add_workers``, >= 1.
    oversubscribe : bool
        Let added workers share cores with running ranks (Open MPI: spawn info
        ``map_by = ":OVERSUBSCRIBE"``, ``bind_to = "none"``); by default they need free
        slots in the launch's allocation.
    join_timeout : float
        Seconds the job waits for added workers to start and meet it (any growth, also by
        ``hpcps grow``) before it aborts: a process that dies before ``MPI_Init`` would
        otherwise leave every rank waiting in ``MPI_Comm_spawn``.
    """

    add_workers: int = 0
    at_step: int = 0
    oversubscribe: bool = False
    join_timeout: float = 300.0


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """A validated job file.

    Attributes
    ----------
    name : str
        Job name (``[A-Za-z0-9_.-]+``).
    seed : int
        Global random seed (>= 0).
    cluster, data, model, optimizer, train, consistency, comm, output, evaluate, checkpoint, lbfgs
        The sections, see the respective ``*Config`` classes.
    path : pathlib.Path
        Absolute path of the job file.
    text : str
        The raw job file text (stored with the model).
    """

    name: str
    seed: int = 0
    cluster: ClusterConfig
    data: DataConfig
    model: ModelConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    consistency: ConsistencyConfig
    comm: CommConfig
    output: OutputConfig
    evaluate: EvaluateConfig
    checkpoint: CheckpointConfig
    fault_tolerance: FaultToleranceConfig = dataclasses.field(default_factory=FaultToleranceConfig)
    lbfgs: LbfgsConfig = dataclasses.field(default_factory=LbfgsConfig)
    elastic: ElasticConfig = dataclasses.field(default_factory=ElasticConfig)
    path: Path
    text: str


# --------------------------------------------------------------------------- schema

_REQUIRED = object()


@dataclass(frozen=True)
class _Rule:
    """Type and constraint of one key (internal)."""

    kind: type  # str, int, float or bool
    default: Any = _REQUIRED
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo exclusive
    hi_open: bool = False  # hi exclusive
    choices: tuple | None = None


_TOP = {
    "name": _Rule(str),
    "seed": _Rule(int, 0, lo=0),
}

_SECTIONS: dict[str, dict[str, _Rule]] = {
    "cluster": {"mode": _Rule(str, "ps", choices=CLUSTER_MODES), "servers": _Rule(int, 1, lo=1)},
    "data": {
        "format": _Rule(str, choices=DATA_FORMATS),
        "path": _Rule(str),
        "test_path": _Rule(str, ""),
        "index_base": _Rule(int, choices=(0, 1)),
        "n_features": _Rule(int, lo=1),
        "duplicate_indices": _Rule(str, "error", choices=DUPLICATE_MODES),
        "test_fraction": _Rule(float, 0.2, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        "split_seed": _Rule(int, 0, lo=0),
        "max_rows": _Rule(int, 0, lo=0),
        "hash_bits": _Rule(int, 20, lo=1, hi=40),
        "numeric_bins": _Rule(int, 8, lo=2, hi=256),
        "crosses": _Rule(bool, True),
    },
    "model": {
        "type": _Rule(str, "logistic"),
        "l2": _Rule(float, 0.0, lo=0.0),
        "dtype": _Rule(str, "float32", choices=DTYPES),
        "factors": _Rule(int, 32, lo=1, hi=65536),
        "hidden": _Rule(list, [256, 128]),
        "init_scale": _Rule(float, 0.1, lo=0.0),
        "options": _Rule(dict, {}),
    },
    "optimizer": {
        "name": _Rule(str, "adagrad", choices=OPTIMIZERS),
        "learning_rate": _Rule(float, 0.1, lo=0.0, lo_open=True),
        "initial_accumulator": _Rule(float, 0.1, lo=0.0),
        "eps": _Rule(float, 1e-8, lo=0.0, lo_open=True),
        "beta1": _Rule(float, 0.9, lo=0.0, hi=1.0, hi_open=True),
        "beta2": _Rule(float, 0.999, lo=0.0, hi=1.0, hi_open=True),
        "beta": _Rule(float, 1.0, lo=0.0),
        "l1": _Rule(float, 0.0, lo=0.0),
        "l2": _Rule(float, 0.0, lo=0.0),
    },
    "train": {
        "epochs": _Rule(int, 5, lo=1),
        "batch_size": _Rule(int, 256, lo=1),
        "shuffle": _Rule(bool, True),
        "max_steps": _Rule(int, 0, lo=0),
        "progress_seconds": _Rule(float, 5.0, lo=0.0, lo_open=True),
        "max_nonfinite_steps": _Rule(int, 0, lo=0),
    },
    "consistency": {
        "model": _Rule(str, "bsp", choices=CONSISTENCY_MODELS),
        "staleness": _Rule(int, 0, lo=0, hi=1_000_000),
        "pull": _Rule(str, "p2p", choices=PULL_MODES),
        "n_fetch": _Rule(int, 1, lo=1, hi=1_000_000),
        "n_push": _Rule(int, 1, lo=1, hi=1_000_000),
        "staleness_aware_lr": _Rule(bool, False),
        "push_threshold": _Rule(float, 0.0, lo=0.0),
        "rma_fallback": _Rule(bool, False),
    },
    "comm": {"max_message_bytes": _Rule(int, 1073741824, lo=1024)},
    "output": {"dir": _Rule(str, "")},
    "checkpoint": {
        "every_steps": _Rule(int, 0, lo=0),
        "every_seconds": _Rule(float, 0.0, lo=0),
        "keep": _Rule(int, 3, lo=1),
        "at_end": _Rule(bool, True),
    },
    "fault_tolerance": {"mode": _Rule(str, "restart", choices=("restart", "continue")),
                        "replicas": _Rule(int, 1, lo=1, hi=2),
                        "on_server_loss": _Rule(str, "reload", choices=("reload", "restart"))},
    "evaluate": {
        "sklearn_baseline": _Rule(bool, False),
        "max_auc_gap": _Rule(float, 0.005, lo=0.0),
    },
    "lbfgs": {
        "history": _Rule(int, 10, lo=1, hi=1000),
        "max_iterations": _Rule(int, 500, lo=1),
        "tolerance": _Rule(float, 1e-6, lo=0.0),
        "f_tolerance": _Rule(float, 1e-12, lo=0.0),
        "work_units": _Rule(int, 64, lo=1, hi=1 << 40),
        "wolfe_c1": _Rule(float, 1e-4, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        "wolfe_c2": _Rule(float, 0.9, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        "line_search_max_evals": _Rule(int, 20, lo=1, hi=1000),
    },
    "elastic": {
        "add_workers": _Rule(int, 0, lo=0, hi=4096),
        "at_step": _Rule(int, 0, lo=0),
        "oversubscribe": _Rule(bool, False),
        "join_timeout": _Rule(float, 300.0, lo=0.0, lo_open=True),
    },
}

# [data] keys that only make sense for one format; setting them for the other is an error.
_FORMAT_ONLY = {
    "adult_csv": ("test_fraction", "split_seed", "hash_bits", "numeric_bins", "crosses"),
    "svmlight": ("test_path", "index_base", "n_features", "duplicate_indices"),
    "prepared": (),
}
_FORMAT_REQUIRED = {"adult_csv": (), "svmlight": ("test_path", "index_base", "n_features"),
                    "prepared": ()}

_TOML_TYPE_NAMES = {
    str: "string",
    int: "integer",
    float: "float",
    bool: "boolean",
    dict: "table",
    list: "array",
}


def _type_name(value: Any) -> str:
    for t in (bool, int, float, str, dict, list):  # bool before int
        if isinstance(value, t):
            return _TOML_TYPE_NAMES[t]
    return type(value).__name__  # datetime, date, time


def _show(value: Any) -> str:
    """Render a value the way it would be written in TOML (roughly)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "{...}"
    return repr(value) if isinstance(value, float) else str(value)


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


class _Checker:
    """Validation helpers bound to one job file (internal)."""

    def __init__(self, path: Path):
        self.path = path
        self.job_dir = path.resolve().parent

    def error(self, key: str | None, message: str) -> ConfigError:
        return ConfigError(self.path, key, message)

    # -- keys ----------------------------------------------------------------------

    def unknown_keys(self, table: dict, valid: dict, prefix: str) -> None:
        for k in table:
            if k in valid:
                continue
            dotted = f"{prefix}{k}"
            close = difflib.get_close_matches(k, list(valid), n=1, cutoff=0.6)
            if close:
                hint = f"did you mean '{close[0]}'?"
            elif prefix and k in _TOP:
                hint = (f"'{k}' is a top-level key; move it above the first [section] "
                        "header")
            else:
                homes = [s for s, keys in _SECTIONS.items() if k in keys and f"{s}." != prefix]
                if homes:
                    hint = f"'{k}' belongs in [{homes[0]}]"
                else:
                    hint = "valid keys: " + ", ".join(sorted(valid))
            raise self.error(dotted, f"unknown key ({hint})")

    def value(self, table: dict, key: str, rule: _Rule, dotted: str) -> Any:
        """Type- and range-check ``table[key]`` (or return the default)."""
        if key not in table:
            if rule.default is _REQUIRED:
                raise self.error(dotted, "required key missing")
            return rule.default
        v = table[key]
        kind = rule.kind
        ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            try:
                v, ok = float(v), True
            except OverflowError:
                raise self.error(dotted, f"number too large, got {v}") from None
        if not ok:
            raise self.error(dotted, f"expected {_TOML_TYPE_NAMES[kind]}, "
                                     f"got {_type_name(v)} {_show(v)}")
        if kind is float and not math.isfinite(v):
            raise self.error(dotted, f"must be a finite number, got {_show(v)}")
        if rule.choices is not None and v not in rule.choices:
            allowed = ", ".join(_show(c) for c in rule.choices)
            msg = f"must be one of {allowed}, got {_show(v)}"
            if isinstance(v, str):
                close = difflib.get_close_matches(v, [str(c) for c in rule.choices], n=1)
                if close:
                    msg += f" (did you mean '{close[0]}'?)"
            raise self.error(dotted, msg)
        if kind is int and v > _INT64_MAX:
            raise self.error(dotted, f"must be <= {_INT64_MAX}, got {v}")
        self._range(v, rule, dotted)
        return v

    def _range(self, v: float, rule: _Rule, dotted: str) -> None:
        lo, hi = rule.lo, rule.hi
        if lo is not None and hi is not None:
            bad = (v <= lo if rule.lo_open else v < lo) or (v >= hi if rule.hi_open else v > hi)
            if bad:
                lb = "(" if rule.lo_open else "["
                rb = ")" if rule.hi_open else "]"
                raise self.error(dotted, f"must be in {lb}{_fmt_num(lo)}, {_fmt_num(hi)}{rb}, "
                                         f"got {_show(v)}")
        elif lo is not None:
            if v <= lo if rule.lo_open else v < lo:
                op = ">" if rule.lo_open else ">="
                raise self.error(dotted, f"must be {op} {_fmt_num(lo)}, got {_show(v)}")
        elif hi is not None:
            if v >= hi if rule.hi_open else v > hi:
                op = "<" if rule.hi_open else "<="
                raise self.error(dotted, f"must be {op} {_fmt_num(hi)}, got {_show(v)}")

    # -- paths -----------------------------------------------------------------------

    def input_file(self, value: str, dotted: str) -> Path:
        """Resolve a data path against the job file's directory; it must be a file."""
        if not value:
            raise self.error(dotted, "must not be empty")
        if "\x00" in value:
            raise self.error(dotted, f"path contains a NUL character: {value!r}")
        p = Path(value).expanduser()
        if not p.is_absolute():
            p = self.job_dir / p
        p = p.resolve()
        if not p.exists():
            rel = "" if Path(value).expanduser().is_absolute() else (
                f" (relative paths are resolved against the job file's directory "
                f"{self.job_dir})")
            raise self.error(dotted, f"file not found: {p}{rel}")
        if not p.is_file():
            raise self.error(dotted, f"not a regular file: {p}")
        if not os.access(p, os.R_OK):
            raise self.error(dotted, f"file not readable: {p}")
        return p


def _section(ck: _Checker, doc: dict, name: str) -> dict:
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ck.error(name, f"expected a table ([{name}]), got {_type_name(table)} "
                             f"{_show(table)}")
    ck.unknown_keys(table, _SECTIONS[name], f"{name}.")
    return table


def _simple(ck: _Checker, doc: dict, name: str) -> dict[str, Any]:
    table = _section(ck, doc, name)
    return {k: ck.value(table, k, rule, f"{name}.{k}") for k, rule in _SECTIONS[name].items()}


def _data(ck: _Checker, doc: dict) -> DataConfig:
    table = _section(ck, doc, "data")
    rules = _SECTIONS["data"]
    fmt = ck.value(table, "format", rules["format"], "data.format")
    for other, keys in _FORMAT_ONLY.items():
        if other == fmt:
            continue
        for k in keys:
            if k not in table or (k == "test_path" and table[k] == ""):
                continue
            if k == "test_path":
                raise ck.error("data.test_path", f"must be empty for format '{fmt}' (the "
                                                 "test set is split off by "
                                                 "data.test_fraction), got "
                                                 f"{_show(table[k])}")
            raise ck.error(f"data.{k}", f"not used with format '{fmt}' (only with "
                                        f"'{other}'); remove it")
    for k in _FORMAT_REQUIRED[fmt]:
        if k not in table:
            raise ck.error(f"data.{k}", f"required key missing (required for format "
                                        f"'{fmt}')")
    vals: dict[str, Any] = {}
    for k, rule in rules.items():
        if k == "format":
            continue
        if k in _FORMAT_ONLY[fmt] or not any(k in ks for ks in _FORMAT_ONLY.values()):
            vals[k] = ck.value(table, k, rule, f"data.{k}")
    if fmt == "prepared":
        raw = str(table.get("path", ""))
        p = Path(raw).expanduser()
        p = (p if p.is_absolute() else ck.job_dir / p).resolve()
        if raw and not p.exists():
            raise ck.error("data.path", f"prepared data file not found: {p}; write it with "
                                        f"`hpcps data prepare {p.stem} --out {p}`")
    path = ck.input_file(vals.pop("path"), "data.path")
    test_path = vals.pop("test_path", "")
    test_path = ck.input_file(test_path, "data.test_path") if fmt == "svmlight" else None
    if fmt == "svmlight":
        from hpcps.data.svmlight import COMPRESSED
        UNPACK = {".gz": "gunzip", ".bz2": "bunzip2", ".xz": "unxz", ".zst": "unzstd"}

        for key, p in (("data.path", path), ("data.test_path", test_path)):
            if p is not None and p.name.endswith(COMPRESSED):   # workers read byte ranges
                raise ck.error(key, f"{p}: a compressed svmlight file cannot be split into "
                                    f"byte ranges for the workers; decompress it first "
                                    f"(e.g. `{UNPACK[p.suffix]} -k {p.name}`)")
    if fmt == "prepared":
        from hpcps.data.prepared import PreparedError, file_attrs

        try:
            file_attrs(path)
        except PreparedError as e:
            raise ck.error("data.path", str(e)) from None
    return DataConfig(format=fmt, path=path, test_path=test_path, **vals)


# [consistency] keys that only apply to some models; setting them otherwise is an error.
_MODEL_ONLY = {
    "staleness": ("ssp",),
    "n_fetch": ("async",),
    "n_push": ("async",),
    "push_threshold": ("async",),
    "staleness_aware_lr": ("ssp", "async"),
}


def _consistency(ck: _Checker, doc: dict) -> ConsistencyConfig:
    table = _section(ck, doc, "consistency")
    vals = _simple(ck, doc, "consistency")
    for k, models in _MODEL_ONLY.items():
        if k in table and vals["model"] not in models:
            which = " or ".join(repr(m) for m in models)
            raise ck.error(f"consistency.{k}", f"only used with model = {which}, not "
                                               f"{vals['model']!r}; remove it")
    if "rma_fallback" in table and vals["pull"] != "rma":
        raise ck.error("consistency.rma_fallback", f"only used with pull = 'rma', not "
                                                   f"{vals['pull']!r}; remove it")
    return ConsistencyConfig(**vals)


# [optimizer] keys that only apply to some rules; setting them for another is an error.
_RULE_ONLY = {
    "initial_accumulator": ("adagrad",),
    "eps": ("adagrad", "adam"),
    "beta1": ("adam",),
    "beta2": ("adam",),
    "beta": ("ftrl",),
    "l1": ("ftrl",),
    "l2": ("ftrl",),
}


def _optimizer(ck: _Checker, doc: dict) -> OptimizerConfig:
    table = _section(ck, doc, "optimizer")
    vals = _simple(ck, doc, "optimizer")
    for k, rules in _RULE_ONLY.items():
        if k in table and vals["name"] not in rules:
            which = " or ".join(repr(r) for r in rules)
            hint = " (the model's L2 penalty is [model] l2)" if k == "l2" else ""
            raise ck.error(f"optimizer.{k}", f"only used with name = {which}, not "
                                             f"{vals['name']!r}; remove it{hint}")
    return OptimizerConfig(**vals)


_MODEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def _model(ck: _Checker, doc: dict) -> ModelConfig:
    vals = _simple(ck, doc, "model")
    t = vals["type"]
    if t not in MODEL_TYPES and not _MODEL_RE.fullmatch(t):
        msg = (f"must be one of {', '.join(repr(m) for m in MODEL_TYPES)} or a user model "
               f"'package.module:ClassName', got {_show(t)}")
        close = difflib.get_close_matches(t, MODEL_TYPES, n=1)
        if close:
            msg += f" (did you mean '{close[0]}'?)"
        raise ck.error("model.type", msg)
    hidden = vals["hidden"]
    if not hidden or not all(isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 1 << 20
                             for h in hidden):
        raise ck.error("model.hidden", f"must be a non-empty array of layer widths in "
                                       f"[1, 1048576], got {hidden!r}")
    vals["hidden"] = tuple(hidden)
    return ModelConfig(**vals)


def _lbfgs(ck: _Checker, doc: dict, cluster: ClusterConfig, model: ModelConfig) -> LbfgsConfig:
    """``[lbfgs]``, and what ``mode = "sandblaster"`` requires of the other sections."""
    vals = _simple(ck, doc, "lbfgs")
    if cluster.mode != "sandblaster":
        for k in doc.get("lbfgs", {}):
            raise ck.error(f"lbfgs.{k}", f"only used with cluster.mode = 'sandblaster', not "
                                         f"{cluster.mode!r}; remove the [lbfgs] section")
        return LbfgsConfig()
    if not vals["wolfe_c1"] < vals["wolfe_c2"]:
        raise ck.error("lbfgs.wolfe_c2", f"must be > lbfgs.wolfe_c1 = {_show(vals['wolfe_c1'])} "
                                         f"(0 < c1 < c2 < 1), got {_show(vals['wolfe_c2'])}")
    if model.type != "logistic":
        raise ck.error("model.type", f"cluster.mode = 'sandblaster' trains the logistic model "
                                     f"only, got {_show(model.type)}")
    if doc.get("model", {}).get("dtype") == "float32":
        raise ck.error("model.dtype", "cluster.mode = 'sandblaster' keeps its vectors in "
                                      "float64 (L-BFGS); remove the key or set \"float64\"")
    return LbfgsConfig(**vals)


def _elastic(ck: _Checker, doc: dict, cluster: ClusterConfig) -> ElasticConfig:
    """``[elastic]``: only for ``mode = "ps"``; ``at_step`` goes with ``add_workers``."""
    table = _section(ck, doc, "elastic")
    vals = _simple(ck, doc, "elastic")
    if table and cluster.mode != "ps":
        k = next(iter(table))
        raise ck.error(f"elastic.{k}", f"workers are added to parameter-server jobs only "
                                       f"(cluster.mode = 'ps'), not {cluster.mode!r}; remove "
                                       "the [elastic] section")
    if vals["add_workers"] and vals["at_step"] < 1:
        raise ck.error("elastic.at_step", f"required with add_workers = {vals['add_workers']}: "
                                          "the clock (>= 1) at which the workers join")
    if not vals["add_workers"]:
        for k in ("at_step", "oversubscribe"):
            if k in table:
                raise ck.error(f"elastic.{k}", "only used with add_workers >= 1; remove it "
                                               "(hpcps grow --oversubscribe for a request)")
    return ElasticConfig(**vals)


def _fault_tolerance(ck: _Checker, doc: dict, cluster: ClusterConfig,
                     consistency: ConsistencyConfig) -> FaultToleranceConfig:
    """``[fault_tolerance]``: ``replicas`` and ``on_server_loss`` only with mode = 'continue';
    replicas = 2 needs two servers and BSP/SSP; under async a lost range restarts the job."""
    vals = _simple(ck, doc, "fault_tolerance")
    given = doc.get("fault_tolerance", {})
    if vals["mode"] != "continue":
        for k in ("replicas", "on_server_loss"):
            if k in given:
                raise ck.error(f"fault_tolerance.{k}", f"only used with fault_tolerance.mode = "
                                                       f"'continue', not {vals['mode']!r}")
        return FaultToleranceConfig(**vals)
    if vals["replicas"] > 1:
        if cluster.servers < vals["replicas"]:
            raise ck.error("fault_tolerance.replicas",
                           f"{vals['replicas']} copies of every key range need at least "
                           f"{vals['replicas']} servers, got [cluster] servers = {cluster.servers}")
        if consistency.model == "async":
            raise ck.error("fault_tolerance.replicas",
                           "replicas = 2 needs [consistency] model = 'bsp' or 'ssp' (replication "
                           "forwards each aggregated clock), got 'async'")
    if consistency.model == "async":
        if given.get("on_server_loss") == "reload":
            raise ck.error("fault_tolerance.on_server_loss",
                           "'reload' needs [consistency] model = 'bsp' or 'ssp' (a reloaded range "
                           "resumes at a clock), got 'async'; use 'restart'")
        vals["on_server_loss"] = "restart"
    return FaultToleranceConfig(**vals)


def _parse(doc: dict, text: str, path: Path) -> JobConfig:
    ck = _Checker(path)
    ck.unknown_keys(doc, {**_TOP, **_SECTIONS}, "")
    name = ck.value(doc, "name", _TOP["name"], "name")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ck.error("name", "must match [A-Za-z0-9_.-]+ (and not be '.' or '..'), "
                               f"got {_show(name)}")
    seed = ck.value(doc, "seed", _TOP["seed"], "seed")

    cluster = ClusterConfig(**_simple(ck, doc, "cluster"))
    data = _data(ck, doc)
    model = _model(ck, doc)
    optimizer = _optimizer(ck, doc)
    train = TrainConfig(**_simple(ck, doc, "train"))
    consistency = _consistency(ck, doc)
    comm = CommConfig(**_simple(ck, doc, "comm"))
    out_dir = _simple(ck, doc, "output")["dir"] or f"runs/{name}"
    if "\x00" in out_dir:
        raise ck.error("output.dir", f"path contains a NUL character: {out_dir!r}")
    output = OutputConfig(dir=(Path.cwd() / Path(out_dir).expanduser()).resolve())
    evaluate = EvaluateConfig(**_simple(ck, doc, "evaluate"))
    checkpoint = CheckpointConfig(**_simple(ck, doc, "checkpoint"))
    ft = _fault_tolerance(ck, doc, cluster, consistency)
    if ft.mode == "continue":
        if cluster.mode != "ps":
            raise ck.error("fault_tolerance.mode", f"'continue' needs [cluster] mode = 'ps', got "
                                                   f"{cluster.mode!r}")
        if consistency.pull != "p2p":
            raise ck.error("fault_tolerance.mode", "'continue' needs [consistency] pull = 'p2p' "
                                                   "(RMA windows cannot be used after a rank "
                                                   "dies)")
        if consistency.model == "async" and (consistency.n_push != 1 or consistency.push_threshold):
            raise ck.error("fault_tolerance.mode", "'continue' with async needs n_push = 1 and "
                                                   "no push_threshold (a worker must hold no "
                                                   "unpushed gradients when it dies)")
    lbfgs = _lbfgs(ck, doc, cluster, model)
    elastic = _elastic(ck, doc, cluster)
    return JobConfig(name=name, seed=seed, cluster=cluster, data=data, model=model,
                     optimizer=optimizer, train=train, consistency=consistency, comm=comm,
                     output=output, evaluate=evaluate, checkpoint=checkpoint,
                     fault_tolerance=ft, lbfgs=lbfgs, elastic=elastic, path=path.resolve(),
                     text=text)


# ------------------------------------------------------------------------ public API


def parse_job(text: str, path: str | os.PathLike) -> JobConfig:
    """Parse and validate job-file text.

    Parameters
    ----------
    text : str
        TOML text of the job file.
    path : str or os.PathLike
        Path of the job file: used in error messages and as the base directory of
        relative data paths. It need not exist.

    Returns
    -------
    JobConfig
        The validated configuration; ``JobConfig.path`` is `path` made absolute.

    Raises
    ------
    ConfigError
        On a TOML syntax error, an unknown / missing / mistyped / out-of-range key, or a
        missing input file.
    """
    path = Path(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"invalid TOML: {e}") from None
    return _parse(doc, text, path)


def load_job(path: str | os.PathLike) -> JobConfig:
    """Read, parse and validate a job file.

    Parameters
    ----------
    path : str or os.PathLike
        The job file (TOML, UTF-8).

    Returns
    -------
    JobConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        If the file cannot be read, or for any error :func:`parse_job` reports.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(path, None, f"job file not found ({path.absolute()})") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a directory, expected a TOML job file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not valid UTF-8 text: {e}") from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot read job file: {e.strerror or e}") from None
    return parse_job(text, path)


def _display_path(path: Path) -> Path:
    """`path` relative to the working directory if it lies below it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def check_world(cfg: JobConfig, world_size: int) -> None:
    """Check that the MPI world fits the job's cluster layout.

    Parameters
    ----------
    cfg : JobConfig
        The job.
    world_size : int
        Number of MPI ranks.

    Raises
    ------
    ConfigError
        With key ``"cluster.servers"`` unless ``1 <= servers <= world_size - 1`` (at least
        one server and one worker); with ``mode = "sandblaster"`` unless
        ``world_size >= servers + 2`` (also a coordinator).
    TypeError
        If `world_size` is not an int.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    k = cfg.cluster.servers
    where = _display_path(cfg.path)
    if cfg.cluster.mode == "allreduce":
        return  # every rank is a worker; one rank is a valid (serial) run
    if cfg.cluster.mode == "sandblaster":   # coordinator (rank 0) + workers + K servers
        if not world_size >= k + 2:
            raise ConfigError(where, "cluster.servers",
                              f"mode 'sandblaster' needs a coordinator, at least one worker "
                              f"and {k} server(s): at least {k + 2} MPI ranks, got {world_size}")
        return
    if world_size < 2:
        raise ConfigError(where, "cluster.servers",
                          f"world size {world_size} is too small: need at least "
                          f"{k} + 1 = {k + 1} MPI ranks ({k} server(s) + at least 1 worker)")
    if not 1 <= k <= world_size - 1:
        raise ConfigError(where, "cluster.servers",
                          f"{k} server(s) in a world of {world_size} ranks leave "
                          f"{world_size} - {k} = {world_size - k} workers; need "
                          f"1 <= servers <= world size - 1 = {world_size - 1} "
                          f"(or launch at least {k + 1} ranks)")


def check_output_writable(cfg: JobConfig) -> None:
    """Create the output directory (with parents) and check that it is writable.

    Parameters
    ----------
    cfg : JobConfig
        The job; uses ``cfg.output.dir``.

    Raises
    ------
    ConfigError
        With key ``"output.dir"`` if the directory cannot be created or written to.
    """
    d = cfg.output.dir
    where = _display_path(cfg.path)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(where, "output.dir", f"exists and is not a directory: {d}") from None
    except OSError as e:
        raise ConfigError(where, "output.dir",
                          f"cannot create directory {d}: {e.strerror or e}") from None
    try:
        with tempfile.TemporaryFile(dir=d, prefix=".hpcps-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(where, "output.dir",
                          f"directory is not writable: {d}: {e.strerror or e}") from None


def output_note(cfg: JobConfig, cwd: str | os.PathLike | None = None) -> str | None:
    """A note when the job writes outside the working directory, else None. Local.

    The only path of a job file that hpcps writes to is ``[output] dir`` (checkpoints,
    model, metrics all go below it). It is resolved (symbolic links followed) against the
    working directory; when the result does not lie below that directory — an absolute
    path, ``..``, or a link pointing elsewhere — the user should be told where the files
    go before they are written.

    Parameters
    ----------
    cfg : JobConfig
    cwd : path-like, optional
        The working directory (default: the process's).

    Returns
    -------
    str or None
        ``"<job>: output.dir: writing to <dir>, outside the working directory <cwd>"``.
    """
    here = Path(cwd if cwd is not None else Path.cwd()).resolve()
    d = cfg.output.dir.resolve()
    if d == here or here in d.parents:
        return None
    return (f"{_display_path(cfg.path)}: output.dir: writing to {d}, outside the working "
            f"directory {here}")


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_dict(cfg: JobConfig) -> dict[str, Any]:
    """The validated configuration as a plain, JSON-serialisable dict.

    Parameters
    ----------
    cfg : JobConfig
        The job.

    Returns
    -------
    dict
        ``{"name", "seed", "cluster": {...}, "data": {...}, ..., "path"}`` with paths as
        strings. ``data`` also holds the derived ``num_features``; the raw job file text
        (``cfg.text``) is left out.
    """
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "text"}
    out = {k: _plain(dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
           for k, v in d.items()}
    out["data"]["num_features"] = cfg.data.num_features
    return out
