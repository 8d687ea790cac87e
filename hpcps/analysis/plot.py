"""``hpcps plot``: a run's learning curves and communication load from ``metrics.json`` (no MPI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from hpcps.analysis.sources import METRICS_FILE, AnalysisError, _one_line, metric_label
from hpcps.core.files import make_temp


def load_metrics(run) -> tuple[Path, dict]:
    """Read a run's ``metrics.json``.

    Parameters
    ----------
    run : path-like
        The run directory or the metrics file itself.

    Returns
    -------
    path : pathlib.Path
        The metrics file.
    metrics : dict
        ``{"epochs": [...], "summary": {...}, ...}`` (see :mod:`hpcps.runtime.output`).

    Raises
    ------
    AnalysisError
        If the file is missing, not JSON, or not a metrics object.
    """
    p = Path(run)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if p.is_dir():
        p = p / METRICS_FILE
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise AnalysisError(f"{p}: no such file (not a run directory?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AnalysisError(f"{p}: cannot read ({_one_line(e)})") from None
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(m, dict) or not isinstance(m.get("epochs", []), list) \
            or not isinstance(m.get("summary", {}), dict):
        raise AnalysisError(f"{p}: not an hpcps metrics file (expected an object with 'epochs' "
                            "and 'summary')")
    return p, m


def _col(epochs, key) -> np.ndarray:
    def num(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return np.nan
        return float(v)

    return np.array([num(e.get(key)) for e in epochs], dtype=np.float64)


def _has(a) -> bool:
    return a is not None and bool(np.isfinite(a).any())


def _run_seconds(epochs, launches) -> tuple[np.ndarray, str]:
    """Each epoch record's ``seconds`` on one time axis for the whole run, and its label.

    ``seconds`` counts from the start of training in the launch that wrote the record; a run
    of several launches (a restart, a resume: ``summary.launches``, each with the clock it
    resumed from) starts again from 0 in each. A record belongs to the last launch that
    resumed below its clock. When every launch has its start time (``started``, ISO 8601),
    launch ``k``'s records are shifted by the time from the first launch's start to its own:
    the time of launches that finished no epoch, the work lost after their last checkpoint
    and the waits before a relaunch are on the axis (a trial: two killed launches, over 100 s,
    were missing). Without them, each launch's records are shifted by the last ``seconds``
    of the launches before it that wrote a record."""
    sec = _col(epochs, "seconds")
    runs = [r for r in launches or [] if isinstance(r, dict)]
    starts = sorted(int(r["resumed_from_step"]) for r in runs
                    if isinstance(r.get("resumed_from_step"), int))
    if not starts:
        return sec, "wall time (s)"
    clock = _col(epochs, "clock")
    launch = np.searchsorted(np.array(starts, dtype=np.float64), clock, side="left")
    began = _started(runs)
    if began is not None and len(began) == len(starts) + 1:
        return (sec + (began - began[0])[np.minimum(launch, len(began) - 1)],
                f"time since launch 1 of {len(began)} (s)")
    out, offset, last = sec.copy(), 0.0, 0.0
    for i in range(sec.size):
        if i and launch[i] != launch[i - 1]:      # the first record of a later launch
            offset, last = offset + last, 0.0
        if np.isfinite(sec[i]):
            last = sec[i]
        out[i] = offset + sec[i]
    return out, f"training time (s), {len(starts) + 1} launches joined"


def _started(runs) -> np.ndarray | None:
    """The launches' start times (seconds since the epoch), in launch order, or None when
    one has none (a run written before they were kept)."""
    import datetime as dt

    try:
        return np.array([dt.datetime.fromisoformat(r["started"]).timestamp() for r in runs])
    except (KeyError, TypeError, ValueError):
        return None


def _series(epochs) -> tuple[list, list]:
    """The curves the epoch records hold, whatever the model.

    Returns
    -------
    losses : list of (label, train column or None, test column or None)
        One per ``train_<loss>`` key (``logloss``, ``mse``, ``hinge``, ...) with its
        ``test_<loss>``.
    metrics : list of (label, test column)
        Every other ``test_<metric>`` (``auc``, ``accuracy``, ``rmse``, ``mae``, ...) but
        ``test_rows``.
    Columns without a finite value are left out.
    """
    keys = list(dict.fromkeys(k for e in epochs for k in e))
    train = [k[len("train_"):] for k in keys if k.startswith("train_")]
    test = [k[len("test_"):] for k in keys if k.startswith("test_") and k != "test_rows"]
    losses = []
    for name in train:
        tr, te = _col(epochs, f"train_{name}"), _col(epochs, f"test_{name}") if name in test else None
        if _has(tr) or _has(te):
            losses.append((metric_label(name), tr if _has(tr) else None, te if _has(te) else None))
    metrics = [(metric_label(n), _col(epochs, f"test_{n}")) for n in test if n not in train]
    return losses, [(lbl, c) for lbl, c in metrics if _has(c)]


def whole_ticks():
    """A matplotlib tick locator of whole numbers only, also on an axis holding a single one
    (one staleness value, one epoch: matplotlib's ``MaxNLocator(integer=True)`` falls back to
    ticks -0.60 ... 0.60 there, found by a trial of 2026-12-04)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True, min_n_ticks=1)


