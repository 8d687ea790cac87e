"""Reading a checkpoint: its manifest, its integrity (sizes and checksums), its fit to the
job, and any key range re-sharded for another number of servers. Local (no MPI)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from hpcps.checkpoint.atomic import _HASHES, _file_digest
from hpcps.checkpoint.layout import (MANIFEST, READ_FORMATS, CheckpointError, ResumeError,
                                     shard_name, slot_specs)

def check_compatible(directory, manifest: dict, tables, slots=None) -> None:
    """Refuse to resume a job whose tables differ from the checkpoint's. Local.

    Parameters
    ----------
    tables : sequence of hpcps.core.tables.TableSpec
    slots : dict of table name -> sequence of str, optional
        The optimizer slots this job needs per table (:attr:`hpcps.core.optim.Optimizer.slot_names`);
        each must be in the checkpoint.

    Raises
    ------
    ResumeError
        Naming the table and both shapes (or dtypes), or the missing optimizer slots.
    """
    have = manifest["partition"]
    for spec in tables:
        p = have.get(spec.name)
        if p is None:
            raise ResumeError(f"{directory}: checkpoint has no table {spec.name!r} "
                              f"(it has {', '.join(have) or 'none'}); is it from another model?")
        saved = p.get("storage", "array")
        want = getattr(spec, "storage", "array")
        if saved != want:
            kinds = {"hash": "a dynamic table (storage 'hash')",
                     "array": "a fixed table (storage 'array')"}
            raise ResumeError(f"{directory}: table {spec.name!r} was checkpointed as "
                              f"{kinds.get(saved, saved)} but this job declares it "
                              f"{kinds.get(want, want)}; resume it with the storage it was "
                              "trained with ([tables.NAME] storage / [model] storage)")
        if (p["num_keys"], p["dim"]) != (spec.num_keys, spec.dim):
            raise ResumeError(f"{directory}: table {spec.name!r} has shape "
                              f"({p['num_keys']}, {p['dim']}) in the checkpoint but "
                              f"({spec.num_keys}, {spec.dim}) in this job")
        if p["dtype"] != spec.dtype:
            raise ResumeError(f"{directory}: table {spec.name!r} is {p['dtype']} in the checkpoint "
                              f"but {spec.dtype} in this job")
        need = list((slots or {}).get(spec.name, ()))
        if saved == "hash":
            have_slots = [s for s in p.get("slot_names", []) if s]
        else:
            have_slots = p.get("slots", [])
        missing = [s for s in need if s not in have_slots]
        if missing:
            raise ResumeError(f"{directory}: table {spec.name!r} has optimizer slots "
                              f"{have_slots} in the checkpoint but this job's optimizer "
                              f"needs {need}; was another optimizer used? (--resume never "
                              "trains afresh)")



def read_manifest(directory) -> dict:
    """The manifest's attributes and small datasets as Python values. Local.

    Reads every format of :data:`READ_FORMATS`. ``m["shards"]`` always has ``checksum`` and
    ``digest``: for format 1, ``"sha256"`` and its ``sha256`` list.

    Raises
    ------
    CheckpointError
        If the manifest is missing or unreadable, or its format or checksum is unknown.
    """
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise CheckpointError(f"{directory}: no {MANIFEST} (checkpoint incomplete"
                              f"{leftover_note(directory)})")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") not in READ_FORMATS:
                raise CheckpointError(f"{path}: not an hpcps checkpoint manifest")
            m = {k: attr_value(v) for k, v in f.attrs.items()}
            m["shards"] = sh = {k: attr_value(v) for k, v in f["shards"].attrs.items()}
            if "checksum" not in sh:                                # format 1
                sh["checksum"], sh["digest"] = "sha256", sh["sha256"]
            if sh["checksum"] not in _HASHES:
                raise CheckpointError(f"{path}: shards/checksum {sh['checksum']!r} is not one "
                                      f"this hpcps version knows ({', '.join(_HASHES)})")
            if not len(sh["files"]) == len(sh["bytes"]) == len(sh["digest"]):
                raise CheckpointError(f"{path}: shards/files, bytes and digest differ in length")
            m["workers"] = {k: f["workers"][k][()] for k in f["workers"]}
            m["history"] = json.loads(f["metrics"].attrs["history"])
            m["partition"] = {}
            for name, g in f["partition"].items():
                d = {k: attr_value(v) for k, v in g.attrs.items()}
                d["ranges"] = g["ranges"][()]
                g_slots = f["slots"][name] if "slots" in f and name in f["slots"] else {}
                d["slots"] = sorted(g_slots.keys())
                d["slot_specs"] = {k: (tuple(g_slots[k].shape[1:]), g_slots[k].dtype.name)
                                   for k in d["slots"]}
                m["partition"][name] = d
    except (OSError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from e
    return m


def attr_value(v):
    """An HDF5 attribute value as plain Python: str (never bytes), int, float or list."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return [attr_value(x) for x in v.tolist()] if v.dtype == object else v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def verify(directory) -> dict:
    """Check that a checkpoint is complete: manifest readable, every shard present with the
    recorded size and checksum (the manifest's ``shards/checksum``: XXH3-128, or SHA-256 in
    format 1), and readable by h5py with every table. Local.

    Returns the manifest (:func:`read_manifest`). A checkpoint that passes is remembered
    (by the sizes, times and inodes of its files) for :func:`is_verified`.

    Raises
    ------
    CheckpointError
        Naming the first problem found: a missing or truncated shard (with the temporary
        files an interrupted write left, if any), a checksum mismatch (with the digest the
        manifest records and the digest of the file), an unreadable file.
    """
    directory = Path(directory)
    m = read_manifest(directory)
    checksum = m["shards"]["checksum"]
    for name, size, digest in zip(m["shards"]["files"], m["shards"]["bytes"], m["shards"]["digest"]):
        p = directory / name
        if not p.exists():
            raise CheckpointError(f"{directory}: shard {name} is missing"
                                  f"{leftover_note(directory, ';')}")
        if p.stat().st_size != size:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, manifest says {size} "
                                  f"(truncated?{leftover_note(directory, ';')})")
        actual = _file_digest(p, checksum)
        if actual != digest:
            raise CheckpointError(f"{p}: {checksum} checksum does not match the manifest "
                                  f"(corrupt): expected {digest}, file has {actual}")
        try:
            with h5py.File(p, "r") as f:
                for t in m["partition"]:
                    f[f"tables/{t}/rows"].shape
        except (OSError, KeyError) as e:
            raise CheckpointError(f"{p}: unreadable shard ({_one_line(e)})") from e
    remember_good(directory)
    return m


