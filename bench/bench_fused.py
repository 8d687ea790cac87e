"""The server's time per fused BSP request (PUSH_CLOCK_PULL), measured in one process.

No scheduler stands between the two sides: a worker endpoint and a server endpoint on a duplicate of ``COMM_SELF``, one
table of 2^20 float32 rows, SGD, BSP with one worker (so every request also completes and
applies a step). Each request is a ``PUSH_CLOCK_PULL`` of one message (a push of K keys, the
clock, the next step's pull of the same keys); the time of the server's poll and handler is
summed over blocks of requests and the best and median block printed, with ``--split`` also
the time in the handler's parts (step_parts, the step's apply, the reply).

Run with plain ``python`` (mpi4py starts a singleton)::

    python bench/bench_fused.py --keys 20 [--split]

K is at most 100: the request must be one eager message (a blocking send to the same process
would wait for a receive posted only after it), so the script raises Open MPI's eager limit
for sends to self (``btl_self_eager_limit``, 1 KiB by default) to 8 KiB unless it is set. Not part of
``hpcps bench``: a measurement tool for the request path (docs/cost_model.md section 10).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import benchlib

benchlib.ensure_importable()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=20, help="keys per request (at most 100)")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--requests", type=int, default=2000, help="requests per block")
    ap.add_argument("--split", action="store_true", help="time the handler's parts too")
    args = ap.parse_args(argv)
    if not 1 <= args.keys <= 100:
        ap.error("--keys must be in [1, 100] (one eager message to this process)")
    import os

    os.environ.setdefault("OMPI_MCA_btl_self_eager_limit", "8192")   # before MPI starts
    from mpi4py import MPI

    from hpcps.comm import transport as tp
    from hpcps.core.consistency import BSP
    from hpcps.core.optim import Optimizer
    from hpcps.core.tables import TableSpec
    from hpcps.server import server as srv_mod
    from hpcps.server.shard import Shard

    parts: dict = {}
    if args.split:
        def timed(cls, name, label):
            f = getattr(cls, name)

            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    parts[label] = parts.get(label, 0.0) + time.perf_counter() - t0
            setattr(cls, name, wrapper)
        timed(tp.ServerEndpoint, "step_parts", "step_parts (compiled)")
        timed(Shard, "apply", "the step's apply")
        timed(srv_mod.ParameterServer, "_check_weights", "the step's weight check")
        timed(srv_mod.ParameterServer, "_reply_rows", "the pull's reply")

    comm = MPI.COMM_SELF.Dup()
    spec = TableSpec("t", 1 << 20, 1, "float32", sparse=True)
    wep = tp.WorkerEndpoint(comm, [0], 1 << 30, wait_spin=None)
    sep = tp.ServerEndpoint(comm, 1 << 30)
    server = srv_mod.ParameterServer.initial(sep, 0, 1, [0], [(spec, Optimizer("sgd", 0.1))],
                                             BSP())
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 1 << 20, args.keys)).astype(np.int64)
    n = keys.size
    grads = np.full((n, 1), 1e-3, np.float32)
    desc = np.array([[0, n, 1, 1, 0], [0, n, 0, 1, 0]], np.int64)
    rows, hdr = np.zeros((n, 1), np.float32), np.zeros(server.shards[0].hdr.size, np.int64)
    blocks = []
    clock = 0
    for _ in range(args.blocks):
        total = 0.0
        for _ in range(args.requests):
            desc[0, 4] = clock
            wep.expect_rows(0, rows, hdr)
            wep.send(0, tp.make_header(tp.PUSH_CLOCK_PULL, 1, clock, n, 1, dim=1, rng=0), desc,
                     more=[(keys, grads, tp.PUSH), (keys, None, tp.PULL)])
            t0 = time.perf_counter()
            got = sep.poll()
            if got is None:
                raise SystemExit("bench_fused.py: the request was not received")
            server.handle(*got)
            total += time.perf_counter() - t0
            wep.complete(tp.PUSH)
            clock += 1
        blocks.append(total / args.requests * 1e6)
    if server.clock != clock or hdr[0] != clock:
        raise SystemExit(f"bench_fused.py: server at clock {server.clock}, expected {clock}")
    blocks.sort()
    print(f"{n} keys per request, {args.blocks} blocks of {args.requests}: server poll + "
          f"handler {blocks[0]:.1f} us per request at best, {blocks[len(blocks) // 2]:.1f} "
          "us median")
    for label, secs in parts.items():
        print(f"  {label}: {secs / (args.blocks * args.requests) * 1e6:.1f} us per request "
              "(mean)")
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