def _staleness_record(summary) -> tuple:
    """``(histogram, unit, description)`` of the summary, or ``(None, None, None)``.

    The run summary holds it as ``consistency.staleness.histogram`` with
    ``consistency.staleness_unit`` (:mod:`hpcps.runtime.job`); ``staleness_histogram`` at the
    top of the summary (clocks) is read too.
    """
    cons = summary.get("consistency")
    if isinstance(cons, dict) and isinstance(cons.get("staleness"), dict) \
            and "histogram" in cons["staleness"]:
        return (cons["staleness"]["histogram"], str(cons.get("staleness_unit") or "clocks"),
                cons.get("description"))
    if "staleness_histogram" in summary:
        return summary["staleness_histogram"], "clocks", None
    return None, None, None


def _staleness(h, where) -> tuple[np.ndarray, np.ndarray]:
    name = "the staleness histogram (summary.consistency.staleness.histogram)"
    if isinstance(h, list):
        x = np.arange(len(h))
        c = h
    elif isinstance(h, dict):
        try:
            pairs = sorted((int(k), v) for k, v in h.items())
        except ValueError:
            raise AnalysisError(f"{where}: {name}: keys must be integers (staleness)") from None
        x = np.array([k for k, _ in pairs], dtype=np.int64)
        c = [v for _, v in pairs]
    else:
        raise AnalysisError(f"{where}: {name} must be a list of counts or an object staleness "
                            f"-> count, got {type(h).__name__}")
    try:
        counts = np.array(c, dtype=np.float64)
    except (TypeError, ValueError):
        raise AnalysisError(f"{where}: {name}: counts must be numbers") from None
    if counts.ndim != 1:
        raise AnalysisError(f"{where}: {name}: counts must be numbers")
    return x, counts


