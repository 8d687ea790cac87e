"""Checkpoint names and errors: the layout's constants, the paths of a run directory's
checkpoints, and the exceptions every other checkpoint module raises. No MPI, no h5py."""

from __future__ import annotations

import re
from pathlib import Path

FORMAT = "hpcps-checkpoint-3"
#: manifest formats :func:`read_manifest` accepts: format 1 recorded SHA-256 (``shards/sha256``);
#: format 3 adds dynamic tables (``partition/<name>`` attr ``storage = "hash"``, no key
#: ranges; each shard's group holds keys, rows and slots); formats 1-2 hold fixed tables only
READ_FORMATS = ("hpcps-checkpoint-1", "hpcps-checkpoint-2", FORMAT)
#: the checksum of shard files written by this version (manifest attr ``shards/checksum``)
CHECKSUM = "xxh3_128"
#: size of the digest field :func:`write_shard` returns and servers send to worker 0
#: (format 1's SHA-256 size): the digest, zero-padded on the right
DIGEST_FIELD = 32
MANIFEST = "manifest.h5"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is unusable or does not match the job (the message says why)."""


class ResumeError(CheckpointError):
    """The checkpoint chosen for a restart does not fit the job; raised identically on every
    rank before any parameter-server traffic."""


# ---------------------------------------------------------------------------- paths


def ckpt_root(run_dir) -> Path:
    """``<run dir>/ckpt``."""
    return Path(run_dir) / "ckpt"


def step_dir(run_dir, step: int) -> Path:
    """Directory of the checkpoint taken at ``step``."""
    return ckpt_root(run_dir) / f"step-{int(step):08d}"


def shard_name(server: int) -> str:
    """File name of server ``server``'s shard."""
    return f"shard-{int(server):04d}.h5"


def list_steps(run_dir) -> list[int]:
    """Steps of every checkpoint directory under ``run_dir`` (complete or not), ascending."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(steps)


def slot_specs(p: dict) -> dict:
    """``{slot: (shape after the row axis, dtype name)}`` of a partition dict: its
    ``slot_specs``, else its ``slots`` (a dict of specs, or names shaped like the rows)."""
    if p.get("slot_specs"):
        return {k: (tuple(t), str(d)) for k, (t, d) in p["slot_specs"].items()}
    slots = p.get("slots") or []
    if isinstance(slots, dict):
        return {k: (tuple(t), str(d)) for k, (t, d) in slots.items()}
    return {k: ((int(p["dim"]),), str(p["dtype"])) for k in slots}
