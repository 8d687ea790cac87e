"""RMA pulls (``consistency.pull = "rma"``) vs raw ``Win.Get`` of the same bytes; Get fan-in.

Two modes, by world size::

    mpirun -n 2 python bench/bench_rma.py            # 1 worker reading 1 server: the ratio
    mpirun -n 5 python bench/bench_rma.py --fanin    # 1..4 workers reading 1 server at once

*Ratio* (2 ranks): the worker pulls through :class:`hpcps.worker.client.PSClient` with the
server's :class:`hpcps.comm.rma.ShardWindow` windows (one ``Lock(SHARED)`` epoch: ``Get`` the
shard header, ``Flush``, check freshness, ``Get`` the rows, ``Unlock``; hpcps reads a run of
adjacent rows with one contiguous ``Get``, and scattered rows either with an ``hindexed``
datatype or — when they are dense enough, ``SPAN_BYTES_PER_ROW`` — as the whole byte span
from the first to the last row in one ``Get``, picked out locally), and, interleaved, with raw
mpi4py calls on a window of the same layout made with ``MPI.Win.Allocate``: ``Lock(SHARED)``,
``Get`` of the header and of the same row bytes — one contiguous ``Get`` for a dense block,
an ``hindexed_block`` ``Get`` of the same offsets for sparse keys (what a user reading rows by
hand writes; Open MPI walks it row by row) — ``Unlock``. Both read into buffers reused between reads (hpcps:
``pull(..., out=buf)``). Dense blocks of 1 KiB rows, 8 KiB ... 64 MiB; sparse pulls of
1 k ... 1 M keys of a dim-1 float32 table. Ratio raw time / hpcps time, goal >= 0.8.

*Fan-in*: k = 1 ... N workers read the same ``--fanin-bytes`` dense block of the one server at
the same moment (``inner`` reads each after a barrier), raw and hpcps interleaved; the aggregate
is k x bytes x reads / the slowest worker's time. On a 2-core machine more than one reader
plus the server oversubscribes the cores, so the curve says how reads share the CPU, not how
a many-core node scales.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import benchlib
from psbench import DENSE_DIM, Bench, fmt_bytes, inner_count


def raw_windows(b: Bench, world):
    """Raw windows with the same layout (header + rows) as hpcps's, one per table. Collective."""
    out = []
    for spec in b.specs:
        if b.is_server:
            n = b.header_len * 8 + spec.num_keys * spec.dim * 4
        else:
            n = 0
        win = MPI.Win.Allocate(n, 1, MPI.INFO_NULL, world)
        out.append(win)
    return out


