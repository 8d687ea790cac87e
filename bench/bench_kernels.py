"""Server update kernels vs the best numpy formulation and vs a memory-bandwidth ceiling.

A push of ``--updates`` keys (Zipf-skewed: hot keys repeat many times) with one float32
gradient row each is applied to a table of 1 M and of 64 M rows (dim 1) by every update rule
``hpcps.optim.RULES`` lists (SGD, AdaGrad, and Adam/FTRL once they exist), through
``hpcps.optim.Optimizer.apply`` — the server's own call: merge duplicate keys, then one step
per distinct row. Contenders, timed in the same run, interleaved, median of ``--reps``:

* ``add.at``   — numpy: ``np.add.at`` sums the duplicates, then the rule on the touched rows;
* ``bincount`` — numpy: ``np.bincount(keys, weights=grads)`` sums them (float64), same step;
  (``w[keys] -= g`` is not a contender: it applies one update per repeated key.)
* ``ceiling``  — a numpy copy (``np.copyto``) moving as many bytes as the update must move at
  the least: stream the keys and gradients in once (12 B per update at dim 1) and read and
  write back every *cache line* the distinct rows touch, in the weights and in each
  optimizer slot (64 B read + 64 B written per line). Random updates are bound by whole
  lines, not by the 4 B they change (see shared/README "Cython"), so counting lines is what
  makes this a real ceiling; a copy of those bytes is the best the memory system can do.

Numpy's step for a rule the script does not know is "numpy merge + our step" (said so in the
table); for Adam and FTRL the numpy step is the textbook one (Kingma & Ba 2015, Alg. 1;
McMahan et al., KDD 2013, Alg. 1), used for its cost, not cross-checked against ours (the
kernels' own unit tests check their values). SGD and AdaGrad are cross-checked.

Ratios: numpy time / ours (goal >= 5) and ceiling time / ours (goal >= 0.5). Last line: the
AdaGrad ratios on the 64 M-row table (or the largest table run).

Usage::

    python bench/bench_kernels.py                  # 1 M and 64 M rows (~1-2 min, ~3 GB RAM)
    python bench/bench_kernels.py --tables 1000000 --zipf 1.1 2.0
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import benchlib

benchlib.ensure_importable()

from hpcps import optim  # noqa: E402

LR, L2, SCALE, EPS = 0.1, 1e-4, 1.0 / 1024, 1e-8
LINE = 64  # bytes per cache line
B1, B2, FTRL_ALPHA, FTRL_BETA, FTRL_L1 = 0.9, 0.999, 0.1, 1.0, 0.0


def make_push(rng, n, rows, a):
    """``n`` int64 keys in ``[0, rows)``: Zipf(a) ranks mapped to random rows; float32 grads."""
    ranks = (rng.zipf(a, size=n) - 1) % rows
    keys = rng.permutation(rows)[ranks].astype(np.int64)
    grads = rng.standard_normal((n, 1)).astype(np.float32)
    return keys, grads


# ---------------------------------------------------------------- numpy steps (unique rows)

def _np_sgd(w, slots, rows, G):
    f = np.float32
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    w[rows] = wr - f(LR) * g


def _np_adagrad(w, slots, rows, G):
    f = np.float32
    acc = slots[0]
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    a = acc[rows] + g * g
    acc[rows] = a
    w[rows] = wr - f(LR) * g / (np.sqrt(a) + f(EPS))


def _np_adam(w, slots, rows, G):
    f = np.float32
    m, v = slots[0], slots[1]
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    mr = f(B1) * m[rows] + f(1 - B1) * g
    vr = f(B2) * v[rows] + f(1 - B2) * g * g
    m[rows] = mr
    v[rows] = vr
    w[rows] = wr - f(LR) * (mr / f(1 - B1)) / (np.sqrt(vr / f(1 - B2)) + f(EPS))


def _np_ftrl(w, slots, rows, G):
    f = np.float32
    z, nn = slots[0], slots[1]
    wr = w[rows]
    g = f(SCALE) * G
    nr = nn[rows]
    n2 = nr + g * g
    zr = z[rows] + g - (np.sqrt(n2) - np.sqrt(nr)) / f(FTRL_ALPHA) * wr
    z[rows] = zr
    nn[rows] = n2
    w[rows] = np.where(np.abs(zr) <= f(FTRL_L1), f(0),
                       -(zr - np.sign(zr) * f(FTRL_L1)) / ((f(FTRL_BETA) + np.sqrt(n2)) / f(FTRL_ALPHA) + f(L2)))


NUMPY_STEPS = {"sgd": _np_sgd, "adagrad": _np_adagrad, "adam": _np_adam, "ftrl": _np_ftrl}
CROSS_CHECKED = ("sgd", "adagrad")


def slot_list(slots) -> list:
    """The optimizer's per-row state as a list of arrays (None, one array, or a sequence/dict)."""
    if slots is None:
        return []
    if isinstance(slots, np.ndarray):
        return [slots]
    if isinstance(slots, dict):
        return list(slots.values())
    return list(slots)


