"""HDF5 checkpoints: layout, atomic commit, validation, and re-sharded reads (h5py, no MPI).

Layout
------
One directory per checkpoint, named by the step (worker clock) it was taken at::

    <run dir>/ckpt/step-00001200/
        shard-0000.h5      written by server 0
        shard-0001.h5      ...
        manifest.h5        written last, by worker 0; its presence marks the checkpoint

``shard-SSSS.h5`` (one per server; serial h5py)
    attrs ``server``, ``n_servers``, ``clock`` (steps applied), ``examples`` (training
    examples whose updates it holds), ``hpcps_version``;
    per table a group ``tables/<name>`` with

    * ``rows``  (hi - lo, dim), the table dtype: the server's rows, in *permuted* key order
      (row i holds permuted position lo + i, see :mod:`hpcps.core.tables`);
    * ``keys``  (hi - lo,) int64: the original key of each row;
    * ``slots/<slot>`` (hi - lo, ...): optimizer state, one entry per row in the order of
      ``rows`` — ``accumulator`` (AdaGrad), ``m``, ``v`` and ``step`` (Adam; ``step`` is
      (hi - lo,) int64), ``z`` and ``n`` (FTRL); the others are shaped like ``rows``;
    * attrs ``lo``, ``hi``, ``num_keys``, ``dim``, ``dtype``, ``multiplier``, ``sparse``,
      ``optimizer``.

``manifest.h5``
    attrs ``format`` (``"hpcps-checkpoint-2"``), ``hpcps_version``, ``job_name``, ``config``
    (the job file text, TOML), ``step`` (worker clock = steps done, all workers),
    ``epoch`` and ``step_in_epoch`` (where the data readers resume), ``steps_per_epoch``,
    ``n_servers``, ``n_workers``, ``created`` (ISO 8601 UTC), ``rng`` (how the readers'
    random streams are derived: numpy PCG64 seeded with ``[seed, worker, epoch]``, so the
    position fully restores them), ``epoch_plan`` (JSON ``[[n_workers, steps], ...]``: the
    segments of an epoch resumed on other numbers of workers); ``epoch`` is 0-based;

    * ``shards``: attrs ``files``, ``bytes``, ``checksum`` (``"xxh3_128"``) and ``digest``
      (hex, one per file) — every shard file with its size and checksum. Format 1
      (``"hpcps-checkpoint-1"``, still read) had ``sha256`` (hex SHA-256 of each file)
      instead of ``checksum`` and ``digest``;
    * ``partition/<table>``: attrs ``num_keys``, ``dim``, ``dtype``, ``multiplier``,
      ``range_size``, ``sparse``; dataset ``ranges`` (n_servers, 2) int64, the permuted key
      range ``[lo, hi)`` of each server;
    * ``workers``: datasets ``clock`` (n_workers,) int64 and ``last_push_seq``
      (n_workers,) int64: under async, the number of push messages each worker had sent
      before the cut — every one applied by the servers before they wrote (0 under BSP/SSP,
      whose cut is the clock);
    * ``metrics``: attr ``history`` (JSON text, the per-epoch metrics so far);
    * ``tables/<name>`` and ``tables/<name>_keys``: HDF5 *virtual datasets* stitching the
      shards, so ``h5py.File(manifest)["tables/weights"]`` reads the whole table
      ``(num_keys, dim)`` in permuted order and ``["tables/weights_keys"]`` the key of each
      of its rows; ``slots/<name>/<slot>`` likewise (each slot with its own shape and dtype).

Atomic commit
-------------
Every file is written under a temporary name in the same directory, flushed, fsync'ed,
moved into place with ``os.replace`` and the directory fsync'ed; files get mode
``0666 & ~umask`` and directories ``0777 & ~umask`` (:mod:`hpcps.core.files`). The manifest is
written last and names the size and checksum of every shard, so a checkpoint is *complete*
only when its manifest exists and every shard matches it. :func:`latest_valid` skips (with a warning)
any newer checkpoint that is incomplete, truncated or corrupt; a process killed at any
instant of a write therefore never makes the previous checkpoint unusable.

Checksum
--------
XXH3, 128-bit (``xxhash.xxh3_128``; Y. Collet, xxHash, https://xxhash.com: the XXH3
algorithm, which passes the SMHasher suite) of each shard file's bytes in order. Damage of
any kind (a torn write, flipped bits, a stale block) leaves the digest unchanged with a
probability of about 2**-128; a truncated file is caught first by its size. It is not a
cryptographic hash and does not resist a forger, which the checkpoint never needed: whoever
can write the shards can write the manifest. Why not SHA-256, as format 1: measured on this
project's 2-core machine on the same 67 MB shard, SHA-256 ran at 1.8 GB/s (as fast as the
disk, so it needed the second core, which a loaded machine does not have) and XXH3 at
37 GB/s (2 ms), so XXH3 is computed in the writing thread, on each piece of the arrays just
before that piece is written. CRC-32 (zlib, 4.3 GB/s), Adler-32 (3.6 GB/s), CRC-32C
(16 GB/s) and BLAKE3 (4.8 GB/s) were slower, the first three also weaker (32 bits); HDF5's
Fletcher-32 filter needs chunked datasets and added 24 ms.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import xxhash

from hpcps import __version__
from hpcps.core.files import make_temp

FORMAT = "hpcps-checkpoint-2"
#: manifest formats :func:`read_manifest` accepts: format 1 recorded SHA-256 (``shards/sha256``)
READ_FORMATS = ("hpcps-checkpoint-1", FORMAT)
#: the checksum of shard files written by this version (manifest attr ``shards/checksum``)
CHECKSUM = "xxh3_128"
#: checksums :func:`verify` knows, by the name the manifest records
_HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
#: size of the digest field :func:`write_shard` returns and servers send to worker 0
#: (format 1's SHA-256 size): the digest, zero-padded on the right
DIGEST_FIELD = 32
#: bytes hashed then written at a time, so the write copies them from cache
_PIECE = 1 << 20
MANIFEST = "manifest.h5"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is unusable or does not match the job (the message says why)."""


