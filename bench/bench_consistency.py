"""Train one model under every consistency model and pull mode; print one comparison table.

Runs inside an MPI launch (every rank runs this script); the job file gives the model, data
and cluster layout (default ``jobs/adult_consistency.toml``), and only its ``[consistency]``
section is replaced, variant by variant:

    bsp p2p | bsp rma | ssp(s=2) p2p | ssp(s=2) rma | async p2p | async rma |
    async n_fetch=4 n_push=4 | async + push filter

Columns: wall time of the training loop, examples/s, final test log-loss and AUC, staleness
of applied updates (mean / max, in clocks for BSP/SSP and in updates for async), bytes moved
between workers and servers (pulled + pushed, summed over workers; RMA reads counted on the
worker side), and the workers' summed pull time. The last lines give the ratios of pull time
RMA / p2p measured in this run, per consistency model.

Usage::

    mpirun -n 5 python bench/bench_consistency.py                 # 4 workers + 1 server
    mpirun -n 5 python bench/bench_consistency.py jobs/x.toml --only "bsp p2p" "async rma"
"""

import argparse
import dataclasses
import io
import os
import sys

try:
    from hpcps.config import load_job
except ImportError:  # run from a source checkout built with ``setup.py build_ext --inplace``
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from hpcps.config import load_job

from hpcps.comm.core import abort_on_error, world
from hpcps.config import ConsistencyConfig
from hpcps.runtime.job import run_job

VARIANTS = {
    "bsp p2p": dict(model="bsp"),
    "bsp rma": dict(model="bsp", pull="rma"),
    "ssp(s=2) p2p": dict(model="ssp", staleness=2),
    "ssp(s=2) rma": dict(model="ssp", staleness=2, pull="rma"),
    "async p2p": dict(model="async"),
    "async rma": dict(model="async", pull="rma"),
    "async fetch/push=4": dict(model="async", n_fetch=4, n_push=4),
    "async filter": dict(model="async", push_threshold=1e-3),
}


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?", default=os.path.join(here, os.pardir, "jobs",
                                                          "adult_consistency.toml"))
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), help="variants to run")
    args = ap.parse_args()
    comm = world()
    base = load_job(args.job)
    rows = []
    for name in args.only or VARIANTS:
        cfg = dataclasses.replace(base, consistency=ConsistencyConfig(**VARIANTS[name]),
                                  output=dataclasses.replace(
                                      base.output, dir=base.output.dir / name.replace(" ", "_")
                                      .replace("/", "-").replace("(", "").replace(")", "")
                                      .replace("=", "")))
        with abort_on_error(comm):
            s = run_job(cfg, comm, out=io.StringIO(), resume="never")   # every run trains afresh
        if comm.Get_rank() == 0:
            import json
            ep = json.loads((cfg.output.dir / "metrics.json").read_text())["epochs"][-1]
            c = s["consistency"]
            moved = sum(w["bytes_pulled"] + w["bytes_pushed"] for w in s["workers"])
            pull = sum(w["pull_seconds"] for w in s["workers"])
            rows.append((name, s["train_seconds"], s["examples_per_second"], ep["test_logloss"],
                         ep["test_auc"], c["staleness"]["mean"], c["staleness"]["max"],
                         c["staleness_unit"], moved, pull))
            print(f"  done: {name}", file=sys.stderr, flush=True)
    if comm.Get_rank() == 0:
        print(f"{base.name}: {comm.Get_size() - base.cluster.servers} workers, "
              f"{base.cluster.servers} server(s), {base.train.epochs} epoch(s), "
              f"{base.model.dtype}, {base.optimizer.name} lr={base.optimizer.learning_rate}")
        print(f"{'variant':<20} {'wall s':>7} {'ex/s':>9} {'logloss':>8} {'AUC':>7} "
              f"{'stale mean':>10} {'max':>4} {'unit':<7} {'MB moved':>9} {'pull s':>7}")
        for r in rows:
            print(f"{r[0]:<20} {r[1]:>7.2f} {r[2]:>9,.0f} {r[3]:>8.4f} {r[4]:>7.4f} "
                  f"{r[5]:>10.2f} {r[6]:>4} {r[7]:<7} {r[8] / 1e6:>9.1f} {r[9]:>7.2f}")
        by = {r[0]: r for r in rows}
        for m in ("bsp", "ssp(s=2)", "async"):
            p, q = by.get(f"{m} p2p"), by.get(f"{m} rma")
            if p and q and p[9] > 0:
                print(f"pull time rma / p2p under {m}: {q[9] / p[9]:.2f} "
                      f"(wall {q[1] / p[1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
