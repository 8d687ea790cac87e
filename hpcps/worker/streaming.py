"""The trainer's part for streamed data (:mod:`hpcps.data.lines`): the line index built once,
the checkpoint's data fingerprint, the readers' counters, the row-identity log of the tests.
Functions of a :class:`hpcps.worker.trainer.Trainer` ``tr``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from hpcps.comm.collectives import allgather_rows, allreduce_max
from hpcps.data import DataError
from hpcps.data.source import stream_index

__all__ = ["index_files", "check_stream_settings", "check_stream_restore", "stream_extra",
           "log_rows", "adopt", "release", "reader_report"]

#: A worker's reader counters, in :func:`reader_report`'s records (``_again``: the part read
#: for nothing and read again, :meth:`hpcps.data.lines.StreamedRows.release`)
COUNTERS = ("bytes", "lines", "read_seconds", "wait_seconds", "skipped", "bytes_again",
            "lines_again", "read_seconds_again", "wait_seconds_again")


def index_files(tr) -> None:
    """Streamed data: the chief counts the lines of the train and test files (or finds
    their index in the run directory), then every worker reads the index. Collective."""
    cache = tr.cfg.output.dir / "line-index"
    err = None
    if tr.is_chief:
        try:
            for split in ("train", "test"):
                stream_index(tr.cfg.data, split, cache)
        except DataError as e:
            err = e
    failed = int(allreduce_max(tr.comm, np.array([err is not None], dtype=np.int64))[0])
    if err is not None:
        raise err
    if failed:
        raise DataError(f"{tr.cfg.data.path}: the data files could not be indexed (the "
                        "chief worker's error is above)")


def _stream_info(tr, restore) -> dict | None:
    """The ``stream`` attribute of checkpoint ``restore`` (a manifest) when both it and the
    job stream data, else None."""
    raw = restore.get("stream") if restore is not None and tr.streaming else None
    return json.loads(raw) if raw else None


def check_stream_settings(tr, restore) -> None:
    """Before the data files are indexed (every line counted; 30 s for 3.5 GB, a trial): a
    checkpoint of streamed data written with another ``shuffle_buffer`` is refused (the
    epoch's order, hence the reader positions, depends on it), naming its job. Local (the
    same on every worker)."""
    info = _stream_info(tr, restore)
    if info is not None and int(info.get("shuffle_buffer", tr.shuffle_block)) != tr.shuffle_block:
        raise DataError(f"{tr.cfg.path}: [data] shuffle_buffer is {tr.shuffle_block} but "
                        f"checkpoint step {restore['step']} (job "
                        f"{restore.get('job_name', '?')!r}) was written with "
                        f"{info.get('shuffle_buffer')}; the epoch's order (the reader "
                        "positions) depends on it: set it back, or start over (--resume never)")


def check_stream_restore(tr, restore) -> None:
    """A checkpoint of streamed data resumes only on the same files (the positions are
    line numbers of those files). Local (after :func:`index_files`; the settings were checked
    before it, :func:`check_stream_settings`)."""
    info = _stream_info(tr, restore)
    if info is None:
        return
    now = stream_index(tr.cfg.data, "train").fingerprint
    if info.get("fingerprint") != now:
        raise DataError(f"{tr.cfg.data.path}: the data files changed since checkpoint step "
                        f"{restore['step']} was written (names, sizes or times differ); its "
                        "reader positions are line numbers of the old files. Restore the "
                        "files, or start over (--resume never)")


def stream_extra(tr) -> dict:
    """The manifest attributes of streamed data: the files' fingerprint and what the
    readers' positions depend on (epoch, step and plan give the lines read)."""
    if not tr.streaming:
        return {}
    ix = stream_index(tr.cfg.data, "train")
    return {"stream": json.dumps({"fingerprint": ix.fingerprint, "lines": ix.n_lines,
                                  "files": len(ix.files), "shuffle_buffer": tr.shuffle_block,
                                  "seed": tr.cfg.seed, "shuffle": tr.cfg.train.shuffle,
                                  "positions": positions(tr, ix)})}


