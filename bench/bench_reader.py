#!/usr/bin/env python3
"""Reader throughput: hpcps's streamed reading and parsing vs ``cat``/``zcat`` piped to ``wc -l``.

Writes a criteo-like data set (``hpcps data generate``: plain and gzip) and the same rows as
an svmlight file, then times, interleaved and repeated (medians):

- ``cat F | wc -l`` (``zcat`` for gzip): the bytes read and line ends counted by the system's
  tools — the ceiling a reader is compared with;
- reading: :func:`hpcps.data.textstream.iter_chunks` (whole-line chunks of the decompressed
  stream, nothing parsed) — goal >= 0.8 of the tools' MB/s;
- parsing: :func:`hpcps.data.criteo.iter_part` (Criteo TSV → 39 feature ids a row) and
  :func:`hpcps.data.svmlight.read_svmlight_part` — goal >= 0.3.

Each reader runs in this process on one core, as a worker's reader does. MB/s counts the
decompressed bytes. Besides the wall-time ratios (the goals), the CPU time of each case is
measured (the tools' as their children's user + system time) and the parse ratios are also
printed as CPU-time ratios, without a goal: on a shared machine the wall ratios follow the
load, the CPU ratios much less. Last line: the Criteo plain parsing ratio.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import benchlib

benchlib.ensure_importable()

from hpcps.data.criteo import iter_part, read_criteo_part  # noqa: E402
from hpcps.data.generate import generate_criteo_like  # noqa: E402
from hpcps.data.svmlight import read_svmlight_part, write_svmlight  # noqa: E402
from hpcps.data.textstream import Piece, iter_chunks  # noqa: E402


def tool(path: Path, gz: bool) -> float:
    t0 = time.perf_counter()
    cmd = f"{'zcat' if gz else 'cat'} '{path}' | wc -l"
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def read_only(path: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    for ch in iter_chunks(path):
        n += ch.data.count(b"\n")
    return time.perf_counter() - t0


def parse_criteo(path: Path) -> float:
    t0 = time.perf_counter()
    rows = 0
    for b in iter_part([Piece(str(path), 0, None)], hash_bits=0):
        rows += b.y.size
    return time.perf_counter() - t0


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
    args = ap.parse_args()
    rows = 30_000 if args.quick else args.rows
    reps = 1 if args.quick else args.reps
    rep = benchlib.Report("reader")
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
        cases = {
            "criteo plain: cat|wc": lambda: tool(plain, False),
            "criteo plain: read": lambda: read_only(plain),
            "criteo plain: parse": lambda: parse_criteo(plain),
            "criteo gzip: zcat|wc": lambda: tool(gz, True),
            "criteo gzip: read": lambda: read_only(gz),
            "criteo gzip: parse": lambda: parse_criteo(gz),
            "svmlight plain: cat|wc": lambda: tool(svm, False),
            "svmlight plain: parse": lambda: parse_svm(svm),
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
        rep.details.update({"rows": rows, "bytes": size, "seconds": med, "cpu_seconds": cmed,
                            "MB_per_s": mbs,
                            "rows_per_s": {k: rows / v for k, v in med.items()}})
        for k in cases:
            print(f"{k:26s} {med[k]:8.3f} s  {mbs[k]:8.1f} MB/s  {rows / med[k] / 1e6:6.2f} M rows/s"
                  f"  (CPU {cmed[k]:.3f} s)")
        for fmt in ("criteo plain", "svmlight plain"):
            r = cmed[f"{fmt}: cat|wc"] / cmed[f"{fmt}: parse"]
            rep.ratio(f"{fmt.split()[0]} parse / cat|wc, CPU time", r)
            print(f"{fmt.split()[0]} parse / cat|wc, CPU time: {r:.2f} (no goal)")
        rep.ratio("criteo plain read / cat|wc", med["criteo plain: cat|wc"] / med["criteo plain: read"], 0.8)
        rep.ratio("criteo gzip read / zcat|wc", med["criteo gzip: zcat|wc"] / med["criteo gzip: read"], 0.8)
        rep.ratio("criteo gzip parse / zcat|wc", med["criteo gzip: zcat|wc"] / med["criteo gzip: parse"], 0.3)
        rep.ratio("svmlight parse / cat|wc", med["svmlight plain: cat|wc"] / med["svmlight plain: parse"], 0.3)
        rep.ratio("criteo plain parse / cat|wc", med["criteo plain: cat|wc"] / med["criteo plain: parse"], 0.3,
                  headline=True)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
