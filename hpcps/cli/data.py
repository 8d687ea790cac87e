"""``hpcps data prepare|generate``: write a prepared or a synthetic data set (no MPI).

Each name in :data:`PREPARERS` turns a data set's original files into one HDF5 file in the
layout of :mod:`hpcps.data.prepared`, which jobs read with ``[data] format = "prepared"``.
The default output is ``data/NAME.h5`` under the current directory. Expected failures
(missing or malformed input) print one line ``hpcps data: error: ...`` and exit with status 1.
"""

from __future__ import annotations

from pathlib import Path

from hpcps.cli.analysis import _guard


def _movielens_100k(src, out) -> dict:
    from hpcps.data.movielens import prepare_movielens_100k

    return prepare_movielens_100k(src, out)


def _fashion_mnist(src, out) -> dict:
    from hpcps.data.fashion_mnist import DEFAULT_SOURCE, prepare_fashion_mnist
    from hpcps.data.prepared import file_attrs, split_rows

    path = prepare_fashion_mnist(src if src is not None else DEFAULT_SOURCE, out)
    return {**file_attrs(path), "train_rows": split_rows(path, "train"),
            "test_rows": split_rows(path, "test"), "path": path}


#: name → ``prepare(src, out) -> dict`` (the file attributes written, plus ``path``);
#: ``src`` is the ``--from`` path or ``None`` (the preparer's default source).
PREPARERS = {
    "movielens-100k": _movielens_100k,
    "fashion-mnist": _fashion_mnist,
}

#: One line per data set for ``--help``: where its input comes from.
SOURCES = {
    "movielens-100k": "ml-100k.inter (RecBole) or u.data (GroupLens); default: the copy in the "
                      "installed recbole package (pip install --no-deps recbole==1.2.1)",
    "fashion-mnist": "the four IDX files train-/t10k-{images-idx3,labels-idx1}-ubyte.gz; default: "
                     "/usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist)",
}


def default_out(name: str) -> Path:
    """``data/NAME.h5`` (relative to the current directory)."""
    return Path("data") / f"{name}.h5"


@_guard
def cmd_prepare(args) -> int:
    """``hpcps data prepare``: run the preparer and print what was written.

    Parameters
    ----------
    args : argparse.Namespace
        ``dataset``, ``src`` (or None), ``out`` (or None).

    Returns
    -------
    int
        Exit status (0).
    """
    out = Path(args.out) if args.out else default_out(args.dataset)
    info = PREPARERS[args.dataset](args.src, out)
    path = info.pop("path")
    print(f"hpcps data: wrote {path} ({args.dataset}, from {info.get('source', '?')})")
    for k, v in info.items():
        if k not in ("dataset", "source", "source_sha256"):
            print(f"  {k} = {v}")
    return 0


@_guard
def cmd_generate(args) -> int:
    """``hpcps data generate``: write a synthetic data set and print where and what.

    Parameters
    ----------
    args : argparse.Namespace
        ``kind``, ``rows``, ``files``, ``out``, ``seed``, ``compress``.

    Returns
    -------
    int
        Exit status (0).
    """
    from hpcps.data.generate import GENERATORS

    info = GENERATORS[args.kind](args.out, args.rows, args.files, seed=args.seed,
                                 compress=args.compress, progress=print)
    rows = sum(f["rows"] for f in info["files"])
    size = sum(f["bytes"] for f in info["files"])
    print(f"hpcps data: wrote {args.kind} to {info['path']}: {rows:,} rows in "
          f"{len(info['files'])} file(s), {size / 1e6:.1f} MB; ground truth in "
          f"{info['path']}/_truth.json")
    return 0


def _count(text: str) -> int:
    """An integer >= 1 with optional ``_`` or a k/M/G suffix (``10M``)."""
    import argparse

    t = text.strip().replace("_", "")
    mult = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1]) * mult) if mult > 1 else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 1000, 2_000_000, 10M)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return n


def register(subparsers) -> None:
    """Add ``data prepare`` to the ``hpcps`` parser.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers`` returned.
    """
    d = subparsers.add_parser("data", help="prepare data sets for jobs (no MPI)")
    dsub = d.add_subparsers(dest="data_command", required=True)
    sources = "; ".join(f"{n}: {s}" for n, s in SOURCES.items())
    p = dsub.add_parser("prepare", help="write a prepared HDF5 data set",
                        description=f"Read a data set's original files and write data/NAME.h5 "
                                    f"(or --out). Inputs: {sources}.")
    p.add_argument("dataset", choices=sorted(PREPARERS), help="data set name")
    p.add_argument("--from", dest="src", metavar="PATH", help="input file or directory")
    p.add_argument("--out", metavar="PATH", help="output file (default: data/NAME.h5)")
    p.set_defaults(func=cmd_prepare)
    g = dsub.add_parser("generate", help="write a synthetic data set with a known ground truth",
                        description="Write a Criteo-format click log (label, 13 integer and 26 "
                                    "categorical fields) drawn from a seeded ground-truth logistic "
                                    "model over Zipf-distributed ids; DIR/_truth.json holds the "
                                    "distributions and the ground truth's AUC per file.")
    g.add_argument("kind", choices=["criteo-like"], help="what to generate")
    g.add_argument("--rows", type=_count, required=True, help="rows in all (e.g. 1000000 or 1M)")
    g.add_argument("--out", required=True, metavar="DIR", help="output directory")
    g.add_argument("--files", type=_count, default=1, help="number of files (default 1)")
    g.add_argument("--seed", type=int, default=0, help="seed of the model and the rows (default 0)")
    g.add_argument("--compress", choices=["none", "gzip", "zstd"], default="none",
                   help="file compression (default none)")
    g.set_defaults(func=cmd_generate)
