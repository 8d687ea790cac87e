"""Strong Wolfe line search (no MPI): Nocedal & Wright, *Numerical Optimization*, 2nd ed.
(2006), Algorithm 3.5 (bracketing) and Algorithm 3.6 (zoom) with safeguarded cubic
interpolation (eq. 3.59).

Along a direction ``d`` from ``x`` the search works on ``φ(t) = F(x + t d)`` and
``φ'(t) = ∇F(x + t d) · d``; it looks for a step ``t > 0`` with

* sufficient decrease: ``φ(t) <= φ(0) + c1 t φ'(0)``, and
* the strong curvature condition: ``|φ'(t)| <= c2 |φ'(0)|``,

``0 < c1 < c2 < 1``. One call of ``phi(t)`` returns both ``φ(t)`` and ``φ'(t)`` because in
Sandblaster each is one distributed evaluation (parameters to the workers, work units,
gradients back to the servers) that yields both at once. The accepted step is always the one
evaluated *last* — the servers' trial slots then hold its point and gradient — except when
the search runs out of evaluations: it then returns the best sufficient-decrease step seen
(``status = "armijo"``) and says whether that was the last one evaluated.

scipy's ``scipy.optimize.line_search`` implements the same algorithm but on vectors it holds
itself (it forms ``x + t d`` and the dot products), which here live on the servers; this
scalar version is therefore written out and tested against the conditions and against scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LineSearchResult:
    """Outcome of :func:`strong_wolfe`.

    Attributes
    ----------
    t : float
        The step (0.0 when ``status == "failed"``).
    f, df : float
        ``φ(t)`` and ``φ'(t)`` (``φ(0)``, ``φ'(0)`` when failed).
    status : str
        ``"wolfe"`` (both strong Wolfe conditions hold), ``"armijo"`` (evaluations ran out;
        only sufficient decrease holds) or ``"failed"`` (no step with sufficient decrease).
    evals : int
        Evaluations of ``phi`` made.
    last : bool
        True if ``t`` was the last step evaluated (so the caller's trial point holds it).
    """

    t: float
    f: float
    df: float
    status: str
    evals: int
    last: bool


def cubic_min(a: float, fa: float, da: float, b: float, fb: float, db: float) -> float:
    """Minimiser of the cubic interpolating ``f`` and ``f'`` at ``a`` and ``b``.

    N&W eq. (3.59). Returns NaN when the cubic has no minimiser (or the inputs are not
    finite); callers fall back to bisection.
    """
    if a == b or not all(math.isfinite(v) for v in (a, fa, da, b, fb, db)):
        return math.nan
    d1 = da + db - 3.0 * (fa - fb) / (a - b)
    disc = d1 * d1 - da * db
    if disc < 0.0:
        return math.nan
    d2 = math.copysign(math.sqrt(disc), b - a)
    den = db - da + 2.0 * d2
    if den == 0.0:
        return math.nan
    return b - (b - a) * (db + d2 - d1) / den


def _interpolate(lo, hi) -> float:
    """Next trial in the bracket: the cubic minimiser, kept at least 10 % of the bracket away
    from both ends, else the midpoint."""
    (a, fa, da), (b, fb, db) = lo, hi
    t = cubic_min(a, fa, da, b, fb, db)
    left, right = min(a, b), max(a, b)
    margin = 0.1 * (right - left)
    if not (math.isfinite(t) and left + margin <= t <= right - margin):
        t = 0.5 * (a + b)
    return t


def strong_wolfe(phi, f0: float, df0: float, t1: float, c1: float = 1e-4, c2: float = 0.9,
                 max_evals: int = 20, t_max: float = 1e10) -> LineSearchResult:
    """Find a step satisfying the strong Wolfe conditions (N&W Algorithms 3.5 and 3.6).

    Parameters
    ----------
    phi : callable(float) -> (float, float)
        ``t -> (φ(t), φ'(t))``; may return a non-finite ``φ`` (treated as too long a step).
    f0, df0 : float
        ``φ(0)`` and ``φ'(0)``; ``df0`` must be < 0 (a descent direction).
    t1 : float
        First trial step, > 0.
    c1, c2 : float
        ``0 < c1 < c2 < 1``.
    max_evals : int
        Largest number of calls of ``phi``, >= 1.
    t_max : float
        Largest step tried; steps grow by doubling while the function still decreases.

    Returns
    -------
    LineSearchResult

    Raises
    ------
    ValueError
        For ``df0 >= 0`` or a non-finite ``f0``/``df0``, ``t1 <= 0``, constants outside
        ``0 < c1 < c2 < 1`` or ``max_evals < 1``.
    """
    if not (math.isfinite(f0) and math.isfinite(df0)) or df0 >= 0.0:
        raise ValueError(f"need a finite f0 and a descent direction (df0 < 0), got f0 = {f0}, "
                         f"df0 = {df0}")
    if not (t1 > 0.0 and 0.0 < c1 < c2 < 1.0 and max_evals >= 1):
        raise ValueError(f"need t1 > 0, 0 < c1 < c2 < 1, max_evals >= 1; got t1 = {t1}, "
                         f"c1 = {c1}, c2 = {c2}, max_evals = {max_evals}")
    evals = 0
    last_t = None

    def call(t):
        nonlocal evals, last_t
        evals += 1
        last_t = t
        f, df = phi(t)
        return float(f), float(df)

    def armijo(t, f):
        return math.isfinite(f) and f <= f0 + c1 * t * df0

    def done(point, status):
        t, f, df = point
        if status == "failed":
            return LineSearchResult(0.0, f0, df0, "failed", evals, last_t is None)
        return LineSearchResult(t, f, df, status, evals, t == last_t)

    def zoom(lo, hi):
        # invariants (N&W §3.5): lo satisfies sufficient decrease and has the lowest φ of such
        # steps seen; φ'(lo) (hi - lo) < 0, so a step satisfying both conditions lies between
        while evals < max_evals:
            t = _interpolate(lo, hi)
            f, df = call(t)
            if not armijo(t, f) or f >= lo[1]:
                hi = (t, f, df)
            else:
                if abs(df) <= -c2 * df0:
                    return done((t, f, df), "wolfe")
                if df * (hi[0] - lo[0]) >= 0.0:
                    hi = lo
                lo = (t, f, df)
        return done(lo, "armijo") if lo[0] > 0.0 else done(lo, "failed")

    prev = (0.0, f0, df0)
    t = min(t1, t_max)
    while evals < max_evals:
        f, df = call(t)
        cur = (t, f, df)
        if not armijo(t, f) or (evals > 1 and f >= prev[1]):
            return zoom(prev, cur)
        if abs(df) <= -c2 * df0:
            return done(cur, "wolfe")
        if df >= 0.0:
            return zoom(cur, prev)
        prev = cur
        if t >= t_max:
            break
        t = min(2.0 * t, t_max)
    return done(prev, "armijo") if prev[0] > 0.0 else done(prev, "failed")
