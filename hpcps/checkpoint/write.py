"""Writing a checkpoint: one shard per server, then the manifest that completes it. Local
(no MPI): servers call :func:`write_shard`, worker 0 :func:`write_manifest`."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import h5py
import numpy as np

from hpcps import __version__
from hpcps.checkpoint.atomic import (H5_OVERHEAD, _atomic_h5, _create_raw, _field, _file_digest,
                                     _unfield)
from hpcps.checkpoint.layout import CHECKSUM, FORMAT, MANIFEST, shard_name, slot_specs
from hpcps.checkpoint.read import leftovers, remember_good



def write_shard(directory, server: int, n_servers: int, clock: int, tables: list,
                examples: int = 0, examples_per_epoch: dict | None = None) -> tuple[int, str]:
    """Write one server's shard file atomically. Local (not collective).

    Parameters
    ----------
    directory : path-like
        The checkpoint directory (``step_dir(run_dir, step)``).
    server, n_servers, clock : int
    examples : int
        Training examples whose updates the shard holds (the attribute ``examples``; a range
        reloaded in place by a continue-mode job counts on from it).
    examples_per_epoch : dict of int -> int, optional
        Examples applied per epoch (0-based) over the run's launches so far (the attribute
        ``examples_per_epoch``, JSON ``{"epoch": count}``; :func:`shard_examples_per_epoch`).
    tables : list of dict
        Per table: ``name``, ``rows`` (n, dim) ndarray, ``keys`` (n,) int64, ``slots``
        (dict of name -> ndarray with n rows: (n, dim) or (n,), any numeric dtype; views
        such as the fields of a record array are fine), ``lo``, ``hi``, ``num_keys``,
        ``multiplier``, ``sparse``, ``optimizer``. A dynamic table's entry is
        ``name``, ``dynamic`` (its :class:`hpcps.kernels.hashtable.HashTable`), ``num_keys``,
        ``sparse``, ``optimizer``: its group is written by
        :func:`hpcps.checkpoint.dynamic.write_group` (keys, rows, slots, ``storage="hash"``).

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
    for name in leftovers(final.parent):
        if name.startswith(f".{final.name}."):
            # this shard's temporary file from a write that was interrupted (a kill, a
            # crash): only this server writes that name, so nobody is writing it now
            (final.parent / name).unlink(missing_ok=True)
    raw: list = []

    def fill(f):
        f.attrs["server"] = int(server)
        f.attrs["n_servers"] = int(n_servers)
        f.attrs["clock"] = int(clock)
        f.attrs["examples"] = int(examples)
        f.attrs["examples_per_epoch"] = json.dumps({str(int(e)): int(n) for e, n in
                                                    sorted((examples_per_epoch or {}).items())})
        f.attrs["hpcps_version"] = __version__
        for t in tables:
            g = f.create_group(f"tables/{t['name']}")
            if t.get("dynamic") is not None:
                from hpcps.checkpoint.dynamic import write_group

                from hpcps.checkpoint.dynamic import write_state

                write_group(g, t["dynamic"])
                write_state(g, t)
                g.attrs["num_keys"] = int(t["num_keys"])
                g.attrs["sparse"] = True
                continue
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
        int(t["dynamic"].nbytes) if t.get("dynamic") is not None else
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
            if p.get("storage") == "hash":
                # a dynamic table: no key ranges, each shard holds the keys its hash gives it
                # (tables/<name>/keys, rows, slots/* in every shard file)
                g.attrs["storage"] = "hash"
                for a in ("num_keys", "dim"):
                    g.attrs[a] = int(p[a])
                g.attrs["multiplier"] = 0
                g.attrs["range_size"] = 0
                g.attrs["dtype"] = p["dtype"]
                g.attrs["sparse"] = True
                g.attrs["slot_names"] = list(p["slots"]) if p["slots"] else [""]
                g.create_dataset("ranges", data=np.zeros((n_servers, 2), dtype=np.int64))
                g["ranges"].attrs["meaning"] = "none: a dynamic table's keys go by their hash"
                continue
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
    for name in leftovers(directory):
        if name.startswith(f".{MANIFEST}."):          # an interrupted earlier attempt's
            (directory / name).unlink(missing_ok=True)
    _atomic_h5(final, fill, H5_OVERHEAD + len(cfg_text.encode()) + len(json.dumps(history)))
    remember_good(directory)        # complete: the shards' digests came from their writers
    return final


def _virtual(f, target, dataset, table, p, n_servers, tail, dtype):
    layout = h5py.VirtualLayout(shape=(p["num_keys"], *tail), dtype=dtype)
    for s in range(n_servers):
        lo, hi = (int(v) for v in p["ranges"][s])
        if hi > lo:
            src = h5py.VirtualSource(shard_name(s), f"tables/{table}/{dataset}", shape=(hi - lo, *tail))
            layout[lo:hi] = src
    f.create_virtual_dataset(target, layout, fillvalue=0)
