"""Short forms for the printed summary of a job with many ranks: ids as ranges, values as their
spread. A job of 60 workers printed a line of 60 entries each for the hosts and the read ages
(a thousand workers: lines of tens of kB); ``metrics.json`` keeps every entry. No MPI.
"""

from __future__ import annotations

import numpy as np

#: above this many servers (workers) the summary prints their spread and the outliers instead
#: of one line (one entry) each
MANY = 8


def id_ranges(ids) -> str:
    """Sorted distinct integers as ranges: ``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3, 7, 9-10"``.

    Parameters
    ----------
    ids : iterable of int

    Returns
    -------
    str
        Empty for no ids.
    """
    vals = sorted({int(i) for i in ids})
    parts, start = [], None
    for i, v in enumerate(vals):
        if start is None:
            start = v
        if i + 1 == len(vals) or vals[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(parts)


def spread(values, fmt=lambda v: f"{v:,.0f}") -> str:
    """``"min .. max (median m)"`` of ``values``, each formatted by ``fmt``; one value when
    min and max read the same.

    Parameters
    ----------
    values : sequence of float, not empty
    fmt : callable float -> str
    """
    a = np.asarray(values, dtype=np.float64)
    lo, hi, med = float(a.min()), float(a.max()), float(np.median(a))
    if fmt(lo) == fmt(hi):
        return fmt(lo)
    return f"{fmt(lo)} .. {fmt(hi)} (median {fmt(med)})"
