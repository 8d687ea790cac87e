"""The offline analysis subcommands of ``hpcps`` (no MPI; logic in :mod:`hpcps.analysis.offline`).

``hpcps inspect SOURCE``                       position, layout, table statistics, integrity
``hpcps eval SOURCE --data FILE [--job JOB]``  the model's test metrics (any model type)
``hpcps export SOURCE [--format npz] [-o OUT]``  tables in original key order as .npz
``hpcps plot RUN [-o curves.png]``             learning curves, per-server load, staleness
``hpcps diff SOURCE_A SOURCE_B``               per-table max / mean absolute difference

SOURCE is a checkpoint directory, its ``manifest.h5``, a run directory (its newest valid
checkpoint) or a ``model.h5``. ``export`` and ``plot`` print the absolute path of the file they
wrote. Every expected failure (missing, incomplete or corrupt file,
invalid job, malformed data) prints one line ``hpcps: error: ...`` and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SOURCE_HELP = "checkpoint directory, manifest.h5, run directory (newest valid checkpoint) or model.h5"


def _errors():
    from hpcps.analysis.offline import AnalysisError
    from hpcps.checkpoint import CheckpointError
    from hpcps.config import ConfigError
    from hpcps.data import DataError

    return (AnalysisError, CheckpointError, ConfigError, DataError, OSError)


def _guard(func):
    """Run a command; expected errors become one line on stderr and exit status 1."""

    def run(args) -> int:
        try:
            return func(args)
        except BrokenPipeError:
            # the reader went away (``hpcps inspect ... | head``): stop quietly, as a shell
            # tool does; stdout to /dev/null so that the exit's flush does not complain
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except _errors() as e:
            msg = " ".join(str(e).split())
            sys.stderr.write(f"hpcps {args.command}: error: {msg}\n")
            sys.stderr.flush()
            return 1

    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


@_guard
def cmd_inspect(args) -> int:
    """``hpcps inspect``: print :func:`hpcps.analysis.offline.inspect`'s report.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments (see :func:`register`).

    Returns
    -------
    int
        Exit status: 0, or 1 (one-line error on stderr) if a source cannot be used.
    """
    from hpcps.analysis import offline as analysis

    print(analysis.format_inspect(analysis.inspect(args.source)))
    return 0


@_guard
def cmd_eval(args) -> int:
    """``hpcps eval``: print :func:`hpcps.analysis.offline.evaluate`'s metrics.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments (see :func:`register`).

    Returns
    -------
    int
        Exit status: 0, or 1 (one-line error on stderr) if a source cannot be used.
    """
    from hpcps.analysis import offline as analysis

    print(analysis.format_evaluate(analysis.evaluate(args.source, args.data, job=args.job)))
    return 0


@_guard
def cmd_export(args) -> int:
    """``hpcps export``: write the tables with :func:`hpcps.analysis.offline.export_npz`.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments (see :func:`register`).

    Returns
    -------
    int
        Exit status: 0, or 1 (one-line error on stderr) if a source cannot be used.
    """
    import numpy as np

    from hpcps.analysis import offline as analysis

    src = analysis.resolve(args.source)
    path = analysis.export_npz(src, args.output)
    with np.load(path, allow_pickle=False) as z:
        parts = ", ".join(f"{k} {z[k].shape}" for k in z.files)
    print(f"wrote {Path(path).resolve()} from {src.label}: {parts}")
    return 0


@_guard
def cmd_plot(args) -> int:
    """``hpcps plot``: draw the run's curves with :func:`hpcps.analysis.offline.plot_run`.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments (see :func:`register`).

    Returns
    -------
    int
        Exit status: 0, or 1 (one-line error on stderr) if a source cannot be used.
    """
    from hpcps.analysis import offline as analysis

    path, panels = analysis.plot_run(args.run, args.output)
    print(f"wrote {Path(path).resolve()} ({len(panels)} panels: {', '.join(panels)})")
    return 0


@_guard
def cmd_diff(args) -> int:
    """``hpcps diff``: print :func:`hpcps.analysis.offline.diff`'s table (exit 0 whatever differs).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments (see :func:`register`).

    Returns
    -------
    int
        Exit status: 0, or 1 (one-line error on stderr) if a source cannot be used.
    """
    from hpcps.analysis import offline as analysis

    print(analysis.format_diff(analysis.diff(args.a, args.b)))
    return 0


def register(subparsers) -> None:
    """Add ``inspect``, ``eval``, ``export``, ``plot`` and ``diff`` to the ``hpcps`` parser.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers`` returned; each subcommand sets ``func``
        (called with the parsed arguments, returns the exit status).
    """
    i = subparsers.add_parser("inspect", help="describe a checkpoint, run or model file (no MPI)",
                              description="Step, epoch, servers, workers, clocks, per-table "
                                          "statistics and optimizer slots; verifies checksums.")
    i.add_argument("source", help=SOURCE_HELP)
    i.set_defaults(func=cmd_inspect)

    e = subparsers.add_parser("eval", help="test metrics of a checkpoint or model file (no MPI)",
                              description="The model's test metrics (logistic: log-loss, AUC, "
                                          "accuracy; mf: MSE, RMSE, MAE; mlp: log-loss, "
                                          "accuracy; a user model: its metrics method) on a "
                                          "data set read as the job that trained the model "
                                          "reads it. A user model is imported as hpcps run "
                                          "imports it (set PYTHONPATH as for the run).")
    e.add_argument("source", help=SOURCE_HELP)
    e.add_argument("--data", required=True,
                   help="svmlight or Criteo data, a file, directory or glob as the job's "
                        "test_path (svmlight and criteo jobs: every row is scored), the Adult CSV "
                        "(adult_csv jobs: the job's test split is scored) or a file of "
                        "`hpcps data prepare` (prepared jobs: its test split is scored)")
    e.add_argument("--job", help="job file to use instead of the configuration stored with the model")
    e.set_defaults(func=cmd_eval)

    x = subparsers.add_parser("export", help="tables in original key order to .npz (no MPI)",
                              description="One array per table and per optimizer slot "
                                          "(<table>__<slot>); no pickled objects.")
    x.add_argument("source", help=SOURCE_HELP)
    x.add_argument("--format", choices=["npz"], default="npz", help="output format (default: npz)")
    x.add_argument("-o", "--output", help="output file (default: <job>-step-XXXXXXXX.npz in the "
                                          "current directory); the path written is printed")
    x.set_defaults(func=cmd_export)

    p = subparsers.add_parser("plot", help="plot a run's metrics.json (no MPI)",
                              description="The model's training loss and test metrics per epoch "
                                          "and over wall time (log-loss, AUC, accuracy, MSE, "
                                          "RMSE, MAE: whatever the run recorded), bytes per "
                                          "server, staleness histogram if recorded. Panels "
                                          "without data are left out; a run with nothing to "
                                          "plot is an error.")
    p.add_argument("run", help="run directory or its metrics.json")
    p.add_argument("-o", "--output", help="image file, format by suffix (default: RUN/curves.png); "
                                          "the path written is printed")
    p.set_defaults(func=cmd_plot)

    d = subparsers.add_parser("diff", help="per-table differences of two checkpoints (no MPI)",
                              description="Max and mean absolute difference per table and slot, "
                                          "in original key order. Exit status 0 unless a source "
                                          "cannot be read.")
    d.add_argument("a", metavar="SOURCE_A", help=SOURCE_HELP)
    d.add_argument("b", metavar="SOURCE_B", help=SOURCE_HELP)
    d.set_defaults(func=cmd_diff)


def main(argv=None) -> int:
    """Run one analysis subcommand without the rest of the ``hpcps`` CLI (for tests).

    Parameters
    ----------
    argv : list of str, optional
        Arguments after the program name.

    Returns
    -------
    int
        Exit status.
    """
    ap = argparse.ArgumentParser(prog="hpcps")
    sub = ap.add_subparsers(dest="command", required=True)
    register(sub)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
