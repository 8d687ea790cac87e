"""Data layer of hpcps: the UCI Adult featurizer and the svmlight byte-range reader.

This package depends on numpy, scipy and scikit-learn only; it never imports
``mpi4py`` (see ``docs/design.md``, layer 2).  Every input error is reported as a
:class:`DataError` (a :class:`ValueError`) whose message names the file and, where
possible, the line and column.

Submodules
----------
adult
    :func:`~hpcps.data.adult.load_adult_columns`, :func:`~hpcps.data.adult.split_indices`,
    :class:`~hpcps.data.adult.AdultFeaturizer`,
    :func:`~hpcps.data.adult.load_adult_partition`, :func:`~hpcps.data.adult.load_adult_full`.
svmlight
    :func:`~hpcps.data.svmlight.byte_ranges`, :func:`~hpcps.data.svmlight.read_svmlight_part`,
    :func:`~hpcps.data.svmlight.write_svmlight`.
partition_rows
    :func:`~hpcps.data.partition_rows.block_bounds` (``np.array_split`` block arithmetic).
"""

from hpcps.core.errors import DataError

__all__ = ["DataError"]
