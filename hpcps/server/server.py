"""The server role: holds one shard of every table and applies the workers' updates.

The loop polls for requests without blocking (it keeps entering MPI, which one-sided pulls
need for progress on some MPIs) and backs off with short sleeps when idle. Update rules are
injected (:class:`hpcps.optim.Optimizer` per table); the consistency policy decides when a
pull may be answered and whether pushes are aggregated per clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import checkpoint as ckpt
from ..comm import transport as tp
from ..tables import KeyPartition, TableSpec

#: Idle back-off of the server loop, seconds (doubles from MIN to MAX while no request waits).
IDLE_SLEEP_MIN = 2e-6
IDLE_SLEEP_MAX = 2e-4


@dataclass
class Shard:
    """One server's rows of one table."""

    spec: TableSpec
    part: KeyPartition
    optimizer: object
    lo: int
    hi: int
    w: np.ndarray
    slots: object

    @property
    def nbytes(self) -> int:
        return self.w.nbytes + (self.slots.nbytes if self.slots is not None else 0)


class ParameterServer:
    """Server loop for one server rank.

    Parameters
    ----------
    endpoint : hpcps.comm.transport.ServerEndpoint
        This server's side of the protocol.
    index : int
        Server index in ``[0, n_servers)``.
    n_servers : int
    worker_ranks : sequence of int
        ``ps`` ranks of the workers, in worker-index order.
    tables : list of (TableSpec, Optimizer)
        Tables in table-id order.
    policy : consistency policy (e.g. :class:`hpcps.consistency.BSP`)
    seed : int
        Job seed (initial values of tables with ``init_std > 0``).
    run_dir : path-like or None
        Run directory; checkpoints go to ``<run_dir>/ckpt/step-XXXXXXXX/shard-SSSS.h5``.
    restore : (directory, manifest) or None
        Checkpoint to start from (:func:`hpcps.checkpoint.latest_valid`); this server reads
        the rows of its key range from whichever old shards hold them, so the number of
        servers may differ from the checkpointed job's.
    """

    def __init__(self, endpoint, index, n_servers, worker_ranks, tables, policy, seed=0,
                 run_dir=None, restore=None):
        self.ep = endpoint
        self.index = index
        self.worker_of_rank = {r: i for i, r in enumerate(worker_ranks)}
        self.n_workers = len(worker_ranks)
        self.policy = policy
        self.shards: list[Shard] = []
        for tid, (spec, opt) in enumerate(tables):
            part = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse)
            lo, hi = part.shard_range(index)
            shape = (hi - lo, spec.dim)
            slots = opt.init_slots(shape, spec.dtype)
            if restore is not None:
                w, saved = ckpt.read_range(restore[0], restore[1], spec.name, lo, hi,
                                           num_keys=spec.num_keys, dim=spec.dim, dtype=spec.dtype,
                                           multiplier=part.multiplier, slots=opt.slot_names)
                if saved:
                    slots = opt.slots_from_dict(saved)
            elif spec.init_std > 0:
                rng = np.random.default_rng([seed, tid, index])
                w = (rng.standard_normal(shape) * spec.init_std).astype(spec.dtype)
            else:
                w = np.zeros(shape, dtype=spec.dtype)
            self.shards.append(Shard(spec, part, opt, lo, hi, w, slots))
        self.n_servers = n_servers
        self.run_dir = run_dir
        start = int(restore[1]["step"]) if restore is not None else 0
        self.clock = start                   # steps applied from every worker
        self.worker_clock = [start] * self.n_workers
        self.examples = {}                   # clock -> examples pushed in that step
        self.pending = {}                    # clock -> {table: [(worker, rows, grads)]}
        self.waiting_pulls = []              # (source, header, rows) deferred by the policy
        self.stopped = set()

    # ------------------------------------------------------------------ loop
    def serve(self) -> None:
        """Answer requests until every worker has sent STOP. Not collective."""
        sleep = IDLE_SLEEP_MIN
        while len(self.stopped) < self.n_workers:
            msg = self.ep.poll()
            if msg is None:
                time.sleep(sleep)
                sleep = min(sleep * 2, IDLE_SLEEP_MAX)
                continue
            sleep = IDLE_SLEEP_MIN
            self.handle(*msg)
        if self.waiting_pulls:
            raise RuntimeError(f"server {self.index}: {len(self.waiting_pulls)} pull(s) still "
                               "waiting at shutdown")

    def handle(self, source: int, h: np.ndarray) -> None:
        op = int(h[tp.H_OP])
        if op == tp.PULL:
            shard = self._shard(h)
            keys = self.ep.recv_keys(source, int(h[tp.H_NKEYS]), op)
            rows = shard.part.local_rows(keys, self.index)
            if self.policy.pull_ready(self.clock, int(h[tp.H_CLOCK])):
                self.ep.reply(source, shard.w[rows], op)
            else:
                self.waiting_pulls.append((source, h, rows))
        elif op == tp.PUSH:
            shard = self._shard(h)
            n = int(h[tp.H_NKEYS])
            keys = self.ep.recv_keys(source, n, op)
            grads = self.ep.recv_values(source, (n, shard.spec.dim), shard.spec.dtype, op)
            rows = shard.part.local_rows(keys, self.index)
            c = int(h[tp.H_CLOCK])
            if c < self.clock:
                raise RuntimeError(f"server {self.index}: push for clock {c} from worker "
                                   f"{self.worker_of_rank[source]} after clock {self.clock} was applied")
            self.pending.setdefault(c, {}).setdefault(int(h[tp.H_TABLE]), []).append(
                (self.worker_of_rank[source], rows, grads))
        elif op == tp.CLOCK:
            w = self.worker_of_rank[source]
            c = int(h[tp.H_CLOCK])
            if c != self.worker_clock[w]:
                raise RuntimeError(f"server {self.index}: worker {w} clocked {c}, expected "
                                   f"{self.worker_clock[w]}")
            self.worker_clock[w] = c + 1
            self.examples[c] = self.examples.get(c, 0) + int(h[tp.H_NEX])
            self._advance()
        elif op == tp.PULL_SHARD:
            shard = self._shard(h)
            if self.policy.pull_ready(self.clock, int(h[tp.H_CLOCK])):
                self.ep.reply(source, shard.w, op)
            else:
                self.waiting_pulls.append((source, h, None))
        elif op == tp.CHECKPOINT:
            if self.clock >= int(h[tp.H_CLOCK]):
                self._checkpoint(source, h)
            else:
                self.waiting_pulls.append((source, h, None))
        elif op == tp.STOP:
            self.stopped.add(source)
        else:
            raise RuntimeError(f"server {self.index}: unknown op {op} from rank {source}")

    # ------------------------------------------------------------------ BSP/SSP
    def _advance(self) -> None:
        """Apply every clock all workers have finished, then answer pulls now allowed."""
        while min(self.worker_clock) > self.clock:
            c = self.clock
            n_ex = self.examples.pop(c, 0)
            scale = 1.0 / n_ex if n_ex else 0.0
            for tid, pushes in sorted(self.pending.pop(c, {}).items()):
                pushes.sort(key=lambda p: p[0])          # worker order: deterministic sums
                shard = self.shards[tid]
                rows = np.concatenate([p[1] for p in pushes])
                grads = np.concatenate([p[2] for p in pushes])
                shard.optimizer.apply(shard.w, shard.slots, rows, grads, scale)
            self.clock = c + 1
        still = []
        for source, h, rows in self.waiting_pulls:
            op = int(h[tp.H_OP])
            if op == tp.CHECKPOINT and self.clock >= int(h[tp.H_CLOCK]):
                self._checkpoint(source, h)
            elif op != tp.CHECKPOINT and self.policy.pull_ready(self.clock, int(h[tp.H_CLOCK])):
                shard = self._shard(h)
                self.ep.reply(source, shard.w if rows is None else shard.w[rows], op)
            else:
                still.append((source, h, rows))
        self.waiting_pulls = still

    def _checkpoint(self, source, h) -> None:
        """Write this server's shard for the checkpoint at step ``h[clock]``; reply with the
        file's size and SHA-256 (uint8 (40,): little-endian int64 size, 32 digest bytes)."""
        step = int(h[tp.H_CLOCK])
        if self.clock != step:
            raise RuntimeError(f"server {self.index}: checkpoint for step {step} requested at "
                               f"clock {self.clock}: not a consistent cut")
        tables = [dict(name=sh.spec.name, rows=sh.w, keys=sh.part.shard_keys(self.index),
                       slots=sh.optimizer.slots_dict(sh.slots), lo=sh.lo, hi=sh.hi,
                       num_keys=sh.spec.num_keys, multiplier=sh.part.multiplier,
                       sparse=sh.spec.sparse, optimizer=sh.optimizer.name)
                  for sh in self.shards]
        nbytes, digest = ckpt.write_shard(ckpt.step_dir(self.run_dir, step), self.index,
                                          self.n_servers, self.clock, tables)
        reply = np.zeros(40, dtype=np.uint8)
        reply[:8] = np.frombuffer(np.array([nbytes], dtype="<i8").tobytes(), dtype=np.uint8)
        reply[8:] = np.frombuffer(bytes.fromhex(digest), dtype=np.uint8)
        self.ep.reply(source, reply, tp.CHECKPOINT)

    def _shard(self, h) -> Shard:
        tid = int(h[tp.H_TABLE])
        if not 0 <= tid < len(self.shards):
            raise RuntimeError(f"server {self.index}: unknown table id {tid}")
        return self.shards[tid]

    def load(self) -> dict:
        """Keys and bytes this server has served, for the run summary."""
        s = self.ep.stats
        return {
            "server": self.index,
            "rows": int(sum(sh.hi - sh.lo for sh in self.shards)),
            "memory_bytes": int(sum(sh.nbytes for sh in self.shards)),
            "keys_pulled": int(s.keys.get("pull", 0)),
            "keys_pushed": int(s.keys.get("push", 0)),
            "bytes_in": int(s.total("bytes_in")),
            "bytes_out": int(s.total("bytes_out")),
            "requests": int(s.total("messages")),
            "clock": self.clock,
        }
