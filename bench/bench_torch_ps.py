"""The Adult job on a torch.distributed.rpc parameter server, written the way a user who
knows the pattern would write it for a sparse model (PyTorch's tutorials "Implementing a
Parameter Server Using Distributed RPC Framework" and "Implementing Batch RPC Processing
Using Asynchronous Executions", pytorch.org/tutorials/intermediate/).

The peer ``bench_e2e.py`` compares hpcps with. Applied to the Adult hashed-cross logistic
regression (the same features, read with hpcps's own featurizer):

* rank 0 holds the model: one float32 weight per feature, the bias and AdaGrad's sums;
* only sparse rows travel: a trainer finds its batch's distinct features and each nonzero's
  index into them (:class:`UniqueInverse`: two linear passes over a per-feature scratch
  array, as hpcps's workers do; ``torch.unique`` sorts, 4x slower), computes the log-loss
  gradient of those rows itself, and sends ``(keys, gradient)``;
* one fused RPC per step: ``push_pull(keys, grad, bias_grad, next_keys)`` applies the step's
  gradient and returns the rows of the trainer's next batch (the next epoch's first batch
  too: the only other RPCs are the run's first pull and the evaluations);
* ``--mode async`` (Downpour): the server applies each push at once, under a lock;
  ``--mode bsp``: ``bsp_push_pull`` is an ``@rpc.functions.async_execution`` function whose
  future completes when every trainer has pushed the clock; the summed gradient is applied
  once, then every trainer gets its next rows (one batched RPC per step);
* torch threads per process: its share of the cores (at least 1), one inter-op thread;
  processes started with ``torch.multiprocessing``; rendezvous over TCP on 127.0.0.1;
  TensorPipe's ``uv`` transport (TCP on loopback) by default: its ``shm`` transport, the
  default on one host, busy-polls a reactor thread per process (``--transport shm`` to
  compare);
* the server's test split and scikit-learn's metrics are loaded before the trainers start
  their clocks (importing ``sklearn.metrics`` beside torch in the first evaluation took ~4 s).

Same work as the hpcps job: the same train/test split and features, the same number of
trainers (``--workers``) plus one server process, the same batch size, epochs, AdaGrad
(lr, initial accumulator, eps), no L2. After every epoch trainer 1 asks the server for the
test log-loss and AUC of its current model (the time includes the evaluations, as hpcps's
does).

Prints the examples/s and the epochs' test log-loss; ``--json`` writes them for
``bench_e2e.py``. Without torch the script says so and exits with status 0 (torch is not a
dependency of hpcps): ``pip install torch`` (CPU wheel) to run it.
"""

from __future__ import annotations

import argparse
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
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
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

class SparsePS:
    """The model on the server process (rank 0): one weight per feature, the bias, AdaGrad's
    sums; only the rows a step touches travel (sparse rows only)."""

    def __init__(self, n_features, n_trainers, lr, init_acc, eps, job, npz):
        self.w = torch.zeros(n_features)
        self.acc = torch.full((n_features,), float(init_acc))
        self.b = torch.zeros(1)
        self.bacc = torch.full((1,), float(init_acc))
        self.lr, self.eps = float(lr), float(eps)
        self.n_trainers, self.job, self.npz = n_trainers, job, npz
        self.lock = Lock()
        self.unique = UniqueInverse(n_features)
        # the test split and the metrics (scikit-learn's) loaded now, before the trainers
        # start their clocks: a user's script imports at its top, not in the first evaluation
        # (importing sklearn.metrics beside torch took ~4 s here, a third of a 2-epoch run)
        self.test = load(job, "test", 0, 1, npz)
        from hpcps.models.logistic_math import binary_metrics

        binary_metrics([0.0, 1.0], [0.25, 0.75])
        self.sizes = {}
        self.size_futures = []
        self.pending = []          # BSP: (keys, grads, bias grad, next keys, future) of this clock

    def apply(self, keys, g, gb):
        """AdaGrad (as torch.optim.Adagrad: sum += g^2; w -= lr g / (sqrt(sum) + eps)) on
        unique ``keys``."""
        acc = self.acc[keys] + g * g
        self.acc[keys] = acc
        self.w[keys] -= self.lr * g / (acc.sqrt() + self.eps)
        self.bacc += gb * gb
        self.b -= self.lr * gb / (self.bacc.sqrt() + self.eps)

    def evaluate(self):
        """Test log-loss and AUC of the current model (the server holds the test split)."""
        from hpcps.models.logistic_math import binary_metrics

        indptr, indices, data, y, _ = self.test
        with self.lock:
            z = torch.zeros(y.numel()).index_add_(0, _row_ids(indptr), self.w[indices] * data) + self.b
        m = binary_metrics(y.double().numpy(), torch.sigmoid(z).double().numpy())
        return float(m["logloss"]), float(m["auc"])