class ResumeError(CheckpointError):
    """The checkpoint chosen for a restart does not fit the job; raised identically on every
    rank before any parameter-server traffic."""


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
        if (p["num_keys"], p["dim"]) != (spec.num_keys, spec.dim):
            raise ResumeError(f"{directory}: table {spec.name!r} has shape "
                              f"({p['num_keys']}, {p['dim']}) in the checkpoint but "
                              f"({spec.num_keys}, {spec.dim}) in this job")
        if p["dtype"] != spec.dtype:
            raise ResumeError(f"{directory}: table {spec.name!r} is {p['dtype']} in the checkpoint "
                              f"but {spec.dtype} in this job")
        need = list((slots or {}).get(spec.name, ()))
        missing = [s for s in need if s not in p.get("slots", [])]
        if missing:
            raise ResumeError(f"{directory}: table {spec.name!r} has optimizer slots "
                              f"{p.get('slots', [])} in the checkpoint but this job's optimizer "
                              f"needs {need}; was another optimizer used? (--resume never "
                              "trains afresh)")


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


# ---------------------------------------------------------------------- atomic files


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_digest(path: Path, checksum: str = CHECKSUM) -> str:
    """Hex digest of the file at ``path`` with ``checksum`` (a key of ``_HASHES``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _HASHES[checksum]).hexdigest()


def _field(digest: str) -> str:
    """``digest`` (hex) zero-padded to :data:`DIGEST_FIELD` bytes."""
    return digest.ljust(2 * DIGEST_FIELD, "0")


def _unfield(field: str, server: int) -> str:
    """The :data:`CHECKSUM` digest (hex) inside a digest field from :func:`write_shard`.

    Raises
    ------
    CheckpointError
        If the field's size is not :data:`DIGEST_FIELD` bytes or its padding is not zero
        (a shard written by another hpcps version).
    """
    n = 2 * _HASHES[CHECKSUM]().digest_size
    if len(field) != 2 * DIGEST_FIELD or field[n:].strip("0"):
        raise CheckpointError(f"shard {shard_name(server)}: digest {field!r} is not a "
                              f"{CHECKSUM} digest field of {DIGEST_FIELD} bytes "
                              "(written by another hpcps version?)")
    return field[:n]


def _atomic_h5(final: Path, fill, need: int = 0) -> str | None:
    """Write an HDF5 file by calling ``fill(h5file)`` on a temp file, then commit it.

    Parameters
    ----------
    final : Path
        Where the file lands (``os.replace`` of the temporary file, then an fsync of the
        directory).
    fill : callable(h5py.File) -> list of (dataset path, ndarray) or None
        Writes the file's metadata and small datasets. Large datasets it only *creates*
        (with :func:`_create_raw`, storage allocated, nothing written) and returns with the
        arrays that belong in them: those are written by :func:`_write_raw` after the HDF5
        library closed the file.
    need : int
        Expected size in bytes (data plus HDF5 overhead). When the file system has less free
        space than that, nothing is written; when writing fails anyway (ENOSPC, EROFS, EDQUOT,
        EFBIG, EIO, ...) the temporary file is removed. Either way the previous checkpoints
        are untouched and the :class:`CheckpointError` names the file, the reason, the bytes
        needed and the bytes free.

    Returns
    -------
    str or None
        :data:`CHECKSUM` digest (hex) of the committed file when ``fill`` returned datasets
        to write, else None (the caller hashes the file itself).
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(_write_failure(final, e.strerror or str(e), need)) from e
    free = _free_bytes(final.parent)
    if need and free is not None and free < need:
        raise CheckpointError(_write_failure(final, "not enough free space", need))
    try:
        tmp = make_temp(final)            # mode 0666 & ~umask, like the directories
    except OSError as e:
        raise CheckpointError(_write_failure(final, e.strerror or str(e), need)) from e
    digest = None
    try:
        # file format of HDF5 1.8-1.10: several times faster to write than the default
        # "earliest", and still readable by HDF5 1.10 tools (h5dump/h5ls of Debian 12);
        # "latest" (HDF5 2.x) is not
        with h5py.File(tmp, "w", libver=("v108", "v110")) as f:
            raw = fill(f) or []
            regions = [(int(f[name].id.get_offset()), arr) for name, arr in raw if arr.nbytes]
        if regions:
            digest = _write_raw(tmp, regions)
        else:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except OSError as e:
        raise CheckpointError(_write_failure(final, _reason(e), need)) from e
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return digest


