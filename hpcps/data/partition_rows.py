"""Contiguous block partitions with ``numpy.array_split`` semantics."""

from __future__ import annotations

import operator

__all__ = ["block_bounds", "check_part"]


def check_part(part: int, n_parts: int) -> tuple[int, int]:
    """Validate a ``(part, n_parts)`` pair.

    Parameters
    ----------
    part : int
        Index of the block, ``0 <= part < n_parts``.
    n_parts : int
        Number of blocks, ``>= 1``.

    Returns
    -------
    (int, int)
        ``part`` and ``n_parts`` as Python ints.

    Raises
    ------
    ValueError
        If ``n_parts < 1`` or ``part`` is outside ``[0, n_parts)``.
    TypeError
        If either is not an integer.
    """
    part = operator.index(part)
    n_parts = operator.index(n_parts)
    if n_parts < 1:
        raise ValueError(f"n_parts must be >= 1, got {n_parts}")
    if not 0 <= part < n_parts:
        raise ValueError(f"part must be in [0, {n_parts}), got {part}")
    return part, n_parts


def block_bounds(n_items: int, part: int, n_parts: int) -> tuple[int, int]:
    """Half-open bounds ``[start, stop)`` of block ``part`` of ``n_parts``.

    Same blocks as ``numpy.array_split(np.arange(n_items), n_parts)[part]``: the first
    ``n_items % n_parts`` blocks have one item more than the others; blocks may be
    empty when ``n_parts > n_items``.  Every item is in exactly one block and the
    blocks are in order.

    Parameters
    ----------
    n_items : int
        Number of items, ``>= 0``.
    part, n_parts : int
        See :func:`check_part`.

    Returns
    -------
    (int, int)
        ``start`` and ``stop`` with ``0 <= start <= stop <= n_items``.

    Raises
    ------
    ValueError
        If ``n_items < 0`` or ``(part, n_parts)`` is invalid.
    """
    n_items = operator.index(n_items)
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    part, n_parts = check_part(part, n_parts)
    q, r = divmod(n_items, n_parts)
    start = part * q + min(part, r)
    stop = start + q + (1 if part < r else 0)
    return start, stop
