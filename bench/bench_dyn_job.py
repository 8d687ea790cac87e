"""A training job whose dynamic table stores ~10^7-10^8 distinct ids of a 2^62 space
(issue 18's job benchmark): 1 worker, 2 servers, AdaGrad float64 logistic regression.

Synthetic svmlight data, ``--rows`` rows of ``--head`` + ``--tail`` binary features:

* ``--head`` ids per row drawn Zipf(1.1) over ``--vocab`` ranks (folded into the vocabulary
  as bench_kernels does), each rank mapped to a 62-bit id by SplitMix64's bijective mix —
  the hot ids every row shares, which carry the label (a fixed random weight per rank);
* ``--tail`` ids per row uniform in ``[0, 2^62)`` — the long tail of ids seen about once,
  which is what makes a click log's distinct-id count grow with its rows.

Distinct ids stored ~= rows * tail (+ the head ids seen). The job's ``metrics.json`` gives
each server's keys stored and peak RSS (``getrusage``), printed at the end.

Usage::

    python bench/bench_dyn_job.py --rows 1000000 --tail 10 --dir /tmp/dynjob   # ~10^7 ids
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

JOB = """
name = "dyn1e{exp}"
seed = 1
[cluster]
servers = 2
[data]
format = "svmlight"
path = "{path}"
test_path = "{test}"
index_base = 0
[model]
dtype = "float64"
[tables.weights]
storage = "hash"
[optimizer]
name = "adagrad"
[train]
epochs = 1
batch_size = {batch}
[output]
dir = "{out}"
"""


def mix62(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (bijective on uint64), top 62 bits: ids in [0, 2^62)."""
    z = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(2)).astype(np.int64)


def generate(path: Path, rows: int, head: int, tail: int, vocab: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    wr = rng.normal(0, 1, size=vocab)
    with open(path, "w") as f:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            ranks = (rng.zipf(1.1, size=(n, head)) - 1) % vocab
            hid = mix62(ranks.astype(np.uint64) + np.uint64(1))
            tid = rng.integers(0, 1 << 62, size=(n, tail), dtype=np.int64)
            logit = wr[ranks].sum(axis=1) / np.sqrt(head)
            y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
            ids = np.sort(np.concatenate([hid, tid], axis=1), axis=1)
            lines = []
            for i in range(n):
                row = ids[i]
                row = row[np.r_[True, row[1:] != row[:-1]]]
                lines.append(f"{y[i]} " + " ".join(f"{k}:1" for k in row.tolist()))
            f.write("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--head", type=int, default=4)
    ap.add_argument("--tail", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, required=True)
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    data = a.dir / "train.svm"
    t0 = time.time()
    if not data.exists():
        generate(data, a.rows, a.head, a.tail, a.vocab, a.seed)
    test = a.dir / "test.svm"
    if not test.exists():           # the first 10,000 rows (a check that it learns, not a score)
        with open(data) as f, open(test, "w") as g:
            for _, line in zip(range(10_000), f):
                g.write(line)
    print(f"data: {a.rows:,} rows x ({a.head} Zipf + {a.tail} uniform) ids, "
          f"{data.stat().st_size / 2**20:,.0f} MiB, {time.time() - t0:.0f} s", flush=True)
    exp = int(round(np.log10(max(1, a.rows * a.tail))))
    job = a.dir / "job.toml"
    job.write_text(JOB.format(exp=exp, path=data, test=test, batch=a.batch, out=a.dir / "run"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "3", str(job)],
                          capture_output=True, text=True)
    secs = time.time() - t0
    print(proc.stdout[-3000:])
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(proc.returncode)
    m = json.loads((a.dir / "run" / "metrics.json").read_text())
    srv = m["summary"]["servers"]
    keys = [d["keys_stored"]["weights"] for d in srv]
    rss = [d["rss_peak_bytes"] for d in srv]
    print(f"job: {secs:.0f} s; keys stored per server {keys} (total {sum(keys):,}); "
          f"peak server RSS {[f'{r / 2**20:,.0f} MiB' for r in rss]}; "
          f"table bytes {[d['memory_bytes'] for d in srv]}; "
          f"RSS per key {max(rss) / max(keys):.1f} B (incl. the Python process)")


if __name__ == "__main__":
    main()
