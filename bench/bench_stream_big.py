"""Data larger than the job's memory (issue 19): a generated Criteo-like data set of
``max(5 GB, 4 x the job's memory limit)`` trains with 1 server + 3 workers inside a memory
cgroup of that limit; prints each worker's peak RSS, the cgroup's peak, whether the kernel
killed anything, and the test AUC against the generator's ground truth.

    python bench/bench_stream_big.py --dir /work/big [--memory-gib 1.25] [--epochs 1]

Steps:

1. ``hpcps data generate criteo-like`` into ``DIR/data`` (seed 21, one file per million rows;
   its last file moved to ``DIR/data/test`` as the held-out set); an existing data set of the
   wanted size is reused (``_truth.json`` says what it holds).
2. A job: ``format = "criteo"`` streamed, ``[model] storage = "hash"`` (every field value its
   own 63-bit id: no hashing collisions), AdaGrad (``--lr`` 0.1, ``--initial-accumulator``
   1e-6), BSP, batch 512 per worker, ``--epochs`` epochs.
3. ``hpcps run -n 4`` started inside a new memory cgroup (v1 ``memory.limit_in_bytes``, or v2
   ``memory.max``) holding the launcher and every rank, as Slurm's ``--mem`` does with
   ``task/cgroup``. The page cache of the data counts against the limit and is reclaimed as
   the readers move on; anonymous memory over the limit would be killed. Without a writable
   cgroup (not root) the job runs unconfined and the script says so.

Goals (issue 19): every worker's peak RSS below 1 GiB; test AUC within 0.01 of the ground
truth's on the same file; the data at least 4 x the memory the job may use (by construction).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BYTES_PER_ROW = 251            # the generator's rows: 25.1 MB per 100,000 (plain TSV)
ROWS_PER_FILE = 1_000_000

JOB = """
name = "stream_big"
seed = 1
[cluster]
servers = 1
[data]
format = "criteo"
path = "{data}"
test_path = "{data}/test"
stream = true
[model]
storage = "hash"
[optimizer]
name = "adagrad"
learning_rate = {lr}
initial_accumulator = {ia}
[train]
epochs = {epochs}
batch_size = 512
progress_seconds = 30.0
[checkpoint]
at_end = false
[output]
dir = "{out}"
"""


class MemoryCgroup:
    """A memory cgroup of ``limit`` bytes that a child joins before it execs (v1 or v2);
    ``None`` from :meth:`make` where no cgroup hierarchy is writable."""

    def __init__(self, path: Path, v2: bool):
        self.path, self.v2 = path, v2

    @classmethod
    def make(cls, limit: int):
        name = f"hpcps-bench-{os.getpid()}"
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup")
        roots = []
        if (v1 / "memory.limit_in_bytes").exists():
            roots.append((v1, False))
        ctl = v2 / "cgroup.controllers"
        if ctl.exists() and "memory" in ctl.read_text().split():
            roots.append((v2, True))
        for root, v2 in roots:
            try:
                p = root / name
                p.mkdir()
                (p / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
                return cls(p, v2)
            except OSError:
                try:
                    p.rmdir()
                except OSError:
                    pass
        return None

    def join(self) -> None:
        """Move the calling process into the group (a ``preexec_fn``)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int | None:
        f = self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(f.read_text()) if f.exists() else None

    def oom_kills(self) -> int:
        f = self.path / ("memory.events" if self.v2 else "memory.oom_control")
        for line in f.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def data_set(dirpath: Path, rows: int) -> dict:
    """Generate (or reuse) ``rows`` rows; returns ``_truth.json``."""
    truth = dirpath / "_truth.json"
    if truth.exists():
        t = json.loads(truth.read_text())
        if sum(f["rows"] for f in t["files"]) >= rows:
            return t
        shutil.rmtree(dirpath)
    files = max(2, -(-rows // ROWS_PER_FILE))
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "hpcps", "data", "generate", "criteo-like", "--rows",
                    str(rows), "--files", str(files), "--seed", "21", "--out", str(dirpath)],
                   check=True)
    (dirpath / "test").mkdir()
    last = sorted(dirpath.glob("part-*.tsv"))[-1]
    last.rename(dirpath / "test" / last.name)
    print(f"generated {rows:,} rows in {files} files, {time.time() - t0:.0f} s", flush=True)
    return json.loads(truth.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="data and run directory")
    ap.add_argument("--memory-gib", type=float, default=1.25,
                    help="memory the job may use (the cgroup's limit), GiB")
    ap.add_argument("--min-data-gb", type=float, default=5.0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--initial-accumulator", type=float, default=1e-6,
                    help="AdaGrad's; small against the squared per-batch mean gradient of a "
                         "rare feature (docs/optimizers.md)")
    ap.add_argument("--rows", type=int, default=0,
                    help="rows to generate instead of the size the limit asks for (a trial run)")
    a = ap.parse_args()
    limit = int(a.memory_gib * 2**30)
    want = max(a.min_data_gb * 1e9, 4 * limit)
    rows = a.rows or int(want / BYTES_PER_ROW) + ROWS_PER_FILE          # + the held-out file
    a.dir.mkdir(parents=True, exist_ok=True)
    truth = data_set(a.dir / "data", rows)
    data = a.dir / "data"
    train_bytes = sum(p.stat().st_size for p in data.glob("part-*.tsv"))
    test_file = sorted((data / "test").glob("part-*"))[0]
    truth_auc = next(f["truth_auc"] for f in truth["files"] if f["name"] == test_file.name)
    out = a.dir / "run"
    shutil.rmtree(out, ignore_errors=True)
    job = a.dir / "job.toml"
    job.write_text(JOB.format(data=data, lr=a.lr, ia=a.initial_accumulator, epochs=a.epochs,
                              out=out))
    cg = MemoryCgroup.make(limit)
    print(f"data: {train_bytes / 1e9:.2f} GB of training rows, test {test_file.name}; job memory "
          + (f"limit {limit / 2**30:.2f} GiB ({cg.path}); data / limit "
             f"{train_bytes / limit:.1f}x" if cg else "NOT limited (no writable memory cgroup)"),
          flush=True)
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                              capture_output=True, text=True, preexec_fn=cg.join if cg else None)
        secs = time.time() - t0
        peak, kills = (cg.peak(), cg.oom_kills()) if cg else (None, 0)
    finally:
        if cg:
            cg.remove()
    print(proc.stdout[-2500:])
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        print(f"job FAILED (exit {proc.returncode}) after {secs:.0f} s; OOM kills in the cgroup: "
              f"{kills}")
        sys.exit(1)
    m = json.loads((out / "metrics.json").read_text())
    s = m["summary"]
    auc = m["epochs"][-1]["test_auc"]
    rss = [r["peak_rss_mb"] * 2**20 for r in s.get("reader", [])]
    srv = s["servers"][0]
    print(f"job: {secs:.0f} s wall, {s['examples_per_second']:,.0f} examples/s, "
          f"{a.epochs} epoch(s); server: {srv['keys_stored']['weights']:,} keys stored, peak RSS "
          f"{srv['rss_peak_bytes'] / 2**20:,.0f} MiB")
    if cg:
        print(f"cgroup: limit {limit / 2**30:.2f} GiB, peak use {peak / 2**30:.2f} GiB (page cache "
              f"included), OOM kills {kills}")
    ok_rss = bool(rss) and max(rss) < 2**30
    print(f"peak RSS per worker: {', '.join(f'{r / 2**20:,.0f} MiB' for r in rss)} "
          f"(goal < 1024 MiB: {'met' if ok_rss else 'MISSED'})")
    print(f"data / job memory: {train_bytes / limit:.1f}x (goal >= 4: "
          f"{'met' if cg and train_bytes >= 4 * limit and not kills else 'MISSED'})")
    gap = truth_auc - auc
    print(f"test AUC {auc:.4f}, ground truth {truth_auc:.4f}: gap {gap:.4f} "
          f"(goal <= 0.01: {'met' if gap <= 0.01 else 'MISSED'})")


if __name__ == "__main__":
    main()
