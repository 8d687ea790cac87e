"""Sandblaster L-BFGS: objective vs scikit-learn, and load balancing with one slowed worker.

Runs inside an MPI launch (every rank runs this script) on the job given (default
``jobs/adult_lbfgs.toml``: full UCI Adult, 2^20 hashed features, l2 = 1e-3). Variants:

    converged       the job as it is, to convergence (with its scikit-learn comparison)
    balanced        [lbfgs] work_units as in the job, ITERATIONS iterations, no worker slowed
    slowed          the same, worker 1 made FACTOR times slower
    one unit, fair  work_units = number of workers (≈ a static split of the rows), none slowed
    one unit, slow  the same, worker 1 FACTOR times slower

Worker 1 is slowed by sleeping ``(FACTOR - 1) x`` the compute time per row measured in the
converged run, times the rows of each unit, before each unit. Columns: iterations,
evaluations, seconds of the L-BFGS loop, seconds per evaluation, objective, worker 1's share of
the units and each worker's units. The last lines give the ratios of seconds per evaluation
(slowed / not slowed) with on-demand units and with one unit per worker, and the objective gap
to scikit-learn.

Usage::

    mpirun -n 5 python bench/bench_sandblaster.py                       # 3 workers + 1 server
    mpirun -n 5 python bench/bench_sandblaster.py jobs/x.toml --factor 10 --iterations 50
"""

import argparse
import dataclasses
import io
import os
import sys
import time

try:
    from hpcps.config import load_job
except ImportError:  # run from a source checkout built with ``setup.py build_ext --inplace``
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from hpcps.config import load_job

from hpcps.comm.collectives import bcast_int
from hpcps.comm.core import abort_on_error, world
from hpcps.runtime.job import run_job

SLOW = 1


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?", default=os.path.join(here, os.pardir, "jobs",
                                                          "adult_lbfgs.toml"))
    ap.add_argument("--factor", type=float, default=30.0,
                    help="how many times slower worker 1 is (default 30)")
    ap.add_argument("--iterations", type=int, default=30,
                    help="L-BFGS iterations of the timing variants (default 30)")
    args = ap.parse_args()
    comm = world()
    base = load_job(args.job)
    n_workers = comm.Get_size() - 1 - base.cluster.servers
    rows, summaries = [], {}
    per_row_ns = 0

    def variant(name, units, slow_s_per_row, baseline, iterations=None):
        lb = dataclasses.replace(base.lbfgs, work_units=units)
        if iterations:
            lb = dataclasses.replace(lb, max_iterations=iterations)
        cfg = dataclasses.replace(
            base, lbfgs=lb,
            evaluate=dataclasses.replace(base.evaluate, sklearn_baseline=baseline),
            output=dataclasses.replace(base.output, dir=base.output.dir / name.replace(" ", "_")))
        n_rows = [0]

        def hook(index, evaluation):
            if index == SLOW and slow_s_per_row > 0:
                time.sleep(slow_s_per_row * n_rows[0] / units)

        if slow_s_per_row > 0:                     # rows of the training split, for the hook
            from hpcps.data.source import load_split
            n_rows[0] = load_split(cfg.data, "train", 0, 1)[0].shape[0]
        with abort_on_error(comm):
            s = run_job(cfg, comm, out=io.StringIO(), resume="never", step_hook=hook)
        if comm.Get_rank() == 0:
            summaries[name] = s
            print(f"  done: {name}", file=sys.stderr, flush=True)
        return s

    s = variant("converged", base.lbfgs.work_units, 0.0, base.evaluate.sklearn_baseline)
    if comm.Get_rank() == 0:
        busy = sum(w["busy_seconds"] for w in s["workers"])
        per_row_ns = int(1e9 * busy / (s["evaluations"] * s["rows"]))
    per_row = bcast_int(comm, per_row_ns) * 1e-9
    extra = (args.factor - 1.0) * per_row
    it = args.iterations
    variant("balanced", base.lbfgs.work_units, 0.0, False, it)
    variant("slowed", base.lbfgs.work_units, extra, False, it)
    variant("one unit, fair", n_workers, 0.0, False, it)
    variant("one unit, slow", n_workers, extra, False, it)
    if comm.Get_rank() != 0:
        return 0
    print(f"{base.name}: 1 coordinator, {n_workers} workers, {base.cluster.servers} server(s); "
          f"{s['rows']:,} rows, {s['active_keys']:,} active keys, m = {base.lbfgs.history}; "
          f"worker {SLOW} slowed {args.factor:g}x (compute {per_row * 1e9:.0f} ns/row)")
    print(f"{'variant':<15} {'units':>5} {'iters':>5} {'evals':>5} {'loop s':>7} {'s/eval':>7} "
          f"{'objective':>14} {'w1 share':>8}  units per worker")
    for name, r in summaries.items():
        us = [w["units"] for w in r["workers"]]
        rows.append((name, r["work_units"], r["iterations"], r["evaluations"],
                     r["train_seconds"], r["evaluation_seconds"] / r["evaluations"],
                     r["objective"], us[SLOW] / sum(us), us))
    for r in rows:
        print(f"{r[0]:<15} {r[1]:>5} {r[2]:>5} {r[3]:>5} {r[4]:>7.2f} {r[5]:>7.4f} "
              f"{r[6]:>14.10f} {100 * r[7]:>7.1f}%  {r[8]}")
    by = {r[0]: r for r in rows}
    print(f"seconds per evaluation, slowed / not slowed: on-demand units "
          f"{by['slowed'][5] / by['balanced'][5]:.2f}, one unit per worker "
          f"{by['one unit, slow'][5] / by['one unit, fair'][5]:.2f}")
    if "baseline" in s:
        b = s["baseline"]
        print(f"objective gap to scikit-learn (lbfgs, tol {b['tol']:g}, {b['n_iter']} iterations, "
              f"{b['seconds']:.1f} s): {b['relative_gap']:+.2e} relative; scikit-learn with its "
              f"default tol 1e-4: {b['default_tol']['relative_gap']:+.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
