"""UCI Adult ("Census Income") reader and hashed-crosses featurizer.

The shipped table (``data/adult.csv.gz``, see ``data/README.md``) has 48,842 rows, 14
feature columns and the ``income`` label.  The featurizer turns each row into 14
tokens -- ``"col=value"`` for the 8 categorical columns, ``"col#bin"`` for the 6
numeric columns cut at quantiles of the training rows -- plus, optionally, one token
``"tokA^tokB"`` for each of the 91 unordered pairs of those tokens (the hashed
feature-crosses recipe of click-through-rate models), and hashes every token into
``2**hash_bits`` buckets with :class:`sklearn.feature_extraction.FeatureHasher`
(signed 32-bit MurmurHash3, seed 0, ``alternate_sign=False``), or, with ``hash_bits = 0``
(for a dynamic table, :mod:`hpcps.server.dynshard`), gives each token its own 63-bit id
(XXH64 of the UTF-8 token modulo ``2**63 - 1``: no bucketing, so distinct crosses collide
only with probability about ``k**2 / 2**64`` for ``k`` tokens).  Hashing is a pure
function of the token string, so results are identical in every process.

Sources
-------
- Becker, B. and Kohavi, R. (1996). Adult. UCI Machine Learning Repository,
  https://doi.org/10.24432/C5XW20 (CC BY 4.0).
- Weinberger, K. et al. (2009). Feature hashing for large scale multitask learning.
  ICML.  (The hashing trick, as implemented by ``FeatureHasher``.)
- McMahan, H. B. et al. (2013). Ad click prediction: a view from the trenches. KDD.
  (Hashed feature crosses for logistic regression.)

This module never imports ``mpi4py``.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import operator
import os
from typing import Mapping

import numpy as np
import xxhash
import scipy.sparse as sp

from hpcps.data import DataError
from hpcps.data import featcache
from hpcps.data.partition_rows import block_bounds, check_part

__all__ = [
    "FEATURE_COLUMNS",
    "NUMERIC_COLUMNS",
    "CATEGORICAL_COLUMNS",
    "LABEL_COLUMN",
    "load_adult_columns",
    "split_indices",
    "AdultFeaturizer",
    "load_adult_partition",
    "load_adult_full",
]

#: The 14 feature columns, in file order (this is also the token order).
FEATURE_COLUMNS: tuple[str, ...] = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "educational-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)
#: Columns parsed as float64 and quantile-binned by the featurizer.
NUMERIC_COLUMNS: tuple[str, ...] = (
    "age",
    "fnlwgt",
    "educational-num",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
)
#: Columns kept as strings (``"?"`` marks a missing value and is kept as a category).
CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(c for c in FEATURE_COLUMNS if c not in NUMERIC_COLUMNS)
#: Label column: ``">50K"`` -> 1, ``"<=50K"`` -> 0 (a trailing ``"."`` is accepted).
LABEL_COLUMN = "income"

_LABELS = {">50K": 1.0, "<=50K": 0.0}
_SPLITS = ("train", "test")
# FeatureHasher accepts n_features up to 2**31 - 1.
_MAX_HASH_BITS = 30
#: Ids of ``hash_bits = 0`` (unhashed tokens) are below this: the int64 id space of a dynamic table.
RAW_IDS = (1 << 63) - 1
#: Version of the featurized-split cache entries (:mod:`hpcps.data.featcache`): bump it whenever
#: the reader, the split or the featurizer changes what :func:`load_adult_partition` returns.
CACHE_VERSION = 1


def _open_text(path: str | os.PathLike) -> io.TextIOBase:
    """Open ``path`` for csv reading; gzip is detected from the magic bytes. A UTF-8
    byte-order mark is skipped (``utf-8-sig``), else the first column would be named
    ``'\\ufeffage'``; the csv module ends lines at CR, LF or CRLF (``newline=""``)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "rt", encoding="utf-8-sig", newline="")


