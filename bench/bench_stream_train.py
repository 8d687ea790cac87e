"""Training rate with streamed vs in-memory rows in one process (no MPI, no servers).

    python bench/bench_stream_train.py DATA_GLOB [--hash-bits 22] [--batch 512]

Runs the logistic model's step (batch_keys, loss_grad, a local AdaGrad update) over the same
Criteo rows, read first with ``read_criteo_part`` into memory (its load time printed apart,
not counted) and then through ``StreamedRows`` (reader thread, default prefetch and
shuffle_buffer); prints rows/s of each and their ratio. On a machine with a free core the
reader thread's parse overlaps the training; with none it adds its CPU time.

``--reps N`` (N > 1) alternates the two epochs N times in the same process (the rows stay in
memory) and prints medians of wall time, process CPU time (training and reader threads) and
training-thread CPU time, and the three ratios: on a shared machine the wall ratio follows the
load, the CPU ratios much less.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import numpy as np

from hpcps.core.planning import epoch_order
from hpcps.data.criteo import read_criteo_part
from hpcps.data.lineindex import load_index
from hpcps.data.lines import Parser, StreamedRows
from hpcps.models import logistic_math as lr


def train(X, y, order, batch, n_features, cpu=None):
    w = np.zeros(n_features, dtype=np.float32)
    acc = np.full(n_features, 0.1, dtype=np.float32)
    marks = lr.new_marks(n_features)
    c0, t0 = (time.process_time(), time.thread_time()), time.perf_counter()
    for a in range(0, order.size, batch):
        rows = order[a:a + batch]
        Xb, yb = X[rows], y[rows]
        keys, local = lr.batch_keys(Xb, marks)
        loss, g, gb = lr.loss_and_gradient(Xb, yb, local, w[keys], 0.0)
        acc[keys] += g * g
        w[keys] -= 0.1 * g / np.sqrt(acc[keys])
    if cpu is not None:
        cpu.append((time.process_time() - c0[0], time.thread_time() - c0[1]))
    return time.perf_counter() - t0


def alternate(X, y, order, a, cfg, ix) -> None:
    """``a.reps`` in-memory and streamed epochs in turn: medians and ratios."""
    n, nf = y.size, cfg.num_features
    wall, cpu = {"mem": [], "str": []}, {"mem": [], "str": []}
    for _ in range(a.reps):
        wall["mem"].append(train(X, y, order, a.batch, nf, cpu["mem"]))
        rows = StreamedRows(ix, Parser(cfg), 0, ix.n_lines, unit=65536, depth=4)
        c = []
        rows.start(order)
        wall["str"].append(train(rows, rows.labels, order, a.batch, nf, c))
        rows.close()
        cpu["str"].append(c[0])
    med = {k: (statistics.median(wall[k]), statistics.median(p for p, _ in cpu[k]),
               statistics.median(t for _, t in cpu[k])) for k in wall}
    for k, name in (("mem", "in memory"), ("str", "streamed")):
        print(f"{name}: {n / med[k][0]:,.0f} rows/s ({med[k][0]:.2f} s), process CPU "
              f"{med[k][1]:.2f} s, training thread CPU {med[k][2]:.2f} s")
    r = [med["mem"][i] / med["str"][i] for i in range(3)]
    print(f"{n:,} rows, medians of {a.reps}: ratio wall {r[0]:.2f}, process CPU {r[1]:.2f}, "
          f"training thread CPU {r[2]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--hash-bits", type=int, default=22)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=1, help="alternate the epochs this many times")
    a = ap.parse_args()
    nf = 1 << a.hash_bits
    t0 = time.perf_counter()
    X, y = read_criteo_part(a.path, 0, 1, hash_bits=a.hash_bits)
    load = time.perf_counter() - t0
    n = y.size
    order = epoch_order(n, 0, 0, 0, True, 65536)
    if a.reps > 1:
        cfg = types.SimpleNamespace(format="criteo", on_bad_line="error", hash_bits=a.hash_bits,
                                    num_features=nf)
        alternate(X, y, order, a, cfg, load_index(a.path))
        return
    mem = train(X, y, order, a.batch, nf)
    del X, y
    cfg = types.SimpleNamespace(format="criteo", on_bad_line="error", hash_bits=a.hash_bits,
                                num_features=nf)
    ix = load_index(a.path)
    rows = StreamedRows(ix, Parser(cfg), 0, ix.n_lines, unit=65536, depth=4)
    rows.start(order)
    st = train(rows, rows.labels, order, a.batch, nf)
    rep = rows.report()
    rows.close()
    print(f"{n:,} rows; in memory {n / mem:,.0f} rows/s ({mem:.1f} s; load {load:.1f} s not "
          f"counted); streamed {n / st:,.0f} rows/s ({st:.1f} s; reader thread "
          f"{rep['read_seconds']:.1f} s, waited {rep['wait_seconds']:.1f} s); ratio {mem / st:.2f}")


if __name__ == "__main__":
    main()
