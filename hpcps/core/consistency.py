"""Consistency models as objects that the server and worker loops consult (no MPI).

Clocks
    A worker's clock ``c`` counts the steps it has finished. A server's *clock* ``C`` is the
    largest value such that every worker's updates of clocks ``< C`` have been applied (under
    BSP/SSP it is also the number of aggregated steps applied). A shard's *version* counts
    the updates applied to it: one per clock under BSP/SSP (so version = clock), one per
    arriving push under asynchronous training.

Staleness
    Every push carries the version of the shard that its gradient was computed on (the
    version the worker read); when the server applies it, ``staleness = version at apply -
    version read``. Under BSP it is always 0; under SSP at most ``s`` (in clocks); under
    Downpour it counts the other pushes applied in between (in updates, as in Zhang et al.,
    IJCAI 2016, §3).

Shard header
    Each shard carries an int64 header (in its RMA window, or sent after a p2p pull reply):
    ``[version, clock, seq, n_workers, clock of worker 0, ..., clock of worker N-1]``,
    padded to a multiple of 8 entries. Readers check freshness with it. ``seq`` is the write
    sequence word: odd while the server writes the shard, bumped before and after every
    write (BSP/SSP: one clock's update of the shard; async: one push), so RMA readers can
    tell a whole write from a half-done one (:mod:`hpcps.comm.rma`).

Policies
    :class:`BSP`, :class:`SSP` and :class:`Async`; each tells a worker how fresh a read must
    be (:meth:`read_floor`), when to fetch and push (:meth:`fetch_due`, :meth:`push_due`),
    and tells the server whether pushes are held and aggregated per clock (``aggregate``).
"""

from __future__ import annotations

import numpy as np

MODELS = ("bsp", "ssp", "async")

# shard header layout (int64 entries): the shard's version and clock, the last push sequence,
# the number of workers, and the slowest and the fastest worker's clock as the server last
# saw them (advisory: progress lines and the lead over the slowest worker)
H_VERSION, H_CLOCK, H_SEQ, H_NWORKERS, H_SLOWEST, H_FASTEST = range(6)
#: Entries of a shard header (int64), padded to 64 bytes.
SHARD_HEADER_LEN = 8


def header_len(n_workers: int) -> int:
    """Entries of a shard header: :data:`SHARD_HEADER_LEN` whatever ``n_workers``.

    The header carried every worker's clock until 2026-12-03: 8 B per worker in every pull
    reply and RMA read, which at 1,024 workers made each reply's header 8 KiB (a server's
    replies 8 MiB per BSP step) against the ~100 B of rows a worker pulls from each of 128
    servers. It now carries the slowest and the fastest clock only."""
    return SHARD_HEADER_LEN


class Policy:
    """Base of the consistency policies (see the module docstring).

    Attributes
    ----------
    name : str
    staleness : int or None
        Bound on how many clocks old a read may be (``None`` = unbounded).
    aggregate : bool
        Servers hold the pushes of each clock and apply them, merged in worker order, once
        every worker has finished that clock (BSP/SSP); otherwise pushes are applied on
        arrival.
    n_fetch, n_push : int
        Fetch parameters every ``n_fetch`` steps; push every ``n_push`` steps.
    staleness_aware_lr : bool
        Servers divide an update's step by ``staleness + 1`` (Zhang et al., IJCAI 2016, §4).
    push_threshold : float
        Push filter threshold (0 = every entry is pushed).
    """

    name = "?"
    staleness: int | None = 0
    aggregate = True
    n_fetch = 1
    n_push = 1
    staleness_aware_lr = False
    push_threshold = 0.0

    @property
    def bsp(self) -> bool:
        """True when the workers run in lockstep: pushes aggregated per clock and staleness 0
        (BSP, or SSP with bound 0). The servers then answer a clock's pulls once it is
        complete, and the workers may agree with a blocking collective every step."""
        return bool(self.aggregate and self.staleness == 0)

    def read_floor(self, clock: int) -> int:
        """Smallest server clock a read made at worker clock ``clock`` may see."""
        raise NotImplementedError

    def fresh(self, header: np.ndarray, clock: int) -> bool:
        """True if a shard ``header`` is fresh enough for a read at worker clock ``clock``."""
        return int(header[H_CLOCK]) >= self.read_floor(clock)

    def pull_ready(self, server_clock: int, pull_clock: int) -> bool:
        """True when a pull made at worker clock ``pull_clock`` may be answered."""
        return server_clock >= self.read_floor(pull_clock)

    def fetch_due(self, step: int) -> bool:
        """True if the worker fetches parameters before step ``step`` of an epoch."""
        return step % self.n_fetch == 0

    def push_due(self, step: int) -> bool:
        """True if the worker pushes its accumulated gradients after step ``step``."""
        return (step + 1) % self.n_push == 0

    def describe(self) -> str:
        return self.name.upper()