_PS = None


class UniqueInverse:
    """Distinct keys of a batch and each occurrence's index into them, ``(keys, inv)`` with
    ``keys[inv] == k`` (keys in order of a first occurrence, not sorted): two linear passes
    over a per-feature scratch array kept between steps, 0.3 ms for a 27k-key batch where
    ``torch.unique(return_inverse=True)`` sorts in 1.1 ms (hpcps's workers find their keys
    the same way, ``hpcps.kernels.keys.unique_inverse``)."""

    def __init__(self, n_features):
        self.scratch = torch.empty(n_features, dtype=torch.int64)

    def __call__(self, k):
        pos = torch.arange(k.numel())
        self.scratch[k] = pos                       # one occurrence of each key wins
        keys = k[self.scratch[k] == pos]            # that occurrence: each key once
        self.scratch[keys] = torch.arange(keys.numel())
        return keys, self.scratch[k]


def _row_ids(indptr):
    lens = indptr[1:] - indptr[:-1]
    return torch.repeat_interleave(torch.arange(lens.numel()), lens)


def start_server(n_features, n_trainers, lr, init_acc, eps, job, npz):
    global _PS
    _PS = SparsePS(n_features, n_trainers, lr, init_acc, eps, job, npz)


@rpc.functions.async_execution if torch is not None else (lambda f: f)
def register(rank, n_rows):
    """Every trainer's row count; answers the largest when all have registered (BSP: every
    trainer takes as many steps per epoch, those with fewer rows send empty steps)."""
    ps, fut = _PS, torch.futures.Future()
    with ps.lock:
        ps.sizes[rank] = n_rows
        ps.size_futures.append(fut)
        if len(ps.sizes) == ps.n_trainers:
            for f in ps.size_futures:
                f.set_result(max(ps.sizes.values()))
    return fut


def push_pull(keys, g, gb, next_keys):
    """Asynchronous step (Downpour): apply this trainer's gradient, return the rows of its
    next batch — one RPC per step."""
    ps = _PS
    with ps.lock:
        if keys.numel() or gb:
            ps.apply(keys, g, gb)
        return ps.w[next_keys], ps.b.clone()


@rpc.functions.async_execution if torch is not None else (lambda f: f)
def bsp_push_pull(keys, g, gb, next_keys):
    """BSP step: the answer (the rows of the next batch) comes when every trainer has pushed
    this clock and the summed gradient is applied — one batched RPC per step, as PyTorch's
    batch-updating parameter server tutorial does with ``async_execution``."""
    ps, fut = _PS, torch.futures.Future()
    with ps.lock:
        ps.pending.append((keys, g, gb, next_keys, fut))
        if len(ps.pending) == ps.n_trainers:
            k = torch.cat([p[0] for p in ps.pending])
            uk, inv = ps.unique(k)
            gs = torch.zeros(uk.numel()).index_add_(0, inv, torch.cat([p[1] for p in ps.pending]))
            ps.apply(uk, gs / ps.n_trainers, sum(p[2] for p in ps.pending) / ps.n_trainers)
            for p in ps.pending:
                p[4].set_result((ps.w[p[3]], ps.b.clone()))
            ps.pending = []
    return fut


def evaluate():
    return _PS.evaluate()


# ------------------------------------------------------------------ the trainers' side

