"""The coordinator's L-BFGS (no MPI): scalars here, vectors on the servers.

Nocedal & Wright, *Numerical Optimization*, 2nd ed. (2006): the two-loop recursion
(Algorithm 7.4) for the direction ``d = -H_k g_k``, L-BFGS (Algorithm 7.5) with the initial
matrix ``H_k⁰ = γ_k I``, ``γ_k = s·y / y·y`` of the newest pair (eq. 7.20), and a strong Wolfe
line search (:mod:`hpcps.sandblaster.linesearch`). As in Sandblaster (Dean et al., NIPS 2012,
§4.2) the coordinator keeps only scalars — ``ρ_i = 1 / (y_i · s_i)``, ``γ``, the objective —
and drives the servers, which hold ``x``, ``g``, ``d`` and the pairs ``(s_i, y_i)``, through
programs (:mod:`hpcps.sandblaster.program`) run by a *machine*:

``machine.run(program) -> Reply``
    runs the program on every shard and returns the summed and maximised results, and for an
    ``EVAL`` the workers' summed log-loss; ``machine.n_rows`` is the number of training rows.
    :class:`hpcps.sandblaster.local.LocalMachine` runs in one process (tests);
    :mod:`hpcps.sandblaster.run` sends the programs over MPI.

Each two-loop step needs the dot product the previous step's axpy changed, so a direction
costs ``2m + 1`` round trips to the servers (m = pairs held); a line-search trial costs one
evaluation (parameters out to the workers, work units, gradients back) and the pair update
one more round trip.

Objective: ``F(w, b) = (1/n) Σ_i logloss(y_i, b + x_i·w) + (l2/2) ||w||²`` — the same
minimiser as scikit-learn's ``LogisticRegression(C = 1/(l2 n))``, which minimises
``C Σ_i logloss + ½||w||²`` = ``F / l2`` (bias not penalised in either).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from hpcps.sandblaster.linesearch import strong_wolfe
from hpcps.sandblaster.program import EVAL_MAXES, EVAL_SUMS, Program

#: Fixed slots: parameters, gradient, direction, trial point, trial gradient.
X, G, D, XT, GT = range(5)


def s_slot(i: int) -> int:
    """Slot of history vector ``s`` number ``i`` (0 <= i < m)."""
    return 5 + 2 * i


def y_slot(i: int) -> int:
    """Slot of history vector ``y`` number ``i`` (0 <= i < m)."""
    return 6 + 2 * i


def n_slots(m: int) -> int:
    """Number of vector slots a server needs for history ``m``: ``5 + 2m``."""
    return 5 + 2 * int(m)


@dataclass
class Reply:
    """A program's results.

    Attributes
    ----------
    sums : float64 (n_sums,)
        Summed over shards: one per ``DOT``, then ``EVAL``'s three.
    maxes : float64 (n_maxes,)
        Maximised over shards (``EVAL``: max |g|, stop flag).
    loss_sum : float
        ``EVAL``: summed log-loss over all training rows (0 otherwise).
    stop : bool
        A rank asked to stop (signal).
    """

    sums: np.ndarray
    maxes: np.ndarray
    loss_sum: float = 0.0
    stop: bool = False


@dataclass
class Evaluation:
    """The objective at one point: ``f``, ``df = g·d``, ``gg = g·g``, ``gmax = max|g|``."""

    f: float
    df: float
    gg: float
    gmax: float


@dataclass
class LbfgsResult:
    """Outcome of :meth:`LBFGS.run`.

    Attributes
    ----------
    status : str
        ``"gradient"`` (max |g| <= tolerance), ``"f_tolerance"``, ``"max_iterations"``,
        ``"line_search_failed"`` or ``"stopped"`` (a stop signal).
    objective : float
        ``F`` at the final point (slot ``X`` on the servers).
    grad_max : float
        ``max |∇F|`` there.
    iterations, evaluations, round_trips : int
        L-BFGS iterations, objective evaluations (each one pass over all work units), and
        programs sent to the servers.
    history : list of dict
        Per iteration: ``iteration``, ``objective``, ``grad_max``, ``step``, ``evaluations``,
        ``line_search`` (status), ``seconds`` (since the start).
    seconds : float
    """

    status: str
    objective: float
    grad_max: float
    iterations: int
    evaluations: int
    round_trips: int
    history: list = field(default_factory=list)
    seconds: float = 0.0


class LBFGS:
    """L-BFGS driven from the coordinator.

    Parameters
    ----------
    machine : object
        ``run(Program) -> Reply`` and ``n_rows`` (see module docstring). Slot ``X`` holds the
        starting point (zeros on fresh servers).
    history : int
        Pairs kept, ``m >= 1``.
    max_iterations : int
    tolerance : float
        Stop when ``max |∇F| <= tolerance``.
    f_tolerance : float
        Stop when an iteration lowers ``F`` by at most ``f_tolerance * max(|F|, 1)``.
    c1, c2 : float
        Strong Wolfe constants.
    max_evals : int
        Evaluations per line search.
    on_iteration : callable(dict) or None
        Called with each history record.
    """

    def __init__(self, machine, history: int = 10, max_iterations: int = 500,
                 tolerance: float = 1e-6, f_tolerance: float = 1e-12, c1: float = 1e-4,
                 c2: float = 0.9, max_evals: int = 20, on_iteration=None):
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.machine = machine
        self.m = int(history)
        self.max_iterations = int(max_iterations)
        self.tolerance = float(tolerance)
        self.f_tolerance = float(f_tolerance)
        self.c1, self.c2, self.max_evals = float(c1), float(c2), int(max_evals)
        self.on_iteration = on_iteration
        self.inv_n = 1.0 / machine.n_rows
        self.pairs: list = []          # [(i, rho_i)], oldest first; vectors in slots of i
        self.free = list(range(self.m))
        self.gamma = 1.0
        self.round_trips = 0
        self.evaluations = 0
        self.reevaluations = 0         # accepted steps evaluated again (not the last trial)
        self.stop_requested = False
        self.last: Evaluation | None = None

    @classmethod
    def from_config(cls, machine, cfg, on_iteration=None) -> "LBFGS":
        """Build from a :class:`hpcps.config.LbfgsConfig`."""
        return cls(machine, cfg.history, cfg.max_iterations, cfg.tolerance, cfg.f_tolerance,
                   cfg.wolfe_c1, cfg.wolfe_c2, cfg.line_search_max_evals, on_iteration)

    # -- talking to the servers -----------------------------------------------------

    def _run(self, prog: Program) -> Reply:
        self.round_trips += 1
        reply = self.machine.run(prog)
        self.stop_requested |= bool(reply.stop)
        return reply

    def _evaluate(self, prog: Program) -> Evaluation:
        """Run ``prog`` (ending with an ``EVAL``) and read the objective from the reply."""
        r = self._run(prog)
        self.evaluations += 1
        pen, df, gg = (float(v) for v in r.sums[-EVAL_SUMS:])
        gmax = float(r.maxes[-EVAL_MAXES])
        self.last = Evaluation(r.loss_sum * self.inv_n + pen, df, gg, gmax)
        return self.last

    def _trial(self, t: float) -> Evaluation:
        """Objective at ``x + t d`` (into slots ``XT``, ``GT``)."""
        return self._evaluate(Program().lincomb(X, t, D, XT).eval(XT, GT, D, self.inv_n))

    def direction(self) -> float:
        """Set ``d = -H g`` on the servers with the two-loop recursion (N&W Algorithm 7.4);
        return ``g · d``."""
        if not self.pairs:
            return float(self._run(Program().copy(G, D).scale(-1.0, D).dot(G, D)).sums[0])
        k = len(self.pairs)
        alpha = [0.0] * k
        prog = Program().copy(G, D)                           # q = g
        for j in reversed(range(k)):                          # newest to oldest
            i, rho = self.pairs[j]
            alpha[j] = rho * float(self._run(prog.dot(s_slot(i), D)).sums[0])
            prog = Program().axpy(-alpha[j], y_slot(i), D)    # q -= alpha_j y_j
        prog.scale(self.gamma, D)                             # r = H0 q
        for j in range(k):                                    # oldest to newest
            i, rho = self.pairs[j]
            beta = rho * float(self._run(prog.dot(y_slot(i), D)).sums[0])
            prog = Program().axpy(alpha[j] - beta, s_slot(i), D)   # r += s_j (alpha_j - beta)
        return float(self._run(prog.scale(-1.0, D).dot(G, D)).sums[0])

    def _update(self) -> None:
        """Accept the trial point: store ``s = xt - x``, ``y = gt - g``, then ``x, g = xt, gt``
        (slot swaps). The pair is kept only if ``s · y > ε y · y`` (curvature)."""
        if not self.free:
            self.free.append(self.pairs.pop(0)[0])            # overwrite the oldest pair
        i = self.free.pop(0)
        r = self._run(Program().lincomb(XT, -1.0, X, s_slot(i)).lincomb(GT, -1.0, G, y_slot(i))
                      .dot(s_slot(i), y_slot(i)).dot(y_slot(i), y_slot(i))
                      .swap(X, XT).swap(G, GT))
        sy, yy = float(r.sums[0]), float(r.sums[1])
        if sy > 1e-12 * yy and yy > 0.0 and math.isfinite(sy):
            self.pairs.append((i, 1.0 / sy))
            self.gamma = sy / yy
        else:
            self.free.append(i)

    def _reset(self) -> None:
        self.free = sorted(self.free + [i for i, _ in self.pairs])
        self.pairs = []
        self.gamma = 1.0

    # -- the iteration --------------------------------------------------------------

    def run(self) -> LbfgsResult:
        """Minimise from the point in slot ``X``; leave the result in slot ``X``.

        Returns
        -------
        LbfgsResult
        """
        t_start = time.perf_counter()
        cur = self._evaluate(Program().eval(X, G, G, self.inv_n))
        f, gmax = cur.f, cur.gmax
        history = []
        status = None
        k = 0
        while status is None:
            if not math.isfinite(f):
                raise FloatingPointError(f"the objective is {f} at iteration {k}")
            if gmax <= self.tolerance:
                status = "gradient"
                break
            if k >= self.max_iterations:
                status = "max_iterations"
                break
            if self.stop_requested:
                status = "stopped"
                break
            df0 = self.direction()
            if not (df0 < 0.0 and math.isfinite(df0)):     # not a descent direction: restart
                self._reset()
                df0 = self.direction()
            gnorm = math.sqrt(-df0) if not self.pairs else 0.0
            t1 = 1.0 if self.pairs else min(1.0, 1.0 / gnorm)
            ls = strong_wolfe(lambda t: (lambda e: (e.f, e.df))(self._trial(t)), f, df0, t1,
                              self.c1, self.c2, self.max_evals)
            if ls.status == "failed":
                if self.pairs:                              # retry once along -g
                    self._reset()
                    continue
                status = "line_search_failed"
                break
            if not ls.last:                                 # trial slots hold another step
                self.reevaluations += 1
                self._trial(ls.t)
            self._update()
            f_old, f, gmax = f, ls.f, self.last.gmax
            k += 1
            rec = {"iteration": k, "objective": f, "grad_max": gmax, "step": ls.t,
                   "evaluations": self.evaluations, "line_search": ls.status,
                   "seconds": time.perf_counter() - t_start}
            history.append(rec)
            if self.on_iteration is not None:
                self.on_iteration(rec)
            if gmax <= self.tolerance:
                status = "gradient"
            elif f_old - f <= self.f_tolerance * max(abs(f_old), abs(f), 1.0):
                status = "f_tolerance"
        return LbfgsResult(status, f, gmax, k, self.evaluations, self.round_trips, history,
                           time.perf_counter() - t_start)