class BSP(Policy):
    """Bulk Synchronous Parallel (Valiant, CACM 1990): the pull for clock ``t + 1`` sees
    exactly the updates of every worker's clock ``t`` and nothing newer.

    Servers hold each clock's pushes until every worker has clocked, then apply them as one
    aggregated step (so BSP equals minibatch SGD on the concatenated minibatches).
    """

    name = "bsp"
    staleness = 0
    aggregate = True

    def read_floor(self, clock: int) -> int:
        return clock


class SSP(Policy):
    """Stale Synchronous Parallel with bound ``s`` (Ho et al., NIPS 2013, §2).

    A worker at clock ``c`` proceeds only when every worker has finished clock ``c - s - 1``,
    and what it reads includes every update of clocks ``< c - s`` (it may include newer
    ones). Servers aggregate per clock exactly as under BSP, in worker order, so ``s = 0``
    gives bit-identical results to BSP. Not implemented: read-my-writes (a worker does not
    see its own pushes of the last ``s`` clocks unless the servers have applied them).

    Parameters
    ----------
    staleness : int
        The bound ``s`` (>= 0).
    staleness_aware_lr : bool

    Raises
    ------
    ValueError
        If ``staleness`` is negative.
    """

    name = "ssp"
    aggregate = True

    def __init__(self, staleness: int, staleness_aware_lr: bool = False):
        if staleness < 0:
            raise ValueError(f"SSP staleness bound must be >= 0, got {staleness}")
        self.staleness = int(staleness)
        self.staleness_aware_lr = bool(staleness_aware_lr)

    def read_floor(self, clock: int) -> int:
        return clock - self.staleness

    def describe(self) -> str:
        return f"SSP(s={self.staleness})"


class Async(Policy):
    """Asynchronous Downpour SGD (Dean et al., NIPS 2012, §4.1).

    A worker fetches the parameters it needs every ``n_fetch`` steps (for the next
    ``n_fetch`` minibatches at once), computes gradients on that copy, accumulates them and
    pushes every ``n_push`` steps; servers apply each push on arrival (AdaGrad by default, as
    in the paper). Reads are never held back, and reads through RMA may be torn across rows.

    Parameters
    ----------
    n_fetch, n_push : int
        >= 1.
    staleness_aware_lr : bool
    push_threshold : float
        >= 0; see :class:`hpcps.worker.steps.PushFilter`.

    Raises
    ------
    ValueError
        For ``n_fetch`` or ``n_push`` < 1 or a negative threshold.
    """

    name = "async"
    staleness = None
    aggregate = False

    def __init__(self, n_fetch: int = 1, n_push: int = 1, staleness_aware_lr: bool = False,
                 push_threshold: float = 0.0):
        if n_fetch < 1 or n_push < 1:
            raise ValueError(f"n_fetch and n_push must be >= 1, got {n_fetch} and {n_push}")
        if not push_threshold >= 0:
            raise ValueError(f"push_threshold must be >= 0, got {push_threshold}")
        self.n_fetch = int(n_fetch)
        self.n_push = int(n_push)
        self.staleness_aware_lr = bool(staleness_aware_lr)
        self.push_threshold = float(push_threshold)

    def read_floor(self, clock: int) -> int:
        return -1

    def describe(self) -> str:
        return f"ASYNC(n_fetch={self.n_fetch}, n_push={self.n_push})"


