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

Pruning and fresh runs
----------------------
:func:`prune` keeps the ``keep`` newest checkpoints that pass :func:`verify` (never the one
just written, nor the newest verified one), so damaged checkpoints never push out good ones.
Steps order checkpoints only within one run: a run that trains afresh in a directory that
holds checkpoints moves them to ``ckpt.aside-<UTC time>/`` first (:func:`set_aside`,
:func:`choose_start`).

Modules
-------
``layout`` (names, paths, errors), ``atomic`` (atomic HDF5 files, checksums), ``write``
(shards, manifest), ``read`` (manifest, :func:`verify`, re-sharded reads), ``catalog`` (the
run directory's checkpoints: newest valid, prune, where a launch starts). This package
re-exports their public names: ``from hpcps import checkpoint as ckpt; ckpt.verify(...)``.

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

from hpcps.checkpoint.atomic import _PIECE, H5_OVERHEAD, _atomic_h5  # noqa: F401
from hpcps.checkpoint.catalog import (RESUME_MODES, Start, choose_start, finished, latest_valid,
                                      no_valid_line, prune, scan, set_aside)
from hpcps.checkpoint.layout import (CHECKSUM, DIGEST_FIELD, FORMAT, MANIFEST, READ_FORMATS,
                                     CheckpointError, ResumeError, ckpt_root, list_steps,
                                     shard_name, slot_specs, step_dir)
from hpcps.checkpoint.read import (attr_value, check_compatible, is_verified, leftovers,
                                   read_manifest, read_range, shard_examples,
                                   shard_examples_per_epoch, verify)
from hpcps.checkpoint.write import write_manifest, write_shard

__all__ = ["CHECKSUM", "DIGEST_FIELD", "FORMAT", "H5_OVERHEAD", "MANIFEST", "READ_FORMATS",
           "RESUME_MODES", "CheckpointError", "ResumeError", "Start", "attr_value",
           "check_compatible", "choose_start", "ckpt_root", "finished", "is_verified",
           "latest_valid", "leftovers", "list_steps", "no_valid_line", "prune", "read_manifest",
           "read_range", "scan", "set_aside", "shard_examples", "shard_examples_per_epoch",
           "shard_name", "slot_specs",
           "step_dir", "verify", "write_manifest", "write_shard"]