def raw_get(win, target, hdr, out, offsets=None, contiguous_at=None):
    """One passive-target read epoch of the header and rows (the raw variant). Local."""
    win.Lock(target, MPI.LOCK_SHARED)
    win.Get([hdr, hdr.size, MPI.INT64_T], target, (0, hdr.size, MPI.INT64_T))
    if contiguous_at is not None:
        win.Get([out, out.size, MPI.FLOAT], target, (contiguous_at, out.size, MPI.FLOAT))
        win.Unlock(target)
        return
    dim = out.shape[1]
    t = MPI.FLOAT.Create_hindexed_block(dim, offsets).Commit()
    win.Get([out, out.size, MPI.FLOAT], target, (0, 1, t))
    win.Unlock(target)
    t.Free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--fanin", action="store_true", help="only the fan-in curve (any world size)")
    ap.add_argument("--fanin-bytes", type=int, default=8 << 20)
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    size = world.Get_size()
    if not args.fanin and size != 2:
        if world.Get_rank() == 0:
            print("the ratio needs exactly 2 ranks (mpirun -n 2); the fan-in: --fanin with N+1 ranks")
        return 2
    reps = 2 if args.quick else args.reps
    fan_rows = max(1, (64 << 10 if args.quick else args.fanin_bytes) // (DENSE_DIM * 4))
    dense_sizes = [8, 64] if args.quick else [8, 64, 512, 4096, 32768, 65536]
    sparse_sizes = [1000, 5000] if args.quick else [1000, 10_000, 100_000, 1_000_000]
    dense_rows = max(fan_rows, max(dense_sizes))
    sparse_keys = 1 << 16 if args.quick else 1 << 22
    b = Bench(world, dense_rows, sparse_keys, rma=True)
    raws = raw_windows(b, world)
    server = b.roles.server_ranks[0]
    hl = b.header_len
    hdr = np.zeros(hl, dtype=np.int64)
    rep = benchlib.Report("rma_fanin" if args.fanin else "rma")
    if not args.fanin:
        rng = np.random.default_rng(0)
        perm = rng.permutation(sparse_keys).astype(np.int64)
        todo = [("dense", k) for k in dense_sizes] + [("sparse", k) for k in sparse_sizes]
        part = b.client.routing.parts[1] if b.client else None
        times = {c: {"hpcps": [], "raw": []} for c in todo}
        bufs = {c: np.empty((c[1], DENSE_DIM if c[0] == "dense" else 1), dtype=np.float32) for c in todo}
        hbufs = {c: np.zeros_like(v) for c, v in bufs.items()}     # hpcps reads into these
        keys = {c: (np.arange(c[1], dtype=np.int64) if c[0] == "dense" else np.ascontiguousarray(perm[:c[1]]))
                for c in todo}
        for r in range(reps):
            for i, case in enumerate(benchlib.rotate(todo, r)):
                table, k = case
                nbytes = bufs[case].nbytes
                inner = inner_count(nbytes, args.quick)
                for variant in (("raw", "hpcps") if (r + i) % 2 == 0 else ("hpcps", "raw")):
                    b.ctl.Barrier()
                    if b.is_server:
                        if variant == "hpcps":
                            b.serve_block()
                        continue
                    c = b.client
                    t0 = MPI.Wtime()
                    if variant == "hpcps":
                        for _ in range(inner):
                            c.pull(table, keys[case], out=hbufs[case])
                    elif table == "dense":
                        for _ in range(inner):
                            raw_get(raws[0], server, hdr, bufs[case], contiguous_at=hl * 8)
                    else:
                        pos = part.positions(keys[case])                # what the caller knows
                        offs = (hl * 8 + pos * 4).tolist()
                        for _ in range(inner):
                            raw_get(raws[1], server, hdr, bufs[case], offsets=offs)
                    times[case][variant].append((MPI.Wtime() - t0) / inner)
                    if variant == "hpcps":
                        b.end_block()
        if not b.is_server:
            rows = []
            print(f"RMA pull (hpcps, Win.Allocate windows) vs raw Win.Get of the same bytes, "
                  f"1 worker + 1 server")
            print(f"{'case':<26} {'bytes':>11} {'raw us':>10} {'hpcps us':>10} {'raw/hpcps':>9} "
                  f"{'raw GB/s':>9} {'hpcps GB/s':>10}")
            for case in todo:
                table, k = case
                nbytes = bufs[case].nbytes + hl * 8
                r_ = benchlib.median(times[case]["raw"])
                h_ = benchlib.median(times[case]["hpcps"])
                label = (f"dense {fmt_bytes(k * DENSE_DIM * 4)}" if table == "dense"
                         else f"sparse {k:,} keys")
                rows.append({"table": table, "n": k, "bytes": nbytes, "raw_us": r_ * 1e6,
                             "hpcps_us": h_ * 1e6, "ratio": r_ / h_, "label": label,
                             "overhead_us": (h_ - r_) * 1e6})
                print(f"{label:<26} {nbytes:>11,} {r_ * 1e6:>10.1f} {h_ * 1e6:>10.1f} {r_ / h_:>9.2f} "
                      f"{nbytes / r_ / 1e9:>9.2f} {nbytes / h_ / 1e9:>10.2f}")
            rep.details["cases"] = rows
            big = [x for x in rows if x["n"] == max(y["n"] for y in rows if y["table"] == x["table"])]
            for x in big:
                rep.ratio(f"RMA {x['label']}: raw Win.Get / hpcps", x["ratio"], 0.8)
            worst = min(big, key=lambda x: x["ratio"])
            rep.ratio(f"RMA pull, large (worst: {worst['label']}): raw Get / hpcps", worst["ratio"],
                      0.8, headline=True)
            small = [x for x in rows if x["n"] == min(y["n"] for y in rows if y["table"] == x["table"])]
            for x in small:
                rep.ratio(f"RMA {x['label']}: per-read overhead of hpcps", x["overhead_us"], None,
                          unit=" us")
                if x["overhead_us"] < 0:
                    rep.note(f"RMA {x['label']}: the raw read took longer than hpcps's (overhead "
                             f"{x['overhead_us']:.0f} us < 0): disturbed by other processes; rerun")
    else:
        n_workers = b.roles.n_workers
        keys = np.arange(fan_rows, dtype=np.int64)
        out = np.empty((fan_rows, DENSE_DIM), dtype=np.float32)
        hout = np.zeros_like(out)
        nbytes = out.nbytes
        inner = 2 if args.quick else max(3, inner_count(nbytes, False, target=64e6))
        agg = {k: {"hpcps": [], "raw": []} for k in range(1, n_workers + 1)}
        me = b.roles.index
        for r in range(reps):
            for k in benchlib.rotate(range(1, n_workers + 1), r):
                for variant in (("raw", "hpcps") if (r + k) % 2 == 0 else ("hpcps", "raw")):
                    b.ctl.Barrier()
                    el = np.zeros(1)
                    if b.is_server:
                        if variant == "hpcps":
                            b.serve_block()
                    elif me < k:
                        t0 = MPI.Wtime()
                        for _ in range(inner):
                            if variant == "hpcps":
                                b.client.pull("dense", keys, out=hout)
                            else:
                                raw_get(raws[0], server, hdr, out, contiguous_at=hl * 8)
                        el[0] = MPI.Wtime() - t0
                    if not b.is_server and variant == "hpcps":
                        b.end_block()
                    slowest = np.zeros(1)
                    b.ctl.Allreduce(el, slowest, op=MPI.MAX)
                    agg[k][variant].append(k * inner * nbytes / slowest[0] / 1e9)
        if world.Get_rank() == 0:
            print(f"Get fan-in: k workers each reading the same {fmt_bytes(nbytes)} block of one "
                  f"server at once, {inner} reads each; {size} ranks on {benchlib.cpu_count()} cores"
                  + (" (oversubscribed)" if size > benchlib.cpu_count() else ""))
            print(f"{'readers':>7} {'raw GB/s':>9} {'hpcps GB/s':>10} {'hpcps/raw':>9}")
            rows = []
            for k in range(1, n_workers + 1):
                r_, h_ = benchlib.median(agg[k]["raw"]), benchlib.median(agg[k]["hpcps"])
                rows.append({"readers": k, "raw_GBps": r_, "hpcps_GBps": h_})
                print(f"{k:>7} {r_:>9.2f} {h_:>10.2f} {h_ / r_:>9.2f}")
            rep.details["fanin"] = rows
            rep.details["ranks"] = size
            rep.details["oversubscribed"] = size > benchlib.cpu_count()
            rep.ratio(f"RMA fan-in: aggregate GB/s with {n_workers} readers / with 1 (hpcps)",
                      rows[-1]["hpcps_GBps"] / rows[0]["hpcps_GBps"], None, headline=True)
            rep.ratio(f"RMA fan-in, {n_workers} readers: hpcps / raw aggregate",
                      rows[-1]["hpcps_GBps"] / rows[-1]["raw_GBps"], 0.8)
    if world.Get_rank() == 0:
        rep.write(args.json)
        print(rep.last_line())
    for w in raws:
        w.Free()
    b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