def make_policy(name: str, **options) -> Policy:
    """Return the consistency policy named in the job file.

    Parameters
    ----------
    name : {"bsp", "ssp", "async"}
    **options
        ``staleness`` (ssp), ``n_fetch``, ``n_push``, ``push_threshold`` (async),
        ``staleness_aware_lr`` (ssp, async); options a model does not use are ignored.

    Raises
    ------
    ValueError
        For an unknown model name or an invalid option value.
    """
    if name == "bsp":
        return BSP()
    if name == "ssp":
        return SSP(options.get("staleness", 0), options.get("staleness_aware_lr", False))
    if name == "async":
        return Async(options.get("n_fetch", 1), options.get("n_push", 1),
                     options.get("staleness_aware_lr", False),
                     options.get("push_threshold", 0.0))
    raise ValueError(f"unknown consistency model {name!r}; valid: {', '.join(MODELS)}")


def policy_from_config(c) -> Policy:
    """The policy of a :class:`hpcps.config.ConsistencyConfig`."""
    return make_policy(c.model, staleness=c.staleness, n_fetch=c.n_fetch, n_push=c.n_push,
                       staleness_aware_lr=c.staleness_aware_lr, push_threshold=c.push_threshold)


class StalenessHistogram:
    """Counts of the staleness of applied updates (no MPI).

    Values ``0 .. BINS - 2`` are counted exactly; larger ones in the last bin. The exact sum
    and maximum are kept as well, so the mean and maximum are exact.
    """

    BINS = 256

    def __init__(self):
        self.counts = np.zeros(self.BINS, dtype=np.int64)
        self.total = 0
        self.maximum = 0

    def add(self, staleness: int, n: int = 1) -> None:
        """Record ``n`` updates of the given staleness (>= 0)."""
        s = int(staleness)
        if s < 0:
            raise ValueError(f"staleness must be >= 0, got {s}")
        self.counts[min(s, self.BINS - 1)] += n
        self.total += s * n
        self.maximum = max(self.maximum, s)

    def row(self) -> np.ndarray:
        """float64 ``(BINS + 2,)``: counts, sum, max (to gather over ranks)."""
        return np.concatenate([self.counts.astype(np.float64), [self.total, self.maximum]])

    @classmethod
    def merge_rows(cls, rows) -> dict:
        """Summary of gathered :meth:`row` rows.

        Returns
        -------
        dict
            ``{"updates", "mean", "max", "histogram": {staleness: count}}`` (the last key
            of the histogram, ``">=BINS-1"``, collects larger values).
        """
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, cls.BINS + 2)
        counts = rows[:, :cls.BINS].sum(axis=0).astype(np.int64)
        n = int(counts.sum())
        total = float(rows[:, cls.BINS].sum())
        hist = {str(i): int(c) for i, c in enumerate(counts[:-1]) if c}
        if counts[-1]:
            hist[f">={cls.BINS - 1}"] = int(counts[-1])
        return {"updates": n, "mean": total / n if n else 0.0,
                "max": int(rows[:, cls.BINS + 1].max()) if rows.size else 0,
                "histogram": hist}


def format_histogram(summary: dict, width: int = 40, most: int = 16) -> list[str]:
    """Text lines of a staleness histogram summary (``StalenessHistogram.merge_rows``): one per
    staleness value, or with more than ``most`` values (async with many workers: a trial at 60
    workers printed 86 lines) one per power-of-two range (``0``, ``1``, ``2-3``, ``4-7``, ...)."""
    hist = summary.get("histogram", {})
    if not hist:
        return []
    if len(hist) > most:
        binned: dict = {}
        for k, v in hist.items():
            if k.startswith(">="):
                label = k
            else:
                lo = 1 << (int(k).bit_length() - 1) if int(k) else 0
                hi = max(lo, 2 * lo - 1)
                label = str(lo) if lo == hi else f"{lo}-{hi}"
            binned[label] = binned.get(label, 0) + v
        hist = binned
    peak = max(hist.values())
    return [f"    {k:>7}: {v:>9,} {'#' * max(1, round(width * v / peak))}" for k, v in hist.items()]
