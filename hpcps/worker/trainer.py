"""The worker role: read this worker's data partition, pull, compute gradients, push, clock.

Under BSP every worker runs the same number of steps per epoch (the largest partition's
``ceil(rows / batch_size)``); a worker whose partition is exhausted still clocks each step
with zero examples, so no server waits for it.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from ..comm.collectives import allreduce_max, allreduce_sum, gatherv
from ..data.source import load_split
from ..consistency import BSP
from ..model import BIAS, WEIGHTS, batch_keys, binary_metrics, predict
from .steps import make_steps


def _fmt_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Trainer:
    """Minibatch training loop of one worker.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    index, n_workers : int
        This worker's index and the number of workers (its data partition).
    client : hpcps.worker.client.PSClient
    comm : MPI.Intracomm
        The workers' communicator (for the per-epoch metrics collectives).
    is_chief : bool
        Worker 0 prints progress and collects the metrics.
    on_epoch : callable(dict) or None
        Called on the chief with each epoch's metrics record.
    policy : hpcps.consistency.Policy, optional
        Consistency policy (default BSP); picks the step runner (:mod:`hpcps.worker.steps`).
    step_hook : callable(worker_index, clock) or None
        Called in every step after the gradient is computed and before it is pushed (tests
        use it to slow one worker's computation down).
    """

    def __init__(self, cfg, index, n_workers, client, comm, is_chief, on_epoch=None, out=None,
                 policy=None, step_hook=None):
        self.cfg = cfg
        self.index = index
        self.n_workers = n_workers
        self.client = client
        self.comm = comm
        self.is_chief = is_chief
        self.on_epoch = on_epoch
        self.out = out or sys.stdout
        self.history: list[dict] = []
        self.policy = policy or BSP()
        self.step_hook = step_hook
        self.steps = make_steps(self.policy, client, index, cfg.data.num_features, step_hook)

    def run(self) -> dict:
        """Train for ``cfg.train.epochs`` epochs. Collective over the workers' communicator."""
        cfg, t = self.cfg, self.cfg.train
        X, y = load_split(cfg.data, "train", self.index, self.n_workers)
        Xt, yt = load_split(cfg.data, "test", self.index, self.n_workers)
        n_train, n_test = (int(v) for v in allreduce_sum(self.comm, np.array([X.shape[0], Xt.shape[0]], dtype=np.int64)))
        steps = int(allreduce_max(self.comm, np.array([math.ceil(X.shape[0] / t.batch_size)], dtype=np.int64))[0])
        if t.max_steps:
            steps = min(steps, t.max_steps)
        if self.is_chief:
            self._say(f"hpcps: {self.n_workers} worker(s), {self.client.n_servers} server(s); "
                      f"{n_train} train / {n_test} test rows, {cfg.data.num_features} features; "
                      f"{steps} steps/epoch of {t.batch_size} rows per worker; "
                      f"{self.policy.describe()} ({self.client.pull_mode} pulls), "
                      f"{cfg.optimizer.name} lr={cfg.optimizer.learning_rate}")
        rng = np.random.default_rng([cfg.seed, self.index])
        total_steps = steps * t.epochs
        examples_per_step = n_train / max(1, math.ceil(n_train / (t.batch_size * self.n_workers)))
        t0 = last = time.perf_counter()
        local_examples = 0
        for epoch in range(t.epochs):
            order = rng.permutation(X.shape[0]) if t.shuffle else np.arange(X.shape[0])
            loss_sum, n_ex = 0.0, 0
            self.steps.begin_epoch(X, y, order, steps, t.batch_size)
            for step in range(steps):
                rows = order[step * t.batch_size:(step + 1) * t.batch_size]
                loss_sum += self.steps.step(step, rows, final=epoch == t.epochs - 1 and step == steps - 1)
                n_ex += rows.size
                self.client.clock(int(rows.size))
                if self.is_chief and time.perf_counter() - last >= t.progress_seconds:
                    last = time.perf_counter()
                    done = epoch * steps + step + 1
                    rate = done * examples_per_step / (last - t0)
                    eta = (last - t0) / done * (total_steps - done)
                    self._say(f"epoch {epoch + 1}/{t.epochs}  step {step + 1}/{steps}  "
                              f"clock {self.client.clock_value} (workers "
                              f"{','.join(str(c) for c in self.client.worker_clocks())})  {rate:,.0f} ex/s  "
                              f"loss(w0) {loss_sum / max(1, n_ex):.4f}  ETA {_fmt_eta(eta)}")
            local_examples += n_ex
            rec = self._evaluate(epoch, Xt, yt, loss_sum, n_ex, time.perf_counter() - t0)
            if rec is not None:
                self.history.append(rec)
                if self.on_epoch:
                    self.on_epoch(rec)
        elapsed = time.perf_counter() - t0
        total_examples = int(allreduce_sum(self.comm, np.array([local_examples], dtype=np.int64))[0])
        return {"seconds": elapsed, "examples": total_examples, "steps": total_steps,
                "epochs": t.epochs, "examples_per_second": total_examples / elapsed if elapsed else 0.0,
                "clock": self.client.clock_value}

    def _evaluate(self, epoch, Xt, yt, loss_sum, n_ex, elapsed):
        """Epoch metrics: progressive train log-loss, test log-loss/AUC/accuracy. Collective."""
        tr = allreduce_sum(self.comm, np.array([loss_sum, n_ex], dtype=np.float64))
        if Xt.shape[0]:
            keys, local = batch_keys(Xt)
            w = self.client.pull(WEIGHTS, keys, fresh=True)[:, 0]
            b = self.client.pull(BIAS, [0], fresh=True)[0, 0]
            p = predict(Xt, local, w, b)
        else:
            p = np.empty(0)
        all_p = gatherv(self.comm, p)
        all_y = gatherv(self.comm, np.asarray(yt, dtype=np.float64))
        if not self.is_chief:
            return None
        m = binary_metrics(all_y, all_p)
        rec = {"epoch": epoch + 1, "clock": self.client.clock_value, "seconds": round(elapsed, 3),
               "train_logloss": float(tr[0] / tr[1]) if tr[1] else float("nan"),
               "test_logloss": m.get("logloss", float("nan")), "test_auc": m.get("auc", float("nan")),
               "test_accuracy": m.get("accuracy", float("nan")), "test_rows": m["n"]}
        self._say(f"epoch {epoch + 1}: train log-loss {rec['train_logloss']:.4f}  "
                  f"test log-loss {rec['test_logloss']:.4f}  AUC {rec['test_auc']:.4f}  "
                  f"accuracy {rec['test_accuracy']:.4f}  ({elapsed:.1f} s)")
        return rec

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
