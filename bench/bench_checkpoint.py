#!/usr/bin/env python3
"""Checkpoint write throughput vs a raw sequential write of the same bytes (same run).

Writes one server shard (``hpcps.checkpoint.write_shard``: rows + keys + AdaGrad slot, with
fsync, atomic rename and SHA-256) and, interleaved, a plain file holding the same bytes
(write + fsync). Median of several repetitions; last line: the ratio (goal >= 0.7).

``--run`` also trains the quick-start job with a checkpoint every 50 steps under mpirun and
prints the share of the run spent checkpointing (goal < 5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcps import checkpoint as ck  # noqa: E402


def raw_write(path: Path, arrays) -> None:
    with open(path, "wb") as f:
        for a in arrays:
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4 << 20, help="table rows (float32, dim 1)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--run", action="store_true", help="also measure the share in a real run")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((args.rows, 1)).astype(np.float32)
    acc = rng.random((args.rows, 1)).astype(np.float32)
    keys = rng.permutation(args.rows).astype(np.int64)
    nbytes = rows.nbytes + acc.nbytes + keys.nbytes
    table = dict(name="weights", rows=rows, keys=keys, slots={"accumulator": acc}, lo=0,
                 hi=args.rows, num_keys=args.rows, multiplier=1, sparse=True, optimizer="adagrad")
    t_ck, t_raw = [], []
    with tempfile.TemporaryDirectory(dir=ROOT) as d:
        d = Path(d)
        for i in range(args.reps):
            t0 = time.perf_counter()
            raw_write(d / "raw.bin", [rows, keys, acc])
            t_raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ck.write_shard(ck.step_dir(d, i), 0, 1, i, [table])
            t_ck.append(time.perf_counter() - t0)
    ck_s, raw_s = statistics.median(t_ck), statistics.median(t_raw)
    print(f"bytes per shard: {nbytes / 1e6:.1f} MB, {args.reps} interleaved repetitions (median)")
    print(f"raw sequential write + fsync : {raw_s * 1e3:8.1f} ms  {nbytes / raw_s / 1e9:6.2f} GB/s")
    print(f"hpcps write_shard (+sha256)  : {ck_s * 1e3:8.1f} ms  {nbytes / ck_s / 1e9:6.2f} GB/s")
    if args.run:
        with tempfile.TemporaryDirectory() as d:
            job = Path(d) / "job.toml"
            text = (ROOT / "jobs" / "adult_lr.toml").read_text().replace(
                '"../data/adult.csv.gz"', f'"{ROOT / "data" / "adult.csv.gz"}"')
            text = text.replace("sklearn_baseline = true", "sklearn_baseline = false")
            job.write_text(text + "\n[checkpoint]\nevery_steps = 50\n")
            subprocess.run([sys.executable, "-m", "hpcps", "run", str(job)], cwd=d, check=True,
                           stdout=subprocess.DEVNULL)
            s = json.loads((Path(d) / "runs" / "adult_lr" / "metrics.json").read_text())["summary"]
            c = s["checkpoints"]
            print(f"quick-start run, checkpoint every 50 steps: {c['count']} checkpoints, "
                  f"{c['seconds']:.2f} s of {s['wall_seconds']:.1f} s = {100 * c['share_of_run']:.1f} % of the run")
    print(f"checkpoint write / raw write throughput ratio: {raw_s / ck_s:.2f} (goal >= 0.7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
