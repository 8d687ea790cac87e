"""Training rate with streamed vs in-memory rows in one process (no MPI, no servers).

    python bench/bench_stream_train.py DATA_GLOB [--hash-bits 22] [--batch 512]

Runs the logistic model's step (batch_keys, loss_grad, a local AdaGrad update) over the same
Criteo rows, read first with ``read_criteo_part`` into memory (its load time printed apart,
not counted) and then through ``StreamedRows`` (reader thread, default prefetch and
shuffle_buffer); prints rows/s of each and their ratio. On a machine with a free core the
reader thread's parse overlaps the training; with none it adds its CPU time.
"""

from __future__ import annotations

import argparse
import time
import types

import numpy as np

from hpcps.core.planning import epoch_order
from hpcps.data.criteo import read_criteo_part
from hpcps.data.lineindex import load_index
from hpcps.data.lines import Parser, StreamedRows
from hpcps.models import logistic_math as lr


def train(X, y, order, batch, n_features):
    w = np.zeros(n_features, dtype=np.float32)
    acc = np.full(n_features, 0.1, dtype=np.float32)
    marks = lr.new_marks(n_features)
    t0 = time.perf_counter()
    for a in range(0, order.size, batch):
        rows = order[a:a + batch]
        Xb, yb = X[rows], y[rows]
        keys, local = lr.batch_keys(Xb, marks)
        loss, g, gb = lr.loss_and_gradient(Xb, yb, local, w[keys], 0.0)
        acc[keys] += g * g
        w[keys] -= 0.1 * g / np.sqrt(acc[keys])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--hash-bits", type=int, default=22)
    ap.add_argument("--batch", type=int, default=512)
    a = ap.parse_args()
    nf = 1 << a.hash_bits
    t0 = time.perf_counter()
    X, y = read_criteo_part(a.path, 0, 1, hash_bits=a.hash_bits)
    load = time.perf_counter() - t0
    n = y.size
    order = epoch_order(n, 0, 0, 0, True, 65536)
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
