"""``hpcps plot``: a run's learning curves and communication load from ``metrics.json`` (no MPI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from hpcps.analysis.sources import METRICS_FILE, AnalysisError, _one_line
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
    return np.array([np.nan if e.get(key) is None else float(e[key]) for e in epochs], dtype=np.float64)


def _staleness(h, where) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(h, list):
        x = np.arange(len(h))
        c = h
    elif isinstance(h, dict):
        try:
            pairs = sorted((int(k), v) for k, v in h.items())
        except ValueError:
            raise AnalysisError(f"{where}: summary.staleness_histogram keys must be integers "
                                "(staleness in clocks)") from None
        x = np.array([k for k, _ in pairs])
        c = [v for _, v in pairs]
    else:
        raise AnalysisError(f"{where}: summary.staleness_histogram must be a list of counts or an "
                            f"object staleness -> count, got {type(h).__name__}")
    try:
        counts = np.array(c, dtype=np.float64)
    except (TypeError, ValueError):
        raise AnalysisError(f"{where}: summary.staleness_histogram counts must be numbers") from None
    if counts.ndim != 1:
        raise AnalysisError(f"{where}: summary.staleness_histogram counts must be numbers")
    return x, counts


def plot_run(run, out=None) -> tuple[Path, list[str]]:
    """Plot a run's learning curves and communication load to an image file.

    Panels: train/test log-loss and test AUC against the epoch and against wall time
    (``seconds``); bytes in/out per server (``summary.servers``); the staleness histogram
    (``summary.staleness_histogram``: a list of counts indexed by staleness, or an object
    ``{"staleness": count}``) when present. Panels without data are left out. Uses
    matplotlib's Agg canvas (no display needed).

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
        Titles of the panels drawn.

    Raises
    ------
    AnalysisError
        If the metrics cannot be read, hold nothing to plot, or the format is not supported.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    mpath, m = load_metrics(run)
    epochs = [e for e in m.get("epochs", []) if isinstance(e, dict)]
    summary = m.get("summary") or {}
    servers = [s for s in summary.get("servers") or [] if isinstance(s, dict)]
    hist = summary.get("staleness_histogram")
    out = Path(out) if out is not None else mpath.parent / "curves.png"

    panels = []
    if epochs:
        ep, sec = _col(epochs, "epoch"), _col(epochs, "seconds")
        tr, te, auc = _col(epochs, "train_logloss"), _col(epochs, "test_logloss"), _col(epochs, "test_auc")
        for xs, xl in ((ep, "epoch"), (sec, "wall time (s)")):
            panels.append((f"log-loss vs {xl}", "loss", xs, xl, tr, te))
            panels.append((f"test AUC vs {xl}", "auc", xs, xl, auc, None))
    if servers:
        panels.append(("bytes per server", "bytes", None, None, None, None))
    if hist is not None:
        sx, sc = _staleness(hist, mpath)
        panels.append(("staleness histogram", "stale", sx, None, sc, None))
    if not panels:
        raise AnalysisError(f"{mpath}: nothing to plot (no epochs, no per-server summary)")

    fig = Figure(figsize=(11, 3.6 * ((len(panels) + 1) // 2)), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    fmt = out.suffix[1:].lower() or "png"
    if fmt not in canvas.get_supported_filetypes():
        raise AnalysisError(f"{out}: unsupported image format {fmt!r} "
                            f"(supported: {', '.join(sorted(canvas.get_supported_filetypes()))})")
    job = m.get("job") or mpath.parent.name
    fig.suptitle(f"hpcps run {job}")
    axes = fig.subplots((len(panels) + 1) // 2, 2, squeeze=False).reshape(-1)
    for ax, (title, kind, x, xl, a, b) in zip(axes, panels):
        ax.set_title(title)
        if xl == "epoch":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if kind == "loss":
            ax.plot(x, a, "o-", label="train (progressive)")
            ax.plot(x, b, "s-", label="test")
            ax.set_xlabel(xl)
            ax.set_ylabel("log-loss")
            ax.legend()
        elif kind == "auc":
            ax.plot(x, a, "o-", color="C2")
            ax.set_xlabel(xl)
            ax.set_ylabel("test AUC")
        elif kind == "bytes":
            idx = np.array([int(s.get("index", i)) for i, s in enumerate(servers)])
            bin_ = np.array([float(s.get("bytes_in", 0)) for s in servers]) / 1e6
            bout = np.array([float(s.get("bytes_out", 0)) for s in servers]) / 1e6
            ax.bar(idx - 0.2, bin_, 0.4, label="in (pushed to the server)")
            ax.bar(idx + 0.2, bout, 0.4, label="out (pulled from the server)")
            ax.set_xticks(idx)
            ax.set_xlabel("server")
            ax.set_ylabel("MB")
            ax.margins(y=0.3)
            ax.legend(fontsize="small")
        else:
            ax.bar(x, a, 0.8, color="C3")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("staleness (clocks)")
            ax.set_ylabel("count")
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
    return out, [p[0] for p in panels]