def plot_run(run, out=None) -> tuple[Path, list[str]]:
    """Plot a run's learning curves and communication load to an image file.

    Panels, each drawn only when ``metrics.json`` holds data for it (whatever the model:
    the curves come from the keys of the epoch records):

    * the training loss (``train_<loss>``: progressive, over each epoch's steps) with the
      test loss (``test_<loss>``) against the epoch, and against wall time (``seconds``) —
      log-loss for logistic and mlp, MSE for mf, a user model's ``loss_name``;
    * the other test metrics (``test_<metric>``) against the epoch and wall time — AUC and
      accuracy for logistic, accuracy for mlp, RMSE and MAE for mf;
    * bytes in/out per server (``summary.servers``);
    * the staleness histogram of the applied updates (``summary.consistency.staleness``;
      clocks under BSP/SSP, updates under async) when it counts any update.

    Uses matplotlib's Agg canvas (no display needed).

    Parameters
    ----------
    run : path-like
        Run directory or ``metrics.json``.
    out : path-like, optional
        Image file; the format follows its suffix (default and no suffix: PNG). Default
        ``<run dir>/curves.png``.

    Returns
    -------
    path : pathlib.Path
        The file written.
    panels : list of str
        Titles of the panels drawn (every one with data).

    Raises
    ------
    AnalysisError
        If the metrics cannot be read, hold nothing to plot (no metric of any epoch, no
        per-server load, no staleness histogram), or the format is not supported.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mpath, m = load_metrics(run)
    epochs = [e for e in m.get("epochs", []) if isinstance(e, dict)]
    summary = m.get("summary") or {}
    servers = [s for s in summary.get("servers") or [] if isinstance(s, dict)]
    if not any(float(s.get("bytes_in") or 0) or float(s.get("bytes_out") or 0) for s in servers):
        servers = []
    hist, unit, policy = _staleness_record(summary)
    out = Path(out) if out is not None else mpath.parent / "curves.png"

    panels = []
    losses, metrics = _series(epochs) if epochs else ([], [])
    if losses or metrics:
        ep = _col(epochs, "epoch")
        sec, sec_label = _run_seconds(epochs, summary.get("launches"))
        xs = [(ep, "epoch")] + ([(sec, sec_label)] if _has(sec) else [])
        for x, xl in xs:
            for label, tr, te in losses:
                panels.append((f"{label} vs {xl}", "loss", x, xl, (label, tr, te)))
            if metrics:
                names = ", ".join(lbl for lbl, _ in metrics)
                panels.append((f"test {names} vs {xl}", "metrics", x, xl, metrics))
        # the same quantity against epoch and wall time side by side
        panels.sort(key=lambda p: (0 if p[1] == "loss" else 1))
    if servers:
        panels.append(("bytes per server", "bytes", None, None, servers))
    if hist is not None:
        sx, sc = _staleness(hist, mpath)
        if sc.sum() > 0:
            mean = float((sx * sc).sum() / sc.sum())
            title = ("staleness histogram" + (f" ({policy})" if policy else "")
                     + f"\n{int(sc.sum()):,} applied updates, mean {mean:.2f}, max "
                       f"{int(sx[sc > 0].max())} {unit}")
            panels.append((title, "stale", sx, f"staleness ({unit})", sc))
    if not panels:
        raise AnalysisError(f"{mpath}: nothing to plot: no epoch record with a train_ or test_ "
                            "metric, no per-server load and no staleness histogram (a run that "
                            "stopped before its first epoch ended?)")

    rows = (len(panels) + 1) // 2
    fig = Figure(figsize=(11, 3.6 * rows), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    fmt = out.suffix[1:].lower() or "png"
    if fmt not in canvas.get_supported_filetypes():
        raise AnalysisError(f"{out}: unsupported image format {fmt!r} "
                            f"(supported: {', '.join(sorted(canvas.get_supported_filetypes()))})")
    job = m.get("job") or mpath.parent.name
    fig.suptitle(f"hpcps run {job}")
    axes = fig.subplots(rows, 2, squeeze=False).reshape(-1)
    for ax, (title, kind, x, xl, data) in zip(axes, panels):
        ax.set_title(title)
        if xl == "epoch":
            ax.xaxis.set_major_locator(whole_ticks())
        if kind == "loss":
            label, tr, te = data
            if tr is not None:
                ax.plot(x, tr, "o-", label="train (progressive)")
            if te is not None:
                ax.plot(x, te, "s-", label="test")
            ax.set_xlabel(xl)
            ax.set_ylabel(label)
            ax.legend()
        elif kind == "metrics":
            for j, (label, col) in enumerate(data):
                ax.plot(x, col, "os^vD*"[j % 6] + "-", color=f"C{(j + 2) % 10}", label=label)
            ax.set_xlabel(xl)
            ax.set_ylabel("test " + ", ".join(lbl for lbl, _ in data))
            if len(data) > 1:
                ax.legend()
        elif kind == "bytes":
            idx = np.array([int(s.get("index", i)) for i, s in enumerate(data)])
            bin_ = np.array([float(s.get("bytes_in") or 0) for s in data]) / 1e6
            bout = np.array([float(s.get("bytes_out") or 0) for s in data]) / 1e6
            ax.bar(idx - 0.2, bin_, 0.4, label="in (pushes and pull requests)")
            ax.bar(idx + 0.2, bout, 0.4, label="out (replies: pulled rows)")
            ax.set_xticks(idx)
            ax.set_xlim(idx.min() - 1, idx.max() + 1)
            ax.set_xlabel("server")
            ax.set_ylabel("MB")
            ax.margins(y=0.3)
            ax.legend(fontsize="small")
        else:
            ax.bar(x, data, 0.8, color="C3")
            ax.set_xlim(x.min() - 0.7, x.max() + 0.7)
            ax.xaxis.set_major_locator(whole_ticks())
            ax.set_xlabel(xl)
            ax.set_ylabel("updates")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    tmp = make_temp(out)                     # mode 0666 & ~umask
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format=fmt, dpi=100)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out, [p[0].split("\n")[0] for p in panels]
