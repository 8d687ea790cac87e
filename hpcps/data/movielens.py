"""MovieLens-100K ratings → a prepared HDF5 file (no MPI).

The data set (Harper & Konstan, "The MovieLens Datasets: History and Context", ACM TiiS 5(4),
2015): 100,000 ratings 1–5 of 1,682 movies by 943 users. GroupLens' terms forbid
redistributing it, so hpcps does not ship it; :func:`prepare_movielens_100k` reads

* RecBole's atomic file ``ml-100k.inter`` — tab-separated, typed header
  ``user_id:token  item_id:token  rating:float  timestamp:float`` (the copy shipped in the
  ``recbole`` wheel, ``pip install --no-deps recbole==1.2.1``, is found when no path is
  given), or
* GroupLens' original ``u.data`` — tab-separated ``user item rating timestamp``, no header.

Preparation
-----------
1. Every line is checked: integer user and item ids, a finite rating (errors name the file
   and line).
2. Split: ``perm = numpy.random.default_rng(seed).permutation(n)``; the first
   ``round(test_fraction * n)`` rows of ``perm`` are the test split, the rest the train split.
   Both splits keep the (random) order of ``perm``, so their rows are shuffled.
3. Ids: the distinct user ids of the **train** split, in increasing order, become indices
   ``0 .. n_users-1`` (items alike). Ids that occur only in the test split get the indices
   ``n_users, n_users+1, ...`` (``n_items, ...``): they have no row in a model's tables, and
   :class:`hpcps.models.mf.MatrixFactorization` predicts them from the bias terms it has.
   Indexing a table of ``n_users`` rows with one of them raises ``IndexError`` instead of
   silently reading another user's row.

Written with :func:`hpcps.data.prepared.write_prepared`: ``X`` int64 ``(n, 2)`` =
``[user index, item index]``, ``y`` float32 ``(n,)`` = rating. File attributes, besides the
common ones: ``n_users``, ``n_items`` (train ids = table rows), ``global_mean`` (mean train
rating), ``rating_min``, ``rating_max``, ``n_ratings``, ``test_fraction``, ``split_seed``,
``test_only_users``, ``test_only_items`` (distinct ids seen only in test),
``test_rows_unseen_user``, ``test_rows_unseen_item`` (test rows whose user / item never occurs
in train).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from hpcps.data import DataError
from hpcps.core.arrays import distinct

DATASET = "movielens-100k"
RECBOLE_FILE = ("dataset_example", "ml-100k", "ml-100k.inter")
RECBOLE_HINT = "pip install --no-deps recbole==1.2.1"
#: Columns of a RecBole header that are required, by name (the ``:type`` suffix is checked too).
HEADER_COLUMNS = {"user_id": "token", "item_id": "token", "rating": "float"}


def recbole_copy() -> Path:
    """Path of ``ml-100k.inter`` inside the installed ``recbole`` package (not imported).

    Raises
    ------
    DataError
        If ``recbole`` is not installed or its copy of the file is missing.
    """
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"no input file given and the recbole package (which ships MovieLens-100K) "
                        f"is not installed: `{RECBOLE_HINT}`, or pass --from PATH (ml-100k.inter "
                        "or u.data)")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*RECBOLE_FILE)
    if not path.is_file():
        raise DataError(f"{path}: not found in the installed recbole package; reinstall it "
                        f"(`{RECBOLE_HINT}`) or pass --from PATH")
    return path


def _header_columns(path: Path, fields: list) -> tuple:
    """Positions of user_id, item_id, rating in a RecBole typed header (line 1)."""
    names = {}
    for pos, f in enumerate(fields):
        name, sep, typ = f.partition(":")
        if not sep:
            raise DataError(f"{path}:1: header field {f!r} is not 'name:type' (expected a RecBole "
                            "header 'user_id:token item_id:token rating:float ...', or no header "
                            "as in u.data)")
        names[name] = (pos, typ)
    cols = []
    for name, typ in HEADER_COLUMNS.items():
        if name not in names:
            raise DataError(f"{path}:1: header has no column '{name}:{typ}' (found "
                            f"{' '.join(fields)})")
        if names[name][1] != typ:
            raise DataError(f"{path}:1: header column {name!r} has type {names[name][1]!r}, "
                            f"expected {typ!r}")
        cols.append(names[name][0])
    return tuple(cols)


def read_ratings(path) -> tuple:
    """Read a ratings file (RecBole ``.inter`` or GroupLens ``u.data``).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    users, items : int64 ndarray (n,)
        Raw ids as in the file.
    ratings : float64 ndarray (n,)

    Raises
    ------
    DataError
        Missing/unreadable file, a wrong header, a line with too few columns, a non-integer
        id or a non-numeric / non-finite rating (the message names the file and line), or
        no ratings at all.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")      # a byte-order mark is skipped
    except FileNotFoundError:
        raise DataError(f"{path}: ratings file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ratings file ({e})") from None
    lines = text.splitlines()
    cols, first = (0, 1, 2), 0
    if lines and lines[0].strip():
        head = lines[0].split("\t")
        if not head[0].strip()[:1].isdigit():  # not a data line: must be a RecBole header
            cols, first = _header_columns(path, [h.strip() for h in head]), 1
    need = max(cols) + 1
    users, items, ratings = [], [], []
    for no in range(first, len(lines)):
        line = lines[no]
        if not line.strip():
            continue
        f = line.split("\t")
        if len(f) < need:
            raise DataError(f"{path}:{no + 1}: {len(f)} tab-separated column(s), need at least "
                            f"{need} (user, item, rating)")
        try:
            u, i = int(f[cols[0]]), int(f[cols[1]])
        except ValueError:
            raise DataError(f"{path}:{no + 1}: user and item ids must be integers, got "
                            f"{f[cols[0]]!r} and {f[cols[1]]!r}") from None
        try:
            r = float(f[cols[2]])
        except ValueError:
            raise DataError(f"{path}:{no + 1}: rating {f[cols[2]]!r} is not a number") from None
        if not math.isfinite(r):
            raise DataError(f"{path}:{no + 1}: rating {f[cols[2]]!r} is not finite")
        users.append(u)
        items.append(i)
        ratings.append(r)
    if not ratings:
        raise DataError(f"{path}: no ratings in the file")
    return (np.array(users, dtype=np.int64), np.array(items, dtype=np.int64),
            np.array(ratings, dtype=np.float64))