def _create_raw(group, name: str, arr: np.ndarray) -> tuple[str, np.ndarray]:
    """Create dataset ``name`` in ``group`` shaped and typed like ``arr``, contiguous, its
    storage allocated at creation and never filled, and return ``(path, arr)`` for
    :func:`_write_raw`. ``arr`` is made C-contiguous and native-endian (the dataset's type)."""
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    ds = group.create_dataset(name, shape=arr.shape, dtype=arr.dtype, dcpl=dcpl,
                              fill_time="never")
    return ds.name, arr


def _write_raw(path: Path, regions) -> str:
    """Write each array at its byte offset of ``path`` (``os.pwrite``), fsync, and return the
    :data:`CHECKSUM` digest (hex) of the whole file, computed in the same pass from memory:
    each piece of :data:`_PIECE` bytes is hashed, then written (the file's other bytes, HDF5
    metadata, are read back: a few KB).

    Parameters
    ----------
    path : Path
        An HDF5 file closed by the library, whose contiguous datasets were allocated at the
        offsets given and not written.
    regions : list of (int, ndarray)
        Byte offset in the file and the C-contiguous array to place there.

    Raises
    ------
    CheckpointError
        If two regions overlap. OSError from the writes goes to the caller.

    Notes
    -----
    The digest is that of the file's bytes in order, so :func:`verify` (which re-reads the
    file) checks exactly the same thing. Hashing a piece just before writing it leaves it in
    the cache for the kernel's copy; XXH3 adds ~2 ms to a 67 MB shard on one core, where the
    SHA-256 of format 1 needed a second thread and a free core.
    """
    regions = sorted(regions, key=lambda r: r[0])
    h = _HASHES[CHECKSUM]()
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        pos = 0                    # the file in order: metadata bytes, arrays
        for off, a in regions:
            if off < pos:
                raise CheckpointError(f"{path}: datasets overlap at byte {off}")
            if off > pos:
                h.update(os.pread(fd, off - pos, pos))
            view = memoryview(a).cast("B")
            for start in range(0, len(view), _PIECE):
                piece = view[start:start + _PIECE]
                h.update(piece)
                done = 0
                while done < len(piece):
                    done += os.pwrite(fd, piece[done:], off + start + done)
            pos = off + a.nbytes
        if size > pos:
            h.update(os.pread(fd, size - pos, pos))
        os.fsync(fd)
        return h.hexdigest()
    finally:
        os.close(fd)


