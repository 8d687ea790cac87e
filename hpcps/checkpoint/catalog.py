"""The checkpoints of a run directory: which one a launch starts from, which to delete, and
setting an earlier run's checkpoints aside. Local (no MPI): the chief decides, the job
broadcasts (:func:`hpcps.runtime.job.find_restore`).

Ordering by step is right only among the checkpoints of *one* run: a run that starts afresh
(``--resume never``, or no valid checkpoint left) in a directory that holds checkpoints first
moves them to ``ckpt.aside-<UTC time>/`` (:func:`set_aside`), so that an earlier run's
higher-numbered checkpoints never count as newer than its own, and a relaunch after a failure
resumes from this run's checkpoints, not the earlier run's.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import shutil
from pathlib import Path

from hpcps.checkpoint.layout import CheckpointError, ckpt_root, list_steps, step_dir
from hpcps.checkpoint.read import is_verified, verify
from hpcps.config.parse import changed_keys

#: the values of ``--resume`` besides a checkpoint directory
RESUME_MODES = ("auto", "never", "require")


def latest_valid(run_dir, warn=None):
    """Newest complete checkpoint under ``run_dir``: ``(directory, manifest)`` or ``None``.

    Newer checkpoints that fail :func:`verify` are skipped; ``warn(message)`` is called for
    each (e.g. to print a warning). Local (not collective).
    """
    found, tried = scan(run_dir)
    if warn:
        for name, why in tried:
            warn(f"skipping checkpoint {name}: {why}")
    return found


def scan(run_dir):
    """The newest checkpoint under ``run_dir`` that passes :func:`verify`, and the newer ones
    that did not. Local.

    Returns
    -------
    found : (Path, dict) or None
        Its directory and manifest.
    tried : list of (str, str)
        ``(directory name, why it is unusable)`` of each checkpoint skipped, newest first
        (every checkpoint of the directory when ``found`` is None).
    """
    tried = []
    for step in reversed(list_steps(run_dir)):
        d = step_dir(run_dir, step)
        try:
            return (d, verify(d)), tried
        except CheckpointError as e:
            tried.append((d.name, _reason(e, d)))
    return None, tried


def _reason(e: CheckpointError, d: Path) -> str:
    """The message of ``e`` without the directory's path in front (the name is said once)."""
    text = " ".join(str(e).split())
    for prefix in (f"{d}/", f"{d}: "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def no_valid_line(run_dir, tried) -> str:
    """One line naming every checkpoint tried and why each is unusable."""
    return (f"no valid checkpoint in {ckpt_root(run_dir)}: "
            + "; ".join(f"{name} ({why})" for name, why in tried))


def finished(manifest: dict, epochs: int) -> bool:
    """Whether the checkpoint is the end of a run of ``epochs`` epochs: taken at the last
    step of its last epoch (or later). Local."""
    per = int(manifest.get("steps_per_epoch", 0))
    return (int(manifest["epoch"]) >= epochs - 1 and per > 0
            and int(manifest["step_in_epoch"]) >= per)


def set_aside(run_dir) -> Path | None:
    """Move ``run_dir/ckpt`` to ``run_dir/ckpt.aside-<UTC time>`` (a new name) when it holds
    any checkpoint directory, so that a run starting afresh never mixes its checkpoints with
    an earlier run's. Returns the new path, or None when there was nothing to move. Local
    (the chief, before any server writes).

    Raises
    ------
    CheckpointError
        If the directory cannot be renamed (naming both paths and the reason).
    """
    root = ckpt_root(run_dir)
    if not list_steps(run_dir):
        return None
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = Path(run_dir) / f"ckpt.aside-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = Path(run_dir) / f"ckpt.aside-{stamp}-{n}"
    try:
        os.rename(root, target)
    except OSError as e:
        raise CheckpointError(f"cannot move the earlier checkpoints {root} to {target}: "
                              f"{e.strerror or e}") from e
    return target


@dataclasses.dataclass
class Start:
    """How a launch starts, as decided by :func:`choose_start`.

    Attributes
    ----------
    directory : Path or None
        The checkpoint to resume from (None: train afresh).
    manifest : dict or None
        Its manifest (:func:`hpcps.checkpoint.read_manifest`).
    warnings, notes : list of str
        Lines to print (without the ``hpcps: warning:`` / ``hpcps: note:`` prefix).
    error : str or None
        Why the launch must stop (``--resume require`` without a valid checkpoint, a named
        checkpoint that is unusable).
    refuse : str or None
        Why ``directory`` must not be resumed though it is valid: the end of a finished run of
        another job file. The job says so after checking that the checkpoint's tables fit
        (a checkpoint of another model is refused naming the table first).
    finished : bool
        The checkpoint is the end of this very job: nothing to train.
    aside : Path or None
        Where an earlier run's checkpoints were moved.
    """

    directory: Path | None = None
    manifest: dict | None = None
    warnings: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    error: str | None = None
    refuse: str | None = None
    finished: bool = False
    aside: Path | None = None


def choose_start(run_dir, resume: str, job_text: str, epochs: int) -> Start:
    """Decide where a launch of a job starts. Local: the chief calls it, once, before any
    checkpoint is written.

    Parameters
    ----------
    run_dir : path-like
        The job's ``[output] dir``.
    resume : str
        ``"auto"``: the newest valid checkpoint, else afresh (saying why, when checkpoints
        were there); ``"require"``: the newest valid checkpoint, else an error;
        ``"never"``: afresh; anything else: the checkpoint directory to resume from.
    job_text : str
        The job file's text (a checkpoint records its own).
    epochs : int
        ``[train] epochs`` of the job.

    Returns
    -------
    Start
        Training afresh in a directory that holds checkpoints moves them aside first
        (:func:`set_aside`) and says so.
    """
    st = Start()
    if resume not in RESUME_MODES:                      # a checkpoint directory
        try:
            st.manifest = verify(resume)
            st.directory = Path(resume)
        except CheckpointError as e:
            st.error = f"--resume {resume}: {' '.join(str(e).split())}"
        return st
    if resume == "never":
        n = len(list_steps(run_dir))
        st.aside = _aside(run_dir, st)
        if st.aside is not None:
            st.notes.append(f"--resume never: the {n} checkpoint(s) already in "
                            f"{ckpt_root(run_dir)} are moved to {st.aside}; this run trains "
                            "afresh and keeps its own checkpoints in "
                            f"{ckpt_root(run_dir)} (delete {st.aside.name} when no longer "
                            "needed)")
        return st
    found, tried = scan(run_dir)
    if found is None:
        if tried and resume == "require":
            st.error = f"{no_valid_line(run_dir, tried)}; --resume require stops here"
        elif resume == "require":
            st.error = f"no checkpoint in {ckpt_root(run_dir)} to resume (--resume require)"
        elif tried:
            st.aside = _aside(run_dir, st)
            if st.error is None:
                st.warnings.append(f"{no_valid_line(run_dir, tried)}; --resume auto trains "
                                   f"from scratch (those checkpoints are moved to {st.aside})")
        return st
    st.warnings.extend(f"skipping checkpoint {name}: {why}" for name, why in tried)
    st.directory, st.manifest = found
    if finished(st.manifest, epochs):
        keys = changed_keys(st.manifest.get("config", job_text), job_text)
        if keys:                     # comments and layout of the text alone do not count
            st.refuse = (f"{st.directory} is the end of a finished run of another job file "
                         f"(keys that differ: {', '.join(keys)}); not "
                         "resuming it. To train this run further (also on another layout), "
                         "raise train.epochs: a run with epochs left resumes. Else train "
                         "afresh with --resume never (the old checkpoints are moved aside), or "
                         "give this job file its own name (outputs go to runs/<name>) or "
                         "[output] dir")
        else:
            st.finished = True
    return st


def _aside(run_dir, st: Start) -> Path | None:
    try:
        return set_aside(run_dir)
    except CheckpointError as e:
        st.error = str(e)
        return None


def prune(run_dir, keep: int, warn=None, current: int | None = None) -> list[Path]:
    """Delete all but the ``keep`` newest *verified* checkpoints, and the damaged or
    incomplete ones older than the newest verified one. Returns the directories removed.
    Local (the chief, after writing a manifest).

    Only checkpoints that pass :func:`verify` count (:func:`is_verified`: each is read once
    per process; a checkpoint this process wrote is not re-read). The newest verified one
    and the checkpoint at step ``current`` (the one just written) are never deleted; nor is
    anything newer than the newest verified one (a checkpoint being written).
    """
    steps = list_steps(run_dir)
    keep = max(1, int(keep))
    good: list[int] = []                 # verified, newest first, at most ``keep``
    for s in reversed(steps):
        if len(good) == keep:
            break
        if s == current or is_verified(step_dir(run_dir, s)):
            good.append(s)
    if not good:
        return []
    removed = []
    for s in steps:
        if s in good or s == current or s > good[0]:
            continue
        d = step_dir(run_dir, s)
        try:
            shutil.rmtree(d)
            removed.append(d)
        except OSError as e:
            if warn:
                warn(f"could not remove old checkpoint {d}: {e}")
    return removed
