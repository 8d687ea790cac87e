"""Small helpers shared by the scripts in ``bench/`` (no MPI, no hpcps imports).

Every benchmark script

* times the variants it compares in the same run, interleaved (the order rotates from one
  repetition to the next) and reports medians, because these machines are shared and noisy;
* prints its headline ratio as its last line, ``<what>: <value> (goal <goal>)``;
* with ``--json PATH`` also writes a :class:`Report` — the ratios with their goals and the
  measured details — for ``hpcps bench`` to collect into ``bench/results.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure_importable() -> None:
    """Make ``import hpcps`` work from a source checkout that was not pip-installed."""
    try:
        import hpcps  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))


def median(values) -> float:
    """Median of a non-empty sequence of numbers."""
    return float(statistics.median(values))


def rotate(seq, k: int) -> list:
    """``seq`` rotated left by ``k`` (so that no variant always runs first)."""
    seq = list(seq)
    if not seq:
        return seq
    k %= len(seq)
    return seq[k:] + seq[:k]


def time_once(fn) -> float:
    """Seconds taken by one call of ``fn()`` (``time.perf_counter``)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Report:
    """Ratios with their goals plus details, written as JSON for ``hpcps bench``.

    Parameters
    ----------
    name : str
        Benchmark name (``kernels``, ``pushpull``, ...).
    argv : list of str
        Command-line arguments of the run (recorded).
    """

    def __init__(self, name: str, argv=None):
        self.name = name
        self.ratios: list[dict] = []
        self.details: dict = {}
        self.notes: list[str] = []
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.t0 = time.perf_counter()

    def ratio(self, what: str, value, goal: float | None = None, *, higher_is_better=True,
              unit: str = "x", headline: bool = False, bound: float | None = None) -> dict:
        """Record one ratio; ``goal`` None means "reported, no goal". ``bound``: a value no
        real measurement can exceed (e.g. 1 for a fraction of a bandwidth ceiling); a value
        above it means the baseline was disturbed (another process took the core while it
        ran), so the goal is neither met nor missed and a note says so.

        Returns the record (``met`` is None without a goal or without a value).
        """
        met = None
        disturbed = bound is not None and value is not None and value > bound
        if goal is not None and value is not None and not disturbed:
            met = bool(value >= goal) if higher_is_better else bool(value <= goal)
        if disturbed:
            self.note(f"{what}: {float(value):.2f} is above {bound:g}, which no real "
                      "measurement can reach: the baseline was disturbed; not counted, rerun")
        rec = {"what": what, "value": None if value is None else float(value), "goal": goal,
               "goal_text": None if goal is None else f"{'>=' if higher_is_better else '<='} {goal:g}",
               "unit": unit, "met": met, "headline": headline, "disturbed": disturbed}
        self.ratios.append(rec)
        return rec

    def note(self, text: str) -> None:
        """A sentence for the results table (why a goal is missed, what was skipped)."""
        self.notes.append(text)

    def write(self, path) -> None:
        """Write the report as JSON to ``path`` (no-op for ``None``)."""
        if not path:
            return
        data = {"name": self.name, "argv": self.argv, "seconds": time.perf_counter() - self.t0,
                "ratios": self.ratios, "details": self.details, "notes": self.notes}
        Path(path).write_text(json.dumps(data, indent=1, default=_jsonable))

    def last_line(self) -> str:
        """Every ratio that has a goal, one per line with "met" or "MISSED", then the headline
        ratio(s) as the last line (each script prints this last), so that a script run alone
        shows every goal it measures, missed ones included."""
        def fmt(r):
            v = "n/a" if r["value"] is None else f"{r['value']:.2f}{r['unit'] if r['unit'] != 'x' else ''}"
            goal = f" (goal {r['goal_text']})" if r["goal_text"] else ""
            flag = ("  DISTURBED (above its bound: rerun)" if r.get("disturbed") else
                    "" if r["met"] is None else ("  met" if r["met"] else "  MISSED"))
            return f"{r['what']}: {v}{goal}{flag}"

        heads = [r for r in self.ratios if r["headline"]] or self.ratios[:1]
        others = [fmt(r) for r in self.ratios if r["goal"] is not None and r not in heads]
        return "\n".join(others + ["; ".join(fmt(r) for r in heads)])


def _jsonable(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def add_common_args(ap) -> None:
    """``--json PATH`` and ``--quick`` (tiny sizes, for the smoke test) for every script."""
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and few repetitions (a smoke test, not a measurement)")


def cpu_count() -> int:
    return os.cpu_count() or 1