def _reason(e: OSError) -> str:
    """The OS reason of a failed write, on one line. h5py's OSError carries HDF5's report
    (several lines, with ``errno = N`` inside) instead of a plain ``strerror``."""
    text = " ".join(str(e.strerror or e).split())
    m = re.search(r"errno = (\d+)", text)
    if m:
        return f"{os.strerror(int(m.group(1)))} (HDF5: {text.split(' (', 1)[0]})"
    return text


def _free_bytes(d: Path) -> int | None:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return None


def _write_failure(final: Path, reason: str, need: int) -> str:
    free = _free_bytes(final.parent)
    have = f"{free / 1e6:,.2f} MB free" if free is not None else "free space unknown"
    want = f"the file needs about {need / 1e6:,.2f} MB, " if need else ""
    return (f"cannot write {final}: {reason}; {want}{have} in {final.parent}. "
            "Earlier checkpoints are untouched; free space (or make the directory "
            "writable) and run the job again to resume from the newest of them")


#: HDF5 bookkeeping added to the data bytes when estimating a file's size.
H5_OVERHEAD = 64 * 1024


# ---------------------------------------------------------------------------- shards


def write_shard(directory, server: int, n_servers: int, clock: int, tables: list,
                examples: int = 0) -> tuple[int, str]:
    """Write one server's shard file atomically. Local (not collective).

    Parameters
    ----------
    directory : path-like
        The checkpoint directory (``step_dir(run_dir, step)``).
    server, n_servers, clock : int
    examples : int
        Training examples whose updates the shard holds (the attribute ``examples``; a range
        reloaded in place by a continue-mode job counts on from it).
    tables : list of dict
        Per table: ``name``, ``rows`` (n, dim) ndarray, ``keys`` (n,) int64, ``slots``
        (dict of name -> ndarray with n rows: (n, dim) or (n,), any numeric dtype; views
        such as the fields of a record array are fine), ``lo``, ``hi``, ``num_keys``,
        ``multiplier``, ``sparse``, ``optimizer``.

    Returns
    -------
    nbytes : int
        Size of the file written.
    digest : str
        The file's :data:`CHECKSUM` digest in a field of :data:`DIGEST_FIELD` bytes, as hex
        (zero-padded on the right; :func:`write_manifest` takes it as it is).

    Raises
    ------
    CheckpointError
        If the file cannot be written — not enough free space (checked first, from the
        array sizes), a full or read-only file system, a quota — naming the file, the
        reason, the bytes needed and free. Nothing of the file is left behind. A shard file
        of the same name in a checkpoint without a manifest (an attempt that never
        completed) is removed first.
    """
    final = Path(directory) / shard_name(server)
    if final.exists() and not (final.parent / MANIFEST).exists():
        # left by an attempt at this checkpoint that never completed (a relaunch writes it
        # again): useless, and its space is needed for the new file
        final.unlink()
    raw: list = []

    def fill(f):
        f.attrs["server"] = int(server)
        f.attrs["n_servers"] = int(n_servers)
        f.attrs["clock"] = int(clock)
        f.attrs["examples"] = int(examples)
        f.attrs["hpcps_version"] = __version__
        for t in tables:
            g = f.create_group(f"tables/{t['name']}")
            raw.append(_create_raw(g, "rows", np.asarray(t["rows"])))
            raw.append(_create_raw(g, "keys", np.asarray(t["keys"], dtype=np.int64)))
            for sname, arr in (t.get("slots") or {}).items():
                raw.append(_create_raw(g, f"slots/{sname}", np.asarray(arr)))
            for a in ("lo", "hi", "num_keys", "multiplier"):
                g.attrs[a] = int(t[a])
            g.attrs["dim"] = int(t["rows"].shape[1])
            g.attrs["dtype"] = str(t["rows"].dtype)
            g.attrs["sparse"] = bool(t["sparse"])
            g.attrs["optimizer"] = str(t.get("optimizer", ""))
        return raw

    need = H5_OVERHEAD + sum(
        np.asarray(t["rows"]).nbytes + 8 * len(t["keys"])
        + sum(np.asarray(a).nbytes for a in (t.get("slots") or {}).values()) for t in tables)
    digest = _atomic_h5(final, fill, need)
    return final.stat().st_size, _field(digest or _file_digest(final))


