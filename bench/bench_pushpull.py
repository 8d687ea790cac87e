"""Push and pull through the hpcps client vs raw mpi4py ``Send``/``Recv`` of the same bytes.

Run with exactly 2 ranks (1 worker, 1 server)::

    mpirun -n 2 python bench/bench_pushpull.py

For each case the worker times a block of operations with hpcps
(:class:`hpcps.worker.client.PSClient` ``pull``/``push`` against a real
:class:`~hpcps.server.server.ParameterServer` loop) and a block of the same messages with
raw blocking ``Send``/``Recv`` between the same two ranks — the same bytes each way: the
request header (64 B), the keys (int64) and, for pushes, the values; for pulls the rows and
the shard's clock header back. The raw server receives into buffers allocated once and replies
from its table's memory; hpcps's server computes local rows, gathers (or, for a block of
consecutive rows, replies from a view), validates and queues. Both variants pull into a buffer
reused from one operation to the next (hpcps: ``pull(..., out=buf)``); a new result array of
many MiB would add first-touch page faults (~0.3-0.5 ms per MiB on this machine).

Cases: dense blocks of consecutive 1 KiB rows (8 KiB ... 64 MiB) pulled and pushed; sparse
pushes and pulls of 8 (``SMALL``: the per-request overhead) and 1 k ... 1 M random keys of a 4 M-key dim-1 float32 table. A block of push
operations ends with one small round trip in both variants (so pushes are timed to their
arrival, not just to the local send). Variants alternate, the case order rotates, median of
``--reps``. Ratios: raw time / hpcps time (1 = as fast as raw MPI; goal >= 0.8 for large
messages) and, for small messages, the per-message overhead hpcps adds (microseconds). For the
largest sparse pull, raw time / the server's gather alone of the same keys (no MPI): the best
ratio any pull that gathers random rows can reach on this machine (raw MPI sends a contiguous
block; the gather is bound by memory latency).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import benchlib
from psbench import DENSE_DIM, Bench, fmt_bytes, inner_count

from hpcps.comm.core import abort_on_error  # noqa: E402  (importable once psbench ran)
from hpcps.comm.progress import library_version  # noqa: E402

HDR = 8
#: keys of the "small" sparse pull and push: the per-request overhead of hpcps at the server
#: and the client, beside raw Send/Recv of the same bytes (goal: at most PER_REQUEST_GOAL_US)
SMALL = 8
PER_REQUEST_GOAL_US = 10.0


def cases(quick: bool):
    dense_rows = [8, 64] if quick else [8, 64, 512, 4096, 32768, 65536]     # x 1 KiB
    sparse_n = [SMALL, 1000, 5000] if quick else [SMALL, 1000, 10_000, 100_000, 1_000_000]
    out = []
    for op in ("pull", "push"):
        out += [("dense", op, k) for k in dense_rows]
        out += [("sparse", op, k) for k in sparse_n]
    return out, max(dense_rows), (1 << 16 if quick else 1 << 22)


def payload_bytes(table, op, k, hl):
    """Bytes each way for one operation: (worker -> server, server -> worker)."""
    row = DENSE_DIM * 4 if table == "dense" else 4
    up = HDR * 8 + 8 * k + (row * k if op == "push" else 0)
    down = (row * k + hl * 8) if op == "pull" else 0
    return up, down


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--notices", action="store_true",
                    help="run inside abort_on_error(notify=True), as hpcps train does: with the "
                         "thread that listens for another rank's input error "
                         "(hpcps.comm.notices), to measure what it costs")
    ap.add_argument("--only", metavar="CASES",
                    help="run only these cases, e.g. 'sparse:8,sparse:1000000' (table:n)")
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    if args.notices:
        with abort_on_error(world, notify=True):
            return run(args, world)
    return run(args, world)


def run(args, world) -> int:
    """The benchmark (see the module docstring). Collective over ``world`` (2 ranks)."""
    if world.Get_size() != 2:
        if world.Get_rank() == 0:
            print("bench_pushpull.py needs exactly 2 ranks: mpirun -n 2 python bench/bench_pushpull.py")
        return 2
    reps = 2 if args.quick else args.reps
    todo, dense_rows, sparse_keys = cases(args.quick)
    if args.only:
        want = {(t, int(n)) for t, n in (c.split(":") for c in args.only.split(","))}
        todo = [c for c in todo if (c[0], c[2]) in want]
    b = Bench(world, dense_rows, sparse_keys)
    raw = world.Dup()
    peer = 1 - world.Get_rank()
    rng = np.random.default_rng(0)
    hl = b.header_len
    # buffers (allocated once; the raw variant never allocates)
    keys = {("dense", k): np.arange(k, dtype=np.int64) for t, _, k in todo if t == "dense"}
    perm = rng.permutation(sparse_keys).astype(np.int64)
    keys.update({("sparse", k): np.ascontiguousarray(perm[:k]) for t, _, k in todo if t == "sparse"})
    maxk = max(k for _, _, k in todo)
    hdr = np.zeros(HDR, dtype=np.int64)
    shdr = np.zeros(hl, dtype=np.int64)
    ack = np.zeros(1, dtype=np.int64)
    kbuf = np.empty(maxk, dtype=np.int64)
    vals = {"dense": np.ones((dense_rows, DENSE_DIM), dtype=np.float32),
            "sparse": np.ones((maxk, 1), dtype=np.float32)}
    vbuf = {t: np.empty_like(v) for t, v in vals.items()}
    hout = {t: np.zeros_like(v) for t, v in vals.items()}     # hpcps pulls into it (out=)
    times = {c: {"hpcps": [], "raw": []} for c in todo}
    busy = {c: [] for c in todo}    # server: CPU seconds in handle per request, per hpcps block
    for rep in range(reps):
        for i, case in enumerate(benchlib.rotate(todo, rep)):
            table, op, k = case
            up, down = payload_bytes(table, op, k, hl)
            inner = inner_count(up + down, args.quick)
            kk = keys[(table, k)]
            for variant in (("raw", "hpcps") if (rep + i) % 2 == 0 else ("hpcps", "raw")):
                b.ctl.Barrier()
                if b.is_server:
                    if variant == "hpcps":
                        b.server.busy = [0, 0.0, 0.0]
                        b.serve_block()
                        n1, _, cpu = b.server.busy
                        busy[case].append(cpu / max(1, n1))
                        continue
                    for _ in range(inner):
                        raw.Recv(hdr, source=peer, tag=1)
                        raw.Recv(kbuf[:k], source=peer, tag=2)
                        if op == "push":
                            raw.Recv(vbuf[table][:k], source=peer, tag=3)
                        else:
                            raw.Send(vals[table][:k], dest=peer, tag=4)
                            raw.Send(shdr, dest=peer, tag=5)
                    if op == "push":
                        raw.Send(ack, dest=peer, tag=6)
                    continue
                # worker
                c = b.client
                v = vals[table][:k]
                out = vbuf[table][:k]
                t0 = MPI.Wtime()
                if variant == "hpcps":
                    for _ in range(inner):
                        if op == "pull":
                            c.pull(table, kk, out=hout[table][:k])
                        else:
                            c.push(table, kk, v)
                    if op == "push":
                        c.pull(table, kk[:1])
                else:
                    for _ in range(inner):
                        raw.Send(hdr, dest=peer, tag=1)
                        raw.Send(kk, dest=peer, tag=2)
                        if op == "push":
                            raw.Send(v, dest=peer, tag=3)
                        else:
                            raw.Recv(out, source=peer, tag=4)
                            raw.Recv(shdr, source=peer, tag=5)
                    if op == "push":
                        raw.Recv(ack, source=peer, tag=6)
                times[case][variant].append((MPI.Wtime() - t0) / inner)
                if variant == "hpcps":
                    b.end_block()
    b.ctl.Barrier()
    busy = b.ctl.bcast(busy if b.is_server else None, root=world.Get_size() - 1)
    gather = b.ctl.bcast(gather_alone(b, keys, todo, reps) if b.is_server else None,
                         root=world.Get_size() - 1)
    if not b.is_server:
        report(todo, times, hl, args, busy, gather)
    raw.Free()
    b.close()
    return 0


def gather_alone(b, keys, todo, reps):
    """Server side: ``{n: seconds}``, the median time of the server's own gather of the rows of
    the largest sparse pull's keys (``Shard.pull_reply``, what its handler does between the
    request's receipt and the reply's send), alone, without MPI: what a pull that gathers its
    rows costs at least, against raw MPI that sends a contiguous block."""
    ns = [k for t, op, k in todo if t == "sparse" and op == "pull"]
    if not ns:
        return {}
    n = max(ns)
    shard, kk = b.server.shards[1], keys[("sparse", n)]
    ts = []
    for _ in range(max(3, reps)):
        t0 = MPI.Wtime()
        b.server.ep.pool.give(shard.pull_reply(kk, 0, b.server.ep.pool))
        ts.append(MPI.Wtime() - t0)
    return {n: benchlib.median(ts)}


def report(todo, times, hl, args, busy, gather=None):
    rep = benchlib.Report("pushpull")
    rows = []
    print("hpcps client vs raw mpi4py Send/Recv of the same bytes, 1 worker + 1 server "
          f"({library_version().splitlines()[0]})"
          + (", input-error listener running" if args.notices else ""))
    print(f"{'case':<28} {'bytes up':>10} {'bytes down':>10} {'raw us':>10} {'hpcps us':>10} "
          f"{'raw/hpcps':>9} {'overhead us':>11} {'hpcps GB/s':>10} {'server us':>9}")
    for case in todo:
        table, op, k = case
        up, down = payload_bytes(table, op, k, hl)
        r = benchlib.median(times[case]["raw"])
        h = benchlib.median(times[case]["hpcps"])
        label = (f"dense {op} {fmt_bytes(k * DENSE_DIM * 4)}" if table == "dense"
                 else f"sparse {op} {k:,} keys")
        rec = {"table": table, "op": op, "n": k, "bytes_up": up, "bytes_down": down,
               "raw_us": r * 1e6, "hpcps_us": h * 1e6, "ratio": r / h,
               "overhead_us": (h - r) * 1e6, "hpcps_GBps": (up + down) / h / 1e9,
               "raw_min_us": min(times[case]["raw"]) * 1e6,
               "hpcps_min_us": min(times[case]["hpcps"]) * 1e6,
               "raw_GBps": (up + down) / r / 1e9, "label": label,
               # the server's own CPU time in its handler per request (median over blocks;
               # the block's STOP and, for pushes, its closing 1-key pull included)
               "server_us": benchlib.median(busy[case]) * 1e6,
               "server_min_us": min(busy[case]) * 1e6}
        rows.append(rec)
        print(f"{label:<28} {up:>10,} {down:>10,} {r * 1e6:>10.1f} {h * 1e6:>10.1f} "
              f"{r / h:>9.2f} {(h - r) * 1e6:>11.1f} {rec['hpcps_GBps']:>10.2f} "
              f"{rec['server_us']:>9.1f}")
    rep.details["cases"] = rows
    big = [x for x in rows if (x["table"] == "dense" and x["n"] == max(y["n"] for y in rows if y["table"] == "dense"))
           or (x["table"] == "sparse" and x["n"] == max(y["n"] for y in rows if y["table"] == "sparse"))]
    small = [x for x in rows if x["n"] == min(y["n"] for y in rows if y["table"] == x["table"])
             and x["table"] == "dense"]
    for x in rows:
        if x["table"] == "sparse" and x["n"] == SMALL:
            rep.ratio(f"per-request overhead, {x['label']} (hpcps {x['hpcps_us']:.1f} us, raw "
                      f"Send/Recv {x['raw_us']:.1f} us)", x["overhead_us"], PER_REQUEST_GOAL_US,
                      higher_is_better=False, unit=" us")
            rep.ratio(f"server CPU time per request (its handler, median of blocks), {x['label']}",
                      x["server_us"], PER_REQUEST_GOAL_US, higher_is_better=False, unit=" us")
    for x in big:
        rep.ratio(f"{x['label']}: raw MPI time / hpcps time", x["ratio"], 0.8)
    for x in rows:
        g = (gather or {}).get(x["n"]) if x["table"] == "sparse" and x["op"] == "pull" else None
        if g:
            x["gather_alone_us"] = g * 1e6
            rep.ratio(f"{x['label']}: raw MPI time / the server's gather alone of the same keys "
                      f"({g * 1e3:.2f} ms of random rows; the best a pull that gathers can reach "
                      "here)", x["raw_us"] / (g * 1e6), None)
    worst = min(big, key=lambda x: x["ratio"])
    rep.ratio(f"push/pull, large messages (worst: {worst['label']}): raw / hpcps",
              worst["ratio"], 0.8, headline=True)
    for x in small:
        rep.ratio(f"{x['label']}: per-message overhead of hpcps", x["overhead_us"], None,
                  unit=" us")
        if x["overhead_us"] < 0:
            rep.note(f"{x['label']}: the raw exchange took longer than hpcps's (overhead "
                     f"{x['overhead_us']:.0f} us < 0): disturbed by other processes; rerun")
    rep.write(args.json)
    print(rep.last_line())


if __name__ == "__main__":
    with abort_on_error(MPI.COMM_WORLD):     # an error on one rank ends every rank (no hang)
        sys.exit(main())
