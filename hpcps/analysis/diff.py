"""``hpcps diff``: per-table differences between two sources, in original key order (no MPI).

A dynamic (hash) table ``NAME`` comes with ``NAME_keys`` (ascending) beside its rows; two
such tables, or one and a fixed table (row ``k`` = key ``k``), are compared by key: the rows
of the keys both store, elementwise, and the keys only one stores counted (``only_a``,
``only_b``), not compared (an absent key's value is its initial value, which a source file
does not hold for every optimizer slot)."""

from __future__ import annotations

import numpy as np

from hpcps.analysis.sources import SLOT_SEP, Source, read_tables, resolve


def diff(a, b) -> dict:
    """Per-table differences between two sources, in original key order.

    Tables and optimizer slots (``<table>__<slot>``) present in both sources are compared
    elementwise in float64; NaN equals NaN.

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
        If either source cannot be read.
    """
    sa = a if isinstance(a, Source) else resolve(a)
    sb = b if isinstance(b, Source) else resolve(b)

    def flat(src):
        tables, slots = read_tables(src)
        out = dict(tables)
        for t, d in slots.items():
            out.update({f"{t}{SLOT_SEP}{s}": v for s, v in d.items()})
        return out

    ta, tb = flat(sa), flat(sb)
    keyed = {n[:-len("_keys")] for t in (ta, tb) for n in t
             if n.endswith("_keys") and n[:-len("_keys")] in t}
    rows = []
    for name in list(ta) + [n for n in tb if n not in ta]:
        if name.endswith("_keys") and name[:-len("_keys")] in keyed:
            continue
        x, y = ta.get(name), tb.get(name)
        row = {"name": name, "shape_a": None if x is None else tuple(x.shape),
               "shape_b": None if y is None else tuple(y.shape)}
        base = name.split(SLOT_SEP)[0]
        if x is not None and y is not None and base in keyed:
            x, y = _align(row, x, y, _keys_of(ta, base, x), _keys_of(tb, base, y))
        if x is None or y is None:
            row["status"] = "only in A" if y is None else "only in B"
        elif x.shape != y.shape:
            row["status"] = "shape mismatch"
        else:
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            same = (x64 == y64) | (np.isnan(x64) & np.isnan(y64))
            d = np.where(same, 0.0, np.abs(x64 - y64))
            row.update(status="compared", size=int(d.size), differing=int(d.size - np.count_nonzero(same)),
                       max_abs=float(d.max()) if d.size else 0.0,
                       mean_abs=float(d.mean()) if d.size else 0.0)
        rows.append(row)
    return {"a": sa, "b": sb, "rows": rows}


def _keys_of(tables: dict, base: str, rows: np.ndarray) -> np.ndarray:
    """The keys of ``rows``: ``base_keys`` for a dynamic table, else ``0 .. len - 1``."""
    k = tables.get(f"{base}_keys")
    return np.asarray(k, dtype=np.int64) if k is not None else np.arange(rows.shape[0])


def _align(row: dict, x, y, ka, kb):
    """The rows of ``x`` and ``y`` of the keys in both ``ka`` and ``kb`` (ascending key
    order); records the key counts in ``row``."""
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    row.update(keys_common=int(common.size), only_a=int(ka.size - common.size),
               only_b=int(kb.size - common.size))
    return x[ia], y[ib]


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