def load_adult_columns(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read the Adult CSV (gzip-compressed or plain) into column arrays.

    The file must have a header row naming at least the 14 :data:`FEATURE_COLUMNS` and
    ``income``, in any order (other columns are ignored).  Surrounding spaces are
    stripped from every field; blank lines are skipped.

    Parameters
    ----------
    path : str or path-like
        CSV file; gzip compression is detected from the first two bytes.

    Returns
    -------
    dict of str to numpy.ndarray
        One entry per feature column, each of shape ``(n_rows,)``: the 6
        :data:`NUMERIC_COLUMNS` as ``float64``, the 8 :data:`CATEGORICAL_COLUMNS` as
        unicode string arrays (``"?"`` kept as is), plus ``"y"``: ``float64`` in
        ``{0.0, 1.0}`` from ``income`` (``">50K"``/``">50K."`` -> 1,
        ``"<=50K"``/``"<=50K."`` -> 0).  Rows are in file order.

    Raises
    ------
    DataError
        If the file is empty, a required column is missing (message names the file and
        the column), a row has the wrong number of fields (file and line), a numeric
        value does not parse or is not finite, or a label is not one of the above
        (file, line and column).
    OSError
        If the file cannot be read.
    """
    path = os.fspath(path)
    with _open_text(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: empty file (no header row)") from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataError(f"{path}:1: cannot read header: {e}") from e
        header = [h.strip() for h in header]
        where = {}
        for j, name in enumerate(header):
            where.setdefault(name, j)
        for name in FEATURE_COLUMNS + (LABEL_COLUMN,):
            if name not in where:
                raise DataError(f"{path}: missing column {name!r} (header: {','.join(header)})")
        wanted = FEATURE_COLUMNS + (LABEL_COLUMN,)
        idx = [where[name] for name in wanted]
        values: list[list[str]] = [[] for _ in wanted]
        lines: list[int] = []
        n_fields = len(header)
        try:
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != n_fields:
                    raise DataError(
                        f"{path}:{reader.line_num}: expected {n_fields} fields, got {len(row)}"
                    )
                lines.append(reader.line_num)
                for vals, j in zip(values, idx):
                    vals.append(row[j].strip())
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataError(f"{path}:{reader.line_num}: {e}") from e

    out: dict[str, np.ndarray] = {}
    for name, vals in zip(wanted, values):
        if name in NUMERIC_COLUMNS:
            out[name] = _parse_numeric(vals, path, name, lines)
        elif name == LABEL_COLUMN:
            y = np.empty(len(vals), dtype=np.float64)
            for i, v in enumerate(vals):
                label = _LABELS.get(v[:-1] if v.endswith(".") else v)
                if label is None:
                    raise DataError(
                        f"{path}:{lines[i]}: column {name!r}: bad label {v!r} "
                        f"(expected '>50K' or '<=50K')"
                    )
                y[i] = label
            out["y"] = y
        else:
            out[name] = np.array(vals, dtype=str)
    return out


def _parse_numeric(vals: list[str], path: str, name: str, lines: list[int]) -> np.ndarray:
    """Parse one numeric column to float64; locate the first bad value on failure."""
    try:
        x = np.array(vals, dtype=np.float64)
    except ValueError:
        x = None
    if x is not None and np.isfinite(x).all():
        return x
    x = np.empty(len(vals), dtype=np.float64)
    for i, v in enumerate(vals):
        try:
            x[i] = float(v)
        except ValueError:
            x[i] = np.nan
        if not math.isfinite(x[i]):
            raise DataError(f"{path}:{lines[i]}: column {name!r}: bad numeric value {v!r}")
    return x


def split_indices(n_rows: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random train/test split of ``range(n_rows)``.

    The test split is the first ``round(test_fraction * n_rows)`` entries of
    ``np.random.default_rng(seed).permutation(n_rows)``, the train split the rest.

    Parameters
    ----------
    n_rows : int
        Number of rows, ``>= 0``.
    test_fraction : float
        Fraction of rows in the test split, ``0 <= test_fraction < 1``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.

    Returns
    -------
    train_idx, test_idx : numpy.ndarray of int64, shapes ``(n_train,)``, ``(n_test,)``
        Disjoint, together ``range(n_rows)``, each sorted ascending.

    Raises
    ------
    ValueError
        If ``n_rows < 0`` or ``test_fraction`` is outside ``[0, 1)``.
    """
    n_rows = operator.index(n_rows)
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    test_fraction = float(test_fraction)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n_rows).astype(np.int64, copy=False)
    n_test = int(round(test_fraction * n_rows))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