def run_trainer(rank, n_workers, args, queue):
    from hpcps.config import load_job

    cfg = load_job(args.job)
    indptr, indices, data, y, nf = load(args.job, "train", rank - 1, n_workers, args.data_npz)
    bs, n = cfg.train.batch_size, y.shape[0]
    step_fn = bsp_push_pull if args.mode == "bsp" else push_pull
    longest = rpc.rpc_sync("parameter_server", register, args=(rank, n))
    steps = -(-longest // bs)
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    empty = torch.zeros(0, dtype=torch.int64)
    unique = UniqueInverse(nf)
    t0 = time.time()
    examples, epochs = 0, []

    def batch(order, s):
        rows = order[s * bs:(s + 1) * bs]
        starts, lens = indptr[rows], indptr[rows + 1] - indptr[rows]
        offsets = torch.cumsum(lens, 0) - lens
        idx = torch.repeat_interleave(starts - offsets, lens) + torch.arange(int(lens.sum()))
        keys, inv = unique(indices[idx])
        row_ids = torch.repeat_interleave(torch.arange(rows.numel()), lens)
        return rows, keys, inv, row_ids, data[idx]

    # the steps of every epoch in one sequence: each RPC pushes a step's gradient and pulls
    # the rows of the next step, the first step of the next epoch included (its order drawn
    # one step early); only the very first pull is an RPC of its own
    total = args.epochs * steps
    order = torch.randperm(n, generator=g)
    cur = batch(order, 0)
    w, b = rpc.rpc_sync("parameter_server", push_pull, args=(empty, torch.zeros(0), 0.0, cur[1]))
    for t in range(total):
        epoch, s = divmod(t, steps)
        rows, keys, inv, row_ids, vals = cur
        if t + 1 == total:
            nxt = None
        else:
            if s + 1 == steps:
                order = torch.randperm(n, generator=g)
            nxt = batch(order, (t + 1) % steps)
        if rows.numel():
            z = torch.zeros(rows.numel()).index_add_(0, row_ids, w[inv] * vals) + b
            err = (torch.sigmoid(z) - y[rows]) / rows.numel()         # mean log-loss
            gk = torch.zeros(keys.numel()).index_add_(0, inv, err[row_ids] * vals)
            gb = float(err.sum())
        else:
            gk, gb = torch.zeros(0), 0.0
        w, b = rpc.rpc_sync("parameter_server", step_fn,
                            args=(keys, gk, gb, nxt[1] if nxt is not None else empty))
        examples += rows.numel()
        cur = nxt
        if rank == 1 and s + 1 == steps:
            ll, auc = rpc.rpc_sync("parameter_server", evaluate)
            epochs.append({"epoch": epoch + 1, "seconds": time.time() - t0, "test_logloss": ll,
                           "test_auc": auc})
            print(f"torch rpc PS ({args.mode}): epoch {epoch + 1}: test log-loss {ll:.4f} AUC "
                  f"{auc:.4f} ({time.time() - t0:.1f} s)", flush=True)
    queue.put({"rank": rank, "t0": t0, "t1": time.time(), "examples": examples, "epochs": epochs})


def run_worker(rank, world_size, args, port, queue):
    # each process's share of the cores (at least one thread)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    torch.set_num_interop_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=max(4, world_size), rpc_timeout=600,
                                           init_method=f"tcp://127.0.0.1:{port}",
                                           _transports=[args.transport])
    if rank == 0:
        from hpcps.config import load_job

        cfg = load_job(args.job)
        nf = cfg.data.num_features
        start_server(nf, world_size - 1, cfg.optimizer.learning_rate,
                     cfg.optimizer.initial_accumulator, cfg.optimizer.eps, args.job, args.data_npz)
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
    ap.add_argument("--mode", choices=["async", "bsp"], default="async",
                    help="async: each trainer's push_pull RPC applies at once (Downpour); bsp: the "
                         "answer waits for every trainer's push of the clock (default async)")
    ap.add_argument("--data-npz", help="featurized data written by adultdata.save_npz (default: featurize "
                                       "in every process)")
    ap.add_argument("--transport", choices=["shm", "uv"], default="uv",
                    help="TensorPipe transport: uv (TCP over loopback, the default) or shm, "
                         "TensorPipe's own choice on one host, whose reactor thread busy-polls "
                         "(~20%% of a core per idle process on the 2 shared cores it was measured "
                         "on; slower there in examples/s in both modes)")
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
    out = {"torch": torch.__version__, "mode": args.mode, "workers": args.workers, "processes": world,
           "examples": examples, "seconds": t1 - t0, "examples_per_second": examples / (t1 - t0),
           "epochs": epochs}
    rep = benchlib.Report("torch_ps")
    rep.details.update(out)
    rep.ratio("torch rpc PS examples/s", out["examples_per_second"], None, unit=" ex/s",
              headline=True)
    rep.write(args.json)
    print(f"torch {torch.__version__} rpc parameter server ({args.mode}), {args.workers} trainers + 1 server: "
          f"{examples:,} examples in {t1 - t0:.1f} s")
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