# -------------------------------------------------------------------------- manifest


def write_manifest(directory, *, cfg_text: str, job_name: str, step: int, epoch: int,
                   step_in_epoch: int, steps_per_epoch: int, n_workers: int,
                   worker_clocks, last_push_seq, shards: list, partitions: dict,
                   history: list, extra: dict | None = None) -> Path:
    """Write ``manifest.h5`` last, making the checkpoint complete. Local (worker 0 only).

    Parameters
    ----------
    shards : list of (nbytes, digest field) in server order, as returned by
        :func:`write_shard` (and sent by the servers to worker 0); the manifest records each
        file's :data:`CHECKSUM` digest.
    partitions : dict of table name -> dict(num_keys, dim, dtype, multiplier, range_size,
        sparse, ranges=(n_servers, 2) int64, slots)
        ``slots``: the optimizer slots, either a list of names (each shaped like the rows)
        or a dict ``{name: (shape after the row axis, dtype name)}``
        (:meth:`hpcps.core.optim.Optimizer.slot_specs`).
    history : list of dict
        Per-epoch metrics so far (stored as JSON text).
    extra : dict of str -> str or int, optional
        More root attributes (e.g. ``epoch_plan``, the JSON list of ``[n_workers, steps]``
        segments of an epoch resumed on another number of workers).

    Raises
    ------
    CheckpointError
        If the manifest cannot be written (see :func:`write_shard`), or a shard's digest
        field is not one this version writes; the checkpoint then stays incomplete and
        :func:`latest_valid` skips it.
    """
    directory = Path(directory)
    n_servers = len(shards)
    digests = [_unfield(d, s) for s, (_, d) in enumerate(shards)]

    def fill(f):
        f.attrs["format"] = FORMAT
        f.attrs["hpcps_version"] = __version__
        f.attrs["job_name"] = job_name
        f.attrs["config"] = cfg_text
        f.attrs["step"] = int(step)
        f.attrs["epoch"] = int(epoch)
        f.attrs["step_in_epoch"] = int(step_in_epoch)
        f.attrs["steps_per_epoch"] = int(steps_per_epoch)
        f.attrs["n_servers"] = n_servers
        f.attrs["n_workers"] = int(n_workers)
        f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        f.attrs["rng"] = "numpy PCG64 seeded with [seed, worker, epoch]; restored by position"
        f.attrs["epoch_plan"] = "[]"
        for k, v in (extra or {}).items():
            f.attrs[k] = v
        sh = f.create_group("shards")
        sh.attrs["files"] = [shard_name(s) for s in range(n_servers)]
        sh.attrs["checksum"] = CHECKSUM
        sh.attrs["digest"] = digests
        sh.attrs["bytes"] = np.array([n for n, _ in shards], dtype=np.int64)
        w = f.create_group("workers")
        w.create_dataset("clock", data=np.asarray(worker_clocks, dtype=np.int64))
        w.create_dataset("last_push_seq", data=np.asarray(last_push_seq, dtype=np.int64))
        w["clock"].attrs["meaning"] = "steps finished by each worker"
        m = f.create_group("metrics")
        m.attrs["history"] = json.dumps(history, allow_nan=True)
        for name, p in partitions.items():
            g = f.create_group(f"partition/{name}")
            for a in ("num_keys", "dim", "multiplier", "range_size"):
                g.attrs[a] = int(p[a])
            g.attrs["dtype"] = p["dtype"]
            g.attrs["sparse"] = bool(p["sparse"])
            g.create_dataset("ranges", data=np.asarray(p["ranges"], dtype=np.int64))
            g["ranges"].attrs["meaning"] = "permuted key range [lo, hi) of each server"
            _virtual(f, f"tables/{name}", "rows", name, p, n_servers, (p["dim"],), p["dtype"])
            _virtual(f, f"tables/{name}_keys", "keys", name, p, n_servers, (), "int64")
            f[f"tables/{name}"].attrs["meaning"] = (
                f"rows of table {name!r} in permuted key order; key of row i: tables/{name}_keys[i]")
            for slot, (tail, dt) in slot_specs(p).items():
                _virtual(f, f"slots/{name}/{slot}", f"slots/{slot}", name, p, n_servers,
                         tail, dt)

    final = directory / MANIFEST
    _atomic_h5(final, fill, H5_OVERHEAD + len(cfg_text.encode()) + len(json.dumps(history)))
    return final


