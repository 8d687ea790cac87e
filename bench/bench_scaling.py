"""Scaling with workers 1...8 and servers 1...4, and the data for the cost model.

Run with plain ``python`` (it launches one ``mpirun`` per layout)::

    python bench/bench_scaling.py [--pushpull-json bench_pushpull.json]

Each layout (W workers, S servers; W + S ranks) runs BSP steps of the Adult job's real
communication pattern with the real parts (:class:`hpcps.worker.client.PSClient`,
:class:`hpcps.server.server.ParameterServer`): every worker walks its block of the featurized
training rows in batches of 256, and per step pulls the batch's distinct feature keys from the
2^20-row float32 weight table, pushes one gradient row per key (values are stand-ins; no
model compute is timed) and clocks — the push, the clock and the next step's pull go in one
``PUSH_CLOCK_PULL`` request per server (``PSClient.pull_next``), as ``hpcps train`` sends
them since issue 20 (the first pull goes alone, the last clock as a ``PUSH_CLOCK``);
servers apply SGD at every step. Measured per layout:
steps/s, examples/s, and per step and server the requests and bytes in/out (the servers'
own counters) — the inputs of ``docs/cost_model.md``.

**On this machine the layouts are oversubscribed**: 2 cores run up to 33 ranks, so time per
step grows with the total work of all ranks; the curve shows the per-rank costs and the load
each server carries, not how a cluster of many nodes scales. The cost model turns the
measured per-message and per-byte costs into a prediction for many nodes.

The model: one BSP step costs each server ``W`` requests (push, clock and the next pull in
one; ``REQUESTS``) of ``K / S`` keys each (K distinct keys per worker batch, 12 B per key
each way: 8 B key + 4 B value) and the step's own work once (the apply of its ``W K / S``
keys, the clock's bookkeeping), so ``T_server = W (a + (K / S) c) + a_step + (W K / S)
c_step``; a worker sends ``S`` requests of ``K / S`` keys each way, ``T_worker = S a + K c``
(the server's per-request costs: an upper bound); a BSP step takes about ``T_server +
T_worker`` with dedicated cores (the worker's next pull waits for the server's last answer).
``a``, ``c`` (per request and per key) and ``a_step``, ``c_step`` (per step and per key
applied) are fitted to calibration runs of the request a step really sends: 1 worker + 1
server (no core shared) at batches 2 and 256 (``--calib-batches``), 3 runs each, the
server's CPU time in its handler per request less its time in the step's apply
(``ParameterServer.step_busy``) and the latter per step, the fastest run of each batch. The
fit to the push/pull benchmark's pulls and pushes sent alone (``--pushpull-json``) is
printed beside it: a lower bound, since those take the shortest paths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import benchlib

benchlib.ensure_importable()

HERE = Path(__file__).resolve().parent
LAYOUTS = [(1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (4, 4), (8, 2), (8, 4), (16, 1), (32, 1)]
QUICK_LAYOUTS = [(1, 1), (2, 1), (2, 2)]
BATCH = 256
KEY_BYTES = 12        # 8 B key + 4 B float32 value, each direction of a pull/push
#: per worker, step and server: one PUSH_CLOCK_PULL (the step's push and clock, the next
#: step's pull); 2 before issue 20's fused step (PULL, then PUSH_CLOCK)
REQUESTS = 1
#: issue 20's goals for the extrapolation: examples/s at 1,024 workers / 128 servers, and
#: its ratio to 64 workers / 8 servers (16x the machines)
GOAL_EXAMPLES_PER_SECOND = 10e6
GOAL_GROWTH = 8.0


# ------------------------------------------------------------------------- MPI part

def mpi_part(args) -> int:
    from mpi4py import MPI

    from adultdata import load_part
    from psbench import Bench

    world = MPI.COMM_WORLD
    S = args.servers
    b = Bench(world, 8, 1 << 20, n_servers=S)
    W = b.roles.n_workers
    keysets = []
    if not b.is_server:
        indptr, indices, _, _, nf = load_part(args.npz, "train", b.roles.index, W)
        n = indptr.size - 1
        for s in range(args.steps):
            lo = (s * args.batch) % max(1, n)
            hi = min(n, lo + args.batch)
            keysets.append(np.unique(indices[indptr[lo]:indptr[hi]]).astype(np.int64))
        grads = {k.size: None for k in keysets}
        grads = {n_: np.full((n_, 1), 1e-3, dtype=np.float32) for n_ in grads}
    b.ctl.Barrier()
    el = np.zeros(1)
    if b.is_server:
        s0 = dict(b.server.ep.stats.messages), dict(b.server.ep.stats.bytes_in), dict(b.server.ep.stats.bytes_out)
        b.server.busy = [0, 0.0, 0.0]          # requests, wall and CPU seconds in the handler
        b.server.step_busy = [0, 0.0]          # steps applied, CPU seconds applying them
        b.serve_block()
        st = b.server.ep.stats
        row = [sum(st.messages.values()) - sum(s0[0].values()),
               sum(st.bytes_in.values()) - sum(s0[1].values()),
               sum(st.bytes_out.values()) - sum(s0[2].values()),
               sum(st.keys.values()), b.server.busy[2] / max(1, b.server.busy[0]),
               b.server.step_busy[1] / max(1, b.server.step_busy[0])]
    else:
        c = b.client
        t0 = MPI.Wtime()
        for i, ks in enumerate(keysets):
            c.pull("sparse", ks)           # after the first step: the pull sent with the clock
            c.push("sparse", ks, grads[ks.size], defer=True)     # sent with the clock
            if i + 1 < len(keysets):
                c.pull_next({"sparse": keysets[i + 1]})
            c.clock(args.batch)
        el[0] = MPI.Wtime() - t0
        b.end_block()
        row = [0, 0, 0, int(sum(k.size for k in keysets)), 0.0, 0.0]
    slowest = np.zeros(1)
    b.ctl.Allreduce(el, slowest, op=MPI.MAX)
    rows = b.ctl.gather((b.is_server, row), root=0)
    if world.Get_rank() == 0:
        servers = [r for srv, r in rows if srv]
        workers = [r for srv, r in rows if not srv]
        steps = args.steps
        out = {"workers": W, "servers": S, "steps": steps, "seconds": float(slowest[0]),
               "step_ms": 1e3 * slowest[0] / steps,
               "examples_per_second": W * args.batch * steps / slowest[0],
               "keys_per_worker_step": sum(w[3] for w in workers) / (W * steps),
               "server_requests_per_step": [s[0] / steps for s in servers],
               "server_bytes_in_per_step": [s[1] / steps for s in servers],
               "server_bytes_out_per_step": [s[2] / steps for s in servers],
               # the server's CPU time in its handler over the block, per request (thread CPU
               # time): the cost of the fused request a BSP step sends, ~100 us + 60 ns per
               # key here (docs/cost_model.md section 9), which the model's a and c (fitted
               # to pulls and pushes sent alone) leave out; short blocks add one-off costs
               "server_cpu_us_per_request": [s[4] * 1e6 for s in servers],
               # of which the step's own work, once per step whatever W (the apply, the
               # clock's bookkeeping, the replies to the waiting pulls): CPU per step
               "server_step_cpu_us": [s[5] * 1e6 for s in servers]}
        Path(args.out).write_text(json.dumps(out))
    b.close()
    return 0


def group_part(args) -> int:
    """The collectives of a fused group step (:class:`hpcps.worker.steps.GroupSteps`,
    ``[comm] aggregate = "node"``) with every rank of the launch as one group,
    ``--group-keys`` keys per member, spread evenly over the members (each owns as many
    servers): per step the rows (float32) back from the owners, then the counts, and the
    gradients and the next step's keys to the owners (3 collectives). Writes a member's wall
    time per step (the slowest member, fastest of 5 blocks) and the time of one pairwise
    8-byte ``MPI_Sendrecv`` to ``--out``."""
    from mpi4py import MPI

    from hpcps.comm.group import StepGroup

    world = MPI.COMM_WORLD
    g = StepGroup(world.Dup())
    K, G = args.group_keys, g.size
    rng = np.random.default_rng(world.Get_rank())
    keys = rng.integers(0, 1 << 20, K).astype(np.int64)
    grads = np.full((K, 1), 1e-3, dtype=np.float32)
    share = np.diff(np.linspace(0, K, G + 1).astype(np.int64))        # keys per owner
    cut = np.concatenate([[0], np.cumsum(share)])
    counts = np.stack([share, share], axis=1)
    incoming = g.counts(counts)
    got = g.alltoall([[keys[cut[d]:cut[d + 1]]] for d in range(G)], 8 * incoming[:, 0])
    rows = np.empty((K, 1), dtype=np.float32)
    best = np.inf
    for _ in range(5):
        world.Barrier()
        t0 = MPI.Wtime()
        for _ in range(args.steps):       # a fused step: the keys came with the last gradients
            back = [[m.view(np.int64).astype(np.float32)] for m in got]
            mine = g.alltoall(back, 4 * share)
            rows[:, 0] = np.concatenate([m.view(np.float32) for m in mine])
            told = g.counts(counts)
            got2 = g.alltoall([[grads[cut[d]:cut[d + 1]], keys[cut[d]:cut[d + 1]]]
                               for d in range(G)], 4 * incoming[:, 0] + 8 * told[:, 1])
            got = [m[4 * int(n):] for m, n in zip(got2, incoming[:, 0])]
        el = np.array([(MPI.Wtime() - t0) / args.steps])
        world.Allreduce(MPI.IN_PLACE, el, op=MPI.MAX)
        best = min(best, float(el[0]))
    # one pairwise exchange of 8 B (a step of a pairwise MPI_Alltoallv; the latency each
    # further member adds to each of the step's 3 collectives)
    a8, b8 = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    peer = (world.Get_rank() + 1) % G
    pair = np.inf
    for _ in range(5):
        world.Barrier()
        t0 = MPI.Wtime()
        for _ in range(1000):
            world.Sendrecv(a8, peer, 7, b8, MPI.ANY_SOURCE, 7)
        el = np.array([(MPI.Wtime() - t0) / 1000])
        world.Allreduce(MPI.IN_PLACE, el, op=MPI.MAX)
        pair = min(pair, float(el[0]))
    if world.Get_rank() == 0:
        Path(args.out).write_text(json.dumps({"members": G, "keys_per_member": K,
                                              "member_us_per_step": best * 1e6,
                                              "pair_exchange_us": pair * 1e6}))
    g.free()
    return 0


def fit_group(points: list) -> dict | None:
    """``a_group + K c_group``: a member's time per step in the group's collectives, ``K``
    its keys, fitted to :func:`group_part`'s runs (at their number of members; ``pair_us``,
    the pairwise exchange that each further member adds to each of the 3 collectives, for
    :func:`predict`); None with fewer than two key counts."""
    if len({p["keys_per_member"] for p in points}) < 2:
        return None
    x = np.array([p["keys_per_member"] for p in points], dtype=float)
    y = np.array([p["member_us_per_step"] for p in points])
    c, a = np.polyfit(x, y, 1)
    return {"a_group_us": float(max(a, 0.0)), "c_group_ns": float(max(c, 0.0)) * 1e3,
            "members": int(min(p["members"] for p in points)),
            "pair_us": float(min(p.get("pair_exchange_us", 0.0) for p in points)),
            "source": ", ".join(f"{p['members']} members x {p['keys_per_member']:,} keys "
                                f"{p['member_us_per_step']:.1f} us" for p in points)}


# ------------------------------------------------------------------------- model

def fit_fused(calib: list) -> dict | None:
    """The costs of the request a BSP step really sends (one ``PUSH_CLOCK_PULL`` per worker
    and server), fitted to the calibration runs (1 worker + 1 server: no core shared) at two
    or more key counts K, from the server's CPU time (the fastest of the repetitions):

    * per request, the handler's time less the step's: ``a + K c`` (receive and take apart,
      queue the push, the clock, the pull's reply), paid once per worker;
    * per step, the time in ``ParameterServer._advance``: ``a_step + K c_step`` (the apply of
      the step's keys, its bookkeeping), paid once per step whatever the number of workers.

    Each by least squares on K. None without two distinct key counts."""
    req, step, wrk = {}, {}, {}
    for r in calib:
        k = round(r["keys_per_worker_step"])
        tot, st = min(zip(r["server_cpu_us_per_request"], r["server_step_cpu_us"]))
        if k not in req or tot < req[k] + step[k]:
            req[k], step[k] = tot - st, st
        own = r["step_ms"] * 1e3 - tot          # the step less the server's CPU: the worker's
        wrk[k] = min(wrk.get(k, own), own)      # own work and its round trip (fastest run)
    if len(req) < 2:
        return None
    K = np.array(sorted(req), dtype=float)
    c, a = np.polyfit(K, [req[k] for k in sorted(req)], 1)
    cs, a_s = np.polyfit(K, [step[k] for k in sorted(req)], 1)
    cw, a_w = np.polyfit(K, [wrk[k] for k in sorted(req)], 1)
    return {"a_us": float(max(a, 0.0)), "c_ns": float(max(c, 0.0)) * 1e3,
            "a_step_us": float(max(a_s, 0.0)), "c_step_ns": float(max(cs, 0.0)) * 1e3,
            "a_worker_us": float(max(a_w, 0.0)), "c_worker_ns": float(max(cw, 0.0)) * 1e3,
            "points": {int(k): {"request_us": float(req[k]), "step_us": float(step[k])}
                       for k in sorted(req)},
            "source": ("fused PUSH_CLOCK_PULL request, 1 worker + 1 server, server CPU time "
                       "(fastest of 3 runs) per request less the step's / per step / the "
                       "worker's step less the server's CPU: "
                       + ", ".join(f"{int(k):,} keys {req[k]:.1f} / {step[k]:.1f} / "
                                   f"{wrk[k]:.1f} us" for k in sorted(req)))}


def fit_costs(pushpull: dict | None, runs: list) -> dict:
    """Per-request cost ``a`` (s) and per-key cost ``c`` (s) by least squares on the relative
    error.

    From the push/pull benchmark's sparse cases (hpcps time of one request with n keys:
    ``a + n c``; the fastest repetition of each, i.e. the cost when no other process took the
    core, since the machine is shared) when available, else from the 1-server layouts of this
    run (server time per step ``2 W a + W K c``, taking the step time as the server's).
    """
    if pushpull:
        cases = [x for x in pushpull["details"]["cases"] if x["table"] == "sparse"]
        A = np.array([[1.0, x["n"]] for x in cases])
        if all("server_min_us" in x for x in cases):
            # the server's own CPU time in its handler (issue 20): what a server spends per
            # request and key, without the waits for a CPU that a loaded machine adds to the
            # round trip the worker sees
            t = np.array([x["server_min_us"] * 1e-6 for x in cases])
            src = ("push/pull benchmark: the server's CPU time per request in its handler, "
                   "fastest block, sparse pulls and pushes of 8 ... 1 M keys")
        else:
            t = np.array([x.get("hpcps_min_us", x["hpcps_us"]) * 1e-6 for x in cases])
            src = ("push/pull benchmark: fastest repetition of sparse pulls and pushes of "
                   "1 k ... 1 M keys")
    else:
        one = [r for r in runs if r["servers"] == 1]
        A = np.array([[REQUESTS * r["workers"], r["workers"] * r["keys_per_worker_step"]] for r in one])
        t = np.array([r["step_ms"] * 1e-3 for r in one])
        src = "this run's 1-server layouts"
    # relative error (rows scaled by 1/t): the 1 M-key cases must not drown the small ones,
    # which are what determines the per-request cost
    (a, c), *_ = np.linalg.lstsq(A / t[:, None], np.ones_like(t), rcond=None)
    return {"a_us": float(max(a, 0.0)) * 1e6, "c_ns": float(max(c, 0.0)) * 1e9, "source": src}


def predict(W, S, K, a_us, c_ns, a_step_us=0.0, c_step_ns=0.0, g=1, group=None,
            a_worker_us=None, c_worker_ns=0.0) -> dict:
    """Step time (ms) with dedicated cores: a server's share (its ``REQUESTS x W`` requests
    of K / S keys each, one after the other, and the step's own work, ``a_step`` and
    ``c_step`` per key of the W K / S it applies) plus a worker's own: ``a_worker + K
    c_worker``, its step at 1 + 1 less the server's CPU there (slicing, keys, gradient, its
    round trip; :func:`fit_fused`), and ``REQUESTS x a`` for each further server it sends
    to; without that calibration, its ``REQUESTS x S`` requests at the server's costs (what
    the model held before 2026-12-04: once the server's per-key cost fell to 3.8 ns with the
    radix sorts, that left out the worker's work and the model's error at 1 + 1 rose to
    0.66). BSP serialises them: a worker's next pull waits for the server's last answer.

    With groups of ``g`` workers (``[comm] aggregate = "node"``; ``group``: :func:`fit_group`'s
    costs) a server gets ``ceil(W / g)`` requests of ``g K / S`` keys (the same keys in all,
    one request per group from the member that owns it), and a worker sends ``ceil(S / g)``
    requests (its servers') with ``K`` keys on average (its servers' share of the group's
    ``g K``) and spends ``a_group + K c_group`` in the group's collectives, plus
    ``3 (g - members) pair_us`` beyond the calibration's members (a pairwise
    ``MPI_Alltoallv`` takes a step per member)."""
    from hpcps.comm.transport import HEADER_LEN, PART_LEN
    from hpcps.core.consistency import header_len

    R = -(-W // g)                       # requests per server and step (one per group)
    t_srv = (REQUESTS * R * a_us * 1e-6 + (W * K / S) * c_ns * 1e-9
             + a_step_us * 1e-6 + (W * K / S) * c_step_ns * 1e-9)
    if a_worker_us is None:          # no calibration of the worker: its requests at the
        t_wrk = REQUESTS * -(-S // g) * a_us * 1e-6 + K * c_ns * 1e-9   # server's costs
    else:                            # its own work and round trip (fitted at 1 + 1), and a
        t_wrk = ((a_worker_us + max(0, -(-S // g) - 1) * REQUESTS * a_us) * 1e-6  # request
                 + K * c_worker_ns * 1e-9)                        # per further server
    if g > 1:
        t_wrk += (group["a_group_us"] + 3 * max(0, g - group.get("members", g))
                  * group.get("pair_us", 0.0)) * 1e-6 + K * group["c_group_ns"] * 1e-9
    # per worker: the keys and values both ways, a request header per request (72 B), the
    # push's and the pull's descriptions (40 B each), and the shard clock header of the pull
    # reply (8 B x header_len(W): 64 B whatever W since 2026-12-03; it held one clock per
    # worker before, so a server's share grew as W**2, docs/cost_model.md section 9)
    clock_headers = R * 8 * header_len(R)
    return {"server_ms": 1e3 * t_srv, "worker_ms": 1e3 * t_wrk, "step_ms": 1e3 * (t_srv + t_wrk),
            "bytes_per_server_step": (W * K / S * KEY_BYTES * 2 + REQUESTS * R * 8 * HEADER_LEN
                                      + 2 * R * 8 * PART_LEN + clock_headers),
            "clock_header_bytes_per_server_step": clock_headers}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="BSP steps per layout")
    ap.add_argument("--pushpull-json", help="results of bench_pushpull.py --json (for a, c)")
    ap.add_argument("--npz", help="featurized data (adultdata.save_npz); default: featurize now")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="rows per worker and step (the model and the goals assume 256)")
    ap.add_argument("--layouts", help="only these layouts, e.g. '1x1,8x1' (workers x servers)")
    ap.add_argument("--calib-batches", default="2,256",
                    help="batches of the 1 + 1 calibration runs that fit a and c to the fused "
                         "request (comma-separated; '' to fit to --pushpull-json instead)")
    ap.add_argument("--calib-steps", type=int, default=2000,
                    help="BSP steps per calibration run (3 runs per batch)")
    ap.add_argument("--group-calib", default="2650,26500",
                    help="keys per member of the group calibration runs (2 ranks, the "
                         "collectives of [comm] aggregate = 'node'; comma-separated, '' for none)")
    ap.add_argument("--group-size", type=int, default=32,
                    help="workers per group in the extrapolation with groups (a node's cores)")
    ap.add_argument("--mpi-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group-keys", type=int, default=2650, help=argparse.SUPPRESS)
    ap.add_argument("--servers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.mpi_part:
        return mpi_part(args)
    if args.group_part:
        return group_part(args)
    from hpcps.runtime import launch

    layouts = QUICK_LAYOUTS if args.quick else LAYOUTS
    if args.layouts:
        layouts = [tuple(int(v) for v in x.split("x")) for x in args.layouts.split(",")]
    steps = 5 if args.quick else args.steps
    mpirun = launch.find_mpirun()
    flavour = launch.mpi_flavour(mpirun)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-scaling-") as d:
        d = Path(d)
        npz = args.npz
        if not npz:
            from adultdata import DEFAULT_JOB, save_npz

            npz = str(d / "adult.npz")
            save_npz(DEFAULT_JOB, npz, max_rows=3000 if args.quick else 0)
        def run(W, S, n_steps, batch, tag=""):
            out = d / f"{W}-{S}{tag}.json"
            cmd, env = launch.build_launch(W + S, [
                sys.executable, str(HERE / "bench_scaling.py"), "--mpi-part", "--servers", S,
                "--steps", n_steps, "--npz", npz, "--out", out, "--batch", batch],
                mpirun=mpirun, flavour=flavour)
            p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
                raise SystemExit(f"bench_scaling.py: layout {W} workers + {S} servers failed")
            return json.loads(out.read_text())

        for W, S in layouts:
            r = run(W, S, steps, args.batch)
            runs.append(r)
            print(f"  {W} worker(s) + {S} server(s): {r['step_ms']:.2f} ms/step", flush=True)
        calib = []
        batches = [int(b) for b in args.calib_batches.split(",") if b.strip()]
        for batch in batches:
            for rep in range(3):
                r = run(1, 1, 20 if args.quick else args.calib_steps, batch, f"-calib{batch}-{rep}")
                r["batch"] = batch
                calib.append(r)
            print(f"  calibration, 1 + 1 at batch {batch}: "
                  f"{np.mean([c['keys_per_worker_step'] for c in calib[-3:]]):,.0f} keys per "
                  f"request, server CPU "
                  f"{min(min(c['server_cpu_us_per_request']) for c in calib[-3:]):.1f} us per "
                  "request (fastest of 3)", flush=True)
        group_points = []
        for k in [int(v) for v in args.group_calib.split(",") if v.strip()]:
            out = d / f"group-{k}.json"
            cmd, env = launch.build_launch(2, [
                sys.executable, str(HERE / "bench_scaling.py"), "--group-part", "--steps",
                20 if args.quick else 200, "--group-keys", k, "--out", out],
                mpirun=mpirun, flavour=flavour)
            p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
                raise SystemExit("bench_scaling.py: the group calibration failed")
            group_points.append(json.loads(out.read_text()))
            print(f"  group calibration, 2 members x {k:,} keys: "
                  f"{group_points[-1]['member_us_per_step']:.1f} us per step and member",
                  flush=True)
    pp = None
    if args.pushpull_json and Path(args.pushpull_json).exists():
        pp = json.loads(Path(args.pushpull_json).read_text())
    singles = fit_costs(pp, runs)
    costs = fit_fused(calib) or singles
    cores = benchlib.cpu_count()
    print(f"\nBSP steps of the Adult job's pull/push/clock pattern (batch {BATCH}, 2^20-row float32 "
          f"table), {cores} cores: layouts with more ranks than cores are OVERSUBSCRIBED")
    print(f"{'W':>3} {'S':>3} {'ranks':>5} {'ms/step':>8} {'ex/s':>9} {'keys/wkr':>8} "
          f"{'req/srv':>7} {'KB in/srv':>9} {'KB out/srv':>10} {'srv CPU us':>10} {'model ms':>8}")
    for r in runs:
        W, S = r["workers"], r["servers"]
        m = predict(W, S, r["keys_per_worker_step"], costs["a_us"], costs["c_ns"],
                    costs.get("a_step_us", 0.0), costs.get("c_step_ns", 0.0),
                    a_worker_us=costs.get("a_worker_us"), c_worker_ns=costs.get("c_worker_ns", 0.0))
        r["model"] = m
        r["oversubscribed"] = W + S > cores
        print(f"{W:>3} {S:>3} {W + S:>5}{'*' if W + S > cores else ' '} {r['step_ms']:>7.2f} "
              f"{r['examples_per_second']:>9,.0f} {r['keys_per_worker_step']:>8,.0f} "
              f"{np.mean(r['server_requests_per_step']):>7.1f} "
              f"{np.mean(r['server_bytes_in_per_step']) / 1e3:>9.1f} "
              f"{np.mean(r['server_bytes_out_per_step']) / 1e3:>10.1f} "
              f"{np.mean(r['server_cpu_us_per_request']):>10.1f} {m['step_ms']:>8.2f}")
    print(f"(* oversubscribed: more ranks than the {cores} cores)")
    print(f"cost model: a = {costs['a_us']:.1f} us per request, c = {costs['c_ns']:.1f} ns per key"
          + (f"; per step a_step = {costs['a_step_us']:.1f} us, c_step = "
             f"{costs['c_step_ns']:.1f} ns per key applied" if "a_step_us" in costs else "")
          + (f"; a worker's own per step a_worker = {costs['a_worker_us']:.1f} us, c_worker = "
             f"{costs['c_worker_ns']:.1f} ns per key" if "a_worker_us" in costs else "")
          + f" (fitted to the {costs['source']})")
    if costs is not singles and pp:
        print(f"  (pulls and pushes sent alone: a = {singles['a_us']:.1f} us, c = "
              f"{singles['c_ns']:.1f} ns, fitted to the {singles['source']}: a lower bound, "
              "not what a step sends)")
    K = float(np.mean([r["keys_per_worker_step"] for r in runs]))
    group = fit_group(group_points)
    if group:
        print(f"group collectives: a_group = {group['a_group_us']:.1f} us per step, c_group = "
              f"{group['c_group_ns']:.2f} ns per key of a member (fitted to {group['source']})")
    extrap = []
    G = args.group_size
    for W, S, g in ((64, 8, 1), (256, 32, 1), (512, 64, 1), (1024, 128, 1), (1024, 32, 1),
                    (64, 8, G), (256, 32, G), (1024, 128, G)):
        if g > 1 and group is None:
            continue
        m = predict(W, S, K, costs["a_us"], costs["c_ns"], costs.get("a_step_us", 0.0),
                    costs.get("c_step_ns", 0.0), g=g, group=group,
                    a_worker_us=costs.get("a_worker_us"), c_worker_ns=costs.get("c_worker_ns", 0.0))
        extrap.append({"workers": W, "servers": S, "group": g, **m,
                       "examples_per_second": W * BATCH / (m["step_ms"] * 1e-3)})
        print(f"  extrapolated {W:>5} workers, {S:>4} servers"
              + (f", groups of {g}" if g > 1 else "") + f": {m['step_ms']:7.2f} ms/step "
              f"(server {m['server_ms']:.2f}, worker {m['worker_ms']:.2f}), "
              f"{m['bytes_per_server_step'] / 1e6:.2f} MB per server per step, "
              f"{W * BATCH / (m['step_ms'] * 1e-3):,.0f} ex/s")
    rep = benchlib.Report("scaling")
    rep.details.update({"runs": runs, "costs": costs, "costs_single_requests": singles,
                        "calibration": calib, "keys_per_worker_step": K,
                        "group_calibration": group_points, "group_costs": group,
                        "extrapolation": extrap, "cores": cores, "batch": BATCH})
    # issue 20's goals for the extrapolation
    def at(W, S, g):
        return next((e for e in extrap if (e["workers"], e["servers"], e["group"]) == (W, S, g)),
                    None)

    # the goals on the layout a user would run at that size: groups of a node's workers when
    # the group calibration ran ([comm] aggregate = "node"), else one request per worker
    g = G if at(1024, 128, G) else 1
    big, small = at(1024, 128, g), at(64, 8, g)
    how = f", groups of {g}" if g > 1 else ""
    rep.ratio(f"cost model: examples/s extrapolated to 1,024 workers / 128 servers{how}",
              big["examples_per_second"], GOAL_EXAMPLES_PER_SECOND, unit=" ex/s")
    rep.ratio(f"cost model: examples/s at 1,024 workers / 128 servers over 64 workers / 8 "
              f"servers{how}", big["examples_per_second"] / small["examples_per_second"],
              GOAL_GROWTH)
    if g > 1:
        rep.ratio("cost model: examples/s at 1,024 workers / 128 servers over 64 workers / 8 "
                  "servers, one request per worker (no groups)",
                  at(1024, 128, 1)["examples_per_second"] / at(64, 8, 1)["examples_per_second"],
                  None)
    one = {r["workers"]: r for r in runs if r["servers"] == 1}
    wmax = max(one) if 1 in one else 1
    if wmax > 1:
        rep.ratio(f"scaling: examples/s with {wmax} workers / with 1 (1 server, oversubscribed)",
                  one[wmax]["examples_per_second"] / one[1]["examples_per_second"], None,
                  headline=True)
    fit = [abs(r["model"]["step_ms"] - r["step_ms"]) / r["step_ms"] for r in runs
           if not r["oversubscribed"]]
    if fit:
        rep.ratio("cost model error on layouts that fit the cores (|model - measured| / measured)",
                  float(np.mean(fit)), None, unit="")
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
