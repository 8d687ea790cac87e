"""Dynamic (hash) table update kernel vs the fixed-array kernel, and its bytes per key.

For each table size N (distinct keys; default 10^6 and 10^8) and each rule (AdaGrad and
FTRL, float32, dim 1):

* the keys are N distinct 64-bit ids (a bijective mix of the rank: spread over all of
  int64, as raw or hashed click-log ids are), all inserted into a
  :class:`hpcps.kernels.hashtable.HashTable` first; the fixed table holds the same N rows
  at a random permutation of ``[0, N)`` (so neither layout profits from hot ranks being
  neighbours);
* ``--pushes`` pushes of ``--updates`` keys each, ranks drawn Zipf(``--zipf``, default 1.1)
  folded into ``[0, N)`` as bench_kernels does, one float32 gradient row per key;
* timed (wall clock, and process CPU time beside it), interleaved, median of ``--reps``: ``hash`` = ``HashTable.apply`` (find each key's
  record through the index, sum duplicates, step each distinct row) and ``fixed`` =
  ``hpcps.core.optim.Optimizer.apply`` on the fixed rows (the server's call: merge
  duplicates, step each distinct row). The two end bitwise equal (checked).

Ratios: updates/s of ``hash`` / updates/s of ``fixed`` (goal >= 0.5; medians, and also
printed for the fastest repetition of each, which a preempted repetition cannot lower) and resident bytes per
stored key / the arithmetic minimum (8 B key + row + optimizer state; goal <= 2). The
resident bytes are the process's RSS growth (``/proc/self/statm``) while the N keys are
inserted into an empty table (index growth and arena copies included), divided by N.

Usage::

    python bench/bench_hashtable.py                       # 10^6 and 10^8 keys (~5-6 GB, ~5-10 min)
    python bench/bench_hashtable.py --sizes 1000000       # 10^6 only
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np

import benchlib

benchlib.ensure_importable()

from hpcps.core.optim import Optimizer  # noqa: E402
from hpcps.core.tables import _splitmix_mix  # noqa: E402
from hpcps.kernels.hashtable import HashTable  # noqa: E402

LR, L2, SCALE = 0.1, 1e-4, 1.0 / 1024
HYPER = {"adagrad": dict(initial_accumulator=0.1),
         "ftrl": dict(beta=1.0, lambda1=1e-5, lambda2=1e-3)}


def rss_bytes() -> int:
    """Resident set size of this process, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ids_of_ranks(ranks) -> np.ndarray:
    """Distinct int64 ids for distinct ranks: a bijection of uint64 (odd multiply, add,
    SplitMix64's mix), so ids cover all of int64."""
    r = np.asarray(ranks, dtype=np.uint64)
    return _splitmix_mix(r * np.uint64(0xD1B54A32D192ED03) + np.uint64(12345)).view(np.int64)


def build_hash(rule, n_keys, dtype, chunk=1 << 20):
    """A table with ranks 0..n_keys-1 inserted; returns (table, RSS growth in bytes)."""
    gc.collect()
    before = rss_bytes()
    opt = HYPER[rule]
    t = HashTable(1, dtype, rule, lr=LR, l2=L2, **opt)
    for lo in range(0, n_keys, chunk):
        t.insert(ids_of_ranks(np.arange(lo, min(lo + chunk, n_keys))))
    gc.collect()
    return t, rss_bytes() - before