def slot_specs(p: dict) -> dict:
    """``{slot: (shape after the row axis, dtype name)}`` of a partition dict: its
    ``slot_specs``, else its ``slots`` (a dict of specs, or names shaped like the rows)."""
    if p.get("slot_specs"):
        return {k: (tuple(t), str(d)) for k, (t, d) in p["slot_specs"].items()}
    slots = p.get("slots") or []
    if isinstance(slots, dict):
        return {k: (tuple(t), str(d)) for k, (t, d) in slots.items()}
    return {k: ((int(p["dim"]),), str(p["dtype"])) for k in slots}


def _virtual(f, target, dataset, table, p, n_servers, tail, dtype):
    layout = h5py.VirtualLayout(shape=(p["num_keys"], *tail), dtype=dtype)
    for s in range(n_servers):
        lo, hi = (int(v) for v in p["ranges"][s])
        if hi > lo:
            src = h5py.VirtualSource(shard_name(s), f"tables/{table}/{dataset}", shape=(hi - lo, *tail))
            layout[lo:hi] = src
    f.create_virtual_dataset(target, layout, fillvalue=0)


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
        raise CheckpointError(f"{directory}: no {MANIFEST} (checkpoint incomplete)")
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

    Returns the manifest (:func:`read_manifest`).

    Raises
    ------
    CheckpointError
        Naming the first problem found.
    """
    directory = Path(directory)
    m = read_manifest(directory)
    checksum = m["shards"]["checksum"]
    for name, size, digest in zip(m["shards"]["files"], m["shards"]["bytes"], m["shards"]["digest"]):
        p = directory / name
        if not p.exists():
            raise CheckpointError(f"{directory}: shard {name} is missing")
        if p.stat().st_size != size:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, manifest says {size} (truncated?)")
        if _file_digest(p, checksum) != digest:
            raise CheckpointError(f"{p}: {checksum} checksum does not match the manifest (corrupt)")
        try:
            with h5py.File(p, "r") as f:
                for t in m["partition"]:
                    f[f"tables/{t}/rows"].shape
        except (OSError, KeyError) as e:
            raise CheckpointError(f"{p}: unreadable shard ({e})") from e
    return m


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
