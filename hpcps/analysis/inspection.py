"""``hpcps inspect``: position, layout, per-table statistics and integrity of a source (no MPI)."""

from __future__ import annotations

import tomllib

import h5py
import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.analysis.listing import MANY, spread
from hpcps.analysis.sources import AnalysisError, _one_line, array_stats, metric_label, resolve


_KNOWN_ATTRS = {"format", "hpcps_version", "job_name", "config", "step", "epoch", "step_in_epoch",
                "steps_per_epoch", "n_servers", "n_workers", "created", "rng", "shards", "workers",
                "history", "partition", "num_features", "index_base"}


def inspect(path) -> dict:
    """Describe a checkpoint, run or model file: position, layout, per-table statistics.

    Parameters
    ----------
    path : path-like
        Anything :func:`resolve` accepts.

    Returns
    -------
    dict
        ``source`` (:class:`Source`), ``integrity`` (str), ``tables`` (dict of name ->
        :func:`array_stats` plus ``sparse``, ``multiplier``, ``server_rows`` for checkpoints and
        ``slots``: dict of slot name -> :func:`array_stats`), ``extra`` (other manifest
        attributes, e.g. ``epoch_plan``).

    Raises
    ------
    AnalysisError
        As :func:`resolve`, or if a table cannot be read.
    """
    src = resolve(path)
    tables = {}
    if src.kind == "checkpoint":
        m = src.meta
        mpath = src.path / ckpt.MANIFEST
        try:
            with h5py.File(mpath, "r") as f:
                for name, part in m["partition"].items():
                    if part.get("storage") == "hash":   # a dynamic table (issue 18)
                        tables[name] = _dynamic_stats(src.path, m, name)
                        continue
                    st = array_stats(f[f"tables/{name}"])
                    ranges = np.asarray(part["ranges"]).reshape(-1, 2)
                    st.update(sparse=bool(part.get("sparse")), multiplier=part.get("multiplier"),
                              server_rows=[int(b - a) for a, b in ranges],
                              slots={s: array_stats(f[f"slots/{name}/{s}"]) for s in part.get("slots", [])})
                    tables[name] = st
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{mpath}: cannot read the tables ({_one_line(e)})") from None
        nbytes = sum(int(b) for b in m["shards"]["bytes"])
        integrity = (f"OK: manifest and {len(m['shards']['files'])} shard(s), {nbytes / 1e6:,.2f} MB, "
                     f"sizes and {m['shards']['checksum']} checksums match the manifest")
    else:
        try:
            with h5py.File(src.path, "r") as f:
                for name, d in f.items():
                    if not isinstance(d, h5py.Dataset) or (
                            name.endswith("_keys") and name[:-5] in f):
                        continue                 # a dynamic table's keys: shown with its rows
                    tables[name] = dict(array_stats(d), slots={})
                    if f"{name}_keys" in f:      # a dynamic table (issue 18): keys beside rows
                        tables[name].update(storage="hash",
                                            keys_stored=int(f[f"{name}_keys"].shape[0]))
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{src.path}: unreadable model file ({_one_line(e)})") from None
        integrity = "readable: every table read in full (model files carry no checksums)"
    extra = {k: v for k, v in src.meta.items() if k not in _KNOWN_ATTRS}
    return {"source": src, "integrity": integrity, "tables": tables, "extra": extra}