def bench(rule, n_keys, args, rng, rep):
    dtype = np.dtype(args.dtype)
    t0 = time.perf_counter()
    table, grown = build_hash(rule, n_keys, dtype)
    build_s = time.perf_counter() - t0
    per_key = grown / n_keys
    minimum = table.min_record_bytes
    opt = Optimizer(rule, LR, l2=L2, **HYPER[rule])
    perm = rng.permutation(n_keys).astype(np.int64)          # rank -> fixed row
    w = np.zeros((n_keys, 1), dtype=dtype)
    slots = opt.init_slots(w.shape, dtype, w=w)
    pushes = []
    for _ in range(args.pushes):
        ranks = ((rng.zipf(args.zipf, size=args.updates) - 1) % n_keys).astype(np.int64)
        g = rng.standard_normal((args.updates, 1)).astype(dtype)
        pushes.append((ids_of_ranks(ranks), perm[ranks], g))
    distinct = np.mean([np.unique(p[1]).size for p in pushes])

    def run_hash():
        for keys, _, g in pushes:
            table.apply(keys, g, SCALE)

    def run_fixed():
        for _, rows, g in pushes:
            opt.apply(w, slots, rows, g, SCALE)

    run_hash(), run_fixed()                                   # warm (scratch buffers)
    times = {"hash": [], "fixed": []}
    cpu = {"hash": [], "fixed": []}        # process CPU time: not lengthened by preemption
    for r in range(args.reps):
        for name in benchlib.rotate(["hash", "fixed"], r):
            c0 = time.process_time()
            times[name].append(benchlib.time_once(run_hash if name == "hash" else run_fixed))
            cpu[name].append(time.process_time() - c0)
    # both applied the same pushes the same number of times: bitwise equal rows
    probe = np.unique(np.concatenate([p[1] for p in pushes]))
    inv = np.empty(n_keys, dtype=np.int64)
    inv[perm] = np.arange(n_keys)
    same = np.array_equal(table.gather(ids_of_ranks(inv[probe])), w[probe])
    n_upd = args.pushes * args.updates
    th, tf = benchlib.median(times["hash"]), benchlib.median(times["fixed"])
    best = min(times["fixed"]) / min(times["hash"])
    cpu_ratio = benchlib.median(cpu["fixed"]) / benchlib.median(cpu["hash"])
    res = {"rule": rule, "keys": n_keys, "dtype": dtype.name, "updates_per_push": args.updates,
           "pushes": args.pushes, "distinct_per_push": float(distinct),
           "hash_updates_per_s": n_upd / th, "fixed_updates_per_s": n_upd / tf,
           "ratio": tf / th, "ratio_of_best": best, "ratio_cpu": cpu_ratio, "rss_bytes_per_key": per_key, "min_bytes_per_key": minimum,
           "record_bytes": table.record_bytes, "index_load": len(table) / table.index_slots,
           "table_nbytes_per_key": table.nbytes / len(table), "build_s": build_s,
           "bitwise_equal": same}
    print(f"{rule:8s} {n_keys:>12,} keys  hash {n_upd / th / 1e6:7.1f} M upd/s  fixed "
          f"{n_upd / tf / 1e6:7.1f} M upd/s  ratio {tf / th:5.2f} (of the best reps {best:4.2f}, of CPU times {cpu_ratio:4.2f})  |  RSS {per_key:5.1f} B/key "
          f"(record {table.record_bytes} B, index load {res['index_load']:.2f}), minimum "
          f"{minimum} B -> {per_key / minimum:4.2f}x  |  build {build_s:5.1f} s  "
          f"distinct/push {distinct:,.0f}  equal {same}", flush=True)
    if not same:
        rep.note(f"{rule} {n_keys:,}: hash and fixed tables differ after the same pushes")
    del table, w, slots, pushes
    gc.collect()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**6, 10**8],
                    help="distinct keys per table (default 10^6 10^8)")
    ap.add_argument("--rules", nargs="+", default=["adagrad", "ftrl"], choices=sorted(HYPER))
    ap.add_argument("--updates", type=int, default=1 << 17, help="keys per push")
    ap.add_argument("--pushes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.updates, args.pushes, args.reps = [20_000, 200_000], 4096, 2, 2
    rep = benchlib.Report("hashtable")
    rng = np.random.default_rng(20261202)
    results = [bench(rule, n, args, rng, rep) for n in args.sizes for rule in args.rules]
    rep.details["results"] = results
    for r in results:
        tag = f"{r['rule']}, {r['keys']:,} keys, Zipf {args.zipf}, {r['dtype']}"
        rep.ratio(f"hash/fixed updates/s ({tag})", r["ratio"], 0.5)
        rep.ratio(f"RSS bytes per key / minimum ({tag})", r["rss_bytes_per_key"]
                  / r["min_bytes_per_key"], 2.0, higher_is_better=False)
    big = [r for r in results if r["keys"] == max(args.sizes)]
    worst = min(big, key=lambda r: r["ratio"])
    worst_mem = max(big, key=lambda r: r["rss_bytes_per_key"] / r["min_bytes_per_key"])
    rep.ratio(f"hash/fixed updates/s, worst at {worst['keys']:,} keys ({worst['rule']})",
              worst["ratio"], 0.5, headline=True)
    rep.ratio(f"bytes/key over minimum, worst at {worst_mem['keys']:,} keys ({worst_mem['rule']})",
              worst_mem["rss_bytes_per_key"] / worst_mem["min_bytes_per_key"], 2.0,
              higher_is_better=False, headline=True)
    for n in rep.notes:
        print("note:", n)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