def index_ids(train_ids: np.ndarray, test_ids: np.ndarray) -> tuple:
    """Map raw ids to indices: train ids → ``0..n-1`` (sorted), test-only ids → ``n, n+1, ...``.

    Returns
    -------
    train_idx, test_idx : int64 ndarray, same shapes as the inputs
    n : int
        Number of distinct train ids.
    test_only : int
        Number of distinct ids that occur only in ``test_ids``.
    """
    known = distinct(train_ids)
    extra = np.setdiff1d(np.unique(test_ids), known)
    vocab = np.concatenate([known, extra])         # known sorted, then extra sorted
    order = np.argsort(vocab, kind="stable")
    sorted_vocab = vocab[order]

    def lookup(ids):
        return order[np.searchsorted(sorted_vocab, ids)].astype(np.int64)

    return lookup(train_ids), lookup(test_ids), int(known.size), int(extra.size)


def prepare_movielens_100k(src=None, out="data/movielens-100k.h5", seed: int = 0,
                           test_fraction: float = 0.2) -> dict:
    """Read MovieLens-100K, split it and write the prepared HDF5 file (see module docstring).

    Parameters
    ----------
    src : str or os.PathLike or None
        ``ml-100k.inter`` or ``u.data``; ``None`` = the copy in the installed ``recbole``.
    out : str or os.PathLike
        Output file (written atomically; parent directories are created).
    seed : int
        Seed of the random train/test split.
    test_fraction : float
        Fraction of the ratings in the test split, in (0, 1).

    Returns
    -------
    dict
        The file attributes written, plus ``path`` (the output ``pathlib.Path``).

    Raises
    ------
    DataError
        Bad input (see :func:`read_ratings`), or no input and no ``recbole``.
    ValueError
        ``test_fraction`` outside (0, 1).
    """
    from hpcps.data.prepared import sha256_file, write_prepared

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    src = Path(src) if src is not None else recbole_copy()
    users, items, ratings = read_ratings(src)
    n = ratings.size
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    te, tr = perm[:n_test], perm[n_test:]
    if tr.size == 0:
        raise DataError(f"{src}: {n} rating(s) leave no training rows at test_fraction "
                        f"{test_fraction}")
    u_tr, u_te, n_users, only_u = index_ids(users[tr], users[te])
    i_tr, i_te, n_items, only_i = index_ids(items[tr], items[te])
    attrs = {
        "dataset": DATASET, "task": "regression", "source": str(src),
        "source_sha256": sha256_file(src),
        "n_users": n_users, "n_items": n_items, "n_ratings": int(n),
        "global_mean": float(ratings[tr].mean()),
        "rating_min": float(ratings.min()), "rating_max": float(ratings.max()),
        "test_fraction": float(test_fraction), "split_seed": int(seed),
        "test_only_users": only_u, "test_only_items": only_i,
        "test_rows_unseen_user": int(np.count_nonzero(u_te >= n_users)),
        "test_rows_unseen_item": int(np.count_nonzero(i_te >= n_items)),
    }
    splits = {
        "train": (np.stack([u_tr, i_tr], axis=1), ratings[tr].astype(np.float32)),
        "test": (np.stack([u_te, i_te], axis=1), ratings[te].astype(np.float32)),
    }
    path = write_prepared(out, splits, attrs)
    return {**attrs, "path": path}
