"""The end-of-job report: each rank's counters (:class:`RankStats`, gathered to the chief as
one float64 row per rank), the summary dict built from them (returned by
:func:`hpcps.runtime.job.run_job` and stored under ``"summary"`` in ``metrics.json``), and
the summary's printed lines. No MPI.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hpcps.server.dynshard import REPORT_LEN

from hpcps.analysis import consistency_report
from hpcps.analysis.listing import MANY, id_ranges, spread
from hpcps.analysis.sources import metric_label
from hpcps.runtime.baseline import cached_baseline, sklearn_baseline  # noqa: F401

# role codes of the gathered row's first column
_WORKER, _SERVER, _STOPPED = 0.0, 1.0, -1.0


@dataclasses.dataclass
class RankStats:
    """One rank's counters at the end of a job; their meaning depends on the role.

    Attributes
    ----------
    is_server : bool
    stopped : bool
        A worker whose training a signal stopped (after a checkpoint).
    index : int
        Server index (original) or worker index.
    rows, memory_bytes : int
        Servers: rows of their shards, and their bytes with the optimizer slots.
    keys_pulled, keys_pushed : int
        Keys served (servers) or requested (workers). Under RMA pulls a server serves no
        pull requests (the workers read its windows), so its ``keys_pulled`` is 0.
    bytes_in, bytes_out, requests : int
        Bytes received and sent in training (the final model's export left out), and
        messages; servers: requests served.
    export_bytes : int
        Bytes of the final model's export (``PULL_SHARD``): sent by a server, received by the
        chief.
    requests_compiled : int
        Servers: of those, the BSP steps taken in by the compiled loop
        (:meth:`hpcps.comm.transport.ServerEndpoint.take_steps`).
    pull_seconds, push_seconds, clock_seconds : float
        Workers: time spent waiting for pulls, pushes and clock exchanges.
    examples : int
        Servers: examples whose gradients they applied.
    examples_per_epoch : list of int
        Servers: the same per epoch (``[train] epochs`` entries).
    rss_peak_bytes : int
        Servers: the process's peak resident memory (``getrusage`` ``ru_maxrss``).
    tables : list of (list of int or None)
        Servers: per table in table-id order, a dynamic table's
        :meth:`hpcps.server.dynshard.DynamicShard.report` (keys stored, admitted, rejected,
        evicted, hot keys), None for a fixed table.
    """

    is_server: bool = False
    stopped: bool = False
    index: int = 0
    rows: int = 0
    memory_bytes: int = 0
    keys_pulled: int = 0
    keys_pushed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    export_bytes: int = 0
    requests: int = 0
    requests_compiled: int = 0
    pull_seconds: float = 0.0
    push_seconds: float = 0.0
    clock_seconds: float = 0.0
    examples: int = 0
    examples_per_epoch: list = dataclasses.field(default_factory=list)
    rss_peak_bytes: int = 0
    tables: list = dataclasses.field(default_factory=list)

    # the scalar fields after the role column, in row order
    _COUNTS = ("index", "rows", "memory_bytes", "keys_pulled", "keys_pushed", "bytes_in",
               "bytes_out", "export_bytes", "requests", "requests_compiled", "pull_seconds",
               "push_seconds", "clock_seconds", "examples", "rss_peak_bytes")
    _SECONDS = ("pull_seconds", "push_seconds", "clock_seconds")

    def to_row(self, epochs: int, n_tables: int = 0) -> np.ndarray:
        """This rank's float64 row for :func:`hpcps.comm.collectives.gather_rows`:
        role code, the counters, then ``epochs`` per-epoch example counts, then
        ``n_tables`` blocks of :data:`REPORT_LEN` numbers (a dynamic table's report, or
        -1 then zeros)."""
        role = _SERVER if self.is_server else _STOPPED if self.stopped else _WORKER
        per_epoch = np.zeros(epochs)
        n = min(epochs, len(self.examples_per_epoch))
        per_epoch[:n] = self.examples_per_epoch[:n]
        keys = np.zeros((n_tables, REPORT_LEN))
        keys[:, 0] = -1
        for i, rep in enumerate(self.tables[:n_tables]):
            if rep is not None:
                keys[i] = rep
        keys = keys.reshape(-1)
        return np.concatenate([[role], [float(getattr(self, k)) for k in self._COUNTS],
                               per_epoch, keys])

    @classmethod
    def from_row(cls, row, n_tables: int = 0) -> "RankStats":
        """The inverse of :meth:`to_row`."""
        role = float(row[0])
        vals = {k: (float(v) if k in cls._SECONDS else int(v))
                for k, v in zip(cls._COUNTS, row[1:1 + len(cls._COUNTS)])}
        end = len(row) - n_tables * REPORT_LEN
        blocks = np.asarray(row[end:]).reshape(n_tables, REPORT_LEN)
        return cls(is_server=role == _SERVER, stopped=role == _STOPPED, **vals,
                   examples_per_epoch=[int(v) for v in row[1 + len(cls._COUNTS):end]],
                   tables=[[int(v) for v in b] if b[0] >= 0 else None for b in blocks])

    @classmethod
    def of_server(cls, load: dict, epochs: int) -> "RankStats":
        """A server's counters from :meth:`hpcps.server.server.ParameterServer.load`."""
        per_epoch = [0] * epochs
        for e, n in load["examples_per_epoch"].items():
            if 0 <= e < epochs:
                per_epoch[e] = int(n)
        return cls(is_server=True, index=int(load["server"]), examples=int(load["examples"]),
                   examples_per_epoch=per_epoch,
                   rss_peak_bytes=int(load.get("rss_peak_bytes", 0)),
                   tables=list(load.get("tables", [])),
                   **{k: int(load[k]) for k in ("rows", "memory_bytes", "keys_pulled",
                                                "keys_pushed", "bytes_in", "bytes_out",
                                                "export_bytes", "requests",
                                                "requests_compiled")})

    def add_client(self, stats) -> None:
        """A worker's counters from its endpoint's :class:`hpcps.comm.transport` stats."""
        self.keys_pulled = int(stats.keys.get("pull", 0))
        self.keys_pushed = int(stats.keys.get("push", 0))
        self.bytes_in = int(stats.training("bytes_in"))
        self.bytes_out = int(stats.training("bytes_out"))
        self.export_bytes = int(stats.export("bytes_in"))
        self.requests = int(stats.total("messages"))
        self.pull_seconds = float(stats.seconds.get("pull", 0.0))
        self.push_seconds = float(stats.seconds.get("push", 0.0))
        self.clock_seconds = float(stats.seconds.get("clock", 0.0))


def summarize(result: dict, ranks: list, wall: float, hosts: list | None = None,
              tables: list | None = None) -> dict:
    """The job's summary from the training result (the chief worker's) and every rank's
    :class:`RankStats`. Local (the chief).

    Parameters
    ----------
    result : dict
        :meth:`hpcps.worker.trainer.Trainer.run`'s result, with ``"checkpoints"`` and
        optionally ``"model_path"``.
    ranks : list of RankStats
    wall : float
        Seconds from the job's start.
    hosts : list of str, optional
        ``hosts[i]`` is the host ``ranks[i]`` ran on (``hpcps.comm.core.allgather_hostnames``).
    tables : list of str, optional
        Table names in table-id order: each server's ``keys_stored`` then maps each
        dynamic table to the keys it stores.
    """
    host = {id(r): (hosts[i] if hosts else "") for i, r in enumerate(ranks)}
    servers = sorted((r for r in ranks if r.is_server), key=lambda r: r.index)
    workers = sorted((r for r in ranks if not r.is_server), key=lambda r: r.index)
    return {
        "wall_seconds": wall,
        "train_seconds": result["seconds"],
        "examples": result["examples"],
        "examples_per_second": result["examples_per_second"],
        "steps": result["steps"],
        "epochs": result["epochs"],
        "model_path": result.get("model_path"),
        **{k: result[k] for k in ("model_seconds", "model_bytes") if k in result},
        "checkpoints": dict(result["checkpoints"],
                            share_of_run=result["checkpoints"]["seconds"] / wall if wall else 0.0),
        "servers": [{"index": r.index, "rows": r.rows, "memory_bytes": r.memory_bytes,
                     "keys_pulled": r.keys_pulled, "keys_pushed": r.keys_pushed,
                     "bytes_in": r.bytes_in, "bytes_out": r.bytes_out,
                     "export_bytes": r.export_bytes, "requests": r.requests,
                     "requests_compiled": r.requests_compiled, "examples": r.examples,
                     "examples_per_epoch": list(r.examples_per_epoch),
                     "rss_peak_bytes": r.rss_peak_bytes,
                     **_dynamic(tables or [], r.tables),
                     "host": host[id(r)]}
                    for r in servers],
        "workers": [{"index": r.index, "bytes_pulled": r.bytes_in, "bytes_pushed": r.bytes_out,
                     "export_bytes": r.export_bytes,
                     "keys_pulled": r.keys_pulled, "keys_pushed": r.keys_pushed,
                     "pull_seconds": r.pull_seconds, "push_seconds": r.push_seconds,
                     "clock_seconds": r.clock_seconds, "host": host[id(r)]}
                    for r in workers],
        **({"reader": result["reader"]} if result.get("reader") else {}),
    }


def _dynamic(names: list, reports: list) -> dict:
    """A server's dynamic tables in its summary entry: ``keys_stored``, ``admitted``,
    ``rejected``, ``evicted`` ({table: count}) and ``hot_keys`` ({table: [[key,
    updates], ...]}, most-updated first)."""
    out = {"keys_stored": {}, "admitted": {}, "rejected": {}, "evicted": {}, "hot_keys": {}}
    for name, rep in zip(names, reports):
        if rep is None:
            continue
        for i, k in enumerate(("keys_stored", "admitted", "rejected", "evicted")):
            out[k][name] = int(rep[i])
        hot = []
        for j in range(4, len(rep), 3):
            hi, lo, n = rep[j:j + 3]
            if n > 0:
                key = (int(hi) << 32) | int(lo)
                hot.append([key - (1 << 64) if key >= 1 << 63 else key, int(n)])
        out["hot_keys"][name] = hot
    return out


def mb(n) -> str:
    """``n`` bytes in MB, for the printed lines."""
    return f"{n / 1e6:,.1f} MB"


def size(n) -> str:
    """``n`` bytes for the printed lines: in bytes below 100 kB (a small dynamic table would
    read "0.0 MB"), else :func:`mb`."""
    return f"{int(n):,} B" if n < 100_000 else mb(n)


def _server_lines(d: dict, rma: bool) -> list[str]:
    """The line of server ``d`` (and of its hot keys) in :func:`summary_lines`."""
    out = []
    pulled = (f"sent {mb(d['bytes_out'])} by messages (pulls are RMA reads)" if rma else
              f"sent {mb(d['bytes_out'])} ({d['keys_pulled']:,} keys pulled)")
    dyn = "".join(f", {t} {k:,} keys stored" for t, k in d.get("keys_stored", {}).items())
    for t in d.get("keys_stored", {}):
        a, r, e = d["admitted"][t], d["rejected"][t], d["evicted"][t]
        if r or e:
            dyn += f" ({a:,} admitted, {r:,} pushes before admission, {e:,} evicted)"
    rss = (f", peak RSS {d['rss_peak_bytes'] / 2**20:,.0f} MiB"     # as the readers' line
           if d.get("rss_peak_bytes") else "")
    out.append(f"  server {d['index']}: {d['rows']:,} rows ({size(d['memory_bytes'])}{dyn}"
               f"{rss}); received {mb(d['bytes_in'])} (pushes and pull requests; "
               f"{d['keys_pushed']:,} keys pushed), {pulled}, "
               f"{d['requests']:,} requests"
               + (f" ({d['requests_compiled']:,} BSP steps taken in compiled code)"
                  if d.get("requests_compiled") else "")
               + (f"; model export {mb(d['export_bytes'])}" if d.get("export_bytes") else ""))
    for t, hot in d.get("hot_keys", {}).items():
        if hot:
            out.append(f"    hot keys of {t} (updates): "
                       + ", ".join(f"{k} ({n:,})" for k, n in hot))
    return out


def readers_line(s: dict) -> str:
    """The summary's ``readers:`` line from ``s["reader"]``, one record per worker alive at
    the end (:func:`hpcps.worker.streaming.reader_report`): the text every reader of this
    launch read, those a re-plan replaced included. Lines read ahead before a recovery or a
    growth and read again after it (``*_again``: their rows were given out again, or the
    worker went on from an earlier step) are named, with their bytes and seconds; the reads of
    a lost worker (``s["failures"]``) cannot be counted and are said to be missing; a resumed
    launch's line is this launch's (as the ``done:`` line's examples)."""
    rd = s["reader"]

    def tot(k):
        return sum(r.get(k, 0) for r in rd)

    tot_b, tot_read = tot("bytes"), tot("read_seconds")
    resumed = (s.get("launches") or [{}])[-1].get("resumed_from_step") is not None
    again = ""
    if tot("lines_again"):
        kinds = [k for k, key in (("recovery", "failures"), ("growth", "growth")) if s.get(key)]
        after = " or a ".join(kinds) or "re-plan"
        again = (f" ({tot('lines_again'):,} of them, {mb(tot('bytes_again'))} in "
                 f"{tot('read_seconds_again'):.2f} s, read again after a {after}: read ahead "
                 "of the steps done then, and given out again)")
    lost = sum(len(ev.get("dead_workers") or []) for ev in s.get("failures") or [])
    return (f"  readers{' (this launch)' if resumed else ''}: {mb(tot_b)} of text, "
            f"{tot('lines'):,} lines{again} "
            f"({tot_b / 1e6 / tot_read if tot_read else 0:,.1f} MB/s per reader thread); "
            f"workers waited {tot('wait_seconds'):.2f} s for data"
            + (f" ({tot('wait_seconds_again'):.2f} s of it for lines read again)" if again else "")
            + (f"; not counted: what the {lost} lost worker(s) read" if lost else "")
            + f"; {tot('skipped'):,} bad line(s) skipped; peak RSS per worker "
            + (spread([r["peak_rss_mb"] for r in rd]) if len(rd) > MANY
               else ", ".join(f"{r['peak_rss_mb']:,.0f}" for r in rd)) + " MiB")


def _servers_spread(servers: list) -> str:
    """One line for many servers: each figure's spread over them."""
    rss = [d["rss_peak_bytes"] / 2**20 for d in servers if d.get("rss_peak_bytes")]
    return (f"  servers ({len(servers)}): rows {spread([d['rows'] for d in servers])}; "
            f"received {spread([d['bytes_in'] for d in servers], mb)}; "
            f"sent {spread([d['bytes_out'] for d in servers], mb)}; "
            f"requests {spread([d['requests'] for d in servers])}"
            + (f"; peak RSS {spread(rss)} MiB" if rss else "")
            + "; the busiest two and the least busy below (every server: metrics.json "
              "summary.servers)")


def _hosts_lines(s: dict) -> list[str]:
    """Where the ranks ran: each host's servers and workers as ranges of their indices, and
    the parameter-server bytes its ranks sent and received (servers: replies / pushes and
    pull requests; workers: requests / replies; the model export left out; traffic between
    ranks of one host included); with more than :data:`MANY` hosts, how many ranks of each
    kind and how many bytes per host."""
    by_host: dict = {}
    traffic: dict = {}
    for kind, sent, got in (("server", "bytes_out", "bytes_in"),
                            ("worker", "bytes_pushed", "bytes_pulled")):
        for d in s.get(kind + "s", []):
            if d.get("host"):
                by_host.setdefault(d["host"], {}).setdefault(kind, []).append(d["index"])
                t = traffic.setdefault(d["host"], [0, 0])
                t[0] += int(d.get(sent) or 0)
                t[1] += int(d.get(got) or 0)
    if not by_host:
        return []
    if len(by_host) > MANY:
        counts = {k: [len(h.get(k, [])) for h in by_host.values()] for k in ("server", "worker")}
        return [f"  hosts: {len(by_host)}; servers per host {spread(counts['server'])}, workers "
                f"per host {spread(counts['worker'])}; sent per host "
                f"{spread([t[0] for t in traffic.values()], size)}, received "
                f"{spread([t[1] for t in traffic.values()], size)} (each rank's host and bytes: "
                "metrics.json summary.servers, summary.workers)"]
    return ["  hosts: " + "; ".join(
        f"{h}: " + ", ".join(f"{k}{'s' if len(ids) > 1 else ''} {id_ranges(ids)}"
                             for k, ids in kinds.items())
        + f" (sent {size(traffic[h][0])}, received {size(traffic[h][1])})"
        for h, kinds in by_host.items())]


def _auc_gap_advice(model: str) -> str:
    """Why more workers can cost quality under the run's consistency model (``"bsp"``,
    ``"ssp"`` or ``"async"``), and what to change (docs/consistency.md, "More workers")."""
    if model == "async":
        # a review: the warning said "under BSP" in async runs too
        return ("under async every worker pushes gradients computed on rows that are older "
                "the more workers push between its pull and its push (the staleness below): "
                "lower [optimizer] learning_rate or set [consistency] staleness_aware_lr, "
                "or train under BSP/SSP (docs/consistency.md)")
    return (f"under {model.upper()} a step averages every worker's batch (fewer, larger steps "
            "per epoch with more workers): raise [train] epochs or [optimizer] learning_rate, "
            "or lower [train] batch_size (docs/consistency.md)")


def summary_lines(s: dict, history: list) -> list[str]:
    """The printed summary of a run (:func:`summarize`'s dict, the epochs' records).

    Under RMA pulls (``s["consistency"]["pull"] == "rma"``) the servers serve no pull
    requests, so their lines give the bytes they sent and leave the key count to the
    workers' line (the keys the workers read from the windows).
    """
    from hpcps.runtime.incidents import incident_lines
    from hpcps.runtime.rundir import launch_phrase

    phrase = launch_phrase(s) if "run_steps" in s else ""
    steps = f"{s['run_steps']:,} steps{phrase}" if phrase else f"{s['steps']} steps"
    # a resumed launch: its own examples (a run of 40 epochs read "1,297,796 examples", this
    # launch's 100 of the 120 steps, as if they were the run's)
    mine = "this launch " if phrase else ""
    lines = [f"done: {s['epochs']} epoch(s), {steps}, {mine}{s['examples']:,} examples in "
             f"{s['train_seconds']:.1f} s ({s['examples_per_second']:,.0f} ex/s)"]
    lines.extend(incident_lines(s))       # lost ranks, growths, restarts: scrolled away
    rma = s.get("consistency", {}).get("pull") == "rma"
    servers = s["servers"]
    shown = servers
    if len(servers) > MANY:            # many: their spread, then the busiest and the least busy
        lines.append(_servers_spread(servers))
        by_load = sorted(servers, key=lambda d: d["bytes_in"] + d["bytes_out"])
        shown = by_load[:-3:-1] + by_load[:1]
    for d in shown:
        lines.extend(_server_lines(d, rma))
    if s.get("mode") != "allreduce":
        tot_pull = sum(d["pull_seconds"] for d in s["workers"])
        tot_push = sum(d["push_seconds"] for d in s["workers"])
        read = ""
        if rma:
            keys = sum(d.get("keys_pulled", 0) for d in s["workers"])
            got = sum(d["bytes_pulled"] for d in s["workers"])
            read = f"read {keys:,} keys ({mb(got)}) by RMA, "
        n_w, t = len(s["workers"]), s["train_seconds"]
        share = (f"; {tot_pull / n_w:.2f} s of pull wait per worker, "
                 f"{100 * tot_pull / n_w / t:.0f} % of the training time") if n_w and t else ""
        lines.append(f"  workers: {read}pull wait {tot_pull:.2f} s, push {tot_push:.2f} s "
                     f"(summed over {n_w} workers{share})")
    if s.get("reader"):                       # streamed data (hpcps.data.lines)
        lines.append(readers_line(s))
    lines.extend(_hosts_lines(s))
    if history and all(k in history[-1] for k in ("test_auc", "test_logloss", "test_accuracy")):
        h = history[-1]
        lines.append(f"  hpcps                              test AUC {h['test_auc']:.4f}  "
                     f"log-loss {h['test_logloss']:.4f}  accuracy {h['test_accuracy']:.4f}")
    elif history:
        lines.append("  hpcps  test " + "  ".join(      # "log-loss", "RMSE": as the plots
            f"{metric_label(k[5:])} {v:.4f}" for k, v in history[-1].items()
            if k.startswith("test_") and k != "test_rows"))
    if "baseline" in s:
        b = s["baseline"]
        lines.append(f"  scikit-learn LogisticRegression    test AUC {b['test_auc']:.4f}  "
                     f"log-loss {b['test_logloss']:.4f}  accuracy {b['test_accuracy']:.4f}  "
                     f"(same features, C = 1/(l2 n) = {b['C']:.4g}; "
                     + (f"cached, fitted once in {b['fitted_seconds']:.1f} s)" if b.get("cached")
                        else f"{b['seconds']:.1f} s)"))
        if "auc_gap" in b:
            lines.append(f"  AUC gap (scikit-learn - hpcps): {b['auc_gap']:+.4f}")
            if b["auc_gap"] > b.get("max_auc_gap", float("inf")):
                # a trial: +0.0168 at 40 BSP workers passed in silence (limit 0.005)
                lines.append(f"  warning: the AUC gap is above [evaluate] max_auc_gap = "
                             f"{b['max_auc_gap']:g}; "
                             + _auc_gap_advice(s.get("consistency", {}).get("model", "bsp")))
    c = s["checkpoints"]
    if c["count"]:
        # the share is of this launch's wall time (start-up, data, training, outputs), which
        # the done line does not give (a trial read 25.5 % as of the 95 s of training)
        lines.append(f"  checkpoints: {c['count']} written, {mb(c['bytes'])}, "
                     f"{c['seconds']:.2f} s ({100 * c['share_of_run']:.1f} % of the launch's "
                     f"{s['wall_seconds']:,.1f} s)")
    if "consistency" in s:
        lines.extend(consistency_report.lines(s["consistency"]))
    if s.get("model_path"):
        lines.append(f"  model: {s['model_path']}" + (
            f" ({mb(s['model_bytes'])}, written in {s['model_seconds']:.1f} s)"
            if "model_seconds" in s else ""))
    return lines


def print_summary(s: dict, history: list, out) -> None:
    """Write :func:`summary_lines` to ``out``. Local (the chief)."""
    for line in summary_lines(s, history):
        out.write(line + "\n")
    out.flush()


def add_baseline(cfg, summary: dict, history: list) -> None:
    """With ``[evaluate] sklearn_baseline`` on a logistic model: the baseline (fitted once per
    set of features, :func:`hpcps.runtime.baseline.cached_baseline`) with the AUC gap to the
    last epoch, under ``summary["baseline"]``. Local (the chief)."""
    if cfg.evaluate.sklearn_baseline and cfg.model.type == "logistic":
        summary["baseline"] = cached_baseline(cfg, sklearn_baseline)
        if history:
            summary["baseline"]["auc_gap"] = (summary["baseline"]["test_auc"]
                                              - history[-1]["test_auc"])
            summary["baseline"]["max_auc_gap"] = cfg.evaluate.max_auc_gap