class AdultFeaturizer:
    """Tokens, quantile bins and hashed pairwise crosses for the Adult table.

    Each row gives 14 tokens, one per :data:`FEATURE_COLUMNS` entry in that order:
    ``"col=value"`` for categoricals (e.g. ``"workclass=Private"``, ``"native-country=?"``)
    and ``"col#bin"`` for numerics (e.g. ``"age#3"``), where ``bin`` is
    ``np.searchsorted(edges, x, side="left")`` (the number of edges ``< x``: bins are
    ``(-inf, e0], (e0, e1], ..., (e_last, inf)``) and ``edges`` are the distinct interior
    quantiles (``numeric_bins - 1`` of them, fewer after de-duplication) of the column
    over the rows given to :meth:`fit`.  The capital columns are 0 in over 90 % of the
    rows, so their only edge is 0 and they get two bins, zero and positive.  With
    ``crosses=True`` it adds ``"tokA^tokB"`` for each of the 91 pairs ``a < b`` of those
    tokens (file order), 105 tokens in all.  Every token is hashed into
    ``2**hash_bits`` buckets by ``FeatureHasher(alternate_sign=False)``; colliding
    tokens of a row are summed, so each row's values sum to :attr:`n_tokens`.

    Parameters
    ----------
    hash_bits : int, default=20
        ``log2`` of the number of buckets, ``1 <= hash_bits <= 30``; ``0``: no buckets,
        each token's id is its 63-bit XXH64 hash (``n_features = 2**63 - 1``).
    numeric_bins : int, default=8
        Number of quantile bins per numeric column, ``>= 1``.
    crosses : bool, default=True
        Add the 91 pairwise cross tokens.

    Attributes
    ----------
    bin_edges_ : dict of str to numpy.ndarray of float64
        Interior bin edges per numeric column, set by :meth:`fit`.

    Raises
    ------
    ValueError
        For out-of-range parameters.
    """

    def __init__(self, hash_bits: int = 20, numeric_bins: int = 8, crosses: bool = True):
        hash_bits = operator.index(hash_bits)
        numeric_bins = operator.index(numeric_bins)
        if not 0 <= hash_bits <= _MAX_HASH_BITS:
            raise ValueError(f"hash_bits must be in [0, {_MAX_HASH_BITS}], got {hash_bits}")
        if numeric_bins < 1:
            raise ValueError(f"numeric_bins must be >= 1, got {numeric_bins}")
        self.hash_bits = hash_bits
        self.numeric_bins = numeric_bins
        self.crosses = bool(crosses)
        self._hasher = None              # the FeatureHasher, made on first use (imports sklearn)

    @property
    def n_features(self) -> int:
        """Number of columns of the output, ``2**hash_bits`` (``2**63 - 1`` for ``0``)."""
        return RAW_IDS if self.hash_bits == 0 else 2**self.hash_bits

    @property
    def n_tokens(self) -> int:
        """Tokens per row: 14, or 105 with crosses."""
        k = len(FEATURE_COLUMNS)
        return k + (k * (k - 1) // 2 if self.crosses else 0)

    def fit(self, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> "AdultFeaturizer":
        """Compute the quantile bin edges of the numeric columns from ``rows`` only.

        Parameters
        ----------
        columns : mapping of str to numpy.ndarray
            As returned by :func:`load_adult_columns`.
        rows : array-like of int, shape (n,)
            Row indices to fit on (the training split), ``n >= 1``.

        Returns
        -------
        AdultFeaturizer
            ``self``.

        Raises
        ------
        ValueError
            If ``rows`` is empty or a column is missing from ``columns``.
        """
        rows = _as_rows(rows)
        if rows.size == 0:
            raise ValueError("AdultFeaturizer.fit needs at least one row")
        probs = np.linspace(0.0, 1.0, self.numeric_bins + 1)[1:-1]
        edges = {}
        for name in NUMERIC_COLUMNS:
            x = np.asarray(_column(columns, name), dtype=np.float64)[rows]
            edges[name] = np.unique(np.quantile(x, probs)) if probs.size else np.empty(0)
        self.bin_edges_ = edges
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "bin_edges_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("AdultFeaturizer is not fitted; call fit(columns, train_rows) first")

    def _column_codes(self, columns, rows) -> list[tuple[list[str], np.ndarray]]:
        """Per column: distinct token strings and each row's code into them."""
        out = []
        for name in FEATURE_COLUMNS:
            col = _column(columns, name)[rows]
            if name in NUMERIC_COLUMNS:
                edges = self.bin_edges_[name]
                codes = np.searchsorted(edges, np.asarray(col, dtype=np.float64), side="left")
                uniq = [f"{name}#{b}" for b in range(edges.size + 1)]
            else:
                values, codes = np.unique(np.asarray(col, dtype=str), return_inverse=True)
                uniq = [f"{name}={v}" for v in values.tolist()]
            out.append((uniq, codes.astype(np.int64, copy=False).reshape(-1)))
        return out

    def tokens(self, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> list[list[str]]:
        """The token strings of each row (slow; for inspection and tests).

        Parameters
        ----------
        columns : mapping of str to numpy.ndarray
            As returned by :func:`load_adult_columns`.
        rows : array-like of int, shape (n,)
            Row indices.

        Returns
        -------
        list of list of str
            ``n`` lists of :attr:`n_tokens` strings, in the order described above.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            If :meth:`fit` was not called (a ``ValueError``).
        """
        self._check_fitted()
        rows = _as_rows(rows)
        cc = self._column_codes(columns, rows)
        out = []
        for r in range(rows.size):
            base = [uniq[codes[r]] for uniq, codes in cc]
            if self.crosses:
                base = base + [a + "^" + b for a, b in itertools.combinations(base, 2)]
            out.append(base)
        return out

    def transform(self, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> sp.csr_matrix:
        """Hashed token counts of ``rows``.

        Equal to ``FeatureHasher(2**hash_bits, input_type="string",
        alternate_sign=False).transform(self.tokens(columns, rows))``, but each distinct
        token (and each distinct cross) is hashed only once.

        Parameters
        ----------
        columns : mapping of str to numpy.ndarray
            As returned by :func:`load_adult_columns`.
        rows : array-like of int, shape (n,)
            Row indices, in output order.

        Returns
        -------
        scipy.sparse.csr_matrix of float64, shape (n, 2**hash_bits)
            Sorted, unique column indices per row; values are token counts (1.0, or
            more when tokens of a row collide); each row sums to :attr:`n_tokens`.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            If :meth:`fit` was not called (a ``ValueError``).
        """
        self._check_fitted()
        rows = _as_rows(rows)
        n = rows.size
        cc = self._column_codes(columns, rows)
        cols = np.empty((n, self.n_tokens), dtype=np.int64)
        for j, (uniq, codes) in enumerate(cc):
            cols[:, j] = self._hash(uniq)[codes]
        if self.crosses:
            j = len(cc)
            for (ua, ca), (ub, cb) in itertools.combinations(cc, 2):
                pair, inv = np.unique(ca * len(ub) + cb, return_inverse=True)
                toks = [ua[p // len(ub)] + "^" + ub[p % len(ub)] for p in pair.tolist()]
                cols[:, j] = self._hash(toks)[inv.reshape(-1)]
                j += 1
        indptr = np.arange(n + 1, dtype=np.int64) * self.n_tokens
        X = sp.csr_matrix(
            (np.ones(cols.size, dtype=np.float64), cols.reshape(-1), indptr),
            shape=(n, self.n_features),
        )
        X.sum_duplicates()  # sorts indices and merges collisions
        return X

    def _hash(self, tokens: list[str]) -> np.ndarray:
        """Bucket index of each token (int64, shape ``(len(tokens),)``)."""
        if not tokens:
            return np.empty(0, dtype=np.int64)
        if self.hash_bits == 0:
            return np.array([xxhash.xxh64_intdigest(t.encode()) % RAW_IDS for t in tokens],
                            dtype=np.int64)
        if self._hasher is None:
            from sklearn.feature_extraction import FeatureHasher

            self._hasher = FeatureHasher(n_features=2**self.hash_bits, input_type="string",
                                         alternate_sign=False, dtype=np.float64)
        H = self._hasher.transform([[t] for t in tokens]).tocsr()
        # one token per row, alternate_sign=False: exactly one stored 1.0 per row
        return H.indices[H.indptr[:-1]].astype(np.int64)


def _as_rows(rows) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1 or (rows.size and not np.issubdtype(rows.dtype, np.integer)):
        raise ValueError(f"rows must be a 1-d integer array, got dtype {rows.dtype} shape {rows.shape}")
    return rows.astype(np.int64, copy=False)


def _column(columns: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    try:
        return np.asarray(columns[name])
    except KeyError:
        raise ValueError(f"column {name!r} missing from the columns mapping") from None


def load_adult_partition(
    path: str | os.PathLike,
    split: str,
    part: int,
    n_parts: int,
    *,
    hash_bits: int = 20,
    numeric_bins: int = 8,
    crosses: bool = True,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    max_rows: int = 0,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Featurized rows of one contiguous block of the train or test split.

    Steps: :func:`load_adult_columns`; keep the first ``max_rows`` rows of the file if
    ``max_rows > 0``; :func:`split_indices` with ``test_fraction``, ``split_seed``;
    :meth:`AdultFeaturizer.fit` on the *whole* train split (so every part uses the same
    bin edges); then block ``part`` of ``np.array_split(split_rows, n_parts)`` (sorted
    row order, every row in exactly one block, blocks may be empty) is featurized.

    The whole featurized split is cached on disk (:mod:`hpcps.data.featcache`, kind
    ``adult``): the first call featurizes all of the split's rows and keeps them; later calls,
    in any process, read them back (without parsing the CSV or importing scikit-learn) and
    slice their block. The key is the file's bytes (XXH3-128), every parameter above but
    ``part``/``n_parts``, :data:`CACHE_VERSION` and the numpy and scikit-learn versions; the
    result is the same with or without the cache, bit for bit.

    Parameters
    ----------
    path : str or path-like
        Adult CSV (gzip or plain), e.g. ``data/adult.csv.gz``.
    split : {"train", "test"}
        Which split.
    part, n_parts : int
        Block index ``0 <= part < n_parts``.
    hash_bits, numeric_bins, crosses
        See :class:`AdultFeaturizer`.
    test_fraction, split_seed
        See :func:`split_indices`.
    max_rows : int, default=0
        Use only the first ``max_rows`` rows of the file (0 = all).

    Returns
    -------
    X : scipy.sparse.csr_matrix of float64, shape (n_part, 2**hash_bits)
        Sorted indices (int32 or int64, as scipy chooses).
    y : numpy.ndarray of float64, shape (n_part,)
        Labels in ``{0.0, 1.0}``.

    Raises
    ------
    ValueError
        For a bad ``split``, ``part`` outside ``[0, n_parts)``, ``max_rows < 0`` or other
        out-of-range parameters (checked before the file is read).
    DataError
        From :func:`load_adult_columns`, or if the train split is empty.
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    part, n_parts = check_part(part, n_parts)
    max_rows = operator.index(max_rows)
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    featurizer = AdultFeaturizer(hash_bits=hash_bits, numeric_bins=numeric_bins, crosses=crosses)
    test_fraction = float(test_fraction)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    split_seed = operator.index(split_seed)
    entry, key = _cache_entry(path, split, featurizer, test_fraction, split_seed, max_rows)
    if entry is None:                                   # no cache: featurize this block only
        return _featurize(path, split, featurizer, test_fraction, split_seed, max_rows,
                          part, n_parts)
    n_cols, n_tokens = featurizer.n_features, featurizer.n_tokens
    got = featcache.load_csr(entry, key, n_cols, n_tokens)
    if got is None:
        with featcache.entry_lock(entry) as held:
            if held:                                    # another process may have written it
                got = featcache.load_csr(entry, key, n_cols, n_tokens)
            if got is None:
                X, y = _featurize(path, split, featurizer, test_fraction, split_seed, max_rows,
                                  0, 1)
                featcache.save_csr(entry, key, X, y)
                got = X.indptr, X.indices, X.data, y
    indptr, indices, data, y = got
    start, stop = block_bounds(y.shape[0], part, n_parts)
    lo, hi = int(indptr[start]), int(indptr[stop])
    X = sp.csr_matrix((data[lo:hi].copy(), indices[lo:hi].copy(), indptr[start:stop + 1] - lo),
                      shape=(stop - start, n_cols))
    X.has_canonical_format = True       # sorted, unique indices: checked by load_csr / transform
    return X, y[start:stop].copy()


def _cache_entry(path, split, featurizer, test_fraction, split_seed, max_rows):
    """``(entry path, key)`` of the cached split, or ``(None, None)``: no cache (disabled, no
    usable directory) or an unreadable file (then the reader reports it)."""
    if featcache.cache_root() is None:
        return None, None
    try:
        digest = featcache.file_digest(path)
    except OSError:
        return None, None
    key = featcache.entry_key(
        kind="adult_csv", version=CACHE_VERSION, file=digest, split=split,
        hash_bits=featurizer.hash_bits, numeric_bins=featurizer.numeric_bins,
        crosses=featurizer.crosses, test_fraction=repr(test_fraction), split_seed=split_seed,
        max_rows=max_rows, numpy=np.__version__, sklearn=_sklearn_version(),
    )
    entry = featcache.entry_path("adult", key)
    return (None, None) if entry is None else (entry, key)


def _sklearn_version() -> str:
    """scikit-learn's version from its metadata, without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scikit-learn")
    except PackageNotFoundError:
        return "none"


def _featurize(path, split, featurizer, test_fraction, split_seed, max_rows, part, n_parts):
    """Read the CSV, fit the featurizer on the train split, featurize block ``part`` of
    ``n_parts`` of ``split``."""
    columns = load_adult_columns(path)
    n_rows = columns["y"].shape[0]
    if max_rows:
        n_rows = min(n_rows, max_rows)
    train, test = split_indices(n_rows, test_fraction, split_seed)
    if train.size == 0:
        raise DataError(f"{os.fspath(path)}: no training rows (file has {n_rows} data rows)")
    featurizer.fit(columns, train)
    rows = train if split == "train" else test
    start, stop = block_bounds(rows.size, part, n_parts)
    rows = rows[start:stop]
    return featurizer.transform(columns, rows), columns["y"][rows].copy()


def load_adult_full(path: str | os.PathLike, split: str, **kwargs) -> tuple[sp.csr_matrix, np.ndarray]:
    """All rows of one split: ``load_adult_partition(path, split, 0, 1, **kwargs)``.

    Used by the scikit-learn baseline.  Same keyword arguments, returns and errors as
    :func:`load_adult_partition`.
    """
    return load_adult_partition(path, split, 0, 1, **kwargs)
