"""A server's part of a checkpoint at a consistent cut (the ``CHECKPOINT`` request): when the
cut is reached and writing its shard file. Mixed into :class:`hpcps.server.server.ParameterServer`
(which provides ``clock``, ``pushes_applied``, ``shards``, ``run_dir``, ``ep``)."""

from __future__ import annotations

import numpy as np

from hpcps import checkpoint as ckpt
from hpcps.comm import transport as tp


class CheckpointCut:
    """The ``CHECKPOINT`` request's two steps: :meth:`_cut_ready`, :meth:`_checkpoint`."""

    def _cut_ready(self, h, expected) -> bool:
        """A checkpoint may be written: every step before it applied and, under async, every
        push each worker sent before the cut (``expected[w]`` messages) applied."""
        if self.clock < int(h[tp.H_CLOCK]):
            return False
        return expected is None or all(a >= e for a, e in zip(self.pushes_applied, expected))

    def _checkpoint(self, source, h) -> None:
        """Write this server's shard for the checkpoint at step ``h[clock]``; reply with the
        file's size and checksum (uint8 (40,): little-endian int64 size, then the digest
        zero-padded to :data:`hpcps.checkpoint.DIGEST_FIELD` bytes)."""
        step = int(h[tp.H_CLOCK])
        if self.clock != step:
            raise RuntimeError(f"server {self.index}: checkpoint for step {step} requested at "
                               f"clock {self.clock}: not a consistent cut")
        tables = [sh.checkpoint_entry(self.index) for sh in self.shards]
        nbytes, digest = ckpt.write_shard(ckpt.step_dir(self.run_dir, step), self.index,
                                          self.n_servers, self.clock, tables,
                                          examples=self.examples_total,
                                          examples_per_epoch=self.examples_run())
        self.checkpoint_steps.append(step)
        reply = np.zeros(40, dtype=np.uint8)
        reply[:8] = np.frombuffer(np.array([nbytes], dtype="<i8").tobytes(), dtype=np.uint8)
        reply[8:] = np.frombuffer(bytes.fromhex(digest), dtype=np.uint8)
        self.ep.reply(source, reply, tp.CHECKPOINT, rng=self.index)
