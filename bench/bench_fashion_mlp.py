#!/usr/bin/env python3
"""Fashion-MNIST MLP: Downpour SGD under mpirun against one process; fails below an accuracy floor.

Runs, on the full data set (60,000 training / 10,000 test images):

1. the single-process reference (:func:`hpcps.models.local.train_local`: the same model,
   initial values, optimizer kernels and minibatch size, one worker, no MPI) — skipped with
   ``--skip-local``;
2. the job ``jobs/fashion_mlp.toml`` (async Downpour, AdaGrad) with ``hpcps run -n N``
   (N = servers + workers, default 1 + 3), trained afresh in a temporary directory.

Prints one table (test accuracy, log-loss, training seconds, examples/s) and the ratios
distributed / single-process of time and accuracy, then exits 1 if the distributed run's
test accuracy is below ``--min-accuracy`` (0.87). The data file is prepared first when it
is missing (``hpcps data prepare fashion-mnist``; needs ``apt-get install
dataset-fashion-mnist``).

Usage::

    python bench/bench_fashion_mlp.py                 # 1 server + 3 workers
    python bench/bench_fashion_mlp.py -n 6 --skip-local
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "fashion_mlp.toml"


def data_file(job: Path) -> Path:
    m = re.search(r'^path\s*=\s*"([^"]+)"', job.read_text(), re.M)
    return (job.parent / m.group(1)).resolve()


def prepare_if_missing(path: Path) -> None:
    if path.exists():
        return
    print(f"preparing {path} ...", flush=True)
    subprocess.run([sys.executable, "-m", "hpcps", "data", "prepare", "fashion-mnist", "--out",
                    str(path)], check=True)


def run_local(job: Path) -> dict:
    from threadpoolctl import threadpool_limits

    from hpcps.config import load_job
    from hpcps.models.local import train_local
    from hpcps.models.mlp import MLP

    cfg = load_job(job)
    model = MLP(cfg)
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):     # as one rank of the MPI run
        _, hist = train_local(model, cfg.train.epochs, cfg.train.batch_size, seed=cfg.seed,
                              on_epoch=lambda e, loss, m: print(
                                  f"  local epoch {e}: train log-loss {loss:.4f}  test accuracy "
                                  f"{m['accuracy']:.4f}", flush=True))
    secs = time.perf_counter() - t0
    n = model.load("train", 0, 1)[0].shape[0] * cfg.train.epochs
    return {"accuracy": hist[-1]["test_accuracy"], "logloss": hist[-1]["test_logloss"],
            "seconds": secs, "ex_s": n / secs}


def run_mpi(job: Path, n: int, workdir: Path) -> dict:
    text = job.read_text()
    text = re.sub(r'^path\s*=\s*"[^"]+"', f'path = "{data_file(job)}"', text, flags=re.M)
    tmp_job = workdir / job.name
    tmp_job.write_text(text)
    cmd = [sys.executable, "-m", "hpcps", "run", "-n", str(n), str(tmp_job), "--resume", "never"]
    print("  " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=workdir, text=True, capture_output=True)
    for line in proc.stdout.splitlines():
        line = re.sub(r"^\[[^\]]*\] ", "", line)        # the rank and host (hpcps.core.log)
        if re.match(r"epoch \d+:|done:|  workers:|  consistency", line):
            print("  " + line, flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"hpcps run exited with status {proc.returncode}")
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
    metrics = json.loads((workdir / "runs" / name / "metrics.json").read_text())
    last, s = metrics["epochs"][-1], metrics["summary"]
    return {"accuracy": last["test_accuracy"], "logloss": last["test_logloss"],
            "seconds": s["train_seconds"], "ex_s": s["examples_per_second"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?", type=Path, default=JOB)
    ap.add_argument("-n", type=int, default=4, help="MPI ranks (servers + workers; default 4)")
    ap.add_argument("--skip-local", action="store_true", help="skip the single-process run")
    ap.add_argument("--min-accuracy", type=float, default=0.87,
                    help="exit 1 if the distributed test accuracy is below this (default 0.87)")
    args = ap.parse_args()
    job = args.job.resolve()
    prepare_if_missing(data_file(job))
    rows = {}
    if not args.skip_local:
        print("single process (hpcps.models.local, 1 BLAS thread):", flush=True)
        rows["1 process"] = run_local(job)
    print(f"hpcps run -n {args.n} (Downpour):", flush=True)
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-fm-") as d:
        rows[f"mpirun -n {args.n}"] = run_mpi(job, args.n, Path(d))
    print(f"\n{'run':<14} {'test acc':>9} {'log-loss':>9} {'train s':>9} {'ex/s':>9}")
    for k, r in rows.items():
        print(f"{k:<14} {r['accuracy']:>9.4f} {r['logloss']:>9.4f} {r['seconds']:>9.1f} "
              f"{r['ex_s']:>9,.0f}")
    dist = rows[f"mpirun -n {args.n}"]
    if "1 process" in rows:
        loc = rows["1 process"]
        print(f"ratios distributed / 1 process: time {dist['seconds'] / loc['seconds']:.2f}, "
              f"accuracy {dist['accuracy'] / loc['accuracy']:.4f} (on {os.cpu_count()} cores)")
    ok = dist["accuracy"] >= args.min_accuracy
    print(f"{'PASS' if ok else 'FAIL'}: distributed test accuracy {dist['accuracy']:.4f} "
          f"{'>=' if ok else '<'} {args.min_accuracy}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
