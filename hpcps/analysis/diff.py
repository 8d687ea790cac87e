"""``hpcps diff``: per-table differences between two sources, in original key order (no MPI).

A dynamic (hash) table ``NAME`` comes with ``NAME_keys`` (ascending) beside its rows; two
such tables, or one and a fixed table (row ``k`` = key ``k``), are compared by key: the rows
of the keys both store, elementwise, and the keys only one stores counted (``only_a``,
``only_b``), not compared (an absent key's value is its initial value, which a source file
does not hold for every optimizer slot)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hpcps.analysis.sources import (SLOT_SEP, AnalysisError, Source, _one_line, _permutation,
                                    _unpermute, resolve)

#: Elements compared at a time (float64 temporaries of this many values, not of a table)
BLOCK = 1 << 20


def diff(a, b) -> dict:
    """Per-table differences between two sources, in original key order.

    Tables and optimizer slots (``<table>__<slot>``) present in both sources are compared
    elementwise in float64; NaN equals NaN. One array of each source is read at a time and
    compared in blocks of :data:`BLOCK` values (a table of 30 M keys took 3 GB compared
    whole with its slots: every array of both sources read first, four float64 temporaries
    of each; a trial, 2026-12-05).

    Parameters
    ----------
    a, b : Source or path-like
        Anything :func:`resolve` accepts (a checkpoint can be compared with a model file).

    Returns
    -------
    dict
        ``a``, ``b`` (:class:`Source`) and ``rows``: list of dict with ``name``,
        ``shape_a``, ``shape_b`` (tuple or None when absent) and ``status``: ``"compared"``
        (then also ``max_abs``, ``mean_abs``, ``differing``, ``size``), ``"shape mismatch"``,
        ``"only in A"`` or ``"only in B"``. A table compared by key (a dynamic table on
        either side) also has ``keys_common``, ``only_a``, ``only_b`` (counts of keys); its
        ``NAME_keys`` array is not a row of its own.

    Raises
    ------
    AnalysisError
        If either source cannot be read, or a dynamic table stores a key twice.
    """
    sa = _Arrays(a if isinstance(a, Source) else resolve(a))
    sb = _Arrays(b if isinstance(b, Source) else resolve(b))
    keyed = sa.dynamic | sb.dynamic
    pairs = {}                        # base -> (rows of A, rows of B, counts) of common keys
    rows = []
    names = [n for n in sa.names + [n for n in sb.names if n not in sa.shapes]
             if not (n.endswith("_keys") and n[:-len("_keys")] in keyed)]
    # a fixed table's key permutation (checkpoint) is read once for its rows and its slots,
    # and dropped after the last of them (one table's at a time: 8 B per key)
    last = {n.split(SLOT_SEP)[0]: n for n in names}
    for name in names:
        rows.append(_diff_row(sa, sb, name, keyed, pairs))
        base = name.split(SLOT_SEP)[0]
        if last[base] == name:
            sa.forget(base)
            sb.forget(base)
    return {"a": sa.src, "b": sb.src, "rows": rows}


def _diff_row(sa, sb, name: str, keyed: set, pairs: dict) -> dict:
    """The row of :func:`diff` for array ``name`` of sources ``sa`` and ``sb``
    (:class:`_Arrays`); ``pairs`` caches the common keys of each table compared by key."""
    xs, ys = sa.shapes.get(name), sb.shapes.get(name)
    row = {"name": name, "shape_a": xs, "shape_b": ys}
    if xs is None or ys is None:
        row["status"] = "only in A" if ys is None else "only in B"
        return row
    base = name.split(SLOT_SEP)[0]
    by_key = base in keyed and base in sa.shapes and base in sb.shapes
    if (xs[1:] != ys[1:]) if by_key else (xs != ys):
        row["status"] = "shape mismatch"
        return row
    pa = pb = None
    if by_key:
        if base not in pairs:
            pairs[base] = _common_keys(sa.sorted_keys(base), sb.sorted_keys(base))
        pa, pb, counts = pairs[base]
        row.update(counts)
    row.update(status="compared", **_compare(sa.read(name), sb.read(name), pa, pb))
    return row


class _Arrays:
    """The arrays of a source, named as :func:`hpcps.analysis.sources.read_tables` names
    them (tables, a dynamic table's ``NAME_keys``, then slots ``TABLE__SLOT``), with their
    shapes, each read only when asked for: a model file's datasets, a checkpoint's fixed
    tables in key order (the manifest's virtual datasets), a dynamic table of a checkpoint
    as its shards' arrays one after the other (their keys: :meth:`sorted_keys`)."""

    def __init__(self, src: Source):
        self.src = src
        self.shapes = {}              # name -> shape, in read_tables' order
        self.dynamic = set()          # tables stored by key
        self._dyn = {}                # checkpoint dynamic array name -> shard dataset path
        self._perm = {}               # checkpoint fixed table -> its rows' keys (checked)
        try:
            if src.kind == "model":
                with h5py.File(src.path, "r") as f:
                    self.shapes = {n: tuple(d.shape) for n, d in f.items()
                                   if isinstance(d, h5py.Dataset)}
                self.dynamic = {n[:-5] for n in self.shapes
                                if n.endswith("_keys") and n[:-5] in self.shapes}
            else:
                self._checkpoint_shapes()
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{src.path}: cannot read the tables ({_one_line(e)})") from None
        self.names = list(self.shapes)

    def _checkpoint_shapes(self) -> None:
        files = [Path(self.src.path) / f for f in self.src.meta["shards"]["files"]]
        slots = {}
        with h5py.File(Path(self.src.path) / "manifest.h5", "r") as man:
            for name, part in self.src.meta["partition"].items():
                if part.get("storage") != "hash":
                    self.shapes[name] = tuple(man[f"tables/{name}"].shape)
                    for s in part.get("slots", []):
                        slots[f"{name}{SLOT_SEP}{s}"] = tuple(man[f"slots/{name}/{s}"].shape)
                    continue
                self.dynamic.add(name)
                parts = {}                # array name -> (rows, trailing shape)
                for path in files:
                    with h5py.File(path, "r") as f:
                        g = f[f"tables/{name}"]
                        found = [(name, "rows"), (f"{name}_keys", "keys")] + [
                            (f"{name}{SLOT_SEP}{s}", f"slots/{s}") for s in g["slots"]]
                        for n, d in found:
                            self._dyn[n] = (name, d)
                            r, rest = parts.get(n, (0, tuple(g[d].shape[1:])))
                            parts[n] = (r + g[d].shape[0], rest)
                for n, (r, rest) in parts.items():
                    (slots if SLOT_SEP in n else self.shapes)[n] = (r,) + rest
        self.shapes.update(slots)

    def read(self, name: str) -> np.ndarray:
        """Array ``name``: in key order, or for a dynamic table in the order of its keys
        (``NAME_keys`` read alike)."""
        src = self.src
        try:
            if src.kind == "model":
                with h5py.File(src.path, "r") as f:
                    return f[name][()]
            if name in self._dyn:
                table, d = self._dyn[name]
                out, at = None, 0
                for fname in src.meta["shards"]["files"]:   # each shard read into its place
                    with h5py.File(Path(src.path) / fname, "r") as f:
                        ds = f[f"tables/{table}/{d}"]
                        if out is None:
                            out = np.empty(self.shapes[name], dtype=ds.dtype)
                        if ds.shape[0]:
                            ds.read_direct(out, dest_sel=np.s_[at:at + ds.shape[0]])
                        at += ds.shape[0]
                return out
            table, _, slot = name.partition(SLOT_SEP)
            mpath = Path(src.path) / "manifest.h5"
            with h5py.File(mpath, "r") as f:
                ds = f[f"slots/{table}/{slot}"] if slot else f[f"tables/{table}"]
                keys = self._perm.get(table)
                if keys is None or keys.shape[0] != ds.shape[0]:
                    keys = _permutation(f[f"tables/{table}_keys"][()], ds.shape[0],
                                        f"{mpath}: {name!r}")
                    self._perm[table] = keys
                return _unpermute(ds[()], keys, f"{mpath}: {name!r}", checked=True)
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{src.path}: cannot read {name!r} ({_one_line(e)})") from None

    def forget(self, table: str) -> None:
        """Drop the key permutation of fixed table ``table`` kept by :meth:`read`."""
        self._perm.pop(table, None)

    def sorted_keys(self, base: str):
        """``(keys, order)`` of table ``base``: its keys ascending and the permutation of
        :meth:`read`'s rows that sorts them (None when they are in order: a fixed table,
        row ``k`` key ``k``). AnalysisError for a key stored twice."""
        if base not in self.dynamic:
            return np.arange(self.shapes[base][0], dtype=np.int64), None
        k = np.asarray(self.read(f"{base}_keys"), dtype=np.int64)
        order = None
        if k.size > 1 and not np.all(k[1:] > k[:-1]):
            order = _index(np.argsort(k, kind="stable"), k.size)
            k = k[order]
            if np.any(k[1:] == k[:-1]):
                dup = int(k[1:][k[1:] == k[:-1]][0])
                raise AnalysisError(f"{self.src.path}: dynamic table {base!r}: key {dup} is "
                                    "stored twice")
        return k, order


def _index(a: np.ndarray, n: int) -> np.ndarray:
    """Row numbers ``a`` of an array of ``n`` rows as int32 when they fit (half the memory
    at tens of millions of keys), else int64."""
    return a.astype(np.int32) if n < 2**31 else a


def _common_keys(a, b):
    """Rows of the keys two tables both store: ``(rows of A, rows of B, counts)`` from
    :meth:`_Arrays.sorted_keys` of each, in ascending key order, by a merge of the sorted
    keys :data:`BLOCK` keys of A at a time (no sort of both together)."""
    (ka, oa), (kb, ob) = a, b
    ia, ib = [], []
    for s in range(0, ka.size if kb.size else 0, BLOCK):
        blk = ka[s:s + BLOCK]
        at = np.searchsorted(kb, blk)
        hit = kb[np.minimum(at, kb.size - 1)] == blk
        ia.append(_index(np.flatnonzero(hit) + s, ka.size))
        ib.append(_index(at[hit], kb.size))
    ia = np.concatenate(ia) if ia else np.empty(0, dtype=np.int64)
    ib = np.concatenate(ib) if ib else np.empty(0, dtype=np.int64)
    counts = {"keys_common": int(ia.size), "only_a": int(ka.size - ia.size),
              "only_b": int(kb.size - ia.size)}
    return (ia if oa is None else oa[ia]), (ib if ob is None else ob[ib]), counts


def _compare(x, y, pa=None, pb=None) -> dict:
    """``size``, ``differing``, ``max_abs`` and ``mean_abs`` of ``|x - y|`` (in float64,
    NaN equal to NaN) over rows ``pa`` of ``x`` and ``pb`` of ``y`` (None: every row, in
    order), :data:`BLOCK` values at a time."""
    n = x.shape[0] if pa is None else pa.size
    per_row = int(np.prod(x.shape[1:], dtype=np.int64))
    step = max(1, BLOCK // max(1, per_row))
    differing, top, total = 0, 0.0, 0.0
    for s in range(0, n, step):
        e = min(n, s + step)
        xb = np.asarray(x[s:e] if pa is None else x[pa[s:e]], dtype=np.float64)
        yb = np.asarray(y[s:e] if pb is None else y[pb[s:e]], dtype=np.float64)
        same = (xb == yb) | (np.isnan(xb) & np.isnan(yb))
        d = np.where(same, 0.0, np.abs(xb - yb))
        differing += int(d.size - np.count_nonzero(same))
        if d.size:
            top, total = max(top, float(d.max())), total + float(d.sum())
    size = n * per_row
    return {"size": int(size), "differing": differing, "max_abs": top,
            "mean_abs": total / size if size else 0.0}


def format_diff(res: dict) -> str:
    """Text table of a :func:`diff` result.

    Parameters
    ----------
    res : dict
        As returned by :func:`diff`.

    Returns
    -------
    str
    """
    lines = [f"A: {res['a'].label}", f"B: {res['b'].label}"]
    width = max([len(r["name"]) for r in res["rows"]] + [5])
    lines.append(f"{'table':<{width}}  {'shape':<16} {'max |A-B|':>12} {'mean |A-B|':>12}  differing")
    for r in res["rows"]:
        if r["status"] == "compared":
            lines.append(f"{r['name']:<{width}}  {str(r['shape_a']):<16} {r['max_abs']:>12.6g} "
                         f"{r['mean_abs']:>12.6g}  {r['differing']:,} of {r['size']:,}"
                         + (f"  (by key: {r['keys_common']:,} keys in both, "
                            f"{r['only_a']:,} only in A, {r['only_b']:,} only in B)"
                            if "keys_common" in r else ""))
        elif r["status"] == "shape mismatch":
            lines.append(f"{r['name']:<{width}}  shapes differ: A {r['shape_a']} vs B {r['shape_b']}; "
                         "not compared")
        else:
            lines.append(f"{r['name']:<{width}}  {r['status']}")
    return "\n".join(lines)