def restore(dst, src) -> None:
    """Copy the arrays of ``src`` into ``dst`` (same structure; not timed)."""
    for d, s in zip(slot_list(dst), slot_list(src)):
        np.copyto(d, s)


def make_numpy(rule, opt, merge):
    step = NUMPY_STEPS.get(rule)

    def run(w, slots, keys, grads):
        R = w.shape[0]
        if merge == "add.at":
            G = np.zeros(R, dtype=np.float32)
            np.add.at(G, keys, grads[:, 0])
        else:
            G = np.bincount(keys, weights=grads[:, 0], minlength=R)
        rows = np.flatnonzero(np.bincount(keys, minlength=R))
        Gr = G[rows].astype(np.float32)
        if step is None:      # a rule this script has no numpy step for: numpy merge + ours
            opt.apply(w, slots, rows, Gr[:, None], SCALE)
        else:
            step(w[:, 0], [s[:, 0] for s in slot_list(slots)], rows, Gr)
    return run


def lines_touched(keys, rows, dim, itemsize) -> int:
    """Distinct cache lines holding the rows of ``keys`` in a C-order (rows, dim) array."""
    row_bytes = dim * itemsize
    if row_bytes >= LINE:
        per_row = -(-row_bytes // LINE) + 1       # a row may straddle one more line
        return int(np.unique(keys).size * per_row)
    touched = np.zeros(rows * row_bytes // LINE + 1, dtype=bool)
    touched[(keys * row_bytes) // LINE] = True
    touched[(keys * row_bytes + row_bytes - 1) // LINE] = True
    return int(touched.sum())


def bench_case(rng, rows, n, a, reps, rules, results):
    keys, grads = make_push(rng, n, rows, a)
    distinct = int(np.unique(keys).size)
    lines = lines_touched(keys, rows, 1, 4)
    print(f"\n== {rows:,} rows x dim 1 float32 ({rows * 4 / 2**20:,.0f} MiB), push of {n:,} keys, "
          f"Zipf a={a}: {distinct:,} distinct rows ({100 * (1 - distinct / n):.1f} % duplicates), "
          f"{lines:,} cache lines touched", flush=True)
    w0 = (0.01 * rng.standard_normal((rows, 1))).astype(np.float32)
    w = np.empty_like(w0)
    for rule in rules:
        opt = optim.Optimizer(rule, learning_rate=LR, l2=L2)
        slots0 = opt.init_slots(w0.shape, np.float32)
        for s in slot_list(slots0):         # non-trivial state (AdaGrad's 0.1 stays)
            if not s.any():
                s[...] = 0.01 * np.abs(rng.standard_normal(s.shape)).astype(np.float32)
        slots = opt.init_slots(w0.shape, np.float32)
        n_slots = len(slot_list(slots0))
        must = n * (8 + 4) + 2 * LINE * lines * (1 + n_slots)    # bytes read + written, at least
        src = np.ones(must // 8, dtype=np.float32)                # copy of must/2 bytes moves `must`
        dst = np.empty_like(src)
        methods = {
            "ours": lambda: opt.apply(w, slots, keys, grads, SCALE),
            "add.at": lambda f=make_numpy(rule, opt, "add.at"): f(w, slots, keys, grads),
            "bincount": lambda f=make_numpy(rule, opt, "bincount"): f(w, slots, keys, grads),
            "ceiling": lambda: np.copyto(dst, src),
        }
        times = {m: [] for m in methods}
        outs = {}
        for rep in range(reps):
            for m in benchlib.rotate(methods, rep):
                np.copyto(w, w0)
                restore(slots, slots0)
                times[m].append(benchlib.time_once(methods[m]))
                if rep == 0 and m != "ceiling":
                    outs[m] = w.copy()
        if rule in CROSS_CHECKED:
            for m in ("add.at", "bincount"):
                if not np.allclose(outs["ours"], outs[m], rtol=1e-3, atol=1e-6):
                    raise SystemExit(f"{rule}: ours and numpy {m} disagree")
        med = {m: benchlib.median(t) for m, t in times.items()}
        best_np = min(med["add.at"], med["bincount"])
        label = "numpy" if rule in NUMPY_STEPS else "numpy merge + our step"
        rec = {"rows": rows, "updates": n, "zipf": a, "rule": rule, "distinct": distinct,
               "lines": lines, "slots": n_slots, "bytes_must": must,
               "ms": {m: 1e3 * v for m, v in med.items()},
               "numpy_over_ours": best_np / med["ours"],
               "ceiling_over_ours": med["ceiling"] / med["ours"],
               "ours_updates_per_s": n / med["ours"],
               "ceiling_GBps": must / med["ceiling"] / 1e9, "numpy_kind": label,
               "cross_checked": rule in CROSS_CHECKED}
        results.append(rec)
        print(f"  {rule:8s} ours {med['ours'] * 1e3:8.1f} ms ({n / med['ours'] / 1e6:6.0f} M upd/s) | "
              f"{label}: add.at {med['add.at'] * 1e3:7.1f}, bincount {med['bincount'] * 1e3:7.1f} ms "
              f"-> x{rec['numpy_over_ours']:.2f} | ceiling {med['ceiling'] * 1e3:6.1f} ms "
              f"({must / 1e6:,.0f} MB at {rec['ceiling_GBps']:.1f} GB/s) -> {rec['ceiling_over_ours']:.2f} "
              f"of it", flush=True)
        del src, dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=10_000_000, help="keys per push")
    ap.add_argument("--tables", type=int, nargs="+", default=[1_000_000, 64 * 2**20],
                    help="table sizes in rows")
    ap.add_argument("--zipf", type=float, nargs="+", default=[1.1, 2.0],
                    help="Zipf exponents of the key draw (the largest table uses the first)")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median)")
    ap.add_argument("--seed", type=int, default=0)
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.updates, args.tables, args.reps, args.zipf = 20_000, [5_000, 200_000], 2, args.zipf[:1]
    rng = np.random.default_rng(args.seed)
    rules = list(optim.RULES)
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}; rules {', '.join(rules)}")
    results: list = []
    big = max(args.tables)
    for rows in args.tables:
        for a in (args.zipf[:1] if rows == big and len(args.tables) > 1 else args.zipf):
            reps = 2 if rows == big and len(args.tables) > 1 else args.reps   # ~1 s per method
            bench_case(rng, rows, args.updates, a, reps, rules, results)
    rep = benchlib.Report("kernels", argv)
    rep.details["cases"] = results
    head = [r for r in results if r["rows"] == big and r["rule"] == "adagrad"][:1] or results[-1:]
    h = head[0]
    tag = f"{h['rule']}, {h['rows'] / 2**20:g} Mi rows" if h["rows"] >= 2**20 else f"{h['rule']}, {h['rows']:,} rows"
    rep.ratio(f"kernel {tag}: best numpy / ours", h["numpy_over_ours"], 5, headline=True)
    rep.ratio(f"kernel {tag}: ours / bandwidth ceiling", h["ceiling_over_ours"], 0.5, headline=True)
    worst_np = min(results, key=lambda r: r["numpy_over_ours"])
    rep.ratio(f"kernel worst case ({worst_np['rule']}, {worst_np['rows']:,} rows, Zipf {worst_np['zipf']}): "
              "best numpy / ours", worst_np["numpy_over_ours"], 5)
    if any(r["rule"] not in NUMPY_STEPS for r in results):
        rep.note("rules without a numpy step in the script are compared with numpy's merge + our step")
    rep.write(args.json)
    print("\n" + rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