def _g(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _clocks(values) -> str:
    v = [int(x) for x in np.asarray(values).reshape(-1)]
    if v and len(set(v)) == 1:
        return f"{v[0]} (all {len(v)} workers)"
    return str(v) if len(v) <= 16 else f"min {min(v)}, max {max(v)} over {len(v)} workers"


def _checkpoint_epochs(m: dict) -> str:
    """Epochs a checkpoint has finished, counted as ``model.h5`` and the history count them.

    The manifest's ``epoch`` is the 0-based index of the epoch the readers resume in and
    ``step_in_epoch`` the steps of it already done, so ``epoch 1, step_in_epoch 8`` of 8 is
    the end of the second epoch: 2 epochs done, as ``model.h5`` (``epoch 2``) says.
    """
    try:
        e, s, n = int(m["epoch"]), int(m["step_in_epoch"]), int(m["steps_per_epoch"])
    except (KeyError, TypeError, ValueError):
        return f"? (epoch {m.get('epoch')}, step_in_epoch {m.get('step_in_epoch')})"
    if n > 0 and s >= n:
        return f"{e + 1}  (end of epoch {e + 1}: {s} of {n} steps)"
    if s == 0:
        return f"{e}  (epoch {e + 1} not started)"
    return f"{e}  (epoch {e + 1} in progress: {s} of {n} steps done)"


def format_inspect(report: dict) -> str:
    """Human-readable text of an :func:`inspect` report (several lines, no trailing newline).

    Parameters
    ----------
    report : dict
        As returned by :func:`inspect`.

    Returns
    -------
    str
        Epochs are counted from 1 everywhere (as in progress lines and ``metrics.json``):
        ``epochs done N`` is the number of whole epochs trained, for a checkpoint (from its
        0-based ``epoch`` and ``step_in_epoch``) as for a model file (its ``epoch``).
    """
    src, m = report["source"], report["source"].meta
    lines = []
    if src.run_dir is not None:
        lines.append(f"run {src.run_dir}: {len(src.checkpoints)} checkpoint(s)")
        for s in src.checkpoints:
            lines.append(f"  {s['path'].name}  " + ("valid" if s["valid"] else f"INVALID: {s['error']}"))
        if src.kind == "model":
            lines.append(f"  no valid checkpoint; showing the final model file {src.path.name}")
        else:
            lines.append(f"  newest valid: {src.path.name}")
        lines.append("")
    if src.kind == "checkpoint":
        lines += [
            f"checkpoint   {src.path}",
            f"format       {m.get('format')} (written by hpcps {m.get('hpcps_version')})",
            f"job          {m.get('job_name')}",
            f"created      {m.get('created')}",
            f"step         {m.get('step')}  (steps done by each worker)",
            f"epochs done  {_checkpoint_epochs(m)}",
            f"servers      {m.get('n_servers')}",
            f"workers      {m.get('n_workers')}",
            f"clocks       {_clocks(m['workers'].get('clock', []))}",
        ]
        seqs = m["workers"].get("last_push_seq")
        if seqs is not None and _consistency(m) == "async":   # counted by async cuts only
            lines.append(f"pushes sent  {_clocks(seqs)}  (per worker, all applied in this "
                         "checkpoint: async cut)")
        hist = m.get("history") or []
        if hist:
            h = hist[-1]
            tests = ", ".join(f"{metric_label(k[5:])} {_g(v)}" for k, v in h.items()
                              if k.startswith("test_") and k != "test_rows")
            lines.append(f"history      {len(hist)} epoch(s) evaluated; last: epoch {h.get('epoch')}"
                         + (f": test {tests}" if tests else ""))
        else:
            lines.append("history      no finished epoch yet")
    else:
        lines += [
            f"model file   {src.path}",
            f"written by   hpcps {m.get('hpcps_version')}",
            f"job          {m.get('job_name')}",
            f"step         {m.get('step')}  (steps done by each worker)",
            f"epochs done  {m.get('epoch')}",
            *([f"features     any id below 2**63 - 1 (dynamic tables; index_base "
               f"{m.get('index_base')})" if any(st.get("storage") == "hash"
                                                for st in report["tables"].values())
               else f"features     {m.get('num_features')} (index_base {m.get('index_base')})"]
              if m.get("num_features") else []),
        ]
    for k, v in report["extra"].items():
        lines.append(f"{k:<12} {v}")
    lines.append(f"integrity    {report['integrity']}")
    lines.append("tables")
    for name, st in report["tables"].items():
        layout = ""
        if "server_rows" in st:
            kind = f"sparse, permuted (multiplier {st['multiplier']})" if st["sparse"] else "dense"
            per = _per_server(st["server_rows"])
            layout = f"; {kind}; rows per server {per}"
            if st.get("storage") == "hash":
                layout = f"; dynamic (hash): {st['keys_stored']:,} keys stored, per server {per}"
        elif st.get("storage") == "hash":
            layout = (f"; dynamic (hash): {st['keys_stored']:,} keys stored (their ids in "
                      f"{name}_keys)")
        lines.append(f"  {name}: shape {st['shape']} {st['dtype']}{layout}")
        lines.append(f"    non-zeros {st['nonzeros']:,} of {st['size']:,}  L2 {_g(st['l2'])}  "
                     f"min {_g(st['min'])}  max {_g(st['max'])}  mean {_g(st['mean'])}"
                     + (f"  NON-FINITE {st['nonfinite']:,}" if st["nonfinite"] else ""))
        for sname, ss in st["slots"].items():
            lines.append(f"    slot {sname}: min {_g(ss['min'])}  mean {_g(ss['mean'])}  "
                         f"max {_g(ss['max'])}" + (f"  NON-FINITE {ss['nonfinite']:,}" if ss["nonfinite"] else ""))
        if not st["slots"] and src.kind == "checkpoint":
            lines.append("    no optimizer slots (sgd)")
        if st.get("hot_keys"):
            lines.append("    hot keys (updates): "
                         + ", ".join(f"{k} ({n:,})" for k, n in st["hot_keys"]))
    return "\n".join(lines)


def _consistency(manifest) -> str:
    """The consistency model of the job a checkpoint's manifest holds (its ``config`` text;
    ``"bsp"`` when absent or unreadable)."""
    try:
        doc = tomllib.loads(manifest.get("config") or "")
    except tomllib.TOMLDecodeError:
        return "bsp"
    section = doc.get("consistency")
    model = section.get("model", "bsp") if isinstance(section, dict) else "bsp"
    return model if isinstance(model, str) else "bsp"


def _per_server(rows: list) -> str:
    """Rows (keys) per server: the list, or with more than :data:`MANY` servers its spread."""
    return f"{spread(rows)} over {len(rows)} servers" if len(rows) > MANY else str(rows)


def _dynamic_stats(directory, manifest: dict, name: str) -> dict:
    """:func:`inspect`'s figures of dynamic table ``name`` of a checkpoint, read shard by shard
    in blocks: :func:`array_stats` of its rows and slots, the keys per shard and the ten
    most-updated keys (ties: the smaller key first). A trial at 32.7 M keys: reading the table
    whole and sorted by key (as :func:`read_dynamic` does for eval and export) took 2.1 GB and
    15 s for a 1 GB checkpoint. Local."""
    from contextlib import ExitStack
    from pathlib import Path

    with ExitStack() as stack:
        groups = [stack.enter_context(h5py.File(Path(directory) / f, "r"))[f"tables/{name}"]
                  for f in manifest["shards"]["files"]]
        per = [int(g["keys"].shape[0]) for g in groups]
        hot_k, hot_n = [], []
        for g, n in zip(groups, per):              # each shard's ten, then the ten of those
            if "updates" not in g or not n:
                continue
            up = g["updates"][()].astype(np.int64)
            cut = np.partition(up, n - min(n, 10))[n - min(n, 10)]
            at = np.flatnonzero((up >= cut) & (up > 0))
            keys = g["keys"][()][at]
            first = np.lexsort((keys, -up[at]))[:10]
            hot_k.append(keys[first])
            hot_n.append(up[at][first])
        k, u = (np.concatenate(hot_k), np.concatenate(hot_n)) if hot_k else ([], [])
        top = np.lexsort((k, -np.asarray(u)))[:10] if len(k) else []
        st = array_stats([g["rows"] for g in groups])
        st.update(sparse=True, storage="hash", multiplier=None, server_rows=per,
                  keys_stored=sum(per), hot_keys=[[int(k[i]), int(u[i])] for i in top],
                  slots={s: array_stats([g["slots"][s] for g in groups])
                         for s in (groups[0]["slots"] if groups else [])})
    return st