def positions(tr, ix) -> list | str:
    """Where each worker's reader is at the cursor's step (for people and tools; a resume
    recomputes it from the epoch, step and plan): per worker the file, 1-based line and the
    indexed byte offset of the first line of the shuffle block it is in, the rows of that
    block already read, and the seed of the block's permutation ``[seed, worker, epoch]``.
    A re-planned segment (after a lost or added worker) is described by ``epoch_plan``."""
    cur = getattr(tr, "cursor", None)
    if cur is None:
        return []
    if cur.plan:
        return "re-planned segment: see epoch_plan"
    n = min(ix.n_lines, tr.cfg.data.max_rows) if tr.cfg.data.max_rows else ix.n_lines
    S, B = max(1, tr.shuffle_block), tr.cfg.train.batch_size
    out = []
    for w in range(tr.n_workers):
        lo, hi = ix.part_bounds(n, w, tr.n_workers)
        done = min(cur.first * B, hi - lo)
        start = done // S * S
        pos = ix.position(lo + start) if lo + start < hi else {"file": None}
        out.append({**pos, "rows_read_in_block": done - start,
                    "block_seed": [tr.cfg.seed, w, cur.epoch]})
    return out


def log_rows(tr, cur, rows, epoch) -> None:
    """Test aid: with ``HPCPS_ROW_IDENTITY=DIR`` each worker appends, after every clock,
    ``epoch clock rows hash_sum hash_sum_of_squares`` of the rows it just trained on
    (:func:`hpcps.data.lines.row_hashes`) to ``DIR/rows-<pid>.txt``."""
    if tr._row_log is None:
        d = os.environ.get("HPCPS_ROW_IDENTITY")
        tr._row_log = open(os.path.join(d, f"rows-{os.getpid()}.txt"), "a") if d else False
        if not d:
            return
    n, h, h2 = cur.Xe.identity(rows)
    tr._row_log.write(f"{epoch} {tr.client.clock_value} {n} {h} {h2}\n")
    tr._row_log.flush()


def adopt(tr, seg) -> None:
    """:meth:`~hpcps.worker.trainer.Trainer.adopt` of ``seg`` after a re-plan, keeping the
    test reader it replaces in the readers' counters (found by a trial: the evaluations read
    before a growth or a recovery dropped out of the summary's ``readers:`` line). Local."""
    if hasattr(tr.Xt, "report"):
        tr._readers[id(tr.Xt)] = tr.Xt
    tr.adopt(seg)


def release(cur, steps: int, batch_size: int) -> None:
    """The segment of ``cur`` ends after ``steps`` of its steps on this worker (a re-plan
    gives the rest of its rows out again, or it goes on from that step after a recovery):
    what its reader read ahead of them is counted as read again
    (:meth:`hpcps.data.lines.StreamedRows.release`). Local."""
    if cur is not None and hasattr(cur.Xe, "release"):
        cur.Xe.release(int(steps) * batch_size)


def reader_report(tr, elapsed: float) -> list:
    """Every worker's reader counters and peak memory, gathered (the chief's list, one
    dict per worker: the :data:`COUNTERS`, ``peak_rss_mb``, ``mb_per_second``). Every
    reader the worker started counts, also those a re-plan replaced. Collective over the
    workers."""
    import resource

    tot = dict.fromkeys(COUNTERS, 0)
    readers = {**tr._readers, **({id(tr.Xt): tr.Xt} if hasattr(tr.Xt, "report") else {})}
    for r in readers.values():
        r.close()
        for k, v in r.report().items():
            tot[k] += v
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0      # KiB -> MiB
    # int64 rows: seconds and MiB in millionths
    micro = [k for k in COUNTERS if k.startswith(("read_seconds", "wait_seconds"))]
    row = [round(tot[k] * 1e6) if k in micro else int(tot[k]) for k in COUNTERS]
    rows = allgather_rows(tr.comm, row + [round(rss * 1e6)])
    out = []
    for w, r in enumerate(rows.tolist()):
        d = {k: (v / 1e6 if k in micro else int(v)) for k, v in zip(COUNTERS, r)}
        rate = d["bytes"] / 1e6 / d["read_seconds"] if d["read_seconds"] else 0.0
        out.append({"worker": w, **d, "peak_rss_mb": r[-1] / 1e6, "mb_per_second": rate,
                    "train_seconds": elapsed})
    return out
