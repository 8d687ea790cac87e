"""Server update kernels vs the best numpy formulation and vs a memory-bandwidth ceiling.

A push of ``--updates`` keys (Zipf-skewed: hot keys repeat many times) with one float32
gradient row each is applied to a table of 1 M and of 64 M rows (dim 1) by every update rule
``hpcps.core.optim.RULES`` lists (SGD, AdaGrad, Adam, FTRL), through
``hpcps.core.optim.Optimizer.apply`` — the server's own call: merge duplicate keys, then one step
per distinct row (Adam's and FTRL's state packed in one record per row; the merge keeps its
zeroed scratch buffers between calls, so ``ours`` runs once untimed first, as a server has
applied pushes before). Contenders, timed in the same run, interleaved, median of ``--reps``:

* ``add.at``   — numpy: ``np.add.at`` sums the duplicates, then the rule on the touched rows;
* ``bincount`` — numpy: ``np.bincount(keys, weights=grads)`` sums them (float64), same step;
  (``w[keys] -= g`` is not a contender: it applies one update per repeated key.) The numpy
  steps keep each optimizer slot in an array of its own, as numpy code would;
* ``ceiling``  — a numpy copy (``np.copyto``) moving as many bytes as the update must move at
  the least: stream the keys and gradients in once (12 B per update at dim 1) and read and
  write back every *cache line* the distinct rows touch, in the weights and in the
  optimizer state as laid out (64 B read + 64 B written per line). Random updates are bound by whole
  lines, not by the 4 B they change (see shared/README "Cython"), so counting lines is what
  makes this a real ceiling; a copy of those bytes is the best the memory system can do.

Numpy's step for a rule the script does not know is "numpy merge + our step" (said so in the
table); for Adam and FTRL the numpy step is the textbook one (Kingma & Ba 2015, Alg. 1, lazy
with a step count per row; McMahan et al., KDD 2013, Alg. 1). Every rule is cross-checked
(with ``bincount``'s float64 sums, Adam's normalised step of about +-lr may flip sign for the
few rows whose summed gradient nearly cancels: up to 0.1 % of the rows may differ).

``step`` lines: the rule alone on the push's distinct rows, sorted, with their summed
gradients (what a server applies after the merge) — ``hpcps.kernels.optim.sparse_<rule>``
against the numpy step on the same rows.

Ratios: numpy time / ours (goal >= 5) and ceiling time / ours (goal >= 0.5). Last line: the
AdaGrad ratios on the 64 M-row table (or the largest table run).

Usage::

    python bench/bench_kernels.py                  # 1 M and 64 M rows (~1-2 min; ~7.8 GB RAM at peak in a user's run)
    python bench/bench_kernels.py --tables 1000000 --zipf 1.1 2.0
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import benchlib

benchlib.ensure_importable()

from hpcps.core import optim  # noqa: E402
from hpcps.kernels import optim as K  # noqa: E402

LR, L2, SCALE, EPS = 0.1, 1e-4, 1.0 / 1024, 1e-8
LINE = 64  # bytes per cache line
B1, B2 = 0.9, 0.999                                  # adam
FTRL_BETA, FTRL_L1, FTRL_L2 = 1.0, 1e-5, 1e-3        # ftrl (alpha = LR)


def make_push(rng, n, rows, a):
    """``n`` int64 keys in ``[0, rows)``: Zipf(a) ranks mapped to random rows; float32 grads."""
    ranks = (rng.zipf(a, size=n) - 1) % rows
    keys = rng.permutation(rows)[ranks].astype(np.int64)
    grads = rng.standard_normal((n, 1)).astype(np.float32)
    return keys, grads


# ---------------------------------------------------------------- numpy steps (unique rows)

def _np_sgd(w, S, rows, G):
    f = np.float32
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    w[rows] = wr - f(LR) * g


def _np_adagrad(w, S, rows, G):
    f = np.float32
    acc = S["accumulator"]
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    a = acc[rows] + g * g
    acc[rows] = a
    w[rows] = wr - f(LR) * g / (np.sqrt(a) + f(EPS))


def _np_adam(w, S, rows, G):
    f = np.float32
    m, v, step = S["m"], S["v"], S["step"]
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    t = step[rows] + 1
    step[rows] = t
    mr = f(B1) * m[rows] + (f(1) - f(B1)) * g
    vr = f(B2) * v[rows] + (f(1) - f(B2)) * (g * g)
    m[rows] = mr
    v[rows] = vr
    bc1 = (1.0 - np.power(B1, t)).astype(f)
    bc2 = (1.0 - np.power(B2, t)).astype(f)
    w[rows] = wr - f(LR) * (mr / bc1) / (np.sqrt(vr / bc2) + f(EPS))


def _np_ftrl(w, S, rows, G):
    f = np.float32
    z, nn = S["z"], S["n"]
    wr = w[rows]
    g = f(SCALE) * G + f(L2) * wr
    nr = nn[rows]
    n2 = nr + g * g
    sn = np.sqrt(n2)
    zr = z[rows] + g - (sn - np.sqrt(nr)) / f(LR) * wr
    z[rows] = zr
    nn[rows] = n2
    w[rows] = np.where(np.abs(zr) <= f(FTRL_L1), f(0),
                       -(zr - np.sign(zr) * f(FTRL_L1)) / ((f(FTRL_BETA) + sn) / f(LR) + f(FTRL_L2)))


NUMPY_STEPS = {"sgd": _np_sgd, "adagrad": _np_adagrad, "adam": _np_adam, "ftrl": _np_ftrl}
CROSS_CHECKED = ("sgd", "adagrad", "adam", "ftrl")


def separate(opt, slots) -> dict:
    """The optimizer's slots as separate C-contiguous 1-D arrays (numpy's layout)."""
    return {k: np.ascontiguousarray(v.reshape(v.shape[0], -1)[:, 0])
            for k, v in opt.slots_dict(slots).items()}


def restore(dst, src) -> None:
    """Copy the state ``src`` into ``dst`` (same structure: None, an array or a dict)."""
    if isinstance(dst, dict):
        for k in dst:
            np.copyto(dst[k], src[k])
    elif dst is not None:
        np.copyto(dst, src)


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
            step(w[:, 0], slots, rows, Gr)
    return run


def kernel_step(rule, opt, w, slots, rows, G):
    """The rule alone on unique sorted ``rows`` (no merge): ``sparse_<rule>``."""
    if rule == "sgd":
        K.sparse_sgd(w, rows, G, LR, L2, SCALE)
    elif rule == "adagrad":
        K.sparse_adagrad(w, slots, rows, G, LR, L2, SCALE, EPS)
    elif rule == "adam":
        K.sparse_adam(w, slots, rows, G, LR, L2, SCALE, B1, B2, EPS)
    elif rule == "ftrl":
        K.sparse_ftrl(w, slots, rows, G, LR, FTRL_BETA, FTRL_L1, FTRL_L2, L2, SCALE)
    else:
        opt.apply(w, slots, rows, G, SCALE)


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
        opt = optim.Optimizer(rule, learning_rate=LR, l2=L2, beta1=B1, beta2=B2, beta=FTRL_BETA,
                              lambda1=FTRL_L1, lambda2=FTRL_L2)
        slots0 = opt.init_slots(w0.shape, np.float32)
        for name, s in opt.slots_dict(slots0).items():   # non-trivial state (AdaGrad's 0.1 stays)
            if not s.any():
                s[...] = (rng.integers(0, 100, s.shape) if name == "step" else
                          0.01 * np.abs(rng.standard_normal(s.shape)).astype(np.float32))
        slots = opt.init_slots(w0.shape, np.float32)
        np_slots0 = separate(opt, slots0) if slots0 is not None else {}
        np_slots = {k: v.copy() for k, v in np_slots0.items()}
        n_slots = len(opt.slot_names)
        # the state's own layout: AdaGrad's array like w, Adam's/FTRL's packed records
        state_row = opt.slot_bytes_per_row(1, np.float32)
        state_lines = lines_touched(keys, rows, 1, state_row) if state_row else 0
        must = n * (8 + 4) + 2 * LINE * (lines + state_lines)     # bytes read + written, at least
        src = np.ones(must // 8, dtype=np.float32)                # copy of must/2 bytes moves `must`
        dst = np.empty_like(src)
        methods = {
            "ours": lambda: opt.apply(w, slots, keys, grads, SCALE),
            "add.at": lambda f=make_numpy(rule, opt, "add.at"): f(w, np_slots, keys, grads),
            "bincount": lambda f=make_numpy(rule, opt, "bincount"): f(w, np_slots, keys, grads),
            "ceiling": lambda: np.copyto(dst, src),
        }
        times = {m: [] for m in methods}
        outs = {}
        methods["ours"]()      # warm-up, untimed: the kernel keeps its scratch buffers between
        np.copyto(w, w0)       # pushes (a server applies many), so the first call's page
        restore(slots, slots0)  # faults are not part of the steady state; numpy keeps nothing
        for rep in range(reps):
            for m in benchlib.rotate(methods, rep):
                np.copyto(w, w0)
                restore(slots, slots0)
                restore(np_slots, np_slots0)
                times[m].append(benchlib.time_once(methods[m]))
                if rep == 0 and m != "ceiling":
                    outs[m] = w.copy()
        if rule in CROSS_CHECKED:
            for m, allowed in (("add.at", 0), ("bincount", 1e-3 * distinct)):
                bad = np.count_nonzero(~np.isclose(outs["ours"], outs[m], rtol=1e-3, atol=1e-6))
                if bad > allowed:
                    raise SystemExit(f"{rule}: ours and numpy {m} disagree on {bad} rows")
        # the rule alone on the push's distinct rows
        urows, G = K.merge_duplicates(keys, grads)
        st = {"ours": [], "numpy": []}
        for rep in range(reps):
            for m in benchlib.rotate(["ours", "numpy"], rep):
                np.copyto(w, w0)
                restore(slots, slots0)
                restore(np_slots, np_slots0)
                if m == "ours":
                    st[m].append(benchlib.time_once(lambda: kernel_step(rule, opt, w, slots, urows, G)))
                else:
                    st[m].append(benchlib.time_once(
                        lambda: (NUMPY_STEPS[rule](w[:, 0], np_slots, urows, G[:, 0])
                                 if rule in NUMPY_STEPS else opt.apply(w, slots, urows, G, SCALE))))
        med = {m: benchlib.median(t) for m, t in times.items()}
        smed = {m: benchlib.median(t) for m, t in st.items()}
        best_np = min(med["add.at"], med["bincount"])
        label = "numpy" if rule in NUMPY_STEPS else "numpy merge + our step"
        rec = {"rows": rows, "updates": n, "zipf": a, "rule": rule, "distinct": distinct,
               "lines": lines, "state_lines": state_lines, "slots": n_slots, "bytes_must": must,
               "ms": {m: 1e3 * v for m, v in med.items()},
               "numpy_over_ours": best_np / med["ours"],
               "ceiling_over_ours": med["ceiling"] / med["ours"],
               "ours_updates_per_s": n / med["ours"],
               "step_ms": {m: 1e3 * v for m, v in smed.items()},
               "step_rows_per_s": distinct / smed["ours"],
               "step_numpy_over_ours": smed["numpy"] / smed["ours"],
               "ceiling_GBps": must / med["ceiling"] / 1e9, "numpy_kind": label,
               "cross_checked": rule in CROSS_CHECKED}
        results.append(rec)
        print(f"  {rule:8s} ours {med['ours'] * 1e3:8.1f} ms ({n / med['ours'] / 1e6:6.0f} M upd/s) | "
              f"{label}: add.at {med['add.at'] * 1e3:7.1f}, bincount {med['bincount'] * 1e3:7.1f} ms "
              f"-> x{rec['numpy_over_ours']:.2f} | ceiling {med['ceiling'] * 1e3:6.1f} ms "
              f"({must / 1e6:,.0f} MB at {rec['ceiling_GBps']:.1f} GB/s) -> {rec['ceiling_over_ours']:.2f} "
              f"of it", flush=True)
        print(f"  {rule:8s} step {smed['ours'] * 1e3:8.1f} ms ({distinct / smed['ours'] / 1e6:6.0f} M rows/s) | "
              f"numpy step {smed['numpy'] * 1e3:7.1f} ms -> x{rec['step_numpy_over_ours']:.2f}", flush=True)
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
    rep.ratio(f"kernel {tag}: ours / bandwidth ceiling", h["ceiling_over_ours"], 0.5, headline=True,
              bound=1.0)
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
