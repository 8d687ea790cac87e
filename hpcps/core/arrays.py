"""Array helpers of the worker, the server and the data readers (no MPI)."""

from __future__ import annotations

import numpy as np


def distinct(values) -> np.ndarray:
    """The distinct values of ``values``, ascending: ``np.unique(values)`` by a sort and one
    pass over it.

    Under numpy 2.4 ``np.unique`` without ``return_*`` finds the distinct values by hashing,
    which here took 0.19 ms for 2,600 random int64 keys of 2^20 (0.014 ms sorted this way),
    7.1 ms for 27,000 (0.14) and 447 ms for 2^20 keys (24 ms).

    Parameters
    ----------
    values : array_like, any shape (flattened), a numeric dtype

    Returns
    -------
    ndarray (m,) of the dtype of ``values``, ascending, without repeats
    """
    s = np.sort(np.asarray(values).reshape(-1))
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
