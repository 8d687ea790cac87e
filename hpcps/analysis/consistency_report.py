"""Per-run consistency measurements: staleness histogram, read ages, push-filter savings.

Each rank fills one float64 row (:func:`local_row`); the rows are gathered with the run's
other statistics and turned into the ``summary["consistency"]`` record of ``metrics.json``
(:func:`summarize`) and a few summary lines (:func:`lines`). No MPI here.

Units: staleness is counted in shard versions (see :mod:`hpcps.core.consistency`): clocks under
BSP/SSP, applied updates under asynchronous training. A read's *age* is the reading worker's
clock minus the server clock of what it read; a worker's *lead* is its clock minus the
slowest worker's clock as seen by the server it read from.
"""

from __future__ import annotations

import numpy as np

from hpcps.core.consistency import StalenessHistogram, format_histogram
from hpcps.analysis.listing import MANY

WORKER_FIELDS = ("read_age_max", "read_age_mean", "lead_max", "rma_reads", "rma_retries",
                 "filter_sent", "filter_offered")
_HEAD = 2 + len(WORKER_FIELDS)


def local_row(is_server: bool, index: int, histogram: StalenessHistogram | None = None,
              client=None, steps=None, windows=()) -> np.ndarray:
    """This rank's row: ``[is_server, index, *WORKER_FIELDS, *histogram.row()]``."""
    row = np.zeros(_HEAD + StalenessHistogram.BINS + 2)
    row[0], row[1] = float(is_server), index
    if client is not None:
        rep = steps.report() if steps is not None else {}
        row[2:_HEAD] = [client.read_age_max, client.read_age_sum / max(1, client.reads),
                        client.lead_max, sum(w.gets for w in windows),
                        sum(w.retries for w in windows), rep.get("filter_sent", 0),
                        rep.get("filter_offered", 0)]
    if histogram is not None:
        row[_HEAD:] = histogram.row()
    return row


def summarize(rows, policy, pull_mode: str, value_bytes: int) -> dict:
    """The ``consistency`` record of the summary from the gathered rows.

    Parameters
    ----------
    rows : float64 (ranks, width)
    policy : hpcps.core.consistency.Policy
    pull_mode : {"p2p", "rma"}
    value_bytes : int
        Bytes of one pushed entry (key + value), for the push filter's savings.
    """
    rows = np.asarray(rows)
    servers = rows[rows[:, 0] == 1]
    workers = rows[rows[:, 0] == 0]
    workers = workers[np.argsort(workers[:, 1])]
    out = {"model": policy.name, "description": policy.describe(), "pull": pull_mode,
           "staleness": StalenessHistogram.merge_rows(servers[:, _HEAD:]),
           "staleness_unit": "clocks" if policy.aggregate else "updates",
           "workers": [{"index": int(r[1]), **{f: (float(v) if f == "read_age_mean" else int(v))
                                               for f, v in zip(WORKER_FIELDS, r[2:_HEAD])}}
                       for r in workers]}
    sent = sum(w["filter_sent"] for w in out["workers"])
    offered = sum(w["filter_offered"] for w in out["workers"])
    if offered:
        out["push_filter"] = {"threshold": policy.push_threshold, "entries_offered": offered,
                              "entries_sent": sent,
                              "bytes_saved": (offered - sent) * value_bytes}
    return out


def lines(c: dict) -> list[str]:
    """Summary lines of a :func:`summarize` record."""
    st = c["staleness"]
    out = [f"  consistency {c['description']}, {c['pull']} pulls: staleness of "
           f"{st['updates']:,} applied updates mean {st['mean']:.2f}, max {st['max']} "
           f"({c['staleness_unit']})"]
    out += format_histogram(st)
    ws = c["workers"]

    def each(some):
        return ", ".join(f"w{w['index']} {w['read_age_max']}/{w['lead_max']}" for w in some)

    ages = each(ws)
    if len(ws) > MANY:          # many workers: the maxima over all, and the largest few
        top = (max(w["read_age_max"] for w in ws), max(w["lead_max"] for w in ws))
        largest = sorted(ws, key=lambda w: (-w["read_age_max"], -w["lead_max"], w["index"]))[:5]
        ages = (f"0/0 for all {len(ws)} workers" if top == (0, 0) else
                f"at most {top[0]}/{top[1]} over {len(ws)} workers; the largest: "
                f"{each(largest)} (every worker: metrics.json summary.consistency.workers)")
    out.append(f"  max read age / max lead over the slowest worker (clocks): {ages}")
    if any(w["rma_reads"] for w in c["workers"]):
        reads = sum(w["rma_reads"] for w in c["workers"])
        retries = sum(w["rma_retries"] for w in c["workers"])
        out.append(f"  RMA reads {reads:,}, stale re-reads {retries:,}")
    if "push_filter" in c:
        f = c["push_filter"]
        out.append(f"  push filter (threshold {f['threshold']:g}): sent {f['entries_sent']:,} of "
                   f"{f['entries_offered']:,} entries, {f['bytes_saved'] / 1e6:,.1f} MB saved")
    return out
