"""The run directory (``[output] dir``): every path a run writes there, where a launch starts
from, and the one writer of ``metrics.json``.

Layout
------
``ckpt/step-SSSSSSSS/``   checkpoints (:mod:`hpcps.checkpoint`); ``ckpt.aside-<UTC time>/``:
                          an earlier run's checkpoints, moved there by a run that trains
                          afresh (:func:`hpcps.checkpoint.set_aside`)
``model.h5``              the final model (:func:`hpcps.runtime.output.write_model`)
``metrics.json``          the run record (:class:`MetricsFile`)
``running.json``          written by the chief while a parameter-server job trains
                          (:mod:`hpcps.resilience.grow_request`), removed on every exit path
``grow-request.json``, ``grow-answer.json``   ``hpcps grow``'s request and the job's answer

A launch starts (:func:`find_restore`) from the newest valid checkpoint (``--resume auto``,
``require``), afresh (``never``, or ``auto`` with no valid checkpoint left), or from a named
checkpoint; a launch of a job whose run is finished trains nothing and leaves the record as
it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hpcps import __version__
from hpcps import checkpoint as ckpt
from hpcps.core.paths import ANSWER, CKPT, METRICS, MODEL, REQUEST, RUNNING  # noqa: F401
from hpcps.core.procs import hpcps_alive as _alive


class RunDir:
    """The paths of one run directory. No I/O at construction."""

    def __init__(self, path):
        self.path = Path(path)
        self.ckpt = self.path / CKPT
        self.model = self.path / MODEL
        self.metrics = self.path / METRICS
        self.running = self.path / RUNNING
        self.request = self.path / REQUEST
        self.answer = self.path / ANSWER

    def earlier_outputs(self) -> list[str]:
        """Names of the final outputs of an earlier run present here (``model.h5``,
        ``metrics.json``). Local."""
        return [p.name for p in (self.model, self.metrics) if p.exists()]

    def record(self) -> dict | None:
        """The ``metrics.json`` record, or None when absent or unreadable. Local."""
        try:
            return json.loads(self.metrics.read_text())
        except (OSError, ValueError):
            return None

    def finished_record(self) -> bool:
        """A finished run's outputs are here: ``model.h5`` and a ``metrics.json`` with its
        summary. Local."""
        rec = self.record()
        return self.model.exists() and isinstance(rec, dict) and "summary" in rec

    def clear_stale_running(self) -> bool:
        """Remove ``running.json`` when the chief that wrote it is gone: the job was aborted
        (``MPI_Abort`` from another rank kills the chief before it can remove the file).
        ``hpcps run`` calls it after every mpirun exit. A chief alive on this host keeps its
        file (another launch in the same directory). Returns whether a file was removed.
        Local."""
        import socket

        try:
            info = json.loads(self.running.read_text())
            if info.get("host") == socket.gethostname() and _alive(int(info["pid"])):
                return False
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass                                 # unreadable: nobody can use it
        try:
            self.running.unlink()
            return True
        except FileNotFoundError:
            return False


class MetricsFile:
    """The one writer of ``metrics.json``: ``{"job", "hpcps_version", "config", "epochs",
    ["summary"], ...}``, rewritten atomically after every epoch and once more with the
    summary at the end (chief only).

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    """

    def __init__(self, cfg):
        from hpcps.config import to_dict

        self.path = RunDir(cfg.output.dir).metrics
        self.head = {"job": cfg.name, "hpcps_version": __version__, "config": to_dict(cfg)}

    def epochs(self, history: list) -> Path:
        """Write the record with the per-epoch metrics so far (no summary yet), atomically but
        not fsynced: every checkpoint holds the epochs' records too, and an fsync per epoch
        held the chief (and under BSP every worker) for 0.3-1.8 ms per epoch of ~60 ms on a
        local disk (Adult, 3 workers), more on a parallel file system."""
        return self._write({**self.head, "epochs": list(history)}, durable=False)

    def final(self, history: list, summary: dict, **more) -> Path:
        """Write the finished run's record: epochs, summary, and ``more`` top-level keys
        (e.g. sandblaster's ``iterations``)."""
        return self._write({**self.head, **more, "epochs": list(history), "summary": summary})

    def _write(self, record: dict, durable: bool = True) -> Path:
        from hpcps.runtime.output import write_metrics

        return write_metrics(self.path, record, durable)


class Restore(NamedTuple):
    """Where a launch resumes: ``restore[0]`` the checkpoint directory, ``restore[1]`` its
    manifest; ``finished``: the run ended there and its outputs are in place (nothing to
    train); ``refuse``: why it must not be resumed after all (raised by the job once the
    tables are found compatible: :attr:`hpcps.checkpoint.Start.refuse`)."""

    directory: Path
    manifest: dict
    finished: bool = False
    refuse: str | None = None


def find_restore(cfg, world, resume="auto", out=None) -> Restore | None:
    """Decide where this launch starts; the same on every rank. Collective over ``world``.

    Rank 0 decides (:func:`hpcps.checkpoint.choose_start`): with ``--resume auto`` or
    ``require`` the newest *valid* checkpoint under ``cfg.output.dir`` (warning about newer
    ones that are incomplete or damaged), else afresh (``auto``, saying so in one line that
    names every checkpoint tried) or an error (``require``); with ``never`` afresh; else the
    named checkpoint. Training afresh moves an earlier run's checkpoints aside first, and
    says when ``model.h5``/``metrics.json`` of an earlier run will be overwritten. Rank 0
    broadcasts the step; every rank then reads that manifest.

    Parameters
    ----------
    resume : "auto", "require", "never" or a checkpoint directory

    Returns
    -------
    Restore or None
        None: train afresh.

    Raises
    ------
    hpcps.checkpoint.ResumeError
        On every rank, with rank 0's reason: ``--resume require`` and no valid checkpoint,
        or a named checkpoint that is unusable. (The end of a finished run of another job file
        comes back as ``Restore.refuse``, for the job to raise after its table check.)
    """
    from hpcps.comm.collectives import bcast_array

    out = out or sys.stdout
    run = RunDir(cfg.output.dir)
    step, finished, error, refuse = -1, 0, b"", b""
    if world.Get_rank() == 0:
        st = ckpt.choose_start(run.path, resume, cfg.text, cfg.train.epochs)
        for w in st.warnings:
            out.write(f"hpcps: warning: {w}\n")
        for n in st.notes:
            out.write(f"hpcps: note: {n}\n")
        if st.error:
            error = st.error.encode()
        elif st.directory is not None:
            step = int(st.manifest["step"])
            finished = int(st.finished and run.finished_record())
            refuse = (st.refuse or "").encode()
        else:
            note = fresh_start_note(run)
            if note:
                out.write(f"hpcps: note: {note}\n")
        out.flush()
    error = bytes(bcast_array(world, np.frombuffer(error, dtype=np.uint8), np.uint8))
    if error:
        raise ckpt.ResumeError(error.decode("utf-8", "replace"))
    step, finished = (int(v) for v in bcast_array(world, [step, finished], np.int64))
    if step < 0:
        return None
    refuse = bytes(bcast_array(world, np.frombuffer(refuse, dtype=np.uint8), np.uint8))
    d = ckpt.step_dir(run.path, step) if resume in ckpt.RESUME_MODES else Path(resume)
    if finished and world.Get_rank() == 0:
        out.write(f"hpcps: note: this job already finished (its newest checkpoint, {d.name}, "
                  f"is at its last step, in {run.path}); nothing is trained and the run's record "
                  f"({MODEL}, {METRICS}) is left as it is. To train again: --resume never "
                  "(the checkpoints are moved aside), or another [output] dir or job name\n")
        out.flush()
    return Restore(d, ckpt.read_manifest(d), bool(finished),
                   refuse.decode("utf-8", "replace") or None)


def fresh_start_note(run: RunDir) -> str | None:
    """What to tell a user whose run directory holds an earlier run's outputs while this
    launch trains afresh (issue 21.4), or None."""
    names = run.earlier_outputs()
    if not names:
        return None
    return (f"{run.path} holds {' and '.join(names)} of an earlier run: this run trains "
            f"afresh and overwrites {'them' if len(names) > 1 else 'it'}"
            " (use another [output] dir or job name to keep them)")


# ------------------------------------------------------------------------------ launches


def parse_restart(text: str | None) -> tuple[int, int] | None:
    """``"N:STATUS"`` (``hpcps train --restart``, given by ``hpcps run`` to a relaunch: its
    restart number and the exit status of the launch that failed) as ``(N, STATUS)``.

    Raises
    ------
    ValueError
        If ``text`` is not two integers separated by a colon.
    """
    if not text:
        return None
    n, _, status = text.partition(":")
    return int(n), int(status)


def growth_records(restore: Restore | None) -> list:
    """The growths of this run's earlier launches (``summary.growth`` records, kept in the
    checkpoint resumed; [] without one, or from a checkpoint written before they were kept).
    Local."""
    return _records(restore.manifest, "growth") if restore is not None else []


def _records(manifest: dict, key: str) -> list:
    """The JSON list of dicts a manifest attribute holds ([] when absent or not one)."""
    try:
        got = json.loads(manifest.get(key, "[]"))
    except (TypeError, ValueError):
        return []
    return [r for r in got if isinstance(r, dict)] if isinstance(got, list) else []


def launch_records(restore: Restore | None, restart: tuple[int, int] | None):
    """The launches of this run so far (from the checkpoint resumed) and this launch's
    record. Local.

    Returns
    -------
    earlier : list of dict
        ``{"launch", "resumed_from_step", ["restart", "after_status"], "steps_kept"}`` each;
        ``steps_kept``: the steps of that launch the next one resumed from (the rest, done
        after its last checkpoint, were lost and done again).
    this : dict
        ``{"launch", "started" (ISO 8601 UTC), "resumed_from_step" (None: from step 0),
        ["restart", "after_status"]}``.
    """
    import datetime as dt

    earlier: list = []
    at = None
    if restore is not None:
        at = int(restore.manifest["step"])
        earlier = _records(restore.manifest, "launches")
        if not earlier:                      # a checkpoint written before launches were kept
            earlier = [{"launch": 1, "resumed_from_step": None}]
        last = earlier[-1]
        last["steps_kept"] = at - int(last.get("resumed_from_step") or 0)
    this = {"launch": len(earlier) + 1,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "resumed_from_step": at}
    if restart is not None:
        this["restart"], this["after_status"] = restart
    return earlier, this


def launch_phrase(summary: dict) -> str:
    """``" in all (7,560 in this launch, restart 1 after status 1, resumed at step 600)"``
    for the ``done:`` line of a resumed launch; ``""`` for a run done in one launch."""
    this = (summary.get("launches") or [{}])[-1]
    at = this.get("resumed_from_step")
    if at is None:
        return ""
    how = (f"restart {this['restart']} after status {this['after_status']}, "
           if "restart" in this else "")
    return (f" in all ({summary['steps']:,} in this launch, {how}resumed at step {at:,}; "
            f"{len(summary['launches'])} launches, {summary.get('restarts', 0)} restart(s))")
