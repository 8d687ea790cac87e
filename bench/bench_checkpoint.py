#!/usr/bin/env python3
"""Checkpoint write throughput vs a raw sequential write of the same bytes (same run).

Writes one server shard (``hpcps.checkpoint.write_shard``: rows + keys + AdaGrad slot as an
HDF5 file, with its XXH3-128 checksum, fsync, atomic rename and directory fsync) and, interleaved, a
plain new file holding the same bytes (``write`` + ``fsync``) in the same directory. Both
write *new* files each repetition and both are deleted before the next, so both see the same
file-system state (rewriting one file in place is several times faster than writing a new one
on this machine's disk, which made an earlier version of this benchmark unfair). Median of
``--reps``. Also times the checkpoint's checksum (XXH3-128, hashed by the writer in the
same pass) alone on the same bytes, and SHA-256 (manifest format 1's, which needed a
second core) for comparison.

``--run`` also trains the quick-start job (``hpcps run``) with the checkpoint settings it
ships with (one checkpoint at the end) and with one every 50 steps, and prints the share of
the run spent checkpointing (goal < 5 % at the default interval).

Last line: the throughput ratio (goal >= 0.7).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

import benchlib

benchlib.ensure_importable()

from hpcps import checkpoint as ck  # noqa: E402


def raw_write(path: Path, arrays) -> None:
    with open(path, "wb") as f:
        for a in arrays:
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())


def run_share(every_steps: int, quick: bool) -> dict:
    """Train the quick-start job with ``hpcps run``; return the checkpoint summary."""
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-ckpt-") as d:
        job = Path(d) / "job.toml"
        text = (benchlib.ROOT / "jobs" / "adult_lr.toml").read_text().replace(
            '"../data/adult.csv.gz"', f'"{benchlib.ROOT / "data" / "adult.csv.gz"}"')
        text = text.replace("sklearn_baseline = true", "sklearn_baseline = false")
        if every_steps:
            text = text.replace("every_steps = 0 ", f"every_steps = {every_steps} ")
        if quick:
            text = text.replace("max_rows = 0 ", "max_rows = 3000 ").replace("epochs = 3 ", "epochs = 1 ")
        job.write_text(text)
        subprocess.run([sys.executable, "-m", "hpcps", "run", "--resume", "never", str(job)],
                       cwd=d, check=True, stdout=subprocess.DEVNULL)
        s = json.loads((Path(d) / "runs" / "adult_lr" / "metrics.json").read_text())["summary"]
        c = dict(s["checkpoints"])
        c["wall_seconds"] = s["wall_seconds"]
        return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4 << 20, help="table rows (float32, dim 1)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--run", action="store_true", help="also measure the share in a real run")
    ap.add_argument("--dir", default=str(benchlib.ROOT), help="where to write (a real disk)")
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.reps = 1 << 16, 2
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((args.rows, 1)).astype(np.float32)
    acc = rng.random((args.rows, 1)).astype(np.float32)
    keys = rng.permutation(args.rows).astype(np.int64)
    nbytes = rows.nbytes + acc.nbytes + keys.nbytes
    table = dict(name="weights", rows=rows, keys=keys, slots={"accumulator": acc}, lo=0,
                 hi=args.rows, num_keys=args.rows, multiplier=1, sparse=True, optimizer="adagrad")
    t = {"raw": [], "hpcps": [], "xxh3_128": [], "sha256": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".hpcps-bench-ckpt-") as d:
        d = Path(d)
        for i in range(args.reps):
            for v in benchlib.rotate(list(t), i):
                if v == "raw":
                    t[v].append(benchlib.time_once(lambda: raw_write(d / f"raw-{i}.bin", [rows, keys, acc])))
                elif v == "hpcps":
                    t[v].append(benchlib.time_once(
                        lambda: ck.write_shard(ck.step_dir(d, i), 0, 1, i, [table])))
                else:
                    def digest(new={"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}[v]):
                        h = new()
                        for a in (rows, keys, acc):
                            h.update(memoryview(a).cast("B"))
                    t[v].append(benchlib.time_once(digest))
            (d / f"raw-{i}.bin").unlink()
            shutil.rmtree(ck.step_dir(d, i))
    ck_s, raw_s, xxh_s, sha_s = (benchlib.median(t[k]) for k in ("hpcps", "raw", "xxh3_128", "sha256"))
    rep = benchlib.Report("checkpoint")
    rep.details.update({"bytes": nbytes, "raw_ms": raw_s * 1e3, "hpcps_ms": ck_s * 1e3,
                        "xxh3_128_alone_ms": xxh_s * 1e3, "sha256_alone_ms": sha_s * 1e3,
                        "load_average": os.getloadavg()[0], "reps": args.reps,
                        "raw_all_ms": [x * 1e3 for x in t["raw"]],
                        "hpcps_all_ms": [x * 1e3 for x in t["hpcps"]]})
    print(f"bytes per shard: {nbytes / 1e6:.1f} MB, {args.reps} interleaved repetitions (median), "
          f"new files in {args.dir}")
    print(f"raw sequential write + fsync   : {raw_s * 1e3:8.1f} ms  {nbytes / raw_s / 1e9:6.2f} GB/s")
    print(f"hpcps write_shard (HDF5+xxh3)  : {ck_s * 1e3:8.1f} ms  {nbytes / ck_s / 1e9:6.2f} GB/s")
    print(f"XXH3-128 of the bytes alone    : {xxh_s * 1e3:8.1f} ms  {nbytes / xxh_s / 1e9:6.2f} GB/s"
          "  (in write_shard's pass)")
    print(f"SHA-256 of the bytes alone     : {sha_s * 1e3:8.1f} ms  {nbytes / sha_s / 1e9:6.2f} GB/s"
          "  (format 1's checksum, for comparison)")
    print(f"load average (1 min)           : {os.getloadavg()[0]:.2f}")
    if args.run:
        for every, label in ((0, "default (one checkpoint at the end)"), (50, "every 50 steps")):
            c = run_share(every, args.quick)
            share = c["seconds"] / c["wall_seconds"] if c["wall_seconds"] else 0.0
            rep.details[f"run_every_{every}"] = c
            print(f"quick-start run, checkpoints {label}: {c['count']} written, {c['seconds']:.2f} s "
                  f"of {c['wall_seconds']:.1f} s = {100 * share:.1f} % of the run")
            rep.ratio(f"checkpoint share of run time, {label}", 100 * share,
                      5 if every == 0 else None, higher_is_better=False, unit=" %")
    rep.ratio("checkpoint write / raw write throughput", raw_s / ck_s, 0.7, headline=True)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
