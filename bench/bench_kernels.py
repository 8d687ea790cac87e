"""Benchmark the server update kernel against numpy references.

A push of ``--updates`` keys (Zipf-skewed, so hot keys repeat many times) with one
gradient row each is applied to a float32 table of ``--rows`` rows (dim 1) with
``hpcps.kernels.optim.apply_sparse`` (merge duplicates + SGD / AdaGrad step), and with two
correct pure-numpy implementations of the same step:

* ``add.at``   — ``np.add.at`` sums the duplicates (float32, input order, like ours), the
                 touched rows come from ``np.bincount(keys) > 0``;
* ``bincount`` — ``np.bincount(keys, weights=grads)`` sums them (in float64).

(``w[keys] -= lr * g`` is not a contender: it applies only one update per repeated key.)
Each repetition runs every method once on a fresh copy of the table (the copy is not
timed), in rotating order; the report gives median times and the ratios numpy / ours
(> 1: ours is faster). The last line is a one-line summary.

Usage::

    python bench/bench_kernels.py            # 10 M updates into 1 M rows (~5 s)
    python bench/bench_kernels.py --big      # also into 64 M rows (~40 s, ~3 GB RAM)
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

try:
    from hpcps.kernels.optim import apply_sparse
except ImportError:  # run from a source checkout built with ``setup.py build_ext --inplace``
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from hpcps.kernels.optim import apply_sparse

LR, L2, SCALE, EPS = 0.1, 1e-4, 1.0 / 1024, 1e-8


def make_push(rng, n, rows, a):
    """``n`` keys in ``[0, rows)``: Zipf(a) ranks mapped to random rows; float32 grads."""
    ranks = (rng.zipf(a, size=n) - 1) % rows
    keys = rng.permutation(rows)[ranks].astype(np.int64)
    grads = rng.standard_normal((n, 1)).astype(np.float32)
    return keys, grads


def _step(name, w, acc, rows, G):
    """The update on unique ``rows`` with summed gradients ``G`` (float32 numpy)."""
    f = np.float32
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    if name == "sgd":
        w[rows] = wr - f(LR) * g
    else:
        a = acc[rows] + g * g
        acc[rows] = a
        w[rows] = wr - f(LR) * g / (np.sqrt(a) + f(EPS))


def numpy_add_at(name, w, acc, keys, grads):
    R = w.shape[0]
    G = np.zeros(R, dtype=np.float32)
    np.add.at(G, keys, grads[:, 0])
    rows = np.flatnonzero(np.bincount(keys, minlength=R))
    _step(name, w[:, 0], None if acc is None else acc[:, 0], rows, G[rows])


def numpy_bincount(name, w, acc, keys, grads):
    R = w.shape[0]
    G = np.bincount(keys, weights=grads[:, 0], minlength=R)
    rows = np.flatnonzero(np.bincount(keys, minlength=R))
    _step(name, w[:, 0], None if acc is None else acc[:, 0], rows, G[rows].astype(np.float32))


def ours(name, w, acc, keys, grads):
    apply_sparse(name, w, acc, keys, grads, LR, L2, SCALE, EPS)


METHODS = {"ours": ours, "add.at": numpy_add_at, "bincount": numpy_bincount}


def bench_table(rng, rows, n, reps, a):
    keys, grads = make_push(rng, n, rows, a)
    n_unique = np.unique(keys).shape[0]
    top = np.bincount(keys, minlength=rows).max()
    print(f"\n== table {rows:,} rows x dim 1 float32, push {n:,} keys "
          f"({n_unique:,} distinct, hottest key x{top:,}, Zipf a={a})")
    w0 = (0.01 * rng.standard_normal((rows, 1))).astype(np.float32)
    acc0 = np.full((rows, 1), 0.1, dtype=np.float32)
    w = np.empty_like(w0)
    acc = np.empty_like(acc0)
    ratios = {}
    for name in ("sgd", "adagrad"):
        times = {m: [] for m in METHODS}
        results = {}
        order = list(METHODS)
        for rep in range(reps):
            for m in order:
                np.copyto(w, w0)
                np.copyto(acc, acc0)
                t0 = time.perf_counter()
                METHODS[m](name, w, acc if name == "adagrad" else None, keys, grads)
                times[m].append(time.perf_counter() - t0)
                if rep == 0:
                    results[m] = w.copy()
            order = order[1:] + order[:1]  # rotate: no method always runs first
        for m in ("add.at", "bincount"):  # sanity: same step (float32 rounding aside)
            if not np.allclose(results["ours"], results[m], rtol=1e-3, atol=1e-6):
                raise SystemExit(f"{name}: ours and numpy {m} disagree")
        med = {m: statistics.median(t) for m, t in times.items()}
        for m in METHODS:
            extra = "" if m == "ours" else f"   numpy/ours = {med[m] / med['ours']:6.2f}x"
            print(f"  {name:8s} {m:9s} median {med[m] * 1e3:9.1f} ms "
                  f"(min {min(times[m]) * 1e3:8.1f}, {reps} reps){extra}")
        ratios[name] = {m: med[m] / med["ours"] for m in ("add.at", "bincount")}
        ratios[name]["ours_ms"] = med["ours"] * 1e3
    return ratios


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=10_000_000, help="keys per push")
    ap.add_argument("--rows", type=int, default=1_000_000, help="table rows")
    ap.add_argument("--big", action="store_true", help="also benchmark a 64 M-row table")
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (median)")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the key draw")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}")
    tables = [args.rows] + ([64 * 2**20] if args.big else [])
    summary = []
    for rows in tables:
        r = bench_table(rng, rows, args.updates, args.reps, args.zipf)
        for name in ("sgd", "adagrad"):
            summary.append(f"{rows // 2**20 if rows >= 2**24 else rows / 1e6:g}M-rows {name}: "
                           f"{r[name]['ours_ms']:.0f} ms, x{r[name]['add.at']:.2f} vs add.at, "
                           f"x{r[name]['bincount']:.2f} vs bincount")
    print("\nSUMMARY (numpy time / ours, median, 10M-update pushes float32 dim 1): "
          .replace("10M", f"{args.updates / 1e6:g}M") + "; ".join(summary))


if __name__ == "__main__":
    main()
