"""The checkpoints of a run directory: the newest valid one, and pruning. Local (no MPI)."""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcps.checkpoint.layout import MANIFEST, CheckpointError, list_steps, step_dir
from hpcps.checkpoint.read import verify

def latest_valid(run_dir, warn=None):
    """Newest complete checkpoint under ``run_dir``: ``(directory, manifest)`` or ``None``.

    Newer checkpoints that fail :func:`verify` are skipped; ``warn(message)`` is called for
    each (e.g. to print a warning). Local (not collective).
    """
    for step in reversed(list_steps(run_dir)):
        d = step_dir(run_dir, step)
        try:
            return d, verify(d)
        except CheckpointError as e:
            if warn:
                warn(f"skipping checkpoint {d.name}: {e}")
    return None


def prune(run_dir, keep: int, warn=None) -> list[Path]:
    """Delete all but the ``keep`` newest *complete* checkpoints (and incomplete ones older
    than the newest complete one). Returns the directories removed. Local."""
    steps = list_steps(run_dir)
    complete = [s for s in steps if (step_dir(run_dir, s) / MANIFEST).exists()]
    keep_set = set(complete[-keep:])
    newest = complete[-1] if complete else -1
    removed = []
    for s in steps:
        if s in keep_set or s > newest:
            continue
        d = step_dir(run_dir, s)
        try:
            shutil.rmtree(d)
            removed.append(d)
        except OSError as e:
            if warn:
                warn(f"could not remove old checkpoint {d}: {e}")
    return removed
