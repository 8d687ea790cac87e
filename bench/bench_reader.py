#!/usr/bin/env python3
"""Reader throughput: hpcps's streamed reading and parsing vs ``cat``/``zcat`` piped to ``wc -l``.

Writes a criteo-like data set (``hpcps data generate``: plain and gzip) and the same rows as
an svmlight file, then times, interleaved and repeated (medians):

- ``cat F | wc -l`` (``zcat`` for gzip): the bytes read and line ends counted by the system's
  tools — the ceiling a reader is compared with;
- reading: :func:`hpcps.data.textstream.iter_chunks` (whole-line chunks of the decompressed
  stream in one reused buffer, ``reuse=True`` as the in-memory Criteo reader reads them; the
  line ends counted, nothing parsed) — goal >= 0.8 of the tools' MB/s;
- streamed parsing, what a worker runs on streamed data (``[data] stream``, the issue's case:
  data larger than memory): :class:`hpcps.data.lines.StreamedRows` over every line of the
  file in a worker's default order (``[train] shuffle``: the lines permuted within each unit
  of ``--unit`` lines, ``[data] shuffle_buffer``) — the reader thread reads a unit, parses it
  into buffers it reuses, gathers its rows in the order's sequence and queues up to
  ``prefetch = 4`` units (bounded memory), while this thread asks for ``X[rows]``,
  ``X.labels[rows]`` (scipy CSR matrices, as a training step gets them) of ``--batch`` rows,
  by default a whole unit a request: the reader's throughput — goal >= 0.3. The same with
  256-row requests (``[train] batch_size``; each step's slice copy and scipy matrix cost
  about as much as the parse) is reported without a goal ("steps"). The line index (one
  newline-counting pass, cached per data set) is built before and timed apart. The rows
  read are checked, once, equal (row by row, by :func:`hpcps.data.lines.row_hashes` of
  their canonical form) to those of the in-memory readers below;
- in-memory parsing, what a worker runs on data that is not streamed (below ``[data]
  stream_above_mb``): the whole part parsed into fresh arrays it keeps,
  :func:`hpcps.data.svmlight.read_svmlight_part` and :func:`hpcps.data.criteo.iter_part` —
  goal >= 0.3 as well. Its time includes the first touch of the memory the matrix will
  occupy, which on a virtual machine can cost more than the parse (the host backs the
  guest's fresh pages).

Each reader runs in this process (the streamed one with its reader thread, as a worker's).
MB/s counts the decompressed bytes. Besides the wall-time ratios (the goals), the CPU time of
each case is measured (the tools' as their children's user + system time) and the parse
ratios are also printed as CPU-time ratios, without a goal: on a shared machine the wall
ratios follow the load, the CPU ratios much less. Last line: the Criteo plain streamed
parsing ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import benchlib

benchlib.ensure_importable()

import types  # noqa: E402

import numpy as np  # noqa: E402

from hpcps.core.planning import epoch_order  # noqa: E402
from hpcps.data.criteo import iter_part, read_criteo_part  # noqa: E402
from hpcps.data.generate import generate_criteo_like  # noqa: E402
from hpcps.data.lines import Parser, StreamedRows, load_index, row_hashes  # noqa: E402
from hpcps.data.svmlight import read_svmlight_part, write_svmlight  # noqa: E402
from hpcps.data.textstream import Piece, iter_chunks  # noqa: E402
from hpcps.kernels.text import count_newlines  # noqa: E402

#: The ``[data]`` keys the streamed reader's parser reads (24-bit ids, as written below).
BITS = 24


def tool(path: Path, gz: bool) -> float:
    t0 = time.perf_counter()
    cmd = f"{'zcat' if gz else 'cat'} '{path}' | wc -l"
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def read_only(path: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    for ch in iter_chunks(path, reuse=True):
        n += count_newlines(ch.data)
    return time.perf_counter() - t0


def parse_criteo(path: Path) -> float:
    t0 = time.perf_counter()
    rows = 0
    for b in iter_part([Piece(str(path), 0, None)], hash_bits=0):
        rows += b.y.size
    return time.perf_counter() - t0


def stream_cfg(fmt: str):
    """The ``[data]`` settings of the streamed reader for ``fmt`` (svmlight or criteo)."""
    return types.SimpleNamespace(format=fmt, on_bad_line="error", num_features=1 << BITS,
                                 hash_bits=BITS, index_base=0, n_features=1 << BITS,
                                 duplicate_indices="sum")


def stream(index, fmt: str, unit: int, batch: int, check: bool = False):
    """Every line of ``index`` through :class:`StreamedRows` in a worker's default order (the
    block shuffle of ``unit`` lines), ``batch`` rows a step: the seconds taken, or (``check``)
    the order and the canonical row hashes of the rows read."""
    order = epoch_order(index.n_lines, 0, 0, 0, True, unit)
    t0 = time.perf_counter()
    rows = StreamedRows(index, Parser(stream_cfg(fmt)), 0, index.n_lines, unit=unit, depth=4)
    rows.start(order)
    got = []
    for a in range(0, order.size, batch):
        r = order[a:a + batch]
        X, y = rows[r], rows.labels[r]
        if check:
            X.sum_duplicates()
            got.append(row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data))
    rows.close()
    return (order, np.concatenate(got)) if check else time.perf_counter() - t0


def reference_hashes(X, y):
    X = X.copy()
    X.sum_duplicates()
    return row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data)


def parse_svm(path: Path) -> float:
    t0 = time.perf_counter()
    read_svmlight_part(path, 0, 1, n_features=1 << 24, index_base=0, duplicates="sum")
    return time.perf_counter() - t0


def _cpu() -> float:
    """CPU seconds of this process and its finished children (user + system)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_common_args(ap)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows generated (default 1 M)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--unit", type=int, default=65536,
                    help="streamed: lines per read unit ([data] shuffle_buffer, default 65536)")
    ap.add_argument("--batch", type=int, default=65536,
                    help="streamed: rows per request X[rows] (default 65536: whole units, the "
                         "reader's throughput); the 'steps' cases ask for 256 ([train] batch_size)")
    args = ap.parse_args()
    rows = 30_000 if args.quick else args.rows
    reps = 1 if args.quick else args.reps
    rep = benchlib.Report("reader")
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-reader-") as d:
        d = Path(d)
        generate_criteo_like(d / "plain", rows, 1, seed=1, compress="none")
        generate_criteo_like(d / "gz", rows, 1, seed=1, compress="gzip")
        plain = d / "plain" / "part-00000.tsv"
        gz = d / "gz" / "part-00000.tsv.gz"
        X, y = read_criteo_part(plain, 0, 1, hash_bits=24)   # scikit-learn writes it
        X.sort_indices()
        svm = d / "data.svm"
        write_svmlight(X, y, svm, index_base=0)
        size = {"criteo": plain.stat().st_size, "svm": svm.stat().st_size}
        t0 = time.perf_counter()
        index = {"criteo plain": load_index(plain), "criteo gzip": load_index(gz),
                 "svmlight plain": load_index(svm)}
        index_s = time.perf_counter() - t0
        print(f"line indexes of the 3 files (once per data set): {index_s:.3f} s")
        # the streamed rows are those of the in-memory readers (X, y: the Criteo rows)
        ref = {"criteo": reference_hashes(X, y)}
        Xs, ys = read_svmlight_part(svm, 0, 1, n_features=1 << BITS, index_base=0, duplicates="sum")
        ref["svmlight"] = reference_hashes(Xs, ys)
        del Xs, ys
        for k, ix in index.items():
            fmt = k.split()[0]
            order, got = stream(ix, fmt, args.unit, args.batch, check=True)
            same = np.array_equal(got, ref[fmt][order])           # a row on every line
            print(f"{k}: streamed rows equal the in-memory reader's: {same}")
            if not same:
                raise SystemExit(f"{k}: the streamed rows differ from the in-memory reader's")
        del X, y
        u, b = args.unit, args.batch
        cases = {
            "criteo plain: cat|wc": lambda: tool(plain, False),
            "criteo plain: read": lambda: read_only(plain),
            "criteo plain: parse": lambda: parse_criteo(plain),
            "criteo plain: stream": lambda: stream(index["criteo plain"], "criteo", u, b),
            "criteo plain: steps": lambda: stream(index["criteo plain"], "criteo", u, 256),
            "criteo gzip: zcat|wc": lambda: tool(gz, True),
            "criteo gzip: read": lambda: read_only(gz),
            "criteo gzip: parse": lambda: parse_criteo(gz),
            "criteo gzip: stream": lambda: stream(index["criteo gzip"], "criteo", u, b),
            "svmlight plain: cat|wc": lambda: tool(svm, False),
            "svmlight plain: parse": lambda: parse_svm(svm),
            "svmlight plain: stream": lambda: stream(index["svmlight plain"], "svmlight", u, b),
            "svmlight plain: steps": lambda: stream(index["svmlight plain"], "svmlight", u, 256),
        }
        times = {k: [] for k in cases}
        cpu = {k: [] for k in cases}
        for r in range(reps):
            for k in benchlib.rotate(list(cases), r):
                c0 = _cpu()
                times[k].append(cases[k]())
                cpu[k].append(_cpu() - c0)
        med = {k: benchlib.median(v) for k, v in times.items()}
        mbs = {k: (size["svm"] if k.startswith("svm") else size["criteo"]) / med[k] / 1e6 for k in med}
        cmed = {k: benchlib.median(v) for k, v in cpu.items()}
        load = (load0[0], os.getloadavg()[0])
        print(f"load average (1 min) at the start and the end: {load[0]:.2f}, {load[1]:.2f}")
        import hpcps
        rep.details.update({"hpcps": os.path.dirname(hpcps.__file__), "load_average": load, "rows": rows, "bytes": size, "unit": u, "batch": b, "index_seconds": index_s,
                            "seconds": med, "cpu_seconds": cmed,
                            "MB_per_s": mbs,
                            "rows_per_s": {k: rows / v for k, v in med.items()}})
        for k in cases:
            print(f"{k:26s} {med[k]:8.3f} s  {mbs[k]:8.1f} MB/s  {rows / med[k] / 1e6:6.2f} M rows/s"
                  f"  (CPU {cmed[k]:.3f} s)")
        for fmt in ("criteo plain", "svmlight plain"):
            for how in ("stream", "steps", "parse"):
                r = cmed[f"{fmt}: cat|wc"] / cmed[f"{fmt}: {how}"]
                rep.ratio(f"{fmt.split()[0]} {how} / cat|wc, CPU time", r)
                print(f"{fmt.split()[0]} {how} / cat|wc, CPU time: {r:.2f} (no goal)")
        rep.ratio("criteo plain read / cat|wc", med["criteo plain: cat|wc"] / med["criteo plain: read"], 0.8)
        rep.ratio("criteo gzip read / zcat|wc", med["criteo gzip: zcat|wc"] / med["criteo gzip: read"], 0.8)
        # streamed (the worker's reader on streamed data) and in memory (whole part, kept)
        rep.ratio("criteo gzip stream / zcat|wc", med["criteo gzip: zcat|wc"] / med["criteo gzip: stream"], 0.3)
        rep.ratio("svmlight stream / cat|wc", med["svmlight plain: cat|wc"] / med["svmlight plain: stream"], 0.3)
        for fmt in ("criteo plain", "svmlight plain"):        # 256-row steps: reported, no goal
            rep.ratio(f"{fmt.split()[0]} stream, 256-row steps / cat|wc",
                      med[f"{fmt}: cat|wc"] / med[f"{fmt}: steps"])
        rep.ratio("criteo gzip parse / zcat|wc", med["criteo gzip: zcat|wc"] / med["criteo gzip: parse"], 0.3)
        rep.ratio("svmlight parse / cat|wc", med["svmlight plain: cat|wc"] / med["svmlight plain: parse"], 0.3)
        rep.ratio("criteo plain parse / cat|wc", med["criteo plain: cat|wc"] / med["criteo plain: parse"], 0.3)
        rep.ratio("criteo plain stream / cat|wc", med["criteo plain: cat|wc"] / med["criteo plain: stream"], 0.3,
                  headline=True)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
