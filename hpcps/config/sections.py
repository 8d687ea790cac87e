"""The job file's sections as frozen dataclasses, each key's default and constraint written
once (in the field, :func:`key`), and :data:`SECTIONS`, the rule table the checker
(:mod:`hpcps.config.schema`) derives from them. No I/O, no MPI.

Allowed values come from the modules that implement them: optimizer names from
:mod:`hpcps.core.optim`, consistency models from :mod:`hpcps.core.consistency`, built-in
models from :mod:`hpcps.models`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcps.config.keys import REQUIRED, Rule, key, rules_of  # noqa: F401  (Rule, REQUIRED: re-exported)
from hpcps.core.consistency import MODELS as CONSISTENCY_MODELS
from hpcps.core.optim import RULES as OPTIMIZERS
from hpcps.models import BUILTIN as _BUILTIN_MODELS

#: Supported ``data.format`` values.
DATA_FORMATS = ("adult_csv", "svmlight", "prepared", "criteo")
#: Supported ``data.on_bad_line`` values (streamed svmlight and Criteo data).
BAD_LINE_MODES = ("error", "skip")
#: Built-in ``model.type`` values (a user model is named ``"package.module:ClassName"``).
MODEL_TYPES = tuple(_BUILTIN_MODELS)
#: Supported ``cluster.mode`` values.
CLUSTER_MODES = ("ps", "allreduce", "sandblaster")
#: Supported ``model.dtype`` values.
DTYPES = ("float32", "float64")
#: Supported table storages: a fixed array over the key space, or a dynamic hash table
#: holding only the keys pushed (:mod:`hpcps.core.dyntables`).
STORAGES = ("array", "hash")
#: Supported ``consistency.pull`` values.
PULL_MODES = ("p2p", "rma")
#: Supported ``data.duplicate_indices`` values (svmlight).
DUPLICATE_MODES = ("error", "sum")
#: Supported ``fault_tolerance.mode`` values.
FT_MODES = ("restart", "continue")
#: Supported ``fault_tolerance.on_server_loss`` values.
SERVER_LOSS = ("reload", "restart")

#: The id space of a dynamic table without a declared size (svmlight without
#: ``n_features``): ids in ``[0, 2**63 - 1)`` (the svmlight reader's int64 bound).
DYNAMIC_KEYS = (1 << 63) - 1

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

    mode: str = key("ps", choices=CLUSTER_MODES)
    servers: int = key(1, lo=1)


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
        Absolute path of the svmlight or Criteo test data (streamed data: a file, a
        directory or a glob, like ``path``); ``None`` for ``adult_csv``.
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
        ``adult_csv`` and ``criteo``: the hashed feature space has ``2**hash_bits``
        features (the sparse table's size); Criteo's 39 fields are hashed into it. ``0``:
        no buckets, every feature keeps its own 63-bit id (needs ``storage = "hash"``, a
        dynamic table; the default there).
    numeric_bins : int
        ``adult_csv``: number of quantile bins for numeric columns.
    crosses : bool
        ``adult_csv``: add pairwise feature crosses.
    stream : bool or None
        svmlight and criteo: read the data through the streaming reader
        (:mod:`hpcps.data.lines`) instead of loading each worker's partition; absent: streamed
        when a file is gzip- or zstd-compressed or the data files add up to more than
        ``stream_above_mb`` MB.
    stream_above_mb : int
        Size (MB, 10**6 bytes) above which the data streams when ``stream`` is absent.
    prefetch : int
        Streaming: read units (of ``shuffle_buffer`` lines) the reader thread parses ahead.
    shuffle_buffer : int
        Streaming: lines per read unit; with ``[train] shuffle`` the epoch's order permutes
        the lines within consecutive blocks of this many lines.
    on_bad_line : str
        Streaming: a malformed line stops the job naming its file and line (``"error"``) or
        is dropped and counted (``"skip"``).
    """

    format: str = key(kind=str, choices=DATA_FORMATS)
    path: Path = key(kind=str)
    test_path: Path | None = key(None, kind=str)
    index_base: int | None = key(None, kind=int, choices=(0, 1))
    n_features: int | None = key(None, kind=int, lo=1)
    duplicate_indices: str = key("error", choices=DUPLICATE_MODES)
    test_fraction: float = key(0.2, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    split_seed: int = key(0, lo=0)
    max_rows: int = key(0, lo=0)
    hash_bits: int = key(20, lo=0, hi=40)
    numeric_bins: int = key(8, lo=2, hi=256)
    crosses: bool = key(True)
    stream: bool | None = key(None, kind=bool)
    stream_above_mb: int = key(1024, lo=1)
    prefetch: int = key(4, lo=1, hi=64)
    shuffle_buffer: int = key(65536, lo=1, hi=1 << 26)
    on_bad_line: str = key("error", choices=BAD_LINE_MODES)

    @property
    def num_features(self) -> int:
        """int : Number of model features (``n_features`` or ``2**hash_bits``)."""
        if self.format == "svmlight":
            # no n_features: ids of a dynamic table, anything below 2**63 - 1
            return int(self.n_features) if self.n_features is not None else DYNAMIC_KEYS
        if self.format == "criteo":
            from hpcps.data.criteo import n_features

            return n_features(self.hash_bits)
        if self.format == "prepared":
            from hpcps.data.prepared import file_attrs

            return int(file_attrs(self.path).get("n_features", 0))
        return DYNAMIC_KEYS if self.hash_bits == 0 else 2**self.hash_bits


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
    storage : str
        Default storage of the model's *sparse* tables: ``"array"`` (a fixed array over the
        key space ``[0, num_keys)``) or ``"hash"`` (a dynamic table: any id in
        ``[0, 2**63 - 1)``, only the keys pushed are stored; docs/dynamic_tables.md).
        ``[tables.NAME] storage`` overrides it per table. Dense tables are always arrays.
    """

    type: str = key("logistic")
    l2: float = key(0.0, lo=0.0)
    dtype: str = key("float32", choices=DTYPES)
    factors: int = key(32, lo=1, hi=65536)
    hidden: tuple = key((256, 128), kind=list)
    init_scale: float = key(0.1, lo=0.0)
    options: dict = key(factory=dict, kind=dict)
    storage: str = key("array", choices=STORAGES)


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

    name: str = key("adagrad", choices=OPTIMIZERS)
    learning_rate: float = key(0.1, lo=0.0, lo_open=True)
    initial_accumulator: float = key(0.1, lo=0.0)
    eps: float = key(1e-8, lo=0.0, lo_open=True)
    beta1: float = key(0.9, lo=0.0, hi=1.0, hi_open=True)
    beta2: float = key(0.999, lo=0.0, hi=1.0, hi_open=True)
    beta: float = key(1.0, lo=0.0)
    l1: float = key(0.0, lo=0.0)
    l2: float = key(0.0, lo=0.0)


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

    epochs: int = key(5, lo=1)
    batch_size: int = key(256, lo=1)
    shuffle: bool = key(True)
    max_steps: int = key(0, lo=0)
    progress_seconds: float = key(5.0, lo=0.0, lo_open=True)
    max_nonfinite_steps: int = key(0, lo=0)


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

    model: str = key("bsp", choices=CONSISTENCY_MODELS)
    staleness: int = key(0, lo=0, hi=1_000_000)
    pull: str = key("p2p", choices=PULL_MODES)
    n_fetch: int = key(1, lo=1, hi=1_000_000)
    n_push: int = key(1, lo=1, hi=1_000_000)
    staleness_aware_lr: bool = key(False)
    push_threshold: float = key(0.0, lo=0.0)
    rma_fallback: bool = key(False)


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    """``[comm]``: communication.

    Attributes
    ----------
    max_message_bytes : int
        Messages larger than this are split into chunks (>= 1024).
    fuse_steps : bool
        Under BSP, and async fetching and pushing every step, with p2p pulls a worker sends
        each server one request per step: its pushes, its clock and the next step's pulls
        (:meth:`hpcps.worker.client.PSClient.pull_next`; under BSP the same model bit for
        bit). False: two (the pulls apart), as before issue 20.
    aggregate : str
        ``"off"``, or ``"node"``: the workers of one node form groups that send their steps
        together, one member of each group to each server (:mod:`hpcps.comm.group`), so that
        a server handles one request per group and step instead of one per worker; the same
        model bit for bit. BSP with p2p pulls and ``[cluster] mode = "ps"`` only, not with
        ``[fault_tolerance] mode = "continue"`` or ``[elastic]``.
    group_workers : int
        With ``aggregate = "node"``: at most this many workers per group (0: all of a
        node's workers; >= 2 splits a node's workers, in worker order, into groups of that
        many).
    """

    max_message_bytes: int = key(1073741824, lo=1024)
    fuse_steps: bool = key(True)
    aggregate: str = key("off", choices=("off", "node"))
    group_workers: int = key(0, lo=0)


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """``[output]``: where results go.

    Attributes
    ----------
    dir : pathlib.Path
        Absolute output directory (job file value resolved against the working
        directory; default ``runs/<name>``).
    """

    dir: Path = key(kind=str, toml_default="")


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

    sklearn_baseline: bool = key(False)
    max_auc_gap: float = key(0.005, lo=0.0)


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

    every_steps: int = key(0, lo=0)
    every_seconds: float = key(0.0, lo=0)
    keep: int = key(3, lo=1)
    at_end: bool = key(True)


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

    mode: str = key("restart", choices=FT_MODES)
    replicas: int = key(1, lo=1, hi=2)
    on_server_loss: str = key("reload", choices=SERVER_LOSS)


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

    history: int = key(10, lo=1, hi=1000)
    max_iterations: int = key(500, lo=1)
    tolerance: float = key(1e-6, lo=0.0)
    f_tolerance: float = key(1e-12, lo=0.0)
    work_units: int = key(64, lo=1, hi=1 << 40)
    wolfe_c1: float = key(1e-4, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    wolfe_c2: float = key(0.9, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    line_search_max_evals: int = key(20, lo=1, hi=1000)


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
        otherwise leave every rank waiting in ``MPI_Comm_spawn``. An added worker that has
        not joined within it ends itself (``hpcps join --deadline``).
    """

    add_workers: int = key(0, lo=0, hi=4096)
    at_step: int = key(0, lo=0)
    oversubscribe: bool = key(False)
    join_timeout: float = key(300.0, lo=0.0, lo_open=True)


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
    tables : dict of str -> dict
        ``[tables.NAME]``: each named table's ``storage`` (``"array"`` or ``"hash"``) and,
        for a dynamic table, ``min_count``, ``ttl_steps``, ``max_keys``, ``evict``
        (:class:`hpcps.core.tables.TableSpec`); the tables not named use ``[model]
        storage`` (sparse) or ``"array"`` (dense).
    """

    name: str = key(kind=str)
    seed: int = key(0, lo=0)
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
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    lbfgs: LbfgsConfig = field(default_factory=LbfgsConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    path: Path
    text: str
    tables: dict = field(default_factory=dict)

    def storage_of(self, name: str, sparse: bool) -> str:
        """The storage of table ``name``: ``[tables.NAME] storage``, else ``[model]
        storage`` for a sparse table, else ``"array"``."""
        if name in self.tables:
            return self.tables[name]["storage"]
        return self.model.storage if sparse else "array"

    @property
    def any_hash(self) -> bool:
        """True when some table may be dynamic (``storage = "hash"`` anywhere)."""
        return self.model.storage == "hash" or any(t["storage"] == "hash"
                                                   for t in self.tables.values())




#: The sections of a job file: name -> dataclass.
SECTION_CLASSES = {
    "cluster": ClusterConfig, "data": DataConfig, "model": ModelConfig,
    "optimizer": OptimizerConfig, "train": TrainConfig, "consistency": ConsistencyConfig,
    "comm": CommConfig, "output": OutputConfig, "checkpoint": CheckpointConfig,
    "fault_tolerance": FaultToleranceConfig, "evaluate": EvaluateConfig,
    "lbfgs": LbfgsConfig, "elastic": ElasticConfig,
}
#: Top-level keys (above the first ``[section]``).
TOP: dict[str, Rule] = rules_of(JobConfig)
#: Every section's keys: section -> key -> :class:`Rule`.
SECTIONS: dict[str, dict[str, Rule]] = {s: rules_of(c) for s, c in SECTION_CLASSES.items()}


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
