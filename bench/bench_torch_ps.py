"""The Adult job on a torch.distributed.rpc parameter server, written as PyTorch's own
parameter-server tutorial writes one ("Implementing a Parameter Server Using Distributed RPC
Framework", pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html).

The peer ``bench_e2e.py`` compares hpcps with. The tutorial's pattern, applied to the
Adult hashed-cross logistic regression (the same features, read with hpcps's own featurizer):

* rank 0 hosts the ``ParameterServer`` module (the model: an ``nn.EmbeddingBag`` of
  ``2**hash_bits`` rows of 1 weight, ``mode="sum"`` with per-sample weights, sparse
  gradients, plus a bias), created once behind a lock by ``get_parameter_server``;
* every trainer holds a ``TrainerNet`` whose ``forward`` calls ``ParameterServer.forward`` on
  the server through an ``RRef`` (``rpc_sync`` of a ``call_method`` helper), so the model runs
  where it lives;
* each step runs in a ``dist_autograd.context()``: forward over RPC, the loss on the
  trainer, ``dist_autograd.backward``, then ``DistributedOptimizer.step`` applies AdaGrad on
  the server (trainers do not wait for each other: asynchronous, like Downpour);
* the processes are started with ``torch.multiprocessing``; rendezvous over TCP on 127.0.0.1.

Same work as the hpcps job: the same train/test split and features, the same number of
trainers (``--workers``) plus one server process, the same batch size, epochs, AdaGrad
(lr, initial accumulator, eps), no L2. After every epoch trainer 1 asks the server for the
test log-loss and AUC of its current model (the time includes the evaluations, as hpcps's
does). Intra-op threads are limited to 1 per process (hpcps's kernels are single-threaded too).

Prints the examples/s and the epochs' test log-loss; ``--json`` writes them for
``bench_e2e.py``. Without torch the script says so and exits with status 0 (torch is not a
dependency of hpcps): ``pip install torch`` (CPU wheel) to run it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from threading import Lock

import benchlib

benchlib.ensure_importable()

try:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
    from torch import optim
    from torch.distributed.optim import DistributedOptimizer
    from torch.distributed.rpc import RRef
except ImportError:  # pragma: no cover - exercised where torch is missing
    torch = None

SKIP_MESSAGE = ("bench_torch_ps.py: skipped: torch is not installed (it is not a dependency of "
                "hpcps); `pip install torch` (the CPU wheel) to compare with a torch.distributed.rpc "
                "parameter server")


def load(job, split, part, n_parts, npz=None):
    """CSR features of the job (hpcps's featurizer) as torch tensors for EmbeddingBag:
    ``(indptr, indices, data, y, num_features)``. With ``npz`` (written by
    :func:`adultdata.save_npz`) the featurized split is read from it, its rows cut into
    ``n_parts`` contiguous blocks; otherwise ``hpcps.data.source.load_split`` featurizes."""
    import numpy as np

    if npz:
        from adultdata import load_part

        indptr, indices, data, y, nf = load_part(npz, split, part, n_parts)
    else:
        from hpcps.config import load_job
        from hpcps.data.source import load_split

        cfg = load_job(job)
        X, y = load_split(cfg.data, split, part, n_parts)
        X = X.tocsr()
        indptr, indices, data, nf = X.indptr, X.indices, X.data, X.shape[1]
    return (torch.from_numpy(np.ascontiguousarray(indptr, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32)), nf)


# ------------------------------------------------------------------ the server's side

class ParameterServer(nn.Module if torch is not None else object):
    """The model, held by rank 0; trainers run its forward remotely."""

    def __init__(self, n_features, job, npz=None):
        super().__init__()
        self.npz = npz
        self.emb = nn.EmbeddingBag(n_features, 1, mode="sum", sparse=True)
        nn.init.zeros_(self.emb.weight)
        self.bias = nn.Parameter(torch.zeros(1))
        self.job = job
        self.test = None

    def forward(self, indices, offsets, weights):
        return self.emb(indices, offsets, per_sample_weights=weights).squeeze(1) + self.bias

    def get_param_rrefs(self):
        return [RRef(p) for p in self.parameters()]

    def evaluate(self):
        """Test log-loss and AUC of the current model (the server holds the test split)."""
        from hpcps.models.logistic_math import binary_metrics

        if self.test is None:
            indptr, indices, data, y, _ = load(self.job, "test", 0, 1, self.npz)
            self.test = (indices, indptr[:-1], data, y)
        indices, offsets, data, y = self.test
        with torch.no_grad():
            p = torch.sigmoid(self.forward(indices, offsets, data)).double().numpy()
        m = binary_metrics(y.double().numpy(), p)
        return float(m["logloss"]), float(m["auc"])


param_server = None
global_lock = Lock()


def get_parameter_server(n_features, job, npz=None):
    global param_server
    with global_lock:
        if param_server is None:
            param_server = ParameterServer(n_features, job, npz)
        return param_server


def call_method(method, rref, *args):
    return method(rref.local_value(), *args)


def remote_method(method, rref, *args):
    return rpc.rpc_sync(rref.owner(), call_method, args=[method, rref] + list(args))


# ------------------------------------------------------------------ the trainers' side

class TrainerNet(nn.Module if torch is not None else object):
    def __init__(self, n_features, job, npz=None):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server,
                                            args=(n_features, job, npz))

    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)

    def forward(self, indices, offsets, weights):
        return remote_method(ParameterServer.forward, self.param_server_rref, indices, offsets, weights)


def run_trainer(rank, n_workers, args, queue):
    from hpcps.config import load_job

    cfg = load_job(args.job)
    indptr, indices, data, y, nf = load(args.job, "train", rank - 1, n_workers, args.data_npz)
    net = TrainerNet(nf, args.job, args.data_npz)
    opt = DistributedOptimizer(optim.Adagrad, net.get_global_param_rrefs(),
                               lr=cfg.optimizer.learning_rate,
                               initial_accumulator_value=cfg.optimizer.initial_accumulator,
                               eps=cfg.optimizer.eps)
    bs, n = cfg.train.batch_size, y.shape[0]
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    t0 = time.time()
    examples, epochs = 0, []
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=g)
        for s in range(0, n, bs):
            rows = order[s:s + bs]
            starts, lens = indptr[rows], indptr[rows + 1] - indptr[rows]
            offsets = torch.cumsum(lens, 0) - lens                 # where each row's bag starts
            idx = torch.repeat_interleave(starts - offsets, lens) + torch.arange(int(lens.sum()))
            with dist_autograd.context() as context_id:
                logits = net(indices[idx], offsets, data[idx])
                loss = F.binary_cross_entropy_with_logits(logits, y[rows])
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            examples += rows.numel()
        if rank == 1:
            ll, auc = remote_method(ParameterServer.evaluate, net.param_server_rref)
            epochs.append({"epoch": epoch + 1, "seconds": time.time() - t0, "test_logloss": ll,
                           "test_auc": auc})
            print(f"torch rpc PS: epoch {epoch + 1}: test log-loss {ll:.4f} AUC {auc:.4f} "
                  f"({time.time() - t0:.1f} s)", flush=True)
    queue.put({"rank": rank, "t0": t0, "t1": time.time(), "examples": examples, "epochs": epochs})


def run_worker(rank, world_size, args, port, queue):
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=600,
                                           init_method=f"tcp://127.0.0.1:{port}")
    if rank == 0:
        rpc.init_rpc("parameter_server", rank=0, world_size=world_size, rpc_backend_options=opts)
    else:
        rpc.init_rpc(f"trainer_{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
        run_trainer(rank, world_size - 1, args, queue)
    rpc.shutdown()          # waits for every process (the server serves until then)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?", default=str(benchlib.ROOT / "jobs" / "adult_lr.toml"),
                    help="hpcps job file: data, features, batch size, AdaGrad settings")
    ap.add_argument("--workers", type=int, default=3, help="trainer processes (plus 1 server)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data-npz", help="featurized data written by adultdata.save_npz (default: featurize "
                                       "in every process)")
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if torch is None:
        print(SKIP_MESSAGE)
        rep = benchlib.Report("torch_ps")
        rep.note("torch missing: skipped")
        rep.details["skipped"] = True
        rep.write(args.json)
        return 0
    args.job = str(Path(args.job).resolve())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    world = args.workers + 1
    procs = [ctx.Process(target=run_worker, args=(r, world, args, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1800) for _ in range(args.workers)]
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        print(f"bench_torch_ps.py: a process failed (exit {bad})")
        return 1
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    examples = sum(r["examples"] for r in results)
    epochs = next(r["epochs"] for r in results if r["rank"] == 1)
    out = {"torch": torch.__version__, "workers": args.workers, "processes": world,
           "examples": examples, "seconds": t1 - t0, "examples_per_second": examples / (t1 - t0),
           "epochs": epochs}
    rep = benchlib.Report("torch_ps")
    rep.details.update(out)
    rep.ratio("torch rpc PS examples/s", out["examples_per_second"], None, unit=" ex/s",
              headline=True)
    rep.write(args.json)
    print(f"torch {torch.__version__} rpc parameter server, {args.workers} trainers + 1 server: "
          f"{examples:,} examples in {t1 - t0:.1f} s")
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
