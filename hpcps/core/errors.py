"""Errors of the input that every layer may raise. No MPI, no I/O."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """Malformed or inconsistent input data (exit status 65, :mod:`hpcps.core.exitcodes`).

    Raised by the readers of :mod:`hpcps.data` (which re-exports it) and by the tables when
    a key falls outside a table's id space, instead of a bare ``ValueError`` (it *is* a
    ``ValueError``, so ``except ValueError`` still catches it). The message starts with the
    path of the offending file and, where known, ``:line`` and the column or feature index at
    fault, or with the table's name.
    """
