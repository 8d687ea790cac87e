#!/usr/bin/env python
"""Write the featurized Adult train/test splits as svmlight files.

For users who want to exercise hpcps's svmlight path (``hpcps.data.svmlight``) on the
same features the built-in Adult loader produces.  Example::

    python data/prepare_svmlight.py --out-dir runs/adult-svm --hash-bits 20 --index-base 1

writes ``adult_train.svm`` and ``adult_test.svm`` (labels 0/1) and prints the
``n_features`` to read them back with (``2**hash_bits``).  Output is deterministic.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing

from hpcps.data.adult import load_adult_full  # noqa: E402
from hpcps.data.svmlight import write_svmlight  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default=str(HERE / "adult.csv.gz"), help="Adult CSV (default: %(default)s)")
    ap.add_argument("--out-dir", required=True, help="directory for adult_{train,test}.svm")
    ap.add_argument("--hash-bits", type=int, default=20)
    ap.add_argument("--numeric-bins", type=int, default=8)
    ap.add_argument("--no-crosses", action="store_true", help="14 tokens per row instead of 105")
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--index-base", type=int, choices=(0, 1), default=1)
    args = ap.parse_args(argv)

    os.makedirs(args.out_dir, exist_ok=True)
    kw = dict(
        hash_bits=args.hash_bits,
        numeric_bins=args.numeric_bins,
        crosses=not args.no_crosses,
        test_fraction=args.test_fraction,
        split_seed=args.split_seed,
    )
    for split in ("train", "test"):
        X, y = load_adult_full(args.input, split, **kw)
        out = os.path.join(args.out_dir, f"adult_{split}.svm")
        write_svmlight(X, y, out, args.index_base)
        print(f"{out}: {X.shape[0]} rows, nnz {X.nnz}")
    print(f"n_features = {2**args.hash_bits}, index_base = {args.index_base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