def leftovers(directory) -> list[str]:
    """Names of the temporary files (``.NAME.XXXXXXXX.tmp``, :func:`hpcps.core.files.make_temp`)
    in a checkpoint directory: what a write interrupted by a kill or a crash left. Local."""
    try:
        return sorted(p.name for p in Path(directory).iterdir()
                      if p.name.startswith(".") and p.name.endswith(".tmp"))
    except OSError:
        return []


def leftover_note(directory, sep: str = ":") -> str:
    """``": .shard-0000.h5.x1y2.tmp left by an interrupted write"`` (``sep`` first), or ``""``
    when the directory holds no temporary file."""
    names = leftovers(directory)
    if not names:
        return ""
    return f"{sep} {', '.join(names)} left by an interrupted write"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


#: checkpoint directory (resolved) -> signature of its files when it last passed
#: :func:`verify` or was written by this process (:func:`remember_good`)
_GOOD: dict[str, tuple] = {}


def _signature(directory: Path) -> tuple:
    """(name, size, mtime, inode) of every file of a checkpoint directory but temporaries."""
    out = []
    for p in sorted(directory.iterdir()):
        if p.name.startswith("."):
            continue
        st = p.stat()
        out.append((p.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def remember_good(directory) -> None:
    """Note that the checkpoint in ``directory`` is complete as its files are now (it just
    passed :func:`verify`, or this process has just written its manifest from the shards'
    own digests). Local."""
    d = Path(directory)
    try:
        _GOOD[str(d.resolve())] = _signature(d)
    except OSError:
        pass


def is_verified(directory) -> bool:
    """Whether the checkpoint in ``directory`` is complete and intact: :func:`verify`, done
    once per state of its files in this process (a checkpoint this process wrote is not
    re-read). Local."""
    d = Path(directory)
    try:
        if _GOOD.get(str(d.resolve())) == _signature(d):
            return True
    except OSError:
        return False
    try:
        verify(d)
    except CheckpointError:
        return False
    return True



def shard_examples_per_epoch(directory) -> dict:
    """Examples applied per epoch (0-based epoch -> count) over the run's launches up to the
    checkpoint ``directory``, from its first shard's ``examples_per_epoch`` attribute (every
    server applies every example's step: each shard holds the same counts); {} when absent
    (checkpoints written before 2026-12-05). Local."""
    try:
        with h5py.File(Path(directory) / shard_name(0), "r") as f:
            raw = f.attrs.get("examples_per_epoch", "{}")
    except (OSError, KeyError) as e:
        raise CheckpointError(f"{directory}: unreadable shard {shard_name(0)} ({e})") from e
    try:
        got = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
        return {int(k): int(v) for k, v in got.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def shard_examples(directory, server: int) -> int:
    """The ``examples`` attribute of ``shard-SSSS.h5`` (0 when absent: older checkpoints).
    Local."""
    try:
        with h5py.File(Path(directory) / shard_name(server), "r") as f:
            return int(f.attrs.get("examples", 0))
    except (OSError, KeyError) as e:
        raise CheckpointError(f"{directory}: unreadable shard {shard_name(server)} ({e})") from e


# ------------------------------------------------------------------- re-sharded reads


def read_range(directory, manifest: dict, table: str, lo: int, hi: int, *, num_keys: int,
               dim: int, dtype: str, multiplier: int, slots=()) -> tuple[np.ndarray, dict]:
    """Rows of permuted positions ``[lo, hi)`` of ``table``, gathered from whichever old
    shards hold them — for a restart on any number of servers. Local.

    Returns
    -------
    rows : ndarray (hi - lo, dim)
    slot_rows : dict slot name -> ndarray (hi - lo, ...)
        Each slot with the shape and dtype it has in the checkpoint.

    Raises
    ------
    CheckpointError
        If the table is missing or its shape, dtype or key permutation differ from the job's
        (the message names the table and both values).
    """
    part = manifest["partition"].get(table)
    if part is None:
        raise CheckpointError(f"{directory}: checkpoint has no table {table!r} "
                              f"(it has {', '.join(manifest['partition'])})")
    if part.get("storage", "array") != "array":
        raise CheckpointError(f"{directory}: table {table!r} was checkpointed as a dynamic "
                              "table (storage 'hash') but this job declares it fixed "
                              "(storage 'array')")
    want = (num_keys, dim)
    have = (part["num_keys"], part["dim"])
    if want != have:
        raise CheckpointError(f"{directory}: table {table!r} has shape {have} in the checkpoint "
                              f"but {want} in this job")
    if part["dtype"] != dtype:
        raise CheckpointError(f"{directory}: table {table!r} is {part['dtype']} in the checkpoint "
                              f"but {dtype} in this job")
    if part["multiplier"] != multiplier:
        raise CheckpointError(f"{directory}: table {table!r} key permutation differs "
                              f"({part['multiplier']} vs {multiplier})")
    rows = np.empty((hi - lo, dim), dtype=dtype)
    missing = [s for s in slots if s not in part["slots"]]
    if missing:
        raise CheckpointError(f"{directory}: table {table!r} has no optimizer slot(s) {missing} "
                              f"(checkpoint has {part['slots']}); was another optimizer used?")
    specs = slot_specs(part)
    slot_rows = {s: np.empty((hi - lo, *specs[s][0]), dtype=specs[s][1]) for s in slots}
    for s, (a, b) in enumerate(np.asarray(part["ranges"])):
        x, y = max(lo, int(a)), min(hi, int(b))
        if x >= y:
            continue
        with h5py.File(Path(directory) / shard_name(s), "r") as f:
            g = f[f"tables/{table}"]
            rows[x - lo:y - lo] = g["rows"][x - a:y - a]
            for sl in slots:
                slot_rows[sl][x - lo:y - lo] = g[f"slots/{sl}"][x - a:y - a]
    return rows, slot_rows
